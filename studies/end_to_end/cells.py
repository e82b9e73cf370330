"""end_to_end's cells: every segment teacher-forced through a KVStatsCache (:func:`cell`), the two attention paths
on captured Q/K/V (:func:`agreement_cell`), greedy generation (:func:`generation_cell`), transformers' quantized
caches (:func:`baseline_cell`); the study's constants, its units (round-robin segments of the held-out documents)
and its per-layer schemes. The model, the reference forward, the quantized forward and the calibration are the
library's (:mod:`kvstats.evaluation.model_engine`, :mod:`kvstats.evaluation.layer_schemes`)."""

from __future__ import annotations

import functools
import math
import time
import warnings

import numpy as np
import torch

from kvstats import study
from kvstats.evaluation.layer_schemes import layer_schemes
from kvstats.evaluation.model_engine import (
    quantized_logits,
    round_robin_segments,
    set_attention,
    shared_model,
    shared_reference,
)
from kvstats.hf.baselines import output_metrics
from kvstats.hf.models import SHIPPED_MODELS, SMOLLM2
from kvstats.measure.metrics import attention_kl_from_scores
from kvstats.studies.formats import DEPLOYED
from kvstats.study.models import available_models, file_suffix
from kvstats.study.sweep import cell_seed, grid

STUDY = "end_to_end"
#: the teacher-forced and paths sweeps' version: 5 since the output metrics come from
#: kvstats.hf.baselines.output_metrics
#: (fp64 log-softmax of both models' logits; before, the quantized model's log-probabilities were fp32)
VERSION = "5"
#: the generation sweep's version: 5 since one cell generates every prompt of a (scheme, n) in one batch
GENERATION_VERSION = "5"
#: D'Alberto's three schemes, then what deployments run: KIVI-style min-max, TurboQuant_mse on K and V (as vLLM's
#: TurboQuant cache), NOVA-KV (calibrated)
SCHEMES = ("kv", "kqv", "qkqv", "minmax", "mse", "nova")
DALBERTO = ("kv", "kqv", "qkqv")
#: the documents of the shipped text (title lines); NOVA-KV is calibrated on the first, the others are measured
DOCUMENTS = ("The Declaration of Independence", "The Preamble to the Constitution", "The Bill of Rights",
             "The Gettysburg Address", "Second Inaugural Address of Abraham Lincoln")
#: SmolLM2-135M's head dimension (every scheme is built for it)
HEAD_DIM = 64
SCALE = {
    "quick": {"segment_tokens": 64, "segments": 8, "budgets": (2, 4), "seeds": (0,), "windows": (0,),
              "window_budget": 4, "calibration_tokens": 1024, "nova_budgets": (2,), "qjl_budgets": (2,),
              "prompts": (0,), "formats": (("nvfp4", 4),),
              "gen_budgets": (2,), "prompt_len": 48, "new": 24, "agree_tokens": 64, "resamples": 999},
    "full": {"segment_tokens": 128, "segments": None, "budgets": (2, 3, 4, 5, 6), "seeds": (0,), "windows": (0, 16),
             "window_budget": 4, "calibration_tokens": None, "nova_budgets": (2, 3, 4, 5, 6), "qjl_budgets": (3,),
             "prompts": (0, 480, 960), "formats": DEPLOYED, "gen_budgets": (2, 4, 6), "prompt_len": 64, "new": 64,
             "agree_tokens": 256, "resamples": 4999},
}
#: The everyday paper tier: the teacher-forced cells every verdict rests on, on SmolLM2 — D'Alberto's three schemes,
#: min-max and TurboQuant_mse at every budget (QKQV against KQV at n = 2..6, the n = 4 ratio and neutrality), NOVA-KV
#: at 2 bits (its claim's budget), QJL's cache at 3 — without what only measured rows read, which stays the full
#: tier's: the greedy generation (a continuation one fp32 reordering sends down another path: no claim's evidence,
#: issue 50), transformers' baselines, the full-precision window, NOVA-KV at 3-6 bits and the deployed formats.
SCALE["paper"] = {**SCALE["full"], "gen_budgets": (), "baselines": False, "windows": (0,), "nova_budgets": (2,),
                  "formats": ()}
