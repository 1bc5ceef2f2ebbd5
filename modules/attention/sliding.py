"""Sliding-window attention (Longformer/Mistral style): each query sees itself and the W-1 previous tokens.

The projections are GQA's (n_kv_head defaults to n_head). The window acts in two places, both driven by
GPTConfig.window: the banded mask the GPT builds once per forward (position distance < W), and the KV cache,
which keeps only the last W positions, so decoding memory is O(W) instead of O(T).
"""
from modules.attention.gqa import GroupedQueryAttention


class SlidingWindowAttention(GroupedQueryAttention):
    def __init__(self, cfg, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.window = cfg.window
