"""kvstats.evaluate: per-unit metrics against a float64 recomputation, units, CIs, checks before measuring,
measured bits, the comparison's family and plan, files and errors."""

import json
import math
import re
import sys
import textwrap

import numpy as np
import pytest
import scipy.stats
import torch

import kvstats
from kvstats._random import spawn_seeds, unit_seed
from kvstats.data.io import save_qkv
from kvstats.data.synthetic import generate
from kvstats.evaluation.comparison import plan_comparison, units_needed
from kvstats.evaluation.evaluator import (
    METRICS,
    InconclusiveWarning,
    QuantizerCheckError,
    evaluate,
    resolve_scheme,
)
from kvstats.measure.stats import InferenceOptions
from kvstats.quant.quantizers import BitBudget
from tests.helpers.quantizers import Int4PerToken as Int4  # symmetric per-token int4: 4 + 32/d bits

SMALL = dict(dim=32, kv_heads=1, q_heads=2, seq=48, n_q=8, inference=InferenceOptions(n_resamples=999))


def _kl_and_recall_fp64(q, k, scores_hat, top_k, causal=False, scale=None):
    """Independent oracle: softmax KL and top-k recall written out in float64 (no kvstats metric code)."""
    q, k, s_hat = q.double(), k.double(), scores_hat.double()
    g = q.shape[1] // k.shape[1]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.einsum("bhnd,bhsd->bhns", q, k.repeat_interleave(g, dim=1)) * scale
    if causal:
        n, m = s.shape[-2:]
        mask = torch.ones(n, m, dtype=torch.bool).tril(m - n)
        s, s_hat = s.masked_fill(~mask, -math.inf), s_hat.masked_fill(~mask, -math.inf)
    p, lp, lq = s.softmax(-1), s.log_softmax(-1), s_hat.log_softmax(-1)
    kl = torch.nan_to_num(p * (lp - lq)).sum(-1).mean().item()
    kk = min(top_k, s.shape[-1])
    top = s.topk(kk, dim=-1).indices
    top_hat = s_hat.topk(kk, dim=-1).indices
    hits = (top.unsqueeze(-1) == top_hat.unsqueeze(-2)).any(-1).sum(-1).double() / kk
    return kl, hits.mean().item()


def _strict_json(text: str):
    """A strict parser: NaN, Infinity and -Infinity are refused, as JSON.parse refuses them."""
    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def test_unit_metrics_match_fp64_oracle():
    ev = evaluate("turbo_prod", bits=3, data="gaussian", units=3, seed=5, **SMALL)
    assert [u["unit"] for u in ev.units] == [0, 1, 2]
    for i in range(3):
        q, k, v = generate("gaussian", 1, 1, 48, 32, unit_seed(5, i), q_heads=2, n_q=8)  # spawned unit seeds
        k_seed, _ = spawn_seeds(unit_seed(5, i), 2)
        kq = kvstats.quantizer("turbo_prod", bits=3, dim=32, seed=k_seed)
        s_hat = kq.inner(q.reshape(1, 1, 16, 32), kq.encode(k)).reshape(1, 2, 8, 48) / math.sqrt(32)
        kl, recall = _kl_and_recall_fp64(q, k, s_hat, top_k=5)
        assert ev.units[i]["attention_kl"] == pytest.approx(kl, rel=1e-4, abs=1e-7)
        assert ev.units[i]["topk_recall"] == pytest.approx(recall, abs=1e-12)
        # bytes per vector by hand: 2-bit indices ceil(32·2/8) = 8, signs 32/8 = 4, two fp32 norms 8 -> 20 bytes
        assert ev.units[i]["bits_total"] == pytest.approx(8 * 20 / 32, abs=1e-12)


def test_summary_is_the_mean_over_units_with_a_studentized_bootstrap_interval():
    ev = evaluate("turbo_mse", bits=2, data="heavy_tail", units=6, **SMALL)
    assert set(ev.summary) == set(METRICS)
    for m, r in ev.summary.items():
        values = np.array([u[m] for u in ev.units])
        assert r.statistic == pytest.approx(values.mean(), rel=1e-12)
        assert r.n == 6
        if np.ptp(values) == 0:
            assert tuple(r.confidence_interval) == (r.statistic, r.statistic)
            continue
        assert r.ci_method == "studentized bootstrap"
        assert r.standard_error == pytest.approx(values.std(ddof=1) / math.sqrt(6), rel=1e-12)
        assert r.confidence_interval.low < r.statistic < r.confidence_interval.high
    assert "attention_kl" in ev.table() and "6 units" in ev.table()


def test_module_class_spec_and_scheme_spec():
    a = resolve_scheme("kvstats.quantizers:TurboMSE", bits=3, dim=32, seed=1)
    b = resolve_scheme("turbo_mse", bits=3, dim=32, seed=1)
    x = torch.randn(1, 1, 10, 32, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a.k.decode(a.k.encode(x)), b.k.decode(b.k.encode(x)), rtol=0, atol=0)
    assert resolve_scheme("kqv", bits=3, dim=32).k.name == "turbo_mse"
    with pytest.raises(ValueError, match="quantizer"):
        resolve_scheme("no_such_thing", bits=3, dim=32)
    with pytest.raises(ValueError, match="cannot import"):
        resolve_scheme("kvstats.quantizers:NoSuchClass", bits=3, dim=32)


@pytest.mark.parametrize("spec", [":", ":TurboMSE", "kvstats.quantizers:", "kvstats.quantizers:Turbo MSE"])
def test_a_module_attribute_spec_without_both_parts_is_refused_naming_the_argument(spec):
    for role, call in (("quantizer", lambda: evaluate(spec, bits=3, data="gaussian", units=2, **SMALL)),
                       ("compare", lambda: evaluate("kqv", bits=3, data="gaussian", units=2, compare=spec, **SMALL))):
        with pytest.raises(ValueError, match=rf"^{role} must be 'module:attribute' .*got {re.escape(repr(spec))}"):
            call()


