"""FP8 KV caches (fp8_e4m3, fp8_e5m2), bit for bit against two independent references:

* the OFP8 definition (OCP 8-bit Floating Point Specification rev 1.0): all 256 codes of each format decoded by hand
  from sign, exponent field and mantissa field (bias 7 / 15, subnormals, E4M3's single NaN pattern per sign, E5M2's
  infinities), and rounding done on that table in float64 — nearest value, a tie to the even code, saturating at
  ±max — never through the quantizer's code or torch's fp8 cast;
* torch's own float8 casts on pre-clamped values (``x.clamp(-max, max).to(torch.float8_e4m3fn)``).

Hand-picked ties, saturation, subnormals, zeros and signs; hypothesis inputs in fp16, bf16, fp32 and fp64; the scales
(unity, dynamic, calibrated; per tensor and per head), the bits (Code.nbytes against the closed form), the config,
the conformance kit and beam search through a KVStatsCache.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvstats
from kvstats.measure.testing import check_quantizer
from kvstats.quant.quantizers import QUANTIZERS, BitBudget, Code, Quantizer, quantizer
from kvstats.quant.quantizers.fp8 import E4M3, E5M2, FP8E4M3, FP8E5M2, fp8_values

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

NAMES = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}
# exponent bits, mantissa bits, bias, whether the top exponent field holds inf/NaN (E5M2) or finite values (E4M3)
FIELDS = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}
INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------- the reference: OFP8 by hand
def ofp8_value(code: int, fmt: str) -> float:
    """The value of one code byte from the OFP8 definition (never from torch)."""
    e_bits, m_bits, bias = FIELDS[fmt]
    sign = -1.0 if code >> 7 else 1.0
    e = (code >> m_bits) & ((1 << e_bits) - 1)
    m = code & ((1 << m_bits) - 1)
    top = (1 << e_bits) - 1
    if fmt == "e4m3" and e == top and m == (1 << m_bits) - 1:
        return math.nan  # S.1111.111: E4M3's only NaN (no infinities)
    if fmt == "e5m2" and e == top:
        return sign * math.inf if m == 0 else math.nan  # S.11111.00 inf, S.11111.{01,10,11} NaN
    if e == 0:
        return sign * math.ldexp(m, 1 - bias - m_bits)  # subnormal: 2^(1-bias) · m / 2^m_bits
    return sign * math.ldexp((1 << m_bits) + m, e - bias - m_bits)  # 2^(e-bias) · (1 + m / 2^m_bits)


def positive_table(fmt: str) -> torch.Tensor:
    """The finite non-negative values, indexed by their code (0 ... the code of max): increasing."""
    values = []
    for code in range(128):
        v = ofp8_value(code, fmt)
        if not math.isfinite(v):
            break
        values.append(v)
    return torch.tensor(values, dtype=torch.float64)


def reference_codes(y: torch.Tensor, fmt: str) -> torch.Tensor:
    """Round-to-nearest-even, saturating, codes of the exact values y (float64), on the hand-built table."""
    table = positive_table(fmt)
    a = y.double().abs().reshape(-1)
    hi = torch.searchsorted(table, a).clamp(1, len(table) - 1)  # table[hi-1] < a <= table[hi]
    lo = hi - 1
    dlo, dhi = a - table[lo], table[hi] - a
    pick = torch.where(dlo < dhi, lo, torch.where(dhi < dlo, hi, torch.where(lo % 2 == 0, lo, hi)))
    pick = torch.where(a >= table[-1], len(table) - 1, pick)  # saturate at ±max
    pick = torch.where(a == 0, 0, pick)
    sign = torch.signbit(y.double().reshape(-1)).to(torch.int64) << 7
    return (pick | sign).to(torch.uint8).reshape(y.shape)


def midpoints(fmt: str) -> torch.Tensor:
    """Every tie of the format (between consecutive finite values, and max + half an ulp), with both signs."""
    t = positive_table(fmt)
    mids = torch.cat([(t[1:] + t[:-1]) / 2, (t[-1] + (t[-1] - t[-2]) / 2).reshape(1)])
    return torch.cat([mids, -mids])


def torch_cast_codes(y: torch.Tensor, fmt: str) -> torch.Tensor:
    """The second reference: torch's own cast of pre-clamped fp32 values."""
    f = FORMATS[fmt]
    return y.float().clamp(-f.max, f.max).to(f.dtype).view(torch.uint8)


