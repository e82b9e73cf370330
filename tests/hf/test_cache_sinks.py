"""Full-precision sink tokens (``KVStatsCache(..., sink_tokens=S)``) and KIVI's residual (``kivi_cache``), on the tiny
grouped-query Llama of tests/helpers/llama.py (4 query heads, 2 KV heads, d = 16; no download).

The oracles:

* a lossless scheme with sinks reproduces the model's logits (≤ 1e-4), on both attention paths, in one forward, in
  greedy generation, with left padding and with beam search;
* a lossy scheme with S sinks equals, on the estimator path, a float64 computation from the definition: key j is
  exact for the query at position i iff j < S or j ≥ S + G·⌊max(0, i + 1 − S − W)/G⌋ (the window), every other key
  decoded from codes of blocks of G tokens that start at S — for a prefill in query blocks and for decode steps;
* the dense path returns the sinks exact, then the decoded codes, then the exact window;
* the bits held: ``memory()`` counts the codes by their closed form and the sinks and the window (KIVI's residual)
  in ``window_bytes``;
* crop, prefill and records with sinks equal what a cache that never saw the removed tokens, a forward, or the
  definition give; S = 0 changes nothing.
"""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")

from transformers import DynamicCache  # noqa: E402

import kvstats.hf.code_attention as code_attention  # noqa: E402
from kvstats.hf.cache import (  # noqa: E402
    IdentityScheme,
    KVStatsCache,
    KVStatsLayer,
    cache_kwargs,
    kivi_cache,
)
from kvstats.quant.quantizers import quantizer  # noqa: E402
from kvstats.quant.schemes import Scheme, scheme  # noqa: E402
from tests.helpers.llama import HKV, HQ, D, T  # noqa: E402
from tests.helpers.llama import logits as _logits  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _int_scheme(bits: int) -> Scheme:
    return Scheme("int_token", bits, quantizer("int_token", bits=bits, dim=D),
                  quantizer("int_token", bits=bits, dim=D))


def _build(name: str) -> Scheme:
    if name == "kivi":
        return scheme("kivi", bits=2, dim=D, group_size=4)
    if name == "int_token":
        return _int_scheme(3)
    return scheme(name, bits=3, dim=D, seed=2)


def _held_outside_window(seq: int, sinks: int, window: int, flush: int) -> int:
    """The tokens held outside the window after ``seq`` tokens: the sinks, then whole blocks of G codes."""
    return min(seq, sinks) + max(0, seq - sinks - window) // flush * flush


