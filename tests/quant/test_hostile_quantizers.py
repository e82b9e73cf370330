"""Hostile inputs to the quantizers and schemes (issue: no silent NaN, no unreproducible seed, nothing lost).

Each test feeds a value a careless or hostile user could pass and checks for a clear error naming the
argument and the value, or for a finite correct result. Where a code path has a compiled kernel, the
test runs on both the kernel and the pure-torch reference (``kvstats.ops.use_reference()``).
"""

import contextlib
import itertools
import math

import numpy as np
import pytest
import scipy.linalg
import torch

import kvstats
from kvstats.data.synthetic import KINDS, generate, outlier_channel_indices, synthetic_queries
from kvstats.quant import ops
from kvstats.quant.quantizers import QUANTIZERS, Code
from kvstats.quant.rotations import srht_sketch
from kvstats.quant.schemes import SCHEMES
from tests.helpers.quantizers import supported_bits

PATHS = {"kernel": contextlib.nullcontext, "reference": ops.use_reference}
BAD_SEEDS = [(-1, ValueError), (2**70, ValueError), (2**63, ValueError), (True, TypeError), ("0", TypeError),
             (1.5, TypeError)]
SEED_MESSAGE = r"seed must be an int in \[0, 2\*\*63 - 1\] or None"


def build_quantizer(name: str, seed, **options):
    return kvstats.quantizer(name, bits=supported_bits(name, 2), dim=64, seed=seed, **options)


def draws(q) -> torch.Tensor:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(7))
    return q.decode(q.encode(x))


# ------------------------------------------------------------------------------------- one seed rule
@pytest.mark.parametrize("name", sorted(QUANTIZERS))
@pytest.mark.parametrize("seed, error", BAD_SEEDS)
def test_every_quantizer_refuses_bad_seeds_with_one_message(name, seed, error):
    with pytest.raises(error, match=SEED_MESSAGE) as info:
        build_quantizer(name, seed)
    assert repr(seed) in str(info.value)


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("seed, error", BAD_SEEDS)
def test_every_scheme_refuses_bad_seeds_with_one_message(name, seed, error):
    with pytest.raises(error, match=SEED_MESSAGE):
        kvstats.scheme(name, bits=3, dim=64, seed=seed)


@pytest.mark.parametrize("seed, error", BAD_SEEDS)
def test_nova_scheme_refuses_bad_seeds(seed, error):
    q, k, v = generate("gaussian", 1, 1, 300, 16, 0, n_q=32)
    with pytest.raises(error, match=SEED_MESSAGE):
        kvstats.scheme("nova", bits=2, dim=16, seed=seed, queries=q, keys=k, values=v)


@pytest.mark.parametrize("seed, error", BAD_SEEDS)
def test_generators_refuse_bad_seeds(seed, error):
    keys = torch.randn(1, 1, 8, 16)
    for call in (lambda: generate("gaussian", 1, 1, 8, 16, seed),
                 lambda: synthetic_queries(keys, 1, 4, seed),
                 lambda: outlier_channel_indices(2, 16, seed)):
        with pytest.raises(error, match=SEED_MESSAGE):
            call()


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_seed_none_is_fresh_entropy_recorded_for_reproduction(name):
    a, b = build_quantizer(name, None), build_quantizer(name, None)
    assert isinstance(a.seed, int) and 0 <= a.seed < 2**63
    assert a.seed != b.seed  # two 63-bit draws collide with probability 2**-63
    again = build_quantizer(name, a.seed)
    torch.testing.assert_close(draws(again), draws(a), rtol=0, atol=0)
    if name in ("turbo_mse", "turbo_prod", "qjl", "rotated_minmax"):  # seeded methods: fresh draws differ
        assert not torch.equal(draws(a), draws(b))


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_scheme_seed_none_is_recorded(name):
    bits = 2 if name == "kivi" else 3  # KIVI as published: budgets 2 and 4 only
    a, b = kvstats.scheme(name, bits=bits, dim=64, seed=None), kvstats.scheme(name, bits=bits, dim=64, seed=None)
    assert a.seed != b.seed
    again = kvstats.scheme(name, bits=bits, dim=64, seed=a.seed)
    k = torch.randn(1, 2, 8, 64, generator=torch.Generator().manual_seed(1))
    for x, y in zip(a.decode(a.encode(k, k)), again.decode(again.encode(k, k))):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_generator_seed_none_gives_fresh_draws(kind):
    first, second = generate(kind, 1, 1, 8, 16, None)[1], generate(kind, 1, 1, 8, 16, None)[1]
    assert not torch.equal(first, second)
    torch.testing.assert_close(generate(kind, 1, 1, 8, 16, 2**63 - 1)[1], generate(kind, 1, 1, 8, 16, 2**63 - 1)[1],
                               rtol=0, atol=0)