def encode_codes(values: torch.Tensor, fmt: str, **options) -> torch.Tensor:
    q = quantizer(NAMES[fmt], dim=values.shape[-1], **options)
    return q.encode(values).payload["codes"]


# ---------------------------------------------------------------------------------------------- the formats
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_all_256_codes_decode_as_the_ofp8_definition(fmt):
    by_hand = torch.tensor([ofp8_value(c, fmt) for c in range(256)], dtype=torch.float64)
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    decoded = fp8_values(codes, FORMATS[fmt], torch.float64)
    nan = torch.isnan(by_hand)
    assert torch.equal(torch.isnan(decoded), nan)
    assert torch.equal(decoded[~nan].view(torch.int64), by_hand[~nan].view(torch.int64))  # ±0 included, bit for bit
    if fmt == "e4m3":
        assert nan.nonzero().flatten().tolist() == [0x7F, 0xFF] and not torch.isinf(by_hand).any()
        assert (by_hand[0x7E], by_hand[0x01], by_hand[0x08], by_hand[0x07]) == (448.0, 2**-9, 2**-6, 7 * 2**-9)
    else:
        assert nan.nonzero().flatten().tolist() == [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]
        assert (by_hand[0x7C], by_hand[0xFC]) == (math.inf, -math.inf)
        assert (by_hand[0x7B], by_hand[0x01], by_hand[0x04], by_hand[0x03]) == (57344.0, 2**-16, 2**-14, 3 * 2**-16)
    f = FORMATS[fmt]
    assert (f.max, f.smallest_subnormal, f.smallest_normal) == (positive_table(fmt)[-1], by_hand[1], by_hand[1 << 3
                                                                if fmt == "e4m3" else 1 << 2])


HAND_PICKED = {  # value -> code, worked out from the definition by hand
    "e4m3": [(0.0, 0x00), (-0.0, 0x80), (1.0, 0x38), (-2.0, 0xC0), (448.0, 0x7E), (-448.0, 0xFE),
             (2**-9, 0x01), (-(2**-9), 0x81), (2**-6, 0x08), (7 * 2**-9, 0x07),
             (1.0625, 0x38), (1.1875, 0x3A), (2**-10, 0x00), (-(2**-10), 0x80), (3 * 2**-10, 0x02),
             (1.5 * 2**-10, 0x01), (464.0, 0x7E), (480.0, 0x7E), (1e6, 0x7E), (-1e6, 0xFE), (65504.0, 0x7E)],
    "e5m2": [(0.0, 0x00), (-0.0, 0x80), (1.0, 0x3C), (-2.0, 0xC0), (57344.0, 0x7B), (-57344.0, 0xFB),
             (2**-16, 0x01), (2**-14, 0x04), (3 * 2**-16, 0x03), (1.125, 0x3C), (1.375, 0x3E),
             (2**-17, 0x00), (-(2**-17), 0x80), (3 * 2**-17, 0x02), (61440.0, 0x7B), (65504.0, 0x7B),
             (-65504.0, 0xFB)],
}


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_hand_picked_ties_saturation_subnormals_zeros_and_signs(fmt, dtype):
    values, want = zip(*HAND_PICKED[fmt])
    x = torch.tensor(values, dtype=torch.float64)
    keep = x.to(dtype).double() == x  # each value exact in the input dtype (bf16: 1.0625 is)
    x, want = x[keep].to(dtype), torch.tensor(want, dtype=torch.uint8)[keep]
    got = encode_codes(x.reshape(1, -1), fmt).flatten()
    assert torch.equal(got, want) and torch.equal(reference_codes(x.double(), fmt), want)
    assert torch.equal(torch_cast_codes(x, fmt), want)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", (*INPUT_DTYPES, torch.float64))
