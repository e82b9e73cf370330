"""retrieval's cells: one prompt per cell (a context with needles, then the questions and answers), its exact
prefill once, the questions through the fp cache, every kvstats scheme's KVStatsCache and transformers' quantized
cache; the study's constants. The prompts, the prefill and the pass rule are ``kvstats retrieval``'s
(:mod:`kvstats.evaluation.retrieval_tasks`, :mod:`kvstats.evaluation.retrieval`), the model and the per-layer
schemes the model engine's (:mod:`kvstats.evaluation.model_engine`, :mod:`kvstats.evaluation.layer_schemes`)."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import torch

from kvstats._random import unit_seed
from kvstats.evaluation.layer_schemes import layer_schemes
from kvstats.evaluation.model_engine import set_attention, shared_model
from kvstats.evaluation.retrieval import PromptRun
from kvstats.evaluation.retrieval_tasks import DEPTHS, Prompt, RetrievalTasks, passed
from kvstats.hf.models import SHIPPED_MODELS, SMOLLM2
from kvstats.measure.stats import paired_equivalence_trials
from kvstats.studies.formats import DEPLOYED
from kvstats.study.sweep import cell_seed

STUDY = "retrieval"
VERSION = "2"  # 2: NOVA-KV cells always on the kvstats path with their records (dc05222)
FORMATS_VERSION = "1"  # the formats sweep's (formats_cell)
#: A second model's sweeps (``retrieval_gemma3`` and ``retrieval_gemma3_formats``, kvstats.study.models.REAL_MODELS
#: beyond SmolLM2): the same prompts' recipe in its own tokens, every scheme and format, and the ``long`` lengths its
#: context holds (:func:`model_tasks`); their version
MODELS_VERSION = "1"
#: kvstats schemes (kvstats.evaluation.layer_schemes: D'Alberto's three with his sketch, KIVI-style min-max,
#: TurboQuant_mse on K and V, NOVA-KV calibrated on the Declaration of Independence), then transformers' quantized
#: cache
SCHEMES = ("kv", "kqv", "qkqv", "minmax", "mse", "nova")
BASELINE = "quanto"  # transformers' QuantizedCache (optimum-quanto backend: nbits 2 or 4)
FP = "fp"
FP_BITS = 16  # the n recorded for the fp model's rows (its cache holds fp32 values; the column needs a number)
#: δ of the "within δ" claim (retrieval-kqv4-neutral): five percentage points of accuracy, TOST at α = ALPHA
MARGIN, ALPHA = 0.05, 0.05
#: Paper scale's pass-key prompts per length, planned: one needle per prompt, and the fewest paired trials at which a
#: method agreeing with the fp model on every trial can be decided equivalent within ±MARGIN is 52
#: (kvstats.stats.paired_equivalence_trials; 30 trials give ±8.3 points) — 18 prompts at each of the 3 lengths.
#: Induction and lookup hold five needles per prompt and clear it already (95 and 90 trials).
EQUIVALENCE_TRIALS = paired_equivalence_trials(MARGIN, confidence_level=1 - 2 * ALPHA)
PASSKEY_LENGTHS = (256, 512, 1024)
PASSKEY_PROMPTS = -(-EQUIVALENCE_TRIALS // len(PASSKEY_LENGTHS))
#: ``formats``: the deployed formats' (spec, n), on the same prompts in their own sweep (:func:`formats_cell`);
#: ``long``: lengths past SmolLM2's 8,192-token context, run on a model whose context holds them (:func:`model_tasks`:
#: Gemma 3 270M's is 32,768)
SCALE = {
    "quick": {"tasks": {"passkey": {256: 4}, "induction": {256: 2, 1024: 1}, "lookup": {256: 2}},
              "bits": (2, 4), "calibration_tokens": 1024, "nova_bits": (2,), "formats": (("nvfp4", 4),)},
    # the everyday tier: what the two verdicts read (``runs``: NOVA-KV against every scalar method at 2 bits, KQV at
    # 4 bits within ±5 points of fp) on contexts up to 1,024 tokens: the pass key's planned 54 trials, induction's and
    # lookup's 60 (the full tier's rows ask ≥ 52 of lookup to exclude KQV-4's -21 points, 152 of induction for its
    # -14.7: lookup decides that verdict; NOVA-KV's McNemar asks 76 of the pooled 174; issue 50's audit)
    "paper": {"tasks": {"passkey": dict.fromkeys(PASSKEY_LENGTHS, PASSKEY_PROMPTS),
                        "induction": {256: 6, 1024: 6}, "lookup": {256: 6, 1024: 6}},
              "bits": (2, 4), "calibration_tokens": None, "formats": (),
              "runs": (("minmax", 2), ("kv", 2), ("mse", 2), ("nova", 2), (BASELINE, 2), ("kqv", 4))},
    # every budget, the deployed formats, induction at 4,096 and 8,192 tokens (16,384 on a model whose context holds
    # them) and the second model
    "full": {"tasks": {"passkey": dict.fromkeys(PASSKEY_LENGTHS, PASSKEY_PROMPTS),
                       "induction": {256: 6, 1024: 6, 4096: 4, 8192: 3}, "lookup": {256: 6, 1024: 6, 2048: 6}},
             "bits": (2, 3, 4), "calibration_tokens": None, "formats": DEPLOYED, "long": {"induction": {16384: 2}}},
}
#: The per-layer schemes' seeds are drawn as end_to_end draws its own (``cell_seed(SCHEME_SEEDS, name, n, seed)``,
#: then one per layer), so the two studies build the same NOVA-KV calibration and every stored cell stays valid.
SCHEME_SEEDS = "end_to_end"
#: The sketch of the QJL stages (D'Alberto's eq. 3, as in end_to_end).
ROWS = "srht"


def model_tasks(cfg: dict, model: str = SMOLLM2) -> dict[str, dict[int, int]]:
    """``{task: {length: prompts}}`` of a scale on ``model``: the scale's ``tasks``, and its ``long`` lengths below
    the model's context (:data:`kvstats.hf.models.SHIPPED_MODELS`; none on SmolLM2's 8,192 tokens)."""
    tasks = {task: dict(lengths) for task, lengths in cfg["tasks"].items()}
    for task, lengths in cfg.get("long", {}).items():
        for length, prompts in lengths.items():
            if length < SHIPPED_MODELS[model].context:
                tasks.setdefault(task, {})[length] = prompts
    return tasks


def _model(model: str = SMOLLM2):
    """The shared ``model`` (:func:`kvstats.evaluation.model_engine.shared_model`), transformers' deprecation notices
    silenced."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    return shared_model(model)


