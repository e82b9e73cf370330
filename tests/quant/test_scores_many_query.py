"""Scores from the codes with many queries per key group (the CPU kernels' queries-innermost tables, their
GEMM fallback for wide codes, and the per-query tables for one query) against a float64 oracle.

The oracle decodes the codes with kvstats.quant.packing (pure torch) and takes the dot products in float64. The
kernels sum the same products in another order (and in fp32 for fp32 inputs), so each score may differ by
the rounding of a sum of n = d + m + 4 terms: |error| <= n · u · Σ|terms| (u = 2^-24 in fp32, 2^-53 in
fp64; Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., §3.1, eq. 3.5, for any order of
summation). That bound is deterministic, so the tests cannot flake; one wrong table entry or look-up
changes a score by a whole term, far above it.
"""

import pytest
import torch

from kvstats.quant import ops
from kvstats.quant.packing import pack_bits, packed_nbytes, unpack_bits
from kvstats.quant.quantizers import quantizer

pytestmark = pytest.mark.skipif(not ops.HAS_EXTENSION, reason="kvstats._C not built")

QUERY_COUNTS = [1, 2, 7, 8, 9, 17, 33, 64, 100]


def _unit_roundoff(dtype: torch.dtype) -> float:
    return 2.0**-24 if dtype == torch.float32 else 2.0**-53


def _codes(g: torch.Generator, shape: tuple[int, ...], d: int, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    codes = torch.randint(0, 1 << bits, (*shape, d), generator=g)
    return codes, pack_bits(codes, bits)


def _check(got: torch.Tensor, terms: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], n_terms: int,
           dtype: torch.dtype) -> None:
    """got [G, n_q, n_k] against Σ over (queries [G, n_q, w], keys [G, n_k, w], weight [G, n_k]) of
    weight · queries @ keysᵀ, in float64, within the summation bound."""
    assert got.dtype == dtype
    want = sum((q @ k.transpose(-1, -2)) * w.unsqueeze(-2) for q, k, w in terms)
    scale = sum((q.abs() @ k.abs().transpose(-1, -2)) * w.abs().unsqueeze(-2) for q, k, w in terms)
    err = (got.double() - want).abs()
    bound = (n_terms + 4) * _unit_roundoff(dtype) * scale + 1e-300
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"error {worst:.2f}x the summation bound"


def _lloyd_case(g, G, nq, nk, d, bits, dtype):
    q = torch.randn(G, nq, d, generator=g, dtype=torch.float64)
    codes, packed = _codes(g, (G, nk), d, bits)
    levels = torch.sort(torch.randn(1 << bits, generator=g, dtype=torch.float64)).values
    norm = torch.rand(G, nk, generator=g, dtype=torch.float64) + 0.5
    # The kernel sees fp32 inputs for fp32: the oracle uses the same rounded values.
    q, levels, norm = (t.to(dtype).double() for t in (q, levels, norm))
    return q, codes, packed, levels, norm


@pytest.mark.slow
@pytest.mark.parametrize("nq", QUERY_COUNTS)
@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("d", [37, 100, 128])
def test_lloyd_scores_match_float64(nq, bits, d):
    g = torch.Generator().manual_seed(1000 * nq + 10 * bits + d)
    q, codes, packed, levels, norm = _lloyd_case(g, 2, nq, 131, d, bits, torch.float32)
    got = ops.lloyd_scores(q.float(), packed, norm.float(), levels.float(), bits)
    _check(got, [(q, levels[codes], norm)], d, torch.float32)