def test_every_tie_and_its_neighbours_round_to_nearest_even(fmt, dtype):
    mids = midpoints(fmt)
    assert torch.equal(mids.to(dtype).double(), mids)  # every tie is exact in fp16, bf16, fp32
    up = torch.nextafter(mids.to(dtype), torch.tensor(math.inf, dtype=dtype))
    down = torch.nextafter(mids.to(dtype), torch.tensor(-math.inf, dtype=dtype))
    x = torch.stack([mids.to(dtype), up, down])  # [3, n]
    got = encode_codes(x, fmt)
    assert torch.equal(got, reference_codes(x.double(), fmt))
    if dtype != torch.float64:
        assert torch.equal(got, torch_cast_codes(x, fmt))
    assert not torch.equal(got[1], got[2])  # just above and just below a tie land on different codes


def test_fp64_input_is_rounded_once_not_twice():
    # 1 + 2^-4 + 2^-40 lies just above the tie between 1.0 and 1.125: it rounds to 1.125. Through fp32 it would
    # first become the tie 1 + 2^-4 and then round to even, 1.0 (what torch's direct cast from fp64 does).
    x = torch.tensor([[1 + 2**-4 + 2**-40, 1 + 2**-4 - 2**-40, -(1 + 2**-4 + 2**-40), 1.1875 - 2**-45]],
                     dtype=torch.float64)
    got = encode_codes(x, "e4m3")
    assert got.flatten().tolist() == [0x39, 0x38, 0xB9, 0x39]
    assert torch.equal(got, reference_codes(x, "e4m3"))
    assert x[:, :1].to(torch.float8_e4m3fn).view(torch.uint8).item() == 0x38  # the double rounding avoided


def test_plain_torch_casts_overflow_which_is_why_encode_clamps_first():
    big = torch.tensor([[1e6, -1e6, 70000.0, 61440.0]])
    assert torch.isinf(big.to(torch.float8_e5m2).float()).all()  # e5m2: a plain cast overflows to ±inf
    assert encode_codes(big, "e5m2").flatten().tolist() == [0x7B, 0xFB, 0x7B, 0x7B]  # encode saturates to ±57344
    assert encode_codes(big, "e4m3").flatten().tolist() == [0x7E, 0xFE, 0x7E, 0x7E]  # ±448
    q = quantizer("fp8_e5m2", dim=4)
    assert q.decode(q.encode(big)).tolist() == [[57344.0, -57344.0, 57344.0, 57344.0]]


# ------------------------------------------------------------------------------------------------- hypothesis
def _floats(width: int, limit: float):
    return st.floats(min_value=-limit, max_value=limit, allow_nan=False, allow_infinity=False, width=width)


def _tensor(values, dtype):
    return torch.tensor(values, dtype=torch.float64 if dtype == torch.bfloat16 else dtype).to(dtype).reshape(1, -1)


@st.composite
def vectors(draw):
    dtype = draw(st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]))
    width = {torch.float16: 16, torch.bfloat16: 32, torch.float32: 32, torch.float64: 64}[dtype]
    limit = 65504.0 if dtype == torch.float16 else 2.0**100
    spread = draw(st.sampled_from([2.0**-20, 2.0**-7, 1.0, 512.0, 2.0**16, limit]))  # subnormal to saturating
    values = draw(st.lists(_floats(width, min(spread, limit)), min_size=2, max_size=24))
    return _tensor(values, dtype)


@given(x=vectors(), fmt=st.sampled_from(["e4m3", "e5m2"]))
@settings(max_examples=100, deadline=None)
def test_unity_codes_and_decode_match_the_references(x, fmt):
    q = quantizer(NAMES[fmt], dim=x.shape[-1])
    code = q.encode(x)
    want = reference_codes(x.double(), fmt)
    assert torch.equal(code.payload["codes"], want)
    if x.dtype != torch.float64:
        assert torch.equal(code.payload["codes"], torch_cast_codes(x, fmt))
    table = torch.tensor([ofp8_value(c, fmt) for c in range(256)], dtype=torch.float64)
    x_hat = q.decode(code)
    assert x_hat.dtype == x.dtype and torch.equal(x_hat.double(), table[want.long()])  # fp8 values are exact in x's


