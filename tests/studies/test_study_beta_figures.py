"""studies/beta_figures.py: the sample sizes of its claims (issue 50). (Its verdict code and a tiny run through the
study shell are in tests/studies/test_study_theory.py.)"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import scipy.stats

from kvstats.study.claims import SampleSize
from kvstats.study.sample_plans import ks_exceedance_sample
from tests.helpers.studies import load_study

bf = load_study("beta_figures")


def _kl_table(trials: int = 8, seed: int = 0) -> pd.DataFrame:
    """Per-trial KLs of every (d, data) cell and method as the sweep writes them: MSE lower than MSE + QJL."""
    rng = np.random.default_rng(seed)
    rows = []
    for d in bf.DIMS:
        for kind in bf.KINDS:
            for t in range(trials):
                base = rng.lognormal(-3, 0.3)
                rows.append({"d": d, "kind": kind, "trial": t, "method": "turbo_mse", "sketch": "none", "kl": base})
                for sketch in (bf.SKETCH, *bf.SENSITIVITY_SKETCHES):
                    rows.append({"d": d, "kind": kind, "trial": t, "method": "turbo_prod", "sketch": sketch,
                                 "kl": base * rng.uniform(1.5, 2.5)})
    return pd.DataFrame(rows)


def test_every_claim_carries_its_sample_size():
    mw = bf.mann_whitney_table(_kl_table())
    assert (mw["n_pairs"] == 8).all() and (mw["sd_difference"] > 0).all()
    ks = pd.DataFrame({"d": [2, 8, 8], "kind": ["gaussian", "gaussian", "low_rank"], "n": 4096,
                       "ks": [0.003, 0.006, 0.1], "p": [0.9, 0.5, 1e-30]})
    a = bf.Analysis(bf.SCALE["quick"], "quick", bf.sequence_lengths(bf.SCALE["quick"], "quick"), mw, ks)
    claims = bf.BetaFigures().claims(a)
    assert len(claims) == 3 and all(isinstance(c.sample, SampleSize) for c in claims)
    wins = claims[0].sample
    assert wins.achieved_n == 8 and f"α = {bf.ALPHA / 12:.3g} per cell, hardest of 12" in wins.test
    # the sphere-law claim: the harder part is the rank-1 bound (planned at 1/32, 0.011 beyond the margin)
    assert claims[-1].sample.planned_n == ks_exceedance_sample(4096, margin=bf.KS_MARGIN, gap=1 / 32 - bf.KS_MARGIN,
                                                               effect_words="x").planned_n


def test_mse_wins_sample_is_the_rank_plan_at_holms_first_step():
    """12 cells whose Hodges–Lehmann shift has standard error 0.005 against a shift of 10% of a median 0.5 at
    ALPHA/12: n = ⌈80·((z_{α/2} + z_β)·0.005/0.05)²⌉ pairs."""
    mw = pd.DataFrame({"sketch": bf.SKETCH, "n_pairs": [80] * 12, "sd_difference": 0.05, "shift_se": 0.005,
                       "median_kl_mse_qjl": 0.5})
    s = bf.mse_wins_sample(mw)
    z = scipy.stats.norm.isf(bf.ALPHA / 24) + scipy.stats.norm.ppf(0.8)
    assert s.planned_n == math.ceil(80 * (z * 0.005 / 0.05) ** 2) and s.achieved_n == 80 and not s.under_powered