# ---------------------------------------------------------------------------------------- provenance
MISMATCHES = [
    ("lloyd", {}, "turbo_mse", {}),                              # another method, same layout
    ("turbo_mse", {"seed": 0}, "turbo_mse", {"seed": 1}),        # another seed
    ("turbo_mse", {"dim": 64, "bits": 2}, "turbo_mse", {"dim": 128, "bits": 3}),  # another dim and bits
    ("turbo_mse", {"norm_dtype": torch.float16}, "turbo_mse", {}),  # another option
    ("turbo_prod", {"rows": "gaussian"}, "turbo_prod", {"rows": "orthogonal"}),
    ("turbo_prod", {}, "qjl", {}),                               # formerly a bare KeyError
    ("qjl", {}, "turbo_prod", {}),
    ("minmax", {}, "lloyd", {}),
    ("qjl", {"outliers": [1, 2]}, "qjl", {"outliers": [1, 3]}),
]


def _built(name, overrides):
    args = {"bits": 2, "dim": 64, "seed": 0, **overrides}
    return kvstats.quantizer(name, **args)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("maker, made, user, used", MISMATCHES)
def test_decode_and_inner_refuse_a_code_from_another_quantizer(path, maker, made, user, used):
    a, b = _built(maker, made), _built(user, used)
    x = torch.randn(3, 5, a.dim, generator=torch.Generator().manual_seed(0))
    with PATHS[path]():
        code = a.encode(x)
        for call in (lambda: b.decode(code), lambda: b.inner(torch.randn(3, 2, b.dim), code)):
            with pytest.raises(ValueError, match="code was made by") as info:
                call()
            message = str(info.value)
            assert repr(a) in message and repr(b) in message
        a.decode(code)  # its own quantizer still decodes it


def test_a_code_remembers_its_quantizer():
    q = _built("turbo_prod", {"seed": 5})
    code = q.encode(torch.randn(4, 64))
    assert (code.source.name, code.source.dim, code.source.bits) == ("turbo_prod", 64, 2)
    assert code.source == _built("turbo_prod", {"seed": 5}).provenance()  # same construction, same fingerprint
    assert code.source.fingerprint != _built("turbo_prod", {"seed": 6}).provenance().fingerprint


@pytest.mark.parametrize("path", PATHS)
def test_a_hand_built_code_missing_a_field_is_a_value_error(path):
    q = _built("turbo_prod", {})
    with PATHS[path]():
        code = q.encode(torch.randn(4, 64))
        code.source = None
        del code.payload["signs"]
        with pytest.raises(ValueError, match="code lacks the field 'signs'"):
            q.decode(code)
        with pytest.raises(ValueError, match="code lacks the field 'signs'"):
            q.inner(torch.randn(2, 64), code)
        with pytest.raises(ValueError, match="code is of vectors of dim 64"):
            _built("turbo_prod", {"dim": 32}).decode(Code(torch.Size([4, 64]), torch.float32))


def test_nova_codes_are_tied_to_the_calibration():
    q, k, _ = generate("gaussian", 1, 1, 400, 16, 0, n_q=64)
    prior = kvstats.quantizer("nova", bits=2, dim=16, seed=0)
    code = prior.encode(k[0, 0])
    fitted = kvstats.quantizer("nova", bits=2, dim=16, seed=0).calibrate(q, k)
    with pytest.raises(ValueError, match="code was made by"):
        fitted.decode(code)
    torch.testing.assert_close(kvstats.quantizer("nova", bits=2, dim=16, seed=0).decode(code), prior.decode(code),
                               rtol=0, atol=0)


def test_scheme_codes_carry_both_sources():
    s = kvstats.scheme("kqv", bits=3, dim=32, seed=1)
    k = torch.randn(1, 2, 6, 32)
    cache = s.encode(k, k)
    assert cache.k.source.name == "turbo_mse" and cache.v.source.name == "turbo_prod"
    other = kvstats.scheme("kqv", bits=3, dim=32, seed=2)
    with pytest.raises(ValueError, match="code was made by"):
        other.decode(cache)


