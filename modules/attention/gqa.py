"""Grouped-query attention (Ainslie et al. 2023): n_head query heads share n_kv_head key/value heads.

MHA (n_kv_head = n_head) and MQA (n_kv_head = 1) are its two ends; sliding-window attention is it with a
banded mask. The KV cache holds only the n_kv_head heads, which is the whole point of GQA/MQA.
"""
import torch
import torch.nn.functional as F
from torch import nn

from modules.norms import build_norm
from modules.positions import apply_rotary


def sdpa(q, k, v, mask, dropout_p: float):
    """F.scaled_dot_product_attention with our mask convention: None means plain causal (no cache, no padding,
    no window, no bias), otherwise a bool mask (True = may attend) or a float bias with -inf where masked.
    Every query row has at least one visible key (the GPT guarantees it), so the softmax never sees 0/0."""
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        # PyTorch's CPU flash-attention kernel runs many small per-block GEMMs; in bf16 each goes through oneDNN
        # with a high per-call cost, so it is 2-3x slower than in fp32: training fwd+bwd at short contexts and
        # small heads (small-cpu: 62 of 160 ms per bf16 step) and decoding alike (gpt2-124m, 1000 cached tokens:
        # 17 ms per token in bf16, 5 ms after casting the cache to fp32). Attention is a small share of the
        # FLOPs, so compute it in fp32 (more accurate too) and cast the output back.
        with torch.autocast("cpu", enabled=False):
            return sdpa(q.float(), k.float(), v.float(), mask, dropout_p).to(q.dtype)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    if mask.is_floating_point():
        mask = mask.to(q.dtype)  # SDPA wants a float mask in the query dtype (bf16 under autocast)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


class GroupedQueryAttention(nn.Module):
    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head, self.head_size = cfg.n_head, cfg.n_kv_head, cfg.head_size
        # q, k, v projections fused into one matmul: (nh + 2 * nkv) * hs outputs (= 3C for MHA, as in GPT-2)
        self.c_attn = nn.Linear(cfg.n_embd, (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_size, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.residual = True  # scaled init: the residual stream sums 2L such outputs
        self.qk_norm = cfg.norm.qk_norm
        if self.qk_norm:
            self.q_norm = build_norm(cfg, cfg.head_size)
            self.k_norm = build_norm(cfg, cfg.head_size)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

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
        if nkv != nh:  # each group of nh/nkv query heads reads the same kv head
            k = k.repeat_interleave(nh // nkv, dim=1)  # (B, nh, S, hs)
            v = v.repeat_interleave(nh // nkv, dim=1)
        y = sdpa(q, k, v, mask, self.dropout if self.training else 0.0)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        return self.resid_dropout(self.c_proj(y))
