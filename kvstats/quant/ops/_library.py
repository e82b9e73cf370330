"""The compiled op library and which implementation serves a call.

``kvstats._C`` registers every op twice from one schema list (``cuda_ext/csrc/schemas.h``): under ``kvstats``
(the fast CPU kernels and the CUDA kernels) and under ``kvstats_shared`` (the GPU's row programs run on the
CPU, one serial lane for a thread block). :func:`kernel` picks, per call, the compiled kernel for the
tensors' device — the shared backend for CPU tensors inside :func:`shared_path` — or None, and the family
module then runs the pure-torch reference (no extension, or inside :func:`use_reference`).

The contract helpers below are the rules every op's fake shares; each raises ValueError or TypeError naming
the op and the argument, with the messages of ``cuda_ext/csrc/prologue/common.h`` (TORCH_CHECK_VALUE,
TORCH_CHECK_TYPE), so that a malformed input is refused alike on every path.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import warnings
from collections.abc import Callable, Iterator

import torch

#: The namespaces of the op library: the fast kernels (CPU, CUDA) and the GPU's code on the CPU.
NAMESPACE, SHARED_NAMESPACE = "kvstats", "kvstats_shared"

try:
    from kvstats import _C  # noqa: F401 - loading the library registers torch.ops.kvstats.* and kvstats_shared.*

    HAS_EXTENSION = True
    EXTENSION_ERROR: str | None = None
except ImportError as exc:  # no compiler on this machine, or an incompatible torch
    HAS_EXTENSION = False
    EXTENSION_ERROR = str(exc)
    warnings.warn(
        f"kvstats: the compiled extension kvstats._C is not available ({exc}); "
        "using the pure-torch reference implementations (correct, slower). "
        "Rebuild with `pip install --no-build-isolation -e .` to get the kernels.",
        RuntimeWarning,
        stacklevel=2,
    )

_FORCE_REFERENCE: contextvars.ContextVar[bool] = contextvars.ContextVar("kvstats_force_reference", default=False)
_SHARED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "kvstats_shared_path", default=os.environ.get("KVSTATS_SHARED_PATH") == "1")


@contextlib.contextmanager
def use_reference(enabled: bool = True) -> Iterator[None]:
    """Run every op on its pure-torch reference inside the block (for timing and debugging)."""
    token = _FORCE_REFERENCE.set(enabled)
    try:
        yield
    finally:
        _FORCE_REFERENCE.reset(token)


def using_reference() -> bool:
    """True when ops run on the references: forced by :func:`use_reference` or no extension."""
    return _FORCE_REFERENCE.get() or not HAS_EXTENSION


@contextlib.contextmanager
def shared_path(enabled: bool = True) -> Iterator[None]:
    """Inside the block, ops on CPU tensors run the GPU's code (the ``kvstats_shared`` backend) instead of the
    fast CPU kernels.

    The CUDA kernels and the shared backend call the same arithmetic (``cuda_ext/csrc/math/``) with the same
    layout of rows and intermediates; the fast CPU kernels have paths of their own (SIMD twins, counting cell
    search, lookup-table and GEMM scores). Here the CPU runs the row programs the GPU runs, one serial lane for
    a thread block, so a test on CPU checks the lines the GPU executes. Slower; for tests. The switch holds in
    the current context (thread, task), and ``KVSTATS_SHARED_PATH=1`` in the environment turns it on from
    import. Needs the extension.
    """
    if not HAS_EXTENSION:
        raise RuntimeError(f"kvstats.ops.shared_path needs the compiled extension: {EXTENSION_ERROR}")
    token = _SHARED.set(bool(enabled))
    try:
        yield
    finally:
        _SHARED.reset(token)


def using_shared_path() -> bool:
    """True when CPU ops take the shared (GPU) code: inside :func:`shared_path` or KVSTATS_SHARED_PATH=1."""
    return HAS_EXTENSION and _SHARED.get()


def kernel(op: str, device: torch.device) -> Callable | None:
    """The compiled kernel of ``op`` that serves tensors on ``device`` now, or None (the reference runs)."""
    if using_reference():
        return None
    if device.type == "meta":  # shapes and dtypes only: the op's fake (registered as its Meta kernel) answers
        return getattr(getattr(torch.ops, NAMESPACE), op).default
    namespace = SHARED_NAMESPACE if device.type == "cpu" and _SHARED.get() else NAMESPACE
    return _registered(namespace, op, device.type)


@functools.cache
def _registered(namespace: str, op: str, device_type: str) -> Callable | None:
    """The kernel of ``namespace::op`` registered for ``device_type``, or None — looked up once per process (the
    library registers every kernel when it loads; a decode step calls several ops per layer)."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"{namespace}::{op}", device_type.upper()):
        return None
    return getattr(getattr(torch.ops, namespace), op).default


