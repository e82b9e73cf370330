"""The study's declarations and its cell: SmolLM2's captures of the two texts, the schemes (NOVA-KV calibrated on
the calibration text), and per layer and seed every scheme's unit rows, with NOVA-KV's Parseval, grouping and
ablation rows."""

from __future__ import annotations

import functools
import hashlib
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from kvstats.hf.models import SMOLLM2
from kvstats.measure import metrics
from kvstats.quant import attention
from kvstats.quant.quantizers.nova import (
    NovaCalibration,
    NovaQuantizer,
    PerHeadQuantizer,
    kmeans_codebook,
    one_thread,
    parseval_terms,
)
from kvstats.quant.rotations import make_rotation
from kvstats.quant.schemes import NovaScheme, Scheme, scheme
from kvstats.study.models import LABELS
from kvstats.study.sweep import cell_seed

STUDY = "nova"
VERSION = "8"  # 8: sliding-window layers attend within their window (Gemma 3); the sink's attention mass from the
# causal softmax (before, the unmasked one); 7: the rotation + group VQ value arm; 6: the transform × quantizer
# ablation and the value-transform rows; 5: kqv/qkqv with rows="srht"
#: the QJL stages of the kqv/qkqv baselines: D'Alberto's eq. 3 sketch (his schemes, his definition; as end_to_end)
QJL_ROWS = "srht"
BUDGETS = (2, 3)
OBLIVIOUS = ("kqv", "qkqv", "kv", "minmax")
SPLIT_AT = "The Preamble to the Constitution"
TEXTS = ("declaration", "constitution_lincoln")  # (calibration, held-out)
SCALE = {
    "quick": {"layers": tuple(range(0, 30, 5)), "seeds": (0,), "n_q": 64, "insample": False},
    "paper": {"layers": tuple(range(30)), "seeds": (0,), "n_q": 256, "insample": True},
}
#: The everyday paper tier: every third layer (10 layers, 30 (layer, KV head) test units per scheme: a Wilcoxon over 30
#: units still reaches p = 2/2^30 ≈ 1.9e-9, and the full tier's effects at n = 2 are r = -0.94 to -1.00);
#: the full tier: all 30 layers and the second model's rows (kvstats.study.models.SCALE_MODELS)
SCALE["full"] = SCALE["paper"]
SCALE["paper"] = {**SCALE["full"], "layers": tuple(range(0, 30, 3))}

METRICS = {"kl": ("attention KL [nats]", True, "low"), "top5": ("top-5 recall", False, "high"),
           "output_error": ("attention-output rel. error", True, "low"),
           "kl_sink_exact": ("KL, token 0 (sink) kept exact", True, "low"),
           "top5_sink_exact": ("top-5 recall, token 0 kept exact", False, "high")}
#: the metrics each "NOVA beats the scalar methods" comparison is a cell of, and the better direction's sign of
#: the matched-pairs rank-biserial r of (nova − other): lower KL (r < 0), higher top-5 recall (r > 0)
CLAIM_METRICS = {"kl": -1, "top5": +1}
ALPHA = 0.05
#: tolerance of the Parseval identity ‖y − ŷ‖² = (k − k̂)ᵀ Σ_Q (k − k̂) with fp16 side information: T is rounded
#: to fp16, so TᵀT equals Σ_Q to about 1e-3 relative (kvstats.quant.quantizers.nova)
PARSEVAL_RTOL = 1e-3
#: NOVA-KV's published storage at its 2-bit setting (arXiv 2608.04074), as printed
PUBLISHED_BITS = "2.22"
#: resamples of the bootstrap CI of the Wilcoxon effect size (the p-value does not depend on it)
WILCOXON_RESAMPLES = 999
#: budgets of the stratified-vs-contiguous grouping rows: the paper's 2-bit setting (4 coefficients per group)
GROUPING_BUDGETS = (2,)
#: the ablation's arms (:func:`ablation_scheme`): (key transform, key quantizer, value codec), all calibrated on the
#: calibration text with nova's seed, so an arm differs from nova in the named factor only. "vq": NOVA-KV's
#: stratified group VQ (g = 8 // b); "scalar": the same machinery with g = 1 (a per-coefficient k-means codebook
#: of 2^b levels with the per-token RMS scale: a trained Lloyd–Max scalar quantizer, stronger than fixed-width)
ABLATION_ARMS = {"nova": ("attention", "vq", "rotated_minmax"),
                 "nova_scalar": ("attention", "scalar", "rotated_minmax"),
                 "rot_vq": ("rotation", "vq", "rotated_minmax"),
                 "rot_scalar": ("rotation", "scalar", "rotated_minmax"),
                 "nova_values": ("attention", "vq", "nova"),
                 "rot_values": ("attention", "vq", "rotated_vq")}
