"""The verdict code of studies/nova/ and studies/end_to_end/: each rule is fed numbers for which it must return
each verdict it can, and the studies' own pieces (NOVA's regrouping, end_to_end's windows) against oracles."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from kvstats.quant.quantizers.nova import DEFAULT_RIDGE
from kvstats.study.report import read_claims, read_definitions
from tests.helpers.studies import load_study


@pytest.fixture(scope="module")
def nv():
    return load_study("nova")


@pytest.fixture(scope="module")
def e2e():
    return load_study("end_to_end")


# ------------------------------------------------------------------------------------------------ nova


def _cmp(other, metric, p, r):
    return {"nova_vs": other, "metric": metric, "w_p_holm": p, "w_r": r}


def test_nova_beats_verdict_returns_each_verdict(nv):
    # lower KL is r < 0, higher recall r > 0 (r of nova - other)
    good = [_cmp("kqv", "kl", 1e-4, -0.8), _cmp("kqv", "top5", 1e-4, 0.7),
            _cmp("minmax", "kl", 1e-3, -0.5), _cmp("minmax", "top5", 1e-3, 0.4)]
    assert nv.beats_verdict(good).verdict == "reproduced"
    # min-max beats nova on KL (significant the other way): a part fails
    mixed = good[:3] + [_cmp("minmax", "kl", 1e-3, +0.5)]
    v = nv.beats_verdict(mixed)
    assert v.verdict == "partly" and "minmax on kl" in v.reason and "opposite direction in 1" in v.reason
    # significant but in the wrong direction everywhere, or nowhere significant
    assert nv.beats_verdict([_cmp("kv", "kl", 1e-4, 0.9), _cmp("kv", "top5", 1e-4, -0.9)]).verdict == "not reproduced"
    assert nv.beats_verdict([_cmp("kv", "kl", 0.2, -0.9)]).verdict == "inconclusive"  # nowhere significant


def test_nova_grouping_verdict_returns_each_verdict(nv):
    row = lambda p, r: {"w_p": p, "w_r": r}  # noqa: E731 - r of stratified - contiguous
    assert nv.grouping_verdict([row(1e-3, -0.9), row(1e-3, -0.6)]).verdict == "reproduced"
    assert nv.grouping_verdict([row(1e-3, -0.9), row(0.4, -0.1)]).verdict == "partly"
    assert nv.grouping_verdict([row(1e-3, 0.9), row(0.4, -0.1)]).verdict == "not reproduced"


def test_nova_ablation_verdict_returns_each_verdict(nv):
    def row(p, r, sign=-1, a="nova", b="rot_vq", metric="kl"):
        return {"p_holm": p, "w_r": r, "expected_sign": sign, "a": a, "b": b, "metric": metric}

    assert nv.ablation_verdict([row(1e-3, -0.8), row(1e-3, 0.7, +1, metric="top5")]).verdict == "reproduced"
    mixed = nv.ablation_verdict([row(1e-3, -0.8), row(1e-3, 0.8, a="nova_scalar", b="rot_scalar")])
    assert mixed.verdict == "partly" and "nova_scalar vs rot_scalar on kl" in mixed.reason
    assert nv.ablation_verdict([row(0.3, -0.8), row(1e-3, -0.7, +1, metric="top5")]).verdict == "not reproduced"


@pytest.mark.slow
def test_nova_ablation_tests_pair_units_and_apply_holm_per_family(nv):
    # Synthetic units: nova lower than rot_vq by a shift in every (layer, KV head); the test must pair the units
    # (Wilcoxon of the 12 differences, all negative: exact p = 2/2^12) and Holm within the transform family only.
    rng = np.random.default_rng(0)
    rows = []
    for arm in nv.ABLATION_ARMS:
        for layer in range(4):
            for head in range(9):
                base = 0.5 + 0.1 * layer + 0.01 * head
                shift = {"nova": -0.1, "nova_values": -0.1, "rot_scalar": 0.1, "nova_scalar": 0.1}.get(arm, 0.0)
                noise = 1e-3 * rng.standard_normal(3)
                rows.append({"scheme": arm, "n": 2, "layer": layer, "head": head, "kv_head": head // 3,
                             "kl": base + shift + noise[0], "top5": 0.5 - shift + noise[1],
                             "output_error": base - (0.05 if arm == "nova_values" else 0.0) + noise[2]})
    t = nv.ablation_tests(pd.DataFrame(rows))
    assert set(t["family"]) == set(nv.ABLATION_FAMILIES)
    r = t[(t["a"] == "nova") & (t["b"] == "rot_vq") & (t["metric"] == "kl")].iloc[0]
    assert r["units"] == 12 and r["w_r"] == pytest.approx(-1.0)
    assert r["w_p"] == pytest.approx(2 / 2 ** 12)
    fam = t[t["family"] == "transform"]
    assert len(fam) == 4
    from statsmodels.stats.multitest import multipletests

    assert np.allclose(fam["p_holm"], multipletests(fam["w_p"], method="holm")[1])
    assert nv.ablation_verdict(t[t["family"] == "values"].to_dict("records")).verdict == "reproduced"


def test_nova_paired_plan_is_the_rank_plan_of_its_hardest_cell(nv):
    """A direction claim's sample size: per cell a shift of 10% of the reference's error (its |median|, for recall
    the miss rate 1 − median) at the cell's Hodges–Lehmann standard error and per-cell level; oracle: the normal
    closed form n·((z_{α/2} + z_β)·se/Δ)² and MDE (z_{α/2} + z_β)·se over the reference's error."""
    import math

    import scipy.stats

    assert nv.claims.EFFECT == 0.10
    rows = pd.DataFrame([
        {"metric": "kl", "kv_units": 18, "sd_difference": 0.04, "shift_se": 0.002, "median_other": 0.4},
        {"metric": "top5", "kv_units": 18, "sd_difference": 0.2, "shift_se": 0.01, "median_other": 0.6},
        {"metric": "kl", "kv_units": 1, "sd_difference": np.nan, "shift_se": np.nan, "median_other": 0.4}])
    alpha = 0.05 / 40  # Holm's first step over 40 tests
    s = nv.claims.paired_plan(rows, n_col="kv_units", ref_col="median_other", alpha=alpha, what="error")
    z = scipy.stats.norm.isf(alpha / 2) + scipy.stats.norm.ppf(0.8)
    # the top-5 cell: Δ = 0.1·(1 − 0.6) = 0.04, se 0.01: n = 18·(z·0.01/0.04)²; the KL cell needs 18·(z·0.002/0.04)²
    assert s.planned_n == max(math.ceil(18 * (z * 0.01 / 0.04) ** 2), 11)
    assert s.achieved_n == 18 and s.under_powered and "2 cell(s)" in s.test and "a 10% lower error" in s.effect
    assert s.mde == pytest.approx(z * 0.01 / 0.4, rel=1e-9)  # the top-5 cell's, relative to its miss rate
    # an effect 40 sds large (statsmodels' solve gives nan there): the Wilcoxon floor, the fewest pairs whose exact
    # two-sided p can fall below α = 0.05 (2/2^6), and the MDE at the cell's own sd
    from kvstats.study.sample_plans import PairedCell, paired_sample

    tight = paired_sample([PairedCell(18, 0.001)], effect=0.04, alpha=0.05, relative=False, unit="u",
                          effect_words="x")
    assert tight.planned_n == min(n for n in range(2, 20) if 2 / 2 ** n < 0.05) == 6
    from statsmodels.stats.power import TTestPower

    d_z = TTestPower().solve_power(nobs=18 * 3 / math.pi, alpha=0.05, power=0.8)  # α = 0.05: its solver is right
    assert tight.mde == pytest.approx(d_z * 0.001, rel=1e-4)
    # a reference with perfect recall leaves nothing to improve on: a reason, not a plan
    perfect = pd.DataFrame([{"metric": "top5", "kv_units": 18, "sd_difference": 0.05, "shift_se": 0.01,
                             "median_other": 1.0}])
    assert isinstance(nv.claims.paired_plan(perfect, n_col="kv_units", ref_col="median_other", alpha=alpha,
                                            what="error"), str)


