"""Attention's weighted sum of values straight from the codes: ``Quantizer.weighted_sum`` and
``Scheme.weighted_values`` against decode-then-multiply in float64.

Tolerance: the fp32 path sums n_k products per output (and applies one inverse rotation or Sᵀ of d terms per
row), so its error is at most about (n_k + d)·eps₃₂·Σⱼ|wᵢⱼ|·|x̂ⱼ| per element; the tests allow 4× that. A wrong
code, level, sign, group or rotation moves the result by O(|x̂|), far outside it. Deterministic inputs (fixed
generators): nothing here is random at test time.
"""

from __future__ import annotations

import pytest
import torch

from kvstats.quant.attention import apply_weights
from kvstats.quant.quantizers import quantizer
from kvstats.quant.schemes import Scheme, scheme

EPS32 = torch.finfo(torch.float32).eps

QUANTIZERS = [
    ("lloyd", {}), ("turbo_mse", {}), ("turbo_mse", {"rotation": "haar"}), ("qjl", {}),
    ("qjl", {"outliers": [1, 5]}), ("qjl", {"outliers": [3]}), ("qjl", {"rows": "gaussian", "m": 40}),
    ("turbo_prod", {}), ("turbo_prod", {"rows": "srht", "sketch_domain": "original"}), ("minmax", {}),
    ("minmax", {"group_size": 8}), ("minmax", {"axis": "channel", "group_size": 4}), ("rotated_minmax", {}),
]


def _inputs(d=32, lead=(2, 3), n_q=5, n_k=19, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*lead, n_k, d, generator=g) * 2 + 0.3).to(dtype)
    w = torch.softmax(torch.randn(*lead, n_q, n_k, generator=g) * 3, -1).to(dtype)
    return x, w


def _check(got, w, x_hat):
    want = w.double() @ x_hat.double()
    bound = 4 * (w.shape[-1] + x_hat.shape[-1]) * EPS32 * (w.double().abs() @ x_hat.double().abs()) + 1e-30
    err = (got.double() - want).abs()
    assert got.shape == want.shape
    assert bool((err <= bound).all()), float((err - bound).max())


CASES = [(n, o, b) for n, o in QUANTIZERS for b in ((1,) if "m" in o else (1, 2, 4))]


@pytest.mark.parametrize("name,opts,bits", CASES, ids=[f"{n}-{o}-{b}" for n, o, b in CASES])
def test_weighted_sum_equals_decode_then_multiply(name, opts, bits):
    # a sketch of m rows not a multiple of d is given by m alone (m = bits·d otherwise)
    q = quantizer(name, dim=32, seed=3, **opts) if "m" in opts else quantizer(name, bits=bits, dim=32, seed=3, **opts)
    x, w = _inputs()
    code = q.encode(x)
    got = q.weighted_sum(w, code)
    assert got.dtype == torch.float32
    _check(got, w, q.decode(code))


@pytest.mark.parametrize("name,opts", [("turbo_prod", {}), ("minmax", {}), ("qjl", {})])
def test_weighted_sum_broadcasts_odd_shapes_and_fp64(name, opts):
    q = quantizer(name, bits=3, dim=12 if name == "minmax" else 16, seed=1, **opts)
    d = q.dim
    for lead_x, lead_w, n_q, n_k in (((), (), 1, 1), ((3,), (2, 3), 4, 7), ((2, 1), (2, 5), 2, 33)):
        x, _ = _inputs(d=d, lead=lead_x, n_k=n_k, seed=n_k)
        _, w = _inputs(d=d, lead=lead_w, n_q=n_q, n_k=n_k, seed=n_k + 1)
        code = q.encode(x)
        _check(q.weighted_sum(w, code), w, q.decode(code).expand(*w.shape[:-2], n_k, d))
        w_t = w.transpose(-1, -2).contiguous().transpose(-1, -2)  # a non-contiguous view
        _check(q.weighted_sum(w_t, code), w, q.decode(code).expand(*w.shape[:-2], n_k, d))
    x64, w64 = _inputs(d=d, dtype=torch.float64)
    code = q.encode(x64)
    got = q.weighted_sum(w64, code)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, w64 @ q.decode(code), rtol=1e-12, atol=1e-12)


def test_weighted_sum_refuses_what_does_not_fit():
    q = quantizer("turbo_mse", bits=2, dim=16, seed=0)
    x, w = _inputs(d=16, n_k=7)
    code = q.encode(x)
    with pytest.raises(ValueError, match="n_k = 6"):
        q.weighted_sum(w[..., :6], code)
    with pytest.raises(ValueError, match=r"weights must be \[\.\.\., n_q, n_k\]"):
        q.weighted_sum(w[0, 0, 0], code)
    with pytest.raises(ValueError, match="do not broadcast"):
        q.weighted_sum(torch.ones(4, 3, 5, 7), code)
    with pytest.raises(TypeError, match="weights"):
        q.weighted_sum(torch.ones(2, 3, 5, 7, dtype=torch.int64), code)
    with pytest.raises(ValueError, match="not by this quantizer"):
        quantizer("turbo_mse", bits=2, dim=16, seed=1).weighted_sum(w, code)


