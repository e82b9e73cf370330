"""retrieval's cells: one prompt per cell (a context with needles, then the questions and answers), its exact
prefill once, the questions through the fp cache, every kvstats scheme's KVStatsCache and transformers' quantized
cache; the study's constants and its prompts. The model and the per-layer schemes are the library's
(:mod:`kvstats.evaluation.model_engine`, :mod:`kvstats.evaluation.layer_schemes`)."""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from kvstats._random import unit_seed
from kvstats.evaluation.layer_schemes import CALIBRATION_TITLE, layer_schemes
from kvstats.evaluation.model_engine import set_attention, shared_model
from kvstats.studies.formats import DEPLOYED
from kvstats.study.sweep import cell_seed

STUDY = "retrieval"
VERSION = "2"  # 2: NOVA-KV cells always on the kvstats path with their records (dc05222)
FORMATS_VERSION = "1"  # the formats sweep's (formats_cell)
#: kvstats schemes (kvstats.evaluation.layer_schemes: D'Alberto's three with his sketch, KIVI-style min-max,
#: TurboQuant_mse on K and V, NOVA-KV calibrated on the Declaration of Independence), then transformers' quantized
#: cache
SCHEMES = ("kv", "kqv", "qkqv", "minmax", "mse", "nova")
BASELINE = "quanto"  # transformers' QuantizedCache (optimum-quanto backend: nbits 2 or 4)
FP = "fp"
FP_BITS = 16  # the n recorded for the fp model's rows (its cache holds fp32 values; the column needs a number)
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
INDUCTION_CUE, INDUCTION_ANSWER = 6, 3
#: ``formats``: the deployed formats' (spec, n), on the same prompts in their own sweep (:func:`formats_cell`)
SCALE = {
    "quick": {"tasks": {"passkey": {256: 4}, "induction": {256: 2, 1024: 1}, "lookup": {256: 2}},
              "bits": (2, 4), "calibration_tokens": 1024, "nova_bits": (2,), "formats": (("nvfp4", 4),)},
    "paper": {"tasks": {"passkey": {256: 10, 512: 10, 1024: 10}, "induction": {256: 6, 1024: 6, 4096: 4, 8192: 3},
                        "lookup": {256: 6, 1024: 6, 2048: 6}},
              "bits": (2, 3, 4), "calibration_tokens": None, "formats": DEPLOYED},
}
#: The per-layer schemes' seeds are drawn as end_to_end draws its own (``cell_seed(SCHEME_SEEDS, name, n, seed)``,
#: then one per layer), so the two studies build the same NOVA-KV calibration and every stored cell stays valid.
SCHEME_SEEDS = "end_to_end"
#: The sketch of the QJL stages (D'Alberto's eq. 3, as in end_to_end) and SmolLM2-135M's head dimension.
ROWS, HEAD_DIM = "srht", 64


