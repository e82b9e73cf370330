"""Lloyd–Max scalar quantizers: a solver for any 1-D law, the exact codebooks of the sphere law f_d, and
the Gaussian limit.

A b-bit Lloyd–Max codebook of a law with density f has N = 2^b levels c_1 < ... < c_N and N - 1
thresholds t_i; it minimises E[(X - Q(X))²] and satisfies

    t_i = (c_i + c_{i+1}) / 2                  (each cell's boundary is the midpoint of its levels)
    c_i = E[X | t_{i-1} < X < t_i]             (each level is the conditional mean of its cell)

with t_0, t_N the ends of the support. :func:`lloyd_max` solves these conditions to 1e-12 (relative to
the law's standard deviation) with a Newton iteration on the thresholds (tridiagonal Jacobian), started
from the asymptotically optimal companding point density f^{1/3} and a few plain Lloyd steps. See
docs/theory_lloyd_max.md.

* :class:`Codebook` — levels, thresholds, mse, d_mse, index entropy; ``quantize`` / ``dequantize``.
* :func:`lloyd_max` — any continuous frozen scipy distribution, bits 1..8.
* :func:`beta_codebook` — the sphere law f_d (kvstats.quant.sphere.coordinate_law), any d ≥ 2: what
  TurboQuant_mse applies to the coordinates of a rotated unit vector. d_mse = d·mse is its D_mse.
* :func:`gaussian_codebook` — the N(0, 1) limit (Max 1960).

Common (d, bits) are shipped precomputed in ``kvstats/tables/codebooks.json`` (made by
scripts/make_codebook_table.py, loaded on first use); the rest are solved on demand. Both are cached.
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
from scipy import integrate, linalg, special, stats

from kvstats._validation import check_int_range
from kvstats.quant.sphere import MAX_DIM, coordinate_law

__all__ = [
    "MAX_BITS",
    "Codebook",
    "lloyd_max",
    "beta_codebook",
    "gaussian_codebook",
    "TABLE_DIMS",
]

MAX_BITS = 8
#: Dimensions whose beta codebooks (bits 1..8) are shipped in kvstats/tables/codebooks.json.
TABLE_DIMS = (2, 3, 4, 8, 16, 32, 64, 96, 128, 256)
_TABLE_FILE = "codebooks.json"


# ------------------------------------------------------------------------------------------ Codebook


@dataclass(frozen=True, eq=False)
class Codebook:
    """A scalar quantizer: 2^bits levels and the 2^bits - 1 cell boundaries between them.

    Attributes:
        bits: bits per coordinate (1..8).
        dim: d of the sphere law f_d the codebook was solved for; None for the Gaussian limit or
            another law given to :func:`lloyd_max`.
        levels: float64 [2^bits], ascending (read-only). Exactly symmetric (levels = -levels[::-1])
            for laws symmetric about 0.
        thresholds: float64 [2^bits - 1], the interior cell boundaries, midpoints of neighbouring levels.
        mse: E[(X - Q(X))²] per coordinate under the law.
        d_mse: mse / Var(X): the expected squared error of a unit vector whose coordinates follow the
            law. For f_d (variance 1/d) this is d·mse, TurboQuant's D_mse; for N(0, 1) it is mse.
        entropy: entropy of the index distribution, in bits (≤ bits).
    """

    bits: int
    dim: int | None
    levels: np.ndarray
    thresholds: np.ndarray
    mse: float
    d_mse: float
    entropy: float

    def __post_init__(self) -> None:
        for name in ("levels", "thresholds"):
            arr = np.array(getattr(self, name), dtype=np.float64, copy=True)
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)
        n = 2**self.bits
        if self.levels.shape != (n,) or self.thresholds.shape != (n - 1,):
            raise ValueError(
                f"levels must have shape ({n},) and thresholds ({n - 1},) for bits={self.bits}, "
                f"got {self.levels.shape} and {self.thresholds.shape}"
            )

    @property
    def n_levels(self) -> int:
        return 2**self.bits

    def quantize(self, x) -> np.ndarray:
        """Index (int64, 0..2^bits - 1) of the cell of each entry of x: ``searchsorted(thresholds, x)``.

        Cell i is [thresholds[i-1], thresholds[i]); a value exactly on a threshold goes to the upper cell.
        """
        arr = np.asarray(x, dtype=np.float64)
        if arr.size and not np.all(np.isfinite(arr)):
            raise ValueError("x contains non-finite values; quantize needs finite input")
        return np.searchsorted(self.thresholds, arr, side="right").astype(np.int64)

    def dequantize(self, indices) -> np.ndarray:
        """The level of each index: ``levels[indices]`` (float64, same shape)."""
        idx = np.asarray(indices)
        if not np.issubdtype(idx.dtype, np.integer):
            raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
        if idx.size and (idx.min() < 0 or idx.max() >= self.n_levels):
            raise ValueError(f"indices must be in [0, {self.n_levels - 1}], got range [{idx.min()}, {idx.max()}]")
        return self.levels[idx]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (floats as Python floats; json's repr round-trips them exactly)."""
        return {
            "bits": self.bits,
            "dim": self.dim,
            "levels": [float(v) for v in self.levels],
            "thresholds": [float(v) for v in self.thresholds],
            "mse": float(self.mse),
            "d_mse": float(self.d_mse),
            "entropy": float(self.entropy),
        }

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> Codebook:
        return cls(
            bits=int(payload["bits"]),
            dim=None if payload["dim"] is None else int(payload["dim"]),
            levels=np.asarray(payload["levels"], dtype=np.float64),
            thresholds=np.asarray(payload["thresholds"], dtype=np.float64),
            mse=float(payload["mse"]),
            d_mse=float(payload["d_mse"]),
            entropy=float(payload["entropy"]),
        )

    def __repr__(self) -> str:
        where = "gaussian limit" if self.dim is None else f"d={self.dim}"
        return (
            f"Codebook(bits={self.bits}, {where}, levels={np.array2string(self.levels, precision=4)}, "
            f"mse={self.mse:.6g}, d_mse={self.d_mse:.6g}, entropy={self.entropy:.4f})"
        )


