"""NVFP4 (kvstats.quant.quantizers.nvfp4) bit for bit against an independent reference.

The reference below is written from the format's definition (NVIDIA NVFP4; E2M1 from the OCP MX v1.0 spec §5.3.3,
E4M3 from the OCP 8-bit floating point spec): both value tables are built from their bit fields, rounding is a
nearest-neighbour search in those tables with ties to the even code, in numpy float32 arithmetic, and codes are
packed two per byte by hand. It never calls the quantizer's encode, torch's float8 cast or kvstats' packing.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import kvstats
from kvstats.measure.testing import check_quantizer
from kvstats.quant.quantizers import QUANTIZERS, NVFP4Quantizer, quantizer
from kvstats.quant.quantizers.config import NVFP4Config


# ------------------------------------------------------------------------------ the independent reference
def _e2m1_table() -> np.ndarray:
    """E2M1 magnitudes of the codes 0..7 from the bit fields: 2 exponent bits (bias 1), 1 mantissa bit."""
    out = []
    for code in range(8):
        e, m = code >> 1, code & 1
        out.append(m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2))
    return np.array(out)


def _e4m3_table() -> np.ndarray:
    """E4M3 (fn) magnitudes of the codes 0..126 from the bit fields: 4 exponent bits (bias 7), 3 mantissa bits;
    0x7F is NaN, there are no infinities."""
    out = []
    for code in range(127):
        e, m = code >> 3, code & 7
        out.append(m / 8 * 2.0**-6 if e == 0 else 2.0 ** (e - 7) * (1 + m / 8))
    return np.array(out)


E2M1 = _e2m1_table()
E4M3 = _e4m3_table()


def test_the_reference_tables_are_the_formats():
    assert E2M1.tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert E4M3[-1] == 448 and E4M3[1] == 2.0**-9 and E4M3[7] == 7 * 2.0**-9 and E4M3[8] == 2.0**-6
    assert np.all(np.diff(E4M3) > 0)


def round_to_table(r: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Index of the nearest table value to r ≥ 0 (float64, exact differences), ties to the even index, r beyond
    the largest value saturating to it."""
    r = np.minimum(np.asarray(r, dtype=np.float64), table[-1])
    lo = np.searchsorted(table, r, side="right") - 1
    hi = np.minimum(lo + 1, len(table) - 1)
    d_lo, d_hi = r - table[lo], table[hi] - r
    up = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return np.where(up, hi, lo).astype(np.int64)


