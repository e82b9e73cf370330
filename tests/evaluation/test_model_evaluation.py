"""kvstats.evaluate(..., model=...): output damage on a language model, against independent recomputations.

On the tiny random Llama of tests/conftest.py (saved as a model folder with a word-level tokenizer): a lossless
scheme gives zero damage; a real scheme's per-segment KL, top-1 and NLL change equal a float64 recomputation
from logits obtained through the other (dense, decode-then-dot) path; the pooled KL tail is numpy's quantiles of
the pooled token KLs; documents are the units; the CLI, strict JSON and provenance work.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")

import kvstats  # noqa: E402
from kvstats.evaluation.model_engine import (  # noqa: E402
    POOLED_COVERAGE,
    POOLED_MIN_DOCUMENTS,
    TAIL,
    model_source,
    model_unit,
)
from kvstats.hf.cache import IdentityScheme, KVStatsCache, cache_kwargs  # noqa: E402
from kvstats.measure.stats import InferenceOptions  # noqa: E402
from tests.helpers.texts import WORDS  # noqa: E402

_RNG = np.random.default_rng(7)
DOCS = {f"doc {i}": " ".join(_RNG.choice(WORDS, 70)) for i in range(5)}  # 70 words: two 32-token segments each
ENOUGH = {f"text {i}": " ".join(_RNG.choice(WORDS, 40)) for i in range(POOLED_MIN_DOCUMENTS)}  # one segment each


@pytest.fixture(scope="module")
def source(tiny_folder):
    return model_source(tiny_folder, segment=32, segments_per_document=2, documents=DOCS)


def test_segments_are_disjoint_and_documents_are_the_units(source):
    assert len(source.segments) == 10 and {d for d, _, _ in source.segments} == set(range(5))
    first, second = source.segments[0][2], source.segments[1][2]
    assert first.shape == second.shape == (1, 32) and not torch.equal(first, second)


def test_a_lossless_scheme_does_no_damage(source):
    row = model_unit(source, IdentityScheme(source.dims["head_dim"]), source.segments[0][2])
    assert row["out_kl"] < 1e-9 and row["top1"] == 1.0 and abs(row["delta_nll"]) < 1e-6
    assert max(row["layer_attention_kl"]) < 1e-9 and min(row["layer_topk_recall"]) == 1.0


def test_unit_metrics_match_a_float64_recomputation_through_the_dense_path(source):
    """Oracle: the dense path (the model's sdpa on decoded keys; linear estimators: the same logits up to fp32
    rounding) and the KL, top-1 and NLL written out in float64 with torch alone."""
    scheme = kvstats.scheme("kqv", bits=3, dim=source.dims["head_dim"], seed=4)
    ids = source.segments[3][2]
    row = model_unit(source, scheme, ids)
    model = source.model
    with torch.inference_mode():
        ref = model(ids).logits.double()
        dense = model(ids, **cache_kwargs(model, KVStatsCache(scheme)), use_cache=True).logits.double()
    lp, lq = ref.log_softmax(-1), dense.log_softmax(-1)
    kl = (lp.exp() * (lp - lq)).sum(-1)[0]
    assert row["out_kl"] == pytest.approx(float(kl.mean()), rel=1e-3)
    assert row["top1"] == pytest.approx(float((ref.argmax(-1) == dense.argmax(-1)).double().mean()), abs=1 / 32)
    target = ids[0, 1:]
    nll = -lq[0, :-1].gather(-1, target[:, None])[:, 0]
    nll_ref = -lp[0, :-1].gather(-1, target[:, None])[:, 0]
    assert row["delta_nll"] == pytest.approx(float((nll - nll_ref).mean()), rel=1e-3, abs=1e-6)
    assert row["out_kl"] > 1e-4  # a 3-bit cache does damage this tiny model measurably


def test_bits_held_with_an_exact_window_and_the_codes_alone(source):
    """kqv's codes hold the same bytes per token however many tokens (its encode of 32 and of 24 tokens, the
    oracle b); the fp32 model keeps W exact tokens at 32 bits: held = (b·(T − W) + 32·W)/T, the codes alone b, and
    with every token exact no codes at all."""
    d, heads = source.dims["head_dim"], source.dims["kv_heads"]
    scheme = kvstats.scheme("kqv", bits=3, dim=d, seed=4)
    gen = torch.Generator().manual_seed(0)
    per_element = {n: 8 * scheme.encode(*(torch.randn(1, heads, n, d, generator=gen) for _ in range(2))).nbytes
                   / (2 * heads * n * d) for n in (24, 32)}
    b = per_element[32]
    assert per_element[24] == b
    ids = source.segments[0][2]
    t, w = ids.shape[1], 8
    plain = model_unit(source, scheme, ids, record=False)
    assert plain["bits_total"] == pytest.approx(b, rel=1e-12) and plain["bits_codes"] == plain["bits_total"]
    windowed = model_unit(source, scheme, ids, full_precision_window=w, record=False)
    assert windowed["bits_codes"] == pytest.approx(b, rel=1e-12)
    assert windowed["bits_total"] == pytest.approx((b * (t - w) + 32 * w) / t, rel=1e-12)
    exact = model_unit(source, scheme, ids, full_precision_window=t, record=False)
    assert exact["bits_total"] == 32 and math.isnan(exact["bits_codes"])


@pytest.mark.filterwarnings("ignore::kvstats.evaluation.results.InconclusiveWarning")
def test_pooled_intervals_are_withheld_below_the_stated_number_of_documents(tiny_folder, tmp_path):
    """5 documents: every pooled statistic an estimate (numpy's, of the pooled tokens) without an interval, the
    reason in the table, in each result and in the JSON (null intervals), the per-document intervals kept;
    POOLED_MIN_DOCUMENTS documents: the cluster bootstrap's intervals (kvstats.stats.cluster_bootstrap_ci called
    directly on the same tokens and seed), the count and the simulated coverage at it stated. An exact window
    of 8 tokens: the table gives the bits of the codes alone beside those held, as the units and the JSON do."""
    from kvstats.measure.stats import cluster_bootstrap_ci

    out = tmp_path / "few.json"
    options = InferenceOptions(n_resamples=199, seed=5)
    few = kvstats.evaluate("kqv", bits=3, model=tiny_folder, segment=32, segments_per_document=2, documents=DOCS,
                           full_precision_window=8, out=out, inference=options)
    assert few.config["documents"] == 5 < POOLED_MIN_DOCUMENTS and len(few.units) == 10
    reason = f"5 documents, fewer than {POOLED_MIN_DOCUMENTS} clusters for the cluster bootstrap to hold its level"
    assert few.config["pooled_intervals"] == f"withheld: {reason}"
    tok = few.summary["evaluated"]["tokens"]
    pooled = np.concatenate([u["tokens_out_kl"] for u in few.units])
    for name, q in TAIL.items():
        r = tok[f"kl_{name}"]
        assert r.statistic == pytest.approx(pooled.mean() if q is None else np.quantile(pooled, q), rel=1e-12)
        assert r.ci_method == "none" and math.isnan(r.confidence_interval.low)
        assert r.extra["no_interval"] == reason or (name == "max" and "maximum" in r.extra["no_interval"])
    for name in ("same_top1", "ppl_ratio"):
        assert tok[name].ci_method == "none" and tok[name].extra["no_interval"] == reason
    assert tok["same_top1"].statistic == pytest.approx(np.concatenate([u["tokens_top1"] for u in few.units]).mean())
    assert math.isfinite(few.summary["evaluated"]["documents"]["out_kl"].confidence_interval.low)  # mean_ci's
    saved = json.loads(out.read_text(), parse_constant=lambda t: pytest.fail(f"not strict JSON: {t}"))
    for name, r in saved["summary"]["evaluated"]["tokens"].items():
        assert r["ci_low"] is None and r["ci_high"] is None and r["no_interval"], name
    assert saved["config"]["pooled_intervals"] == f"withheld: {reason}"
    table = few.table()
    flat = " ".join(table.split())
    assert f"of 5 documents (10 segments; as llama.cpp's --kl-divergence; no intervals: {reason}" in flat
    assert "cluster BCa" not in table and "simulated coverage" not in table
    assert "KL p99 " in table and table.count("(no interval: 5 documents)") == len(TAIL) - 1 + 2
    codes = np.mean([u["bits_codes"] for u in few.units])
    assert few.bits["evaluated"]["measured_codes"] == pytest.approx(codes, rel=1e-12)
    assert saved["bits"]["evaluated"]["measured_codes"] == pytest.approx(codes, rel=1e-12)
    assert codes < few.bits["evaluated"]["measured"]  # the window's 8 fp32 tokens cost more than codes
    assert (f"{few.bits['evaluated']['measured']:.4g} bits per element held (measured: the codes and the exact "
            f"window of 8 tokens); the codes alone {codes:.4g} bits per element of the quantized tokens") in table

    enough = kvstats.evaluate("kqv", bits=3, model=tiny_folder, segment=32, documents=ENOUGH, inference=options)
    assert enough.config["documents"] == POOLED_MIN_DOCUMENTS == len(enough.units)
    tok = enough.summary["evaluated"]["tokens"]
    units = [np.array(u["tokens_out_kl"]) for u in enough.units]
    want = cluster_bootstrap_ci(units, np.mean, clusters=[u["document"] for u in enough.units], n_resamples=199,
                                seed=5)
    assert tuple(tok["kl_mean"].confidence_interval) == pytest.approx(tuple(want.confidence_interval), rel=1e-12)
    assert all(math.isfinite(tok[n].confidence_interval.low) for n in tok if n != "kl_max")
    low, high = POOLED_COVERAGE[POOLED_MIN_DOCUMENTS]
    assert (f"95% cluster BCa bootstrap over the {POOLED_MIN_DOCUMENTS} documents, then their segments; simulated "
            f"coverage of a nominal 95% at {POOLED_MIN_DOCUMENTS} documents: {low}-{high}%") in " ".join(
                enough.table().split())
    assert "no interval: " not in enough.table().replace("(no interval: none covers a maximum)", "")
    assert "exact window" in enough.table() and "codes alone" not in enough.table()  # no window, no second figure


@pytest.mark.slow
def test_the_cluster_bootstrap_loses_its_level_below_the_stated_number_of_documents():
    """What POOLED_MIN_DOCUMENTS rests on: one segment of 128 lognormal token values per document with a document
    effect, the pooled mean's 95% cluster BCa interval against the closed-form mean exp((0.5² + 1.2²)/2), 200 data
    sets each: at POOLED_MIN_DOCUMENTS documents it covered 89.5% (a 0.83 floor is 3 binomial sd below), at half
    as many 76.5% (a 0.86 ceiling is 4 sd above)."""
    from kvstats.measure.stats import cluster_bootstrap_ci

    truth = math.exp((0.5 ** 2 + 1.2 ** 2) / 2)

    def covered(documents: int) -> float:
        hits = 0
        for s in range(200):
            rng = np.random.default_rng(10_000 + s)
            units = [np.exp(rng.normal(0, 0.5) + rng.normal(0, 1.2, 128)) for _ in range(documents)]
            ci = cluster_bootstrap_ci(units, np.mean, n_resamples=499, seed=s).confidence_interval
            hits += ci.low <= truth <= ci.high
        return hits / 200

    assert covered(POOLED_MIN_DOCUMENTS) >= 0.83 and covered(POOLED_MIN_DOCUMENTS // 2) <= 0.86


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::kvstats.evaluation.results.InconclusiveWarning")
def test_evaluate_on_a_model_pools_tokens_and_compares_over_documents(tiny_folder, tmp_path):
    out = tmp_path / "model.json"
    ev = kvstats.evaluate("kqv", bits=3, model=tiny_folder, compare="kv", segment=32, segments_per_document=2,
                          documents=DOCS, out=out, inference=InferenceOptions(n_resamples=499))
    assert len(ev.units) == 10 and ev.config["documents"] == 5
    pooled = np.concatenate([u["tokens_out_kl"] for u in ev.units])
    tok = ev.summary["evaluated"]["tokens"]
    for name, q in TAIL.items():
        want = pooled.mean() if q is None else np.quantile(pooled, q)
        assert tok[f"kl_{name}"].statistic == pytest.approx(want, rel=1e-12)
    deltas = np.concatenate([np.array(u["tokens_nll"]) - np.array(u["tokens_nll_ref"]) for u in ev.units])
    assert tok["ppl_ratio"].statistic == pytest.approx(math.exp(deltas.mean()), rel=1e-12)
    per_doc = [np.mean([u["out_kl"] for u in ev.units if u["document"] == d]) for d in range(5)]
    assert ev.summary["evaluated"]["documents"]["out_kl"].statistic == pytest.approx(np.mean(per_doc), rel=1e-12)
    assert ev.summary["evaluated"]["documents"]["out_kl"].n == 5  # documents, not segments
    assert set(ev.comparison) <= {"out_kl", "top1", "delta_nll"} and ev.comparison
    for c in ev.comparison.values():
        assert c["test"].n == 5
    saved = json.loads(out.read_text(), parse_constant=lambda t: pytest.fail(f"not strict JSON: {t}"))
    assert saved["schema"] == "kvstats-model-evaluation/1" and "torch" in saved["provenance"]["versions"]
    assert "KL p99.9" in ev.table() and "same top p" in ev.table()


@pytest.mark.slow
def test_cli_evaluate_model(tiny_folder, capsys):
    from kvstats.cli.parser import main

    assert main(["evaluate", "--model", str(tiny_folder), "--quantizer", "turbo_mse", "--bits", "4", "--segment",
                 "32", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "turbo_mse at 4 bits on" in out and "KL p99" in out and "PPL ratio" in out
    assert main(["evaluate", "--model", str(tiny_folder), "--data", "gaussian", "--quantizer", "kqv",
                 "--bits", "4"]) == 2
    assert "not both" in capsys.readouterr().err


def test_sensitivity_figure_ticks_whole_layers(tmp_path, monkeypatch):
    """Two layers: the x axis shows layers 0 and 1, no fractional ticks between them (it showed 0.0, 0.2, ...)."""
    import matplotlib.figure

    from kvstats.evaluation.sensitivity import sensitivity_figure

    seen = []
    save = matplotlib.figure.Figure.savefig

    def record(fig, *args, **kwargs):
        fig.canvas.draw()
        low, high = fig.axes[0].get_xlim()
        seen.append([t for t in fig.axes[0].get_xticks() if low <= t <= high])
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    rows = [{"layer": i, "only_mean": 0.1 * (i + 1), "only_low": 0.05, "only_high": 0.3, "saved_mean": 0.05,
             "saved_low": 0.0, "saved_high": 0.1} for i in range(2)]
    sensitivity_figure(rows, 0.3, 0.15, [1], "t", tmp_path / "s.png")
    assert seen and all(float(t).is_integer() for t in seen[0]) and {0.0, 1.0} <= set(seen[0])


def test_cli_text_gives_the_documents_of_evaluate_and_sensitivity(tiny_folder, tmp_path, capsys):
    """--text: the user's files are the documents (named by the file), the same numbers as evaluate(documents=)
    with their texts; a folder gives its .txt files; --text without --model is refused by name."""
    from kvstats.cli.parser import main

    folder = tmp_path / "texts"
    folder.mkdir()
    for i in range(3):
        (folder / f"d{i}.txt").write_text(DOCS[f"doc {i}"], encoding="utf-8")
    out = tmp_path / "ev.json"
    assert main(["evaluate", "--model", str(tiny_folder), "--quantizer", "kv", "--bits", "3", "--segment", "32",
                 "--text", str(folder / "d0.txt"), str(folder / "d1.txt"), str(folder / "d2.txt"), "--out", str(out),
                 "--no-progress"]) == 0
    units = json.loads(out.read_text())["units"]
    assert [u["title"] for u in units] == ["d0.txt", "d1.txt", "d2.txt"]
    ev = kvstats.evaluate("kv", bits=3, model=tiny_folder, segment=32, progress=False,
                          documents={f"d{i}.txt": DOCS[f"doc {i}"] for i in range(3)})
    assert [u["out_kl"] for u in units] == [u["out_kl"] for u in ev.units]
    assert main(["sensitivity", "--model", str(tiny_folder), "--quantizer", "kv", "--bits", "3", "--documents", "0",
                 "--segment", "32", "--text", str(folder), "--no-progress"]) == 0
    assert "3 documents" in capsys.readouterr().out
    assert main(["evaluate", "--quantizer", "kv", "--bits", "3", "--text", str(folder)]) == 2
    assert "--text is for --model" in capsys.readouterr().err


@pytest.mark.parametrize("make, message", [
    (lambda d: [d / "missing.txt"], "no such file or folder"),
    (lambda d: [d], "is a folder with no .txt files"),
    (lambda d: [d / "empty.txt"], "is empty"),
    (lambda d: [d / "latin1.txt"], "is not UTF-8 text"),
    (lambda d: [d / "ok.txt", d / "ok.txt"], "twice"),
])
def test_read_documents_refuses_what_it_cannot_read_naming_the_path(make, message, tmp_path):
    from kvstats.data.texts import read_documents

    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "ok.txt").write_text("fine", encoding="utf-8")
    empty = tmp_path / "sub"
    empty.mkdir()
    paths = make(empty if "folder" in message else tmp_path)
    with pytest.raises(ValueError, match=rf"--text .*{message}"):
        read_documents(paths)


@pytest.mark.slow
def test_sensitivity_measures_each_layer_and_its_recommendation(tiny_folder, tmp_path):
    """Oracles: quantizing no layer is exact (a lossless scheme on every layer gives KL 0); 'only L' and 'all but
    L' are the mean over documents of model_unit's KL under those per-layer schemes, recomputed here; the
    recommended set's damage is measured and at most the target when reached."""
    from kvstats.evaluation.sensitivity import sensitivity
    from kvstats.hf.cache import IdentityScheme

    s = sensitivity("qkqv", bits=2, model=tiny_folder, documents_used=3, segment=32, documents=DOCS, target=1e-9)
    assert s.layers == 2 and s.config["documents"] == 3
    src = model_source(tiny_folder, segment=32, documents=DOCS)
    quant = kvstats.scheme("qkqv", bits=2, dim=src.dims["head_dim"], seed=0)
    exact = IdentityScheme(src.dims["head_dim"])
    for name, keep in (("only 0", {1}), ("all but 0", {0}), ("all", set())):
        want = np.mean([model_unit(src, lambda i, k=keep: exact if i in k else quant, ids)["out_kl"]
                        for _, _, ids in src.segments[:3]])
        assert s.damage[name].statistic == pytest.approx(want, rel=1e-9)
    rec = s.recommendation  # target 1e-9: only keeping every layer exact reaches it
    assert rec["keep_exact"] == [0, 1] and rec["reached"] and rec["damage"].statistic < 1e-9
    png = s.figure(tmp_path / "s.png")
    assert png.stat().st_size > 1000
    assert "keep exact: 0, 1" in s.table()
    json.loads(s.to_json(), parse_constant=lambda t: pytest.fail(f"not strict JSON: {t}"))


