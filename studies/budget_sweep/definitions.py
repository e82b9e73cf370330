"""The study's terms, generated from its configuration constants."""

from __future__ import annotations

import re

from kvstats.measure.stats import (
    WILCOXON_EXACT_MAX_N,
    wilcoxon_min_pvalue,
)
from kvstats.studies.budget_sweep.analysis import paired_family_size
from kvstats.studies.budget_sweep.cells import (
    ALPHA,
    BUDGETS,
    DOCUMENT_TITLES,
    NO_SKETCH,
    PEAKED,
    QJL_SCHEMES,
    REAL_D,
    SCHEMES,
    SENSITIVITY_BUDGETS,
    SENSITIVITY_SKETCHES,
    SKETCH,
    SKETCH_OPTIONS,
    SYNTHETIC,
    SYNTHETIC_HEADS,
    make_scheme,
)
from kvstats.studies.formats import DEPLOYED, method_label


def definitions(cfg: dict, n_windows: int) -> dict[str, str]:
    """The study's terms, generated from its configuration constants."""
    gens = "; ".join(f"{lab} = {kind}({', '.join(f'{k}={v}' for k, v in params.items()) or 'defaults'})"
                     for lab, (kind, params) in SYNTHETIC.items())
    def quantizers(name: str) -> str:
        sch = make_scheme(name, 4, cfg["d"], 0, SKETCH if name in QJL_SCHEMES else NO_SKETCH)
        norms = ", ".join(f"{part} norms {q.norm_dtype}".replace("torch.", "")
                          for part, q in (("K", sch.k), ("V", sch.v)) if hasattr(q, "norm_dtype"))
        k, v = (re.sub(r", seed=\d+", "", repr(q)) for q in (sch.k, sch.v))  # seeds are per trial
        return f"{name}: K = {k}, V = {v}" + (f" ({norms})" if norms else "")

    return {
        "schemes": "at n = 4, d = " + str(cfg["d"]) + " (other n alike): "
                   + "; ".join(quantizers(name) for name in SCHEMES)
                   + f"; budgets n ∈ {list(BUDGETS)} bits per element",
        "sketch": f"QJL stage: rows={SKETCH!r} (S = H·diag(s′), m = d, D'Alberto eq. 3) for every verdict, applied "
                  "to the residual in the MSE stage's rotated domain (S r, D'Alberto §2.2 literally; "
                  "sketch_domain='rotated'); sensitivity rows at n ∈ " + str(list(SENSITIVITY_BUDGETS)) + ": "
                  + "; ".join(f"{s_} = {SKETCH_OPTIONS[s_]}" for s_ in SENSITIVITY_SKETCHES)
                  + " (srht-original: S Πᵀ r, the residual de-rotated first; equal in law to the rotated domain "
                  "for Gaussian rows, not for the Hadamard sketch)",
        "synthetic data": f"kvstats.data.synthetic.generate: {gens}; heavy_tail = i.i.d. Student-t coordinates; "
                          f"d = {cfg['d']}, seq {cfg['seq']}, {SYNTHETIC_HEADS[0]} KV / {SYNTHETIC_HEADS[1]} query "
                          "heads",
        "query models": f"peaked = the generator's queries with {', '.join(f'{k}={v}' for k, v in PEAKED.items())}; "
                        f"isotropic = q ~ N(0, I_d) independent of the keys; {cfg['n_q']} queries per head; both "
                        "scored on the same quantized cache of a trial",
        "real data": f"SmolLM2-135M Q/K/V captured per document of kvstats/texts/public_domain.txt "
                     f"({len(DOCUMENT_TITLES)} documents: {'; '.join(DOCUMENT_TITLES)}), layers "
                     f"{list(cfg['layers'])}, d = {REAL_D}; the model's own queries (after RoPE)",
        "trial": f"synthetic: one fresh draw of K, V and both query sets ({cfg['trials']} per cell); real: one "
                 f"disjoint window of {cfg['window']} consecutive tokens of one document ({n_windows} windows), "
                 f"queries = its last {cfg['n_q'] // 2} positions, causal. Quantizer seeds (rotation, sketch) are "
                 "fresh per trial; minmax has no random state, so across its trials only the data vary. The paired "
                 "tests' smallest attainable two-sided p (N pairs all one sign; kvstats.stats.wilcoxon_min_pvalue: "
                 f"exact 2/2^N up to {WILCOXON_EXACT_MAX_N} pairs, the normal approximation beyond) is "
                 f"{wilcoxon_min_pvalue(cfg['trials']):.2g} over the {cfg['trials']} synthetic trials"
                 f"{' (normal approximation)' if cfg['trials'] > WILCOXON_EXACT_MAX_N else ' (exact)'}, "
                 f"{wilcoxon_min_pvalue(max(n_windows, 1)):.2g} over the {n_windows} real windows"
                 f"{' (normal approximation)' if n_windows > WILCOXON_EXACT_MAX_N else ' (exact)'}",
        "aggregation": "per trial: mean over heads and queries of each metric; across trials: medians, paired "
                       f"Wilcoxon over trials, Holm within each sketch's tests at alpha = {ALPHA} (the paper's sketch: "
                       f"{paired_family_size(cfg)} tests, every verdict; each sensitivity sketch its own family of "
                       f"{paired_family_size(cfg, SENSITIVITY_SKETCHES[0])}), beside each test its minimum detectable "
                       "mean difference (column detectable_shift: 80% power at alpha/m, m the same family); ratios "
                       "are ratios "
                       "of medians with a paired BCa bootstrap CI (on the real windows a cluster BCa bootstrap: "
                       "the documents, then their windows; windows of one document are not independent, and the "
                       "real windows' Wilcoxon p-values describe these documents' windows)",
        "formats": "the deployed formats on the real windows (their own sweep, the same windows, layers and queries): "
                   + ", ".join(method_label(s, n) for s, n in cfg.get("formats", DEPLOYED))
                   + " (kvstats.scheme by the names docs/quantizers.md gives; a pair K/V at n = the mean of its "
                     "widths), each tested against KQV at the same n per layer (paired Wilcoxon over windows, Holm "
                     "over those tests alone: figures/data/budget_sweep_formats_wilcoxon.csv)",
        "top-k": "top-5 recall: share of the reference top-5 keys among the estimate's top 5, ties broken by index "
                 "(kvstats.metrics.topk_recall_from_scores); causal rows see only visible keys",
    }
