"""Rotary position embeddings (Su et al. 2021): q and k are rotated by position-dependent angles, so their dot
product depends only on the relative offset. The frequency base is configurable (position.base)."""
import torch

from modules.positions.base import Position


class RotaryPosition(Position):
    def __init__(self, cfg):
        super().__init__(cfg)
        # MLA rotates only its decoupled key/query part; every other attention rotates the whole head.
        dim = cfg.rope_dim if cfg.attention.name == "mla" else cfg.head_size
        inv_freq = cfg.position.base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)  # (dim/2,)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rotary(self, pos):
        angles = pos.float()[:, None, :, None] * self.inv_freq.to(pos.device)  # (B, 1, T, dim/2)
        return angles.cos(), angles.sin()
