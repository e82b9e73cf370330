"""Scalar Lloyd–Max quantization of unit vectors: ``lloyd`` (raw coordinates) and ``turbo_mse``.

Both store ‖x‖ and, per coordinate of the unit vector u = x/‖x‖ (after the rotation Π for
turbo_mse), the index of its cell in the b-bit Lloyd–Max codebook of the sphere law f_d
(:func:`kvstats.codebooks.beta_codebook`):

    encode:  idx_j = cell of (Π u)_j,            stored: idx (b bits each, packed), ‖x‖
    decode:  x̂ = ‖x‖ · Πᵀ c[idx],               c = codebook levels
    inner:   ⟨q, x̂⟩ = ‖x‖ · ⟨Π q, c[idx]⟩       (biased: E⟨q, x̂⟩ ≈ (1 − D_mse)⟨q, x⟩, 2/π at b = 1)

For unit x the expected squared error is E‖x − x̂‖² = D_mse(d, b) = d · MSE of the codebook, exactly
when Π u is uniform on the sphere (Haar Π, or any Π for uniform x). ``lloyd`` applies the codebook
to the raw coordinates: optimal only for data already spread like f_d (the KV scheme's baseline).
A zero vector encodes to ‖x‖ = 0 and decodes to exactly 0. The hot paths run in the fused kernels
``lloyd_encode`` / ``lloyd_decode`` / ``lloyd_scores`` (kvstats.ops); a Haar rotation is applied as a
dense matmul around them.
"""

from __future__ import annotations

import torch

from kvstats.quant import ops
from kvstats.quant.codebooks import beta_codebook
from kvstats.quant.packing import packed_nbytes
from kvstats.quant.quantizers._common import DeviceCache, check_norm_dtype, dtype_bits
from kvstats.quant.quantizers.base import BitBudget, Code, Quantizer, acc_dtype, broadcast_groups
from kvstats.quant.rotations import HaarRotation, RandomizedHadamard, Rotation, make_rotation

__all__ = ["LloydQuantizer", "TurboMSE"]