@given(x=vectors(), fmt=st.sampled_from(["e4m3", "e5m2"]), granularity=st.sampled_from(["tensor", "head"]))
@settings(max_examples=100, deadline=None)
def test_dynamic_scales_and_codes_match_the_reference(x, fmt, granularity):
    f = FORMATS[fmt]
    x3 = x.reshape(1, 1, *x.shape)  # [B=1, H=1, n=1, d]
    q = quantizer(NAMES[fmt], dim=x.shape[-1], scale="dynamic", granularity=granularity, heads=1)
    code = q.encode(x3)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    s = x.to(acc).abs().max() / f.max  # the definition: amax / max in the accumulation dtype
    y = x.to(acc) / (s if s > 0 else 1)
    assert torch.equal(code.scalars["scale"].flatten(), s.reshape(1))
    assert torch.equal(code.payload["codes"].reshape(x.shape), reference_codes(y.double(), fmt))
    table = torch.tensor([ofp8_value(c, fmt) for c in range(256)], dtype=acc)
    x_hat = (table[code.payload["codes"].long()] * s).to(x.dtype)
    assert torch.equal(q.decode(code), x_hat)
    assert float(q.decode(code).double().abs().max()) <= float(x.double().abs().max()) * (1 + 2**-3)


# -------------------------------------------------------------------------------------------------- scales
def _kv(shape=(2, 4, 9, 32), seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("name", NAMES.values())
def test_dynamic_scale_is_per_head_or_per_sequence_and_zero_slabs_stay_zero(name):
    x = _kv()
    x[1, 2] = 0.0
    fmax = FORMATS[name[4:]].max
    head = quantizer(name, dim=32, scale="dynamic", granularity="head")
    c = head.encode(x)
    assert c.scalars["scale"].shape == (2, 4)
    assert torch.equal(c.scalars["scale"], x.abs().amax(dim=(-2, -1)) / fmax)
    tensor = quantizer(name, dim=32, scale="dynamic", heads=4)
    ct = tensor.encode(x)
    assert ct.scalars["scale"].shape == (2,)  # one per sequence: rows never share a scale (beam search)
    assert torch.equal(ct.scalars["scale"], x.abs().amax(dim=(-3, -2, -1)) / fmax)
    for q, code in ((head, c), (tensor, ct)):
        x_hat = q.decode(code)
        assert torch.isfinite(x_hat).all() and torch.equal(x_hat[1, 2], torch.zeros(9, 32))
        assert q.codes_per_vector is False


@pytest.mark.parametrize("name", NAMES.values())
@pytest.mark.parametrize("granularity", ["tensor", "head"])
def test_calibrated_scales_equal_dynamic_ones_on_the_calibration_data(name, granularity):
    x = _kv((1, 4, 9, 32), seed=1, scale=30.0)
    cal = quantizer(name, dim=32, scale="calibrated", granularity=granularity, heads=4).calibrate(x)
    dyn = quantizer(name, dim=32, scale="dynamic", granularity=granularity, heads=4)
    a, b = cal.encode(x), dyn.encode(x)
    assert torch.equal(a.payload["codes"], b.payload["codes"]) and not a.scalars  # the scales stay in the quantizer
    assert torch.equal(cal.scales.reshape(-1), b.scalars["scale"].reshape(-1))
    assert torch.equal(cal.decode(a), dyn.decode(b)) and cal.codes_per_vector is True


@pytest.mark.parametrize("name", NAMES.values())
def test_calibrated_values_beyond_the_range_saturate(name):
    fmax = FORMATS[name[4:]].max
    q = quantizer(name, dim=8, scale="calibrated", heads=1).load_scales(0.5)
    x = torch.tensor([[[[1e3 * fmax, -1e3 * fmax, 0.25, 0.0, -0.0, 1.0, 2.0, fmax / 2]]]])
    x_hat = q.decode(q.encode(x)).flatten()
    assert x_hat[:2].tolist() == [0.5 * fmax, -0.5 * fmax]  # max · s: saturated, never inf or NaN
    assert torch.equal(x_hat[2:7], x.flatten()[2:7]) and torch.signbit(x_hat[4])
    assert x_hat[7] == 0.5 * fmax


def test_calibration_is_required_refused_and_fingerprinted():
    q = quantizer("fp8_e4m3", dim=32, scale="calibrated", granularity="head", heads=4)
    assert q.needs_calibration and not q.calibrated and q.scales is None
    assert not QUANTIZERS["fp8_e4m3"].needs_calibration  # unity and dynamic need none: refused per instance
    with pytest.raises(ValueError, match=r"no scales yet: call \.calibrate\(keys\)"):
        q.encode(_kv())
    with pytest.raises(ValueError, match=r"keys must be \[\.\.\., 4 \(heads\), n, 32\]"):
        q.calibrate(_kv((2, 3, 9, 32)))
    zero = _kv()
    zero[:, 2] = 0
    with pytest.raises(ValueError, match=r"keys are all zero \(head 2\)"):
        q.calibrate(zero)
    with pytest.raises(ValueError, match="keys contains non-finite"):
        q.calibrate(_kv().index_fill_(-1, torch.tensor([0]), math.nan))
    code = q.calibrate(_kv()).encode(_kv())
    assert q.calibrated and q.scales.shape == (4,)
    q.calibrate(_kv(seed=5) * 2)  # new scales, new fingerprint: the old code is refused by name
    with pytest.raises(ValueError, match="code was made by"):
        q.decode(code)
    for bad, pattern in ((torch.ones(3), r"scales must have shape \[4\]"), ([1.0, 0.0, 1.0, 1.0], "> 0"),
                         ([1.0, math.nan, 1.0, 1.0], "finite"), ([1.0, 1e36, 1.0, 1.0], "<=")):
        with pytest.raises(ValueError, match=pattern):
            q.load_scales(bad)
    with pytest.raises(ValueError, match="calibrate sets the scales of scale='calibrated'"):
        quantizer("fp8_e5m2", dim=32).calibrate(_kv())


def test_bad_input_is_refused_by_name():
    q = quantizer("fp8_e4m3", dim=16, scale="dynamic", heads=2)
    for bad in (math.nan, math.inf, -math.inf):
        x = torch.randn(1, 2, 3, 16)
        x[0, 1, 2, 5] = bad
        with pytest.raises(ValueError, match="x contains non-finite"):
            q.encode(x)
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 2 \(heads\), n, 16\]"):
        q.encode(torch.randn(1, 3, 3, 16))
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 2 \(heads\), n, 16\]"):
        q.encode(torch.randn(3, 16))
    with pytest.raises(TypeError, match="x must be float16"):
        q.encode(torch.ones(1, 2, 3, 16, dtype=torch.int32))


