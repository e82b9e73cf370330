"""Per-layer recipes (kvstats.evaluation.layer_recipe): the solver against brute force over every map, the additivity
check against a hand-built two-layer case and scipy's t interval, the layer map's JSON round trip and its cache
reproducing the same logits bit for bit after loading."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from scipy import stats as sps

from kvstats.evaluation.layer_recipe import LayerMap, additivity, format_width, recipe_stability, solve_recipe

pytestmark = pytest.mark.usefixtures("one_thread")


def _brute_force(damage: np.ndarray, widths: np.ndarray, budget: float) -> float:
    """The least total damage over every map whose mean width fits the budget (F^(2L) maps)."""
    n_layers, _, n_formats = damage.shape
    best = np.inf
    for choice in itertools.product(range(n_formats), repeat=2 * n_layers):
        c = np.array(choice).reshape(n_layers, 2)
        if widths[c].mean() <= budget + 1e-12:
            best = min(best, float(np.take_along_axis(damage, c[..., None], -1).sum()))
    return best


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [2.0, 2.5, 3.0, 4.5, 8.0])
def test_solver_finds_the_least_damage_brute_force_finds(seed, budget):
    rng = np.random.default_rng(seed)
    widths = np.array([2.0, 4.0, 8.0])
    # damage falls with the width (as it does), with noise so that the optimum is not a rule of thumb
    damage = rng.gamma(2.0, 1.0, (3, 2, 1)) * np.array([4.0, 1.0, 0.1]) * rng.uniform(0.5, 1.5, (3, 2, 3))
    choice = solve_recipe(damage, widths, budget)
    assert choice.shape == (3, 2) and widths[choice].mean() <= budget + 1e-9
    got = float(np.take_along_axis(damage, choice[..., None], -1).sum())
    assert got == pytest.approx(_brute_force(damage, widths, budget), rel=1e-9, abs=1e-12)


def test_solver_refuses_what_it_cannot_solve():
    with pytest.raises(ValueError, match="below the narrowest format"):
        solve_recipe(np.ones((2, 2, 2)), [2, 4], 1.5)
    with pytest.raises(ValueError, match=r"damage must be \[layers, 2 \(K, V\), formats\]"):
        solve_recipe(np.ones((2, 3, 2)), [2, 4], 3)
    with pytest.raises(ValueError, match="finite"):
        solve_recipe(np.full((1, 2, 2), np.nan), [2, 4], 3)


def test_additivity_on_a_hand_built_two_layer_case():
    """Two layers, six documents: layer damages a, b alone and the recipe's damage a + b + 0.5·a·b (an interaction
    term): predicted Σ = a + b per document; the difference's mean and t interval by hand with scipy."""
    a = np.array([0.10, 0.20, 0.15, 0.30, 0.25, 0.12])
    b = np.array([0.05, 0.10, 0.08, 0.20, 0.11, 0.06])
    measured = a + b + 0.5 * a * b
    r = additivity(np.stack([a, b], 1), measured, margin=0.2)
    diff = measured - (a + b)
    half = sps.t.ppf(0.975, 5) * diff.std(ddof=1) / np.sqrt(6)
    assert r["predicted"] == pytest.approx((a + b).mean())
    assert r["difference"].statistic == pytest.approx(diff.mean())
    assert tuple(r["difference"].confidence_interval) == pytest.approx((diff.mean() - half, diff.mean() + half))
    assert r["verdict"] == "additive"  # the interaction is 1-3% of the damage: within ±20%
    assert additivity(np.stack([a, b], 1), 2 * (a + b), margin=0.2)["verdict"] == "super-additive"
    assert additivity(np.stack([a, b], 1), 0.5 * (a + b), margin=0.2)["verdict"] == "sub-additive"
    noisy = a + b + np.array([0.3, -0.3, 0.25, -0.2, 0.3, -0.35])
    assert additivity(np.stack([a, b], 1), noisy, margin=0.2)["verdict"] == "undecided"