def reference_nvfp4(x: np.ndarray, granularity: str = "head"):
    """NVFP4 of x [..., n, d] (d % 16 == 0; float32, or float64 for the oracles' path): (packed codes, e4m3 scale
    bytes, g, x̂), every operation in x's precision."""
    f32 = x.dtype.type
    blocks = x.reshape(*x.shape[:-1], -1, 16)
    amax_b = np.abs(blocks).max(-1)                                    # [..., n, d/16]
    amax = amax_b.max(-1)                                              # [..., n]
    if granularity == "head":
        amax = amax.max(-1)                                            # [...]: one per leading index
    g = np.asarray(amax / f32(2688), dtype=f32)
    gb = g[..., None, None] if granularity == "head" else g[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(gb > 0, (amax_b / f32(6)) / gb, f32(0)).astype(f32)
        scale_codes = round_to_table(ratio, E4M3)
        p = (E4M3[scale_codes].astype(f32) * gb).astype(f32)[..., None]  # [..., n, d/16, 1]
        v = (np.abs(blocks) / p).astype(f32)
    mag = np.where(p > 0, round_to_table(np.where(p > 0, v, 0), E2M1), 0)
    sign = np.signbit(blocks)
    codes = (mag + 8 * sign).reshape(x.shape)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    x_hat = (np.where(sign, f32(-1), f32(1)) * (E2M1[mag].astype(f32) * p)).astype(f32).reshape(x.shape)
    return packed, scale_codes.astype(np.uint8), g, x_hat


def bits_of(t: torch.Tensor) -> np.ndarray:
    """The bit patterns of a float tensor (so −0 ≠ +0 and NaN = NaN)."""
    int_type = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(int_type).numpy()


def assert_matches_reference(x: torch.Tensor, scope: str = "head"):
    """encode/decode of x (fp32/fp16/bf16, or fp64) equal the reference on x's values, bit for bit."""
    d = x.shape[-1]
    q = quantizer("nvfp4", dim=d, granularity=scope)
    code = q.encode(x)
    wide = x.double() if x.dtype == torch.float64 else x.float()
    packed, scales, g, x_hat = reference_nvfp4(wide.numpy(), scope)
    np.testing.assert_array_equal(code.payload["codes"].numpy(), packed)
    np.testing.assert_array_equal(code.payload["scales"].numpy(), scales)
    np.testing.assert_array_equal(bits_of(code.scalars["global_scale"]), bits_of(torch.from_numpy(g)))
    want = torch.from_numpy(x_hat).clamp(-torch.finfo(x.dtype).max, torch.finfo(x.dtype).max).to(x.dtype)
    np.testing.assert_array_equal(bits_of(q.decode(code)), bits_of(want))
    return q, code


# ---------------------------------------------------------------------------------------- hand-picked cases
MIDPOINTS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
#: the code each midpoint rounds to: the even one of its two neighbours (round half to even on the codes)
TIE_CODE = {0.25: 0, 0.75: 2, 1.25: 2, 1.75: 4, 2.5: 4, 3.5: 6, 5.0: 6}


def _with_unit_scales(values, p: float = 1.0) -> torch.Tensor:
    """x [1 + rows, 16]: row 0 holds 2688·p, so g = p; every other row is a block of amax 6p (s_b = 1) holding up
    to 15 of the values times p in its columns 1..15, so x / (s_b·g) gives the values back exactly."""
    values = list(values)
    rows = math.ceil(len(values) / 15)
    x = torch.zeros(rows + 1, 16)
    x[0, 0] = 2688 * p
    for r in range(rows):
        x[r + 1, 0] = 6 * p
        chunk = values[15 * r: 15 * r + 15]
        x[r + 1, 1: 1 + len(chunk)] = torch.tensor(chunk, dtype=torch.float32) * p
    return x


def _codes(code, shape) -> torch.Tensor:
    packed = code.payload["codes"]
    return torch.stack([packed & 15, packed >> 4], dim=-1).reshape(shape)


def _neighbours(m: float, dtype: torch.dtype, p: float) -> tuple[float, float]:
    """The values of dtype just below and just above m > 0 (one step of its bit pattern); for a p that is not a power
    of two, m ± 2^(⌊log2 m⌋ − 18), whose 19 bits times p's 4 stay exact in fp32."""
    if math.frexp(p)[0] != 0.5:
        step = 2.0 ** (math.floor(math.log2(m)) - 18)
        return m - step, m + step
    int_type = torch.int32 if dtype == torch.float32 else torch.int16
    bits = torch.tensor([m], dtype=dtype).view(int_type)
    return float((bits - 1).view(dtype)), float((bits + 1).view(dtype))


@pytest.mark.parametrize("dtype, p", [(torch.float32, 1.0), (torch.float32, 1.125 * 2.0**-3), (torch.float16, 1.0),
                                      (torch.float16, 2.0**-3), (torch.bfloat16, 1.0), (torch.bfloat16, 2.0**-3)])
def test_ties_go_to_the_even_code_and_neighbours_of_every_midpoint_to_their_side(dtype, p):
    # g = p and s_b = 1, so x / (s_b·g) = v exactly: v at, just below and just above every midpoint
    below, above = zip(*(_neighbours(m, dtype, p) for m in MIDPOINTS))
    values = [*MIDPOINTS, *below, *above, *(-m for m in MIDPOINTS)]
    x = _with_unit_scales(values, p).to(dtype)
    assert (x[1:, 1:].flatten()[: len(values)].float() / p).tolist() == values  # the values are exact in dtype
    q, code = assert_matches_reference(x)
    got = _codes(code, x.shape)[1:, 1:].flatten()[: len(values)]
    k = len(MIDPOINTS)
    assert got[:k].tolist() == [TIE_CODE[m] for m in MIDPOINTS]               # exactly on the midpoint: even code
    assert got[k: 2 * k].tolist() == list(range(7))                          # just below: the lower neighbour
    assert got[2 * k: 3 * k].tolist() == list(range(1, 8))                   # just above: the upper neighbour
    assert got[3 * k:].tolist() == [8 + TIE_CODE[m] for m in MIDPOINTS]     # negative ties: sign bit + even code
    x_hat = q.decode(code).float()[1:, 1:].flatten()[:k] / p
    assert x_hat.tolist() == [E2M1[TIE_CODE[m]] for m in MIDPOINTS]


def test_grid_values_are_exact_and_the_codes_are_packed_low_nibble_first():
    grid = [0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6, 0]
    x = _with_unit_scales(grid)
    q, code = assert_matches_reference(x)
    assert torch.equal(q.decode(code), x)
    packed = code.payload["codes"][1]  # row 1: [6, 0.5, 1, 1.5, ...] -> codes 7, 1, 2, 3, ...
    assert packed[:2].tolist() == [7 | 1 << 4, 2 | 3 << 4]
    assert code.payload["scales"][:, 0].tolist() == [0x7E, 0x38]  # 448 and 1.0 in e4m3
    assert code.scalars["global_scale"].tolist() == 1.0


def test_a_block_scale_tie_rounds_to_even_and_the_element_saturates_at_6():
    # g = 1; a block of amax 6.375 has r = 1.0625, the tie between e4m3 1.0 (mantissa 0) and 1.125: s = 1.0,
    # so 6.375 / 1.0 is beyond 6 and saturates to code 7 (6.0). One ulp more and s = 1.125: 6.375/1.125 -> 6.
    x = torch.zeros(3, 16)
    x[0, 0], x[1, 0], x[2, 0] = 2688, 6.375, float(np.nextafter(np.float32(6.375), np.float32(7)))
    q, code = assert_matches_reference(x)
    assert code.payload["scales"][:, 0].tolist() == [0x7E, 0x38, 0x39]
    assert (code.payload["codes"][1:, 0] & 15).tolist() == [7, 7]
    assert q.decode(code)[1:, 0].tolist() == [6.0, 6.75]


def test_the_block_scale_is_amax_over_6_then_over_g_in_fp32():
    # the definition's order matters at an e4m3 tie: here (a / 6) / g = 1.5625 exactly, the tie between 1.5 (0x3C,
    # even) and 1.625 (0x3D), while a / (6·g) = 1.5625001 would round up. Found by scanning fp32 neighbours.
    amax, a = 3.631707191467285, 0.012666389346122742
    f32 = np.float32
    g = f32(amax) / f32(2688)
    assert (f32(a) / f32(6)) / g == 1.5625 and f32(a) / (f32(6) * g) > 1.5625
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 16] = amax, a
    q, code = assert_matches_reference(x)
    assert code.payload["scales"][0].tolist() == [0x7E, 0x3C]


