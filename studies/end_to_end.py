"""Study: a quantized KV cache inside SmolLM2-135M-Instruct — what KV, KQV and QKQV at n = 2..6 do to the
model's output, and how well attention-level metrics predict it.

    python studies/end_to_end.py --scale quick|paper [--scheduler ADDR] [--n-jobs N]

Teacher-forced. The first T tokens of the shipped public-domain text (kvstats.data.real.default_text) go through
the model once with the exact cache (sdpa) and once per cell with a :class:`kvstats.cache.KVStatsCache` on the
estimator path (``attn_implementation="kvstats"``: logits against quantized keys come from the scheme's own
estimator; a prefill equals token-by-token decoding, tested in tests/test_cache.py). Each layer gets its own
scheme seed. Per token t: the KL between the exact and quantized next-token distributions, both NLLs of the
true next token (perplexity), top-1 agreement; and, captured inside the attention function for the same
forward, the attention KL and top-5 recall of the logits used against the exact logits of the same queries
(mean over the 30 layers × 9 query heads). A control cell runs a lossless scheme through the same cache.

Generation. Greedy continuations (``model.generate(..., cache=KVStatsCache(...))``) of prompts cut from the
text, compared token by token with the exact model's greedy continuation.

Statistics: bootstrap CIs (BCa, over tokens; tokens are not independent, so the CIs are optimistic) of
every per-cell mean; Spearman rank correlation of attention KL with output KL across cells (bootstrap over
cells) and across tokens within each cell (bootstrap over tokens); paired ratios QKQV/KQV per n.

Paths. The same cache read by the estimator (kvstats_attention) and by decode-then-dot (sdpa on decoded K̂), in
fp32 and in fp64.

quick: 256 tokens, seed 0, no window, 1 prompt × 32 new tokens (~3 min on 2 free cores).
paper: 1024 tokens, seeds 0-2, windows 0 and 64, 8 prompts × 64 new tokens.

Writes figures/end_to_end_{output,attention,predictivity}.png and in figures/data/: end_to_end.csv (one row per
cell), end_to_end_tokens.csv, end_to_end_layers.csv, end_to_end_correlation.csv, end_to_end_generation.csv,
end_to_end_paths.csv, end_to_end_claims.json. Cells are stored as they finish (kvstats.sweep) and run on joblib
workers (all cores; ``--n-jobs 1``: in this process) or a Dask cluster (``--scheduler``); each worker loads the
model once (~1 s from kvstats' cached fp32 conversion) and runs one torch thread.
"""

from __future__ import annotations

import functools
import math
import sys
import time
import warnings

import matplotlib.ticker
import numpy as np
import pandas as pd
import torch
from scipy import stats

from kvstats import plots, study
from kvstats._random import spawn_seeds
from kvstats.report import fmt_p
from kvstats.stats import bootstrap_ci, ratio_ci, spearman
from kvstats.sweep import cell_seed, grid

STUDY = "end_to_end"
VERSION = "2"
POSITION = 90  # place in figures/REPORT.md (kvstats.report.study_order)
SCHEMES = ("kv", "kqv", "qkqv")
BUDGETS = (2, 3, 4, 5, 6)
SCALE = {
    "quick": {"tokens": 256, "seeds": (0,), "windows": (0,), "prompts": (0,), "prompt_len": 64, "new": 32,
              "agree_tokens": 64, "resamples": 999},
    "paper": {"tokens": 1024, "seeds": (0, 1, 2), "windows": (0, 64),
              "prompts": (0, 384, 768, 1152, 1536, 1920, 2304, 2688), "prompt_len": 64, "new": 64,
              "agree_tokens": 256, "resamples": 4999},
}
PAPER_RATIO_N4 = 2.25


# ------------------------------------------------------------------------------------------ the model


def _quiet():
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers: past_key_values -> cache


@functools.lru_cache(maxsize=2)
def _model(dtype: str = "float32"):
    """SmolLM2 (kvstats.data.real.load_model) in ``dtype`` and the tokenized text; once per process."""
    _quiet()
    from kvstats.data.real import default_text, load_model

    model, tokenizer, name = load_model("smollm2")  # fp32 (cached conversion); fp64 is an exact upcast of it
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
    ids = tokenizer(default_text(), return_tensors="pt").input_ids
    return model, tokenizer, ids


def _cache_kw(model, cache) -> dict:
    """``cache=`` on transformers that renamed the argument (5.x), ``past_key_values=`` before."""
    import inspect

    return {"cache": cache} if "cache" in inspect.signature(model.forward).parameters else {"past_key_values": cache}


def _set_attention(model, name: str) -> None:
    from kvstats.cache import register_attention

    register_attention()
    if model.config._attn_implementation != name:
        model.set_attn_implementation(name)


@functools.lru_cache(maxsize=2)
def _reference(tokens: int):
    """The exact model over the first ``tokens`` tokens: (ids [1, T], logits [T, V], log-probabilities [T, V])."""
    model, _, ids = _model()
    if ids.shape[1] < tokens:
        raise ValueError(f"the text has {ids.shape[1]} tokens, fewer than {tokens}")
    ids = ids[:, :tokens]
    _set_attention(model, "sdpa")
    with torch.inference_mode():
        logits = model(ids).logits[0].float()
    return ids, logits, torch.log_softmax(logits, dim=-1)


