"""The README's code runs as printed (it is what a newcomer copies first) and says what it claims."""

from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from kvstats.measure.stats import mann_whitney
from tests.helpers.docs import python_blocks

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_readme_example_compares_independent_trials(tmp_path, monkeypatch):
    blocks = [b for b in python_blocks(README) if b.no_run is None]
    assert blocks, "README.md has no runnable python example"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    for block in blocks:
        exec(compile("\n" * (block.line - 1) + block.code, str(README), "exec"), namespace)
    kl = namespace["kl"]
    n = len(kl["kqv"])
    # The statistics are over trials (independent units), one number per trial and scheme — not over the
    # queries of one draw, which gave p ≈ 1e−52 before.
    assert n == len(kl["qkqv"]) == 12 and all(isinstance(x, float) for x in kl["kqv"] + kl["qkqv"])
    result = mann_whitney(kl["kqv"], kl["qkqv"])
    assert result.n == (n, n)
    # scipy's exact two-sided test on the same 12 vs 12 trials (whose smallest possible p, at complete
    # separation, is 2/C(24, 12) ≈ 7.4e−7: the per-query p ≈ 1e−52 cannot arise from trials)
    oracle = scipy.stats.mannwhitneyu(kl["kqv"], kl["qkqv"], alternative="two-sided", method="exact")
    assert result.pvalue == pytest.approx(oracle.pvalue, rel=1e-12)
    # KQV beats QKQV in attention KL at n = 4 (D'Alberto, arXiv 2605.08114, finding 2) in most trials.
    assert np.median(kl["kqv"]) < np.median(kl["qkqv"])
