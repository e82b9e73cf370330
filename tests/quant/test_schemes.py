"""Schemes: budgets, GQA, causal masking, and attention from codes against attention from decoded K̂, V̂."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstats.quant.schemes import SCHEMES, causal_mask, scheme


def reference_attention(q, k_hat, v_hat, causal=False):
    """softmax(q K̂ᵀ/√d) V̂ in float64 with heads repeated explicitly (transformers' repeat_kv)."""
    g = q.shape[1] // k_hat.shape[1]
    k_rep = k_hat.double().repeat_interleave(g, dim=1)
    v_rep = v_hat.double().repeat_interleave(g, dim=1)
    logits = q.double() @ k_rep.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n, s = logits.shape[-2:]
        allowed = torch.tensor([[j <= s - n + i for j in range(s)] for i in range(n)])
        logits = logits.masked_fill(~allowed, float("-inf"))
    return torch.softmax(logits, -1) @ v_rep


@pytest.mark.slow
@given(
    name=st.sampled_from(sorted(set(SCHEMES) - {"kivi"})),  # kivi: n = 2, 4 and groups dividing d (test_kivi.py)
    bits=st.integers(2, 8),
    d=st.sampled_from([2, 7, 16, 33, 64, 96, 128]),
    kv_heads=st.integers(1, 3),
    ratio=st.integers(1, 8),
    seq=st.integers(1, 24),
    n_q=st.integers(1, 5),
    causal=st.booleans(),
    seed=st.integers(0, 10_000),
)
@settings(max_examples=50, deadline=None)
def test_attention_equals_softmax_of_decoded_cache(name, bits, d, kv_heads, ratio, seq, n_q, causal, seed):
    # Every built-in K estimator is linear in the code (decode-then-dot for lloyd/turbo_mse; the QJL
    # estimator of turbo_prod equals ⟨q, k̂⟩ exactly), so attention from codes must equal attention
    # over the decoded cache.
    if causal and n_q > seq:
        n_q = seq
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(2, kv_heads, seq, d, generator=g)
    v = torch.randn(2, kv_heads, seq, d, generator=g)
    q = torch.randn(2, kv_heads * ratio, n_q, d, generator=g)
    s = scheme(name, bits=bits, dim=d, seed=seed)
    cache = s.encode(k, v)
    out = s.attention(q, cache, causal=causal)
    k_hat, v_hat = s.decode(cache)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), reference_attention(q, k_hat, v_hat, causal), rtol=2e-4, atol=2e-4)


def test_budgets_follow_the_design():
    d = 128
    kv, kqv, qkqv = (scheme(n, bits=4, dim=d) for n in ("kv", "kqv", "qkqv"))
    assert (kv.k.name, kv.v.name) == ("lloyd", "lloyd")
    assert (kqv.k.name, kqv.v.name) == ("turbo_mse", "turbo_prod")
    assert (qkqv.k.name, qkqv.v.name) == ("turbo_prod", "turbo_prod")
    for s in (kv, kqv, qkqv):
        budget = s.bits_per_coordinate()
        assert budget["k"].payload == budget["v"].payload == 4.0  # the same nominal n for K and V
    assert qkqv.k.stage.bits == 3 and kqv.k.bits == 4


def test_k_and_v_get_independent_seeds():
    s = scheme("qkqv", bits=3, dim=64, seed=0)
    x = torch.randn(1, 1, 8, 64)
    assert not torch.equal(s.k.encode(x).payload["signs"], s.v.encode(x).payload["signs"])


def test_cache_nbytes_is_much_smaller_than_fp16():
    s = scheme("kqv", bits=4, dim=128)
    k = torch.randn(1, 2, 256, 128, dtype=torch.float16)
    cache = s.encode(k, k.clone())
    # K: 4-bit codes (64 B) + ‖k‖ (4 B). V: 3-bit codes (48 B) + ‖v‖ (4 B) + 128 signs (16 B) + γ (4 B).
    expected = 2 * 256 * ((64 + 4) + (48 + 4 + 16 + 4))
    assert cache.nbytes == expected
    assert cache.nbytes < k.numel() * 2 * 2 * 0.3  # under 30% of the fp16 K and V


def test_causal_mask_alignment():
    m = causal_mask(2, 4)
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]
    with pytest.raises(ValueError, match="n_q <= n_k"):
        causal_mask(5, 4)


@pytest.mark.parametrize("bad_q, pattern", [
    (torch.randn(1, 3, 2, 16), "queries.shape\\[1\\] \\(query heads\\) must be a multiple of the KV heads 2, got 3"),
    (torch.randn(1, 4, 2, 8), "queries must be \\[1, H_q, N, 16\\]"),
    (torch.randn(2, 4, 2, 16), "queries must be \\[1, H_q, N, 16\\]"),
])
def test_bad_queries(bad_q, pattern):
    s = scheme("kqv", bits=3, dim=16)
    cache = s.encode(torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16))
    with pytest.raises(ValueError, match=pattern):
        s.attention(bad_q, cache)