def test_nova_bits_verdict_holds_the_printed_number_to_half_a_unit(nv):
    assert nv.bits_verdict(2.224).verdict == "reproduced"  # |2.224 - 2.22| <= 0.005
    v = nv.bits_verdict(2.211)
    assert v.verdict == "not reproduced" and "0 of 1" in v.reason
    assert nv.bits_verdict(2.0, published="2.0").verdict == "reproduced"


def test_nova_parseval_verdict_returns_each_verdict(nv):
    coef = [1.0, 2.0, 4.0]
    assert nv.parseval_verdict(coef, [1.0005, 2.0, 3.999]).verdict == "reproduced"  # within 1e-3 relative
    assert nv.parseval_verdict(coef, [1.0, 2.1, 4.0]).verdict == "partly"
    assert nv.parseval_verdict(coef, [1.1, 2.1, 4.4]).verdict == "not reproduced"


def _calibrated(nv, bits=2, seed=3):
    from kvstats.quant.schemes import NovaScheme

    g = torch.Generator().manual_seed(11)
    scales = torch.linspace(0.2, 3.0, 64)  # an anisotropic key spectrum: the eigen-ranks matter
    q = torch.randn(1, 9, 400, 64, generator=g)
    k = torch.randn(1, 3, 400, 64, generator=g, dtype=torch.float32) * scales
    v = torch.randn(1, 3, 400, 64, generator=g)
    return NovaScheme.calibrate(q, k, v, bits=bits, seed=seed), q, k, v


def test_regrouped_in_the_stratified_order_is_the_calibrated_quantizer(nv):
    """Oracle: regrouping a head into its own order refits exactly the codebooks calibrate() fitted."""
    s, _, k, _ = _calibrated(nv)
    head = s.k.heads[1]
    same = nv.regrouped(head, k[:, 1], head.calibration.ranks)
    assert torch.equal(same.calibration.codebooks, head.calibration.codebooks)
    assert torch.equal(same.calibration.transform, head.calibration.transform)
    x = k[0, 1, :50]
    assert torch.equal(same.decode(same.encode(x)), head.decode(head.encode(x)))
    with pytest.raises(ValueError, match="order must be a permutation"):
        nv.regrouped(head, k[:, 1], torch.zeros(64, dtype=torch.int64))


