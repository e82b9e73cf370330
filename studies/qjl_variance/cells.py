"""The study's declarations and its cells: the QJL estimator's error per sketch (and against unquantized JL),
TurboQuant's inner-product errors, eq. (3) on sparse vectors, Lemma 3.5's tails, Theorem 3.6's scores, the outlier
sketch, the bit accounting."""

from __future__ import annotations

import math

import numpy as np
import torch

from kvstats.quant.quantizers import quantizer
from kvstats.quant.sphere import sample_sphere
from kvstats.study.sweep import cell_seed, grid

STUDY = "qjl_variance"
VERSION = "5"  # 3: variance cells of the Hadamard sketch (rows="srht", m = d); 4: Lemma 3.5 per sketch, δ = 0.01;
# 5: Theorem 3.6's cells keep each sketch's largest deviation, a constant-m control arm, 1000 sketches (paper)
D = 128
M_VALUES = (32, 64, 128, 256, 512)
COS_VALUES = (0.0, 0.3, 0.6, 0.8, 0.95)
M_AT_COS = 128
COS_AT_M = 0.3
# theorem_trials: 0 failures in N sketches give a two-sided 95% Clopper–Pearson upper bound 1 − 0.025^{1/N} ≈ 3.69/N
# on the failure probability; deciding "≤ 1/n" at n = 256 needs N ≥ 944 (planned by power; issue 48, item 4).
# scaling_trials: sketches per cell of Theorem 3.6's scaling grid and its control arm; the scaling claim's TOST on the
# log ratio of m* within ±log 1.25 plans 84 per cell from the spread of the 1000-sketch cells (issue 50): 200 keep a
# margin of 2.4× over that plan at a fifth of the cost
SCALE = {"quick": {"sketches": 30, "pairs": 128, "scale_sketches": 100, "err_vectors": 2000, "tail_trials": 20,
                   "outlier_reps": 10, "spiky_sketches": 20, "theorem_trials": 100, "scaling_trials": 100},
         "paper": {"sketches": 300, "pairs": 512, "scale_sketches": 1000, "err_vectors": 20000, "tail_trials": 100,
                   "outlier_reps": 20, "spiky_sketches": 50, "theorem_trials": 1000, "scaling_trials": 200}}
ALPHA = 0.05
SPARSITY = (1, 2, 4, 8, 32, 128)  # nonzeros of r, spiky (1) to flat (d = 128)
SPIKY_ROWS = ("srht", "gaussian")
SPIKY_PAIRS = 64  # vectors r per sketch
UNBIASED_ATOL = 0.02  # |E⟨r, r̂⟩/‖r‖² − 1| ≤ 2% is called unbiased (Monte Carlo SE ≤ 0.003 at quick scale)
#: (ε, δ): the lemma at its usual δ and at δ = 0.01, where the tail it allows is small and a violation is not marginal
LEMMA_35 = ((0.3, 0.1), (0.2, 0.05), (0.1, 0.1), (0.3, 0.01), (0.2, 0.01))
THEOREM_36 = {"r": 1.0, "n": 256, "eps": (0.2, 0.1)}
#: Theorem 3.6's scaling: m = ⌈2r²ε⁻² log n⌉ over n keys and dimensions d (the theorem's m does not depend on d);
#: the control arm holds m at the smallest n's value for every n (at d = D), where the scaling rule must fail
THEOREM_36_SCALING = {"eps": 0.2, "keys": (64, 256, 1024, 4096), "d": (64, 128, 256)}
#: The equivalence margin of the scaling claim: the sketch size a fixed error needs, m·(deviation)² per log n,
#: may differ by a factor up to 1.25 between the smallest and largest n (or d) and still count as "the same"
SCALING_MARGIN = 1.25
TAIL_PAIRS = 512
OUTLIER_DATA = {"outlier_channels": 8}
OUTLIER_SCALES = (5.0, 10.0)
OUTLIER_KEYS, OUTLIER_QUERIES, OUTLIER_M_TOTAL = 256, 16, 2 * D  # equal sign-bit budget: m + outlier_m = 2d
QJL_BITS = {"m": 3 * D, "outliers": 8, "norm_dtype": "float16"}  # QJL's 3-bit setting as read here


