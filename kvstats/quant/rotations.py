"""Rotations and sketches applied to vectors on the last axis.

* :func:`fwht` — orthonormal fast Walsh–Hadamard transform, y = x · H_d / √d, for d a power of two
  (2 ≤ d ≤ 32768). Symmetric, orthogonal, self-inverse: fwht(fwht(x)) = x.
* :class:`RandomizedHadamard` — the randomized WHT rotation Π = H·D/√d (D random ±1 signs) used by
  TurboQuant, for **any** d ≥ 2 (see below).
* :class:`HaarRotation` — a Haar-distributed orthogonal matrix (QR of a Gaussian matrix, sign-corrected).
* :func:`gaussian_sketch`, :func:`orthogonal_sketch`, :func:`srht_sketch` — JL matrices S [m, d] for QJL.

Memory limit. The dense matrices (Haar rotations, sketches) are built in float64 on the CPU; one larger
than :data:`MAX_DENSE_BYTES` (256 MiB: a d × d matrix up to d = 5792, e.g. the m = d sketch at d = 4096
is 128 MiB) is refused before it is allocated, with its size in the message. Use the WHT rotation (O(d)
memory) beyond that.

Head dims that are not powers of two (80, 96, 192, ...) have no Sylvester–Hadamard matrix. :func:`fwht`
refuses them (it never pads silently). :class:`RandomizedHadamard` handles them with three sign-flip +
WHT passes over overlapping power-of-two blocks: with p = 2^⌊log2 d⌋ it transforms coordinates
[0, p), then [d − p, d), then [0, p) again, each after its own random signs. Every pass is orthogonal,
so the whole map is orthogonal on R^d and mixes all coordinates (the first two passes carry [0, p) into
[d − p, d), the third carries that back into [0, d − p)). The mixing is not perfect: structured
cancellations leave some entries of Π exactly zero (depending on the seed: 0–19% at d = 96, mean ≈ 8%;
2–15% at d = 100; none at powers of two — docs/rotations.md), so an input coordinate reaches most, not
all, outputs. Use ``HaarRotation`` where exact
rotation invariance matters more than speed.
All randomness is drawn on the CPU from the seed, so the same seed gives the same rotation on any device.
"""

from __future__ import annotations

import math

import torch

from kvstats._random import make_generator
from kvstats._validation import check_float_tensor, check_int_range, is_power_of_two
from kvstats.quant import ops

__all__ = [
    "MAX_DENSE_BYTES",
    "MAX_FWHT_DIM",
    "check_dense_size",
    "srht_sketch",
    "fwht",
    "Rotation",
    "RandomizedHadamard",
    "HaarRotation",
    "NoRotation",
    "make_rotation",
    "one_pass",
    "one_pass_signs",
    "gaussian_sketch",
    "orthogonal_sketch",
    "spherical_sign_scale",
]

MAX_FWHT_DIM = 32768
#: Largest dense float64 matrix (rotation or sketch) kvstats builds: 256 MiB.
MAX_DENSE_BYTES = 256 * 2**20


def check_dense_size(rows: int, cols: int, what: str) -> None:
    """Refuse a dense float64 [rows, cols] matrix above :data:`MAX_DENSE_BYTES`, naming its size."""
    size = rows * cols * 8
    if size > MAX_DENSE_BYTES:
        raise ValueError(f"{what} would be a dense float64 [{rows}, {cols}] matrix of {size / 2**20:.0f} MiB, above "
                         f"the limit kvstats.quant.rotations.MAX_DENSE_BYTES = {MAX_DENSE_BYTES // 2**20} MiB; use a "
                         "smaller dim or m, or the WHT rotation")


def fwht(x: torch.Tensor, *, check_finite: bool = True) -> torch.Tensor:
    """Orthonormal fast Walsh–Hadamard transform along the last axis.

    y = x · H_d / √d, H_d the Sylvester–Hadamard matrix (``scipy.linalg.hadamard(d)`` order).
    O(d log d) per vector; runs the compiled kernel for x's device when built, else the pure-torch
    reference. Arithmetic in fp32 (fp64 for fp64 input); the result has x's dtype and shape.

    Args:
        x: [..., d] tensor, float16 / bfloat16 / float32 / float64, d a power of two in [2, 32768].
        check_finite: raise on NaN/Inf input (default). With False, NaN/Inf propagate as in torch
            (a non-finite entry spoils its whole vector).

    Returns:
        [..., d] tensor, contiguous.
    """
    check_float_tensor(x, "x", check_finite=check_finite)
    d = x.shape[-1]
    if not (2 <= d <= MAX_FWHT_DIM and is_power_of_two(d)):
        raise ValueError(
            f"x.shape[-1] must be a power of two in [2, {MAX_FWHT_DIM}] for fwht, got {d}; "
            "for other head dims use RandomizedHadamard, which blocks non-powers of two"
        )
    return ops.fwht(x)


def _random_signs(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, (n,), generator=gen, dtype=torch.int64).to(torch.float64) * 2 - 1