# ----------------------------------------------------------------------------------------------------- bits
SCALE_CASES = [  # options, heads one scale covers (0: no scale)
    ({}, 0), ({"scale": "dynamic", "granularity": "head"}, 1), ({"scale": "dynamic", "heads": 4}, 4),
    ({"scale": "calibrated", "heads": 4}, 4), ({"scale": "calibrated", "granularity": "head", "heads": 4}, 1)]


@pytest.mark.parametrize("name", NAMES.values())
@pytest.mark.parametrize("options, per", SCALE_CASES)
def test_nbytes_is_the_closed_form(name, options, per):
    d, h = 32, 4
    q = quantizer(name, dim=d, **options)
    if options.get("scale") == "calibrated":
        q.calibrate(_kv())
    for n in (1, 7, 64):
        budget = q.bits_per_coordinate(n_tokens=n)
        side = 0.0 if not per else 32 / (n * d * per)  # one fp32 scale per n·d·H (tensor) or n·d (head) elements
        assert budget == BitBudget(payload=8.0, side=side)
        for dtype in INPUT_DTYPES:
            x = _kv((2, h, n, d)).to(dtype)
            code = q.encode(x)
            in_code = budget.total if options.get("scale") == "dynamic" else budget.payload  # calibrated: shared
            assert code.nbytes * 8 == pytest.approx(in_code * x.numel(), rel=1e-12)
            assert code.payload["codes"].dtype == torch.uint8 and code.payload["codes"].shape == x.shape
    assert q.bits_per_coordinate() == q.bits_per_coordinate(n_tokens=1)


