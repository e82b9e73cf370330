"""A conformance kit for quantizers, in the spirit of scikit-learn's ``check_estimator``.

    from kvstats.measure.testing import check_quantizer
    check_quantizer(MyQuantizer(bits=4, dim=64, seed=0), build=MyQuantizer)   # build(bits=, dim=, seed=)

:func:`check_quantizer` runs the protocol checks of docs/quantizers.md on one quantizer and raises an
``AssertionError`` whose message starts with ``check_quantizer[<check>]``, naming the check that failed; an
exception raised inside the quantizer during a check is reported the same way, as a failure of that check:

* ``protocol``      — encode / decode / inner / bits_per_coordinate(n_tokens=...) exist; ``dim`` is an int ≥ 2.
* ``budget``        — bits_per_coordinate returns payload, norms, side and total that are finite and ≥ 0
  (total = their sum, payload > 0).
* ``shapes``        — x [..., n, d] decodes to [..., n, d]; inner(query [..., n_q, d], code) is [..., n_q, n];
* ``input``         — no call changes its inputs: x of encode, query and code of inner, weights and code of
  weighted_sum, the code of decode and of the plans, the query or weights of a plan (dtype, shape and every
  byte). Checked at every call of every check (:class:`kvstats.quant._guard.InputGuard`): each input is copied
  before the call and compared after it, so an idempotent change (``x.clamp_``, ``x.abs_()``) is seen at the
  first call, before any check uses the changed data.
* ``code fields``   — encode returns a kvstats ``Code`` that holds nothing beyond its fields (no attribute
  set on it, payloads and scalars are tensors, parts are Codes): the cost is what ``nbytes`` counts.
* ``dtypes``        — fp16, bf16, fp32 (and fp64) inputs decode to the input's dtype; inner returns fp32
  (fp64 for fp64 queries); outputs are finite, zero vectors included.
* ``reconstruction`` — for every input dtype the decoded x̂ correlates positively with x (Σ⟨x, x̂⟩ > 0:
  refuses a decode that returns 0 or −x̂); no reconstruction beats Shannon's rate–distortion bound for the
  Gaussian source at the bits the code holds (refuses a decoder that reads x from anywhere but the code);
  with ``build``, the quantizer at its widest bit width (``max_bits``) reconstructs x with a relative
  squared error below 1/2.
* ``determinism``   — encoding the same x twice gives identical codes, and so does a strided view of x (what
  the cache passes); a code decodes and scores the same after another x was encoded (a decoder that returns
  the last input it kept, a stash, fails here, not in the cache check's beam search); with ``factory`` or
  ``build``, a quantizer rebuilt from the same seed gives identical codes and decodes the first one's code
  identically; with ``isolated``, so does one built in a fresh process.
* ``nbytes``        — ``code.nbytes`` equals the bytes of every tensor the code holds, for every input dtype,
  and no tensor is a view into a larger buffer (which nbytes would undercount).
* ``bits``          — at two token counts: for fp32 input 8·nbytes = bits_per_coordinate(n_tokens=n).total ·
  x.numel() when all side information lives in the code, or = (payload + norms) · x.numel() when it is
  shared by every code (calibration data, counted in ``side`` amortised over ``n_tokens``); for fp16 and bf16
  input the same, or fewer bits (a lossless store keeps fp16 as fp16), never more. fp64 inputs are exempt:
  their codes keep fp64 scalars (docs/bit_accounting.md).
* ``inner``         — with ``linear=True`` (default): inner(q, code) = ⟨q, decode(code)⟩, the consistency of a
  linear estimator (every kvstats quantizer). Pass ``linear=False`` for estimators with no such x̂.
* ``weighted sum``  — when the quantizer has ``weighted_sum`` (every kvstats quantizer; the cache takes
  attention's output from it): weighted_sum(w, code) = w · decode(code) for weights w [..., n_q, n], as the
  ``inner`` check.
* ``cache``         — what :class:`kvstats.cache.KVStatsCache` needs (docs/quantizers.md, "What a quantizer owes
  the cache"): codes of 1 and of odd token counts; every code tensor keeps the batch axis of x first, and
  selecting or repeating rows along it (beam search) gives the code of those rows of x; per-vector codes
  appended token by token decode and score as their parts, and their first tokens (crop) as those tokens; a
  quantizer that declares ``codes_per_vector = True`` has codes indexed by token, and tokens encoded a few at a
  time decode and score as the same tokens encoded at once (the cache then encodes window tokens ahead; a
  vector or two in 27 may differ, see ``kvstats.quant._checks.vectors_apart``); ``inner_plan`` and
  ``weighted_sum_plan`` (what the cache's decode steps call) give the numbers of ``inner`` and ``weighted_sum``.
  Code: :mod:`kvstats.quant._cache_checks`.
* ``bad input``     — NaN, ±inf, a wrong last dim, an empty tensor, an integer tensor, a non-tensor and a
  non-Code are refused with ValueError or TypeError (never accepted, never another exception).

Sizing of the rate–distortion check (a correct quantizer never fails it, whatever its design): a code of
R bits per coordinate has at most 2^{NR} reconstructions of the N coordinates of x ~ N(0, I); the
probability that any of them lies within squared distance N·δ of x is at most 2^{NR}·P(χ²_N ≤ Nδ)
(Anderson: a ball holds the most Gaussian mass centred at 0), and by Chernoff's bound with
δ = e^{-2}·2^{-2R} this is below 2^{-N(1 + δ)/(2 ln 2)} ≤ 2^{-0.72 N}: under 1e-2000 for the N = 9,216
coordinates checked.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from kvstats.quant._cache_checks import check_cache
from kvstats.quant._checks import BATCH, HEADS, Check, CheckFailed, close, draw
from kvstats.quant.attention import inner_tolerance
from kvstats.quant.quantizers.base import Code, held_bytes

__all__ = ["CHECKS", "check_quantizer", "decode_in_fresh_process"]

#: The checks, in the order they run.
CHECKS = ("protocol", "budget", "shapes", "input", "code fields", "dtypes", "nbytes", "reconstruction",
          "determinism", "cache", "bits", "inner", "weighted sum", "bad input")
#: Input dtypes every quantizer takes; fp64 (references and oracles) is checked apart where its codes differ.
STORED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: A reconstruction closer to x than e^{-2} times the Gaussian rate–distortion bound 2^{-2R} (module doc).
RD_FACTOR = math.exp(-2.0)
#: At its widest bit width a quantizer must reconstruct x with ‖x − x̂‖²/‖x‖² below this.
WIDEST_MAX_RELATIVE_ERROR = 0.5


def check_quantizer(quantizer, *, factory: Callable[[int], object] | None = None,
                    build: Callable[..., object] | None = None, linear: bool = True, n_tokens: int = 24,
                    heads: int | None = None, seed: int = 0, isolated: bool = False) -> None:
    """Run the protocol checks (module docstring) on ``quantizer``; raise AssertionError naming the failed one.

    Args:
        quantizer: the quantizer to check (calibrated already, if it needs calibration).
        factory: optional ``factory(seed) -> quantizer`` building it afresh from a seed (``quantizer.seed``),
            for the same-seed checks.
        build: optional ``build(bits=, dim=, seed=) -> quantizer`` (the signature of a kvstats quantizer class
            and of what ``kvstats.evaluate`` takes): used for the same-seed checks when ``factory`` is None
            (at ``quantizer.bits``), and for the reconstruction check at the widest bit width
            ``quantizer.max_bits`` (when the quantizer has one).
        linear: whether inner(q, code) must equal ⟨q, decode(code)⟩ (see the ``inner`` check).
        n_tokens: tokens per encoded batch (axis −2); the ``bits`` check also uses ``2·n_tokens + 9``.
        heads: None (default): the general protocol, x of any shape ``[..., n, d]`` (the data are
            ``[2, 3, n, d]`` and ``[n, d]``); an int H: a quantizer of whole caches, checked on
            ``[2, H, n, d]`` alone, what a Scheme and the cache pass (e.g. one quantizer per KV head).
        seed: seed of the random test data.
        isolated: also build the quantizer with ``build`` (picklable) in a freshly started Python process and check
            that it decodes a code made here to the same x̂ (:func:`decode_in_fresh_process`): a decoder that reads
            anything but the code and the seed — a module-level stash keyed by the code's content, a file — fails
            there. Costs the start of a process (seconds).
    """
    check = Check(quantizer)
    q = check.guarded(quantizer)
    budget = _protocol(check, q, n_tokens)
    h = HEADS if heads is None else heads
    x = draw((BATCH, h, n_tokens, q.dim), seed)
    query = draw((BATCH, h, 5, q.dim), seed + 1)
    code, x_hat, scores = _shapes(check, q, x, query, any_shape=heads is None)
    _inputs_and_dtypes(check, q, x, query)
    _reconstruction(check, q, x, build, seed)
    _determinism(check, q, x, query, code, x_hat, factory, build)
    check_cache(check, q, seed, h)
    _bits(check, q, budget, n_tokens, seed, h)
    if linear:
        _inner(check, query, x_hat, scores)
    _weighted_sum(check, q, code, x_hat, seed)
    _bad_input(check, q, x, query, seed, any_shape=heads is None)
    if isolated:
        if build is None:
            check.fail("determinism", "isolated=True needs build(bits=, dim=, seed=) to rebuild the quantizer")
        failure = decode_in_fresh_process([(build, _int_bits(q), q.dim, getattr(q, "seed", seed), q)], heads=h)
        check.that(not failure, "determinism", failure)


# ------------------------------------------------------------------------------------------------- checks


def _protocol(check: Check, q, n_tokens: int):
    for method in ("encode", "decode", "inner", "bits_per_coordinate"):
        check.that(callable(getattr(q, method, None)), "protocol", f"no method {method}()")
    d = getattr(q, "dim", None)
    check.that(isinstance(d, int) and not isinstance(d, bool) and d >= 2, "protocol",
               f"dim must be an int >= 2, got {d!r}")
    try:
        budget = q.bits_per_coordinate(n_tokens=n_tokens)
    except TypeError as exc:
        check.fail("protocol", f"bits_per_coordinate(n_tokens=...) is part of the protocol: {exc}")
    except Exception as exc:  # noqa: BLE001
        check.fail("protocol", f"bits_per_coordinate(n_tokens={n_tokens}) raised {type(exc).__name__}: {exc}")
    _budget(check, budget, f"bits_per_coordinate(n_tokens={n_tokens})")
    return budget


def _budget(check: Check, budget, what: str) -> None:
    fields = {}
    for name in ("payload", "norms", "side", "total"):
        value = getattr(budget, name, None)
        check.that(isinstance(value, (int, float)) and not isinstance(value, bool), "budget",
                   f"{what} must return a BitBudget (payload, norms, side, total numbers), got {budget!r}")
        check.that(math.isfinite(value) and value >= 0, "budget",
                   f"{what}.{name} = {value!r}: every field of the budget must be finite and >= 0")
        fields[name] = float(value)
    check.that(fields["payload"] > 0, "budget", f"{what}.payload = 0: a code holds at least its payload")
    parts = fields["payload"] + fields["norms"] + fields["side"]
    check.that(abs(fields["total"] - parts) <= 1e-9 * max(parts, 1.0), "budget",
               f"{what}.total = {fields['total']!r} is not payload + norms + side = {parts!r}")


def _code_fields(check: Check, code, where: str) -> None:
    check.that(isinstance(code, Code), "code fields", f"{where} must return a kvstats Code, got {type(code).__name__}")
    names = {f.name for f in dataclasses.fields(Code)}
    extra = sorted(set(vars(code)) - names)
    check.that(not extra, "code fields", f"{where} returned a Code carrying attributes beyond its fields: {extra} "
               "(whatever a code holds must be in payload, scalars or parts, where nbytes counts it)")
    for group in ("payload", "scalars"):
        for key, t in getattr(code, group).items():
            check.that(isinstance(t, torch.Tensor), "code fields",
                       f"{where}: code.{group}[{key!r}] is a {type(t).__name__}, not a tensor")
    for key, part in code.parts.items():
        _code_fields(check, part, f"{where} (part {key!r})")


def _shapes(check: Check, q, x: torch.Tensor, query: torch.Tensor, any_shape: bool):
    b, h, n, d = x.shape
    with check.running("shapes", f"encoding x of shape {tuple(x.shape)}"):
        code = q.encode(x)
    _code_fields(check, code, "encode")
    check.that(tuple(code.shape) == tuple(x.shape), "shapes",
               f"code.shape {tuple(code.shape)} is not the shape of x {tuple(x.shape)}")
    with check.running("shapes", "decoding"):
        x_hat = q.decode(code)
        scores = q.inner(query, code)
    check.that(tuple(x_hat.shape) == tuple(x.shape), "shapes",
               f"decode gave shape {tuple(x_hat.shape)} for x of shape {tuple(x.shape)}")
    check.that(tuple(scores.shape) == (b, h, 5, n), "shapes",
               f"inner(query [{b}, {h}, 5, d], code of [{b}, {h}, {n}, d]) gave {tuple(scores.shape)}, "
               f"expected ({b}, {h}, 5, {n})")
    if any_shape:
        with check.running("shapes", "encoding a 2-D x [n, d]"):
            flat = q.encode(x[0, 0])
            flat_scores = q.inner(query[0, 0], flat)
        check.that(tuple(flat_scores.shape) == (5, n), "shapes", "inner on a 2-D query and code must give [n_q, n_k]")
    return code, x_hat, scores


def _inputs_and_dtypes(check: Check, q, x: torch.Tensor, query: torch.Tensor) -> None:
    for dtype in (*STORED_DTYPES, torch.float64):
        xd, qd = x.to(dtype), query.to(dtype)
        with check.running("dtypes", f"encoding {dtype} input"):
            code = q.encode(xd)
        _code_fields(check, code, f"encode of {dtype} input")
        with check.running("dtypes", f"decoding the code of {dtype} input"):
            out = q.decode(code)
            s = q.inner(qd, code)
        check.that(out.dtype == dtype, "dtypes", f"decode of {dtype} input returned {out.dtype}")
        check.that(bool(torch.isfinite(out).all()), "dtypes", f"decode of finite {dtype} input is not finite")
        want = torch.float64 if dtype == torch.float64 else torch.float32
        check.that(s.dtype == want, "dtypes", f"inner with {dtype} queries returned {s.dtype}, expected {want}")
        check.that(bool(torch.isfinite(s).all()), "dtypes", f"inner with {dtype} inputs is not finite")
        held = held_bytes(code)
        check.that(code.nbytes == held, "nbytes", f"for {dtype} input code.nbytes = {code.nbytes} but its tensors "
                   f"hold {held} bytes")
        for key, t in code.named_tensors():
            size = t.numel() * t.element_size()
            check.that(t.untyped_storage().nbytes() <= size, "nbytes",
                       f"code tensor {key!r} ({size} bytes) is a view into a {t.untyped_storage().nbytes()}-byte "
                       "buffer: the code holds more than nbytes counts; store a compact copy")
        dot = float((xd.double() * out.double()).sum())
        check.that(dot > 0, "reconstruction",
                   f"decode of {dtype} input does not correlate with x (Σ⟨x, x̂⟩ = {dot:.4g} <= 0): a reconstruction "
                   "must point the way x does (a decode returning 0 or −x̂ fails here)")
    with check.running("dtypes", "encoding zero vectors"):
        zero_hat = q.decode(q.encode(torch.zeros_like(x)))
    check.that(bool(torch.isfinite(zero_hat).all()), "dtypes", "zero vectors decode to non-finite values")


def _reconstruction(check: Check, q, x: torch.Tensor, build, seed: int) -> None:
    with check.running("reconstruction", "encoding x"):
        code = q.encode(x)
        x_hat = q.decode(code)
    held = held_bytes(code)  # what the code holds, whatever its nbytes says
    rate = 8 * held / x.numel()
    if rate < 24:  # fp32 data carry at most 32 bits a coordinate: below 24 bits the Gaussian bound applies
        mse = float(((x.double() - x_hat.double()) ** 2).mean())
        floor = RD_FACTOR * 2.0 ** (-2 * rate)
        check.that(mse >= floor, "reconstruction",
                   f"x̂ is closer to x (mean squared error {mse:.3g} per coordinate) than any code of {rate:.4g} bits "
                   f"per coordinate can bring Gaussian data (Shannon's bound 2^(-2R) = {2.0 ** (-2 * rate):.3g}, "
                   f"here with a factor e^-2 of slack): the decoder reads x from somewhere the code's {held} "
                   "bytes do not hold (the quantizer, a global, an attribute)")
    widest = getattr(q, "max_bits", None)
    if build is None or not isinstance(widest, int) or isinstance(widest, bool):
        return
    with check.running("reconstruction", f"building the quantizer at its widest bit width {widest}"):
        wide = check.guarded(build(bits=widest, dim=q.dim, seed=getattr(q, "seed", seed)))
        wide_hat = wide.decode(wide.encode(x))
    err = float(((x.double() - wide_hat.double()) ** 2).sum() / (x.double() ** 2).sum())
    check.that(err < WIDEST_MAX_RELATIVE_ERROR, "reconstruction",
               f"at its widest bit width {widest} the quantizer reconstructs x with relative squared error "
               f"‖x − x̂‖²/‖x‖² = {err:.3g} (>= {WIDEST_MAX_RELATIVE_ERROR}): its decode does not recover x")


def _determinism(check: Check, q, x, query, code, x_hat, factory, build) -> None:
    with check.running("determinism", "encoding x again"):
        again = q.encode(x)
        check.that(code.equal(again), "determinism", "encoding the same x twice gave different codes")
        check.that(torch.equal(q.decode(code), x_hat), "determinism", "decoding the same code twice differed")
    wide = torch.cat([x, x], dim=-2)  # a strided view of x: what the cache hands encode (a slice of its span)
    with check.running("determinism", "encoding a strided view of x"):
        strided = q.encode(wide[..., x.shape[-2]:, :])
        strided_hat = q.decode(strided)
    check.that(code.equal(strided) or close(strided_hat, x_hat), "determinism",
               "encoding a strided view of x (x[..., a:b, :] of a longer tensor, what the cache passes) gave other "
               "codes than encoding x itself")
    # before the cache check, whose beam-search rows a decoder returning the last input it kept fails as well
    with check.running("determinism", "encoding another x, then decoding and scoring the first code again"):
        before_scores = q.inner(query, code)
        q.encode(draw(tuple(x.shape), 7654321))
        after_hat = q.decode(code)
        after_scores = q.inner(query, code)
    check.that(torch.equal(after_hat, x_hat) and close(after_scores, before_scores), "determinism",
               "after encoding another x, the first code decodes or scores differently: decode reads state outside "
               "the code (a stash: the last input kept on the quantizer or in a global); it must depend on the code "
               "and the seed only")
    if factory is None and build is None:
        return
    seed = getattr(q, "seed", None)
    with check.running("determinism", f"rebuilding the quantizer with seed {seed!r}"):
        fresh = factory(seed) if factory is not None else build(bits=_int_bits(q), dim=q.dim, seed=seed)
        fresh = check.guarded(fresh)
        other = draw(tuple(x.shape), 1234567)
        q.encode(other)  # anything a cheat stashes about the last input now describes another x
        rebuilt = dataclasses.replace(code, **_cloned_fields(code))
        fresh_hat = fresh.decode(rebuilt)  # before it encodes anything: it cannot have kept what x's code needs
        fresh_scores = fresh.inner(query, rebuilt)
        fresh_code = fresh.encode(x)
        check.that(code.equal(fresh_code), "determinism",
                   f"a quantizer rebuilt with the same seed {seed} gave different codes")
    check.that(torch.equal(fresh_hat, x_hat), "determinism",
               "a quantizer rebuilt with the same seed decodes the code (copied tensor by tensor) to another x̂: "
               "decode must depend on the code and the seed only")
    check.that(close(fresh_scores, q.inner(query, code)), "determinism",
               "a quantizer rebuilt with the same seed scores the code (copied tensor by tensor) differently")


def _int_bits(q):
    """``q.bits`` as the int a constructor takes (qjl reports m/d, a float, which is integral when built from bits)."""
    bits = getattr(q, "bits", None)
    return int(bits) if isinstance(bits, float) and bits.is_integer() else bits


def _cloned_fields(code: Code) -> dict:
    return {"payload": {k: t.clone() for k, t in code.payload.items()},
            "scalars": {k: t.clone() for k, t in code.scalars.items()},
            "parts": {k: dataclasses.replace(p, **_cloned_fields(p)) for k, p in code.parts.items()}}


def _bits(check: Check, q, budget, n_tokens: int, seed: int, heads: int) -> None:
    for n in (n_tokens, 2 * n_tokens + 9):
        with check.running("bits", f"bits_per_coordinate(n_tokens={n})"):
            at_n = budget if n == n_tokens else q.bits_per_coordinate(n_tokens=n)
        _budget(check, at_n, f"bits_per_coordinate(n_tokens={n})")
        x = draw((BATCH, heads, n, q.dim), seed + 2)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            with check.running("bits", f"encoding {dtype} input of {n} tokens"):
                code = q.encode(x.to(dtype))
            bits = 8 * held_bytes(code)
            in_code, shared = at_n.total * x.numel(), (at_n.payload + at_n.norms) * x.numel()
            exact = abs(bits - in_code) <= 1e-6 * bits or abs(bits - shared) <= 1e-6 * bits
            # a narrower input may be stored narrower (a lossless store keeps fp16 as fp16), never wider
            ok = exact or (dtype != torch.float32 and bits <= min(in_code, shared) * (1 + 1e-6))
            check.that(ok, "bits",
                       f"8·nbytes = {bits} bits for {x.numel()} coordinates of {dtype} input ({n} tokens), but "
                       f"bits_per_coordinate(n_tokens={n}) = {at_n} gives {in_code:g} (total) or {shared:g} "
                       "(payload + norms)" + ("" if dtype == torch.float32 else
                                              "; codes of fp16/bf16 input may hold fewer bits, never more"))


def _inner(check: Check, query, x_hat, scores) -> None:
    exact = query.double() @ x_hat.double().transpose(-1, -2)
    gap = float((scores.double() - exact).abs().max())
    tol = inner_tolerance(exact, query, x_hat)  # the cache's check of a decoded plan uses the same
    check.that(gap <= tol, "inner", f"inner(q, code) differs from ⟨q, decode(code)⟩ by {gap:.3g} (> {tol:.3g}); "
               "pass linear=False (kvstats evaluate --nonlinear) if the estimator has no such reconstruction")


def _weighted_sum(check: Check, q, code, x_hat, seed: int) -> None:
    weighted_sum = getattr(q, "weighted_sum", None)
    if weighted_sum is None:  # optional: the cache decodes, then multiplies
        return
    logits = draw((*x_hat.shape[:-2], 5, x_hat.shape[-2]), seed + 2) * 3
    weights = torch.softmax(logits, dim=-1)
    with check.running("weighted sum", "weighted_sum(weights [..., 5, n], code)"):
        got = weighted_sum(weights, code)
    exact = weights.double() @ x_hat.double()
    check.that(tuple(got.shape) == tuple(exact.shape), "weighted sum",
               f"weighted_sum(weights {tuple(weights.shape)}, code) gave {tuple(got.shape)}, expected "
               f"{tuple(exact.shape)}")
    gap = float((got.double() - exact).abs().max())
    tol = 1e-5 * float(x_hat.double().abs().max()) + 1e-6
    check.that(gap <= tol, "weighted sum", f"weighted_sum(w, code) differs from w · decode(code) by {gap:.3g} "
               f"(> {tol:.3g})")


def _bad_input(check: Check, q, x: torch.Tensor, query: torch.Tensor, seed: int, any_shape: bool) -> None:
    d = q.dim
    with check.running("bad input", "encoding x"):
        flat = q.encode(x[0, 0] if any_shape else x)
    good_query = query[0, 0] if any_shape else query
    nan_query = good_query.clone().index_fill_(-1, torch.tensor([0]), float("nan"))
    wrong_query = draw((*good_query.shape[:-1], d + 1), seed)
    bad_x = {"NaN": x.clone().index_fill_(-1, torch.tensor([0]), float("nan")),
             "inf": x.clone().index_fill_(-1, torch.tensor([0]), float("inf")),
             "a wrong last dim": draw((4, d + 1), seed),
             "an empty tensor": torch.empty(0, d),
             "an integer tensor": torch.ones(4, d, dtype=torch.int64),
             "a list": [[0.0] * d]}
    cases = [(f"encode of {what}", lambda v=v: q.encode(v)) for what, v in bad_x.items()]
    cases += [("inner with a NaN query", lambda: q.inner(nan_query, flat)),
              ("inner with a query of the wrong dim", lambda: q.inner(wrong_query, flat)),
              ("decode of a non-Code", lambda: q.decode({"payload": {}}))]
    for what, call in cases:
        try:
            call()
        except (ValueError, TypeError) as exc:
            check.that(bool(str(exc)), "bad input", f"{what} raised {type(exc).__name__} with an empty message")
        except CheckFailed:  # it changed an input (the guard's input check)
            raise
        except Exception as exc:  # noqa: BLE001 - the point is to report any other exception type
            check.fail("bad input", f"{what} raised {type(exc).__name__}: {exc} (expected ValueError or TypeError)")
        else:
            check.fail("bad input", f"{what} was accepted (expected ValueError or TypeError)")


def _defined_in_main(build) -> bool:
    """Whether ``build`` (or the function a functools.partial wraps) is defined in the ``__main__`` module."""
    import functools

    while isinstance(build, functools.partial):
        build = build.func
    return getattr(build, "__module__", None) == "__main__"


def _unguarded_main_script() -> str | None:
    """The running script's path when it has no ``if __name__ == "__main__"`` guard, else None (guarded, or no
    script: an interactive session, ``python -c``)."""
    import re
    import sys
    from pathlib import Path

    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path or not Path(path).is_file():
        return None
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    return None if re.search(r"__name__\s*==\s*['\"]__main__['\"]", text) else str(path)


#: what the fresh interpreter runs: the payload from stdin, the results pickled to stdout
_CHILD = ("import pickle, sys; from kvstats.quant.conformance import _decode_in_this_process as run; "
          "sys.stdout.buffer.write(pickle.dumps(run(sys.stdin.buffer.read())))")


def _fresh_interpreter(payload: bytes, timeout: float) -> list[tuple]:
    """:func:`_decode_in_this_process` in a new ``python -c`` with this process's import path (its ``''``, the
    working folder, as that folder): the builds' modules are imported, the caller's script is not run."""
    import os
    import pickle
    import subprocess
    import sys

    path = os.pathsep.join(p or os.getcwd() for p in sys.path)
    done = subprocess.run([sys.executable, "-c", _CHILD], input=payload, capture_output=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=path))
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"the fresh interpreter exited with {done.returncode}: {last}")
    return pickle.loads(done.stdout)


def _spawned(payload: bytes, timeout: float) -> list[tuple]:
    """:func:`_decode_in_this_process` in a process started by multiprocessing's spawn, which imports the running
    script as ``__mp_main__`` (how a build defined in it is found)."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_decode_in_this_process, payload).result(timeout=timeout)


