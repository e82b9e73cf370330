"""transformers' cache, attention and mask registries, imported once with the error that names the extra."""

try:
    from transformers import AttentionInterface
    from transformers.cache_utils import Cache, CacheLayerMixin
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("kvstats.hf needs transformers (the [models] extra): pip install 'kvstats[models]'") from exc

__all__ = ["AttentionInterface", "AttentionMaskInterface", "Cache", "CacheLayerMixin", "sdpa_mask"]