def test_stability_of_a_clear_cut_map_and_of_a_coin_flip():
    widths = [2.0, 4.0]
    rng = np.random.default_rng(0)
    clear = np.tile(np.array([10.0, 0.1]), (8, 2, 2, 1)) * rng.uniform(0.9, 1.1, (8, 2, 2, 2))
    clear[:, 0, :, 0] = 0.01  # layer 0 hardly cares: 2 bits there, 4 on layer 1 fits a 3-bit budget
    r = recipe_stability(clear, widths, 3.0, resamples=50)
    assert r["same_map"] == 1.0 and (r["agreement"] == 1.0).all()
    assert r["choice"].tolist() == [[0, 0], [1, 1]]
    flip = np.zeros((8, 2, 2, 2))
    flip[..., 0] = 1.0 + rng.normal(0, 1.0, (8, 2, 2))  # every slot gains alike from 4 bits, up to noise
    r = recipe_stability(flip, widths, 3.0, resamples=50)
    assert r["same_map"] < 1.0


def test_layer_map_json_round_trip_and_refusals(tmp_path):
    m = LayerMap((("int_token@4", "int_token@2"), ("fp8_e4m3@8", "nvfp4@4"), ("exact", "int_token@3")))
    assert m.widths().tolist() == [[4, 2], [8, 4], [32, 3]] and m.mean_bits == pytest.approx(53 / 6)
    path = m.save(tmp_path / "map.json")
    assert LayerMap.load(path) == m
    assert LayerMap((("int_token@4", "int_token@2"), ("int_token@4", "exact"))).summary() == \
        "2 × K int_token@4, 1 × V exact, 1 × V int_token@2"
    with pytest.raises(ValueError, match=r"layers\[1\] V: format must be 'exact' or 'name@bits'"):
        LayerMap((("int_token@4", "int_token@2"), ("fp8_e4m3@8", "mystery@4")))
    with pytest.raises(ValueError, match="k_bits/v_bits disagree"):
        bad = m.to_dict()
        bad["layers"][0]["k_bits"] = 3
        LayerMap.from_dict(bad)
    assert format_width("exact", exact_bits=16) == 16
    for broken, named in (({"schema": "kvstats-kv-layer-map/1", "layers": [{"layer": 0, "k": "int_token@4"}]},
                           "a list of objects with"),
                          ({**m.to_dict(), "exact_bits": 7}, "exact_bits must be one of"),
                          ({**m.to_dict(), "exact_bits": True}, "exact_bits must be one of")):
        with pytest.raises(ValueError, match=named):
            LayerMap.from_dict(broken)
    (tmp_path / "not.json").write_bytes(b"\xff\xfe not json")
    with pytest.raises(ValueError, match="is not a kvstats layer map"):
        LayerMap.load(tmp_path / "not.json")


def test_a_loaded_map_reproduces_the_same_logits_bit_for_bit(tmp_path):
    from kvstats.evaluation.model_engine import quantized_logits
    from tests.helpers.llama import D, _tiny

    model = _tiny()
    m = LayerMap((("int_token@4", "int_token@2"), ("exact", "fp8_e4m3@8")))
    ids = torch.randint(1, 100, (1, 40), generator=torch.Generator().manual_seed(1))
    first, cache = quantized_logits(model, m.schemes(D), ids, record=False)
    again, _ = quantized_logits(model, LayerMap.load(m.save(tmp_path / "m.json")).schemes(D), ids, record=False)
    assert torch.equal(first, again)
    names = [layer.scheme.name for layer in cache.layers]
    assert names == ["int_token@4/int_token@2", "exact/fp8_e4m3@8"]
    # the cache holds the declared widths: int_token at 4 and 2 bits plus its per-token side, exact at 32
    assert cache.layers[0].scheme.k.bits == 4 and cache.layers[0].scheme.v.bits == 2


def _documents():
    from tests.helpers.texts import WORDS

    rng = np.random.default_rng(5)
    return {f"doc {i}": " ".join(rng.choice(WORDS, 40)) for i in range(6)}


def _text_folder(tmp_path):
    """The documents as text files, for the CLI's --text."""
    text = tmp_path / "docs"
    text.mkdir()
    for title, body in _documents().items():
        (text / f"{title}.txt").write_text(body)
    return text