def _decode_in_this_process(payload: bytes) -> list[tuple]:
    """The child's side of :func:`decode_in_fresh_process`: build each quantizer, decode and score each code."""
    import pickle

    results = []
    for build, bits, dim, seed, code, query in pickle.loads(payload):
        try:
            q = build(bits=bits, dim=dim, seed=seed)
            results.append(("ok", q.decode(code), q.inner(query, code)))
        except Exception as exc:  # noqa: BLE001 - reported to the parent as the check's failure
            results.append(("raised", f"{type(exc).__name__}: {exc}", None))
    return results


def decode_in_fresh_process(tasks, *, heads: int | None = None, timeout: float = 600.0) -> str:
    """Encode test data with each quantizer here, decode the codes with the same quantizer built afresh in a new
    Python process (``multiprocessing`` spawn: no module state of this one), and compare; "" when all agree, else
    the failure in words.

    ``tasks``: ``(build, bits, dim, seed, quantizer)``; ``build(bits=, dim=, seed=)`` must be picklable (a class or
    module-level function, ``functools.partial`` of one; not a lambda). A decoder that keeps what it needs anywhere
    but the code — a module-level dict keyed by the code's bytes, the instance, a global — decodes differently or
    fails there, which the rate–distortion check cannot see when the stash is only partial.

    The fresh process is a new interpreter that imports the builds' modules and nothing else (``python -c``, this
    process's ``sys.path``): the caller's script is not run again. A build defined in the script itself (module
    ``__main__``) can only be found by running the script again as multiprocessing's spawn does, which needs the
    script's work under ``if __name__ == "__main__":``; a script without that guard is told so instead of being
    re-executed (it printed a spurious second report).
    """
    import pickle

    sent, expected = [], []
    for i, (build, bits, dim, seed, q) in enumerate(tasks):
        x = draw((BATCH, HEADS if heads is None else heads, 24, dim), 4242 + i)
        query = draw((BATCH, HEADS if heads is None else heads, 5, dim), 4343 + i)
        code = q.encode(x)
        sent.append((build, bits, dim, seed, code, query))
        expected.append((q.decode(code), q.inner(query, code)))
    try:
        payload = pickle.dumps(sent)
    except Exception as exc:  # noqa: BLE001
        return (f"the quantizer's factory or codes cannot be pickled for a fresh process ({type(exc).__name__}: "
                f"{exc}); give build= a class or a module-level function (functools.partial of one), not a lambda")
    in_main = any(_defined_in_main(build) for build, *_ in tasks)
    if in_main and (unguarded := _unguarded_main_script()):
        return (f"build= is defined in the script {unguarded}, which has no `if __name__ == \"__main__\":` guard: "
                "rebuilding it in a fresh process runs the script again. Put the script's work under that guard, "
                "or define the quantizer in a module of its own and import it")
    try:
        results = (_spawned if in_main else _fresh_interpreter)(payload, timeout)
    except Exception as exc:  # noqa: BLE001 - a child that cannot import the quantizer's module, a crash
        return f"a fresh process could not rebuild the quantizer ({type(exc).__name__}: {exc})"
    for (status, got, scores), (x_hat, want_scores), (_, bits, dim, seed, _) in zip(results, expected, tasks):
        if status != "ok":
            return (f"built in a fresh process (bits={bits}, dim={dim}, seed={seed}), the quantizer raised {got} while "
                    "decoding a code made here: decode depends on state outside the code and the seed")
        if not (close(got, x_hat) and close(scores, want_scores)):
            return (f"built in a fresh process (bits={bits}, dim={dim}, seed={seed}), the quantizer decodes a code "
                    "made here to another x̂: decode depends on state outside the code and the seed (a stash, a global)")
    return ""