def test_block_scales_saturate_at_448_when_the_global_scale_is_subnormal():
    # amax = 1.5·2^-138: g = amax / 2688 is the fp32 subnormal 2^-149 (rounded down by a third), so r = amax/6/g =
    # 512, past 464 (halfway from 448 to the next binade step): the block scale saturates at 448 and its elements at 6.
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 16] = 1.5 * 2.0**-138, 2.0**-141
    f32 = np.float32
    assert (f32(x[0, 0]) / f32(6)) / (f32(x[0, 0]) / f32(2688)) == 512
    q, code = assert_matches_reference(x)
    assert code.payload["scales"][0, 0] == 0x7E and code.payload["codes"][0, 0] == 7
    assert float(code.scalars["global_scale"]) == 2.0**-149
    # amax below 2688·2^-150: g underflows to 0 and the whole tensor decodes to zeros (signs kept)
    tiny = torch.tensor([[2.0**-140, -(2.0**-141)] + [0.0] * 14])
    q, code = assert_matches_reference(tiny)
    assert float(code.scalars["global_scale"]) == 0 and torch.equal(q.decode(code), torch.zeros(1, 16))


def test_torch_e4m3_cast_is_the_ocp_table_with_ties_to_even_and_saturation():
    mids = (E4M3[1:] + E4M3[:-1]) / 2
    r = np.concatenate([E4M3, mids, np.nextafter(mids, 0), np.nextafter(mids, 1e9), [448.5, 464, 1e6, 1e-12, 0]])
    r = r.astype(np.float32)
    got = torch.from_numpy(r).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(got, round_to_table(r, E4M3))