def _schemes(name: str, n: int, seed: int, layers: int):
    """One scheme per layer (independent seeds); ``identity``: the lossless control."""
    from kvstats.cache import IdentityScheme
    from kvstats.schemes import scheme

    if name == "identity":
        s = IdentityScheme(64)
        return lambda i: s
    seeds = spawn_seeds(cell_seed(STUDY, name, n, seed), layers)
    built = [scheme(name, bits=n, dim=64, seed=s) for s in seeds]
    return lambda i: built[i]


def _quantized_logits(ids, name, n, seed, window, path="kvstats", record=True, dtype="float32"):
    from kvstats.cache import KVStatsCache

    model, _, _ = _model(dtype)
    _set_attention(model, path)
    cache = KVStatsCache(_schemes(name, n, seed, model.config.num_hidden_layers), full_precision_window=window,
                         record_attention=record)
    with torch.inference_mode():
        logits = model(ids, use_cache=True, **_cache_kw(model, cache)).logits[0]
    return (logits if dtype == "float64" else logits.float()), cache


# ------------------------------------------------------------------------------------------- the cells


def cell(scheme: str, n: int, seed: int, window: int, tokens: int) -> list[dict]:
    """One teacher-forced forward through a KVStatsCache: per-token, per-layer and one summary row."""
    _quiet()
    t0 = time.perf_counter()
    ids, ref_logits, ref = _reference(tokens)
    logits, cache = _quantized_logits(ids, scheme, n, seed, window)
    seconds = time.perf_counter() - t0
    logq = torch.log_softmax(logits, dim=-1)
    out_kl = (ref.exp() * (ref - logq)).sum(-1).clamp_min(0)  # [T]
    target = ids[0, 1:]
    nll_ref = -ref[:-1].gather(-1, target[:, None])[:, 0]
    nll = -logq[:-1].gather(-1, target[:, None])[:, 0]
    top1 = (ref.argmax(-1) == logq.argmax(-1)).double()
    records = sorted(cache.attention_records, key=lambda r: r.layer)
    attn_kl = torch.stack([r.kl[0] for r in records])  # [L, Hq, T]
    top5 = torch.stack([r.recall[0] for r in records])
    mem = cache.memory()
    rows = []
    tok_kl, tok_top5 = attn_kl.mean(dim=(0, 1)), top5.mean(dim=(0, 1))
    for t in range(ids.shape[1]):
        rows.append({"kind": "token", "t": t, "out_kl": float(out_kl[t]), "top1": float(top1[t]),
                     "nll_ref": float(nll_ref[t]) if t < len(nll) else None,
                     "nll": float(nll[t]) if t < len(nll) else None,
                     "attn_kl": float(tok_kl[t]), "top5": float(tok_top5[t])})
    lay_kl, lay_top5 = attn_kl.mean(dim=(1, 2)), top5.mean(dim=(1, 2))
    for i, r in enumerate(records):
        rows.append({"kind": "layer", "layer": r.layer, "attn_kl": float(lay_kl[i]), "top5": float(lay_top5[i])})
    rows.append({"kind": "cell", "seconds": seconds, "max_abs_dlogit": float((logits - ref_logits).abs().max()),
        "bits_per_element": mem.bits_per_element, "code_bytes": mem.code_bytes, "window_bytes": mem.window_bytes,
        "fp16_bytes": mem.fp16_bytes})
    return rows


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> float:
    """Mean over tokens of KL(p ‖ q) from log-probabilities [T, V], in fp64."""
    p_log, q_log = p_log.double(), q_log.double()
    return float((p_log.exp() * (p_log - q_log)).sum(-1).clamp_min(0).mean())


def agreement_cell(scheme: str, n: int, dtype: str, tokens: int) -> list[dict]:
    """The same cache read by the estimator (kvstats_attention) and by decode-then-dot (the model's sdpa).

    Per attention call the two agree to rounding (every built-in estimator is linear in the code); across 30
    layers a rounding difference can flip a code in a later layer (its input moved by ~1e-7), and the two fp32
    runs then become two slightly different quantized models. In fp64 flips are ~1e-9 as likely."""
    _quiet()
    model, _, ids = _model(dtype)
    ids = ids[:, :tokens]
    _set_attention(model, "sdpa")
    with torch.inference_mode():
        ref = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
    est, _ = _quantized_logits(ids, scheme, n, 0, 0, record=False, dtype=dtype)
    dense, _ = _quantized_logits(ids, scheme, n, 0, 0, path="sdpa", record=False, dtype=dtype)
    le, ld = torch.log_softmax(est.double(), -1), torch.log_softmax(dense.double(), -1)
    return [{"max_abs_diff": float((est.double() - dense.double()).abs().max()), "kl_paths": _kl(le, ld),
             "kl_fp_estimator": _kl(ref, le), "kl_fp_dense": _kl(ref, ld),
             "top1_paths": float((le.argmax(-1) == ld.argmax(-1)).double().mean())}]


def _fp_nll(prompt: torch.Tensor, continuation: tuple[int, ...]) -> float:
    """Mean NLL (nats/token) the exact model assigns to ``continuation`` after ``prompt`` [1, P]."""
    model, _, _ = _model()
    _set_attention(model, "sdpa")
    full = torch.cat([prompt, torch.tensor([continuation], dtype=prompt.dtype)], dim=1)
    with torch.inference_mode():
        logp = torch.log_softmax(model(full).logits[0, prompt.shape[1] - 1:-1].double(), dim=-1)
    return float(-logp.gather(-1, full[0, prompt.shape[1]:, None]).mean())


