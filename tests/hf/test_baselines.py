"""kvstats.hf.baselines: transformers' own quantized caches (quanto, HQQ) through end_to_end's output metrics.

* ``output_metrics`` against scipy (KL via ``scipy.special.rel_entr``, NLL via ``logsumexp``), and exact logits
  give KL 0, top-1 agreement 1, NLL equal to the reference's.
* ``teacher_forced_logits`` (skipped without the ``[baselines]`` extra) on a tiny random Llama: the first token
  is exact (a QuantizedCache quantizes a forward's tokens after that forward); it reproduces transformers' own
  ``generate(cache_implementation="quantized")`` token for token (greedy decoding fed back); the damage falls
  with the budget (4 bits below 2 bits) and with fewer tokens quantized. These are deterministic (fixed model,
  deterministic round-to-nearest codes): no sampling, nothing to be flaky.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import logsumexp, rel_entr, softmax

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")

from kvstats.hf.baselines import (  # noqa: E402
    BACKENDS,
    available_backends,
    baseline_rows,
    output_metrics,
    quantized_cache,
    quantized_prefill,
    teacher_forced_logits,
)

B, T, V = 2, 24, 100


def test_output_metrics_against_scipy():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 3
    other = ref + torch.randn(B, T, V, generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (B, T), generator=g)
    m = output_metrics(ref, other, ids)
    p, q = softmax(ref.numpy(), axis=-1), softmax(other.numpy(), axis=-1)
    np.testing.assert_allclose(m["out_kl"].numpy(), rel_entr(p, q).sum(-1), rtol=1e-9, atol=1e-12)
    tgt = ids[:, 1:].numpy()
    for name, logits in (("nll_ref", ref), ("nll", other)):
        x = logits.numpy()[:, :-1]
        want = logsumexp(x, axis=-1) - np.take_along_axis(x, tgt[..., None], -1)[..., 0]
        np.testing.assert_allclose(m[name].numpy(), want, rtol=1e-12)
    np.testing.assert_array_equal(m["top1"].numpy(), (ref.argmax(-1) == other.argmax(-1)).double().numpy())
    same = output_metrics(ref, ref.clone(), ids)
    assert float(same["out_kl"].abs().max()) == 0 and bool((same["top1"] == 1).all())
    torch.testing.assert_close(same["nll"], same["nll_ref"], rtol=0, atol=0)


def test_bad_inputs():
    x = torch.zeros(B, T, V)
    with pytest.raises(ValueError, match="one shape"):
        output_metrics(x, x[:, 1:], torch.zeros(B, T, dtype=torch.long))
    with pytest.raises(ValueError, match="ids must be"):
        output_metrics(x, x, torch.zeros(B, T + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="backend must be one of"):
        quantized_cache(_tiny().config, "int8")
    assert set(available_backends()) <= set(BACKENDS)


def _tiny():
    cfg = transformers.LlamaConfig(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_theta=10000.0,
        attn_implementation="sdpa", initializer_range=0.1, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def model():
    return _tiny()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(1, V, (B, T), generator=torch.Generator().manual_seed(1))


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_quantized_cache_teacher_forcing(backend, model, ids):
    if backend not in available_backends():
        pytest.skip(f"{BACKENDS[backend]} is not installed (the [baselines] extra)")
    with pytest.raises(ValueError, match="nbits must be"):
        quantized_cache(model, backend, 0)
    with torch.inference_mode():
        exact = model(ids).logits.float()
    # a residual longer than the text: only the first forward's token is quantized (after it attended exactly)
    first_only = teacher_forced_logits(model, ids, backend, 2, residual_length=T + 1, q_group_size=16)
    torch.testing.assert_close(first_only[:, 0], exact[:, 0], rtol=0, atol=2e-5)
    damage = {"first only": float(output_metrics(exact, first_only, ids)["out_kl"].mean())}
    for nbits in (2, 4):
        logits = teacher_forced_logits(model, ids, backend, nbits, residual_length=4, q_group_size=16)
        torch.testing.assert_close(logits[:, 0], exact[:, 0], rtol=0, atol=2e-5)
        damage[nbits] = float(output_metrics(exact, logits, ids)["out_kl"].mean())
        assert bool(torch.isfinite(logits).all())
    assert 0 < damage[4] < damage[2] and damage["first only"] < damage[2], damage
    rows = baseline_rows(model, ids, exact, backend, 2, residual_length=4, q_group_size=16)  # end_to_end's rows
    tokens = [r for r in rows if r["kind"] == "token"]
    assert len(tokens) == B * T and rows[-1]["kind"] == "cell" and rows[-1]["residual_length"] == 4
    assert sum(r["out_kl"] for r in tokens) / len(tokens) == pytest.approx(damage[2], rel=1e-12)
    assert sum(r["nll"] is None for r in tokens) == B
    # transformers' own generate with the same cache, fed its greedy tokens back, gives the same tokens
    prompt = ids[:1, :1]
    out = model.generate(prompt, max_new_tokens=T - 1, do_sample=False, cache_implementation="quantized",
                         cache_config={"backend": backend, "nbits": 2, "residual_length": 4, "q_group_size": 16})
    logits = teacher_forced_logits(model, out, backend, 2, residual_length=4, q_group_size=16)
    assert torch.equal(logits[0, :-1].argmax(-1), out[0, 1:])


@pytest.mark.slow  # transformers and optimum-quanto's imports
def test_quantized_cache_bytes_are_its_codes_scales_shifts_and_residual():
    from kvstats.hf.baselines import available_backends, quantized_cache, quantized_cache_memory

    if "quanto" not in available_backends():
        pytest.skip("optimum-quanto is not installed")
    config = transformers.LlamaConfig(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, head_dim=64,
                                      num_hidden_layers=2, intermediate_size=64, vocab_size=32)
    cache = quantized_cache(config, "quanto", 4, residual_length=4)
    gen = torch.Generator().manual_seed(0)
    for tokens in (64, 1, 1):  # a prefill quantized whole, then two exact tokens in the residual
        for layer in range(2):
            cache.update(torch.randn(1, 2, tokens, 64, generator=gen), torch.randn(1, 2, tokens, 64, generator=gen),
                         layer)
    held = quantized_cache_memory(cache)
    quantized, residual = 1 * 2 * 64 * 64, 1 * 2 * 2 * 64  # elements of K (or V) per layer
    codes = quantized // 2 + 2 * 4 * quantized // 64  # int4 codes two per byte, an fp32 scale and shift per 64
    expected = 2 * (2 * codes + 2 * residual * 4)
    assert held["cache_bytes"] == expected
    assert held["quantized_memory"]["residual_bytes"] == 2 * 2 * residual * 4
    assert held["bits_per_element"] == pytest.approx(8 * expected / (2 * 2 * (quantized + residual)))


@pytest.mark.parametrize("nbits", [2, 4])
def test_a_quantized_prefill_holds_what_the_prefill_forward_would_have_written(nbits):
    """The oracle is transformers itself: the same QuantizedCache filled by the prefill forward. The next token's
    logits through either cache are equal bit for bit (the cache quantizes a forward's states after the forward)."""
    if "quanto" not in available_backends():
        pytest.skip("optimum-quanto is not installed")
    model = _tiny()
    ids = torch.randint(1, V, (1, 33), generator=torch.Generator().manual_seed(4))  # 32 prompt tokens: groups of 64
    with torch.inference_mode():
        by_forward = quantized_cache(model, "quanto", nbits, residual_length=2)
        model(ids[:, :-1], past_key_values=by_forward, use_cache=True)
        want = model(ids[:, -1:], past_key_values=by_forward, use_cache=True).logits
        past = model(ids[:, :-1], use_cache=True).past_key_values
        handed = quantized_prefill(model, past, "quanto", nbits, residual_length=2)
        got = model(ids[:, -1:], past_key_values=handed, use_cache=True).logits
        exact = model(ids).logits[:, -1:]
    assert torch.equal(got, want) and not torch.allclose(got, exact, atol=1e-4)  # quantized, the same way