def unit_pairs(n: int, d: int, cos: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n unit pairs (q, k) with ⟨q, k⟩ = cos exactly, k uniform on the sphere, q's orthogonal part uniform."""
    k = sample_sphere(n, d, seed=seed)
    u = torch.randn(n, d, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    u = u - (u * k).sum(-1, keepdim=True) * k
    u = u / torch.linalg.vector_norm(u, dim=-1, keepdim=True)
    return cos * k + math.sqrt(1 - cos * cos) * u, k


def paired_inner(quant, q: torch.Tensor, k: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Prod(qᵢ, kᵢ) for paired rows [n, d] -> [n] (float64): the diagonals of [block, block] estimates over n/block
    groups (the kernels handle a few groups of many keys far faster than many groups of one)."""
    n, d = q.shape
    b = block if n % block == 0 else n
    est = quant.inner(q.reshape(n // b, b, d), quant.encode(k.reshape(n // b, b, d)))
    return torch.diagonal(est, dim1=-2, dim2=-1).reshape(n).double()


def cell(rows: str, m: int, cos: float, d: int, sketches: int, pairs: int, constant: str = "exact") -> list[dict]:
    """One row per sketch seed: mean error and mean squared error over ``pairs`` pairs."""
    out = []
    for s in range(sketches):
        q, k = unit_pairs(pairs, d, cos, cell_seed(STUDY, "pairs", d, cos, pairs, s))
        quant = quantizer("qjl", dim=d, m=m, rows=rows, seed=cell_seed(STUDY, "sketch", rows, m, d, s))
        if constant == "gaussian":  # the Gaussian constant √(π/2) on spherical rows (biased, docs/references.md §4)
            quant.sketch.scale = math.sqrt(math.pi / 2)
        est = paired_inner(quant, q, k)
        err = est - cos
        out.append({"sketch": s, "mean_err": float(err.mean()), "mse": float(err.pow(2).mean()),
                    "mean_ratio": float((est / cos).mean()) if cos else math.nan})
    return out


def jl_cell(m: int, cos: float, d: int, sketches: int, pairs: int) -> list[dict]:
    """QJL against the unquantized JL estimator (1/m)⟨S q, S k⟩ on the same Gaussian S and the same pairs: one
    row per sketch seed with both mean squared errors (paired by sketch)."""
    out = []
    for s in range(sketches):
        q, k = unit_pairs(pairs, d, cos, cell_seed(STUDY, "jl-pairs", d, cos, pairs, s))
        quant = quantizer("qjl", dim=d, m=m, rows="gaussian", seed=cell_seed(STUDY, "jl-sketch", m, d, s))
        sk = quant.sketch.matrix(q.device, torch.float64)  # [m, d], the rows QJL signs
        jl = ((q @ sk.T) * (k @ sk.T)).sum(-1) / m
        est = paired_inner(quant, q, k)
        out.append({"sketch": s, "mse_qjl": float((est - cos).pow(2).mean()),
                    "mse_jl": float((jl - cos).pow(2).mean())})
    return out


def error_cell(method: str, bits: int, d: int, vectors: int) -> list[dict]:
    """Errors ⟨y, x̂⟩ − ⟨y, x⟩ for unit x uniform, ⟨y, x⟩ = 0.5 (one quantizer seed per 100 vectors)."""
    errs = []
    for chunk in range(0, vectors, 100):
        y, x = unit_pairs(100, d, 0.5, cell_seed(STUDY, "errpairs", d, chunk))
        quant = quantizer(method, bits=bits, dim=d, seed=cell_seed(STUDY, "errq", method, bits, chunk))
        errs.append(quant.inner(y[:, None, :].float(), quant.encode(x[:, None, :].float()))[:, 0, 0].double() - 0.5)
    e = torch.cat(errs).numpy()
    return [{"errors": np.round(e, 6).tolist(), "mean": float(e.mean()), "sd": float(e.std(ddof=1))}]


def sparse_unit(n: int, d: int, k: int, seed: int) -> torch.Tensor:
    """n unit vectors with k nonzero entries ±1/√k on a uniformly random support (k = 1: ±e_i; k = d: flat)."""
    g = torch.Generator().manual_seed(seed)
    support = torch.rand(n, d, generator=g).argsort(-1)[:, :k]
    signs = torch.where(torch.rand(n, k, generator=g) < 0.5, -1.0, 1.0).double()
    return torch.zeros(n, d, dtype=torch.float64).scatter_(1, support, signs / math.sqrt(k))


def spiky_cell(rows: str, k: int, d: int, sketches: int, pairs: int) -> list[dict]:
    """E⟨r, r̂⟩/‖r‖² = Prod(r, r) for unit r with k nonzeros: one row per sketch (mean over ``pairs`` vectors)."""
    out = []
    for s in range(sketches):
        r = sparse_unit(pairs, d, k, cell_seed(STUDY, "spiky-r", d, k, s)).float()
        quant = quantizer("qjl", dim=d, m=d, rows=rows, seed=cell_seed(STUDY, "spiky-q", rows, d, s))
        out.append({"sketch": s, "ratio": float(paired_inner(quant, r, r).mean())})
    return out


def lemma35_m(eps: float, delta: float) -> int:
    """QJL Lemma 3.5's sketch size m = ⌈(4/3)(1 + ε)ε⁻² log(2/δ)⌉."""
    return math.ceil(4 / 3 * (1 + eps) / eps**2 * math.log(2 / delta))


def theorem36_m(r: float, eps: float, n: int) -> int:
    """QJL Theorem 3.6's sketch size m = ⌈2r²ε⁻² log n⌉."""
    return math.ceil(2 * r * r / eps**2 * math.log(n))


def control_m() -> int:
    """The control arm's constant sketch size: the theorem's m at the smallest n of the scaling grid."""
    return theorem36_m(THEOREM_36["r"], THEOREM_36_SCALING["eps"], min(THEOREM_36_SCALING["keys"]))


def tail_cell(eps: float, delta: float, d: int, trials: int) -> list[dict]:
    """Lemma 3.5: count of |Prod − ⟨q, k⟩| > ε‖q‖‖k‖ over trials × TAIL_PAIRS unit pairs (q, k uniform, independent),
    Gaussian rows, a fresh sketch per trial."""
    m, hits = lemma35_m(eps, delta), []
    for t in range(trials):
        q = sample_sphere(TAIL_PAIRS, d, seed=cell_seed(STUDY, "tail-q", d, t)).float()
        k = sample_sphere(TAIL_PAIRS, d, seed=cell_seed(STUDY, "tail-k", d, t)).float()
        quant = quantizer("qjl", dim=d, m=m, rows="gaussian", seed=cell_seed(STUDY, "tail-s", eps, delta, t))
        est = paired_inner(quant, q, k)
        hits.append(int(((est - (q.double() * k.double()).sum(-1)).abs() > eps).sum()))
    return [{"m": m, "hits": sum(hits), "n": trials * TAIL_PAIRS, "hits_per_sketch": hits}]


def scores_cell(eps: float, d: int, trials: int, keys: int | None = None, sketch_m: int | None = None) -> list[dict]:
    """Theorem 3.6: per trial (a fresh sketch, one query, n = ``keys`` keys (default THEOREM_36's), all of norm
    r), the largest |ŝᵢ/sᵢ − 1| of the softmax scores sᵢ ∝ exp⟨q, kᵢ⟩ with estimated inner products; failure when
    it exceeds 3ε. ``sketch_m`` replaces the theorem's m (the constant-m control arm)."""
    r, n = THEOREM_36["r"], THEOREM_36["n"] if keys is None else keys
    m, worst = theorem36_m(r, eps, n) if sketch_m is None else sketch_m, []
    for t in range(trials):
        q = r * sample_sphere(1, d, seed=cell_seed(STUDY, "thm-q", d, t)).float()
        k = r * sample_sphere(n, d, seed=cell_seed(STUDY, "thm-k", d, t)).float()
        quant = quantizer("qjl", dim=d, m=m, rows="gaussian", seed=cell_seed(STUDY, "thm-s", eps, t))
        est = quant.inner(q[None], quant.encode(k[None]))[0, 0].double()
        ref = (k.double() @ q.double()[0])
        worst.append(float((torch.softmax(est, 0) / torch.softmax(ref, 0) - 1).abs().max()))
    w = np.asarray(worst)
    return [{"m": m, "failures": int((w > 3 * eps).sum()), "n": trials, "max_dev": float(w.max()),
             "median_dev": float(np.median(w)), "keys": n, "worst_per_sketch": [round(x, 6) for x in worst]}]


def outlier_cell(outlier_scale: float, rep: int) -> list[dict]:
    """Mean squared inner-product error of QJL (Gaussian rows) on keys with outlier channels, at equal sign bits:
    one sketch of OUTLIER_M_TOTAL rows vs the split (outliers = the channels of largest mean |k| in the batch,
    8 rows per outlier channel, the rest on the inliers)."""
    from kvstats.data.synthetic import generate

    q, k, _ = generate("gaussian", 1, 1, OUTLIER_KEYS, D, cell_seed(STUDY, "outlier-data", outlier_scale, rep),
                       n_q=OUTLIER_QUERIES, outlier_scale=outlier_scale, **OUTLIER_DATA)
    ref = (q.double() @ k.double().transpose(-1, -2))
    c = OUTLIER_DATA["outlier_channels"]
    idx = torch.argsort(k[0, 0].abs().mean(0), descending=True)[:c].tolist()
    out = {}
    for split in (False, True):
        kw = ({"m": OUTLIER_M_TOTAL - 8 * c, "outliers": idx, "outlier_m": 8 * c} if split else
              {"m": OUTLIER_M_TOTAL})
        quant = quantizer("qjl", dim=D, rows="gaussian", seed=cell_seed(STUDY, "outlier-q", split, rep), **kw)
        est = quant.inner(q, quant.encode(k)).double()
        out["split" if split else "single"] = float((est - ref).pow(2).mean())
        out[f"bits_{'split' if split else 'single'}"] = quant.bits_per_coordinate().total
    return [out]


def qjl_bits() -> dict[str, float]:
    """Bits per key coordinate of QJL_BITS (kvstats BitBudget): without and with the outlier split (the same
    3 sign bits per coordinate in total), and the compression against fp16."""
    dt = getattr(torch, QJL_BITS["norm_dtype"])
    c, m = QJL_BITS["outliers"], QJL_BITS["m"]
    plain = quantizer("qjl", dim=D, m=m, norm_dtype=dt).bits_per_coordinate()
    split = quantizer("qjl", dim=D, m=m * (D - c) // D, outliers=list(range(c)), outlier_m=m * c // D,
                      norm_dtype=dt).bits_per_coordinate()
    return {"plain_payload": plain.payload, "plain_total": plain.total, "plain_side": plain.side,
            "split_payload": split.payload, "split_total": split.total, "split_side": split.side,
            "plain_ratio": 16 / plain.total, "split_ratio": 16 / split.total}


def variance_cells(cfg: dict) -> list[dict]:
    """The estimator's cells: Gaussian and orthogonal rows vs m at COS_AT_M and vs cos at M_AT_COS (d = D), the
    Hadamard sketch (rows='srht') at m = d vs cos, and the constant check at d = 64, m = 64, q = k (exact and
    Gaussian constants on orthogonal rows)."""
    common = {"d": D, "sketches": cfg["sketches"], "pairs": cfg["pairs"]}
    return (grid(rows=["gaussian", "orthogonal"], m=list(M_VALUES), cos=COS_AT_M, **common) +
            grid(rows=["gaussian", "orthogonal"], m=M_AT_COS, cos=[c for c in COS_VALUES if c != COS_AT_M], **common) +
            # D'Alberto's Hadamard sketch at his m = d (his √(π/2) claim is verdicted on it)
            grid(rows="srht", m=D, cos=list(COS_VALUES), **common) +
            grid(rows="orthogonal", m=64, cos=1.0, d=64, sketches=cfg["scale_sketches"], pairs=cfg["pairs"],
                 constant=["exact", "gaussian"]))