#: QJL's own cache (kvstats.scheme("qjl_cache"), arXiv 2406.03482 §4-5): keys m = n·d sign bits on orthogonalised rows
#: (the paper's practice) with the OUTLIERS channels of largest mean |k| per layer, found on the calibration
#: document (the paper finds them in the prompt), in their own sketch of ROWS_PER_OUTLIER rows each; values min-max
#: per token at n bits. Measured at QJL_BUDGETS against the same-budget schemes of the main sweep.
QJL_CACHE = {"outliers": 4, "rows_per_outlier": 8}
#: the QJL cache sweep's version (its own sweep, so the main cells stay cached)
QJL_VERSION = "1"
#: the deployed formats' sweep (``formats``: (spec, n) of kvstats.studies.formats.DEPLOYED at paper scale):
#: teacher-forced as every scheme (:func:`cell`, no window), measured beside the same-n schemes; its own version
FORMATS_VERSION = "1"
#: The second model's sweep (``end_to_end_gemma3``, kvstats.study.models.REAL_MODELS beyond SmolLM2): the same
#: teacher-forced cells on its own segments of the held-out documents — D'Alberto's three schemes, KIVI-style
#: min-max and TurboQuant_mse at every budget, NOVA-KV at MODEL_NOVA_BITS (its claim's budget; calibrated on the
#: model's own capture of the calibration document), QJL's cache at ``qjl_budgets`` (outlier channels found on the same
#: capture), the deployed formats (``formats``) and the lossless control; beside them the two paths on its captured
#: Q/K/V (``end_to_end_gemma3_paths``), and the full-precision windows at ``window_budget``; the generation is
#: SmolLM2's only
MODEL_SCHEMES = ("kv", "kqv", "qkqv", "minmax", "mse")
MODEL_NOVA_BITS = 2
#: the second model's sweep version
MODELS_VERSION = "1"
#: The sketch of every QJL stage (kqv's V, qkqv's K and V): D'Alberto's randomized Hadamard sketch, arXiv
#: 2605.08114 §2.2 eq. 3 (S = H·diag(s′), m = d = 64), the definition the D'Alberto claims below are held to.
QJL_ROWS = "srht"


def _quiet():
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers and its backends: deprecation notices


def documents(text: str | None = None) -> dict[str, str]:
    """The shipped text cut at the title lines of :data:`DOCUMENTS`: {title: document text, title included}."""
    from kvstats.data.texts import split_titled
    from kvstats.hf.capture import default_text

    return split_titled(default_text() if text is None else text, DOCUMENTS)


@functools.lru_cache(maxsize=4)
def _segments(size: int, count: int | None, model: str = SMOLLM2) -> tuple[torch.Tensor, tuple[tuple[str, int], ...]]:
    """Token ids [segments, size] of the held-out documents (all but the calibration one) in ``model``'s tokens, cut
    round-robin (:func:`kvstats.evaluation.model_engine.round_robin_segments`), and their origins."""
    _, tokenizer, _ = shared_model(model)
    docs = documents()
    ids = {t: tokenizer(docs[t], return_tensors="pt").input_ids[0] for t in DOCUMENTS[1:]}
    where = round_robin_segments({t: len(v) for t, v in ids.items()}, size, count)
    return torch.stack([ids[t][a:a + size] for t, a in where]), tuple(where)


def _reference(size: int, count: int | None, model: str = SMOLLM2) -> tuple[torch.Tensor, torch.Tensor]:
    """The segments (ids [B, T]) and the exact model's logits [B, T, V] over them in one batched forward
    (:func:`kvstats.evaluation.model_engine.shared_reference`: once per process, shared by every cell)."""
    ids, _ = _segments(size, count, model)
    return ids, shared_reference(ids.tolist(), model)