#: op name -> its fake (its Python contract), in the order the family modules registered them.
CONTRACTS: dict[str, Callable] = {}


def register_fake(op: str) -> Callable[[Callable], Callable]:
    """Register the decorated function as the fake of ``op`` in both namespaces (when the library is loaded), so
    that the op traces under torch.compile and passes ``torch.library.opcheck``; returns the function, which the
    op's reference also calls for its checks. The op joins :data:`CONTRACTS` (``kvstats.ops.OPS``)."""

    def register(fake: Callable) -> Callable:
        if op in CONTRACTS:
            raise ValueError(f"op {op!r} already has a contract ({CONTRACTS[op].__module__})")
        CONTRACTS[op] = fake
        if HAS_EXTENSION:
            for namespace in (NAMESPACE, SHARED_NAMESPACE):
                torch.library.register_fake(f"{namespace}::{op}")(fake)
        return fake

    return register


def kernel_devices(ops: tuple[str, ...]) -> dict[str, list[str]]:
    """Which dispatch keys have a compiled (fast) kernel, per op: ``{"fwht": ["CPU", "CUDA"], ...}``."""
    if not HAS_EXTENSION:
        return {op: [] for op in ops}
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    return {op: [key for key in ("CPU", "CUDA") if has_kernel(f"{NAMESPACE}::{op}", key)] for op in ops}


# ---------------------------------------------------------------------------------------- dtypes

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: Largest head dimension the Walsh–Hadamard kernels accept (prologue/common.h: kMaxFwhtDim).
MAX_FWHT_DIM = 32768


def storage_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    """Stored scalars keep fp64 for fp64 inputs (oracles), else the requested dtype."""
    return torch.float64 if x.dtype == torch.float64 else dtype


