"""Study: the law of a sphere coordinate, its Gaussian limit, and the exact Lloyd–Max codebooks.

    python studies/sphere_law.py --scale quick|paper [--scheduler ADDR]

Writes (each figure's data beside it in figures/data/<name>.csv):
  figures/sphere_law_density.png          f_d over histograms of sampled coordinates and N(0, 1/d)
  figures/sphere_law_gaussian_distance.png TV and KL(f_d ‖ N(0, 1/d)) against d
  figures/sphere_law_codebook_convergence.png  √d · levels of the exact codebook against d, → Gaussian levels
  figures/data/sphere_law_turboquant_dmse_table.csv  D_mse at d = 128: exact, Gaussian limit, TurboQuant's printed

Everything here is closed-form or a cheap solve; the only sampling is the histograms. Each figure's numbers
come from kvstats.study.sweep cells (per dimension, per bit width), run and stored like every study's.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from kvstats import study
from kvstats.measure import verdicts  # noqa: E402
from kvstats.quant.codebooks import beta_codebook, gaussian_codebook  # noqa: E402
from kvstats.quant.sphere import coordinate_law, gaussian_limit_distance, goodness_of_fit, sample_sphere  # noqa: E402
from kvstats.study import plots
from kvstats.study.claims import Claim, listing  # noqa: E402
from kvstats.study.paths import figure_path  # noqa: E402
from kvstats.study.sample_plans import EXACT, hardest, ks_equivalence_sample  # noqa: E402
from kvstats.study.sweep import grid  # noqa: E402

STUDY = "sphere_law"
VERSION = "2"
SCALE = {"quick": {"n_vectors": 20_000, "max_dim": 32768, "n_dims": 25, "max_codebook_dim": 1024},
         "paper": {"n_vectors": 200_000, "max_dim": 2**20, "n_dims": 61, "max_codebook_dim": 32768}}
#: The scales this study runs at: its claims are decided at paper scale (synthetic draws, seconds to minutes), so the
#: full tier adds nothing to it (docs/studies.md, "Tiers").
SCALES = ("quick", "paper")
CODEBOOK_DIMS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 4096, 32768)
DENSITY_DIMS = (2, 3, 4, 8, 16, 1024)
POSITION = 10  # place in figures/REPORT.md (kvstats.study.report.study_order)
PRINTED_DMSE = {1: 0.36, 2: 0.117, 3: 0.03, 4: 0.009}  # TurboQuant (arXiv 2504.19874), as printed
MAX_1960_MSE = {1: 0.3634, 2: 0.1175, 3: 0.03454, 4: 0.009497}  # Max (1960), table; docs/references.md §2
ALPHA = 0.05  # level of the KS fit (each end of the distance's interval) and the family-wise level of the KS tests
#: "follows f_d": the true Kolmogorov distance to f_d below 0.02 (an equivalence margin, decidable at both scales;
#: a coordinate law 10% off in scale is outside it (0.024 at d ≥ 8), as is N(0, 1/d) at d = 2 (0.097))
KS_MARGIN = 0.02
TV_ASYMPTOTE = 0.3501  # d·TV(f_d, N(0, 1/d)) → 0.3501 (docs/references.md §1)
RTOL_TV = 0.02  # the asymptote holds within 2% at the largest d shown (1.8% at d = 64)
RTOL_MAX = 0.005  # "about 3 significant digits"
RTOL_LEVELS = 0.01  # large-d codebook levels within 1% of the Gaussian ones; small-d gap at least 1%
SMALL_D = 8


# ----------------------------------------------------------------------------------------------- the cells


def density_cell(d: int, n_vectors: int) -> list[dict]:
    """Histogram of one coordinate of ``n_vectors`` uniform points on S^{d−1}, with f_d and N(0, 1/d) per bin."""
    law, gauss = coordinate_law(d), stats.norm(0, d**-0.5)
    # one coordinate per vector: the histogram's draws are then i.i.d. from f_d
    x = sample_sphere(n_vectors, d, seed=d)[:, 0].numpy()
    half = 1.0 if d <= 16 else 5.0 / math.sqrt(d)
    bins = np.linspace(-half, half, 61)
    hist, _ = np.histogram(x, bins=bins, density=True)
    centres = 0.5 * (bins[1:] + bins[:-1])
    gof = goodness_of_fit(x, d, method="ks")
    return [{"bin_centre": c, "bin_width": w, "histogram_density": h, "f_d": law.pdf(c), "gaussian": gauss.pdf(c),
             "ks": gof.statistic, "ks_p": gof.pvalue}
            for c, w, h in zip(centres, np.diff(bins), hist)]


def distance_cell(d: int) -> list[dict]:
    """Total variation and KL from f_d to N(0, 1/d) (quadrature), with their large-d asymptotes."""
    row = gaussian_limit_distance(d).to_dict()
    row.pop("d", None)
    return [row | {"tv_asymptote_0.350/d": 0.3501 / d, "kl_asymptote_3/(4d^2)": 0.75 / d**2}]


def codebook_cell(bits: int, d: int) -> list[dict]:
    """√d × the positive levels of the exact b-bit codebook of f_d, beside the Gaussian codebook's."""
    g, cb, half = gaussian_codebook(bits), beta_codebook(d, bits), 2 ** (bits - 1)
    return [{"level_index": j + 1, "sqrt_d_level": float(cb.levels[half + j] * math.sqrt(d)),
             "gaussian_level": float(g.levels[half + j]), "d_mse": cb.d_mse, "gaussian_d_mse": g.d_mse}
            for j in range(half)]


