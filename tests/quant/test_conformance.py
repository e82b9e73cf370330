"""The conformance kit (kvstats.testing.check_quantizer) and registering quantizers and schemes from outside.

Every built-in quantizer passes check_quantizer, and so does a small external per-token int4 quantizer
written here; broken variants of that quantizer fail it, each with the name of the check it breaks.
"""

import dataclasses
import re

import pytest
import torch

import kvstats
from kvstats.data.synthetic import generate
from kvstats.measure.testing import check_quantizer
from kvstats.quant.quantizers import QUANTIZERS, BitBudget, IdentityQuantizer
from kvstats.quant.schemes import SCHEMES
from tests.helpers.quantizers import Int4PerToken  # noqa: E402, F401

BUILT_IN = [
    ("lloyd", {}), ("lloyd", {"norm_dtype": torch.float16}), ("turbo_mse", {}), ("turbo_mse", {"rotation": "haar"}),
    ("turbo_prod", {"bits": 1}), ("turbo_prod", {"bits": 3}), ("turbo_prod", {"bits": 3, "rows": "srht"}),
    ("turbo_prod", {"bits": 2, "rows": "orthogonal", "rotation": "haar"}),
    ("qjl", {}), ("qjl", {"rows": "gaussian", "bits": None, "m": 96}), ("qjl", {"rows": "srht"}),
    ("qjl", {"outliers": [0]}),
    ("qjl", {"outliers": [3, 9], "outlier_m": 16}),
    ("minmax", {}), ("minmax", {"group_size": 16, "bits": 4}), ("minmax", {"axis": "channel"}),
    ("minmax", {"axis": "channel", "group_size": 64, "bits": 3}), ("rotated_minmax", {}), ("nova", {}),
    ("int_token", {}), ("int_token", {"bits": 4, "side_dtype": torch.float32}),
    ("fp8_e4m3", {"bits": 8}), ("fp8_e5m2", {"bits": 8}),
    ("fp8_e4m3", {"bits": 8, "scale": "dynamic", "granularity": "head"}),
    ("fp8_e5m2", {"bits": 8, "scale": "dynamic", "granularity": "head"}),
    ("nvfp4", {"bits": 4}), ("nvfp4", {"bits": 4, "granularity": "token"}),
    ("nova", {"bits": 3}),
]


def test_every_registered_quantizer_is_covered():
    assert {name for name, _ in BUILT_IN} == set(QUANTIZERS)


@pytest.mark.slow
@pytest.mark.parametrize("name, options", BUILT_IN, ids=[f"{n}-{o}" for n, o in BUILT_IN])
def test_built_in_quantizers_pass(name, options):
    args = {"bits": 2, "dim": 64, "seed": 3, **options}
    check_quantizer(kvstats.quantizer(name, **args),
                    factory=lambda seed: kvstats.quantizer(name, **{**args, "seed": seed}))
    cls = QUANTIZERS[name]
    if "m" not in options and cls.min_bits < cls.max_bits:  # a fixed m fixes qjl's bits; fp8, nvfp4 have one width
        def build(bits, dim, seed):
            return kvstats.quantizer(name, **{**options, "bits": bits, "dim": dim, "seed": seed})

        check_quantizer(kvstats.quantizer(name, **args), build=build)  # also at the widest bit width


def test_calibrated_nova_and_identity_pass():
    q, k, _ = generate("low_rank", 1, 1, 600, 32, 0, n_q=64)
    nova = kvstats.quantizer("nova", bits=2, dim=32, seed=1).calibrate(q, k)
    check_quantizer(nova)
    for dtype in (None, torch.float16, torch.bfloat16):
        check_quantizer(IdentityQuantizer(64, dtype=dtype))


def test_an_external_int4_quantizer_passes():
    check_quantizer(Int4PerToken(4, 64), factory=lambda seed: Int4PerToken(4, 64, seed))
    q = Int4PerToken(4, 64)
    x = torch.randn(10, 64, generator=torch.Generator().manual_seed(0))
    # independent oracle: the error of round-to-nearest is at most half a step, step = max|x|/7
    assert ((q.decode(q.encode(x)) - x).abs() <= x.abs().amax(-1, keepdim=True) / 14 + 1e-6).all()