def test_contiguous_groups_hold_consecutive_eigen_ranks(nv):
    """Contiguous group j holds the eigen-values ranked j·g … j·g + g − 1: its log-volumes are the block sums of
    the sorted spectrum (independent oracle: numpy over the descending eigenvalues)."""
    s, q, k, v = _calibrated(nv)
    c = nv.contiguous(s, k)
    for strat, cont in zip(s.k.heads, c.k.heads):
        lam = np.sort(strat.calibration.eigenvalues.numpy())[::-1]
        want = 0.5 * np.log(lam.reshape(-1, strat.group_dim)).sum(-1)
        np.testing.assert_allclose(cont.calibration.group_log_volumes().numpy(), want, rtol=1e-12)
        # same transform up to the order of its rows
        assert torch.equal(cont.calibration.transform.sum(0), strat.calibration.transform.sum(0)) or \
            torch.allclose(cont.calibration.transform.sum(0), strat.calibration.transform.sum(0), rtol=1e-12)
    code = c.encode(k, v)
    assert c.scores(q[:, :, -2:], code).shape == (1, 9, 2, 400)


#: the fake Gemma 3's sliding window in layer 0 (layer 1 attends in full): of the last 4 of 300 positions
#: (296–299), 296 and 297 still see token 0 and 298, 299 no longer do
FAKE_WINDOW = 298


def _fake_captures(nv):
    """Both texts' Q/K/V of two layers for SmolLM2's shapes and Gemma 3's (4 query / 1 KV heads, d = 256); 300
    tokens: nova's key codebook (2^8 entries at n = 2) needs at least 256 calibration tokens."""
    from kvstats.hf.models import GEMMA3, SMOLLM2

    gen = torch.Generator().manual_seed(5)
    fake = {}
    for model, (hq, hkv, d) in ((SMOLLM2, (9, 3, 64)), (GEMMA3, (4, 1, 256))):
        scales = torch.linspace(0.3, 2.0, d)
        for name in nv.TEXTS:
            for layer in (0, 1):
                fake[(name, layer, model)] = (torch.randn(1, hq, 300, d, generator=gen),
                                              torch.randn(1, hkv, 300, d, generator=gen) * scales,
                                              torch.randn(1, hkv, 300, d, generator=gen))
    return fake


