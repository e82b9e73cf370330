"""end_to_end's claims (one short function each, None where its cells were not run) and the definitions of its
terms."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

from kvstats.evaluation.layer_schemes import build_scheme
from kvstats.hf.models import SHIPPED_MODELS
from kvstats.measure.stats import equivalence, mcnemar, proportion_ci
from kvstats.measure.verdicts import equivalence as equivalence_rule
from kvstats.measure.verdicts import measured
from kvstats.studies.end_to_end.analysis import (
    ALPHA,
    PAPER_RATIO_N4,
    Analysis,
    _ci,
    direction_verdict,
    paired_ratio,
    paired_tests,
    ratio_verdict,
)
from kvstats.studies.end_to_end.cells import DOCUMENTS, HEAD_DIM, QJL_CACHE, QJL_ROWS, STUDY
from kvstats.study.claims import Claim, SampleSize, fmt_p
from kvstats.study.models import model_claim_id, per_model_claims
from kvstats.study.sample_plans import interval_sample, paired_cells, paired_sample, tost_sample

NOVA_BITS = 2  # NOVA-KV's claim is about the model's output at 2 bits per element

#: The effects of interest of the direction claims (issue 50), each a fraction of the reference scheme's mean over
#: segments (b of a − b). QKQV against KQV: 10%, the smallest gap that still ranks two schemes for a deployment
#: (D'Alberto's own gap at n = 4 is 125%: KQV's KL 2.25× lower).
QKQV_EFFECT = 0.10
#: NOVA-KV against each scalar method: "recovers most of what scalar methods lose" is at least half the damage.
NOVA_EFFECT = 0.50
#: QJL's cache against KIVI-style min-max: "scores best among the quantized caches", the same 10% ranking gap.
QJL_EFFECT = 0.10


def direction_sample(tst: pd.DataFrame, effect: float, words: str) -> SampleSize:
    """The sample size of a direction claim over :func:`paired_tests`' rows: each row a paired Wilcoxon cell at
    α/m (Holm's first step, m the claim's tests) with the spread of its differences (``shift_se``), the effect of
    interest ``effect``·|mean of b| (:func:`kvstats.study.sample_plans.paired_sample`)."""
    cells = paired_cells(tst.rename(columns={"segments": "n_pairs"}), scale="mean_b")
    sample = paired_sample(cells, effect=effect, effect_words=words, alpha=ALPHA / len(tst), unit="segments")
    return replace(sample, mde_of="shift as a fraction of the reference scheme's mean")


def _mde(r) -> str:
    """The detectable mean difference beside a non-significant test ("—" beside a significant one)."""
    if r.p_holm < ALPHA:
        return "—"
    return "none" if not math.isfinite(r.mde) else f"{r.mde:.3g}"


def _test_lines(tst: pd.DataFrame) -> str:
    return "\n".join(f"| {r.n} | {r.a} − {r.b} | {r.metric} | {r.mean_a:.4g} | {r.mean_b:.4g} | {r.r:+.2f} | "
                     f"{fmt_p(r.p)} ({r.p_method}) | {r.p_holm:.2g} | {100 * r.a_lower_fraction:.0f}% | {_mde(r)} |"
                     for r in tst.itertuples())


TEST_HEADER = ("| n | a − b | metric | mean a | mean b | Wilcoxon r | p | Holm p (this claim's tests) | a lower in | "
               f"detectable shift (80%, α = {ALPHA:g}/m, m this claim's tests) |\n"
               "|---|---|---|---|---|---|---|---|---|---|\n")


def lossless_claim(a: Analysis) -> Claim | None:
    ctrl = a.summary[a.summary["scheme"] == "identity"]
    if not len(ctrl):
        return None
    r = ctrl.iloc[0]
    return Claim(
        id=model_claim_id("e2e-lossless-control", a.model),
        claim="A KVStatsCache with a lossless scheme leaves the model unchanged.",
        source="kvstats", data=a.data, figure=f"{STUDY}_output.png",
        verdict=measured("the pipeline's floor, our own measurement"),
        measurement=(f"identity scheme through the cache on the estimator path: mean next-token KL "
                     f"{_bounded(r['out_kl'], LOSSLESS_KL_BOUND)} nats, max |Δlogit| "
                     f"{_bounded(r['max_abs_dlogit'], LOSSLESS_LOGIT_BOUND)}, top-1 agreement {r['top1']:.3f}, "
                     f"perplexity {r['ppl']:.4f} vs {r['ppl_ref']:.4f}"),
        details="The floor of the pipeline: fp32 re-association between sdpa and kvstats_attention. Its size is "
                "round-off, which moves with BLAS and thread count, so it is given against a bound "
                f"(figures/data/{STUDY}.csv holds this run's values).")


#: the lossless control's round-off floor is reported against these bounds, not as its value (fp32 round-off)
LOSSLESS_KL_BOUND, LOSSLESS_LOGIT_BOUND = 1e-9, 1e-3


def _bounded(x: float, bound: float) -> str:
    """``≤ bound`` when x is within it, else x itself (then the bound is broken and the value is the news)."""
    return f"≤ {bound:g}" if x <= bound else f"{x:.1e} (above {bound:g})"


#: the per-call agreement of the two paths is reported against this bound, not as its round-off value (which moves
#: with BLAS and thread count in the last digits): float64 round-off on logits of size ~30 is ~1e-14
AGREE_ATOL = 1e-10


def paths_claim(a: Analysis) -> Claim | None:
    agree = a.agree
    if not len(agree):
        return None
    calls = len(agree)
    within = int((agree["max_abs_diff"] <= AGREE_ATOL).sum())
    kl_within = int((agree["kl_paths"] <= AGREE_ATOL).sum())
    per_scheme = "; ".join(f"{sch}: {int((g['max_abs_diff'] <= AGREE_ATOL).sum())}/{len(g)} layers"
                           for sch, g in agree.groupby("scheme", sort=False))
    return Claim(
        id=model_claim_id("e2e-estimator-equals-decode", a.model), source="kvstats", figure=None,
        verdict=measured("our own check of the two attention paths, per attention call"),
        data=f"{a.model_name}'s captured post-RoPE Q/K/V of every layer (the shipped text, first "
             f"{int(a.cfg['agree_tokens'])} tokens), float64, the study's per-layer schemes at n = 4",
        claim="For kvstats' built-in K estimators (all linear in the code) attention through the estimator "
              "equals decode-then-dot.",
        measurement=(f"one code read by the estimator (what kvstats_attention calls) and by q·K̂ᵀ on the decoded keys "
                     f"(what sdpa sees): |Δlogit| ≤ {AGREE_ATOL:g} in {within}/{calls} (scheme, layer) calls and "
                     f"KL between the two causal attention rows ≤ {AGREE_ATOL:g} in {kl_within}/{calls} "
                     f"({per_scheme})."),
        details=("The comparison is per attention call, on the same inputs. A whole-model comparison of the two paths "
                 "is not reported: across many layers a rounding difference (~1e-7 in fp32, and fp32 steps remain in "
                 "an fp64 model's LlamaRMSNorm) can move a later layer's key across a codebook threshold, and the "
                 "two runs then become two different quantized models — a chaotic quantity that changes with BLAS "
                 "and thread count (docs/end_to_end.md). Bound, not round-off value: the largest |Δlogit| itself "
                 "moves in its last digits between machines."))


def qkqv_claim(a: Analysis) -> Claim:
    """D'Alberto: QKQV worse than KQV at every budget, carried to the output."""
    w, segs, resamples = 0, a.segs, a.cfg["resamples"]
    dq = paired_tests(segs, [("qkqv", "kqv")], metrics=("out_kl", "attn_kl"), window=w,
                      resamples=min(resamples, 999))
    v_dq = direction_verdict(dq.to_dict("records"), +1, "(n, metric) cells")
    rows = []
    for n in a.budgets:
        r_out = paired_ratio(segs, "out_kl", n, w, resamples, a.docs)
        r_att = paired_ratio(segs, "attn_kl", n, w, resamples, a.docs)
        rows.append(f"| {n} | {r_att[0]:.2f} [{r_att[1]:.2f}, {r_att[2]:.2f}] | {r_out[0]:.2f} [{r_out[1]:.2f}, "
                    f"{r_out[2]:.2f}] | {a.mean.loc[('kqv', n), 'ppl']:.2f} | {a.mean.loc[('qkqv', n), 'ppl']:.2f} |")
    table = ("| n | attention KL QKQV/KQV [95% CI] | next-token KL QKQV/KQV [95% CI] | ppl KQV | ppl QKQV |\n"
             "|---|---|---|---|---|\n" + "\n".join(rows))
    return Claim(
        id=model_claim_id("e2e-qkqv-worse-than-kqv", a.model), figure=f"{STUDY}_output.png", data=a.data,
        claim="QKQV is worse than KQV in KL at every budget (D'Alberto), here carried from attention KL to the "
              "model's next-token distribution.",
        source="D'Alberto, arXiv 2605.08114, abstract (finding 2); end-to-end test by kvstats",
        measurement=(f"{a.model_name}: QKQV − KQV per segment, next-token KL and attention KL at n = {a.budgets}: "
                     f"{v_dq.reason}."),
        verdict=v_dq,
        sample=direction_sample(dq, QKQV_EFFECT, f"QKQV's mean KL {QKQV_EFFECT:.0%} above KQV's"),
        details=(table + "\n\nRatios of means over segments, paired cluster BCa bootstrap (documents, then "
                 "segments).\n\n"
                 + TEST_HEADER + _test_lines(dq) + "\n\n" + a.unit
                 + " At equal n QKQV also stores more (its K keeps γ = ‖r‖ beside ‖k‖)."))


