"""Decode of the sign-sketch quantizers (qjl, turbo_prod) from byte tables, against float64 oracles."""

import pytest
import torch

from kvstats.quant import ops
from kvstats.quant.packing import pack_signs, unpack_signs
from kvstats.quant.quantizers import quantizer


def _signs_case(n, m, d, dtype, seed):
    """(±1 signs b [n, m], packed b with the padding bits set, S [m, d], weight [n], base [n, d]), float64 b/S."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(m, d, generator=g, dtype=torch.float64)
    b = torch.randint(0, 2, (n, m), generator=g, dtype=torch.float64) * 2 - 1
    packed = pack_signs(b)
    if m % 8 and n:
        packed[:, -1] |= (0xFF << (m % 8)) & 0xFF  # set the padding bits: they must be ignored
    weight = torch.rand(n, generator=g, dtype=torch.float64)
    base = torch.randn(n, d, generator=g, dtype=torch.float64)
    return b, packed, s, weight.to(dtype), base.to(dtype)


def _paths():
    """The sign_decode implementations: the compiled kernel (CPU fast path and the GPU's shared path) and
    the pure-torch reference."""
    paths = [("reference", ops.sign_decode_reference)]
    if ops.HAS_EXTENSION:
        paths += [("kernel", torch.ops.kvstats.sign_decode.default),
                  ("shared", torch.ops.kvstats_shared.sign_decode.default)]
    return paths


# m: multiples of 8 and not (padding bits); d: the kernel's chunks of 128, 32, 8 fp32 columns and a tail.
@pytest.mark.parametrize("m, d", [(8, 4), (13, 5), (128, 128), (300, 64), (77, 171), (512, 128), (24, 1)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sign_decode_equals_the_dense_product_in_float64(m, d, dtype):
    # Σ_p T[256p + byte_p] = sᵀ b for every packed row. fp64: to rounding (1e-12). fp32 tables: each table
    # entry is a sum of 8 rows rounded once, then ceil(m/8) entries are added in fp32, so the error is at
    # most ~(m/8 + 1)·2^-24·Σ|terms| ≲ 65 · 6e-8 · (8·√m·4): below 1e-3 for m ≤ 512 (atol 2e-3, rtol 1e-5).
    b, packed, s, weight, base = _signs_case(50, m, d, dtype, seed=m + d)
    oracle = (b @ s) * weight.double().unsqueeze(-1)
    tables = ops.sign_tables(s.to(dtype))
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 2e-3}
    for name, decode in _paths():
        got = decode(packed, tables, weight, None)
        assert got.dtype == dtype and got.shape == (50, d), name
        torch.testing.assert_close(got.double(), oracle, **tol, msg=name)
        with_base = decode(packed, tables, weight, base)
        torch.testing.assert_close(with_base.double(), base.double() + oracle, **tol, msg=name)


@pytest.mark.skipif(not ops.HAS_EXTENSION, reason="kvstats._C not built")
@pytest.mark.parametrize("m, d", [(512, 128), (77, 171), (13, 5)])
def test_sign_decode_kernel_equals_the_reference_to_fp32_rounding(m, d):
    # The same fp32 table entries summed in another order: |difference| ≤ 2·mb·2^-24·Σ|entries| (≲ 1e-4 here).
    _, packed, s, weight, base = _signs_case(700, m, d, torch.float32, seed=7 * m + d)
    tables = ops.sign_tables(s.float())
    ref = ops.sign_decode_reference(packed, tables, weight, base)
    torch.testing.assert_close(torch.ops.kvstats.sign_decode.default(packed, tables, weight, base), ref,
                               rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(torch.ops.kvstats_shared.sign_decode.default(packed, tables, weight, base), ref,
                               rtol=1e-5, atol=1e-4)


def test_sign_decode_of_no_rows():
    _, packed, s, weight, base = _signs_case(0, 24, 16, torch.float32, seed=1)
    for name, decode in _paths():
        got = decode(packed, ops.sign_tables(s.float()), weight, base)
        assert got.shape == (0, 16) and got.dtype == torch.float32, name


@pytest.mark.skipif(not ops.HAS_EXTENSION, reason="kvstats._C not built")
def test_sign_decode_under_inference_mode_with_two_threads():
    # 5000 rows: several parallel tasks per thread; the output is allocated under inference mode.
    _, packed, s, weight, base = _signs_case(5000, 100, 96, torch.float32, seed=3)
    tables = ops.sign_tables(s.float())
    ref = ops.sign_decode_reference(packed, tables, weight, base)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode():
            got = ops.sign_decode(packed, tables, weight, base)
    finally:
        torch.set_num_threads(previous)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)


# The CPU kernel sums many fp32 rows (d a multiple of 16, N >= 4096 rows per thread and at least 8192) by the
# blocked sum: sub-tables of 16 columns x 16 byte positions swept by blocks of 4096 rows, partial sums carried
# between position groups. The tests run on 2 threads, and ask the extension whether each case takes it.
BLOCKED_ROWS = 2 * 4096


def _takes_blocked_sum(n: int, d: int) -> bool:
    return torch.ops.kvstats._sign_decode_blocked(n, d, True)


@pytest.fixture
def two_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


def _split_calls(decode, packed, tables, weight, base, parts=3):
    """decode on row ranges short enough for the direct sum (< BLOCKED_ROWS rows each), concatenated."""
    bounds = torch.linspace(0, packed.shape[0], parts + 1).long().tolist()
    pieces = [decode(packed[a:b], tables, weight[a:b], None if base is None else base[a:b])
              for a, b in zip(bounds, bounds[1:])]
    return torch.cat(pieces)


@pytest.mark.slow
@pytest.mark.skipif(not ops.HAS_EXTENSION, reason="kvstats._C not built")
@pytest.mark.parametrize("n, m, d", [
    (BLOCKED_ROWS + 37, 512, 128),   # 4 position groups, 8 slices, a partial block and rows not a multiple of 4
    (BLOCKED_ROWS + 1, 300, 48),     # mb = 38: groups of 16, 16 and 6; padding bits set
    (3 * 4096 + 5, 100, 16),         # mb = 13: one group (no carried sums), one slice, three blocks
    (BLOCKED_ROWS, 64, 32),          # exactly the threshold
])
def test_blocked_sign_decode_is_bit_for_bit_the_direct_sum(n, m, d, two_threads):
    # Same fp32 entries added in the same order per column (p = 0, 1, ...), then scaled and added to base as
    # the direct sum does: the outputs must be identical, to the direct sum of the same rows (split calls)
    # and to the GPU's shared row code, and within fp32 rounding of the float64 oracle (bound as above).
    b, packed, s, weight, base = _signs_case(n, m, d, torch.float32, seed=n + m)
    tables = ops.sign_tables(s.float())
    oracle = (b @ s) * weight.double().unsqueeze(-1)
    kernel = torch.ops.kvstats.sign_decode.default
    assert _takes_blocked_sum(n, d) and not _takes_blocked_sum(n // 3 + 1, d)  # the split calls: direct sum
    for with_base in (None, base):
        got = kernel(packed, tables, weight, with_base)
        assert torch.equal(got, _split_calls(kernel, packed, tables, weight, with_base))
        with torch.inference_mode():  # the layout copy and the output are allocated under inference mode
            assert torch.equal(got, kernel(packed, tables, weight, with_base))
        assert torch.equal(got, torch.ops.kvstats_shared.sign_decode.default(packed, tables, weight, with_base))
        expect = oracle if with_base is None else oracle + with_base.double()
        torch.testing.assert_close(got.double(), expect, rtol=1e-5, atol=2e-3)


@pytest.mark.skipif(not ops.HAS_EXTENSION, reason="kvstats._C not built")
@pytest.mark.parametrize("d, bits", [(128, 4), (256, 3)])
def test_blocked_turbo_prod_decode_is_bit_for_bit_the_direct_sum(d, bits, two_threads):
    # turbo_prod_decode adds the sign part by the blocked sum over blocks of 1024 decoded rows when the rows
    # are many: identical to the same rows encoded and decoded in calls short enough for the direct sum
    # (encoding is row by row); d = 256 carries partial sums across two position groups (mb = 32).
    qz = quantizer("turbo_prod", bits=bits, dim=d, seed=2)
    x = torch.randn(BLOCKED_ROWS + 45, d, generator=torch.Generator().manual_seed(d))
    assert _takes_blocked_sum(x.shape[0], d) and not _takes_blocked_sum(3000, d)
    code = qz.encode(x)
    got = qz.decode(code)
    split = torch.cat([qz.decode(qz.encode(x[a:a + 3000])) for a in range(0, x.shape[0], 3000)])
    assert torch.equal(got, split)
    torch.testing.assert_close(got.double(), _oracle_decode(qz, code), rtol=1e-5, atol=2e-5)


@pytest.mark.skipif(not ops.HAS_EXTENSION, reason="kvstats._C not built")
def test_sign_decode_opcheck():
    for with_base in (False, True):
        _, packed, s, weight, base = _signs_case(9, 20, 12, torch.float32, seed=4)
        torch.library.opcheck(torch.ops.kvstats.sign_decode.default,
                              (packed, ops.sign_tables(s.float()), weight, base if with_base else None))


# (The kernel prints dtypes and shapes as ATen does — Short, [3] — the reference as torch does: the messages
# are matched on the op, the argument and what it must be.)
@pytest.mark.parametrize("tamper, error, message", [
    (lambda a: {**a, "packed": a["packed"].to(torch.int16)}, TypeError, "sign_decode: packed must be"),
    (lambda a: {**a, "packed": a["packed"][0]}, ValueError, r"sign_decode: packed must be \[N, mb\] with mb >= 1"),
    (lambda a: {**a, "tables": a["tables"][:, :0]}, ValueError, r"sign_decode: tables must be \[256 \* packed"),
    (lambda a: {**a, "tables": a["tables"][:256]}, ValueError, r"sign_decode: tables must be .* = \[768, d\]"),
    (lambda a: {**a, "tables": a["tables"].half()}, TypeError, "sign_decode: tables must be .*float32 or .*float64"),
    (lambda a: {**a, "weight": a["weight"][:3]}, ValueError, r"sign_decode: weight must be \[4\]"),
    (lambda a: {**a, "weight": a["weight"].long()}, TypeError, "sign_decode: weight must be a float tensor"),
    (lambda a: {**a, "base": torch.zeros(4, 6)}, ValueError, r"sign_decode: base must be \[4, 5\]"),
    (lambda a: {**a, "base": torch.zeros(4, 5, dtype=torch.float64)}, TypeError, "sign_decode: base must be"),
])
def test_sign_decode_rejects_bad_inputs_naming_the_argument(tamper, error, message):
    _, packed, s, weight, _ = _signs_case(4, 20, 5, torch.float32, seed=2)
    args = tamper({"packed": packed, "tables": ops.sign_tables(s.float()), "weight": weight, "base": None})
    for _name, decode in _paths():
        with pytest.raises(error, match=message):
            decode(args["packed"], args["tables"], args["weight"], args["base"])


def test_tables_too_large_fall_back_to_the_dense_product(monkeypatch):
    # Without byte tables (SIGN_TABLE_LIMIT exceeded) qjl decodes by unpacking the signs and a dense product.
    from kvstats.quant.ops import signs as sign_decode_ops

    monkeypatch.setattr(sign_decode_ops, "SIGN_TABLE_LIMIT", 0)
    qz = quantizer("qjl", m=24, dim=16, seed=1)
    assert qz.sketch.tables(torch.device("cpu"), torch.float64) is None
    x = torch.randn(7, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    code = qz.encode(x)
    torch.testing.assert_close(qz.decode(code), _oracle_decode(qz, code), rtol=1e-12, atol=1e-12)


def _oracle_decode(qz, code):
    """The decode formulas of the module docstrings in float64, from the stored codes."""
    if qz.name == "qjl":
        s = qz.sketch.matrix(torch.device("cpu"), torch.float64)
        b = unpack_signs(code.payload["signs"], qz.sketch.m, torch.float64)
        return (b @ s) * (qz.sketch.scale / qz.sketch.m) * code.scalars["norm"].double().unsqueeze(-1)
    s = qz.sketch.matrix(torch.device("cpu"), torch.float64)
    b = unpack_signs(code.payload["signs"], qz.dim, torch.float64)
    y = (b @ s) * (qz.sketch.scale / qz.dim) * code.scalars["gamma"].double().unsqueeze(-1)
    if qz.stage is None:
        return y
    mse = code.parts["mse"]
    levels = qz.stage.levels(torch.device("cpu"), torch.float64)
    from kvstats.quant.packing import unpack_bits
    idx = unpack_bits(mse.payload["indices"], qz.stage.bits, qz.dim).long()
    y = y + levels[idx] * mse.scalars["norm"].double().unsqueeze(-1)
    return qz.stage.rotation.inverse(y)


@pytest.mark.slow
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


@pytest.mark.parametrize("d, bits", [(96, 4), (33, 2), (128, 8)])
def test_turbo_prod_decode_in_one_kernel_equals_a_float64_oracle(d, bits):
    # 700 rows: several blocks of the fused kernel's 64 rows, the last partial; d = 96 and 33 take the
    # three-pass rotation and the kernel's narrower column chunks. Tolerance as above (sums of ≤ 4d terms ~1).
    qz = quantizer("turbo_prod", bits=bits, dim=d, seed=11)
    x = torch.randn(700, d, generator=torch.Generator().manual_seed(d))
    code = qz.encode(x)
    got = qz.decode(code)
    torch.testing.assert_close(got.double(), _oracle_decode(qz, code), rtol=1e-5, atol=2e-5)
    if ops.HAS_EXTENSION:
        with ops.shared_path():
            torch.testing.assert_close(qz.decode(code).double(), _oracle_decode(qz, code), rtol=1e-5, atol=2e-5)