# ----------------------------------------------------------------------------- truncated moments


class _Law:
    """Cell probabilities P = P(lo < X < hi) and centred first moments M = E[(X - μ)·1{lo < X < hi}].

    Exact (pdf-difference) forms for the normal and beta families, quad otherwise. P is the difference
    of CDFs below the median and of survival functions above it, so that tail cells keep their digits.
    """

    def __init__(self, dist) -> None:
        self.dist = dist
        self.mean = float(dist.mean())
        sd = float(dist.std())
        self.scale = sd if np.isfinite(sd) and sd > 0 else float(dist.ppf(0.75) - dist.ppf(0.25))
        lo, hi = dist.support()
        self.lo, self.hi = float(lo), float(hi)
        self.median = float(dist.median())
        name = getattr(dist.dist, "name", "")
        shapes, loc, scl = _params(dist)
        self.kind = "generic"
        if name == "norm":
            self.kind, self.sigma = "norm", scl
        elif name == "beta":
            self.kind = "beta"
            self.a, self.b = shapes
            self.loc, self.bscale = loc, scl
            self.log_beta = special.betaln(self.a, self.b)
            self.sym_const = special.poch(self.a, 0.5) / (2.0 * np.sqrt(np.pi))

    def pdf(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.dist.pdf(x), dtype=np.float64)

    def prob(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        upper = lo >= self.median
        p_low = self.dist.cdf(hi) - self.dist.cdf(lo)
        p_up = self.dist.sf(lo) - self.dist.sf(hi)
        return np.where(upper, p_up, p_low)

    def centred_moment(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        if self.kind == "norm":
            # E[(X-μ) 1{lo<X<hi}] = σ² (φ(lo) - φ(hi))
            return self.sigma**2 * (self.pdf(lo) - self.pdf(hi))
        if self.kind == "beta":
            # X = loc + s·B, B ~ Beta(a, b), m = a/(a+b): d/du [u^a (1-u)^b / B(a,b)] = -(a+b)(u - m) f_B(u),
            # so E[(B - m) 1{B < u}] = -g(u)/(a+b) with g(u) = u^a (1-u)^b / B(a,b), computed in logs.
            return self.bscale * (self._g(lo) - self._g(hi)) / (self.a + self.b)
        out = np.empty(np.shape(lo))
        for i, (l, h) in enumerate(zip(np.ravel(lo), np.ravel(hi))):
            out.flat[i] = _quad(lambda x: (x - self.mean) * self.dist.pdf(x), l, h, self.mean, self.scale)
        return out

    def _g(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if self.a == self.b:
            # symmetric case (the sphere law): with s = 2u - 1, u(1-u) = (1 - s²)/4 and, by Legendre's
            # duplication formula, 4^{-a}/B(a, a) = Γ(a + ½)/(2√π Γ(a)). Both factors stay accurate at
            # large a, where a·log u and log B(a, a) are ~10^4 and would cancel to O(1).
            s = np.clip((2.0 * (x - self.loc) - self.bscale) / self.bscale, -1.0, 1.0)
            with np.errstate(divide="ignore"):
                return np.exp(self.a * np.log1p(-s * s)) * self.sym_const
        u = np.clip((x - self.loc) / self.bscale, 0.0, 1.0)
        with np.errstate(divide="ignore"):
            log_g = self.a * np.log(u) + self.b * np.log1p(-u) - self.log_beta
        return np.exp(log_g)  # 0 at u = 0 and u = 1 (a, b > 0)

    def centroids(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = self.prob(lo, hi)
        return self.mean + self.centred_moment(lo, hi) / p, p


def _params(dist) -> tuple[tuple[float, ...], float, float]:
    """(shapes, loc, scale) of a frozen scipy distribution."""
    shapes, loc, scale = dist.dist._parse_args(*dist.args, **dist.kwds)
    return tuple(float(s) for s in shapes), float(loc), float(scale)


def _quad(fn, lo: float, hi: float, centre: float, scale: float) -> float:
    """∫_lo^hi fn, split at centre ± k·scale so quad finds the mass on long or infinite intervals."""
    marks = [centre + k * scale for k in (-40, -8, -2, 0, 2, 8, 40)]
    edges = [lo, *[m for m in marks if lo < m < hi], hi]
    total = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        for a, b in zip(edges[:-1], edges[1:]):
            total += integrate.quad(fn, a, b, limit=200, epsabs=0.0, epsrel=1e-13)[0]
    return total


# --------------------------------------------------------------------------------------- solver


def _is_symmetric_about_zero(law: _Law) -> bool:
    if abs(law.median) > 1e-14 * law.scale:
        return False
    qs = np.array([0.55, 0.7, 0.85, 0.95, 0.99, 0.999])
    x = law.dist.ppf(qs)
    return bool(np.allclose(law.dist.cdf(-x), law.dist.sf(x), rtol=1e-12, atol=1e-15))


def _companding_init(law: _Law, lo: float, hi: float, k: int) -> np.ndarray:
    """Interior thresholds (k - 1) with point density ∝ f^{1/3} on [lo, hi] (Panter–Dite companding)."""
    q_lo, q_hi = float(law.dist.cdf(lo)), float(law.dist.cdf(hi))
    z = np.linspace(-8.0, 8.0, 4001)
    q = q_lo + (q_hi - q_lo) * stats.norm.cdf(z)
    x = law.dist.ppf(np.clip(q, 1e-300, 1.0 - 1e-16))
    x = np.clip(x, lo if np.isfinite(lo) else -np.inf, hi if np.isfinite(hi) else np.inf)
    x = np.maximum.accumulate(x)
    dens = np.cbrt(law.pdf(x))
    dens = np.where(np.isfinite(dens), dens, 0.0)
    cum = np.concatenate([[0.0], np.cumsum(0.5 * (dens[1:] + dens[:-1]) * np.diff(x))])
    cum /= cum[-1]
    targets = np.arange(1, k) / k
    keep = np.concatenate([[True], np.diff(cum) > 0])
    return np.interp(targets, cum[keep], x[keep])


def _solve(law: _Law, lo: float, hi: float, k: int, tol: float, max_iter: int) -> tuple[np.ndarray, int]:
    """Interior thresholds t_1..t_{k-1} of the k-level Lloyd–Max quantizer of the law restricted to
    [lo, hi] (lo, hi fixed ends). Returns (thresholds, iterations)."""
    if k == 1:
        return np.empty(0), 0
    t = _companding_init(law, lo, hi, k)

    def residual(t: np.ndarray):
        edges = np.concatenate([[lo], t, [hi]])
        c, p = law.centroids(edges[:-1], edges[1:])
        return t - 0.5 * (c[:-1] + c[1:]), c, p, edges

    def valid(t: np.ndarray) -> bool:
        edges = np.concatenate([[lo], t, [hi]])
        return bool(np.all(np.diff(edges) > 0)) and bool(np.all(np.isfinite(t)))

    # a few plain Lloyd steps: cheap, and they land Newton in its basin even from a rough start
    for _ in range(5):
        _, c, _, _ = residual(t)
        t = 0.5 * (c[:-1] + c[1:])

    step_tol = tol * law.scale
    best, stalled = (math.inf, t), 0
    for it in range(1, max_iter + 1):
        g, c, p, edges = residual(t)
        f = law.pdf(t)
        # ∂c_i/∂(upper end t_i) = f(t_i)(t_i - c_i)/P_i ; ∂c_{i+1}/∂(lower end t_i) = f(t_i)(c_{i+1} - t_i)/P_{i+1}
        dc_up = f * (t - c[:-1]) / p[:-1]
        dc_low = f * (c[1:] - t) / p[1:]
        diag = 1.0 - 0.5 * (dc_up + dc_low)
        ab = np.zeros((3, k - 1))
        ab[1] = diag
        ab[0, 1:] = -0.5 * dc_up[1:]  # ∂G_i/∂t_{i+1} = -½ ∂c_{i+1}/∂t_{i+1}
        ab[2, :-1] = -0.5 * dc_low[:-1]  # ∂G_{i+1}/∂t_i = -½ ∂c_{i+1}/∂t_i
        try:
            delta = linalg.solve_banded((1, 1), ab, -g)
        except (linalg.LinAlgError, ValueError):
            delta = -g  # fall back to a Lloyd step
        gnorm = float(np.max(np.abs(g)))
        lam, new_gnorm = 1.0, math.inf
        while lam > 1e-6:
            trial = t + lam * delta
            if valid(trial):
                new_gnorm = float(np.max(np.abs(residual(trial)[0])))
                # accept a decrease; at round-off level the residual no longer decreases monotonically
                if new_gnorm <= gnorm * (1 - 1e-4 * lam) or gnorm < 1e3 * step_tol:
                    break
            lam *= 0.5
        else:
            trial = 0.5 * (c[:-1] + c[1:])  # Newton failed to decrease: take a Lloyd step
            new_gnorm = float(np.max(np.abs(residual(trial)[0])))
        change = float(np.max(np.abs(trial - t)))
        t = trial
        # Converged when the step is below tol·σ, or when the optimality conditions already hold to
        # tol·σ/10, the round-off floor of the CDFs (reached first at large d, where scipy's Beta CDF
        # is good to ~1e-14 only and the ill-conditioned Newton step then jitters at ~1e-11·σ).
        if change < step_tol or new_gnorm < 0.1 * step_tol:
            return t, it
        # At d ≳ 10^5 the Beta CDF's own round-off (~1e-12 relative) is the floor: accept the best
        # point once the residual has stopped improving for 5 steps below 1e-10·σ (the tested accuracy).
        if new_gnorm < best[0]:
            best, stalled = (new_gnorm, t), 0
        else:
            stalled += 1
        if stalled >= 5 and best[0] < 1e-10 * law.scale:
            return best[1], it
    raise RuntimeError(
        f"lloyd_max did not converge to {tol:g} in {max_iter} Newton iterations (last change {change:.3g})"
    )


def _cell_mse(law: _Law, lo: float, hi: float, level: float) -> float:
    return _quad(lambda x: (x - level) ** 2 * law.dist.pdf(x), lo, hi, level, law.scale)


def lloyd_max(dist, bits: int, tol: float = 1e-12, max_iter: int = 200, *, symmetric: bool | None = None) -> Codebook:
    """The b-bit Lloyd–Max codebook of a continuous 1-D law (a frozen scipy distribution).

    Solves the two optimality conditions (levels = conditional means of their cells, thresholds =
    midpoints of neighbouring levels) by Newton's method on the thresholds, stopping when no threshold
    moves by more than ``tol`` × the law's standard deviation. Truncated moments are exact for
    ``scipy.stats.norm`` and ``scipy.stats.beta`` (pdf differences), ``scipy.integrate.quad`` otherwise.

    For a law symmetric about 0 (detected, or forced by ``symmetric``) the positive half is solved with
    0 as the middle threshold and mirrored, so levels are exactly antisymmetric.

    Args:
        dist: frozen scipy continuous distribution, e.g. ``scipy.stats.norm()``.
        bits: 1..8.
        tol: convergence tolerance on threshold moves, relative to the law's standard deviation.
        max_iter: maximum Newton iterations.
        symmetric: None to detect symmetry about 0.

    Returns:
        :class:`Codebook` with dim=None, d_mse = mse / Var(X).
    """
    bits = check_int_range(bits, "bits", 1, MAX_BITS)
    if not (hasattr(dist, "dist") and isinstance(dist.dist, stats.rv_continuous)):
        raise TypeError(f"dist must be a frozen continuous scipy distribution, got {type(dist).__name__}")
    if not (isinstance(tol, float) and 0 < tol < 1):
        raise ValueError(f"tol must be a float in (0, 1), got {tol!r}")
    max_iter = check_int_range(max_iter, "max_iter", 1, 10**6)
    law = _Law(dist)
    if symmetric is None:
        symmetric = _is_symmetric_about_zero(law)
    n = 2**bits
    if symmetric:
        k = n // 2
        t_pos, _ = _solve(law, 0.0, law.hi, k, tol, max_iter)
        edges = np.concatenate([[0.0], t_pos, [law.hi]])
        c_pos, _ = law.centroids(edges[:-1], edges[1:])
        levels = np.concatenate([-c_pos[::-1], c_pos])
    else:
        t_all, _ = _solve(law, law.lo, law.hi, n, tol, max_iter)
        edges = np.concatenate([[law.lo], t_all, [law.hi]])
        levels, _ = law.centroids(edges[:-1], edges[1:])
    thresholds = 0.5 * (levels[:-1] + levels[1:])
    cells = np.concatenate([[law.lo], thresholds, [law.hi]])
    probs = law.prob(cells[:-1], cells[1:])
    if symmetric:
        half = n // 2  # mirror the positive half so that the numbers are exactly symmetric too
        probs = np.concatenate([probs[half:][::-1], probs[half:]])
        mse = 2.0 * sum(_cell_mse(law, cells[i], cells[i + 1], levels[i]) for i in range(half, n))
    else:
        mse = sum(_cell_mse(law, cells[i], cells[i + 1], levels[i]) for i in range(n))
    probs = probs / probs.sum()
    nz = probs[probs > 0]
    entropy = float(-np.sum(nz * np.log2(nz)))
    return Codebook(
        bits=bits, dim=None, levels=levels, thresholds=thresholds, mse=float(mse),
        d_mse=float(mse / dist.var()), entropy=entropy,
    )


# ------------------------------------------------------------------------------- table and cache


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, dict]:
    try:
        text = resources.files("kvstats").joinpath("tables", _TABLE_FILE).read_text()
    except (FileNotFoundError, ModuleNotFoundError, OSError):
        return {}
    return json.loads(text)["codebooks"]


def _table_key(dim: int | None, bits: int) -> str:
    return f"gaussian/bits={bits}" if dim is None else f"beta/d={dim}/bits={bits}"


def _solve_beta(d: int, bits: int) -> Codebook:
    cb = lloyd_max(coordinate_law(d), bits, symmetric=True)
    return Codebook(
        bits=bits, dim=d, levels=cb.levels, thresholds=cb.thresholds, mse=cb.mse, d_mse=d * cb.mse,
        entropy=cb.entropy,
    )


def _solve_gaussian(bits: int) -> Codebook:
    return lloyd_max(stats.norm(0.0, 1.0), bits, symmetric=True)


@functools.lru_cache(maxsize=1024, typed=True)  # typed: 128.0 must not hit the entry of 128
def beta_codebook(d: int, bits: int) -> Codebook:
    """Exact b-bit Lloyd–Max codebook of f_d, the law of a coordinate of a uniform point on S^{d-1}.

    Any int d in [2, 2^20] and bits 1..8. d = 2 is the arcsine law, d = 3 gives the uniform quantizer
    on [-1, 1], large d approaches ``gaussian_codebook(bits)`` scaled by 1/√d. ``d_mse`` = d·mse is
    TurboQuant_mse's D_mse = E‖x - x̂‖² for a unit vector after a uniform random rotation.
    Cached; common (d, bits) come from the shipped table.
    """
    d = check_int_range(d, "d", 2, MAX_DIM)
    bits = check_int_range(bits, "bits", 1, MAX_BITS)
    entry = _table().get(_table_key(d, bits))
    return Codebook.from_dict(entry) if entry is not None else _solve_beta(d, bits)


@functools.lru_cache(maxsize=1024, typed=True)  # typed: 128.0 must not hit the entry of 128
def gaussian_codebook(bits: int) -> Codebook:
    """b-bit Lloyd–Max codebook of N(0, 1) (Max 1960), the d → ∞ limit of √d·``beta_codebook(d, bits)``.

    dim is None and d_mse = mse (unit variance).
    """
    bits = check_int_range(bits, "bits", 1, MAX_BITS)
    entry = _table().get(_table_key(None, bits))
    return Codebook.from_dict(entry) if entry is not None else _solve_gaussian(bits)


def _build_table() -> dict[str, dict]:
    """Every shipped entry, freshly solved (used by scripts/make_codebook_table.py)."""
    out = {}
    for bits in range(1, MAX_BITS + 1):
        out[_table_key(None, bits)] = _solve_gaussian(bits).to_dict()
    for d in TABLE_DIMS:
        for bits in range(1, MAX_BITS + 1):
            out[_table_key(d, bits)] = _solve_beta(d, bits).to_dict()
    return out