@pytest.mark.parametrize("name", ["kv", "kqv", "qkqv", "minmax", "qjl_cache"])
def test_scheme_weighted_values_with_grouped_query_heads(name):
    s = scheme(name, bits=3, dim=16, seed=4)
    g = torch.Generator().manual_seed(9)
    k, v = torch.randn(2, 2, 11, 16, generator=g), torch.randn(2, 2, 11, 16, generator=g)
    w = torch.softmax(torch.randn(2, 6, 4, 11, generator=g), -1)
    cache = s.encode(k, v)
    got = s.weighted_values(w, cache)
    want = apply_weights(w.double(), s.decode(cache)[1].double())
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="weights must be"):
        s.weighted_values(w[..., :10], cache)
    with pytest.raises(ValueError, match="multiple of the KV heads"):
        s.weighted_values(w[:, :5], cache)


@pytest.mark.parametrize("name,opts,bits", [(n, o, 1 if "m" in o else 3) for n, o in QUANTIZERS],
                         ids=[f"{n}-{o}" for n, o in QUANTIZERS])
def test_plans_give_the_unplanned_numbers_bit_for_bit(name, opts, bits):
    # a plan (what a decode step calls) is the same kernels on the same tensors, flattened once: equal, not close
    q = quantizer(name, dim=32, seed=3, **opts) if "m" in opts else quantizer(name, bits=bits, dim=32, seed=3, **opts)
    x, w = _inputs()
    code = q.encode(x)
    query = torch.randn(2, 3, 5, 32, generator=torch.Generator().manual_seed(1))
    scores, weighted = q.inner_plan(code), q.weighted_sum_plan(code)
    for _ in range(2):  # a plan is called again and again
        assert torch.equal(scores(query), q.inner(query, code))
        assert torch.equal(weighted(w), q.weighted_sum(w, code))
    # leading dims to broadcast with the code's: flattened with it on the call
    assert torch.equal(scores(query[0]), q.inner(query[0], code))
    assert torch.equal(weighted(w[:1]), q.weighted_sum(w[:1], code))


@pytest.mark.parametrize("name", ["kv", "kqv", "qkqv", "minmax", "qjl_cache"])
def test_scheme_plan_gives_own_scores_and_values_bit_for_bit(name):
    s = scheme(name, bits=3, dim=16, seed=4)
    g = torch.Generator().manual_seed(9)
    k, v = torch.randn(2, 2, 11, 16, generator=g), torch.randn(2, 2, 11, 16, generator=g)
    q, w = torch.randn(2, 6, 1, 16, generator=g), torch.softmax(torch.randn(2, 6, 1, 11, generator=g), -1)
    cache = s.encode(k, v)
    scores, values = s.own_plan(cache)
    assert torch.equal(scores(q), s.own_scores(q, cache))
    assert torch.equal(values(w), s.own_weighted_values(w, cache))
    torch.testing.assert_close(values(w).double(), apply_weights(w.double(), s.decode(cache)[1].double()),
                               rtol=0, atol=1e-5)


def test_a_subclass_with_its_own_estimator_is_planned_through_it():
    # the built-in plans reproduce the built-in _inner / _weighted_sum; a subclass that overrides those gets the
    # default plan, which calls its own method (else the cache would compute the parent's numbers)
    for name in ("turbo_mse", "turbo_prod", "qjl"):
        parent = type(quantizer(name, bits=3, dim=16, seed=0))

        class Doubled(parent):
            def _inner(self, query, code):
                return 2 * super()._inner(query, code)

            def _weighted_sum(self, weights, code):
                return 2 * super()._weighted_sum(weights, code)

        q = Doubled(bits=3, dim=16, seed=0)
        x, w = _inputs(d=16)
        code = q.encode(x)
        query = torch.randn(2, 3, 5, 16, generator=torch.Generator().manual_seed(2))
        assert torch.equal(q.inner_plan(code)(query), q.inner(query, code)), name
        assert torch.equal(q.weighted_sum_plan(code)(w), q.weighted_sum(w, code)), name
        s = Scheme("doubled", 3, q, Doubled(bits=3, dim=16, seed=1))
        cache = s.encode(x, x)
        scores, values = s.own_plan(cache)
        q6 = torch.randn(2, 3, 1, 16, generator=torch.Generator().manual_seed(4))
        w6 = torch.softmax(torch.randn(2, 3, 1, x.shape[-2], generator=torch.Generator().manual_seed(5)), -1)
        assert torch.equal(scores(q6), s.scores(q6, cache)), name
        assert torch.equal(values(w6), s.weighted_values(w6, cache)), name
