"""Schemes named by their quantizers: ``"fp8_e4m3"`` (K and V), the engines' FP8-K/NVFP4-V pair ``"fp8_e4m3/nvfp4"`` and
asymmetric widths ``"int_token@8/int_token@4"`` (:func:`kvstats.schemes.pair_widths`).

The oracles: each part is the registered quantizer at its width with the scheme's K or V child seed, built by hand,
encoding bit for bit the same; the widths follow the stated rule (n = (b_K + b_V)/2) on a table worked by hand; the
bits held are the codes' bytes, and equal the mean of the two formats' closed forms; everything else is refused by
name.
"""

from __future__ import annotations

import pytest
import torch

from kvstats._random import spawn_seeds
from kvstats.evaluation.evaluator import evaluate
from kvstats.evaluation.quantizer_sides import measured_bits
from kvstats.measure.stats import InferenceOptions
from kvstats.quant.quantizers import quantizer
from kvstats.quant.schemes import pair_widths, scheme


@pytest.mark.parametrize("name, bits, widths, label", [
    ("fp8_e4m3/nvfp4", 6, (8, 4), "fp8_e4m3@8/nvfp4@4"),  # both widths fixed by the formats
    ("nvfp4/fp8_e5m2", 6, (4, 8), "nvfp4@4/fp8_e5m2@8"),
    ("int_token@8/int_token@4", 6, (8, 4), "int_token@8/int_token@4"),
    ("int_token@8/int_token", 6, (8, 4), "int_token@8/int_token@4"),  # V gets what the budget leaves: 2·6 − 8
    ("int_token/int_token@2", 3, (4, 2), "int_token@4/int_token@2"),
    ("turbo_mse/minmax", 3, (3, 3), "turbo_mse@3/minmax@3"),  # neither given: both at n
    ("int_token@4/int_token@3", 3.5, (4, 3), "int_token@4/int_token@3"),  # half budgets from Python
    ("fp8_e4m3", 8, (8, 8), "fp8_e4m3"),  # a quantizer's name: K and V
    ("int_token", 2, (2, 2), "int_token"),
])
def test_widths_follow_the_mean_rule_and_the_parts_are_the_registered_quantizers(name, bits, widths, label):
    s = scheme(name, bits=bits, dim=32, seed=9)
    assert tuple(w for _, w in pair_widths(name, bits)) == widths
    assert (s.name, s.bits, s.k.bits, s.v.bits) == (label, bits, *widths)
    x = torch.randn(2, 2, 24, 32, generator=torch.Generator().manual_seed(1)) * 3
    for part, seed, width in zip((s.k, s.v), spawn_seeds(9, 2), widths):
        by_hand = quantizer(part.name, bits=width, dim=32, seed=seed)
        assert part.config == by_hand.config
        assert torch.equal(part.decode(part.encode(x)), by_hand.decode(by_hand.encode(x)))


def test_fp8_k_nvfp4_v_holds_the_mean_of_the_two_formats_closed_forms():
    """FP8 e4m3 with unity scale: 8 bits, nothing else. NVFP4 (d = 64): 4 payload bits + one e4m3 scale per 16
    values (0.5) + one fp32 global scale per head of each encode call (32 / (n·d)). Mean over K and V."""
    d, n, heads = 64, 48, 2
    s = scheme("fp8_e4m3/nvfp4", bits=6, dim=d)
    k = torch.randn(1, heads, n, d, generator=torch.Generator().manual_seed(2))
    v = torch.randn(1, heads, n, d, generator=torch.Generator().manual_seed(3))
    closed = (8 + 4 + 0.5 + 32 / (n * d)) / 2
    assert measured_bits(s, [(None, k, v)]) == closed
    assert float(s.bits_per_coordinate(n_tokens=n)["mean"].total) == closed


