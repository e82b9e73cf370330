"""Quantizers against closed forms: D_mse of turbo_mse, unbiasedness and variance of qjl/turbo_prod,
the bias of turbo_mse, exact bit accounting, and input handling.

Sizing of the statistical tests: each compares a Monte Carlo mean of N i.i.d. draws with its expected
value and accepts |mean − expected| ≤ Z·SE, SE = sample sd/√N, Z = 5.5. For N ≥ 2000 the CLT makes the
two-sided false-failure probability ≈ 4e-8 < 1e-6. Seeds are fixed, so each test is deterministic anyway;
the sizing says a correct implementation would fail for at most a 1e-6 fraction of seeds.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstats.quant.codebooks import beta_codebook
from kvstats.quant.packing import packed_nbytes
from kvstats.quant.quantizers import QUANTIZERS, quantizer
from tests.helpers.quantizers import supported_bits

Z = 5.5
# Data-oblivious quantizers (the calibrated ones, e.g. nova, are tested in their own files).
OBLIVIOUS = sorted(n for n, c in QUANTIZERS.items() if not getattr(c, "needs_calibration", n == "nova"))


def unit_vectors(n, d, seed, dtype=torch.float64):
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return x / x.norm(dim=-1, keepdim=True)


def assert_mean_within(samples: np.ndarray, expected: float, what: str):
    samples = np.asarray(samples, dtype=np.float64)
    se = samples.std(ddof=1) / math.sqrt(len(samples))
    mean = samples.mean()
    assert abs(mean - expected) <= Z * se, f"{what}: mean {mean:.6g} vs {expected:.6g} (SE {se:.3g})"


# ------------------------------------------------------------------------------------------- D_mse
@pytest.mark.slow
@pytest.mark.parametrize("rotation", ["wht", "haar"])
@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_turbo_mse_distortion_matches_exact_codebook(bits, rotation):
    # Uniform x: Π x is uniform for any fixed orthogonal Π, so E‖x − x̂‖² = D_mse(d, b) exactly.
    d, n = 128, 4000
    q = quantizer("turbo_mse", bits=bits, dim=d, seed=bits, rotation=rotation)
    x = unit_vectors(n, d, seed=100 + bits)
    err = ((q.decode(q.encode(x)) - x) ** 2).sum(-1).numpy()
    exact = beta_codebook(d, bits).d_mse
    assert_mean_within(err, exact, f"D_mse b={bits}")
    assert 4.0**-bits <= exact <= math.sqrt(3) * math.pi / 2 * 4.0**-bits


def test_a_spike_raw_lloyd_vs_wht_vs_haar():
    # e_1: the raw-coordinate codebook wastes every level on it (error² ≈ 0.95). The WHT maps it to
    # exactly ±1/√d in every coordinate — its worst case: each lands between two levels, and the error
    # is known in closed form, 2.2× D_mse at b = 2. A Haar rotation gives a typical (≈ D_mse) error.
    d, bits = 128, 2
    x = torch.zeros(1, d, dtype=torch.float64)
    x[0, 0] = 1.0

    def sq_err(name, **opts):
        qz = quantizer(name, bits=bits, dim=d, seed=0, **opts)
        return float(((qz.decode(qz.encode(x)) - x) ** 2).sum())

    cb = beta_codebook(d, bits)
    level = cb.levels[np.searchsorted(cb.thresholds, 1 / math.sqrt(d))]
    assert sq_err("turbo_mse") == pytest.approx(d * (1 / math.sqrt(d) - level) ** 2, rel=1e-9)
    assert sq_err("lloyd") > 0.9
    # Haar: Π e_1 is uniform on S^127, so the error is that of a uniform unit vector (mean D_mse, sd 0.13·D_mse,
    # a right tail from one large coordinate). P(error ≥ 2·D_mse) = 5.1e-7 ± 0.3e-7 over the seed (importance
    # sampling, one coordinate drawn N(0, 3²), 4e6 draws; direct Monte Carlo agrees at 1.6 and 1.8·D_mse);
    # the other checks are exact, so the test fails a correct implementation with probability ≈ 5e-7.
    assert sq_err("turbo_mse", rotation="haar") < 2 * cb.d_mse


# ------------------------------------------------------------------------------------ unbiasedness
def estimates_over_seeds(name, q_vec, k_vec, n_seeds, **opts):
    out = np.empty(n_seeds)
    for s in range(n_seeds):
        qz = quantizer(name, dim=q_vec.shape[-1], seed=s, **opts)
        out[s] = qz.inner(q_vec.view(1, -1), qz.encode(k_vec.view(1, -1))).item()
    return out


def fixed_pair(d, cos, seed=0):
    """Unit k and q with ⟨q, k⟩ = cos (q scaled by 2 so ‖q‖ ≠ 1)."""
    k, r = unit_vectors(2, d, seed)
    r = r - (r @ k) * k
    r = r / r.norm()
    return 2 * (cos * k + math.sqrt(1 - cos**2) * r), k


@pytest.mark.slow
@pytest.mark.parametrize("rows", ["gaussian", "orthogonal"])
def test_qjl_is_unbiased_and_gaussian_variance_matches_closed_form(rows):
    d, m, n = 64, 64, 3000
    q, k = fixed_pair(d, cos=0.6)
    est = estimates_over_seeds("qjl", q, k, n, m=m, rows=rows)
    truth = float(q @ k)
    assert_mean_within(est, truth, f"QJL {rows}")
    closed = ((math.pi / 2) * float(q @ q) * float(k @ k) - truth**2) / m
    var = est.var(ddof=1)
    # SE of the sample variance from the sample 4th central moment (valid without normality).
    m4 = np.mean((est - est.mean()) ** 4)
    se_var = math.sqrt((m4 - var**2) / n)
    if rows == "gaussian":
        assert abs(var - closed) <= Z * se_var, (var, closed, se_var)
    else:
        # Orthogonalised rows: lower variance than the Gaussian closed form (docs/references.md §4).
        assert var + Z * se_var < closed, (var, closed)


@pytest.mark.slow
def test_orthogonal_rows_with_gaussian_constant_would_be_biased():
    # The spherical and Gaussian constants differ by a factor ≈ 1 + 1/(4d): 1.0039 at d = 64 (docs/references.md §4),
    # 1.0157 at d = 16. Our estimator uses the exact constant and is unbiased; with the Gaussian one the
    # bias at d = 16 is ≈ 25 SE for n = 3000 (q = k: sd per draw ≈ 0.035), so the rejection is certain.
    d, n = 16, 3000
    k = unit_vectors(1, d, seed=3)[0]
    est = estimates_over_seeds("qjl", k, k, n, m=d, rows="orthogonal")
    assert_mean_within(est, 1.0, "exact constant")
    from kvstats.quant.rotations import spherical_sign_scale
    biased = est * math.sqrt(math.pi / 2) / spherical_sign_scale(d)
    se = biased.std(ddof=1) / math.sqrt(n)
    assert biased.mean() - 1.0 > Z * se  # √(π/2) is the larger constant: it over-estimates


@pytest.mark.slow
@pytest.mark.parametrize("bits", [1, 2, 3])
def test_turbo_prod_is_unbiased(bits):
    d, n = 64, 2500
    q, k = fixed_pair(d, cos=0.8, seed=bits)
    est = estimates_over_seeds("turbo_prod", q, k, n, bits=bits)
    assert_mean_within(est, float(q @ k), f"turbo_prod b={bits}")


@pytest.mark.slow
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_turbo_prod_distortion_matches_closed_form(bits):
    # Per trial: fresh seed, independent uniform unit x and y. Then Π y is uniform and independent of
    # the residual, so D_prod = E|⟨y, x⟩ − ⟨y, x̂⟩|² = (π/2 − 1/d)·D_mse(b−1)/d exactly (docs/references.md §3).
    d, n = 64, 2500
    xs, ys = unit_vectors(n, d, seed=10 + bits), unit_vectors(n, d, seed=20 + bits)
    err = np.empty(n)
    for s in range(n):
        qz = quantizer("turbo_prod", bits=bits, dim=d, seed=1000 * bits + s)
        est = qz.inner(ys[s].view(1, -1), qz.encode(xs[s].view(1, -1))).item()
        err[s] = est - float(ys[s] @ xs[s])
    closed = (math.pi / 2 - 1 / d) * beta_codebook(d, bits - 1).d_mse / d
    assert_mean_within(err, 0.0, "bias")
    assert_mean_within(err**2, closed, f"D_prod b={bits}")


def test_turbo_mse_shrinks_inner_products_by_one_minus_dmse():
    # E⟨y, x̂⟩ = (1 − D_mse)⟨y, x⟩ for uniform x (2/π at b = 1 in the Gaussian limit): biased, and we see it.
    d, n, bits = 128, 3000, 1
    x = unit_vectors(n, d, seed=1)
    qz = quantizer("turbo_mse", bits=bits, dim=d, seed=0)
    ratio = (qz.decode(qz.encode(x)) * x).sum(-1).numpy()  # ⟨x, x̂⟩ with y = x
    factor = 1 - beta_codebook(d, bits).d_mse
    assert_mean_within(ratio, factor, "shrinkage")
    assert abs(factor - 2 / math.pi) < 0.01
    se = ratio.std(ddof=1) / math.sqrt(n)
    assert ratio.mean() < 1 - Z * se  # rejects unbiasedness


# ------------------------------------------------------------------------------------ bit accounting
CONFIGS = [
    ("lloyd", {}), ("turbo_mse", {}), ("turbo_mse", {"rotation": "haar"}), ("turbo_prod", {}),
    ("qjl", {}), ("minmax", {}), ("minmax", {"axis": "channel", "group_size": 8}),
]


@pytest.mark.slow
@given(
    config=st.sampled_from(CONFIGS),
    d=st.integers(2, 512),
    bits=st.integers(1, 8),
    n=st.integers(1, 20),
    lead=st.lists(st.integers(1, 3), max_size=2),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    seed=st.integers(0, 1000),
)
@settings(max_examples=60, deadline=None)
def test_round_trip_shapes_dtypes_and_exact_bytes(config, d, bits, n, lead, dtype, seed):
    name, opts = config
    if name == "minmax" and opts.get("axis", "token") == "token":
        opts = {"group_size": d}
    if name == "turbo_mse" and opts.get("rotation") == "haar" and d > 256:
        return  # a dense Haar matrix per example is slow; covered at 256
    qz = quantizer(name, bits=bits, dim=d, seed=seed, **opts)
    x = torch.randn(*lead, n, d, generator=torch.Generator().manual_seed(seed)).to(dtype)
    code = qz.encode(x)
    x_hat = qz.decode(code)
    assert x_hat.shape == x.shape and x_hat.dtype == dtype and torch.isfinite(x_hat).all()
    vectors = x.numel() // d
    if name == "minmax" and opts.get("axis") == "channel":
        groups = -(-n // opts["group_size"]) * (x.numel() // (n * d)) * d
        expected = vectors * packed_nbytes(d, bits) + groups * 2 * 2
        assert code.nbytes == expected
    else:
        budget = qz.bits_per_coordinate()
        assert code.nbytes * 8 == pytest.approx(budget.total * x.numel(), rel=1e-12)
        assert code.payload  # codes really are packed uint8
        assert all(t.dtype == torch.uint8 for t in code.payload.values())
    s = qz.inner(torch.randn(*lead, 3, d).to(dtype), code)
    assert s.shape == (*lead, 3, n) and torch.isfinite(s).all()


def _stored_tensors(code, prefix=""):
    """{field path: tensor} of a code and its nested parts, payloads ("p:") and scalars ("s:") apart."""
    out = {f"{prefix}p:{k}": v for k, v in code.payload.items()}
    out.update({f"{prefix}s:{k}": v for k, v in code.scalars.items()})
    for k, part in code.parts.items():
        out.update(_stored_tensors(part, f"{prefix}{k}/"))
    return out


@pytest.mark.parametrize("name", OBLIVIOUS)
def test_fp64_codes_differ_from_the_budget_only_by_fp64_scalars(name):
    # docs/bit_accounting.md: fp64 inputs (references, oracles) keep their stored scalars in fp64, so their
    # codes exceed the budget by exactly (8 − the budget's bytes) per stored scalar; payloads are the same.
    qz = quantizer(name, bits=supported_bits(name, 3), dim=48, seed=0)  # 48: nvfp4's blocks of 16
    x = torch.randn(2, 7, 48, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    c32, c64 = qz.encode(x.float()), qz.encode(x)
    t32, t64 = _stored_tensors(c32), _stored_tensors(c64)
    assert t32.keys() == t64.keys()
    extra = 0
    for key, t in t64.items():
        assert t.shape == t32[key].shape, key
        if key.split("/")[-1].startswith("p:"):
            assert t.dtype == t32[key].dtype == torch.uint8, key
        else:
            assert t.dtype == torch.float64 and t32[key].dtype in (torch.float32, torch.float16), key
            extra += t.numel() * (8 - t32[key].element_size())
    # c32.nbytes: the budget (round-trip test above); a code may store no scalar at all (fp8 with a unity scale)
    assert c64.nbytes == c32.nbytes + extra and (extra > 0) == any(not k.split("/")[-1].startswith("p:") for k in t64)


def test_bit_budgets():
    d = 128
    assert quantizer("turbo_mse", bits=4, dim=d).bits_per_coordinate().to_dict() == \
        {"payload": 4.0, "norms": 0.25, "side": 0.0, "total": 4.25}
    prod = quantizer("turbo_prod", bits=4, dim=d).bits_per_coordinate()
    assert (prod.payload, prod.norms) == (4.0, 0.5)  # 3 + 1 bits; ‖x‖ and γ in fp32
    assert quantizer("qjl", dim=d, m=256).bits_per_coordinate().payload == 2.0
    outl = quantizer("qjl", dim=d, m=256, outliers=[22, 23, 24], outlier_m=64).bits_per_coordinate()
    assert (outl.payload, outl.norms) == ((256 + 64) / 128, 64 / 128)
    mm = quantizer("minmax", bits=2, dim=d, group_size=32).bits_per_coordinate()
    assert (mm.payload, mm.side) == (2.0, 1.0)  # fp16 min and scale per 32 values
    assert quantizer("turbo_mse", bits=4, dim=d, norm_dtype=torch.float16).bits_per_coordinate().norms == 0.125


# ----------------------------------------------------------------------------------- qjl outliers
@pytest.mark.slow
def test_qjl_outlier_split_is_unbiased_and_decodes_both_parts():
    d, n = 32, 2500
    q, k = fixed_pair(d, cos=0.5, seed=4)
    k = k.clone()
    k[[3, 17]] *= 20  # outlier channels
    est = estimates_over_seeds("qjl", q, k, n, m=32, outliers=[3, 17], outlier_m=16, rows="gaussian")
    assert_mean_within(est, float(q @ k), "QJL outliers")
    qz = quantizer("qjl", dim=d, m=32, outliers=[3, 17], seed=0)
    x_hat = qz.decode(qz.encode(k.view(1, -1)))
    assert x_hat.shape == (1, d) and (x_hat[0, [3, 17]].abs() > 1).all()


# --------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("name", OBLIVIOUS)
def test_zero_vectors_encode_to_zero_without_nan(name):
    qz = quantizer(name, bits=supported_bits(name, 3), dim=16, seed=0)
    x = torch.zeros(2, 5, 16)
    x_hat = qz.decode(qz.encode(x))
    assert torch.isfinite(x_hat).all()
    assert torch.equal(x_hat, torch.zeros_like(x))


@pytest.mark.parametrize("name", OBLIVIOUS)
def test_bad_input_is_named(name):
    qz = quantizer(name, bits=supported_bits(name, 2), dim=16, seed=0)
    bad = torch.randn(3, 16)
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="x contains non-finite"):
        qz.encode(bad)
    with pytest.raises(ValueError, match=r"x.shape\[-1\] must equal the quantizer's dim 16, got 12"):
        qz.encode(torch.randn(3, 12))
    with pytest.raises(TypeError, match="x must be float16"):
        qz.encode(torch.ones(3, 16, dtype=torch.int32))
    with pytest.raises(ValueError, match="x is empty"):
        qz.encode(torch.zeros(0, 16))
    with pytest.raises(ValueError, match="query must be"):
        qz.inner(torch.randn(16), qz.encode(torch.randn(4, 16)))


@pytest.mark.parametrize("name", OBLIVIOUS)
def test_inner_broadcasts_leading_dims_and_names_those_that_do_not(name):
    qz = quantizer(name, bits=supported_bits(name, 2), dim=16, seed=0)
    g = torch.Generator().manual_seed(1)
    code = qz.encode(torch.randn(3, 5, 16, generator=g))
    q = torch.randn(1, 4, 16, generator=g)
    est = qz.inner(q, code)  # query [1, 4, d] against keys [3, 5, d]
    assert est.shape == (3, 4, 5)
    torch.testing.assert_close(est, qz.inner(q.expand(3, 4, 16), code), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"query's leading dims \(2,\) .* do not broadcast with the code's \(3,\)"):
        qz.inner(torch.randn(2, 4, 16), code)


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(name="turbo_mse", bits=0, dim=16), "bits must be in \\[1, 8\\], got 0"),
    (dict(name="turbo_mse", bits=9, dim=16), "bits must be in \\[1, 8\\], got 9"),
    (dict(name="lloyd", bits=2, dim=1), "dim must be in \\[2, "),
    (dict(name="nope", bits=2, dim=16), "name must be one of"),
    (dict(name="qjl", dim=16, bits=2, m=64), "bits=2 and m=64 disagree"),
    (dict(name="qjl", dim=16, outliers=[16]), "outliers must be distinct channel indices in \\[0, 16\\)"),
    (dict(name="minmax", bits=2, dim=16, group_size=5), "group_size must divide dim=16"),
    (dict(name="turbo_prod", bits=2, dim=16, rows="sparse"), "rows must be one of"),
])
def test_bad_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        quantizer(**kwargs)


def test_minmax_reconstruction_error_is_bounded_by_half_a_step():
    x = torch.randn(50, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    qz = quantizer("minmax", bits=3, dim=64, group_size=16)
    code = qz.encode(x)
    step = code.scalars["scale"].repeat_interleave(16, dim=-1)
    assert ((qz.decode(code) - x).abs() <= step / 2 + 1e-12).all()
    const = torch.full((2, 64), 3.25)
    assert torch.equal(qz.decode(qz.encode(const)), const)


def test_same_seed_same_codes():
    x = torch.randn(10, 96)
    for name in ("turbo_mse", "turbo_prod", "qjl"):
        a = quantizer(name, bits=3, dim=96, seed=5).encode(x)
        b = quantizer(name, bits=3, dim=96, seed=5).encode(x)
        assert all(torch.equal(a.payload[key], b.payload[key]) for key in a.payload)


def test_turbo_prod_sketch_domain_original_sketches_the_derotated_residual():
    """sketch_domain='original' stores sign(S Πᵀ r) for the residual r of the rotated domain: its sketch is
    S·Πᵀ (rows Π sᵢ), the estimator stays the decode-then-dot of its own reconstruction, and the codes differ
    from the rotated domain's (same seed) while the MSE stage is shared."""
    from kvstats._random import spawn_seeds
    from kvstats.quant.rotations import srht_sketch
    from kvstats.quant.schemes import scheme

    d, seed = 64, 5
    rot = quantizer("turbo_prod", bits=3, dim=d, seed=seed, rows="srht")
    orig = quantizer("turbo_prod", bits=3, dim=d, seed=seed, rows="srht", sketch_domain="original")
    s = srht_sketch(d, d, spawn_seeds(seed, 2)[1])
    assert torch.equal(rot.sketch.matrix(torch.device("cpu"), torch.float64), s)
    expected = orig.stage.rotation.forward(s)  # S·Πᵀ: row i is (Π sᵢ)ᵀ
    torch.testing.assert_close(orig.sketch.matrix(torch.device("cpu"), torch.float64), expected, rtol=0, atol=1e-12)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, d, generator=g, dtype=torch.float64), torch.randn(3, d, generator=g, dtype=torch.float64)
    c_rot, c_orig = rot.encode(x), orig.encode(x)
    assert torch.equal(c_rot.parts["mse"].payload["indices"], c_orig.parts["mse"].payload["indices"])
    assert not torch.equal(c_rot.payload["signs"], c_orig.payload["signs"])
    torch.testing.assert_close(orig.inner(y, c_orig), y @ orig.decode(c_orig).T, rtol=1e-10, atol=1e-10)
    # the residual's signs are sign(S Πᵀ r) with r = Π x − ŷ taken in the rotated domain
    r = orig.stage.rotation.forward(x) - orig.stage.rotation.forward(orig.decode_mse(c_orig))
    from kvstats.quant import ops

    signs = ops.unpack_bits(c_orig.payload["signs"], 1, d).bool()
    assert torch.equal(signs, (r @ expected.T) > 0)
    assert scheme("kqv", bits=4, dim=d, seed=0, rows="srht", sketch_domain="original").v.config.sketch_domain \
        == "original"
    with pytest.raises(ValueError, match="sketch_domain"):
        quantizer("turbo_prod", bits=3, dim=d, seed=0, sketch_domain="residual")