def acc_dtype(x: torch.Tensor) -> torch.dtype:
    """The accumulation dtype of x: fp64 for fp64, else fp32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def packed_nbytes(d: int, bits: int) -> int:
    """Bytes of one packed row of d codes of ``bits`` bits: ceil(d·bits/8)."""
    return (d * bits + 7) // 8


# --------------------------------------------------------------------------------- contract rules


def check_bits(bits: int, op: str) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"{op}: bits must be in [1, 8], got {bits}")


def check_device(ref: torch.Tensor, t: torch.Tensor, op: str, name: str) -> None:
    if t.device != ref.device:
        raise ValueError(f"{op}: {name} must be on {ref.device}, got {t.device}")


def check_float(t: torch.Tensor, op: str, name: str) -> None:
    if t.dtype not in FLOATS:
        raise TypeError(f"{op}: {name} must be a float tensor, got {t.dtype}")


def check_dtype(t: torch.Tensor, allowed, op: str, name: str) -> None:
    allowed = allowed if isinstance(allowed, tuple) else (allowed,)
    if t.dtype not in allowed:
        raise TypeError(f"{op}: {name} must be {' or '.join(map(str, allowed))}, got {t.dtype}")


def check_storage(dtype: torch.dtype) -> None:
    if dtype not in FLOATS:
        raise TypeError(f"norm/side dtype must be float16, bfloat16, float32 or float64, got {dtype}")


def check_signs(ref: torch.Tensor, signs: torch.Tensor, d: int, acc: torch.dtype, op: str) -> None:
    """signs [passes, block] of the rotation (0, 1 or 3 passes of a power-of-two block that fits d)."""
    check_device(ref, signs, op, "signs")
    if signs.dim() != 2:
        raise ValueError(f"{op}: signs must be [passes, block], got {tuple(signs.shape)}")
    check_dtype(signs, acc, op, "signs")
    passes, block = signs.shape
    if passes not in (0, 1, 3):
        raise ValueError(f"{op}: signs must have 0, 1 or 3 passes, got {passes}")
    if passes > 0 and not (1 <= block <= MAX_FWHT_DIM and block & (block - 1) == 0 and block <= d
                           and (passes == 3 or block == d) and 2 * block > d):
        raise ValueError(f"{op}: rotation block {block} does not fit d = {d} with {passes} pass(es)")


def check_table(ref: torch.Tensor, table: torch.Tensor, expected: int, op: str, name: str) -> None:
    check_device(ref, table, op, name)
    if table.dim() != 1 or table.shape[0] != expected:
        raise ValueError(f"{op}: {name} must be 1-D of length {expected}, got {tuple(table.shape)}")
    check_dtype(table, acc_dtype(ref), op, name)


def check_packed(packed: torch.Tensor, rows_dim: int, bits: int, d: int, op: str) -> None:
    check_dtype(packed, torch.uint8, op, "packed")
    if packed.dim() != rows_dim:
        raise ValueError(f"{op}: packed must have {rows_dim} dimensions, got {tuple(packed.shape)}")
    nb = packed_nbytes(d, bits)
    if packed.shape[-1] != nb:
        raise ValueError(f"{op}: packed.size(-1) must be ceil({d}*{bits}/8) = {nb}, got {packed.shape[-1]}")


def check_score_keys(q, packed, norm, bits: int, op: str, what: str) -> None:
    """q [G, n_q, ·] float32/64; packed [G, n_k, ·] of width ceil(q.size(2)·bits/8); norm [G, n_k] float."""
    if q.dim() != 3:
        raise ValueError(f"{op}: {what} must be [G, n_q, {'d' if bits > 1 or what == 'q' else 'm'}], "
                         f"got {tuple(q.shape)}")
    check_dtype(q, (torch.float32, torch.float64), op, what)
    check_packed(packed, 3, bits, q.shape[2], op)
    check_device(q, packed, op, "packed")
    check_device(q, norm, op, "norm")
    if packed.shape[0] != q.shape[0]:
        raise ValueError(f"{op}: packed.size(0) must equal {what}.size(0) = {q.shape[0]}, got {packed.shape[0]}")
    if norm.dim() != 2 or tuple(norm.shape) != tuple(packed.shape[:2]):
        raise ValueError(f"{op}: norm must be [G, n_k] = {list(packed.shape[:2])}, got {tuple(norm.shape)}")
    check_float(norm, op, "norm")


def scores_like(q: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """The empty output [G, n_q, n_k] of a score op."""
    return q.new_empty(q.shape[0], q.shape[1], packed.shape[1])


def check_weighted_keys(w, packed, norm, bits: int, d: int, op: str, norm_name: str = "norm") -> None:
    """w [G, n_q, n_k] float32/64 (attention weights); packed [G, n_k, ceil(d·bits/8)] uint8; a per-key weight
    [G, n_k] float (``norm_name``). The rules of the weighted-sum ops (the score ops' keys, with the weights in
    place of the queries)."""
    if w.dim() != 3:
        raise ValueError(f"{op}: w must be [G, n_q, n_k], got {tuple(w.shape)}")
    check_dtype(w, (torch.float32, torch.float64), op, "w")
    check_packed(packed, 3, bits, d, op)
    check_device(w, packed, op, "packed")
    check_device(w, norm, op, norm_name)
    if packed.shape[0] != w.shape[0] or packed.shape[1] != w.shape[2]:
        raise ValueError(f"{op}: packed must be [G, n_k, ·] = [{w.shape[0]}, {w.shape[2]}, ·] for w "
                         f"{tuple(w.shape)}, got {tuple(packed.shape)}")
    if norm.dim() != 2 or tuple(norm.shape) != tuple(packed.shape[:2]):
        raise ValueError(f"{op}: {norm_name} must be [G, n_k] = {list(packed.shape[:2])}, got {tuple(norm.shape)}")
    check_float(norm, op, norm_name)


def weighted_like(w: torch.Tensor, width: int) -> torch.Tensor:
    """The empty output [G, n_q, width] of a weighted-sum op, in w's dtype."""
    return w.new_empty(w.shape[0], w.shape[1], width)
