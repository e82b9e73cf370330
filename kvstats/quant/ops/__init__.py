"""The one door to the compiled op library ``torch.ops.kvstats`` (and its twin ``torch.ops.kvstats_shared``).

One module per op family — :mod:`~kvstats.quant.ops.hadamard` (fwht), :mod:`~kvstats.quant.ops.pack`,
:mod:`~kvstats.quant.ops.signs` (sign_decode), :mod:`~kvstats.quant.ops.lloyd`, :mod:`~kvstats.quant.ops.qjl`,
:mod:`~kvstats.quant.ops.turbo_prod`, :mod:`~kvstats.quant.ops.minmax`, :mod:`~kvstats.quant.ops.decode`
(decode_attention, composed of the others) — holds, for each of its ops, side by side:

* ``<op>_fake`` — the op's contract in Python: its checks (shapes, dtypes, devices; ValueError or TypeError
  naming the op and the argument, as the C++ checks in ``cuda_ext/csrc/prologue/``) and its empty outputs. It is
  registered with ``torch.library.register_fake``, so the op traces under ``torch.compile`` and passes
  ``torch.library.opcheck``, and every reference runs it first;
* ``<op>_reference`` — a pure-torch implementation: the oracle in tests and the fallback when the extension
  is not built;
* ``<op>`` — the typed wrapper the rest of kvstats calls. It runs the compiled kernel for the tensors'
  device (:func:`~kvstats.quant.ops._library.kernel`: the fast CPU or the CUDA kernel; on CPU inside
  :func:`shared_path`, the GPU's code), or the reference when the extension is missing or inside
  :func:`use_reference`.

No other module touches ``torch.ops.kvstats``. Wrappers assume inputs their callers validated; argument checks
that name the user's argument live in the public functions (e.g. :func:`kvstats.quant.rotations.fwht`).
"""

from __future__ import annotations

from kvstats.quant.ops import _library, decode, hadamard, lloyd, minmax, pack, qjl, signs, turbo_prod
from kvstats.quant.ops._library import (
    EXTENSION_ERROR,
    HAS_EXTENSION,
    shared_path,
    use_reference,
    using_reference,
    using_shared_path,
)

# Each family module exports its ops' wrappers and references (its __all__); a new op joins its family's
# __all__ and, through its fake, OPS: nothing here changes.
from kvstats.quant.ops.decode import *  # noqa: F403
from kvstats.quant.ops.hadamard import *  # noqa: F403
from kvstats.quant.ops.lloyd import *  # noqa: F403
from kvstats.quant.ops.minmax import *  # noqa: F403
from kvstats.quant.ops.pack import *  # noqa: F403
from kvstats.quant.ops.qjl import *  # noqa: F403
from kvstats.quant.ops.signs import *  # noqa: F403
from kvstats.quant.ops.turbo_prod import *  # noqa: F403

#: The op families, each a module with its ops' fakes, references and wrappers.
FAMILIES = (hadamard, pack, lloyd, qjl, turbo_prod, minmax, signs, decode)
#: Every op of the library (one per schema of cuda_ext/csrc/schemas.h; tests/quant/test_shared_path.py checks
#: both ways).
OPS = tuple(_library.CONTRACTS)

__all__ = ["HAS_EXTENSION", "EXTENSION_ERROR", "OPS", "FAMILIES", "kernel_devices", "use_reference",
           "using_reference", "shared_path", "using_shared_path"]
__all__ += [name for family in FAMILIES for name in family.__all__]


def kernel_devices() -> dict[str, list[str]]:
    """Which dispatch keys have a compiled kernel, per op: ``{"fwht": ["CPU", "CUDA"], ...}``."""
    return _library.kernel_devices(OPS)
