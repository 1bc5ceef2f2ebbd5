"""Rotary position embeddings (Su et al. 2021): q and k are rotated by position-dependent angles, so their dot
product depends only on the relative offset. The frequency base is configurable (position.base)."""
from dataclasses import dataclass

import torch

from modules.options import check_number, fail
from modules.positions.base import Position, PositionOptions
from modules.registry import register


@dataclass(frozen=True)
class RopeOptions(PositionOptions):
    base: float = 10000.0  # sets the slowest rotation frequency

    def __post_init__(self):
        check_number(self.key("base"), self.base, 1)


@register("position", "rope")
class RotaryPosition(Position):
    Options = RopeOptions

    @classmethod
    def validate(cls, cfg):
        # the attention decides which width is rotated (the whole head, or MLA's decoupled part)
        dim = cfg.rotary_dim
        if dim == 0 or dim % 2:
            key, value = cfg.variant("attention").rotary_dim_source(cfg)
            width = "head size n_embd/n_head" if key == "n_embd" else "rotary width"
            fail(key, value, f"{width}={dim} is odd or zero; rope rotates pairs of dimensions, so it must be even")

    def __init__(self, cfg):
        super().__init__(cfg)
        dim = cfg.rotary_dim
        inv_freq = cfg.position.base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)  # (dim/2,)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rotary(self, pos):
        angles = pos.float()[:, None, :, None] * self.inv_freq.to(pos.device)  # (B, 1, T, dim/2)
        return angles.cos(), angles.sin()
