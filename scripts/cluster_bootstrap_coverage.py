"""Simulate the coverage of the model evaluation's pooled intervals by number of documents: the nominal 95% cluster
BCa interval (kvstats.stats.cluster_bootstrap_ci) of the pooled mean, median, p90 and p99 of one segment per
document, 128 lognormal token values each with a document effect (log-values N(0, 0.5²) + N(0, 1.2²)), 400 data
sets of 499 resamples per count: kvstats.evaluation.model_engine.POOLED_COVERAGE and the choice of
POOLED_MIN_DOCUMENTS.

    .venv/bin/python scripts/cluster_bootstrap_coverage.py [--documents 3 4 6 8 10 12 16 24] [--sets 400]

About 70-100 s per count on one core.
"""

from __future__ import annotations

import argparse

import numpy as np

from kvstats.measure.stats import cluster_bootstrap_ci

TOKENS, DOCUMENT_SD, TOKEN_SD = 128, 0.5, 1.2


def draw(rng: np.random.Generator, documents: int) -> list[np.ndarray]:
    return [np.exp(rng.normal(0, DOCUMENT_SD) + rng.normal(0, TOKEN_SD, TOKENS)) for _ in range(documents)]


def truths() -> dict:
    """Each statistic and its population value: the mean in closed form, the quantiles of 20,000 documents."""
    big = np.concatenate(draw(np.random.default_rng(3), 20000))
    return {"mean": (np.mean, float(np.exp(DOCUMENT_SD ** 2 / 2 + TOKEN_SD ** 2 / 2))),
            "median": (np.median, float(np.median(big))),
            "p90": (lambda x: np.quantile(x, 0.9), float(np.quantile(big, 0.9))),
            "p99": (lambda x: np.quantile(x, 0.99), float(np.quantile(big, 0.99)))}


def coverage(documents: int, sets: int, stats: dict) -> dict[str, float]:
    hits = dict.fromkeys(stats, 0)
    for s in range(sets):
        units = draw(np.random.default_rng(10_000 + s), documents)
        for name, (statistic, truth) in stats.items():
            ci = cluster_bootstrap_ci(units, statistic, n_resamples=499, seed=s).confidence_interval
            hits[name] += ci.low <= truth <= ci.high
    return {name: 100 * h / sets for name, h in hits.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, nargs="+", default=[3, 4, 6, 8, 10, 12, 16, 24])
    parser.add_argument("--sets", type=int, default=400, help="simulated data sets per count")
    args = parser.parse_args(argv)
    stats = truths()
    print("documents  " + "  ".join(f"{name:>6}" for name in stats) + "  (% covered, nominal 95%)")
    for k in args.documents:
        got = coverage(k, args.sets, stats)
        print(f"{k:>9}  " + "  ".join(f"{v:6.1f}" for v in got.values()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
