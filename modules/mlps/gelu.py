"""The GPT-2 MLP: d -> 4d -> GELU -> d."""
from torch import nn

from modules.mlps.base import MLP, GeluOptions, gelu
from modules.registry import register


@register("mlp", "gelu")
class GeluMLP(MLP):
    Options = GeluOptions

    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, cfg.mlp_hidden, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.mlp_hidden, cfg.n_embd, bias=cfg.bias)
        self.approximate = getattr(cfg.mlp, "approximate", "tanh")
        self.dropout = nn.Dropout(cfg.dropout)

    def activation(self, h):
        return gelu(h, self.approximate)

    def forward(self, x):
        return self.dropout(self.c_proj(self.activation(self.c_fc(x))))  # (B, T, C) -> (B, T, H) -> (B, T, C)
