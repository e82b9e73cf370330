"""Scalar Lloyd–Max quantization of unit vectors: ``lloyd`` (raw coordinates) and ``turbo_mse``.

Both store ‖x‖ and, per coordinate of the unit vector u = x/‖x‖ (after the rotation Π for
turbo_mse), the index of its cell in the b-bit Lloyd–Max codebook of the sphere law f_d
(:func:`kvstats.quant.codebooks.beta_codebook`):

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

from typing import NamedTuple

import torch

from kvstats.quant import ops
from kvstats.quant.codebooks import beta_codebook
from kvstats.quant.packing import packed_nbytes
from kvstats.quant.quantizers._common import DeviceCache, dtype_bits
from kvstats.quant.quantizers.base import BitBudget, Code, Quantizer
from kvstats.quant.quantizers.config import LloydConfig, TurboMSEConfig
from kvstats.quant.quantizers.numerics import acc_dtype
from kvstats.quant.quantizers.plans import GroupedPlan, flat_keys
from kvstats.quant.rotations import NoRotation, Rotation, make_rotation, one_pass, one_pass_signs

__all__ = ["LloydInputs", "LloydStage", "LloydQuantizer", "TurboMSE"]


class LloydInputs(NamedTuple):
    """What the Lloyd kernels take besides the rows: the in-kernel rotation's signs [passes, block] ([0, 0]:
    none), the codebook's thresholds [2^b − 1] and levels [2^b] in the accumulation dtype, and b."""

    signs: torch.Tensor
    thresholds: torch.Tensor
    levels: torch.Tensor
    bits: int


