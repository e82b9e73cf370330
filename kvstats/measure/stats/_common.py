"""Constants and input checks shared by the statistics modules."""

from __future__ import annotations

import numpy as np

#: Largest n₁·n₂ for which the exact (no-ties) p-value of U is computed (:func:`mwu_exact_cdf`): up to
#: here its float64 result agrees with exact rational arithmetic to ~1e-11 relative (tests), and costs
#: ≤ 0.1 s. Larger samples get the asymptotic p (normal approximation), which is also what scipy's
#: ``method="auto"`` uses there.
EXACT_MAX_PAIRS = 100_000
#: Largest n₁·n₂ for which the Hodges–Lehmann CI uses the exact null distribution of U.
EXACT_CI_MAX_PAIRS = 10_000
#: Resampled values held at once by the bootstrap (8 bytes each: 400 MB); larger runs go in batches.
BOOTSTRAP_MAX_ELEMENTS = 50_000_000
#: Largest n₁·n₂ for which the Hodges–Lehmann estimate is computed (it needs all pairwise differences).
HL_MAX_PAIRS = 20_000_000


def _sample(x, name: str, *, min_size: int = 1) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a 1-D array of numbers, got {type(x).__name__}") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size < min_size:
        raise ValueError(f"{name} must have at least {min_size} value(s), got {arr.size}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains non-finite values (first seen: {arr[~np.isfinite(arr)][0]})")
    return arr


def _check_level(confidence_level: float) -> float:
    if not 0.0 < float(confidence_level) < 1.0:
        raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level}")
    return float(confidence_level)
