"""Kernel calls planned for one code: the leading dims of a query (or of weights) and of a code's per-key tensors
broadcast and flattened into the one group axis G the score and weighted-sum kernels take (:func:`broadcast_groups`,
:func:`flat_keys`), once per code for a cache's decode steps (:class:`GroupedPlan`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["GroupedPlan", "broadcast_groups", "flat_keys"]


def broadcast_groups(query: torch.Tensor, *code_tensors: torch.Tensor, key_dims: tuple[int, ...]):
    """Broadcast the leading dims of query [..., n_q, d] and of per-key tensors [..., n_k, *key_dims]
    and flatten them into one group axis G, as the score kernels take them.

    Returns (lead shape, query [G, n_q, d], [tensor as [G, n_k, *rest] for each code tensor]).
    """
    leads = [t.shape[: t.dim() - 1 - k] for t, k in zip(code_tensors, key_dims)]
    lead = query.shape[:-2]
    if any(other != lead for other in leads):  # (equal shapes, a decode step's case, need no broadcast)
        lead = torch.broadcast_shapes(lead, *leads)

    def flatten(t: torch.Tensor, t_lead: torch.Size, tail: torch.Size) -> torch.Tensor:
        return (t if t_lead == lead else t.expand(*lead, *tail)).reshape(-1, *tail)

    q3 = flatten(query, query.shape[:-2], query.shape[-2:])
    flat = [flatten(t, t_lead, t.shape[t.dim() - 1 - k:]) for t, t_lead, k in zip(code_tensors, leads, key_dims)]
    return lead, q3, flat


def flat_keys(t: torch.Tensor, key_dims: int) -> torch.Tensor:
    """A code's per-key tensor [*lead, n_k, *rest] (``key_dims`` = len(rest)) as [G, n_k, *rest], G = prod(lead):
    the layout of the kernels (:class:`GroupedPlan`'s flattening)."""
    return t.reshape(-1, *t.shape[t.dim() - 1 - key_dims:])


class GroupedPlan:
    """A kernel call planned for one code: ``plan(x)`` for x [*lead, n_q, w] runs ``kernel(x [G, n_q, w], *flat)``
    with the code's per-key tensors [*lead, n_k, *rest] as ``flat`` [G, n_k, *rest] and returns [*lead, n_q, X].

    The flattening (:func:`broadcast_groups`) is done once, when x has the code's leading dims — a cache's decode
    steps call the same code's kernels once per layer and token; an x whose leading dims must be broadcast with the
    code's is flattened with it on each call (:meth:`broadcast`)."""

    def __init__(self, kernel: Callable[..., torch.Tensor], *code_tensors: torch.Tensor, key_dims: tuple[int, ...]):
        self.kernel, self.code_tensors, self.key_dims = kernel, code_tensors, key_dims
        leads = {t.shape[:t.dim() - 1 - k] for t, k in zip(code_tensors, key_dims)}
        # None: the code's own tensors broadcast among themselves, so every call flattens them
        self.lead = leads.pop() if len(leads) == 1 else None
        self._flat: list[torch.Tensor] | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[:-2] != self.lead:
            return self.broadcast(x)
        if self._flat is None:
            self._flat = [flat_keys(t, k) for t, k in zip(self.code_tensors, self.key_dims)]
        out = self.kernel(x.reshape(-1, *x.shape[-2:]), *self._flat)
        return out.view(*self.lead, *out.shape[-2:])

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """The call for x whose leading dims broadcast with the code's."""
        lead, x3, flat = broadcast_groups(x, *self.code_tensors, key_dims=self.key_dims)
        out = self.kernel(x3, *flat)
        return out.reshape(*lead, *out.shape[-2:])