# ------------------------------------------------------------------------------- storage dtype limits
FP16_STORAGE = [
    ("minmax", {}, "side_dtype"),                                 # fp16 lo and step by default
    ("rotated_minmax", {}, "side_dtype"),
    ("lloyd", {"norm_dtype": torch.float16}, "norm_dtype"),
    ("turbo_mse", {"norm_dtype": torch.float16}, "norm_dtype"),
    ("turbo_prod", {"norm_dtype": torch.float16}, "norm_dtype"),
    ("qjl", {"norm_dtype": torch.float16}, "norm_dtype"),
    ("qjl", {"norm_dtype": torch.float16, "outliers": [0]}, "norm_dtype"),
    ("nova", {"scale_dtype": torch.float16}, "scale_dtype"),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name, options, option", FP16_STORAGE)
def test_values_fp16_storage_cannot_hold_are_refused_naming_the_dtype(path, name, options, option):
    q = build_quantizer(name, 0, **options)
    # every stored scalar (norm, RMS scale, group minimum) is then beyond 65504, the largest finite fp16
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3)) - 7e4
    with PATHS[path](), pytest.raises(ValueError, match=rf"overflows torch.float16 .*pass {option}=torch.float32"):
        q.encode(x)


@pytest.mark.parametrize("path", PATHS)
def test_minmax_near_the_fp16_limit_stays_finite_and_accurate(path):
    # |x| ≤ 6e4 and group range ≤ 1.2e5: lo and step = range/3 fit in fp16, so decode is finite and within
    # half a step (plus the fp16 rounding of lo and step, 2^-11 relative each) of x.
    q = kvstats.quantizer("minmax", bits=2, dim=64)
    x = torch.linspace(-6e4, 6e4, 64).repeat(2, 1)
    with PATHS[path]():
        x_hat = q.decode(q.encode(x))
    step = 1.2e5 / 3
    assert torch.isfinite(x_hat).all()
    assert (x_hat - x).abs().max() <= step / 2 + 4 * 2**-11 * 6e4


def test_identity_fp16_storage_refuses_values_above_65504():
    from kvstats.quant.quantizers import IdentityQuantizer

    with pytest.raises(ValueError, match=r"dtype=torch.float16 cannot hold"):
        IdentityQuantizer(8, dtype=torch.float16).encode(torch.full((2, 8), 1e5))


# --------------------------------------------------------------------------- qjl, one outlier channel
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows", ["gaussian", "orthogonal"])
def test_qjl_with_exactly_one_outlier_channel_is_exact_there(path, rows):
    d, channel = 32, 5
    q = kvstats.quantizer("qjl", dim=d, seed=11, rows=rows, outliers=[channel])
    gen = torch.Generator().manual_seed(4)
    x, query = torch.randn(2, 7, d, generator=gen), torch.randn(2, 3, d, generator=gen)
    x[..., channel] *= 50
    keep = [i for i in range(d) if i != channel]
    # oracle: a plain qjl on the inlier channels with the same sketch (same child seed, m = d rows)
    inlier = kvstats.quantizer("qjl", dim=d - 1, m=d, seed=11, rows=rows)
    with PATHS[path]():
        code = q.encode(x)
        x_hat, scores = q.decode(code), q.inner(query, code)
        inlier_code = inlier.encode(x[..., keep])
        exact_term = query[..., channel:channel + 1] * x[..., None, :, channel]
        expected = inlier.inner(query[..., keep], inlier_code) + exact_term
        torch.testing.assert_close(x_hat[..., keep], inlier.decode(inlier_code))
    assert torch.equal(x_hat[..., channel], x[..., channel])
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-4)
    assert code.nbytes * 8 == q.bits_per_coordinate().total * x[..., 0].numel() * d


# ------------------------------------------------------------------------------------- meta tensors
def test_meta_tensors_are_refused_naming_the_argument():
    q = kvstats.quantizer("turbo_prod", bits=3, dim=16)
    code = q.encode(torch.randn(4, 16))
    with pytest.raises(ValueError, match="x is a meta tensor"):
        q.encode(torch.empty(4, 16, device="meta"))
    with pytest.raises(ValueError, match="query is a meta tensor"):
        q.inner(torch.empty(2, 16, device="meta"), code)
    code.scalars["gamma"] = torch.empty(4, device="meta")
    with pytest.raises(ValueError, match="code field 'gamma' is a meta tensor"):
        q.decode(code)
    s = kvstats.scheme("kqv", bits=3, dim=16)
    with pytest.raises(ValueError, match="keys is a meta tensor"):
        s.encode(torch.empty(1, 1, 4, 16, device="meta"), torch.randn(1, 1, 4, 16))