def ratio_claim(a: Analysis) -> Claim | None:
    if 4 not in a.budgets:
        return None
    r4 = paired_ratio(a.segs, "attn_kl", 4, 0, a.cfg["resamples"], a.docs)
    v4 = ratio_verdict(*r4)
    return Claim(
        id=model_claim_id("e2e-ratio-n4", a.model), figure=f"{STUDY}_attention.png", data=a.data,
        claim=f"At n = 4, KQV's KL is {PAPER_RATIO_N4}× lower than QKQV's.",
        source="D'Alberto, arXiv 2605.08114, abstract (finding 4)",
        measurement=(f"on {a.model_name}'s own attention inside the model, mean attention KL QKQV/KQV at n = 4 = "
                     f"{r4[0]:.2f} [{r4[1]:.2f}, {r4[2]:.2f}] (paired cluster BCa over {a.n_docs} documents, "
                     f"then their {a.n_seg} segments)"),
        verdict=v4,
        sample=interval_sample(r4[1:], a.n_seg, effect=float(PAPER_RATIO_N4) - 1.0, unit="segments",
                               effect_words=f"the published ratio's distance from no difference, {PAPER_RATIO_N4} − 1",
                               test="paired cluster BCa bootstrap CI of QKQV/KQV (number rule)",
                               mde_of="distance of the ratio from 1 its CI clears"),
        discrepancy=(None if v4.verdict == "reproduced" else
                     f"QKQV/KQV attention KL at n = 4 is {r4[0]:.2f} [{r4[1]:.2f}, {r4[2]:.2f}] on {a.model_name}'s "
                     f"attention, against the published {PAPER_RATIO_N4} on the paper's data."),
        details=None)


