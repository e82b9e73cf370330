"""Significance groups at one budget (:func:`kvstats.stats.significance_groups`) and the compact letter display.

Oracles: the letters' defining property (two methods share a letter exactly when their pair is not significant) on
every significance pattern hypothesis draws, and a display worked by hand; the p-values recomputed with
scipy.stats.wilcoxon and statsmodels' Holm directly; the means with numpy. The data are fixed by their seeds: no
test here depends on chance.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st
from statsmodels.stats.multitest import multipletests

from kvstats.stats import compact_letters, significance_groups


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.booleans(), min_size=n * (n - 1) // 2, max_size=n * (n - 1) // 2))))
def test_methods_share_a_letter_exactly_when_their_pair_is_not_significant(case):
    n, flags = case
    methods = [f"m{i}" for i in range(n)]
    pairs = list(itertools.combinations(methods, 2))
    significant = [p for p, f in zip(pairs, flags) if f]
    letters = compact_letters(methods, significant)
    assert set(letters) == set(methods) and all(letters[m] for m in methods)  # every method has a letter
    for a, b in pairs:
        assert (not set(letters[a]) & set(letters[b])) == ((a, b) in significant)
    columns = {ch: {m for m in methods if ch in letters[m]} for ch in set("".join(letters.values()))}
    assert not any(c < o for c in columns.values() for o in columns.values())  # absorbed: no column inside another
    assert letters[methods[0]].startswith("a")  # the best method gets the first letter


def test_a_display_worked_by_hand():
    # a–c, a–d, b–d significant: a|b share "a", b|c share "b", c|d share "c" (the classic overlapping display)
    assert compact_letters("abcd", [("a", "c"), ("a", "d"), ("b", "d")]) == {"a": "a", "b": "ab", "c": "bc",
                                                                             "d": "c"}
    assert compact_letters("abc", []) == {"a": "a", "b": "a", "c": "a"}
    assert compact_letters("abc", [("a", "b"), ("b", "c"), ("c", "a")]) == {"a": "a", "b": "b", "c": "c"}


def _units(n_units: int = 12, seed: int = 0) -> pd.DataFrame:
    """Five methods on the same units: A, B close, C and D worse, E as good as A but at 6 bits."""
    rng = np.random.default_rng(seed)
    base = rng.lognormal(size=n_units)
    rows = []
    for method, shift, bits in [("A", 0.0, 4.5), ("B", 0.02, 4.5), ("C", 0.6, 4.4), ("D", 1.5, 4.6), ("E", 0.0, 6.0)]:
        noise = rng.normal(0, 0.01, n_units)
        rows += [{"method": method, "unit": u, "kl": base[u] * (1 + shift) + noise[u], "bits": bits}
                 for u in range(n_units)]
    return pd.DataFrame(rows)


def test_p_values_means_and_groups_against_scipy_and_statsmodels():
    units = _units()
    g = significance_groups(units, "kl", "method", "unit", bits="bits", budget=4.5, tolerance=0.25)
    grouped = ["A", "B", "C", "D"]
    assert g.table.method.tolist() == grouped + ["E"]  # best mean first, the ungrouped last
    for r in g.table.itertuples():
        assert r.mean == pytest.approx(units.loc[units.method == r.method, "kl"].mean(), rel=1e-12)
        assert r.ci_low < r.mean < r.ci_high
    series = {m: units[units.method == m].sort_values("unit").kl.to_numpy() for m in grouped}
    raw = [scipy.stats.wilcoxon(series[a], series[b]).pvalue for a, b in itertools.combinations(grouped, 2)]
    holm = multipletests(raw, method="holm")[1]
    np.testing.assert_allclose(g.pairs.p.to_numpy(), raw, rtol=1e-12)
    np.testing.assert_allclose(g.pairs.p_adj.to_numpy(), holm, rtol=1e-12)
    significant = {(a, b) for (a, b), p in zip(itertools.combinations(grouped, 2), holm) if p < 0.05}
    assert g.table.set_index("method").letters[grouped].to_dict() == compact_letters(grouped, significant)
    assert g.distinguishable("A", "D") is True and g.distinguishable("A", "E") is None
    e = g.table.set_index("method").loc["E"]
    assert not e.grouped and e.letters == "" and "holds 6 bits per element, outside 4.5 ± 0.25" in e.note
    assert "not grouped: holds 6 bits" in g.markdown()
    unknown = units.assign(bits=np.where(units.method == "E", np.nan, units.bits))
    e = significance_groups(unknown, "kl", "method", "unit", bits="bits", budget=4.5, tolerance=0.25).table
    assert e.set_index("method").loc["E", "note"] == "bits held not measured"


def test_higher_is_better_orders_the_other_way():
    g = significance_groups(_units(), "kl", "method", "unit", lower_is_better=False)
    assert g.table.method.tolist()[:2] == ["D", "C"] and g.table.letters.iloc[0].startswith("a")


def test_too_few_units_say_undecided_not_equal():
    """Three units: the exact two-sided Wilcoxon p is at least 2/2³ = 0.25, never below 0.05 after Holm."""
    g = significance_groups(_units(n_units=3), "kl", "method", "unit")
    assert set(g.table.letters) == {"a"} and not g.pairs.significant.any()
    assert any("undecided, not equal" in n for n in g.notes)


def test_methods_without_shared_units_and_bad_arguments_are_refused_by_name():
    units = _units()
    apart = units.assign(unit=np.where(units.method == "B", units.unit + 100, units.unit))
    with pytest.raises(ValueError, match=r"paired_by 'unit': the methods \('A', 'B'\) share no unit"):
        significance_groups(apart, "kl", "method", "unit")
    for kwargs, match in [({"budget": 4.5}, "budget and tolerance go together"),
                          ({"budget": 4.5, "tolerance": 0.2}, r"budget needs bits="),
                          ({"bits": "nope"}, r"bits must name a column"),
                          ({"alpha": 0.7}, r"alpha must be in \(0, 0.5\)"),
                          ({"bits": "bits", "budget": 4.5, "tolerance": -1}, "tolerance must be a finite number")]:
        with pytest.raises(ValueError, match=match):
            significance_groups(units, "kl", "method", "unit", **kwargs)
    with pytest.raises(ValueError, match=r"table has no rows"):
        significance_groups(units.iloc[:0], "kl", "method", "unit")
    with pytest.raises(ValueError, match=r"metric column 'kl' holds 1 non-finite"):
        significance_groups(units.assign(kl=units.kl.where(units.index != 3, np.nan)), "kl", "method", "unit")
    with pytest.raises(ValueError, match=r"significant pair .* names 'z'"):
        compact_letters("ab", [("a", "z")])
    with pytest.raises(ValueError, match="each method once"):
        compact_letters("aa", [])


def test_methods_equal_on_every_unit_share_a_letter_with_p_one():
    """Pass/fail outcomes of two methods are often equal trial for trial: no difference to test, p = 1 (the
    signed-rank test itself refuses all-zero differences)."""
    outcomes = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    units = pd.DataFrame([{"method": m, "trial": t, "success": v} for m in ("a", "b") for t, v in enumerate(outcomes)]
                         + [{"method": "c", "trial": t, "success": 0.0} for t in range(6)])
    g = significance_groups(units, "success", "method", "trial", lower_is_better=False)
    row = g.pairs[(g.pairs.level_a == "a") & (g.pairs.level_b == "b")].iloc[0]
    assert (row.p, row.p_method, row.rank_biserial, row.n_zero) == (1.0, "none: equal on every unit", 0.0, 6)
    assert set(g.table.set_index("method").letters[["a", "b"]]) == {"a"} and g.distinguishable("a", "b") is False