@functools.lru_cache(maxsize=16)
def _reference_generation(offset: int, prompt_len: int, new: int) -> tuple[tuple[int, ...], float]:
    """The exact model's greedy continuation of one prompt, and its own NLL of it."""
    model, _, ids = _model()
    prompt = ids[:, offset:offset + prompt_len]
    _set_attention(model, "sdpa")
    with torch.inference_mode():
        out = model.generate(prompt, max_new_tokens=new, do_sample=False,
                             attention_mask=torch.ones(1, prompt_len, dtype=torch.long))
    cont = tuple(out[0, prompt_len:].tolist())
    return cont, _fp_nll(prompt, cont)


def generation_cell(scheme: str, n: int, seed: int, window: int, offset: int, prompt_len: int, new: int) -> list[dict]:
    """Greedy continuation through a KVStatsCache vs the exact model's, one prompt.

    Besides the tokens before the first divergence (coarse: one flip changes all that follows), the exact
    model scores the quantized model's continuation (mean NLL per token): how plausible the text is."""
    from kvstats.cache import KVStatsCache

    _quiet()
    model, tokenizer, ids = _model()
    ref, ref_nll = _reference_generation(offset, prompt_len, new)
    prompt = ids[:, offset:offset + prompt_len]
    _set_attention(model, "kvstats")
    cache = KVStatsCache(_schemes(scheme, n, seed, model.config.num_hidden_layers), full_precision_window=window)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(prompt, max_new_tokens=new, do_sample=False,
                             attention_mask=torch.ones(1, prompt_len, dtype=torch.long), **_cache_kw(model, cache))
    seconds = time.perf_counter() - t0
    gen = tuple(out[0, prompt_len:].tolist())
    same = [a == b for a, b in zip(gen, ref)]
    first = same.index(False) if False in same else len(same)
    return [{"tokens_before_divergence": first, "agreement": float(np.mean(same)), "new": len(gen),
             "fp_nll": _fp_nll(prompt, gen), "fp_nll_reference": ref_nll,
             "seconds_per_token": seconds / max(1, len(gen)), "bits_per_element": cache.memory().bits_per_element,
             "text": tokenizer.decode(list(gen)), "reference_text": tokenizer.decode(list(ref))}]


# ------------------------------------------------------------------------------------------ statistics


def _ci(x, resamples: int, seed: int) -> tuple[float, float, float]:
    x = np.asarray(x, dtype=float)
    r = bootstrap_ci(x[np.isfinite(x)], np.mean, n_resamples=resamples, seed=seed)
    return r.statistic, *r.confidence_interval


def summary_table(tokens: pd.DataFrame, cells: pd.DataFrame, resamples: int) -> pd.DataFrame:
    """One row per cell: means with bootstrap CIs over tokens; perplexities."""
    rows = []
    keys = ["scheme", "n", "seed", "window"]
    for key, g in tokens.groupby(keys, sort=False):
        s = cell_seed(STUDY, "ci", *key)
        d_nll = (g["nll"] - g["nll_ref"]).dropna()
        row = dict(zip(keys, key))
        for col in ("out_kl", "top1", "attn_kl", "top5"):
            row[col], row[f"{col}_lo"], row[f"{col}_hi"] = _ci(g[col], resamples, s)
        m, lo, hi = _ci(d_nll, resamples, s)
        row.update({"ppl_ref": math.exp(g["nll_ref"].mean()), "ppl": math.exp(g["nll"].mean()),
                    "ppl_ratio": math.exp(m), "ppl_ratio_lo": math.exp(lo), "ppl_ratio_hi": math.exp(hi),
                    "tokens": len(g)})
        rows.append(row)
    out = pd.DataFrame(rows)
    info = cells[keys + ["bits_per_element", "code_bytes", "window_bytes", "fp16_bytes", "max_abs_dlogit",
                         "seconds"]]
    return out.merge(info, on=keys, how="left")


def _spearman_ci(x, y, resamples: int, seed: int):
    """Spearman's ρ with a bootstrap CI (pairs resampled; BCa, percentile when BCa degenerates)."""
    if len(x) < 4:
        rho = stats.spearmanr(x, y)
        return float(rho.statistic), float(rho.pvalue), math.nan, math.nan, "too few points for a CI"
    r = spearman(x, y, n_resamples=resamples, seed=seed)
    return r.statistic, r.pvalue, *r.confidence_interval, r.ci_method


def correlations(summary: pd.DataFrame, tokens: pd.DataFrame, resamples: int) -> pd.DataFrame:
    """Spearman ρ between attention-level and output-level damage: across cells and across tokens per cell."""
    rows = []
    q = summary[summary["scheme"] != "identity"]
    pairs = [("attn_kl", "out_kl"), ("attn_kl", "ppl_ratio"), ("attn_kl", "1-top1"), ("1-top5", "out_kl")]
    q = q.assign(**{"1-top1": 1 - q["top1"], "1-top5": 1 - q["top5"]})
    for a, b in pairs:
        rho, p, lo, hi, method = _spearman_ci(q[a], q[b], resamples, cell_seed(STUDY, "rho", a, b))
        rows.append({"level": "cells", "scheme": "all", "n": None, "seed": None, "window": None, "x": a, "y": b,
                     "rho": rho, "p": p, "rho_lo": lo, "rho_hi": hi, "ci_method": method, "points": len(q)})
    tq = tokens[(tokens["scheme"] != "identity") & (tokens["t"] > 0)]  # t = 0 attends one key: KL is 0
    for key, g in tq.groupby(["scheme", "n", "seed", "window"], sort=False):
        rho, p, lo, hi, method = _spearman_ci(g["attn_kl"], g["out_kl"], min(resamples, 999),
                                              cell_seed(STUDY, "rho-tokens", *key))
        rows.append({"level": "tokens", "scheme": key[0], "n": key[1], "seed": key[2], "window": key[3],
                     "x": "attn_kl", "y": "out_kl", "rho": rho, "p": p, "rho_lo": lo, "rho_hi": hi,
                     "ci_method": method, "points": len(g)})
    return pd.DataFrame(rows)


