"""How a position scheme plugs into the GPT: three hooks, each a no-op unless the scheme needs it, plus the facts
the rest of the library asks it (no code outside this folder compares position names); its parameters are
counted from the module itself (modules/accounting.py).

- `add_to_embedding(x, pos)`: absolute schemes (learned, sinusoidal) add a vector to the token embedding.
- `rotary(pos)`: rotary schemes return (cos, sin) tables that attention applies to q and k (`apply_rotary`).
- `attn_bias(pos_q, pos_k)`: relative-bias schemes (alibi, t5bias) return a float bias added to the scores;
  such a scheme sets `adds_attn_bias = True` so the GPT builds a float mask for every call.

`pos` are per-sample position ids (B, T) int64, so left-padded batches and KV-cache decoding see exactly the
positions a prompt would see alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from modules.options import VariantOptions


@dataclass(frozen=True)
class PositionOptions(VariantOptions):
    family = "position"


class Position(nn.Module):
    Options = PositionOptions
    adds_attn_bias = False  # True: attn_bias returns a tensor, so the mask must be a float bias

    def __init__(self, cfg):
        super().__init__()

    # ---- facts, asked by config validation and generation (cfg is a GPTConfig) ----
    @classmethod
    def validate(cls, cfg) -> None:
        """Checks that involve the rest of the model (e.g. rope needs an even rotary width)."""

    @classmethod
    def max_positions(cls, cfg) -> int | None:
        """The largest number of positions the scheme can represent (None: unbounded)."""
        return None

    def embedding_params(self) -> int:
        """Parameters excluded from `params_non_embedding`: the nn.Embedding tables of a scheme that adds to the
        token embedding (learned's wpe); a table read elsewhere (t5bias's score bias) is not an embedding."""
        if type(self).add_to_embedding is Position.add_to_embedding:
            return 0
        return sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Embedding))

    # ---- hooks ----
    def add_to_embedding(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return x

    def rotary(self, pos: torch.Tensor):
        return None

    def attn_bias(self, pos_q: torch.Tensor, pos_k: torch.Tensor):
        return None


def apply_rotary(x: torch.Tensor, rot) -> torch.Tensor:
    """Rotate pairs (x[i], x[i + d/2]) of the last dim by the angles in rot = (cos, sin), each (B, 1, T, d/2)."""
    if rot is None:
        return x
    cos, sin = rot
    x1, x2 = x.float().chunk(2, dim=-1)  # rotate in fp32: angles of late positions need the mantissa
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)
