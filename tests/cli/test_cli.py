"""The ``kvstats`` command with hostile files: each bad model, text, output or cached capture gets one line on
stderr naming the file and the problem, a non-zero exit, no traceback and nothing left behind; ``--help`` is
instant (no torch or transformers import); ``capture`` takes a bounded number of tokens by default and shows
progress. Every file is small and made here (a tiny random Llama, no download)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvstats.cli.capture import CAPTURE_TOKENS
from kvstats.cli.parser import main

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict:
    """Subprocesses import this checkout's kvstats, whatever is installed."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def _one_line_error(capsys, *needles: str) -> str:
    out = capsys.readouterr()
    err = out.err.strip()
    assert "Traceback" not in out.err and "Traceback" not in out.out
    last = err.splitlines()[-1]
    assert last.startswith("kvstats capture: error: "), err
    for needle in needles:
        assert needle in last, (needle, last)
    return last


def _nothing_left(folder: Path, before: set[str]) -> None:
    left = {p.name for p in folder.iterdir()} - before
    assert not left, f"left behind: {sorted(left)}"


# ------------------------------------------------------------------------------------ --help, --version


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_import_neither_torch_nor_transformers(flag):
    code = (
        "import sys, kvstats.cli.parser\n"
        "try:\n"
        f"    kvstats.cli.parser.main([{flag!r}])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'pandas', 'scipy') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout, done.stdout
    assert ("capture" in done.stdout) if flag == "--help" else ("kvstats" in done.stdout)


def test_default_token_count_matches_the_data_layer():
    from kvstats.hf.capture import DEFAULT_CAPTURE_TOKENS

    assert CAPTURE_TOKENS == DEFAULT_CAPTURE_TOKENS


@pytest.mark.parametrize("target", ["inf", "nan", "-1"])
def test_sensitivity_target_must_be_finite_and_non_negative_before_any_work(target, tmp_path, capsys):
    from kvstats.evaluation.sensitivity import sensitivity

    missing = str(tmp_path / "no_model")  # never reached: the target is refused first
    assert main(["sensitivity", "--quantizer", "kqv", "--bits", "2", "--model", missing, "--target", target]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kvstats sensitivity: error: --target must be a finite number >= 0 (a mean next-token KL "
                          f"in nats), got {float(target)}") and "Traceback" not in err
    with pytest.raises(ValueError, match=rf"^target must be a finite number >= 0 .*got {float(target)}"):
        sensitivity("kqv", bits=2, model=missing, target=float(target))


# ------------------------------------------------------------------------------------------ model files

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")


# `tiny_folder` (the tiny Llama saved as a Hugging Face folder) comes from tests/conftest.py


@pytest.fixture
def text_file(tmp_path):
    from tests.helpers.texts import WORDS

    path = tmp_path / "text.txt"
    path.write_text(" ".join(WORDS * 4), encoding="utf-8")  # 64 tokens of the word-level tokenizer
    return path


@pytest.fixture
def out_dir(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def _capture(model, text_file, out, *more):
    return main(["capture", "--model", str(model), "--text", str(text_file), "--out", str(out), "--no-progress",
                 *more])


def _broken_copy(tiny_folder, tmp_path, name, damage) -> Path:
    folder = tmp_path / "broken_model"
    shutil.copytree(tiny_folder, folder)
    damage(folder / name)
    return folder


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_truncated_model_safetensors(tiny_folder, tmp_path, text_file, out_dir, capsys):
    model = _broken_copy(tiny_folder, tmp_path, "model.safetensors", _truncate)
    assert _capture(model, text_file, out_dir / "cap.safetensors") == 2
    _one_line_error(capsys, "model.safetensors", "truncated or corrupt")
    _nothing_left(out_dir, set())


def test_broken_config_json(tiny_folder, tmp_path, text_file, out_dir, capsys):
    model = _broken_copy(tiny_folder, tmp_path, "config.json", lambda p: p.write_text('{"model_type": "llama", '))
    assert _capture(model, text_file, out_dir / "cap.safetensors") == 2
    _one_line_error(capsys, "config.json", "not valid JSON")
    _nothing_left(out_dir, set())


@pytest.mark.parametrize("content", [b"", b"GGUF\x03\x00", b"not a gguf file at all, just text" * 3])
def test_tiny_gguf(content, tmp_path, text_file, out_dir, capsys):
    model = tmp_path / "tiny.gguf"
    model.write_bytes(content)
    assert _capture(model, text_file, out_dir / "cap.safetensors") == 2
    _one_line_error(capsys, "tiny.gguf", "not a GGUF file", f"{len(content)} bytes")
    _nothing_left(out_dir, set())


def test_truncated_gguf(tmp_path, text_file, out_dir, capsys):
    """A valid GGUF (written by the gguf package: llama metadata and one tensor), cut in half."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    model = tmp_path / "cut.gguf"
    writer = gguf.GGUFWriter(str(model), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.arange(4096, dtype=np.float32).reshape(64, 64))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert len(gguf.GGUFReader(str(model)).tensors) == 1  # intact before the cut
    _truncate(model)
    assert _capture(model, text_file, out_dir / "cap.safetensors") == 2
    _one_line_error(capsys, "cut.gguf", "truncated or corrupt GGUF")
    _nothing_left(out_dir, set())


# ----------------------------------------------------------------------------------- --out and --text


def test_out_is_a_folder_is_refused_before_the_model_loads(tiny_folder, text_file, out_dir, capsys, monkeypatch):
    import kvstats.hf.capture as real

    def must_not_load(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(real, "load_model", must_not_load)
    assert _capture(tiny_folder, text_file, out_dir) == 2
    _one_line_error(capsys, "--out", str(out_dir), "is a folder")
    _nothing_left(out_dir, set())
    blocker = out_dir / "a_file"
    blocker.write_text("x")
    assert _capture(tiny_folder, text_file, blocker / "cap.safetensors") == 2
    _one_line_error(capsys, "is a file, not a folder")
    _nothing_left(out_dir, {"a_file"})


def test_text_is_a_folder_missing_or_not_utf8(tiny_folder, tmp_path, out_dir, capsys):
    assert _capture(tiny_folder, tmp_path, out_dir / "cap.safetensors") == 2
    _one_line_error(capsys, "--text", str(tmp_path), "is a folder")
    assert _capture(tiny_folder, tmp_path / "missing.txt", out_dir / "cap.safetensors") == 2
    _one_line_error(capsys, "missing.txt", "does not exist")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("les élèves".encode("latin-1"))
    assert _capture(tiny_folder, latin1, out_dir / "cap.safetensors") == 2
    _one_line_error(capsys, "latin1.txt", "not UTF-8")
    _nothing_left(out_dir, set())


def test_failed_capture_leaves_no_partial_output(tiny_folder, text_file, out_dir, capsys):
    assert _capture(tiny_folder, text_file, out_dir / "cap.safetensors", "--tokens", "500") == 2
    _one_line_error(capsys, "fewer than max_tokens=500")
    _nothing_left(out_dir, set())


def test_tokens_must_be_positive_or_all(tiny_folder, text_file, out_dir, capsys):
    with pytest.raises(SystemExit) as exc:
        _capture(tiny_folder, text_file, out_dir / "cap.safetensors", "--tokens", "0")
    assert exc.value.code == 2 and "positive integer or 'all'" in capsys.readouterr().err


# ------------------------------------------------------------------------------ default tokens, progress


def test_default_tokens_are_bounded_and_progress_is_shown(tiny_folder, text_file, out_dir, capsys, monkeypatch):
    """Without --tokens: at most CAPTURE_TOKENS (here patched to 20) of a longer text, the whole text when it
    is shorter; a tqdm bar counts the layers (2 of the tiny model) on stderr. --tokens all: the whole text."""
    import kvstats.cli.capture as cli
    from kvstats.data.io import load_qkv

    monkeypatch.setattr(cli, "CAPTURE_TOKENS", 20)
    out = out_dir / "cap.safetensors"
    rc = main(["capture", "--model", str(tiny_folder), "--text", str(text_file), "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0 and load_qkv(out).metadata["n_tokens"] == 20
    assert "2/2" in captured.err and "layer" in captured.err
    monkeypatch.setattr(cli, "CAPTURE_TOKENS", 1000)  # longer than the text: the whole text (64 tokens)
    assert _capture(tiny_folder, text_file, out) == 2  # an existing --out is refused without --force
    assert "exists; pass --force" in capsys.readouterr().err and load_qkv(out).metadata["n_tokens"] == 20
    assert _capture(tiny_folder, text_file, out, "--force") == 0 and load_qkv(out).metadata["n_tokens"] == 64
    assert _capture(tiny_folder, text_file, out, "--tokens", "all", "--force") == 0
    assert load_qkv(out).metadata["n_tokens"] == 64
    assert sorted(p.name for p in out_dir.iterdir()) == ["cap.safetensors"]


# ------------------------------------------------------------------------------------- cached captures


def test_corrupt_cached_capture_is_captured_again(tmp_path, monkeypatch, capsys):
    """load_default_capture finds a truncated cache file: it says so, captures again and returns a valid file.
    The capture itself is replaced by a stub writing a small file (the real one loads SmolLM2)."""
    import torch

    import kvstats.hf.capture as real
    from kvstats.data.io import save_qkv

    monkeypatch.setenv("KVSTATS_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_capture(model, *, max_tokens, out):
        calls.append((model, max_tokens))
        g = torch.Generator().manual_seed(0)
        layer = (torch.randn(1, 4, max_tokens, 8, generator=g), torch.randn(1, 2, max_tokens, 8, generator=g),
                 torch.randn(1, 2, max_tokens, 8, generator=g))
        save_qkv(out, [layer, layer], {"model": "stub"})

    monkeypatch.setattr(real, "capture", fake_capture)
    path = real.default_capture_path(16)
    keys = real.load_default_capture(16, verbose=False).keys(1).clone()
    good = path.read_bytes()
    assert len(calls) == 1
    for damage in (lambda b: b[: len(b) // 2], lambda b: b"", lambda b: b[:7]):
        path.write_bytes(damage(good))
        f = real.load_default_capture(16, verbose=False)
        assert f.metadata["n_tokens"] == 16 and f.metadata["model"] == "stub" and torch.equal(f.keys(1), keys)
        assert f"{path.name}: not a readable safetensors file" in capsys.readouterr().err
    assert len(calls) == 4
    real.load_default_capture(16, verbose=False)  # intact: no new capture
    assert len(calls) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.parametrize("damage", ["truncated", "empty", "missing layer"])
def test_truncated_capture_file_is_a_clear_error(tmp_path, damage):
    import torch

    from kvstats.data.io import load_qkv, save_qkv

    layer = tuple(torch.zeros(1, 2, 4, 8) for _ in range(3))
    path = save_qkv(tmp_path / "cap.safetensors", [layer, layer], {"model": "x"})
    if damage == "truncated":
        _truncate(path)
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # a well-formed file whose header lists a layer it does not hold
        from safetensors import safe_open
        from safetensors.torch import save_file

        with safe_open(str(path), framework="pt") as f:
            meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys() if not k.startswith("layer.1.")}
        save_file(tensors, str(path), metadata=meta)
    match = "incomplete capture" if damage == "missing layer" else "truncated or corrupt"
    with pytest.raises(ValueError, match=f"cap.safetensors.*{match}"):
        load_qkv(path)