def _capture(tmp_path, tokens=64, d=16, layers=2, seed=3, **meta):
    gen = torch.Generator().manual_seed(seed)
    tensors = [tuple(torch.randn(1, h, tokens, d, generator=gen) for h in (2, 1, 1)) for _ in range(layers)]
    path = save_qkv(tmp_path / "cap.safetensors", tensors, {"model": "random", "n_tokens": tokens, **meta})
    return path, tensors


def test_capture_file_units_are_disjoint_windows(tmp_path):
    path, layers = _capture(tmp_path)
    out = tmp_path / "res" / "eval.json"
    ev = evaluate("turbo_mse", bits=3, data=path, units=None, window=16, out=out,
                  inference=InferenceOptions(n_resamples=999))
    assert len(ev.units) == 4  # 64 tokens / 16
    # unit 1 = tokens 16..31 of both layers, causal within the window, mean over layers
    scheme = resolve_scheme("turbo_mse", bits=3, dim=16, seed=unit_seed(0, 1))  # unit 1's spawned seed
    kls = []
    for q, k, v in layers:
        sl = slice(16, 32)
        s_hat = scheme.scores(q[:, :, sl], scheme.encode(k[:, :, sl], v[:, :, sl])) / 4.0
        kls.append(_kl_and_recall_fp64(q[:, :, sl], k[:, :, sl], s_hat, 5, causal=True)[0])
    assert ev.units[1]["attention_kl"] == pytest.approx(np.mean(kls), rel=1e-4)
    saved = _strict_json(out.read_text())
    assert saved["config"]["units"] == 4 and len(saved["units"]) == 4
    assert saved["summary"]["attention_kl"]["statistic"] == pytest.approx(ev.summary["attention_kl"].statistic)
    with pytest.raises(ValueError, match="units must be at most 4"):
        evaluate("turbo_mse", bits=3, data=path, units=5, window=16)
    with pytest.raises(ValueError, match=r"layers must name at least one stored layer"):
        evaluate("turbo_mse", bits=3, data=path, window=16, layers=[])


def test_a_capture_of_one_text_says_its_windows_are_not_independent_draws(tmp_path):
    """Windows of one text share it: the table says so (the units, the scope of its p-values and intervals, how to
    generalise); synthetic draws are independent and get no such note."""
    path, _ = _capture(tmp_path)
    ev = evaluate("turbo_mse", bits=3, data=path, window=16, inference=InferenceOptions(n_resamples=999))
    assert ev.config["inference_units"] == "windows of one text"
    flat = " ".join(ev.table().split())  # unwrapped
    assert ("! the 4 units are windows of one text: they are not independent draws; the intervals and p-values "
            "describe this text, not texts in general") in flat and "capture several documents" in flat
    synthetic = evaluate("turbo_mse", bits=3, data="gaussian", units=3, **SMALL)
    assert synthetic.config["inference_units"] == "independent draws"
    assert "windows of one text" not in synthetic.table() and "not independent" not in synthetic.table()


def test_capture_softmax_scale_is_the_models(tmp_path):
    """A capture records attn_scaling (Gemma's query_pre_attn_scalar, ...): the logits use it, not 1/√d."""
    path, layers = _capture(tmp_path, attn_scaling=0.6)
    ev = evaluate("turbo_mse", bits=2, data=path, window=32, inference=InferenceOptions(n_resamples=999))
    assert ev.config["softmax_scale"] == 0.6
    scheme = resolve_scheme("turbo_mse", bits=2, dim=16, seed=unit_seed(0, 0))
    kls = []
    for q, k, v in layers:
        sl = slice(0, 32)
        s_hat = scheme.scores(q[:, :, sl], scheme.encode(k[:, :, sl], v[:, :, sl])) * 0.6
        kls.append(_kl_and_recall_fp64(q[:, :, sl], k[:, :, sl], s_hat, 5, causal=True, scale=0.6)[0])
    assert ev.units[0]["attention_kl"] == pytest.approx(np.mean(kls), rel=1e-4)


# ------------------------------------------------------------------------------------------ the comparison


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::kvstats.evaluation.results.InconclusiveWarning")
def test_compare_is_paired_over_a_family_of_distinct_metrics_and_holm_corrected():
    ev = evaluate("kqv", bits=3, data="gaussian", units=8, compare="qkqv", **SMALL)
    # K differs (turbo_mse vs turbo_prod); V is turbo_prod with the same seed in both: its errors are equal;
    # 6d_attention_kl repeats attention_kl (linear estimators); bits_total is never tested
    assert set(ev.excluded) == {"6d_v_direction", "6d_v_norm", "6d_attention_kl", "bits_total"}
    family = [m for m in METRICS if m not in ev.excluded]
    assert list(ev.comparison) == family
    raw = [scipy.stats.wilcoxon([u[m] for u in ev.units], [u[f"other:{m}"] for u in ev.units]).pvalue
           for m in family]
    order = np.argsort(raw)  # Holm by hand: p_(i)·(m - i), running maximum, at most 1
    holm = np.empty(len(raw))
    running = 0.0
    for rank, j in enumerate(order):
        running = max(running, min(1.0, raw[j] * (len(raw) - rank)))
        holm[j] = running
    for m, p, h in zip(family, raw, holm):
        c = ev.comparison[m]
        assert c["test"].pvalue == pytest.approx(p, rel=1e-9)
        assert c["pvalue_holm"] == pytest.approx(h, rel=1e-9)
        assert c["significant"] == (h < 0.05)
    table = ev.table()
    assert "p (Holm)" in table and "B mean" in table and "rank-biserial of A − B" in table
    assert "A = kqv at 3 bits" in table and "B = qkqv: budget n = 3" in table
    same = evaluate("kqv", bits=3, data="gaussian", units=3, compare="kqv", **SMALL)
    assert same.comparison == {}  # equal in every unit: nothing to test