def paired_ratio(tokens: pd.DataFrame, col: str, n: int, window: int, resamples: int):
    """mean(QKQV)/mean(KQV) of a per-token metric at budget n (seeds averaged per token), paired bootstrap CI."""
    sel = tokens[(tokens["n"] == n) & (tokens["window"] == window)]
    a = sel[sel["scheme"] == "qkqv"].groupby("t")[col].mean()
    b = sel[sel["scheme"] == "kqv"].groupby("t")[col].mean()
    a, b = a.align(b, join="inner")
    r = ratio_ci(a.to_numpy(), b.to_numpy(), np.mean, n_resamples=resamples, paired=True,
                 seed=cell_seed(STUDY, "ratio", col, n, window))
    return r.statistic, *r.confidence_interval


# --------------------------------------------------------------------------------------------- figures


def _by_n(summary: pd.DataFrame, scheme: str, window: int) -> pd.DataFrame:
    g = summary[(summary["scheme"] == scheme) & (summary["window"] == window)]
    return g.groupby("n", as_index=False).mean(numeric_only=True).sort_values("n")


def _errorbar(ax, x, mid, lo, hi, name, offset=0.0, label=None):
    st = plots.style(name)
    ax.errorbar(np.asarray(x) + offset, mid, yerr=[np.maximum(mid - lo, 0), np.maximum(hi - mid, 0)],
                color=st["color"], marker=st["marker"], ms=5, capsize=3, lw=1.4, label=label or st["label"])


