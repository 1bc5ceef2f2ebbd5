"""What every MLP shares: the hidden width option and its default; the Linears, and so the parameter and FLOP
counts, are read from the module itself (modules/accounting.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from modules.kernels import gelu_tanh as gelu_kernel
from modules.kernels import glu as glu_kernel
from modules.options import VariantOptions, check_choice, check_int


@dataclass(frozen=True)
class MLPOptions(VariantOptions):
    hidden: int | None = None  # None: the variant's default width (default_hidden)

    family = "mlp"

    def __post_init__(self):
        if self.hidden is not None:
            check_int(self.key("hidden"), self.hidden)


@dataclass(frozen=True)
class GeluOptions(MLPOptions):
    approximate: str = "tanh"  # tanh: GPT-2's approximation; none: the exact erf form (BERT, MPT)

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.key("approximate"), self.approximate, ("tanh", "none"))


# GELU's tanh form as a sigmoid: 0.5 (1 + tanh(u)) = sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), so
# gelu(x) = x * sigmoid(x (_S1 + _S3 x^2)) with _S1 = 2 sqrt(2/pi) and _S3 = 0.044715 _S1: the same function.
_S1 = 2.0 * math.sqrt(2.0 / math.pi)
_S3 = 0.044715 * _S1


def gelu(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """F.gelu, except the tanh form compiled, and eager on CPU. Under torch.compile it is x * sigmoid(...): inductor
    fuses that (and its derivative) into one vectorised loop each way, where its lowering of F.gelu(tanh), like
    ATen's own CPU kernel, took 2.5x as long forward and backward (a compiled small-cpu step x1.15 faster with this
    form; docs/bench.md, "An AMX Xeon"). Eager on CPU it is the same form in one C++ kernel each way
    (modules/kernels/gelu_tanh.py), where the formula in PyTorch ops would be five kernels."""
    if approximate == "tanh":
        if torch.compiler.is_compiling():
            return x * torch.sigmoid(x * (_S1 + _S3 * x * x))
        if x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and x.numel():
            if (k := gelu_kernel.kernel()) is not None:
                return k.gelu_tanh(x)
    return F.gelu(x, approximate=approximate)


def gated(h: torch.Tensor, gate, kernel_gate: str | None) -> torch.Tensor:
    """gate(g) * u of the fused projection's output h = [g, u] (..., 2H) -> (..., H). Eager on CPU in one C++ pass
    each way (modules/kernels/glu.py) where that kernel has the gate (`kernel_gate`: "silu", "gelu_tanh"); else in
    PyTorch ops (compiled, inductor fuses them)."""
    if (kernel_gate is not None and not torch.compiler.is_compiling() and h.device.type == "cpu"
            and h.dtype in (torch.float32, torch.bfloat16) and h.numel()):
        if (k := glu_kernel.kernel()) is not None:
            return k.glu(h, glu_kernel.GATES[kernel_gate])
    g, u = h.chunk(2, dim=-1)  # 2 x (..., H)
    return gate(g) * u


class MLP(nn.Module):
    Options = MLPOptions
    # Linears whose output is added to the residual stream: GPT-2's init scales them by 1/sqrt(2 n_layer).
    # The GPT looks each one up by name when it initialises, so a variant that names them differently must say so.
    residual_projections = ("c_proj",)

    @classmethod
    def validate(cls, cfg) -> None:
        """Checks that involve the rest of the model."""

    def fused_blocks(self) -> dict[str, tuple[int, ...]]:
        """{Linear name: output rows of each block} for a Linear that fuses several maps into one matmul: Muon
        orthogonalises each block on its own (modules/parametrization.py)."""
        return {}

    @classmethod
    def default_hidden(cls, cfg) -> int:
        return 4 * cfg.n_embd


class GatedMLP(MLP):
    """out = c_proj(gate(x W_g) * (x W_u)), with W_g and W_u fused into one c_fc (gate first, then up)."""

    @classmethod
    def default_hidden(cls, cfg) -> int:
        # Three d x h matrices instead of two, so h = 2/3 * 4d keeps the parameter count (and FLOPs) of the 4d
        # MLP; rounded to a multiple of 8 for friendlier matmul shapes.
        return max(8, 8 * round(8 * cfg.n_embd / 3 / 8))

    def fused_blocks(self):
        h = self.c_proj.in_features
        return {"c_fc": (h, h)}  # gate, up