def test_bits_at_the_cache_shapes():
    # d = 128, H = 8: a per-head dynamic scale of a one-token decode step costs 32/128 = 0.25 bits per element, a
    # per-sequence one 32/1024; a calibrated per-tensor scale over a 4096-token cache 32/(8·4096·128)
    dyn_head = quantizer("fp8_e4m3", dim=128, scale="dynamic", granularity="head")
    dyn_tensor = quantizer("fp8_e4m3", dim=128, scale="dynamic", heads=8)
    cal = quantizer("fp8_e5m2", dim=128, scale="calibrated", heads=8)
    assert dyn_head.bits_per_coordinate().total == 8.25 and dyn_tensor.bits_per_coordinate().total == 8.03125
    assert cal.bits_per_coordinate(n_tokens=4096).side == 32 / (8 * 4096 * 128)
    steps = [dyn_head.encode(torch.randn(2, 8, 1, 128)) for _ in range(16)]  # 16 decode steps
    assert sum(c.nbytes for c in steps) * 8 / (2 * 8 * 16 * 128) == 8.25
    assert quantizer("fp8_e5m2", dim=128).bits_per_coordinate(n_tokens=1000) == BitBudget(payload=8.0)
    with pytest.raises(ValueError, match=r"n_tokens must be in \[1, "):
        dyn_head.bits_per_coordinate(n_tokens=0)


