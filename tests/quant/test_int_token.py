"""``int_token``: asymmetric b-bit integers per token and head (one fp16 lo and one fp16 step per vector).

Every code, offset, step, packed byte and decoded value is compared bit for bit with numpy written from the format's
definition (tests/helpers/minmax_reference.py: float32 arithmetic, fp16 rounding, round half to even, the packing
layout), on hypothesis-drawn fp32/fp16/bf16 inputs and on hand-picked ties, saturation, subnormals, zeros and signs.
The bits held are checked against the closed form b + 2·16/d (plus byte padding).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import kvstats
from kvstats.quant.quantizers import IntTokenQuantizer, MinMaxQuantizer, quantizer
from kvstats.quant.quantizers.config import IntTokenConfig, MinMaxConfig
from tests.helpers.minmax_reference import as_float32, minmax_groups, pack_reference

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _assert_matches_definition(q: IntTokenQuantizer, x: torch.Tensor) -> None:
    """The code of x and its decode, bit for bit against the numpy definition (one group per vector)."""
    codes, lo, step, x_hat = minmax_groups(as_float32(x), q.bits)
    code = q.encode(x)
    assert set(code.payload) == {"indices"} and set(code.scalars) == {"min", "scale"} and not code.parts
    assert torch.equal(code.payload["indices"], torch.from_numpy(pack_reference(codes, q.bits)))
    assert code.scalars["min"].dtype == code.scalars["scale"].dtype == torch.float16
    assert torch.equal(code.scalars["min"], torch.from_numpy(lo)[..., None])
    assert torch.equal(code.scalars["scale"], torch.from_numpy(step)[..., None])
    decoded = q.decode(code)
    assert decoded.dtype == x.dtype
    assert torch.equal(decoded, torch.from_numpy(x_hat).to(x.dtype))


# ------------------------------------------------------------------------------------------ the registry, config
def test_registered_with_a_frozen_config_fixing_axis_and_group():
    q = quantizer("int_token", bits=4, dim=64)
    assert isinstance(q, IntTokenQuantizer) and isinstance(q, MinMaxQuantizer)
    assert type(q.config) is IntTokenConfig and q.config.method == "int_token"
    assert (q.axis, q.group_size, q.side_dtype, q.codes_per_vector) == ("token", 64, torch.float16, True)
    assert q.config.to_dict() == {"method": "int_token", "bits": 4, "dim": 64, "seed": 0, "axis": "token",
                                  "group_size": 64, "side_dtype": "torch.float16"}
    assert q.config.replace(dim=128).group_size == 128  # the group follows d
    assert IntTokenQuantizer.from_config(q.config).provenance() == q.provenance()
    # same tensors as min-max per token with one group of d, but its own provenance: codes are not interchangeable
    mm = quantizer("minmax", bits=4, dim=64)
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0))
    assert q.encode(x).equal(mm.encode(x))
    with pytest.raises(ValueError, match="code was made by MinMaxQuantizer"):
        q.decode(mm.encode(x))
    with pytest.raises(TypeError, match="config must be a IntTokenConfig"):
        IntTokenQuantizer(config=MinMaxConfig(bits=4, dim=64))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"axis": "channel"}, TypeError, r"unexpected option\(s\) \['axis'\]; its options are \['side_dtype'\]"),
    ({"group_size": 16}, TypeError, r"unexpected option\(s\) \['group_size'\]"),
    ({"side_dtype": torch.float64}, ValueError, "side_dtype must be"),
    ({"side_dtype": torch.int8}, ValueError, "side_dtype must be"),
    ({"bits": 0}, ValueError, r"bits must be in \[1, 8\], got 0"),
    ({"bits": 9}, ValueError, r"bits must be in \[1, 8\], got 9"),
    ({"bits": 2.5}, TypeError, "bits must be an int"),
    ({"dim": 1}, ValueError, r"dim must be in \[2, 32768\], got 1"),
])
def test_out_of_range_config_is_refused_naming_the_field(kwargs, error, message):
    with pytest.raises(error, match=message):
        quantizer("int_token", **{"bits": 4, "dim": 16, **kwargs})


# ---------------------------------------------------------------------------------- codes against the definition
@pytest.mark.slow
@given(data=st.data(), bits=st.integers(1, 8), d=st.integers(2, 80), n=st.integers(1, 6),
       dtype=st.sampled_from(sorted(DTYPES)), subnormal=st.booleans())
@settings(max_examples=120, deadline=None)
def test_codes_and_decode_equal_the_definition(data, bits, d, n, dtype, subnormal):
    width = 16 if dtype == "fp16" else 32
    bound = 6e4 / 2 if dtype == "fp16" else 3e4  # the group's range and min stay within fp16 (else refused)
    elements = st.floats(-bound, bound, width=width, allow_nan=False, allow_subnormal=subnormal)
    x = data.draw(arrays(np.float16 if dtype == "fp16" else np.float32, (n, d), elements=elements))
    x = torch.from_numpy(x.astype(np.float32)).to(DTYPES[dtype])
    _assert_matches_definition(quantizer("int_token", bits=bits, dim=d), x)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_gaussian_heads_equal_the_definition(bits, dtype):
    x = (torch.randn(2, 3, 17, 64, generator=torch.Generator().manual_seed(bits)) * 3).to(DTYPES[dtype])
    _assert_matches_definition(quantizer("int_token", bits=bits, dim=64), x)


def test_ties_round_half_to_even_and_the_extremes_saturate():
    # b = 2, lo = 0, step = 1 (exact in fp16): 0.5 -> 0, 1.5 -> 2, 2.5 -> 2 (half to even); max -> 3 = 2^b − 1
    q = quantizer("int_token", bits=2, dim=6)
    x = torch.tensor([[0.0, 0.5, 1.5, 2.5, 3.0, 1.0]])
    code = q.encode(x)
    codes = np.array([[0, 0, 2, 2, 3, 1]])
    assert torch.equal(code.payload["indices"], torch.from_numpy(pack_reference(codes, 2)))
    assert torch.equal(q.decode(code), torch.tensor([[0.0, 0.0, 2.0, 2.0, 3.0, 1.0]]))
    # b = 4: values k + 0.5 over a step of 1 (lo = −7.5, hi = 7.5): every tie to the even code
    q4 = quantizer("int_token", bits=4, dim=16)
    x4 = torch.arange(16, dtype=torch.float32)[None] - 7.5
    _assert_matches_definition(q4, x4)
    x4 = torch.tensor([[-7.5, 7.5] + [-7.0 + 0.5 * k for k in range(14)]])  # ties of (x − lo)/step at k + 0.5
    _assert_matches_definition(q4, x4)
    # the minimum codes to 0 and the maximum to 2^b − 1 at every b
    for bits in range(1, 9):
        qb = quantizer("int_token", bits=bits, dim=8)
        row = torch.tensor([[-3.0, 5.0, 0.1, 0.2, -1.0, 4.9, 2.0, -2.9]])
        got = qb.encode(row)
        codes, *_ = minmax_groups(as_float32(row), bits)
        assert codes[0, 0] == 0 and codes[0, 1] == (1 << bits) - 1
        assert torch.equal(got.payload["indices"], torch.from_numpy(pack_reference(codes, bits)))


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_zeros_constants_signs_and_subnormals(dtype):
    dt = DTYPES[dtype]
    q = quantizer("int_token", bits=3, dim=8)
    tiny = torch.finfo(dt).smallest_normal / 4  # a subnormal of the dtype
    x = torch.stack([torch.zeros(8), torch.full((8,), -2.75), torch.linspace(-5, -1, 8), torch.linspace(1, 9, 8),
                     torch.tensor([0.0, -0.0, tiny, -tiny, 0.0, tiny, 0.0, 0.0]),
                     torch.tensor([-3.5, 3.5, -3.5, 3.5, -3.5, 3.5, -3.5, 3.5])]).to(dt)
    _assert_matches_definition(q, x)
    x_hat = q.decode(q.encode(x))
    assert torch.equal(x_hat[0], x[0]) and torch.equal(x_hat[1], x[1])  # a constant vector decodes to itself
    assert torch.equal(x_hat[5], x[5])  # min and max are levels 0 and 7 of a step of 1, exact in fp16
    assert bool((x_hat[2] < 0).all()) and bool((x_hat[3] > 0).all())  # signs kept


def test_non_finite_input_and_fp16_overflow_are_refused_by_name():
    q = quantizer("int_token", bits=4, dim=8)
    for bad in (float("nan"), float("inf"), float("-inf")):
        x = torch.randn(2, 8)
        x[1, 3] = bad
        with pytest.raises(ValueError, match="x contains non-finite values"):
            q.encode(x)
    with pytest.raises(ValueError, match="its stored min overflows torch.float16"):
        q.encode(torch.full((1, 8), -7e4))
    wide = quantizer("int_token", bits=4, dim=8, side_dtype=torch.float32)  # fp32 lo and step hold it
    assert torch.isfinite(wide.decode(wide.encode(torch.full((1, 8), -7e4)))).all()


# ------------------------------------------------------------------------------------------------------- bits held
@pytest.mark.parametrize("side, side_bits", [(torch.float16, 16), (torch.bfloat16, 16), (torch.float32, 32)])
@pytest.mark.parametrize("d", [2, 7, 16, 64, 100, 128])
@pytest.mark.parametrize("bits", range(1, 9))
def test_bits_held_are_b_plus_two_side_scalars_per_vector(bits, d, side, side_bits):
    q = quantizer("int_token", bits=bits, dim=d, side_dtype=side)
    x = torch.randn(2, 3, 5, d, generator=torch.Generator().manual_seed(d))
    code = q.encode(x)
    vectors = x.numel() // d
    assert code.nbytes == vectors * (math.ceil(d * bits / 8) + 2 * side_bits // 8)
    budget = q.bits_per_coordinate()
    assert budget.payload == 8 * math.ceil(d * bits / 8) / d and budget.norms == 0
    assert budget.side == 2 * side_bits / d
    assert code.nbytes * 8 == pytest.approx(budget.total * x.numel(), rel=1e-12)
    if d * bits % 8 == 0:  # no byte padding: exactly b + 2·bits(side)/d
        assert budget.total == pytest.approx(bits + 2 * side_bits / d, rel=1e-15)


def test_bits_at_head_dim_128():
    assert [quantizer("int_token", bits=b, dim=128).bits_per_coordinate().total for b in (8, 4, 2)] == \
        [8.25, 4.25, 2.25]


def test_estimators_read_the_codes_as_decoded():
    q = quantizer("int_token", bits=4, dim=32)
    g = torch.Generator().manual_seed(3)
    x, query = torch.randn(2, 9, 32, generator=g), torch.randn(2, 4, 32, generator=g)
    code = q.encode(x)
    x_hat = q.decode(code)
    torch.testing.assert_close(q.inner(query, code), query @ x_hat.transpose(-1, -2), rtol=1e-6, atol=1e-5)
    w = torch.softmax(torch.randn(2, 4, 9, generator=g), -1)
    torch.testing.assert_close(q.weighted_sum(w, code), w @ x_hat, rtol=1e-6, atol=1e-6)
    assert kvstats.quantizer("int_token", bits=4, dim=32).decode_parts(code, torch.float32) is None
