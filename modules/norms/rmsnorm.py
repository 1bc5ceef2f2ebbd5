"""RMSNorm (Zhang & Sennrich 2019): rescale by the root mean square; no centring, no bias."""
import torch
from torch import nn

from modules.norms.base import EpsNormOptions, Norm
from modules.registry import register


@register("norm", "rmsnorm")
class RMSNorm(Norm):
    Options = EpsNormOptions

    def __init__(self, dim: int, cfg):
        super().__init__()
        self.eps = cfg.norm.eps
        self.weight = nn.Parameter(torch.ones(dim))

    @classmethod
    def num_params(cls, cfg, dim):
        return dim

    def forward(self, x):
        # statistics in fp32: under bf16 autocast the mean of squares of large activations loses precision
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)
