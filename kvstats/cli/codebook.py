"""``kvstats codebook``: the exact Lloyd–Max codebook of the sphere law f_d or of N(0, 1)."""

from __future__ import annotations

import argparse

from kvstats.cli.registry import arg, print_payload, subcommand

__all__: list[str] = []


@subcommand(
    "codebook",
    help="print the exact Lloyd-Max codebook of the sphere law f_d (or of N(0,1) with --gaussian / --dim 0)",
    args=[
        arg("--dim", type=int, default=None, help="head dimension d >= 2 (0 = the Gaussian limit N(0,1))"),
        arg("--bits", type=int, required=True, help="bits per coordinate, 1..8"),
        arg("--gaussian", action="store_true", help="the N(0,1) limit instead of f_d"),
        arg("--json", action="store_true", help="print JSON"),
    ],
)
def _codebook(args: argparse.Namespace) -> int:
    from kvstats.quant.codebooks import beta_codebook, gaussian_codebook

    if args.gaussian or args.dim == 0:
        cb = gaussian_codebook(args.bits)
    elif args.dim is None:
        raise ValueError("give --dim D (D >= 2), or --gaussian / --dim 0 for the N(0,1) limit")
    else:
        cb = beta_codebook(args.dim, args.bits)
    payload = cb.to_dict()
    payload["law"] = "N(0,1)" if cb.dim is None else f"coordinate of a uniform point on S^{cb.dim - 1}"
    if not args.json:
        payload["levels"] = " ".join(f"{v:.10g}" for v in cb.levels)
        payload["thresholds"] = " ".join(f"{v:.10g}" for v in cb.thresholds)
    print_payload(payload, args.json)
    return 0
