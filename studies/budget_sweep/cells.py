"""The study's declarations and its cells: SmolLM2's captures of the shipped documents and their disjoint windows,
a trial's data and exact references (cached per worker), the schemes, one trial's metrics, the cell and the grid."""

from __future__ import annotations

import functools
import hashlib
import math
import sys

import torch

from kvstats.measure import metrics
from kvstats.measure.error6d import ERROR6D_COMPONENTS, Error6DReference, error6d
from kvstats.quant import attention
from kvstats.quant.schemes import Scheme, scheme
from kvstats.study.sweep import cell_seed, grid

STUDY = "budget_sweep"
VERSION = "4"  # 4: srht sketch, sketch sensitivity cells, isotropic queries, disjoint real windows
#: the second model's sweep (budget_sweep_gemma3)
MODELS_VERSION = "1"
SCHEMES = ("kqv", "qkqv", "kv", "minmax")
QJL_SCHEMES = ("kqv", "qkqv")  # the schemes with a QJL stage (the sketch matters only for them)
BUDGETS = (2, 3, 4, 5, 6)
#: D'Alberto's sketch (arXiv 2605.08114 §2.2, eq. 3): S = H·diag(s′), m = d
SKETCH = "srht"
#: sensitivity: other sketches of the QJL stage, at these budgets only; "srht-original" is eq. 3's sketch applied to
#: the residual de-rotated to the data's coordinates (Πᵀ r) instead of in the rotated domain (D'Alberto §2.2)
SENSITIVITY_SKETCHES = ("gaussian", "orthogonal", "srht-original")
#: sketch label -> the scheme's sketch options
SKETCH_OPTIONS = {"srht": {"rows": "srht"}, "gaussian": {"rows": "gaussian"}, "orthogonal": {"rows": "orthogonal"},
                  "srht-original": {"rows": "srht", "sketch_domain": "original"}}
SENSITIVITY_BUDGETS = (4,)
NO_SKETCH = "none"  # the sketch column of kv and minmax (no QJL stage)
#: label -> (generator kind, its parameters)
SYNTHETIC = {
    "gaussian": ("gaussian", {}),
    "heavy_tail_df3": ("heavy_tail", {"df": 3.0}),
    "heavy_tail_df1.5": ("heavy_tail", {"df": 1.5}),
    "low_rank_r1": ("low_rank", {"rank": 1, "noise": 0.01}),
    "low_rank_r8": ("low_rank", {"rank": 8, "noise": 0.01}),
}
SYNTHETIC_HEADS = (2, 4)  # KV heads, query heads
#: the peaked query model: the generator's query parameters (kvstats.data.synthetic.generate)
PEAKED = {"peak": 8.0, "query_key_correlation": 0.7, "n_focus": 2}
#: query models of the synthetic data; real data use the model's own queries
QUERY_MODELS = ("peaked", "isotropic")
REAL_QUERIES = "model"
PRIMARY_QUERIES = "peaked"
#: the separate documents of kvstats/texts/public_domain.txt, by their title lines
DOCUMENT_TITLES = ("The Declaration of Independence", "The Preamble to the Constitution of the United States",
                   "The Bill of Rights", "The Gettysburg Address",
                   "Second Inaugural Address of Abraham Lincoln, March 4, 1865")
