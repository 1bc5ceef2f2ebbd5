"""Normalisation layers by name. Placement (pre/post) lives in the GPT block; QK-norm in the attention."""
from modules.norms.layernorm import LayerNorm
from modules.norms.rmsnorm import RMSNorm

REGISTRY = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}


def build_norm(cfg, dim: int):
    return REGISTRY[cfg.norm.name](dim, eps=cfg.norm.eps, bias=cfg.bias)


def norm_params(cfg, dim: int) -> int:
    """Parameter count of one norm of width dim (analytic, for accounting)."""
    return dim * (2 if cfg.norm.name == "layernorm" and cfg.bias else 1)


__all__ = ["REGISTRY", "LayerNorm", "RMSNorm", "build_norm", "norm_params"]
