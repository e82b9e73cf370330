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
from kvstats.quantizers import QUANTIZERS
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
