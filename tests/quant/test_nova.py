"""NOVA-KV: the transform and its inverse, the generalized Parseval relation, reproducible k-means
codebooks, exact code sizes and bit accounting, scores from codes, calibration errors.

Everything here is deterministic (fixed seeds, no Monte Carlo acceptance bands): identities are held to
float64 round-off (relative 1e-9 for products of a few d×d matrices at condition numbers ≤ 1e4), and
fp32 paths to a tolerance set by fp32 round-off on logits of size ≈ ‖q‖‖k‖.

Unbiasedness is NOT tested, because it is not expected: once calibrated the codec is deterministic, so
for a fixed key the logit error ⟨q, k − k̂⟩ is a fixed function of q. NOVA-KV minimises the second moment
E_q[⟨q, k − k̂⟩²] (= ‖y − ŷ‖², the Parseval relation below), not its mean — unlike turbo_prod / QJL.
"""

import math

import numpy as np
import pytest
import torch

from kvstats.quant.packing import packed_nbytes
from kvstats.quant.quantizers import QUANTIZERS, quantizer
from kvstats.quant.quantizers.nova import (
    NovaQuantizer,
    PerHeadQuantizer,
    RotatedMinMax,
    default_group_dim,
    kmeans_codebook,
    parseval_terms,
    stratified_ranks,
)
from kvstats.quant.schemes import CALIBRATED_SCHEMES, SCHEMES, NovaScheme, scheme
from tests.helpers.studies import load_study

D = 16


def gaussian(n, d, seed, scales, mean=0.0, dtype=torch.float64):
    """n rows of mean + z · diag(scales) · R (R a fixed random orthogonal matrix): anisotropic, correlated."""
    gen = torch.Generator().manual_seed(seed)
    rot, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(1000 + d), dtype=dtype))
    z = torch.randn(n, d, generator=gen, dtype=dtype)
    return (mean + (z * torch.as_tensor(scales, dtype=dtype)) @ rot.T).to(dtype)


def calibration_data(d=D, n_q=600, n_k=400, seed=0):
    """Queries with a decaying spectrum (a few strong directions, as after RoPE) and offset, skewed keys."""
    q_scales = 4.0 * 0.75 ** torch.arange(d, dtype=torch.float64)
    k_scales = torch.linspace(2.0, 0.2, d, dtype=torch.float64).flip(0)
    mean = torch.linspace(-1, 1, d, dtype=torch.float64)
    return gaussian(n_q, d, seed, q_scales), gaussian(n_k, d, seed + 1, k_scales, mean)


@pytest.fixture(scope="module")
def exact_nova():
    """ρ = 0 and float64 side information: every identity holds to round-off."""
    q, k = calibration_data()
    return NovaQuantizer(2, D, seed=3, ridge=0.0, side_dtype=torch.float64).calibrate(q, k), q, k


# --------------------------------------------------------------------------------- the transform
def test_transform_inverts_and_whitens_to_the_spectrum(exact_nova):
    nq, q, k = exact_nova
    cal = nq.calibration
    held_out = gaussian(50, D, 77, torch.ones(D))
    for x in (k, held_out):
        back = nq.reconstruct(nq.coefficients(x))
        assert torch.allclose(back, x, rtol=0, atol=1e-10 * x.abs().max().item())
    # TᵀT = Σ_Q (the heart of Parseval) and Cov(y) = Λ, diagonal, over the calibration keys.
    t = cal.transform
    assert torch.allclose(t.T @ t, cal.sigma_q, rtol=0, atol=1e-10 * cal.sigma_q.abs().max().item())
    y = nq.coefficients(k)
    cov = (y - y.mean(0)).T @ (y - y.mean(0)) / y.shape[0]
    assert torch.allclose(cov, torch.diag(cal.eigenvalues), rtol=0, atol=1e-9 * cal.eigenvalues.max().item())
    # Stratified groups: group j holds eigen-ranks j, j + G, ...: ranks r ↦ group r mod G.
    groups = D // nq.group_dim
    assert [int(r) % groups for r in cal.ranks] == [j for j in range(groups) for _ in range(nq.group_dim)]
    lam_by_rank = cal.eigenvalues[torch.argsort(cal.ranks)]
    assert bool((lam_by_rank[:-1] >= lam_by_rank[1:]).all())