def figures(summary: pd.DataFrame, tokens: pd.DataFrame, layers: pd.DataFrame, corr: pd.DataFrame,
            gen: pd.DataFrame, scale: str, tokens_n: int) -> None:
    plots.setup()
    window = 0
    control = summary[summary["scheme"] == "identity"]
    # ---- output damage
    fig, axes = plots.panels(1, 4, f"SmolLM2-135M with a quantized KV cache: output damage "
                                   f"(teacher-forced, {tokens_n} tokens, {scale} scale)", width=4.0, height=3.4)
    for k, name in enumerate(SCHEMES):
        g = _by_n(summary, name, window)
        off = (k - 1) * 0.08
        _errorbar(axes[0, 0], g["n"], g["out_kl"], g["out_kl_lo"], g["out_kl_hi"], name, off)
        _errorbar(axes[0, 1], g["n"], g["ppl_ratio"], g["ppl_ratio_lo"], g["ppl_ratio_hi"], name, off)
        _errorbar(axes[0, 2], g["n"], g["top1"], g["top1_lo"], g["top1_hi"], name, off)
        gg = gen[(gen["scheme"] == name) & (gen["window"] == window)].groupby("n")["fp_nll"]
        st = plots.style(name)
        axes[0, 3].plot(gg.mean().index + off, gg.mean().values, color=st["color"], marker=st["marker"], lw=1.4,
                        label=st["label"])
    for wv in sorted(set(summary["window"]) - {window}):  # paper scale: the fp window, dashed
        for name in SCHEMES:
            g = _by_n(summary, name, wv)
            st = plots.style(name)
            axes[0, 0].plot(g["n"], g["out_kl"], color=st["color"], ls="--", lw=1, marker=st["marker"], ms=3,
                            mfc="none", label=f"{name.upper()}, last {wv} tokens exact")
            axes[0, 1].plot(g["n"], g["ppl_ratio"], color=st["color"], ls="--", lw=1, marker=st["marker"], ms=3,
                            mfc="none")
            axes[0, 2].plot(g["n"], g["top1"], color=st["color"], ls="--", lw=1, marker=st["marker"], ms=3,
                            mfc="none")
    if len(control):
        axes[0, 0].text(0.98, 0.97, f"lossless control: {float(control['out_kl'].mean()):.0e} nats",
                        transform=axes[0, 0].transAxes, ha="right", va="top", fontsize=7)
    axes[0, 0].set(yscale="log", xlabel="budget n (bits per element, payload)", ylabel="mean KL(p_fp ‖ p_quant), nats",
                   title="next-token KL")
    axes[0, 1].axhline(1.0, color="k", ls=":", lw=1)
    axes[0, 1].set(yscale="log", xlabel="budget n", ylabel="perplexity ratio quant / fp",
                   title=f"perplexity (fp: {float(summary['ppl_ref'].iloc[0]):.2f})")
    axes[0, 2].set(xlabel="budget n", ylabel="fraction of tokens", title="top-1 agreement with fp", ylim=(0, 1.02))
    if len(gen):
        ref_nll = gen.drop_duplicates("offset")["fp_nll_reference"].mean()
        axes[0, 3].axhline(ref_nll, color="k", ls=":", lw=1, label="fp's own greedy text")
        axes[0, 3].legend(loc="upper right", fontsize=7)
    axes[0, 3].set(xlabel="budget n", ylabel="NLL under the fp model (nats/token)",
                   title=f"greedy generation ({int(gen['new'].max()) if len(gen) else 0} tokens, "
                         f"{gen['offset'].nunique() if len(gen) else 0} prompt(s))")
    axes[0, 0].legend(loc="lower left", fontsize=7)
    for ax in axes[0]:
        ax.set_xticks(BUDGETS)
    plots.save(fig, f"{STUDY}_output")

    # ---- attention damage
    fig, axes = plots.panels(1, 3, "Attention damage in the same forward (mean over 30 layers × 9 heads × tokens)",
                             width=4.2, height=3.4)
    for k, name in enumerate(SCHEMES):
        g = _by_n(summary, name, window)
        off = (k - 1) * 0.08
        _errorbar(axes[0, 0], g["n"], g["attn_kl"], g["attn_kl_lo"], g["attn_kl_hi"], name, off)
        _errorbar(axes[0, 1], g["n"], g["top5"], g["top5_lo"], g["top5_hi"], name, off)
        lay = layers[(layers["scheme"] == name) & (layers["n"] == 4) & (layers["window"] == window)]
        lay = lay.groupby("layer")["attn_kl"].mean()
        st = plots.style(name)
        axes[0, 2].plot(lay.index, lay.values, color=st["color"], marker=st["marker"], ms=3, lw=1.2, label=st["label"])
    axes[0, 0].set(yscale="log", xlabel="budget n", ylabel="attention KL (nats)", title="attention KL")
    axes[0, 1].set(xlabel="budget n", ylabel="top-5 recall", title="top-5 recall", ylim=(0, 1.02))
    axes[0, 2].set(yscale="log", xlabel="layer", ylabel="attention KL (nats)", title="attention KL by layer, n = 4")
    axes[0, 0].legend(loc="lower left", fontsize=7)
    for ax in axes[0, :2]:
        ax.set_xticks(BUDGETS)
    plots.save(fig, f"{STUDY}_attention")

    # ---- predictivity
    fig, axes = plots.panels(1, 3, "Does attention KL predict output damage? (Spearman ρ, bootstrap 95% CI)",
                             width=4.3, height=3.6)
    ax = axes[0, 0]
    q = summary[summary["scheme"] != "identity"]
    for name in SCHEMES:
        g = q[q["scheme"] == name]
        st = plots.style(name)
        ax.scatter(g["attn_kl"], g["out_kl"], color=st["color"], marker=st["marker"], s=30, label=st["label"])
        for _, r in g[g["seed"] == g["seed"].min()].iterrows():
            ax.annotate(f"{int(r['n'])}{'w' if r['window'] else ''}", (r["attn_kl"], r["out_kl"]), fontsize=7,
                        xytext=(3, 2), textcoords="offset points")
    c = corr[(corr["level"] == "cells") & (corr["x"] == "attn_kl") & (corr["y"] == "out_kl")].iloc[0]
    ax.set(xscale="log", yscale="log", xlabel="attention KL (mean)", ylabel="next-token KL (mean)",
           title=f"across cells: ρ = {c['rho']:.2f} [{c['rho_lo']:.2f}, {c['rho_hi']:.2f}], {int(c['points'])} cells")
    ax.legend(fontsize=7, loc="upper left")
    ax = axes[0, 1]
    sel = tokens[(tokens["scheme"] == "kqv") & (tokens["n"] == 4) & (tokens["seed"] == tokens["seed"].min())
                 & (tokens["window"] == window) & (tokens["t"] > 0)]
    ct = corr[(corr["level"] == "tokens") & (corr["scheme"] == "kqv") & (corr["n"] == 4)
              & (corr["window"] == window)].iloc[0]
    ax.scatter(sel["attn_kl"], sel["out_kl"].clip(lower=1e-6), s=6, alpha=0.5, color=plots.style("kqv")["color"])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set(xscale="log", yscale="log", xlabel="attention KL at token t", ylabel="next-token KL at token t",
           title=f"KQV n = 4, per token: ρ = {ct['rho']:.2f} [{ct['rho_lo']:.2f}, {ct['rho_hi']:.2f}]")
    ax = axes[0, 2]
    ctok = corr[(corr["level"] == "tokens") & (corr["window"] == window)]
    for k, name in enumerate(SCHEMES):
        g = ctok[ctok["scheme"] == name].groupby("n", as_index=False).mean(numeric_only=True)
        _errorbar(ax, g["n"], g["rho"], g["rho_lo"], g["rho_hi"], name, (k - 1) * 0.08)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xlabel="budget n", ylabel="Spearman ρ over tokens", title="per-token ρ(attention KL, next-token KL)",
           ylim=(-0.2, 1.0))
    ax.set_xticks(BUDGETS)
    ax.legend(fontsize=7, loc="lower right")
    plots.save(fig, f"{STUDY}_predictivity")


# ---------------------------------------------------------------------------------------------- claims


def _at_most(x: float, what: str) -> str:
    return f"{what} = 0 (identical logits)" if x == 0 else f"{what} ≤ {x:.1e}"


