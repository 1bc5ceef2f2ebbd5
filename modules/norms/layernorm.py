"""LayerNorm with an optional bias (GPT-2 has one; bias=false drops it, as PyTorch's nn.LayerNorm can't). QK-norm's
LayerNorm over heads runs eager on CPU through a C++ kernel (modules/kernels/head_norm.py)."""
import torch
import torch.nn.functional as F
from torch import nn

from modules.kernels import head_norm as head_kernel
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
        if x.dim() == 4 and (k := _head_kernel(x, self.weight)) is not None:  # QK-norm's heads (B, nh, T, hs)
            return k.head_norm(x, self.weight, self.bias, self.eps)
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


def _head_kernel(x: torch.Tensor, weight: torch.Tensor):
    """The C++ kernel for heads normalised in place in the projection's output (modules/kernels/head_norm.py) where
    it applies: eager on CPU, fp32 or bf16 heads with unit stride in their width (at most 1024), fp32 weights; else
    None."""
    if (x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and x.stride(-1) == 1 and x.numel()
            and x.size(-1) <= 1024 and weight.dtype == torch.float32 and not torch.compiler.is_compiling()):
        return head_kernel.kernel()
    return None
