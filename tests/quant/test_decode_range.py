"""Finite inputs near the dtype's largest value never decode to inf (issue 30, item 1).

fp16 x up to 65,504 decode with a saturating cast (a reconstruction that overshoots the largest finite fp16 is
clamped there, which never moves it away from x); fp32/bf16/fp64 x are accepted up to decode_headroom
(finfo(acc).max / (4·d)) and refused above it by name, so no decode's fp32 (fp64) arithmetic can overflow.
Run on both the compiled kernels and the pure-torch references.
"""

import contextlib
import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvstats
from kvstats.data.synthetic import generate
from kvstats.quant import ops
from kvstats.quant.quantizers import QUANTIZERS, PerHeadQuantizer
from kvstats.quant.quantizers.numerics import decode_headroom, saturating_cast

pytestmark = pytest.mark.usefixtures("one_thread")

ACC = {torch.float32: torch.float32, torch.bfloat16: torch.float32, torch.float64: torch.float64}
PATHS = {"kernel": contextlib.nullcontext, "reference": ops.use_reference}
# derandomized: the same examples on every run, so the property cannot flake
_SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
SHAPES = ("spike", "linspace", "gaussian", "constant", "alternating")
# fp16 side data (the default) cannot hold ‖x‖ ≈ 65504·√d: those are refused by name, as documented; fp32
# storage of every stored scalar lets the whole fp16 range through to the decode.
FP32_STORAGE = {"lloyd": {"norm_dtype": torch.float32}, "turbo_mse": {"norm_dtype": torch.float32},
                "turbo_prod": {"norm_dtype": torch.float32}, "qjl": {"norm_dtype": torch.float32},
                "minmax": {"side_dtype": torch.float32}, "rotated_minmax": {"side_dtype": torch.float32},
                "int_token": {"side_dtype": torch.float32},
                "nova": {"scale_dtype": torch.float32}}


def rows(shape: str, top: float, d: int, seed: int) -> torch.Tensor:
    """Four rows of dim d in float64 whose max |x| is exactly top."""
    gen = torch.Generator().manual_seed(seed)
    if shape == "spike":
        x = torch.zeros(4, d, dtype=torch.float64)
        x[torch.arange(4), torch.randint(d, (4,), generator=gen)] = top
    elif shape == "linspace":
        x = torch.linspace(-top, top, d, dtype=torch.float64).repeat(4, 1)
    elif shape == "gaussian":
        x = torch.randn(4, d, generator=gen, dtype=torch.float64)
    elif shape == "constant":
        x = torch.ones(4, d, dtype=torch.float64)
    else:
        x = torch.ones(4, d, dtype=torch.float64)
        x[:, ::2] = -1
    return x / x.abs().amax(-1, keepdim=True) * top


@functools.cache
def build(name: str, bits: int, d: int, storage: bool):
    options = FP32_STORAGE.get(name, {}) if storage else {}
    q = kvstats.quantizer(name, bits=bits, dim=d, seed=3, **options)
    if name == "nova":
        queries, keys, _ = generate("gaussian", 1, 1, 256, d, 0, n_q=256)
        q.calibrate(queries[0, 0], keys[0, 0])
    return q


def valid_bits(name: str) -> list[int]:
    cls = QUANTIZERS[name]
    return [b for b in (1, 2, 3, 4, 8) if cls.min_bits <= b <= cls.max_bits]


def _quantizer_and_rows(draw) -> tuple:
    """(name, bits, d, shape) of one case: a registered quantizer at one of its widths, rows of one shape."""
    name = draw(st.sampled_from(sorted(QUANTIZERS)))
    return (name, draw(st.sampled_from(valid_bits(name))), draw(st.sampled_from([16, 64, 128])),
            draw(st.sampled_from(SHAPES)))


@st.composite
def cases(draw):
    return (*_quantizer_and_rows(draw), draw(st.floats(1e4, 65504.0)), draw(st.booleans()))


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
@_SETTINGS
@given(case=cases())
def test_fp16_rows_up_to_65504_never_decode_to_inf(path, case):
    name, bits, d, shape, top, storage = case
    q = build(name, bits, d, storage)
    x = rows(shape, top, d, seed=bits).half()
    with PATHS[path]():
        try:
            code = q.encode(x)
        except ValueError as exc:  # only a stored scalar fp16 cannot hold, named with the option that fixes it
            assert not storage and "overflows torch.float16" in str(exc), str(exc)
            return
        x_hat = q.decode(code)
    assert x_hat.dtype == torch.float16 and torch.isfinite(x_hat).all(), (name, bits, d, shape, top)


def test_the_reported_turbo_prod_row_decodes_finite():
    q = kvstats.quantizer("turbo_prod", bits=2, dim=128, seed=0)
    x = torch.linspace(-3e4, 3e4, 128).half()[None]
    assert torch.isfinite(q.decode(q.encode(x))).all()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("name", sorted(QUANTIZERS))
