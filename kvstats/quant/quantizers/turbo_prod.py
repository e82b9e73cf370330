"""TurboQuant_prod: an unbiased inner-product quantizer at b bits (Zandieh et al., arXiv 2504.19874).

    stage 1:  TurboQuant_mse at b − 1 bits: ŷ = ‖x‖·c[idx] in the rotated domain (y = Π x)
    stage 2:  residual r = y − ŷ, stored as sign(S r) (m = d rows) and γ = ‖r‖
    decode:   x̂ = Πᵀ (ŷ + (c_S/d)·γ·Sᵀ sign(S r))
    inner:    ⟨q, x̂⟩ = ⟨Πq, ŷ⟩ + (c_S/d)·γ·⟨S Πq, sign(S r)⟩   — unbiased for ⟨q, x⟩

The residual is sketched in the rotated domain by default (equivalent in law for Gaussian S, and it spares a
de-rotation; ``sketch_domain="original"`` sketches Πᵀ r instead, which differs for the Hadamard sketch); ŷ uses
‖x‖ rounded to its stored precision, so decode rebuilds exactly the point the residual was taken from. For unit
x and y of uniformly random direction:
D_prod = E|⟨y,x⟩ − ⟨y,x̂⟩|² = (π/2 − 1/d)·D_mse(b−1)·‖y‖²/d with Gaussian rows (docs/references.md §3, derived;
for y ∥ x it is smaller, see :func:`kvstats.inference.turbo_prod_distortion`). At b = 1 there is no
MSE stage: the quantizer is QJL on x with m = d. Encode and scores run in the fused kernels
``turbo_prod_encode`` / ``turbo_prod_scores`` (kvstats.ops), scores straight from the packed codes.
"""

from __future__ import annotations

import torch

from kvstats._random import spawn_seeds
from kvstats.quant import ops
from kvstats.quant.packing import packed_nbytes
from kvstats.quant.quantizers._common import dtype_bits
from kvstats.quant.quantizers.base import BitBudget, Code, Quantizer
from kvstats.quant.quantizers.config import TurboProdConfig
from kvstats.quant.quantizers.lloyd import LloydStage
from kvstats.quant.quantizers.numerics import acc_dtype, saturating_cast
from kvstats.quant.quantizers.plans import GroupedPlan, flat_keys
from kvstats.quant.quantizers.qjl import SignSketch
from kvstats.quant.rotations import make_rotation, one_pass

__all__ = ["TurboProd"]