def cell_schemes(name: str, n: int, seed: int, layers: int, calibration_tokens: int | None = None,
                 model: str = SMOLLM2):
    """One scheme per layer of ``model`` (:func:`kvstats.evaluation.layer_schemes.layer_schemes` at its head dim,
    independent seeds spawned from the cell seed ``cell_seed(STUDY, name, n, seed)``, the model's name before the
    scheme's for a model other than SmolLM2): D'Alberto's sketch (QJL_ROWS), NOVA-KV and QJL's outlier channels
    calibrated on the model's calibration capture, ``identity`` the lossless control."""
    parts = (STUDY, name, n, seed) if model == SMOLLM2 else (STUDY, model, name, n, seed)
    return layer_schemes(name, n, cell_seed(*parts), layers, dim=SHIPPED_MODELS[model].head_dim, rows=QJL_ROWS,
                         calibration_tokens=calibration_tokens, outliers=QJL_CACHE["outliers"],
                         rows_per_outlier=QJL_CACHE["rows_per_outlier"], model=model)


def cell(scheme: str, n: int, seed: int, window: int, segment_tokens: int, segments: int | None,
         calibration_tokens: int | None, model: str = SMOLLM2) -> list[dict]:
    """Every segment through a KVStatsCache in one batched teacher-forced forward of ``model`` (a shipped model):
    per-token, per-layer and one summary row. The exact forward over the same segments is computed once per process
    and shared."""
    _quiet()
    ids, ref_logits = _reference(segment_tokens, segments, model)
    lm = shared_model(model)[0]
    t0 = time.perf_counter()
    schemes = cell_schemes(scheme, n, seed, lm.config.num_hidden_layers, calibration_tokens, model)  # NOVA: timed
    calibration_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    logits, cache = quantized_logits(lm, schemes, ids, full_precision_window=window)
    seconds = time.perf_counter() - t0
    damage = output_metrics(ref_logits, logits, ids)  # fp64: out_kl, top1 [B, T]; nll_ref, nll [B, T-1]
    out_kl, top1, nll_ref, nll = damage["out_kl"], damage["top1"], damage["nll_ref"], damage["nll"]
    records = sorted(cache.attention_records, key=lambda r: r.layer)
    attn_kl = torch.stack([r.kl for r in records])  # [L, B, Hq, T]
    top5 = torch.stack([r.recall for r in records])
    mem = cache.memory()
    rows = []
    tok_kl, tok_top5 = attn_kl.mean(dim=(0, 2)), top5.mean(dim=(0, 2))  # [B, T]
    b, t_len = ids.shape
    for u in range(b):
        for t in range(t_len):
            last = t == t_len - 1
            rows.append({"kind": "token", "segment": u, "t": t, "out_kl": float(out_kl[u, t]),
                         "top1": float(top1[u, t]), "nll_ref": None if last else float(nll_ref[u, t]),
                         "nll": None if last else float(nll[u, t]), "attn_kl": float(tok_kl[u, t]),
                         "top5": float(tok_top5[u, t])})
    lay_kl, lay_top5 = attn_kl.mean(dim=(1, 2, 3)), top5.mean(dim=(1, 2, 3))
    for i, r in enumerate(records):
        rows.append({"kind": "layer", "layer": r.layer, "attn_kl": float(lay_kl[i]), "top5": float(lay_top5[i])})
    rows.append({"kind": "cell", "seconds": seconds, "calibration_seconds": calibration_seconds,
                 "max_abs_dlogit": max(float((logits[u] - ref_logits[u]).abs().max()) for u in range(len(ids))),
                 "bits_per_element": mem.bits_per_element, "code_bytes": mem.code_bytes,
                 "window_bytes": mem.window_bytes, "fp16_bytes": mem.fp16_bytes, "segments": b,
                 "segment_tokens": t_len})
    return rows


