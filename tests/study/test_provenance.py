"""kvstats.study.provenance: the commit of a source checkout, and of an installed copy as pip recorded it in
direct_url.json (PEP 610): from a git URL its commit_id, from a local folder that folder's checkout."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess

import pytest

from kvstats.study import provenance, report


class _Distribution:
    version = "0.0.test"

    def __init__(self, direct_url: str | None):
        self.direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        return self.direct_url if name == "direct_url.json" else None


def _installed(monkeypatch, record) -> None:
    """kvstats seen as an installed copy (no source checkout) whose direct_url.json is ``record``."""
    text = None if record is None else (record if isinstance(record, str) else json.dumps(record))
    monkeypatch.setattr(provenance, "source_root", lambda: None)
    real = importlib.metadata.distribution
    monkeypatch.setattr(importlib.metadata, "distribution",
                        lambda name: _Distribution(text) if name == "kvstats" else real(name))


def _checkout(path) -> str:
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "f.txt").write_text("x")
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    return subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_an_install_from_git_reports_the_commit_pip_recorded(monkeypatch):
    _installed(monkeypatch, {"url": "https://github.com/example/kvstats.git",
                             "vcs_info": {"vcs": "git", "commit_id": "0123456789abcdef0123456789abcdef01234567",
                                          "requested_revision": "main"}})
    assert provenance.kvstats_commit() == "0123456 (installed by pip from git)"
    assert provenance.provenance(started=0.0)["kvstats_commit"] == "0123456 (installed by pip from git)"


def test_an_install_from_a_folder_reports_that_checkout(monkeypatch, tmp_path):
    short = _checkout(tmp_path)
    _installed(monkeypatch, {"url": tmp_path.as_uri(), "dir_info": {"editable": False}})
    assert provenance.kvstats_commit() == short


@pytest.mark.parametrize("record", [None, {"url": "https://example.org/kvstats-0.1.tar.gz", "archive_info": {}},
                                    "{not json"])
def test_without_a_recorded_commit_it_is_unknown(monkeypatch, record):
    _installed(monkeypatch, record)
    assert provenance.kvstats_commit() == "unknown"


def test_the_report_names_the_installed_commit_when_its_folder_is_no_checkout(monkeypatch, tmp_path):
    _installed(monkeypatch, {"url": "https://github.com/example/kvstats.git",
                             "vcs_info": {"vcs": "git", "commit_id": "fedcba9876543210fedcba9876543210fedcba98"}})
    (tmp_path / "figures" / "data").mkdir(parents=True)
    text = report.build_report(tmp_path / "figures", scale="quick", studies=[]).read_text()
    assert "(commit fedcba9 (installed by pip from git))" in text
