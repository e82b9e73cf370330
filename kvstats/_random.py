"""Seeds to generators: the one seed rule of kvstats.

Every ``seed`` argument in the package (quantizers, schemes, rotations, sketches, the synthetic data
generators) goes through :func:`check_seed`:

* an int in [0, 2**63 − 1] (Python int or numpy integer; ``bool`` is refused) is used as given;
* ``None`` means fresh entropy from the operating system (numpy's convention for
  ``np.random.default_rng(None)``): one int in [0, 2**63 − 1] is drawn once and then used — and
  recorded (``q.seed``, ``s.seed``), so an object built with ``seed=None`` can be rebuilt exactly from
  the recorded seed;
* anything else — negative or larger ints, floats, strings, bools — raises (TypeError for a wrong type,
  ValueError for an int out of range) with a message naming ``seed`` and the value seen.

Random objects are built on the CPU from a seeded torch.Generator and then moved to their device, so
the same seed gives the same matrices everywhere.
"""

from __future__ import annotations

import secrets

import numpy as np
import torch

__all__ = ["MAX_SEED", "check_seed", "make_generator", "spawn_seeds"]

#: Largest seed accepted (the range of a signed 64-bit int, which torch and numpy both take).
MAX_SEED = 2**63 - 1


def check_seed(seed, name: str = "seed") -> int:
    """Validate a seed under the package's one rule (module docstring); None draws fresh OS entropy.

    Returns the int seed to use (for None: the fresh one, to be recorded by the caller).
    """
    if seed is None:
        return secrets.randbits(63)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be an int in [0, 2**63 - 1] or None (fresh entropy), "
                        f"got {type(seed).__name__} ({seed!r})")
    if not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"{name} must be an int in [0, 2**63 - 1] or None (fresh entropy), got {seed!r}")
    return int(seed)


def make_generator(seed: int | torch.Generator | None, name: str = "seed") -> torch.Generator:
    """A CPU torch.Generator from a seed under :func:`check_seed` (or the given generator itself, which must be a
    CPU one: every caller draws on the CPU, then moves the result)."""
    if isinstance(seed, torch.Generator):
        if seed.device.type != "cpu":
            raise ValueError(f"{name}: a torch.Generator must be on the CPU (the draws are made there), got one on "
                             f"{seed.device}")
        return seed
    return torch.Generator(device="cpu").manual_seed(check_seed(seed, name))


def unit_seed(seed: int, i: int) -> int:
    """The seed of unit ``i`` of a run seeded ``seed``: 63 bits of child ``i`` of ``numpy.random.SeedSequence(seed)``
    (the child ``SeedSequence(seed).spawn(n)[i]`` for any n > i), so a run with seed 1 shares no unit with the run
    with seed 0 (with ``seed + i``, unit 1 of one was unit 0 of the other), and two units of a run share a seed with
    probability about n²/2⁶⁴. ``seed`` must be an int (the run's seed, drawn once when it was None)."""
    if seed is None:
        raise TypeError("seed must be the run's int seed (draw a fresh one once with check_seed(None)), got None")
    child = np.random.SeedSequence(check_seed(seed), spawn_key=(int(i),))
    hi, lo = (int(w) for w in child.generate_state(2, dtype=np.uint32))
    return ((hi << 32) | lo) & MAX_SEED


def spawn_seeds(seed: int | None, count: int, name: str = "seed") -> list[int]:
    """`count` independent child seeds of `seed` (numpy SeedSequence), e.g. for the K and V quantizers."""
    return [int(s.generate_state(1, dtype=np.uint32)[0])
            for s in np.random.SeedSequence(check_seed(seed, name)).spawn(count)]