def nova_claim(a: Analysis) -> Claim | None:
    """NOVA-KV at 2 bits against every scalar method, on the model's output."""
    segs = a.segs
    if NOVA_BITS not in a.budgets or "nova" not in set(segs["scheme"]):
        return None
    others = [x for x in a.schemes if x != "nova"]
    nt = paired_tests(segs[segs["n"] == NOVA_BITS], [("nova", x) for x in others], metrics=("out_kl", "d_nll"),
                      window=0, resamples=min(a.cfg["resamples"], 999))
    v_nova = direction_verdict(nt.to_dict("records"), -1, "(baseline, metric) comparisons")
    best = nt[nt["metric"] == "out_kl"].sort_values("mean_b").iloc[0]
    return Claim(
        id=model_claim_id("e2e-nova-2bit-output", a.model), figure=f"{STUDY}_output.png", data=a.data,
        claim=(f"At {NOVA_BITS} bits per element NOVA-KV recovers most of the accuracy scalar methods lose: "
               "here, the model's next-token KL to the exact model and its NLL increase are lower with "
               f"NOVA-KV than with each of {', '.join(others)} at n = {NOVA_BITS}."),
        source="NOVA-KV, arXiv 2608.04074, abstract; end-to-end test by kvstats",
        measurement=(f"{a.model_name}: best baseline on next-token KL: {best['b']} ({best['mean_b']:.3g} vs NOVA-KV's "
                     f"{best['mean_a']:.3g} nats, r = {best['r']:+.2f}, {fmt_p(best['p'])}); {v_nova.reason}."),
        verdict=v_nova,
        sample=direction_sample(nt, NOVA_EFFECT, f"NOVA-KV's mean damage {NOVA_EFFECT:.0%} below each baseline's"),
        details=TEST_HEADER + _test_lines(nt) + "\n\n" + a.unit + " d_nll: mean NLL of the true next token "
                "minus the exact model's.")


#: the QJL cache's comparisons: KIVI (the paper's baseline at 3 bits; kvstats' minmax is KIVI-style) in the
#: verdict, the other schemes of the same budget beside it
QJL_VERDICT_BASELINE = "minmax"