def dmse_cell(bits: int, d: int) -> list[dict]:
    """D_mse at (d, b): exact codebook, Gaussian limit, TurboQuant's printed value, and the bounds."""
    exact = beta_codebook(d, bits).d_mse
    limit = gaussian_codebook(bits).d_mse
    printed = PRINTED_DMSE[bits]
    return [{"exact_d_mse": exact, "gaussian_limit_d_mse": limit, "printed_d_mse": printed,
             "rel_diff_printed_vs_exact": (printed - exact) / exact, "rel_diff_limit_vs_exact": (limit - exact) / exact,
             "lower_bound_4^-b": 4.0**-bits, "upper_bound_sqrt3pi/2_4^-b": math.sqrt(3) * math.pi / 2 * 4.0**-bits}]


# --------------------------------------------------------------------------------------------- the figures


def _save(fig, name: str) -> None:
    fig.savefig(figure_path(name), dpi=130)
    plt.close(fig)


def density_figure(table: pd.DataFrame) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5))
    for ax, d in zip(axes.flat, DENSITY_DIMS):
        rows = table[table["d"] == d].sort_values("bin_centre")
        law, gauss = coordinate_law(d), stats.norm(0, d**-0.5)
        ax.bar(rows["bin_centre"], rows["histogram_density"], width=rows["bin_width"], color="#c6dbef",
               edgecolor="#6baed6", lw=0.4, label=f"histogram, n = {int(rows['n_vectors'].iloc[0]):,}")
        half = float(rows["bin_centre"].max() + rows["bin_width"].iloc[-1] / 2)
        t = np.linspace(-half, half, 801)[1:-1]
        ax.plot(t, law.pdf(t), color="#08519c", lw=2, label="$f_d$ (exact)")
        ax.plot(t, gauss.pdf(t), color="#e6550d", lw=1.5, ls="--", label="N(0, 1/d)")
        ax.set_title(f"d = {d}")
        ax.set_xlabel("coordinate t")
        ax.set_ylabel("density")
        if d == 2:
            ax.set_ylim(0, 3.0)
        ax.legend(fontsize=8, loc="best", framealpha=0.9)
    fig.suptitle("Law of one coordinate of a uniform point on $S^{d-1}$: exact $f_d$ vs its Gaussian limit")
    fig.tight_layout()
    _save(fig, "sphere_law_density")


