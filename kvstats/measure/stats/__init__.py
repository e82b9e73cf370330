"""Statistics for comparing quantizers: Mann–Whitney and Wilcoxon with effect sizes, multiple testing, bootstrap
CIs (means, ratios, Spearman ρ), power and sample-size planning, binary outcomes (Wilson / Clopper–Pearson, exact
McNemar) and equivalence (TOST, non-inferiority), significance groups at one budget (a compact letter display). See
docs/statistics.md.

One private module per family of tests (``_mann_whitney``, ``_mann_whitney_reported``, ``_wilcoxon``, ``_compare``,
``_bootstrap``, ``_correlation``, ``_power``, ``_exact_power``, ``_planning``, ``_binary``, ``_equivalence``,
``_normal_theory``, ``_groups``); the public names are the ones below.

Conventions (docs/references.md §5):

* ``U₁`` is the Mann–Whitney statistic of the *first* sample as scipy reports it,
  ``U₁ = #{(i, j): aᵢ > bⱼ} + ½·#{(i, j): aᵢ = bⱼ}``.
* The rank-biserial correlation is ``r = 2·U₁/(n₁n₂) − 1 = P(a > b) − P(a < b)``: **negative when the
  first sample tends to be smaller** (e.g. ``mann_whitney(kl_kqv, kl_qkqv)`` gives ``r < 0`` when KQV has
  the lower KL). The often quoted ``1 − 2U/(n₁n₂)`` is the same number when ``U`` is the *other*
  sample's statistic (``U₂ = n₁n₂ − U₁``). |r| ≤ 1; ±1 means complete separation.
* ``r_Z = Z/√N`` (``N = n₁ + n₂``, Z from the normal approximation with tie correction, no continuity
  correction) has the same sign; it cannot reach ±1 (at 70 vs 70 its maximum is ≈ 0.86), which is why a
  published ``r = −0.983`` at that size must be the rank-biserial one.
* In the far tail the exact null distribution of U and its normal approximation differ by many orders of
  magnitude (complete separation at 70 vs 70: exact p ≈ 2e−41, normal p ≈ 1e−23). Results always state
  which p-value is reported (``pvalue_method``) and carry both when the exact one is computable.
"""

# The limits below are part of the documented behaviour (docs/statistics.md), so they stay reachable here.
from kvstats.measure.stats._binary import (
    McNemarResult,
    ProportionResult,
    mcnemar,
    paired_equivalence_trials,
    proportion_ci,
)
from kvstats.measure.stats._bootstrap import NO_INTERVAL as NO_INTERVAL
from kvstats.measure.stats._bootstrap import T_INTERVAL_BELOW as T_INTERVAL_BELOW
from kvstats.measure.stats._bootstrap import (
    BootstrapResult,
    MeanResult,
    bootstrap_ci,
    cluster_bootstrap_ci,
    interval_text,
    mean_ci,
    ratio_ci,
)
from kvstats.measure.stats._common import BOOTSTRAP_MAX_ELEMENTS as BOOTSTRAP_MAX_ELEMENTS
from kvstats.measure.stats._common import EXACT_CI_MAX_PAIRS as EXACT_CI_MAX_PAIRS
from kvstats.measure.stats._common import EXACT_MAX_PAIRS as EXACT_MAX_PAIRS
from kvstats.measure.stats._common import HL_MAX_PAIRS as HL_MAX_PAIRS
from kvstats.measure.stats._compare import compare
from kvstats.measure.stats._correlation import CorrelationResult, ols_slope, spearman
from kvstats.measure.stats._equivalence import EquivalenceResult, equivalence, noninferiority
from kvstats.measure.stats._exact_power import EXACT_POWER_MAX_N as EXACT_POWER_MAX_N
from kvstats.measure.stats._exact_power import (
    binomial_power,
    binomtest_pvalues,
    mcnemar_critical_values,
    mcnemar_power,
    tost_power,
)
from kvstats.measure.stats._goodness_of_fit import ks_distance_interval
from kvstats.measure.stats._groups import SignificanceGroups, compact_letters, significance_groups
from kvstats.measure.stats._mann_whitney import MannWhitneyResult, hodges_lehmann, mann_whitney, mwu_null_cdf
from kvstats.measure.stats._mann_whitney_reported import (
    RankBiserialReport,
    mann_whitney_min_n,
    mann_whitney_min_pvalue,
    mann_whitney_u_pvalue,
    rank_biserial_report,
)
from kvstats.measure.stats._normal_theory import (
    TIntervalResult,
    ZTestResult,
    log_ratio_t_interval,
    t_interval,
    t_standard_error,
    z_difference_test,
)
from kvstats.measure.stats._options import InferenceOptions, inference_options
from kvstats.measure.stats._planning import (
    SamplePlan,
    binomial_mde,
    binomial_sample_size,
    binomial_window,
    mcnemar_mde,
    mcnemar_sample_size,
    mcnemar_window,
    plan_sample_size,
    tost_mde,
    tost_sample_size,
)
from kvstats.measure.stats._power import (
    PowerResult,
    detectable_shift,
    paired_t_power,
    signed_rank_shift_se,
    wilcoxon_min_pvalue,
    wilcoxon_power,
)
from kvstats.measure.stats._wilcoxon import WILCOXON_BOOTSTRAP_MAX_N as WILCOXON_BOOTSTRAP_MAX_N
from kvstats.measure.stats._wilcoxon import WILCOXON_EXACT_MAX_N as WILCOXON_EXACT_MAX_N
from kvstats.measure.stats._wilcoxon import WILCOXON_PERMUTATION_MAX_N as WILCOXON_PERMUTATION_MAX_N
from kvstats.measure.stats._wilcoxon import WilcoxonResult, wilcoxon

__all__ = [
    "BootstrapResult",
    "InferenceOptions",
    "inference_options",
    "CorrelationResult",
    "EquivalenceResult",
    "McNemarResult",
    "ProportionResult",
    "MannWhitneyResult",
    "PowerResult",
    "SamplePlan",
    "WilcoxonResult",
    "MeanResult",
    "RankBiserialReport",
    "TIntervalResult",
    "ZTestResult",
    "SignificanceGroups",
    "binomial_mde",
    "binomial_power",
    "binomial_sample_size",
    "binomial_window",
    "binomtest_pvalues",
    "bootstrap_ci",
    "cluster_bootstrap_ci",
    "compact_letters",
    "compare",
    "interval_text",
    "ks_distance_interval",
    "detectable_shift",
    "signed_rank_shift_se",
    "equivalence",
    "hodges_lehmann",
    "log_ratio_t_interval",
    "mann_whitney",
    "mann_whitney_min_n",
    "mann_whitney_min_pvalue",
    "mann_whitney_u_pvalue",
    "mcnemar",
    "mcnemar_critical_values",
    "mcnemar_mde",
    "mcnemar_power",
    "mcnemar_sample_size",
    "mcnemar_window",
    "mean_ci",
    "mwu_null_cdf",
    "noninferiority",
    "ols_slope",
    "paired_equivalence_trials",
    "paired_t_power",
    "plan_sample_size",
    "proportion_ci",
    "rank_biserial_report",
    "ratio_ci",
    "significance_groups",
    "spearman",
    "t_interval",
    "t_standard_error",
    "tost_mde",
    "tost_power",
    "tost_sample_size",
    "wilcoxon",
    "wilcoxon_min_pvalue",
    "wilcoxon_power",
    "z_difference_test",
]

# Users see (and pickle) these names as ``kvstats.measure.stats.<name>``, wherever their family module lives.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
