"""Shared correctness checks of the compiled ops, run by tests/ on CPU and by tests/gpu/ on CUDA.

Tolerances follow the fast-hadamard-transform idiom: the kernel's error against a float64 oracle must
be at most twice the error of the pure-torch reference run in the same low-precision dtype, plus a
small absolute slack (rounding of the final cast can differ by one ulp).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import torch

from kvstats.quant import ops

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FWHT_DIMS = (2, 4, 8, 16, 64, 128, 256, 1024, 4096)


def fwht_oracle(x: torch.Tensor) -> torch.Tensor:
    """x · H_d / √d in float64 with scipy's Sylvester–Hadamard matrix.

    Above d = 4096 the dense matrix would take gigabytes, so the Sylvester recursion
    H_2k [a; b] = [H_k (a + b); H_k (a − b)] splits the vector down to scipy's matrix.
    """
    x = x.double().cpu()
    d = x.shape[-1]
    if d > 4096:
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat((fwht_oracle(a + b), fwht_oracle(a - b)), dim=-1) / np.sqrt(2.0)
    h = torch.from_numpy(scipy.linalg.hadamard(d).astype(np.float64) / np.sqrt(d))
    return x @ h


def fwht_sample_inputs(device: str, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 64), (2, 5, 128), (7, 2), (1, 1, 1, 256), (33, 1024), (4, 96 * 0 + 32)]
    out = []
    for i, shape in enumerate(shapes):
        dtype = DTYPES[i % len(DTYPES)]
        out.append((torch.randn(shape, generator=g) * 3 + 0.5).to(device=device, dtype=dtype))
    return out


def assert_close_to_oracle(kernel_out: torch.Tensor, ref_low: torch.Tensor, oracle: torch.Tensor) -> None:
    """Kernel error ≤ 2 × (reference-in-same-dtype error) + atol, both against the float64 oracle."""
    err_kernel = (kernel_out.double().cpu() - oracle).abs().max().item()
    err_ref = (ref_low.double().cpu() - oracle).abs().max().item()
    scale = oracle.abs().max().item()
    atol = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}[
        kernel_out.dtype
    ] * max(scale, 1.0)
    assert err_kernel <= 2 * err_ref + atol, (err_kernel, err_ref, atol)


def check_fwht_correctness(device: str) -> None:
    g = torch.Generator().manual_seed(1234)
    for d in FWHT_DIMS:
        for dtype in DTYPES:
            x64 = torch.randn(6, d, generator=g, dtype=torch.float64) + 0.25
            x = x64.to(device=device, dtype=dtype)
            oracle = fwht_oracle(x.double())
            kernel = ops.fwht(x)
            with ops.use_reference():
                ref_low = ops.fwht(x)
            assert kernel.dtype == dtype and kernel.shape == x.shape and kernel.device == x.device
            assert_close_to_oracle(kernel, ref_low, oracle)


def compiled(name: str, device: str = "cpu"):
    """The compiled op that serves ``device`` now: on CPU inside ``ops.shared_path()`` the kvstats_shared
    backend's (the GPU's code), else the fast kernel's (torch.ops.kvstats)."""
    shared = ops.using_shared_path() and torch.device(device).type == "cpu"
    return getattr(torch.ops.kvstats_shared if shared else torch.ops.kvstats, name).default


def check_fwht_opcheck(device: str) -> None:
    for x in fwht_sample_inputs(device):
        torch.library.opcheck(compiled("fwht", device), (x,))
        if x.dtype == torch.float32:
            torch.library.opcheck(compiled("fwht", device), (x.double().requires_grad_(),))


# ------------------------------------------------------------------------ quantizer ops (kernels)
from kvstats.quant.codebooks import beta_codebook  # noqa: E402
from kvstats.quant.rotations import RandomizedHadamard, gaussian_sketch  # noqa: E402

QUANT_DIMS = (64, 96, 128, 256, 33)


