"""``kvstats info``: versions, whether the extension is built, which devices have kernels."""

from __future__ import annotations

import argparse

from kvstats.cli.registry import arg, print_payload, subcommand

__all__: list[str] = []


@subcommand("info", help="versions, whether the extension is built, which devices have kernels",
            args=[arg("--json", action="store_true", help="print JSON")])
def _info(args: argparse.Namespace) -> int:
    import platform

    import numpy
    import scipy
    import torch

    from kvstats import __version__
    from kvstats.quant import ops

    payload = {
        "kvstats": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "extension built": ops.HAS_EXTENSION,
        "extension error": ops.EXTENSION_ERROR or "-",
        "kernels": ops.kernel_devices(),
        "cuda available": torch.cuda.is_available(),
        "cuda devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "threads": torch.get_num_threads(),
    }
    print_payload(payload, args.json)
    return 0