@pytest.mark.slow
def test_the_documented_comparison_concludes_with_default_units():
    ev = evaluate("kqv", bits=4, data="gaussian", compare="qkqv")
    assert len(ev.units) == 16 and ev.plan.can_conclude
    assert ev.comparison["attention_kl"]["pvalue_holm"] < 0.05


@pytest.mark.slow
def test_a_comparison_that_cannot_conclude_says_so_with_the_units_needed():
    # oracle: the smallest two-sided p of scipy's exact Wilcoxon at n pairs is that of n positive differences
    floor = {n: scipy.stats.wilcoxon(np.arange(1.0, n + 1)).pvalue for n in (8, 9)}
    assert plan_comparison(8, 7, 0.05).smallest_pvalue == pytest.approx(7 * floor[8], rel=1e-12)
    assert 7 * floor[8] >= 0.05 > 7 * floor[9] and units_needed(7, 0.05) == 9
    with pytest.warns(InconclusiveWarning, match=r"needs at least 9 units: pass units=9 \(--units 9\)"):
        ev = evaluate("kqv", bits=3, data="gaussian", units=8, compare="qkqv", **SMALL)
    assert not ev.plan.can_conclude and ev.plan.family_size == 7  # before running: 7 candidate metrics
    assert ev.family_plan.family_size == 5 and ev.family_plan.can_conclude  # 2 V metrics turned out equal
    with pytest.warns(InconclusiveWarning):
        few = evaluate("kqv", bits=3, data="gaussian", units=5, compare="qkqv", **SMALL)
    assert not few.family_plan.can_conclude and "cannot conclude" in few.table()


def _shifted_turbo_mse(bits, dim, seed):
    return kvstats.quantizer("turbo_mse", bits=bits, dim=dim, seed=seed + 1)


@pytest.mark.slow
def test_non_significant_rows_carry_a_detectable_shift():
    """turbo_mse against itself with other rotations: no real difference, so rows are not significant and each
    gets the shift the test could detect; a row that is significant gets none."""
    ev = evaluate("turbo_mse", bits=2, data="gaussian", units=12, compare=_shifted_turbo_mse, **SMALL)
    rows = [c for c in ev.comparison.values() if not c["significant"]]
    assert rows
    for m, c in ev.comparison.items():
        shift = c["detectable_shift"]
        if c["significant"]:
            assert shift is None
            continue
        sd = np.std([u[m] - u[f"other:{m}"] for u in ev.units], ddof=1)
        assert shift.alpha == pytest.approx(0.05 / len(ev.comparison))
        assert shift.extra["shift"] == pytest.approx(shift.effect_size * sd, rel=1e-12) and shift.extra["shift"] > 0


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::kvstats.evaluation.results.InconclusiveWarning")
def test_unequal_bits_are_flagged_and_match_bits_picks_the_comparators_budget():
    ev = evaluate("turbo_mse", bits=4, data="gaussian", units=3, compare="qkqv", **SMALL)
    assert ev.bits["matched"] is False and "not bit-matched" in ev.table()
    # by hand at d = 32: turbo_mse(4) holds 4 + 32/32 = 5 bits; qkqv(n) holds n + 2·32/32 = n + 2 bits
    assert ev.bits["evaluated"]["measured"] == pytest.approx(5.0)
    assert ev.bits["compared"]["measured"] == pytest.approx(6.0)
    matched = evaluate("turbo_mse", bits=4, data="gaussian", units=3, compare="qkqv", match_bits=True, **SMALL)
    assert matched.config["compare_bits"] == 3 and matched.bits["compared"]["measured"] == pytest.approx(5.0)
    assert matched.bits["matched"] is True
    # fp8 builds at 8 bits only: no budget holds turbo_mse's 5 bits or fewer; the table says so and lists what B's
    # budgets hold, instead of suggesting the --match-bits that was given
    none_fit = evaluate("turbo_mse", bits=4, data="gaussian", units=3, compare="fp8_e4m3", match_bits=True, **SMALL)
    assert none_fit.bits["compared"]["budgets_measured"] == {"8": 8.0} and none_fit.bits["matched"] is False
    table = " ".join(none_fit.table().split())
    assert "although bit matching was asked for: none of its budgets holds that many or fewer" in table
    assert "n = 8: 8)" in table and "runs the comparator at its largest budget" not in table


# -------------------------------------------------------------------------------- checks before measuring


class ClaimsThreeBits(Int4):
    min_bits, max_bits = 3, 4

    def bits_per_coordinate(self, n_tokens=None):
        return BitBudget(payload=3.0)


class Nondeterministic(Int4):
    def _encode(self, x):
        return super()._encode(x + 1e-2 * torch.randn_like(x))


class BreaksOnOneToken(Int4):
    def _encode(self, x):
        if x.dim() >= 2 and x.shape[-2] == 1:
            raise RuntimeError("cannot group a single token")
        return super()._encode(x)


class ClampsAfterEncoding(Int4):
    """Honest int4 codes, then its input clamped in place: idempotent, so a second encode changes nothing more."""

    def _encode(self, x):
        code = super()._encode(x)
        x.clamp_(-0.5, 0.5)
        return code


@pytest.mark.parametrize("cls, check", [(ClaimsThreeBits, "bits"), (Nondeterministic, "determinism"),
                                        (BreaksOnOneToken, "cache"), (ClampsAfterEncoding, "input")])