def distance_figure(table: pd.DataFrame) -> None:
    table = table.sort_values("d")
    d, tv, kl = table["d"].to_numpy(dtype=float), table["total_variation"], table["kl"]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ax.loglog(d, tv, "o-", color="#08519c", label="total variation")
    ax.loglog(d, kl, "s-", color="#e6550d", label="KL($f_d$ ‖ N(0, 1/d)) [nats]")
    ax.loglog(d, 0.3501 / d, ":", color="#08519c", alpha=0.7, label="0.350 / d")
    ax.loglog(d, 0.75 / d**2, ":", color="#e6550d", alpha=0.7, label="3 / (4 d²)")
    ax.set_xlabel("dimension d")
    ax.set_ylabel("distance")
    ax.set_title("Distance from the sphere-coordinate law $f_d$ to N(0, 1/d)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    _save(fig, "sphere_law_gaussian_distance")


def convergence_figure(table: pd.DataFrame) -> None:
    bits_list = sorted(table["bits"].unique())
    fig, axes = plt.subplots(1, len(bits_list), figsize=(6.5 * len(bits_list), 5))
    for ax, bits in zip(np.atleast_1d(axes), bits_list):
        sub = table[table["bits"] == bits]
        half = 2 ** (bits - 1)
        colours = plt.cm.viridis(np.linspace(0, 0.85, half))
        for j in range(half):
            lev = sub[sub["level_index"] == j + 1].sort_values("d")
            ax.semilogx(lev["d"], lev["sqrt_d_level"], "o-", ms=3, color=colours[j], label=f"level {j + 1}")
            ax.axhline(lev["gaussian_level"].iloc[0], color=colours[j], ls="--", lw=1)
        ax.plot([], [], "k--", lw=1, label="Gaussian limit (Max)")
        ax.set_xlabel("dimension d")
        ax.set_ylabel("√d × positive level")
        ax.set_title(f"{bits}-bit exact codebook of $f_d$, scaled by √d")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Exact Lloyd–Max codebooks of $f_d$ converge to the Gaussian codebook / √d")
    fig.tight_layout()
    _save(fig, f"{STUDY}_codebook_convergence")


def sphere_law_verdict(ks: dict, n: int, d_max: int, tv_max: float) -> verdicts.Verdict:
    """(1) every histogram's sample follows f_d within KS_MARGIN in Kolmogorov distance (equivalence rule on the
    distance's interval, kvstats.measure.verdicts.ks_equivalence); (2) the Gaussian limit: d·TV at the largest d
    equals the asymptote 0.3501 within RTOL_TV (identity rule, exact quadrature). Combined."""
    fit = verdicts.ks_equivalence(list(ks.values()), [n] * len(ks), KS_MARGIN, alpha=ALPHA, what="dimensions")
    limit = verdicts.identity([d_max * tv_max], TV_ASYMPTOTE, rtol=RTOL_TV, what=f"d·TV at d = {d_max}")
    return verdicts.combine([fit, limit])


def codebook_verdict(large_levels, gaussian_levels, small_gap: float) -> verdicts.Verdict:
    """(1) √d × the exact levels at the largest d within RTOL_LEVELS of the Gaussian levels (identity rule);
    (2) at d = SMALL_D the outer level is at least RTOL_LEVELS off (bound rule, exact numbers). Combined."""
    near = verdicts.identity(list(large_levels), list(gaussian_levels), rtol=RTOL_LEVELS,
                             what="levels at the largest d")
    small = verdicts.bound([abs(small_gap)], [(abs(small_gap), abs(small_gap))], RTOL_LEVELS, upper=False,
                           what=f"relative gaps of the outer level at d = {SMALL_D}")
    return verdicts.combine([near, small])


def definitions(cfg: dict, scale: str) -> dict[str, str]:
    """The study's terms, generated from its configuration constants."""
    return {
        "f_d": "law of one coordinate of a uniform point on S^{d−1}: Beta((d−1)/2, (d−1)/2) on [−1, 1] "
               "(kvstats.quant.sphere.coordinate_law)",
        "histograms": f"first coordinate of {cfg['n_vectors']} uniform points on S^{{d−1}} per d in {DENSITY_DIMS} "
                      f"(one coordinate per vector: i.i.d. draws); KS distance to f_d with its interval for the true "
                      f"distance (Kolmogorov's law, level {1 - ALPHA:g}) against the margin {KS_MARGIN} "
                      f"({scale} scale)",
        "distances": f"total variation and KL(f_d ‖ N(0, 1/d)) by quadrature at {cfg['n_dims']} dimensions from 2 to "
                     f"{cfg['max_dim']}; asymptotes {TV_ASYMPTOTE}/d and 3/(4d²)",
        "codebooks": f"exact b-bit Lloyd–Max codebooks of f_d (kvstats.quant.codebooks.beta_codebook), b = 2, 3, d up "
                     f"to {cfg['max_codebook_dim']}; Gaussian codebooks by Newton (gaussian_codebook)",
    }


@dataclass(frozen=True)
class Analysis:
    """What the claims read: the scale's configuration, the dimensions swept, the D_mse rows at d = 128 and
    the KS distance of each histogram."""

    cfg: dict
    scale: str
    dist_dims: list[int]
    conv_dims: list[int]
    dmse_rows: list[dict]
    ks: dict[int, float]


def gaussian_limit_claim(a: Analysis) -> Claim:
    dist = [gaussian_limit_distance(d) for d in (a.dist_dims[0], 1024, a.dist_dims[-1])]
    n = a.cfg["n_vectors"]
    return Claim(
        id="sphere-law-gaussian-limit",
        claim="A coordinate of a uniform point on S^{d−1} has density f_d (Beta((d−1)/2, (d−1)/2) on [−1, 1]): "
              "arcsine at d = 2, uniform at d = 3, → N(0, 1/d) as d grows.",
        source="D'Alberto, arXiv 2605.08114, §1 eq. (1); docs/references.md §1",
        measurement=("KS distance of the histogram samples to f_d: " + listing(a.ks.items(), "d = {}: {:.4f}")
                     + f" (n = {n:,} draws each: the true distance is within "
                     f"{stats.kstwo.isf(ALPHA, n):.4f} of it at level {1 - ALPHA:g}, margin {KS_MARGIN}); "
                     f"total variation to N(0, 1/d): {dist[0].total_variation:.3f} at d = {dist[0].d}, "
                     f"{dist[1].total_variation:.2e} at d = 1024, {dist[2].total_variation:.1e} at d = {dist[2].d} "
                     "(≈ 0.350/d); KL ≈ 3/(4d²)."),
        data=f"closed-form densities (quadrature); histograms of sampled coordinates ({a.scale} scale)",
        verdict=sphere_law_verdict(a.ks, n, dist[2].d, dist[2].total_variation),
        sample=hardest([ks_equivalence_sample(n, margin=KS_MARGIN, alpha=ALPHA, unit="draws per d",
                                              effect_words=f"the margin {KS_MARGIN:g} in Kolmogorov distance with the "
                                                           "draws from f_d (true distance 0)"), EXACT]),
        figure="sphere_law_gaussian_distance.png")


def lloyd_max_claim(a: Analysis) -> Claim:
    gauss = {b: gaussian_codebook(b).d_mse for b in MAX_1960_MSE}
    worst = max(abs(gauss[b] / MAX_1960_MSE[b] - 1) for b in MAX_1960_MSE)
    return Claim(
        id="lloyd-max-gaussian-table",
        claim="Max (1960): the b-bit Lloyd–Max quantizer of N(0, 1) has MSE 0.3634, 0.1175, 0.03454, 0.009497 "
              "at b = 1..4 (a correct solver agrees to about 3 significant digits).",
        source="Max 1960, IRE Trans. Inform. Theory IT-6, table I; docs/references.md §2",
        measurement=("exact solver: " + listing(gauss.items(), "b={}: {:.6f}")
                     + f"; largest relative difference {100 * worst:.2f}%."),
        data="Newton-solved Lloyd–Max codebooks (kvstats.quant.codebooks.gaussian_codebook)",
        verdict=verdicts.identity([gauss[b] for b in MAX_1960_MSE], [MAX_1960_MSE[b] for b in MAX_1960_MSE],
                                  rtol=RTOL_MAX, what="bit widths"),
        sample=EXACT)


def codebook_claim(a: Analysis) -> Claim:
    conv = {d: math.sqrt(d) * beta_codebook(d, 2).levels[-1] for d in (SMALL_D, 128, 1024)}
    d_big = max(a.conv_dims or [1024])
    large = [math.sqrt(d_big) * v for b in (2, 3) for v in beta_codebook(d_big, b).levels]
    glev = [v for b in (2, 3) for v in gaussian_codebook(b).levels]
    gap = conv[SMALL_D] / gaussian_codebook(2).levels[-1] - 1
    return Claim(
        id="codebook-gaussian-limit",
        claim="The exact codebook of f_d approaches the Gaussian codebook scaled by 1/√d at large d, and must "
              "be solved on f_d itself at small d.",
        source="TurboQuant, arXiv 2504.19874, §3.1 (codebook of the Beta law); docs/references.md §2",
        measurement=("√d × the outer 2-bit level: " + listing(conv.items(), "d={}: {:.4f}")
                     + f" vs Gaussian {gaussian_codebook(2).levels[-1]:.4f}; D_mse at d = 128 vs the Gaussian "
                     f"limit: {100 * a.dmse_rows[2]['rel_diff_limit_vs_exact']:+.1f}% at b = 3."),
        data=f"exact codebooks, d = 2..{d_big}",
        verdict=codebook_verdict(large, glev, gap),
        sample=EXACT,
        figure=f"{STUDY}_codebook_convergence.png")


# ------------------------------------------------------------------------------------------------- the study


class SphereLaw(study.Study):
    """The study on the protocol (kvstats.study.protocol.Study): four sweeps, their figures and three claims."""

    name, version, position, description = STUDY, VERSION, POSITION, __doc__
    scales = SCALES

    def cells(self, scale: str) -> study.Sweeps:
        cfg = SCALE[scale]
        return {f"{STUDY}_density": (density_cell, grid(d=list(DENSITY_DIMS), n_vectors=cfg["n_vectors"])),
                f"{STUDY}_gaussian_distance": (distance_cell, grid(d=distance_dims(cfg))),
                "codebook_convergence": (codebook_cell, grid(bits=[2, 3], d=codebook_dims(cfg))),
                f"{STUDY}_dmse": (dmse_cell, grid(bits=[1, 2, 3, 4], d=128))}

    def analyse(self, tables, scale: str) -> Analysis:
        cfg = SCALE[scale]
        ks = {int(d): float(g["ks"].iloc[0]) for d, g in tables[f"{STUDY}_density"].groupby("d")}
        rows = tables[f"{STUDY}_dmse"].sort_values("bits").to_dict("records")
        return Analysis(cfg, scale, distance_dims(cfg), codebook_dims(cfg), rows, ks)

    def figures(self, tables, a: Analysis) -> None:
        density, dist, conv = (tables[f"{STUDY}_density"], tables[f"{STUDY}_gaussian_distance"],
                               tables["codebook_convergence"])
        plots.write_csv(f"{STUDY}_density", density)
        density_figure(density)
        plots.write_csv(f"{STUDY}_gaussian_distance", dist)
        distance_figure(dist)
        plots.write_csv(f"{STUDY}_codebook_convergence", conv)
        convergence_figure(conv)
        plots.write_csv(f"{STUDY}_turboquant_dmse_table", tables[f"{STUDY}_dmse"])
        print(f"D_mse at d = 128 (exact / Gaussian limit / printed){' — quick scale' if a.scale == 'quick' else ''}:")
        for r in a.dmse_rows:
            print(f"   b={r['bits']}: {r['exact_d_mse']:.5f} / {r['gaussian_limit_d_mse']:.5f} / {r['printed_d_mse']}"
                  f"  (printed vs exact {100 * r['rel_diff_printed_vs_exact']:+.1f}%)")

    def claims(self, a: Analysis) -> list[Claim]:
        return [gaussian_limit_claim(a), lloyd_max_claim(a), codebook_claim(a)]

    def definitions(self, a: Analysis) -> dict[str, str]:
        return definitions(a.cfg, a.scale)


def distance_dims(cfg: dict) -> list[int]:
    return sorted({int(round(v)) for v in np.geomspace(2, cfg["max_dim"], cfg["n_dims"])})


def codebook_dims(cfg: dict) -> list[int]:
    return [d for d in CODEBOOK_DIMS if d <= cfg["max_codebook_dim"]]


def main(argv: list[str] | None = None) -> int:
    return SphereLaw().main(argv, echo=False)


if __name__ == "__main__":
    sys.exit(main())