# ------------------------------------------------------------------------------------ lossless: the model itself
@pytest.mark.parametrize("sinks, window", [(1, 0), (4, 0), (4, 3), (3, 5), (T + 8, 0)])
@pytest.mark.parametrize("path", ["dense", "est"])
def test_a_lossless_scheme_with_sinks_reproduces_the_model(path, sinks, window, dense, est, ids, request):
    model = request.getfixturevalue(path)
    ref = _logits(dense, ids, DynamicCache())
    cache = KVStatsCache(IdentityScheme(D), window, sink_tokens=sinks)
    torch.testing.assert_close(_logits(model, ids, cache), ref, rtol=0, atol=1e-4)
    layer = cache.layers[0]
    assert layer.n_sinks == min(sinks, T) and torch.equal(layer.sink_keys, layer.decoded()[0][..., :layer.n_sinks, :])
    with torch.inference_mode():  # token by token from a 7-token prompt
        cache = KVStatsCache(IdentityScheme(D), window, sink_tokens=sinks)
        steps = [model(ids[:, :7], **cache_kwargs(model, cache), use_cache=True).logits]
        steps += [model(ids[:, t:t + 1], **cache_kwargs(model, cache), use_cache=True).logits for t in range(7, T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize("path", ["dense", "est"])
def test_lossless_sinks_in_greedy_padded_and_beam_search_generation(path, dense, est, request):
    model = request.getfixturevalue(path)
    ids = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    ids[1, :4], mask[1, :4] = 0, 0  # left padding: the second row's sinks are padding and one real token
    with torch.inference_mode():
        kw = dict(max_new_tokens=6, do_sample=False, attention_mask=mask)
        cache = KVStatsCache(IdentityScheme(D), 2, sink_tokens=5)
        assert torch.equal(model.generate(ids, **cache_kwargs(model, cache), **kw), dense.generate(ids, **kw))
        kw = dict(max_new_tokens=5, do_sample=False, num_beams=3)  # reorder_cache moves the sinks with the beams
        cache = KVStatsCache(IdentityScheme(D), 2, sink_tokens=3)
        assert torch.equal(model.generate(ids[:1], **cache_kwargs(model, cache), **kw), dense.generate(ids[:1], **kw))


def test_sinks_longer_than_the_text_keep_everything_exact(est, dense, ids):
    for model in (est, dense):
        cache = KVStatsCache(scheme("qkqv", bits=2, dim=D), sink_tokens=T)
        torch.testing.assert_close(_logits(model, ids, cache), _logits(dense, ids), rtol=0, atol=2e-5)
        assert cache.memory().code_bytes == 0 and cache.layers[0].n_sinks == T


# ----------------------------------------------------------------- lossy: the estimator path from its definition
def _definition(s: Scheme, k, v, q, first: int, sinks: int, window: int, flush: int, scaling: float):
    """float64 attention of the queries q [1, H_q, n, d] at positions [first, first + n) over keys [0, first + n):
    key j is exact for query i iff j < S or j ≥ held(i + 1) (:func:`_held_outside_window`), else read through the
    codes, decoded (blocks of G tokens from position S: KIVI's groups start after the sinks)."""
    n, grp = q.shape[2], HQ // HKV
    seq = first + n
    k, v = k[..., :seq, :], v[..., :seq, :]
    k_hat, v_hat = k.double().clone(), v.double().clone()
    for a in range(sinks, sinks + (seq - sinks) // flush * flush if seq > sinks else 0, flush):
        kh, vh = s.decode(s.encode(k[..., a:a + flush, :], v[..., a:a + flush, :]))
        k_hat[..., a:a + flush, :], v_hat[..., a:a + flush, :] = kh.double(), vh.double()
    pos_q, pos_k = torch.arange(first, seq)[:, None], torch.arange(seq)[None]
    held = torch.tensor([_held_outside_window(i + 1, sinks, window, flush) for i in range(first, seq)])[:, None]
    exact = (pos_k < sinks) | (pos_k >= held)
    rep = lambda t: t.double().repeat_interleave(grp, dim=1)  # noqa: E731
    qd = q.double()
    logits = torch.where(exact, qd @ rep(k).transpose(-1, -2), qd @ rep(k_hat).transpose(-1, -2)) * scaling
    w = torch.softmax(logits.masked_fill(pos_k > pos_q, float("-inf")), dim=-1)
    return ((w * exact) @ rep(v) + (w * ~exact) @ rep(v_hat)).transpose(1, 2)


@pytest.mark.parametrize("values", ["codes", "decoded"])
@pytest.mark.parametrize("name, sinks, window, flush", [("kqv", 2, 3, 1), ("kqv", 5, 0, 1), ("kivi", 3, 4, 4),
                                                        ("int_token", 1, 2, 1), ("qjl_cache", 4, 1, 1)])
@pytest.mark.parametrize("chunks", [(15,), (3, 12)])
def test_estimator_path_with_sinks_equals_its_float64_definition(name, sinks, window, flush, values, chunks,
                                                                 monkeypatch):
    """A prefill of 15 tokens in query blocks of 4 (in one forward, or 3 tokens then 12: a chunk that starts among
    the sinks), then 6 decode steps: each output equals the definition (the sinks and the window exact, the rest
    through the codes), with the output's codes part from the value codes or from V̂ decoded once."""
    monkeypatch.setattr(code_attention, "QUERY_BLOCK", 4)
    monkeypatch.setattr(code_attention, "CODE_VALUES_MAX_QUERIES", 10 ** 9 if values == "codes" else 0)
    s, scaling, prefill, steps = _build(name), D ** -0.5, 15, 6
    g = torch.Generator().manual_seed(11)
    k, v = torch.randn(1, HKV, prefill + steps, D, generator=g), torch.randn(1, HKV, prefill + steps, D, generator=g)
    q = torch.randn(1, HQ, prefill + steps, D, generator=g)
    layer = KVStatsLayer(s, window, flush, sinks=sinks)
    with torch.inference_mode():
        start = 0
        for n in chunks:
            layer.update(k[..., start:start + n, :], v[..., start:start + n, :])
            out, _ = layer.attend(q[..., start:start + n, :], None, scaling)
            want = _definition(s, k, v, q[..., start:start + n, :], start, sinks, window, flush, scaling)
            torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-5)
            start += n
        for t in range(prefill, prefill + steps):
            layer.update(k[..., t:t + 1, :], v[..., t:t + 1, :])
            out, _ = layer.attend(q[..., t:t + 1, :], None, scaling)
            want = _definition(s, k, v, q[..., t:t + 1, :], t, sinks, window, flush, scaling)
            torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-5)
    assert layer.n_sinks == sinks and layer.n_quantized == _held_outside_window(prefill + steps, sinks, window, flush)
    assert layer.n_quantized > sinks  # codes were read too


@pytest.mark.parametrize("name, window, flush", [("kqv", 2, 1), ("kv", 0, 1), ("kivi", 3, 4)])
def test_a_decode_step_with_sinks_runs_the_plans_with_the_numbers_of_the_general_path(name, window, flush,
                                                                                      monkeypatch):
    """The fused decode op reads codes then the window, not exact keys before the codes: with S > 0 a decode step
    runs the plans (the op is never called), and gives the outputs and weights of the general blocked path (a
    recording layer) bit for bit; with S = 0 the same layers do call the op where it reads the codes."""
    calls = []
    fused = code_attention.ops.decode_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(code_attention.ops, "decode_attention", counting)
    g = torch.Generator().manual_seed(5)
    for sinks in (3, 0):
        fast = KVStatsLayer(_build(name), window, flush, sinks=sinks)
        general = KVStatsLayer(_build(name), window, flush, record=True, sinks=sinks)
        with torch.inference_mode():
            k, v = torch.randn(1, HKV, 11, D, generator=g), torch.randn(1, HKV, 11, D, generator=g)
            for layer in (fast, general):
                layer.update(k, v)
                layer.attend(torch.randn(1, HQ, 11, D), None, 0.25)
            for _ in range(5):
                k1, v1, q = (torch.randn(1, h, 1, D, generator=g) for h in (HKV, HKV, HQ))
                outs = []
                for layer in (fast, general):
                    layer.update(k1, v1)
                    outs.append(layer.attend(q, None, 0.25))
                assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
        if sinks:
            assert not calls, "the fused op ran with sinks"
    assert bool(calls) == (name != "kivi")  # S = 0: the op runs where it reads the codes (not min-max)


# --------------------------------------------------------------------------------------------------- dense path
@pytest.mark.parametrize("name, window, flush", [("kqv", 3, 1), ("kivi", 4, 4)])
def test_dense_path_returns_the_sinks_exact_then_decoded_codes_then_the_window(name, window, flush):
    s, sinks = _build(name), 3
    g = torch.Generator().manual_seed(6)
    k, v = torch.randn(1, HKV, 20, D, generator=g), torch.randn(1, HKV, 20, D, generator=g)
    layer = KVStatsLayer(s, window, flush, sinks=sinks)
    keys, values = layer.update(k[..., :12, :], v[..., :12, :])
    for t in range(12, 21):
        nq = _held_outside_window(t, sinks, window, flush)
        assert layer.n_quantized == nq and keys.shape[-2] == t
        assert torch.equal(keys[..., :sinks, :], k[..., :sinks, :]) and torch.equal(values[..., :sinks, :],
                                                                                     v[..., :sinks, :])
        decoded = [s.decode(s.encode(k[..., a:a + flush, :], v[..., a:a + flush, :])) for a in range(sinks, nq, flush)]
        assert torch.equal(keys[..., sinks:nq, :], torch.cat([p[0] for p in decoded], dim=-2))
        assert torch.equal(values[..., sinks:nq, :], torch.cat([p[1] for p in decoded], dim=-2))
        assert torch.equal(keys[..., nq:t, :], k[..., nq:t, :]) and torch.equal(values[..., nq:t, :], v[..., nq:t, :])
        if t < 20:
            keys, values = layer.update(k[..., t:t + 1, :], v[..., t:t + 1, :])


@pytest.mark.parametrize("name", ["kqv", "int_token"])
def test_both_paths_agree_with_sinks(name, dense, est, ids):
    """W = 0: both paths treat every pair alike (module doc), the sinks exact on both."""
    s = _build(name)
    a = _logits(est, ids, KVStatsCache(s, sink_tokens=4))
    b = _logits(dense, ids, KVStatsCache(s, sink_tokens=4))
    assert float((a - _logits(dense, ids)).abs().max()) > 0.01
    torch.testing.assert_close(a, b, rtol=0, atol=5e-5)


# ------------------------------------------------------------------------------------------------------ memory
@pytest.mark.parametrize("sinks, window", [(0, 6), (4, 6), (4, 0)])
def test_memory_counts_codes_by_their_closed_form_and_the_sinks_with_the_window(sinks, window, est, ids):
    bits = 4
    cache = KVStatsCache(_int_scheme(bits), window, sink_tokens=sinks)
    _logits(est, ids, cache)
    mem, layers = cache.memory(), len(cache.layers)
    codes = T - window - sinks  # per layer: int_token holds ceil(d·b/8) bytes and fp16 lo and step per vector
    assert mem.code_bytes == layers * 2 * HKV * codes * (math.ceil(D * bits / 8) + 2 * 2)
    assert mem.window_bytes == layers * 2 * HKV * (window + sinks) * D * 4  # fp32 model: exact K and V
    assert cache.layers[0].nbytes() == (mem.code_bytes // layers, mem.window_bytes // layers)
    elements = layers * 2 * HKV * T * D
    assert mem.elements == elements
    assert mem.bits_per_element == pytest.approx(
        (codes * (bits + 32 / D) + (window + sinks) * 32) / T, rel=1e-12)
    assert mem.exact_elements == layers * 2 * HKV * (window + sinks) * D
    assert mem.code_bits_per_element == pytest.approx(bits + 32 / D, rel=1e-12)  # the codes alone


@pytest.mark.parametrize("sinks", [0, 4])
@pytest.mark.parametrize("bits", [2, 4])
def test_kivi_cache_counts_its_residual_in_the_bits_held(bits, sinks, est, ids):
    group, residual = 4, 8
    cache = kivi_cache(est, bits, group_size=group, residual_length=residual, sink_tokens=sinks)
    assert (cache.window, cache.flush_size, cache.sink_tokens) == (residual, group, sinks)
    _logits(est, ids, cache)
    nq = _held_outside_window(T, sinks, residual, group)
    n = nq - sinks  # coded tokens: K per channel in n/G groups, V per token in d/G groups, fp16 lo and step
    k_bytes = HKV * (n * D * bits // 8 + D * (n // group) * 4)
    v_bytes = HKV * (n * D * bits // 8 + n * (D // group) * 4)
    mem, layers = cache.memory(), len(cache.layers)
    assert mem.code_bytes == layers * (k_bytes + v_bytes)
    assert mem.window_bytes == layers * 2 * HKV * (T - n) * D * 4  # the residual (and the sinks), exact
    assert mem.exact_elements == layers * 2 * HKV * (T - n) * D
    assert mem.code_bits_per_element == pytest.approx(8 * (k_bytes + v_bytes) / (2 * HKV * n * D), rel=1e-12)
    # the residual holds R to R + G − 1 tokens, exact
    assert all(residual <= layer.keys.shape[-2] < residual + group for layer in cache.layers)


def test_kivi_cache_is_the_published_setting_and_refuses_others_by_name(dense):
    cache = kivi_cache(dense, 4, group_size=8, residual_length=16)
    s = cache.scheme
    assert (s.name, s.bits, s.k.axis, s.k.group_size, s.v.axis, s.v.group_size) == ("kivi", 4, "channel", 8,
                                                                                    "token", 8)
    with pytest.raises(ValueError, match=r"bits must be one of \(2, 4\) for scheme 'kivi'"):
        kivi_cache(dense, 3, group_size=8, residual_length=16)
    with pytest.raises(ValueError, match="residual_length must be a multiple of group_size = 8"):
        kivi_cache(dense, 2, group_size=8, residual_length=12)
    with pytest.raises(ValueError, match=r"group_size must divide dim=16 for axis='token', got 32"):
        kivi_cache(dense, 2)  # G = 32 needs d divisible by 32: the tiny model's d = 16
    with pytest.raises(ValueError, match=r"group_size must be in \[1, 1048576\], got 0"):
        kivi_cache(dense, 2, group_size=0)


# -------------------------------------------------------------------------------------- crop, prefill, records
def _state(cache):
    return [(layer.n_quantized, layer.n_sinks, layer.cumulative_length, *layer.decoded(), layer.keys, layer.values)
            for layer in cache.layers]


def _assert_same_state(a, b, atol):
    for la, lb in zip(_state(a), _state(b), strict=True):
        assert la[:3] == lb[:3]
        for x, y in zip(la[3:], lb[3:]):
            torch.testing.assert_close(x, y, rtol=0, atol=atol)


@pytest.mark.parametrize("name, window, flush", [("kqv", 3, 1), ("kivi", 4, 4)])
@pytest.mark.parametrize("fed, keep", [((20, 6), 22), ((10,), 3), ((6, 4), 5)])
def test_crop_with_sinks_equals_a_cache_that_never_saw_the_tokens(name, window, flush, fed, keep, est, ids):
    """Crops past the window, inside the window, and into the sinks (S = 5): the cache equals one fed the kept
    tokens, and the next forward gives the same logits."""
    s = _build(name)
    cropped, ref = (KVStatsCache(s, window, flush_size=flush, sink_tokens=5) for _ in range(2))
    start = 0
    for n in fed:
        _logits(est, ids[:, start:start + n], cropped)
        start += n
    cropped.crop(keep)
    _logits(est, ids[:, :keep], ref)
    assert cropped.get_seq_length() == keep
    tol = 1e-5 if flush == 1 else 0.3  # a 2-bit min-max code may flip by one step on K/V of other chunkings
    _assert_same_state(cropped, ref, atol=tol)
    a, b = _logits(est, ids[:, keep:keep + 8], cropped), _logits(est, ids[:, keep:keep + 8], ref)
    torch.testing.assert_close(a, b, rtol=0, atol=5e-5 if flush == 1 else 1e-3)


def test_prefill_with_sinks_stores_what_a_forward_stores(dense, est, ids):
    with torch.inference_mode():
        past = dense(ids[:, :20], use_cache=True).past_key_values
    lossless = KVStatsCache(IdentityScheme(D), 3, sink_tokens=4).prefill(past)
    torch.testing.assert_close(_logits(est, ids[:, 20:], lossless), _logits(dense, ids)[:, 20:], rtol=0, atol=1e-4)
    s = _build("kqv")  # W = 0: the chunk reads the codes alike on both paths
    prefilled, forward = KVStatsCache(s, sink_tokens=4).prefill(past), KVStatsCache(s, sink_tokens=4)
    for i, layer in enumerate(past.layers):  # the same K/V through update(), as a forward stores them
        forward.update(layer.keys, layer.values, i)
    _assert_same_state(prefilled, forward, atol=0)
    assert torch.equal(prefilled.layers[1].sink_keys, past.layers[1].keys[..., :4, :])
    a, b = _logits(est, ids[:, 20:], prefilled), _logits(dense, ids[:, 20:], forward)
    assert float((a - _logits(dense, ids)[:, 20:]).abs().max()) > 0.01  # the codes change the chunk's logits
    torch.testing.assert_close(a, b, rtol=0, atol=5e-5)


def test_records_with_sinks_see_no_damage_before_the_first_code(est, ids):
    """W = 0 and S = 4: queries 0..3 see only sinks (exact): their attention KL is 0 (to fp32 rounding, as a lossless
    scheme's) and their recall 1; later queries read codes."""
    cache = KVStatsCache(scheme("kv", bits=2, dim=D), sink_tokens=4, record_attention=True)
    _logits(est, ids, cache)
    kl = torch.stack([r.kl for r in cache.attention_records])
    recall = torch.stack([r.recall for r in cache.attention_records])
    assert float(kl[..., :4].abs().max()) < 1e-6 and bool((recall[..., :4] == 1).all())
    assert float(kl[..., 4:].mean()) > 1e-3


# ------------------------------------------------------------------------------------------- S = 0, bad values
def test_zero_sinks_change_nothing(est, ids):
    s = _build("kqv")
    a, b = KVStatsCache(s, 3), KVStatsCache(s, 3, sink_tokens=0)
    assert torch.equal(_logits(est, ids, a), _logits(est, ids, b))
    assert all(layer.sink_keys is None and layer.n_sinks == 0 for layer in b.layers)
    assert repr(a) == repr(b) and "sink_tokens" in repr(KVStatsCache(s, 3, sink_tokens=2))


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2", None])
def test_a_bad_sink_count_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match=rf"sink_tokens must be an int >= 0, got {bad!r}"):
        KVStatsCache(IdentityScheme(D), sink_tokens=bad)