def test_a_failing_quantizer_is_refused_naming_the_check(cls, check):
    bits = 3 if cls is ClaimsThreeBits else 4
    with pytest.raises(QuantizerCheckError, match=rf"^quantizer '{cls.__name__}': its K quantizer fails the "
                                                  rf"conformance checks: check_quantizer\[{check}\]"):
        evaluate(cls, bits=bits, data="gaussian", units=2, **SMALL)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::kvstats.evaluation.results.InconclusiveWarning")
def test_a_quantizer_that_changes_its_input_is_measured_against_the_data_as_drawn(tmp_path):
    """Its codes are those of the honest int4, so every metric of every unit must be too: the references (exact
    attention, the 6D errors) come from the data as drawn, whatever encode does to the tensors it is given;
    likewise on a capture, whose windows are views of the loaded file, and with match_bits (whose encodes of the
    first unit come before the units are measured)."""
    path, _ = _capture(tmp_path)
    for data, extra in (("gaussian", SMALL), (path, {"window": 16, "n_resamples": 999})):
        args = dict(bits=4, data=data, units=2, check=False, compare=ClampsAfterEncoding, match_bits=True, **extra)
        honest = evaluate(Int4, **args)
        clamping = evaluate(ClampsAfterEncoding, **{**args, "compare": Int4})
        for a, b in zip(honest.units, clamping.units):
            assert {m: a[m] for m in METRICS} == {m: b[m] for m in METRICS}
            assert {m: a[f"other:{m}"] for m in METRICS} == {m: b[m] for m in METRICS}
            assert {m: b[f"other:{m}"] for m in METRICS} == {m: a[m] for m in METRICS}


def test_no_check_measures_anyway_and_reports_the_bits_held():
    ev = evaluate(ClaimsThreeBits, bits=3, data="gaussian", units=2, check=False, **SMALL)
    assert ev.config["checks"] == {"quantizer": "skipped (check=False)"}
    assert ev.bits["evaluated"]["claimed"] == 3.0
    assert ev.bits["evaluated"]["measured"] == pytest.approx(4 + 32 / 32)  # what the codes hold, by hand
    assert ev.summary["bits_total"].statistic == pytest.approx(5.0)
    assert "it claims 3" in ev.table()


class DuckInt4:
    """The protocol without subclassing Quantizer: encode, decode, inner, bits_per_coordinate, dim, seed."""

    def __init__(self, bits, dim, seed=0):
        self.inner_q, self.dim, self.seed, self.bits = Int4(4, dim, seed), dim, seed, bits

    def encode(self, x):
        return self.inner_q.encode(x)

    def decode(self, code):
        return self.inner_q.decode(code)

    def inner(self, query, code):
        return self.inner_q.inner(query, code)

    def bits_per_coordinate(self, n_tokens=None):
        return self.inner_q.bits_per_coordinate(n_tokens)

    def __repr__(self):
        return f"DuckInt4(dim={self.dim}, seed={self.seed})"


@pytest.mark.slow
def test_a_duck_typed_quantizer_is_evaluated():
    ev = evaluate(DuckInt4, bits=4, data="gaussian", units=2, **SMALL)
    checks = ev.config["checks"]["quantizer"]
    assert checks["K"] == checks["V"] == checks["fresh process"] == "passed"

    class NoInner(DuckInt4):
        inner = None

    with pytest.raises(TypeError, match=r"built a NoInner for K with no method\(s\) \['inner'\]"):
        evaluate(NoInner, bits=4, data="gaussian", units=2, **SMALL)


def test_compare_errors_name_the_side_and_nova_is_refused_uncalibrated():
    with pytest.raises(ValueError, match=r"^compare 'Int4PerToken': bits must be in \[4, 4\], got 2"):
        evaluate("turbo_mse", bits=2, data="gaussian", units=2, compare=Int4, **SMALL)
    with pytest.raises(ValueError, match="needs calibration"):
        evaluate("nova", bits=2, data="gaussian", units=2, **SMALL)


def test_seed_none_draws_a_fresh_seed_and_records_it():
    ev = evaluate("turbo_mse", bits=2, data="gaussian", units=2, seed=None, **SMALL)
    again = evaluate("turbo_mse", bits=2, data="gaussian", units=2, seed=ev.config["seed"], **SMALL)
    assert [u["attention_kl"] for u in ev.units] == [u["attention_kl"] for u in again.units]
    assert ev.provenance["seeds"]["seed"] == ev.config["seed"]


@pytest.mark.slow
def test_a_ready_schemes_budget_is_its_own():
    """A ready Scheme was built at its budget: a conflicting bits= is refused by name (it would label the results
    and build the comparator at another budget); a compared Scheme is labelled with its own budget."""
    at2 = kvstats.scheme("kqv", bits=2, dim=32, seed=0)
    with pytest.raises(ValueError, match=r"^bits=3, but the Scheme 'kqv' given as quantizer was built at 2 bits"):
        evaluate(at2, bits=3, data="gaussian", units=2, **SMALL)
    with pytest.warns(InconclusiveWarning):
        ev = evaluate(at2, bits=2, data="gaussian", units=2, compare=kvstats.scheme("kv", bits=3, dim=32, seed=0),
                      **SMALL)
    assert (ev.bits["evaluated"]["budget"], ev.bits["compared"]["budget"], ev.config["compare_bits"]) == (2, 3, 3)
    assert "B = kv: budget n = 3" in ev.table()
    with pytest.raises(ValueError, match=r"^match_bits=True cannot set the budget of compare='kv', a Scheme built"):
        evaluate(at2, bits=2, data="gaussian", units=2, compare=kvstats.scheme("kv", bits=3, dim=32, seed=0),
                 match_bits=True, **SMALL)
    from kvstats.evaluation.quantizer_sides import (
        Side,  # every engine (synthetic, capture, model, sensitivity) builds its sides so
    )
    assert Side("compare", kvstats.scheme("kv", bits=3, dim=32, seed=0), 2, {}).bits == 3


