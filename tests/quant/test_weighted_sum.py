"""The weighted sums straight from the codes (lloyd_weighted_sum, qjl_weighted_sum, minmax_weighted_sum): the
fast CPU kernel, the shared path (the GPU's code) and the reference against a float64 decode-then-matmul
oracle, within the summation bound (n_k + 4)·eps·Σ_j |w_ij · x̂_jt|; odd shapes, every width, every side
dtype, fp64 weights, inference mode, non-contiguous weights, and bit-identical results at 1 and 2 threads."""

import pytest
import torch

from kvstats.quant import ops

pytestmark = pytest.mark.skipif(not ops.HAS_EXTENSION, reason="kvstats._C not built")

PATHS = ("kernel", "shared", "reference")
SIDE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _codes(g, nk, d, bits, gen):
    codes = torch.randint(0, 1 << bits, (g * nk, d), generator=gen, dtype=torch.uint8)
    return ops.pack_bits_reference(codes, bits).reshape(g, nk, (d * bits + 7) // 8)


def _weights(g, nq, nk, dtype, gen, contiguous=True):
    if contiguous:
        return torch.softmax(torch.randn(g, nq, nk, generator=gen, dtype=torch.float64), -1).to(dtype)
    return torch.softmax(torch.randn(g, nk, nq, generator=gen, dtype=torch.float64), 1).to(dtype).transpose(1, 2)


def _case(op, g, nq, nk, d, bits, w_dtype, side, seed, contiguous=True):
    """(args, oracle values x̂ [g, nk, d] in float64) of one op."""
    gen = torch.Generator().manual_seed(seed)
    w = _weights(g, nq, nk, w_dtype, gen, contiguous)
    if op == "lloyd_weighted_sum":
        packed = _codes(g, nk, d, bits, gen)
        norm = (torch.rand(g, nk, generator=gen, dtype=torch.float64) + 0.5).to(side)
        levels = torch.randn(1 << bits, generator=gen, dtype=torch.float64).to(w_dtype)
        nb = packed.shape[-1]
        x_hat = ops.lloyd_decode_reference(packed.reshape(-1, nb), norm.reshape(-1).double(),
                                           torch.empty(0, 0, dtype=torch.float64), levels.double(), bits, d)
        return (w, packed, norm, levels, bits, d), x_hat.reshape(g, nk, d)
    if op == "qjl_weighted_sum":
        packed = _codes(g, nk, d, 1, gen)
        norm = (torch.rand(g, nk, generator=gen, dtype=torch.float64) + 0.5).to(side)
        b = ops.unpack_bits_reference(packed.reshape(g * nk, packed.shape[-1]), 1, d).double() * 2 - 1
        return (w, packed, norm, 0.0123, d), (b.reshape(g, nk, d) * norm.double().unsqueeze(-1) * 0.0123)
    group = next(k for k in (32, 4, 3, 1) if d % k == 0)
    packed = _codes(g, nk, d, bits, gen)
    lo = torch.randn(g, nk, d // group, generator=gen, dtype=torch.float64).to(side)
    scale = (torch.rand(g, nk, d // group, generator=gen, dtype=torch.float64) / (1 << bits)).to(side)
    nb = packed.shape[-1]
    x_hat = ops.minmax_decode_reference(packed.reshape(-1, nb), lo.reshape(g * nk, d // group).double(),
                                        scale.reshape(g * nk, d // group).double(), group, bits, d)
    return (w, packed, lo, scale, group, bits, d), x_hat.reshape(g, nk, d)


def _run(op, path, args):
    if path == "kernel":
        return getattr(torch.ops.kvstats, op).default(*args)
    if path == "shared":
        return getattr(torch.ops.kvstats_shared, op).default(*args)
    return getattr(ops, f"{op}_reference")(*args)


def _check(op, path, args, x_hat):
    w = args[0]
    out = _run(op, path, args)
    nk = w.shape[2]
    assert out.dtype == w.dtype and out.shape == (w.shape[0], w.shape[1], x_hat.shape[2]), (op, path)
    oracle = w.double() @ x_hat
    eps = torch.finfo(w.dtype).eps
    bound = (nk + 4) * eps * (w.double().abs() @ x_hat.abs()) + 1e-300
    err = (out.double() - oracle).abs()
    assert (err <= bound).all(), (op, path, (err / bound).max().item())
    return out


OPS = ("lloyd_weighted_sum", "qjl_weighted_sum", "minmax_weighted_sum")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", OPS)
def test_every_width_and_side_dtype(op, path):
    for bits in (1,) if op == "qjl_weighted_sum" else range(1, 9):
        for k, side in enumerate(SIDE):
            for w_dtype in (torch.float32, torch.float64):
                args, x_hat = _case(op, 2, 3, 40, 64 if k % 2 else 12, bits, w_dtype, side, 10 * bits + k)
                _check(op, path, args, x_hat)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("g, nq, nk, d, bits", [(1, 1, 1, 12, 3), (3, 3, 700, 64, 3), (2, 9, 33, 12, 3),
                                                 (1, 5, 300, 33, 5), (3, 1, 257, 64, 4), (2, 4, 50, 100, 2)])
def test_odd_shapes(op, path, g, nq, nk, d, bits):
    if op == "lloyd_weighted_sum" or d % 4 == 0 or op == "qjl_weighted_sum" or d % 3 == 0:
        args, x_hat = _case(op, g, nq, nk, d, bits, torch.float32, torch.float16, g * nq + nk + d)
        _check(op, path, args, x_hat)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", OPS)
def test_empty_keys_give_zeros_and_empty_groups_empty_outputs(op, path):
    args, _ = _case(op, 2, 3, 0, 12, 3, torch.float32, torch.float32, 0)
    out = _run(op, path, args)
    assert out.shape == (2, 3, 12) and torch.equal(out, torch.zeros(2, 3, 12))
    for g, nq in ((0, 3), (2, 0)):
        args, _ = _case(op, g, nq, 5, 12, 3, torch.float32, torch.float32, 0)
        assert _run(op, path, args).shape == (g, nq, 12)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", OPS)
def test_inference_mode_non_contiguous_weights_and_threads(op, path):
    args, x_hat = _case(op, 3, 5, 900, 64, 4 if op != "qjl_weighted_sum" else 1, torch.float32, torch.bfloat16, 7,
                        contiguous=False)
    assert not args[0].is_contiguous()
    previous = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.inference_mode():
                outs.append(_check(op, path, args, x_hat))
        assert torch.equal(outs[0], outs[1]), op
    finally:
        torch.set_num_threads(previous)


def test_minmax_range_wider_than_the_fp32_maximum_stays_finite():
    # step · code overflows fp32 where x̂ = lo + step · code does not (minmax_decode's fallback).
    x = torch.tensor([[-3e38, 3e38, 0.0, 1e38, -2e38, 5.0, 2.5e38, -1e30]], dtype=torch.float32)
    packed, lo, step = ops.minmax_encode_reference(x, 8, 4, torch.float32)
    x_hat = ops.minmax_decode_reference(packed, lo, step, 8, 4, 8)
    w = torch.tensor([[[1.0]]])
    for path in PATHS:
        out = _run("minmax_weighted_sum", path, (w, packed.unsqueeze(0), lo.unsqueeze(0), step.unsqueeze(0), 8, 4, 8))
        assert torch.isfinite(out).all(), path
        assert torch.equal(out[0], x_hat), path