@pytest.mark.slow
def test_nova_runs_through_the_shell_with_rule_verdicts_and_definitions(tmp_path, monkeypatch, nv):
    """The study on fake captures of both models (whatever is installed): SmolLM2's claims, Gemma 3's under their
    own ids, and the sliding-window layer's attention under its window (token 0's mass against scipy)."""
    from kvstats.hf.models import GEMMA3, SMOLLM2

    fake = _fake_captures(nv)
    monkeypatch.setattr(nv.cells, "layer_qkv", lambda name, layer, model=SMOLLM2: fake[(name, layer, model)])
    monkeypatch.setattr(nv.cells, "layer_window",
                        lambda name, layer, model=SMOLLM2: FAKE_WINDOW if model == GEMMA3 and layer == 0 else None)
    monkeypatch.setattr(nv, "ensure_captures", lambda model: None)
    import kvstats.study.models as study_models

    for module in (nv, study_models):  # the analysis asks nv's name, run_models the module's
        monkeypatch.setattr(module, "available_models", lambda scale=None: ([SMOLLM2, GEMMA3], {}))
    for module in (nv, nv.cells, nv.analysis, nv.figures, nv.claims):  # each module that reads BUDGETS
        monkeypatch.setattr(module, "BUDGETS", (2,))
    monkeypatch.setitem(nv.SCALE, "quick", {"layers": (0, 1), "seeds": (0,), "n_q": 4, "insample": False})
    monkeypatch.setenv("KVSTATS_FIGURES_DIR", str(tmp_path / "figures"))
    monkeypatch.setenv("KVSTATS_CELLS_DIR", str(tmp_path / "cells"))
    assert nv.main(["--scale", "quick", "--n-jobs", "1", "--no-progress"]) == 0
    data = tmp_path / "figures" / "data"
    claims = {c["id"]: c for c in read_claims(data / "nova_claims.json")}
    assert claims["nova-ruler-longbench"]["verdict"] == "not testable here"
    assert claims["nova-comparable-throughput"]["verdict"] == "not testable here"
    assert claims["nova-beats-scalar-n2"]["rule"] == "direction"
    assert claims["nova-equal-volume-grouping"]["rule"] == "direction"
    assert claims["nova-bits-per-element"]["rule"] == "identity"
    # the Parseval identity holds on any keys (fp16 T): the rule must say so
    assert claims["nova-generalized-parseval"]["verdict"] == "implementation check"  # holds by construction
    assert all(c["verdict"] != "measured" or c["source"] == "kvstats" for c in claims.values())
    defs = read_definitions(data / "nova_definitions.json")
    assert "r mod G" in defs["grouping"] and "rows srht" in defs["kqv, n = 2"]
    assert str(DEFAULT_RIDGE) in defs["calibration"] or f"{DEFAULT_RIDGE:g}" in defs["calibration"]
    # Gemma 3: its own rows and ids, the model-free rows once, the verdicts compared
    assert claims["nova-beats-scalar-n2-gemma3"]["rule"] == "direction"
    assert claims["nova-beats-scalar-n2-gemma3"]["data"].startswith("Gemma-3-270M (head dim 256)")
    assert "1 of the 2 layers within their 298-token sliding window" in claims["nova-beats-scalar-n2-gemma3"]["data"]
    assert "nova-bits-per-element-gemma3" not in claims and "nova-ruler-longbench-gemma3" not in claims
    assert claims["nova-models"]["verdict"] == "measured"
    # every claim's sample size: a plan, a reason none applies, or a label that tests nothing
    labels = ("measured", "not testable here", "implementation check")
    assert all(c["sample"] or c["verdict"] in labels for c in claims.values())
    assert claims["nova-bits-per-element"]["sample"].startswith("none planned")
    for cid in ("nova-beats-scalar-n2", "nova-equal-volume-grouping", "nova-ablation-transform",
                "nova-value-transform", "nova-rotations-equalize"):
        assert claims[cid]["sample"]["achieved_n"] == 6 and claims[cid]["sample"]["unit"] == "(layer, KV head) units"
    assert "Holm over 20 tests" in claims["nova-beats-scalar-n2"]["sample"]["test"]  # 4 baselines × 5 metrics
    assert "unit (Gemma-3-270M)" in defs
    units = pd.read_csv(data / "nova_gemma3_units.csv")
    assert set(units["window"]) == {0, FAKE_WINDOW}
    # token 0's attention mass under the banded causal mask, against scipy's float64 softmax
    import scipy.special

    q, k, _ = fake[(nv.TEXTS[1], 0, GEMMA3)]
    logits = (q[0, :, -4:].double() @ k[0, 0].double().T / 16.0).numpy()  # [4 heads, 4 queries, 300]
    pos, keys = np.arange(296, 300)[:, None], np.arange(300)[None]
    band = (keys <= pos) & (keys > pos - FAKE_WINDOW)
    mass = scipy.special.softmax(np.where(band, logits, -np.inf), axis=-1)[..., 0].mean(-1)  # per head
    got = units[(units["layer"] == 0) & (units["scheme"] == "nova")].sort_values("head")["sink_mass"].to_numpy()
    np.testing.assert_allclose(got, mass, rtol=1e-5)  # the CSV keeps 6 significant digits (≤ 5e-6 relative)
    assert mass.min() > 0 and not band[2:, 0].any()  # two queries see token 0, two do not: the band matters
    # the sink's errors over the layers that attend token 0 (the full-attention one), from the unit rows
    sink = claims["nova-attention-sink-gemma3"]["measurement"]
    full = units[(units["window"] == 0) & (units["scheme"] == "nova") & (units["n"] == 2)]
    assert (f"full-attention layers): nova {full['abs_logit_err_sink'].median():.2f} vs "
            f"{full['abs_logit_err_rest'].median():.2f}") in sink
    assert "in the 1 sliding-window layers keeping token 0 exact changes nothing" in sink


def test_layer_window_reads_the_captures_rule_and_refuses_what_it_cannot_measure(nv, monkeypatch):
    """nova's layer rule from a capture's metadata: the window of a sliding layer, None for full attention; a
    scaling other than 1/sqrt(d), a soft cap, or a model with sliding layers whose capture records no rule for the
    layer are refused by name."""
    from types import SimpleNamespace

    from kvstats.hf.models import GEMMA3, SMOLLM2

    def capture(attention, d=256, **meta):
        f = SimpleNamespace(metadata={"attention": attention, **meta}, keys=lambda layer: torch.zeros(1, 1, 4, d))
        monkeypatch.setattr(nv.cells, "_file", lambda name, model=SMOLLM2: f)

    capture([{"layer": 0, "scaling": 1 / 16, "softcap": None, "sliding_window": 512},
             {"layer": 1, "scaling": 1 / 16, "softcap": None, "sliding_window": None}])
    assert nv.cells.layer_window("x", 0, GEMMA3) == 512 and nv.cells.layer_window("x", 1, GEMMA3) is None
    capture([{"layer": 0, "scaling": 0.1, "softcap": None, "sliding_window": None}])
    with pytest.raises(ValueError, match="layer 0 scales its logits by 0.1, not 1/sqrt"):
        nv.cells.layer_window("x", 0, GEMMA3)
    capture([{"layer": 0, "scaling": 1 / 16, "softcap": 50.0, "sliding_window": None}])
    with pytest.raises(ValueError, match="soft-caps its logits"):
        nv.cells.layer_window("x", 0, GEMMA3)
    capture([])
    with pytest.raises(ValueError, match="15 sliding-window layers but the capture .* no attention rule for layer 3"):
        nv.cells.layer_window("constitution_lincoln", 3, GEMMA3)
    capture([], d=64)  # SmolLM2: full attention everywhere, an older capture without rules reads as 1/sqrt(d)
    assert nv.cells.layer_window("x", 3, SMOLLM2) is None


# ------------------------------------------------------------------------------------------ end_to_end