def claims(summary: pd.DataFrame, tokens: pd.DataFrame, corr: pd.DataFrame, gen: pd.DataFrame,
           agree: pd.DataFrame, cfg: dict, scale: str) -> list[dict]:
    data = (f"SmolLM2-135M-Instruct (fp32, 30 layers, 9 q / 3 KV heads, d = 64), teacher-forced over the first "
            f"{cfg['tokens']} tokens of kvstats' public-domain text; seeds {list(cfg['seeds'])}; windows "
            f"{list(cfg['windows'])} ({scale})")
    out = []
    w = 0
    main = summary[(summary["window"] == w) & (summary["scheme"] != "identity")]
    mean = main.groupby(["scheme", "n"]).mean(numeric_only=True)
    ctrl = summary[summary["scheme"] == "identity"]
    if len(ctrl):
        r = ctrl.iloc[0]
        out.append({
            "id": "e2e-lossless-control", "claim": "A KVStatsCache with a lossless scheme leaves the model unchanged.",
            "source": "kvstats", "data": data, "verdict": "measured", "figure": f"{STUDY}_output.png",
            "measurement": (f"identity scheme through the cache on the estimator path: mean next-token KL "
                            f"{r['out_kl']:.1e} nats, max |Δlogit| {r['max_abs_dlogit']:.1e}, top-1 agreement "
                            f"{r['top1']:.3f}, perplexity {r['ppl']:.4f} vs {r['ppl_ref']:.4f}"),
            "details": "The floor of the pipeline: fp32 re-association between sdpa and kvstats_attention."})
    if len(agree):
        f64, f32 = agree[agree["dtype"] == "float64"], agree[agree["dtype"] == "float32"]
        rows_ag = "\n".join(f"| {r['scheme']} | {r['n']} | {r['dtype']} | {r['max_abs_diff']:.1e} | "
                            f"{r['kl_paths']:.1e} | {r['kl_fp_estimator']:.3f} | {r['kl_fp_dense']:.3f} | "
                            f"{r['top1_paths']:.3f} |"
                            for _, r in agree.iterrows())
        out.append({
            "id": "e2e-estimator-equals-decode", "source": "kvstats", "verdict": "measured", "figure": None,
            "data": f"SmolLM2-135M-Instruct in fp32 and fp64, first {int(agree['tokens'].iloc[0])} tokens of the text",
            "claim": "For kvstats' built-in K estimators (all linear in the code) attention through the estimator "
                     "equals decode-then-dot.",
            "measurement": (f"same cache read by kvstats_attention (estimator) and by the model's sdpa (decoded K̂): in "
                            f"fp64 {_at_most(f64['max_abs_diff'].max(), 'max |Δlogit|')} and "
                            f"{_at_most(f64['kl_paths'].max(), 'KL between the paths')}; in fp32 the paths drift "
                            f"apart (KL ≤ "
                            f"{f32['kl_paths'].max():.2g}, vs KL to fp {f32['kl_fp_estimator'].min():.2g} to "
                            f"{f32['kl_fp_estimator'].max():.2g})"),
            "details": ("| scheme | n | dtype | max abs Δlogit | KL(est ‖ dense) | KL fp→est | KL fp→dense | top-1 "
                        "equal |\n|---|---|---|---|---|---|---|---|\n" + rows_ag + "\n\nEach attention call agrees to "
                        "rounding. In fp32 a ~1e-7 difference in one layer's output can move a later layer's key "
                        "across a codebook threshold; the flipped code changes that layer's attention by a full "
                        "quantization step and the two runs become two different quantized models (chaotic "
                        "amplification through 30 quantized layers, not a bias of either path). In fp64 such flips "
                        "are ~1e-9 as likely and the paths agree.")})
    rows, verdict_out, verdict_att = [], [], []
    for n in BUDGETS:
        r_out = paired_ratio(tokens, "out_kl", n, w, cfg["resamples"])
        r_att = paired_ratio(tokens, "attn_kl", n, w, cfg["resamples"])
        verdict_out.append(r_out[1] > 1)
        verdict_att.append(r_att[1] > 1)
        rows.append(f"| {n} | {r_att[0]:.2f} [{r_att[1]:.2f}, {r_att[2]:.2f}] | {r_out[0]:.2f} [{r_out[1]:.2f}, "
                    f"{r_out[2]:.2f}] | {mean.loc[('kqv', n), 'ppl']:.2f} | {mean.loc[('qkqv', n), 'ppl']:.2f} |")
    table = ("| n | attention KL QKQV/KQV [95% CI] | next-token KL QKQV/KQV [95% CI] | ppl KQV | ppl QKQV |\n"
             "|---|---|---|---|---|\n" + "\n".join(rows))

    def verdict(flags):
        return "reproduced" if all(flags) else ("partly" if any(flags) else "not reproduced")

    out.append({
        "id": "e2e-qkqv-worse-than-kqv", "figure": f"{STUDY}_output.png", "data": data,
        "claim": "QKQV is worse than KQV in KL at every budget (D'Alberto), here carried from attention KL to the "
                 "model's next-token distribution.",
        "source": "D'Alberto, arXiv 2605.08114, abstract (finding 2); end-to-end test by kvstats",
        "measurement": (f"QKQV/KQV ratio of mean next-token KL > 1 with the paired bootstrap CI above 1 at "
                        f"{sum(verdict_out)}/{len(BUDGETS)} budgets; of attention KL at {sum(verdict_att)}/"
                        f"{len(BUDGETS)}"),
        "verdict": verdict([a and b for a, b in zip(verdict_out, verdict_att)]),
        "details": table + "\n\nCIs: BCa bootstrap over tokens, pairs kept (tokens are dependent: optimistic). "
                           "At equal n QKQV also stores more (its K keeps γ = ‖r‖ beside ‖k‖: 0.25 more bits per "
                           "element at d = 64 with fp32 norms), so KQV wins at a lower total cost."})
    r4 = paired_ratio(tokens, "attn_kl", 4, w, cfg["resamples"])
    inside = r4[1] <= PAPER_RATIO_N4 <= r4[2]
    out.append({
        "id": "e2e-ratio-n4", "figure": f"{STUDY}_attention.png", "data": data,
        "claim": f"At n = 4, KQV's KL is {PAPER_RATIO_N4}× lower than QKQV's.",
        "source": "D'Alberto, arXiv 2605.08114, abstract (finding 4)",
        "measurement": (f"on SmolLM2's own attention inside generation, mean attention KL QKQV/KQV at n = 4 = "
                        f"{r4[0]:.2f} [{r4[1]:.2f}, {r4[2]:.2f}] (paired BCa over tokens)"),
        "verdict": "reproduced" if inside else ("partly" if r4[1] > 1 else "not reproduced"),
        "details": ("The direction holds (KQV lower); the size differs from the published 2.25×, which was "
                    "measured on other data (the paper's distributions), so only the direction is comparable."
                    if not inside else None)})
    c = corr[(corr["level"] == "cells") & (corr["x"] == "attn_kl") & (corr["y"] == "out_kl")].iloc[0]
    other = corr[corr["level"] == "cells"]
    lines = "\n".join(f"| {r['x']} | {r['y']} | {r['rho']:.3f} [{r['rho_lo']:.3f}, {r['rho_hi']:.3f}] | "
                      f"{fmt_p(r['p'])} |" for _, r in other.iterrows())
    qc = summary[summary["scheme"] != "identity"]
    lx, ly = np.log10(qc["attn_kl"].to_numpy()), np.log10(qc["out_kl"].to_numpy())
    fit_b, fit_a = np.polyfit(lx, ly, 1)
    resid = {k: float(10 ** g.mean()) for k, g in pd.Series(ly - (fit_a + fit_b * lx), index=qc["scheme"].to_numpy())
             .groupby(level=0)}
    ct = corr[(corr["level"] == "tokens") & (corr["window"] == w)]
    per = ct.assign(n=ct["n"].astype(int)).groupby(["scheme", "n"])["rho"].mean().unstack("n")
    per_table = ("| scheme | " + " | ".join(f"n = {n}" for n in per.columns) + " |\n|---|" + "---|" * len(per.columns)
                 + "\n" + "\n".join(f"| {s} | " + " | ".join(f"{v:.2f}" for v in per.loc[s]) + " |" for s in per.index))
    out.append({
        "id": "e2e-attention-kl-predicts-output", "figure": f"{STUDY}_predictivity.png", "data": data,
        "source": "kvstats", "verdict": "measured",
        "claim": "Attention KL (a K-only, per-layer metric) ranks cache configurations as their damage to the "
                 "model's next-token distribution.",
        "measurement": (f"Spearman ρ(attention KL, next-token KL) across {int(c['points'])} cells = {c['rho']:.3f}, "
                        f"95% CI [{c['rho_lo']:.3f}, {c['rho_hi']:.3f}] ({c['ci_method']} bootstrap over cells), "
                        f"{fmt_p(c['p'])} (scipy, t approximation); per token within a cell the median ρ is "
                        f"{ct['rho'].median():.2f} (range {ct['rho'].min():.2f} to {ct['rho'].max():.2f})"),
        "details": ("| x | y | ρ [95% CI] across cells | p |\n|---|---|---|---|\n" + lines
                    + "\n\nPer-token ρ(attention KL_t, next-token KL_t), t ≥ 1:\n\n" + per_table
                    + f"\n\nA common log-log fit across cells, log10 KL_out = {fit_a:.2f} + {fit_b:.2f}·log10 KL_attn, "
                      "leaves per scheme a mean factor of "
                    + ", ".join(f"{k.upper()} ×{v:.2f}" for k, v in resid.items())
                    + ": attention KL sees K only, and the schemes' value quantizers differ (KV: n-bit Lloyd–Max on "
                      "raw values; KQV and QKQV: TurboQuant_prod, (n−1) bits + 1-bit QJL, unbiased but noisier).")})
    ppl_rows = "\n".join(
        f"| {s} | " + " | ".join(f"{mean.loc[(s, n), 'ppl']:.2f} ({mean.loc[(s, n), 'top1']:.2f}, "
                                 f"{mean.loc[(s, n), 'bits_per_element']:.2f} b)" for n in BUDGETS) + " |"
        for s in SCHEMES)
    ppl_ref = float(summary["ppl_ref"].iloc[0])
    best = {s: next((n for n in BUDGETS if mean.loc[(s, n), "ppl"] <= 1.05 * ppl_ref), None) for s in SCHEMES}
    out.append({
        "id": "e2e-perplexity", "figure": f"{STUDY}_output.png", "data": data, "source": "kvstats",
        "verdict": "measured",
        "claim": "Perplexity and top-1 agreement of SmolLM2 with each scheme's cache at n = 2..6.",
        "measurement": (f"fp perplexity {ppl_ref:.2f}; smallest n within 5% of it: "
                        + ", ".join(f"{s.upper()} {best[s] if best[s] else '> 6'}" for s in SCHEMES)
                        + "; at n = 4: " + ", ".join(f"{s.upper()} {mean.loc[(s, 4), 'ppl']:.2f}" for s in SCHEMES)),
        "details": ("perplexity (top-1 agreement, bits per element with norms) per n:\n\n| scheme | "
                    + " | ".join(f"n = {n}" for n in BUDGETS) + " |\n|---|" + "---|" * len(BUDGETS) + "\n" + ppl_rows)})
    windows = sorted(set(summary["window"]) - {w})
    if windows:
        wv = windows[-1]
        rows_w = []
        for s_name in SCHEMES:
            for n in BUDGETS:
                base = mean.loc[(s_name, n), "out_kl"]
                with_w = summary[(summary["scheme"] == s_name) & (summary["n"] == n) & (summary["window"] == wv)]
                rows_w.append((s_name, n, base, float(with_w["out_kl"].mean())))
        table_w = f"| scheme | n | KL, W = 0 | KL, W = {wv} | ratio |\n|---|---|---|---|---|\n" + "\n".join(
            f"| {a} | {n} | {b:.3f} | {c:.3f} | {b / c:.1f} |" for a, n, b, c in rows_w)
        at4 = {a: b / c for a, n, b, c in rows_w if n == 4}
        out.append({
            "id": "e2e-window", "figure": f"{STUDY}_output.png", "data": data, "source": "kvstats",
            "verdict": "measured",
            "claim": f"Keeping the last {wv} tokens exact (KIVI/QJL-style window) reduces the output damage.",
            "measurement": (f"mean next-token KL with W = 0 / with W = {wv} at n = 4: "
                            + ", ".join(f"{k.upper()} {v:.1f}×" for k, v in at4.items())),
            "details": table_w + f"\n\nOver {cfg['tokens']} tokens a window of {wv} keeps "
                                 f"{min(1.0, wv / cfg['tokens']):.0%} of the last query's keys exact."})
    if len(gen):
        gw = gen[gen["window"] == w]
        nll = gw.groupby(["scheme", "n"])["fp_nll"].mean().unstack("n")
        div = gw.groupby(["scheme", "n"])["tokens_before_divergence"].mean().unstack("n")
        ref_nll = gw.drop_duplicates("offset")["fp_nll_reference"].mean()
        table = ("| scheme | " + " | ".join(f"n = {n}" for n in nll.columns) + " |\n|---|" + "---|" * len(nll.columns)
                 + "\n" + "\n".join(f"| {s} | " + " | ".join(f"{nll.loc[s, n]:.2f} ({div.loc[s, n]:.0f})"
                                                           for n in nll.columns) + " |" for s in nll.index))
        out.append({
            "id": "e2e-generation", "figure": f"{STUDY}_output.png", "data": data, "source": "kvstats",
            "verdict": "measured",
            "claim": "Greedy generation through the quantized cache (model.generate with a KVStatsCache) stays "
                     "plausible to the fp model.",
            "measurement": (f"fp-model NLL of the greedy continuation ({int(gen['new'].max())} tokens, "
                            f"{gen['offset'].nunique()} prompt(s) of {cfg['prompt_len']} tokens): fp's own "
                            f"{ref_nll:.2f} nats/token; at n = 4: "
                            + ", ".join(f"{s.upper()} {nll.loc[s, 4]:.2f}" for s in SCHEMES if s in nll.index)
                            + "; at n = 6: "
                            + ", ".join(f"{s.upper()} {nll.loc[s, 6]:.2f}" for s in SCHEMES if s in nll.index)),
            "details": ("fp-model NLL of the continuation (tokens equal to fp's greedy continuation before the "
                        "first divergence):\n\n" + table + "\n\nThe divergence point is coarse: greedy decoding "
                        "flips at the first near-tie, after which the texts differ although both may be fine.")})
    return out


