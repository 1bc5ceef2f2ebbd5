"""How a position scheme plugs into the GPT: three hooks, each a no-op unless the scheme needs it.

- `add_to_embedding(x, pos)`: absolute schemes (learned, sinusoidal) add a vector to the token embedding.
- `rotary(pos)`: rotary schemes return (cos, sin) tables that attention applies to q and k (`apply_rotary`).
- `attn_bias(pos_q, pos_k)`: relative-bias schemes (alibi) return a float bias added to the attention scores.

`pos` are per-sample position ids (B, T) int64, so left-padded batches and KV-cache decoding see exactly the
positions a prompt would see alone.
"""
import torch
from torch import nn


class Position(nn.Module):
    def __init__(self, cfg):
        super().__init__()

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
