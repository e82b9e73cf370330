"""The conformance kit's ``cache`` check (:mod:`kvstats.quant.conformance`): what
:class:`kvstats.cache.KVStatsCache` needs of a quantizer (docs/quantizers.md, "What a quantizer owes the cache") —
codes of 1 and of odd token counts, a batch axis first in every code tensor (beam search), per-vector codes that
join and cut along the tokens, and plans that give the numbers of ``inner`` and ``weighted_sum``."""

from __future__ import annotations

import torch

from kvstats.quant._checks import BATCH, Check, close, draw, vectors_apart

__all__ = ["check_cache"]

#: Tokens of the test data: odd, and encoded 1 + 1 + 3 + 4 at a time (one-token decode steps, odd prefill chunks).
TOKENS = 9


def check_cache(check: Check, q, seed: int, heads: int) -> None:
    """The ``cache`` check of :func:`~kvstats.quant.conformance.check_quantizer` on x [B, heads, TOKENS, d]: raises
    :class:`~kvstats.quant._checks.CheckFailed` naming it."""
    n = TOKENS
    x = draw((BATCH, heads, n, q.dim), seed + 3)
    query = draw((BATCH, heads, 5, q.dim), seed + 4)
    with check.running("cache", "encoding one token"):
        one = q.encode(x[..., :1, :])
        one_hat = q.decode(one)
        one_scores = q.inner(query, one)
    check.that(tuple(one_hat.shape) == (BATCH, heads, 1, q.dim) and tuple(one_scores.shape) == (BATCH, heads, 5, 1),
               "cache", f"a one-token x [{BATCH}, {heads}, 1, d] decoded to {tuple(one_hat.shape)} and scored "
               f"{tuple(one_scores.shape)}")
    with check.running("cache", f"encoding {n} tokens"):
        code = q.encode(x)
        x_hat = q.decode(code)
        scores = q.inner(query, code)
    _batch_axis(check, q, code, query, x_hat, scores)
    cuts = (0, 1, 2, 5, n)
    with check.running("cache", "encoding the tokens 1 + 1 + 3 + 4 at a time"):
        pieces = [q.encode(x[..., a:b, :]) for a, b in zip(cuts, cuts[1:])]
        piece_hats = [q.decode(p) for p in pieces]
    _plans(check, q, code, query, seed)
    declared = getattr(q, "codes_per_vector", None)
    if not all(p.is_per_vector() for p in (*pieces, code)):
        check.that(declared is not True, "cache",
                   "codes_per_vector is True, but its codes are not indexed by token (Code.is_per_vector() is False)")
        return  # groups across tokens: the cache keeps each chunk's code whole, which the checks above cover
    _per_vector_codes(check, q, query, code, x_hat, scores, pieces, piece_hats, declared, heads)


def _batch_axis(check: Check, q, code, query: torch.Tensor, x_hat: torch.Tensor, scores: torch.Tensor) -> None:
    """Every code tensor keeps the batch axis of x first, and selecting or repeating rows along it (beam search)
    gives the code of those rows of x."""
    for key, t in code.named_tensors():
        check.that(t.dim() >= 1 and t.shape[0] == BATCH, "cache",
                   f"code tensor {key!r} has shape {tuple(t.shape)}: the cache selects beams along axis 0 of every "
                   f"code tensor, which must be the batch axis of x [B, H, n, d] (B = {BATCH})")
    for what, select in (("index_select(0, [1, 0, 1]) (beam search reordering)",
                          lambda t: t.index_select(0, torch.tensor([1, 0, 1], device=t.device))),
                         ("repeat_interleave(2, dim=0) (beam search expansion)",
                          lambda t: t.repeat_interleave(2, dim=0))):
        with check.running("cache", f"decoding a code after {what}"):
            chosen = code.map_batch(select)
            chosen_hat = q.decode(chosen)
            chosen_scores = q.inner(select(query), chosen)
        check.that(close(chosen_hat, select(x_hat)) and close(chosen_scores, select(scores)), "cache",
                   f"{what} on every code tensor did not give the code of those rows of x")


def _per_vector_codes(check: Check, q, query: torch.Tensor, code, x_hat: torch.Tensor, scores: torch.Tensor,
                      pieces: list, piece_hats: list[torch.Tensor], declared: bool | None, heads: int) -> None:
    """Per-vector codes (of x [B, H, n, d] and of its tokens 1 + 1 + 3 + 4 at a time, ``pieces``) appended along
    the token axis decode and score as their parts, the same as one encode when ``codes_per_vector`` is declared,
    and their first tokens (crop) decode as those tokens."""
    n = TOKENS
    with check.running("cache", "appending per-vector codes along the token axis"):
        joined = pieces[0]
        for p in pieces[1:]:
            joined = joined.cat(p)
        joined_hat = q.decode(joined)
        joined_scores = q.inner(query, joined)
    check.that(close(joined_hat, torch.cat(piece_hats, dim=-2)), "cache",
               "per-vector codes appended along the token axis do not decode to their parts' x̂ side by side")
    check.that(close(joined_scores, torch.cat([q.inner(query, p) for p in pieces], dim=-1)), "cache",
               "per-vector codes appended along the token axis do not score as their parts")
    if declared is True:  # the cache encodes window tokens ahead, in other groups than they would leave the window
        apart = max(vectors_apart(joined_hat, x_hat), vectors_apart(joined_scores.transpose(-1, -2),
                                                                      scores.transpose(-1, -2)))
        allowed = max(2, BATCH * heads * n // 27)
        check.that(apart <= allowed, "cache",
                   f"codes_per_vector is True, but {apart} of the {BATCH * heads * n} tokens encoded 1 + 1 + 3 + 4 at "
                   "a time do not decode or score as the same tokens encoded at once: a token's code depends on the "
                   "other tokens encoded with it (declare codes_per_vector = False)")
    with check.running("cache", "cutting a per-vector code to its first 5 tokens (crop)"):
        head = code.narrow(5)
        head_hat = q.decode(head)
    check.that(close(head_hat, x_hat[..., :5, :]), "cache",
               "the first 5 tokens of a per-vector code (crop) do not decode to the first 5 rows of x̂")


def _plans(check: Check, q, code, query: torch.Tensor, seed: int) -> None:
    """The cache's decode steps call ``inner_plan(code)`` and ``weighted_sum_plan(code)`` (a kvstats Quantizer has
    both): they must give what ``inner`` and ``weighted_sum`` give."""
    weights = torch.softmax(draw((*query.shape[:-1], code.shape[-2]), seed + 5) * 3, dim=-1)
    for method, make, arg in (("inner", "inner_plan", query), ("weighted_sum", "weighted_sum_plan", weights)):
        if getattr(q, make, None) is None or getattr(q, method, None) is None:
            continue
        with check.running("cache", f"{make}(code) against {method}"):
            got = getattr(q, make)(code)(arg)
            want = getattr(q, method)(arg, code)
        check.that(close(got, want), "cache", f"{make}(code)(x) differs from {method}(x, code): a decode step of the "
                   f"cache would not compute what {method} does")