def _row(p, r, b="kqv", metric="out_kl", n=2):
    return {"p": p, "p_holm": p, "r": r, "b": b, "metric": metric, "n": n}


def test_e2e_direction_verdict_returns_each_verdict(e2e):
    # NOVA lower than each baseline: r of nova - baseline < 0
    assert e2e.direction_verdict([_row(1e-3, -1.0), _row(0.01, -0.7, "mse")], -1, "cells").verdict == "reproduced"
    v = e2e.direction_verdict([_row(1e-3, -1.0), _row(0.01, +0.7, "minmax")], -1, "cells")
    assert v.verdict == "partly" and "minmax on out_kl at n = 2" in v.reason
    assert e2e.direction_verdict([_row(0.3, -1.0), _row(0.01, +0.7)], -1, "cells").verdict == "not reproduced"
    # the rule reads the claim's Holm-adjusted p, not the raw one
    assert e2e.direction_verdict([_row(0.01, -1.0) | {"p_holm": 0.2}], -1, "cells").verdict == "inconclusive"


def test_e2e_paired_tests_holm_over_the_claims_family(e2e):
    import pandas as pd
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(0)
    rows = [{"scheme": s, "n": 2, "window": 0, "segment": i, "out_kl": rng.random() + (0.2 if s == "qkqv" else 0),
             "attn_kl": rng.random()} for s in ("kqv", "qkqv") for i in range(12)]
    t = e2e.paired_tests(pd.DataFrame(rows), [("qkqv", "kqv")], metrics=("out_kl", "attn_kl"), resamples=99)
    assert len(t) == 2
    np.testing.assert_allclose(t["p_holm"], multipletests(t["p"], method="holm")[1])


def _walsh_shift_se(d) -> float:
    """The Hodges–Lehmann shift's standard error by hand: the distribution-free 95% interval of the Walsh averages
    the signed-rank test inverts to, [W(k+1), W(N−k)], over 2·z_.975."""
    import math

    import scipy.stats

    n, z = len(d), scipy.stats.norm.isf(0.025)
    walsh = sorted((d[i] + d[j]) / 2 for i in range(n) for j in range(i, n))
    k = math.floor(len(walsh) / 2 - z * math.sqrt(n * (n + 1) * (2 * n + 1) / 24))
    return (walsh[len(walsh) - 1 - k] - walsh[k]) / (2 * z)


def test_e2e_direction_sample_plans_the_hardest_cell_at_holms_first_step(e2e):
    """A direction claim's sample (issue 50): each paired_tests row a Wilcoxon cell at α/m (m = 2 here) planned on
    its Hodges–Lehmann shift's standard error se: n = ⌈16·((z_{1−α/2m} + z_.8)·se/(QKQV_EFFECT·mean(KQV)))²⌉; the
    claim's planned n is the hardest cell's."""
    import math

    import scipy.stats

    rng = np.random.default_rng(1)
    kqv = {m: rng.uniform(0.5, 1.5, 16) for m in ("out_kl", "attn_kl")}
    noise = {"out_kl": 0.3, "attn_kl": 0.05}
    rows = [{"scheme": s, "n": 2, "seed": 0, "window": 0, "segment": i,
             **{m: kqv[m][i] + (rng.normal(0.2, noise[m]) if s == "qkqv" else 0.0) for m in kqv}}
            for s in ("kqv", "qkqv") for i in range(16)]
    t = e2e.paired_tests(pd.DataFrame(rows), [("qkqv", "kqv")], metrics=("out_kl", "attn_kl"), resamples=99)
    sample = e2e.claims.direction_sample(t, e2e.claims.QKQV_EFFECT, "10% above")
    expected = []
    for r in t.itertuples():
        d = np.array([rows[16 + i][r.metric] - rows[i][r.metric] for i in range(16)])
        assert r.sd_difference == pytest.approx(np.std(d, ddof=1))
        assert r.shift_se == pytest.approx(_walsh_shift_se(d))
        mde = (scipy.stats.norm.isf(e2e.analysis.ALPHA / 4) + scipy.stats.norm.ppf(0.8)) * r.shift_se
        expected.append(math.ceil(16 * (mde / (e2e.claims.QKQV_EFFECT * abs(r.mean_b))) ** 2))
    assert sample.planned_n == max(expected) > 16 and sample.achieved_n == 16 and sample.unit == "segments"
    assert "α = 0.025 per cell, hardest of 2 cell(s)" in sample.test and "Hodges–Lehmann" in sample.test
    assert sample.mde is not None


def test_e2e_ratio_verdict_is_the_number_rule_on_the_printed_ratio(e2e):
    assert e2e.ratio_verdict(2.3, 2.1, 2.4).verdict == "reproduced"           # 2.25 inside the CI
    assert e2e.ratio_verdict(1.6, 1.4, 1.8).verdict == "partly"               # outside, but above 1
    assert e2e.ratio_verdict(1.0, 0.8, 1.2).verdict == "not reproduced"       # the direction fails
    assert e2e.ratio_verdict(2.2, 2.1, 2.246).verdict == "partly"             # no slack from the printed digits


