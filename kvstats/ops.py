"""The one door to the compiled op library ``torch.ops.kvstats``.

Each op has three things side by side here:

* ``<op>_reference`` — a pure-torch implementation: the oracle in tests and the fallback when the
  extension is not built;
* a fake (meta) implementation registered with ``torch.library.register_fake`` so the op works under
  ``torch.compile`` and ``torch.library.opcheck``;
* ``<op>`` — the typed wrapper that the rest of kvstats calls. It dispatches to the compiled kernel
  (the dispatcher picks CPU or CUDA by device) unless the extension is missing or the caller asked for
  the references with ``with kvstats.ops.use_reference(): ...``.

No other module touches ``torch.ops.kvstats``. Wrappers here assume validated inputs; argument checks
that name the user's argument live in the public functions (e.g. :func:`kvstats.rotations.fwht`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import warnings
from collections.abc import Iterator

import torch

__all__ = [
    "HAS_EXTENSION",
    "EXTENSION_ERROR",
    "fwht",
    "fwht_reference",
    "kernel_devices",
    "use_reference",
    "using_reference",
]

OPS = ("fwht",)

try:
    from kvstats import _C  # noqa: F401  (loading the library registers torch.ops.kvstats.*)

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


def kernel_devices() -> dict[str, list[str]]:
    """Which dispatch keys have a compiled kernel, per op: ``{"fwht": ["CPU", "CUDA"], ...}``."""
    if not HAS_EXTENSION:
        return {op: [] for op in OPS}
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    return {op: [key for key in ("CPU", "CUDA") if has_kernel(f"kvstats::{op}", key)] for op in OPS}


# ---------------------------------------------------------------------------------------------- fwht


def fwht_reference(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal fast Walsh–Hadamard transform along the last axis, in pure torch.

    y = x · H_d / √d with H_d the Sylvester–Hadamard matrix (H_1 = [1], H_2k = [[H_k, H_k], [H_k, -H_k]]),
    the same order as ``scipy.linalg.hadamard``. O(d log d): log2(d) butterfly stages, each one
    reshape of x to [..., d/(2h), 2, h]. Arithmetic in fp32 (fp64 for fp64 input); returns x's dtype.

    Shapes: x [..., d] with d a power of two -> [..., d].
    """
    d = x.shape[-1]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = x.to(acc).reshape(-1, d)
    h = 1
    while h < d:
        pairs = y.view(-1, d // (2 * h), 2, h)
        a, b = pairs[:, :, 0, :], pairs[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2).view(-1, d)
        h *= 2
    return (y / math.sqrt(d)).to(x.dtype).view(x.shape)


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh–Hadamard transform (kernel, or reference under :func:`use_reference`)."""
    if using_reference():
        return fwht_reference(x)
    return torch.ops.kvstats.fwht.default(x)


if HAS_EXTENSION:

    @torch.library.register_fake("kvstats::fwht")
    def _fwht_fake(x: torch.Tensor) -> torch.Tensor:
        torch._check(x.dim() >= 1, lambda: "fwht: x must have at least one dimension")
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    def _fwht_backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        # H_d/√d is symmetric and orthogonal: the transform is its own adjoint.
        return torch.ops.kvstats.fwht.default(grad)

    torch.library.register_autograd("kvstats::fwht", _fwht_backward)