def qjl_cache_claim(a: Analysis) -> Claim | None:
    """QJL's own cache configuration end to end, against KIVI-style min-max at the same n (the verdict) and the
    other schemes (measured beside it); None without the QJL sweep."""
    if a.qjl_segs is None:
        return None
    budgets = sorted(int(n) for n in a.qjl_segs["n"].unique() if int(n) in a.budgets)
    if not budgets or QJL_VERDICT_BASELINE not in set(a.segs["scheme"]):
        return None
    segs = pd.concat([a.qjl_segs, a.segs[a.segs["n"].isin(budgets)]], ignore_index=True)
    resamples = min(a.cfg["resamples"], 999)
    kivi = paired_tests(segs, [("qjl", QJL_VERDICT_BASELINE)], metrics=("out_kl", "d_nll"), resamples=resamples)
    others = [x for x in a.schemes if x != QJL_VERDICT_BASELINE and x in set(segs["scheme"])]
    beside = paired_tests(segs, [("qjl", x) for x in others], metrics=("out_kl", "d_nll"), resamples=resamples)
    verdict = direction_verdict(kivi.to_dict("records"), -1, "(n, metric) comparisons with KIVI-style min-max")
    qs = a.qjl_summary.set_index("n")
    parts = []
    for n in budgets:
        r = qs.loc[n]
        parts.append(f"n = {n}: {r['bits_per_element']:.2f} bits per element (K m = {n}·d sign bits + 2 fp16 "
                     f"norms, {QJL_CACHE['outliers']} outlier channels; V {n}-bit per token), next-token KL "
                     f"{r['out_kl']:.3g} [{r['out_kl_lo']:.3g}, {r['out_kl_hi']:.3g}] nats, top-1 agreement "
                     f"{r['top1']:.3f}, perplexity ×{r['ppl_ratio']:.3f}")
    best = beside[beside["metric"] == "out_kl"].sort_values("mean_b").iloc[0] if len(beside) else None
    return Claim(
        id=model_claim_id("qjl-cache-smollm2", a.model), figure=None, data=a.data + f"; QJL's cache at n ∈ {budgets}",
        claim=("At 3 bits per element QJL's cache (keys: QJL sketch with a separate outlier sketch; values: "
               "per-token quantization) keeps the model's accuracy close to the 16-bit model and scores best "
               "among the quantized caches it is compared with, KIVI (3 bits) included. Tested here: next-token "
               "KL and NLL increase lower than the KIVI-style min-max cache's at the same n."),
        source="Zandieh, Daliri, Han, QJL, arXiv 2406.03482, §4 and §5 (table 1: LongBench F1 vs KIVI)",
        measurement=(f"{a.model_name}: " + "; ".join(parts) + f". Against KIVI-style min-max: {verdict.reason}"
                     + (f"; the best same-budget scheme on next-token KL is {best['b']} ({best['mean_b']:.3g} vs "
                        f"QJL's {best['mean_a']:.3g} nats)" if best is not None else "") + "."),
        verdict=verdict,
        sample=direction_sample(kivi, QJL_EFFECT, f"QJL's mean damage {QJL_EFFECT:.0%} below KIVI-style min-max's"),
        discrepancy=(None if verdict.verdict == "reproduced" else
                     f"QJL's cache (keys m = {budgets[0]}·d sign bits with the outlier split, values per token) is "
                     f"not better than KIVI-style min-max at n = {budgets[0]} on {a.model_name} (d = "
                     f"{SHIPPED_MODELS[a.model].head_dim}): next-token KL "
                     f"{qs.loc[budgets[0], 'out_kl']:.3g} nats, perplexity ×{qs.loc[budgets[0], 'ppl_ratio']:.2f}; "
                     "the paper's LongBench results are on Llama-2/3 with d = 128."),
        details=(TEST_HEADER + _test_lines(kivi) + "\n\nBeside the verdict (Holm over these rows):\n\n"
                 + TEST_HEADER + _test_lines(beside) + "\n\n" + a.unit + " The paper measures LongBench F1 "
                 f"on Llama-2/3; next-token KL and NLL of {a.model_name} are the measures here. The outlier channels "
                 "are found on the calibration document (the paper finds them in each prompt)."))


#: the same-n schemes each deployed format is tested against (where run at its n): KQV, TurboQuant_mse on K and V,
#: KIVI-style min-max with d-token groups
FORMATS_AGAINST = ("kqv", "mse", "minmax")


def formats_claim(a: Analysis) -> Claim | None:
    """The deployed formats (kvstats.studies.formats.DEPLOYED) teacher-forced as every scheme, each against the
    same-n schemes of the main sweep (paired Wilcoxon over segments, Holm over this claim's tests); None without the
    formats sweep."""
    if a.formats_segs is None:
        return None
    from kvstats.studies.formats import method_label

    fs = a.formats_summary
    specs = list(dict.fromkeys(fs["scheme"]))
    segs = pd.concat([a.formats_segs, a.segs[a.segs["n"].isin(set(fs["n"]))]], ignore_index=True)
    tests = paired_tests(segs, [(x, y) for x in specs for y in FORMATS_AGAINST], metrics=("out_kl", "d_nll"),
                         resamples=min(a.cfg["resamples"], 999))
    parts = [f"{method_label(r.scheme, int(r.n))}: {r.bits_per_element:.3g} bits held, next-token KL {r.out_kl:.3g} "
             f"[{r.out_kl_lo:.3g}, {r.out_kl_hi:.3g}] nats, top-1 {r.top1:.3f}, perplexity ×{r.ppl_ratio:.3f}"
             for r in fs.itertuples()]
    kl = tests[tests["metric"] == "out_kl"] if len(tests) else tests
    lower = [f"{r.a} < {r.b} at n = {r.n}" for r in kl.itertuples() if r.p_holm < ALPHA and r.r < 0]
    higher = [f"{r.a} > {r.b} at n = {r.n}" for r in kl.itertuples() if r.p_holm < ALPHA and r.r > 0]
    return Claim(
        id=model_claim_id("e2e-formats", a.model), figure=None, source="kvstats",
        data=a.data + "; the deployed formats " + ", ".join(method_label(x, int(n)) for x, n in zip(fs["scheme"],
                                                                                                     fs["n"])),
        claim="The formats the field deploys (int per token-head, KIVI as published, NVFP4, FP8-K/NVFP4-V, FP8 "
              "e4m3) teacher-forced on the same segments as kvstats' schemes, beside the schemes of the same n.",
        measurement=(f"{a.model_name}: " + "; ".join(parts) + f". Next-token KL against "
                     f"{', '.join(FORMATS_AGAINST)} at the same n ({len(kl)} tests of {len(tests)}, Holm): "
                     f"significantly lower in {len(lower)}"
                     + (f" ({', '.join(lower)})" if lower else "") + f", higher in {len(higher)}"
                     + (f" ({', '.join(higher)})" if higher else "") + ". The same n is not the same bits held: "
                     "the formats study compares at equal measured bits."),
        verdict=measured(f"{len(lower)} of {len(kl)} same-n comparisons favour the format, {len(higher)} the scheme"),
        details=(TEST_HEADER + _test_lines(tests) + "\n\n" + a.unit
                 + " n of a pair K/V is the mean of its widths; fp8_e4m3 at n = 8 has no same-n scheme here."))


