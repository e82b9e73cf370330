"""A conformance kit for quantizers, in the spirit of scikit-learn's ``check_estimator``.

    from kvstats.testing import check_quantizer
    check_quantizer(MyQuantizer(bits=4, dim=64, seed=0), factory=lambda seed: MyQuantizer(4, 64, seed))

:func:`check_quantizer` runs the protocol checks of docs/quantizers.md on one quantizer and raises an
``AssertionError`` whose message starts with ``check_quantizer[<check>]``, naming the check that failed:

* ``protocol``     — encode / decode / inner / bits_per_coordinate(n_tokens=...) exist; ``dim`` is an int.
* ``shapes``       — x [..., n, d] decodes to [..., n, d]; inner(query [..., n_q, d], code) is [..., n_q, n].
* ``dtypes``       — fp16, bf16, fp32 (and fp64) inputs decode to the input's dtype; inner returns fp32
  (fp64 for fp64 queries); outputs are finite, zero vectors included.
* ``determinism``  — encoding the same x twice gives identical codes; with ``factory``, a quantizer rebuilt
  from the same seed gives identical codes too.
* ``nbytes``       — ``code.nbytes`` equals the bytes of every tensor the code holds (payloads, scalars,
  nested parts), and no tensor is a view into a larger buffer (which nbytes would undercount).
* ``inner``        — with ``linear=True`` (default): inner(q, code) = ⟨q, decode(code)⟩, the consistency of a
  linear estimator (every kvstats quantizer: decode-then-dot, or an unbiased reconstruction such that
  ⟨q, x̂⟩ is the asymmetric estimate). Pass ``linear=False`` for estimators with no such x̂.
* ``bits``         — 8·nbytes = bits_per_coordinate(n_tokens=n).total · x.numel() when all side
  information lives in the code, or = (payload + norms) · x.numel() when it is shared by every code
  (calibration data, counted in ``side`` amortised over ``n_tokens``).
* ``bad input``    — NaN, ±inf, a wrong last dim, an empty tensor, an integer tensor, a non-tensor and a
  non-Code are refused with ValueError or TypeError (never accepted, never another exception).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvstats.quantizers.base import Code

__all__ = ["check_quantizer"]


class _Check:
    """Raise AssertionError naming the check and the quantizer."""

    def __init__(self, quantizer):
        self.quantizer = quantizer

    def fail(self, check: str, message: str):
        raise AssertionError(f"check_quantizer[{check}] failed for {self.quantizer!r}: {message}")

    def that(self, ok: bool, check: str, message: str) -> None:
        if not ok:
            self.fail(check, message)


def _tensors(code: Code, prefix: str = ""):
    for key, t in (*code.payload.items(), *code.scalars.items()):
        yield prefix + key, t
    for name, part in code.parts.items():
        yield from _tensors(part, f"{prefix}{name}.")


def _same_codes(a: Code, b: Code) -> bool:
    ta, tb = dict(_tensors(a)), dict(_tensors(b))
    return ta.keys() == tb.keys() and all(
        ta[k].shape == tb[k].shape and ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]) for k in ta)


def _draw(shape, seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def check_quantizer(quantizer, *, factory: Callable[[int], object] | None = None, linear: bool = True,
                    n_tokens: int = 24, seed: int = 0) -> None:
    """Run the protocol checks (module docstring) on ``quantizer``; raise AssertionError naming the failed one.

    Args:
        quantizer: the quantizer to check (calibrated already, if it needs calibration).
        factory: optional ``factory(seed) -> quantizer`` building it afresh from a seed, for the
            same-seed-same-codes check (``quantizer.seed`` is used as the seed).
        linear: whether inner(q, code) must equal ⟨q, decode(code)⟩ (see the ``inner`` check).
        n_tokens: tokens per encoded batch (axis −2).
        seed: seed of the random test data.
    """
    check = _Check(quantizer)
    q = quantizer
    for method in ("encode", "decode", "inner", "bits_per_coordinate"):
        check.that(callable(getattr(q, method, None)), "protocol", f"no method {method}()")
    d = getattr(q, "dim", None)
    check.that(isinstance(d, int) and d >= 1, "protocol", f"dim must be a positive int, got {d!r}")
    try:
        budget = q.bits_per_coordinate(n_tokens=n_tokens)
    except TypeError as exc:
        check.fail("protocol", f"bits_per_coordinate(n_tokens=...) is part of the protocol: {exc}")

    # shapes -----------------------------------------------------------------------------------------
    x = _draw((2, 3, n_tokens, d), seed)
    query = _draw((2, 3, 5, d), seed + 1)
    code = q.encode(x)
    check.that(isinstance(code, Code), "shapes", f"encode must return a kvstats Code, got {type(code).__name__}")
    check.that(tuple(code.shape) == tuple(x.shape), "shapes",
               f"code.shape {tuple(code.shape)} is not the shape of x {tuple(x.shape)}")
    x_hat = q.decode(code)
    check.that(tuple(x_hat.shape) == tuple(x.shape), "shapes",
               f"decode gave shape {tuple(x_hat.shape)} for x of shape {tuple(x.shape)}")
    scores = q.inner(query, code)
    check.that(tuple(scores.shape) == (2, 3, 5, n_tokens), "shapes",
               f"inner(query [2, 3, 5, d], code of [2, 3, {n_tokens}, d]) gave {tuple(scores.shape)}, "
               f"expected (2, 3, 5, {n_tokens})")
    flat = q.encode(x[0, 0])
    check.that(tuple(q.inner(query[0, 0], flat).shape) == (5, n_tokens), "shapes",
               "inner on a 2-D query and code must give [n_q, n_k]")

    # dtypes -----------------------------------------------------------------------------------------
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        xd, qd = x.to(dtype), query.to(dtype)
        out = q.decode(q.encode(xd))
        check.that(out.dtype == dtype, "dtypes", f"decode of {dtype} input returned {out.dtype}")
        check.that(bool(torch.isfinite(out).all()), "dtypes", f"decode of finite {dtype} input is not finite")
        s = q.inner(qd, q.encode(xd))
        want = torch.float64 if dtype == torch.float64 else torch.float32
        check.that(s.dtype == want, "dtypes", f"inner with {dtype} queries returned {s.dtype}, expected {want}")
        check.that(bool(torch.isfinite(s).all()), "dtypes", f"inner with {dtype} inputs is not finite")
    zeros = torch.zeros(4, d)
    zero_hat = q.decode(q.encode(zeros))
    check.that(bool(torch.isfinite(zero_hat).all()), "dtypes", "zero vectors decode to non-finite values")

    # determinism ------------------------------------------------------------------------------------
    check.that(_same_codes(code, q.encode(x)), "determinism", "encoding the same x twice gave different codes")
    check.that(torch.equal(q.decode(code), x_hat), "determinism", "decoding the same code twice differed")
    if factory is not None:
        again = factory(q.seed)
        check.that(_same_codes(code, again.encode(x)), "determinism",
                   f"a quantizer rebuilt with the same seed {q.seed} gave different codes")

    # nbytes -----------------------------------------------------------------------------------------
    held = 0
    for key, t in _tensors(code):
        size = t.numel() * t.element_size()
        held += size
        check.that(t.untyped_storage().nbytes() <= size, "nbytes",
                   f"code tensor {key!r} ({size} bytes) is a view into a {t.untyped_storage().nbytes()}-byte "
                   "buffer: the code holds more than nbytes counts; store a compact copy")
    check.that(code.nbytes == held, "nbytes", f"code.nbytes = {code.nbytes} but its tensors hold {held} bytes")

    # inner vs decode --------------------------------------------------------------------------------
    if linear:
        exact = query.double() @ x_hat.double().transpose(-1, -2)
        gap = float((scores.double() - exact).abs().max())
        tol = 1e-4 * float(exact.abs().max()) + 1e-5 * float(query.double().norm(dim=-1).max() *
                                                              x_hat.double().norm(dim=-1).max()) + 1e-6
        check.that(gap <= tol, "inner", f"inner(q, code) differs from ⟨q, decode(code)⟩ by {gap:.3g} (> {tol:.3g}); "
                   "pass linear=False if the estimator has no such reconstruction")

    # bit accounting ---------------------------------------------------------------------------------
    bits = 8 * code.nbytes
    in_code, shared = budget.total * x.numel(), (budget.payload + budget.norms) * x.numel()
    check.that(abs(bits - in_code) <= 1e-6 * bits or abs(bits - shared) <= 1e-6 * bits, "bits",
               f"8·nbytes = {bits} bits for {x.numel()} coordinates, but bits_per_coordinate(n_tokens={n_tokens}) "
               f"= {budget} gives {in_code:g} (total) or {shared:g} (payload + norms)")

    # bad input --------------------------------------------------------------------------------------
    bad_x = {"NaN": x.clone().index_fill_(-1, torch.tensor([0]), float("nan")),
             "inf": x.clone().index_fill_(-1, torch.tensor([0]), float("inf")),
             "a wrong last dim": _draw((4, d + 1), seed),
             "an empty tensor": torch.empty(0, d),
             "an integer tensor": torch.ones(4, d, dtype=torch.int64),
             "a list": [[0.0] * d]}
    cases = [(f"encode of {what}", lambda v=v: q.encode(v)) for what, v in bad_x.items()]
    cases += [("inner with a NaN query", lambda: q.inner(bad_x["NaN"][0, 0, :5], flat)),
              ("inner with a query of the wrong dim", lambda: q.inner(_draw((5, d + 1), seed), flat)),
              ("decode of a non-Code", lambda: q.decode({"payload": {}}))]
    for what, call in cases:
        try:
            call()
        except (ValueError, TypeError) as exc:
            check.that(bool(str(exc)), "bad input", f"{what} raised {type(exc).__name__} with an empty message")
        except Exception as exc:  # noqa: BLE001 - the point is to report any other exception type
            check.fail("bad input", f"{what} raised {type(exc).__name__}: {exc} (expected ValueError or TypeError)")
        else:
            check.fail("bad input", f"{what} was accepted (expected ValueError or TypeError)")
