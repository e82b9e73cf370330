"""Study: retrieval through a quantized KV cache — pass/fail per trial, with intervals and paired exact tests.

    python studies/retrieval.py --scale quick|paper [--scheduler ADDR]

The field judges KV quantizers by retrieval (needle-in-a-haystack, passkey, RULER; NOVA-KV's headline result,
arXiv 2608.04074, RULER and LongBench results: needle retrieval at 2 bits on Qwen3-8B, 75.4 for NOVA-KV vs 25.3
for the best scalar method) and reports it as one accuracy, one seed, no interval, no paired test. This study
measures retrieval on SmolLM2-135M-Instruct (fp32) through kvstats.cache.KVStatsCache with every trial a pass or
a fail, so each accuracy gets a Wilson interval and each comparison an exact McNemar test on the same trials.

Tasks (a trial is one needle; every scheme and the fp model see the same prompts; docs/studies.md, "retrieval"):

* ``passkey``: a sentence "The pass key is 48213. Remember it. 48213 is the pass key." hidden in text, then
  "What is the pass key?" in SmolLM2's chat format; one needle per prompt. Small models lose it fast with length
  so it runs at short lengths only.
* ``induction``: five spans of 12 random tokens, each on its own line, at depths 10%, 30%, 50%, 70%, 90% of the
  text; the question repeats the first 6 tokens of each span on a new line, the answer is the next 3 (copying a
  span seen once: induction heads). Reaches 8,192 tokens (the model's context).
* ``lookup``: a list "id 0417: 58213" lines filling the context; the question asks five ids, at the five depths.

Protocol. The context (text with needles) goes through the model once in full precision (sdpa); its K/V are
handed to each cache (:meth:`KVStatsCache.prefill`: every token stored as codes, no full-precision window; for
transformers' QuantizedCache its first ``update``), and the questions with their answers go through the cache in
one teacher-forced forward — the serving protocol of a full-precision prefill and a quantized cache that every
later token reads. A trial passes when the model's greedy prediction is every answer token (teacher forcing
gives exactly the logits of greedy decoding as long as it is right, so "all argmax right" = "greedy generation
returns the answer"). Attention KL: KL(p_exact ‖ p_quantized) of every question and answer query, every layer,
from the cache's records (kvstats schemes only).

Statistics. Accuracy with its Wilson 95% interval (kvstats.stats.proportion_ci); exact McNemar of each scheme
against the fp model and between schemes on the same trials (kvstats.stats.mcnemar), Holm within each (task,
length) family and, pooled over lengths, within each task; the needles of one prompt share its text (not
independent trials: the p-values describe these prompts). "Within δ" is tested on the paired difference's
Newcombe interval at 90% (TOST at α = 0.05) with δ = 0.05.

quick: passkey at 256 tokens (4 prompts), induction at 256 (2) and 1,024 (1), lookup at 256 (2), n ∈ {2, 4}
(NOVA-KV at 2);
paper: passkey at 256, 512 and 1,024 (10 prompts each), induction at 256–8,192, lookup at 256–2,048, n ∈ {2, 3, 4}.
Writes figures/retrieval_heatmap_n2.png (and _n4), figures/retrieval_accuracy_vs_kl.png,
figures/data/retrieval_*.csv and the claims file. Needs the [models] extra (and [baselines] for transformers'
quantized caches).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from statsmodels.stats.multitest import multipletests

from kvstats import study
from kvstats._random import unit_seed
from kvstats.measure.stats import cluster_bootstrap_ci, mcnemar, proportion_ci
from kvstats.measure.verdicts import bound, cell_direction, combine, direction, equivalence, measured
from kvstats.study import plots
from kvstats.study.claims import Claim
from kvstats.study.report import fmt_p
from kvstats.study.sweep import cell_seed

STUDY = "retrieval"
VERSION = "2"  # 2: NOVA-KV cells always on the kvstats path with their records (dc05222)
POSITION = 97  # place in figures/REPORT.md: after model_damage
#: kvstats schemes (studies/end_to_end.py's builders: D'Alberto's three, KIVI-style min-max, TurboQuant_mse on K
#: and V, NOVA-KV calibrated on the Declaration of Independence), then transformers' quantized cache
SCHEMES = ("kv", "kqv", "qkqv", "minmax", "mse", "nova")
BASELINE = "quanto"  # transformers' QuantizedCache (optimum-quanto backend: nbits 2 or 4)
FP = "fp"
FP_BITS = 16  # the n recorded for the fp model's rows (its cache holds fp32 values; the column needs a number)
#: the per-element ("scalar") methods NOVA-KV's claim compares with: KIVI-style min-max, quanto's int codes, a
#: Lloyd codebook per coordinate and TurboQuant_mse (a codebook per coordinate after a rotation)
SCALAR = ("minmax", BASELINE, "kv", "mse")
#: scheme pairs tested against each other at each n (besides every scheme against the fp model)
PAIRS = (("nova", "minmax"), ("nova", "mse"), ("nova", "kv"), ("nova", BASELINE), ("kqv", "qkqv"), ("kqv", "mse"))
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
INDUCTION_CUE, INDUCTION_ANSWER = 6, 3
ALPHA = 0.05
MARGIN = 0.05  # δ of the "within δ" claim: five percentage points of accuracy
NOVA_BITS = 2
SCALE = {
    "quick": {"tasks": {"passkey": {256: 4}, "induction": {256: 2, 1024: 1}, "lookup": {256: 2}},
              "bits": (2, 4), "calibration_tokens": 1024, "nova_bits": (2,)},
    "paper": {"tasks": {"passkey": {256: 10, 512: 10, 1024: 10}, "induction": {256: 6, 1024: 6, 4096: 4, 8192: 3},
                        "lookup": {256: 6, 1024: 6, 2048: 6}},
              "bits": (2, 3, 4), "calibration_tokens": None},
}
STYLE = {FP: {"color": "#000000", "marker": "o", "label": "fp32 (no quantization)"},
         BASELINE: {"color": "#8c564b", "marker": "P", "label": "transformers QuantizedCache (quanto)"}}


def style(name: str) -> dict[str, str]:
    from kvstats.studies.end_to_end import style as scheme_style

    return STYLE.get(name) or scheme_style(name)


# ------------------------------------------------------------------------------------------------ prompts


def _tokenizer():
    from kvstats.studies.end_to_end import _model

    return _model()[1]


def _encode(text: str) -> list[int]:
    return _tokenizer()(text, add_special_tokens=False).input_ids


@functools.lru_cache(maxsize=1)
def filler_tokens() -> tuple[int, ...]:
    """The haystack: the shipped documents except the Declaration of Independence (NOVA-KV's calibration text),
    concatenated and tokenized (once per process)."""
    from kvstats.studies.end_to_end import DOCUMENTS

    from kvstats.data.texts import documents

    return tuple(_encode("\n\n".join(text for title, text in documents().items() if title != DOCUMENTS[0])))


@functools.lru_cache(maxsize=1)
def _vocabulary() -> tuple[int, ...]:
    """The distinct token ids of the haystack, sorted: what induction needles are drawn from."""
    return tuple(sorted(set(filler_tokens())))


def _split(question: str, answer: str) -> tuple[list[int], tuple[int, ...]]:
    """Token ids of a question and of its answer, split where the text of both tokenizes: SmolLM2's tokenizer
    writes " 48213" as a lone space and the digits, so the space belongs to the question (a model's first guess
    after "is" is a word, not a bare space); ValueError if the parts do not tokenize as the whole."""
    q, a, whole = _encode(question.rstrip(" ")), _encode(answer), _encode(question + answer)
    if question.endswith(" "):
        q = whole[:len(whole) - len(a)]
    if q + a != whole:
        raise ValueError(f"question {question!r} and answer {answer!r} do not tokenize as their concatenation")
    return q, tuple(a)


def _haystack(length: int, rng: np.random.Generator) -> list[int]:
    """``length`` consecutive filler tokens from a random start (the filler read cyclically)."""
    filler = filler_tokens()
    start = int(rng.integers(0, len(filler)))
    return [filler[(start + i) % len(filler)] for i in range(length)]


@dataclass(frozen=True)
class Prompt:
    """One prompt: the context (ids), the question chunk (ids: questions and answers, teacher-forced) and per needle
    its depth and where its answer sits in the chunk (``answers[i] = (offset, answer ids)``: the logits at
    ``offset - 1 + j`` predict answer token j)."""

    context: list[int]
    chunk: list[int]
    depths: tuple[float, ...]
    answers: tuple[tuple[int, tuple[int, ...]], ...]


def _induction(length: int, rng: np.random.Generator) -> Prompt:
    hay, nl = _haystack(length, rng), _encode("\n")
    vocab = _vocabulary()
    context, last, chunk, answers = [], 0, [], []
    for d in DEPTHS:
        span = [int(t) for t in rng.choice(vocab, INDUCTION_CUE + INDUCTION_ANSWER)]
        at = int(d * length)
        context += hay[last:at] + nl + span + nl
        last = at
        question, answer = nl + span[:INDUCTION_CUE], span[INDUCTION_CUE:]
        answers.append((len(chunk) + len(question), tuple(answer)))
        chunk += question + answer + nl
    return Prompt(context + hay[last:], chunk, DEPTHS, tuple(answers))


def _lookup(length: int, rng: np.random.Generator) -> Prompt:
    context, entries = [], []
    while len(context) < length:
        key, value = f"{rng.integers(0, 10 ** 4):04d}", f"{rng.integers(10 ** 4, 10 ** 5)}"
        if any(key == k for k, _, _ in entries):
            continue
        entries.append((key, value, len(context)))
        context += _encode(("\n" if len(entries) > 1 else "") + f"id {key}: {value}")
    context = context[:length]
    entries = [e for e in entries if e[2] + 12 < length]  # whole lines only
    chunk, answers, depths = [], [], []
    for d in DEPTHS:
        key, value, at = min(entries, key=lambda e: abs(e[2] - d * length))
        question, answer = _split(f"\nid {key}: ", value)
        answers.append((len(chunk) + len(question), answer))
        depths.append(d)
        chunk += question + list(answer)
    return Prompt(context, chunk, tuple(depths), tuple(answers))


def _passkey(length: int, rng: np.random.Generator, depth: float) -> Prompt:
    tok = _tokenizer()
    key = f"{rng.integers(10 ** 4, 10 ** 5)}"
    head = tok.apply_chat_template([{"role": "user", "content": "There is a pass key hidden in the following text. "
                                     "Find it and remember it.\n\n"}], tokenize=False)
    head = _encode(head.rsplit("<|im_end|>", 1)[0])
    hay = _haystack(length - len(head), rng)
    at = int(depth * len(hay))
    context = head + hay[:at] + _encode(f" The pass key is {key}. Remember it. {key} is the pass key. ") + hay[at:]
    question, answer = _split("\n\nWhat is the pass key?<|im_end|>\n<|im_start|>assistant\nThe pass key is ", key)
    return Prompt(context, question + list(answer), (depth,), ((len(question), answer),))


def build_prompt(task: str, length: int, prompt: int) -> Prompt:
    """The prompt ``prompt`` of a (task, length) cell: its own spawned seed (kvstats._random.unit_seed)."""
    rng = np.random.default_rng(unit_seed(cell_seed(STUDY, task, length), prompt))
    if task == "induction":
        return _induction(length, rng)
    if task == "lookup":
        return _lookup(length, rng)
    if task == "passkey":
        return _passkey(length, rng, DEPTHS[prompt % len(DEPTHS)])
    raise ValueError(f"task must be 'passkey', 'induction' or 'lookup', got {task!r}")


def passed(logits: torch.Tensor, p: Prompt) -> list[bool]:
    """Per needle: the greedy prediction (argmax of ``logits`` [chunk, V]) is every answer token."""
    pred = logits.argmax(-1)
    return [all(int(pred[offset - 1 + j]) == a for j, a in enumerate(answer)) for offset, answer in p.answers]


# --------------------------------------------------------------------------------------------------- cell


def _chunk_logits(model, ids: torch.Tensor, cache) -> torch.Tensor:
    from kvstats.hf.cache import cache_kwargs

    return model(ids, use_cache=True, **cache_kwargs(model, cache)).logits[0].float()


def cell(task: str, length: int, prompt: int, bits: tuple, calibration_tokens: int | None,
         nova_bits: tuple | None = None) -> list[dict]:
    """One prompt: the exact prefill once, then the questions through the fp cache, every kvstats scheme at every n
    (NOVA-KV at ``nova_bits``, default every n: its calibration is the quick scale's largest cost) and
    transformers' quantized cache: one row per (scheme, n, needle)."""
    from kvstats.studies.end_to_end import _model, _set_attention, layer_schemes

    from kvstats.hf.baselines import available_backends, quantized_cache
    from kvstats.hf.cache import KVStatsCache

    model, _, _ = _model()
    p = build_prompt(task, length, prompt)
    context, chunk = torch.tensor([p.context]), torch.tensor([p.chunk])
    rows = []

    def add(scheme, n, outcome, attn_kl=float("nan"), bits_held=float("nan")):
        rows.extend({"task": task, "length": length, "prompt": prompt, "needle": i, "depth": p.depths[i],
                     "scheme": scheme, "n": n, "success": bool(ok), "attn_kl": attn_kl,
                     "bits_per_element": bits_held, "context_tokens": len(p.context)} for i, ok in enumerate(outcome))

    with torch.inference_mode():
        _set_attention(model, "sdpa")
        past = model(context, use_cache=True, logits_to_keep=1).past_key_values  # no [T, vocab] logits
        layers = len(past.layers)
        if BASELINE in available_backends():
            for n in (b for b in bits if b in (2, 4)):  # quanto's nbits
                q = quantized_cache(model, BASELINE, nbits=n)
                for i, layer in enumerate(past.layers):
                    q.update(layer.keys, layer.values, i)
                add(BASELINE, n, passed(_chunk_logits(model, chunk, q), p))
        _set_attention(model, "kvstats")
        for name in SCHEMES:
            for n in (bits if name != "nova" or nova_bits is None else nova_bits):
                seed = cell_seed(STUDY, "scheme", task, length, prompt) if name != "nova" else 0
                cache = KVStatsCache(layer_schemes(name, n, seed, layers, calibration_tokens), record_attention=True)
                logits = _chunk_logits(model, chunk, cache.prefill(past))
                if len(cache.attention_records) != layers:  # every layer on the estimator path, each one record
                    raise RuntimeError(f"retrieval cell {task}/{length}/{prompt}, {name} n = {n}: "
                                       f"{len(cache.attention_records)} attention records for {layers} layers: the "
                                       f"chunk did not run on the kvstats attention path")
                kl = float(np.mean([r.kl.mean().item() for r in cache.attention_records]))
                add(name, n, passed(logits, p), kl, cache.memory().bits_per_element)
        _set_attention(model, "sdpa")
        quantized = len(rows)
        add(FP, FP_BITS, passed(_chunk_logits(model, chunk, past), p))  # last: this forward extends past itself
    return rows[quantized:] + rows[:quantized]  # the fp rows first


# -------------------------------------------------------------------------------------------- statistics


def accuracy_table(trials: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Accuracy per group with its Wilson 95% interval."""
    rows = []
    for key, g in trials.groupby(by, sort=False):
        r = proportion_ci(g["success"].to_numpy())
        rows.append({**dict(zip(by, key)), "passed": r.successes, "trials": r.n, "accuracy": r.statistic,
                     "ci_low": r.confidence_interval.low, "ci_high": r.confidence_interval.high,
                     "attn_kl": float(g["attn_kl"].mean()), "bits_per_element": float(g["bits_per_element"].mean())})
    return pd.DataFrame(rows)


TRIAL = ["task", "length", "prompt", "needle"]


def _outcomes(trials: pd.DataFrame, scheme: str, n: int) -> pd.Series:
    sel = trials[(trials["scheme"] == scheme) & (trials["n"] == (FP_BITS if scheme == FP else n))]
    return sel.set_index(TRIAL)["success"]


def _mcnemar_row(trials: pd.DataFrame, a: str, b: str, n: int, level: float = 0.95) -> dict | None:
    x, y = _outcomes(trials, a, n), _outcomes(trials, b, n)
    x, y = x.align(y, join="inner")
    if x.empty:
        return None
    r = mcnemar(x.to_numpy(), y.to_numpy(), confidence_level=level)
    (n11, n10), (n01, n00) = r.table
    return {"a": a, "b": b, "n": n, "trials": r.n, "accuracy_a": r.proportions[0], "accuracy_b": r.proportions[1],
            "difference": r.effect_size, "diff_low": r.confidence_interval.low, "diff_high": r.confidence_interval.high,
            "a_only": n10, "b_only": n01, "p": r.pvalue}


def tests_table(trials: pd.DataFrame, bits: tuple) -> pd.DataFrame:
    """Exact McNemar per (task, length) and pooled over lengths ("all"): every scheme against the fp model
    (``family = "vs fp"``) and the :data:`PAIRS` (``"between"``), Holm within each (task, length, family)."""
    rows = []
    schemes = [s for s in (*SCHEMES, BASELINE) if s in set(trials["scheme"])]
    for task, tt in trials.groupby("task", sort=False):
        for length, g in [*tt.groupby("length"), ("all", tt)]:
            for family, pairs in (("vs fp", [(s, FP) for s in schemes]), ("between", PAIRS)):
                part = [r for n in bits for a, b in pairs if (r := _mcnemar_row(g, a, b, n)) is not None]
                if not part:
                    continue
                holm = multipletests([r["p"] for r in part], method="holm")[1]
                rows += [{"task": task, "length": str(length), "family": family, **r, "p_holm": float(h)}
                         for r, h in zip(part, holm)]
    return pd.DataFrame(rows)


def equivalence_rows(trials: pd.DataFrame, scheme: str, n: int) -> list[dict]:
    """Per task, the paired difference scheme − fp with Newcombe's 90% interval: TOST at α = 0.05 (margin δ)."""
    out = []
    for task, g in trials.groupby("task", sort=False):
        r = _mcnemar_row(g, scheme, FP, n, level=1 - 2 * ALPHA)
        if r is not None:
            out.append({"task": task, **r})
    return out


# ---------------------------------------------------------------------------------------------- analysis


@dataclass(frozen=True, eq=False)
class Analysis:
    """The trials (one row per scheme, n and needle), the accuracies (per task, length, scheme, n; per task
    pooled over lengths; per task, length and depth) and the McNemar tests."""

    cfg: dict
    scale: str
    trials: pd.DataFrame
    accuracy: pd.DataFrame
    pooled: pd.DataFrame
    grid: pd.DataFrame
    tests: pd.DataFrame


def analyse(trials: pd.DataFrame, scale: str) -> Analysis:
    cfg = SCALE[scale]
    trials = trials.assign(success=trials["success"].astype(bool))
    return Analysis(cfg, scale, trials, accuracy_table(trials, ["task", "length", "scheme", "n"]),
                    accuracy_table(trials, ["task", "scheme", "n"]),
                    accuracy_table(trials, ["task", "length", "depth", "scheme", "n"]),
                    tests_table(trials, cfg["bits"]))


def _acc(row) -> str:
    return f"{100 * row['accuracy']:.0f}% [{100 * row['ci_low']:.0f}, {100 * row['ci_high']:.0f}] ({row['passed']}/" \
           f"{row['trials']})"


def _pooled_row(a: Analysis, task: str, scheme: str, n: int) -> pd.Series | None:
    sel = a.pooled[(a.pooled["task"] == task) & (a.pooled["scheme"] == scheme) & (a.pooled["n"] == n)]
    return None if sel.empty else sel.iloc[0]


def _test(a: Analysis, task: str, length: str, family: str, x: str, y: str, n: int) -> pd.Series | None:
    t = a.tests
    sel = t[(t["task"] == task) & (t["length"] == length) & (t["family"] == family) & (t["a"] == x) & (t["b"] == y)
            & (t["n"] == n)]
    return None if sel.empty else sel.iloc[0]


def _recovered(rows: np.ndarray) -> float:
    """(accuracy of column 1 − of column 2) / (of column 0 − of column 2): the share of what the scalar method
    (column 2) loses against fp (column 0) that NOVA-KV (column 1) recovers; nan where nothing is lost."""
    fp, nova, scalar = rows.mean(axis=0)
    return float((nova - scalar) / (fp - scalar)) if fp > scalar else float("nan")


def recovered_fraction(trials: pd.DataFrame, scalar: str) -> tuple[float, tuple[float, float]]:
    """NOVA-KV's recovered fraction at 2 bits over every trial, with a cluster bootstrap CI over prompts (a prompt's
    needles share its text): the estimate and (low, high), nan when some resample loses nothing."""
    cols = [_outcomes(trials, name, NOVA_BITS) for name in (FP, "nova", scalar)]
    table = pd.concat(cols, axis=1, join="inner").astype(float)
    prompts = [key[:3] for key in table.index]  # (task, length, prompt)
    units = [row[None, :] for row in table.to_numpy()]
    estimate = _recovered(table.to_numpy())
    if not np.isfinite(estimate) or len(set(prompts)) < 3:
        return estimate, (float("nan"), float("nan"))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = cluster_bootstrap_ci(units, _recovered, clusters=prompts, n_resamples=1999, method="percentile",
                                 seed=cell_seed(STUDY, "recovered", scalar))
    return estimate, tuple(r.confidence_interval)


def fp_claim(a: Analysis) -> Claim:
    acc = a.accuracy[a.accuracy["scheme"] == FP]
    parts = [f"{task}: " + ", ".join(f"{int(r['length'])} tokens {_acc(r)}" for _, r in g.iterrows())
             for task, g in acc.groupby("task", sort=False)]
    return Claim(
        id="retrieval-fp",
        claim="A retrieval task tests a quantizer only where the unquantized model succeeds",
        source="kvstats",
        measurement="SmolLM2-135M-Instruct fp32 accuracy (Wilson 95% CI): " + "; ".join(parts) + ".",
        data=_data(a),
        verdict=measured("the fp accuracies every scheme is compared with"),
        figure=f"{STUDY}_heatmap_n4.png" if 4 in a.cfg["bits"] else f"{STUDY}_heatmap_n{NOVA_BITS}.png")


def schemes_claim(a: Analysis) -> Claim:
    parts = []
    for task in a.pooled["task"].unique():
        cells = []
        for n in a.cfg["bits"]:
            for s in (*SCHEMES, BASELINE):
                row, t = _pooled_row(a, task, s, n), _test(a, task, "all", "vs fp", s, FP, n)
                if row is None or t is None:
                    continue
                cells.append(f"{s} n = {n} {100 * row['accuracy']:.0f}% [{100 * row['ci_low']:.0f}, "
                             f"{100 * row['ci_high']:.0f}] (Δ {100 * t['difference']:+.0f} pts, Holm "
                             f"{fmt_p(t['p_holm'])})")
        fp = _pooled_row(a, task, FP, FP_BITS)
        parts.append(f"{task} (fp {100 * fp['accuracy']:.0f}%, {fp['trials']} trials): " + "; ".join(cells))
    lost = a.tests[(a.tests["family"] == "vs fp") & (a.tests["length"] == "all")]
    worse = lost[(lost["p_holm"] < ALPHA) & (lost["difference"] < 0)]
    return Claim(
        id="retrieval-schemes",
        claim="Retrieval accuracy of every scheme at n = " + ", ".join(map(str, a.cfg["bits"]))
              + " against the fp model, on the same trials",
        source="kvstats",
        measurement="Accuracy pooled over lengths with Wilson 95% CIs and the paired difference to fp (exact "
                    "McNemar, Holm over the schemes and budgets of each task): " + " | ".join(parts)
                    + ". Per length: figures/data/retrieval_accuracy.csv and retrieval_tests.csv.",
        data=_data(a),
        verdict=measured(f"{len(worse)} of {len(lost)} (scheme, n, task) cells lose retrieval significantly"),
        figure=f"{STUDY}_accuracy_vs_kl.png")


def nova_claim(a: Analysis) -> Claim | None:
    """NOVA-KV against the best scalar method at 2 bits, pooled over every task and length (trials paired)."""
    trials = a.trials
    pooled = accuracy_table(trials, ["scheme", "n"]).set_index(["scheme", "n"])
    scalar = [s for s in SCALAR if (s, NOVA_BITS) in pooled.index]
    if ("nova", NOVA_BITS) not in pooled.index or not scalar:
        return None
    best = max(scalar, key=lambda s: pooled.loc[(s, NOVA_BITS), "accuracy"])
    t = _mcnemar_row(trials, "nova", best, NOVA_BITS)
    fp = pooled.loc[(FP, FP_BITS), "accuracy"]
    nova, base = pooled.loc[("nova", NOVA_BITS), "accuracy"], pooled.loc[(best, NOVA_BITS), "accuracy"]
    lost = fp - base
    recovered, ci = recovered_fraction(trials, best)
    better = direction([cell_direction(t["p"], t["difference"], expected_sign=+1, alpha=ALPHA)],
                       what="pooled comparisons")
    # "most": at least half of what the scalar method loses, the bound rule on the recovered fraction's CI
    v = better if not np.isfinite(ci).all() else combine([better, bound([recovered], [ci], 0.5, upper=False,
                                                                         what="recovered fractions")])
    return Claim(
        id="retrieval-nova-vs-scalar",
        claim="At 2 bits NOVA-KV recovers most of the retrieval accuracy scalar methods lose (RULER needle "
              "retrieval on Qwen3-8B at 128K: 75.4 vs 25.3 for the best scalar 2-bit method); measured small-scale",
        source="NOVA-KV, arXiv 2608.04074 (RULER and LongBench results); small-scale test by kvstats",
        measurement=(f"SmolLM2-135M, every task and length pooled ({t['trials']} trials): fp "
                     f"{100 * fp:.1f}%, NOVA-KV {100 * nova:.1f}%, best scalar method at n = 2 ({best}) "
                     f"{100 * base:.1f}%; NOVA-KV − {best} = {100 * t['difference']:+.1f} pts [95% CI "
                     f"{100 * t['diff_low']:+.1f}, {100 * t['diff_high']:+.1f}], exact McNemar {fmt_p(t['p'])} "
                     f"({t['a_only']} trials only NOVA-KV passes, {t['b_only']} only {best}); it recovers "
                     + (f"{100 * recovered:.0f}% [95% CI {100 * ci[0]:.0f}, {100 * ci[1]:.0f}; cluster bootstrap "
                        f"over prompts] of the {100 * lost:.1f} points the scalar method loses"
                        if np.isfinite(ci).all() else
                        f"{100 * recovered:.0f}% (no interval: some resamples lose nothing to recover)"
                        if np.isfinite(recovered) else "nothing measurable: the scalar method loses nothing")
                     + ". A 135M model at ≤ 8,192 tokens, not Qwen3-8B at 128K (nova-ruler-longbench)."),
        data=_data(a),
        verdict=v,
        figure=f"{STUDY}_heatmap_n{NOVA_BITS}.png")


def neutral_claim(a: Analysis) -> Claim | None:
    rows = equivalence_rows(a.trials, "kqv", 4)
    if not rows:
        return None
    v = equivalence([(r["diff_low"], r["diff_high"]) for r in rows], MARGIN, what="tasks")
    parts = [f"{r['task']} {100 * r['difference']:+.1f} pts [90% CI {100 * r['diff_low']:+.1f}, "
             f"{100 * r['diff_high']:+.1f}] ({r['trials']} trials)" for r in rows]
    return Claim(
        id="retrieval-kqv4-neutral",
        claim=f"KQV at 4 bits is retrieval-neutral: its accuracy is within δ = {MARGIN:g} of the fp model's",
        source="kvstats",
        measurement="KQV n = 4 − fp, paired per trial, Newcombe's interval at 90% (TOST at α = 0.05): "
                    + "; ".join(parts) + ".",
        data=_data(a),
        verdict=v)


def _data(a: Analysis) -> str:
    tasks = "; ".join(f"{task} at {', '.join(f'{length} ({prompts} prompts)' for length, prompts in c.items())}"
                      for task, c in a.cfg["tasks"].items())
    return (f"SmolLM2-135M-Instruct fp32, full-precision prefill then the questions through the cache: {tasks} "
            f"tokens; five needles per induction and lookup prompt ({a.scale} scale)")


def definitions(a: Analysis) -> dict[str, str]:
    return {
        "trial": "one needle: passes when the greedy prediction is every answer token (teacher-forced; argmax "
                 "right at every answer position = greedy generation returns the answer)",
        "protocol": "the context goes through the model once in full precision (sdpa); its K/V fill each cache "
                    "(kvstats.cache.KVStatsCache.prefill: codes for every token, no full-precision window; "
                    "transformers' QuantizedCache (quanto, q_group_size 64, residual_length 128): its first update); "
                    "the questions and answers then go through the cache in one forward (their own keys exact in "
                    "quanto's residual buffer, quantized in KVStatsCache)",
        "tasks": f"passkey (one needle, SmolLM2's chat format); induction (five lines of "
                 f"{INDUCTION_CUE + INDUCTION_ANSWER} random tokens of the text's vocabulary, cue "
                 f"{INDUCTION_CUE}, answer {INDUCTION_ANSWER}); lookup (a list of 'id dddd: ddddd' lines, five ids "
                 f"asked); needle depths {', '.join(f'{d:g}' for d in DEPTHS)}; haystack: the shipped documents "
                 "except the Declaration of Independence (NOVA-KV's calibration text), read cyclically from a "
                 "random start; every prompt its own spawned seed",
        "schemes": "as end_to_end (kv, kqv, qkqv with D'Alberto's Hadamard sketch, minmax KIVI-style, mse = "
                   "TurboQuant_mse on K and V, nova calibrated per layer on the Declaration); each prompt draws "
                   "fresh scheme seeds; transformers' QuantizedCache with the quanto backend at nbits 2 and 4 only "
                   "(its backend's choice)" + ("" if "hqq" in set(a.trials["scheme"]) else
                                               "; its hqq backend did not run (the hqq package was not installed)"),
        "tests": "Wilson 95% intervals (kvstats.stats.proportion_ci); exact McNemar on the same trials "
                 "(kvstats.stats.mcnemar) with the paired difference's Newcombe interval, Holm within each (task, "
                 "length, family); the five needles of a prompt share its text, so trials are not independent: "
                 "p-values describe these prompts",
        "attention KL": "KL(p_exact ‖ p_quantized) of the question and answer queries, mean over heads, queries "
                        "and layers (KVStatsCache's records: kvstats schemes only)",
    }


# ------------------------------------------------------------------------------------------------ figures


def heatmap(a: Analysis, n: int = NOVA_BITS) -> None:
    """Accuracy over length × depth: one row of panels per task, fp and the schemes at ``n``."""
    import matplotlib.pyplot as plt

    tasks = list(a.cfg["tasks"])
    cols = [(FP, FP_BITS)] + [(s, n) for s in ("kqv", "minmax", "mse", "nova", BASELINE)
                         if ((a.grid["scheme"] == s) & (a.grid["n"] == n)).any()]
    fig, axes = plots.panels(len(tasks), len(cols), f"Retrieval accuracy over context length × needle depth "
                             f"(SmolLM2-135M; quantized caches at n = {n})", width=2.1, height=1.9)
    for i, task in enumerate(tasks):
        lengths = sorted(a.cfg["tasks"][task])
        for j, (s, b) in enumerate(cols):
            ax = axes[i, j]
            g = a.grid[(a.grid["task"] == task) & (a.grid["scheme"] == s) & (a.grid["n"] == b)]
            m = g.pivot_table(index="length", columns="depth", values="accuracy").reindex(index=lengths,
                                                                                           columns=list(DEPTHS))
            im = ax.imshow(m.to_numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
            ax.set_xticks(range(len(DEPTHS)), [f"{d:g}" for d in DEPTHS], fontsize=6)
            ax.set_yticks(range(len(lengths)), [str(x) for x in lengths], fontsize=6)
            ax.grid(False)
            if i == 0:
                ax.set_title(style(s)["label"] if s in (FP, BASELINE) else s, fontsize=7)
            if j == 0:
                ax.set_ylabel(f"{task}\ntokens", fontsize=7)
            if i == len(tasks) - 1:
                ax.set_xlabel("needle depth", fontsize=7)
    fig.colorbar(im, ax=axes, shrink=0.6, label="accuracy")
    plots.save(fig, f"{STUDY}_heatmap_n{n}")
    plt.close(fig)


def accuracy_vs_kl(a: Analysis) -> None:
    """Pooled accuracy (Wilson interval) against the mean attention KL, one point per (scheme, n), per task."""
    tasks = list(a.cfg["tasks"])
    fig, axes = plots.panels(1, len(tasks), "Retrieval accuracy against attention KL (SmolLM2-135M)", width=3.4,
                             height=3.0)
    for ax, task in zip(axes[0], tasks):
        g = a.pooled[a.pooled["task"] == task]
        fp = g[g["scheme"] == FP].iloc[0]
        ax.axhspan(fp["ci_low"], fp["ci_high"], color="0.85", label="fp32 (95% CI)")
        for s in SCHEMES:
            r = g[g["scheme"] == s].sort_values("n")
            if r.empty:
                continue
            st = style(s)
            ax.errorbar(r["attn_kl"], r["accuracy"], yerr=[r["accuracy"] - r["ci_low"], r["ci_high"] - r["accuracy"]],
                        color=st["color"], marker=st["marker"], ls="-", lw=0.8, ms=4, capsize=2, label=s)
        ax.set_xscale("log")
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("mean attention KL (nats)")
        ax.set_title(task)
    axes[0, 0].set_ylabel("accuracy (Wilson 95% CI)")
    axes[0, -1].legend(fontsize=6, frameon=False, loc="lower left")
    plots.save(fig, f"{STUDY}_accuracy_vs_kl")


# ------------------------------------------------------------------------------------------------- study


class Retrieval(study.Study):
    """The study on the protocol (kvstats.study.protocol.Study): one cell per prompt."""

    name, version, position, description = STUDY, VERSION, POSITION, __doc__

    def cells(self, scale: str) -> study.Sweeps:
        cfg = SCALE[scale]
        nova = {"nova_bits": list(cfg["nova_bits"])} if "nova_bits" in cfg else {}
        cells = [{"task": task, "length": length, "prompt": i, "bits": list(cfg["bits"]),
                  "calibration_tokens": cfg["calibration_tokens"], **nova}
                 for task, lengths in cfg["tasks"].items() for length, prompts in lengths.items()
                 for i in range(prompts)]
        return {STUDY: (cell, sorted(cells, key=lambda c: -c["length"]))}  # the longest first: they bound the wall

    def analyse(self, tables, scale: str) -> Analysis:
        return analyse(tables[STUDY], scale)

    def figures(self, tables, a: Analysis) -> None:
        plots.write_csv(f"{STUDY}_trials", a.trials)
        plots.write_csv(f"{STUDY}_accuracy", a.accuracy)
        plots.write_csv(f"{STUDY}_depth", a.grid)
        plots.write_csv(f"{STUDY}_tests", a.tests)
        for n in sorted({NOVA_BITS, 4} & set(a.cfg["bits"])):
            heatmap(a, n)
        accuracy_vs_kl(a)

    def claims(self, a: Analysis) -> list[Claim]:
        return [c for c in (fp_claim(a), schemes_claim(a), nova_claim(a), neutral_claim(a)) if c is not None]

    def definitions(self, a: Analysis) -> dict[str, str]:
        return definitions(a)


def main(argv: list[str] | None = None) -> int:
    return Retrieval().main(argv)


if __name__ == "__main__":
    sys.exit(main())
