"""Helpers shared by the quantizer modules: norm storage and per-device caches of constant tensors."""

from __future__ import annotations

import torch

NORM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_norm_dtype(dtype: torch.dtype, name: str = "norm_dtype") -> torch.dtype:
    if dtype not in NORM_DTYPES:
        raise ValueError(f"{name} must be torch.float16, torch.bfloat16 or torch.float32, got {dtype}")
    return dtype


def dtype_bits(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits


def store_scalar(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round a per-vector scalar to its stored precision (fp64 values are kept in fp64 for oracles)."""
    return value if value.dtype == torch.float64 else value.to(dtype)


class DeviceCache:
    """Constant tensors (codebooks, sketches, signs) materialised once per (device, dtype)."""

    def __init__(self, source: torch.Tensor):
        self.source = source
        self._cache: dict[tuple, torch.Tensor] = {}

    def on(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        key = (torch.device(device), dtype)
        if key not in self._cache:
            self._cache[key] = self.source.to(device=device, dtype=dtype)
        return self._cache[key]
