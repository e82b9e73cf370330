"""The tables the claims read: variance and bias per setting with t intervals over sketches, the
TurboQuant error summary, the QJL-vs-JL comparison, the eq. (3) means."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.stats

from kvstats.measure.stats import t_interval
from kvstats.quant.codebooks import beta_codebook
from kvstats.studies.qjl_variance.cells import SPIKY_ROWS, D


def aggregate(table: pd.DataFrame) -> pd.DataFrame:
    """Per (rows, m, cos, d, constant): variance and bias with their t-intervals over sketches, the t-test p of
    "unbiased", the closed forms and the mean ratio."""
    agg = []
    for (rows, m, cos, d, constant), g in table.groupby(["rows", "m", "cos", "d", "constant"]):
        var, bias = t_interval(g["mse"]), t_interval(g["mean_err"])
        v, (vlo, vhi) = var.statistic, var.confidence_interval
        b, (blo, bhi) = bias.statistic, bias.confidence_interval
        agg.append({"rows": rows, "m": m, "cos": cos, "d": d, "constant": constant, "var": v, "var_lo": vlo,
                    "var_hi": vhi, "bias": b, "bias_lo": blo, "bias_hi": bhi,
                    "p_unbiased": float(scipy.stats.ttest_1samp(g["mean_err"], 0.0).pvalue),
                    "qjl_closed_form": (math.pi / 2 - cos**2) / m, "jl_closed_form": (1 + cos**2) / m,
                    "mean_ratio": float(g["mean_ratio"].mean()), "sketches": len(g)})
    return pd.DataFrame(agg)


def method_errors(errs: pd.DataFrame, method: str, bits: int) -> np.ndarray:
    """The error sample of one (method, bits) cell."""
    return np.asarray(errs[(errs["method"] == method) & (errs["bits"] == bits)].iloc[0]["errors"])


def error_summary(errs: pd.DataFrame) -> pd.DataFrame:
    """Per bit width and method: mean error with its t-interval, SD, t-test p of "mean 0", predicted bias."""
    rows = []
    for bits in (1, 2, 3, 4):
        for method in ("turbo_mse", "turbo_prod"):
            e = method_errors(errs, method, bits)
            mean = t_interval(e)
            m, (lo, hi) = mean.statistic, mean.confidence_interval
            rows.append({"method": method, "bits": bits, "mean": m, "ci_low": lo, "ci_high": hi,
                         "sd": float(e.std(ddof=1)), "p_unbiased": float(scipy.stats.ttest_1samp(e, 0).pvalue),
                         "predicted_bias": -0.5 * beta_codebook(D, bits).d_mse if method == "turbo_mse" else 0.0})
    return pd.DataFrame(rows)


def jl_comparison(jl: pd.DataFrame) -> pd.DataFrame:
    """Per cos: mean squared error of QJL and of unquantized JL over the sketches, the paired t-test of the
    per-sketch difference (QJL − JL; the sketches are independent; its mean and sd), the ratio of means and its
    closed form ((π/2) − c²)/(1 + c²) (Gaussian rows, docs/references.md §4)."""
    rows = []
    for (m, cos), g in jl.groupby(["m", "cos"]):
        diff = (g["mse_qjl"] - g["mse_jl"]).to_numpy()
        rows.append({"m": int(m), "cos": float(cos), "sketches": len(g), "var_qjl": float(g["mse_qjl"].mean()),
                     "var_jl": float(g["mse_jl"].mean()), "ratio": float(g["mse_qjl"].mean() / g["mse_jl"].mean()),
                     "ratio_closed_form": (math.pi / 2 - cos**2) / (1 + cos**2), "mean_diff": float(diff.mean()),
                     "sd_diff": float(diff.std(ddof=1)),
                     "p": float(scipy.stats.ttest_1samp(diff, 0.0).pvalue)})
    return pd.DataFrame(rows)


def spiky_means(spiky: pd.DataFrame) -> tuple[dict[str, dict[int, float]], float]:
    """Mean ratio E⟨r, r̂⟩/‖r‖² per rows and sparsity k, and the largest 95% CI half-width."""
    sp = spiky.groupby(["rows", "k"])["ratio"]
    means = {r_: {int(k_): float(v) for (rr, k_), v in sp.mean().items() if rr == r_} for r_ in SPIKY_ROWS}
    return means, float((1.96 * sp.std(ddof=1) / np.sqrt(sp.count())).max())


@dataclass(frozen=True)
class Analysis:
    """What the claims read: the scale's configuration, the estimator's cells (constant filled in) and their
    aggregate, the TurboQuant error summary and the tables of the further rows."""

    cfg: dict
    scale: str
    table: pd.DataFrame
    agg: pd.DataFrame
    err_tab: pd.DataFrame
    spiky: pd.DataFrame
    tails: pd.DataFrame
    thm: pd.DataFrame
    outl: pd.DataFrame
    thm_scaling: pd.DataFrame
    jl: pd.DataFrame
    thm_control: pd.DataFrame

    @property
    def main_tab(self) -> pd.DataFrame:
        """QJL's own sketches (Gaussian and orthogonalised rows) at d = D: every QJL claim reads these."""
        return self.agg[(self.agg["d"] == D) & (self.agg["rows"] != "srht")]

    @property
    def hadamard(self) -> pd.DataFrame:
        """D'Alberto's Hadamard sketch at m = d (his claims only)."""
        return self.agg[self.agg["rows"] == "srht"]

    @property
    def g(self) -> pd.DataFrame:
        return self.main_tab[self.main_tab["rows"] == "gaussian"]

    @property
    def o(self) -> pd.DataFrame:
        return self.main_tab[self.main_tab["rows"] == "orthogonal"]

    @property
    def data_txt(self) -> str:
        return (f"unit pairs with fixed cos∠(q, k), d = {D}; {self.cfg['sketches']} independent sketches × "
                f"{self.cfg['pairs']} pairs per point ({self.scale} scale)")
