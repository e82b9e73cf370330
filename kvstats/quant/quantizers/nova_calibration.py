"""NOVA-KV's calibration pieces (arXiv id and section in :mod:`kvstats.quant.quantizers.nova`): the group size, the
stratified eigen-ranks, the attention transform T from Σ_Q and the key covariance, k-means++ / Lloyd codebooks,
the calibration record of one (layer, KV head) and the calibration NOVA-KV derives with no data (isotropic).
Re-exported by :mod:`kvstats.quant.quantizers.nova`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from kvstats._validation import all_finite, check_float_tensor

__all__ = ["NovaCalibration", "as_stored", "attention_transform", "calibration_rows", "default_group_dim",
           "isotropic_calibration", "kmeans_codebook", "kmeans_plusplus", "one_thread",
           "stratified_ranks"]


#: Relative ridge ρ: Σ_Q + ρ·(tr Σ_Q / d)·I.
DEFAULT_RIDGE = 1e-3
#: Tokens the calibration data are amortised over by default (the paper's 128K context).
DEFAULT_AMORTIZE_TOKENS = 131072
SIDE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

def default_group_dim(bits: int, dim: int) -> int:
    """Coefficients per VQ group: the largest g ≤ 8 // bits (at least 1) that divides dim."""
    g = max(1, 8 // bits)
    while dim % g:
        g -= 1
    return g


def stratified_ranks(dim: int, group_dim: int) -> torch.Tensor:
    """Eigen-rank of each stored coefficient in group-major order: position j·g + i holds rank i·G + j.

    So group j (positions j·g … j·g + g − 1) holds ranks j, j + G, j + 2G, …: eigen-rank r → group r mod G.
    """
    groups = dim // group_dim
    return torch.tensor([i * groups + j for j in range(groups) for i in range(group_dim)], dtype=torch.int64)


@contextlib.contextmanager
def one_thread():
    """torch on one thread for the block: MKL's multithreaded GEMM (a tall XᵀX is split along the token axis on
    some CPUs) and LAPACK's eigensolver return last bits that depend on the thread count, and the eigenvalues,
    the ridge and the k-means that follow would carry them into printed numbers
    (tests/study/test_reproducibility.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def attention_transform(sigma_q: torch.Tensor, key_cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The NOVA key transform for a given (already ridged) Σ_Q and key covariance C_K.

    Returns (T, Λ): T = Vᵀ Σ_Q^{1/2} [d, d] (row r: eigen-rank r) and Λ [d] descending, where
    Σ_Q^{1/2} C_K Σ_Q^{1/2} = V Λ Vᵀ. Float64. Σ_Q must be symmetric positive definite.
    """
    sigma_q, key_cov = sigma_q.to(torch.float64), key_cov.to(torch.float64)
    with one_thread():  # d × d work: one thread costs nothing and pins the last bits
        w, u = torch.linalg.eigh((sigma_q + sigma_q.T) / 2)
        if not bool(w[0] > 1e-12 * w[-1].abs().clamp_min(1e-300)):
            raise ValueError(f"sigma_q is singular or indefinite (eigenvalues {w[0].item():.3g} .. "
                             f"{w[-1].item():.3g}); pass ridge > 0")
        half = (u * w.sqrt()) @ u.T
        a = half @ key_cov @ half
        lam, v = torch.linalg.eigh((a + a.T) / 2)
        lam, v = lam.flip(0).clamp_min(0.0), v.flip(1)
        return v.T @ half, lam


def kmeans_plusplus(data: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding of ``size`` centers for each of several data sets at once.

    data [..., n, g] -> centers [..., size, g]: the first center uniform, each next one drawn with
    probability proportional to the squared distance to the nearest center so far (Arthur & Vassilvitskii).
    """
    lead, (n, g) = data.shape[:-2], data.shape[-2:]
    x = data.reshape(-1, n, g)
    cols = [np.ascontiguousarray(x[..., j]) for j in range(g)]  # [sets, n] each: fast elementwise passes

    def sq_dist(c: np.ndarray) -> np.ndarray:  # squared distance of every point to c [sets, g]
        out = (cols[0] - c[:, :1]) ** 2
        for j in range(1, g):
            out += (cols[j] - c[:, j:j + 1]) ** 2
        return out

    sets = np.arange(x.shape[0])
    centers = np.empty((x.shape[0], size, g))
    centers[:, 0] = x[sets, rng.integers(n, size=x.shape[0])]
    d2 = sq_dist(centers[:, 0])
    for i in range(1, size):
        cum = np.cumsum(d2, axis=1)
        total = cum[:, -1]
        pick = np.minimum((cum < (rng.random(x.shape[0]) * total)[:, None]).sum(1), n - 1)
        pick = np.where(total > 0, pick, rng.integers(n, size=x.shape[0]))
        centers[:, i] = x[sets, pick]
        np.minimum(d2, sq_dist(centers[:, i]), out=d2)
    return centers.reshape(*lead, size, g)


def kmeans_codebook(data: np.ndarray, size: int, seed: int, iters: int = 20) -> np.ndarray:
    """k-means codebooks of ``size`` centroids, reproducible from ``seed``.

    data [n, g] -> [size, g], or [G, n, g] -> [G, size, g] (one codebook per group). k-means++ seeding
    (:func:`kmeans_plusplus`, numpy ``default_rng(seed)``), then ``iters`` Lloyd iterations of
    ``scipy.cluster.vq.kmeans2(minit="matrix")`` per codebook; a cluster left empty keeps its centroid.
    """
    from scipy.cluster.vq import kmeans2

    data = np.asarray(data, dtype=np.float64)
    if data.ndim not in (2, 3):
        raise ValueError(f"data must be [n, g] or [groups, n, g], got shape {data.shape}")
    if data.shape[-2] < size:
        raise ValueError(f"data must have at least size={size} rows for k-means, got {data.shape[-2]}")
    batched = data if data.ndim == 3 else data[None]
    init = kmeans_plusplus(batched, size, np.random.default_rng(seed))
    books = np.empty_like(init)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "One of the clusters is empty": kept, as documented
        for j in range(batched.shape[0]):
            books[j] = kmeans2(np.ascontiguousarray(batched[j]), init[j], iter=iters, minit="matrix",
                               missing="warn")[0]
    return books if data.ndim == 3 else books[0]


def calibration_rows(x: torch.Tensor, name: str, dim: int) -> torch.Tensor:
    """x [..., dim] as float64 rows [n, dim] on the CPU (calibration runs there: eigh, k-means in numpy)."""
    check_float_tensor(x, name)
    if x.shape[-1] != dim:
        raise ValueError(f"{name}.shape[-1] must equal dim {dim}, got {x.shape[-1]}")
    return x.reshape(-1, dim).to(device="cpu", dtype=torch.float64)


def as_stored(x: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    """x rounded to the stored side dtype and back to float64; refused if it overflows that dtype."""
    out = x.to(dtype).to(torch.float64)
    if not all_finite(out):
        raise ValueError(f"{name} overflows side_dtype={dtype}; pass side_dtype=torch.float32")
    return out


@dataclass(frozen=True)
class NovaCalibration:
    """Calibration of one (layer, KV head), float64 (values already rounded to the stored precision).

    transform: T [d, d], rows in group-major order (row p has eigen-rank ``ranks[p]``); y = T (k − μ).
    inverse: T⁻¹ [d, d] (computed from the stored T). mean: μ_K [d]. codebooks: [G, 2^{g·b}, g].
    eigenvalues: Λ [d] in the same group-major order. ranks: eigen-rank of each coefficient.
    sigma_q: the ridged Σ_Q [d, d] (diagnostics and Parseval; not needed to decode).
    ridge: the absolute ridge added, ρ·tr(E[qqᵀ])/d. n_queries, n_keys: calibration sizes.
    source: ``"data"`` (:meth:`NovaQuantizer.calibrate`) or ``"isotropic prior"`` (:func:`isotropic_calibration`).
    """

    transform: torch.Tensor
    inverse: torch.Tensor
    mean: torch.Tensor
    codebooks: torch.Tensor
    eigenvalues: torch.Tensor
    ranks: torch.Tensor
    sigma_q: torch.Tensor
    ridge: float
    n_queries: int
    n_keys: int
    source: str = "data"

    def group_log_volumes(self) -> torch.Tensor:
        """½ Σ log λ_r over each group's coefficients, [G] (equal volumes ⇔ equal entries)."""
        g = self.codebooks.shape[-1]
        return 0.5 * self.eigenvalues.clamp_min(1e-300).log().reshape(-1, g).sum(-1)


@functools.lru_cache(maxsize=32)
def _isotropic_codebook(dim: int, group_dim: int, size: int, seed: int) -> torch.Tensor:
    groups = dim // group_dim
    n = max(16 * size, 1024)
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn((n + groups - 1) // groups, dim, generator=gen, dtype=torch.float64)
    u = y / (torch.linalg.vector_norm(y, dim=-1, keepdim=True) / math.sqrt(dim))
    book = kmeans_codebook(u.reshape(-1, group_dim)[:n].numpy(), size, seed)
    return torch.from_numpy(book)


def isotropic_calibration(dim: int, bits: int, group_dim: int | None = None, seed: int = 0,
                          side_dtype: torch.dtype = torch.float16) -> NovaCalibration:
    """The calibration NOVA-KV derives with no data: Σ_Q = I, μ_K = 0, C_K = I.

    Then A = I, T = I (y = k), and every group of u = y/RMS(y) has the same law, so all groups share
    one k-means codebook trained on u of standard Gaussian vectors (seeded). This is plain group VQ of
    the raw coordinates; :class:`NovaQuantizer` uses it until :meth:`NovaQuantizer.calibrate` is called.
    """
    g = default_group_dim(bits, dim) if group_dim is None else group_dim
    groups, size = dim // g, 1 << (g * bits)
    book = as_stored(_isotropic_codebook(dim, g, size, seed), side_dtype, "codebooks")
    eye = torch.eye(dim, dtype=torch.float64)
    return NovaCalibration(transform=eye, inverse=eye.clone(), mean=torch.zeros(dim, dtype=torch.float64),
                           codebooks=book.expand(groups, size, g).clone(),
                           eigenvalues=torch.ones(dim, dtype=torch.float64), ranks=torch.arange(dim),
                           sigma_q=eye.clone(), ridge=0.0, n_queries=0, n_keys=0, source="isotropic prior")
