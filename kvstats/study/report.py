"""figures/REPORT.md: every published claim beside our measurement.

The studies write their claims files (:mod:`kvstats.study.claims_files`, which documents the keys; its names are
re-exported here).

:func:`build_report` assembles ``figures/REPORT.md`` from all claims files (in :func:`study_order`), with a
summary table, the known discrepancies (generated from the claims' ``discrepancy`` texts), one section per
study and the study's figures embedded; ``kvstats reproduce`` calls it after running the studies.

This module holds no measured number and no list of studies: numbers come from the claims files, and the
order from the studies themselves (each study script declares ``POSITION = <int>``, recorded in its claims).
"""

from __future__ import annotations

import ast
import datetime as _dt
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvstats.measure.stats._common import EXACT_MAX_PAIRS
from kvstats.study.claims import CLAIM_KEYS, VERDICTS, SampleSize, fmt_p, validate_claim
from kvstats.study.claims_files import (
    claims_path,
    definitions_path,
    read_claims,
    read_definitions,
    read_timings,
    timings_path,
    write_claims,
    write_definitions,
    write_timings,
)
from kvstats.study.paths import FULL_TIER, default_figures_dir
from kvstats.study.provenance import figures_commit
from kvstats.study.scales import SCALES

__all__ = [
    "CLAIM_KEYS",
    "code_status",
    "sample_text",
    "DEFAULT_PREAMBLE",
    "VERDICTS",
    "build_report",
    "claims_path",
    "definitions_path",
    "read_definitions",
    "write_definitions",
    "default_figures_dir",
    "fmt_p",
    "read_claims",
    "read_timings",
    "script_scales",
    "study_order",
    "timings_path",
    "validate_claim",
    "write_claims",
    "write_timings",
]


def _definitions(fig: Path, studies: Iterable[str]) -> list[str]:
    """The "Definitions" section: per study, what its terms mean, from ``<study>_definitions.json``."""
    lines = []
    for study in studies:
        path = definitions_path(study, fig)
        if path.is_file():
            lines += [f"### {study}", "", "| term | definition |", "|---|---|"]
            lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in read_definitions(path).items()]
            lines.append("")
    return ["## Definitions", "", "What each study's numbers mean, written from the configuration its code ran.",
            "", *lines] if lines else []