def agreement_cell(scheme: str, n: int, tokens: int, model: str = SMOLLM2) -> list[dict]:
    """Per attention call, the same code read by the estimator (``scheme.scores``, what kvstats_attention calls)
    and by decode-then-dot (q·K̂ᵀ with K̂ = the decoded keys, what the model's sdpa sees), in float64, on every
    layer's captured post-RoPE Q/K/V of ``model`` (the shipped text, first ``tokens`` tokens) with the study's
    per-layer schemes: max |Δlogit| and the KL between the two causal attention rows, one row per layer.

    Every built-in estimator is linear in the code, so the two agree to float64 round-off. A whole-model
    comparison is not made: across 30 layers one rounding difference can flip a later layer's code and the two
    runs become two different quantized models, a chaotic quantity that moves with BLAS and thread count
    (docs/end_to_end.md)."""
    from kvstats.hf.capture import load_default_capture

    cap = load_default_capture(max(tokens, 1024), model=model, verbose=False)
    schemes = cell_schemes(scheme, n, 0, len(cap), model=model)
    rows = []
    for i in cap.layers:
        lay = cap.layer(i)
        q, k, v = (t[:, :, :tokens].double() for t in (lay.q, lay.k, lay.v))
        d, g = k.shape[-1], q.shape[1] // k.shape[1]
        s = schemes(i)
        code = s.encode(k, v)
        est = s.scores(q, code).double() / math.sqrt(d)
        k_hat, _ = s.decode(code)
        dense = q @ k_hat.double().repeat_interleave(g, dim=1).transpose(-1, -2) / math.sqrt(d)
        mask = torch.ones(tokens, tokens, dtype=torch.bool).tril()
        rows.append({"layer": i, "max_abs_diff": float((est - dense).abs().max()),
                     "logit_scale": float(dense.masked_select(mask).abs().max()),
                     "kl_paths": attention_kl_from_scores(est, dense, causal=True, double=True)})
    return rows


def _heldout_ids() -> torch.Tensor:
    """[1, tokens]: the held-out documents' tokens, concatenated (generation prompts are cut from them)."""
    _, tokenizer, _ = shared_model()
    docs = documents()
    return tokenizer("\n\n".join(docs[t] for t in DOCUMENTS[1:]), return_tensors="pt").input_ids


def _fp_nll(prompts: torch.Tensor, continuations: torch.Tensor, lengths: list[int] | None = None) -> list[float]:
    """Mean NLL (nats/token) the exact model assigns to each continuation [B, N] after its prompt [B, P], over its
    first ``lengths[i]`` tokens (default all N), in one batched forward (equally long rows: no padding inside;
    the causal model's logits at a token do not see the tokens after it)."""
    model, _, _ = shared_model()
    set_attention(model, "sdpa")
    full = torch.cat([prompts, continuations.to(prompts.dtype)], dim=1)
    p_len = prompts.shape[1]
    with torch.inference_mode():
        logp = torch.log_softmax(model(full).logits[:, p_len - 1:-1].double(), dim=-1)
    nll = -logp.gather(-1, full[:, p_len:, None])[..., 0]  # [B, N]
    lengths = [nll.shape[1]] * nll.shape[0] if lengths is None else lengths
    return [float(nll[i, :m].mean()) for i, m in enumerate(lengths)]


def _until_eos(tokens: list[int]) -> list[int]:
    """A generated row up to and including its first end-of-sequence token (what a single-prompt generate
    returns; a batched one pads the rows that finished early)."""
    model, _, _ = shared_model()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1]
    return tokens


def _prompts(offsets: tuple[int, ...], prompt_len: int) -> torch.Tensor:
    """[len(offsets), prompt_len]: the prompts cut from the held-out documents at ``offsets``."""
    ids = _heldout_ids()[0]
    return torch.stack([ids[o:o + prompt_len] for o in offsets])


def _greedy(prompts: torch.Tensor, new: int, **cache) -> torch.Tensor:
    """Greedy continuations [B, new] of equally long prompts [B, P], all rows in one ``model.generate``."""
    model, _, _ = shared_model()
    with torch.inference_mode():
        out = model.generate(prompts, max_new_tokens=new, do_sample=False,
                             attention_mask=torch.ones_like(prompts), **cache)
    return out[:, prompts.shape[1]:]


