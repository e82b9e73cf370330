"""Frozen, validated quantizer configurations: built once, checked once, recorded, and enough to rebuild."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import kvstats
from kvstats.measure.stats import InferenceOptions
from kvstats.quant.quantizers import config as C
from kvstats.quantizers import QUANTIZERS, IdentityQuantizer, Quantizer, quantizer

REGISTERED = [("lloyd", {}), ("turbo_mse", {"rotation": "haar"}), ("turbo_prod", {"rows": "srht"}),
              ("qjl", {"outliers": [3, 1]}), ("minmax", {"axis": "channel", "group_size": 8}),
              ("rotated_minmax", {}), ("nova", {})]


@pytest.mark.parametrize("name, opts", REGISTERED)
def test_a_quantizer_rebuilt_from_its_config_is_the_same_quantizer(name, opts):
    q = quantizer(name, bits=2, dim=16, seed=5, **opts)
    assert isinstance(q.config, QUANTIZERS[name].Config) and q.config.method == name
    again = type(q).from_config(q.config)
    assert again.provenance() == q.provenance()
    x = torch.randn(1, 2, 40, 16, generator=torch.Generator().manual_seed(0))
    assert q.encode(x).equal(again.encode(x))
    # the constructor's keywords are the config's fields
    assert type(q)(**q.config.kwargs()).provenance() == q.provenance()


@pytest.mark.parametrize("name, opts", REGISTERED)
def test_a_config_is_frozen_and_json_ready(name, opts):
    q = quantizer(name, bits=2, dim=16, seed=5, **opts)
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.config.bits = 3
    record = json.loads(json.dumps(q.config.to_dict(), allow_nan=False))
    assert record["method"] == name and record["dim"] == 16 and record["seed"] == 5
    for key, value in q.config.options().items():  # every option is recorded, dtypes by their names
        assert record[key] == (str(value) if isinstance(value, torch.dtype) else
                               list(value) if isinstance(value, tuple) else value)


def test_options_read_through_the_config():
    q = quantizer("turbo_prod", bits=3, dim=32, rows="orthogonal", norm_dtype=torch.float16)
    assert (q.rows, q.norm_dtype, q.rotation_kind) == ("orthogonal", torch.float16, "wht")
    assert q.options() == q.config.options()
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        q.nonsense  # noqa: B018


def test_a_fresh_seed_is_held_by_the_config_and_reproduces_the_codes():
    q = quantizer("turbo_mse", bits=3, dim=32, seed=None)
    assert isinstance(q.config.seed, int) and q.seed == q.config.seed
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
    assert type(q).from_config(q.config).encode(x).equal(q.encode(x))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(name="turbo_mse", bits=3, dim=32, nope=1), TypeError,
     r"TurboMSE got unexpected option\(s\) \['nope'\]; its options are \['norm_dtype', 'rotation'\]"),
    (dict(name="turbo_mse", bits=9, dim=32), ValueError, r"bits must be in \[1, 8\], got 9"),
    (dict(name="turbo_prod", bits=3, dim=32, rows="dense"), ValueError, "rows must be one of"),
    (dict(name="turbo_prod", bits=3, dim=32, rotation="dct"), ValueError, "rotation must be one of"),
    (dict(name="lloyd", bits=3, dim=32, norm_dtype=torch.int8), ValueError, "norm_dtype must be"),
    (dict(name="minmax", bits=3, dim=32, group_size=5), ValueError, "group_size must divide dim=32"),
    (dict(name="qjl", bits=2, dim=32, m=10), ValueError, "bits=2 and m=10 disagree"),
    (dict(name="nova", bits=4, dim=32, group_dim=4), ValueError, "group_dim must divide dim=32 and satisfy"),
    (dict(name="lloyd", dim=32), TypeError, "LloydQuantizer needs bits"),
])
def test_bad_configs_are_refused_naming_the_field(kwargs, error, message):
    with pytest.raises(error, match=message):
        quantizer(**kwargs)


def test_each_config_is_validated_once(monkeypatch):
    # TurboProd's stage 1 is a LloydStage, not a second quantizer checking its config again.
    calls = []
    for cls in (C.TurboProdConfig, C.TurboMSEConfig, C.LloydConfig):
        original = cls.validate
        monkeypatch.setattr(cls, "validate", lambda self, _o=original, _c=cls: (calls.append(_c.__name__), _o(self)))
    quantizer("turbo_prod", bits=4, dim=32)
    assert calls == ["TurboProdConfig"]
    calls.clear()
    kvstats.scheme("kqv", bits=4, dim=32)
    assert sorted(calls) == ["LloydConfig", "TurboMSEConfig", "TurboProdConfig"]  # TurboMSEConfig calls its base's


def test_a_config_of_another_quantizer_is_refused():
    with pytest.raises(TypeError, match="config must be a TurboProdConfig for TurboProd, got LloydConfig"):
        QUANTIZERS["turbo_prod"].from_config(C.LloydConfig(bits=2, dim=16))


def test_a_subclass_with_its_own_bit_range_gets_a_config_with_that_range():
    class Int4(Quantizer):
        name = "int4_cfg"
        min_bits = max_bits = 4

    assert Int4.Config.min_bits == Int4.Config.max_bits == 4 and issubclass(Int4.Config, C.QuantizerConfig)
    assert Int4(4, 16).config.bits == 4
    with pytest.raises(ValueError, match=r"bits must be in \[4, 4\], got 3"):
        Int4(3, 16)


def test_identity_config_holds_its_storage_dtype_and_width():
    q = IdentityQuantizer(16, dtype=torch.float16)
    assert (q.config.dtype, q.config.bits, q.bits, q.store_dtype) == (torch.float16, 16, 16, torch.float16)
    assert IdentityQuantizer.from_config(q.config).provenance() == q.provenance()


def test_a_scheme_is_a_pair_of_configs():
    s = kvstats.scheme("kqv", bits=3, dim=32, seed=2, rows="srht")
    cfg = s.config
    assert (cfg.name, cfg.bits, cfg.seed) == ("kqv", 3, 2)
    assert cfg.k == s.k.config and cfg.v == s.v.config and cfg.v.rows == "srht"
    record = json.loads(json.dumps(cfg.to_dict()))
    assert record["k"]["method"] == "turbo_mse" and record["v"]["method"] == "turbo_prod"
    assert record["k"]["seed"] != record["v"]["seed"]  # independent child seeds


def test_the_fingerprint_follows_the_config():
    a = quantizer("turbo_prod", bits=3, dim=32, seed=1)
    assert a.provenance() == quantizer("turbo_prod", bits=3, dim=32, seed=1, rows="gaussian").provenance()
    for change in ({"rows": "srht"}, {"rotation": "haar"}, {"norm_dtype": torch.float16}, {"seed": 2}):
        other = type(a).from_config(a.config.replace(**change))
        assert other.provenance().fingerprint != a.provenance().fingerprint, change


@pytest.mark.slow
def test_evaluate_records_the_configs_of_both_sides(tmp_path):
    from kvstats.evaluation.evaluator import evaluate

    out = tmp_path / "ev.json"
    with pytest.warns(UserWarning, match="cannot conclude"):  # 2 units: only the record is checked here
        ev = evaluate("kqv", bits=3, data="gaussian", units=2, seed=5, compare="minmax", out=out, dim=16,
                      kv_heads=1, q_heads=2, seq=32, n_q=4, inference=InferenceOptions(n_resamples=99))
    schemes = json.loads(out.read_text())["config"]["schemes"]
    assert schemes == json.loads(json.dumps(ev.config["schemes"]))
    k, v = schemes["evaluated"]["k"], schemes["evaluated"]["v"]
    assert (k["method"], v["method"], v["rows"], k["class"]) == ("turbo_mse", "turbo_prod", "gaussian",
                                                                  "kvstats.quant.quantizers.lloyd.TurboMSE")
    from kvstats._random import unit_seed

    unit0 = kvstats.scheme("kqv", bits=3, dim=16, seed=unit_seed(5, 0))  # unit 0's scheme
    assert k == unit0.config.to_dict()["k"] | {"class": k["class"], "name": "turbo_mse"}
    assert schemes["compared"]["k"]["axis"] == "channel" and schemes["compared"]["v"]["axis"] == "token"


class Round(Quantizer):
    """A user's quantizer with its own bit range (so its Config is generated) — module level: picklable."""

    name = "round_cfg"
    min_bits, max_bits = 2, 16

    def _encode(self, x):
        return kvstats.quantizers.Code(x.shape, x.dtype, payload={"x": x.to(torch.float16)})

    def _decode(self, code):
        return code.payload["x"].to(code.dtype)

    def bits_per_coordinate(self, n_tokens=None):
        return kvstats.quantizers.BitBudget(payload=16.0)