SCALE = {
    # quick: 20 trials (a paired test can reach p = 2/2^20 ≈ 1.9e-6, below Holm's 0.05/(~1400 tests)) of 128 tokens
    "quick": {"trials": 20, "seq": 128, "n_q": 16, "d": 128, "layers": (3, 20), "window": 128, "resamples": 999,
              "paired_resamples": 199},
    # paper: 40 synthetic trials, planned by power (issue 50; each decided cell's Wilcoxon p at 80 trials inverted to
    # the n that reaches 80% power at Holm's first step, 0.05/1530): the findings' decided cells need ≤ 40 (finding 2
    # and QJL-on-V up to 53-64), top-5's two weakest 97 and min-max's 119, which may turn undecided at 40; 40 trials
    # still reach p = 2/2^40 ≈ 1.8e-12. The real rows keep every window the text has (25: their plans ask 24-30).
    # 1999 bootstrap resamples for the BCa ratio intervals and the energy tests (9999 in the full tier): at 9999 the
    # ratio intervals were the analysis's largest cost (1.1 million ratios of medians, a third of its time)
    "paper": {"trials": 40, "seq": 512, "n_q": 64, "d": 128, "layers": (1, 5, 10, 15, 20, 25, 29),
              "window": 128, "resamples": 1999, "paired_resamples": 999},
    # full: the sizes before planning (80 trials), with the second model's rows
    "full": {"trials": 80, "seq": 512, "n_q": 64, "d": 128, "layers": (1, 5, 10, 15, 20, 25, 29),
             "window": 128, "resamples": 9999, "paired_resamples": 999},
}
REAL_D = 64
#: the real data sets: label in the table's ``data`` column -> the shipped model (kvstats.hf.models); a trial of one is
#: a disjoint window of one of its captured documents. "gemma3" runs in its own sweep (``budget_sweep_gemma3``), at
#: the primary sketch only, on GEMMA3_LAYERS (sliding-window layers and the global layers 5, 11, 17)
REAL_DATA = {"smollm2": "smollm2", "gemma3": "gemma3-270m"}
REAL_DIMS = {"smollm2": REAL_D, "gemma3": 256}
GEMMA3_LAYERS = {"quick": (3, 5), "paper": (1, 5, 8, 11, 14, 17), "full": (1, 5, 8, 11, 14, 17)}
ALPHA = 0.05
#: the six components of the 6D error (docs/metrics_error6d.md), columns of the trial table under these names
E6 = ERROR6D_COMPONENTS
#: the metrics of the paired comparison table
METRICS = ("attention_kl", "k_direction", "distance_6d", "top5", "output_error", "v_rel_mse")
#: finding (1)'s metrics: KL, geometric K error, 6D distance
FINDING1_METRICS = ("attention_kl", "k_direction", "distance_6d")
PAPER_RATIO = "2.25"  # as printed: KL(QKQV)/KL(KQV) at n = 4
PAPER_P = 1e-23
#: the paper's Mann–Whitney effect size as printed, and its trials per group (70 vs 70)
PAPER_R = "-0.983"
PAPER_N = 70
#: finding (3): the scheme with the better geometric K reconstruction at each budget
CROSSOVER = {2: "qkqv", 3: "qkqv", 4: "kqv", 5: "qkqv", 6: "kqv"}


def documents() -> list[tuple[str, str]]:
    """(title, text) of each document of the shipped text, split at the lines of DOCUMENT_TITLES."""
    from kvstats.hf.capture import default_text

    lines = default_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() in DOCUMENT_TITLES]
    if len(starts) != len(DOCUMENT_TITLES):
        raise ValueError(f"expected the {len(DOCUMENT_TITLES)} titles {DOCUMENT_TITLES} in the default text, "
                         f"found {len(starts)}")
    bounds = starts + [len(lines)]
    return [(lines[a].strip(), "\n".join(lines[a:b]).strip()) for a, b in zip(bounds, bounds[1:])]


def document_path(text: str, data: str = "smollm2"):
    from kvstats.hf.capture import cache_dir

    return cache_dir() / STUDY / f"{data}_{hashlib.sha256(text.encode('utf-8')).hexdigest()[:12]}.safetensors"


def capture_documents(verbose: bool = True, data: str = "smollm2") -> None:
    """Capture a real data set's model's Q/K/V over each document on its own (one forward pass each), cached; the
    model is loaded only when some document is not cached yet."""
    from kvstats.hf.capture import cached_capture_ok, capture_qkv, load_model

    missing = [(t, x) for t, x in documents() if not cached_capture_ok(document_path(x, data))]
    if not missing:
        return
    if verbose:
        print(f"capturing {data} Q/K/V over {len(missing)} documents ...", file=sys.stderr, flush=True)
    lm, tokenizer, name = load_model(REAL_DATA[data])
    for title, text in missing:
        path = document_path(text, data)
        path.parent.mkdir(parents=True, exist_ok=True)
        capture_qkv(lm, tokenizer, text, model_name=name, text_source=f"kvstats:public_domain.txt: {title}").save(path)