def _rotation_signs(d: int, acc: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    return RandomizedHadamard(d, seed).signs_matrix(torch.device(device), acc)


def _tables(d: int, bits: int, acc: torch.dtype, device: str):
    cb = beta_codebook(d, bits)
    return (torch.tensor(cb.thresholds, dtype=acc, device=device), torch.tensor(cb.levels, dtype=acc, device=device))


def _random(shape, seed, device, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 1.7 + 0.3).to(device=device, dtype=dtype)


def assert_codes_agree(kernel_packed, ref_packed, bits, d, max_fraction=1e-3):
    """Packed codes equal, except codes of inputs within rounding of a threshold: at most a
    `max_fraction` of them, each off by one cell."""
    a = ops.unpack_bits_reference(kernel_packed.cpu(), bits, d).long()
    b = ops.unpack_bits_reference(ref_packed.cpu(), bits, d).long()
    diff = (a - b).abs()
    assert diff.max().item() <= 1, "a code differs by more than one cell"
    assert (diff > 0).float().mean().item() <= max_fraction, f"{(diff > 0).sum().item()} codes differ"


def sample_cases(device: str):
    """(name, args) of every quantizer op on fresh random inputs: dims incl. non-powers of two."""
    cases = []
    for i, d in enumerate(QUANT_DIMS):
        dtype = DTYPES[i % len(DTYPES)]
        bits = (1, 2, 3, 4, 8)[i % 5]
        acc = torch.float32
        x = _random((37, d), 10 + i, device, dtype)
        th, lv = _tables(d, bits, acc, device)
        signs = _rotation_signs(d, acc, device, i)
        cases.append(("lloyd_encode", (x, signs, th, bits, torch.float16 if i % 2 else torch.float32)))
        packed, norm = ops.lloyd_encode_reference(x, signs, th, bits, torch.float32)
        cases.append(("lloyd_decode", (packed, norm, signs, lv, bits, d)))
        # n_q = 5 scores through the lookup tables; n_q = 9 through the dense-chunk GEMM path (CPU).
        q = _random((3, 5 if i % 2 else 9, d), 20 + i, device)
        keys = _random((3, 11, d), 30 + i, device)
        kp, kn = ops.lloyd_encode_reference(keys.reshape(-1, d), signs[:0], th, bits, torch.float32)
        cases.append(("lloyd_scores", (q, kp.reshape(3, 11, -1), kn.reshape(3, 11), lv, bits)))
        m = (d, 2 * d, 77)[i % 3]
        sketch = gaussian_sketch(m, d, i).to(device=device, dtype=acc)
        cases.append(("qjl_encode", (x, sketch, torch.float32)))
        sp, sn = ops.qjl_encode_reference(keys.reshape(-1, d), sketch, torch.float32)
        qs = q @ sketch.T
        cases.append(("qjl_scores", (qs, sp.reshape(3, 11, -1), sn.reshape(3, 11), 0.0123)))
        cases.append(("turbo_prod_encode", (x, signs, th, lv, bits, sketch[:, :d] if m >= d else
                                            gaussian_sketch(d, d, i).to(device=device, dtype=acc), torch.float32)))
        cases.append(("turbo_prod_scores", (q, qs, kp.reshape(3, 11, -1), kn.reshape(3, 11), lv, bits,
                                            sp.reshape(3, 11, -1), sn.reshape(3, 11), 0.0123)))
        group = (d, 32, 16, 64, 11)[i] if d % (d, 32, 16, 64, 11)[i] == 0 else d
        cases.append(("minmax_encode", (x, group, bits, torch.float16)))
        mp, ml, ms = ops.minmax_encode_reference(x, group, bits, torch.float16)
        cases.append(("minmax_decode", (mp, ml, ms, group, bits, d)))
        codes = (torch.arange(37 * d, device=device) * 7 % (1 << bits)).to(torch.uint8).reshape(37, d)
        cases.append(("pack_bits", (codes, bits)))
        cases.append(("unpack_bits", (ops.pack_bits_reference(codes.cpu(), bits).to(device), bits, d)))
        cases.append(("sign_decode", _sign_decode_args(sp, sketch, sn, i, device)))
        cases.append(("turbo_prod_decode", _turbo_prod_decode_args(packed, norm, signs, lv, bits, x, sketch)))
        # Attention weights over the 11 keys of each group: 5 or 9 queries (one or two query blocks on the CPU).
        w = torch.softmax(_random((3, 5 if i % 2 else 9, 11), 40 + i, device), -1)
        cases.append(("lloyd_weighted_sum", (w, kp.reshape(3, 11, -1), kn.reshape(3, 11), lv, bits, d)))
        cases.append(("qjl_weighted_sum", (w, sp.reshape(3, 11, -1), sn.reshape(3, 11), 0.0123, m)))
        vp, vl, vs = ops.minmax_encode_reference(keys.reshape(-1, d), group, bits, torch.float16)
        cases.append(("minmax_weighted_sum", (w, vp.reshape(3, 11, -1), vl.reshape(3, 11, -1), vs.reshape(3, 11, -1),
                                              group, bits, d)))
        cases.append(("decode_attention", _decode_attention_args(i, q, kp.reshape(3, 11, -1), kn.reshape(3, 11), lv,
                                                                  bits, sketch, sp.reshape(3, 11, -1),
                                                                  sn.reshape(3, 11), device)))
    return cases


def _decode_attention_args(i: int, q, packed, norm, levels, bits: int, sketch, signs, sign_norm, device: str):
    """A decode step over the 11 code keys of each of 3 groups (the last i % 3 of them ahead: weight 0) and a
    window of 1 + 2·(i % 3) exact tokens: K a Lloyd part (rotated where d is a power of two: one pass), or QJL signs
    alone for i = 2; V turbo_prod's Lloyd part plus signs, or signs alone for i = 3; soft capping on odd i, a sink
    per query row for i = 4."""
    g, nq, d = q.shape
    rotation = _rotation_signs(d, q.dtype, device, 300 + i)[0] if d & (d - 1) == 0 else None
    win = 1 + 2 * (i % 3)
    win_k, win_v = _random((g, win, d), 310 + i, device), _random((g, win, d), 320 + i, device)
    lloyd = (packed, norm, levels, bits)
    sign = (sketch, signs, sign_norm, 0.0123)
    no_lloyd, no_sign = (None, None, None, 0), (None, None, None, 0.0)
    k = (rotation, *(no_lloyd if i == 2 else lloyd), *(sign if i == 2 else no_sign))
    v = (rotation, *(no_lloyd if i == 3 else lloyd), *sign)
    sinks = _random((g, nq), 330 + i, device) if i == 4 else None
    return (q, win_k, win_v, 11 - i % 3, d ** -0.5, 30.0 if i % 2 else None, sinks, *k, *v)


def _turbo_prod_decode_args(packed, norm, signs, levels, bits: int, x, sketch):
    """lloyd_decode's arguments for the codes of x, then the sign bits of S x (S = sketch [m, d]) with the
    byte tables of S and weights."""
    sp, sn = ops.qjl_encode_reference(x, sketch, torch.float32)
    return packed, norm, signs, levels, bits, x.shape[1], sp, ops.sign_tables(sketch), sn * 0.0123


def _sign_decode_args(packed, sketch, norm, seed: int, device: str):
    """(packed [N, mb], byte tables of the sketch, weight [N], base [N, d] or None on odd seeds)."""
    packed = packed.reshape(-1, packed.shape[-1])
    base = _random((packed.shape[0], sketch.shape[1]), 200 + seed, device) if seed % 2 == 0 else None
    return packed, ops.sign_tables(sketch), norm.reshape(-1) * 0.0123, base


def block_boundary_cases(device: str):
    """Cases with more rows / keys than one kernel block (256 on the CPU), the last block partial, and
    code widths that take every scoring layout: 3 bits (pairs of codes, with a tail when 8 ∤ d), 4 bits
    (bytes), 5 bits (code by code); queries below and above the GEMM switch (8)."""
    cases = []
    acc = torch.float32
    for i, (d, bits, dtype) in enumerate(((70, 3, torch.float16), (64, 4, torch.float32), (40, 5, torch.bfloat16))):
        n = 600
        x = _random((n, d), 50 + i, device, dtype)
        th, lv = _tables(d, bits, acc, device)
        signs = _rotation_signs(d, acc, device, i)
        sketch = gaussian_sketch(d, d, 60 + i).to(device=device, dtype=acc)
        wide = gaussian_sketch(77, d, 70 + i).to(device=device, dtype=acc)
        cases.append(("lloyd_encode", (x, signs, th, bits, torch.float32)))
        cases.append(("qjl_encode", (x, wide, torch.float16)))
        cases.append(("turbo_prod_encode", (x, signs, th, lv, bits, sketch, torch.float32)))
        keys = _random((2, n, d), 80 + i, device)
        kp, kn = ops.lloyd_encode_reference(keys.reshape(-1, d), signs[:0], th, bits, torch.float32)
        sp, sn = ops.qjl_encode_reference(keys.reshape(-1, d), wide, torch.float32)
        for n_q in (3, 9):
            q = _random((2, n_q, d), 90 + i + n_q, device)
            qs = q @ wide.T
            cases.append(("lloyd_scores", (q, kp.reshape(2, n, -1), kn.reshape(2, n), lv, bits)))
            cases.append(("qjl_scores", (qs, sp.reshape(2, n, -1), sn.reshape(2, n), 0.0123)))
            cases.append(("turbo_prod_scores", (q, qs, kp.reshape(2, n, -1), kn.reshape(2, n), lv, bits,
                                                sp.reshape(2, n, -1), sn.reshape(2, n), 0.0123)))
        cases.append(("sign_decode", _sign_decode_args(sp, wide, sn, i, device)))
        packed, norm = ops.lloyd_encode_reference(x, signs, th, bits, torch.float32)
        cases.append(("turbo_prod_decode", _turbo_prod_decode_args(packed, norm, signs, lv, bits, x, wide)))
    return cases


def _float_close(kernel, ref, name, atol_scale=1.0):
    """Within 1e-5 (× atol_scale) of the largest value, plus one rounding step of a 16-bit output dtype
    (two paths may round a stored fp16/bf16 scalar on either side of a boundary)."""
    ulp = torch.finfo(kernel.dtype).eps if kernel.dtype in (torch.float16, torch.bfloat16) else 0.0
    kernel, ref = kernel.double().cpu(), ref.double().cpu()
    scale = max(ref.abs().max().item(), 1.0)
    err = (kernel - ref).abs()
    allowed = 1e-5 * scale * atol_scale + ulp * ref.abs()
    assert (err <= allowed).all(), f"{name}: max error {err.max().item()}"


def _code_layout(name: str, args, j: int):
    """(bits, d) of the packed codes in output j of an encode op."""
    if name == "lloyd_encode":
        return args[3], args[0].shape[1]
    if name == "minmax_encode":
        return args[2], args[0].shape[1]
    if name == "qjl_encode":
        return 1, args[1].shape[0]
    return (args[4], args[0].shape[1]) if j == 0 else (1, args[5].shape[0])  # turbo_prod_encode


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def assert_outputs_agree(name: str, args, got, want) -> None:
    """Outputs of one op from two implementations: bit-exact packing, codes equal up to threshold ties
    (sign bits of a near-zero residual may flip too), floats within the dtype's tolerance."""
    got, want = as_tuple(got), as_tuple(want)
    assert len(got) == len(want), name
    for j, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape, (name, j, a.dtype, b.dtype, a.shape, b.shape)
        if name in ("pack_bits", "unpack_bits"):
            assert torch.equal(a.cpu(), b.cpu()), name
        elif a.dtype == torch.uint8:
            bits, d = _code_layout(name, args, j)
            assert_codes_agree(a, b, bits, d, max_fraction=2e-3 if name == "turbo_prod_encode" else 1e-3)
        else:
            _float_close(a, b, f"{name}[{j}]", atol_scale=10 if a.dtype == torch.float16 else 1)


def check_ops_against_references(device: str, cases=None) -> None:
    """Every quantizer op: kernel vs its pure-torch reference on the same inputs (default: sample_cases)."""
    for name, args in sample_cases(device) if cases is None else cases:
        kernel = as_tuple(compiled(name, device)(*args))
        assert all(t.device.type == torch.device(device).type for t in kernel), name
        ref = getattr(ops, f"{name}_reference")(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args))
        assert_outputs_agree(name, args, kernel, ref)


