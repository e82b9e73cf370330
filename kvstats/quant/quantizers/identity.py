"""The lossless "quantizer": stores x as it is (or cast to a storage dtype).

    encode: x (cloned, or x.to(dtype)),   decode: x̂ = x,   inner: ⟨q, x⟩ (decode-then-dot)

The reference point of the cache tests (a KVStatsCache with it reproduces the model) and, with
``dtype=torch.float16``, an fp16 cache. Not in the registry (its signature has no ``bits``): import it
from ``kvstats.quantizers``.
"""

from __future__ import annotations

import torch

from kvstats.quant.quantizers.base import BitBudget, Code, Quantizer
from kvstats.quant.quantizers.config import IdentityConfig

__all__ = ["IdentityQuantizer"]


class IdentityQuantizer(Quantizer):
    """A lossless "quantizer": stores x as it is (or cast to ``dtype``); decode returns it; inner is q·xᵀ.

    ``bits_per_coordinate`` counts the storage dtype (fp32 when ``dtype`` is None, i.e. assuming fp32
    inputs); ``Code.nbytes`` is exact either way.
    """

    name = "identity"
    codes_per_vector = True
    min_bits, max_bits = 8, 64
    Config = IdentityConfig

    def __init__(self, dim: int, seed: int | None = 0, *, dtype: torch.dtype | None = None):
        super().__init__(config=IdentityConfig(dim=dim, seed=seed, dtype=dtype))

    @property
    def store_dtype(self) -> torch.dtype | None:
        return self._qconfig.dtype

    @classmethod
    def from_config(cls, config: IdentityConfig) -> IdentityQuantizer:
        return cls(config.dim, config.seed, dtype=config.dtype)

    def _encode(self, x: torch.Tensor) -> Code:
        if self.store_dtype is not None and self.store_dtype != x.dtype:
            self._check_storable(x, self.store_dtype, "x", "dtype")
        stored = x.clone() if self.store_dtype is None else x.to(self.store_dtype)
        return Code(x.shape, x.dtype, payload={"x": stored})

    def _decode(self, code: Code) -> torch.Tensor:
        return code.payload["x"].to(code.dtype)

    def bits_per_coordinate(self, n_tokens: int | None = None) -> BitBudget:
        return BitBudget(payload=float(self.bits))

    def __repr__(self) -> str:
        return f"IdentityQuantizer(dim={self.dim}, dtype={self.store_dtype})"