@pytest.mark.slow
@pytest.mark.parametrize("spec, bits", [("fp8_e4m3/nvfp4", 6), ("int_token", 4), ("fp8_e5m2", 8)])
def test_sensitivity_takes_the_deployed_formats_and_pairs(spec, bits, tiny_folder):
    """The formats by name and the FP8-K/NVFP4-V pair in sensitivity: 'all' and 'only 0' are the mean over documents
    of model_unit's KL under the scheme kvstats.scheme builds for the spec (layer 0 alone quantized), recomputed."""
    from kvstats.evaluation.sensitivity import sensitivity
    from kvstats.hf.cache import IdentityScheme

    s = sensitivity(spec, bits=bits, model=tiny_folder, documents_used=2, segment=32, documents=DOCS,
                    configurations=["all", "only 0"])
    src = model_source(tiny_folder, segment=32, documents=DOCS)
    quant = kvstats.scheme(spec, bits=bits, dim=src.dims["head_dim"], seed=0)
    exact = IdentityScheme(src.dims["head_dim"])
    for name, keep in (("only 0", {1}), ("all", set())):
        want = np.mean([model_unit(src, lambda i, k=keep: exact if i in k else quant, ids)["out_kl"]
                        for _, _, ids in src.segments[:2]])
        assert want > 0 and s.damage[name].statistic == pytest.approx(want, rel=1e-9)


