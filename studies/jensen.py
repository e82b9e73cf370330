"""Study: the Jensen bias of softmax under logit noise, and where each scheme's logit error puts it.

    python studies/jensen.py --scale quick|paper [--scheduler ADDR]

Curves: E[KL(p ‖ softmax(s + ε))] vs the mean noise variance σ̄² for independent Gaussian logit noise,
uniform (σᵢ² = σ̄²) or score-correlated (σᵢ² ∝ sᵢ − min s, same mean), by Monte Carlo
(kvstats.inference.jensen_simulation), averaged over the attention rows of several real-looking synthetic
queries (gaussian keys, d = 128, seq 256, peak 8). Alongside: the second-order expansion ½Σpᵢ(1 − pᵢ)σᵢ² and
the systematic part KL(p ‖ p_mf), p_mf ∝ pᵢe^{σᵢ²/2} (zero for uniform noise: the e^{σ²/2} cancels).

Points: for each scheme (KV, KQV, QKQV) and budget n = 2..6 on the same data, the measured logit-error
variance σ̄² = mean (ŝ − s)² over (query, key) (logits in units of q·k/√d) and the measured attention KL.

Writes figures/jensen.png, figures/data/jensen_{curves,schemes}.csv and the claims file.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import scipy.stats

from kvstats import metrics, plots, study
from kvstats.inference import jensen_simulation
from kvstats.schemes import scheme
from kvstats.sweep import cell_seed, grid

STUDY = "jensen"
VERSION = "1"
POSITION = 60  # place in figures/REPORT.md (kvstats.report.study_order)
D, SEQ, N_Q = 128, 256, 16
SIGMA2 = tuple(float(v) for v in np.round(np.geomspace(1e-3, 4.0, 10), 6))
SCALE = {"quick": {"draws": 1000, "queries": 4, "trials": 8},
         "paper": {"draws": 20000, "queries": 16, "trials": 40}}


def data(trial: int):
    from kvstats.data.synthetic import generate

    return generate("gaussian", 1, 2, SEQ, D, cell_seed(STUDY, "data", trial), q_heads=4, n_q=N_Q)


def curve_cell(mode: str, sigma2: float, queries: int, draws: int) -> list[dict]:
    """Jensen simulation on the attention rows of the first ``queries`` queries of trial 0."""
    q, k, _ = data(0)
    scores = metrics.attention_scores(q, k, double=True).reshape(-1, SEQ)[:queries].numpy()
    rows = []
    for j, s in enumerate(scores):
        r = jensen_simulation(s, sigma2, mode=mode, n_draws=draws, seed=cell_seed(STUDY, "noise", mode, sigma2, j))
        rows.append({"query": j, "kl": r.statistic, "kl_se": r.extra["kl_se"], "kl_second_order": r.kl_second_order,
                     "kl_fourth_order": r.kl_fourth_order, "kl_mean_field": r.kl_mean_field,
                     "kl_jensen_bound": r.kl_jensen_bound,
                     "inflation_max_rel_dev": float(np.max(np.abs(r.inflation / r.inflation_theory - 1))),
                     "entropy": float(-(r.p * np.log(np.maximum(r.p, 1e-300))).sum())})
    return rows


def scheme_cell(scheme_name: str, n: int, trials: int) -> list[dict]:
    """Measured logit-error variance and KL of a scheme on the curve's data (one row per trial)."""
    rows = []
    for t in range(trials):
        q, k, v = data(t)
        s = scheme(scheme_name, bits=n, dim=D, seed=cell_seed(STUDY, "quant", scheme_name, n, t))
        ref = metrics.attention_scores(q, k)
        est = s.scores(q, s.encode(k, v)) / math.sqrt(D)
        err2 = (est - ref).double().pow(2)
        # Spearman correlation per query row = Pearson correlation of the ranks
        ranks = [scipy.stats.rankdata(x.reshape(-1, SEQ).numpy(), axis=-1) for x in (ref.double(), err2)]
        ranks = [r - r.mean(-1, keepdims=True) for r in ranks]
        rho = float(np.mean((ranks[0] * ranks[1]).sum(-1) / np.sqrt((ranks[0] ** 2).sum(-1) * (ranks[1] ** 2).sum(-1))))
        rows.append({"trial": t, "sigma2": float(err2.mean()), "kl": metrics.attention_kl_from_scores(ref, est),
                     "spearman_err2_score": float(rho)})
    return rows


