"""GEGLU (Shazeer 2020): SwiGLU with a GELU gate."""

from modules.mlps.base import GeluOptions, gelu
from modules.mlps.swiglu import SwiGLUMLP
from modules.registry import register


@register("mlp", "geglu")
class GeGLUMLP(SwiGLUMLP):
    Options = GeluOptions

    def gate(self, g):
        return gelu(g, self.approximate)

    @property
    def kernel_gate(self):  # the CPU kernel has GELU's tanh form, not the erf one
        return "gelu_tanh" if self.approximate == "tanh" else None

    def __init__(self, cfg):
        super().__init__(cfg)
        self.approximate = cfg.mlp.approximate
