"""Scalar Lloyd–Max quantization of unit vectors: ``lloyd`` (raw coordinates) and ``turbo_mse``.

Both store ‖x‖ and, per coordinate of the unit vector u = x/‖x‖ (after the rotation Π for
turbo_mse), the index of its cell in the b-bit Lloyd–Max codebook of the sphere law f_d
(:func:`kvstats.codebooks.beta_codebook`):

    encode:  idx_j = cell of (Π u)_j,            stored: idx (b bits each, packed), ‖x‖
    decode:  x̂ = ‖x‖ · Πᵀ c[idx],               c = codebook levels
    inner:   ⟨q, x̂⟩ (decode-then-dot; biased: E⟨q, x̂⟩ ≈ (1 − D_mse)⟨q, x⟩, 2/π at b = 1)

For unit x the expected squared error is E‖x − x̂‖² = D_mse(d, b) = d · MSE of the codebook, exactly
when Π u is uniform on the sphere (Haar Π, or any Π for uniform x). ``lloyd`` applies the codebook
to the raw coordinates: optimal only for data already spread like f_d (the KV scheme's baseline).
A zero vector encodes to ‖x‖ = 0 and decodes to exactly 0.
"""

from __future__ import annotations

import torch

from kvstats.codebooks import beta_codebook
from kvstats.packing import pack_bits, packed_nbytes, unpack_bits
from kvstats.quantizers._common import DeviceCache, check_norm_dtype, dtype_bits, store_scalar
from kvstats.quantizers.base import BitBudget, Code, Quantizer, acc_dtype
from kvstats.rotations import Rotation, make_rotation

__all__ = ["LloydQuantizer", "TurboMSE"]


class LloydQuantizer(Quantizer):
    """b-bit Lloyd–Max codebook of f_d on the raw coordinates of x/‖x‖, plus ‖x‖ (no rotation).

    Args:
        bits: b in [1, 8]; dim: d ≥ 2; seed: unused (kept for the common signature).
        norm_dtype: precision ‖x‖ is stored in (fp32 default: no hidden bias; fp16 halves the cost).
    """

    name = "lloyd"

    def __init__(self, bits: int, dim: int, seed: int = 0, *, norm_dtype: torch.dtype = torch.float32):
        super().__init__(bits, dim, seed)
        self.norm_dtype = check_norm_dtype(norm_dtype)
        self.codebook = beta_codebook(self.dim, self.bits)
        self._levels = DeviceCache(torch.tensor(self.codebook.levels, dtype=torch.float64))
        self._thresholds = DeviceCache(torch.tensor(self.codebook.thresholds, dtype=torch.float64))

    # The identity here; TurboMSE rotates.
    def _rotate(self, u: torch.Tensor) -> torch.Tensor:
        return u

    def _unrotate(self, y: torch.Tensor) -> torch.Tensor:
        return y

    def encode_rotated(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The MSE stage in the rotated domain (used by turbo_prod).

        Returns (indices [..., d] int64, stored norm [...], y = Π x in acc dtype, ŷ = ‖x‖·c[idx]).
        """
        acc = acc_dtype(x.dtype)
        xa = x.to(acc)
        norm = torch.linalg.vector_norm(xa, dim=-1)
        y = self._rotate(xa)
        u = y / torch.where(norm > 0, norm, torch.ones_like(norm)).unsqueeze(-1)
        idx = torch.bucketize(u, self._thresholds.on(u.device, acc))
        stored = store_scalar(norm, self.norm_dtype)
        y_hat = self._levels.on(u.device, acc)[idx] * stored.to(acc).unsqueeze(-1)
        return idx, stored, y, y_hat

    def _encode(self, x: torch.Tensor) -> Code:
        idx, norm, _, _ = self.encode_rotated(x)
        return Code(x.shape, x.dtype, payload={"indices": pack_bits(idx, self.bits)}, scalars={"norm": norm})

    def decode_rotated(self, code: Code, acc: torch.dtype) -> torch.Tensor:
        """ŷ = ‖x‖ · c[idx] in the rotated domain, [..., d]."""
        idx = unpack_bits(code.payload["indices"], self.bits, self.dim)
        return self._levels.on(idx.device, acc)[idx] * code.scalars["norm"].to(acc).unsqueeze(-1)

    def _decode(self, code: Code) -> torch.Tensor:
        acc = acc_dtype(code.dtype)
        return self._unrotate(self.decode_rotated(code, acc)).to(code.dtype)

    def bits_per_coordinate(self) -> BitBudget:
        return BitBudget(payload=8 * packed_nbytes(self.dim, self.bits) / self.dim,
                         norms=dtype_bits(self.norm_dtype) / self.dim)


class TurboMSE(LloydQuantizer):
    """TurboQuant_mse: random rotation Π, then the b-bit Lloyd–Max codebook of f_d per coordinate.

    Args:
        rotation: ``"wht"`` (randomized Walsh–Hadamard, O(d log d), default) or ``"haar"`` (dense QR).
        Others as :class:`LloydQuantizer`; the seed fixes Π.
    """

    name = "turbo_mse"

    def __init__(self, bits: int, dim: int, seed: int = 0, *, rotation: str = "wht",
                 norm_dtype: torch.dtype = torch.float32):
        super().__init__(bits, dim, seed, norm_dtype=norm_dtype)
        self.rotation_kind = rotation
        self.rotation: Rotation = make_rotation(rotation, self.dim, seed)

    def _rotate(self, u: torch.Tensor) -> torch.Tensor:
        return self.rotation.forward(u)

    def _unrotate(self, y: torch.Tensor) -> torch.Tensor:
        return self.rotation.inverse(y)

    def _inner(self, query: torch.Tensor, code: Code) -> torch.Tensor:
        # ⟨q, Πᵀŷ⟩ = ⟨Πq, ŷ⟩: rotate the (few) queries instead of de-rotating the (many) keys.
        acc = acc_dtype(query.dtype)
        return self._rotate(query.to(acc)) @ self.decode_rotated(code, acc).transpose(-1, -2)

    def __repr__(self) -> str:
        return f"TurboMSE(bits={self.bits}, dim={self.dim}, seed={self.seed}, rotation={self.rotation_kind!r})"