@functools.lru_cache(maxsize=4)
def _reference_generation(offsets: tuple[int, ...], prompt_len: int, new: int) -> tuple[list[list[int]], list[float]]:
    """The exact model's greedy continuation of each prompt (token lists), and its own NLL of each."""
    model, _, _ = shared_model()
    prompts = _prompts(offsets, prompt_len)
    set_attention(model, "sdpa")
    cont = _greedy(prompts, new)
    rows = [_until_eos(r) for r in cont.tolist()]
    return rows, _fp_nll(prompts, cont, [len(r) for r in rows])


def generation_cell(scheme: str, n: int, seed: int, window: int, offsets: list[int], prompt_len: int, new: int,
                    calibration_tokens: int | None) -> list[dict]:
    """Greedy continuations through a KVStatsCache vs the exact model's, one row per prompt of the held-out
    documents (``offsets``: where each prompt starts).

    All prompts go through one batched ``model.generate`` (the model's weights are read once per step for all of
    them: a single-prompt decode step is bound by reading the weights). Besides the tokens before the first
    divergence (coarse: one flip changes all that follows), the exact model scores the quantized model's
    continuation (mean NLL per token): how plausible the text is."""
    from kvstats.hf.cache import KVStatsCache, cache_kwargs

    _quiet()
    model, tokenizer, _ = shared_model()
    offsets = tuple(int(o) for o in offsets)
    ref, ref_nll = _reference_generation(offsets, prompt_len, new)
    prompts = _prompts(offsets, prompt_len)
    layers = cell_schemes(scheme, n, seed, model.config.num_hidden_layers, calibration_tokens)
    set_attention(model, "kvstats")
    cache = KVStatsCache(layers, full_precision_window=window)
    t0 = time.perf_counter()
    gen = _greedy(prompts, new, **cache_kwargs(model, cache))
    seconds = time.perf_counter() - t0
    cache.require_estimator_path(model)
    bits = cache.memory().bits_per_element
    conts = [_until_eos(r) for r in gen.tolist()]
    nll = _fp_nll(prompts, gen, [len(g) for g in conts])
    rows = []
    for i, offset in enumerate(offsets):
        g, r = conts[i], ref[i]
        same = [a == b for a, b in zip(g, r)]
        first = same.index(False) if False in same else len(same)
        rows.append({"offset": offset, "tokens_before_divergence": first, "agreement": float(np.mean(same)),
                     "new": len(g), "fp_nll": nll[i], "fp_nll_reference": ref_nll[i],
                     "seconds_per_token": seconds / max(1, gen.shape[1] * len(offsets)), "bits_per_element": bits,
                     "text": tokenizer.decode(g), "reference_text": tokenizer.decode(r)})
    return rows


def baseline_cell(backend: str, n: int, residual_length: int, segment_tokens: int, segments: int | None) -> list[dict]:
    """transformers' own quantized cache (quanto / HQQ, the optional [baselines] extra) over the same segments:
    token rows as cell() (no attention metrics), fed token by token (kvstats.hf.baselines)."""
    from kvstats.hf.baselines import baseline_rows

    _quiet()
    ids, ref_logits = _reference(segment_tokens, segments)
    model, _, _ = shared_model()
    set_attention(model, "sdpa")
    return baseline_rows(model, ids, ref_logits, backend, n, residual_length=residual_length)


def cell_grid(cfg: dict) -> list[dict]:
    """The teacher-forced cells: every scheme at every budget (W = 0), every scheme with each non-zero window at
    ``window_budget``, and the lossless control."""
    base = {"seed": list(cfg["seeds"]), "segment_tokens": cfg["segment_tokens"], "segments": cfg["segments"],
            "calibration_tokens": cfg["calibration_tokens"]}
    cells = [c for c in grid(scheme=list(SCHEMES), n=list(cfg["budgets"]), window=0, **base)
             if c["scheme"] != "nova" or c["n"] in cfg["nova_budgets"]]
    for wv in cfg["windows"]:
        if wv:
            cells += [c for c in grid(scheme=list(SCHEMES), n=cfg["window_budget"], window=wv, **base)
                      if c["scheme"] != "nova" or c["n"] in cfg["nova_budgets"]]
    cells += grid(scheme="identity", n=0, window=0, **{**base, "seed": 0})
    return cells


