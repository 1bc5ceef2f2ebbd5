"""Attention variants: one module file each, registered by name (see modules/registry.py)."""


def build_attention(cfg, layer_idx: int):
    from modules.registry import variant
    return variant("attention", cfg.attention.name)(cfg, layer_idx)


__all__ = ["build_attention"]