@pytest.mark.parametrize("extra, named", [
    ({"layers": [0]}, "layers"), ({"window": 16}, "window"), ({"match_bits": True}, "match_bits")])
def test_arguments_that_would_have_no_effect_are_refused_by_name(extra, named):
    with pytest.raises(ValueError, match=rf"^{named}="):
        evaluate("turbo_mse", bits=2, data="gaussian", units=2, **SMALL, **extra)


def test_store_must_be_a_folder(tmp_path):
    existing = tmp_path / "a_file"
    existing.write_text("x")
    with pytest.raises(ValueError, match=rf"^store= must be a folder .*{re.escape(repr(str(existing)))}.* a file"):
        evaluate("turbo_mse", bits=2, data="gaussian", units=2, store=existing, **SMALL)
    blocked = tmp_path / "r.json.units"  # the default store beside out
    blocked.write_text("x")
    with pytest.raises(ValueError, match=r"r\.json\.units.* a file"):
        evaluate("turbo_mse", bits=2, data="gaussian", units=2, out=tmp_path / "r.json", **SMALL)
    assert existing.read_text() == blocked.read_text() == "x" and not (tmp_path / "r.json").exists()


def test_bad_input():
    with pytest.raises(ValueError, match="data"):
        evaluate("turbo_mse", bits=3, data="not_a_kind_or_file")
    with pytest.raises(ValueError, match="units"):
        evaluate("turbo_mse", bits=3, data="gaussian", units=1)
    with pytest.raises(ValueError, match="bits"):
        evaluate("turbo_mse", bits=9, data="gaussian")
    with pytest.raises(ValueError, match=r"InferenceOptions\.alpha must be in \(0, 1\), got 1\.5"):
        evaluate("turbo_mse", bits=3, data="gaussian", inference=InferenceOptions(alpha=1.5))
    with pytest.raises(TypeError, match=r"inference must be a kvstats.stats.InferenceOptions .* got dict"):
        evaluate("turbo_mse", bits=3, data="gaussian", inference={"alpha": 0.1})


# ---------------------------------------------------------------------------------------- files and resume


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::kvstats.evaluation.results.InconclusiveWarning")
def test_results_are_strict_json_with_provenance(tmp_path):
    out = tmp_path / "r.json"
    ev = evaluate("kqv", bits=3, data="gaussian", units=3, compare="qkqv", out=out, **SMALL)
    saved = _strict_json(out.read_text())
    assert saved["schema"] == "kvstats-evaluation/2"
    prov = saved["provenance"]
    assert set(prov) >= {"kvstats_commit", "versions", "device", "started", "finished", "wall_seconds", "command",
                         "seeds"}
    assert prov["versions"]["torch"] == torch.__version__ and prov["versions"]["kvstats"] == kvstats.__version__
    assert prov["device"]["torch_threads"] == torch.get_num_threads()
    # NaN never written: the estimates' p-values are null, with the reason beside them
    kl = saved["summary"]["attention_kl"]
    assert kl["pvalue"] is None and "estimate" in kl["null_reasons"]["pvalue"]
    assert saved["units"][0]["bits_total"] == ev.units[0]["bits_total"]
    assert not (tmp_path / "r.json.units").exists()  # the unit store is removed once the results are written


@pytest.mark.slow
def test_an_interrupted_run_resumes_from_its_stored_units(tmp_path, monkeypatch):
    import kvstats.evaluation.units as units_module

    out = tmp_path / "r.json"
    args = dict(bits=2, data="gaussian", units=5, out=out, **SMALL)
    real = units_module.unit_metrics
    calls = {"n": 0}

    def interrupt_at_the_fourth_unit(*a, **k):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(units_module, "unit_metrics", interrupt_at_the_fourth_unit)
    with pytest.raises(KeyboardInterrupt):
        evaluate("turbo_mse", **args)
    assert not out.exists() and len(list((tmp_path / "r.json.units" / "evaluate").glob("*.json"))) == 3
    monkeypatch.setattr(units_module, "unit_metrics", real)
    resumed = evaluate("turbo_mse", **args)
    assert resumed.config["units_reused"] == 3
    fresh = evaluate("turbo_mse", **{**args, "out": tmp_path / "fresh.json"})
    assert resumed.units == fresh.units


def test_out_is_checked_before_any_work(tmp_path, monkeypatch):
    import kvstats.evaluation.units as units_module

    monkeypatch.setattr(units_module, "unit_metrics", lambda *a, **k: pytest.fail("a unit ran"))
    existing = tmp_path / "done.json"
    existing.write_text("{}")
    with pytest.raises(FileExistsError, match="exists; pass --force"):
        evaluate("turbo_mse", bits=2, data="gaussian", units=2, out=existing, **SMALL)
    assert existing.read_text() == "{}"
    with pytest.raises(ValueError, match="is a folder"):
        evaluate("turbo_mse", bits=2, data="gaussian", units=2, out=tmp_path, **SMALL)


@pytest.mark.slow
def test_out_never_destroys_a_device_a_fifo_a_symlink_or_the_input(tmp_path):
    import hashlib
    import os
    import stat
    import threading

    from kvstats._files import is_stream

    assert is_stream("/dev/null")  # written through, never replaced (the next call runs as the CI user)
    evaluate("turbo_mse", bits=2, data="gaussian", units=2, out="/dev/null", **SMALL)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = {}
    reader = threading.Thread(target=lambda: got.setdefault("text", fifo.read_text()))
    reader.start()
    evaluate("turbo_mse", bits=2, data="gaussian", units=2, out=fifo, **SMALL)
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and _strict_json(got["text"])["config"]["units"] == 2

    target = tmp_path / "target.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with pytest.raises(FileExistsError):
        evaluate("turbo_mse", bits=2, data="gaussian", units=2, out=link, **SMALL)
    evaluate("turbo_mse", bits=2, data="gaussian", units=2, out=link, force=True, **SMALL)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert _strict_json(target.read_text())["config"]["units"] == 2

    cap, _ = _capture(tmp_path)
    before = hashlib.sha256(cap.read_bytes()).hexdigest()
    for out in (cap, tmp_path / "cap_link.safetensors"):
        if out != cap:
            out.symlink_to(cap)
        with pytest.raises(ValueError, match="is the input"):
            evaluate("turbo_mse", bits=2, data=cap, window=16, out=out, force=True)
    assert hashlib.sha256(cap.read_bytes()).hexdigest() == before


