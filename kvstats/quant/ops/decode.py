"""One decode step of attention from the codes in one call (``decode_attention``), for a cache's generation loop.

For G key groups (batch × KV heads), each with the n_q queries q [G, n_q, d] of its GQA group, n_code keys read
through the K quantizer's codes and an exact window win_k / win_v [G, w, d] (the latest tokens, kept in full
precision):

    logits  = [scores of q against the K codes of keys 0 … n_code − 1,  q · win_kᵀ] · scaling
    logits  = softcap · tanh(logits / softcap)                  (Gemma 2's soft capping, when given)
    weights = softmax(logits)  (with one sink logit per query row joining the sum and dropped, gpt-oss's s_aux)
    out     = weights[…, n_code:] @ win_v  +  Σ_{j < n_code} weights_j · v̂_j     (v̂ never decoded)

Each side's codes come as :class:`CodeParts`: an optional one-pass randomized-Hadamard rotation (signs s: the
queries are scored as fwht(q · s), a weighted sum y is rotated back as fwht(y) · s), a Lloyd part (``lloyd_*``
ops) and/or a QJL sign part (``qjl_*`` ops; ``turbo_prod_scores`` when both). The op is those ops and ATen's
matmul and softmax in the order the unfused path calls them (``KVStatsLayer._attend_last`` with the quantizers'
plans), so a cache's decode step returns the same numbers either way; it exists to remove the Python between
the ops (about 40 calls per layer and generated token). Kernels: ``cuda_ext/csrc/decode_attention.cpp`` (one
composition, registered for the CPU, the shared backend and CUDA). A step whose output is not finite (a logit or a
sum overflowed the accumulation dtype) is refused by name on every path, as are non-finite sinks and a scaling
beyond q's dtype: the op returns right numbers or none.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from kvstats.quant.ops import _library as lib
from kvstats.quant.ops.hadamard import fwht, fwht_reference
from kvstats.quant.ops.lloyd import (
    lloyd_scores,
    lloyd_scores_reference,
    lloyd_weighted_sum,
    lloyd_weighted_sum_reference,
)
from kvstats.quant.ops.qjl import qjl_scores, qjl_scores_reference, qjl_weighted_sum, qjl_weighted_sum_reference
from kvstats.quant.ops.turbo_prod import turbo_prod_scores, turbo_prod_scores_reference

__all__ = ["CodeParts", "ROWS_ONE_BY_ONE", "decode_attention", "decode_attention_reference",
           "decode_attention_unfused", "rows_matmul"]

OP = "decode_attention"

#: Up to this many rows, :func:`rows_matmul` multiplies each row by itself (a decode step's queries: B·H_q rows).
ROWS_ONE_BY_ONE = 64


def rows_matmul(x: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ matrix [K, N] -> [..., N], thread-count independent for up to :data:`ROWS_ONE_BY_ONE` rows.

    A BLAS product of few rows may split its K-term sums between threads (MKL's sgemm at 9 rows × 64 × 64 gives
    other last bits at 1 and at 2 threads), so a decode step's sketch products — the QJL parts' S q and Sᵀ y —
    would depend on the thread count. Up to :data:`ROWS_ONE_BY_ONE` rows each row is its own product (``bmm`` of
    [R, 1, K] by the matrix expanded to [R, K, N]: one sum per output element, whole in one thread); more rows
    (a prefill, a study's many queries) go to one ``matmul``. The fused decode step uses the same rule."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows == 0 or rows > ROWS_ONE_BY_ONE:
        return x @ matrix
    out = torch.bmm(x.reshape(rows, 1, x.shape[-1]), matrix.expand(rows, *matrix.shape))
    return out.view(*x.shape[:-1], matrix.shape[-1])


class CodeParts(NamedTuple):
    """One side's codes (K or V) as :func:`decode_attention` reads them, flattened to G = batch × KV heads groups.

    rotation: signs s [d] of a one-pass randomized Hadamard rotation Π = H·diag(s)/√d, or None (Π = I).
    packed, norm, levels, bits: a Lloyd part — codes [G, n_k, ceil(d·bits/8)], ‖x‖ [G, n_k], levels [2^bits]
    (``lloyd_scores`` / ``lloyd_weighted_sum``), or None.
    sketch, signs, sign_norm, sign_scale: a QJL sign part — S [m, d], packed signs [G, n_k, ceil(m/8)], the
    per-key factor [G, n_k] and the scale c/m (``qjl_scores`` / ``qjl_weighted_sum``, then Sᵀ), or None.
    Tensors in the accumulation dtype of the queries (the codes uint8, the norms as stored).
    """

    rotation: torch.Tensor | None = None
    packed: torch.Tensor | None = None
    norm: torch.Tensor | None = None
    levels: torch.Tensor | None = None
    bits: int = 0
    sketch: torch.Tensor | None = None
    signs: torch.Tensor | None = None
    sign_norm: torch.Tensor | None = None
    sign_scale: float = 0.0

    @property
    def keys(self) -> int:
        """n_k, the keys the codes hold."""
        return (self.packed if self.packed is not None else self.signs).shape[1]


def _check_part(side: str, parts: tuple, q: torch.Tensor, n_code: int) -> None:
    rotation, packed, norm, levels, bits, sketch, signs, sign_norm, sign_scale = parts
    groups, d = q.shape[0], q.shape[2]
    if not ((packed is None) == (norm is None) == (levels is None)):
        raise ValueError(f"{OP}: {side}_packed, {side}_norm and {side}_levels must be given together (a Lloyd part)")
    if not ((sketch is None) == (signs is None) == (sign_norm is None)):
        raise ValueError(f"{OP}: {side}_sketch, {side}_signs and {side}_sign_norm must be given together (a sign "
                         f"part)")
    if packed is None and sketch is None:
        raise ValueError(f"{OP}: n_code = {n_code} keys need the {side} codes: a Lloyd part, a sign part or both")
    if rotation is not None:
        lib.check_device(q, rotation, OP, f"{side}_rotation")
        if rotation.dim() != 1 or rotation.shape[0] != d:
            raise ValueError(f"{OP}: {side}_rotation must be [{d}] (the signs of one Hadamard pass), got "
                             f"{tuple(rotation.shape)}")
        lib.check_dtype(rotation, q.dtype, OP, f"{side}_rotation")
    if sketch is not None:
        lib.check_device(q, sketch, OP, f"{side}_sketch")
        if sketch.dim() != 2 or sketch.shape[1] != d:
            raise ValueError(f"{OP}: {side}_sketch must be [m, {d}], got {tuple(sketch.shape)}")
        lib.check_dtype(sketch, q.dtype, OP, f"{side}_sketch")
    if packed is not None:
        if not 1 <= bits <= 8:
            raise ValueError(f"{OP}: {side}_bits must be in [1, 8], got {bits}")
        lib.check_device(q, levels, OP, f"{side}_levels")
        if levels.dim() != 1 or levels.shape[0] != 1 << bits:
            raise ValueError(f"{OP}: {side}_levels must be 1-D of length 2^{side}_bits = {1 << bits}, got "
                             f"{tuple(levels.shape)}")
        lib.check_dtype(levels, q.dtype, OP, f"{side}_levels")
    if sketch is not None and not math.isfinite(sign_scale):
        raise ValueError(f"{OP}: {side}_sign_scale must be finite, got {sign_scale}")
    # codes [G, n_k >= n_code, bytes of a row] uint8 and their per-key factors [G, n_k] float, on q's device
    m = sketch.shape[0] if sketch is not None else 0
    for name, codes, factor_name, factor, row in (("packed", packed, "norm", norm, lib.packed_nbytes(d, bits)),
                                                  ("signs", signs, "sign_norm", sign_norm, lib.packed_nbytes(m, 1))):
        if codes is None:
            continue
        lib.check_device(q, codes, OP, f"{side}_{name}")
        lib.check_device(q, factor, OP, f"{side}_{factor_name}")
        lib.check_dtype(codes, torch.uint8, OP, f"{side}_{name}")
        if codes.dim() != 3 or codes.shape[0] != groups or codes.shape[1] < n_code or codes.shape[2] != row:
            raise ValueError(f"{OP}: {side}_{name} must be [{groups}, n_k >= n_code = {n_code}, {row}], got "
                             f"{tuple(codes.shape)}")
        if factor.dim() != 2 or tuple(factor.shape) != tuple(codes.shape[:2]):
            raise ValueError(f"{OP}: {side}_{factor_name} must be [{groups}, {codes.shape[1]}] (one per key of "
                             f"{side}_{name}), got {tuple(factor.shape)}")
        lib.check_float(factor, OP, f"{side}_{factor_name}")
    if packed is not None and signs is not None and packed.shape[1] != signs.shape[1]:
        raise ValueError(f"{OP}: {side}_packed and {side}_signs must hold the same keys, got {packed.shape[1]} and "
                         f"{signs.shape[1]}")


@lib.register_fake(OP)
def decode_attention_fake(q, win_k, win_v, n_code: int, scaling: float, softcap, sinks, *parts):
    """q [G, n_q, d] fp32/fp64, win_k / win_v [G, w, d] in q's dtype, n_code ≥ 0 code keys, the K and V parts
    (:class:`CodeParts`, nine arguments each: k_rotation … k_sign_scale, v_rotation … v_sign_scale) -> empty
    (out [G, n_q, d], weights [G, n_q, n_code + w])."""
    if q.dim() != 3:
        raise ValueError(f"{OP}: q must be [G, n_q, d], got {tuple(q.shape)}")
    lib.check_dtype(q, (torch.float32, torch.float64), OP, "q")
    for name, t in (("win_k", win_k), ("win_v", win_v)):
        lib.check_device(q, t, OP, name)
        if t.dim() != 3 or t.shape[0] != q.shape[0] or t.shape[2] != q.shape[2]:
            raise ValueError(f"{OP}: {name} must be [{q.shape[0]}, w, {q.shape[2]}], got {tuple(t.shape)}")
        lib.check_dtype(t, q.dtype, OP, name)
    if win_k.shape[1] != win_v.shape[1]:
        raise ValueError(f"{OP}: win_k and win_v must hold the same tokens, got {win_k.shape[1]} and {win_v.shape[1]}")
    if n_code < 0:
        raise ValueError(f"{OP}: n_code must be >= 0, got {n_code}")
    if n_code + win_k.shape[1] < 1:
        raise ValueError(f"{OP}: a step needs at least one key, got n_code = 0 and an empty window")
    largest = torch.finfo(q.dtype).max if q.dtype in (torch.float32, torch.float64) else math.inf
    if not (math.isfinite(scaling) and abs(scaling) <= largest):
        raise ValueError(f"{OP}: scaling must be finite in {q.dtype} (|scaling| <= {largest:g}), got {scaling}")
    if softcap is not None and not (math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"{OP}: softcap must be a finite positive number or None, got {softcap}")
    if sinks is not None:
        lib.check_device(q, sinks, OP, "sinks")
        if tuple(sinks.shape) != tuple(q.shape[:2]):
            raise ValueError(f"{OP}: sinks must be [{q.shape[0]}, {q.shape[1]}] (one logit per query row), got "
                             f"{tuple(sinks.shape)}")
        lib.check_dtype(sinks, q.dtype, OP, "sinks")
    if len(parts) != 18:
        raise TypeError(f"{OP}: takes nine arguments for each of the K and V parts, got {len(parts)}")
    if n_code > 0:
        _check_part("k", parts[:9], q, n_code)
        _check_part("v", parts[9:], q, n_code)
    return q.new_empty(q.shape), q.new_empty(q.shape[0], q.shape[1], n_code + win_k.shape[1])


def _code_scores(q, k: CodeParts, reference: bool) -> torch.Tensor:
    """Scores [G, n_q, n_k] of q against every key of the K codes (the K quantizers' ``inner_plan``)."""
    rotate = fwht_reference if reference else fwht
    qr = rotate(q * k.rotation) if k.rotation is not None else q
    if k.packed is not None and k.sketch is not None:
        f = turbo_prod_scores_reference if reference else turbo_prod_scores
        return f(qr, rows_matmul(qr, k.sketch.T), k.packed, k.norm, k.levels, k.bits, k.signs, k.sign_norm,
                 k.sign_scale)
    if k.packed is not None:
        return (lloyd_scores_reference if reference else lloyd_scores)(qr, k.packed, k.norm, k.levels, k.bits)
    return (qjl_scores_reference if reference else qjl_scores)(rows_matmul(qr, k.sketch.T), k.signs, k.sign_norm,
                                                               k.sign_scale)


def _code_values(w, v: CodeParts, d: int, reference: bool) -> torch.Tensor:
    """Σⱼ wᵢⱼ v̂ⱼ [G, n_q, d] over every key of the V codes (the V quantizers' ``weighted_sum_plan``)."""
    out = None
    if v.packed is not None:
        f = lloyd_weighted_sum_reference if reference else lloyd_weighted_sum
        out = f(w, v.packed, v.norm, v.levels, v.bits, d)
    if v.sketch is not None:
        f = qjl_weighted_sum_reference if reference else qjl_weighted_sum
        signed = rows_matmul(f(w, v.signs, v.sign_norm, v.sign_scale, v.sketch.shape[0]), v.sketch)
        out = signed if out is None else out + signed
    if v.rotation is None:
        return out
    return (fwht_reference if reference else fwht)(out) * v.rotation


def _compose(q, win_k, win_v, n_code: int, scaling: float, softcap, sinks, k: CodeParts, v: CodeParts,
             reference: bool):
    exact = (q.unsqueeze(0) @ win_k.unsqueeze(0).transpose(-1, -2)).squeeze(0)
    logits = torch.cat([_code_scores(q, k, reference)[..., :n_code], exact], -1) if n_code else exact
    logits.mul_(scaling)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if sinks is None:
        weights = torch.softmax(logits, -1)
    else:
        weights = torch.softmax(torch.cat([logits, sinks.unsqueeze(-1)], -1), -1)[..., :-1].contiguous()
    out = (weights[..., n_code:].unsqueeze(0) @ win_v.unsqueeze(0)).squeeze(0)
    if n_code:
        w = weights[..., :n_code]
        if v.keys > n_code:  # codes ahead of the quantized tokens: weight 0
            w = F.pad(w, (0, v.keys - n_code))
        out += _code_values(w, v, q.shape[2], reference)
    return out, weights


def _checked_step(q, win_k, win_v, n_code: int, scaling: float, softcap, sinks, k: CodeParts, v: CodeParts,
                  reference: bool):
    """:func:`_compose` after the fake's checks and the checks of values the fake cannot see (finite sinks), with
    its output refused when not finite (as the kernel's)."""
    decode_attention_fake(q, win_k, win_v, n_code, scaling, softcap, sinks, *k, *v)
    if sinks is not None and not bool(torch.isfinite(sinks).all()):
        raise ValueError(f"{OP}: sinks must be finite, got {sinks[~torch.isfinite(sinks)].flatten()[0].item()}")
    out, weights = _compose(q, win_k, win_v, n_code, scaling, softcap, sinks, k, v, reference)
    if not bool(torch.isfinite(out).all()):
        raise ValueError(f"{OP}: the output is not finite (a logit or a weighted sum overflowed {q.dtype}, or q or "
                         "the window hold a non-finite value); rescale the inputs or pass float64")
    return out, weights


def decode_attention_reference(q, win_k, win_v, n_code: int, scaling: float, softcap, sinks, *parts):
    """The op in pure torch on the ops' references (arguments as :func:`decode_attention_fake`)."""
    return _checked_step(q, win_k, win_v, n_code, scaling, softcap, sinks, CodeParts(*parts[:9]),
                         CodeParts(*parts[9:]), reference=True)


def decode_attention_unfused(q, win_k, win_v, n_code: int, scaling: float, softcap, sinks, k: CodeParts,
                             v: CodeParts):
    """The op as separate calls of the library's ops (each on its kernel where one is built): the definition the
    fused kernel must equal bit for bit (tests)."""
    return _checked_step(q, win_k, win_v, n_code, scaling, softcap, sinks, k, v, reference=False)


def decode_attention(q, win_k, win_v, n_code: int, scaling: float, softcap: float | None,
                     sinks: torch.Tensor | None, *parts):
    """(out [G, n_q, d], weights [G, n_q, n_code + w]) of one decode step (module docstring); ``parts``: the K
    and V :class:`CodeParts` unpacked (``*k, *v``: nine arguments each; ``CodeParts()`` where n_code is 0)."""
    op = lib.kernel(OP, q.device)
    if op is not None:
        return op(q, win_k, win_v, n_code, scaling, softcap, sinks, *parts)
    return decode_attention_reference(q, win_k, win_v, n_code, scaling, softcap, sinks, *parts)