def _side_by_side(a: Analysis) -> str:
    """The perplexity claim's table rows: next-token KL / perplexity / bits per element per scheme and budget."""
    def cell_txt(x, n):
        if (x, n) not in a.mean.index:
            return "not run"
        m = a.mean.loc[(x, n)]
        return f"{m['out_kl']:.3g} / {m['ppl']:.2f} / {m['bits_per_element']:.2f}"

    return "\n".join(f"| {x} | " + " | ".join(cell_txt(x, n) for n in a.budgets) + " |" for x in a.schemes)


def perplexity_claim(a: Analysis) -> Claim:
    """The practical choices side by side."""
    mean, budgets = a.mean, a.budgets
    ppl_ref = float(a.summary["ppl_ref"].iloc[0])
    best_n = {x: next((n for n in budgets if (x, n) in mean.index and mean.loc[(x, n), "ppl"] <= 1.05 * ppl_ref),
                      None) for x in a.schemes}
    return Claim(
        id="e2e-perplexity", figure=f"{STUDY}_output.png", data=a.data, source="kvstats",
        verdict=measured("our own measurement of each scheme's output damage"),
        claim=(f"Next-token KL, perplexity and bits per element of SmolLM2 with each scheme's cache at "
               f"n = {budgets}."),
        measurement=(f"fp perplexity {ppl_ref:.2f}; smallest n within 5% of it: "
                     + ", ".join(f"{x} {best_n[x] if best_n[x] else f'> {max(n for y, n in mean.index if y == x)}'}"
                                 for x in a.schemes)
                     + f"; at n = {budgets[0]}: " + ", ".join(f"{x} {mean.loc[(x, budgets[0]), 'ppl']:.2f}"
                                                           for x in a.schemes)),
        details=("next-token KL (nats) / perplexity / bits per element, mean over segments:\n\n| scheme | "
                 + " | ".join(f"n = {n}" for n in budgets) + " |\n|---|" + "---|" * len(budgets) + "\n"
                 + _side_by_side(a)
                 + "\n\nmse: TurboQuant_mse on K and V (what vLLM-style deployments run); minmax: KIVI-style "
                   "(K per channel in groups of d tokens, V per token, fp16 ranges); nova: calibrated on "
                   f"'{DOCUMENTS[0]}'. Bits per element are those the cache holds (codes, norms, ranges and the "
                   "exact tokens); nova's calibration (per KV head its transform and codebooks) is not in them: "
                   "the nova study's bit count amortises it over 128K tokens."))


#: δ of the "quality-neutral at 4 bits" claim: a mean NLL increase of 0.01 nats per token (perplexity × 1.01)
NEUTRAL_MARGIN = 0.01


def _per_segment(segs: pd.DataFrame, scheme: str, n: int | None, col: str) -> pd.Series:
    sel = segs[(segs["scheme"] == scheme) & (segs["window"] == 0) & ((segs["n"] == n) if n is not None else True)]
    return sel.groupby("segment")[col].mean()


def neutral_claim(a: Analysis) -> Claim | None:
    """'KQV at 4 bits is quality-neutral' as an equivalence claim: TOST on the per-segment NLL increase against
    the lossless control, margin δ stated."""
    if 4 not in a.budgets or "identity" not in set(a.segs["scheme"]):
        return None
    x, y = _per_segment(a.segs, "kqv", 4, "d_nll").align(_per_segment(a.segs, "identity", None, "d_nll"),
                                                         join="inner")
    r = equivalence(x.to_numpy(), y.to_numpy(), margin=NEUTRAL_MARGIN, paired=True)
    v = equivalence_rule([r.confidence_interval], NEUTRAL_MARGIN, what="comparisons")
    return Claim(
        id="e2e-kqv4-neutral", figure=None, data=a.data, source="kvstats",
        claim=(f"KQV at 4 bits is quality-neutral: the model's NLL per token rises by less than δ = "
               f"{NEUTRAL_MARGIN:g} nats (perplexity × {math.exp(NEUTRAL_MARGIN):.3f})."),
        measurement=(f"NLL increase KQV n = 4 − lossless control, paired over {r.n} segments: "
                     f"{r.effect_size:+.4f} nats/token, 90% CI [{r.confidence_interval.low:+.4f}, "
                     f"{r.confidence_interval.high:+.4f}] (TOST, α = 0.05 each side: {fmt_p(r.pvalue)}). Segments "
                     f"share {a.n_docs} documents: the t interval treats them as independent."),
        verdict=v,
        sample=replace(tost_sample(float(np.std(x.to_numpy() - y.to_numpy(), ddof=1)), r.n, margin=NEUTRAL_MARGIN,
                                   effect_words=f"no true difference, within the margin δ = {NEUTRAL_MARGIN:g} nats",
                                   unit="segments"), test="paired TOST over segments, α = 0.05 each side"))


