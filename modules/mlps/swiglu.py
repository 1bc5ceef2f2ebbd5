"""SwiGLU (Shazeer 2020): out = W_o (silu(x W_g) * x W_u); hidden ~ 8/3 d keeps the parameters and FLOPs of the
4d GELU MLP (GatedMLP.default_hidden)."""
import torch.nn.functional as F
from torch import nn

from modules.mlps.base import GatedMLP, gated
from modules.registry import register


@register("mlp", "swiglu")
class SwiGLUMLP(GatedMLP):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 2 * cfg.mlp_hidden, bias=cfg.bias)  # gate and up, fused
        self.c_proj = nn.Linear(cfg.mlp_hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    kernel_gate = "silu"  # the gate's name in the CPU kernel (modules/kernels/glu.py); None: it has none

    def gate(self, g):
        return F.silu(g)

    def forward(self, x):
        a = gated(self.c_fc(x), self.gate, self.kernel_gate)  # (B, T, 2H): gate, then up -> (B, T, H)
        return self.dropout(self.c_proj(a))  # (B, T, C)
