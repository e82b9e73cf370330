"""Fixtures of the cache tests: the tiny GQA Llama (tests/helpers/llama.py) on the dense path (sdpa: KVStatsCache
returns decoded tensors) and on the estimator path, and its token ids."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")

from kvstats.hf.cache import use_estimator_attention  # noqa: E402
from tests.helpers.llama import T, _tiny  # noqa: E402


@pytest.fixture(scope="module")
def ids():
    return torch.randint(1, 100, (1, T), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def dense():
    """The model on the default path (sdpa): KVStatsCache returns decoded tensors."""
    return _tiny("sdpa")


@pytest.fixture(scope="module")
def est():
    """The same model on the estimator path (attn_implementation="kvstats")."""
    return use_estimator_attention(_tiny("sdpa"))
