"""Code fingerprints (kvstats.study.fingerprint): a study's cells are keyed by the code they run and its claims
record the code that computed them (issue 50, item 4).

The static import closure is checked against what Python itself imports (a fresh interpreter's ``sys.modules``
after importing the study): the closure must hold every module the import ran, so no edit of an imported module
can leave a cell's key unchanged."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvstats.study import fingerprint
from kvstats.study.fingerprint import code_fingerprint, function_fingerprint, import_closure, study_fingerprint
from kvstats.study.protocol import StudyRun
from kvstats.study.report import build_report, code_status, read_claims, write_claims
from kvstats.study.sweep import study_args

REPO = Path(__file__).resolve().parents[2]


def _imported_by_python(module: str) -> set[str]:
    """The modules of kvstats and studies that ``import module`` loads in a fresh interpreter."""
    code = (f"import json, sys; import {module}; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('kvstats', 'studies'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.slow  # three fresh interpreters import torch and a study
@pytest.mark.parametrize("module", ["studies.sphere_law", "studies.turboquant_distortion", "studies.nova.cells"])
def test_the_static_closure_holds_every_module_the_import_runs(module):
    closure = set(import_closure(module))
    # compiled modules (kvstats._C) have no Python source: the extension's sources are fingerprinted instead
    missing = {m for m in _imported_by_python(module) if fingerprint.module_path(m) is not None} - closure
    assert not missing, f"{module} imports modules its fingerprint misses: {sorted(missing)}"


def test_closures_follow_what_each_study_imports_and_no_more():
    theory = set(import_closure("studies.sphere_law"))
    real = set(import_closure("studies.nova"))
    assert {"studies", "studies.sphere_law", "kvstats", "kvstats.quant.sphere", "kvstats.study.sweep"} <= theory
    assert not any(m.startswith("kvstats.hf") for m in theory)  # a synthetic study does not run the cache
    assert {"kvstats.hf.capture", "kvstats.studies.nova.cells"} <= real  # the package imports itself so
    assert code_fingerprint("studies.nova") == code_fingerprint("kvstats.studies.nova")  # one file, two names
    # a study script run as __main__ is fingerprinted by its file: the same code, the same fingerprint
    assert code_fingerprint(files=[REPO / "studies" / "formats.py"]) == code_fingerprint("kvstats.studies.formats")
    assert code_fingerprint(files=[REPO / "studies" / "nova" / "cells.py"]) == code_fingerprint("studies.nova.cells")
    assert code_fingerprint("studies.sphere_law") != code_fingerprint("studies.nova")
    assert code_fingerprint("studies.sphere_law") == study_fingerprint("sphere_law")
    assert study_fingerprint("no_such_study") is None


def test_lazy_attributes_count_where_they_are_used(tmp_path):
    """``kvstats.scheme`` / ``from kvstats import quantizer`` load modules through kvstats' PEP 562 table: they are in
    the closure of the file that uses them, not of every importer of kvstats."""
    uses = tmp_path / "uses.py"
    uses.write_text("import kvstats\nfrom kvstats import quantizer\n\n"
                    "def f():\n    return kvstats.scheme('kqv', 4, 8)\n")
    plain = tmp_path / "plain.py"
    plain.write_text("import kvstats\n")
    assert {"kvstats.quant.schemes", "kvstats.quant.quantizers"} <= set(fingerprint._closure(
        tuple(sorted(fingerprint._imports("", uses)))))
    assert fingerprint._imports("", plain) == {"kvstats"}
    assert "kvstats.quant.schemes" not in import_closure("kvstats")


def test_attribute_chains_and_the_extension_count(tmp_path):
    chained = tmp_path / "chained.py"
    chained.write_text("import kvstats\nimport kvstats.evaluation\n\n"
                       "def f():\n    return kvstats.evaluation.sensitivity, kvstats.study.StudyRun\n")
    found = set(fingerprint._closure(tuple(sorted(fingerprint._imports("", chained)))))
    assert {"kvstats.evaluation.sensitivity", "kvstats.study.protocol"} <= found
    # the build that runs, by the record setup.py wrote beside it (an unrebuilt edit still runs the old library)
    from kvstats.quant import ops

    if ops.HAS_EXTENSION:
        record = Path(sys.modules["kvstats._C"].__file__).with_name(fingerprint.BUILD_RECORD)
        assert fingerprint.extension_identity() == b"kvstats._C built from " + record.read_bytes()
    # sources are named by their place in the package, in a checkout as in an installed copy
    assert fingerprint._label((REPO / "studies" / "nova" / "cells.py").resolve()) == "kvstats/studies/nova/cells.py"
    assert fingerprint._label((REPO / "kvstats" / "quant" / "sphere.py").resolve()) == "kvstats/quant/sphere.py"


def test_a_fingerprint_follows_every_byte_of_its_files(tmp_path):
    script = tmp_path / "mine.py"
    script.write_text("from kvstats.quant import sphere\n")
    first = code_fingerprint(files=[script])
    assert code_fingerprint(files=[script]) == first
    script.write_text("from kvstats.quant import sphere\n# a comment\n")
    assert code_fingerprint(files=[script]) != first
    with pytest.raises(ValueError, match="neither"):
        code_fingerprint()
    with pytest.raises(ValueError, match="not a file"):
        code_fingerprint(files=[tmp_path / "absent.py"])
    with pytest.raises(ValueError, match="no_such"):
        import_closure("kvstats.no_such")
    with pytest.raises(ValueError, match="module names"):
        import_closure([])


def test_a_study_cell_recomputes_when_its_code_changes_and_only_then(tmp_path, monkeypatch):
    """StudyRun keys each cell by the fingerprint of its cell function's module: the same code reuses the stored
    cells, an edit of that module computes them again."""
    monkeypatch.setenv("KVSTATS_CELLS_DIR", str(tmp_path / "cells"))
    monkeypatch.syspath_prepend(str(tmp_path))
    source = tmp_path / "mycells.py"
    source.write_text("def cell(x):\n    return [{'x': x, 'y': 2 * x}]\n")

    def run() -> tuple[int, int]:
        module = importlib.import_module("mycells")
        importlib.reload(module)
        study = StudyRun("mine", study_args(None, ["--n-jobs", "1", "--no-progress"]))
        study.sweep(module.cell, [{"x": 1}, {"x": 2}], version="1")
        return study.computed, study.cached

    assert run() == (2, 0)
    assert run() == (0, 2)
    source.write_text("def cell(x):\n    return [{'x': x, 'y': 3 * x}]  # changed\n")
    assert run() == (2, 0)
    assert function_fingerprint(importlib.import_module("mycells").cell) == code_fingerprint(files=[source])


def test_the_report_names_claims_of_other_code(tmp_path):
    """Claims recording the current fingerprint are the commit's; another fingerprint or none is named at the top
    and in the study's section, and refused with require_current."""
    figures = tmp_path / "figures"
    claim = {"id": "c", "claim": "x", "source": "kvstats", "measurement": "m", "data": "d", "verdict": "measured",
             "figure": None, "rule": "r", "reason": "why"}
    write_claims("sphere_law", [claim], figures_dir=figures, code=study_fingerprint("sphere_law"))
    assert read_claims(figures / "data" / "sphere_law_claims.json")[0]["code"] == study_fingerprint("sphere_law")
    text = build_report(figures, studies=["sphere_law"], require_current=True).read_text()
    assert "Not this code's numbers" not in text and "Code: this commit's" in text
    write_claims("jensen", [claim], figures_dir=figures, code="0" * 24)
    write_claims("qjl_variance", [claim], figures_dir=figures)
    write_claims("someone_elses", [claim], figures_dir=figures)
    claims = {s: read_claims(figures / "data" / f"{s}_claims.json")
              for s in ("sphere_law", "jensen", "qjl_variance", "someone_elses")}
    assert code_status(claims) == {"sphere_law": "current", "jensen": "stale", "qjl_variance": "unrecorded",
                                   "someone_elses": "unknown"}
    text = build_report(figures).read_text()
    assert "computed by other code than this commit's: jensen" in text
    assert "recording no code fingerprint (written before they were recorded): qjl_variance" in text
    with pytest.raises(ValueError, match=r"jensen \(stale\), qjl_variance \(unrecorded\)"):
        build_report(figures, require_current=True)
    with pytest.raises(ValueError, match="code must be"):
        write_claims("jensen", [claim], figures_dir=figures, code="")