@pytest.mark.parametrize("ratio, byte", [(2.0**-9, 0x01), (2.0**-8, 0x02), (7 * 2.0**-9, 0x07), (2.0**-6, 0x08),
                                         (2.0**-10, 0x00), (3 * 2.0**-10, 0x02), (2.0**-10 * 1.5, 0x01)])
def test_subnormal_block_scales(ratio, byte):
    # g = 1, a block of amax 6·r: s_b = e4m3(r), subnormal below 2^-6; 2^-10 ties to 0, 3·2^-10 to 2^-8 (even)
    x = torch.zeros(2, 16)
    x[0, 0], x[1, 0], x[1, 1], x[1, 2] = 2688, 6 * ratio, -3 * ratio, 0.5 * ratio
    q, code = assert_matches_reference(x)
    assert int(code.payload["scales"][1, 0]) == byte
    if byte == 0:  # the scale underflows e4m3: the block decodes to zeros that keep their sign
        assert bits_of(q.decode(code)[1, :3]).tolist() == bits_of(torch.tensor([0.0, -0.0, 0.0])).tolist()


def test_zero_blocks_zero_tensors_and_negative_zero():
    x = torch.randn(2, 3, 5, 64, generator=torch.Generator().manual_seed(0))
    x[0, 1, 2, 16:32] = 0
    x[1, 2] = 0  # a whole head zero: g = 0
    x[1, 0, 0, :16] = -0.0
    for scope in ("head", "token"):
        q, code = assert_matches_reference(x, scope)
        x_hat = q.decode(code)
        assert torch.equal(code.payload["scales"][0, 1, 2, 1], torch.tensor(0, dtype=torch.uint8))
        assert (x_hat[0, 1, 2, 16:32] == 0).all() and (x_hat[1, 2] == 0).all()
        assert torch.signbit(x_hat[1, 0, 0, :16]).all()
        assert (code.scalars["global_scale"][1, 2] == 0).all()
        assert torch.isfinite(x_hat).all()


