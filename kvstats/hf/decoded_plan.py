"""The cache's plan for a quantizer with none of its own: a chunk's codes decoded once and kept.

A :class:`~kvstats.hf.cache.KVStatsCache` layer scores every chunk of codes at every decode step. kvstats' own
quantizers score from the codes through plans (``inner_plan``, ``weighted_sum_plan``, the fused step); a quantizer
written on the protocol alone has none, so every step would call its ``inner`` on the whole cache — decoding every
code again, O(S·d) decode work per layer and step. For such a quantizer (:func:`decodable_sides`) the layer keeps
K̂ = decode(codes) and V̂ beside the codes, decodes only the new tokens' codes when they are appended, and scores
q·K̂ᵀ and sums w·V̂: a decode step then costs what its new tokens cost to decode, plus the two products an fp cache
does too. The price is memory: the decoded copy is held as well (the cache's ``memory()`` still reports the codes,
what a deployment holds).

Exactness. For V this is the definition the cache applies to a quantizer without ``weighted_sum`` (decode, then
multiply), on the same numbers. For K it is exact when the quantizer's ``inner`` is decode-then-dot —
inner(q, code) = ⟨q, decode(code)⟩, what ``check_quantizer`` checks unless told the estimator is not linear. The
plan compares the two on every newly decoded token, with the query of the step that first reads it
(within :func:`kvstats.quant.attention.inner_tolerance`); where they differ, that layer scores from ``inner`` on the
whole cache from then on (that step too), with a warning: slow, and never another estimator's numbers.
"""

from __future__ import annotations

import warnings

import torch

from kvstats.quant import attention as _attention

__all__ = ["DecodedPlan", "decodable_sides"]


def _default_estimator(q, public: str, private: str, plan: str) -> bool:
    """Whether ``q``'s method ``public`` is decode-then-dot / decode-then-multiply by construction: a subclass of
    kvstats' Quantizer from outside kvstats that overrides none of ``public``, ``private`` and ``plan``."""
    from kvstats.quant.quantizers.base import Quantizer
    from kvstats.quant.schemes import _set_on_instance

    cls = type(q)
    module = cls.__module__ or ""
    return (isinstance(q, Quantizer) and not (module == "kvstats" or module.startswith("kvstats."))
            and all(getattr(cls, m) is getattr(Quantizer, m) for m in (public, private, plan))
            and not _set_on_instance(q, public, private, plan))


def _protocol_only(q, *methods: str) -> bool:
    """Whether ``q`` is a quantizer on the protocol alone (not kvstats' Quantizer) without any of ``methods``."""
    from kvstats.quant.quantizers.base import Quantizer

    return not isinstance(q, Quantizer) and not any(callable(getattr(q, m, None)) for m in methods)


def decodable_sides(scheme) -> tuple[bool, bool]:
    """(K, V): whether a cache of ``scheme`` keeps the decoded K̂ (scores q·K̂ᵀ, checked against ``inner``) and the
    decoded V̂ (sums w·V̂) instead of calling the quantizer on the whole chunk at every step: a plain
    :class:`~kvstats.schemes.Scheme` (no method of its own) whose quantizer is a user's with no plans — on the
    protocol alone (no ``inner_plan``; for V no ``weighted_sum``), or a subclass of kvstats' Quantizer from outside
    kvstats that keeps its decode-then-dot defaults. kvstats' own quantizers keep their plans."""
    from kvstats.quant.schemes import Scheme, _set_on_instance

    cls = type(scheme)
    if not isinstance(scheme, Scheme) or any(getattr(cls, m) is not getattr(Scheme, m) for m in (
            "own_plan", "own_scores", "own_weighted_values", "scores", "weighted_values", "decode_parts")):
        return False, False
    if _set_on_instance(scheme, "scores", "weighted_values", "own_scores", "own_weighted_values", "own_plan"):
        return False, False
    k = _protocol_only(scheme.k, "inner_plan") or _default_estimator(scheme.k, "inner", "_inner", "inner_plan")
    v = (_protocol_only(scheme.v, "weighted_sum", "weighted_sum_plan")
         or _default_estimator(scheme.v, "weighted_sum", "_weighted_sum", "weighted_sum_plan"))
    return k, v


