"""Grouped-query attention (Ainslie et al. 2023): n_head query heads share n_kv_head key/value heads.

MHA (n_kv_head = n_head) and MQA (n_kv_head = 1) are its two ends; sliding-window attention is it with a
window. The KV cache holds only the n_kv_head heads, which is the whole point of GQA/MQA, and attention reads them
in place (no per-step copy to n_head heads), so the smaller cache is also less memory to read per decoded token.
"""
from dataclasses import dataclass

from torch import nn

from modules.attention.base import Attention, AttentionOptions, sdpa
from modules.norms import build_norm
from modules.options import check_int, fail
from modules.parametrization import attn_scale
from modules.positions import apply_rotary
from modules.registry import register


@dataclass(frozen=True)
class GQAOptions(AttentionOptions):
    n_kv_head: int | None = 2  # key/value heads, a divisor of n_head (conf/attention/gqa.yaml states the same)

    def __post_init__(self):
        if self.n_kv_head is None:
            fail(self.key("n_kv_head"), None, "gqa needs an integer number of key/value heads")
        check_int(self.key("n_kv_head"), self.n_kv_head)


@register("attention", "gqa")
class GroupedQueryAttention(Attention):
    Options = GQAOptions

    @classmethod
    def n_kv_head(cls, cfg):
        n = getattr(cfg.attention, "n_kv_head", None)
        return cfg.n_head if n is None else n

    @classmethod
    def validate(cls, cfg):
        if cfg.n_head % cfg.n_kv_head:
            fail("attention.n_kv_head", cfg.n_kv_head, f"must divide n_head={cfg.n_head} (choose a divisor)")

    @classmethod
    def kv_numbers_per_token(cls, cfg):
        return 2 * cfg.n_kv_head * cfg.head_size  # k and v of every kv head

    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head, self.head_size = cfg.n_head, cfg.n_kv_head, cfg.head_size
        # q, k, v projections fused into one matmul: (nh + 2 * nkv) * hs outputs (= 3C for MHA, as in GPT-2)
        self.c_attn = nn.Linear(cfg.n_embd, (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_size, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.qk_norm = cfg.norm.qk_norm
        if self.qk_norm:
            self.q_norm = build_norm(cfg, cfg.head_size)
            self.k_norm = build_norm(cfg, cfg.head_size)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.scale = attn_scale(cfg)  # None: SDPA's 1/sqrt(hs) (sp); mup: sqrt(hs0)/hs

    def fused_blocks(self):
        nh, nkv, hs = self.n_head, self.n_kv_head, self.head_size
        return {"c_attn": (nh * hs, nkv * hs, nkv * hs)}  # q, k, v

    def forward(self, x, mask, rot, cache=None):
        B, T, C = x.size()
        nh, nkv, hs = self.n_head, self.n_kv_head, self.head_size
        q, k, v = self.c_attn(x).split([nh * hs, nkv * hs, nkv * hs], dim=2)
        q = q.view(B, T, nh, hs).transpose(1, 2)   # (B, nh, T, hs)
        k = k.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        if self.qk_norm:  # before the rotation, so the norm sees the content, not the angle
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, rot), apply_rotary(k, rot)
        if cache is not None:  # store the new (rotated) keys, get back past + new: (B, nkv, S, hs)
            k, v = cache.update(self.layer_idx, k=k, v=v)
        # each group of nh/nkv query heads reads the same kv head; sdpa does that without copying K and V
        y = self.attend(q, k, v, mask, self.dropout if self.training else 0.0)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        return self.resid_dropout(self.c_proj(y))

    def attend(self, q, k, v, mask, dropout_p):
        """q (B, nh, T, hs), k and v (B, nkv, S, hs) -> (B, nh, T, hs); a windowed variant overrides it."""
        return sdpa(q, k, v, mask, dropout_p, self.scale)