@functools.lru_cache(maxsize=16)
def _document(doc: int, data: str = "smollm2"):
    from kvstats.data.io import load_qkv

    return load_qkv(document_path(documents()[doc][1], data))


@functools.lru_cache(maxsize=16)
def _real(doc: int, layer: int, data: str = "smollm2"):
    f = _document(doc, data)
    return f.queries(layer).float(), f.keys(layer).float(), f.values(layer).float()


def document_tokens(data: str = "smollm2") -> list[int]:
    return [int(_document(i, data).metadata["n_tokens"]) for i in range(len(documents()))]  # the header only


def real_windows(window: int, data: str = "smollm2") -> list[tuple[int, int]]:
    """The trials of a real data set: (document, first token) of every disjoint window of ``window`` tokens,
    ⌊tokens/window⌋ per document, in order."""
    return [(doc, start) for doc, n in enumerate(document_tokens(data)) for start in range(0, n - window + 1, window)]


def window_count(cfg: dict, *, capture: bool = False, data: str = "smollm2") -> int:
    """The real trials of ``data`` at this scale: the disjoint windows of the documents (0 without real layers).
    With ``capture``, first capture the documents (cached): once in the main process, never in parallel workers."""
    if not cfg["layers"]:
        return 0
    if capture:
        capture_documents(data=data)
    return len(real_windows(cfg["window"], data))


#: trial_data's cache holds two data sets' trials (< 1 MB each at paper scale): a worker runs a data set's 24
#: cells one after another, and a cache smaller than one data set's trials (it was 48 < 80) evicts every trial
#: before its next use, so each cell regenerated all of them (30% of a paper cell)
TRIAL_CACHE = 192


@functools.lru_cache(maxsize=TRIAL_CACHE)
def trial_data(data: str, layer: int | None, d: int, seq: int, n_q: int, trial: int):
    """(queries by query model, K, V, causal) of one trial; the same for every scheme, sketch and budget."""
    if data in REAL_DATA:
        doc, start = real_windows(seq, data)[trial]
        q, k, v = _real(doc, layer, data)
        end = start + seq
        return ({REAL_QUERIES: q[:, :, end - n_q:end].contiguous()}, k[:, :, start:end].contiguous(),
                v[:, :, start:end].contiguous(), True)
    from kvstats.data.synthetic import generate

    kind, params = SYNTHETIC[data]
    kv_heads, q_heads = SYNTHETIC_HEADS
    seed = cell_seed(STUDY, "data", data, layer, d, seq, n_q, trial)
    q, k, v = generate(kind, 1, kv_heads, seq, d, seed, q_heads=q_heads, n_q=n_q, **(PEAKED | params))
    gen = torch.Generator().manual_seed(cell_seed(STUDY, "isotropic", data, d, n_q, trial))
    iso = torch.randn(1, q_heads, n_q, d, generator=gen, dtype=torch.float64).to(q.dtype)
    return {"peaked": q, "isotropic": iso}, k, v, False


@functools.lru_cache(maxsize=TRIAL_CACHE)
def trial_reference(data: str, layer: int | None, d: int, seq: int, n_q: int, trial: int,
                    model: str) -> metrics.AttentionReference:
    """The exact attention of one trial's query set (fp32 logits ``q kᵀ/√d``, causal as the data), with its top-5
    sets once computed: the same for every scheme, sketch and budget, so a worker's cells share it (one data set's
    query sets fit the cache: 2 × 80 synthetic, 0.65 MB each at paper scale)."""
    queries, k, _, causal = trial_data(data, layer, d, seq, n_q, trial)
    return metrics.AttentionReference(metrics.attention_scores(queries[model], k), causal=causal)