@pytest.mark.parametrize("shape", SHAPES)
def test_wide_rows_up_to_the_headroom_decode_finite_and_beyond_are_refused(path, dtype, name, shape):
    d = 64
    q = build(name, max(2, QUANTIZERS[name].min_bits), d, storage=True)
    limit = q.input_limit(dtype)
    assert limit == torch.finfo(ACC[dtype]).max / (4 if name in ("minmax", "int_token") else 4 * d)
    # 0.98: bf16 rounds to 8 significant bits (relative 2^-8), so the row stays below the limit after the cast
    below = rows(shape, 0.98 * limit, d, seed=1).to(dtype)
    with PATHS[path]():
        try:
            x_hat = q.decode(q.encode(below))
        except ValueError as exc:
            # NOVA's calibrated transform T is not orthogonal: its coefficients can outgrow x by T's largest
            # singular value, and a stored scale beyond fp32 is refused by name
            assert name == "nova" and "its stored scale overflows" in str(exc), str(exc)
        else:
            assert torch.isfinite(x_hat).all()
        over = rows(shape, 1.05 * limit, d, seed=1).to(dtype)
        with pytest.raises(ValueError, match=r"x \(max \|x\| = .*\) is too large for .*: its decode accumulates"):
            q.encode(over)


def test_headroom_is_far_above_fp16_and_per_head_inherits_it():
    assert decode_headroom(torch.float16, 1 << 20) > 65504
    heads = PerHeadQuantizer([kvstats.quantizer("turbo_mse", bits=2, dim=16, seed=s) for s in range(2)])
    x = torch.full((2, 3, 16), 2 * decode_headroom(torch.float32, 16))
    with pytest.raises(ValueError, match=r"too large"):
        heads.encode(x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_saturating_cast_is_the_box_projection(dtype):
    # oracle: for x inside [−max, max], clamping x̂ never increases |x̂ⱼ − xⱼ| (checked in float64)
    big = torch.finfo(dtype).max
    gen = torch.Generator().manual_seed(0)
    x = ((torch.rand(1000, generator=gen, dtype=torch.float64) * 2 - 1) * big).to(dtype).double()
    fp32 = torch.finfo(torch.float32).max  # x̂ is finite in its fp32 accumulation (beyond it decode refuses)
    x_hat = (x + torch.randn(1000, generator=gen, dtype=torch.float64) * big).clamp(-fp32, fp32).float()
    cast = saturating_cast(x_hat, dtype)
    assert torch.isfinite(cast).all()
    clamped = x_hat.abs() > big
    assert 100 < int(clamped.sum()) < 900  # both kinds of coordinate are exercised
    assert (cast[clamped].double() == big * x_hat[clamped].sign()).all()
    assert ((cast.double() - x).abs()[clamped] <= (x_hat.double() - x).abs()[clamped]).all()
    # inside the range it is the plain cast
    torch.testing.assert_close(cast[~clamped], x_hat[~clamped].to(dtype), rtol=0, atol=0)


@st.composite
def wide_cases(draw):
    return (*_quantizer_and_rows(draw), draw(st.floats(30.0, 38.5)),
            draw(st.sampled_from([torch.float32, torch.bfloat16])))


@pytest.mark.parametrize("path", PATHS)
@_SETTINGS
@given(case=wide_cases())
def test_fp32_and_bf16_rows_up_to_their_maximum_decode_finite_or_are_refused_by_name(path, case):
    # max |x| from 1e30 to 3.2e38 (fp32's largest is 3.4e38): finite x̂, or a ValueError naming max |x| (beyond
    # input_limit) or the stored scalar that cannot hold it — never inf
    name, bits, d, shape, log_top, dtype = case
    q = build(name, bits, d, True)
    x = rows(shape, min(10.0 ** log_top, 3.2e38), d, seed=bits).to(dtype)
    with PATHS[path]():
        try:
            code = q.encode(x)
        except ValueError as exc:
            assert "is too large for" in str(exc), str(exc)
            return
        x_hat = q.decode(code)
    assert float(x.abs().max()) <= q.input_limit(dtype)
    assert torch.isfinite(x_hat).all(), (name, bits, d, shape, log_top, dtype)


class _OverflowsInItsDecode(kvstats.quantizers.IdentityQuantizer):
    # a decode whose fp32 arithmetic overflows: inf must surface as an error, not be clamped into ±65504
    def _decode(self, code):
        return code.payload["x"].float() * 1e36


def test_a_decode_that_overflows_its_accumulation_is_refused_not_clamped():
    q = _OverflowsInItsDecode(16)
    code = q.encode(torch.full((2, 16), 1e4).half())
    with pytest.raises(ValueError, match=r"IdentityQuantizer.* decoded a code of finite torch.float16 x to "
                                         r"non-finite values .*a fault of the quantizer's decode"):
        q.decode(code)
    with pytest.raises(ValueError, match=r"a fault of the quantizer's decode"):  # inner decodes the same way
        q.inner(torch.randn(1, 16), code)