def _model():
    """The shared SmolLM2 (:func:`kvstats.evaluation.model_engine.shared_model`), transformers' deprecation notices
    silenced."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    return shared_model()


def _tokenizer():
    return _model()[1]


def _encode(text: str) -> list[int]:
    return _tokenizer()(text, add_special_tokens=False).input_ids


@functools.lru_cache(maxsize=1)
def filler_tokens() -> tuple[int, ...]:
    """The haystack: the shipped documents except the Declaration of Independence (NOVA-KV's calibration text),
    concatenated and tokenized (once per process)."""
    from kvstats.data.texts import documents

    return tuple(_encode("\n\n".join(text for title, text in documents().items() if title != CALIBRATION_TITLE)))


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


def _chunk_logits(model, ids: torch.Tensor, cache) -> torch.Tensor:
    from kvstats.hf.cache import cache_kwargs

    return model(ids, use_cache=True, **cache_kwargs(model, cache)).logits[0].float()


def cell_schemes(name: str, n: int, seed: int, layers: int, calibration_tokens: int | None):
    """One scheme per layer (:func:`kvstats.evaluation.layer_schemes.layer_schemes`), seeded from
    ``cell_seed(SCHEME_SEEDS, name, n, seed)``."""
    return layer_schemes(name, n, cell_seed(SCHEME_SEEDS, name, n, seed), layers, dim=HEAD_DIM, rows=ROWS,
                         calibration_tokens=calibration_tokens)


class _PromptRun:
    """One prompt's exact prefill (``past``, once) and the rows of what reads it: one row per (scheme, n, needle)."""

    def __init__(self, task: str, length: int, prompt: int):
        self.model = _model()[0]
        self.task, self.length, self.prompt = task, length, prompt
        self.p = build_prompt(task, length, prompt)
        self.chunk = torch.tensor([self.p.chunk])
        set_attention(self.model, "sdpa")
        self.past = self.model(torch.tensor([self.p.context]), use_cache=True,
                               logits_to_keep=1).past_key_values  # no [T, vocab] logits
        self.layers = len(self.past.layers)
        self.rows: list[dict] = []

    def add(self, scheme: str, n, outcome, attn_kl: float = float("nan"), bits_held: float = float("nan")) -> None:
        p = self.p
        self.rows.extend({"task": self.task, "length": self.length, "prompt": self.prompt, "needle": i,
                          "depth": p.depths[i], "scheme": scheme, "n": n, "success": bool(ok), "attn_kl": attn_kl,
                          "bits_per_element": bits_held, "context_tokens": len(p.context)}
                         for i, ok in enumerate(outcome))

    def kvstats(self, name: str, n, schemes) -> None:
        """The questions through a KVStatsCache of ``schemes`` (layer -> Scheme) holding the prefill as codes, on the
        kvstats attention the caller set (a scheme build that leaves another behind is refused: no records)."""
        from kvstats.hf.cache import KVStatsCache

        cache = KVStatsCache(schemes, record_attention=True)
        logits = _chunk_logits(self.model, self.chunk, cache.prefill(self.past))
        if len(cache.attention_records) != self.layers:  # every layer on the estimator path, each one record
            raise RuntimeError(f"retrieval cell {self.task}/{self.length}/{self.prompt}, {name} n = {n}: "
                               f"{len(cache.attention_records)} attention records for {self.layers} layers: the "
                               f"chunk did not run on the kvstats attention path")
        kl = float(np.mean([r.kl.mean().item() for r in cache.attention_records]))
        self.add(name, n, passed(logits, self.p), kl, cache.memory().bits_per_element)

    def baseline(self, n: int) -> None:
        """The questions through transformers' quantized cache (:data:`BASELINE`, nbits ``n``) of the prefill."""
        from kvstats.hf.baselines import quantized_prefill

        set_attention(self.model, "sdpa")
        q = quantized_prefill(self.model, self.past, BASELINE, nbits=n)
        self.add(BASELINE, n, passed(_chunk_logits(self.model, self.chunk, q), self.p))

    def exact(self) -> None:
        """The questions through the fp cache: last, as this forward extends ``past`` itself."""
        set_attention(self.model, "sdpa")
        self.add(FP, FP_BITS, passed(_chunk_logits(self.model, self.chunk, self.past), self.p))


def cell(task: str, length: int, prompt: int, bits: tuple, calibration_tokens: int | None,
         nova_bits: tuple | None = None) -> list[dict]:
    """One prompt: the exact prefill once, then the questions through the fp cache, every kvstats scheme at every n
    (NOVA-KV at ``nova_bits``, default every n: its calibration is the quick scale's largest cost) and
    transformers' quantized cache: one row per (scheme, n, needle), the fp rows first."""
    from kvstats.hf.baselines import available_backends

    with torch.inference_mode():
        run = _PromptRun(task, length, prompt)
        if BASELINE in available_backends():
            for n in (b for b in bits if b in (2, 4)):  # quanto's nbits
                run.baseline(n)
        set_attention(run.model, "kvstats")
        for name in SCHEMES:
            for n in (bits if name != "nova" or nova_bits is None else nova_bits):
                seed = cell_seed(STUDY, "scheme", task, length, prompt) if name != "nova" else 0
                run.kvstats(name, n, cell_schemes(name, n, seed, run.layers, calibration_tokens))
        quantized = len(run.rows)
        run.exact()
    return run.rows[quantized:] + run.rows[:quantized]


def formats_cell(task: str, length: int, prompt: int, formats: list) -> list[dict]:
    """The deployed formats on one prompt (``formats``: [spec, n] pairs, kvstats.studies.formats.DEPLOYED at paper
    scale): the exact prefill once, then the questions through a KVStatsCache of each (one scheme for every layer,
    as the schemes' cells; these formats are deterministic): one row per (format, n, needle), rows as :func:`cell`'s.
    The fp rows are :func:`cell`'s (the same prompt, the same exact forward)."""
    with torch.inference_mode():
        run = _PromptRun(task, length, prompt)
        set_attention(run.model, "kvstats")
        for spec, n in formats:
            run.kvstats(spec, n, cell_schemes(spec, n, cell_seed(STUDY, "format", task, length, prompt), run.layers,
                                              None))
    return run.rows