def test_recipe_end_to_end_on_a_tiny_model_against_direct_measurements(tiny_folder):
    """Every number of a recipe run recomputed by hand: an isolated damage and the chosen map's damage by direct
    model_unit calls (bit for bit), the map by solve_recipe on the mean isolated damages, the additivity's parts."""
    from kvstats.evaluation.model_engine import model_unit, reference_logits
    from kvstats.evaluation.recipe_run import _single, recipe
    from kvstats.evaluation.sensitivity import _documents_source

    formats = ["int_token@2", "int_token@4"]
    r = recipe(formats, budgets=[5, 5.5], model=str(tiny_folder), documents=_documents(), documents_used=None,
               segment=16, resamples=20)
    source = _documents_source(str(tiny_folder), 16, _documents(), torch.float32, None)
    _, _, ids = source.segments[2]
    ref = reference_logits(source, ids)[0]
    direct = model_unit(source, _single(2, 1, 0, "int_token@2", 32).schemes(16), ids, reference=ref, record=False)
    assert r.units[2]["isolated"][1][0][0] == direct["out_kl"]
    per_doc = np.array([u["isolated"] for u in r.units])
    b = r.budgets[0]
    assert np.array_equal(solve_recipe(per_doc.mean(0), r.config["held_bits"], 5.0),
                          np.array([[formats.index(x["k"]), formats.index(x["v"])] for x in b["map"]["layers"]]))
    m = r.map(5.0)
    assert b["bits"] <= 5.0 * (1 + 1e-9)  # the budget is on the bits the codes hold, measured
    assert np.mean(b["layer_bits"]) == pytest.approx(b["measured"][0]["bits_total"])  # per layer, document 0
    again = model_unit(source, m.schemes(16), ids, reference=ref, record=False)
    assert b["measured"][2]["out_kl"] == again["out_kl"]
    assert b["additivity"]["measured"] == pytest.approx(np.mean([x["out_kl"] for x in b["measured"]]))
    u = b["versus_uniform"]
    # the comparator: the uniform map of most measured bits within the budget (int_token@2 holds 4 at d = 16)
    assert u is not None and u["format"] == "int_token@2" and u["bits"] == pytest.approx(4.0) and not u["equal_bits"]
    # the refinement: the solver's map first, then other maps the resamples chose (at 5.5 bits 1 of the 20 resamples
    # chose another), each measured end to end (recomputed here), and the refined map the one of least damage
    b55 = r.budgets[1]
    ref = b55["refinement"]
    assert ref[0]["solver"] and ref[0]["map"] == b55["map"] and len({json.dumps(x["map"]) for x in ref}) == len(ref)
    assert len(ref) == 2 and ref[1]["share"] == pytest.approx(1 - b55["stability"]["same_map"])
    other = LayerMap.from_dict(ref[1]["map"])
    direct = [model_unit(source, other.schemes(16), ids_, reference=reference_logits(source, ids_)[0],
                         record=False)["out_kl"] for _, _, ids_ in source.segments]
    assert ref[1]["measured"] == pytest.approx(np.mean(direct), rel=1e-12)
    assert r.map(5.5, refined=True) == LayerMap.from_dict(ref[int(np.argmin([x["measured"] for x in ref]))]["map"])
    assert r.map(5.0, refined=True) == r.map(5.0)  # no other map: the solver's
    json.loads(r.to_json())
    assert "budget 5 bits per element held" in r.table()
    assert 0 <= r.config["noise_floor"] < 1e-6  # a lossless cache is the model's own attention (fp32)
    ua = r.config["uniform_additivity"]["int_token@4"]
    assert ua["predicted"] == pytest.approx(per_doc[..., 1].sum(axis=(1, 2)).mean())
    assert ua["measured"] == pytest.approx(np.mean([u["uniform"]["int_token@4"]["out_kl"] for u in r.units]))



def test_documents_measured_apart_give_the_same_recipe_and_foreign_units_are_refused(tiny_folder):
    """recipe_unit per document (as the study's parallel cells run them), passed back as units, gives the one-run
    recipe bit for bit; units of other formats, out of order or too few are refused by name."""
    from kvstats.evaluation.recipe_run import recipe, recipe_unit

    formats = ["int_token@2", "int_token@4"]
    args = dict(model=str(tiny_folder), documents=_documents(), documents_used=4, segment=16)
    whole = recipe(formats, budgets=[5], resamples=20, **args)
    units = [recipe_unit(formats, i, **args) for i in range(4)]
    apart = recipe(formats, budgets=[5], resamples=20, units=units, **args)
    assert apart.units == whole.units and apart.budgets[0]["map"] == whole.budgets[0]["map"]
    assert [x["out_kl"] for x in apart.budgets[0]["measured"]] == [x["out_kl"] for x in whole.budgets[0]["measured"]]
    other = recipe_unit(["int_token@2", "int_token@3"], 0, **args)
    with pytest.raises(ValueError, match=r"units\[0\] was measured for other formats"):
        recipe(formats, budgets=[5], units=[other, *units[1:]], **args)
    with pytest.raises(ValueError, match=r"units\[0\] must be document 0"):
        recipe(formats, budgets=[5], units=[units[1], units[0], *units[2:]], **args)
    with pytest.raises(ValueError, match="one measurement per document"):
        recipe(formats, budgets=[5], units=units[:3], **args)
    with pytest.raises(ValueError, match="document must be"):
        recipe_unit(formats, 4, **args)

