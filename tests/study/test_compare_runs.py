"""scripts/compare_runs.py: another run's figures folder against the committed one (issue 50, item 5)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pandas as pd

from kvstats.measure import verdicts as V
from kvstats.study.report import DEFAULT_PREAMBLE, build_report, write_claims

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_runs.py"


def _script():
    spec = importlib.util.spec_from_file_location("compare_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _folder(root: Path) -> Path:
    claim = {"id": "a", "claim": "c", "source": "kvstats", "measurement": "m 1.0", "data": "d",
             "verdict": V.measured("m"), "figure": None}
    write_claims("mine", [claim], scale="paper", figures_dir=root)
    pd.DataFrame({"x": [1.0, 2.0], "seconds": [0.5, 0.7]}).to_csv(root / "data" / "mine.csv", index=False)
    (root / "mine.png").write_bytes(b"png")
    build_report(root, scale="paper", preamble=DEFAULT_PREAMBLE, timings={"mine": 3.0})
    return root


def test_identical_runs_apart_from_timings_pass_and_any_other_difference_is_named(tmp_path, capsys):
    main = _script().main
    ours = _folder(tmp_path / "ours")
    other = tmp_path / "other"
    shutil.copytree(ours, other)
    pd.DataFrame({"x": [1.0, 2.0], "seconds": [9.0, 9.0]}).to_csv(other / "data" / "mine.csv", index=False)
    assert main([str(other), "--committed", str(ours)]) == 0  # cell timings differ: identical apart from timings
    assert "identical apart from timings" in capsys.readouterr().out
    pd.DataFrame({"x": [1.0, 2.5], "seconds": [9.0, 9.0]}).to_csv(other / "data" / "mine.csv", index=False)
    (other / "mine.png").write_bytes(b"another png")
    assert main([str(other), "--committed", str(ours)]) == 1
    out = capsys.readouterr().out
    assert "table differs: data/mine.csv" in out and "figure differs: mine.png" in out
    write_claims("mine", [{"id": "a", "claim": "c", "source": "kvstats", "measurement": "m 1.1", "data": "d",
                           "verdict": V.measured("m"), "figure": None}], scale="paper", figures_dir=other)
    assert main([str(other), "--committed", str(ours)]) == 1
    out = capsys.readouterr().out
    assert "file differs: data/mine_claims.json" in out and "REPORT.md differs" in out and "+" in out