def test_cli_sensitivity(tiny_folder, tmp_path, capsys):
    from kvstats.cli.parser import main

    out = tmp_path / "sens.json"
    assert main(["sensitivity", "--model", str(tiny_folder), "--quantizer", "kqv", "--bits", "2", "--documents", "2",
                 "--segment", "32", "--out", str(out), "--no-progress"]) == 0
    assert out.is_file() and (tmp_path / "sens.png").is_file()
    assert "all but this layer" in capsys.readouterr().out


@pytest.mark.slow
def test_sensitivity_in_parts_equals_one_run(tiny_folder):
    """A study splits the configurations over workers and joins them with known=: the same numbers, and the join
    measures only the bisection's sets."""
    from kvstats.evaluation.sensitivity import sensitivity

    args = dict(bits=2, model=tiny_folder, documents_used=3, segment=32, documents=DOCS)
    whole = sensitivity("kqv", **args)
    a = sensitivity("kqv", configurations=["all", "only 0", "only 1"], **args)
    b = sensitivity("kqv", configurations=["all but 0", "all but 1"], **args)
    assert a.recommendation is None and b.recommendation is None
    with pytest.raises(ValueError, match="partial sensitivity"):
        a.table()
    joined = sensitivity("kqv", known={**a.per_document, **b.per_document}, **args)
    for name in ("all", "only 0", "only 1", "all but 0", "saved 1"):
        assert joined.damage[name].statistic == pytest.approx(whole.damage[name].statistic, rel=1e-12)
    assert joined.recommendation["keep_exact"] == whole.recommendation["keep_exact"]
    with pytest.raises(ValueError, match="configurations must name"):
        sensitivity("kqv", configurations=["only 7"], **args)