class DecodedPlan:
    """``scores(q)`` and ``values(w)`` of one chunk of codes (a :class:`~kvstats.schemes.CacheCode`) from its
    decoded K̂/V̂ ``[B, H_kv, S, d]`` (the sides :func:`decodable_sides` allows; the other through the scheme), the
    same contract as :meth:`kvstats.schemes.Scheme.own_plan`. :meth:`extended` gives the plan of the chunk with
    more tokens' codes appended, decoding only those."""

    def __init__(self, scheme, chunk, sides: tuple[bool, bool], *, k_hat: torch.Tensor | None = None,
                 v_hat: torch.Tensor | None = None, unchecked: list | None = None):
        from kvstats.quant.quantizers.base import Quantizer

        self.scheme, self.chunk = scheme, chunk
        self.decode_k, self.decode_v = sides
        # K̂/V̂ are views of the first n tokens of buffers with room to grow (doubling: a decode step appends in
        # amortised O(new tokens), where torch.cat would copy the whole chunk at every step)
        self.k_hat = (scheme.k.decode(chunk.k) if k_hat is None else k_hat) if self.decode_k else None
        self.v_hat = (scheme.v.decode(chunk.v) if v_hat is None else v_hat) if self.decode_v else None
        # (first token, CacheCode) of decoded keys whose inner was not yet compared with q·k̂ᵀ; a subclass of
        # kvstats' Quantizer with the defaults is decode-then-dot by construction: nothing to compare
        self.check = self.decode_k and not isinstance(scheme.k, Quantizer)
        self.unchecked = ([(0, chunk)] if unchecked is None else unchecked) if self.check else []

    @staticmethod
    def _grown(held: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """``held`` (a view of the first tokens of its buffer) followed by ``new`` along the tokens (axis -2): written
        into the buffer's spare room when it has enough (the view of a later plan: no plan older than this one reads
        past its own tokens), else into a buffer twice as long."""
        n, m = held.shape[-2], new.shape[-2]
        base = held._base if held._base is not None and held._base.dim() == held.dim() else held
        if base.shape[-2] >= n + m and base.data_ptr() == held.data_ptr() and base.shape[:-2] == held.shape[:-2]:
            base[..., n:n + m, :] = new
            return base[..., :n + m, :]
        grown = held.new_empty((*held.shape[:-2], max(2 * (n + m), 64), held.shape[-1]))
        grown[..., :n, :] = held
        grown[..., n:n + m, :] = new
        return grown[..., :n + m, :]

    def extended(self, chunk, code) -> DecodedPlan:
        """The plan of ``chunk`` = this plan's chunk with ``code`` (the new tokens' codes) appended; this plan is
        not used after it (its chunk was replaced)."""
        n = self.chunk.k.shape[self.chunk.k.token_axis]
        k_hat = self._grown(self.k_hat, self.scheme.k.decode(code.k)) if self.decode_k else None
        v_hat = self._grown(self.v_hat, self.scheme.v.decode(code.v)) if self.decode_v else None
        return DecodedPlan(self.scheme, chunk, (self.decode_k, self.decode_v), k_hat=k_hat, v_hat=v_hat,
                           unchecked=[*self.unchecked, (n, code)])

    def scores(self, q: torch.Tensor) -> torch.Tensor:
        """q [B, H_q, N, d] (the accumulation dtype) -> [B, H_q, N, S]: q·K̂ᵀ, or the scheme's own scores."""
        if not self.decode_k:
            return self.scheme.own_scores(q, self.chunk)
        out = _attention.scores(q, self.k_hat.to(q.dtype), scale=1.0)
        while self.unchecked:
            start, code = self.unchecked[0]
            n = code.k.shape[code.k.token_axis]
            k_hat = self.k_hat[..., start:start + n, :].to(q.dtype)
            ref = self.scheme._scores_by(self.scheme.k.inner, q, code)
            gap = float((ref.to(out.dtype) - out[..., start:start + n]).abs().max())
            tol = _attention.inner_tolerance(ref, q, k_hat)
            if not gap <= tol:
                self._give_up(gap, tol)
                return self.scheme.own_scores(q, self.chunk)
            self.unchecked.pop(0)
        return out

    def _give_up(self, gap: float, tol: float) -> None:
        self.decode_k, self.k_hat, self.unchecked = False, None, []
        warnings.warn(f"{type(self.scheme.k).__name__}: inner(q, code) differs from <q, decode(code)> by {gap:.3g} "
                      f"(> {tol:.3g}) on a decode step's new tokens, so the cache cannot score from the decoded keys: "
                      "this layer's scores now come from inner on every cached code at every step (its own "
                      "estimator; slow)", UserWarning, stacklevel=3)

    def values(self, w: torch.Tensor) -> torch.Tensor:
        """w [B, H_q, N, S] (the accumulation dtype) -> [B, H_q, N, d]: w·V̂, or the scheme's own sums."""
        if not self.decode_v:
            return self.scheme.own_weighted_values(w, self.chunk)
        return _attention.apply_weights(w, self.v_hat.to(w.dtype))
