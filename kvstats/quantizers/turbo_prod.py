"""TurboQuant_prod: an unbiased inner-product quantizer at b bits (Zandieh et al., arXiv 2504.19874).

    stage 1:  TurboQuant_mse at b − 1 bits: ŷ = ‖x‖·c[idx] in the rotated domain (y = Π x)
    stage 2:  residual r = y − ŷ, stored as sign(S r) (m = d rows) and γ = ‖r‖
    decode:   x̂ = Πᵀ (ŷ + (c_S/d)·γ·Sᵀ sign(S r))
    inner:    ⟨q, x̂⟩ = ⟨Πq, ŷ⟩ + (c_S/d)·γ·⟨S Πq, sign(S r)⟩   — unbiased for ⟨q, x⟩

The residual is sketched in the rotated domain (equivalent in law for Gaussian S, and it spares a
de-rotation). For unit x and any y: D_prod = E|⟨y,x⟩ − ⟨y,x̂⟩|² = (π/2 − 1/d)·D_mse(b−1)·‖y‖²/d for
Gaussian rows when the residual direction is uniform (REFERENCE §3, derived). At b = 1 there is no MSE
stage: the quantizer is QJL on x with m = d.
"""

from __future__ import annotations

import torch

from kvstats._random import spawn_seeds
from kvstats.packing import packed_nbytes
from kvstats.quantizers._common import check_norm_dtype, dtype_bits, store_scalar
from kvstats.quantizers.base import BitBudget, Code, Quantizer, acc_dtype
from kvstats.quantizers.lloyd import TurboMSE
from kvstats.quantizers.qjl import SignSketch

__all__ = ["TurboProd"]


class TurboProd(Quantizer):
    """TurboQuant_prod at b bits per coordinate: (b−1)-bit TurboQuant_mse + 1-bit QJL on the residual.

    Args:
        bits: b in [1, 8] (b − 1 bits of MSE codes + 1 sign bit per coordinate).
        dim: d ≥ 2. seed: fixes the rotation and the sketch (independent child seeds).
        rotation: ``"wht"`` (default) or ``"haar"`` for the MSE stage.
        rows: ``"gaussian"`` (default, as in the paper) or ``"orthogonal"`` for the residual sketch.
        norm_dtype: precision of ‖x‖ and γ (fp32 default).
    """

    name = "turbo_prod"

    def __init__(self, bits: int, dim: int, seed: int = 0, *, rotation: str = "wht", rows: str = "gaussian",
                 norm_dtype: torch.dtype = torch.float32):
        super().__init__(bits, dim, seed)
        self.norm_dtype = check_norm_dtype(norm_dtype)
        seed_mse, seed_qjl = spawn_seeds(seed, 2)
        self.rotation_kind, self.rows = rotation, rows
        self.mse = TurboMSE(self.bits - 1, self.dim, seed_mse, rotation=rotation, norm_dtype=norm_dtype) \
            if self.bits > 1 else None
        self.sketch = SignSketch(self.dim, self.dim, rows, seed_qjl)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.mse is None else self.mse.rotation.forward(x)

    def _unrotate(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.mse is None else self.mse.rotation.inverse(y)

    def _encode(self, x: torch.Tensor) -> Code:
        acc = acc_dtype(x.dtype)
        code = Code(x.shape, x.dtype)
        if self.mse is None:
            residual = x.to(acc)
        else:
            mse_code = self.mse.encode(x)
            y = self._rotate(x.to(acc))
            residual = y - self.mse.decode_rotated(mse_code, acc)
            code.parts["mse"] = mse_code
        code.payload["signs"] = self.sketch.signs(residual)
        code.scalars["gamma"] = store_scalar(torch.linalg.vector_norm(residual, dim=-1), self.norm_dtype)
        return code

    def _decode(self, code: Code) -> torch.Tensor:
        acc = acc_dtype(code.dtype)
        y_hat = self.sketch.reconstruct(code.payload["signs"], code.scalars["gamma"], acc)
        if self.mse is not None:
            y_hat = y_hat + self.mse.decode_rotated(code.parts["mse"], acc)
        return self._unrotate(y_hat).to(code.dtype)

    def _inner(self, query: torch.Tensor, code: Code) -> torch.Tensor:
        q = self._rotate(query.to(acc_dtype(query.dtype)))
        scores = self.sketch.estimate(q, code.payload["signs"], code.scalars["gamma"])
        if self.mse is not None:
            scores = scores + q @ self.mse.decode_rotated(code.parts["mse"], q.dtype).transpose(-1, -2)
        return scores

    def bits_per_coordinate(self) -> BitBudget:
        sign_bits = BitBudget(payload=8 * packed_nbytes(self.dim, 1) / self.dim,
                              norms=dtype_bits(self.norm_dtype) / self.dim)
        return sign_bits if self.mse is None else sign_bits + self.mse.bits_per_coordinate()

    def __repr__(self) -> str:
        return (f"TurboProd(bits={self.bits}, dim={self.dim}, seed={self.seed}, rotation={self.rotation_kind!r}, "
                f"rows={self.rows!r})")