def model_cell_grid(cfg: dict, model: str) -> list[dict]:
    """A second model's teacher-forced cells: :data:`MODEL_SCHEMES` at every budget (W = 0) and with each non-zero
    window at ``window_budget``, NOVA-KV at :data:`MODEL_NOVA_BITS`, QJL's cache at ``qjl_budgets``, the deployed
    formats of ``formats`` at the first seed (as SmolLM2's formats sweep), the lossless control."""
    base = {"model": model, "seed": list(cfg["seeds"]), "window": 0, "segment_tokens": cfg["segment_tokens"],
            "segments": cfg["segments"], "calibration_tokens": cfg["calibration_tokens"]}
    return (grid(scheme=list(MODEL_SCHEMES), n=list(cfg["budgets"]), **base)
            + grid(scheme="nova", n=MODEL_NOVA_BITS, **base)
            + grid(scheme="qjl", n=list(cfg["qjl_budgets"]), **base)
            + [{"scheme": spec, "n": n, **base, "seed": cfg["seeds"][0]} for spec, n in cfg.get("formats", ())]
            + [c for wv in cfg["windows"] if wv
               for c in grid(scheme=list(MODEL_SCHEMES), n=cfg["window_budget"], **{**base, "window": wv})]
            + grid(scheme="identity", n=0, **{**base, "seed": 0}))


def sweeps(cfg: dict, scale: str | None = None) -> study.Sweeps:
    """The study's sweeps at one scale: the teacher-forced cells (:func:`cell_grid`), QJL's cache and the deployed
    formats (each its own sweep and version), the two paths, the generation (where the scale has ``gen_budgets``)
    and, when transformers' quantized caches are installed and the scale runs them, the baselines; the other models
    the scale runs (:data:`kvstats.study.models.SCALE_MODELS`) on their own segments."""
    from kvstats.hf.baselines import available_backends  # transformers' quantized caches, when installed

    out = {
        STUDY: (cell, cell_grid(cfg)),
        f"{STUDY}_qjl": (cell, grid(scheme="qjl", n=list(cfg["qjl_budgets"]), seed=list(cfg["seeds"]), window=0,
                                    segment_tokens=cfg["segment_tokens"], segments=cfg["segments"],
                                    calibration_tokens=cfg["calibration_tokens"])),
        f"{STUDY}_formats": (cell, [{"scheme": spec, "n": n, "seed": cfg["seeds"][0], "window": 0,
                                     "segment_tokens": cfg["segment_tokens"], "segments": cfg["segments"],
                                     "calibration_tokens": cfg["calibration_tokens"]}
                                    for spec, n in cfg.get("formats", ())]),
        f"{STUDY}_paths": (agreement_cell, grid(scheme=list(DALBERTO), n=4, tokens=cfg["agree_tokens"]))}
    if cfg["gen_budgets"]:
        out[f"{STUDY}_generation"] = (generation_cell, grid(
            scheme=list(SCHEMES), n=list(cfg["gen_budgets"]), seed=cfg["seeds"][0], window=0,
            offsets=[list(cfg["prompts"])], prompt_len=cfg["prompt_len"], new=cfg["new"],
            calibration_tokens=cfg["calibration_tokens"]))
    for model in available_models(scale=scale)[0]:
        if model != SMOLLM2:
            out[f"{STUDY}{file_suffix(model)}"] = (cell, model_cell_grid(cfg, model))
            out[f"{STUDY}{file_suffix(model)}_paths"] = (agreement_cell, grid(scheme=list(DALBERTO), n=4,
                                                                          tokens=cfg["agree_tokens"], model=model))
    backends = available_backends() if cfg.get("baselines", True) else []
    if backends:
        out[f"{STUDY}_baselines"] = (baseline_cell, grid(
            backend=backends, n=[2, 4], residual_length=[1, 16], segment_tokens=cfg["segment_tokens"],
            segments=cfg["segments"]))
    return out