class LloydQuantizer(Quantizer):
    """b-bit Lloyd–Max codebook of f_d on the raw coordinates of x/‖x‖, plus ‖x‖ (no rotation).

    Args:
        bits: b in [1, 8]; dim: d ≥ 2; seed: unused (kept for the common signature).
        norm_dtype: precision ‖x‖ is stored in (fp32 default: no hidden bias; fp16 halves the cost).
    """

    name = "lloyd"
    storage_options = {"norm": "norm_dtype"}
    rotation: Rotation | None = None

    def __init__(self, bits: int, dim: int, seed: int = 0, *, norm_dtype: torch.dtype = torch.float32):
        super().__init__(bits, dim, seed)
        self.norm_dtype = check_norm_dtype(norm_dtype)
        self.codebook = beta_codebook(self.dim, self.bits)
        self._levels = DeviceCache(torch.tensor(self.codebook.levels, dtype=torch.float64))
        self._thresholds = DeviceCache(torch.tensor(self.codebook.thresholds, dtype=torch.float64))

    # -------------------------------------------------------------------- the rotation, split in two
    # A randomized Hadamard rotation runs inside the kernels (as its signs); a Haar rotation is a dense
    # matmul done here around them ("outer").
    def kernel_signs(self, device: torch.device, acc: torch.dtype) -> torch.Tensor:
        """[passes, block] signs for the kernels ([0, 0]: no in-kernel rotation)."""
        if isinstance(self.rotation, RandomizedHadamard):
            return self.rotation.signs_matrix(device, acc)
        return torch.empty(0, 0, device=device, dtype=acc)

    def outer_rotate(self, x: torch.Tensor) -> torch.Tensor:
        """Haar: Π x in the accumulation dtype; otherwise x unchanged (the kernel reads any float dtype)."""
        if isinstance(self.rotation, HaarRotation):
            return self.rotation.forward(x.to(acc_dtype(x.dtype)))
        return x

    def outer_unrotate(self, y: torch.Tensor) -> torch.Tensor:
        return self.rotation.inverse(y) if isinstance(self.rotation, HaarRotation) else y

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """Π x (identity for ``lloyd``)."""
        return x if self.rotation is None else self.rotation.forward(x)

    def levels(self, device: torch.device, acc: torch.dtype) -> torch.Tensor:
        return self._levels.on(device, acc)

    def thresholds(self, device: torch.device, acc: torch.dtype) -> torch.Tensor:
        return self._thresholds.on(device, acc)

    # ------------------------------------------------------------------------------------- protocol
    def _encode(self, x: torch.Tensor) -> Code:
        acc = acc_dtype(x.dtype)
        flat = self.outer_rotate(x.reshape(-1, self.dim))
        packed, norm = ops.lloyd_encode(flat, self.kernel_signs(x.device, acc), self.thresholds(x.device, acc),
                                        self.bits, self.norm_dtype)
        lead = x.shape[:-1]
        return Code(x.shape, x.dtype, payload={"indices": packed.reshape(*lead, -1)},
                    scalars={"norm": norm.reshape(lead)})

    def decode_rotated(self, code: Code, acc: torch.dtype) -> torch.Tensor:
        """ŷ = ‖x‖ · c[idx] in the rotated domain, [..., d] in acc."""
        packed = code.payload["indices"]
        empty = torch.empty(0, 0, device=packed.device, dtype=acc)
        y = ops.lloyd_decode(packed.reshape(-1, packed.shape[-1]), code.scalars["norm"].reshape(-1), empty,
                             self.levels(packed.device, acc), self.bits, self.dim)
        return y.reshape(code.shape)

    def decode_unrotated(self, code: Code, acc: torch.dtype) -> torch.Tensor:
        """x̂ = Πᵀ(‖x‖ · c[idx]), [..., d] in acc."""
        packed = code.payload["indices"]
        x = ops.lloyd_decode(packed.reshape(-1, packed.shape[-1]), code.scalars["norm"].reshape(-1),
                             self.kernel_signs(packed.device, acc), self.levels(packed.device, acc), self.bits,
                             self.dim)
        return self.outer_unrotate(x).reshape(code.shape)

    def _decode(self, code: Code) -> torch.Tensor:
        return self.decode_unrotated(code, acc_dtype(code.dtype)).to(code.dtype)

    def _inner(self, query: torch.Tensor, code: Code) -> torch.Tensor:
        # ⟨q, Πᵀŷ⟩ = ⟨Πq, ŷ⟩: rotate the (few) queries instead of de-rotating the (many) keys, and score
        # straight from the packed indices.
        acc = acc_dtype(query.dtype)
        q = self.rotate(query.to(acc))
        lead, q3, (packed, norm) = broadcast_groups(q, code.payload["indices"], code.scalars["norm"],
                                                    key_dims=(1, 0))
        scores = ops.lloyd_scores(q3, packed, norm, self.levels(q.device, acc), self.bits)
        return scores.reshape(*lead, *scores.shape[-2:])

    def options(self) -> dict:
        return {"norm_dtype": self.norm_dtype, "rotation": getattr(self, "rotation_kind", None)}

    def bits_per_coordinate(self, n_tokens: int | None = None) -> BitBudget:
        return BitBudget(payload=8 * packed_nbytes(self.dim, self.bits) / self.dim,
                         norms=dtype_bits(self.norm_dtype) / self.dim)


class TurboMSE(LloydQuantizer):
    """TurboQuant_mse: random rotation Π, then the b-bit Lloyd–Max codebook of f_d per coordinate.

    Arguments other than ``rotation`` as :class:`LloydQuantizer`; the seed fixes Π.

    Args:
        rotation: ``"wht"`` (randomized Walsh–Hadamard, O(d log d), default) or ``"haar"`` (dense QR).
    """

    name = "turbo_mse"

    def __init__(self, bits: int, dim: int, seed: int = 0, *, rotation: str = "wht",
                 norm_dtype: torch.dtype = torch.float32):
        super().__init__(bits, dim, seed, norm_dtype=norm_dtype)
        self.rotation_kind = rotation
        self.rotation = make_rotation(rotation, self.dim, self.seed)

    def __repr__(self) -> str:
        return f"TurboMSE(bits={self.bits}, dim={self.dim}, seed={self.seed}, rotation={self.rotation_kind!r})"
