"""The retrieval tasks' prompts, for any tokenizer: a context with needles, then a chunk of questions and answers.

    tasks = RetrievalTasks(tokenizer)                        # the haystack: the shipped documents
    p = tasks.build("induction", 1024, np.random.default_rng(0))
    ok = passed(logits_of_the_chunk, p)                      # per needle: every answer token is the argmax

A trial is one needle (docs/retrieval.md):

* ``passkey``: "The pass key is 48213. Remember it. 48213 is the pass key." hidden in text at one depth, then
  "What is the pass key?" — in the tokenizer's chat format when it has one (the user turn holds the text and the
  question, the assistant turn starts "The pass key is "), else as plain text; one needle per prompt.
* ``induction``: five spans of 12 random tokens of the haystack's vocabulary, each on its own line, at depths
  10%, 30%, 50%, 70%, 90%; the question repeats the first 6 tokens of each span on a new line, the answer is the
  next 3 (copying a span seen once: induction heads).
* ``lookup``: lines "id 0417: 58213" filling the context; the question asks the ids nearest the five depths.

Teacher forcing gives exactly the logits of greedy decoding as long as the prediction is right, so "every answer
token is the argmax" = "greedy generation returns the answer".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["DEPTHS", "INDUCTION_ANSWER", "INDUCTION_CUE", "TASKS", "Prompt", "RetrievalTasks", "passed"]

TASKS = ("passkey", "induction", "lookup")
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
INDUCTION_CUE, INDUCTION_ANSWER = 6, 3
_INTRO = "There is a pass key hidden in the following text. Find it and remember it.\n\n"
_QUESTION = "\n\nWhat is the pass key?"
_ANSWER_LEAD = "The pass key is "
_SENTINEL = "\x00KVSTATS-HAYSTACK\x00"


@dataclass(frozen=True)
class Prompt:
    """One prompt: the context (ids), the question chunk (ids: questions and answers, teacher-forced) and per needle
    its depth and where its answer sits in the chunk (``answers[i] = (offset, answer ids)``: the logits at
    ``offset - 1 + j`` predict answer token j)."""

    context: list[int]
    chunk: list[int]
    depths: tuple[float, ...]
    answers: tuple[tuple[int, tuple[int, ...]], ...]


def passed(logits: torch.Tensor, p: Prompt) -> list[bool]:
    """Per needle: the greedy prediction (argmax of ``logits`` [chunk, V]) is every answer token."""
    pred = logits.argmax(-1)
    return [all(int(pred[offset - 1 + j]) == a for j, a in enumerate(answer)) for offset, answer in p.answers]


class RetrievalTasks:
    """The prompts of the three tasks for one tokenizer and one haystack (``documents``, ``{title: text}``: the
    shipped documents except the Declaration of Independence, NOVA-KV's calibration text, by default)."""

    def __init__(self, tokenizer, documents: dict[str, str] | None = None):
        from kvstats.data.texts import documents as shipped
        from kvstats.evaluation.layer_schemes import CALIBRATION_TITLE

        self.tokenizer = tokenizer
        texts = {t: x for t, x in shipped().items() if t != CALIBRATION_TITLE} if documents is None else documents
        if not texts:
            raise ValueError("documents is empty: the haystack needs text")
        self.filler = tuple(self.encode("\n\n".join(texts.values())))
        if len(self.filler) < 64:
            raise ValueError(f"documents hold {len(self.filler)} tokens: the haystack needs at least 64")
        self.vocabulary = tuple(sorted(set(self.filler)))  # what induction needles are drawn from
        # the special tokens the tokenizer puts before any text (a BOS: Llama, Gemma; none: SmolLM2)
        self.prefix = [int(t) for t in tokenizer("", add_special_tokens=True).input_ids]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def split(self, question: str, answer: str) -> tuple[list[int], tuple[int, ...]]:
        """Token ids of a question and of its answer, split where the text of both tokenizes: a tokenizer that
        writes " 48213" as a lone space and the digits puts the space in the question (a model's first guess after
        "is" is a word, not a bare space); ValueError if the parts do not tokenize as the whole."""
        q, a, whole = self.encode(question.rstrip(" ")), self.encode(answer), self.encode(question + answer)
        if question.endswith(" "):
            q = whole[:len(whole) - len(a)]
        if q + a != whole:
            raise ValueError(f"question {question!r} and answer {answer!r} do not tokenize as their concatenation")
        return q, tuple(a)

    def haystack(self, length: int, rng: np.random.Generator) -> list[int]:
        """``length`` consecutive filler tokens from a random start (the filler read cyclically)."""
        filler = self.filler
        start = int(rng.integers(0, len(filler)))
        return [filler[(start + i) % len(filler)] for i in range(length)]

    def _with_prefix(self, p: Prompt) -> Prompt:
        if not self.prefix or p.context[:len(self.prefix)] == self.prefix:
            return p
        return Prompt(self.prefix + p.context, p.chunk, p.depths, p.answers)

    def build(self, task: str, length: int, rng: np.random.Generator, *, depth: float | None = None) -> Prompt:
        """The prompt of ``task`` with a context of about ``length`` tokens, its random parts drawn from ``rng``;
        ``depth``: the passkey's (one of :data:`DEPTHS`, required for passkey)."""
        if task == "induction":
            return self._with_prefix(self.induction(length, rng))
        if task == "lookup":
            return self._with_prefix(self.lookup(length, rng))
        if task == "passkey":
            if depth is None:
                raise ValueError("passkey needs the needle's depth")
            return self._with_prefix(self.passkey(length, rng, depth))
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")

    def induction(self, length: int, rng: np.random.Generator) -> Prompt:
        hay, nl = self.haystack(length, rng), self.encode("\n")
        context, last, chunk, answers = [], 0, [], []
        for d in DEPTHS:
            span = [int(t) for t in rng.choice(self.vocabulary, INDUCTION_CUE + INDUCTION_ANSWER)]
            at = int(d * length)
            context += hay[last:at] + nl + span + nl
            last = at
            question, answer = nl + span[:INDUCTION_CUE], span[INDUCTION_CUE:]
            answers.append((len(chunk) + len(question), tuple(answer)))
            chunk += question + answer + nl
        return Prompt(context + hay[last:], chunk, DEPTHS, tuple(answers))

    def lookup(self, length: int, rng: np.random.Generator) -> Prompt:
        context, entries = [], []
        while len(context) < length:
            key, value = f"{rng.integers(0, 10 ** 4):04d}", f"{rng.integers(10 ** 4, 10 ** 5)}"
            if any(key == k for k, _, _ in entries):
                continue
            entries.append((key, value, len(context)))
            context += self.encode(("\n" if len(entries) > 1 else "") + f"id {key}: {value}")
        context = context[:length]
        entries = [e for e in entries if e[2] + 12 < length]  # whole lines only
        if not entries:
            raise ValueError(f"lookup at {length} tokens holds no whole line: use a longer context")
        chunk, answers, depths = [], [], []
        for d in DEPTHS:
            key, value, at = min(entries, key=lambda e: abs(e[2] - d * length))
            question, answer = self.split(f"\nid {key}: ", value)
            answers.append((len(chunk) + len(question), answer))
            depths.append(d)
            chunk += question + list(answer)
        return Prompt(context, chunk, tuple(depths), tuple(answers))

    def _passkey_frame(self) -> tuple[str, str]:
        """(text before the haystack, text after it up to the answer): the tokenizer's chat format around one user
        turn when it has one (rendered with a sentinel where the haystack goes), else plain text."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": _INTRO + _SENTINEL + _QUESTION}],
                                           tokenize=False, add_generation_prompt=True)
            if text.count(_SENTINEL) == 1:
                head, tail = text.split(_SENTINEL)
                return head, tail + _ANSWER_LEAD
        return _INTRO, _QUESTION + " " + _ANSWER_LEAD

    def passkey(self, length: int, rng: np.random.Generator, depth: float) -> Prompt:
        key = f"{rng.integers(10 ** 4, 10 ** 5)}"
        head_text, question_text = self._passkey_frame()
        head = self.encode(head_text)
        if length - len(head) < 16:
            raise ValueError(f"passkey at {length} tokens leaves {length - len(head)} tokens of text after the "
                             f"{len(head)}-token instruction: use a longer context")
        hay = self.haystack(length - len(head), rng)
        at = int(depth * len(hay))
        context = head + hay[:at] + self.encode(f" The pass key is {key}. Remember it. {key} is the pass key. ") \
            + hay[at:]
        question, answer = self.split(question_text, key)
        return Prompt(context, question + list(answer), (depth,), ((len(question), answer),))
