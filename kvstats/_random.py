"""Seeds to generators. Every random object in kvstats is built on the CPU from a seeded
torch.Generator and then moved to its device, so the same seed gives the same matrices everywhere."""

from __future__ import annotations

import numpy as np
import torch


def make_generator(seed: int | torch.Generator, name: str = "seed") -> torch.Generator:
    """A CPU torch.Generator from an int seed (or the given generator itself)."""
    if isinstance(seed, torch.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be an int or a torch.Generator, got {type(seed).__name__} ({seed!r})")
    if seed < 0:
        raise ValueError(f"{name} must be non-negative, got {seed}")
    return torch.Generator(device="cpu").manual_seed(int(seed))


def spawn_seeds(seed: int, count: int) -> list[int]:
    """`count` independent child seeds of `seed` (numpy SeedSequence), e.g. for the K and V quantizers."""
    return [int(s.generate_state(1, dtype=np.uint32)[0]) for s in np.random.SeedSequence(seed).spawn(count)]