class _LiesAboutBits(Int4PerToken):
    def bits_per_coordinate(self, n_tokens=None):
        return BitBudget(payload=4.0)  # forgets the fp32 scale


class _Random(Int4PerToken):
    def _encode(self, x):
        return super()._encode(x + 1e-2 * torch.randn_like(x))


class _HoldsAView(Int4PerToken):
    def _encode(self, x):
        code = super()._encode(x)
        big = torch.zeros(2 * code.scalars["scale"].numel())
        code.scalars["scale"] = big[: code.scalars["scale"].numel()].view_as(code.scalars["scale"]).copy_(
            code.scalars["scale"])
        return code


class _WrongInner(Int4PerToken):
    def _inner(self, query, code):
        return 2 * super()._inner(query, code)


class _WrongWeightedSum(Int4PerToken):
    def _weighted_sum(self, weights, code):
        return super()._weighted_sum(weights, code).flip(-1)  # the channels of the output reversed


class _AcceptsNaN(Int4PerToken):
    def encode(self, x):
        return self._encode(x) if isinstance(x, torch.Tensor) and x.is_floating_point() else super().encode(x)


class _NoTokens(Int4PerToken):
    def bits_per_coordinate(self):
        return super().bits_per_coordinate()


class _WrongDtype(Int4PerToken):
    # (a _decode in a wider dtype is fine: decode casts it back, saturating)
    def _inner(self, query, code):
        return super()._inner(query, code).half()


class _DecodesZero(Int4PerToken):
    def _decode(self, code):
        return torch.zeros(code.shape, dtype=code.dtype)


class _DecodesNegated(Int4PerToken):
    def _decode(self, code):
        return -super()._decode(code)


class _ZeroForFp64(Int4PerToken):
    def _decode(self, code):
        x_hat = super()._decode(code)
        return torch.zeros_like(x_hat) if code.dtype == torch.float64 else x_hat


class _MutatesInput(Int4PerToken):
    def _encode(self, x):
        code = super()._encode(x)
        x.mul_(0.5)  # e.g. a normalisation done in place
        return code


class _ClampsInPlace(Int4PerToken):
    def _encode(self, x):
        x.clamp_(-1.0, 1.0)  # idempotent: a second encode of the same tensor changes nothing more
        return super()._encode(x)


class _AbsInPlace(Int4PerToken):
    def _encode(self, x):
        code = super()._encode(x)
        x.abs_()  # after coding: the codes are honest, the caller's data are not
        return code


class _ClampsTheQuery(Int4PerToken):
    def _inner(self, query, code):
        return super()._inner(query.clamp_(-1.0, 1.0), code)


class _ClampsTheWeights(Int4PerToken):
    def weighted_sum(self, weights, code):
        return super().weighted_sum(weights.clamp_(max=0.1), code)


class _ClampsTheCode(Int4PerToken):
    def _decode(self, code):
        code.scalars["scale"].clamp_(max=0.2)
        return super()._decode(code)


class _PlanClampsTheQuery(Int4PerToken):
    def inner_plan(self, code):
        plan = super().inner_plan(code)
        return lambda query: plan(query.clamp_(-1.0, 1.0))


_STASH: dict[bytes, torch.Tensor] = {}


class _StashesInAGlobal(Int4PerToken):
    """A 'lossless 4-bit' quantizer: the codes are real, but decode returns x from a module-level stash."""

    def _encode(self, x):
        code = super()._encode(x)
        _STASH[code.payload["codes"].numpy().tobytes()] = x.clone()
        return code

    def _decode(self, code):
        return _STASH[code.payload["codes"].numpy().tobytes()].to(code.dtype)


class _StashesOnTheCode(Int4PerToken):
    def _encode(self, x):
        code = super()._encode(x)
        code.exact = x.clone()  # not a field: nbytes does not count it
        return code

    def _decode(self, code):
        return code.exact.to(code.dtype)