# ---------------------------------------------------------------------------------------------------- CLI


@pytest.mark.slow
def test_cli_evaluate_on_synthetic_data_and_a_capture(tmp_path, capsys):
    from kvstats.cli.parser import main

    out = tmp_path / "synthetic.json"
    assert main(["evaluate", "--quantizer", "turbo_mse", "--bits", "3", "--data", "gaussian", "--units", "3",
                 "--dim", "32", "--out", str(out), "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "turbo_mse at 3 bits on gaussian (3 units" in table and "attention_kl" in table
    saved = _strict_json(out.read_text())
    direct = evaluate("turbo_mse", bits=3, data="gaussian", units=3, dim=32,
                      inference=InferenceOptions(n_resamples=999))
    assert [u["attention_kl"] for u in saved["units"]] == [u["attention_kl"] for u in direct.units]
    assert main(["evaluate", "--quantizer", "turbo_mse", "--bits", "3", "--units", "3", "--dim", "32", "--out",
                 str(out), "--no-progress"]) == 2
    assert "exists; pass --force" in capsys.readouterr().err

    cap, _ = _capture(tmp_path, tokens=48)
    assert main(["evaluate", "--quantizer", "kqv", "--bits", "4", "--data", str(cap), "--window", "16",
                 "--compare", "kv", "--json", "--no-progress"]) == 0
    captured = capsys.readouterr()
    payload = _strict_json(captured.out)
    assert payload["config"]["units"] == 3 and set(payload["comparison"]) <= set(METRICS)
    assert "note: with 3 units" in captured.err and "cannot conclude" in captured.err


@pytest.mark.slow
def test_cli_imports_module_class_from_the_current_folder(tmp_path, capsys, monkeypatch):
    from kvstats.cli.parser import main

    (tmp_path / "myquant.py").write_text(textwrap.dedent('''
        from kvstats.quant.quantizers import quantizer

        def Lloyd3(bits, dim, seed):
            return quantizer("lloyd", bits=bits, dim=dim, seed=seed)
    '''))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert main(["evaluate", "--quantizer", "myquant:Lloyd3", "--bits", "3", "--units", "2", "--dim", "32",
                 "--no-progress"]) == 0
    assert "myquant:Lloyd3 at 3 bits" in capsys.readouterr().out


def test_cli_evaluate_errors_are_one_line(tmp_path, capsys):
    from kvstats.cli.parser import main

    assert main(["evaluate", "--quantizer", "nope", "--bits", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvstats evaluate: error:") and "nope" in err and "Traceback" not in err
    assert main(["evaluate", "--quantizer", "kqv", "--bits", "3", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert main(["evaluate", "--quantizer", "tests.evaluation.test_evaluation:ClaimsThreeBits", "--bits", "3",
                 "--units", "2", "--dim", "32", "--no-progress"]) == 2
    assert "check_quantizer[bits]" in capsys.readouterr().err


def test_minmax_bits_are_those_its_codes_hold_at_a_window_that_is_not_a_multiple_of_d():
    """K per channel over groups of d = 32 tokens at 48 tokens: 2 groups, the second partial. By hand, per KV
    head: K payload 48 · 8 bytes + 32 channels · 2 groups · (lo, step in fp16) 4 bytes = 640; V per token
    48 · (8 + 4) = 576; bits per element 8 · (640 + 576) / (2 · 48 · 32) = 3.1667."""
    ev = evaluate("minmax", bits=2, data="gaussian", units=2, **SMALL)
    assert ev.bits["evaluated"]["measured"] == pytest.approx(8 * (640 + 576) / (2 * 48 * 32), rel=1e-12)
    assert ev.summary["bits_total"].statistic == pytest.approx(ev.bits["evaluated"]["measured"], rel=1e-12)


@pytest.mark.slow
def test_a_calibrated_nova_scheme_is_checked_on_cache_shapes_and_evaluated():
    """NOVA-KV keeps one calibrated quantizer per KV head (x must be [B, H_kv, n, d]): the checks run on the
    data's cache shape, which is all a Scheme is ever given."""
    from kvstats.quant.schemes import NovaScheme

    q, k, v = generate("low_rank", 1, 2, 600, 32, 99, q_heads=4, n_q=64)  # calibration data, held out
    nova = NovaScheme.calibrate(q, k, v, bits=2, seed=0)
    ev = evaluate(nova, bits=2, data="low_rank", units=2, kv_heads=2, q_heads=4, dim=32, seq=48, n_q=8,
                  inference=InferenceOptions(n_resamples=999))
    checks = ev.config["checks"]["quantizer"]
    assert checks["K"] == checks["V"] == "passed" and checks["fresh process"].startswith("not run: a ready Scheme")
    code = nova.encode(*generate("low_rank", 1, 2, 48, 32, 0, q_heads=4, n_q=8)[1:])
    assert ev.units[0]["bits_total"] == pytest.approx(8 * code.nbytes / (2 * 2 * 48 * 32), rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("sink", ["pipe", "file"])
def test_out_dev_stdout_is_written_through_the_descriptor(sink, tmp_path):
    """--out /dev/stdout (piped, or redirected to a file by the shell): the JSON goes through the very descriptor,
    before the table, in one piece; nothing is replaced, nothing fails after the work."""
    import subprocess

    cmd = [sys.executable, "-m", "kvstats.cli.parser", "evaluate", "--quantizer", "turbo_mse", "--bits", "2",
           "--units", "2", "--dim", "32", "--out", "/dev/stdout", "--no-progress"]
    if sink == "pipe":
        text = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout
    else:
        target = tmp_path / "out.txt"
        with open(target, "w") as handle:
            subprocess.run(cmd, stdout=handle, stderr=subprocess.DEVNULL, check=True, timeout=300)
        text = target.read_text()
    start = text.index("A = turbo_mse at 2 bits")
    assert _strict_json(text[:start])["config"]["units"] == 2


@pytest.mark.slow
def test_json_with_out_dev_stdout_prints_the_json_once():
    import subprocess

    cmd = [sys.executable, "-m", "kvstats.cli.parser", "evaluate", "--quantizer", "turbo_mse", "--bits", "2",
           "--units", "2", "--dim", "32", "--out", "/dev/stdout", "--json", "--no-progress"]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout
    assert _strict_json(text)["config"]["units"] == 2  # one document: json.loads refuses "Extra data"


@pytest.mark.parametrize("flags, named", [
    (["--layers", "0"], "--layers"), (["--window", "16"], "--window"), (["--match-bits"], "--match-bits")])
def test_cli_flags_that_would_have_no_effect_are_refused_by_name(flags, named, capsys):
    from kvstats.cli.parser import main

    assert main(["evaluate", "--quantizer", "kqv", "--bits", "3", "--units", "2", "--dim", "32", "--no-progress",
                 *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvstats evaluate: error: {named} ") and "Traceback" not in err


# ------------------------------------------------------------------------- the review's hostile quantizers

_PARTIAL_STASH: dict[bytes, torch.Tensor] = {}


class PartialStash(Int4):
    """Honest 4-bit codes, but decode returns x rounded to steps of 0.4 from a module-level stash keyed by the code's
    bytes: far better than 4 bits allow, yet not lossless, so Shannon's bound (e^-2 slack) lets it pass."""

    def _encode(self, x):
        code = super()._encode(x)
        for row, value in zip(code.payload["codes"].reshape(-1, code.payload["codes"].shape[-1]),
                              x.reshape(-1, x.shape[-1])):
            _PARTIAL_STASH[row.numpy().tobytes()] = torch.round(value.double() * 2.5) / 2.5
        return code

    def _decode(self, code):
        rows = code.payload["codes"].reshape(-1, code.payload["codes"].shape[-1])
        return torch.stack([_PARTIAL_STASH[r.numpy().tobytes()] for r in rows]).reshape(code.shape).to(code.dtype)


@pytest.mark.slow
def test_a_partial_stash_passes_the_rate_bound_but_not_a_fresh_process():
    from kvstats.measure.testing import check_quantizer

    check_quantizer(PartialStash(4, 32), build=PartialStash)  # in this process, the stash is there
    with pytest.raises(AssertionError, match=r"check_quantizer\[determinism\].*fresh process.*raised KeyError"):
        check_quantizer(PartialStash(4, 32), build=PartialStash, isolated=True)
    with pytest.raises(QuantizerCheckError, match=r"built in a fresh process .* raised KeyError"):
        evaluate(PartialStash, bits=4, data="gaussian", units=2, **SMALL)


class GrowsBeyond64(Int4):
    def _encode(self, x):
        code = super()._encode(x)
        if x.dim() >= 2 and x.shape[-2] > 64:
            code.scalars["extra"] = torch.zeros(x.shape[:-1])
        return code


def test_bits_are_checked_at_the_evaluations_own_length():
    from kvstats.measure.testing import check_quantizer

    check_quantizer(GrowsBeyond64(4, 32))  # 24 and 57 tokens: honest
    with pytest.raises(QuantizerCheckError, match=r"at the evaluation's own 96 tokens: the codes hold 6 bits"):
        evaluate(GrowsBeyond64, bits=4, data="gaussian", units=2, **{**SMALL, "seq": 96})
    ev = evaluate(GrowsBeyond64, bits=4, data="gaussian", units=2, check=False, **{**SMALL, "seq": 96})
    assert ev.bits["evaluated"]["measured"] == pytest.approx(6.0) and ev.bits["evaluated"]["claimed"] == 5.0


class UnderstatesNbytes(Int4):
    """A Code subclass whose nbytes leaves out the fp32 scales."""

    def _encode(self, x):
        code = super()._encode(x)
        return _ShortCode(code.shape, code.dtype, code.payload, code.scalars, code.parts, code.source)

    def bits_per_coordinate(self, n_tokens=None):
        return BitBudget(payload=4.0)


from kvstats.quant.quantizers import Code as _Code  # noqa: E402


class _ShortCode(_Code):
    @property
    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.payload.values())


def test_measured_bits_come_from_the_tensors_held_not_from_nbytes():
    ev = evaluate(UnderstatesNbytes, bits=4, data="gaussian", units=2, check=False, **SMALL)
    assert ev.bits["evaluated"]["measured"] == pytest.approx(4 + 32 / 32)  # payload 4 + fp32 scale per vector


class NonLinear(Int4):
    """An estimator that is not decode-then-dot: 1.05 · ⟨q, x̂⟩."""

    def _inner(self, query, code):
        return 1.05 * super()._inner(query, code)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::kvstats.evaluation.results.InconclusiveWarning")
def test_a_nonlinear_estimator_is_checked_as_such_and_keeps_the_decoded_kl():
    with pytest.raises(QuantizerCheckError, match=r"check_quantizer\[inner\].*--nonlinear"):
        evaluate(NonLinear, bits=4, data="gaussian", units=2, **SMALL)
    ev = evaluate(NonLinear, bits=4, data="gaussian", units=4, compare="kqv", linear=False, **SMALL)
    assert "6d_attention_kl" in ev.comparison  # no longer a repeat of attention_kl
    assert ev.plan.family_size == 8


def test_a_capture_of_several_documents_has_documents_as_its_units(tmp_path):
    gen = torch.Generator().manual_seed(5)
    layer = tuple(torch.randn(1, h, 96, 16, generator=gen) for h in (2, 1, 1))
    path = save_qkv(tmp_path / "docs.safetensors", [layer], {"model": "random", "documents": [
        {"source": s, "text_sha256": s * 64, "start": a, "stop": b} for s, a, b in (("a", 0, 64), ("b", 64, 96))]})
    ev = evaluate("turbo_mse", bits=2, data=path, window=16, inference=InferenceOptions(n_resamples=999))
    assert [u["document"] for u in ev.units] == [0, 0, 0, 0, 1, 1]
    assert ev.config["inference_units"].startswith("documents") and ev.summary["attention_kl"].n == 2
    per_doc = [np.mean([u["attention_kl"] for u in ev.units if u["document"] == d]) for d in (0, 1)]
    assert ev.summary["attention_kl"].statistic == pytest.approx(np.mean(per_doc), rel=1e-12)
    assert "(2 documents, 6 windows" in ev.table() and "windows of one text" not in ev.table()
    first = evaluate("turbo_mse", bits=2, data=path, window=16, units=4, inference=InferenceOptions(n_resamples=999))
    assert [u["document"] for u in first.units] == [0, 0, 0, 0]  # the first document's windows only: one text
    assert first.config["inference_units"] == "windows of one text"
    assert "the 4 units are windows of one text" in " ".join(first.table().split())


def test_repeated_layers_and_cli_values_are_refused_by_their_own_names(tmp_path, capsys):
    from kvstats.cli.parser import main

    path, _ = _capture(tmp_path)
    with pytest.raises(ValueError, match=r"layers must name each layer once"):
        evaluate("turbo_mse", bits=2, data=path, window=16, layers=[0, 0, 1])
    assert main(["evaluate", "--quantizer", "kqv", "--bits", "4", "--data", str(path), "--layers", "0", "0"]) == 2
    assert "--layers must name stored layers" in capsys.readouterr().err
    assert main(["evaluate", "--quantizer", "kqv", "--bits", "4", "--top-k", "0"]) == 2
    assert "--top-k must be" in capsys.readouterr().err
    assert main(["evaluate", "--quantizer", "kqv", "--bits", "4", "--data", str(path), "--out", str(path),
                 "--force"]) == 2
    assert "--out" in capsys.readouterr().err and path.is_file()


def test_a_resumed_run_never_reuses_units_of_changed_code(tmp_path, monkeypatch):
    """A factory whose module imports a helper from the user's folder: the helper changes between an interrupted
    run and its rerun, and the stored units are not reused (every user file loaded is part of the key)."""
    import importlib

    import kvstats.evaluation.units as units_module

    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "stalehelper.py").write_text("OFFSET = 0\n")
    (folder / "stalequant.py").write_text(textwrap.dedent('''
        import kvstats
        import stalehelper

        def Q(bits, dim, seed):
            return kvstats.quantizer("turbo_mse", bits=bits, dim=dim, seed=seed + stalehelper.OFFSET)
    '''))
    monkeypatch.syspath_prepend(str(folder))
    out = tmp_path / "r.json"
    real, calls = units_module.unit_metrics, {"n": 0}

    def interrupt_at_the_third(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(units_module, "unit_metrics", interrupt_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        evaluate("stalequant:Q", bits=2, data="gaussian", units=4, out=out, check=False, **SMALL)
    monkeypatch.setattr(units_module, "unit_metrics", real)
    (folder / "stalehelper.py").write_text("OFFSET = 1000\n")  # a new version of the user's code
    for name in ("stalequant", "stalehelper"):
        sys.modules.pop(name, None)
    importlib.invalidate_caches()
    rerun = evaluate("stalequant:Q", bits=2, data="gaussian", units=4, out=out, check=False, **SMALL)
    assert rerun.config["units_reused"] == 0


def _rewritten(path, edit):
    """The capture at path with edit(tensors) applied and its digests recomputed (a file save_qkv would refuse)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from kvstats.data.io import tensor_sha256

    with safe_open(str(path), framework="pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())
    edit(tensors)
    meta["tensor_sha256"] = json.dumps({k: tensor_sha256(t) for k, t in tensors.items()})
    save_file(tensors, str(path), metadata=meta)
    return path


def test_a_non_finite_capture_value_is_refused_up_front_naming_file_layer_token_and_unit(tmp_path):
    path, _ = _capture(tmp_path)
    _rewritten(path, lambda t: t["layer.1.k"].__setitem__((0, 0, 37, 3), float("nan")))
    with pytest.raises(ValueError, match=r"cap.safetensors'?: layer 1's k holds nan at token 37 \(batch 0, head 0, "
                                         r"channel 3; unit 2 \(a window of 16 tokens\)\)"):
        evaluate("turbo_mse", bits=3, data=path, units=2, window=16)  # units 0 and 1 alone never reach token 37


def test_an_estimator_that_overflows_on_finite_capture_data_is_named_with_the_unit_and_layer(tmp_path):
    path, _ = _capture(tmp_path)

    def scale(t):  # q·k ≈ 1e39 per channel: beyond fp32, whose estimator then overflows; float64 holds it
        t["layer.1.q"] *= 1e20
        t["layer.1.k"] *= 1e19

    _rewritten(path, scale)
    with pytest.raises(ValueError, match=r"Scheme.* estimates logits that are not finite in unit 0, layer 1 from "
                                         r"finite queries \(max \|q\| = .*e\+20\) and keys"):
        evaluate("turbo_mse", bits=3, data=path, units=2, window=16)