#: the budgets of the ablation rows: the paper's 2-bit setting
ABLATION_BUDGETS = (2,)
#: the ablation's paired comparisons: claim -> [(arm a, arm b, what a − b isolates)], metrics, expected sign of r
#: (a − b; negative: a lower). The transform claim holds the quantizer fixed, the quantizer claim the transform.
ABLATION_FAMILIES = {
    "transform": ([("nova", "rot_vq", "with group VQ"), ("nova_scalar", "rot_scalar", "with scalar")],
                  CLAIM_METRICS),
    "quantizer": ([("nova", "nova_scalar", "attention transform"), ("rot_vq", "rot_scalar", "rotation")],
                  CLAIM_METRICS),
    "values": ([("nova_values", "rot_values", "value transform alone: group VQ in both, keys identical")],
               {"output_error": -1}),
    "value_quantizer": ([("rot_values", "nova", "value quantizer alone: rotation in both, keys identical"),
                         ("nova_values", "nova", "transform and quantizer together, keys identical")],
                        {"output_error": -1}),
}


def texts() -> dict[str, str]:
    """The shipped text cut in two: the Declaration (calibration) and the rest (held out)."""
    from kvstats.hf.capture import default_text

    full = default_text()
    i = full.index(SPLIT_AT)
    return {TEXTS[0]: full[:i].strip(), TEXTS[1]: full[i:].strip()}


def model_layers(cfg: dict, model: str) -> list[int]:
    """The scale's layers that ``model`` has (SCALE's are SmolLM2's 30)."""
    from kvstats.hf.models import SHIPPED_MODELS

    return [i for i in cfg["layers"] if i < SHIPPED_MODELS[model].layers]


def capture_path(name: str, model: str = SMOLLM2) -> Path:
    from kvstats.hf.capture import cache_dir

    text = texts()[name]
    return cache_dir() / f"{LABELS[model]}_{name}_{hashlib.sha256(text.encode()).hexdigest()[:10]}.safetensors"


def ensure_captures(model: str = SMOLLM2) -> None:
    """Capture ``model``'s Q/K/V over both parts once (cached beside the default capture)."""
    from kvstats.hf.capture import cached_capture_ok, capture

    for name in TEXTS:
        path = capture_path(name, model)
        if not cached_capture_ok(path):
            print(f"capturing {model} Q/K/V over '{name}' into {path} ...", file=sys.stderr, flush=True)
            capture(model, text=texts()[name], out=path)


@functools.lru_cache(maxsize=4)
def _file(name: str, model: str = SMOLLM2):
    from kvstats.data.io import load_qkv

    return load_qkv(capture_path(name, model))


