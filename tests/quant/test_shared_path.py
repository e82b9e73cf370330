"""The CPU kernels on the shared path — the GPU's code (cuda_ext/csrc/quant_math.h run by one serial
lane) — against the pure-torch references: every op, every code width 1–8, fp16/bf16/fp32 inputs, odd d,
GQA-style groups of queries, more rows than one CPU block. The CPU fast paths are tested the same way in
test_kernels.py; here every CPU op is forced onto the code the CUDA kernels run."""

import pytest
import torch

from kvstats.quant import ops
from kvstats.quant.quantizers import quantizer
from tests.helpers.ops import check_fwht_correctness, check_ops_against_references, sample_cases, width_cases

pytestmark = pytest.mark.skipif(not ops.HAS_EXTENSION, reason="kvstats._C not built")


def test_switch_is_scoped_and_restored():
    assert not ops.using_shared_path()
    with ops.shared_path():
        assert ops.using_shared_path()
        with ops.shared_path(False):
            assert not ops.using_shared_path()
        assert ops.using_shared_path()
    assert not ops.using_shared_path()


def test_switch_holds_in_its_own_thread_only():
    import threading

    seen = []
    with ops.shared_path():
        worker = threading.Thread(target=lambda: seen.append(ops.using_shared_path()))
        worker.start()
        worker.join()
        assert ops.using_shared_path()
    assert seen == [False]


def test_shared_backend_is_a_second_namespace_with_the_same_schemas():
    # One schema list (cuda_ext/csrc/schemas.h) declares both namespaces; every op has a kernel in each, and
    # kvstats._C only loads the library (no Python methods).
    import kvstats._C

    for op in ops.OPS:
        fast, shared = getattr(torch.ops.kvstats, op).default, getattr(torch.ops.kvstats_shared, op).default
        assert str(fast._schema).split("::", 1)[1] == str(shared._schema).split("::", 1)[1], op
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"kvstats_shared::{op}", "CPU"), op
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"kvstats_shared::{op}", "CUDA"), op
    assert [name for name in dir(kvstats._C) if not name.startswith("__")] == []


def test_every_schema_has_a_python_contract_and_every_contract_a_schema():
    # The schema list (C++) and the family modules' fakes (Python) name the same ops: a new op without its
    # family module, or a fake without a schema, fails here.
    registered = {name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("kvstats::") and not name.startswith("kvstats::_")}
    assert registered == set(ops.OPS)
    for op in ops.OPS:
        assert callable(getattr(ops, op)) and callable(getattr(ops, f"{op}_reference")), op


def test_wrappers_take_the_shared_kernel_inside_the_switch():
    # Inside shared_path the wrappers get kvstats_shared's kernels for CPU tensors; use_reference wins over it.
    from kvstats.quant.ops import _library

    with ops.shared_path():
        assert _library.kernel("fwht", torch.device("cpu")) is torch.ops.kvstats_shared.fwht.default
        with ops.use_reference():
            assert _library.kernel("fwht", torch.device("cpu")) is None
    assert _library.kernel("fwht", torch.device("cpu")) is torch.ops.kvstats.fwht.default


@pytest.mark.slow
@pytest.mark.parametrize("bits", range(1, 9))
def test_every_op_on_the_shared_path(bits):
    with ops.shared_path():
        check_ops_against_references("cpu", width_cases("cpu", bits))


def test_sample_cases_on_the_shared_path():
    with ops.shared_path():
        check_ops_against_references("cpu", sample_cases("cpu"))


@pytest.mark.slow
def test_fwht_on_the_shared_path():
    with ops.shared_path():
        check_fwht_correctness("cpu")


@pytest.mark.slow
def test_shared_and_fast_paths_agree():
    # Both paths compute the same cells from the same arithmetic up to the summation order of the norm
    # and the schedule of the butterflies, so codes may differ only at threshold ties (bounded in op_suite).
    from tests.helpers.ops import as_tuple, assert_outputs_agree

    for name, args in width_cases("cpu", 4):
        fast = as_tuple(getattr(torch.ops.kvstats, name).default(*args))
        shared = as_tuple(getattr(torch.ops.kvstats_shared, name).default(*args))
        assert_outputs_agree(name, args, shared, fast)


@pytest.mark.slow
@pytest.mark.parametrize("name, bits", [("lloyd", 1), ("turbo_mse", 3), ("turbo_prod", 2), ("turbo_prod", 8),
                                        ("qjl", 1), ("minmax", 5), ("turbo_mse", 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_public_api_on_the_shared_path_with_gqa(name, bits, dtype):
    # 8 query heads on 2 KV heads (GQA 4: the 4 heads' 3 queries each stacked per KV head, n_q = 12),
    # d = 96 (not a power of two), 300 keys.
    d = 96
    qz = quantizer(name, bits=bits, dim=d, seed=5)
    g = torch.Generator().manual_seed(bits)
    x = torch.randn(1, 2, 300, d, generator=g).to(dtype)
    q = torch.randn(1, 8, 3, d, generator=g).to(dtype).reshape(1, 2, 12, d)
    with ops.use_reference():
        code = qz.encode(x)
        s_ref, x_ref = qz.inner(q, code), qz.decode(code)
    with ops.shared_path():
        s, x_hat = qz.inner(q, code), qz.decode(code)
    tol = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(x_hat.float(), x_ref.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lloyd", "turbo_mse", "turbo_prod"])
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("d", [128, 96, 40, 33])
def test_fp32_decode_fast_path_is_bit_for_bit_the_shared_path(name, bits, d):
    # The fast decode of codes of ≤ 4 bits with d a multiple of 8 looks the levels up straight from the
    # packed bytes (lloyd_cpu.cpp, decode_packed_row_f32); wider codes and d = 33 unpack a byte per code
    # first. Either way each value is levels[code]·norm, de-rotated by the same butterflies as the shared
    # row code, so the outputs are identical, not merely close (turbo_prod adds its sign part identically).
    qz = quantizer(name, bits=bits, dim=d, seed=bits)
    x = torch.randn(2, 150, d, generator=torch.Generator().manual_seed(10 * bits + d))
    code = qz.encode(x)
    fast = qz.decode(code)
    with ops.shared_path():
        shared = qz.decode(code)
    assert torch.equal(fast, shared)