def test_a_generated_config_pickles_with_its_quantizer():
    import pickle

    q = Round(4, 16, seed=3)
    assert Round.Config.__qualname__ == "Round.Config" and Round.Config.method == "round_cfg"
    again = pickle.loads(pickle.dumps(q))
    assert again.config == q.config and again.provenance() == q.provenance()
    x = torch.randn(3, 16)
    torch.testing.assert_close(again.decode(q.encode(x)), q.decode(q.encode(x)))


def test_a_subclass_keeping_its_own_config_attribute_still_fingerprints_its_configuration():
    class WithConfig(Round):
        def __init__(self, bits, dim, seed=0, scale=2.0):
            super().__init__(bits, dim, seed)
            self.config = {"scale": scale}  # the user's own settings, under the natural name

    q = WithConfig(4, 16)
    code = q.encode(torch.randn(2, 16))
    assert q.decode(code).shape == (2, 16) and q.provenance().fingerprint
    s = kvstats.schemes.Scheme("mine", 4, q, q)
    assert s.config.k == q._qconfig  # the quantizer's configuration, not the user's dict


def test_config_and_arguments_together_are_refused_and_the_type_must_be_exact():
    cfg = C.TurboProdConfig(bits=2, dim=64)
    with pytest.raises(TypeError, match=r"give config= or the arguments \['bits', 'dim', 'rows'\], not both"):
        QUANTIZERS["turbo_prod"](4, 128, config=cfg, rows="srht")
    with pytest.raises(TypeError, match="config must be a LloydConfig for LloydQuantizer, got TurboMSEConfig"):
        QUANTIZERS["lloyd"].from_config(C.TurboMSEConfig(bits=3, dim=64, rotation="haar"))


