"""The deployed formats in the cache (FP8, NVFP4, int per token-head, KIVI, the FP8-K/NVFP4-V pair and asymmetric
widths), on the tiny grouped-query Llama of tests/helpers/llama.py (4 query heads, 2 KV heads, d = 16; no download).

The oracle: the same cache storing ``decode(encode(x))`` of the same quantizers, block for block
(:class:`tests.helpers.quantizers.Dequantized`). On the dense path the model reads the decoded tensors, so greedy
and beam-search generation must give the same tokens and the same logits bit for bit; on the estimator path the
scores are the formats' own decode-then-dot, equal to the oracle's up to fp32 summation order (logits within 1e-4,
the same tokens). The estimator path against a float64 definition, window and sinks included, is
tests/hf/test_cache_sinks.py; each format's codes against an independent reference are tests/quant.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")

from kvstats.hf.cache import KVStatsCache, cache_kwargs  # noqa: E402
from kvstats.quant.schemes import Scheme, scheme  # noqa: E402
from tests.helpers.llama import D  # noqa: E402
from tests.helpers.quantizers import Dequantized  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

#: (spec, budget n, options) of every deployed format the cache takes by name
FORMATS = [("fp8_e4m3", 8, {}), ("fp8_e4m3", 8, {"scale": "dynamic", "granularity": "head"}), ("fp8_e5m2", 8, {}),
           ("nvfp4", 4, {}), ("int_token", 4, {}), ("int_token", 2, {}), ("fp8_e4m3/nvfp4", 6, {}),
           ("int_token@8/int_token@4", 6, {}), ("kivi", 2, {"group_size": 4})]
IDS = [f"{name}-{bits}" + ("-" + "-".join(map(str, o.values())) if o else "") for name, bits, o in FORMATS]


def _pair(name: str, bits: int, options: dict) -> tuple[Scheme, Scheme]:
    """(the format's scheme, the oracle storing its decoded tensors)."""
    s = scheme(name, bits=bits, dim=D, seed=4, **options)
    return s, Scheme("oracle", 32, Dequantized(s.k), Dequantized(s.v))


def _generate(model, s: Scheme, ids, **kw):
    cache = KVStatsCache(s, 3, flush_size=2)  # codes in blocks of 2 behind an exact window of 3
    with torch.inference_mode():
        return model.generate(ids, **cache_kwargs(model, cache), do_sample=False, output_logits=True,
                              return_dict_in_generate=True, **kw), cache


@pytest.mark.parametrize("name, bits, options", FORMATS, ids=IDS)
@pytest.mark.parametrize("path", ["dense", "est"])
def test_greedy_and_beam_generation_equal_the_dequantized_oracle(name, bits, options, path, dense, est, request):
    model = request.getfixturevalue(path)
    s, oracle = _pair(name, bits, options)
    ids = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0  # left padding
    atol = 0 if path == "dense" else 1e-4
    for kw, prompt in ((dict(max_new_tokens=8, attention_mask=mask), ids), (dict(max_new_tokens=6, num_beams=3),
                                                                             ids[:1])):
        got, cache = _generate(model, s, prompt, **kw)
        want, _ = _generate(model, oracle, prompt, **kw)
        assert torch.equal(got.sequences, want.sequences)
        for a, b in zip(got.logits, want.logits):
            torch.testing.assert_close(a, b, rtol=0, atol=atol)
        assert cache.memory().code_bytes > 0  # the codes were read, not only the window


@pytest.mark.parametrize("name, bits", [(name, bits) for name, bits, options in FORMATS if not options])
def test_from_config_builds_the_format_by_name(name, bits, dense):
    built = KVStatsCache.from_config(dense.config, name, bits, seed=4)._scheme_for(0)
    want, _ = _pair(name, bits, {})
    assert built.name == want.name and built.k.config == want.k.config and built.v.config == want.v.config


def test_a_budget_the_pair_does_not_hold_is_refused_naming_the_widths(dense):
    with pytest.raises(ValueError, match=r"holds K at 8 and V at 4 bits: its budget n is their mean, 6, got bits=4"):
        KVStatsCache.from_config(dense.config, "fp8_e4m3/nvfp4", 4)
