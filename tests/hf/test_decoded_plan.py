"""A user quantizer with no plans in the cache (kvstats.hf.decoded_plan): its chunks decoded once and kept, the same
numbers as the quantizer's own inner on every code at every step, the new tokens' decode the only decode work of a
step, and an estimator that is not decode-then-dot scored by itself (with a warning), never from the decoded keys."""

from __future__ import annotations

import pytest
import torch

import kvstats.hf.code_attention as code_attention
from kvstats.hf.decoded_plan import DecodedPlan, decodable_sides
from kvstats.quant.schemes import Scheme, scheme
from tests.helpers.llama import D, _tiny
from tests.helpers.quantizers import Int4PerToken
from tests.helpers.user_quantizers import GroupAbsmax

pytestmark = pytest.mark.usefixtures("one_thread")


class SmallGroups(GroupAbsmax):
    group = 8  # the tiny Llama's d = 16


class CountingDecodes(SmallGroups):
    """Counts the tokens each decode reads (the work a step costs)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.decoded_tokens = 0

    def decode(self, code):
        self.decoded_tokens += code.shape[-2]
        return super().decode(code)


class Stretched(SmallGroups):
    """An estimator that is not decode-then-dot: 1.25 ⟨q, x̂⟩."""

    def inner(self, query, code):
        return 1.25 * super().inner(query, code)


class OwnEstimator(Int4PerToken):
    def _inner(self, query, code):
        return 2.0 * super()._inner(query, code)


def _scheme(k_cls=SmallGroups, v_cls=SmallGroups, bits=4):
    return Scheme("user", bits, k_cls(bits, D, 1), v_cls(bits, D, 2), 0)


def _generate(model, sch, window: int, steps: int = 6, prompt: int = 24):
    """Logits of a prefill of ``prompt`` tokens and ``steps`` greedy decode steps through a KVStatsCache."""
    from kvstats.evaluation.model_engine import set_attention
    from kvstats.hf.cache import KVStatsCache, cache_kwargs

    set_attention(model, "kvstats")
    cache = KVStatsCache(sch, window)
    ids = torch.randint(1, 100, (2, prompt), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out = model(ids, **cache_kwargs(model, cache), use_cache=True)
        logits, nxt = [out.logits[:, -1]], out.logits[:, -1:].argmax(-1)
        for _ in range(steps):
            out = model(nxt, **cache_kwargs(model, cache), use_cache=True)
            logits.append(out.logits[:, -1])
            nxt = out.logits[:, -1:].argmax(-1)
    return torch.stack(logits), cache


def _without_plan(monkeypatch):
    monkeypatch.setattr(code_attention, "decodable_sides", lambda s: (False, False))


def test_which_quantizers_get_the_decoded_plan():
    assert decodable_sides(_scheme()) == (True, True)  # the protocol alone: no plans, no weighted_sum
    assert decodable_sides(_scheme(Int4PerToken, Int4PerToken)) == (True, True)  # kvstats' defaults, outside kvstats
    assert decodable_sides(_scheme(OwnEstimator, SmallGroups)) == (False, True)  # an estimator of its own keeps it
    for name, bits in (("kqv", 4), ("minmax", 4), ("fp8_e4m3", 8), ("int_token", 4)):  # kvstats' own: their plans
        assert decodable_sides(scheme(name, bits=bits, dim=D)) == (False, False)
    sch = _scheme()
    sch.k.inner_plan = lambda code: None  # a plan of its own
    assert decodable_sides(sch) == (False, True)


@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("quantizer", [SmallGroups, Int4PerToken])
def test_generation_is_bit_for_bit_the_quantizers_own_path(window, quantizer, monkeypatch):
    """The oracle: the same cache with the plan switched off, where every step scores every code through the
    quantizer's inner and decodes every value code again (the estimator's definition)."""
    model = _tiny()
    got, cache = _generate(model, _scheme(quantizer, quantizer), window)
    assert all(isinstance(p[3]["decoded"], DecodedPlan) for layer in cache.layers for p in layer._chunk_plans)
    _without_plan(monkeypatch)
    want, cache = _generate(model, _scheme(quantizer, quantizer), window)
    assert not any("decoded" in p[3] for layer in cache.layers for p in layer._chunk_plans)
    assert torch.equal(got, want)


def _step_decodes(model, sch, steps: int) -> list[int]:
    """Tokens decoded by each of ``steps`` decode steps after a 24-token prefill (window 0)."""
    from kvstats.evaluation.model_engine import set_attention
    from kvstats.hf.cache import KVStatsCache, cache_kwargs

    set_attention(model, "kvstats")
    cache = KVStatsCache(sch, 0)
    ids = torch.randint(1, 100, (1, 24), generator=torch.Generator().manual_seed(0))
    counts = []
    with torch.inference_mode():
        nxt = model(ids, **cache_kwargs(model, cache), use_cache=True).logits[:, -1:].argmax(-1)
        for _ in range(steps):
            before = sch.k.decoded_tokens + sch.v.decoded_tokens
            nxt = model(nxt, **cache_kwargs(model, cache), use_cache=True).logits[:, -1:].argmax(-1)
            counts.append(sch.k.decoded_tokens + sch.v.decoded_tokens - before)
    return counts


def test_a_decode_step_decodes_only_its_new_tokens(monkeypatch):
    """Per layer and step, with the plan: the new token's K (decoded, then its inner checked: one decode each) and
    its V, 3 tokens whatever the cache's length; without it the whole cache, K's and V's, at every step."""
    model, layers, steps = _tiny(), 2, 5
    counts = _step_decodes(model, _scheme(CountingDecodes, CountingDecodes), steps)
    assert counts == [layers * 3] * steps
    _without_plan(monkeypatch)
    counts = _step_decodes(model, _scheme(CountingDecodes, CountingDecodes), steps)
    assert counts == [layers * 2 * (24 + s + 1) for s in range(steps)]


def test_an_estimator_that_is_not_decode_then_dot_is_scored_by_itself(monkeypatch):
    """inner = 1.25 ⟨q, x̂⟩: the first comparison catches it; the scores come from inner (a warning says so and why),
    so the outputs are those of the quantizer's own path."""
    model = _tiny()
    with pytest.warns(UserWarning, match=r"inner\(q, code\) differs from <q, decode\(code\)>"):
        got, _ = _generate(model, _scheme(Stretched, SmallGroups), window=2)
    _without_plan(monkeypatch)
    want, _ = _generate(model, _scheme(Stretched, SmallGroups), window=2)
    assert torch.equal(got, want)


def test_inner_tolerance_separates_rounding_from_another_estimator():
    from kvstats.quant.attention import inner_tolerance

    gen = torch.Generator().manual_seed(0)
    q, x = torch.randn(4, 64, generator=gen), torch.randn(50, 64, generator=gen)
    exact = q.double() @ x.double().T
    fp32 = (q @ x.T).double()
    tol = inner_tolerance(exact, q, x)
    assert float((fp32 - exact).abs().max()) < tol / 10  # fp32 rounding: far inside
    assert float((1.01 * exact - exact).abs().max()) > tol  # a 1% different estimator: outside
