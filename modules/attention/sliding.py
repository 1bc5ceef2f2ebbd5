"""Sliding-window attention (Longformer/Mistral style): each query sees itself and the W-1 previous tokens.

The projections are GQA's (n_kv_head defaults to n_head). The window acts in two places, both driven by the
variant's `window(cfg)`: the banded mask the GPT builds once per forward (position distance < W), and the KV cache,
which keeps only the last W positions, so decoding memory is O(W) instead of O(T).
"""
from dataclasses import dataclass

from modules.attention.base import AttentionOptions
from modules.attention.gqa import GroupedQueryAttention
from modules.options import check_int, fail
from modules.registry import register


@dataclass(frozen=True)
class SlidingOptions(AttentionOptions):
    window: int | None = None     # required: each query sees itself and the window-1 previous tokens
    n_kv_head: int | None = None  # None: n_head (set it to combine with GQA)

    def __post_init__(self):
        if self.window is None:
            fail(self.key("window"), None, "sliding needs an integer window >= 1")
        check_int(self.key("window"), self.window)
        if self.n_kv_head is not None:
            check_int(self.key("n_kv_head"), self.n_kv_head)


@register("attention", "sliding")
class SlidingWindowAttention(GroupedQueryAttention):
    Options = SlidingOptions

    @classmethod
    def window(cls, cfg):
        return cfg.attention.window
