"""A user's GGUF file is converted once: the float32 conversion is cached under a name holding the file's SHA-256
and the transformers version, reused by the next load (the same weights, bit for bit), and converted again when the
file changes or the cached folder is damaged."""

from __future__ import annotations

import shutil
import time

import pytest
import torch

pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")


@pytest.mark.slow
def test_a_users_gguf_is_converted_once_and_reloaded_from_the_cache(smollm2, tmp_path, monkeypatch, capsys):
    from kvstats.hf import models

    monkeypatch.setenv("KVSTATS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KVSTATS_NO_MODEL_CACHE", raising=False)
    user = tmp_path / "my-model.gguf"
    shutil.copyfile(models.smollm2_gguf_path(), user)
    folder = models.gguf_conversion(user)
    assert folder.parent == tmp_path / "cache"
    assert folder.name.startswith("gguf-my-model-") and "-transformers-" in folder.name
    t0 = time.perf_counter()
    first, _, name = models.load_model(user)
    converting = time.perf_counter() - t0
    assert name == "my-model" and (folder / "model.safetensors").is_file()
    assert folder / "model.safetensors" in models.model_files(user)  # an output may not overwrite it
    t0 = time.perf_counter()
    second, tokenizer, _ = models.load_model(user)
    print(f"convert {converting:.1f} s, cached {time.perf_counter() - t0:.1f} s")
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert tokenizer("hello world").input_ids  # the tokenizer came back with the weights
    # a damaged conversion is noticed, deleted and made again
    (folder / "model.safetensors").write_bytes(b"cut")
    models.load_model(user)
    assert "incomplete or corrupt; converting again" in capsys.readouterr().err
    assert (folder / "model.safetensors").stat().st_size > 1000
    # another file (one byte more) has another digest: another conversion folder
    with open(user, "ab") as f:
        f.write(b"\0")
    assert models.gguf_conversion(user) != folder