def layer_qkv(name: str, layer: int, model: str = SMOLLM2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    f = _file(name, model)
    return f.queries(layer).float(), f.keys(layer).float(), f.values(layer).float()


def layer_window(name: str, layer: int, model: str = SMOLLM2) -> int | None:
    """The sliding window of ``layer`` as the capture records it (None: full attention), after checking that the
    layer's logits are what every scheme here computes, ``q·kᵀ/√d`` with no soft cap: a model whose layer scales
    otherwise or soft-caps is refused, naming the layer (its attention would be measured against the wrong
    softmax)."""
    from kvstats.hf.models import SHIPPED_MODELS

    f = _file(name, model)
    d = int(f.keys(layer).shape[-1])
    rules = {a["layer"]: a for a in f.metadata.get("attention") or []}
    if layer not in rules and SHIPPED_MODELS[model].sliding_layers:
        raise ValueError(f"{model} has {SHIPPED_MODELS[model].sliding_layers} sliding-window layers but the capture "
                         f"{capture_path(name, model).name} records no attention rule for layer {layer}: its window "
                         "is unknown; capture it again (kvstats.hf.capture records each layer's rule)")
    rule = rules.get(layer, {})
    scaling = rule.get("scaling", f.metadata.get("attn_scaling", 1 / math.sqrt(d)))
    if not math.isclose(scaling, 1 / math.sqrt(d), rel_tol=1e-9):
        raise ValueError(f"{model} layer {layer} scales its logits by {scaling!r}, not 1/sqrt(d) = "
                         f"{1 / math.sqrt(d)!r}: the nova study's schemes and metrics use 1/sqrt(d)")
    if rule.get("softcap") is not None:
        raise ValueError(f"{model} layer {layer} soft-caps its logits (softcap = {rule['softcap']!r}): the nova "
                         "study's metrics have no soft cap")
    window = rule.get("sliding_window")
    return None if window is None else int(window)


def make_scheme(name: str, n: int, d: int, seed: int, calib=None) -> Scheme:
    """kv/kqv/qkqv (kvstats.schemes, fp32 norms; QJL stages with :data:`QJL_ROWS`), minmax (as budget_sweep),
    nova (calibrated on ``calib``)."""
    if name == "minmax":
        return scheme("minmax", bits=n, dim=d, seed=seed)
    if name.startswith("nova"):
        q, k, v = calib
        return NovaScheme.calibrate(q, k, v, bits=n, seed=seed)
    if name in ("kqv", "qkqv"):
        return scheme(name, bits=n, dim=d, seed=seed, rows=QJL_ROWS)
    return scheme(name, bits=n, dim=d, seed=seed)


def regrouped(head: NovaQuantizer, keys: torch.Tensor, order: torch.Tensor) -> NovaQuantizer:
    """``head`` (calibrated) with its coefficients stored in another eigen-rank ``order`` and codebooks refitted.

    ``order[p]`` is the eigen-rank stored at position p (group-major: group j holds positions j·g … j·g + g − 1);
    ``torch.arange(d)`` gives contiguous groups (ranks j·g … j·g + g − 1 in group j: very unequal volumes),
    :func:`kvstats.quant.quantizers.nova.stratified_ranks` NOVA-KV's own grouping (rank r → group r mod G). The
    transform's rows are only permuted (same fp16 values), the codebooks are refitted on the calibration
    ``keys`` [n, d] exactly as :meth:`NovaQuantizer.calibrate` fits them (same seed, same iterations): only the
    grouping differs.
    """
    cal, d, g = head.calibration, head.dim, head.group_dim
    order = torch.as_tensor(order, dtype=torch.int64)
    if sorted(order.tolist()) != list(range(d)):
        raise ValueError(f"order must be a permutation of 0..{d - 1}, got {order.tolist()}")
    position = torch.empty_like(cal.ranks)
    position[cal.ranks] = torch.arange(d)  # where each eigen-rank sits in ``head``
    rows = position[order]
    t = cal.transform[rows]
    with one_thread():  # as NovaQuantizer.calibrate: the k-means must see the same last bits at any thread count
        y = (keys.reshape(-1, d).double() - cal.mean) @ t.T
    rms = torch.linalg.vector_norm(y, dim=-1, keepdim=True) / math.sqrt(d)
    u = (y / torch.where(rms > 0, rms, torch.ones_like(rms))).reshape(-1, head.groups, g).numpy()
    books = kmeans_codebook(u.transpose(1, 0, 2), head.codebook_size, head.seed, head.kmeans_iters)
    books = torch.from_numpy(books).to(head.side_dtype).double()
    new = NovaCalibration(transform=t, inverse=torch.linalg.inv(t), mean=cal.mean, codebooks=books,
                          eigenvalues=cal.eigenvalues[rows], ranks=order, sigma_q=cal.sigma_q, ridge=cal.ridge,
                          n_queries=cal.n_queries, n_keys=cal.n_keys)
    return NovaQuantizer(head.bits, d, head.seed, group_dim=g, ridge=head.ridge, kmeans_iters=head.kmeans_iters,
                         scale_dtype=head.scale_dtype, side_dtype=head.side_dtype,
                         amortize_tokens=head.amortize_tokens, calibration=new)


def contiguous(s: NovaScheme, keys: torch.Tensor) -> Scheme:
    """``s`` with every KV head's groups contiguous in eigen-rank (:func:`regrouped`); keys [1, H_kv, S, d]."""
    heads = [regrouped(h, keys[:, i], torch.arange(s.dim)) for i, h in enumerate(s.k.heads)]
    return Scheme("nova_contiguous", s.bits, PerHeadQuantizer(heads), s.v, s.seed)


def _bits(s: Scheme, name: str, tokens: int) -> dict[str, float]:
    if name == "minmax":
        k = s.k.bits_per_coordinate(tokens).total
    elif name.startswith("nova"):
        k = s.k.bits_per_coordinate(n_tokens=tokens).total
    else:
        k = s.k.bits_per_coordinate().total
    out = {"bits_k": k, "bits_v": s.v.bits_per_coordinate().total}
    if name.startswith("nova"):
        out["bits_k_128k"] = s.k.bits_per_coordinate().total
    return out


def cell(layer: int, seed: int, n_q: int, insample: bool, model: str = SMOLLM2) -> list[dict]:
    """One layer and seed: every scheme at every budget, one row per query head; Parseval rows for nova. A
    sliding-window layer (Gemma 3) attends within its window, as the model does."""
    q_cal, k_cal, v_cal = layer_qkv(TEXTS[0], layer, model)
    q, k, v = layer_qkv(TEXTS[1], layer, model)
    window = layer_window(TEXTS[1], layer, model)
    d, hq, hkv, s_len = k.shape[-1], q.shape[1], k.shape[1], k.shape[2]
    g = hq // hkv
    qn = q[:, :, -n_q:]
    ref = metrics.attention_scores(qn, k, double=True)
    # one reference serves every scheme: its log-softmax (KL) and top-5 sets are computed once per cell
    kl_ref = metrics.AttentionReference(ref, causal=True, window=window)
    # ranking (top-5) in fp32: sorting fp64 costs twice as much, ties are not an issue
    top_ref = metrics.AttentionReference(ref.float(), causal=True, window=window)
    visible = kl_ref.visible
    o_ref = attention.attend(ref, v.double(), visible)
    # [hq, n_q]: token 0's share of the (causal, windowed) attention; 0 where the window no longer holds it
    sink_mass = attention.attention_weights(ref, visible)[0, ..., 0]
    rows = []
    names = ("nova",) + (("nova_insample",) if insample else ()) + OBLIVIOUS
    for n in BUDGETS:
        for name in names:
            sd = cell_seed(STUDY, name, n, layer, seed)
            calib = (q_cal, k_cal, v_cal) if name == "nova" else (q, k, v)
            t0 = time.perf_counter()
            s = make_scheme(name, n, d, sd, calib)
            code = s.encode(k, v)
            est = (s.scores(qn, code) / math.sqrt(d)).double()
            o_hat = s.attention(qn, code, causal=True, window=window).double()
            seconds = time.perf_counter() - t0
            kl = kl_ref.kl(est, reduction="none")[0]  # [hq, n_q]
            top5 = top_ref.topk_recall(est.float(), top_k=5, reduction="none")[0]
            # the attention sink (token 0) kept in full precision: encode tokens 1.. only, exact logit for 0
            rest = s.encode(k[:, :, 1:].contiguous(), v[:, :, 1:].contiguous())
            est_s = torch.cat([ref[..., :1], (s.scores(qn, rest) / math.sqrt(d)).double()], -1)
            kl_s = kl_ref.kl(est_s, reduction="none")[0]
            top5_s = top_ref.topk_recall(est_s.float(), top_k=5, reduction="none")[0]
            raw_err = (est - ref) * math.sqrt(d)  # [1, hq, n_q, S] raw logit errors
            abs_err = raw_err.abs()[0]
            err_sink = abs_err[..., 0].mean(-1)
            err_rest = abs_err[..., 1:].masked_fill(~visible[:, 1:], 0).sum(-1) / visible[:, 1:].sum(-1)
            oerr = ((o_ref - o_hat).norm(dim=-1) / o_ref.norm(dim=-1))[0]
            lerr = raw_err.pow(2).masked_fill(~visible, 0).sum(-1)[0] / visible.sum(-1)
            bits = _bits(s, name, s_len)
            for h in range(hq):
                rows.append({"kind": "unit", "scheme": name, "n": n, "head": h, "kv_head": h // g,
                             "kl": kl[h].mean().item(), "top5": top5[h].mean().item(),
                             "output_error": oerr[h].mean().item(), "logit_mse": lerr[h].mean().item(),
                             "kl_sink_exact": kl_s[h].mean().item(), "top5_sink_exact": top5_s[h].mean().item(),
                             "sink_mass": sink_mass[h].mean().item(), "abs_logit_err_sink": err_sink[h].item(),
                             "abs_logit_err_rest": err_rest[h].mean().item(),
                             "seconds": seconds, "seq_len": s_len, "window": window or 0, **bits})
            if name == "nova" and n == 2:
                rows.extend(_parseval_rows(s, k, q, q_cal, g, k_cal))
            if name == "nova" and n in GROUPING_BUDGETS:
                rows.extend(_grouping_rows(s, k, v, k_cal, qn, kl_ref, kl, g))
            if name == "nova" and n in ABLATION_BUDGETS:
                rows.extend(_ablation_rows(n, sd, (q_cal, k_cal, v_cal), k, v, qn, kl_ref, top_ref, o_ref, g,
                                           window))
    return rows


def ablation_scheme(arm: str, n: int, seed: int, calib) -> Scheme:
    """One arm of :data:`ABLATION_ARMS`, calibrated on ``calib`` = (queries, keys, values) with ``seed``."""
    transform, quant, values = ABLATION_ARMS[arm]
    q, k, v = calib
    options = {"group_dim": 1} if quant == "scalar" else {}
    return NovaScheme.calibrate(q, k, v, bits=n, seed=seed, transform=transform, value_codec=values, **options)


def _ablation_rows(n: int, seed: int, calib, k, v, qn, kl_ref: metrics.AttentionReference,
                   top_ref: metrics.AttentionReference, o_ref, g: int, window: int | None) -> list[dict]:
    """Every ablation arm on the held-out cache: per query head its KL, top-5 recall, output error and bits."""
    rows = []
    for arm in ABLATION_ARMS:
        s = ablation_scheme(arm, n, seed, calib)
        code = s.encode(k, v)
        est = (s.scores(qn, code) / math.sqrt(s.dim)).double()
        o_hat = s.attention(qn, code, causal=True, window=window).double()
        kl = kl_ref.kl(est, reduction="none")[0].mean(-1)
        top5 = top_ref.topk_recall(est.float(), top_k=5, reduction="none")[0].mean(-1)
        oerr = ((o_ref - o_hat).norm(dim=-1) / o_ref.norm(dim=-1))[0].mean(-1)
        # calibration side information amortised over 128K tokens (DEFAULT_AMORTIZE_TOKENS), as nova's bits claim
        bits = {"bits_k": s.k.bits_per_coordinate().total, "bits_v": s.v.bits_per_coordinate().total}
        for h in range(qn.shape[1]):
            rows.append({"kind": "ablation", "scheme": arm, "n": n, "head": h, "kv_head": h // g,
                         "kl": kl[h].item(), "top5": top5[h].item(), "output_error": oerr[h].item(), **bits})
    return rows


def _grouping_rows(s: NovaScheme, k, v, k_cal, qn, kl_ref: metrics.AttentionReference, kl_stratified,
                   g: int) -> list[dict]:
    """Stratified (NOVA-KV's) vs contiguous groups, per KV head: held-out coefficient MSE ‖y − ŷ‖² (the
    attention-aware distortion by Parseval), the group log-volume spread and the attention KL of its query heads
    (``kl_ref``: the cell's exact attention, causal)."""
    c = contiguous(s, k_cal)
    est = (c.scores(qn, c.encode(k, v)) / math.sqrt(s.dim)).double()
    kl_c = kl_ref.kl(est, reduction="none")[0].mean(-1)  # [hq]
    kl_s = kl_stratified.mean(-1)
    rows = []
    for h, (strat, cont) in enumerate(zip(s.k.heads, c.k.heads)):
        keys = k[0, h].double()
        rows.append({"kind": "grouping", "scheme": "nova", "n": s.bits, "kv_head": h,
                     "coef_mse_stratified": parseval_terms(strat, keys).coefficient_error.mean().item(),
                     "coef_mse_contiguous": parseval_terms(cont, keys).coefficient_error.mean().item(),
                     "kl_stratified": kl_s[h * g:(h + 1) * g].mean().item(),
                     "kl_contiguous": kl_c[h * g:(h + 1) * g].mean().item(),
                     "logvol_spread_stratified": float(np.ptp(strat.calibration.group_log_volumes().numpy())),
                     "logvol_spread_contiguous": float(np.ptp(cont.calibration.group_log_volumes().numpy()))})
    return rows


def rotated_top_energy(head: NovaQuantizer, keys: torch.Tensor, seed: int, top: int = 8) -> float:
    """The share of the attention-metric energy in the ``top`` largest coordinate variances after a randomized
    Hadamard rotation R: the variances diag(R M Rᵀ) of M = Σ_Q^{1/2} C_K Σ_Q^{1/2} (C_K the covariance of
    ``keys`` [n, d], Σ_Q the head's calibrated second moment), against NOVA-KV's transform, whose coefficient
    variances are M's eigenvalues (``top8_energy``). Equal variances give top/d."""
    # on one thread, as the calibration: a multithreaded GEMM changes last bits with the thread count
    with one_thread():
        k = keys.double().reshape(-1, head.dim)
        centred = k - k.mean(0)
        cov = centred.T @ centred / k.shape[0]
        lam, vec = torch.linalg.eigh(head.calibration.sigma_q.double())
        root = vec @ torch.diag(lam.clamp_min(0).sqrt()) @ vec.T
        m = root @ cov @ root
        r = make_rotation("wht", head.dim, seed).matrix().double()
        variances = torch.diagonal(r @ m @ r.T)
        return float(variances.sort(descending=True).values[:top].sum() / variances.sum())


def _parseval_rows(s: NovaScheme, k, q, q_cal, g: int, k_cal) -> list[dict]:
    rows = []
    for h, head in enumerate(s.k.heads):
        keys = k[0, h].double()
        cal = parseval_terms(head, keys, q_cal[0, h * g:(h + 1) * g])
        held = parseval_terms(head, keys, q[0, h * g:(h + 1) * g])
        lam = head.calibration.eigenvalues
        rows.append({"kind": "parseval", "scheme": "nova", "n": 2, "kv_head": h, "d": head.dim,
                     "coef_mse": cal.coefficient_error.mean().item(), "sigma_form": cal.sigma_form.mean().item(),
                     "logit_mse_calib_q": cal.query_mean.mean().item(),
                     "logit_mse_heldout_q": held.query_mean.mean().item(),
                     "ridge_abs": head.calibration.ridge,
                     "top8_energy": float(lam.sort(descending=True).values[:8].sum() / lam.sum()),
                     "top8_energy_rotated": rotated_top_energy(head, k_cal[0, h], cell_seed(STUDY, "spectrum", h)),
                     "group_logvol_spread": float(np.ptp(head.calibration.group_log_volumes().numpy()))})
    return rows
