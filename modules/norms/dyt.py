"""Dynamic Tanh (Zhu et al. 2025, "Transformers without Normalization"): y = weight * tanh(alpha * x) + bias.

No statistics at all: an element-wise squashing with one learnable scalar alpha per layer (init alpha_init; the
paper's default is 0.5) and per-channel weight (init 1) and bias (init 0). The bias is part of the definition, so
it is kept even when the model has bias=false.
"""
from dataclasses import dataclass

import torch
from torch import nn

from modules.norms.base import Norm, NormOptions
from modules.options import check_number
from modules.registry import register


@dataclass(frozen=True)
class DyTOptions(NormOptions):
    alpha_init: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        check_number(self.key("alpha_init"), self.alpha_init, 0)


@register("norm", "dyt")
class DyT(Norm):
    Options = DyTOptions

    def __init__(self, dim: int, cfg):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(cfg.norm.alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):  # (..., dim)
        return torch.tanh(self.alpha * x) * self.weight + self.bias
