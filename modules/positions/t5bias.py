"""T5's relative position bias (Raffel et al. 2020), causal: each head adds a learned scalar to its attention
scores, looked up by the bucket of the distance n = query position - key position >= 0.

Buckets: the first num_buckets/2 hold the distances 0, 1, ... exactly; the rest are log-spaced up to max_distance,
and every longer distance shares the last bucket (so the scheme runs at any length). One table for all layers,
as in T5.
"""
import math
from dataclasses import dataclass

import torch
from torch import nn

from modules.options import check_int, fail
from modules.positions.base import Position, PositionOptions
from modules.registry import register


@dataclass(frozen=True)
class T5BiasOptions(PositionOptions):
    num_buckets: int = 32    # T5's default
    max_distance: int = 128  # distances >= this share the last bucket

    def __post_init__(self):
        check_int(self.key("num_buckets"), self.num_buckets, lo=2)
        check_int(self.key("max_distance"), self.max_distance)
        if self.max_distance <= self.num_buckets // 2:
            fail(self.key("max_distance"), self.max_distance,
                 f"must exceed num_buckets/2={self.num_buckets // 2} (the exact buckets); raise it")


def relative_bucket(n: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Bucket index of each causal distance n >= 0 (int64 tensor of any shape)."""
    exact = num_buckets // 2
    log_ratio = torch.log(n.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    far = (exact + (log_ratio * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return torch.where(n < exact, n, far)


@register("position", "t5bias")
class T5BiasPosition(Position):
    Options = T5BiasOptions
    adds_attn_bias = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.num_buckets, self.max_distance = cfg.position.num_buckets, cfg.position.max_distance
        self.rel_bias = nn.Embedding(self.num_buckets, cfg.n_head)  # (buckets, nh)

    def attn_bias(self, pos_q, pos_k):
        n = (pos_q[:, :, None] - pos_k[:, None, :]).clamp(min=0)  # (B, Tq, Tk); future keys are masked anyway
        bucket = relative_bucket(n, self.num_buckets, self.max_distance)
        # gathered head-first, so each head's (Tq, Tk) scores are contiguous: the lookup then permute gave a view
        # strided by nh, which the compiled softmax read element by element (3 ms a layer at small-cpu's shapes)
        return self.rel_bias.weight.float().t()[:, bucket].transpose(0, 1)  # (nh, B, Tq, Tk) -> (B, nh, Tq, Tk)