def top1_claim(a: Analysis) -> Claim | None:
    """Top-1 agreement with the exact model per token: Wilson intervals and exact McNemar between schemes at n = 4
    on the same tokens (Holm), beside the cluster bootstrap CI over documents."""
    n = 4 if 4 in a.budgets else a.budgets[-1]
    tok = a.tokens[(a.tokens["window"] == 0) & (a.tokens["n"] == n) & (a.tokens["scheme"] != "identity")]
    outcomes = {x: g.groupby(["segment", "t"])["top1"].mean() >= 0.5 for x, g in tok.groupby("scheme")}
    names = [x for x in a.schemes if x in outcomes]
    if "kqv" not in outcomes or len(names) < 2:
        return None
    rows, tests = [], []
    for x in names:
        w = proportion_ci(outcomes[x].to_numpy())
        c = a.summary[(a.summary["scheme"] == x) & (a.summary["n"] == n) & (a.summary["window"] == 0)].iloc[0]
        rows.append(f"| {x} | {100 * w.statistic:.1f}% | [{100 * w.confidence_interval.low:.1f}, "
                    f"{100 * w.confidence_interval.high:.1f}] | [{100 * c['top1_lo']:.1f}, {100 * c['top1_hi']:.1f}] |")
    for x in names:
        if x != "kqv":
            p, q = outcomes["kqv"].align(outcomes[x], join="inner")
            tests.append((x, mcnemar(p.to_numpy(), q.to_numpy())))
    holm = multipletests([t.pvalue for _, t in tests], method="holm")[1]
    lines = [f"| kqv − {x} | {100 * t.effect_size:+.2f} pts [{100 * t.confidence_interval.low:+.2f}, "
             f"{100 * t.confidence_interval.high:+.2f}] | {t.table[0][1]} / {t.table[1][0]} | {fmt_p(h)} |"
             for (x, t), h in zip(tests, holm)]
    worse = [x for (x, t), h in zip(tests, holm) if h < ALPHA and t.effect_size < 0]
    better = [x for (x, t), h in zip(tests, holm) if h < ALPHA and t.effect_size > 0]
    return Claim(
        id="e2e-top1-agreement", figure=None, data=a.data, source="kvstats",
        claim=f"Top-1 agreement with the exact model at n = {n}, per token, with exact paired tests between schemes.",
        measurement=(f"KQV agrees on {100 * outcomes['kqv'].mean():.1f}% of {outcomes['kqv'].size} tokens; "
                     f"exact McNemar on the same tokens (Holm over {len(tests)}): KQV agrees significantly more often "
                     f"than {', '.join(better) or 'none'}, less often than {', '.join(worse) or 'none'}."),
        verdict=measured("our own measurement of top-1 agreement"),
        details=("| scheme | top-1 agreement | Wilson 95% CI (tokens) | 95% CI, documents then segments |\n"
                 "|---|---|---|---|\n" + "\n".join(rows)
                 + "\n\n| comparison | difference [Newcombe 95% CI] | tokens only KQV / only the other agrees | "
                   "Holm p (exact McNemar) |\n|---|---|---|---|\n" + "\n".join(lines)
                 + "\n\nTokens of one segment are not independent trials: the Wilson interval and McNemar's p "
                   "describe these tokens; the cluster bootstrap interval resamples documents, then segments."))


def predictivity_claim(a: Analysis) -> Claim:
    corr = a.corr
    c = corr[(corr["level"] == "cells") & (corr["x"] == "attn_kl") & (corr["y"] == "out_kl")].iloc[0]
    other = corr[corr["level"] == "cells"]
    lines = "\n".join(f"| {r['x']} | {r['y']} | {r['rho']:.2f} |" for _, r in other.iterrows())
    ct = corr[(corr["level"] == "tokens") & (corr["window"] == 0)]
    return Claim(
        id="e2e-attention-kl-predicts-output", figure=f"{STUDY}_predictivity.png", data=a.data,
        source="kvstats", verdict=measured("our own measurement of how attention KL ranks output damage"),
        claim="Attention KL (a K-only, per-layer metric) ranks cache configurations as their damage to the "
              "model's next-token distribution.",
        measurement=(f"Spearman ρ(attention KL, next-token KL) across the {int(c['points'])} designed cells "
                     f"(scheme × n × seed × window) = {c['rho']:.2f}, descriptive: the cells are a design, not a "
                     f"sample, so no p or CI is given; per token within each of the {len(ct)} cells without a "
                     f"full-precision window (W = 0) the median ρ is {ct['rho'].median():.2f} (range "
                     f"{ct['rho'].min():.2f} to {ct['rho'].max():.2f})"),
        details=("| x | y | ρ across the designed cells |\n|---|---|---|\n" + lines
                 + "\n\nAttention KL sees K only; the schemes' value quantizers differ, so the output damage "
                   "at equal attention KL differs by scheme. The cells are chosen, not sampled: ρ describes "
                   "this design; a p-value or a bootstrap over cells would treat them as a random sample."))


