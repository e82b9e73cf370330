"""The ``kivi`` scheme: KIVI as published (Liu et al., arXiv 2402.02750 §3; the authors' code, jy-yuan/KIVI).

Keys min-max per channel over groups of G = 32 consecutive tokens, values min-max per token over groups of G
consecutive channels, fp16 lo and step, at 2 or 4 bits only. Codes, offsets, steps and decoded K̂/V̂ are compared
bit for bit with numpy written from that definition (tests/helpers/minmax_reference.py), and the bits held with
their closed form. Its full-precision residual is the cache's window: tests/hf/test_cache_sinks.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import kvstats
from kvstats.quant.schemes import KIVI_BITS, KIVI_GROUP_SIZE, KIVI_RESIDUAL_LENGTH, SCHEMES, scheme
from tests.helpers.minmax_reference import as_float32, minmax_groups, pack_reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _keys_reference(k: torch.Tensor, bits: int, group: int):
    """(codes [..., n, d], lo and step [..., d, groups], K̂ float32 [..., n, d]): per channel, groups of ``group``
    consecutive tokens, the last one partial."""
    x = np.swapaxes(as_float32(k), -1, -2)  # [..., d, n]
    n = x.shape[-1]
    codes, los, steps, x_hat = [], [], [], []
    for start in range(0, n, group):
        c, lo, s, xh = minmax_groups(x[..., start:start + group], bits)
        codes.append(c), los.append(lo), steps.append(s), x_hat.append(xh)
    return (np.swapaxes(np.concatenate(codes, -1), -1, -2), np.stack(los, -1), np.stack(steps, -1),
            np.swapaxes(np.concatenate(x_hat, -1), -1, -2))


def _values_reference(v: torch.Tensor, bits: int, group: int):
    """(codes [..., n, d], lo and step [..., n, d/group], V̂ float32): per token, groups of ``group`` channels."""
    x = as_float32(v)
    grouped = x.reshape(*x.shape[:-1], x.shape[-1] // group, group)
    codes, lo, step, x_hat = minmax_groups(grouped, bits)
    return codes.reshape(x.shape), lo, step, x_hat.reshape(x.shape)


def test_kivi_is_registered_with_the_published_constants():
    assert "kivi" in SCHEMES
    assert (KIVI_BITS, KIVI_GROUP_SIZE, KIVI_RESIDUAL_LENGTH) == ((2, 4), 32, 128)
    s = scheme("kivi", bits=2, dim=128)
    assert (s.k.name, s.k.axis, s.k.group_size, s.k.side_dtype) == ("minmax", "channel", 32, torch.float16)
    assert (s.v.name, s.v.axis, s.v.group_size, s.v.side_dtype) == ("minmax", "token", 32, torch.float16)
    assert s.config.to_dict()["scheme"] == "kivi"


@pytest.mark.parametrize("bits", [3, 5, 8])
def test_other_budgets_are_refused_by_name(bits):
    with pytest.raises(ValueError, match=rf"bits must be one of \(2, 4\) for scheme 'kivi' \(KIVI-2 and KIVI-4 as "
                                         rf"published\), got {bits}"):
        kvstats.scheme("kivi", bits=bits, dim=64)


def test_a_group_that_does_not_divide_the_head_dim_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"group_size must divide dim=48 for axis='token', got 32"):
        kvstats.scheme("kivi", bits=2, dim=48)
    assert kvstats.scheme("kivi", bits=2, dim=48, group_size=16).v.group_size == 16


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", KIVI_BITS)
def test_codes_equal_the_published_definition(bits, dtype):
    n, d = 2 * 32 + 5, 64  # a partial last key group of 5 tokens
    g = torch.Generator().manual_seed(bits)
    k = (torch.randn(1, 2, n, d, generator=g) * 2 + torch.linspace(-4, 4, d)).to(dtype)  # per-channel offsets
    v = (torch.randn(1, 2, n, d, generator=g) * 3).to(dtype)
    s = scheme("kivi", bits=bits, dim=d, seed=0)
    code = s.encode(k, v)
    k_codes, k_lo, k_step, k_hat = _keys_reference(k, bits, 32)
    v_codes, v_lo, v_step, v_hat = _values_reference(v, bits, 32)
    for part, codes, lo, step in ((code.k, k_codes, k_lo, k_step), (code.v, v_codes, v_lo, v_step)):
        assert torch.equal(part.payload["indices"], torch.from_numpy(pack_reference(codes, bits)))
        assert part.scalars["min"].dtype == torch.float16
        assert torch.equal(part.scalars["min"], torch.from_numpy(lo))
        assert torch.equal(part.scalars["scale"], torch.from_numpy(step))
    assert code.k.scalars["min"].shape == (1, 2, d, 3) and code.v.scalars["min"].shape == (1, 2, n, 2)
    got_k, got_v = s.decode(code)
    assert torch.equal(got_k, torch.from_numpy(k_hat).to(dtype))
    assert torch.equal(got_v, torch.from_numpy(v_hat).to(dtype))


@pytest.mark.parametrize("bits", KIVI_BITS)
@pytest.mark.parametrize("n", [32, 128, 100])
def test_bits_held_are_the_closed_form(bits, n):
    d, b, h = 128, 1, 2
    s = scheme("kivi", bits=bits, dim=d)
    code = s.encode(torch.randn(b, h, n, d), torch.randn(b, h, n, d))
    groups = math.ceil(n / 32)
    k_bytes = b * h * (n * d * bits // 8 + d * groups * 2 * 2)  # codes + fp16 lo and step per channel group
    v_bytes = b * h * (n * d * bits // 8 + n * (d // 32) * 2 * 2)  # codes + fp16 lo and step per channel group
    assert (code.k.nbytes, code.v.nbytes) == (k_bytes, v_bytes)
    budget = s.bits_per_coordinate(n_tokens=n)
    assert budget["k"].total == pytest.approx(bits + 32 * groups / n, rel=1e-12)
    assert budget["v"].total == pytest.approx(bits + 1.0, rel=1e-12)
    assert 8 * code.nbytes == pytest.approx(budget["mean"].total * 2 * b * h * n * d, rel=1e-12)
    if n % 32 == 0:  # KIVI-2: 3 bits per element, KIVI-4: 5 (before the residual)
        assert budget["mean"].total == bits + 1


@pytest.mark.parametrize("bits,d,group", [(2, 32, 32), (4, 64, 16), (2, 96, 8)])
def test_attention_equals_softmax_over_the_decoded_cache(bits, d, group):
    g = torch.Generator().manual_seed(d)
    k, v = torch.randn(1, 2, 45, d, generator=g), torch.randn(1, 2, 45, d, generator=g)
    q = torch.randn(1, 4, 7, d, generator=g)
    s = scheme("kivi", bits=bits, dim=d, group_size=group)
    cache = s.encode(k, v)
    k_hat, v_hat = (t.double().repeat_interleave(2, dim=1) for t in s.decode(cache))
    logits = q.double() @ k_hat.transpose(-1, -2) / math.sqrt(d)
    visible = torch.arange(45)[None] <= torch.arange(38, 45)[:, None]
    want = torch.softmax(logits.masked_fill(~visible, float("-inf")), -1) @ v_hat
    torch.testing.assert_close(s.attention(q, cache, causal=True).double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [1, 5, 40, 45])
def test_attention_within_a_sliding_window_is_the_banded_softmax(window):
    """``Scheme.attention(window=W)``: query at position p sees p − W < j ≤ p (a Gemma 3 sliding layer), spelled
    out by hand over the decoded cache in float64; W = 45 (every position) is plain causal attention."""
    d = 32
    g = torch.Generator().manual_seed(window)
    k, v = torch.randn(1, 2, 45, d, generator=g), torch.randn(1, 2, 45, d, generator=g)
    q = torch.randn(1, 4, 7, d, generator=g)
    s = scheme("kivi", bits=4, dim=d, group_size=32)
    cache = s.encode(k, v)
    k_hat, v_hat = (t.double().repeat_interleave(2, dim=1) for t in s.decode(cache))
    logits = q.double() @ k_hat.transpose(-1, -2) / math.sqrt(d)
    pos, keys = torch.arange(38, 45)[:, None], torch.arange(45)[None]
    visible = (keys <= pos) & (keys > pos - window)
    want = torch.softmax(logits.masked_fill(~visible, float("-inf")), -1) @ v_hat
    got = s.attention(q, cache, causal=True, window=window).double()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    plain = s.attention(q, cache, causal=True).double()
    # a window shorter than the last query's position hides keys: the outputs differ (the test is not vacuous)
    assert torch.equal(got, plain) == (window >= 45)
    with pytest.raises(ValueError, match="window = 5 needs causal=True"):
        s.attention(q, cache, window=5)
