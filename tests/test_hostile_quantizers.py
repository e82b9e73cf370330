"""Hostile inputs to the quantizers and schemes (issue: no silent NaN, no unreproducible seed, nothing lost).

Each test feeds a value a careless or hostile user could pass and checks for a clear error naming the
argument and the value, or for a finite correct result. Where a code path has a compiled kernel, the
test runs on both the kernel and the pure-torch reference (``kvstats.ops.use_reference()``).
"""

import contextlib

import pytest
import torch

import kvstats
from kvstats import ops
from kvstats.data.synthetic import KINDS, generate, outlier_channel_indices, synthetic_queries
from kvstats.quantizers import QUANTIZERS, Code
from kvstats.schemes import SCHEMES

PATHS = {"kernel": contextlib.nullcontext, "reference": ops.use_reference}
BAD_SEEDS = [(-1, ValueError), (2**70, ValueError), (2**63, ValueError), (True, TypeError), ("0", TypeError),
             (1.5, TypeError)]
SEED_MESSAGE = r"seed must be an int in \[0, 2\*\*63 - 1\] or None"


def build_quantizer(name: str, seed, **options):
    return kvstats.quantizer(name, bits=2, dim=64, seed=seed, **options)


def draws(q) -> torch.Tensor:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(7))
    return q.decode(q.encode(x))


# ------------------------------------------------------------------------------------- one seed rule
@pytest.mark.parametrize("name", sorted(QUANTIZERS))
@pytest.mark.parametrize("seed, error", BAD_SEEDS)
def test_every_quantizer_refuses_bad_seeds_with_one_message(name, seed, error):
    with pytest.raises(error, match=SEED_MESSAGE) as info:
        build_quantizer(name, seed)
    assert repr(seed) in str(info.value)


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("seed, error", BAD_SEEDS)
def test_every_scheme_refuses_bad_seeds_with_one_message(name, seed, error):
    with pytest.raises(error, match=SEED_MESSAGE):
        kvstats.scheme(name, bits=3, dim=64, seed=seed)


@pytest.mark.parametrize("seed, error", BAD_SEEDS)
def test_nova_scheme_refuses_bad_seeds(seed, error):
    q, k, v = generate("gaussian", 1, 1, 300, 16, 0, n_q=32)
    with pytest.raises(error, match=SEED_MESSAGE):
        kvstats.scheme("nova", bits=2, dim=16, seed=seed, queries=q, keys=k, values=v)


@pytest.mark.parametrize("seed, error", BAD_SEEDS)
def test_generators_refuse_bad_seeds(seed, error):
    keys = torch.randn(1, 1, 8, 16)
    for call in (lambda: generate("gaussian", 1, 1, 8, 16, seed),
                 lambda: synthetic_queries(keys, 1, 4, seed),
                 lambda: outlier_channel_indices(2, 16, seed)):
        with pytest.raises(error, match=SEED_MESSAGE):
            call()


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_seed_none_is_fresh_entropy_recorded_for_reproduction(name):
    a, b = build_quantizer(name, None), build_quantizer(name, None)
    assert isinstance(a.seed, int) and 0 <= a.seed < 2**63
    assert a.seed != b.seed  # two 63-bit draws collide with probability 2**-63
    again = build_quantizer(name, a.seed)
    torch.testing.assert_close(draws(again), draws(a), rtol=0, atol=0)
    if name in ("turbo_mse", "turbo_prod", "qjl", "rotated_minmax"):  # seeded methods: fresh draws differ
        assert not torch.equal(draws(a), draws(b))


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_scheme_seed_none_is_recorded(name):
    a, b = kvstats.scheme(name, bits=3, dim=64, seed=None), kvstats.scheme(name, bits=3, dim=64, seed=None)
    assert a.seed != b.seed
    again = kvstats.scheme(name, bits=3, dim=64, seed=a.seed)
    k = torch.randn(1, 2, 8, 64, generator=torch.Generator().manual_seed(1))
    for x, y in zip(a.decode(a.encode(k, k)), again.decode(again.encode(k, k))):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_generator_seed_none_gives_fresh_draws(kind):
    first, second = generate(kind, 1, 1, 8, 16, None)[1], generate(kind, 1, 1, 8, 16, None)[1]
    assert not torch.equal(first, second)
    torch.testing.assert_close(generate(kind, 1, 1, 8, 16, 2**63 - 1)[1], generate(kind, 1, 1, 8, 16, 2**63 - 1)[1],
                               rtol=0, atol=0)


