"""What a quantizer owes the generation cache (docs/quantizers.md), checked both ways on optimum-quanto adapters.

Three adapters wrap optimum-quanto's int4 (MaxOptimizer: affine codes with a scale and a shift per group) the
way a user would. One keeps the cache contract; one groups each channel over 8 tokens (a KIVI-style key
layout, which cannot encode a one-token step); one stores quanto's packed tensor as it is, whose rows pair up
rows of different batch entries (so selecting beams along axis 0 picks the wrong codes). For each,
``check_quantizer`` passes exactly when ``generate(num_beams=2)`` with a KVStatsCache reproduces the
generation of a cache that stores each token's ``decode(encode(x))`` in full precision (the oracle: the same
quantization, none of the cache's code algebra).
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")
quanto = pytest.importorskip("optimum.quanto", reason="optimum-quanto (the [quanto] extra) is not installed")

from kvstats.hf.cache import KVStatsCache, cache_kwargs, use_estimator_attention  # noqa: E402
from kvstats.measure.testing import check_quantizer  # noqa: E402
from kvstats.quant.packing import pack_bits, unpack_bits  # noqa: E402
from kvstats.quant.quantizers import BitBudget, Code, Quantizer  # noqa: E402
from kvstats.quant.schemes import Scheme  # noqa: E402
from tests.helpers.quantizers import Dequantized  # noqa: E402

D, HQ, HKV = 16, 4, 2


def _quanto_int4(rows: torch.Tensor, group: int):
    """quanto's int4 of ``rows`` [r, group·k] in groups of ``group`` along the last axis: (codes 0..15 as uint8
    [r, group·k], scale and shift [r·k, 1], the packed tensor quanto itself keeps)."""
    scale, shift = quanto.MaxOptimizer()(rows, quanto.qint4, 0, group)
    qt = quanto.quantize_weight(rows, quanto.qint4, 0, scale, shift, group)
    return qt._data.unpack().reshape(rows.shape), scale, shift, qt._data._data


class QuantoPerToken(Quantizer):
    """int4 per vector (one group of d coordinates): codes packed [..., n, d/2], scale and shift [..., n] fp32."""

    name = "quanto_per_token"
    min_bits = max_bits = 4

    def _encode(self, x):
        codes, scale, shift, _ = _quanto_int4(x.reshape(-1, self.dim).float(), self.dim)
        lead = x.shape[:-1]
        return Code(x.shape, x.dtype, payload={"codes": pack_bits(codes.reshape(x.shape).long(), 4)},
                    scalars={"scale": scale.reshape(lead), "shift": shift.reshape(lead)})

    def _decode(self, code):
        codes = unpack_bits(code.payload["codes"], 4, self.dim).float()
        return (codes * code.scalars["scale"][..., None] - code.scalars["shift"][..., None]).to(code.dtype)

    def bits_per_coordinate(self, n_tokens=None):
        return BitBudget(payload=4.0, side=64 / self.dim)


class QuantoPerChannel(Quantizer):
    """int4 per channel over groups of 8 tokens (KIVI's key layout): x [..., n, d] must have n % 8 == 0."""

    name = "quanto_per_channel"
    min_bits = max_bits = 4
    group = 8

    def _encode(self, x):
        channels = x.transpose(-1, -2).reshape(-1, x.shape[-2]).float()  # [.. · d, n]
        codes, scale, shift, _ = _quanto_int4(channels, self.group)
        lead = (*x.shape[:-2], self.dim, x.shape[-2] // self.group)
        codes = codes.reshape(*x.shape[:-2], self.dim, x.shape[-2]).transpose(-1, -2)
        return Code(x.shape, x.dtype, payload={"codes": pack_bits(codes.long(), 4)},
                    scalars={"scale": scale.reshape(lead), "shift": shift.reshape(lead)})

    def _decode(self, code):
        codes = unpack_bits(code.payload["codes"], 4, self.dim).float().transpose(-1, -2)  # [..., d, n]
        scale = code.scalars["scale"].repeat_interleave(self.group, dim=-1)
        shift = code.scalars["shift"].repeat_interleave(self.group, dim=-1)
        return (codes * scale - shift).transpose(-1, -2).to(code.dtype)

    def bits_per_coordinate(self, n_tokens=None):
        return BitBudget(payload=4.0, side=64 / self.group)


class QuantoPacked(QuantoPerToken):
    """Per vector like QuantoPerToken, but storing quanto's own packed tensor [ceil(r/2), d] (r = all vectors): its
    row i holds vectors i and i + ceil(r/2), which for a batch of 2 belong to different batch entries."""

    name = "quanto_packed"

    def _encode(self, x):
        _, scale, shift, packed = _quanto_int4(x.reshape(-1, self.dim).float(), self.dim)
        lead = x.shape[:-1]
        return Code(x.shape, x.dtype, payload={"packed": packed.clone()},
                    scalars={"scale": scale.reshape(lead), "shift": shift.reshape(lead)})

    def _decode(self, code):
        packed = code.payload["packed"]
        rows = code.scalars["scale"].numel()
        codes = torch.cat([packed & 15, packed >> 4])[:rows].float().reshape(code.shape)
        return (codes * code.scalars["scale"][..., None] - code.scalars["shift"][..., None]).to(code.dtype)


def _tiny(attn: str):
    cfg = transformers.LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=HQ,
        num_key_value_heads=HKV, head_dim=D, max_position_embeddings=256, attn_implementation="sdpa",
        initializer_range=0.1, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    return use_estimator_attention(model) if attn == "kvstats" else model


@pytest.fixture(scope="module")
def models():
    return {attn: _tiny(attn) for attn in ("sdpa", "kvstats")}


def _beams(model, scheme: Scheme) -> torch.Tensor:
    ids = torch.randint(1, 100, (1, 16), generator=torch.Generator().manual_seed(3))  # 16: a multiple of 8
    with torch.inference_mode():
        return model.generate(ids, **cache_kwargs(model, KVStatsCache(scheme)), num_beams=2, do_sample=False,
                              max_new_tokens=5)


def _works_in_beam_search(model, cls) -> bool:
    try:
        got = _beams(model, Scheme(cls.name, 4, cls(4, D, 1), cls(4, D, 2)))
    except Exception:  # noqa: BLE001 - a crash inside generate is one way of not working
        return False
    oracle = _beams(model, Scheme("oracle", 32, Dequantized(cls(4, D, 1)), Dequantized(cls(4, D, 2))))
    return torch.equal(got, oracle)


def _passes_check(cls) -> bool:
    try:
        check_quantizer(cls(4, D, 0), build=cls)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("attn", ["sdpa", "kvstats"])
@pytest.mark.parametrize("cls, keeps_the_contract", [(QuantoPerToken, True), (QuantoPerChannel, False),
                                                      (QuantoPacked, False)])
def test_check_quantizer_passes_exactly_when_beam_search_works(cls, keeps_the_contract, attn, models):
    assert _passes_check(cls) is keeps_the_contract
    assert _works_in_beam_search(models[attn], cls) is keeps_the_contract


def test_the_failures_name_the_cache_check():
    with pytest.raises(AssertionError, match=r"^check_quantizer\[cache\].*while encoding one token"):
        check_quantizer(QuantoPerChannel(4, D, 0))
    with pytest.raises(AssertionError, match=r"^check_quantizer\[cache\].*code tensor 'packed' has shape"):
        check_quantizer(QuantoPacked(4, D, 0))


def test_the_per_token_adapter_decodes_like_quanto():
    """Oracle: quanto's own dequantize of the same rows."""
    x = torch.randn(2, 3, 5, D, generator=torch.Generator().manual_seed(0))
    rows = x.reshape(-1, D)
    scale, shift = quanto.MaxOptimizer()(rows, quanto.qint4, 0, D)
    expected = quanto.quantize_weight(rows, quanto.qint4, 0, scale, shift, D).dequantize().reshape(x.shape)
    q = QuantoPerToken(4, D, 0)
    torch.testing.assert_close(q.decode(q.encode(x)), expected, rtol=0, atol=1e-6)
