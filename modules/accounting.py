"""Sizes as pure functions of the config: parameters, training FLOPs per token, KV-cache bytes.

No weights are built, and no variant name is compared: each figure is summed from the facts the chosen variants
declare (Attention.linears / score_dims / kv_numbers_per_token, MLP.linears, Norm.num_params, Position.num_params),
and tests check each figure against a real model. `cfg` may be a GPTConfig, a GPT (its .config), or the dict /
DictConfig you would pass to GPT.
"""
import torch

from modules.config import GPTConfig


def _cfg(cfg) -> GPTConfig:
    if hasattr(cfg, "config") and isinstance(cfg.config, GPTConfig):
        return cfg.config
    return GPTConfig.from_dict(cfg)


def _layer_linears(c: GPTConfig) -> list[tuple[int, int]]:
    """(in, out) of every Linear of one transformer block: attention, then MLP."""
    return c.variant("attention").linears(c) + c.variant("mlp").linears(c)


def _layer_params(c: GPTConfig) -> int:
    attn, norm = c.variant("attention"), c.variant("norm")
    linears = sum(i * o + (o if c.bias else 0) for i, o in _layer_linears(c))
    norms = 2 * norm.num_params(c, c.n_embd) + sum(norm.num_params(c, d) for d in attn.qk_norm_dims(c))  # ln_1, ln_2
    return linears + norms + attn.extra_params(c)


def param_counts(cfg) -> dict:
    """{"params": total, "params_non_embedding": total minus the token embedding and any position table}. A tied
    lm_head shares the token embedding and is counted once; an untied one is non-embedding."""
    c = _cfg(cfg)
    position = c.variant("position")
    tok = c.vocab_size * c.n_embd
    final_norm = c.variant("norm").num_params(c, c.n_embd) if c.norm.placement == "pre" else 0  # post: blocks end normed
    head = 0 if c.tie_weights else c.vocab_size * c.n_embd
    total = tok + position.num_params(c) + c.n_layer * _layer_params(c) + final_norm + head
    return {"params": total, "params_non_embedding": total - tok - position.embedding_params(c)}


def attention_span(cfg, seq_len: int | None = None) -> int:
    """Keys each query is charged for: the context length, capped at the window for sliding attention."""
    c = _cfg(cfg)
    t = c.block_size if seq_len is None else seq_len
    return min(t, c.window) if c.window is not None else t


def flops_per_token(cfg, seq_len: int | None = None) -> int:
    """Training FLOPs per token (forward + backward), the PaLM-appendix estimate:

        6 * N_matmul + 6 * n_layer * n_head * (d_qk + d_v) * T_att

    N_matmul counts the weights of every matrix multiply a token goes through (all Linear layers including the
    lm_head, which is a matmul even when tied; not the embedding lookups, norms or biases); 2 FLOPs per weight
    forward, 4 backward. The second term is the score (q.k, width d_qk) and value (width d_v) products against
    T_att keys, again x2 forward and x3 for training; (d_qk, d_v) is the attention's `score_dims` (head_size each,
    MLA: head_size + rope_dim for the scores). T_att = seq_len (default block_size), capped at the attention's
    window. Like PaLM we don't halve for causality, so for MHA the term is the familiar 12 * n_layer * n_embd * T.
    """
    c = _cfg(cfg)
    n_matmul = c.n_layer * sum(i * o for i, o in _layer_linears(c)) + c.vocab_size * c.n_embd
    d_qk, d_v = c.variant("attention").score_dims(c)
    attn = 6 * c.n_layer * c.n_head * (d_qk + d_v) * attention_span(c, seq_len)
    return 6 * n_matmul + attn


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def kv_cache_bytes_per_token(cfg, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes the KV cache holds per token of one sequence: n_layer times the attention's kv_numbers_per_token
    (2 * n_kv_head * head_size for MHA/GQA/MQA/sliding, kv_latent_dim + rope_dim for MLA)."""
    c = _cfg(cfg)
    return c.n_layer * c.variant("attention").kv_numbers_per_token(c) * _itemsize(dtype)


def kv_cache_bytes(cfg, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes a cache holds after prefilling/decoding seq_len positions (left padding included) for batch_size
    sequences; sliding windows keep at most `window` positions. Equals `model.new_cache(...).nbytes` then."""
    c = _cfg(cfg)
    held = min(seq_len, c.window) if c.window is not None else seq_len
    return batch_size * held * kv_cache_bytes_per_token(c, dtype)
