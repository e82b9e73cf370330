"""Study: a quantized KV cache inside SmolLM2-135M-Instruct — what D'Alberto's KV, KQV and QKQV and the practical
choices (KIVI-style min-max, TurboQuant_mse on K and V as vLLM-style deployments run, NOVA-KV calibrated) do to
the model's output, and how well attention-level metrics predict it.

    python studies/end_to_end --scale quick|paper [--scheduler ADDR] [--n-jobs N]

Units. The shipped public-domain text holds separate documents (:data:`DOCUMENTS`). NOVA-KV is calibrated per
layer on the first (the Declaration of Independence); the others are cut into disjoint segments of
``segment_tokens`` tokens, each inside one document, taken round-robin over the documents. One unit = one
segment, fed to the model on its own; every scheme sees the same segments, so comparisons are paired
(Wilcoxon signed-rank over segments, :func:`kvstats.stats.wilcoxon`). Segments of one document are not
independent: CIs are cluster bootstraps (:func:`kvstats.stats.cluster_bootstrap_ci`: documents, then the segments
within them), and the p-values describe these documents' segments.

Teacher-forced. All segments go through the model in one batched forward with the exact cache (sdpa; computed
once per process and shared by every cell) and once per cell with a :class:`kvstats.cache.KVStatsCache` on the
estimator path (``attn_implementation="kvstats"``: logits against quantized keys come from the scheme's own
estimator). Each layer gets its own scheme seed. Per token: the KL between the exact and quantized next-token
distributions, both NLLs of the true next token, top-1 agreement; and, captured inside the attention function
of the same forward, the attention KL and top-5 recall (mean over 30 layers × 9 query heads). A control cell
runs a lossless scheme through the same cache. Non-zero full-precision windows run at ``window_budget`` only.

Second model. On Gemma 3 270M (kvstats.study.models; its sweeps ``end_to_end_gemma3`` and
``end_to_end_gemma3_paths``) the same teacher-forced cells — D'Alberto's three schemes, KIVI-style min-max and
TurboQuant_mse at every budget, NOVA-KV at 2 bits, QJL's cache, the deployed formats, the lossless control — and the
two paths run on its own segments and captured Q/K/V, and the full-precision windows, judged by the same rules
(claim ids ending in ``-gemma3``); the generation is SmolLM2's only.

Verdicts (kvstats.measure.verdicts). "QKQV is worse than KQV at every budget": the direction rule over (n, metric)
cells; "KQV's KL is 2.25× lower at n = 4": the number rule on the QKQV/KQV ratio of mean attention KL (paired
cluster bootstrap); NOVA-KV's "recovers most of what scalar methods lose at 2 bits": the direction rule
over (baseline, metric) comparisons at n = 2, next-token KL and NLL increase against every other scheme.

Generation. Greedy continuations (``model.generate(..., cache=KVStatsCache(...))``) of prompts cut from the
held-out documents, compared token by token with the exact model's greedy continuation. The prompts of a (scheme, n)
decode in one batch (a batch-1 decode step is bound by reading the weights); a batched fp32 matmul rounds
differently from a single-row one (~5e-7), which can flip a greedy token at a near-tie, as any rounding can.

QJL's cache (its own sweep, ``end_to_end_qjl``): ``kvstats.scheme("qjl_cache")`` at ``qjl_budgets`` (keys
m = n·d sign bits on orthogonalised rows with the 4 largest-magnitude key channels of each layer, found on the
calibration document, in their own sketch; values min-max per token), teacher-forced like every cell and compared
with KIVI-style min-max at the same n.

Paths. The same cache read by the estimator (kvstats_attention) and by decode-then-dot (sdpa on decoded K̂), in
fp32 and in fp64.

quick: 8 segments of 64 tokens, n ∈ {2, 4} (NOVA-KV at n = 2 only, calibrated on the first 1024 tokens), 1 prompt ×
24 new tokens.
paper: every segment of 128 tokens, n = 2..6, a 16-token window at n = 4, 3 prompts × 64 new tokens.

Writes figures/end_to_end_{output,attention,predictivity}.png and in figures/data/: end_to_end.csv (one row per
cell), end_to_end_segments.csv (one row per cell and segment), end_to_end_tokens.csv (one row per token;
regenerated, not kept in git), end_to_end_layers.csv,
end_to_end_correlation.csv, end_to_end_generation.csv, end_to_end_paths.csv, end_to_end_claims.json,
end_to_end_definitions.json. Cells are stored as they finish (kvstats.study.sweep) and run on joblib workers (all
cores; ``--n-jobs 1``: in this process) or a Dask cluster (``--scheduler``); each worker loads the model once.

The package: :mod:`~kvstats.studies.end_to_end.cells` (the constants, the units, the cells; the model, the reference
and quantized forwards and the calibration are kvstats.evaluation's model engine),
:mod:`~kvstats.studies.end_to_end.analysis`, :mod:`~kvstats.studies.end_to_end.figures`,
:mod:`~kvstats.studies.end_to_end.claims`.
"""

