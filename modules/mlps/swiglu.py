"""SwiGLU (Shazeer 2020): silu(x W_gate) * (x W_up) -> W_down. Hidden ~ 8/3 d so the three matrices hold as
many parameters as the two of the 4d GELU MLP (see GPTConfig.mlp_hidden)."""
import torch.nn.functional as F
from torch import nn


class SwiGLUMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 2 * cfg.mlp_hidden, bias=cfg.bias)  # gate and up, fused
        self.c_proj = nn.Linear(cfg.mlp_hidden, cfg.n_embd, bias=cfg.bias)
        self.c_proj.residual = True
        self.dropout = nn.Dropout(cfg.dropout)

    def gate(self, g):
        return F.silu(g)

    def forward(self, x):
        g, u = self.c_fc(x).chunk(2, dim=-1)  # 2 x (B, T, H)
        return self.dropout(self.c_proj(self.gate(g) * u))  # (B, T, C)
