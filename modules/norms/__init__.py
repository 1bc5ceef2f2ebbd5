"""Normalisation layers: one module file each, registered by name (see modules/registry.py)."""


def build_norm(cfg, dim: int):
    from modules.registry import variant
    return variant("norm", cfg.norm.name)(dim, cfg)


__all__ = ["build_norm"]
