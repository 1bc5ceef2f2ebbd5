"""Learned absolute positions (GPT-2): a table of block_size rows added to the token embedding."""
import torch
from torch import nn

from modules.positions.base import Position
from modules.registry import register


@register("position", "learned")
class LearnedPosition(Position):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.block_size = cfg.block_size
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)

    @classmethod
    def max_positions(cls, cfg):
        return cfg.block_size

    def add_to_embedding(self, x, pos):
        # The table has no row for position >= block_size. Clamping would silently reuse the last row, so refuse;
        # generate() crops the context to block_size tokens instead.
        # (skipped while torch.compile traces: reading the max is a host sync / graph break)
        if not torch.compiler.is_compiling() and pos.numel() and int(pos.max()) >= self.block_size:
            raise ValueError(f"invalid position_ids max={int(pos.max())}: learned positions need ids in "
                             f"[0, {self.block_size - 1}] (block_size={self.block_size}); crop the context")
        return x + self.wpe(pos)  # (B, T, C)