# ---------------------------------------------------------------------------------------- provenance
MISMATCHES = [
    ("lloyd", {}, "turbo_mse", {}),                              # another method, same layout
    ("turbo_mse", {"seed": 0}, "turbo_mse", {"seed": 1}),        # another seed
    ("turbo_mse", {"dim": 64, "bits": 2}, "turbo_mse", {"dim": 128, "bits": 3}),  # another dim and bits
    ("turbo_mse", {"norm_dtype": torch.float16}, "turbo_mse", {}),  # another option
    ("turbo_prod", {"rows": "gaussian"}, "turbo_prod", {"rows": "orthogonal"}),
    ("turbo_prod", {}, "qjl", {}),                               # formerly a bare KeyError
    ("qjl", {}, "turbo_prod", {}),
    ("minmax", {}, "lloyd", {}),
    ("qjl", {"outliers": [1, 2]}, "qjl", {"outliers": [1, 3]}),
]


def _built(name, overrides):
    args = {"bits": 2, "dim": 64, "seed": 0, **overrides}
    return kvstats.quantizer(name, **args)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("maker, made, user, used", MISMATCHES)
def test_decode_and_inner_refuse_a_code_from_another_quantizer(path, maker, made, user, used):
    a, b = _built(maker, made), _built(user, used)
    x = torch.randn(3, 5, a.dim, generator=torch.Generator().manual_seed(0))
    with PATHS[path]():
        code = a.encode(x)
        for call in (lambda: b.decode(code), lambda: b.inner(torch.randn(3, 2, b.dim), code)):
            with pytest.raises(ValueError, match="code was made by") as info:
                call()
            message = str(info.value)
            assert repr(a) in message and repr(b) in message
        a.decode(code)  # its own quantizer still decodes it


def test_a_code_remembers_its_quantizer():
    q = _built("turbo_prod", {"seed": 5})
    code = q.encode(torch.randn(4, 64))
    assert (code.source.name, code.source.dim, code.source.bits) == ("turbo_prod", 64, 2)
    assert code.source == _built("turbo_prod", {"seed": 5}).provenance()  # same construction, same fingerprint
    assert code.source.fingerprint != _built("turbo_prod", {"seed": 6}).provenance().fingerprint


@pytest.mark.parametrize("path", PATHS)
def test_a_hand_built_code_missing_a_field_is_a_value_error(path):
    q = _built("turbo_prod", {})
    with PATHS[path]():
        code = q.encode(torch.randn(4, 64))
        code.source = None
        del code.payload["signs"]
        with pytest.raises(ValueError, match="code lacks the field 'signs'"):
            q.decode(code)
        with pytest.raises(ValueError, match="code lacks the field 'signs'"):
            q.inner(torch.randn(2, 64), code)
        with pytest.raises(ValueError, match="code is of vectors of dim 64"):
            _built("turbo_prod", {"dim": 32}).decode(Code(torch.Size([4, 64]), torch.float32))


def test_nova_codes_are_tied_to_the_calibration():
    q, k, _ = generate("gaussian", 1, 1, 400, 16, 0, n_q=64)
    prior = kvstats.quantizer("nova", bits=2, dim=16, seed=0)
    code = prior.encode(k[0, 0])
    fitted = kvstats.quantizer("nova", bits=2, dim=16, seed=0).calibrate(q, k)
    with pytest.raises(ValueError, match="code was made by"):
        fitted.decode(code)
    torch.testing.assert_close(kvstats.quantizer("nova", bits=2, dim=16, seed=0).decode(code), prior.decode(code),
                               rtol=0, atol=0)


def test_scheme_codes_carry_both_sources():
    s = kvstats.scheme("kqv", bits=3, dim=32, seed=1)
    k = torch.randn(1, 2, 6, 32)
    cache = s.encode(k, k)
    assert cache.k.source.name == "turbo_mse" and cache.v.source.name == "turbo_prod"
    other = kvstats.scheme("kqv", bits=3, dim=32, seed=2)
    with pytest.raises(ValueError, match="code was made by"):
        other.decode(cache)