class LloydStage:
    """The Lloyd–Max stage of ``lloyd``, ``turbo_mse`` and TurboQuant_prod's stage 1: rotation Π, the b-bit
    codebook of f_d and ‖x‖'s storage dtype, with what the kernels need as one bundle (:meth:`inputs`).

    Its code is ``Code(payload={"indices": [..., ceil(d·b/8)]}, scalars={"norm": [...]})``.
    """

    def __init__(self, bits: int, dim: int, rotation: Rotation, norm_dtype: torch.dtype):
        self.bits, self.dim, self.rotation, self.norm_dtype = bits, dim, rotation, norm_dtype
        self.codebook = beta_codebook(dim, bits)
        self._levels = DeviceCache(torch.tensor(self.codebook.levels, dtype=torch.float64))
        self._thresholds = DeviceCache(torch.tensor(self.codebook.thresholds, dtype=torch.float64))

    def inputs(self, device: torch.device, acc: torch.dtype) -> LloydInputs:
        return LloydInputs(self.rotation.kernel_signs(device, acc), self._thresholds.on(device, acc),
                           self._levels.on(device, acc), self.bits)

    def levels(self, device: torch.device, acc: torch.dtype) -> torch.Tensor:
        return self._levels.on(device, acc)

    def encode(self, x: torch.Tensor) -> Code:
        """The stage's code of x [..., d]."""
        inputs = self.inputs(x.device, acc_dtype(x.dtype))
        packed, norm = ops.lloyd_encode(self.rotation.outer_forward(x.reshape(-1, self.dim)), inputs.signs,
                                        inputs.thresholds, self.bits, self.norm_dtype)
        lead = x.shape[:-1]
        return Code(x.shape, x.dtype, payload={"indices": packed.reshape(*lead, -1)},
                    scalars={"norm": norm.reshape(lead)})

    def _decode(self, code: Code, acc: torch.dtype, signs: torch.Tensor) -> torch.Tensor:
        packed = code.payload["indices"]
        return ops.lloyd_decode(packed.reshape(-1, packed.shape[-1]), code.scalars["norm"].reshape(-1), signs,
                                self._levels.on(packed.device, acc), self.bits, self.dim)

    def decode_rotated(self, code: Code, acc: torch.dtype) -> torch.Tensor:
        """ŷ = ‖x‖ · c[idx] in the rotated domain, [..., d] in acc."""
        empty = torch.empty(0, 0, device=code.device, dtype=acc)
        return self._decode(code, acc, empty).reshape(code.shape)

    def decode_unrotated(self, code: Code, acc: torch.dtype) -> torch.Tensor:
        """x̂ = Πᵀ(‖x‖ · c[idx]), [..., d] in acc."""
        x = self._decode(code, acc, self.rotation.kernel_signs(code.device, acc))
        return self.rotation.outer_inverse(x).reshape(code.shape)

    def scores(self, q: torch.Tensor, code: Code) -> torch.Tensor:
        """⟨q, x̂⟩ for rotated queries Πq [..., n_q, d] (acc dtype) -> [..., n_q, n_k], from the packed indices."""
        return self.scores_plan(code).broadcast(q)

    def weighted_rotated(self, weights: torch.Tensor, code: Code) -> torch.Tensor:
        """Σⱼ wᵢⱼ ŷⱼ in the rotated domain (ŷ = ‖x‖·c[idx]) for weights [..., n_q, n_k] (acc dtype) ->
        [..., n_q, d], from the packed indices; Πᵀ of it is Σⱼ wᵢⱼ x̂ⱼ."""
        return self.weighted_rotated_plan(code).broadcast(weights)

    def decode_parts(self, code: Code, dtype: torch.dtype) -> ops.CodeParts:
        """The stage's code for :func:`kvstats.ops.decode_attention`: the rotation's signs and the Lloyd part (the
        kernels :meth:`scores_plan` and :meth:`weighted_rotated_plan` call). The rotation must pass
        :func:`kvstats.quant.rotations.one_pass`."""
        packed = code.payload["indices"]
        return ops.CodeParts(rotation=one_pass_signs(self.rotation, packed.device, dtype), packed=flat_keys(packed, 1),
                             norm=flat_keys(code.scalars["norm"], 0), levels=self._levels.on(packed.device, dtype),
                             bits=self.bits)

    def scores_plan(self, code: Code) -> GroupedPlan:
        """:meth:`scores` against one code, planned for many queries
        (:class:`~kvstats.quant.quantizers.base.GroupedPlan`)."""
        return GroupedPlan(self._scores_kernel, code.payload["indices"], code.scalars["norm"], key_dims=(1, 0))

    def weighted_rotated_plan(self, code: Code) -> GroupedPlan:
        """:meth:`weighted_rotated` over one code, planned for many weights."""
        return GroupedPlan(self._weighted_kernel, code.payload["indices"], code.scalars["norm"], key_dims=(1, 0))

    def _scores_kernel(self, q3: torch.Tensor, packed: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        return ops.lloyd_scores(q3, packed, norm, self._levels.on(q3.device, q3.dtype), self.bits)

    def _weighted_kernel(self, w3: torch.Tensor, packed: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        return ops.lloyd_weighted_sum(w3, packed, norm, self._levels.on(w3.device, w3.dtype), self.bits, self.dim)

    def budget(self) -> BitBudget:
        return BitBudget(payload=8 * packed_nbytes(self.dim, self.bits) / self.dim,
                         norms=dtype_bits(self.norm_dtype) / self.dim)


class LloydQuantizer(Quantizer):
    """b-bit Lloyd–Max codebook of f_d on the raw coordinates of x/‖x‖, plus ‖x‖ (no rotation).

    Args (:class:`~kvstats.quant.quantizers.config.LloydConfig`):
        bits: b in [1, 8]; dim: d ≥ 2; seed: unused (kept for the common signature).
        norm_dtype: precision ‖x‖ is stored in (fp32 default: no hidden bias; fp16 halves the cost).
    """

    name = "lloyd"
    codes_per_vector = True
    storage_options = {"norm": "norm_dtype"}
    Config = LloydConfig

    def _setup_from_config(self) -> None:
        self.rotation = self._rotation()
        self.stage = LloydStage(self.bits, self.dim, self.rotation, self._qconfig.norm_dtype)
        self.codebook = self.stage.codebook

    def _rotation(self) -> Rotation:
        return NoRotation(self.dim)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """Π x (identity for ``lloyd``)."""
        return self.rotation.forward(x)

    def _encode(self, x: torch.Tensor) -> Code:
        return self.stage.encode(x)

    def _decode(self, code: Code) -> torch.Tensor:
        return self.stage.decode_unrotated(code, acc_dtype(code.dtype))

    def _inner(self, query: torch.Tensor, code: Code) -> torch.Tensor:
        # ⟨q, Πᵀŷ⟩ = ⟨Πq, ŷ⟩: rotate the (few) queries instead of de-rotating the (many) keys, and score
        # straight from the packed indices.
        acc = acc_dtype(query.dtype)
        return self.stage.scores(self.rotate(query if query.dtype == acc else query.to(acc)), code)

    def _weighted_sum(self, weights: torch.Tensor, code: Code) -> torch.Tensor:
        # Σ w Πᵀŷ = Πᵀ Σ w ŷ: one inverse rotation per output row
        return self.rotation.inverse(self.stage.weighted_rotated(weights, code))

    def inner_plan(self, code: Code):
        if not self._plan_reproduces("_inner", LloydQuantizer):
            return super().inner_plan(code)
        scores = self.stage.scores_plan(code)
        return lambda query: scores(self.rotate(query))

    def weighted_sum_plan(self, code: Code):
        if not self._plan_reproduces("_weighted_sum", LloydQuantizer):
            return super().weighted_sum_plan(code)
        weighted = self.stage.weighted_rotated_plan(code)
        return lambda weights: self.rotation.inverse(weighted(weights))

    def decode_parts(self, code: Code, dtype: torch.dtype):
        # the plans rotate the queries (Π q) and the weighted sums back (Πᵀ y) around the stage's kernels
        if not (self._methods_of(LloydQuantizer, "inner_plan", "weighted_sum_plan", "_inner", "_weighted_sum",
                                 "rotate") and type(self.stage) is LloydStage and one_pass(self.rotation)):
            return None
        return self.stage.decode_parts(code, dtype)

    def bits_per_coordinate(self, n_tokens: int | None = None) -> BitBudget:
        return self.stage.budget()


class TurboMSE(LloydQuantizer):
    """TurboQuant_mse: random rotation Π, then the b-bit Lloyd–Max codebook of f_d per coordinate.

    Arguments other than ``rotation`` as :class:`LloydQuantizer`; the seed fixes Π
    (:class:`~kvstats.quant.quantizers.config.TurboMSEConfig`).

    Args:
        rotation: ``"wht"`` (randomized Walsh–Hadamard, O(d log d), default) or ``"haar"`` (dense QR).
    """

    name = "turbo_mse"
    Config = TurboMSEConfig

    def _rotation(self) -> Rotation:
        return make_rotation(self._qconfig.rotation, self.dim, self.seed)

    @property
    def rotation_kind(self) -> str:
        return self._qconfig.rotation

    def __repr__(self) -> str:
        return f"TurboMSE(bits={self.bits}, dim={self.dim}, seed={self.seed}, rotation={self.rotation_kind!r})"