def _script_constant(path: str | os.PathLike, name: str) -> Any:
    """The literal value a study assigns to ``name`` at module level (read without importing it), or None: a study
    script ``studies/<name>.py``, or a study package ``studies/<name>/`` (its ``__init__.py``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "__init__.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def script_position(path: str | os.PathLike) -> int | None:
    """The ``POSITION = <int>`` a study declares at module level (read without importing it), or None."""
    value = _script_constant(path, "POSITION")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def script_scales(path: str | os.PathLike) -> tuple[str, ...]:
    """The scales a study runs at: the ``SCALES = (...)`` it declares at module level (read without importing it),
    else every scale (:data:`kvstats.study.sweep.SCALES`). ValueError for a declaration that names no known scale."""
    value = _script_constant(path, "SCALES")
    if value is None:
        return SCALES
    if not isinstance(value, tuple) or not value or any(s not in SCALES for s in value):
        raise ValueError(f"{path}: SCALES must be a non-empty tuple of {list(SCALES)}, got {value!r}")
    return value


def _claims_position(path: Path) -> int | None:
    try:
        positions = {c["position"] for c in read_claims(path) if c["position"] is not None}
    except (OSError, ValueError, TypeError):
        return None
    return min(positions) if positions else None


def study_order(names: Iterable[str] | Mapping[str, str | os.PathLike],
                figures_dir: str | os.PathLike | None = None) -> list[str]:
    """Studies in report order: by the position each declares, then by name; those without one last, by name.

    ``names``: study names (their position is read from their claims files in ``figures_dir``, else from
    ``studies/<name>.py`` or the package ``studies/<name>/`` beside that folder), or a mapping name -> study script
    or package (the ``POSITION`` it declares; else its claims file's).
    """
    scripts = names if isinstance(names, Mapping) else {}
    names = list(names)
    # claims files written before `position` existed: the study script beside the figures folder says it
    studies_dir = Path(figures_dir or default_figures_dir()).resolve().parent / "studies"
    positions = {}
    for name in names:
        pos = script_position(scripts[name]) if name in scripts else None
        if pos is None:
            pos = _claims_position(claims_path(name, figures_dir))
        if pos is None and name not in scripts:
            script = studies_dir / f"{name}.py"
            pos = script_position(script if script.is_file() else studies_dir / name)
        positions[name] = pos
    return sorted(names, key=lambda n: (positions[n] is None, positions[n] or 0, n))


# ------------------------------------------------------------------------------------------- the report

def _mann_whitney_extremes(n: int) -> tuple[float, float, float]:
    """Complete separation of n vs n: (max |Z|/√N, exact two-sided p = 2/C(2n, n), normal-approximation p).

    Z as scipy.stats.mannwhitneyu computes it (continuity correction 0.5); the p is two-sided.
    """
    u_sd = math.sqrt(n * n * (2 * n + 1) / 12)
    z = (n * n / 2 - 0.5) / u_sd
    return z / math.sqrt(2 * n), 2 / math.comb(2 * n, n), math.erfc(z / math.sqrt(2))


def _preamble() -> str:
    r_max, p_exact, p_normal = _mann_whitney_extremes(70)
    return f"""
## How to read this report

- **Verdicts.** *reproduced*: our measurement agrees with the published claim (direction, and the number
  within our CI where a number is claimed) and the data exclude the alternative; *partly*: the direction or
  part of the claim holds, a number or part does not; *not reproduced*: our data exclude it; *inconclusive*:
  the data exclude neither the claim nor its alternative (a CI holding both the claim and the null, a bound
  the CI straddles), printed with the minimum detectable effect and the sample size that would decide it.
  The rules are symmetric in noise: a bound is met only when the CI's far end meets it, and a direction
  against the trivial bound of a quantity (D_mse > 0) does not count. *measured*: our own measurement, with
  no published number to hold it to; *implementation check*: the statement holds by a theorem or by construction, so
  agreeing with it shows that kvstats computes it right, not that the paper is right (*check failed*: it did
  not hold, a defect of kvstats). Each claim names its data and scale; quick-scale verdicts rest on small
  samples. A number is reproduced when it lies in our CI (exact values: equals them) up to a relative
  tolerance the claim declares; the printed digits never widen it, and whether a printed value is the exact
  one correctly rounded is stated beside it.
- **Mann–Whitney effect sizes.** r is the **rank-biserial correlation r = 2U₁/(n₁n₂) − 1**, U₁ the statistic
  of the *first* sample (as scipy reports it), so r < 0 when the first sample (e.g. KQV) tends to be smaller;
  |r| = 1 is complete separation. We also give **Z/√N** (normal approximation, tie-corrected, N = n₁ + n₂),
  which cannot reach ±1 (at 70 vs 70 its maximum is ≈ {r_max:.2f}): a published r = −0.983 at that size must be
  the rank-biserial one.
- **Which p.** Unless stated otherwise p is the **exact** two-sided Mann–Whitney p (no ties and
  n₁n₂ ≤ {EXACT_MAX_PAIRS:,}, e.g. 316 vs 316; beyond that the normal approximation, named as such); the
  normal-approximation p is given beside it where it matters — in the far tail they differ by many orders of
  magnitude (complete separation at 70 vs 70: exact p ≈ {p_exact:.0e}, normal p ≈ {p_normal:.0e}). Multiple
  comparisons are Holm-corrected over the family named in each claim. Ratio CIs are BCa bootstrap CIs of a
  ratio of medians (of means where a claim says so), paired where the units are, and cluster bootstraps (the
  documents, then their segments or windows) where units share a document.
- **Reproducibility.** On one machine this report is the same at any thread or worker count: every cell runs
  on one thread, and `tests/study/test_reproducibility.py` reruns cells at 1 and 2 threads and the study shell with
  1 and 2 workers and compares them bit for bit. Across machines, BLAS kernels differ in the last bits; what
  passes through k-means or through a model's 30 layers (one flipped code cascades) can then move beyond the
  printed digits, while verdicts hold (docs/studies.md, "Reproducibility").
"""


#: Conventions printed at the top of figures/REPORT.md by ``kvstats reproduce`` (the numbers in it are computed,
#: not measured). The known discrepancies follow, generated from the claims (:func:`build_report`).
DEFAULT_PREAMBLE = _preamble()


def _discrepancies(claims: Mapping[str, list[dict[str, Any]]]) -> list[str]:
    """The "Known discrepancies" section: each claim's ``discrepancy`` text, linked to its claim."""
    items = [f"- {c['discrepancy'].strip()} ([{study}: {c['id']}](#{_anchor(c)}))"
             for study, cs in claims.items() for c in cs if c["discrepancy"]]
    if not items:
        return []
    return ["## Known discrepancies (details in the claims below)", "", *items, ""]


def _anchor(claim: dict[str, Any]) -> str:
    """GitHub's anchor of the claim's heading ``### <id> — <verdict>``."""
    text = f"{claim['id']} — {_VERDICT_MARK[claim['verdict']]}".lower()
    return "".join(ch for ch in text.replace(" ", "-") if ch.isalnum() or ch in "-_")


_VERDICT_MARK = {"reproduced": "✅ reproduced", "not reproduced": "❌ not reproduced", "partly": "◐ partly",
                 "inconclusive": "❔ inconclusive",
                 "measured": "· measured", "not testable here": "⊘ not testable here",
                 "implementation check": "☑ implementation check", "check failed": "⚠ check failed"}


def _cell(text: str | None) -> str:
    return (text or "—").replace("|", "\\|").replace("\n", " ")


def _study_figures(figures_dir: Path, study: str, claims: list[dict], prefix: str = "") -> list[str]:
    """The study's PNGs: those its claims name, then every ``<study>_*.png`` / ``<study>.png`` (named ``prefix`` +
    file name: the full tier's are under ``full/``), no repeats."""
    named = [c["figure"] for c in claims if c["figure"]]
    globbed = sorted(prefix + p.name for p in figures_dir.glob(f"{study}*.png")
                     if p.stem == study or p.stem.startswith(study + "_"))
    return list(dict.fromkeys(named + globbed))


def _claims_files(folder: Path) -> dict[str, Path]:
    """``{study: <folder>/data/<study>_claims.json}`` of every claims file in a tier's folder."""
    return {p.name[: -len("_claims.json")]: p for p in sorted((folder / "data").glob("*_claims.json"))}


def _tier(claim: Mapping[str, Any]) -> str:
    """The tier a report row comes from: the full tier's folder, else the scale its claims record."""
    return claim.get("tier") or claim.get("scale") or "—"


def _code_words(status: str, claims: Sequence[Mapping[str, Any]]) -> str:
    code = ", ".join(sorted({c.get("code") for c in claims} - {None}))
    return {"current": f"this commit's (fingerprint {code}).",
            "stale": f"**other than this commit's** (claims record {code}).",
            "unrecorded": "**not recorded** (claims written before code fingerprints).",
            "unknown": "not a shipped study (no fingerprint to compare)."}[status]


def _tier_lines(claims: Mapping[str, list[dict[str, Any]]], full_status: Mapping[str, str]) -> list[str]:
    """The report's statement of its two tiers: how many rows each gives and whose code computed the full tier's."""
    rows = [c for cs in claims.values() for c in cs]
    full_rows = [c for c in rows if c.get("tier") == FULL_TIER]
    not_current = sorted(s for s, v in full_status.items() if v in ("stale", "unrecorded")
                         and any(c.get("tier") == FULL_TIER for c in claims.get(s, [])))
    return [f"**Tiers.** {len(rows) - len(full_rows)} rows come from this run; {len(full_rows)} from the full tier "
            "(`kvstats reproduce --scale full`, figures/full: the second model's rows, descriptive sweeps, long "
            "contexts, every format at every budget), which this run does not recompute. Each row names its tier."
            + (f" The full tier's rows of {', '.join(not_current)} were not computed by this commit's code (see "
               "their sections)." if not_current else ""), ""]


def _timing_table(title: str, timings: Mapping[str, float], note: str | None) -> list[str]:
    return ([f"**{title}**" + (f": {note}" if note else ""), "", "| study | wall time (s) |", "|---|---:|"]
            + [f"| {s} | {t:.0f} |" for s, t in timings.items()]
            + [f"| **total** | **{sum(timings.values()):.0f}** |", ""])


def _study_scales(claims: Mapping[str, list[dict[str, Any]]], default: str) -> dict[str, str]:
    """The scale each study ran at: the one its claims record, else ``default`` (the command's scale)."""
    out = {}
    for study, cs in claims.items():
        recorded = {c["scale"] for c in cs if c["scale"]}
        out[study] = "/".join(sorted(recorded)) if recorded else default
    return out


def _scale_line(scales: Mapping[str, str], default: str) -> str:
    """``paper`` when every study ran at one scale; else the majority scale and the exceptions."""
    values = list(scales.values())
    if not values:
        return default
    main = max(set(values), key=values.count)
    others = {s: v for s, v in scales.items() if v != main}
    if not others:
        return main
    return f"{main}, except " + ", ".join(f"{s} ({v})" for s, v in others.items())


def code_status(claims: Mapping[str, list[dict[str, Any]]]) -> dict[str, str]:
    """Per study, whether its claims are the current code's: ``"current"`` (every claim records the fingerprint
    :func:`kvstats.study.fingerprint.study_fingerprint` gives now), ``"stale"`` (some record another),
    ``"unrecorded"`` (some record none: written before fingerprints, or by code that did not pass one) or
    ``"unknown"`` (not a shipped study: nothing to compare with)."""
    from kvstats.study.fingerprint import study_fingerprint

    status = {}
    for study, cs in claims.items():
        now = study_fingerprint(study)
        recorded = {c.get("code") for c in cs}
        status[study] = ("unknown" if now is None else "unrecorded" if None in recorded
                         else "current" if recorded == {now} else "stale")
    return status


def _code_lines(status: Mapping[str, str]) -> list[str]:
    """The report's statement of which studies' claims other code computed."""
    other = {k: [s for s, v in status.items() if v == k] for k in ("stale", "unrecorded")}
    if not other["stale"] and not other["unrecorded"]:
        return []
    parts = []
    if other["stale"]:
        parts.append(f"computed by other code than this commit's: {', '.join(other['stale'])}")
    if other["unrecorded"]:
        parts.append(f"recording no code fingerprint (written before they were recorded): "
                     f"{', '.join(other['unrecorded'])}")
    return [f"**Not this code's numbers** — claims {'; '.join(parts)}. Rerun those studies "
            "(`kvstats reproduce`) for numbers this commit computes.", ""]


#: What a claim without a recorded sample size says, by the rule that labelled it (these rules test nothing).
_NO_TEST = {"measured": "none planned: a measurement of our own, held to no test",
            "not testable": "none planned: not testable here",
            "implementation check": "none planned: an implementation check (it holds by construction; no data can "
                                    "contradict the paper)"}


def sample_text(sample: Mapping[str, Any] | str | None, rule: str | None = None) -> str:
    """A claim's planned sample size in words (:class:`kvstats.study.claims.SampleSize` as stored), the reason none
    applies, or — for a claim that recorded none — what its rule implies (:data:`_NO_TEST`; a rule that tests and
    records no plan is flagged)."""
    if isinstance(sample, str):
        return sample.rstrip(".") + "."
    if not sample:
        return _NO_TEST.get(rule, "**no plan recorded** for a verdict by a test") + "."
    mde = ("no effect is detectable with that power there" if sample["mde"] is None
           else f"minimum detectable {sample['mde_of']} there {sample['mde']:.3g}")
    short = " — **fewer than planned**" if SampleSize(**sample).under_powered else ""
    return (f"{sample['achieved_n']:,} {sample['unit']} achieved, {sample['planned_n']:,} planned "
            f"({sample['test']}, {sample['power']:.0%} power for {sample['effect']}); {mde}{short}.")


def _sample_counts(rows: Sequence[Mapping[str, Any]]) -> str:
    """One tier's sample sizes in words: planned by power (and which got fewer than planned), computed without
    sampling, labels that test nothing, and verdicts by a test with no plan recorded."""
    planned = [c for c in rows if isinstance(c.get("sample"), Mapping)]
    reasons = [c for c in rows if isinstance(c.get("sample"), str)]
    untested = [c for c in rows if not c.get("sample") and c.get("rule") in _NO_TEST]
    missing = [c["id"] for c in rows if not c.get("sample") and c.get("rule") not in _NO_TEST]
    short = [c["id"] for c in planned if SampleSize(**c["sample"]).under_powered]
    parts = [f"{len(planned)} of {len(rows)} claims planned by power"
             + (f" ({len(short)} got fewer than planned: {', '.join(short)})" if short else ""),
             f"{len(reasons)} without sampling", f"{len(untested)} measurements or labels that test nothing"]
    if missing:
        parts.append(f"**{len(missing)} verdicts by a test with no plan recorded**: {', '.join(missing)}")
    return "; ".join(parts)


def _sample_line(claims: Mapping[str, list[dict[str, Any]]]) -> list[str]:
    """How the claims' sample sizes stand, per tier (:func:`_sample_counts`)."""
    rows = [c for cs in claims.values() for c in cs]
    if not rows:
        return []
    tiers = list(dict.fromkeys(_tier(c) for c in rows))
    if len(tiers) == 1:
        return ["Sample sizes: " + _sample_counts(rows) + ".", ""]
    return ["Sample sizes, " + "; ".join(f"{tier} tier: " + _sample_counts([c for c in rows if _tier(c) == tier])
                                         for tier in tiers) + ".", ""]


def build_report(
    figures_dir: str | os.PathLike | None = None,
    *,
    scale: str = "quick",
    studies: Sequence[str] | None = None,
    timings: Mapping[str, float] | None = None,
    preamble: str | None = None,
    date: _dt.datetime | None = None,
    out: str | os.PathLike | None = None,
    failed: Sequence[str] = (),
    require_current: bool = False,
) -> Path:
    """Assemble ``figures/REPORT.md`` from every ``figures/data/*_claims.json``.

    Args:
        figures_dir: the figures folder (default :func:`default_figures_dir`).
        scale: the scale of the command (stated at the top); a study whose claims record their own scale
            (``write_claims(scale=)``) is reported at that one, and a mixed run names the exceptions.
        studies: the studies to include, in this order (default: every claims file, in :func:`study_order`).
            The full tier's rows (``<figures_dir>/full``, :func:`kvstats.study.paths.tier_dir`) that the folder's
            own claims lack follow each study's, each row naming its tier, their figures under ``full/`` and that
            tier's code status and timing table beside; a study only the full tier runs is included whole.
        timings: wall seconds per study (shown in the run table; default the folder's recorded ones,
            :func:`write_timings`, when they are of ``scale``).
        preamble: markdown inserted after the header (conventions, how to read the verdicts).
        date: the run's date (default now, UTC).
        out: output path (default ``<figures_dir>/REPORT.md``).
        failed: studies that failed in this run (named at the top: their claims files, if any, are stale).
        require_current: refuse (ValueError naming them) studies whose claims in this folder are not the current
            code's (:func:`code_status`); otherwise the report names them at the top and in their sections. The full
            tier's rows are never refused: the report states whose code computed them.

    Returns:
        the path written.
    """
    fig = Path(figures_dir or default_figures_dir())
    found = _claims_files(fig)
    # the full tier's rows (<figures>/full, kvstats.study.paths.tier_dir) that this folder's claims lack
    full = fig / FULL_TIER if fig.name != FULL_TIER else None
    found_full = _claims_files(full) if full is not None else {}
    wanted = [*found, *found_full] if studies is None else studies
    order = study_order(list(dict.fromkeys([*wanted, *found_full])), fig)
    if studies is not None and [s for s in order if s in studies] != list(studies):  # the caller's order first
        order = [*studies, *(s for s in order if s not in studies)]
    claims = {s: read_claims(found[s]) for s in order if s in found}
    status = code_status(claims)
    if require_current and any(v in ("stale", "unrecorded") for v in status.values()):
        raise ValueError("claims not computed by the current code: " + ", ".join(
            f"{s} ({v})" for s, v in status.items() if v in ("stale", "unrecorded")) + "; rerun those studies")
    full_claims = {s: read_claims(found_full[s]) for s in order if s in found_full}
    full_status = code_status(full_claims)
    for s, cs in full_claims.items():
        ours = {c["id"] for c in claims.get(s, [])}
        added = [c | {"figure": f"{FULL_TIER}/{c['figure']}" if c["figure"] else None, "tier": FULL_TIER}
                 for c in cs if c["id"] not in ours]
        if added:
            claims[s] = claims.get(s, []) + added
    claims = {s: claims[s] for s in order if s in claims}
    date = date or _dt.datetime.now(_dt.timezone.utc)
    ours = {s: [c for c in cs if "tier" not in c] for s, cs in claims.items()}
    scales = _study_scales({s: cs for s, cs in ours.items() if cs}, scale)
    any_quick = "quick" in scales.values()
    lines = [
        "# kvstats — published claims against our measurements",
        "",
        f"Generated by `kvstats reproduce --scale {scale}` on {date:%Y-%m-%d %H:%M} UTC "
        f"(commit {figures_commit(fig)}). **Scale: {_scale_line(scales, scale)}.**"
        + (" Quick-scale sample sizes are small: p-values and CIs of quick-scale studies are those of the quick "
           "run, not the paper-scale numbers; `kvstats reproduce --scale paper` reruns at the sizes the claims need."
           if any_quick else ""),
        "",
        "Do not edit: this file is regenerated from `figures/data/*_claims.json` by "
        "`kvstats.study.report.build_report`.",
        "",
    ]
    if failed:
        lines += [f"**Failed in this run: {', '.join(failed)}** — their sections below (if any) come from an "
                  "earlier run.", ""]
    lines += _code_lines(status)
    if full_claims:
        lines += _tier_lines(claims, full_status)
    if preamble:
        lines += [preamble.strip(), ""]
    lines += _discrepancies(claims)
    lines += _definitions(fig, claims)
    counts = {v: sum(c["verdict"] == v for cs in claims.values() for c in cs) for v in VERDICTS}
    lines += ["## Summary", "",
              "Verdicts: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n) + ".", "",
              *_sample_line(claims),
              "| study | claim | tier | verdict | our measurement |", "|---|---|---|---|---|"]
    for study, cs in claims.items():
        for c in cs:
            lines.append(f"| [{study}](#{study}) | {_cell(c['claim'])} | {_tier(c)} | "
                         f"{_VERDICT_MARK[c['verdict']]} | {_cell(c['measurement'])} |")
    lines.append("")
    recorded = read_timings(fig)
    if timings is None and recorded is not None and recorded["scale"] == scale:
        timings = recorded["studies"]
    if timings:
        lines += _timing_table(f"Wall time of this run ({scale} scale)", timings, None)
    full_timings = read_timings(full) if full_claims else None
    if full_timings:
        lines += _timing_table(f"Wall time of the full tier's run ({full_timings['date']}, commit "
                               f"{full_timings['commit']})", full_timings["studies"], full_timings.get("note"))
    for study, cs in claims.items():
        mine = ours[study]
        head = []
        if mine:
            head.append(f"Scale: {scales[study]}. Code: " + _code_words(status[study], mine))
        if len(mine) < len(cs):
            head.append(f"{len(cs) - len(mine)} row(s) from the full tier (figures/full): code "
                        + _code_words(full_status[study], full_claims[study]))
        lines += [f"## {study}", "", " ".join(head), ""]
        for c in cs:
            lines += [
                f"### {c['id']} — {_VERDICT_MARK[c['verdict']]}",
                "",
                f"- **Tier:** {_tier(c)}",
                f"- **Claim:** {c['claim']}",
                f"- **Source:** {c['source']}",
                f"- **Measured:** {c['measurement']}",
                f"- **Data:** {c['data']}",
            ]
            if c["rule"]:
                lines.append(f"- **Verdict by the {c['rule']} rule:** {c['reason']}")
            unplanned_full = c.get("tier") == FULL_TIER and not c["sample"] and c["rule"] not in _NO_TEST
            lines.append("- **Sample size:** " + ("**no plan recorded**: the full tier's run predates sample plans "
                                                  "(rerun the full tier)." if unplanned_full
                                                  else sample_text(c["sample"], c["rule"])))
            if c["figure"]:
                lines.append(f"- **Figure:** [{c['figure']}]({c['figure']})")
            lines.append("")
            if c["details"]:
                lines += [c["details"].strip(), ""]
        figs = _study_figures(fig, study, mine)
        if full is not None and len(mine) < len(cs):
            figs += [f for f in _study_figures(full, study, [c for c in cs if "tier" in c], FULL_TIER + "/")
                     if f not in figs and Path(f).name not in figs]
        if figs:
            lines += [f"#### Figures of {study}", ""]
            lines += [f"![{Path(f).stem}]({f})\n" for f in figs]
    missing = [s for s in order if s not in claims]
    if missing:
        lines += ["## Studies without a claims file", "", ", ".join(missing), ""]
    path = Path(out) if out else fig / "REPORT.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return path