@pytest.mark.parametrize("config, change, field, expected", [
    (C.MinMaxConfig(bits=3, dim=64), {"dim": 128}, "group_size", 128),
    (C.MinMaxConfig(bits=3, dim=64, axis="channel"), {"axis": "token"}, "group_size", 64),
    (C.MinMaxConfig(bits=3, dim=64, group_size=16), {"dim": 128}, "group_size", 16),  # given: kept
    (C.NovaConfig(bits=2, dim=64), {"bits": 1}, "group_dim", C.NovaConfig(bits=1, dim=64).group_dim),
    (C.QJLConfig(bits=1, dim=64), {"bits": 2}, "m", 128),
    (C.QJLConfig(bits=1, dim=64), {"dim": 128}, "m", 128),
    (C.QJLConfig(bits=1, dim=64), {"m": 256}, "bits", 4.0),
    (C.QJLConfig(dim=64, outliers=(1, 2)), {"m": 32}, "outlier_m", 32),
])
def test_replace_derives_again_what_was_derived(config, change, field, expected):
    assert getattr(config.replace(**change), field) == expected


def test_a_per_head_quantizer_records_every_heads_config():
    from kvstats.quantizers import PerHeadQuantizer

    heads = [quantizer("turbo_mse", bits=3, dim=16, seed=s) for s in (0, 1)]
    q = PerHeadQuantizer(heads)
    assert isinstance(q.config, C.PerHeadConfig) and q.config.heads == tuple(h.config for h in heads)
    record = kvstats.schemes.Scheme("x", 3, q, q).config.to_dict()
    assert [h["seed"] for h in record["k"]["heads"]] == [0, 1]


def test_a_haar_rotation_beyond_its_dense_limit_is_refused_by_the_config():
    with pytest.raises(ValueError, match="dim must be at most 16384 for rotation='haar'"):
        C.TurboMSEConfig(bits=3, dim=20000, rotation="haar")