def test_stratified_ranks_layout():
    assert stratified_ranks(8, 2).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert sorted(stratified_ranks(64, 4).tolist()) == list(range(64))


# --------------------------------------------------------------------------------------- Parseval
def test_generalized_parseval_to_float64_precision(exact_nova):
    # ‖y − ŷ‖² = (k − k̂)ᵀ Σ_Q (k − k̂) = mean_q (qᵀ(k − k̂))² over the calibration queries (ρ = 0).
    nq, q, k = exact_nova
    fresh = gaussian(200, D, 5, torch.linspace(2.0, 0.2, D).flip(0), torch.linspace(-1, 1, D))
    for keys in (k, fresh):
        terms = parseval_terms(nq, keys, q)
        assert terms.max_relative_gap() < 1e-10
        assert float(terms.coefficient_error.mean()) > 1e-3  # a real quantization error, not a trivial 0 = 0


def test_parseval_with_a_ridge_uses_the_ridged_sigma():
    # With ρ > 0: ‖Δy‖² = Δkᵀ(Σ + rI)Δk exactly, i.e. = mean_q (qᵀΔk)² + r‖Δk‖².
    q, k = calibration_data()
    nq = NovaQuantizer(2, D, seed=0, ridge=0.05, side_dtype=torch.float64).calibrate(q, k)
    terms = parseval_terms(nq, k, q)
    dk = k - nq.decode(nq.encode(k))
    r = nq.calibration.ridge
    assert r == pytest.approx(0.05 * float(torch.trace(q.T @ q / q.shape[0])) / D, rel=1e-12)
    scale = float(terms.coefficient_error.mean())
    assert float((terms.coefficient_error - terms.sigma_form).abs().max()) < 1e-10 * scale
    assert float((terms.coefficient_error - terms.query_mean - r * (dk ** 2).sum(-1)).abs().max()) < 1e-10 * scale
    assert float((terms.coefficient_error - terms.query_mean).abs().max()) > 1e-3 * scale  # the ridge shows


def test_parseval_with_fp16_side_information_holds_to_side_precision():
    q, k = calibration_data()
    nq = NovaQuantizer(2, D, seed=0, ridge=0.0).calibrate(q, k)  # T, μ, codebooks rounded to fp16
    assert parseval_terms(nq, k, q).max_relative_gap() < 1e-2


# ------------------------------------------------------------------------------------------ k-means
def test_kmeans_codebooks_reproducible_by_seed():
    q, k = calibration_data()
    a = NovaQuantizer(2, D, seed=11).calibrate(q, k).calibration.codebooks
    b = NovaQuantizer(2, D, seed=11).calibrate(q, k).calibration.codebooks
    c = NovaQuantizer(2, D, seed=12).calibrate(q, k).calibration.codebooks
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    data = np.random.default_rng(0).standard_normal((3, 300, 2))
    batched = kmeans_codebook(data, 16, seed=4)
    assert batched.shape == (3, 16, 2)
    assert np.array_equal(batched, kmeans_codebook(data, 16, seed=4))
    # k-means reduces the distortion of its own seeding: better than 16 random data points.
    own = ((data[0][:, None] - batched[0][None]) ** 2).sum(-1).min(1).mean()
    rand = ((data[0][:, None] - data[0][:16][None]) ** 2).sum(-1).min(1).mean()
    assert own < rand