def window_claim(a: Analysis) -> Claim | None:
    summary = a.summary
    windows = sorted(set(summary["window"]) - {0})
    if not windows:
        return None
    wv, nw = windows[-1], a.cfg["window_budget"]
    rows_w = []
    for x in a.schemes:
        if (x, nw) not in a.mean.index:
            continue
        base = a.mean.loc[(x, nw), "out_kl"]
        with_w = summary[(summary["scheme"] == x) & (summary["n"] == nw) & (summary["window"] == wv)]
        rows_w.append((x, base, float(with_w["out_kl"].mean())))
    return Claim(
        id=model_claim_id("e2e-window", a.model), figure=f"{STUDY}_output.png", data=a.data, source="kvstats",
        verdict=measured("our own measurement of the full-precision window"),
        claim=f"Keeping the last {wv} tokens exact (KIVI/QJL-style window) reduces the output damage.",
        measurement=(f"{a.model_name}: mean next-token KL with W = 0 / with W = {wv} at n = {nw}: "
                     + ", ".join(f"{x} {b / c:.1f}×" for x, b, c in rows_w)),
        details=(f"| scheme | KL, W = 0 | KL, W = {wv} |\n|---|---|---|\n"
                 + "\n".join(f"| {x} | {b:.3f} | {c:.3f} |" for x, b, c in rows_w)))


def generation_claim(a: Analysis) -> Claim | None:
    gen = a.gen
    if not len(gen):
        return None
    gw = gen[gen["window"] == 0]
    nll = gw.groupby(["scheme", "n"])["fp_nll"].mean().unstack("n")
    div = gw.groupby(["scheme", "n"])["tokens_before_divergence"].mean().unstack("n")
    ref_nll = gw.drop_duplicates("offset")["fp_nll_reference"].mean()
    table = ("| scheme | " + " | ".join(f"n = {n}" for n in nll.columns) + " |\n|---|" + "---|" * len(nll.columns)
             + "\n" + "\n".join(f"| {x} | " + " | ".join(f"{nll.loc[x, n]:.2f} ({div.loc[x, n]:.0f})"
                                                       for n in nll.columns) + " |" for x in nll.index))
    n0 = int(nll.columns[0])
    return Claim(
        id="e2e-generation", figure=f"{STUDY}_output.png", data=a.data, source="kvstats",
        verdict=measured("our own measurement of greedy generation"),
        claim="Greedy generation through the quantized cache (model.generate with a KVStatsCache) stays "
              "plausible to the fp model.",
        measurement=(f"fp-model NLL of the greedy continuation ({int(gen['new'].max())} tokens, "
                     f"{gen['offset'].nunique()} prompt(s) of {a.cfg['prompt_len']} tokens from the held-out "
                     f"documents): fp's own {ref_nll:.2f} nats/token; at n = {n0}: "
                     + ", ".join(f"{x} {nll.loc[x, n0]:.2f}" for x in a.schemes if x in nll.index)),
        details=("fp-model NLL of the continuation (tokens equal to fp's greedy continuation before the "
                 "first divergence):\n\n" + table + "\n\nThe divergence point is coarse: greedy decoding "
                 "flips at the first near-tie, after which the texts differ although both may be fine."))


def baseline_record(base: pd.DataFrame, segs: pd.DataFrame, cfg: dict, docs: dict[int, str]) -> Claim:
    """transformers' own quantized caches (the [baselines] extra) beside kvstats' schemes at the same budgets, on
    the same segments: per segment the mean next-token KL, NLL increase and top-1 agreement, then the mean over
    segments with a cluster BCa bootstrap CI over documents, then segments (_ci)."""
    tok = base[base["kind"] == "token"].assign(d_nll=lambda t: t["nll"] - t["nll_ref"])
    per_seg = tok.groupby(["backend", "n", "residual_length", "segment"], as_index=False)[
        ["out_kl", "d_nll", "top1"]].mean()
    lines = []
    for (backend, n, res), g in per_seg.groupby(["backend", "n", "residual_length"]):
        _, lo, hi = _ci(g["out_kl"].to_numpy(), cfg["resamples"], int(n), g["segment"].map(docs).to_numpy())
        lines.append(f"| transformers {backend}, residual {int(res)} | {int(n)} | {g['out_kl'].mean():.4f} "
                     f"[{lo:.4f}, {hi:.4f}] | "
                     f"{g['d_nll'].mean():+.4f} | {g['top1'].mean():.3f} |")
    ours = segs[(segs["window"] == 0) & (segs["scheme"] != "identity") & segs["n"].isin(per_seg["n"].unique())]
    for (scheme, n), g in ours.groupby(["scheme", "n"]):
        lines.append(f"| kvstats {scheme}, W = 0 | {int(n)} | {g['out_kl'].mean():.4f} | {g['d_nll'].mean():+.4f} | "
                     f"{g['top1'].mean():.3f} |")
    first = per_seg.groupby(["backend", "n", "residual_length"])["out_kl"].mean()
    return Claim(
        id="e2e-transformers-baselines", figure=None, source="kvstats",
        verdict=measured("our own measurement of the quantized caches transformers ships"),
        data=(f"SmolLM2-135M-Instruct, the same {per_seg['segment'].nunique()} segments of "
              f"{int(base.loc[base['kind'] == 'cell', 'segment_tokens'].iloc[0])} tokens as the other claims, fed "
              "token by token through transformers' QuantizedCache (kvstats.hf.baselines)"),
        claim=("transformers' own quantized KV caches (optimum-quanto / HQQ: per-group round-to-nearest with a "
               "scale and zero point, an exact residual window) measured with the same output metrics as "
               "kvstats' schemes."),
        measurement="mean next-token KL: " + ", ".join(
            f"{b} n = {int(n)} residual {int(r)}: {v:.3g}" for (b, n, r), v in first.items()),
        details=("| cache | n | next-token KL [95% CI: documents, then segments] | NLL increase | top-1 agreement |\n"
                 "|---|---|---|---|---|\n" + "\n".join(lines) + "\n\nThe residual window keeps the last "
                 "residual − 1 tokens or fewer exact (transformers re-quantizes the whole cache when it fills); "
                 "kvstats' rows keep no window (W = 0). Attention metrics are not available for these caches."))