from __future__ import annotations

import pandas as pd

from kvstats import study
from kvstats.studies.end_to_end.analysis import (
    Analysis,
    analyse,
    direction_verdict,
    paired_ratio,
    paired_tests,
    ratio_verdict,
    segment_means,
    summary_table,
)
from kvstats.studies.end_to_end.cells import (
    DOCUMENTS,
    FORMATS_VERSION,
    GENERATION_VERSION,
    MODELS_VERSION,
    QJL_VERSION,
    SCALE,
    STUDY,
    VERSION,
    _heldout_ids,
    _quiet,
    agreement_cell,
    baseline_cell,
    cell,
    cell_grid,
    cell_schemes,
    documents,
    generation_cell,
    sweeps,
)
from kvstats.studies.end_to_end.claims import CLAIMS, baseline_claim, definitions
from kvstats.studies.end_to_end.claims import claims as study_claims
from kvstats.studies.end_to_end.figures import figures as study_figures
from kvstats.study.claims import Claim

__all__ = ["CLAIMS", "DOCUMENTS", "POSITION", "SCALE", "STUDY", "VERSION", "Analysis", "EndToEnd", "_heldout_ids",
           "agreement_cell", "analyse", "baseline_cell", "baseline_claim", "cell", "cell_grid", "cell_schemes",
           "definitions", "direction_verdict", "documents", "generation_cell", "main", "paired_ratio", "paired_tests",
           "ratio_verdict", "segment_means", "summary_table"]

POSITION = 90  # place in figures/REPORT.md (kvstats.study.report.study_order)


def print_summary(summary: pd.DataFrame) -> None:
    """The cells without a window, means over seeds per (scheme, n)."""
    cols = ["scheme", "n", "out_kl", "ppl", "top1", "attn_kl", "top5", "bits_per_element", "seconds"]
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(summary[summary["window"] == 0][cols].groupby(["scheme", "n"]).mean().round(4).to_string())


class EndToEnd(study.Study):
    """The study on the protocol (kvstats.study.protocol.Study): the teacher-forced, paths, generation and (when
    transformers' quantized caches are installed) baselines sweeps, three figures and up to ten claims.

    The generation sweep has its own cache version (``versions``); ``main`` is the protocol's but for what it
    prints after the claims: the summary table and the cells' wall time, before writing the claims (echoed) and
    the definitions."""

    name, version, position, description = STUDY, VERSION, POSITION, __doc__
    versions = {f"{STUDY}_generation": GENERATION_VERSION, f"{STUDY}_qjl": QJL_VERSION,
                f"{STUDY}_formats": FORMATS_VERSION, f"{STUDY}_gemma3": MODELS_VERSION,
                f"{STUDY}_gemma3_paths": MODELS_VERSION}

    def cells(self, scale: str) -> study.Sweeps:
        return sweeps(SCALE[scale], scale)

    def analyse(self, tables, scale: str) -> Analysis:
        return analyse(tables, scale)

    def figures(self, tables, a: Analysis) -> None:
        study_figures(a)

    def claims(self, a: Analysis) -> list[Claim]:
        return study_claims(a)

    def definitions(self, a: Analysis) -> dict[str, str]:
        return definitions(a)

    def main(self, argv=None, *, echo: bool = True) -> int:
        run = study.start(self.name, self.description, argv, position=self.position)
        _quiet()
        # one torch thread per cell (the sweep's default): several threads per process spin badly on a shared
        # machine (10-100× slower measured here under load)
        tables = self.run_sweeps(run)
        t_cells = run.elapsed()
        analysis = self.analyse(tables, run.scale)
        self.figures(tables, analysis)
        out = self.claims(analysis)
        print_summary(analysis.summary)
        print(f"(cells {t_cells:.1f} s)")
        return run.finish(out, definitions=self.definitions(analysis), echo=echo)


def main(argv: list[str] | None = None) -> int:
    return EndToEnd().main(argv)