@pytest.mark.parametrize("transform", ["attention", "klt", "rotation"])
def test_calibration_sums_over_tokens_run_on_one_thread(transform):
    """Every product and reduction of the calibration (the moments over tokens, the coefficients the k-means
    sees, the eigensolver) runs with torch at one thread, whatever the caller set, and the caller's setting
    comes back: a multithreaded GEMM that splits the token axis changes last bits with the thread count (seen in
    CI: the ridge and the eigenvalues of a SmolLM2 head differed between 1 and 2 threads), and the study
    reports must not. The oracle is torch's own thread count observed at each dispatched op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class ThreadsAtEachOp(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in ("mm", "matmul", "addmm", "bmm", "mean", "sum", "linalg_eigh", "_linalg_eigh", "trace"):
                self.seen.append((name, torch.get_num_threads()))
            return func(*args, **(kwargs or {}))

    q, k = calibration_data()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with ThreadsAtEachOp() as mode:
            NovaQuantizer(2, D, seed=0, transform=transform).calibrate(q if transform == "attention" else None, k)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    token_sums = [(name, t) for name, t in mode.seen if name in ("mm", "mean")]
    assert len(token_sums) >= 2, mode.seen  # the key moments at least: the mode saw the calibration
    assert all(t == 1 for name, t in mode.seen if name in ("mm", "mean", "linalg_eigh", "_linalg_eigh")), mode.seen


# -------------------------------------------------------------------------------- codes and sizes
@pytest.mark.parametrize(("bits", "d", "group_dim"), [(1, 16, 8), (2, 16, 4), (3, 16, 2), (4, 16, 2), (2, 18, 3)])
def test_group_vq_shapes_packed_sizes_and_budget(bits, d, group_dim):
    assert default_group_dim(bits, d) == group_dim
    q, k = calibration_data(d=d, n_k=300)
    nq = quantizer("nova", bits=bits, dim=d, seed=0).calibrate(q, k)
    assert nq.codebook_size == 2 ** (group_dim * bits) and nq.calibration.codebooks.shape == (
        d // group_dim, 2 ** (group_dim * bits), group_dim)
    x = k[:10].reshape(2, 5, d).float()
    code = nq.encode(x)
    nbytes = packed_nbytes(d // group_dim, group_dim * bits)
    assert nbytes == math.ceil(d * bits / 8)
    assert code.payload["indices"].shape == (2, 5, nbytes) and code.payload["indices"].dtype == torch.uint8
    assert code.scalars["scale"].shape == (2, 5) and code.scalars["scale"].dtype == torch.float16
    assert code.nbytes == 10 * (nbytes + 2)
    x_hat = nq.decode(code)
    assert x_hat.shape == x.shape and x_hat.dtype == x.dtype
    budget = nq.bits_per_coordinate(n_tokens=1000)
    assert budget.payload == 8 * nbytes / d and budget.norms == 16 / d
    assert budget.side == 16 * (d * d + d + nq.codebook_size * d) / (1000 * d)


def test_bits_per_element_at_the_papers_setting():
    # d = 128, b = 2, 128K tokens: K = 2 + 16/128 + 16·(128² + 128 + 256·128)/(131072·128) ;
    # V (rotated min-max, fp16 lo and step per token) = 2 + 32/128. Mean ≈ 2.21 (paper: 2.22).
    nq = NovaQuantizer(2, 128)
    k = nq.bits_per_coordinate()
    assert k.total == pytest.approx(2 + 0.125 + 16 * (128 * 128 + 128 + 256 * 128) / (131072 * 128), rel=1e-12)
    v = RotatedMinMax(2, 128).bits_per_coordinate()
    assert v.total == 2.25
    assert (k.total + v.total) / 2 == pytest.approx(2.2110, abs=1e-4)


def test_too_few_calibration_tokens_is_a_clear_error():
    q, k = calibration_data(n_k=400)
    with pytest.raises(ValueError, match=r"keys must hold at least 256 calibration tokens.*got 100"):
        NovaQuantizer(2, D).calibrate(q, k[:100])
    with pytest.raises(ValueError, match=r"queries must hold at least d = 16 .*got 8"):
        NovaQuantizer(2, D).calibrate(q[:8], k)
    with pytest.raises(ValueError, match="keys must hold"):
        NovaScheme.calibrate(q.reshape(1, 2, -1, D), k[:100].reshape(1, 1, -1, D), bits=2)


def test_singular_query_second_moment_needs_the_ridge():
    q, k = calibration_data()
    q = q.clone()
    q[:, 5:] = 0  # queries live in a 5-dimensional subspace: Σ_Q is singular
    with pytest.raises(ValueError, match="ridge"):
        NovaQuantizer(2, D, ridge=0.0).calibrate(q, k)
    nq = NovaQuantizer(2, D, ridge=1e-3, side_dtype=torch.float64).calibrate(q, k)
    # ‖T⁻¹‖₂ ≤ 1/√(smallest eigenvalue of Σ_Q + r I) ≤ 1/√r.
    assert torch.linalg.matrix_norm(nq.calibration.inverse, ord=2) <= 1 / math.sqrt(nq.calibration.ridge) * (1 + 1e-9)
    # A direction no query uses costs nothing in logit terms: scores stay accurate there.
    x = k[:50]
    err = (nq.inner(q[:100], nq.encode(x)) - q[:100] @ x.T).pow(2).mean()
    assert float(err) < 0.2 * float((q[:100] @ (x - x.mean(0)).T).pow(2).mean())


# --------------------------------------------------------------------------------------- scores
def test_scores_from_codes_equal_inner_products_with_decoded_keys(exact_nova):
    nq, q, k = exact_nova
    code = nq.encode(k[:40])
    s = nq.inner(q[:7], code)
    assert s.shape == (7, 40)
    assert torch.allclose(s, q[:7] @ nq.decode(code).T, rtol=0, atol=1e-10 * s.abs().max().item())
    fq = NovaQuantizer(2, D, seed=3).calibrate(q, k)  # default fp16 side information, fp32 arithmetic
    code32 = fq.encode(k[:40].float())
    s32 = fq.inner(q[:7].float(), code32)
    ref = q[:7] @ fq.decode(code32).double().T
    assert s32.dtype == torch.float32
    assert torch.allclose(s32.double(), ref, rtol=0, atol=1e-5 * ref.abs().max().item())


def test_uncalibrated_quantizer_runs_on_the_isotropic_prior():
    qz = quantizer("nova", bits=2, dim=D, seed=0)
    assert not qz.calibrated
    x = gaussian(20, D, 4, torch.ones(D)).float()
    x_hat = qz.decode(qz.encode(x))
    assert qz.calibration.source == "isotropic prior" and torch.equal(qz.calibration.transform, torch.eye(D).double())
    books = qz.calibration.codebooks
    assert torch.equal(books[0], books[-1])  # one codebook shared by all groups
    assert float(((x - x_hat) ** 2).sum() / (x ** 2).sum()) < 0.25  # a working 2-bit quantizer
    assert torch.equal(qz.decode(qz.encode(torch.zeros(3, D))), torch.zeros(3, D))
    assert qz.calibrate(*calibration_data()).calibrated


def test_nova_beats_an_oblivious_rotation_on_anisotropic_keys():
    # The claim the method rests on, in-sample: with keys and queries concentrated in few directions
    # the expected squared logit error E_q[(qᵀ(k − k̂))²] of nova is far below turbo_mse's at 2 bits.
    q, k = calibration_data(n_k=1000)
    nq = NovaQuantizer(2, D, seed=0).calibrate(q, k)
    tm = quantizer("turbo_mse", bits=2, dim=D, seed=0, norm_dtype=torch.float16)

    def logit_mse(qz):
        return float(((q @ (k - qz.decode(qz.encode(k))).T) ** 2).mean())

    assert logit_mse(nq) < 0.5 * logit_mse(tm)


# ------------------------------------------------------------------------------- the whole cache
def test_nova_scheme_gqa_attention_matches_decoded_reference():
    d, hkv, g, s_len = D, 2, 3, 320
    q_all, _ = calibration_data(d=d, n_q=hkv * g * s_len)
    keys = torch.stack([calibration_data(d=d, n_k=s_len, seed=10 * h)[1] for h in range(hkv)]).unsqueeze(0)
    queries = q_all.reshape(1, hkv * g, s_len, d)
    values = gaussian(hkv * s_len, d, 9, torch.ones(d)).reshape(1, hkv, s_len, d)
    sch = NovaScheme.calibrate(queries.float(), keys.float(), values.float(), bits=2, seed=1)
    assert sch.name == "nova" and isinstance(sch.k, PerHeadQuantizer) and len(sch.k.heads) == hkv
    cache = sch.encode(keys.float(), values.float())
    assert cache.k.payload["indices"].shape == (1, hkv, s_len, 4) and cache.k.scalars["scale"].shape == (1, hkv, s_len)
    assert cache.k.nbytes == hkv * s_len * (4 + 2)
    assert cache.v.nbytes == hkv * s_len * (4 + 4)
    k_hat, v_hat = sch.decode(cache)
    qn = queries[:, :, -5:].float()
    scores = sch.scores(qn, cache)
    ref = qn.double() @ k_hat.double().repeat_interleave(g, dim=1).transpose(-1, -2)
    assert torch.allclose(scores.double(), ref, rtol=0, atol=1e-4 * ref.abs().max().item())
    out = sch.attention(qn, cache, causal=True)
    logits = ref / math.sqrt(d)
    allowed = torch.arange(s_len) <= (torch.arange(5) + s_len - 5).unsqueeze(-1)
    w = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1)
    expected = w @ v_hat.double().repeat_interleave(g, dim=1)
    assert torch.allclose(out.double(), expected, rtol=0, atol=1e-4)
    # the registry route builds the same calibrated scheme
    same = scheme("nova", bits=2, dim=d, seed=1, queries=queries.float(), keys=keys.float())
    assert isinstance(same, NovaScheme)
    assert torch.equal(same.k.heads[0].calibration.codebooks, sch.k.heads[0].calibration.codebooks)


def test_registry_entries_and_argument_errors():
    assert QUANTIZERS["nova"] is NovaQuantizer
    assert "nova" in CALIBRATED_SCHEMES and "nova" not in SCHEMES
    with pytest.raises(ValueError, match="queries="):
        scheme("nova", bits=2, dim=D)
    q, k = calibration_data()
    sch = NovaScheme.calibrate(q.reshape(1, 1, -1, D).float(), k.reshape(1, 1, -1, D).float(), bits=2)
    with pytest.raises(ValueError, match="1 \\(KV heads\\)"):
        sch.encode(torch.zeros(1, 2, 4, D), torch.zeros(1, 2, 4, D))
    with pytest.raises(ValueError, match="multiple of the KV heads"):
        NovaScheme.calibrate(torch.zeros(1, 3, 400, D), torch.zeros(1, 2, 400, D))
    with pytest.raises(ValueError, match="group_dim"):
        NovaQuantizer(2, D, group_dim=8)


def test_rotated_minmax_values():
    rm = RotatedMinMax(2, D, seed=0)
    x = gaussian(30, D, 3, torch.ones(D)).float()
    code = rm.encode(x)
    assert code.nbytes == 30 * (packed_nbytes(D, 2) + 4)
    x_hat = rm.decode(code)
    # Error bounded by half a step per rotated coordinate: ‖x − x̂‖ = ‖Πx − Πx̂‖ ≤ √d · step/2.
    step = code.parts["minmax"].scalars["scale"].float().squeeze(-1)  # one group (of d) per token
    assert bool(((x - x_hat).norm(dim=-1) <= math.sqrt(D) * step / 2 * 1.01 + 1e-3).all())
    qv = gaussian(4, D, 8, torch.ones(D)).float()
    assert torch.allclose(rm.inner(qv, code), qv @ x_hat.T, atol=1e-4)


# ------------------------------------------------------------------------------------------- the study
@pytest.mark.slow
def test_nova_study_cell_and_analysis_on_stand_in_tensors(monkeypatch):
    """studies/nova/ end to end on small stand-ins of SmolLM2's tensors (GQA 3/1, d = 16, 300 tokens)."""
    study = load_study("nova")

    def stand_in(name, layer, model="smollm2"):
        seed = 100 * layer + (name == study.TEXTS[1])
        q, _ = calibration_data(d=D, n_q=3 * 300, seed=seed)
        _, k = calibration_data(d=D, n_k=300, seed=seed + 7)
        v = gaussian(300, D, seed + 9, torch.ones(D))
        return q.reshape(1, 3, 300, D).float(), k.reshape(1, 1, 300, D).float(), v.reshape(1, 1, 300, D).float()

    monkeypatch.setattr(study.cells, "layer_qkv", stand_in)
    monkeypatch.setattr(study.cells, "layer_window", lambda name, layer, model="smollm2": None)  # full attention
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the sweep runs cells
    try:
        rows = [dict(r, layer=0, seed=0) for r in study.cell(0, 0, 16, True)]
    finally:
        torch.set_num_threads(threads)
    import pandas as pd

    table = pd.DataFrame(rows)
    units = study.unit_table(table)
    schemes = ("nova", "nova_insample") + study.OBLIVIOUS
    assert len(units) == 3 * len(study.BUDGETS) * len(schemes)
    assert np.isfinite(units[list(study.METRICS)].to_numpy()).all()
    assert units["top5"].between(0, 1).all() and (units["kl"] >= 0).all()
    pars = table[table["kind"] == "parseval"]
    assert len(pars) == 1 and (pars["sigma_form"] / pars["coef_mse"] - 1).abs().max() < 1e-2
    tst = study.tests(units)
    assert set(tst["nova_vs"]) == set(schemes[1:]) and tst["p_holm"].between(0, 1).all()