def baseline_claim(base: pd.DataFrame, segs: pd.DataFrame, cfg: dict, docs: dict[int, str]) -> dict:
    """:func:`baseline_record` as the dict :func:`kvstats.study.report.validate_claim` reads (its verdict a Verdict)."""
    return baseline_record(base, segs, cfg, docs).to_dict()


def baselines_claim(a: Analysis) -> Claim | None:
    return None if a.base is None else baseline_record(a.base, a.segs, a.cfg, a.docs)


#: the claims in the order the report lists them; each returns None where its cells were not run
CLAIMS = (lossless_claim, paths_claim, qkqv_claim, ratio_claim, nova_claim, qjl_cache_claim, formats_claim,
          perplexity_claim,
          neutral_claim,
          top1_claim, predictivity_claim, window_claim, generation_claim, baselines_claim)


#: the claims judged on a second model too (its sweep runs their cells), in the report's order
MODEL_CLAIMS = (lossless_claim, paths_claim, qkqv_claim, ratio_claim, nova_claim, qjl_cache_claim, formats_claim,
                window_claim)


def claims(a: Analysis) -> list[Claim]:
    """SmolLM2's claims, then each other model's :data:`MODEL_CLAIMS`, the comparison of their verdicts and a row per
    model that did not run (kvstats.study.models.per_model_claims)."""
    out = [c for c in (make(a) for make in CLAIMS) if c is not None]
    theirs = {model: [c for c in (make(other) for make in MODEL_CLAIMS) if c is not None]
              for model, other in a.others.items()}
    return out + per_model_claims(STUDY, out, theirs, a.missing)


def definitions(a: Analysis) -> dict[str, str]:
    """What the study's terms mean, generated from its configuration constants and the schemes it builds."""
    cfg, n_docs = a.cfg, a.n_docs

    def quant(qz) -> str:
        opts = ", ".join(f"{k} {str(v).replace('torch.', '')}" for k, v in qz.options().items()
                         if k not in ("heads", "calibration"))
        return f"{qz.name} ({opts})"

    n = cfg["budgets"][0]
    out = {"unit": (f"one segment of {cfg['segment_tokens']} consecutive tokens inside one held-out document "
                    f"({', '.join(DOCUMENTS[1:])}); segments are disjoint, taken round-robin over the documents, "
                    f"{cfg['segments'] or 'all'} of them; each is fed to the model on its own (batched)"),
           "aggregation": ("per segment, the mean over its tokens of next-token KL(p_fp ‖ p_quant), top-1 agreement, "
                           "NLL increase and of the attention KL / top-5 recall over 30 layers × 9 heads; cell "
                           "values are means over segments with cluster BCa bootstrap CIs (kvstats.stats."
                           "cluster_bootstrap_ci: the documents resampled, then the segments within each; segments "
                           f"of one document are not independent, and with {n_docs or 'a few'} documents the "
                           "interval is itself below nominal)"),
           "tests": (f"paired Wilcoxon signed-rank over segments, α = {ALPHA:g}, Holm over each claim's own tests "
                     f"(its family: the cells listed in the claim), direction rule over those cells. Segments share "
                     f"{n_docs or 'a few'} documents, so the p-values "
                     "describe these documents' segments, not text in general; the CIs resample documents"),
           "seeds": f"{list(cfg['seeds'])}; each layer gets its own child seed of the cell seed",
           "NOVA-KV calibration": (f"per layer on '{DOCUMENTS[0]}' "
                                   f"({cfg['calibration_tokens'] or 'all'} tokens), never on a measured segment"),
           "full-precision window": f"{list(cfg['windows'])} tokens (non-zero windows at n = {cfg['window_budget']})",
           "top-k ties": ("top-5 recall ranks keys by a stable descending sort: among equal logits the lower "
                          "index first")}
    for name in a.schemes:
        if name == "nova":
            out["nova"] = ("K NovaQuantizer per KV head (calibrated transform, stratified group VQ, fp16 scale and "
                           "side information); V rotated min-max per token")
            continue
        s = build_scheme(name, n, 0, dim=HEAD_DIM, rows=QJL_ROWS)
        out[name] = f"K {quant(s.k)}; V {quant(s.v)}"
    return out
