"""Sliding-window attention (Longformer/Mistral style): each query sees itself and the W-1 previous tokens.

The projections are GQA's (n_kv_head defaults to n_head). The window acts in two places, both driven by the
variant's `window(cfg)`: attention, and the KV cache, which keeps only the last W positions, so decoding memory is
O(W) instead of O(T).

Attention costs O(T * W), not O(T^2): for a plain causal call (training, or a prefill into an empty cache, without
padding or a position bias; the GPT then passes mask=None, see `applies_own_window`) the queries are cut into
blocks of W, and each block attends only to its own keys and the previous block's, under one fixed (W, 2W) band
mask; the other W * (T - 2W) scores of each block are never computed. Up to T = 2W the blocks would skip at most a
quarter of the scores and cost more in copies than they save (small-cpu's T = 64, W = 32: 1.55x the causal call's
time, forward and backward, where one call under a (T, T) band mask costs 1.01x; docs/bench.md), so such a call is
one SDPA call under the band. Every other call (cached keys, left padding,
alibi/t5 bias, explicit position ids) gets the GPT's banded (B, 1, T, S) mask, whose window is a distance in
position ids; those calls are decoding steps (T = 1) or short padded prompts.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from modules.attention.base import AttentionOptions, sdpa
from modules.attention.gqa import GroupedQueryAttention
from modules.options import check_int, fail
from modules.registry import register


@dataclass(frozen=True)
class SlidingOptions(AttentionOptions):
    window: int | None = 32       # each query sees itself and the window-1 previous tokens (as sliding.yaml)
    n_kv_head: int | None = None  # None: n_head (set it to combine with GQA)

    def __post_init__(self):
        if self.window is None:
            fail(self.key("window"), None, "sliding needs an integer window >= 1")
        check_int(self.key("window"), self.window)
        if self.n_kv_head is not None:
            check_int(self.key("n_kv_head"), self.n_kv_head)


def _band(W: int, device) -> torch.Tensor:
    """(W, 2W) bool: query i of a block (position bW + i) may see key j of [previous block, own block]
    (position (b-1)W + j) iff the key is not in the future and less than W positions back: i < j <= W + i."""
    i = torch.arange(W, device=device)[:, None]
    j = torch.arange(2 * W, device=device)[None, :]
    return (j > i) & (j <= W + i)


def band_mask(T: int, W: int, device) -> torch.Tensor:
    """(T, T) bool: query t may see key s iff s <= t and t - s < W (itself and the W-1 previous positions)."""
    i = torch.arange(T, device=device)
    return (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < W)


def blocked_sliding_attention(q, k, v, window: int, dropout_p: float, scale: float | None = None):
    """Causal attention in which query t sees keys t-W+1 .. t, for q (B, nh, T, hs), k, v (B, nkv, S=T, hs) at
    consecutive positions, in O(T * W) time and memory -> (B, nh, T, hs). scale: of q.k (None: 1/sqrt(hs))."""
    B, nh, T, hs = q.shape
    W = window
    if T <= W:  # the window cuts nothing: plain causal
        return sdpa(q, k, v, None, dropout_p, scale)
    if T <= 2 * W:  # two blocks at most: one call under the (T, T) band is cheaper than cutting them out
        return sdpa(q, k, v, band_mask(T, W, q.device), dropout_p, scale)
    n = -(-T // W)  # number of query blocks; the last one is zero-padded (padding keys lie in every real
    pad = n * W - T  # query's future, so the band hides them; padding queries are dropped at the end)
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))  # (B, h, nW, hs)
    nkv = k.size(1)
    # block 0 sees only itself (plain causal); blocks 1.. see [previous block, own block] under the band
    y0 = sdpa(q[:, :, :W], k[:, :, :W], v[:, :, :W], None, dropout_p, scale)  # (B, nh, W, hs)
    qb = q[:, :, W:].reshape(B, nh, n - 1, W, hs).transpose(1, 2)           # (B, n-1, nh, W, hs)
    kb = k.unfold(2, 2 * W, W).transpose(-1, -2).transpose(1, 2)  # (B, n-1, nkv, 2W, hs): windows of 2W, step W
    vb = v.unfold(2, 2 * W, W).transpose(-1, -2).transpose(1, 2)
    yb = sdpa(qb.reshape(B * (n - 1), nh, W, hs), kb.reshape(B * (n - 1), nkv, 2 * W, hs),
              vb.reshape(B * (n - 1), nkv, 2 * W, hs), _band(W, q.device), dropout_p, scale)  # (B(n-1), nh, W, hs)
    yb = yb.view(B, n - 1, nh, W, hs).transpose(1, 2).reshape(B, nh, (n - 1) * W, hs)
    return torch.cat((y0, yb), dim=2)[:, :, :T]


@register("attention", "sliding")
class SlidingWindowAttention(GroupedQueryAttention):
    Options = SlidingOptions

    @classmethod
    def window(cls, cfg):
        return cfg.attention.window

    @classmethod
    def applies_own_window(cls, cfg) -> bool:
        return True

    def __init__(self, cfg, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.window_size = cfg.attention.window

    def attend(self, q, k, v, mask, dropout_p):
        if mask is None:  # plain causal call: the window is ours to apply, blockwise
            return blocked_sliding_attention(q, k, v, self.window_size, dropout_p, self.scale)
        return sdpa(q, k, v, mask, dropout_p, self.scale)  # the GPT's banded mask (cache, padding, bias)