class _StashesInTheInstance(Int4PerToken):
    def _encode(self, x):
        code = super()._encode(x)
        self._last = (code.payload["codes"].clone(), x.clone())
        return code

    def _decode(self, code):
        codes, x = self._last
        return x.to(code.dtype) if torch.equal(codes, code.payload["codes"]) else super()._decode(code)


class _GrowsForFp16(Int4PerToken):
    def _encode(self, x):
        code = super()._encode(x)
        if x.dtype == torch.float16:
            code.scalars["scale"] = code.scalars["scale"].double()
        return code

    def _decode(self, code):
        return super()._decode(dataclasses.replace(code, scalars={"scale": code.scalars["scale"].float()}))


class _GrowsBeyond24Tokens(Int4PerToken):
    def _encode(self, x):
        code = super()._encode(x)
        if x.dim() >= 2 and x.shape[-2] > 24:
            code.scalars["extra"] = torch.zeros(x.shape[:-1])
        return code


class _NegativeSide(IdentityQuantizer):
    """Stores fp32 x (32 bits) and claims 32 - 31 = 1 bit through a negative side cost."""

    def bits_per_coordinate(self, n_tokens=None):
        return BitBudget(payload=32.0, side=-31.0)


class _RaisesInDecode(Int4PerToken):
    def _decode(self, code):
        return code.payload["codes"].view(7, -1)  # a RuntimeError inside the quantizer