def test_the_extension_is_named_by_its_build_record_else_by_its_bytes(tmp_path, monkeypatch):
    """Two checkouts of one commit build libraries whose bytes differ (they embed the checkout's absolute paths:
    the sources' __FILE__ in torch's checks), so the fingerprint names a build by the record setup.py writes beside
    it; a library without one is named by its bytes, and no library by a marker."""
    import types

    from kvstats.quant import ops

    library = tmp_path / "_C.abi3.so"
    library.write_bytes(b"\x7fELF /some/checkout/cuda_ext/csrc/ops.cpp")
    monkeypatch.setitem(sys.modules, "kvstats._C", types.SimpleNamespace(__file__=str(library)))
    monkeypatch.setattr(ops, "HAS_EXTENSION", True)
    assert fingerprint.extension_identity() == library.read_bytes()
    (tmp_path / fingerprint.BUILD_RECORD).write_text('{"sources_sha256": "ab"}\n')
    assert fingerprint.extension_identity() == b'kvstats._C built from {"sources_sha256": "ab"}\n'
    library.write_bytes(b"\x7fELF /another/checkout/cuda_ext/csrc/ops.cpp")  # the same build elsewhere
    assert fingerprint.extension_identity() == b'kvstats._C built from {"sources_sha256": "ab"}\n'
    monkeypatch.setattr(ops, "HAS_EXTENSION", False)
    assert fingerprint.extension_identity() == b"no compiled extension: the pure-torch references"