@functools.lru_cache(maxsize=2)
def _tasks(model: str = SMOLLM2) -> RetrievalTasks:
    """The library's prompts (:class:`kvstats.evaluation.retrieval_tasks.RetrievalTasks`) for ``model``'s tokenizer
    and the default haystack (the shipped documents but NOVA-KV's calibration text), built once per process."""
    return RetrievalTasks(_model(model)[1])


def build_prompt(task: str, length: int, prompt: int, model: str = SMOLLM2) -> Prompt:
    """The prompt ``prompt`` of a (task, length) cell in ``model``'s tokens: its own spawned seed
    (kvstats._random.unit_seed; the same draw for every model); the passkey at depth ``DEPTHS[prompt % 5]``."""
    rng = np.random.default_rng(unit_seed(cell_seed(STUDY, task, length), prompt))
    return _tasks(model).build(task, length, rng, depth=DEPTHS[prompt % len(DEPTHS)])


def cell_schemes(name: str, n: int, seed: int, layers: int, calibration_tokens: int | None, model: str = SMOLLM2):
    """One scheme per layer of ``model`` (:func:`kvstats.evaluation.layer_schemes.layer_schemes` at its head dim,
    NOVA-KV calibrated on its own capture of the calibration document), seeded from ``cell_seed(SCHEME_SEEDS, name,
    n, seed)`` — the model's name before the scheme's for a model other than SmolLM2, as end_to_end seeds its own."""
    parts = (SCHEME_SEEDS, name, n, seed) if model == SMOLLM2 else (SCHEME_SEEDS, model, name, n, seed)
    return layer_schemes(name, n, cell_seed(*parts), layers, dim=SHIPPED_MODELS[model].head_dim, rows=ROWS,
                         calibration_tokens=calibration_tokens, model=model)


def baseline_refusal(model) -> str | None:
    """Why transformers' quantized cache (:data:`BASELINE`) cannot hold ``model``'s cache — its own ValueError, e.g.
    for a model with sliding-window layers (Gemma 3) — or None when it can."""
    from kvstats.hf.baselines import quantized_cache

    try:
        quantized_cache(model, BASELINE, nbits=2)
    except ValueError as e:
        return str(e)
    return None


