"""Fixtures shared by several test modules."""

import pytest


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """The tiny Llama of tests/test_data_real.py saved as a Hugging Face folder with a word-level tokenizer
    (built offline); used by the data layer's and the CLI's tests."""
    transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.test_data_real import WORDS, _tiny_llama

    folder = tmp_path_factory.mktemp("tiny_llama")
    _tiny_llama(attn="sdpa").save_pretrained(folder)
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(WORDS))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return folder