@pytest.mark.parametrize("name, bits, error, match", [
    ("fp8_e4m3/nvfp4", 4, ValueError, r"holds K at 8 and V at 4 bits: its budget n is their mean, 6, got bits=4"),
    ("fp8_e4m3", 4, ValueError, r"holds K at 8 and V at 8 bits"),
    ("int_token@8/int_token", 7, ValueError, r"int_token.*V quantizer int_token at 6 bits"),  # fine: 6 bits exist
    ("kv/fp8_e4m3", 6, ValueError, r"its K part 'kv' must be a registered quantizer"),
    ("fp8_e4m3/nvfp4/int_token", 6, ValueError, r"a pair is 'K/V' \(two quantizers\), got 3 parts"),
    ("int_token@x/int_token", 4, ValueError, r"its K part 'int_token@x'"),
    ("int_token@9/int_token@3", 6, ValueError, r"its K quantizer int_token at 9 bits: bits must be in \[1, 8\]"),
    ("nova/int_token", 4, ValueError, r"its K quantizer nova needs calibration"),
    ("int_token@4/int_token", 2.25, TypeError, r"bits must be a whole or half number of bits"),
    ("int_token@4/int_token", True, TypeError, r"bits must be a whole or half number of bits"),
    ("int_token@4/int_token", float("nan"), TypeError, r"bits must be a whole or half number of bits .*, got nan"),
    ("int_token@4/int_token", float("inf"), TypeError, r"bits must be a whole or half number of bits .*, got inf"),
])
def test_a_spec_that_cannot_be_built_exactly_is_refused_by_name(name, bits, error, match):
    if "at 6 bits" in match:  # int_token@8 with n = 7 leaves V 6 bits: that builds
        assert scheme(name, bits=bits, dim=32).v.bits == 6
        return
    with pytest.raises(error, match=match):
        scheme(name, bits=bits, dim=32)


def test_options_reach_both_parts_and_k_options_v_options_one():
    s = scheme("fp8_e4m3/fp8_e5m2", bits=8, dim=32, k_options={"scale": "dynamic", "granularity": "head"})
    assert (s.k.config.scale, s.v.config.scale) == ("dynamic", "unity")
    s = scheme("int_token@8/int_token@4", bits=6, dim=32, side_dtype=torch.float32)
    assert s.k.side_dtype == s.v.side_dtype == torch.float32
    with pytest.raises(TypeError, match=r"its V quantizer nvfp4 at 4 bits: .*scale"):
        scheme("fp8_e4m3/nvfp4", bits=6, dim=32, scale="dynamic", granularity="head")  # nvfp4 has no scale option


def test_rows_reach_the_parts_with_a_sketch_and_no_other():
    """rows= sets the QJL sketch of the parts that have one (turbo_prod, qjl) and is not passed to the formats, which
    have none (as kvstats.scheme documents for schemes without a QJL stage); a bad rows is refused by name."""
    s = scheme("turbo_prod/fp8_e4m3", bits=6, dim=32, rows="srht")
    assert s.k.config.rows == "srht" and "rows" not in s.v.config.options()
    assert scheme("fp8_e4m3/nvfp4", bits=6, dim=32, rows="gaussian").k.config.scale == "unity"
    with pytest.raises(ValueError, match=r"rows must be one of .*, got 'hadamard'"):
        scheme("fp8_e4m3", bits=8, dim=32, rows="hadamard")


def test_evaluate_takes_a_pair_and_compares_it():
    """evaluate on synthetic data (cache [1, 2, 512, 32]) with the FP8-K/NVFP4-V pair against int8-K/int4-V per
    token-head: the records carry each part's config and width, the bits held are the closed forms: (8 + 4.5 +
    32/(512·32))/2 and ((8 + 32/32) + (4 + 32/32))/2 = 7."""
    ev = evaluate("fp8_e4m3/nvfp4", bits=6, data="gaussian", units=3, dim=32, seed=0, compare="int_token@8/int_token",
                  inference=InferenceOptions(n_resamples=199), progress=False)
    schemes = ev.to_dict()["config"]["schemes"]
    assert schemes["evaluated"]["scheme"] == "fp8_e4m3@8/nvfp4@4"
    assert (schemes["evaluated"]["k"]["name"], schemes["evaluated"]["v"]["name"]) == ("fp8_e4m3", "nvfp4")
    assert (schemes["compared"]["k"]["bits"], schemes["compared"]["v"]["bits"]) == (8, 4)
    assert all(u["bits_total"] == (8 + 4.5 + 32 / (512 * 32)) / 2 and u["other:bits_total"] == 7 for u in ev.units)