def check_ops_opcheck(device: str) -> None:
    for name, args in sample_cases(device)[:12]:
        torch.library.opcheck(compiled(name, device), args)


def width_cases(device: str, bits: int):
    """Every op at one code width, for each input dtype (fp32, fp16, bf16): odd and even d (33 with the
    three-pass rotation for fp32 and bf16, 64 with one pass for fp16), 300 rows (more than one CPU block
    of 256, the last partial), scores with GQA-style groups (2 key groups, 4 queries each) and a sketch
    wider than d."""
    cases = []
    acc = torch.float32
    for k, dtype in enumerate(DTYPES):
        for d in ((33,), (64,), (33,))[k]:
            seed = 100 * bits + 10 * k + d
            x = _random((300, d), seed, device, dtype)
            th, lv = _tables(d, bits, acc, device)
            signs = _rotation_signs(d, acc, device, seed)
            norm_dtype = (torch.float32, torch.float16, torch.bfloat16)[k]
            cases.append(("lloyd_encode", (x, signs, th, bits, norm_dtype)))
            packed, norm = ops.lloyd_encode_reference(x, signs, th, bits, torch.float32)
            cases.append(("lloyd_decode", (packed, norm, signs, lv, bits, d)))
            keys = _random((2, 37, d), seed + 1, device)
            kp, kn = ops.lloyd_encode_reference(keys.reshape(-1, d), signs[:0], th, bits, torch.float32)
            kp, kn = kp.reshape(2, 37, -1), kn.reshape(2, 37)
            q = _random((2, 4, d), seed + 2, device)
            cases.append(("lloyd_scores", (q, kp, kn, lv, bits)))
            m = d + 11
            sketch = gaussian_sketch(m, d, seed).to(device=device, dtype=acc)
            cases.append(("qjl_encode", (x, sketch, norm_dtype)))
            sp, sn = ops.qjl_encode_reference(keys.reshape(-1, d), sketch, torch.float32)
            sp, sn = sp.reshape(2, 37, -1), sn.reshape(2, 37)
            qs = q @ sketch.T
            cases.append(("qjl_scores", (qs, sp, sn, 0.0123)))
            cases.append(("turbo_prod_encode", (x, signs, th, lv, bits, sketch, norm_dtype)))
            cases.append(("turbo_prod_scores", (q, qs, kp, kn, lv, bits, sp, sn, 0.0123)))
            group = 11 if d == 33 else 16
            cases.append(("minmax_encode", (x, group, bits, norm_dtype)))
            mp, ml, ms = ops.minmax_encode_reference(x, group, bits, torch.float16)
            cases.append(("minmax_decode", (mp, ml, ms, group, bits, d)))
            codes = (torch.arange(300 * d, device=device) * 7 % (1 << bits)).to(torch.uint8).reshape(300, d)
            cases.append(("pack_bits", (codes, bits)))
            cases.append(("unpack_bits", (ops.pack_bits_reference(codes.cpu(), bits).to(device), bits, d)))
            cases.append(("sign_decode", _sign_decode_args(sp, sketch, sn, seed, device)))
            cases.append(("turbo_prod_decode", _turbo_prod_decode_args(packed, norm, signs, lv, bits, x, sketch)))
    return cases
