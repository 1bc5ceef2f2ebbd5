"""Multi-head latent attention (DeepSeek-V2, simplified: queries are not compressed).

Keys and values of all heads are up-projected from one latent c_kv of width d_c, so the cache holds d_c
numbers per token instead of 2 * n_head * hs. Rotary angles can't pass through that up-projection (they would
have to be applied to the latent, which has no head structure), so position enters through a separate, decoupled
key part k_rope of width d_r, shared by all heads, cached next to the latent, and matched by a d_r-wide part of
each query. Each head then scores [q_nope, q_rope] . [k_nope, k_rope] / sqrt(hs + d_r).

With position=rope only the decoupled parts are rotated; with other position schemes they are ordinary extra
key/query dimensions and position comes from the embedding (learned, sinusoidal) or the bias (alibi).
latent_norm: true adds DeepSeek-V2/V3's RMSNorm on the latent before the up-projection (kv_a_layernorm there).

Decoding uses DeepSeek-V2's absorbed form (see `absorbs`): the key up-projection is folded into the query and the
value up-projection into the output, so a step reads the cached latents directly, like MQA with one (d_c + d_r)-wide
key head, instead of re-expanding every cached latent to per-head keys and values.
"""
from dataclasses import dataclass

import torch
from torch import nn

from modules.attention.base import Attention, AttentionOptions, sdpa
from modules.norms import build_norm
from modules.options import check_bool, check_int, fail
from modules.parametrization import attn_scale
from modules.positions import apply_rotary
from modules.registry import register


@dataclass(frozen=True)
class MLAOptions(AttentionOptions):
    kv_latent_dim: int | None = None  # width d_c of the cached latent (None: n_embd // 2)
    rope_dim: int | None = None       # width d_r of the decoupled key part shared by all heads (None: hs // 2)
    latent_norm: bool = False         # RMSNorm (eps 1e-6, as DeepSeek) on the latent before the up-projection

    def __post_init__(self):
        if self.kv_latent_dim is not None:
            check_int(self.key("kv_latent_dim"), self.kv_latent_dim)
        if self.rope_dim is not None:
            check_int(self.key("rope_dim"), self.rope_dim, lo=0)
        check_bool(self.key("latent_norm"), self.latent_norm)


