"""kvstats.inference / kvstats.testing applied to the real quantizers: the unbiasedness check accepts
QJL and TurboQuant_prod, rejects TurboQuant_mse at b = 1, and QJL's variance matches its closed form.

Sizing: assert_unbiased runs a two-sided t test at alpha = 1e-6 (false failure ≤ 1e-6 for a correct
estimator). turbo_mse at b = 1 shrinks ⟨q, k⟩ = 0.8 by ≈ 0.36·0.8 ≈ 0.29, with an estimate sd ≈ 0.06
at d = 32: with 1500 draws the bias is ≈ 180 standard errors, so the rejection is certain.
"""

import math

import numpy as np
import pytest
import torch

from kvstats.measure.inference import check_unbiased, qjl_variance
from kvstats.measure.testing import assert_unbiased
from kvstats.quant.quantizers import quantizer

D = 32


def pair(cos=0.8, seed=0):
    g = torch.Generator().manual_seed(seed)
    k, r = torch.randn(2, D, generator=g, dtype=torch.float64)
    k = k / k.norm()
    r = r - (r @ k) * k
    return (cos * k + math.sqrt(1 - cos**2) * r / r.norm()).numpy(), k.numpy()


def estimator(name, **opts):
    def run(q, k, seeds):
        qt, kt = torch.from_numpy(np.asarray(q)).view(1, -1), torch.from_numpy(np.asarray(k)).view(1, -1)
        out = np.empty(len(seeds))
        for i, s in enumerate(seeds):
            qz = quantizer(name, dim=D, seed=int(s) % 2**62, **opts)
            out[i] = qz.inner(qt, qz.encode(kt)).item()
        return out
    return run


@pytest.mark.slow
@pytest.mark.parametrize("name, opts", [("qjl", {"rows": "gaussian"}), ("qjl", {}), ("turbo_prod", {"bits": 2}),
                                        ("turbo_prod", {"bits": 3})])
def test_accepts_unbiased_quantizers(name, opts):
    # alpha = 1e-8 per quantizer (4 of them: 4e-8 in all), so that even a normal tail 10x too thin for the
    # t statistic of 1500 bounded estimates would keep a correct quantizer's failure probability < 1e-6
    q, k = pair()
    assert_unbiased(estimator(name, **opts), q, k, n_seeds=1500, alpha=1e-8)


def test_rejects_turbo_mse_at_one_bit():
    q, k = pair()
    with pytest.raises(AssertionError, match="estimator is biased"):
        assert_unbiased(estimator("turbo_mse", bits=1), q, k, n_seeds=1500)


@pytest.mark.slow
def test_qjl_variance_ratio_is_one_within_its_ci():
    # 1 − 1e-9 CI on the variance ratio (kurtosis-aware delta method): a correct estimator falls outside w.p.
    # 1e-9 by the normal approximation, and < 1e-6 even if that tail were 1000x too thin at n = 3000
    q, k = pair(cos=0.3, seed=1)
    r = check_unbiased(estimator("qjl", rows="gaussian"), q, k, n_draws=3000,
                       variance_closed_form=qjl_variance(q, k, D), confidence_level=1 - 1e-9)
    low, high = r.variance_ratio_ci
    assert low <= 1 <= high, (low, high)