def test_e2e_segments_are_disjoint_round_robin_and_inside_one_document(e2e):
    from kvstats.evaluation.model_engine import round_robin_segments

    got = round_robin_segments({"a": 10, "b": 25, "c": 3}, 4)
    assert got == [("a", 0), ("b", 0), ("a", 4), ("b", 4), ("b", 8), ("b", 12), ("b", 16), ("b", 20)]
    assert round_robin_segments({"a": 10, "b": 25}, 4, 3) == [("a", 0), ("b", 0), ("a", 4)]
    with pytest.raises(ValueError, match="fewer than 9"):
        round_robin_segments({"a": 10, "b": 25}, 4, 9)
    docs = e2e.documents()
    assert list(docs) == list(e2e.DOCUMENTS)
    text = "\n".join(docs.values())
    assert sum(len(d) for d in docs.values()) <= len(text) and all(d.startswith(t) for t, d in docs.items())


def test_e2e_paired_tests_pair_segments_across_schemes(e2e):
    """Wilcoxon over segments: a scheme lower on every one of 8 segments gives r = -1 and the exact p = 2/2^8."""
    rows = []
    for seg in range(8):
        for scheme, kl in (("nova", 0.1 + 0.01 * seg), ("kqv", 0.5 + 0.02 * seg)):
            rows.append({"scheme": scheme, "n": 2, "seed": 0, "window": 0, "segment": seg, "out_kl": kl})
    t = e2e.paired_tests(pd.DataFrame(rows), [("nova", "kqv")], metrics=("out_kl",)).iloc[0]
    assert t["r"] == -1.0 and t["p"] == pytest.approx(2 / 2 ** 8) and t["segments"] == 8


def test_e2e_mse_scheme_is_turbo_mse_on_both(e2e):
    from kvstats.evaluation.layer_schemes import build_scheme

    s = build_scheme("mse", 3, 7, dim=e2e.cells.HEAD_DIM, rows=e2e.cells.QJL_ROWS)
    assert s.k.name == s.v.name == "turbo_mse" and s.k.seed != s.v.seed and s.bits == 3