class LatentRMSNorm(nn.Module):
    """RMSNorm with DeepSeek's eps, independent of the model's norm choice (it is part of MLA, not a layer norm)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


@register("attention", "mla")
class MultiHeadLatentAttention(Attention):
    Options = MLAOptions

    @classmethod
    def latent_dim(cls, cfg) -> int:
        d = cfg.attention.kv_latent_dim
        return cfg.n_embd // 2 if d is None else d

    @classmethod
    def rope_dim(cls, cfg) -> int:
        d = cfg.attention.rope_dim
        return cfg.head_size // 2 if d is None else d

    @classmethod
    def validate(cls, cfg):
        if cls.latent_dim(cfg) > cfg.n_embd:
            fail("attention.kv_latent_dim", cls.latent_dim(cfg),
                 f"expected an integer in [1, n_embd={cfg.n_embd}] (a latent wider than d compresses nothing)")

    @classmethod
    def rotary_dim(cls, cfg):
        return cls.rope_dim(cfg)

    @classmethod
    def rotary_dim_source(cls, cfg):
        return "attention.rope_dim", cls.rope_dim(cfg)

    @classmethod
    def rotated_numbers(cls, cfg):
        return cfg.n_head * cls.rope_dim(cfg), cls.rope_dim(cfg)  # the heads' rotary queries, one shared key

    @classmethod
    def qk_norm_rows(cls, cfg):
        hs, dr = cfg.head_size, cls.rope_dim(cfg)  # content and rotary parts normalised separately (forward)
        return ((cfg.n_head, hs), (cfg.n_head, hs)) + (((cfg.n_head, dr), (1, dr)) if dr else ())

    @classmethod
    def score_dims(cls, cfg):
        return cfg.head_size + cls.rope_dim(cfg), cfg.head_size

    @classmethod
    def kv_numbers_per_token(cls, cfg):
        return cls.latent_dim(cfg) + cls.rope_dim(cfg)  # the latent and the shared rotary key

    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.head_size = cfg.n_head, cfg.head_size
        self.d_c, self.d_r = self.latent_dim(cfg), self.rope_dim(cfg)
        nh, hs = cfg.n_head, cfg.head_size
        self.c_q = nn.Linear(cfg.n_embd, nh * (hs + self.d_r), bias=cfg.bias)       # queries: content + rotary part
        self.c_kv_down = nn.Linear(cfg.n_embd, self.d_c + self.d_r, bias=cfg.bias)  # latent + shared rotary key
        self.latent_norm = LatentRMSNorm(self.d_c) if cfg.attention.latent_norm else nn.Identity()
        self.c_kv_up = nn.Linear(self.d_c, 2 * nh * hs, bias=cfg.bias)             # latent -> per-head k, v
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.qk_norm = cfg.norm.qk_norm
        if self.qk_norm:  # content and rotary parts are normalised separately (the rotary key is cached)
            self.q_norm, self.k_norm = build_norm(cfg, hs), build_norm(cfg, hs)
            if self.d_r:
                self.q_rope_norm, self.k_rope_norm = build_norm(cfg, self.d_r), build_norm(cfg, self.d_r)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.scale = attn_scale(cfg)  # None: SDPA's 1/sqrt(hs + dr) (sp); mup: sqrt(d0)/(hs + dr)

    def fused_blocks(self):
        nh, hs = self.n_head, self.head_size
        # the latent and the shared rotary key; per-head keys and values. c_q stays whole: each head's content and
        # rotary query parts are one query. (A zero-width rotary block is dropped.)
        return {"c_kv_down": (self.d_c, self.d_r), "c_kv_up": (nh * hs, nh * hs)}

    def forward(self, x, mask, rot, cache=None):
        B, T, C = x.size()
        nh, hs, d_c, d_r = self.n_head, self.head_size, self.d_c, self.d_r
        q = self.c_q(x).view(B, T, nh, hs + d_r).transpose(1, 2)  # (B, nh, T, hs + dr)
        q_nope, q_rope = q.split([hs, d_r], dim=-1)               # (B, nh, T, hs), (B, nh, T, dr)
        latent, k_rope = self.c_kv_down(x).split([d_c, d_r], dim=-1)  # (B, T, dc), (B, T, dr)
        latent = self.latent_norm(latent)  # normalised once here, so the cache holds what c_kv_up reads
        k_rope = k_rope.unsqueeze(1)                              # (B, 1, T, dr): one rotary key for all heads
        if self.qk_norm:
            q_nope = self.q_norm(q_nope)
            if d_r:
                q_rope, k_rope = self.q_rope_norm(q_rope), self.k_rope_norm(k_rope)
        q_rope, k_rope = apply_rotary(q_rope, rot), apply_rotary(k_rope, rot)
        if cache is not None:  # cache only the latent and the rotated shared key: (dc + dr) numbers per token
            latent, k_rope = cache.update(self.layer_idx, latent=latent, k_rope=k_rope)
        if self.absorbs(T, cache):
            y = self._attend_latent(q_nope, q_rope, latent, k_rope, mask)  # (B, nh, T, hs)
            return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))
        S = latent.size(1)
        k_nope, v = self.c_kv_up(latent).split([nh * hs, nh * hs], dim=-1)  # 2 x (B, S, nh * hs)
        k_nope = k_nope.view(B, S, nh, hs).transpose(1, 2)  # (B, nh, S, hs)
        v = v.view(B, S, nh, hs).transpose(1, 2)            # (B, nh, S, hs)
        if self.qk_norm:
            k_nope = self.k_norm(k_nope)
        q = torch.cat((q_nope, q_rope), dim=-1)                             # (B, nh, T, hs + dr)
        k = torch.cat((k_nope, k_rope.expand(B, nh, S, d_r)), dim=-1)       # (B, nh, S, hs + dr)
        y = sdpa(q, k, v, mask, self.dropout if self.training else 0.0, self.scale)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def absorbs(self, T: int, cache) -> bool:
        """Decode against the latent directly (DeepSeek-V2's absorbed form): for one new token with a cache.
        Expanding all S cached latents to per-head keys and values costs S * d_c * 2 * nh * hs multiply-adds per
        step; absorbed, a step costs nh * S * (2 d_c + d_r). Not with qk_norm: a norm of the up-projected keys does
        not pass through the up-projection. Training and prefill (T > 1) keep the expanded form."""
        return cache is not None and T == 1 and not self.qk_norm and not (self.training and self.dropout > 0)

    def _attend_latent(self, q_nope, q_rope, latent, k_rope, mask):
        """Attention with the key up-projection folded into the query and the value up-projection into the output:
        q_nope . (W_k c + b_k) = (W_k^T q_nope) . c + q_nope . b_k, whose last term is the same for every key and
        cancels in the softmax; sum_s p_s (W_v c_s + b_v) = W_v (sum_s p_s c_s) + b_v since the p_s sum to 1.
        q_nope (B, nh, T, hs), q_rope (B, nh, T, dr), latent (B, S, dc), k_rope (B, 1, S, dr) -> (B, nh, T, hs)."""
        B, nh, T, hs = q_nope.shape
        d_c = self.d_c
        with torch.autocast(q_nope.device.type, enabled=False):  # scores in fp32, as sdpa does under bf16 on CPU
            ct = torch.promote_types(q_nope.dtype, torch.float32)
            w_k, w_v = self.c_kv_up.weight.to(ct).view(2, nh, hs, d_c)  # (nh, hs, dc) each
            # the expanded form's scale (1/sqrt(d_qk) under sp), applied to the small query
            scale = (hs + self.d_r) ** -0.5 if self.scale is None else self.scale
            q_lat = (q_nope.to(ct) * scale) @ w_k  # (B, nh, T, dc): the query read in latent coordinates
            lat = latent.to(ct)  # (B, S, dc): the one "kv head" all query heads read, never copied per head
            # all heads' queries as rows of one matrix, so each product is one (B,) batch of GEMMs over the cache
            scores = q_lat.reshape(B, nh * T, d_c) @ lat.transpose(1, 2)  # (B, nh*T, S)
            if self.d_r:
                q_r = (q_rope.to(ct) * scale).reshape(B, nh * T, self.d_r)
                scores = scores + q_r @ k_rope[:, 0].to(ct).transpose(1, 2)
            scores = scores.view(B, nh, T, -1)  # (B, nh, T, S)
            if mask is not None:
                scores = (scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool
                          else scores + mask.to(ct))
            p = torch.softmax(scores, dim=-1).view(B, nh * T, -1)
            o = (p @ lat).view(B, nh, T, d_c)  # attention-weighted latents
            y = o @ w_v.transpose(-1, -2)  # (B, nh, T, hs): the value up-projection, applied once per query
            if self.c_kv_up.bias is not None:
                y = y + self.c_kv_up.bias.to(ct).view(2, nh, 1, hs)[1]
        return y.to(q_nope.dtype)

