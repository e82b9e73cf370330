"""Results files a pipeline can read: strict JSON (no NaN or Infinity), missing values null with a reason.

    json.dumps(strict_json(payload), allow_nan=False)

``strict_json`` replaces every non-finite float by None and records, in a ``null_reasons`` entry of the object that
held it, why the value is missing (by field name, see :data:`NULL_REASONS`); numpy scalars become Python numbers and
anything else that JSON cannot hold becomes its string.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["NULL_REASONS", "strict_json"]

#: Why a value of the results file is null, by field name (a NaN or infinite number has no strict-JSON form).
NULL_REASONS = {
    "pvalue": "an estimate, not a test",
    "effect_size": "no effect size for this result",
    "ci_low": "no interval for this result",
    "ci_high": "no interval for this result",
    "median_ratio": "the median of the second sample is 0",
    "shift": "no shift is detectable at this many units (see reason)",
    "statistic": "not defined for these data",
    "bits_codes": "no token was quantized (the exact window holds them all)",
    "measured_codes": "no token was quantized (the exact window holds them all)",
}


def strict_json(value, key: str = "", reasons: dict | None = None):
    """``value`` with every non-finite float replaced by None; ``reasons`` collects why, by field name."""
    if isinstance(value, dict):
        own: dict[str, str] = {}
        out = {k: strict_json(v, k, own) for k, v in value.items()}
        if own:
            out["null_reasons"] = own
        return out
    if isinstance(value, (list, tuple)):
        return [strict_json(v, key, reasons) for v in value]
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        if reasons is not None:
            reasons[key] = f"{NULL_REASONS.get(key, 'not a finite number')} ({value})"
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