# ------------------------------------------------------------------------------------------ large d
@pytest.mark.parametrize("build, what", [
    (lambda: kvstats.quantizer("qjl", dim=32768, seed=0), "orthogonal sketch"),
    (lambda: kvstats.quantizer("qjl", dim=8192, rows="gaussian", seed=0), "Gaussian sketch"),
    (lambda: kvstats.quantizer("turbo_prod", bits=2, dim=16384, seed=0), "Gaussian sketch"),
    (lambda: kvstats.quantizer("turbo_mse", bits=2, dim=8192, rotation="haar", seed=0), "Haar rotation"),
    (lambda: kvstats.quantizer("qjl", bits=8, dim=4096, rows="srht", seed=0), "SRHT sketch"),
])
def test_dense_matrices_above_the_memory_limit_are_refused_with_their_size(build, what):
    with pytest.raises(ValueError, match=rf"{what} would be a dense float64 \[\d+, \d+\] matrix of \d+ MiB, "
                                         r"above the limit kvstats.quant.rotations.MAX_DENSE_BYTES = 256 MiB"):
        build()


# ----------------------------------------------------------------------------- D'Alberto's SRHT sketch
# D'Alberto (arXiv 2605.08114 §2.2, eq. 3): q = sign(H(s′⊙r)), r̂ = (√(π/2)‖r‖/d)·s′⊙(H q), m = d.
SQRT_HALF_PI = math.sqrt(math.pi / 2)


def test_srht_sketch_is_h_times_signs():
    s = srht_sketch(16, 16, 3)
    h = torch.tensor(scipy.linalg.hadamard(16), dtype=torch.float64)
    signs = s[0] / h[0]                                   # s′ read off the first row
    assert set(signs.tolist()) <= {-1.0, 1.0}
    torch.testing.assert_close(s, h * signs, rtol=0, atol=0)
    torch.testing.assert_close(s @ s.T, 16 * torch.eye(16, dtype=torch.float64), rtol=0, atol=0)  # rows ⊥, norm √d
    with pytest.raises(ValueError, match="rows='srht' needs a power-of-two sketched width d .* got d = 96"):
        srht_sketch(96, 96, 0)
    with pytest.raises(ValueError, match="got d = 96"):
        kvstats.quantizer("turbo_prod", bits=3, dim=96, rows="srht")


@pytest.mark.parametrize("path", PATHS)
def test_srht_on_a_spike_returns_sqrt_half_pi_times_the_spike(path):
    # r = e₁: S e₁ = s′₁·(column of ones), so q = s′₁·1 and s′⊙(H q) = s′₁² · d · e₁ for every s′.
    d = 64
    r = torch.zeros(1, d, dtype=torch.float64)
    r[0, 0] = 2.5
    with PATHS[path]():
        for seed in range(5):
            q = kvstats.quantizer("qjl", dim=d, rows="srht", seed=seed)
            torch.testing.assert_close(q.decode(q.encode(r)), SQRT_HALF_PI * r, rtol=1e-12, atol=1e-12)


