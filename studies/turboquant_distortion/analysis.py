"""The summary table (one row per bit width: measured, exact, printed, bounds) and the paired 2π ratios."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.stats

from kvstats.measure.inference import orthogonal_sketch_prod_distortion, turbo_prod_distortion
from kvstats.measure.stats import log_ratio_t_interval
from kvstats.quant.codebooks import gaussian_codebook
from kvstats.studies.turboquant_distortion.cells import (
    ALPHA,
    BITS,
    PRINTED_DMSE,
    PRINTED_DPROD_TIMES_D,
    D,
    exact_dmse,
    exact_dprod,
)


def summary(table: pd.DataFrame, method: str, column: str) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Mean of ``column`` per bit width for ``method`` with its 95% t-interval over replicates."""
    g = table[table["method"] == method].groupby("bits")[column]
    n = g.count()
    mean, sd = g.mean(), g.std()
    t = scipy.stats.t.ppf(0.975, n - 1)
    return mean, mean - t * sd / np.sqrt(n), mean + t * sd / np.sqrt(n)


def bits_row(table: pd.DataFrame, b: int) -> dict:
    """One row of the summary table: exact, printed and bound values at b, the measured means and CIs."""
    r = {"bits": b, "d": D, "exact_d_mse": exact_dmse(D, b), "gaussian_limit_d_mse": gaussian_codebook(b).d_mse,
         "exact_d_prod_x_d": D * exact_dprod(D, b), "printed_d_mse": PRINTED_DMSE.get(b, math.nan),
         "printed_d_prod_x_d": PRINTED_DPROD_TIMES_D.get(b, math.nan),
         "lower_d_mse": 4.0**-b, "upper_d_mse": math.sqrt(3) * math.pi / 2 * 4.0**-b,
         "lower_d_prod_x_d": 4.0**-b, "upper_d_prod_x_d": math.sqrt(3) * math.pi**2 * 4.0**-b}
    for method in ("turbo_mse", "turbo_prod"):
        for col in ("d_mse", "d_prod_x_d", "d_prod_parallel_x_d"):
            m, lo, hi = (s[b] for s in summary(table, method, col))
            r[f"{method}_{col}"], r[f"{method}_{col}_lo"], r[f"{method}_{col}_hi"] = m, lo, hi
    prod = table[(table["method"] == "turbo_prod") & (table["bits"] == b)]
    a = float(prod["residual_parallel2"].mean())
    r["exact_d_prod_parallel_x_d"] = D * turbo_prod_distortion(exact_dmse(D, b - 1), D, cos2=1.0,
                                                               residual_parallel2=min(a, exact_dmse(D, b - 1)))
    return r


def paired_ratios(table: pd.DataFrame, prod: str = "turbo_prod") -> dict[int, tuple[float, float, float]]:
    """``prod`` / turbo_mse d·D_prod per b ≥ 2, paired by replicate: (geometric-mean ratio, its CI at 1 − ALPHA)
    (:func:`kvstats.stats.log_ratio_t_interval`: a t interval on the log ratios)."""
    ratios = {}
    for b_ in BITS[1:]:
        sub = table[table["bits"] == b_].pivot(index="rep", columns="method", values="d_prod_x_d")
        r = log_ratio_t_interval(sub[prod].to_numpy(), sub["turbo_mse"].to_numpy(), 1 - ALPHA)
        ratios[b_] = (r.statistic, *r.confidence_interval)
    return ratios


def two_pi_closed_form(sketch: str, b: int) -> float:
    """The closed-form ratio d·D_prod(turbo_prod(b)) / d·D_mse(turbo_mse(b)) for y independent of x: Gaussian rows
    (π/2 − 1/d)·D_mse(b−1)/D_mse(b); the Hadamard sketch (orthogonal rows, m = d) its own factor
    (:func:`kvstats.inference.orthogonal_sketch_prod_distortion`, ≈ π/2 − 1)."""
    prev = exact_dmse(D, b - 1)
    prod = orthogonal_sketch_prod_distortion(prev, D) if sketch == "srht" else turbo_prod_distortion(prev, D)
    return prod / (exact_dmse(D, b) / D)


@dataclass(frozen=True)
class Analysis:
    """What the figures and claims read: the scale's configuration, the summary table (one row per b), the
    worst-case errors' mean and sd per (rotation, vector), the paired 2π ratios, the split configuration's bits
    per coordinate per norm dtype and the outlier errors per configuration (by replicate)."""

    cfg: dict
    scale: str
    tab: pd.DataFrame
    worst_mean: pd.Series
    worst_sd: pd.Series
    ratios: dict[str, dict[int, tuple[float, float, float]]]
    split_cost: dict[str, dict[str, float]]
    outlier_errors: dict[str, np.ndarray]

    @property
    def t4(self) -> pd.DataFrame:
        """The rows TurboQuant prints (b ≤ 4)."""
        return self.tab[self.tab["bits"] <= 4]

    @property
    def data_text(self) -> str:
        return (f"unit vectors uniform on S^{D - 1}, d = {D}, {self.cfg['reps']} replicates (fresh rotation/sketch "
                f"seeds) × {self.cfg['vectors']} vectors per bit width ({self.scale} scale)")
