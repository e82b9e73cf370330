"""The files a study writes beside its figures: its claims, its definitions and the tier's timings.

Each study writes ``figures/data/<study>_claims.json``: a JSON list of claim objects, one per claim it
checks (or per measurement of its own), with these keys:

=============  ==============================================================================================
key            meaning
=============  ==============================================================================================
``id``         short stable identifier, unique within the study (``"dalberto-ratio-n4"``)
``claim``      the published claim in words, with its numbers
``source``     paper and where in it (``"D'Alberto, arXiv 2605.08114, abstract"``); ``"kvstats"`` for our own
``measurement`` what we measured, with numbers, CI, effect size and p (and which p) as text
``data``       which data and at which scale (``"synthetic gaussian, d=128, seq 512, 12 trials (quick)"``)
``verdict``    one of :data:`kvstats.measure.verdicts.VERDICTS`: ``"reproduced"``, ``"partly"``, ``"not reproduced"``,
               ``"inconclusive"``, ``"measured"`` (no published counterpart), ...
``figure``     path of the figure relative to ``figures/`` (``"budget_sweep_kl.png"``), or null
``details``    optional markdown (a table, a caveat); may be omitted or null
``scale``      optional: the scale the study ran at (``"quick"``, ``"paper"`` or ``"full"``), set by
               ``write_claims(scale=)``
``position``   optional: the study's place in the report (an int, smaller first), set by ``write_claims(position=)``
``discrepancy`` optional: one sentence, computed by the study from its numbers, stating where a published
               number or statement disagrees with ours; listed under "Known discrepancies" in REPORT.md
``rule``       the verdict rule that produced ``verdict`` (:mod:`kvstats.measure.verdicts`); set from a ``Verdict``
``reason``     the rule's sentence, generated from the numbers it saw; set from a ``Verdict``
``code``       the fingerprint of the code that computed it (:mod:`kvstats.study.fingerprint`)
``sample``     its sample size planned by power (:class:`kvstats.study.claims.SampleSize`), or the reason none applies
=============  ==============================================================================================

Files written before ``position`` and ``discrepancy`` existed stay valid (the keys are optional).

    from kvstats.study.claims_files import write_claims
    write_claims("budget_sweep", [Claim(...), ...], scale="paper")

The report (:mod:`kvstats.study.report`) reads these files; the studies never import it, so a change to how the
report is written leaves every study's code fingerprint, and with it every committed claim, current.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvstats.study.claims import _REQUIRED, Claim, _check_position, validate_claim
from kvstats.study.paths import data_dir, default_figures_dir
from kvstats.study.provenance import figures_commit
from kvstats.study.scales import SCALES

__all__ = ["claims_path", "definitions_path", "read_claims", "read_definitions", "read_timings", "timings_path",
           "write_claims", "write_definitions", "write_timings"]


def claims_path(study: str, figures_dir: str | os.PathLike | None = None) -> Path:
    """``<figures_dir>/data/<study>_claims.json``."""
    return data_dir(figures_dir) / f"{study}_claims.json"


def write_claims(study: str, claims: Sequence[Mapping[str, Any]], *, scale: str | None = None,
                 position: int | None = None, figures_dir: str | os.PathLike | None = None,
                 echo: bool = False, code: str | None = None) -> Path:
    """Validate ``claims`` (:class:`kvstats.study.claims.Claim` records, or dicts of :data:`CLAIM_KEYS`) and write
    them to ``figures/data/<study>_claims.json`` (atomically); return the path.

    Ids must be unique within the study. ``scale`` (``"quick"``/``"paper"``) is recorded in every claim, so
    a report assembled from studies run at different scales says which ran at which; ``position`` (the
    study's ``POSITION``) is recorded likewise and orders the report; ``code``, the fingerprint of the code that
    computed them (:func:`kvstats.study.fingerprint.study_fingerprint`), too, so :func:`build_report` can tell
    claims of other code. ``figures_dir``
    defaults to :func:`default_figures_dir`. With ``echo`` each claim is printed as
    ``[verdict] id: measurement`` (what a study shows its user).
    """
    if not isinstance(study, str) or not study or "/" in study:
        raise ValueError(f"study must be a study name like 'budget_sweep', got {study!r}")
    if isinstance(claims, (str, bytes, Mapping)) or not isinstance(claims, Iterable):
        raise TypeError(f"claims must be a list of Claims (or dicts), got {type(claims).__name__}")
    if scale is not None and scale not in SCALES:
        raise ValueError(f"scale must be one of {list(SCALES)} or None, got {scale!r}")
    _check_position(position, "position")
    checked = [validate_claim(c.to_dict() if isinstance(c, Claim) else c, f"claims[{i}]", strict=True)
               for i, c in enumerate(claims)]
    if scale is not None:
        checked = [c | {"scale": scale} for c in checked]
    if position is not None:
        checked = [c | {"position": position} for c in checked]
    if code is not None:
        if not isinstance(code, str) or not code:
            raise ValueError(f"code must be a code fingerprint (a non-empty string), got {code!r}")
        checked = [c | {"code": code} for c in checked]
    ids = [c["id"] for c in checked]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"claim ids must be unique within study {study!r}, repeated: {dupes}")
    path = claims_path(study, figures_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    # optional keys that are None are left out: files keep the shape older readers know
    payload = [{k: v for k, v in c.items() if v is not None or k in _REQUIRED or k == "details"} for c in checked]
    tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    if echo:
        for c in checked:
            print(f"[{c['verdict']}] {c['id']}: {c['measurement']}")
    return path


def read_claims(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read and validate one claims file."""
    path = Path(path)
    payload = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(payload, list):
        raise ValueError(f"{path} must hold a JSON list of claims, got {type(payload).__name__}")
    return [validate_claim(c, f"{path.name}[{i}]") for i, c in enumerate(payload)]


def definitions_path(study: str, figures_dir: str | os.PathLike | None = None) -> Path:
    """``<figures_dir>/data/<study>_definitions.json``."""
    return data_dir(figures_dir) / f"{study}_definitions.json"


def write_definitions(study: str, definitions: Mapping[str, str], *,
                      figures_dir: str | os.PathLike | None = None) -> Path:
    """Write what the study's numbers mean (``{term: definition}``, e.g. ``{"sketch": "srht, m = d"}``).

    The texts should be generated from the study's configuration (the constants its cells use), so the
    report's "Definitions" section states what the code ran. Written atomically; returns the path.
    """
    if not isinstance(definitions, Mapping) or not definitions:
        raise TypeError(f"definitions must be a non-empty dict of str -> str, got {definitions!r}")
    for key, value in definitions.items():
        if not isinstance(key, str) or not key.strip() or not isinstance(value, str) or not value.strip():
            raise ValueError(f"definitions must map non-empty strings to non-empty strings, got {key!r}: {value!r}")
    path = definitions_path(study, figures_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(dict(definitions), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def read_definitions(path: str | os.PathLike) -> dict[str, str]:
    """Read one definitions file (see :func:`write_definitions`)."""
    path = Path(path)
    payload = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(payload, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in payload.items()):
        raise ValueError(f"{path} must hold a JSON object of strings")
    return payload


def timings_path(figures_dir: str | os.PathLike | None = None) -> Path:
    """``<figures_dir>/data/timings.json``: the wall time of each study in the tier's last ``kvstats reproduce``."""
    return data_dir(figures_dir) / "timings.json"


def write_timings(timings: Mapping[str, float], *, scale: str, figures_dir: str | os.PathLike | None = None,
                  note: str | None = None) -> Path:
    """Record a run's wall seconds per study (``timings``), its scale and when and on what it ran (threads, workers,
    CPUs) beside its claims: the report prints each tier's own timing table from it."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {list(SCALES)}, got {scale!r}")
    for study, seconds in timings.items():
        if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"timings[{study!r}] must be finite seconds ≥ 0, got {seconds!r}")
    path = timings_path(figures_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"scale": scale, "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "commit": figures_commit(Path(figures_dir or default_figures_dir())), "cpus": os.cpu_count(),
               "note": note, "studies": {k: round(float(v), 1) for k, v in timings.items()}}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def read_timings(figures_dir: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """The tier's recorded timings (:func:`write_timings`), or None where none were recorded."""
    path = timings_path(figures_dir)
    if not path.is_file():
        return None
    payload = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(payload, dict) or not isinstance(payload.get("studies"), dict):
        raise ValueError(f"{path} must hold a JSON object with a 'studies' object of seconds")
    if payload.get("scale") not in SCALES:
        raise ValueError(f"{path}: 'scale' must be one of {list(SCALES)}, got {payload.get('scale')!r}")
    for study, seconds in payload["studies"].items():
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                or seconds < 0:
            raise ValueError(f"{path}: studies[{study!r}] must be finite seconds >= 0, got {seconds!r}")
    for key in ("date", "commit"):
        if not isinstance(payload.get(key), str):
            raise ValueError(f"{path}: {key!r} must be a string, got {payload.get(key)!r}")
    return payload