# --------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("kwargs, error, pattern", [
    ({"bits": 4}, ValueError, "bits must be 8 for an FP8 format"),
    ({"bits": 9}, ValueError, "bits must be 8 for an FP8 format"),
    ({"bits": 8.0}, TypeError, "bits must be an int"),
    ({"scale": "static"}, ValueError, r"scale must be one of \('unity', 'dynamic', 'calibrated'\)"),
    ({"granularity": "channel", "scale": "dynamic"}, ValueError, "granularity must be one of"),
    ({"granularity": "head"}, ValueError, "granularity must be 'tensor' with scale='unity'"),
    ({"scale": "dynamic"}, ValueError, "heads must be given .* a scale covers all H heads"),
    ({"scale": "calibrated", "granularity": "head"}, ValueError, "heads must be given .* one scale per head"),
    ({"scale": "dynamic", "heads": 0}, ValueError, r"heads must be in \[1, 65536\]"),
    ({"heads": True}, TypeError, "heads must be an int"),
    ({"group_size": 4}, TypeError, "got unexpected option"),
])
def test_config_values_out_of_range_are_refused_by_field(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        quantizer("fp8_e4m3", dim=16, **kwargs)


def test_configs_are_frozen_and_rebuild_the_quantizer():
    from kvstats.quant.quantizers.config import FP8E4M3Config, FP8E5M2Config

    q = quantizer("fp8_e5m2", dim=64, scale="dynamic", heads=8)
    assert type(q) is FP8E5M2 and type(q.config) is FP8E5M2Config and q.bits == 8
    assert q.config.to_dict() == {"method": "fp8_e5m2", "bits": 8, "dim": 64, "seed": 0, "scale": "dynamic",
                                  "granularity": "tensor", "heads": 8}
    assert FP8E5M2.from_config(q.config).provenance() == q.provenance()
    assert q.config.replace(granularity="head").granularity == "head"
    with pytest.raises(TypeError, match="config must be a FP8E4M3Config"):
        FP8E4M3(config=q.config)
    assert FP8E4M3(dim=16).config == FP8E4M3Config(dim=16)
    assert quantizer("fp8_e4m3", dim=16).provenance() != quantizer("fp8_e5m2", dim=16).provenance()
    with pytest.raises(ValueError, match="code was made by"):
        quantizer("fp8_e4m3", dim=16).decode(quantizer("fp8_e5m2", dim=16).encode(torch.randn(2, 16)))


# ------------------------------------------------------------------------------------- the kit and the cache
CONFORMANCE = [  # options, check_quantizer's heads (None: any shape [..., n, d])
    ({}, None), ({"scale": "dynamic", "granularity": "head"}, None), ({"scale": "dynamic", "heads": 3}, 3),
    ({"scale": "calibrated", "heads": 3}, 3), ({"scale": "calibrated", "granularity": "head", "heads": 3}, 3)]


@pytest.mark.parametrize("name", NAMES.values())
@pytest.mark.parametrize("options, heads", CONFORMANCE)
def test_fp8_passes_the_conformance_kit(name, options, heads):
    cal = _kv((2, 3, 50, 64), seed=7, scale=2.0)

    def build(bits, dim, seed):
        q = quantizer(name, bits=bits, dim=dim, seed=seed, **options)
        return q.calibrate(cal) if options.get("scale") == "calibrated" else q

    check_quantizer(build(8, 64, 0), build=build, heads=heads)


class _Dequantized(Quantizer):
    """The oracle's store for beam search: ``decode(encode(x))`` of the wrapped quantizer, in fp32."""

    name = "fp8_dequantized"
    min_bits = max_bits = 32

    def __init__(self, inner: Quantizer):
        super().__init__(32, inner.dim, 0)
        self.wrapped = inner

    def _encode(self, x):
        return Code(x.shape, x.dtype, payload={"x_hat": self.wrapped.decode(self.wrapped.encode(x)).float()})

    def _decode(self, code):
        return code.payload["x_hat"].to(code.dtype)

    def bits_per_coordinate(self, n_tokens=None):
        return BitBudget(payload=32.0)


@pytest.mark.parametrize("name", NAMES.values())
@pytest.mark.parametrize("options", [o for o, _ in CONFORMANCE])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_scores_and_weighted_sums_from_the_codes_equal_the_ofp8_oracle(name, options, dtype):
    """inner and weighted_sum read the codes (the Lloyd kernels: the format's value table, the key's scale) against
    the float64 oracle built from the OFP8 definition by hand: x̂ = s · ofp8_value(code) with s the scale the code
    names (1, the code's dynamic scale, the calibrated one), rounded to x's dtype as decode rounds it. fp32 x: the
    kernels' summation order is the only difference, bounded by d·2^-24·Σ|q_d x̂_d|; fp16 x with a scale keeps
    decode-then-dot (decode rounds s · value to fp16), so the same bound holds."""
    q = quantizer(name, dim=64, **options)
    if options.get("scale") == "calibrated":
        q.calibrate(_kv((2, 3, 50, 64), seed=7, scale=2.0))
    x = _kv((2, 3, 40, 64), seed=11, scale=5.0).to(dtype)
    code = q.encode(x)
    table = torch.tensor([ofp8_value(c, name[4:]) for c in range(256)], dtype=torch.float64)
    values = table[code.payload["codes"].long()]
    if options.get("scale") == "dynamic":
        s = code.scalars["scale"].double()
        scale = s.reshape(*s.shape, *(1,) * (2 if options.get("granularity") == "head" else 3))
    elif options.get("scale") == "calibrated":
        scale = q.scales.double().reshape(-1, 1, 1) if options.get("granularity") == "head" else q.scales.double()
    else:
        scale = torch.ones((), dtype=torch.float64)
    x_hat = (values * scale).to(dtype).double()  # what decode returns, exactly
    assert torch.equal(q.decode(code).double(), x_hat)
    g = torch.Generator().manual_seed(5)
    queries = torch.randn(2, 3, 4, 64, generator=g, dtype=torch.float64).to(dtype)
    weights = torch.softmax(torch.randn(2, 3, 4, 40, generator=g, dtype=torch.float64), -1).to(dtype)
    bound = 64 * 2.0 ** -24
    scores, oracle = q.inner(queries, code).double(), queries.double() @ x_hat.transpose(-1, -2)
    assert ((scores - oracle).abs() <= bound * (queries.double().abs() @ x_hat.abs().transpose(-1, -2))).all()
    out, oracle = q.weighted_sum(weights, code).double(), weights.double() @ x_hat
    assert ((out - oracle).abs() <= bound * (weights.double() @ x_hat.abs())).all()
    # the fused decode step reads the same parts where the kernels reproduce decode (unity, or fp32 x)
    parts = q.decode_parts(code, torch.float32)
    assert (parts is not None) == (dtype == torch.float32 or not options.get("scale"))
    if parts is not None:
        assert parts.bits == 8 and parts.rotation is None
        assert torch.equal(parts.packed, code.payload["codes"].reshape(6, 40, 64))
        assert torch.equal(parts.norm.double(), scale.expand(2, 3, 40, 1).reshape(6, 40))
        finite = torch.isfinite(table)
        assert torch.equal(parts.levels.double()[finite], table[finite]) and (parts.levels[~finite] == 0).all()


@pytest.mark.parametrize("name, byte", [("fp8_e4m3", 0x7F), ("fp8_e4m3", 0xFF), ("fp8_e5m2", 0x7C),
                                        ("fp8_e5m2", 0xFE)])
def test_a_nan_or_inf_code_byte_is_refused_by_the_from_codes_path(name, byte):
    """A code byte encode never writes (E4M3's NaN, E5M2's inf and NaN) is refused by inner, weighted_sum, the plans
    and decode_parts, naming the quantizer: the kernels would read it at level 0, a finite wrong number."""
    fmt = FORMATS[name[4:]]  # the mask marks exactly the bytes the OFP8 definition makes NaN or inf
    assert [c for c in range(256) if c & fmt.special_mask == fmt.special_mask] == \
        [c for c in range(256) if not math.isfinite(ofp8_value(c, name[4:]))]
    q = quantizer(name, dim=32)
    code = q.encode(_kv((1, 2, 6, 32), seed=4))
    code.payload["codes"][0, 1, 3, 5] = byte
    query, weights = _kv((1, 2, 3, 32), seed=5), torch.softmax(_kv((1, 2, 3, 6), seed=6), -1)
    for call in (lambda: q.inner(query, code), lambda: q.weighted_sum(weights, code), lambda: q.inner_plan(code),
                 lambda: q.weighted_sum_plan(code), lambda: q.decode_parts(code, torch.float32)):
        with pytest.raises(ValueError, match=rf"{type(q).__name__}.*NaN or inf {name[4:]} bytes"):
            call()


@pytest.mark.slow
def test_beam_search_through_a_kvstats_cache_equals_the_dequantized_oracle():
    pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")
    from kvstats.hf.cache import KVStatsCache, cache_kwargs
    from kvstats.quant.schemes import Scheme
    from tests.helpers.llama import HKV, D, _tiny

    model = _tiny("sdpa")
    ids = torch.randint(1, 100, (1, 16), generator=torch.Generator().manual_seed(3))

    def beams(k, v):
        with torch.inference_mode():
            return model.generate(ids, **cache_kwargs(model, KVStatsCache(Scheme("fp8", 8, k, v))), num_beams=2,
                                  do_sample=False, max_new_tokens=6)

    cal = _kv((1, HKV, 40, D), seed=2)
    pairs = [(quantizer("fp8_e4m3", dim=D), quantizer("fp8_e5m2", dim=D)),
             (quantizer("fp8_e4m3", dim=D, scale="dynamic", granularity="head"),
              quantizer("fp8_e5m2", dim=D, scale="dynamic", heads=HKV)),
             (quantizer("fp8_e4m3", dim=D, scale="calibrated", heads=HKV).calibrate(cal),
              quantizer("fp8_e4m3", dim=D, scale="calibrated", granularity="head", heads=HKV).calibrate(cal))]
    for k, v in pairs:
        assert torch.equal(beams(k, v), beams(_Dequantized(k), _Dequantized(v)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cuda_codes_equal_the_references(fmt):
    mids = midpoints(fmt)
    x = torch.cat([mids, torch.nextafter(mids, mids * 2), torch.nextafter(mids, mids * 0), _kv((1000,), 3) * 100])
    for dtype in INPUT_DTYPES:
        xd = x.to(dtype).reshape(1, -1)
        q = quantizer(NAMES[fmt], dim=xd.shape[-1])
        code = q.encode(xd.cuda())
        assert torch.equal(code.payload["codes"].cpu(), reference_codes(xd.double(), fmt))
        assert torch.equal(q.decode(code).cpu(), q.decode(q.encode(xd)))
    dyn = quantizer(NAMES[fmt], dim=32, scale="dynamic", granularity="head")
    x4 = _kv(scale=50.0)
    a, b = dyn.encode(x4.cuda()), dyn.encode(x4)
    assert torch.equal(a.payload["codes"].cpu(), b.payload["codes"]) and torch.equal(a.scalars["scale"].cpu(),
                                                                                       b.scalars["scale"])
    assert kvstats.quantizer(NAMES[fmt], dim=32).encode(x4.cuda()).payload["codes"].is_cuda
