"""What the conformance kit's checks share (:mod:`kvstats.quant.conformance`, :mod:`kvstats.quant._cache_checks`):
the report of a failed check (:class:`CheckFailed`, raised through :class:`Check`), the test data (:func:`draw`)
and the comparison of results up to fp32 rounding (:func:`close`, :func:`vectors_apart`)."""

from __future__ import annotations

import contextlib

import torch

from kvstats.quant._guard import InputGuard

__all__ = ["BATCH", "HEADS", "Check", "CheckFailed", "apart", "close", "draw", "vectors_apart"]

#: Batch rows and heads of the test data (x [B, H, n, d]).
BATCH, HEADS = 2, 3


class CheckFailed(AssertionError):
    """A failed conformance check; the message starts with ``check_quantizer[<check>]``."""


class Check:
    """Raise :class:`CheckFailed` naming the check and the quantizer."""

    def __init__(self, quantizer):
        self.quantizer = quantizer

    def fail(self, check: str, message: str):
        raise CheckFailed(f"check_quantizer[{check}] failed for {self.quantizer!r}: {message}")

    def guarded(self, quantizer):
        """``quantizer`` with every input of every call compared after the call with a copy taken before it."""
        return InputGuard(quantizer, lambda message: self.fail("input", message))

    def that(self, ok: bool, check: str, message: str) -> None:
        if not ok:
            self.fail(check, message)

    @contextlib.contextmanager
    def running(self, check: str, doing: str = ""):
        """Report an exception raised inside the quantizer as a failure of ``check``."""
        try:
            yield
        except CheckFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - any exception of the quantizer fails the check it happened in
            where = f" while {doing}" if doing else ""
            self.fail(check, f"the quantizer raised {type(exc).__name__}{where}: {exc}")


def draw(shape, seed: int, dtype=torch.float32) -> torch.Tensor:
    """Test data x ~ N(0, I) of ``shape`` from ``seed``: drawn in float64, then cast to ``dtype``."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to fp32 rounding: a rotation applied as a matmul rounds differently for another number of rows."""
    return a.shape == b.shape and not bool(apart(a, b).any())


def apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where a and b (of one shape) differ beyond fp32 rounding: 1e-5 of max|b| plus 1e-5 of |b|."""
    a, b = a.double(), b.double()
    return (a - b).abs() > 1e-5 * b.abs().amax().clamp_min(1e-30) + 1e-5 * b.abs()


def vectors_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many vectors (rows over the last axis) of a and b differ beyond fp32 rounding (:func:`close` row by row).

    Codes of the same vectors formed in other groups of rows may differ in a few vectors: a rotation or sketch
    computed by a matmul rounds differently for another number of rows, and a coordinate within an ulp of a cell
    boundary then takes the neighbouring cell (about 1e-4 per vector of 64 coordinates, so three or more of 54
    vectors apart has probability below 1e-7); a code that depends on the other rows moves most of them."""
    return int(apart(a, b).any(-1).sum())
