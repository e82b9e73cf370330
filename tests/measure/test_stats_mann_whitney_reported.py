"""kvstats.stats' Mann–Whitney p-values from reported numbers (group sizes, U₁, a published rank-biserial r) against
scipy.stats.mannwhitneyu on samples built to have them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from kvstats import stats as S


def _samples_with_u(u: int, n1: int, n2: int) -> tuple[np.ndarray, np.ndarray]:
    """a, b without ties and with exactly u pairs a > b (a's values between the b's)."""
    b = np.arange(n2, dtype=float)
    above = [min(max(u - n2 * i, 0), n2) for i in range(n1)]
    a = np.array([c - 0.5 + 0.1 * i / n1 for i, c in enumerate(above)])
    assert scipy.stats.mannwhitneyu(a, b).statistic == u
    return a, b


@pytest.mark.parametrize("n1, n2", [(5, 5), (4, 9), (12, 7)])
def test_min_pvalue_is_scipys_p_at_complete_separation(n1, n2):
    a, b = np.arange(n1, dtype=float), np.arange(n1, n1 + n2, dtype=float)
    exact = scipy.stats.mannwhitneyu(a, b, method="exact").pvalue
    assert S.mann_whitney_min_pvalue(n1, n2, method="exact") == pytest.approx(exact, rel=1e-12)
    assert S.mann_whitney_min_pvalue(n1, n2, method="exact") == 2 / math.comb(n1 + n2, n1)
    asym = scipy.stats.mannwhitneyu(a, b, method="asymptotic").pvalue
    assert S.mann_whitney_min_pvalue(n1, n2, method="asymptotic") == asym
    # "auto" follows kvstats.stats.mann_whitney's choice (exact at these sizes)
    assert S.mann_whitney_min_pvalue(n1, n2) == pytest.approx(S.mann_whitney(a, b).pvalue, rel=1e-9)


def test_min_pvalue_at_70_vs_70_and_its_default_second_group():
    assert S.mann_whitney_min_pvalue(70, method="exact") == pytest.approx(2 / math.comb(140, 70), rel=1e-12)
    assert S.mann_whitney_min_pvalue(70, method="asymptotic") == pytest.approx(1.8e-24, rel=0.05)
    with pytest.raises(ValueError, match="method"):
        S.mann_whitney_min_pvalue(5, method="normal")


def test_smallest_group_size_for_p_below_1e_23_matches_scipy():
    """Exact p at complete separation n vs n is 2/C(2n, n): 41 per group reach p < 1e−23 (not 70); the normal
    approximation needs 68. Oracle: scipy.stats.mannwhitneyu on separated samples."""
    exact = S.mann_whitney_min_n(1e-23, method="exact")
    normal = S.mann_whitney_min_n(1e-23, method="asymptotic")
    for n, method in ((exact, "exact"), (normal, "asymptotic")):
        a, b = np.arange(n, dtype=float), np.arange(n, 2 * n, dtype=float)
        p_n = scipy.stats.mannwhitneyu(a, b, method=method, use_continuity=True).pvalue
        p_before = scipy.stats.mannwhitneyu(a[:-1], b[:-1], method=method, use_continuity=True).pvalue
        assert p_n < 1e-23 <= p_before
    assert (exact, normal) == (41, 68)
    with pytest.raises(ValueError, match="target"):
        S.mann_whitney_min_n(0.0, method="exact")
    with pytest.raises(ValueError, match="n_max"):
        S.mann_whitney_min_n(1e-23, method="exact", n_max=20)


@pytest.mark.parametrize("u, n1, n2", [(0, 6, 6), (7, 6, 6), (18, 6, 6), (30, 6, 6), (36, 6, 6), (42, 70, 70),
                                       (11, 4, 9), (25, 9, 4)])
def test_u_pvalue_is_scipys_for_samples_with_that_u(u, n1, n2):
    a, b = _samples_with_u(u, n1, n2)
    asym = scipy.stats.mannwhitneyu(a, b, method="asymptotic", use_continuity=False).pvalue
    assert S.mann_whitney_u_pvalue(u, n1, n2, method="asymptotic") == pytest.approx(asym, rel=1e-9)
    exact = scipy.stats.mannwhitneyu(a, b, method="exact").pvalue
    assert S.mann_whitney_u_pvalue(u, n1, n2, method="exact") == pytest.approx(exact, rel=1e-12)


def test_u_pvalue_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError, match="integer u"):
        S.mann_whitney_u_pvalue(2.5, 5, 5, method="exact")
    with pytest.raises(ValueError, match="integer u"):
        S.mann_whitney_u_pvalue(26, 5, 5, method="exact")
    with pytest.raises(ValueError, match="method"):
        S.mann_whitney_u_pvalue(3, 5, 5, method="auto")
    # the normal approximation takes a fractional U₁ (from a rounded r)
    assert 0 < S.mann_whitney_u_pvalue(2.5, 5, 5, method="asymptotic") < 1


def test_rank_biserial_report_of_dalbertos_triple():
    """r = −0.983 printed to 3 decimals at 70 vs 70: U₁ ∈ [40.67, 45.57] over r ± 0.0005, integers 41 and 42 with
    r's rounding; the normal p at the printed r is above 1e−23, at the interval's low end below it; the exact p
    holds by orders of magnitude. Oracle: scipy on samples with that U₁."""
    n = 70
    rep = S.rank_biserial_report(-0.983, n, n, r_interval=(-0.9835, -0.9825))
    assert rep.statistic == pytest.approx((1 - 0.983) / 2 * n * n) and rep.effect_size == -0.983
    assert rep.u_integers == (41, 42)
    assert rep.pvalue > 1e-23 > rep.p_asymptotic_at_ends[0] and rep.p_asymptotic_at_ends[1] > rep.pvalue
    exact = [scipy.stats.mannwhitneyu(*_samples_with_u(u, n, n), method="exact").pvalue for u in (41, 42)]
    assert rep.p_exact_max == pytest.approx(max(exact), rel=1e-12) and rep.p_exact_max < 1e-33
    a, b = _samples_with_u(42, n, n)
    assert S.rank_biserial_report(2 * 42 / n**2 - 1, n, n).pvalue == pytest.approx(
        scipy.stats.mannwhitneyu(a, b, method="asymptotic", use_continuity=False).pvalue, rel=1e-9)
    assert "p_exact_max" in rep.summary()


def test_rank_biserial_report_without_an_interval():
    rep = S.rank_biserial_report(0.5, 4, 6)  # U₁ = 18, an integer: its exact p is the only one
    assert rep.r_interval == (0.5, 0.5) and rep.u_integers == (18,)
    assert rep.p_exact_max == pytest.approx(S.mann_whitney_u_pvalue(18, 4, 6, method="exact"))
    assert math.isnan(S.rank_biserial_report(0.51, 4, 6).p_exact_max)  # U₁ = 18.12: no integer U₁
    with pytest.raises(ValueError, match="contain"):
        S.rank_biserial_report(0.5, 4, 6, r_interval=(0.6, 0.7))
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        S.rank_biserial_report(1.5, 4, 6)