class _BreaksOnOneToken(Int4PerToken):
    def _encode(self, x):
        pairs = x.reshape(*x.shape[:-2], x.shape[-2] // 2, 2 * self.dim)  # groups over 2 tokens: needs an even n
        return super()._encode(pairs.reshape(x.shape))


class _SharesAScaleAcrossTheBatch(Int4PerToken):
    """One scale per (head, token) shared by the batch rows: a code tensor without the batch axis."""

    def _encode(self, x):
        code = super()._encode(x)
        if x.dim() == 4:
            code.scalars["scale"] = code.scalars["scale"].amax(0)
        return code

    def _decode(self, code):
        scale = code.scalars["scale"]
        if len(code.shape) == 4:
            scale = scale.expand(code.shape[:-1])
        return super()._decode(dataclasses.replace(code, scalars={"scale": scale}))


class _SharesAScaleAcrossTokens(Int4PerToken):
    """Declares codes per vector, yet every token's scale is the largest over the tokens encoded with it (stored per
    token, so the code's shapes are those of per-vector codes): what the cache's encode-ahead would get wrong."""

    codes_per_vector = True

    def _encode(self, x):
        code = super()._encode(x)
        scale = code.scalars["scale"]
        code.scalars["scale"] = scale.amax(-1, keepdim=True).expand_as(scale).contiguous()
        return code


class _OneScaleDeclaredPerVector(Int4PerToken):
    """Declares codes per vector, yet stores one scale for all the tokens encoded together (no token axis)."""

    codes_per_vector = True

    def _encode(self, x):
        code = super()._encode(x)
        code.scalars["scale"] = code.scalars["scale"].amax(-1)
        return code

    def _decode(self, code):
        scale = code.scalars["scale"].unsqueeze(-1).expand(code.shape[:-1])
        return super()._decode(dataclasses.replace(code, scalars={"scale": scale}))


class _PlanDiffers(Int4PerToken):
    """A decode plan that is not the quantizer's inner (what the cache would then compute instead)."""

    def inner_plan(self, code):
        return lambda query: 2 * self.inner(query, code)


def test_a_true_codes_per_vector_declaration_passes():
    check_quantizer(type("Int4Declared", (Int4PerToken,), {"codes_per_vector": True})(4, 64))


def test_an_undeclared_shared_scale_passes_the_cache_check():
    # the same codes without the claim: the cache keeps each chunk whole, nothing to refuse
    check_quantizer(type("SharedScaleUndeclared", (_SharesAScaleAcrossTokens,), {"codes_per_vector": None})(4, 64))


@pytest.mark.parametrize("cls, check", [
    (_LiesAboutBits, "bits"), (_Random, "determinism"), (_HoldsAView, "nbytes"), (_WrongInner, "inner"),
    (_WrongWeightedSum, "weighted sum"), (_AcceptsNaN, "bad input"), (_NoTokens, "protocol"), (_WrongDtype, "dtypes"),
    (_DecodesZero, "reconstruction"), (_DecodesNegated, "reconstruction"), (_ZeroForFp64, "reconstruction"),
    (_MutatesInput, "input"), (_StashesInAGlobal, "reconstruction"), (_StashesOnTheCode, "code fields"),
    (_StashesInTheInstance, "reconstruction"), (_GrowsForFp16, "bits"), (_GrowsBeyond24Tokens, "bits"),
    (_RaisesInDecode, "shapes"), (_BreaksOnOneToken, "cache"), (_SharesAScaleAcrossTheBatch, "cache"),
    (_SharesAScaleAcrossTokens, "cache"), (_OneScaleDeclaredPerVector, "cache"), (_PlanDiffers, "cache"),
])
def test_broken_quantizers_fail_naming_the_check(cls, check):
    with pytest.raises(AssertionError, match=rf"^check_quantizer\[{check}\] failed for"):
        check_quantizer(cls(4, 64))


@pytest.mark.parametrize("cls, call, argument", [
    (_ClampsInPlace, "encode()", "x"), (_AbsInPlace, "encode()", "x"), (_ClampsTheQuery, "inner()", "query"),
    (_ClampsTheWeights, "weighted_sum()", "weights"), (_ClampsTheCode, "decode()", "code"),
    (_PlanClampsTheQuery, "the plan of inner_plan(code)", "query"),
])
def test_a_change_to_any_input_is_found_at_the_first_call(cls, call, argument):
    """Idempotent in-place changes (clamp_, abs_) leave nothing to see on a second call with the same tensor: every
    input of every call is copied before the call and compared after it."""
    with pytest.raises(AssertionError, match=rf"^check_quantizer\[input\] failed for .*{re.escape(call)} changed "
                                             rf"its {argument} in place"):
        check_quantizer(cls(4, 64))


def test_a_negative_side_cost_is_refused():
    with pytest.raises(AssertionError, match=r"^check_quantizer\[budget\] failed for .*side = -31.0"):
        check_quantizer(_NegativeSide(64))


class _KeepsTheLastInput(IdentityQuantizer):
    """A 16-bit store of x may be exact (the rate-distortion check cannot see this stash): decode returns the last
    input encoded, whatever the code."""

    def _encode(self, x):
        self._last = x.clone()
        return super()._encode(x)

    def _decode(self, code):
        return self._last.to(code.dtype)


def test_a_stash_of_the_last_input_is_named_a_stash_not_a_beam_search_failure():
    """Without factory or build, the first check whose code is not the last input encoded was the cache's beam
    search (rows selected from a code decoded to the unselected x): the determinism check now decodes the first
    code after encoding another x, and names the stash."""
    for kwargs in ({}, {"factory": lambda seed: _KeepsTheLastInput(64, seed)}):
        with pytest.raises(AssertionError, match=r"^check_quantizer\[determinism\] failed for .*after encoding "
                                                 r"another x.*\(a stash") as failed:
            check_quantizer(_KeepsTheLastInput(64), **kwargs)
        assert "beam" not in str(failed.value)


class _KeepsEveryRow(Int4PerToken):
    """Honest 4-bit codes, but decode returns x rounded to steps of 0.4, kept in the instance keyed by each row's
    code: better than 4 bits allow, yet within the rate-distortion check's slack, and there after other encodes."""

    def _encode(self, x):
        code = super()._encode(x)
        kept = self.__dict__.setdefault("_kept", {})
        for row, value in zip(code.payload["codes"].reshape(-1, code.payload["codes"].shape[-1]),
                              x.reshape(-1, x.shape[-1])):
            kept[row.numpy().tobytes()] = torch.round(value.double() * 2.5) / 2.5
        return code

    def _decode(self, code):
        rows = code.payload["codes"].reshape(-1, code.payload["codes"].shape[-1])
        kept = self.__dict__.get("_kept", {})
        return torch.stack([kept[r.numpy().tobytes()] for r in rows]).reshape(code.shape).to(code.dtype)


def test_a_stash_in_the_instance_keyed_by_the_code_is_found_by_a_fresh_instance():
    """Every code this instance made decodes from its stash after other encodes too; a freshly built instance has
    none (KeyError while decoding the copied code)."""
    check_quantizer(_KeepsEveryRow(4, 64))
    with pytest.raises(AssertionError, match=r"^check_quantizer\[determinism\] failed for .*raised KeyError while "
                                             r"rebuilding the quantizer with seed"):
        check_quantizer(_KeepsEveryRow(4, 64), factory=lambda seed: _KeepsEveryRow(4, 64, seed))


def test_an_exception_inside_the_quantizer_is_reported_as_its_check():
    with pytest.raises(AssertionError, match=r"check_quantizer\[shapes\].*raised RuntimeError while decoding"):
        check_quantizer(_RaisesInDecode(4, 64))
    with pytest.raises(AssertionError, match=r"check_quantizer\[cache\].*raised RuntimeError while encoding one token"):
        check_quantizer(_BreaksOnOneToken(4, 64))


def test_widest_bit_width_reconstruction_needs_build():
    """A decode that adds twice each neighbour's coordinate correlates with x at any bit width; built at its
    widest bit width (8) it still misses x by about 4 times its energy, which only the rebuild can see."""

    class Noisy(Int4PerToken):
        min_bits, max_bits = 4, 8

        def _decode(self, code):
            x_hat = super()._decode(code)
            return x_hat + 2 * x_hat.roll(1, dims=-1)  # x̂ plus twice its neighbour's coordinate

    check_quantizer(Noisy(4, 64))  # passes without build
    with pytest.raises(AssertionError, match=r"^check_quantizer\[reconstruction\] failed .*widest bit width 8"):
        check_quantizer(Noisy(4, 64), build=Noisy)


# --------------------------------------------------------------------------------- registering from outside
def test_register_a_quantizer_from_outside():
    try:
        kvstats.register(Int4PerToken)
        q = kvstats.quantizer("int4_per_token", bits=4, dim=32, seed=0)
        assert isinstance(q, Int4PerToken)
        with pytest.raises(ValueError, match="already registered"):
            kvstats.register(_Random)  # same name, another class
        kvstats.register(_Random, replace=True)
        assert isinstance(kvstats.quantizer("int4_per_token", bits=4, dim=32), _Random)
        with pytest.raises(TypeError, match="subclass of kvstats.quantizers.Quantizer"):
            kvstats.register(int)
    finally:
        QUANTIZERS.pop("int4_per_token", None)


def test_register_a_scheme_from_outside():
    def int4_both(bits, dim, seeds, rows=None, **options):
        return Int4PerToken(bits, dim, seeds[0]), Int4PerToken(bits, dim, seeds[1])

    try:
        kvstats.register_scheme("int4", int4_both, min_bits=4)
        s = kvstats.scheme("int4", bits=4, dim=32, seed=5)
        assert (s.name, s.seed, s.k.seed != s.v.seed) == ("int4", 5, True)
        gen = torch.Generator().manual_seed(0)
        k, v, q = (torch.randn(1, 2, 12, 32, generator=gen) for _ in range(3))
        cache = s.encode(k, v)
        k_hat, v_hat = s.decode(cache)
        expected = torch.softmax(q.double() @ k_hat.double().transpose(-1, -2) / 32**0.5, -1) @ v_hat.double()
        torch.testing.assert_close(s.attention(q, cache).double(), expected, rtol=1e-5, atol=1e-5)
        assert cache.nbytes * 8 == s.bits_per_coordinate()["mean"].total * (k.numel() + v.numel())
        with pytest.raises(ValueError, match=r"bits must be in \[4, 8\], got 3"):
            kvstats.scheme("int4", bits=3, dim=32)
        with pytest.raises(ValueError, match="already registered"):
            kvstats.register_scheme("kqv", int4_both)
        with pytest.raises(TypeError, match="factory must be callable"):
            kvstats.register_scheme("x", None)
    finally:
        SCHEMES.pop("int4", None)