class _PromptRun:
    """One prompt's exact prefill (:class:`kvstats.evaluation.retrieval.PromptRun`, sdpa) and the rows of what reads
    it: one row per (scheme, n, needle)."""

    def __init__(self, task: str, length: int, prompt: int, model: str = SMOLLM2):
        self.model = _model(model)[0]
        self.task, self.length, self.prompt, self.model_name = task, length, prompt, model
        self.p = build_prompt(task, length, prompt, model)
        self.run = PromptRun(self.model, self.p, attention="sdpa")
        self.layers = len(self.run.past.layers)
        self.rows: list[dict] = []

    def add(self, scheme: str, n, outcome, attn_kl: float = float("nan"), bits_held: float = float("nan"),
            **extra) -> None:
        p = self.p
        self.rows.extend({"task": self.task, "length": self.length, "prompt": self.prompt, "needle": i,
                          "depth": p.depths[i], "scheme": scheme, "n": n, "success": bool(ok), "attn_kl": attn_kl,
                          "bits_per_element": bits_held, "context_tokens": len(p.context), **extra}
                         for i, ok in enumerate(outcome))

    def schemes(self, name: str, n: int, seed: int, calibration_tokens: int | None):
        return cell_schemes(name, n, seed, self.layers, calibration_tokens, self.model_name)

    def kvstats(self, name: str, n, schemes) -> None:
        """The questions through a KVStatsCache of ``schemes`` (layer -> Scheme) holding the prefill as codes, on the
        estimator path (verified by the library's run)."""
        r = self.run.quantized(schemes)
        self.add(name, n, r["success"], r["attn_kl"], r["bits_per_element"])

    def baseline(self, n: int) -> None:
        """The questions through transformers' quantized cache (:data:`BASELINE`, nbits ``n``) of the prefill."""
        from kvstats.hf.baselines import quantized_prefill
        from kvstats.hf.cache import cache_kwargs

        set_attention(self.model, "sdpa")
        q = quantized_prefill(self.model, self.run.past, BASELINE, nbits=n)
        logits = self.model(self.run.chunk, use_cache=True, **cache_kwargs(self.model, q)).logits[0].float()
        self.add(BASELINE, n, passed(logits, self.p))

    def exact(self, **extra) -> None:
        """The questions through the fp cache: last, as this forward extends the prefill itself."""
        self.add(FP, FP_BITS, self.run.exact()["success"], **extra)


def cell(task: str, length: int, prompt: int, bits: tuple, calibration_tokens: int | None,
         nova_bits: tuple | None = None, model: str = SMOLLM2, runs: list | None = None) -> list[dict]:
    """One prompt in ``model``'s tokens: the exact prefill once, then the questions through the fp cache, every
    kvstats scheme at every n (NOVA-KV at ``nova_bits``, default every n: its calibration is the quick scale's
    largest cost) and transformers' quantized cache — or only the (scheme, n) pairs of ``runs`` — : one row per
    (scheme, n, needle), the fp rows first. A model whose cache transformers' quantized cache refuses
    (:func:`baseline_refusal`) has no baseline rows; its fp rows say why in ``baseline_refused``."""
    from kvstats.hf.baselines import available_backends

    if runs is None:
        runs = [(BASELINE, n) for n in bits if n in (2, 4)]  # quanto's nbits
        runs += [(name, n) for name in SCHEMES for n in (bits if name != "nova" or nova_bits is None else nova_bits)]
    unknown = sorted({str(name) for name, _ in runs} - {*SCHEMES, BASELINE})
    if unknown:
        raise ValueError(f"runs names unknown schemes {unknown}; known: {[*SCHEMES, BASELINE]}")
    with torch.inference_mode():
        run = _PromptRun(task, length, prompt, model)
        refused = {}
        if any(name == BASELINE for name, _ in runs) and BASELINE in available_backends():
            why = baseline_refusal(run.model)
            if why is None:
                for _, n in (r for r in runs if r[0] == BASELINE):
                    run.baseline(n)
            else:
                refused = {"baseline_refused": why}
        for name, n in runs:
            if name != BASELINE:
                seed = cell_seed(STUDY, "scheme", task, length, prompt) if name != "nova" else 0
                run.kvstats(name, n, run.schemes(name, n, seed, calibration_tokens))
        quantized = len(run.rows)
        run.exact(**refused)
    return run.rows[quantized:] + run.rows[:quantized]


def formats_cell(task: str, length: int, prompt: int, formats: list, model: str = SMOLLM2) -> list[dict]:
    """The deployed formats on one prompt (``formats``: [spec, n] pairs, kvstats.studies.formats.DEPLOYED at paper
    scale): the exact prefill once, then the questions through a KVStatsCache of each (one scheme for every layer,
    as the schemes' cells; these formats are deterministic): one row per (format, n, needle), rows as :func:`cell`'s.
    The fp rows are :func:`cell`'s (the same prompt, the same exact forward)."""
    with torch.inference_mode():
        run = _PromptRun(task, length, prompt, model)
        for spec, n in formats:
            run.kvstats(spec, n, run.schemes(spec, n, cell_seed(STUDY, "format", task, length, prompt), None))
    return run.rows
