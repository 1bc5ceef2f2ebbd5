"""What every attention variant shares: SDPA with the GPT's mask convention, and the facts the rest of the library
asks of a variant instead of comparing names (config validation, the cache, the mask, rope's width, and the
attention products accounting cannot read from the Linears; parameters and Linears are counted from the module
itself, modules/accounting.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from modules.options import VariantOptions


@dataclass(frozen=True)
class AttentionOptions(VariantOptions):
    family = "attention"


class Attention(nn.Module):
    Options = AttentionOptions
    # Linears whose output is added to the residual stream: GPT-2's init scales them by 1/sqrt(2 n_layer).
    # The GPT looks each one up by name when it initialises, so a variant that names them differently must say so.
    residual_projections = ("c_proj",)

    # ---- facts (cfg is a GPTConfig) ----
    @classmethod
    def validate(cls, cfg) -> None:
        """Checks that involve the rest of the model (e.g. n_kv_head must divide n_head)."""

    @classmethod
    def n_kv_head(cls, cfg) -> int:
        return cfg.n_head

    @classmethod
    def window(cls, cfg) -> int | None:
        """Each query sees at most this many keys (itself included); None: the whole causal past."""
        return None

    @classmethod
    def applies_own_window(cls, cfg) -> bool:
        """True if, given mask=None (plain causal, consecutive positions from 0, no padding, no cached keys), the
        variant applies its window itself in O(T * W), so the GPT need not build a (T, T) banded mask."""
        return False

    @classmethod
    def rotary_dim(cls, cfg) -> int:
        """The width of q and k that rope rotates (per head)."""
        return cfg.head_size

    @classmethod
    def rotary_dim_source(cls, cfg) -> tuple[str, object]:
        """The config key (and its value) that sets rotary_dim, for error messages."""
        return "n_embd", cfg.n_embd

    @classmethod
    def rotated_numbers(cls, cfg) -> tuple[int, int]:
        """(q, k) numbers per token that rope rotates: every query head and every kv head at rotary_dim."""
        return cfg.n_head * cls.rotary_dim(cfg), cls.n_kv_head(cfg) * cls.rotary_dim(cfg)

    @classmethod
    def qk_norm_rows(cls, cfg) -> tuple[tuple[int, int], ...]:
        """((rows per token, width), ...) that QK-norm normalises: each query head and each kv head."""
        return (cfg.n_head, cfg.head_size), (cls.n_kv_head(cfg), cfg.head_size)

    @classmethod
    def score_dims(cls, cfg) -> tuple[int, int]:
        """(d_qk, d_v): widths of the per-head score (q.k) and value products, for the attention FLOPs."""
        return cfg.head_size, cfg.head_size

    @classmethod
    def kv_numbers_per_token(cls, cfg) -> int:
        """Numbers one layer's KV cache holds per token."""
        raise NotImplementedError

    def fused_blocks(self) -> dict[str, tuple[int, ...]]:
        """{Linear name: output rows of each block} for a Linear that fuses several maps (q, k, v) into one
        matmul: Muon orthogonalises each block on its own (modules/parametrization.py)."""
        return {}


def sdpa(q, k, v, mask, dropout_p: float, scale: float | None = None):
    """F.scaled_dot_product_attention with our mask convention, for q (B, nh, T, d) and k, v (B, nkv, S, d) where
    nkv divides nh (GQA/MQA: each group of nh/nkv query heads reads one kv head, and K/V are never copied).

    mask None means plain causal attention over this call's keys only (no cached keys, no padding, no bias; a
    windowed variant applies its window itself, see `Attention.applies_own_window`); otherwise a bool mask
    (B, 1, T, S) (True = may attend) or a float bias (B, nh, T, S) with -inf where masked.
    Every query row has at least one visible key (the GPT guarantees it), so the softmax never sees 0/0."""
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        # PyTorch's CPU flash-attention kernel runs many small per-block GEMMs; in bf16 each goes through oneDNN
        # with a high per-call cost, so bf16 attention is slower than fp32 in training and decoding alike (figures:
        # `python -m ablations.bench --inference-dtype bf16`, docs/bench.md). Attention is a small share of the
        # FLOPs, so compute it in fp32 (more accurate too) and cast the output back.
        with torch.autocast("cpu", enabled=False):
            return sdpa(q.float(), k.float(), v.float(), mask, dropout_p, scale).to(q.dtype)
    B, nh, T, _ = q.shape
    nkv = k.size(1)
    if q.device.type == "cpu" and q.size(-1) != v.size(-1) and nkv == nh:
        return math_attention(q, k, v, mask, dropout_p, scale)  # e.g. MLA: no CPU flash kernel for these widths
    if mask is not None and mask.is_floating_point():
        mask = mask.to(q.dtype)  # SDPA wants a float mask in the query dtype (bf16 under autocast)
    if nkv != nh and T == 1:
        # One query per head (decoding): the g = nh/nkv query heads of a group become g query rows against their
        # one kv head, a plain attention with nkv heads. (SDPA's enable_gqa on CPU costs as much as full MHA.)
        # mask None with T = 1 means one key (no cache), so the rows need no mask at all.
        g = nh // nkv
        if mask is not None and mask.dim() == 4 and mask.size(1) != 1:
            # a per-head bias: (B, nh, 1, S) -> (B, nkv, g, S), B = 1 where every row's positions are the same
            mask = mask.reshape(mask.size(0), nkv, g, mask.size(-1))
        y = F.scaled_dot_product_attention(q.reshape(B, nkv, g, q.size(-1)), k, v, attn_mask=mask,
                                           dropout_p=dropout_p, scale=scale)  # (B, nkv, g, dv)
        return y.reshape(B, nh, 1, v.size(-1))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, dropout_p=dropout_p,
                                          scale=scale, enable_gqa=nkv != nh)


def math_attention(q, k, v, mask, dropout_p: float, scale: float | None = None):
    """softmax(q k^T * scale + mask) v written out, with `sdpa`'s mask convention, for q, k (B, nh, T|S, d) and
    v (B, nh, S, dv) -> (B, nh, T, dv). For the CPU where q and k differ in width from v (MLA's are wider): PyTorch's
    CPU flash kernel needs one width, and SDPA's own math path masks the causal scores with a boolean tril, which
    inductor fuses into a softmax 2-3x slower than this additive bias (docs/bench.md, "MLA's attention on the CPU").
    The scale goes on q (B nh T d numbers, not B nh T S)."""
    T, d = q.shape[-2:]
    S = k.size(2)
    scores = (q * (d ** -0.5 if scale is None else scale)) @ k.transpose(-1, -2)  # (B, nh, T, S)
    if mask is None:  # plain causal over this call's keys (S == T)
        scores = scores + torch.full((T, S), float("-inf"), dtype=scores.dtype, device=scores.device).triu(1)
    elif mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    else:
        scores = scores + mask.to(scores.dtype)
    p = torch.softmax(scores, dim=-1)
    if dropout_p > 0:
        p = F.dropout(p, dropout_p)
    return p @ v  # (B, nh, T, dv)
