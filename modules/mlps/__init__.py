"""MLP variants by name."""
from modules.mlps.geglu import GeGLUMLP
from modules.mlps.gelu import GeluMLP
from modules.mlps.relu2 import ReLU2MLP
from modules.mlps.swiglu import SwiGLUMLP

REGISTRY = {"gelu": GeluMLP, "relu2": ReLU2MLP, "swiglu": SwiGLUMLP, "geglu": GeGLUMLP}
GATED = ("swiglu", "geglu")


def build_mlp(cfg):
    return REGISTRY[cfg.mlp.name](cfg)


__all__ = ["REGISTRY", "GATED", "build_mlp"]