def test_the_built_extension_is_this_checkouts_sources():
    """The record beside the loaded library names the sources it was built from: their sha256 (relative path, a NUL,
    the bytes, over every file under cuda_ext/csrc in sorted order) must be this checkout's, or the library runs
    other code than the checkout holds (rebuild: make setup)."""
    import hashlib

    from kvstats.quant import ops

    if not ops.HAS_EXTENSION:
        pytest.skip("the compiled extension is not loaded: the pure-torch references run")
    record = Path(sys.modules["kvstats._C"].__file__).with_name(fingerprint.BUILD_RECORD)
    if not record.is_file():
        pytest.skip(f"no build record beside the library ({record}): it was built before setup.py wrote one")
    digest = hashlib.sha256()
    for path in sorted((p for p in (REPO / "cuda_ext" / "csrc").rglob("*") if p.is_file()), key=str):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0")
        digest.update(path.read_bytes())
    assert json.loads(record.read_text())["sources_sha256"] == digest.hexdigest()


@pytest.mark.slow  # every study's import closure (about a second each)
def test_no_study_fingerprint_holds_the_report_writer():
    # how REPORT.md is worded moves no number: a study imports its claims writer (kvstats.study.claims_files) and
    # fmt_p (kvstats.study.claims), never kvstats.study.report, so rewording the report leaves every claim current
    studies = sorted(p.stem if p.is_file() else p.name for p in (REPO / "studies").iterdir()
                     if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file())
    assert len(studies) >= 13
    holding = [s for s in studies if "kvstats.study.report" in import_closure(f"studies.{s}")]
    assert not holding, f"these studies' fingerprints include kvstats.study.report: {holding}"
