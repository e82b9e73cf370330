"""The decode-step row kernels (cuda_ext/csrc/cpu/code_rows.h: fp32, ≤ 8 queries per group, codes of ≤ 4 bits,
d a multiple of 8, AVX2): what the CPU kernels of lloyd/qjl weighted sums and of lloyd/qjl/turbo_prod scores run
for a decode step. Weighted sums equal the shared path (the GPU's per-element loop, same terms in key order) bit
for bit; scores agree with a float64 oracle within the summation bound d·eps·Σ|terms| and do not depend on the
thread count; shapes around the eligibility limits (9 queries, d = 12, 5 bits) take the other kernels and agree
too."""

import pytest
import torch

from kvstats.quant import ops

pytestmark = [
    pytest.mark.skipif(not ops.HAS_EXTENSION, reason="kvstats._C not built"),
    pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                       reason="the row kernels run on AVX2 CPUs (elsewhere the table kernels serve)"),
]

EPS32 = 2.0 ** -24


def _packed(g, nk, d, bits, gen):
    codes = torch.randint(0, 1 << bits, (g * nk, d), generator=gen, dtype=torch.uint8)
    return ops.pack_bits_reference(codes, bits).reshape(g, nk, (d * bits + 7) // 8), codes.reshape(g, nk, d)


CASES = [(bits, nq, d, nk) for bits in (1, 2, 3, 4) for nq in range(1, 9) for d, nk in ((8, 1), (64, 300),
                                                                                             (128, 1031))]


@pytest.mark.parametrize("bits,nq,d,nk", CASES)
def test_lloyd_weighted_sum_equals_the_shared_path_bit_for_bit(bits, nq, d, nk):
    gen = torch.Generator().manual_seed(1000 * bits + 10 * nq + d)
    packed, _ = _packed(3, nk, d, bits, gen)
    w = torch.softmax(torch.randn(3, nq, nk, generator=gen), -1)
    norm = torch.rand(3, nk, generator=gen) + 0.5
    levels = torch.randn(1 << bits, generator=gen)
    args = (w, packed, norm, levels, bits, d)
    fast = torch.ops.kvstats.lloyd_weighted_sum.default(*args)
    assert torch.equal(fast, torch.ops.kvstats_shared.lloyd_weighted_sum.default(*args))


@pytest.mark.parametrize("nq", [1, 3, 8])
@pytest.mark.parametrize("m", [8, 64, 256])
def test_qjl_weighted_sum_equals_the_shared_path_bit_for_bit(nq, m):
    gen = torch.Generator().manual_seed(nq * 1000 + m)
    packed, _ = _packed(2, 513, m, 1, gen)
    w = torch.softmax(torch.randn(2, nq, 513, generator=gen), -1)
    norm = torch.rand(2, 513, generator=gen) + 0.5
    args = (w, packed, norm, 0.0123, m)
    assert torch.equal(torch.ops.kvstats.qjl_weighted_sum.default(*args),
                       torch.ops.kvstats_shared.qjl_weighted_sum.default(*args))


def _score_oracle(q, codes, levels, norm):
    """float64 scores and the magnitudes Σ_t |q_t · level_t| · |norm| that bound their fp32 rounding."""
    x = levels.double()[codes.long()]  # [g, nk, d]
    exact = torch.einsum("gid,gjd->gij", q.double(), x) * norm.double().unsqueeze(1)
    mag = torch.einsum("gid,gjd->gij", q.double().abs(), x.abs()) * norm.double().abs().unsqueeze(1)
    return exact, mag


@pytest.mark.parametrize("bits,nq,d,nk", CASES)
def test_lloyd_scores_within_the_summation_bound_and_thread_independent(bits, nq, d, nk):
    gen = torch.Generator().manual_seed(7 + 1000 * bits + 10 * nq + d)
    packed, codes = _packed(3, nk, d, bits, gen)
    q = torch.randn(3, nq, d, generator=gen)
    norm = torch.rand(3, nk, generator=gen) + 0.5
    levels = torch.randn(1 << bits, generator=gen)
    exact, mag = _score_oracle(q, codes, levels, norm)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(torch.ops.kvstats.lloyd_scores.default(q, packed, norm, levels, bits))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])
    # d terms summed in fp32 (lanes, then a tree) and one multiply by the norm: |err| ≤ (d + 2)·eps·Σ|terms|
    assert ((outs[0].double() - exact).abs() <= (d + 2) * EPS32 * mag + 1e-30).all()