class TurboProd(Quantizer):
    """TurboQuant_prod at b bits per coordinate: (b−1)-bit TurboQuant_mse + 1-bit QJL on the residual.

    Args (:class:`~kvstats.quant.quantizers.config.TurboProdConfig`):
        bits: b in [1, 8] (b − 1 bits of MSE codes + 1 sign bit per coordinate).
        dim: d ≥ 2. seed: fixes the rotation and the sketch (independent child seeds).
        rotation: ``"wht"`` (default) or ``"haar"`` for the MSE stage.
        rows: ``"gaussian"`` (default, as in the paper), ``"orthogonal"`` or ``"srht"`` (D'Alberto's randomized
            Hadamard sketch, arXiv 2605.08114 §2.2 eq. 3; d a power of two) for the residual sketch
            (see :mod:`kvstats.quant.quantizers.qjl`).
        sketch_domain: ``"rotated"`` (default: S r, r the residual in the rotated domain, as D'Alberto §2.2 and
            TurboQuant's algorithm) or ``"original"`` (S Πᵀ r: the residual de-rotated first). Equal in law for
            Gaussian rows (S Πᵀ is Gaussian too), not for the Hadamard sketch, whose sign-sum bias depends on the
            residual's coordinates.
        norm_dtype: precision of ‖x‖ and γ (fp32 default).
    """

    name = "turbo_prod"
    codes_per_vector = True
    storage_options = {"norm": "norm_dtype", "gamma": "norm_dtype"}
    Config = TurboProdConfig

    def _setup_from_config(self) -> None:
        cfg = self._qconfig
        seed_mse, seed_qjl = spawn_seeds(self.seed, 2)
        #: stage 1, TurboQuant_mse at b − 1 bits (None at b = 1: the quantizer is QJL on x)
        self.stage = LloydStage(self.bits - 1, self.dim, make_rotation(cfg.rotation, self.dim, seed_mse),
                                cfg.norm_dtype) if self.bits > 1 else None
        # the residual lives in the MSE stage's rotated domain; "original" sketches Πᵀ r (S·Πᵀ on r)
        self.sketch = SignSketch(self.dim, self.dim, cfg.rows, seed_qjl,
                                 rotation=self.stage.rotation if cfg.sketch_domain == "original" and self.stage
                                 else None)

    @property
    def rotation_kind(self) -> str:
        return self._qconfig.rotation

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.stage is None else self.stage.rotation.forward(x)

    def _encode(self, x: torch.Tensor) -> Code:
        if self.stage is None:
            signs, gamma = self.sketch.encode(x, self.norm_dtype)
            return Code(x.shape, x.dtype, payload={"signs": signs}, scalars={"gamma": gamma})
        acc, lead = acc_dtype(x.dtype), x.shape[:-1]
        stage = self.stage.inputs(x.device, acc)
        idx, norm, signs, gamma = ops.turbo_prod_encode(
            self.stage.rotation.outer_forward(x.reshape(-1, self.dim)), stage.signs, stage.thresholds, stage.levels,
            stage.bits, self.sketch.matrix(x.device, acc), self.norm_dtype)
        mse_code = Code(x.shape, x.dtype, payload={"indices": idx.reshape(*lead, -1)},
                        scalars={"norm": norm.reshape(lead)})
        return Code(x.shape, x.dtype, payload={"signs": signs.reshape(*lead, -1)},
                    scalars={"gamma": gamma.reshape(lead)}, parts={"mse": mse_code})

    def decode_mse(self, code: Code) -> torch.Tensor:
        """x̂_mse = Πᵀ(‖x‖·c[idx]), stage 1's reconstruction alone, [..., d] in the code's dtype."""
        self.check_code(code)
        if self.stage is None:
            raise ValueError(f"{self!r} has no MSE stage at bits=1")
        return saturating_cast(self.stage.decode_unrotated(code.parts["mse"], acc_dtype(code.dtype)), code.dtype)

    def _decode(self, code: Code) -> torch.Tensor:
        acc = acc_dtype(code.dtype)
        if self.stage is None:
            return self.sketch.reconstruct(code.payload["signs"], code.scalars["gamma"], acc)
        # x̂ = Πᵀ(ŷ + (c_S/d)·γ·Sᵀ b). Πᵀ is linear: Πᵀŷ comes de-rotated from lloyd_decode, and Πᵀ Sᵀ b = (S Π)ᵀ b
        # from the byte tables of S Π (rows of S de-rotated once), so no pass of Πᵀ over the keys remains.
        s_pi, tables = self._derotated_sketch(code.device, acc)
        mse = code.parts["mse"]
        if tables is not None and self.stage.rotation.in_kernel:
            # One kernel: each row's MSE part decoded and its sign part added while in cache.
            packed, signs = mse.payload["indices"], code.payload["signs"]
            stage = self.stage.inputs(code.device, acc)
            weight = self.sketch.weights(code.scalars["gamma"], acc)
            x_hat = ops.turbo_prod_decode(
                packed.reshape(-1, packed.shape[-1]), mse.scalars["norm"].reshape(-1), stage.signs, stage.levels,
                stage.bits, self.dim, signs.reshape(-1, signs.shape[-1]), tables, weight.reshape(-1))
            return x_hat.view(code.shape)
        x_hat = self.stage.decode_unrotated(mse, acc)
        x_hat = self.sketch.reconstruct(code.payload["signs"], code.scalars["gamma"], acc, basis=(s_pi, tables),
                                        base=x_hat)
        return x_hat

    def _derotated_sketch(self, device: torch.device, acc: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(S Π [m, d] (row i: Πᵀ sᵢ), its byte tables), built once per (device, dtype)."""
        cache = self.__dict__.setdefault("_derotated_cache", {})
        key = (torch.device(device), acc)
        if key not in cache:
            s_pi = self.stage.rotation.inverse(self.sketch.matrix(device, acc)).contiguous()
            cache[key] = (s_pi, ops.sign_tables(s_pi))
        return cache[key]

    def _inner(self, query: torch.Tensor, code: Code) -> torch.Tensor:
        q = self._rotate(query.to(acc_dtype(query.dtype)))
        if self.stage is None:
            return self.sketch.estimate(q, code.payload["signs"], code.scalars["gamma"])
        return self._scores_plan(code).broadcast(q)

    def _scores_plan(self, code: Code) -> GroupedPlan:
        """Scores of rotated queries against both stages' codes, planned for one code (b ≥ 2)."""
        mse = code.parts["mse"]
        return GroupedPlan(self._scores_kernel, mse.payload["indices"], mse.scalars["norm"], code.payload["signs"],
                           code.scalars["gamma"], key_dims=(1, 0, 1, 0))

    def _scores_kernel(self, q3, idx, norm, signs, gamma) -> torch.Tensor:
        """Scores [G, n_q, n_k] of rotated queries q3 [G, n_q, d] against both stages' codes in the kernels' layout."""
        return ops.turbo_prod_scores(q3, ops.rows_matmul(q3, self.sketch.matrix(q3.device, q3.dtype).T), idx, norm,
                                     self.stage.levels(q3.device, q3.dtype), self.stage.bits, signs, gamma,
                                     self.sketch.scale / self.sketch.m)

    def _weighted_sum(self, weights: torch.Tensor, code: Code) -> torch.Tensor:
        # Σ w x̂ = Πᵀ(Σ w ŷ + Sᵀ Σ w (c_S/d)·γ·b): both parts from the codes, one inverse rotation per output row
        signed = self.sketch.weighted_sum(weights, code.payload["signs"], code.scalars["gamma"])
        if self.stage is None:
            return signed
        return self.stage.rotation.inverse(self.stage.weighted_rotated(weights, code.parts["mse"]) + signed)

    def inner_plan(self, code: Code):
        if self.stage is None or not self._plan_reproduces("_inner", TurboProd):
            return super().inner_plan(code)
        scores = self._scores_plan(code)
        return lambda query: scores(self._rotate(query))

    def weighted_sum_plan(self, code: Code):
        if not self._plan_reproduces("_weighted_sum", TurboProd):
            return super().weighted_sum_plan(code)
        signed = self.sketch.weighted_sum_plan(code.payload["signs"], code.scalars["gamma"])
        if self.stage is None:
            return signed
        mse = self.stage.weighted_rotated_plan(code.parts["mse"])
        return lambda weights: self.stage.rotation.inverse(mse(weights) + signed(weights))

    def decode_parts(self, code: Code, dtype: torch.dtype):
        # scores: turbo_prod_scores(Π q, S Π q, …) (qjl_scores(S q, …) at b = 1); sums: Πᵀ(Lloyd part + Sᵀ · signs)
        if not (self._methods_of(TurboProd, "inner_plan", "weighted_sum_plan", "_inner", "_weighted_sum", "_rotate",
                                 "_scores_kernel", "_scores_plan") and type(self.sketch) is SignSketch):
            return None
        signs = code.payload["signs"]
        sign_part = {"sketch": self.sketch.matrix(signs.device, dtype), "signs": flat_keys(signs, 1),
                     "sign_norm": flat_keys(code.scalars["gamma"], 0), "sign_scale": self.sketch.scale / self.sketch.m}
        if self.stage is None:
            return ops.CodeParts(**sign_part)
        if type(self.stage) is not LloydStage or not one_pass(self.stage.rotation):
            return None
        return self.stage.decode_parts(code.parts["mse"], dtype)._replace(**sign_part)

    def bits_per_coordinate(self, n_tokens: int | None = None) -> BitBudget:
        sign_bits = BitBudget(payload=8 * packed_nbytes(self.dim, 1) / self.dim,
                              norms=dtype_bits(self.norm_dtype) / self.dim)
        return sign_bits if self.stage is None else sign_bits + self.stage.budget()

    def __repr__(self) -> str:
        return (f"TurboProd(bits={self.bits}, dim={self.dim}, seed={self.seed}, rotation={self.rotation_kind!r}, "
                f"rows={self.rows!r})")