def test_fp64_input_is_rounded_once_and_a_single_vector_has_one_global_scale():
    # fp64 (the oracles' path): every step in fp64, the block scale rounded once from fp64 (a ratio just above an
    # e4m3 midpoint, closer to it than fp32 can tell, still rounds up)
    x = torch.randn(3, 2, 7, 32, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    x[0, 0, 0, 0] = 2688.0
    x[0, 0, 0, 16] = 6 * 1.0625 * (1 + 2.0**-40)  # r = 1.0625·(1 + 2^-40): fp32 would make it the tie (-> 1.0)
    q, code = assert_matches_reference(x)
    assert code.scalars["global_scale"].dtype == torch.float64
    assert int(code.payload["scales"][0, 0, 0, 1]) == 0x39  # 1.125
    one = torch.randn(64, generator=torch.Generator().manual_seed(5))
    for granularity in ("head", "token"):
        q = quantizer("nvfp4", dim=64, granularity=granularity)
        code = q.encode(one)
        assert code.scalars["global_scale"].shape == () and code.payload["codes"].shape == (32,)
        assert torch.equal(q.decode(code), q.decode(q.encode(one[None]))[0])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_inf_are_refused_by_name(bad):
    q = quantizer("nvfp4", dim=32)
    x = torch.randn(3, 32)
    x[1, 5] = bad
    with pytest.raises(ValueError, match=r"^x contains non-finite values"):
        q.encode(x)


# ------------------------------------------------------------------------------------------- hypothesis
def _finite(width):
    return st.floats(allow_nan=False, allow_infinity=False, width=width, allow_subnormal=True,
                     min_value=-(2.0**60) if width == 32 else None, max_value=2.0**60 if width == 32 else None)


@st.composite
def inputs(draw):
    lead = draw(st.sampled_from([(), (2,), (1, 2)]))
    shape = (*lead, draw(st.integers(1, 4)), draw(st.sampled_from([16, 32, 64])))
    dtype = draw(st.sampled_from(["fp32", "fp16", "bf16"]))
    if dtype == "fp16":
        return torch.from_numpy(draw(hnp.arrays(np.float16, shape, elements=_finite(16)))), draw(_scopes)
    x = draw(hnp.arrays(np.float32, shape, elements=_finite(32)))
    # move whole tensors across the ranges (subnormal scales), below the input limit (2^120 at d = 64)
    exponent = draw(st.integers(-60, 50))
    x = torch.from_numpy(x) * 2.0**exponent
    return (x.to(torch.bfloat16) if dtype == "bf16" else x), draw(_scopes)


_scopes = st.sampled_from(["head", "token"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=inputs())
def test_encode_and_decode_equal_the_reference_bit_for_bit(case):
    x, scope = case
    assert_matches_reference(x, scope)


#: element values of a structured block (times its p = s_b·g): grid values, midpoints, and one fp32 step around them
_GRID_AND_TIES = sorted({*E2M1.tolist(), *MIDPOINTS, *(float(np.nextafter(np.float32(m), np.float32(d)))
                                                      for m in MIDPOINTS for d in (0, 7))})


@st.composite
def structured_inputs(draw):
    """x [rows, d] built to land on the format's edges: one element 2688·2^j (so g = 2^j exactly), then blocks of
    values v·s·2^j with s drawn from the e4m3 table (subnormals included) and v from grid values, midpoints and
    their neighbours, mostly with a ±6 in the block (so s_b = s and x / (s_b·g) = v: exact ties)."""
    rows, nb = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    j = draw(st.integers(-10, 4))
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    grid = np.array(_GRID_AND_TIES)
    v = grid[draw(hnp.arrays(np.int64, (rows, nb, 16), elements=st.integers(0, len(grid) - 1)))]
    six = draw(hnp.arrays(np.int64, (rows, nb), elements=st.integers(-3, 15)))  # < 0: no 6 in that block
    np.put_along_axis(v, np.maximum(six, 0)[..., None], np.where(six >= 0, 6.0, v[..., :1].max(-1))[..., None], -1)
    signs = draw(hnp.arrays(np.bool_, (rows, nb, 16)))
    s = E4M3[draw(hnp.arrays(np.int64, (rows, nb, 1), elements=st.integers(1, 126)))]
    x = (np.where(signs, -v, v) * s * 2.0**j).reshape(rows, nb * 16)
    sign = draw(st.sampled_from([-1, 1]))
    x[draw(st.integers(0, rows - 1)), draw(st.integers(0, nb * 16 - 1))] = sign * 2688 * 2.0**j
    return torch.from_numpy(x).to(dtype), draw(_scopes)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=structured_inputs())
def test_structured_inputs_with_ties_and_subnormal_scales_equal_the_reference(case):
    x, scope = case
    assert_matches_reference(x, scope)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 40), lead=st.sampled_from([(), (3,), (2, 2)]), d=st.sampled_from([16, 48, 128]),
       scope=_scopes, dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_bits_held_are_the_closed_form(n, lead, d, scope, dtype):
    q = quantizer("nvfp4", dim=d, granularity=scope)
    x = torch.randn(*lead, n, d).to(dtype)
    heads = math.prod(lead)
    globals_ = heads if scope == "head" else heads * n
    expected = heads * n * (d // 2 + d // 16) + 4 * globals_  # 4-bit codes, one e4m3 byte per 16, fp32 g's
    code = q.encode(x)
    assert code.nbytes == expected
    assert math.isclose(code.nbytes * 8, q.bits_per_coordinate(n_tokens=n).total * x.numel(), rel_tol=1e-12)


def test_bit_budgets():
    q = quantizer("nvfp4", dim=128)
    assert q.bits_per_coordinate(n_tokens=1024).to_dict() == \
        {"payload": 4.0, "norms": 0.0, "side": 0.5 + 32 / (1024 * 128), "total": 4.500244140625}
    assert q.bits_per_coordinate().total == q.bits_per_coordinate(n_tokens=1).total == 4.75  # one token per encode
    tok = quantizer("nvfp4", dim=128, granularity="token")
    assert tok.bits_per_coordinate(n_tokens=1024).total == 4.75
    assert quantizer("nvfp4", dim=64, granularity="token").bits_per_coordinate().total == 5.0
    with pytest.raises(ValueError, match="n_tokens must be in"):
        q.bits_per_coordinate(n_tokens=0)


# ------------------------------------------------------------------------------------ config and registry
def test_config_registry_and_refusals():
    assert QUANTIZERS["nvfp4"] is NVFP4Quantizer
    q = kvstats.quantizer("nvfp4", dim=64, granularity="token")
    assert q.config == NVFP4Config(bits=4, dim=64, seed=0, granularity="token") and q.codes_per_vector
    assert q.config.to_dict() == {"method": "nvfp4", "bits": 4, "dim": 64, "seed": 0, "granularity": "token"}
    assert NVFP4Quantizer.from_config(q.config).provenance() == q.provenance()
    assert not quantizer("nvfp4", dim=64).codes_per_vector
    with pytest.raises(ValueError, match="bits must be 4 for nvfp4"):
        quantizer("nvfp4", bits=2, dim=64)
    with pytest.raises(ValueError, match="dim must be a multiple of 16 for nvfp4.*got 40"):
        quantizer("nvfp4", dim=40)
    with pytest.raises(ValueError, match="granularity must be one of"):
        quantizer("nvfp4", dim=64, granularity="tensor")
    with pytest.raises(TypeError, match="unexpected option"):
        quantizer("nvfp4", dim=64, block=32)


def test_a_head_granularity_code_is_not_the_concatenation_of_its_tokens_codes():
    # the global scale spans the tokens of one encode: why codes_per_vector is False for "head"
    x = torch.randn(1, 2, 4, 32, generator=torch.Generator().manual_seed(1))
    x[..., 0, :] *= 100
    q = quantizer("nvfp4", dim=32)
    at_once = q.decode(q.encode(x))
    apart = torch.cat([q.decode(q.encode(x[..., i: i + 1, :])) for i in range(4)], dim=-2)
    assert not torch.equal(at_once, apart)
    tok = quantizer("nvfp4", dim=32, granularity="token")
    torch.testing.assert_close(tok.decode(tok.encode(x)), torch.cat(
        [tok.decode(tok.encode(x[..., i: i + 1, :])) for i in range(4)], dim=-2), rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["head", "token"])
def test_nvfp4_passes_the_conformance_kit(scope):
    def build(bits, dim, seed):
        return quantizer("nvfp4", bits=bits, dim=dim, seed=seed, granularity=scope)

    check_quantizer(build(4, 64, 3), factory=lambda seed: build(4, 64, seed))
    check_quantizer(build(4, 64, 3), build=build)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_encode_and_decode_equal_the_reference():
    x = torch.randn(2, 4, 33, 128, generator=torch.Generator().manual_seed(2)) * 3
    x[0, 0, 0, :16] = 0
    for scope in ("head", "token"):
        q = quantizer("nvfp4", dim=128, granularity=scope)
        code = q.encode(x.cuda())
        packed, scales, g, x_hat = reference_nvfp4(x.numpy(), scope)
        np.testing.assert_array_equal(code.payload["codes"].cpu().numpy(), packed)
        np.testing.assert_array_equal(code.payload["scales"].cpu().numpy(), scales)
        np.testing.assert_array_equal(bits_of(code.scalars["global_scale"].cpu()), g.view(np.int32))
        np.testing.assert_array_equal(bits_of(q.decode(code).cpu()), x_hat.view(np.int32))
