"""Decode of the sign-sketch quantizers (qjl, turbo_prod) from byte tables, against float64 oracles."""

import pytest
import torch

from kvstats import ops
from kvstats.packing import pack_signs, unpack_signs
from kvstats.quantizers import quantizer


@pytest.mark.parametrize("m, d", [(8, 4), (13, 5), (128, 128), (300, 64)])
def test_sign_tables_sum_to_the_dense_product(m, d):
    # Σ_p T[256p + byte_p] = sᵀ b for every packed row, m not a multiple of 8 included (padding bits add nothing).
    g = torch.Generator().manual_seed(m)
    s = torch.randn(m, d, generator=g, dtype=torch.float64)
    b = torch.randint(0, 2, (50, m), generator=g, dtype=torch.float64) * 2 - 1
    packed = pack_signs(b)
    packed[:, -1] |= 0 if m % 8 == 0 else (0xFF << (m % 8)) & 0xFF  # set the padding bits: still ignored
    weight = torch.rand(50, generator=g, dtype=torch.float64)
    oracle = (b @ s) * weight.unsqueeze(-1)
    got = ops.sign_decode(packed, s, ops.sign_tables(s), weight)
    torch.testing.assert_close(got, oracle, rtol=1e-12, atol=1e-12)
    base = torch.randn(50, d, generator=g, dtype=torch.float64)
    torch.testing.assert_close(ops.sign_decode(packed, s, ops.sign_tables(s), weight, accumulate=base.clone()),
                               base + oracle, rtol=1e-12, atol=1e-12)


def test_sign_tables_too_large_fall_back_to_the_dense_product(monkeypatch):
    monkeypatch.setattr(ops, "SIGN_TABLE_LIMIT", 0)
    g = torch.Generator().manual_seed(1)
    s = torch.randn(24, 16, generator=g, dtype=torch.float64)
    b = torch.randint(0, 2, (7, 24), generator=g, dtype=torch.float64) * 2 - 1
    weight = torch.rand(7, generator=g, dtype=torch.float64)
    assert ops.sign_tables(s) is None
    torch.testing.assert_close(ops.sign_decode(pack_signs(b), s, None, weight), (b @ s) * weight.unsqueeze(-1))


def _oracle_decode(qz, code):
    """The decode formulas of the module docstrings in float64, from the stored codes."""
    if qz.name == "qjl":
        s = qz.sketch.matrix(torch.device("cpu"), torch.float64)
        b = unpack_signs(code.payload["signs"], qz.sketch.m, torch.float64)
        return (b @ s) * (qz.sketch.scale / qz.sketch.m) * code.scalars["norm"].double().unsqueeze(-1)
    s = qz.sketch.matrix(torch.device("cpu"), torch.float64)
    b = unpack_signs(code.payload["signs"], qz.dim, torch.float64)
    y = (b @ s) * (qz.sketch.scale / qz.dim) * code.scalars["gamma"].double().unsqueeze(-1)
    if qz.mse is None:
        return y
    mse = code.parts["mse"]
    levels = qz.mse.levels(torch.device("cpu"), torch.float64)
    from kvstats.packing import unpack_bits
    idx = unpack_bits(mse.payload["indices"], qz.mse.bits, qz.dim).long()
    y = y + levels[idx] * mse.scalars["norm"].double().unsqueeze(-1)
    return qz.mse.rotation.inverse(y)


@pytest.mark.parametrize("name, opts", [
    ("qjl", {"bits": 4}), ("qjl", {"m": 100}), ("qjl", {"bits": 1, "rows": "gaussian"}),
    ("qjl", {"bits": 2, "outliers": [1, 5]}), ("qjl", {"bits": 2, "outliers": [3]}),
    ("turbo_prod", {"bits": 4}), ("turbo_prod", {"bits": 3, "rotation": "haar"}),
    ("turbo_prod", {"bits": 2, "rows": "srht"}), ("turbo_prod", {"bits": 1}),
])
def test_decode_equals_the_reference_path_and_a_float64_oracle(name, opts):
    # fp32 decode vs the pre-table formula (use_reference: unpack, dense product, then Πᵀ) and vs the decode
    # formula in float64: equal up to fp32 rounding of sums of ≤ 4d terms (entries ~1: atol 2e-5).
    d = 64
    qz = quantizer(name, dim=d, seed=3, **opts)
    x = torch.randn(3, 70, d, generator=torch.Generator().manual_seed(5))
    code = qz.encode(x)
    got = qz.decode(code)
    with ops.use_reference():
        ref = qz.decode(code)
    assert got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=2e-5)
    if qz.name == "qjl" and qz.outliers is not None:
        return  # the outlier split is checked against the reference path above
    torch.testing.assert_close(got.double(), _oracle_decode(qz, code), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("name", ["qjl", "turbo_prod"])
def test_decode_of_float64_codes_is_exact_to_float64_rounding(name):
    qz = quantizer(name, bits=3, dim=32, seed=1)
    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    code = qz.encode(x)
    got = qz.decode(code)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, _oracle_decode(qz, code), rtol=1e-12, atol=1e-12)