def _acc(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


class Rotation:
    """An orthogonal map Π on R^d: ``forward(x) = Π x`` and ``inverse(y) = Πᵀ y`` along the last axis.

    The fused kernels (kvstats.ops) apply a randomized Hadamard rotation themselves, from its signs; any other
    rotation is applied around them. A rotation says which part is which, so that no quantizer asks what
    type of rotation it holds: Π = outer ∘ in-kernel, with

    * ``kernel_signs(device, dtype)`` — the [passes, block] signs the kernels apply ([0, 0]: none);
    * ``outer_forward(x)`` / ``outer_inverse(y)`` — the rest, applied before encoding / after decoding
      (identity when the kernels do it all; in the accumulation dtype otherwise).
    """

    dim: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @property
    def in_kernel(self) -> bool:
        """True when the kernels apply all of Π (outer_forward and outer_inverse are the identity)."""
        return False

    def kernel_signs(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(0, 0, device=device, dtype=dtype)

    def outer_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(_acc(x))

    def outer_inverse(self, y: torch.Tensor) -> torch.Tensor:
        return self.inverse(y)

    def matrix(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Π as a dense [d, d] matrix: ``forward(x) == x @ matrix().T``."""
        eye = torch.eye(self.dim, dtype=dtype)
        return self.forward(eye).T.contiguous()


class RandomizedHadamard(Rotation):
    """Randomized Walsh–Hadamard rotation Π = H_d · diag(s) / √d, s uniform ±1; any d ≥ 2.

    For d a power of two this is one pass (O(d log d)). Otherwise three passes over overlapping
    power-of-two blocks (module docstring). ``forward``/``inverse`` take [..., d] in any float dtype
    and return the same dtype (arithmetic as in :func:`fwht`).
    """

    def __init__(self, dim: int, seed: int | torch.Generator = 0):
        self.dim = check_int_range(dim, "dim", 2, 1 << 20)
        gen = make_generator(seed)
        self.block = 1 << (self.dim.bit_length() - 1)
        if self.block > MAX_FWHT_DIM:
            raise ValueError(f"dim must be at most {2 * MAX_FWHT_DIM - 1} for RandomizedHadamard, got {dim}")
        self.passes = 1 if self.block == self.dim else 3
        self._signs = [_random_signs(self.block, gen) for _ in range(self.passes)]
        self._cache: dict[tuple, list[torch.Tensor]] = {}

    def _signs_on(self, like: torch.Tensor) -> list[torch.Tensor]:
        key = (like.device, like.dtype)
        if key not in self._cache:
            self._cache[key] = [s.to(device=like.device, dtype=like.dtype) for s in self._signs]
        return self._cache[key]

    def signs_matrix(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The random signs as [passes, block] (the form the fused kernels take; kvstats.ops)."""
        key = ("matrix", torch.device(device), dtype)
        if key not in self._cache:
            self._cache[key] = torch.stack(self._signs).to(device=device, dtype=dtype)
        return self._cache[key]

    @property
    def in_kernel(self) -> bool:
        return True

    def kernel_signs(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        return self.signs_matrix(device, dtype)

    def outer_forward(self, x: torch.Tensor) -> torch.Tensor:
        return x  # the kernels read any float dtype and rotate

    def outer_inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y

    def _span(self, k: int) -> slice:
        return slice(self.dim - self.block, self.dim) if k == 1 else slice(0, self.block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        signs = self._signs_on(x)
        if self.passes == 1:
            return ops.fwht(x * signs[0])
        y = x.clone()
        for k in range(3):
            span = self._span(k)
            y[..., span] = ops.fwht(y[..., span] * signs[k])
        return y

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        signs = self._signs_on(y)
        if self.passes == 1:
            return ops.fwht(y) * signs[0]
        x = y.clone()
        for k in (2, 1, 0):
            span = self._span(k)
            x[..., span] = ops.fwht(x[..., span]) * signs[k]
        return x


class HaarRotation(Rotation):
    """Haar-distributed orthogonal Π: Q from the QR of a d×d standard Gaussian, columns sign-corrected
    by sign(diag R) so the law is exactly Haar (Mezzadri 2007). O(d²) per vector."""

    def __init__(self, dim: int, seed: int | torch.Generator = 0):
        self.dim = check_int_range(dim, "dim", 2, 1 << 14)
        check_dense_size(self.dim, self.dim, "the Haar rotation")
        gen = make_generator(seed)
        g = torch.randn(self.dim, self.dim, generator=gen, dtype=torch.float64)
        q, r = torch.linalg.qr(g)
        self._q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
        self._cache: dict[tuple, torch.Tensor] = {}

    def _q_on(self, like: torch.Tensor) -> torch.Tensor:
        acc = torch.float64 if like.dtype == torch.float64 else torch.float32
        key = (like.device, acc)
        if key not in self._cache:
            self._cache[key] = self._q.to(device=like.device, dtype=acc)
        return self._cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self._q_on(x)
        return (x.to(q.dtype) @ q.T).to(x.dtype)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        q = self._q_on(y)
        return (y.to(q.dtype) @ q).to(y.dtype)

    def matrix(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return self._q.to(dtype)


class NoRotation(Rotation):
    """Π = I (the ``lloyd`` quantizer: the codebook on the raw coordinates)."""

    def __init__(self, dim: int):
        self.dim = check_int_range(dim, "dim", 2, 1 << 20)

    @property
    def in_kernel(self) -> bool:
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y

    def outer_forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def one_pass(rotation: Rotation) -> bool:
    """Whether ``rotation`` is Π = I or a one-pass :class:`RandomizedHadamard` (d a power of two) — exactly those
    classes: what the fused decode step applies from the signs alone (:func:`one_pass_signs`)."""
    return type(rotation) is NoRotation or (type(rotation) is RandomizedHadamard and rotation.passes == 1)


def one_pass_signs(rotation: Rotation, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
    """The signs s [d] of a one-pass randomized Hadamard rotation (forward: fwht(x · s), inverse: fwht(y) · s), None
    for Π = I. ``rotation`` must pass :func:`one_pass`."""
    if not one_pass(rotation):
        raise ValueError(f"rotation must be Π = I or a one-pass randomized Hadamard rotation, got {rotation!r}")
    return None if type(rotation) is NoRotation else rotation.signs_matrix(device, dtype)[0]


def make_rotation(kind: str, dim: int, seed: int | torch.Generator) -> Rotation:
    """``"wht"`` -> :class:`RandomizedHadamard`, ``"haar"`` -> :class:`HaarRotation`."""
    if kind == "wht":
        return RandomizedHadamard(dim, seed)
    if kind == "haar":
        return HaarRotation(dim, seed)
    raise ValueError(f"rotation must be 'wht' or 'haar', got {kind!r}")


def gaussian_sketch(m: int, d: int, seed: int | torch.Generator) -> torch.Tensor:
    """S ∈ R^{m×d} with i.i.d. N(0, 1) entries (float64, CPU)."""
    check_int_range(m, "m", 1, 1 << 20)
    check_int_range(d, "d", 2, 1 << 20)
    check_dense_size(m, d, "the Gaussian sketch")
    return torch.randn(m, d, generator=make_generator(seed), dtype=torch.float64)


def orthogonal_sketch(m: int, d: int, seed: int | torch.Generator) -> torch.Tensor:
    """S ∈ R^{m×d} with row-orthogonalised Gaussian rows, each of norm √d (the QJL paper's choice).

    Rows come in blocks of up to d: each block is the first rows of an independent Haar matrix
    scaled by √d, so within a block rows are exactly orthogonal and every row is uniform on the
    sphere of radius √d. Blocks are independent (m > d stacks several).
    """
    check_int_range(m, "m", 1, 1 << 20)
    check_int_range(d, "d", 2, 1 << 20)
    check_dense_size(m, d, "the orthogonal sketch")
    check_dense_size(d, d, "a block of the orthogonal sketch")
    gen = make_generator(seed)
    blocks, left = [], m
    while left > 0:
        rows = min(left, d)
        q = HaarRotation(d, gen).matrix()
        blocks.append(q[:rows] * math.sqrt(d))
        left -= rows
    return torch.cat(blocks, dim=0)


def srht_sketch(m: int, d: int, seed: int | torch.Generator) -> torch.Tensor:
    """D'Alberto's randomized Hadamard sketch (arXiv 2605.08114 §2.2, eq. 3): S = H·diag(s′) [m, d].

    H is the unnormalised ±1 Sylvester–Hadamard matrix of order d (d a power of two: refused otherwise,
    there is no Sylvester matrix to take rows from), s′ fresh Rademacher signs from ``seed``. Rows are
    orthogonal, of norm √d; with m = d, q = sign(S r) and r̂ = (√(π/2)·‖r‖/d)·Sᵀq = (√(π/2)‖r‖/d)·s′⊙(H q)
    is eq. 3. m > d stacks independent blocks (fresh s′ each); a last partial block keeps its first rows.
    Float64, CPU.
    """
    check_int_range(m, "m", 1, 1 << 20)
    check_int_range(d, "d", 2, 1 << 20)
    if not is_power_of_two(d):
        raise ValueError(f"rows='srht' needs a power-of-two sketched width d (the Sylvester–Hadamard matrix), "
                         f"got d = {d}; use rows='orthogonal' or 'gaussian'")
    check_dense_size(m, d, "the SRHT sketch")
    gen = make_generator(seed)
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    blocks, left = [], m
    while left > 0:
        rows = min(left, d)
        blocks.append(h[:rows] * _random_signs(d, gen).to(torch.float64))
        left -= rows
    return torch.cat(blocks, dim=0)


def spherical_sign_scale(d: int) -> float:
    """The constant c making (c/m)·‖k‖·⟨S q, sign(S k)⟩ unbiased for rows s uniform on the sphere of
    radius √d: c = 1 / (√d · E|u₁|) = √π · Γ((d+1)/2) / (√d · Γ(d/2)), u uniform on S^{d−1}.

    For Gaussian rows the constant is √(π/2); c → √(π/2) as d → ∞.
    """
    check_int_range(d, "d", 2, 1 << 30)
    return math.exp(0.5 * math.log(math.pi) + math.lgamma((d + 1) / 2) - 0.5 * math.log(d) - math.lgamma(d / 2))
