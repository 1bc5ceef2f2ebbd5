"""Fixed sinusoidal absolute positions (Vaswani et al. 2017), computed on the fly: no parameters, any length."""
import math

import torch

from modules.positions.base import Position
from modules.registry import register


# Each sin/cos pair has RMS 1/sqrt(2) per dimension, while GPT-2-initialised token embeddings have std 0.02: added
# as is, the fixed table would swamp token identity ~35x (Vaswani et al. balance the two by scaling the embeddings
# by sqrt(d), which weight tying with a 0.02-std head rules out here). So the table is scaled to the embeddings'
# init RMS: each dimension of pe gets RMS 0.02, like a learned position table at init.
PE_SCALE = 0.02 * 2**0.5


@register("position", "sinusoidal")
class SinusoidalPosition(Position):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.n_embd = cfg.n_embd
        half = (cfg.n_embd + 1) // 2
        inv_freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) * 2 / cfg.n_embd)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def add_to_embedding(self, x, pos):
        angles = pos.float()[..., None] * self.inv_freq.to(x.device)  # (B, T, C/2)
        # interleave sin (even dims) and cos (odd dims), then trim to C for odd n_embd
        pe = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[..., : self.n_embd]  # (B, T, C)
        return x + (PE_SCALE * pe).to(x.dtype)
