"""Dynamic Tanh (Zhu et al. 2025, "Transformers without Normalization"): y = weight * tanh(alpha * x) + bias.

No statistics at all: an element-wise squashing with one learnable scalar alpha per layer (init alpha_init; the
paper's default is 0.5) and per-channel weight (init 1) and bias (init 0). The bias is part of the definition, so
it is kept even when the model has bias=false.

Eager on CPU in fp32 (the residual stream, under bf16-mixed too) it is one C++ kernel each way
(modules/kernels/dyt.py), where PyTorch's ops are four kernels forward and several backward. Compiled on CPU, tanh
is written as 2 sigmoid(2z) - 1, the same function: inductor's CPU lowering of tanh took 1.8x as long as this form
forward and backward together (one DyT at (2048, 128) fp32, one thread, an AVX2 EPYC: 2.5 ms against 1.4 ms; a
compiled small-cpu step with DyT ran 5.7% under the LayerNorm baseline; docs/bench.md, "DyT's tanh under compile").
The form's error is absolute, at most ~2e-7 (two units in fp32's last place at 1), not relative to tanh's value near
0: negligible beside the output's scale, as the tests check against float64. (Inductor itself emitted this form
until PyTorch issue 148241, where a sign near 0 mattered (atan2 downstream); it now calls Sleef's tanh and keeps the
form behind `torch._inductor.config.cpp.use_decompose_tanh`. DyT's output feeds a matmul, where only the absolute
error counts.)
"""
from dataclasses import dataclass

import torch
from torch import nn

from modules.kernels import dyt as dyt_kernel
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
        if (x.device.type == "cpu" and x.dtype == torch.float32 and self.weight.dtype == torch.float32 and x.numel()
                and not torch.compiler.is_compiling()):
            if (k := dyt_kernel.kernel()) is not None:  # eager on CPU: one C++ pass each way
                return k.dyt(x, self.alpha, self.weight, self.bias)
        z = self.alpha * x
        if torch.compiler.is_compiling() and x.device.type == "cpu":
            t = 2 * torch.sigmoid(2 * z) - 1  # = tanh(z), see the docstring
        else:
            t = torch.tanh(z)
        return t * self.weight + self.bias
