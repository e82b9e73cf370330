"""Helpers shared by the quantizer modules: norm storage and per-device caches of constant tensors."""

from __future__ import annotations

import torch

__all__ = ["dtype_bits", "store_scalar", "DeviceCache"]


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
