"""LayerNorm with an optional bias (GPT-2 has one; bias=false drops it, as PyTorch's nn.LayerNorm can't)."""
import torch
import torch.nn.functional as F
from torch import nn

from modules.norms.base import EpsNormOptions, Norm
from modules.registry import register


@register("norm", "layernorm")
class LayerNorm(Norm):
    Options = EpsNormOptions

    def __init__(self, dim: int, cfg):
        super().__init__()
        self.eps = cfg.norm.eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if cfg.bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