@functools.lru_cache(maxsize=TRIAL_CACHE)
def trial_error6d_reference(data: str, layer: int | None, d: int, seq: int, n_q: int, trial: int,
                            model: str) -> Error6DReference:
    """The fp64 exact side of one trial's 6D error for one query set (logits, ``log p``, output
    ``softmax(q kᵀ/√d) v``): the same for every scheme, sketch and budget, so a worker's cells share it
    (≈ 3.3 MB per query set at paper scale, ≈ 0.5 GB per worker for one data set's 160)."""
    queries, k, v, causal = trial_data(data, layer, d, seq, n_q, trial)
    return Error6DReference(queries[model], k, v, causal=causal)


def make_scheme(name: str, n: int, d: int, seed: int, sketch: str = SKETCH) -> Scheme:
    """The registered scheme (or format spec) ``kvstats.scheme(name, bits=n, dim=d, seed=seed,
    **SKETCH_OPTIONS[sketch])``;
    ``sketch`` sets every QJL stage (kqv's V, qkqv's K and V); "none" for kv and minmax, which have none. ``minmax``
    (KIVI-style): K per channel (groups of d tokens), V per token (groups of d coordinates), fp16 min and
    scale: 32/d side bits per element, as the fp32 norm of the other schemes."""
    return scheme(name, bits=n, dim=d, seed=seed, **({} if sketch == NO_SKETCH else SKETCH_OPTIONS[sketch]))


def trial_metrics(s: Scheme, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, *, code=None,
                  decoded=None, reference: metrics.AttentionReference | None = None,
                  exact: Error6DReference | None = None) -> dict:
    """One trial's numbers for one query set through the public API: the scheme's scores, kvstats.metrics and
    the 6D error (components 4–5 from the scheme's own estimated logits, the attention it computes).
    ``code``/``decoded``: ``s.encode(k, v)`` and ``s.decode(code)`` when already computed (shared by the
    query models of a trial); ``reference``: ``AttentionReference(attention_scores(q, k), causal=causal)`` when
    already computed (:func:`trial_reference`, shared by the schemes); ``exact``: ``Error6DReference(q, k, v,
    causal=causal)`` likewise (:func:`trial_error6d_reference`): the same numbers."""
    code = s.encode(k, v) if code is None else code
    k_hat, v_hat = s.decode(code) if decoded is None else decoded
    if reference is None:
        reference = metrics.AttentionReference(metrics.attention_scores(q, k), causal=causal)
    est = s.scores(q, code) / math.sqrt(k.shape[-1])
    row = dict(zip(ERROR6D_COMPONENTS, error6d(q, k, v, k_hat, v_hat, scores_hat=est, causal=causal,
                                                        reference=exact)[0].tolist()))
    err = (est - reference.logits).double()
    if causal:  # only the logits a query can see
        err = err[..., attention.causal_visible(err.shape[-2], err.shape[-1])]
    return row | {
        "top5": reference.topk_recall(est, top_k=5),
        "k_rel_mse": metrics.mse(k, k_hat, relative=True),
        "v_rel_mse": metrics.mse(v, v_hat, relative=True),
        "logit_var": float(err.pow(2).mean()),
    }


def cell(data: str, layer: int | None, scheme_name: str, sketch: str, n: int, d: int, seq: int, n_q: int,
         trials: int) -> list[dict]:
    """One (data, scheme, sketch, n): one row per trial and query model."""
    rows = []
    for t in range(trials):
        queries, k, v, causal = trial_data(data, layer, d, seq, n_q, t)
        s = make_scheme(scheme_name, n, k.shape[-1], cell_seed(STUDY, "quant", scheme_name, n, t), sketch)
        code = s.encode(k, v)
        decoded = s.decode(code)
        side = {  # side data shared across tokens (min-max K groups) amortised over the trial's tokens
            "bits_k": s.k.bits_per_coordinate(n_tokens=k.shape[2]).total,
            "bits_v": s.v.bits_per_coordinate(n_tokens=k.shape[2]).total,
            "seq_len": int(k.shape[2]),
        }
        for model, q in queries.items():
            ref = trial_reference(data, layer, d, seq, n_q, t, model)
            exact = trial_error6d_reference(data, layer, d, seq, n_q, t, model)
            rows.append({"trial": t, "queries": model, **trial_metrics(
                s, q, k, v, causal, code=code, decoded=decoded, reference=ref, exact=exact), **side})
    return rows