def test_bad_cache_and_arguments():
    s = scheme("kv", bits=3, dim=16)
    with pytest.raises(ValueError, match="keys and values must have the same shape"):
        s.encode(torch.randn(1, 2, 5, 16), torch.randn(1, 2, 6, 16))
    with pytest.raises(ValueError, match="keys must be \\[B, H_kv, S, 16\\]"):
        s.encode(torch.randn(2, 5, 16), torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match="bits must be in \\[2, 8\\], got 1"):
        scheme("kqv", bits=1, dim=16)
    with pytest.raises(ValueError, match="name must be one of"):
        scheme("kvq", bits=3, dim=16)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("seq", [64, 100])
def test_minmax_scheme_equals_the_hand_built_kivi_pair(bits, seq):
    # What budget_sweep and studies/nova built by hand: K per channel in groups of d tokens, V per token,
    # fp16 lo/step. The registered scheme must give the same codes, scores and bit counts.
    from kvstats.quant.quantizers import MinMaxQuantizer
    from kvstats.quant.schemes import Scheme

    d = 64
    gen = torch.Generator().manual_seed(bits + seq)
    k, v = torch.randn(2, 2, seq, d, generator=gen), torch.randn(2, 2, seq, d, generator=gen)
    q = torch.randn(2, 4, 8, d, generator=gen)
    by_hand = Scheme("minmax", bits, MinMaxQuantizer(bits, d, axis="channel", group_size=d),
                     MinMaxQuantizer(bits, d, axis="token"))
    registered = scheme("minmax", bits=bits, dim=d, seed=12345)
    a, b = by_hand.encode(k, v), registered.encode(k, v)
    for x, y in zip(by_hand.decode(a), registered.decode(b)):
        assert torch.equal(x, y)
    assert torch.equal(by_hand.scores(q, a), registered.scores(q, b))
    assert a.nbytes == b.nbytes
    assert by_hand.bits_per_coordinate(n_tokens=seq) == registered.bits_per_coordinate(n_tokens=seq)
    # K side: 2 fp16 scalars per channel per group of d tokens, amortised over seq tokens
    assert registered.bits_per_coordinate(n_tokens=seq)["k"].side == 32 * math.ceil(seq / d) / seq


def test_minmax_scheme_options_and_rows_ignored():
    s = scheme("minmax", bits=3, dim=32, seed=0, k_axis="token", k_group_size=8, side_dtype=torch.float32, rows="srht")
    assert (s.k.axis, s.k.group_size, s.k.side_dtype) == ("token", 8, torch.float32)
    assert (s.v.axis, s.v.group_size) == ("token", 32)
    assert scheme("minmax", bits=3, dim=32).k.group_size == 32


def test_qjl_cache_scheme_equals_the_hand_built_qjl_pair():
    # QJL's cache (arXiv 2406.03482 §4-5): keys m = n·d sign bits, outliers in their own sketch taken out of the
    # m rows, values min-max per token; the registered scheme must build exactly that pair.
    from kvstats._random import spawn_seeds
    from kvstats.quant.quantizers import quantizer

    d, bits, outliers = 64, 3, [1, 5, 9, 20]
    s = scheme("qjl_cache", bits=bits, dim=d, seed=7, outliers=outliers, outlier_m=32)
    ks, vs = spawn_seeds(7, 2)
    k_hand = quantizer("qjl", dim=d, m=bits * d - 32, seed=ks, rows="orthogonal", outliers=outliers, outlier_m=32,
                       norm_dtype=torch.float16)
    v_hand = quantizer("minmax", bits=bits, dim=d, seed=vs, axis="token")
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, 2, 40, d, generator=gen), torch.randn(1, 2, 40, d, generator=gen)
    q = torch.randn(1, 2, 5, d, generator=gen)
    code = s.encode(k, v)
    assert torch.equal(s.k.inner(q, code.k), k_hand.inner(q, k_hand.encode(k)))
    assert torch.equal(s.v.decode(code.v), v_hand.decode(v_hand.encode(v)))
    assert s.bits_per_coordinate()["k"].total == bits + 2 * 16 / d  # two fp16 norms (inliers, outliers) per key
    plain = scheme("qjl_cache", bits=bits, dim=d, seed=7)
    assert plain.k.m == bits * d and plain.k.outliers is None
    with pytest.raises(ValueError, match="outlier_m must be given"):
        scheme("qjl_cache", bits=bits, dim=d, outliers=outliers)
    with pytest.raises(ValueError, match="outlier_m"):
        scheme("qjl_cache", bits=bits, dim=d, outliers=outliers, outlier_m=bits * d)