@pytest.mark.slow
def test_e2e_runs_through_the_shell_at_a_tiny_scale(tmp_path, monkeypatch, e2e, smollm2):
    import kvstats.evaluation.layer_schemes as layer_schemes
    from kvstats.evaluation.layer_schemes import nova_layers
    from kvstats.study.sweep import cell_seed

    tiny = {"segment_tokens": 12, "segments": 6, "budgets": (2,), "seeds": (0,), "windows": (0, 4),
            "window_budget": 2, "calibration_tokens": 300, "nova_budgets": (2,), "qjl_budgets": (2,), "prompts": (0,),
            "gen_budgets": (2,), "prompt_len": 8, "new": 3, "agree_tokens": 12, "resamples": 99,
            "formats": (("int_token", 2), ("fp8_e4m3", 8))}
    monkeypatch.setattr(e2e.cells, "SCHEMES", ("kqv", "qkqv", "minmax", "mse", "nova"))
    monkeypatch.setattr(layer_schemes, "_calibration_folder", lambda: tmp_path / "nova")
    nova_layers.cache_clear()
    monkeypatch.setitem(e2e.SCALE, "quick", tiny)
    monkeypatch.setenv("KVSTATS_FIGURES_DIR", str(tmp_path / "figures"))
    monkeypatch.setenv("KVSTATS_CELLS_DIR", str(tmp_path / "cells"))
    assert e2e.main(["--scale", "quick", "--n-jobs", "1", "--no-progress"]) == 0
    data = tmp_path / "figures" / "data"
    claims = {c["id"]: c for c in read_claims(data / "end_to_end_claims.json")}
    assert claims["e2e-nova-2bit-output"]["rule"] == "direction"
    assert claims["e2e-qkqv-worse-than-kqv"]["rule"] == "direction"
    # every verdict by a test records its sample size (issue 50): 6 segments achieved
    tested = [c for c in claims.values() if c["rule"] not in ("measured", "not testable", "implementation check")]
    assert tested and all(isinstance(c["sample"], dict) and c["sample"]["achieved_n"] == 6 for c in tested)
    assert "6 disjoint segments of 12 tokens" in claims["e2e-nova-2bit-output"]["data"]
    # QJL's cache ran in its own sweep and is compared with min-max at its budget
    assert claims["qjl-cache-smollm2"]["rule"] == "direction" and "n = 2" in claims["qjl-cache-smollm2"]["measurement"]
    # the deployed formats in their own sweep: bits held their closed forms at d = 64 (int2 per token-head: 2 + an
    # fp16 scale and zero per 64 elements = 2.5; fp8 e4m3 with unity scale: 8), int_token@2 tested against the three
    # same-n schemes on two metrics, fp8_e4m3@8 against none (no scheme at n = 8)
    formats = pd.read_csv(data / "end_to_end_formats.csv").set_index("scheme")
    assert formats.loc["int_token", "bits_per_element"] == 2.5 and formats.loc["fp8_e4m3", "bits_per_element"] == 8
    assert claims["e2e-formats"]["verdict"] == "measured"
    assert "of 3 same-n comparisons" in claims["e2e-formats"]["reason"]
    assert "int_token@2: 2.5 bits held" in claims["e2e-formats"]["measurement"]
    segs = pd.read_csv(data / "end_to_end_segments.csv")
    # every scheme saw the same 6 segments; the lossless control is exact to fp32 rounding
    assert segs.groupby(["scheme", "n", "window"])["segment"].nunique().eq(6).all()
    assert claims["e2e-lossless-control"]["verdict"] == "measured"
    ctrl = segs[segs["scheme"] == "identity"]
    assert ctrl["out_kl"].max() < 1e-6
    defs = read_definitions(data / "end_to_end_definitions.json")
    assert "12 consecutive tokens" in defs["unit"] and defs["mse"].startswith("K turbo_mse")
    # Gemma 3 270M (where its package is installed): its own sweep, its claims judged by the same rules, a row that
    # compares the two models' verdicts; without it, a row that says so
    from kvstats.study.models import missing_reason

    if missing_reason("gemma3-270m") is None:
        assert claims["e2e-qkqv-worse-than-kqv-gemma3"]["rule"] == "direction"
        assert "Gemma-3-270M" in claims["qjl-cache-gemma3"]["measurement"]
        assert "d = 256" in claims["e2e-qkqv-worse-than-kqv-gemma3"]["data"]
        gemma = pd.read_csv(data / "end_to_end_gemma3.csv")
        assert gemma[gemma["scheme"] == "identity"]["out_kl"].max() < 1e-6  # lossless through its cache
        assert set(gemma["scheme"]) == {"kv", "kqv", "qkqv", "minmax", "mse", "nova", "qjl", "identity",
                                        "int_token", "fp8_e4m3"}
        # the deployed formats on Gemma's segments: int2 per token-head holds 2 + 32/256 bits at d = 256
        g_formats = gemma.set_index("scheme")
        assert g_formats.loc["int_token", "bits_per_element"] == 2.125
        assert g_formats.loc["fp8_e4m3", "bits_per_element"] == 8
        # the two attention paths read one code alike on every Gemma layer (d = 256, one KV head for four queries)
        paths = pd.read_csv(data / "end_to_end_gemma3_paths.csv")
        assert len(paths) == 3 * 18 and paths["max_abs_diff"].max() <= 1e-9
        assert claims["e2e-estimator-equals-decode-gemma3"]["data"].startswith("Gemma-3-270M's captured")
        assert "54/54 (scheme, layer) calls" in claims["e2e-estimator-equals-decode-gemma3"]["measurement"]
        # the full-precision window on Gemma: every scheme of its sweep at the window budget, W = 0 against W = 4
        assert claims["e2e-window-gemma3"]["measurement"].startswith("Gemma-3-270M: mean next-token KL with W = 0")
        assert {"kv", "kqv", "qkqv", "minmax", "mse"} <= set(gemma[gemma["window"] == 4]["scheme"])
        measured = claims["e2e-formats-gemma3"]["measurement"]
        assert measured.startswith("Gemma-3-270M: ") and "int_token@2: 2.12 bits held" in measured
        assert claims["e2e-nova-2bit-output-gemma3"]["rule"] == "direction"
        assert claims["end-to-end-models"]["verdict"] == "measured"
        assert "head dim 64 vs 256" in claims["end-to-end-models"]["details"]
        assert (tmp_path / "figures" / "end_to_end_models.png").is_file()
    else:
        assert claims["end-to-end-gemma3-rows"]["verdict"] == "not testable here"
    # NOVA-KV's calibration was stored once per model and reloads to the same codes
    stored = list((tmp_path / "nova").glob("nova_calibration_*.pt"))
    assert len(stored) == (2 if missing_reason("gemma3-270m") is None else 1)
    root = cell_seed(e2e.STUDY, "nova", 2, 0)  # the cell seed end_to_end spawns the layers' seeds from
    fitted = nova_layers(2, root, 300)
    nova_layers.cache_clear()
    loaded = nova_layers(2, root, 300)
    assert loaded is not fitted and len(loaded) == 30
    k = torch.randn(1, 3, 5, 64, generator=torch.Generator().manual_seed(2))
    assert torch.equal(loaded[7].k.decode(loaded[7].k.encode(k)), fitted[7].k.decode(fitted[7].k.encode(k)))
    nova_layers.cache_clear()


@pytest.mark.slow
def test_e2e_generation_cell_batches_prompts_each_row_its_own(e2e, smollm2):
    # one batched generate for every prompt: each row must carry its own prompt's exact greedy continuation
    # (oracle: a single-prompt model.generate of the exact model) and, with a lossless cache, reproduce it
    from kvstats.evaluation.model_engine import set_attention, shared_model

    model, tokenizer, _ = shared_model()
    set_attention(model, "sdpa")
    offsets, prompt_len, new = (0, 40), 8, 4
    rows = e2e.generation_cell("identity", 0, 0, 0, list(offsets), prompt_len, new, None)
    assert [r["offset"] for r in rows] == list(offsets)
    for r, o in zip(rows, offsets):
        prompt = e2e._heldout_ids()[:, o:o + prompt_len]
        set_attention(model, "sdpa")
        with torch.inference_mode():
            single = model.generate(prompt, max_new_tokens=new, do_sample=False,
                                    attention_mask=torch.ones_like(prompt))[0, prompt_len:]
        assert r["reference_text"] == tokenizer.decode(single.tolist())
        assert r["text"] == r["reference_text"] and r["tokens_before_divergence"] == new
        assert abs(r["fp_nll"] - r["fp_nll_reference"]) < 1e-6
        with torch.inference_mode():
            full = torch.cat([prompt, single[None]], dim=1)
            logp = torch.log_softmax(model(full).logits[0, prompt_len - 1:-1].double(), dim=-1)
        assert abs(r["fp_nll_reference"] + float(logp.gather(-1, single[:, None]).mean())) < 1e-4