def test_no_output_is_written_over_the_models_own_files(tiny_folder, tmp_path, capsys):
    from kvstats.cli.parser import main

    weights = next(p for p in tiny_folder.iterdir() if p.suffix == ".safetensors")
    before = weights.read_bytes()
    with pytest.raises(ValueError, match="is the input"):
        kvstats.evaluate("kqv", bits=4, model=tiny_folder, segment=32, documents=DOCS, out=weights, force=True)
    assert main(["capture", "--model", str(tiny_folder), "--out", str(weights), "--force", "--no-progress"]) == 2
    assert main(["sensitivity", "--model", str(tiny_folder), "--quantizer", "kqv", "--bits", "2", "--out",
                 str(weights), "--force", "--no-progress"]) == 2
    assert weights.read_bytes() == before
    out = tmp_path / "s.png"
    assert main(["sensitivity", "--model", str(tiny_folder), "--quantizer", "kqv", "--bits", "2", "--out", str(out),
                 "--no-progress"]) == 2  # the default figure path would be --out itself
    assert "its own path" in capsys.readouterr().err and not out.exists()
    assert main(["sensitivity", "--model", str(tiny_folder), "--quantizer", "kqv", "--bits", "2", "--out",
                 str(tmp_path / "s.json"), "--figure", str(tmp_path / "f.json"), "--no-progress"]) == 2
    assert "matplotlib writes" in capsys.readouterr().err and not (tmp_path / "s.json").exists()


def test_a_half_precision_model_is_measured_against_the_lossless_kvstats_path(tiny_folder):
    """bf16: the model's own sdpa rounds in bf16 where the kvstats path accumulates in fp32; the reference is then
    the kvstats path with a lossless scheme, so a lossless scheme does no damage, and the floor is reported."""
    ev = kvstats.evaluate(lambda bits, dim, seed: __import__("kvstats.hf.cache", fromlist=["x"]).IdentityQuantizer(dim),
                          bits=8, model=tiny_folder, segment=32, documents=DOCS, dtype=torch.bfloat16, check=False,
                          inference=InferenceOptions(n_resamples=99))
    assert ev.config["reference"].startswith("the kvstats path with a lossless scheme")
    assert ev.summary["evaluated"]["documents"]["out_kl"].statistic < 1e-9
    assert ev.config["lossless_floor"] > 1e-7  # measured on the tiny model: ~1e-4