@pytest.mark.parametrize("nq", [1, 3, 8])
@pytest.mark.parametrize("bits", [2, 3, 4, 5])
def test_turbo_prod_and_qjl_scores_within_the_summation_bound(nq, bits):
    """The code part and the sign part (levels ±1) through the rows, then combined as math::key_score."""
    gen = torch.Generator().manual_seed(nq * 10 + bits)
    g, nk, d, m = 2, 700, 64, 128
    packed, codes = _packed(g, nk, d, bits - 1, gen)
    signs_packed, signs = _packed(g, nk, m, 1, gen)
    q = torch.randn(g, nq, d, generator=gen)
    qs = torch.randn(g, nq, m, generator=gen)
    norm = torch.rand(g, nk, generator=gen) + 0.5
    gamma = torch.rand(g, nk, generator=gen)
    levels = torch.randn(1 << (bits - 1), generator=gen)
    scale = 0.0123
    code_part, code_mag = _score_oracle(q, codes, levels, norm)
    sign_w = gamma * scale
    sign_part, sign_mag = _score_oracle(qs, signs, torch.tensor([-1.0, 1.0]), sign_w)
    out = torch.ops.kvstats.turbo_prod_scores.default(q, qs, packed, norm, levels, bits - 1, signs_packed, gamma, scale)
    bound = (d + 3) * EPS32 * code_mag + (m + 3) * EPS32 * sign_mag + 1e-30
    assert ((out.double() - (code_part + sign_part)).abs() <= bound).all()
    qjl = torch.ops.kvstats.qjl_scores.default(qs, signs_packed, gamma, scale)
    assert ((qjl.double() - sign_part).abs() <= (m + 2) * EPS32 * sign_mag + 1e-30).all()


@pytest.mark.parametrize("nq", [2, 3, 8])
@pytest.mark.parametrize("bits", [2, 4])
def test_a_query_scores_alike_in_every_row_of_its_group(nq, bits):
    """One query repeated in every row of a launch gets the same scores, bit for bit, in each row: the rows run one
    program (FMA only where the kernel says so). A compiler that contracted the sign part's multiply-add into the
    code part's sum in some rows only (GCC's C++ default, with FMA in the target) gave other last bits in rows 1.."""
    gen = torch.Generator().manual_seed(40 + nq + bits)
    g, nk, d, m = 2, 300, 64, 64
    packed, _ = _packed(g, nk, d, bits - 1, gen)
    signs_packed, _ = _packed(g, nk, m, 1, gen)
    q = torch.randn(g, 1, d, generator=gen).expand(g, nq, d).contiguous()
    qs = torch.randn(g, 1, m, generator=gen).expand(g, nq, m).contiguous()
    norm, gamma = torch.rand(g, nk, generator=gen) + 0.5, torch.rand(g, nk, generator=gen)
    levels = torch.randn(1 << (bits - 1), generator=gen)
    for out in (torch.ops.kvstats.turbo_prod_scores.default(q, qs, packed, norm, levels, bits - 1, signs_packed,
                                                              gamma, 0.0123),
                torch.ops.kvstats.lloyd_scores.default(q, packed, norm, levels, bits - 1),
                torch.ops.kvstats.qjl_scores.default(qs, signs_packed, gamma, 0.0123)):
        assert all(torch.equal(out[:, 0], out[:, i]) for i in range(1, nq))


@pytest.mark.parametrize("nq,d,bits", [(9, 64, 3), (3, 12, 3), (3, 64, 5), (1, 4, 2)])
def test_launches_outside_the_rows_take_the_other_kernels_and_agree(nq, d, bits):
    gen = torch.Generator().manual_seed(nq + d + bits)
    packed, codes = _packed(2, 200, d, bits, gen)
    q = torch.randn(2, nq, d, generator=gen)
    w = torch.softmax(torch.randn(2, nq, 200, generator=gen), -1)
    norm = torch.rand(2, 200, generator=gen) + 0.5
    levels = torch.randn(1 << bits, generator=gen)
    exact, mag = _score_oracle(q, codes, levels, norm)
    s = torch.ops.kvstats.lloyd_scores.default(q, packed, norm, levels, bits)
    assert ((s.double() - exact).abs() <= (d + 2) * EPS32 * mag + 1e-30).all()
    x = levels.double()[codes.long()] * norm.double().unsqueeze(-1)
    ws = torch.ops.kvstats.lloyd_weighted_sum.default(w, packed, norm, levels, bits, d)
    bound = (200 + 4) * EPS32 * (w.double() @ x.abs())
    assert ((ws.double() - w.double() @ x).abs() <= bound).all()
