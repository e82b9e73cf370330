"""The quantizer family and its registry.

    q = kvstats.quantizer("turbo_prod", bits=4, dim=128, seed=0)

Names: ``lloyd`` (scalar Lloyd–Max, no rotation), ``turbo_mse``, ``turbo_prod``, ``qjl``, ``minmax``,
``rotated_minmax``, ``int_token`` (min-max per token and head), ``nvfp4`` (NVIDIA's NVFP4), ``fp8_e4m3`` and
``fp8_e5m2`` (OCP FP8, vLLM's and SGLang's caches), ``nova`` (calibrated: call
``.calibrate(queries, keys)`` before encoding). Not registered
(other signatures): :class:`IdentityQuantizer` (lossless), :class:`PerHeadQuantizer` (one quantizer per KV head).
Each class documents what it stores, its estimator and its bit count; see also docs/quantizers.md.
"""

from __future__ import annotations

from kvstats.quant.quantizers.base import BitBudget, Code, CodeSource, Quantizer, held_bytes
from kvstats.quant.quantizers.fp8 import FP8E4M3, FP8E5M2, FP8Quantizer
from kvstats.quant.quantizers.identity import IdentityQuantizer
from kvstats.quant.quantizers.int_token import IntTokenQuantizer
from kvstats.quant.quantizers.lloyd import LloydQuantizer, TurboMSE
from kvstats.quant.quantizers.minmax import MinMaxQuantizer, RotatedMinMax
from kvstats.quant.quantizers.nova import NovaQuantizer
from kvstats.quant.quantizers.nvfp4 import NVFP4Quantizer
from kvstats.quant.quantizers.per_head import PerHeadQuantizer
from kvstats.quant.quantizers.qjl import QJLQuantizer
from kvstats.quant.quantizers.turbo_prod import TurboProd

__all__ = ["BitBudget", "Code", "CodeSource", "Quantizer", "QUANTIZERS", "held_bytes", "quantizer", "register",
           "LloydQuantizer", "TurboMSE", "TurboProd", "QJLQuantizer", "MinMaxQuantizer", "RotatedMinMax",
           "NovaQuantizer", "IdentityQuantizer", "PerHeadQuantizer", "NVFP4Quantizer", "IntTokenQuantizer",
           "FP8Quantizer", "FP8E4M3", "FP8E5M2"]

QUANTIZERS: dict[str, type[Quantizer]] = {}


def register(cls: type[Quantizer] | None = None, *, replace: bool = False):
    """Add a Quantizer subclass to the registry under ``cls.name`` (usable as a decorator, also as
    ``@register(replace=True)``). Its constructor must take ``bits=, dim=, seed=`` keywords to be
    built by :func:`quantizer`. An existing name is refused unless ``replace=True``."""
    if cls is None:
        return lambda c: register(c, replace=replace)
    if not (isinstance(cls, type) and issubclass(cls, Quantizer)):
        raise TypeError(f"cls must be a subclass of kvstats.quantizers.Quantizer, got {cls!r}")
    if not cls.name or not isinstance(cls.name, str):
        raise ValueError(f"{cls.__name__} has no name to register under (set the class attribute name)")
    if cls.name in QUANTIZERS and QUANTIZERS[cls.name] is not cls and not replace:
        raise ValueError(f"a quantizer named {cls.name!r} is already registered ({QUANTIZERS[cls.name].__name__}); "
                         "pass replace=True to replace it")
    QUANTIZERS[cls.name] = cls
    return cls


for _cls in (LloydQuantizer, TurboMSE, TurboProd, QJLQuantizer, MinMaxQuantizer, RotatedMinMax, NovaQuantizer,
             IntTokenQuantizer, NVFP4Quantizer, FP8E4M3, FP8E5M2):
    register(_cls)


def quantizer(name: str, **kwargs) -> Quantizer:
    """Build a registered quantizer by name: ``quantizer("turbo_mse", bits=4, dim=128, seed=0)``."""
    if name not in QUANTIZERS:
        raise ValueError(f"name must be one of {sorted(QUANTIZERS)}, got {name!r}")
    return QUANTIZERS[name](**kwargs)
