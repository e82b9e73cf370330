"""A long forward's attention from decoded K̂/V̂ (kvstats.hf.decoded_attention): the far keys through torch's flash
kernel, the band explicitly, joined by log-sum-exp — against attention from its definition in float64 (the
estimator's scores, V̂ decoded, per query and key), and refused wherever it could not be that.

The oracle takes each quantized key's logit from ``scheme.scores`` (the estimator itself, not K̂), so it checks
both the split softmax and that K̂'s products stand for the estimator. fp32 against fp64: the outputs are ~1 in
size and the sums run over ≤ 400 keys, so 2e-5 bounds the rounding with a wide margin (the measured gap ~1e-6).
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")

import kvstats.hf.code_attention as code_attention  # noqa: E402
from kvstats.hf.cache import KVStatsCache, use_estimator_attention  # noqa: E402
from kvstats.hf.cache_layer import KVStatsLayer  # noqa: E402
from kvstats.hf.decoded_attention import flash_part, merge_parts, scores_are_decoded  # noqa: E402
from kvstats.hf.logit_rules import LogitRules  # noqa: E402
from kvstats.quant import attention as _attention  # noqa: E402
from kvstats.quant.quantizers.base import Quantizer  # noqa: E402
from kvstats.quant.schemes import Scheme, scheme  # noqa: E402
from tests.helpers.llama import _tiny  # noqa: E402
from tests.helpers.llama import logits as model_logits  # noqa: E402
from tests.helpers.quantizers import Int4PerToken  # noqa: E402
from tests.helpers.user_quantizers import GroupAbsmax  # noqa: E402

HQ, HKV, D = 6, 2, 32
SCALING = D ** -0.5


def _layer_oracle(layer: KVStatsLayer, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """attend() of the queries q [B, H_q, N, d] at the last N positions from its definition, in float64: key j is
    read through its code by the query at position i iff j < quantized_count(i + 1) (its logit then the scheme's
    estimator ``scheme.scores`` of its chunk, its value from ``scheme.v.decode``; the sinks exact), else exactly
    (k, v hold every position's exact states); causal. Output [B, N, H_q, d]."""
    seq, n, grp = k.shape[-2], q.shape[2], q.shape[1] // k.shape[1]
    sinks = layer.n_sinks
    code_logits = [q.new_zeros(*q.shape[:3], sinks)] + [layer.scheme.scores(q, c) for c in layer.chunks]
    code_values = [v[..., :sinks, :]] + [layer.scheme.v.decode(c.v) for c in layer.chunks]
    quant = torch.cat(code_logits, -1).double()[..., :seq]
    quant = torch.nn.functional.pad(quant, (0, seq - quant.shape[-1]))
    quant[..., :sinks] = (q @ k[..., :sinks, :].repeat_interleave(grp, 1).transpose(-1, -2)).double()
    v_hat = torch.cat(code_values, -2).double()[..., :seq, :]
    v_hat = torch.nn.functional.pad(v_hat, (0, 0, 0, seq - v_hat.shape[-2])).repeat_interleave(grp, 1)
    exact = q.double() @ k.double().repeat_interleave(grp, 1).transpose(-1, -2)
    pos_q = torch.arange(seq - n, seq).unsqueeze(-1)
    pos_k = torch.arange(seq).unsqueeze(0)
    use_exact = pos_k >= layer.quantized_count(pos_q + 1)
    logits = torch.where(use_exact, exact, quant) * SCALING
    w = torch.softmax(logits.masked_fill(pos_k > pos_q, float("-inf")), dim=-1)
    out = (w * ~use_exact) @ v_hat + (w * use_exact) @ v.double().repeat_interleave(grp, 1)
    return out.transpose(1, 2)


def _states(seq: int, seed: int, batch: int = 1):
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(batch, HKV, seq, D, generator=g), torch.randn(batch, HKV, seq, D, generator=g)
    return k, v, torch.randn(batch, HQ, seq, D, generator=g)


def _attend(layer: KVStatsLayer, q: torch.Tensor, monkeypatch, *, expect_decoded: bool = True, **kw):
    """layer.attend(q) in a forward whose weights nobody reads (as a prefill under generate), asserting which path
    ran: the decoded-keys one, or the blocks of code logits."""
    monkeypatch.setattr(code_attention, "_weights_requested", lambda: False)
    calls = []
    for name in ("_attend_decoded", "_attend_rows"):
        real = getattr(KVStatsLayer, name)
        monkeypatch.setattr(layer, name, lambda *a, _real=real, _name=name, **k: calls.append(_name)
                            or _real(layer, *a, **k))
    out, weights = layer.attend(q, kw.pop("mask", None), SCALING, rules=kw.pop("rules", None))
    assert weights is None
    assert set(calls) == ({"_attend_decoded"} if expect_decoded else {"_attend_rows"}), calls
    return out


CASES = {  # scheme, cache options: per-vector codes, a transposed K̂ (per-channel groups), sinks, flushes, GQA
    "kqv": (lambda: scheme("kqv", bits=3, dim=D, seed=1), {"window": 16}),
    "qkqv": (lambda: scheme("qkqv", bits=2, dim=D, seed=2), {"window": 5}),
    "minmax-channel": (lambda: scheme("minmax", bits=3, dim=D, seed=3), {"window": 16}),
    "kivi": (lambda: scheme("kivi", bits=2, dim=D, seed=4), {"window": 32}),
    "qjl_cache": (lambda: scheme("qjl_cache", bits=3, dim=D, seed=5), {"window": 8}),
    "nvfp4": (lambda: scheme("nvfp4", bits=4, dim=D, seed=0), {"window": 16}),
    "sinks-flush": (lambda: scheme("kqv", bits=4, dim=D, seed=6), {"window": 12, "sinks": 4, "flush_size": 8}),
    "flush": (lambda: scheme("kqv", bits=4, dim=D, seed=6), {"window": 12, "flush_size": 5}),
    "no-window": (lambda: scheme("kqv", bits=4, dim=D, seed=7), {"window": 0}),
    "window-past-the-segment": (lambda: scheme("kqv", bits=4, dim=D, seed=8), {"window": 170}),
    "user-subclass": (lambda: Scheme("user", 4, Int4PerToken(4, D, seed=0), Int4PerToken(4, D, seed=0)),
                      {"window": 16}),
    "user-protocol-only": (lambda: Scheme("user", 4, GroupAbsmax(4, D), GroupAbsmax(4, D)), {"window": 16}),
}
#: cases whose K estimator is not decode-then-dot by construction: the code-logit blocks (their plan checks inner)
BLOCKS = {"user-protocol-only"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_long_forward_from_decoded_keys_equals_its_definition(case, monkeypatch):
    """A 300-token prefill (blocks of 37 queries: a partial last block; batch 2) and then a 150-token segment after
    it (its first keys readable only through their codes): each equals the float64 definition. One token flushed at
    a time without sinks takes the window path (two flash calls and the exact band), the others the blocks."""
    make, options = CASES[case]
    monkeypatch.setattr(code_attention, "DECODED_QUERY_BLOCK", 37)
    k, v, q = _states(450, seed=len(case), batch=2)
    layer = KVStatsLayer(make(), layer_idx=0, **options)
    layer.update(k[..., :300, :], v[..., :300, :])
    out = _attend(layer, q[:, :, :300], monkeypatch, expect_decoded=case not in BLOCKS)
    torch.testing.assert_close(out.double(), _layer_oracle(layer, k[..., :300, :], v[..., :300, :], q[:, :, :300]),
                               rtol=0, atol=2e-5)
    layer.update(k[..., 300:, :], v[..., 300:, :])
    out = _attend(layer, q[:, :, 300:], monkeypatch, expect_decoded=case not in BLOCKS)
    torch.testing.assert_close(out.double(), _layer_oracle(layer, k, v, q[:, :, 300:]), rtol=0, atol=2e-5)


@pytest.mark.parametrize("options", [{"window": 0, "sinks": 4}, {"window": 0, "flush_size": 3},
                                     {"window": 2, "sinks": 3, "flush_size": 2}])
def test_blocks_of_one_query_whose_keys_are_all_codes(options, monkeypatch):
    """Blocks of one query with no exact key in their band (W = 0 with sink tokens or flushes: the query's own key
    is already a code): the far part alone, against the definition."""
    monkeypatch.setattr(code_attention, "DECODED_QUERY_BLOCK", 1)
    k, v, q = _states(70, seed=5)
    layer = KVStatsLayer(scheme("kqv", bits=3, dim=D, seed=1), layer_idx=0, **options)
    layer.update(k, v)
    out = _attend(layer, q, monkeypatch)
    torch.testing.assert_close(out.double(), _layer_oracle(layer, k, v, q), rtol=0, atol=2e-5)


def test_a_protocol_only_quantizer_keeps_its_checked_estimator(monkeypatch):
    """A quantizer on the protocol alone whose inner is not ⟨q, decode⟩ (here 1.25 times it): the long forward
    keeps the code-logit blocks, whose plan compares inner with q·K̂ᵀ, warns and scores through inner — the
    attention of its own estimator, never K̂'s."""

    class Stretched(GroupAbsmax):
        def inner(self, q, code):
            return 1.25 * super().inner(q, code)

    sch = Scheme("stretched", 4, Stretched(4, D), GroupAbsmax(4, D))
    assert not scores_are_decoded(sch)
    k, v, q = _states(200, seed=8)
    layer = KVStatsLayer(sch, window=8, layer_idx=0)
    layer.update(k, v)
    with pytest.warns(UserWarning):
        out = _attend(layer, q, monkeypatch, expect_decoded=False)
    torch.testing.assert_close(out.double(), _layer_oracle(layer, k, v, q), rtol=0, atol=2e-5)


def test_flash_part_refuses_tensors_off_the_cpu():
    q = torch.randn(1, HQ, 3, D, device="meta")
    with pytest.raises(ValueError, match="q must be on the CPU, got meta"):
        flash_part(q, q[:, :HKV], q[:, :HKV], SCALING)


def test_off_the_cpu_the_decoded_path_is_not_taken():
    """The flash part would form whole [N, S] logits on another device: the blocks bound them there."""
    layer = KVStatsLayer(scheme("kqv", bits=4, dim=D), window=8, layer_idx=0)
    layer.update(*_states(100, seed=1)[:2])
    assert layer._decoded_keys_apply(None, 0.0, False, LogitRules())
    layer.device = torch.device("cuda")
    assert not layer._decoded_keys_apply(None, 0.0, False, LogitRules())


def test_decoded_keys_agree_with_the_code_logits_path(monkeypatch):
    """The same prefill through both paths: the same attention up to fp32 rounding (the decoded path reorders the
    sums; a quantized model can then flip a code in a later layer, docs/cache.md)."""
    k, v, q = _states(260, seed=9)
    outs = []
    for decoded in (True, False):
        layer = KVStatsLayer(scheme("kqv", bits=4, dim=D, seed=0), window=16, layer_idx=0)
        layer.update(k, v)
        if not decoded:
            monkeypatch.setattr(layer, "_decoded_keys_apply", lambda *a, **kw: False)
        outs.append(_attend(layer, q, monkeypatch, expect_decoded=decoded))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=5e-6)


@pytest.mark.parametrize("what", ["record", "mask", "softcap", "window", "sinks", "nonlinear", "short"])
def test_what_the_decoded_path_cannot_compute_takes_the_code_logits(what, monkeypatch):
    """Records (they need every logit), a mask, soft capping, a sliding window, attention-sink logits, a K estimator
    that may not be linear, and a forward short enough to return its weights: the block path, never K̂."""
    k, v, q = _states(200, seed=3)
    sch = (Scheme("mine", 4, _NonlinearInner(4, D, seed=0), Int4PerToken(4, D, seed=0)) if what == "nonlinear"
           else scheme("kqv", bits=4, dim=D, seed=0))
    layer = KVStatsLayer(sch, window=8, layer_idx=0, record=what == "record")
    layer.update(k, v)
    rules = {"softcap": LogitRules(softcap=30.0), "window": LogitRules(sliding_window=64),
             "sinks": LogitRules(sinks=torch.zeros(HQ))}.get(what)
    mask = torch.ones(1, 1, 200, 200, dtype=torch.bool).tril() if what == "mask" else None
    if what == "short":
        layer = KVStatsLayer(sch, window=8, layer_idx=0)
        layer.update(k[..., :40, :], v[..., :40, :])
        q = q[:, :, :40]
    monkeypatch.setattr(code_attention, "_weights_requested", lambda: False)
    monkeypatch.setattr(layer, "_attend_decoded", lambda *a, **kw: pytest.fail("the decoded path ran"))
    layer.attend(q, mask, SCALING, rules=rules)


class _NonlinearInner(Int4PerToken):
    """A user's K quantizer whose estimator is not ⟨q, decode(code)⟩."""

    def _inner(self, q, code):
        return torch.tanh(super()._inner(q, code))


def test_scores_are_decoded_names_the_linear_estimators():
    assert scores_are_decoded(scheme("kqv", bits=4, dim=D))
    assert scores_are_decoded(scheme("nova", bits=2, dim=D, queries=torch.randn(1, HQ, 300, D),
                                     keys=torch.randn(1, HKV, 300, D)))
    # a subclass of kvstats' Quantizer keeping its inner: decode-then-dot by construction; a quantizer on the
    # protocol alone: nothing guarantees its inner (the cache checks it on the code-logit path)
    assert scores_are_decoded(Scheme("user", 4, Int4PerToken(4, D, seed=0), Int4PerToken(4, D, seed=0)))
    assert not scores_are_decoded(Scheme("user", 4, GroupAbsmax(4, D), GroupAbsmax(4, D)))
    assert not scores_are_decoded(Scheme("mine", 4, _NonlinearInner(4, D, seed=0), Int4PerToken(4, D, seed=0)))
    overridden = scheme("kqv", bits=4, dim=D)
    overridden.k.inner = lambda q, code: torch.zeros(())  # honoured by the cache through scheme.scores
    assert not scores_are_decoded(overridden)

    class OwnScores(Scheme):
        def scores(self, queries, cache):
            return super().scores(queries, cache) * 2

    plain = scheme("kqv", bits=4, dim=D)
    assert not scores_are_decoded(OwnScores("kqv2", 4, plain.k, plain.v))
    assert not scores_are_decoded(object())
    assert issubclass(_NonlinearInner, Quantizer)


def test_flash_part_and_merge_equal_one_softmax():
    """Two disjoint key sets' partial attentions, joined by their log-sum-exps, equal the softmax over both
    (float64 reference), with grouped-query heads and a transposed key tensor (the kernel reads it copied)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, HQ, 7, D, generator=g)
    k = torch.randn(2, HKV, D, 90, generator=g).transpose(-1, -2)  # last axis not unit-stride
    v = torch.randn(2, HKV, 90, D, generator=g)
    out_a, lse_a = flash_part(q, k[..., :50, :], v[..., :50, :], SCALING)
    out_b, lse_b = flash_part(q, k[..., 50:, :], v[..., 50:, :], SCALING)
    logits = _attention.scores(q.double(), k.double(), scale=SCALING)
    want = _attention.apply_weights(torch.softmax(logits, -1), v.double())
    torch.testing.assert_close(lse_a.double(), torch.logsumexp(logits[..., :50], -1), rtol=0, atol=1e-5)
    torch.testing.assert_close(merge_parts(out_a, lse_a, out_b, lse_b).double(), want, rtol=0, atol=1e-6)
    # causal (query r over keys [0, r]), batch 2, grouped heads: the G query heads of a KV head as a batch axis
    out, lse = flash_part(q, k[..., :7, :], v[..., :7, :], SCALING, causal=True)
    causal = logits[..., :7].masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(causal, -1), rtol=0, atol=1e-5)
    want = _attention.apply_weights(torch.softmax(causal, -1), v[..., :7, :].double())
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-6)


def test_lossless_long_prefill_through_decoded_keys_is_the_models_own():
    """The oracle for every architecture: a lossless scheme's 200-token prefill, on the decoded path, gives the
    model's own logits (sdpa, no cache) within fp32 rounding."""
    from kvstats.quant.schemes import IdentityScheme

    model = _tiny(attn="sdpa")
    ids = torch.randint(1, 100, (1, 200), generator=torch.Generator().manual_seed(1))
    want = model_logits(model, ids)
    use_estimator_attention(model)
    cache = KVStatsCache(IdentityScheme(16), full_precision_window=8)
    ran = []
    real = KVStatsLayer._attend_decoded

    def spy(self, *a, **kw):
        ran.append(self.layer_idx)
        return real(self, *a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(KVStatsLayer, "_attend_decoded", spy)
        got = model_logits(model, ids, cache)
    assert ran == [0, 1]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