# ------------------------------------------------------------- the value transform and the ablation arms
@pytest.mark.parametrize("transform", ["klt", "rotation"])
def test_identity_metric_transforms_are_orthogonal_and_keep_parseval(transform):
    # With the identity metric TᵀT = I, so ‖y − ŷ‖² = ‖x − x̂‖² exactly (float64 side information).
    _, k = calibration_data()
    nq = NovaQuantizer(2, D, seed=4, side_dtype=torch.float64, transform=transform).calibrate(None, k)
    t = nq.calibration.transform
    assert torch.allclose(t @ t.T, torch.eye(D, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.equal(nq.calibration.sigma_q, torch.eye(D, dtype=torch.float64))
    terms = parseval_terms(nq, k)
    x_err = ((k - nq.decode(nq.encode(k))) ** 2).sum(-1)
    assert torch.allclose(terms.coefficient_error, x_err, rtol=1e-10, atol=1e-12)
    # coefficient variances sorted by rank: descending, and for the KLT they are C's eigenvalues
    lam_by_rank = nq.calibration.eigenvalues[torch.argsort(nq.calibration.ranks)]
    assert bool((lam_by_rank[:-1] >= lam_by_rank[1:]).all())
    if transform == "klt":
        centred = k - k.mean(0)
        eig = torch.linalg.eigvalsh(centred.T @ centred / k.shape[0]).flip(0)
        assert torch.allclose(lam_by_rank, eig, rtol=1e-9, atol=1e-12)
    else:  # the rotation is the seed's randomized Hadamard matrix, rows reordered: data-oblivious
        from kvstats._random import spawn_seeds
        from kvstats.quant.rotations import make_rotation

        rot = make_rotation("wht", D, spawn_seeds(4, 2)[1]).matrix()
        assert sorted(map(tuple, t.tolist())) == sorted(map(tuple, rot.tolist()))


def test_klt_compacts_energy_where_a_rotation_equalises_it():
    # Anisotropic correlated data: the KLT's coefficient variances are the spectrum (max/min 100), a random
    # rotation's are nearly equal; at 2 bits the KLT's group VQ has the lower reconstruction MSE.
    _, k = calibration_data(n_k=2000)
    klt = NovaQuantizer(2, D, seed=0, transform="klt").calibrate(None, k)
    rot = NovaQuantizer(2, D, seed=0, transform="rotation").calibrate(None, k)
    spread = [float(q.calibration.eigenvalues.max() / q.calibration.eigenvalues.min()) for q in (klt, rot)]
    assert spread[0] > 50 > 5 > spread[1]

    def mse(q):
        return float(((k - q.decode(q.encode(k))) ** 2).mean())

    assert mse(klt) < 0.8 * mse(rot)


def test_transform_and_queries_must_agree():
    q, k = calibration_data()
    with pytest.raises(ValueError, match="queries are needed"):
        NovaQuantizer(2, D, seed=0).calibrate(None, k)
    with pytest.raises(ValueError, match="queries must be None for transform='klt'"):
        NovaQuantizer(2, D, seed=0, transform="klt").calibrate(q, k)
    with pytest.raises(ValueError, match="transform must be one of"):
        NovaQuantizer(2, D, seed=0, transform="pca")


def test_nova_value_codec_calibrates_values_per_head_and_attends_like_decoded_values():
    d, hkv, g, s_len = D, 2, 3, 320
    q_all, _ = calibration_data(d=d, n_q=hkv * g * s_len)
    keys = torch.stack([calibration_data(d=d, n_k=s_len, seed=10 * h)[1] for h in range(hkv)]).unsqueeze(0)
    queries = q_all.reshape(1, hkv * g, s_len, d)
    values = torch.stack([calibration_data(d=d, n_k=s_len, seed=20 + h)[1] for h in range(hkv)]).unsqueeze(0)
    with pytest.raises(ValueError, match="value_codec='nova' calibrates on the values"):
        NovaScheme.calibrate(queries.float(), keys.float(), bits=2, value_codec="nova")
    with pytest.raises(ValueError, match="value_codec must be one of"):
        NovaScheme.calibrate(queries.float(), keys.float(), values.float(), bits=2, value_codec="vq")
    plain = NovaScheme.calibrate(queries.float(), keys.float(), values.float(), bits=2, seed=1)
    sch = NovaScheme.calibrate(queries.float(), keys.float(), values.float(), bits=2, seed=1, value_codec="nova")
    assert isinstance(sch.v, PerHeadQuantizer) and all(h.transform == "klt" for h in sch.v.heads)
    assert torch.equal(sch.k.heads[1].calibration.transform, plain.k.heads[1].calibration.transform)
    cache = sch.encode(keys.float(), values.float())
    k_hat, v_hat = sch.decode(cache)
    qn = queries[:, :, -5:].float()
    out = sch.attention(qn, cache, causal=True)
    logits = sch.scores(qn, cache).double() / math.sqrt(d)
    allowed = torch.arange(s_len) <= (torch.arange(5) + s_len - 5).unsqueeze(-1)
    w = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1)
    assert torch.allclose(out.double(), w @ v_hat.double().repeat_interleave(g, dim=1), rtol=0, atol=1e-4)
    # on these anisotropic values the calibrated value path reconstructs better than rotated min-max
    v_plain = plain.decode(plain.encode(keys.float(), values.float()))[1]
    assert float(((v_hat - values) ** 2).mean()) < 0.5 * float(((v_plain - values) ** 2).mean())
    # "rotated_vq": the same group VQ behind a rotation (the arm isolating the value transform); the keys unchanged
    with pytest.raises(ValueError, match="value_codec='rotated_vq' calibrates on the values"):
        NovaScheme.calibrate(queries.float(), keys.float(), bits=2, value_codec="rotated_vq")
    rot = NovaScheme.calibrate(queries.float(), keys.float(), values.float(), bits=2, seed=1,
                               value_codec="rotated_vq")
    assert all(h.transform == "rotation" for h in rot.v.heads)
    assert torch.equal(rot.k.heads[1].calibration.transform, plain.k.heads[1].calibration.transform)
    assert [h.group_dim for h in rot.v.heads] == [h.group_dim for h in sch.v.heads]
    v_rot = rot.decode(rot.encode(keys.float(), values.float()))[1]
    # the KLT puts these anisotropic values' energy where the bits are; a rotation spreads it evenly
    assert float(((v_hat - values) ** 2).mean()) < float(((v_rot - values) ** 2).mean())


def test_recalibration_changes_the_fingerprint_and_refuses_older_codes():
    """Quantizer.provenance is computed once per config only where the options are the config's; NOVA's options
    hold its calibration digest, so a recalibrated quantizer stamps a new fingerprint and refuses the codes of its
    earlier calibration (decoding them against the new transform would be silently wrong)."""
    from kvstats.quant.quantizers import quantizer

    g = torch.Generator().manual_seed(0)
    q = quantizer("nova", bits=2, dim=16, seed=0)
    q.calibrate(torch.randn(400, 16, generator=g), torch.randn(400, 16, generator=g))
    first = q.provenance().fingerprint
    old = q.encode(torch.randn(5, 16, generator=g))
    q.calibrate(torch.randn(400, 16, generator=g) * 3, torch.randn(400, 16, generator=g) + 1)
    assert q.provenance().fingerprint != first
    with pytest.raises(ValueError, match="code was made by"):
        q.decode(old)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_each_group_is_encoded_to_its_nearest_centroid(dtype):
    """The index of every group is the arg-min of ‖u − c‖² over its codebook (a float64 numpy brute force the
    oracle): equal to it, or a centroid whose distance is the minimum to the round-off of the working dtype."""
    q, k = calibration_data(n_k=300)
    nq = quantizer("nova", bits=2, dim=D, seed=0).calibrate(q, k)
    x = gaussian(4500, D, 11, torch.linspace(2.0, 0.2, D, dtype=torch.float64)).to(dtype)  # > one block (4,096)
    idx, stored, y = nq.encode_coefficients(x)
    u = (y.double() / stored.double().unsqueeze(-1)).numpy().reshape(4500, nq.groups, nq.group_dim)
    books = nq.calibration.codebooks.double().numpy()  # [G, K, g]
    dist = ((u[:, :, None, :] - books[None]) ** 2).sum(-1)  # [n, G, K]
    best = dist.min(-1)
    chosen = np.take_along_axis(dist, idx.numpy()[..., None], -1)[..., 0]
    tol = (1e-12 if dtype == torch.float64 else 1e-5) * (1.0 + (u ** 2).sum(-1))
    assert (chosen - best <= tol).all()
    assert (idx.numpy() == dist.argmin(-1)).mean() > 0.99  # exact ties and near-ties are rare