@pytest.mark.parametrize("nq", QUERY_COUNTS)
@pytest.mark.parametrize("m", [13, 100, 128, 512])
def test_qjl_scores_match_float64(nq, m):
    g = torch.Generator().manual_seed(10 * nq + m)
    qs = torch.randn(3, nq, m, generator=g).double()
    bits_ = torch.randint(0, 2, (3, 70, m), generator=g)
    norm = (torch.rand(3, 70, generator=g) + 0.5).double()
    scale = 0.0123
    got = ops.qjl_scores(qs.float(), pack_bits(bits_, 1), norm.float(), scale)
    # scale · norm is rounded once to fp32 by the kernel (the per-key weight): take it as the oracle's weight.
    w = (norm.float() * torch.tensor(scale, dtype=torch.float32)).double()
    _check(got, [(qs, bits_.double() * 2 - 1, w)], m, torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("nq", QUERY_COUNTS)
@pytest.mark.parametrize("bits", range(1, 8))
@pytest.mark.parametrize("d, m", [(37, 37), (100, 100), (128, 128), (64, 256)])
def test_turbo_prod_scores_match_float64(nq, bits, d, m):
    g = torch.Generator().manual_seed(100 * nq + 10 * bits + d + m)
    q, codes, packed, levels, norm = _lloyd_case(g, 2, nq, 67, d, bits, torch.float32)
    qs = torch.randn(2, nq, m, generator=g).double()
    signs = torch.randint(0, 2, (2, 67, m), generator=g)
    gamma = (torch.rand(2, 67, generator=g) + 0.1).double()
    scale = 0.031
    got = ops.turbo_prod_scores(q.float(), qs.float(), packed, norm.float(), levels.float(), bits,
                                pack_bits(signs, 1), gamma.float(), scale)
    w = (gamma.float() * torch.tensor(scale, dtype=torch.float32)).double()
    _check(got, [(q, levels[codes], norm), (qs, signs.double() * 2 - 1, w)], d + m, torch.float32)


@pytest.mark.parametrize("nq", [3, 16, 40])
@pytest.mark.parametrize("bits", [2, 3, 4, 6])
def test_float64_queries_score_in_float64(nq, bits):
    g = torch.Generator().manual_seed(nq + bits)
    d, m = 100, 60
    q, codes, packed, levels, norm = _lloyd_case(g, 2, nq, 90, d, bits, torch.float64)
    qs = torch.randn(2, nq, m, generator=g, dtype=torch.float64)
    signs = torch.randint(0, 2, (2, 90, m), generator=g)
    gamma = torch.rand(2, 90, generator=g, dtype=torch.float64)
    got = ops.turbo_prod_scores(q, qs, packed, norm, levels, bits, pack_bits(signs, 1), gamma, 0.5)
    _check(got, [(q, levels[codes], norm), (qs, signs.double() * 2 - 1, gamma * 0.5)], d + m, torch.float64)
    got = ops.qjl_scores(qs, pack_bits(signs, 1), gamma, 0.5)
    _check(got, [(qs, signs.double() * 2 - 1, gamma * 0.5)], m, torch.float64)


@pytest.mark.parametrize("nk", [1, 5, 63, 64, 65, 2047, 2049, 4200])
def test_key_counts_across_blocks_and_chunks(nk):
    # Keys are summed 4 (or 8) at a time in blocks of 64, in tasks of 2048: every remainder, both
    # query-block widths (16 and a last block of <= 8).
    g = torch.Generator().manual_seed(nk)
    d, bits, m, nq = 96, 3, 96, 21
    q, codes, packed, levels, norm = _lloyd_case(g, 2, nq, nk, d, bits, torch.float32)
    qs = torch.randn(2, nq, m, generator=g).double()
    signs = torch.randint(0, 2, (2, nk, m), generator=g)
    gamma = (torch.rand(2, nk, generator=g) + 0.1).double()
    got = ops.turbo_prod_scores(q.float(), qs.float(), packed, norm.float(), levels.float(), bits,
                                pack_bits(signs, 1), gamma.float(), 1.0)
    _check(got, [(q, levels[codes], norm), (qs, signs.double() * 2 - 1, gamma)], d + m, torch.float32)


def test_empty_keys_and_queries():
    g = torch.Generator().manual_seed(0)
    levels = torch.randn(8, generator=g)
    for nq, nk in [(64, 0), (0, 50), (0, 0)]:
        q = torch.randn(2, nq, 40, generator=g)
        packed = torch.zeros(2, nk, packed_nbytes(40, 3), dtype=torch.uint8)
        out = ops.lloyd_scores(q, packed, torch.ones(2, nk), levels, 3)
        assert out.shape == (2, nq, nk)
        out = ops.qjl_scores(q, torch.zeros(2, nk, 5, dtype=torch.uint8), torch.ones(2, nk), 1.0)
        assert out.shape == (2, nq, nk)


@pytest.mark.parametrize("name, bits", [("turbo_mse", 4), ("turbo_mse", 2), ("turbo_prod", 4), ("turbo_prod", 3),
                                        ("qjl", 4), ("qjl", 1)])
def test_public_inner_under_inference_mode_with_two_threads(name, bits):
    # q.inner as a user calls it (broadcast head groups, GQA-style: 2 key heads, 4 query heads each) under
    # torch.inference_mode() with 2 intra-op threads, against the pure-torch reference in float64 on the
    # same codes. Both estimate the same quantity; the difference is fp32 rounding only.
    d = 96
    qz = quantizer(name, bits=bits, dim=d, seed=3)
    g = torch.Generator().manual_seed(bits)
    x = torch.randn(1, 2, 1, 300, d, generator=g)
    q = torch.randn(1, 2, 4, 40, d, generator=g)
    code = qz.encode(x)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode():
            got = qz.inner(q, code)
    finally:
        torch.set_num_threads(threads)
    with ops.use_reference():
        want = qz.inner(q.double(), code)
    assert got.shape == (1, 2, 4, 40, 300) and got.dtype == torch.float32
    # fp32 rounding of the queries' rotation / sketch and of the sums: relative to the scores' scale.
    err = (got.double() - want).abs().max().item()
    assert err <= 1e-5 * want.abs().max().item(), err


def test_unpack_oracle_round_trips():
    # The oracle's decoding (kvstats.quant.packing) is the layout's definition: a self-check of the helper.
    g = torch.Generator().manual_seed(5)
    for bits in range(1, 9):
        codes, packed = _codes(g, (3,), 37, bits)
        assert torch.equal(unpack_bits(packed, bits, 37), codes)