def main(argv: list[str] | None = None) -> int:
    shell = study.start(STUDY, __doc__, argv, position=POSITION)
    args = shell.args
    cfg = SCALE[args.scale]
    curves = shell.sweep(curve_cell, grid(mode=["uniform", "correlated"], sigma2=list(SIGMA2),
                                          queries=cfg["queries"], draws=cfg["draws"]),
                         version=VERSION, name=f"{STUDY}_curves")
    points = shell.sweep(scheme_cell, grid(scheme_name=["kv", "kqv", "qkqv"], n=[2, 3, 4, 5, 6], trials=cfg["trials"]),
                         version=VERSION, name=f"{STUDY}_schemes")
    plots.write_csv(f"{STUDY}_curves", curves)
    plots.write_csv(f"{STUDY}_schemes", points)
    mean_curves = curves.groupby(["mode", "sigma2"]).mean(numeric_only=True).reset_index()
    pts = points.groupby(["scheme_name", "n"]).agg(sigma2=("sigma2", "median"), kl=("kl", "median"),
                                                   kl_lo=("kl", lambda x: x.quantile(0.25)),
                                                   kl_hi=("kl", lambda x: x.quantile(0.75)),
                                                   rho=("spearman_err2_score", "mean")).reset_index()

    plots.setup()
    fig, axes = plots.panels(1, 2, "Softmax under logit noise (Jensen): KL vs noise variance, and the schemes on it",
                             width=5.8, height=4.4)
    ax = axes[0, 0]
    for mode, color in (("uniform", "#1f77b4"), ("correlated", "#d62728")):
        c = mean_curves[mean_curves["mode"] == mode]
        ax.plot(c["sigma2"], c["kl"], "o-", color=color, ms=4, label=f"{mode} noise: E[KL] (Monte Carlo)")
        ax.plot(c["sigma2"], c["kl_second_order"], "--", color=color, lw=1, label=f"{mode}: ½Σp(1−p)σ² (2nd order)")
        if mode == "correlated":
            ax.plot(c["sigma2"], c["kl_mean_field"], ":", color=color, lw=1.5,
                    label="correlated: systematic KL(p ‖ p_mf)")
    for sch in ("kv", "kqv", "qkqv"):
        p = pts[pts["scheme_name"] == sch]
        st = plots.style(sch)
        ax.errorbar(p["sigma2"], p["kl"], yerr=[p["kl"] - p["kl_lo"], p["kl_hi"] - p["kl"]], ls="none",
                    marker=st["marker"], color=st["color"], ms=6, mfc="white", capsize=2,
                    label=f"{st['label']}, n=2..6")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("mean logit-noise variance σ̄² [nats²]")
    ax.set_ylabel("attention KL [nats]")
    ax.set_title(f"mean over {cfg['queries']} query rows (S = {SEQ} keys)")
    ax.legend(fontsize=6.5, loc="upper left")
    ax = axes[0, 1]
    for mode, color in (("uniform", "#1f77b4"), ("correlated", "#d62728")):
        c = mean_curves[mean_curves["mode"] == mode]
        ax.plot(c["sigma2"], c["kl"] / c["sigma2"], "o-", color=color, ms=4, label=f"{mode} noise")
    ax.set_xscale("log")
    ax.set_xlabel("mean logit-noise variance σ̄² [nats²]")
    ax.set_ylabel("E[KL] / σ̄²")
    ax.set_title("E[KL]/σ̄² (would rise with σ̄² if softmax amplified super-linearly)")
    ax.legend()
    plots.save(fig, STUDY)

    u = mean_curves[mean_curves["mode"] == "uniform"].set_index("sigma2")
    c = mean_curves[mean_curves["mode"] == "correlated"].set_index("sigma2")
    s_lo, s_hi = SIGMA2[0], SIGMA2[-1]
    infl = curves["inflation_max_rel_dev"]
    p4 = pts[pts["n"] == 4].set_index("scheme_name")
    data_txt = (f"synthetic gaussian keys, d = {D}, {SEQ} keys, peak 8; {cfg['queries']} query rows × {cfg['draws']} "
                f"noise draws per point; schemes: {cfg['trials']} trials per (scheme, n) ({args.scale} scale)")
    rising = c["kl"].iloc[-1] / c.index[-1] > c["kl"].iloc[0] / c.index[0]
    growth = ("rising (super-linear)" if rising else "not rising: no super-linear growth for this peaked attention "
              "(the σ⁴ term is negative unless attention is diffuse, docs/inference.md)")
    on_curve = np.interp(np.log(pts["sigma2"]), np.log(u.index), u["kl"])
    off_curve = float(np.exp(np.max(np.abs(np.log(pts["kl"] / on_curve)))))
    pts_md = ("| scheme | n | median σ̄² | median KL | uniform-noise E[KL] at that σ̄² | Spearman(err², score) |\n"
              "|---|---|---|---|---|---|\n" +
              "\n".join(f"| {r.scheme_name} | {r.n} | {r.sigma2:.3g} | {r.kl:.3g} | "
                        f"{np.interp(np.log(r.sigma2), np.log(u.index), u['kl']):.3g} | {r.rho:+.2f} |"
                        for r in pts.itertuples()))
    claims = [
        {
            "id": "jensen-inflation",
            "claim": "For logit error ε ~ N(0, σ²), E[e^{s+ε}] = e^{s}·e^{σ²/2}; a uniform σ² cancels in softmax, a "
                     "σ² correlated with the scores does not.",
            "source": "D'Alberto, arXiv 2605.08114, §3.1 eq. (4); REFERENCE §5",
            "measurement": (f"inflation e^ε measured against e^{{σ²/2}} per key: median max relative deviation "
                            f"{infl.median():.3f} over all points (Monte Carlo error); systematic KL(p ‖ p_mf) is "
                            f"{u['kl_mean_field'].max():.1g} for uniform noise at every σ̄² and "
                            f"{c.loc[s_hi, 'kl_mean_field']:.3g} nats for correlated noise at σ̄² = {s_hi:g}; "
                            f"E[KL] correlated/uniform = {c.loc[s_lo, 'kl'] / u.loc[s_lo, 'kl']:.2f} at σ̄² = {s_lo:g} "
                            f"and {c.loc[s_hi, 'kl'] / u.loc[s_hi, 'kl']:.2f} at σ̄² = {s_hi:g}. E[KL]/σ̄² for "
                            f"correlated noise goes from {c['kl'].iloc[0] / c.index[0]:.3f} to "
                            f"{c['kl'].iloc[-1] / c.index[-1]:.3f}: "
                            f"{growth}."),
            "data": data_txt,
            "verdict": "reproduced" if u["kl_mean_field"].max() < 1e-9 and c.loc[s_hi, "kl_mean_field"] > 0 else
            "partly",
            "figure": f"{STUDY}.png",
            "details": "E[KL]/σ̄² over the grid — uniform: "
                       + ", ".join(f"{v:.3g}" for v in (u["kl"] / u.index)) + "; correlated: "
                       + ", ".join(f"{v:.3g}" for v in (c["kl"] / c.index)) + ".",
        },
        {
            "id": "jensen-schemes-on-curve",
            "claim": "QJL on K amplifies the inner-product (logit) variance, which softmax turns into KL "
                     "super-linearly (Jensen); hence KQV beats QKQV on KL.",
            "source": "D'Alberto, arXiv 2605.08114, abstract and §3",
            "measurement": (f"at n = 4: logit-error variance σ̄² = {p4.loc['kqv', 'sigma2']:.3g} (KQV) vs "
                            f"{p4.loc['qkqv', 'sigma2']:.3g} (QKQV), ratio "
                            f"{p4.loc['qkqv', 'sigma2'] / p4.loc['kqv', 'sigma2']:.2f}"
                            f"; KL {p4.loc['kqv', 'kl']:.3g} vs {p4.loc['qkqv', 'kl']:.3g}. The measured points lie on "
                            f"the uniform-noise curve within a factor {off_curve:.1f}"
                            "; Spearman correlation between squared logit error and score: "
                            f"{pts['rho'].min():+.2f} to {pts['rho'].max():+.2f}."),
            "data": data_txt,
            "verdict": "measured",
            "figure": f"{STUDY}.png",
            "details": pts_md,
        },
    ]
    return shell.finish(claims)


if __name__ == "__main__":
    sys.exit(main())