def formats_cells(scale: str, n_windows: int) -> list[dict]:
    """The deployed formats (kvstats.studies.formats.DEPLOYED: spec, n) on the real windows, as the real rows of the
    primary grid (same layers, windows, queries; a fresh scheme seed per trial, unused by these deterministic
    formats): their own sweep, so the primary grid's tables and its 6D scales stay D'Alberto's schemes alone."""
    from kvstats.studies.formats import DEPLOYED

    cfg = SCALE[scale]
    if not n_windows:
        return []
    return [{"data": "smollm2", "layer": layer, "scheme_name": spec, "sketch": NO_SKETCH, "n": n, "d": REAL_D,
             "seq": cfg["window"], "n_q": cfg["n_q"] // 2, "trials": n_windows}
            for spec, n in cfg.get("formats", DEPLOYED) for layer in cfg["layers"]]


def model_cells(scale: str, data: str, n_windows: int) -> list[dict]:
    """A second real data set's cells (``budget_sweep_gemma3``): the primary grid (every scheme and budget, QJL
    schemes with the srht sketch) and the sensitivity grid (QJL schemes with the other sketches at
    :data:`SENSITIVITY_BUDGETS`) on its layers, windows and own queries, as SmolLM2's real rows."""
    cfg = SCALE[scale]
    if not n_windows:
        return []
    base = {"data": data, "layer": list(GEMMA3_LAYERS[scale]), "d": REAL_DIMS[data], "seq": cfg["window"],
            "n_q": cfg["n_q"] // 2, "trials": n_windows}
    return (grid(**base, scheme_name=list(QJL_SCHEMES), sketch=SKETCH, n=list(BUDGETS))
            + grid(**base, scheme_name=[s for s in SCHEMES if s not in QJL_SCHEMES], sketch=NO_SKETCH,
                   n=list(BUDGETS))
            + grid(**base, scheme_name=list(QJL_SCHEMES), sketch=list(SENSITIVITY_SKETCHES),
                   n=list(SENSITIVITY_BUDGETS)))


def sweep_cells(scale: str, n_windows: int) -> list[dict]:
    """The primary grid (every scheme and budget; QJL schemes with the srht sketch) and the sensitivity grid
    (QJL schemes with the other sketches at SENSITIVITY_BUDGETS), for synthetic and real data."""
    cfg = SCALE[scale]

    def both(data, layer, d, seq, n_q, trials):
        base = {"data": data, "layer": layer, "d": d, "seq": seq, "n_q": n_q, "trials": trials}
        return (grid(**base, scheme_name=list(QJL_SCHEMES), sketch=SKETCH, n=list(BUDGETS))
                + grid(**base, scheme_name=[s for s in SCHEMES if s not in QJL_SCHEMES], sketch=NO_SKETCH,
                       n=list(BUDGETS))
                + grid(**base, scheme_name=list(QJL_SCHEMES), sketch=list(SENSITIVITY_SKETCHES),
                       n=list(SENSITIVITY_BUDGETS)))

    out = []
    for data in SYNTHETIC:
        out += both([data], [None], cfg["d"], cfg["seq"], cfg["n_q"], cfg["trials"])
    # real: 9 query heads (vs 4 synthetic), so half the queries per head keeps the cost per trial alike
    if n_windows:
        out += both(["smollm2"], list(cfg["layers"]), REAL_D, cfg["window"], cfg["n_q"] // 2, n_windows)
    return out
