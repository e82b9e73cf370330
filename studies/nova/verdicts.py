"""The verdict rules of the claims (kvstats.measure.verdicts)."""

from __future__ import annotations

from kvstats.measure.verdicts import (
    Verdict,
    cell_direction,
    direction,
    identity,
    printed_half_unit,
)
from kvstats.studies.nova.cells import ALPHA, CLAIM_METRICS, PARSEVAL_RTOL, PUBLISHED_BITS


def beats_verdict(rows) -> Verdict:
    """NOVA-KV beats the scalar methods: the direction rule over comparisons (baseline × metric).

    rows: mappings with ``nova_vs``, ``metric`` (a key of :data:`CLAIM_METRICS`), ``w_p_holm`` and ``w_r`` (the
    Wilcoxon r of nova − baseline). A comparison is for the claim when significant (Holm) in the better direction
    of its metric (lower KL, higher recall), against when significant the other way."""
    rows = list(rows)
    cells = [cell_direction(r["w_p_holm"], r["w_r"], expected_sign=CLAIM_METRICS[r["metric"]], alpha=ALPHA)
             for r in rows]
    verdict = direction(cells, what="comparisons (baseline × metric)")
    against = [f"{r['nova_vs']} on {r['metric']}" for r, c in zip(rows, cells) if c == -1]
    if against:
        verdict = Verdict(verdict.verdict, verdict.rule, f"{verdict.reason} ({', '.join(against)})")
    return verdict


def ablation_verdict(rows) -> Verdict:
    """One ablation family: the direction rule over its (comparison, metric) cells, each for the claim when
    significant (Holm within the family) with the sign ``expected_sign`` of the Wilcoxon r of a − b."""
    rows = list(rows)
    cells = [cell_direction(r["p_holm"], r["w_r"], expected_sign=r["expected_sign"], alpha=ALPHA) for r in rows]
    verdict = direction(cells, what="(comparison, metric) cells")
    against = [f"{r['a']} vs {r['b']} on {r['metric']}" for r, c in zip(rows, cells) if c == -1]
    if against:
        verdict = Verdict(verdict.verdict, verdict.rule, f"{verdict.reason} ({', '.join(against)})")
    return verdict


def grouping_verdict(rows) -> Verdict:
    """Equal-volume (stratified) groups beat contiguous ones: the direction rule over (n, metric) cells, lower
    coefficient MSE and lower KL (expected r of stratified − contiguous < 0)."""
    cells = [cell_direction(r["w_p"], r["w_r"], expected_sign=-1, alpha=ALPHA) for r in rows]
    return direction(cells, what="(n, metric) cells")


def bits_verdict(ours: float, published: str = PUBLISHED_BITS) -> Verdict:
    """Our bit count against the printed number: the identity rule within half a unit of its last digit."""
    return identity([ours], float(published), atol=printed_half_unit(published), what="bit counts")


def parseval_verdict(coef_mse, sigma_form, rtol: float = PARSEVAL_RTOL) -> Verdict:
    """‖y − ŷ‖² = (k − k̂)ᵀ Σ_Q (k − k̂) per (layer, KV head) cell: the identity rule at ``rtol``."""
    return identity(list(sigma_form), list(coef_mse), rtol=rtol, what="(layer, KV head) cells")
