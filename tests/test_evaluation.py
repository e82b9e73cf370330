"""kvstats.evaluate: per-unit metrics against a float64 recomputation, units, CIs, files and errors."""

import json
import math

import numpy as np
import pytest
import torch

import kvstats
from kvstats._random import spawn_seeds
from kvstats.data.io import save_qkv
from kvstats.data.synthetic import generate
from kvstats.evaluation import METRICS, evaluate, resolve_scheme

SMALL = dict(dim=32, kv_heads=1, q_heads=2, seq=48, n_q=8, n_resamples=999)


def _kl_and_recall_fp64(q, k, scores_hat, top_k, causal=False):
    """Independent oracle: softmax KL and top-k recall written out in float64 (no kvstats metric code)."""
    q, k, s_hat = q.double(), k.double(), scores_hat.double()
    g = q.shape[1] // k.shape[1]
    s = torch.einsum("bhnd,bhsd->bhns", q, k.repeat_interleave(g, dim=1)) / math.sqrt(q.shape[-1])
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


def test_unit_metrics_match_fp64_oracle():
    ev = evaluate("turbo_prod", bits=3, data="gaussian", units=3, seed=5, **SMALL)
    assert [u["unit"] for u in ev.units] == [0, 1, 2]
    for i in range(3):
        q, k, v = generate("gaussian", 1, 1, 48, 32, 5 + i, q_heads=2, n_q=8)
        k_seed, _ = spawn_seeds(5 + i, 2)
        kq = kvstats.quantizer("turbo_prod", bits=3, dim=32, seed=k_seed)
        s_hat = kq.inner(q.reshape(1, 1, 16, 32), kq.encode(k)).reshape(1, 2, 8, 48) / math.sqrt(32)
        kl, recall = _kl_and_recall_fp64(q, k, s_hat, top_k=5)
        assert ev.units[i]["attention_kl"] == pytest.approx(kl, rel=1e-4, abs=1e-7)
        assert ev.units[i]["topk_recall"] == pytest.approx(recall, abs=1e-12)
        assert ev.units[i]["bits_total"] == pytest.approx(kvstats.quantizer("turbo_prod", bits=3, dim=32)
                                                          .bits_per_coordinate().total)


def test_summary_is_the_mean_over_units_with_a_ci():
    ev = evaluate("turbo_mse", bits=2, data="heavy_tail", units=6, **SMALL)
    assert set(ev.summary) == set(METRICS)
    for m, r in ev.summary.items():
        values = [u[m] for u in ev.units]
        assert r.statistic == pytest.approx(np.mean(values), rel=1e-12)
        lo, hi = r.confidence_interval
        assert lo <= r.statistic <= hi
        assert r.n == 6
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


def test_capture_file_units_are_disjoint_windows(tmp_path):
    gen = torch.Generator().manual_seed(3)
    layers = [tuple(torch.randn(1, h, 64, 16, generator=gen) for h in (2, 1, 1)) for _ in range(2)]
    path = save_qkv(tmp_path / "cap.safetensors", layers, {"model": "random", "n_tokens": 64})
    out = tmp_path / "res" / "eval.json"
    ev = evaluate("turbo_mse", bits=3, data=path, units=None, window=16, out=out, n_resamples=999)
    assert len(ev.units) == 4  # 64 tokens / 16
    # unit 1 = tokens 16..31 of both layers, causal within the window, mean over layers
    scheme = resolve_scheme("turbo_mse", bits=3, dim=16, seed=1)
    kls = []
    for q, k, v in layers:
        sl = slice(16, 32)
        s_hat = scheme.scores(q[:, :, sl], scheme.encode(k[:, :, sl], v[:, :, sl])) / 4.0
        kls.append(_kl_and_recall_fp64(q[:, :, sl], k[:, :, sl], s_hat, 5, causal=True)[0])
    assert ev.units[1]["attention_kl"] == pytest.approx(np.mean(kls), rel=1e-4)
    saved = json.loads(out.read_text())
    assert saved["config"]["units"] == 4 and len(saved["units"]) == 4
    assert saved["summary"]["attention_kl"]["statistic"] == pytest.approx(ev.summary["attention_kl"].statistic)
    with pytest.raises(ValueError, match="units must be at most 4"):
        evaluate("turbo_mse", bits=3, data=path, units=5, window=16)


def test_compare_is_paired_and_holm_corrected():
    ev = evaluate("kqv", bits=3, data="gaussian", units=8, compare="qkqv", **SMALL)
    # K differs (turbo_mse vs turbo_prod); V is turbo_prod with the same seed in both: its errors are equal
    equal = {m for m in METRICS if all(u[m] == u[f"other:{m}"] for u in ev.units)}
    assert equal == {"6d_v_direction", "6d_v_norm"}
    assert set(ev.comparison) == set(METRICS) - equal
    for m, c in ev.comparison.items():
        assert 0.0 <= c["test"].pvalue <= c["pvalue_holm"] <= 1.0
        a = [u[m] for u in ev.units]
        b = [u[f"other:{m}"] for u in ev.units]
        from scipy.stats import wilcoxon

        assert c["test"].pvalue == pytest.approx(wilcoxon(a, b).pvalue, rel=1e-9)
    assert "p (Holm)" in ev.table()
    same = evaluate("kqv", bits=3, data="gaussian", units=3, compare="kqv", **SMALL)
    assert same.comparison == {}  # equal in every unit: nothing to test


def test_bad_input():
    with pytest.raises(ValueError, match="data"):
        evaluate("turbo_mse", bits=3, data="not_a_kind_or_file")
    with pytest.raises(ValueError, match="units"):
        evaluate("turbo_mse", bits=3, data="gaussian", units=1)
    with pytest.raises(ValueError, match="bits"):
        evaluate("turbo_mse", bits=9, data="gaussian")


def test_cli_evaluate_on_synthetic_data_and_a_capture(tmp_path, capsys):
    from kvstats.cli import main

    out = tmp_path / "synthetic.json"
    assert main(["evaluate", "--quantizer", "turbo_mse", "--bits", "3", "--data", "gaussian", "--units", "3",
                 "--dim", "32", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "turbo_mse at 3 bits on gaussian (3 units" in table and "attention_kl" in table
    saved = json.loads(out.read_text())
    direct = evaluate("turbo_mse", bits=3, data="gaussian", units=3, dim=32, n_resamples=999)
    assert [u["attention_kl"] for u in saved["units"]] == [u["attention_kl"] for u in direct.units]

    gen = torch.Generator().manual_seed(1)
    layers = [tuple(torch.randn(1, h, 48, 16, generator=gen) for h in (2, 1, 1))]
    cap = save_qkv(tmp_path / "cap.safetensors", layers, {"model": "random", "n_tokens": 48})
    assert main(["evaluate", "--quantizer", "kqv", "--bits", "4", "--data", str(cap), "--window", "16",
                 "--compare", "kv", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["config"]["units"] == 3 and set(payload["comparison"]) <= set(METRICS)


def test_cli_evaluate_errors_are_one_line(tmp_path, capsys):
    from kvstats.cli import main

    assert main(["evaluate", "--quantizer", "nope", "--bits", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvstats evaluate: error:") and "nope" in err and "Traceback" not in err
    assert main(["evaluate", "--quantizer", "kqv", "--bits", "3", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