# ------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    shell = study.start(STUDY, __doc__, argv, position=POSITION)
    args = shell.args
    _quiet()
    cfg = SCALE[args.scale]
    # one torch thread per cell (the sweep's default): several threads per process spin badly on a shared
    # machine (10-100× slower measured here under load)
    cells = grid(scheme=list(SCHEMES), n=list(BUDGETS), seed=list(cfg["seeds"]), window=list(cfg["windows"]),
                 tokens=cfg["tokens"])
    cells.append({"scheme": "identity", "n": 0, "seed": 0, "window": 0, "tokens": cfg["tokens"]})
    table = shell.sweep(cell, cells, version=VERSION)
    agree = shell.sweep(agreement_cell, grid(scheme=list(SCHEMES), n=4, dtype=["float32", "float64"],
                                             tokens=cfg["agree_tokens"]), version=VERSION, name=f"{STUDY}_paths")
    gen_cells = grid(scheme=list(SCHEMES), n=list(BUDGETS), seed=cfg["seeds"][0], window=list(cfg["windows"]),
                     offset=list(cfg["prompts"]), prompt_len=cfg["prompt_len"], new=cfg["new"])
    gen = shell.sweep(generation_cell, gen_cells, version=VERSION, name=f"{STUDY}_generation")
    t_cells = shell.elapsed()

    keys = ["scheme", "n", "seed", "window"]
    tokens = table[table["kind"] == "token"][keys + ["t", "out_kl", "top1", "nll_ref", "nll", "attn_kl", "top5"]]
    layers = table[table["kind"] == "layer"][keys + ["layer", "attn_kl", "top5"]]
    cell_rows = table[table["kind"] == "cell"]
    summary = summary_table(tokens, cell_rows, cfg["resamples"])
    corr = correlations(summary, tokens, cfg["resamples"])
    plots.write_csv(STUDY, summary)
    plots.write_csv(f"{STUDY}_tokens", tokens)
    plots.write_csv(f"{STUDY}_layers", layers)
    plots.write_csv(f"{STUDY}_correlation", corr)
    plots.write_csv(f"{STUDY}_generation", gen)
    plots.write_csv(f"{STUDY}_paths", agree)
    figures(summary, tokens, layers, corr, gen, args.scale, cfg["tokens"])
    out = claims(summary, tokens, corr, gen, agree, cfg, args.scale)
    cols = ["scheme", "n", "out_kl", "ppl", "top1", "attn_kl", "top5", "bits_per_element", "seconds"]
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(summary[summary["window"] == 0][cols].groupby(["scheme", "n"]).mean().round(4).to_string())
    print(f"(cells {t_cells:.1f} s)")
    return shell.finish(out)


if __name__ == "__main__":
    sys.exit(main())