def test_cli_recipe_exports_maps_that_load_back(tiny_folder, tmp_path, capsys):
    from kvstats.cli.parser import main

    text = _text_folder(tmp_path)
    export = tmp_path / "maps"
    assert main(["recipe", "--model", str(tiny_folder), "--formats", "int_token@2", "int_token@4", "--budgets", "5",
                 "6", "--documents", "0", "--text", str(text), "--segment", "16", "--resamples", "10", "--export",
                 str(export), "--out", str(tmp_path / "r.json"), "--no-progress"]) == 0
    assert "against uniform int_token@2" in capsys.readouterr().out
    data = json.loads((tmp_path / "r.json").read_text())
    # at 6 bits, int_token@4's own bits at d = 16: compared at equal measured bits, unless the recipe is that map
    six = data["budgets"][1]
    if six["versus_uniform"] is None:
        assert six["versus_reason"] == "the recipe is the uniform int_token@4 map itself: nothing to compare"
        assert all(x["k"] == x["v"] == "int_token@4" for x in six["map"]["layers"])
    else:
        assert six["versus_uniform"]["format"] == "int_token@4" and six["versus_uniform"]["equal_bits"]
    for b in (5, 6):
        m = LayerMap.load(export / f"map_{b}bits.json")
        assert m.to_dict() == next(x["map"] for x in data["budgets"] if x["budget"] == b)
    assert main(["recipe", "--model", str(tiny_folder), "--formats", "int_token@2", "mystery@4", "--budgets",
                 "3"]) == 2
    assert "--formats: format must be 'exact' or 'name@bits'" in capsys.readouterr().err
    # int_token@2 holds 2 + 32/16 = 4 bits per element at d = 16: a 3-bit budget is refused before any measurement
    assert main(["recipe", "--model", str(tiny_folder), "--formats", "int_token@2", "int_token@4", "--budgets",
                 "3", "--text", str(text), "--segment", "16", "--no-progress"]) == 2
    assert "budgets: 3 bits is below the narrowest format's 4 bits per element held (int_token@2" in \
        capsys.readouterr().err