def _exact_srht_mean(r: torch.Tensor, query: torch.Tensor) -> float:
    """E over s′ of ⟨query, r̂⟩ by enumerating all 2^d sign patterns (d ≤ 16).

    Each row of S is H_i ⊙ s′, whose entries are i.i.d. Rademacher for every fixed i, so every row has the
    law of ε ~ Rademacher^d and E⟨q, r̂⟩ = √(π/2)·‖r‖·Σ_j q_j E[ε_j sign(⟨ε, r⟩)].
    """
    eps = torch.tensor(list(itertools.product([-1.0, 1.0], repeat=r.numel())), dtype=torch.float64)
    weights = (torch.sign(eps @ r).unsqueeze(-1) * eps).mean(0)
    return float(SQRT_HALF_PI * r.norm() * (query @ weights))


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_srht_estimator_is_unbiased_over_fresh_signs_for_spread_r(path):
    # Monte Carlo over N = 2000 independent s′ (seeds) of ⟨q, r̂⟩ for one spread (Gaussian) r at d = 16,
    # against the exact mean by enumeration (independent oracle): |mean − exact| ≤ Z·SE, Z = 5.5, two-sided
    # false-failure probability ≈ 4e-8 by the CLT. (The exact mean differs from ⟨q, r⟩ by the O(1/d)
    # non-Gaussianity of a Rademacher sum, by an amount that depends on r: not asserted. The spike's exact
    # mean is √(π/2) for every s′, asserted below.)
    d, n = 16, 2000
    gen = torch.Generator().manual_seed(0)
    r, query = torch.randn(d, generator=gen, dtype=torch.float64), torch.randn(d, generator=gen, dtype=torch.float64)
    with PATHS[path]():
        est = []
        for seed in range(n):
            q = kvstats.quantizer("qjl", dim=d, rows="srht", seed=seed)
            est.append(float(q.inner(query[None], q.encode(r[None]))[0, 0]))
    est = np.asarray(est)
    exact = _exact_srht_mean(r, query)
    se = est.std(ddof=1) / math.sqrt(n)
    assert abs(est.mean() - exact) <= 5.5 * se, (est.mean(), exact, se)
    spike = torch.zeros(d, dtype=torch.float64)
    spike[0] = 1.0
    assert _exact_srht_mean(spike, spike) == pytest.approx(SQRT_HALF_PI, rel=1e-12)  # the biased spiky case


CUDA = torch.cuda.is_available() and ops.HAS_EXTENSION


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA"))])
@pytest.mark.parametrize("name, options", [("qjl", {}), ("turbo_prod", {"bits": 3}), ("turbo_prod", {"bits": 1})])
def test_srht_kernels_agree_with_the_reference(name, options, device):
    d = 128
    q = kvstats.quantizer(name, dim=d, seed=9, rows="srht", **options)
    gen = torch.Generator().manual_seed(2)
    x, query = torch.randn(3, 40, d, generator=gen).to(device), torch.randn(3, 9, d, generator=gen).to(device)
    code = q.encode(x)
    scores, x_hat = q.inner(query, code), q.decode(code)
    with ops.use_reference():
        ref_code = q.encode(x)
        ref_scores, ref_x_hat = q.inner(query, ref_code), q.decode(ref_code)
    signs, ref_signs = code.payload["signs"], ref_code.payload["signs"]
    assert (signs == ref_signs).float().mean() >= 0.99  # a sign can flip only where S r rounds to ±0
    torch.testing.assert_close(q.inner(query, ref_code), ref_scores, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(scores, ref_scores, rtol=1e-3, atol=0.05 * float(ref_scores.abs().mean()))
    torch.testing.assert_close(x_hat, ref_x_hat, rtol=1e-3, atol=0.05 * float(ref_x_hat.abs().mean()))


def test_scheme_rows_sets_every_qjl_stage():
    s = kvstats.scheme("qkqv", bits=4, dim=128, seed=0, rows="srht")
    assert s.k.rows == s.v.rows == "srht" and s.k.sketch.rows == "srht"
    assert kvstats.scheme("kqv", bits=4, dim=128, seed=0, rows="srht").v.rows == "srht"
    assert kvstats.scheme("kqv", bits=4, dim=128, seed=0).v.rows == "gaussian"   # the quantizer's default
    for name in ("kv", "minmax"):  # no QJL stage: accepted and ignored
        kvstats.scheme(name, bits=4, dim=128, seed=0, rows="srht")
    k = torch.randn(1, 2, 16, 128, generator=torch.Generator().manual_seed(0))
    out = s.attention(torch.randn(1, 4, 3, 128), s.encode(k, k))
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="rows must be one of"):
        kvstats.scheme("kv", bits=4, dim=128, rows="hadamard")


# ------------------------------------------------------------------------- messages that name the cause (issue 30)
class _DividesByTheNorm(kvstats.quantizers.Quantizer):
    """Stores ⟨x, 1⟩/‖x‖: 0/0 = NaN for a zero vector (an encode fault, not an overflow)."""

    name = "divides_by_the_norm"
    min_bits = max_bits = 8

    def _encode(self, x):
        xa = x.float()
        return Code(x.shape, x.dtype, payload={"x": xa.to(torch.float16)},
                    scalars={"ratio": xa.sum(-1) / xa.norm(dim=-1)})

    def _decode(self, code):
        return code.payload["x"]

    def bits_per_coordinate(self, n_tokens=None):
        return kvstats.quantizers.BitBudget(payload=16.0, side=32 / self.dim)


