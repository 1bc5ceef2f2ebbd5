"""GEGLU (Shazeer 2020): SwiGLU with a GELU gate."""
import torch.nn.functional as F

from modules.mlps.swiglu import SwiGLUMLP


class GeGLUMLP(SwiGLUMLP):
    def gate(self, g):
        return F.gelu(g, approximate="tanh")
