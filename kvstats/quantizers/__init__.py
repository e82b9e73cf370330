"""The quantizer family and its registry.

    q = kvstats.quantizer("turbo_prod", bits=4, dim=128, seed=0)

Names: ``lloyd`` (scalar Lloyd–Max, no rotation), ``turbo_mse``, ``turbo_prod``, ``qjl``, ``minmax``, ``nova``
(calibrated: call ``.calibrate(queries, keys)`` before encoding).
Each class documents what it stores, its estimator and its bit count; see also docs/quantizers.md.
"""

from __future__ import annotations

from kvstats.quantizers.base import BitBudget, Code, Quantizer
from kvstats.quantizers.lloyd import LloydQuantizer, TurboMSE
from kvstats.quantizers.minmax import MinMaxQuantizer
from kvstats.quantizers.nova import NovaQuantizer
from kvstats.quantizers.qjl import QJLQuantizer
from kvstats.quantizers.turbo_prod import TurboProd

__all__ = ["BitBudget", "Code", "Quantizer", "QUANTIZERS", "quantizer", "register",
           "LloydQuantizer", "TurboMSE", "TurboProd", "QJLQuantizer", "MinMaxQuantizer", "NovaQuantizer"]

QUANTIZERS: dict[str, type[Quantizer]] = {}


def register(cls: type[Quantizer]) -> type[Quantizer]:
    """Add a Quantizer subclass to the registry under ``cls.name`` (usable as a decorator)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name to register under")
    QUANTIZERS[cls.name] = cls
    return cls


for _cls in (LloydQuantizer, TurboMSE, TurboProd, QJLQuantizer, MinMaxQuantizer, NovaQuantizer):
    register(_cls)


def quantizer(name: str, **kwargs) -> Quantizer:
    """Build a registered quantizer by name: ``quantizer("turbo_mse", bits=4, dim=128, seed=0)``."""
    if name not in QUANTIZERS:
        raise ValueError(f"name must be one of {sorted(QUANTIZERS)}, got {name!r}")
    return QUANTIZERS[name](**kwargs)