def test_cli_per_layer_recipe_exports_an_engine_form_that_loads_back(tiny_folder, tmp_path, capsys):
    """--per-layer ties K and V (engines hold one dtype per layer): the exported engine form's per-layer spec loads
    back as the same map, with the width and dtype its exact layers were measured at; a per-K/V map with int_token
    gets no engine form, says why, and an engine file of an earlier run in its place is removed."""
    from kvstats.cli.parser import main
    from kvstats.evaluation.recipe_export import from_layer_spec

    text = _text_folder(tmp_path)
    export = tmp_path / "maps"
    assert main(["recipe", "--model", str(tiny_folder), "--formats", "fp8_e4m3@8", "exact", "--budgets", "20",
                 "--documents", "0", "--text", str(text), "--segment", "16", "--resamples", "10", "--per-layer",
                 "--export", str(export), "--out", str(tmp_path / "r.json"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "engine form:" in err
    data = json.loads((tmp_path / "r.json").read_text())
    b = data["budgets"][0]
    assert data["config"]["tie_kv"] and all(x["k"] == x["v"] for x in b["map"]["layers"])
    m = LayerMap.load(export / "map_20bits.json")
    engine = json.loads((export / "map_20bits.engine.json").read_text())
    assert engine["exact_bits"] == 32 and engine["measured_dtype"] == "float32"
    assert from_layer_spec(engine["layer_spec"], layers=len(m), exact_bits=engine["exact_bits"]) == m
    assert main(["recipe", "--model", str(tiny_folder), "--formats", "int_token@2", "int_token@4", "--budgets", "20",
                 "--documents", "0", "--text", str(text), "--segment", "16", "--resamples", "10", "--export",
                 str(export), "--force", "--no-progress"]) == 0
    assert "no engine form: " in capsys.readouterr().err
    assert LayerMap.load(export / "map_20bits.json").layers[0][0].startswith("int_token")
    assert not (export / "map_20bits.engine.json").exists()  # the first run's, describing another map: removed
    assert main(["recipe", "--model", str(tiny_folder), "--formats", "int_token@2", "int_token@4", "--budgets", "5",
                 "--refine", "-1"]) == 2
    assert "--refine must be" in capsys.readouterr().err

def test_a_layer_map_cache_reports_each_layer_s_bits(tmp_path):
    """Per layer the bits its codes hold: int_token at b bits with fp16 scale and zero point per token is
    b + 32/d, fp8 8; every layer together their mean (K and V and every layer hold as many elements)."""
    from kvstats.evaluation.model_engine import quantized_logits
    from tests.helpers.llama import D, _tiny

    m = LayerMap((("int_token@4", "int_token@2"), ("fp8_e4m3@8", "fp8_e4m3@8")))
    ids = torch.randint(1, 100, (1, 24), generator=torch.Generator().manual_seed(2))
    _, cache = quantized_logits(_tiny(), m.schemes(D), ids, record=False)
    per_layer = [cache.memory(layer=i).bits_per_element for i in range(2)]
    assert per_layer == pytest.approx([(4 + 2) / 2 + 32 / D, 8.0])
    assert cache.memory().bits_per_element == pytest.approx(np.mean(per_layer))
    with pytest.raises(ValueError, match=r"layer must be a layer index in \[0, 2\), got 2"):
        cache.memory(layer=2)


def test_a_layer_map_is_a_quantizer_for_retrieval_and_model_evaluation_only(tiny_folder):
    """A recipe against uniform precision on the same trials (retrieval: McNemar) and the same documents (evaluate):
    the map's rows are its cache's, and a map on synthetic data is refused by name."""
    import kvstats
    from kvstats.evaluation.retrieval import evaluate_retrieval

    m = LayerMap((("int_token@4", "int_token@2"), ("int_token@2", "int_token@4")))
    ev = evaluate_retrieval(m, bits=3, model=str(tiny_folder), compare="int_token", tasks=["lookup"], lengths=[96],
                            prompts=2)
    assert ev.config["sides"]["A"] == {"label": m.name, "bits": 3.0}
    assert ev.config["schemes"]["evaluated"] == m.to_dict()
    assert {(t["a"], t["b"]) for t in ev.tests} == {("A", "fp"), ("B", "fp"), ("A", "B")}
    # the map's bits held per element: int_token at (4 + 2)/2 and (2 + 4)/2 nominal plus 32/d per token
    assert ev.units[0]["A"]["bits_per_element"] == pytest.approx(3 + 32 / 16)
    matched = evaluate_retrieval(m, bits=3, model=str(tiny_folder), compare="int_token", match_bits=True,
                                 tasks=["lookup"], lengths=[96], prompts=1)
    assert matched.config["compare_bits"] == 3  # int_token@3 holds 3 + 32/16 = 5 bits, the map's measured 5
    mev = kvstats.evaluate(m, bits=3, model=str(tiny_folder), documents=_documents(), segment=16, check=False)
    assert mev.config["quantizer"] == m.name and mev.bits["evaluated"]["measured"] == pytest.approx(3 + 32 / 16)
    with pytest.raises(ValueError, match=r"quantizer is a layer map \(layer map \(2 layers, 3 bits nominal\)\)"):
        kvstats.evaluate(m, bits=3)


def test_solver_with_k_and_v_tied_matches_brute_force_over_per_layer_maps():
    """tie_kv: one format per layer for K and V together (as engines store them): the least summed damage over
    every per-layer map, found by enumeration, and K equal to V in every layer."""
    rng = np.random.default_rng(11)
    widths = np.array([2.5, 4.5, 8.0])
    for budget in (4.0, 5.5, 6.0):  # each admits several per-layer maps of 3 layers
        damage = rng.exponential(1.0, (3, 2, 3)) / widths[None, None, :] ** 2
        choice = solve_recipe(damage, widths, budget, tie_kv=True)
        assert (choice[:, 0] == choice[:, 1]).all()
        feasible = [fs for fs in itertools.product(range(3), repeat=3) if widths[list(fs)].mean() <= budget + 1e-9]
        assert len(feasible) > 3
        best = min(sum(damage[i, :, f].sum() for i, f in enumerate(fs)) for fs in feasible)
        assert sum(damage[i, s, choice[i, s]] for i in range(3) for s in range(2)) == pytest.approx(best, rel=1e-9)
        # documents whose damages scatter: the resamples choose several maps, every one of them tied
        per_doc = damage[None] * rng.lognormal(0.0, 1.0, (6, 3, 2, 3))
        stable = recipe_stability(per_doc, widths, budget, resamples=40, tie_kv=True)
        assert all((c[:, 0] == c[:, 1]).all() for c, _ in stable["maps"])
        assert sum(share for _, share in stable["maps"]) == pytest.approx(1.0)


def test_engine_export_round_trips_and_refuses_what_engines_cannot_hold():
    """A per-layer map of engine dtypes -> the range spec and vLLM's flags -> the same map; K != V in a layer, a format
    with no engine dtype and malformed specs are refused by name."""
    from kvstats.evaluation.recipe_export import engine_export, from_layer_spec

    m = LayerMap((("exact", "exact"),) * 2 + (("nvfp4@4", "nvfp4@4"),) * 3 + (("fp8_e4m3@8", "fp8_e4m3@8"),))
    e = engine_export(m)
    assert e["layer_spec"] == "0-1:auto,2-4:nvfp4,5:fp8_e4m3"
    assert e["layer_dtypes"] == ["auto", "auto", "nvfp4", "nvfp4", "nvfp4", "fp8_e4m3"]
    assert e["vllm_args"] is None and "fp8_e4m3, nvfp4" in e["vllm_reason"]
    assert e["exact_bits"] == 32 and from_layer_spec(e["layer_spec"], layers=6, exact_bits=32) == m
    one = LayerMap((("exact", "exact"),) + (("fp8_e4m3@8", "fp8_e4m3@8"),) * 3)
    assert engine_export(one)["vllm_args"] == ["--kv-cache-dtype", "fp8_e4m3", "--kv-cache-dtype-skip-layers", "0"]
    assert from_layer_spec("1-3:fp8_e4m3", layers=4, default="auto", exact_bits=32) == one
    # vLLM's skip list is a list of layer indices: one word each
    two = LayerMap((("exact", "exact"), ("nvfp4@4", "nvfp4@4"), ("exact", "exact")), exact_bits=16)
    e2 = engine_export(two)
    assert e2["vllm_args"] == ["--kv-cache-dtype", "nvfp4", "--kv-cache-dtype-skip-layers", "0", "2"]
    assert e2["exact_bits"] == 16 and from_layer_spec(e2["layer_spec"], layers=3, exact_bits=16) == two
    assert from_layer_spec(e2["layer_spec"], layers=3, exact_bits=32) != two  # the width is part of the map
    with pytest.raises(ValueError, match="exact_bits must be one of"):
        LayerMap((("exact", "exact"),), exact_bits=7)
    with pytest.raises(ValueError, match="layer 0 has K nvfp4@4 and V fp8_e4m3@8"):
        engine_export(LayerMap((("nvfp4@4", "fp8_e4m3@8"),)))
    with pytest.raises(ValueError, match="layer 1's format int_token@4 has no engine KV-cache dtype"):
        engine_export(LayerMap((("exact", "exact"), ("int_token@4", "int_token@4"))))
    for spec, message in (("0-2:nvfp4", r"layers \[3, 4, 5\] without a dtype"), ("0-9:nvfp4", "outside layers 0-5"),
                          ("0:int4,1-5:auto", "dtype 'int4'"), ("0-3:auto,3-5:nvfp4", r"layers \[3\] are named twice"),
                          ("zero:auto", "is not 'layer:dtype'"), ("0-5:auto,", "'' is not 'layer:dtype'"),
                          ("", "spec must be a non-empty string")):
        with pytest.raises(ValueError, match=message):
            from_layer_spec(spec, layers=6, exact_bits=32)
    with pytest.raises(ValueError, match="layers must be"):
        from_layer_spec("0:auto", layers=0, exact_bits=32)



def test_the_public_recipe_is_the_function_even_after_its_parts_are_imported():
    """kvstats.evaluation.recipe is the recipe function: the module of its parts (layer_recipe) has its own name, so
    importing it cannot shadow the function on the package."""
    import kvstats.evaluation.layer_recipe  # noqa: F401
    import kvstats.evaluation.recipe_export  # noqa: F401
    from kvstats.evaluation import recipe
    from kvstats.evaluation.recipe_run import recipe as the_function

    assert recipe is the_function
