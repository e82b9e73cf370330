"""Attention in one place (kvstats.quant.attention): every caller gets the same numbers, and they are right.

Oracle: a float64 einsum reference written here (explicit repetition of the KV heads, the causal mask from
its definition j ≤ query_offset + i, numpy softmax). Callers checked: kvstats.quant.attention itself,
kvstats.metrics, Scheme.scores / Scheme.attention, the transformers cache (KVStatsLayer.attend and
kvstats_attention) and budget_sweep's trial metrics. Same-arithmetic callers must agree with
kvstats.quant.attention exactly (==); every caller must match the reference to the rounding of its dtype.
Deterministic (fixed seeds, no sampling statistics).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special
import torch

from kvstats.measure import metrics
from kvstats.quant import attention
from kvstats.quant.schemes import Scheme
from tests.helpers.studies import load_study

RATIOS = (1, 2, 4, 7)
TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


def _data(ratio: int, dtype: torch.dtype, *, hkv: int = 2, n: int = 5, s: int = 9, d: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(100 * ratio + seed)
    q = torch.randn(2, hkv * ratio, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(2, hkv, s, d, generator=g, dtype=torch.float64)
    v = torch.randn(2, hkv, s, d, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _visible(n: int, s: int, offset: int | None) -> np.ndarray:
    offset = s - n if offset is None else offset
    return np.array([[j <= offset + i for j in range(s)] for i in range(n)])


def _reference(q, k, v, causal: bool, offset: int | None = None, scale: float | None = None):
    """(logits, weights, output) in float64 numpy with explicit GQA head repetition."""
    q, k, v = (x.double().numpy() for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    kr, vr = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    logits = np.einsum("bhnd,bhsd->bhns", q, kr) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    masked = np.where(_visible(q.shape[2], k.shape[2], offset), logits, -np.inf) if causal else logits
    w = scipy.special.softmax(masked, axis=-1)
    return logits, w, np.einsum("bhns,bhsd->bhnd", w, vr)


def _close(got: torch.Tensor, want: np.ndarray, dtype: torch.dtype) -> None:
    np.testing.assert_allclose(got.double().numpy(), want, rtol=TOL[dtype], atol=TOL[dtype])


def _identity_scheme(d: int) -> Scheme:
    from kvstats.hf.cache import IdentityScheme

    return IdentityScheme(d)


# ------------------------------------------------------------------------------------------ the module


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("causal, offset", [(False, None), (True, None), (True, 0), (True, 2)])
def test_attention_module_matches_the_float64_reference(ratio, dtype, causal, offset):
    q, k, v = _data(ratio, dtype)
    logits, _, out = _reference(q, k, v, causal, offset)
    s = attention.scores(q, k)
    assert s.shape == (2, 2 * ratio, 5, 9) and s.dtype == dtype
    _close(s, logits, dtype)
    visible = attention.causal_visible(5, 9, offset) if causal else None
    if causal:
        assert visible.tolist() == _visible(5, 9, offset).tolist()
    _close(attention.attend(s, v, visible), out, dtype)


def test_causal_visible_rejects_what_it_cannot_place():
    with pytest.raises(ValueError, match=r"n_q = 5 queries > n_k = 3 keys needs an explicit query_offset"):
        attention.causal_visible(5, 3)
    with pytest.raises(ValueError, match=r"query_offset must be >= 0, got -1"):
        attention.causal_visible(2, 3, -1)
    assert attention.causal_visible(5, 3, 0).sum().item() == 1 + 2 + 3 + 3 + 3
    with pytest.raises(ValueError, match=r"query heads \(3\) must be a positive multiple of the KV heads \(2\)"):
        attention.gqa_group(3, 2)


# ------------------------------------------------------------------------------------------ the callers


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("causal, offset", [(False, None), (True, None), (True, 1)])
def test_metrics_use_the_same_attention(ratio, dtype, causal, offset):
    """metrics.attention_scores is kvstats.quant.attention.scores; the metrics' mask and weights are the reference's.

    Weights oracle: adding the same vector c to every value shifts the output by exactly c (weights sum to 1),
    so attention_output_error(q, k, v, k, v + c) = ‖c‖ / ‖o‖ with o the reference output.
    """
    q, k, v = _data(ratio, dtype, seed=1)
    logits, w, out = _reference(q, k, v, causal, offset)
    assert torch.equal(metrics.attention_scores(q, k), attention.scores(q, k))
    c = torch.linspace(-0.5, 0.5, v.shape[-1], dtype=dtype)
    got = metrics.attention_output_error(q, k, v, k, v + c, causal=causal, query_offset=offset, reduction="none")
    want = np.linalg.norm(c.double().numpy()) / np.linalg.norm(out, axis=-1)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=20 * TOL[dtype])
    # KL against a shifted copy of the keys: the reference's masked softmaxes give the oracle
    k_hat = k + 0.3 * torch.ones_like(k)
    _, w_hat, _ = _reference(q, k_hat, v, causal, offset)
    kl = metrics.attention_kl(q, k, k_hat, causal=causal, query_offset=offset, reduction="none")
    np.testing.assert_allclose(kl.double().numpy(), scipy.special.rel_entr(w, w_hat).sum(-1),
                               rtol=50 * TOL[dtype], atol=TOL[dtype])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("causal", [False, True])
def test_scheme_scores_and_attention_use_the_same_attention(ratio, dtype, causal):
    """Scheme.scores / Scheme.attention with a lossless scheme: exactly kvstats.quant.attention, and the reference."""
    q, k, v = _data(ratio, dtype, seed=2)
    logits, w, out = _reference(q, k, v, causal)
    s = _identity_scheme(16)
    code = s.encode(k, v)
    raw = s.scores(q, code)
    assert torch.equal(raw, attention.scores(q, k, scale=1.0))
    _close(raw / 4.0, logits, dtype)
    got, weights = s.attention(q, code, causal=causal, return_weights=True)
    visible = attention.causal_visible(5, 9) if causal else None
    assert torch.equal(got, attention.attend(attention.scores(q, k), v, visible))
    _close(weights, w, dtype)
    _close(got, out, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("window", [0, 3, 9])
def test_cache_attention_uses_the_same_attention(ratio, dtype, window):
    """KVStatsLayer.attend (codes, exact window, or both) and kvstats_attention: the causal reference."""
    from kvstats.hf.cache import KVStatsLayer, kvstats_attention

    q, k, v = _data(ratio, dtype, seed=3)
    scale = 16 ** -0.5
    _, w, out = _reference(q, k, v, True, scale=scale)
    layer = KVStatsLayer(_identity_scheme(16), window)
    layer.update(k, v)
    got, weights = layer.attend(q, None, scale)
    assert got.shape == (2, 5, 2 * ratio, 16)
    _close(got.transpose(1, 2), out, dtype)
    _close(weights, w, dtype)

    class Module:
        training = False
        scaling = scale

    plain, plain_w = kvstats_attention(Module(), q, k, v, None)
    _close(plain.transpose(1, 2), out, dtype)
    _close(plain_w, w, dtype)
    expected = attention.attention_weights(attention.scores(q, k, scale=scale), attention.causal_visible(5, 9))
    assert torch.equal(plain_w, expected)


@pytest.mark.slow
@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("causal", [False, True])
def test_budget_sweep_trial_uses_the_same_attention(ratio, causal):
    """budget_sweep's per-trial attention numbers against the float64 reference on the scheme's own logits."""
    bs = load_study("budget_sweep")
    q, k, v = _data(ratio, torch.float32, seed=4, d=32, s=12)
    s = bs.make_scheme("kqv", 3, 32, seed=5)
    row = bs.trial_metrics(s, q, k, v, causal)
    code = s.encode(k, v)
    _, v_hat = s.decode(code)
    est = (s.scores(q, code) / math.sqrt(32)).double().numpy()
    _, w, out = _reference(q, k, v, causal)
    masked = np.where(_visible(5, 12, None), est, -np.inf) if causal else est
    w_hat = scipy.special.softmax(masked, axis=-1)
    out_hat = np.einsum("bhns,bhsd->bhnd", w_hat, np.repeat(v_hat.double().numpy(), ratio, axis=1))
    kl = scipy.special.rel_entr(w, w_hat).sum(-1).mean()
    err = (np.linalg.norm(out - out_hat, axis=-1) / np.linalg.norm(out, axis=-1)).mean()
    assert row["attention_kl"] == pytest.approx(kl, rel=1e-9)
    assert row["output_error"] == pytest.approx(err, rel=1e-9)
    assert row["attention_kl"] > 1e-4  # 3-bit keys: a real error, not a vacuous 0


@pytest.mark.parametrize("ratio", RATIOS)
def test_a_module_that_is_not_causal_attends_to_every_key_without_a_mask(ratio):
    """kvstats_attention for a module with is_causal = False and no mask (a vision tower's, an encoder's): every
    key, as sdpa reads it (float64 numpy the oracle); a causal module with no mask: causal. On a KVStatsCache, which
    models causal decoding, the non-causal call is refused by name, not read as causal."""
    from kvstats.hf.cache import KVStatsLayer, kvstats_attention

    q, k, v = _data(ratio, torch.float64, seed=8)
    n = q.shape[2]
    q, k, v = q[:, :, :n], k[:, :, :n], v[:, :, :n]  # as many keys as queries: a self-attention forward
    scale = 16 ** -0.5
    kr, vr = (np.repeat(t.numpy(), ratio, axis=1) for t in (k, v))
    logits = np.einsum("bhnd,bhsd->bhns", q.numpy(), kr) * scale

    def oracle(visible):
        w = scipy.special.softmax(np.where(visible, logits, -np.inf), axis=-1)
        return np.einsum("bhns,bhsd->bhnd", w, vr)

    class Encoder:
        training, scaling, is_causal = False, scale, False

    class Decoder(Encoder):
        is_causal = True

    full, _ = kvstats_attention(Encoder(), q, k, v, None)
    np.testing.assert_allclose(full.transpose(1, 2).numpy(), oracle(np.ones((n, n), bool)), rtol=1e-12, atol=1e-12)
    causal, _ = kvstats_attention(Decoder(), q, k, v, None)
    np.testing.assert_allclose(causal.transpose(1, 2).numpy(), oracle(np.tril(np.ones((n, n), bool))), rtol=1e-12,
                               atol=1e-12)
    assert not np.allclose(full.numpy(), causal.numpy())  # the two readings differ on these states
    # the call's is_causal=True overrides the module's False (CLIP's text tower calls its encoder so), as in sdpa
    keyword, _ = kvstats_attention(Encoder(), q, k, v, None, is_causal=True)
    np.testing.assert_allclose(keyword.numpy(), causal.numpy(), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"sliding_window=2"):
        kvstats_attention(Encoder(), q, k, v, None, sliding_window=2)
    layer = KVStatsLayer(_identity_scheme(16), 0)
    keys, values = layer.update(k, v)
    with pytest.raises(ValueError, match=r"Encoder is not causal \(is_causal=False\) and passed no mask"):
        kvstats_attention(Encoder(), q, keys, values, None)
    one, _ = kvstats_attention(Encoder(), q[:, :, -1:], keys, values, None)  # one query at the last key: every key
    np.testing.assert_allclose(one.transpose(1, 2).numpy(), oracle(np.ones((n, n), bool))[:, :, -1:], rtol=1e-10,
                               atol=1e-10)
