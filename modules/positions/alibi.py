"""ALiBi (Press et al. 2022): no embedding; each head adds -slope * distance to its attention scores."""
import math

import torch

from modules.positions.base import Position
from modules.registry import register


def alibi_slopes(n_head: int) -> torch.Tensor:
    """Geometric slopes 2^(-8/n), 2^(-16/n), ...; for n not a power of two, the paper's recipe: the slopes of
    the nearest lower power of two, then every other slope of the next power of two."""
    def pow2(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    m = 2 ** math.floor(math.log2(n_head))
    slopes = pow2(m) + pow2(2 * m)[0::2][: n_head - m]
    return torch.tensor(slopes, dtype=torch.float32)


@register("position", "alibi")
class ALiBiPosition(Position):
    adds_attn_bias = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.register_buffer("slopes", alibi_slopes(cfg.n_head), persistent=False)

    def attn_bias(self, pos_q, pos_k):
        # fp32 and bounded (slope <= 0.5 times a distance < context length): no overflow under bf16 autocast.
        dist = (pos_q[:, None, :, None] - pos_k[:, None, None, :]).float()  # (B, 1, Tq, Tk)
        return -self.slopes.to(dist.device)[None, :, None, None] * dist.abs()  # (B, nh, Tq, Tk)
