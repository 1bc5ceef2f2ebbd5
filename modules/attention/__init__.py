"""Attention variants by name."""
from modules.attention.gqa import GroupedQueryAttention
from modules.attention.mha import MultiHeadAttention
from modules.attention.mla import MultiHeadLatentAttention
from modules.attention.mqa import MultiQueryAttention
from modules.attention.sliding import SlidingWindowAttention

REGISTRY = {
    "mha": MultiHeadAttention,
    "gqa": GroupedQueryAttention,
    "mqa": MultiQueryAttention,
    "sliding": SlidingWindowAttention,
    "mla": MultiHeadLatentAttention,
}


def build_attention(cfg, layer_idx: int):
    return REGISTRY[cfg.attention.name](cfg, layer_idx)


__all__ = ["REGISTRY", "build_attention"]
