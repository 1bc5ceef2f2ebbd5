"""ScaleNorm (Nguyen & Salazar 2019, "Transformers without Tears", eq. 5): y = g * x / ||x||_2.

One learned scalar g per norm, initialised to sqrt(dim) (so a row starts with RMS 1, as after RMSNorm), in place of
per-channel gains; eps bounds ||x|| from below, as the authors' code clamps it. Statistics in fp32.
"""
import torch
from torch import nn

from modules.norms.base import EpsNormOptions, Norm
from modules.registry import register


@register("norm", "scalenorm")
class ScaleNorm(Norm):
    Options = EpsNormOptions

    def __init__(self, dim: int, cfg):
        super().__init__()
        self.eps = cfg.norm.eps
        self.g = nn.Parameter(torch.full((1,), dim ** 0.5))

    def forward(self, x):  # (..., dim)
        xf = x.float()
        return (self.g * xf / torch.linalg.vector_norm(xf, dim=-1, keepdim=True).clamp(min=self.eps)).to(x.dtype)