def test_a_nan_stored_scalar_is_called_undefined_not_an_overflow_and_names_the_vector():
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    x[1] = 0
    with pytest.raises(ValueError, match=r"stored NaN as ratio of x\[1\] \(‖x‖ = 0\), max \|x\| = .*undefined value "
                                         r".*not an overflow") as info:
        _DividesByTheNorm(8, 16).encode(x)
    assert "too large" not in str(info.value)


@pytest.mark.parametrize("rotation", ["wht", "haar"])
def test_a_rotation_that_would_overflow_is_refused_as_too_large_not_as_non_finite_input(rotation):
    # Π x can reach ‖x‖ = √d · max |x|: beyond fp32 for x near 3e38, which the inner min-max then saw as
    # "non-finite input"; now the outer input limit refuses x first, naming max |x|
    q = kvstats.quantizer("rotated_minmax", bits=2, dim=64, seed=0, rotation=rotation)
    x = torch.full((2, 64), 3e38)
    with pytest.raises(ValueError, match=r"x \(max \|x\| = 3e\+38\) is too large for RotatedMinMax") as info:
        q.encode(x)
    assert "non-finite" not in str(info.value)


# ------------------------------------------------------------------- products of finite fp32 beyond fp32
def _orthogonal_to(x_hat: torch.Tensor, seed: int) -> torch.Tensor:
    """fp32 rows at max |row| = 3e38 (near fp32's largest, 3.4e38) that are orthogonal to every row of x̂ up to their
    own rounding: their products with x̂ overflow fp32 while ⟨row, x̂ⱼ⟩ is about 3e38 · 2^-24 · ‖x̂ⱼ‖ · √d."""
    a = torch.randn(3, x_hat.shape[-1], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    basis = torch.linalg.qr(x_hat.double().T).Q  # [d, n]: the span of x̂'s rows
    rows = a - (a @ basis) @ basis.T
    return (rows * (3e38 / rows.abs().amax(-1, keepdim=True))).float()


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_inner_is_right_where_fp32_products_overflow_and_refused_where_the_result_does(name, path):
    q = build_quantizer(name, 0)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(11))
    with PATHS[path]():
        code = q.encode(x)
        x_hat = q.decode(code).double()
        query = _orthogonal_to(x_hat, 12)
        got = q.inner(query, code)
        exact = query.double() @ x_hat.T  # the oracle: float64, whose range holds every product here
        # the consistency tolerance of check_quantizer's inner check (fp32 rounding of the sums)
        tol = 1e-4 * float(exact.abs().max()) + 1e-5 * float(query.double().norm(dim=-1).max() *
                                                             x_hat.norm(dim=-1).max())
        assert got.dtype == torch.float32 and bool(torch.isfinite(got).all())
        assert float((got.double() - exact).abs().max()) <= tol
        along = (x_hat[:2] * (3e38 / x_hat[:2].abs().amax(-1, keepdim=True))).float()  # ⟨row, x̂⟩ near 3e38 · 20
        assert float((along.double() @ x_hat.T).abs().max()) > torch.finfo(torch.float32).max
        with pytest.raises(ValueError, match=r"inner\(query, code\) .* reaches \|⟨query, x⟩\| = .*beyond float32's "
                                             r"largest finite value .*max \|query\| = 3e\+38.*float64"):
            q.inner(along, code)


def test_mse_of_fp32_rows_whose_squares_overflow_fp32_is_right_or_refused():
    from kvstats.measure import metrics

    x = torch.full((2, 4), 2.0**66)  # ‖x − (−x)‖² = 4 · (2^67)² = 2^136 per row, exactly: beyond fp32 (2^128)
    assert metrics.mse(x, -x) == 2.0**136
    torch.testing.assert_close(metrics.mse(x, -x, reduction="none", double=True),
                               torch.full((2,), 2.0**136, dtype=torch.float64), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"mse reaches 8\.711e\+40 per vector, beyond float32's largest finite "
                                         r"value .*double=True"):
        metrics.mse(x, -x, reduction="none")
    assert metrics.mse(x, 0.5 * x, relative=True) == 0.25  # relative: already computed in float64