def test_e2e_baseline_claim_tabulates_per_segment_means(e2e):
    """The baselines claim averages tokens within a segment, then segments (the units), with a cluster bootstrap
    CI (documents, then segments) that contains that mean; kvstats' own schemes at the same budgets stand beside
    them."""
    rng = np.random.default_rng(0)
    rows = []
    for seg in range(4):
        for t in range(3):
            rows.append({"kind": "token", "backend": "quanto", "n": 2, "residual_length": 16, "segment": seg,
                         "t": t, "out_kl": float(seg + t), "top1": float(t % 2), "nll": 2.0 + seg, "nll_ref": 2.0})
    rows.append({"kind": "cell", "backend": "quanto", "n": 2, "residual_length": 16, "segment_tokens": 3})
    base = pd.DataFrame(rows)
    segs = pd.DataFrame({"scheme": ["kqv"] * 4 + ["kqv"] * 4, "n": [2] * 4 + [4] * 4, "seed": 0,
                         "window": 0, "segment": list(range(4)) * 2,
                         "out_kl": rng.random(8), "d_nll": rng.random(8), "top1": rng.random(8)})
    claim = e2e.baseline_claim(base, segs, {"resamples": 999}, {0: "a", 1: "a", 2: "b", 3: "c"})
    # segment means of out_kl: seg + 1 -> mean over segments 2.5; d_nll: seg -> 1.5; top1: 1/3
    assert "quanto n = 2 residual 16: 2.5" in claim["measurement"]
    line = next(x for x in claim["details"].splitlines() if x.startswith("| transformers quanto"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1] == "2" and cells[2].startswith("2.5000 [") and cells[3] == "+1.5000" and cells[4] == "0.333"
    lo, hi = (float(v) for v in cells[2].split("[")[1].rstrip("]").split(","))
    assert lo <= 2.5 <= hi and lo >= 1.0 and hi <= 4.0
    ours = [x for x in claim["details"].splitlines() if x.startswith("| kvstats kqv")]
    assert len(ours) == 1 and f"{segs['out_kl'][:4].mean():.4f}" in ours[0]  # only n = 2, the baselines' budget
    assert claim["verdict"].verdict == "measured"


def test_rotated_top_energy_against_scipy(nv):
    """The rotated coordinate variances of M = Σ_Q^{1/2} C_K Σ_Q^{1/2}: oracle by scipy (sqrtm, np.cov) on the same
    rotation; their total is trace(M) = the sum of the calibration's eigenvalues (T diagonalises M)."""
    import scipy.linalg

    from kvstats.quant.quantizers.nova import NovaQuantizer
    from kvstats.quant.rotations import make_rotation

    g = torch.Generator().manual_seed(0)
    d = 16
    q = torch.randn(400, d, generator=g, dtype=torch.float64) * torch.linspace(3, 0.2, d, dtype=torch.float64)
    k = torch.randn(500, d, generator=g, dtype=torch.float64) * torch.linspace(0.3, 2, d, dtype=torch.float64)
    head = NovaQuantizer(2, d, seed=0, ridge=0.0).calibrate(q, k)
    share = nv.rotated_top_energy(head, k, seed=5, top=4)
    sigma = head.calibration.sigma_q.double().numpy()
    root = np.real(scipy.linalg.sqrtm(sigma))
    m = root @ np.cov(k.numpy().T, bias=True) @ root
    r = make_rotation("wht", d, 5).matrix().double().numpy()
    variances = np.sort(np.diag(r @ m @ r.T))[::-1]
    assert share == pytest.approx(variances[:4].sum() / variances.sum(), rel=1e-9)
    assert variances.sum() == pytest.approx(float(head.calibration.eigenvalues.sum()), rel=1e-6)


def test_spectrum_claim_returns_each_verdict(nv):
    from types import SimpleNamespace

    def claim(rot, klt):
        pars = pd.DataFrame({"d": 64, "top8_energy_rotated": rot, "top8_energy": klt})
        return nv.spectrum_claim(SimpleNamespace(pars=pars, data="synthetic", model="smollm2")).verdict.verdict

    rot = np.linspace(0.13, 0.16, 12)   # near the equal share 8/64 = 0.125, below 2 × 0.125
    klt = np.linspace(0.55, 0.75, 12)  # 12 pairs of one sign: exact Wilcoxon p = 2/4096
    assert claim(rot, klt) == "reproduced"
    assert claim(np.r_[rot[:-1], 0.3], klt) == "partly"          # one unit far from equal, compaction holds
    assert claim(klt, rot) == "not reproduced"                   # the rotation compacts, T spreads
