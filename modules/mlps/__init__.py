"""MLP variants: one module file each, registered by name (see modules/registry.py)."""


def build_mlp(cfg):
    from modules.registry import variant
    return variant("mlp", cfg.mlp.name)(cfg)


__all__ = ["build_mlp"]
