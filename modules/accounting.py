"""Sizes as pure functions of the config: parameters, training FLOPs per token, KV-cache bytes.

No weights are built; everything is counted from the same derived sizes (GPTConfig.head_size, n_kv_head,
mlp_hidden, kv_latent_dim, rope_dim) the modules are built from, and tests check each figure against a real model.
`cfg` may be a GPTConfig, a GPT (its .config), or the dict / DictConfig you would pass to GPT.
"""
import torch

from modules.config import GPTConfig


def _cfg(cfg) -> GPTConfig:
    if hasattr(cfg, "config") and isinstance(cfg.config, GPTConfig):
        return cfg.config
    return GPTConfig.from_dict(cfg)


def _norm(c: GPTConfig, dim: int) -> int:
    return dim * (2 if c.norm.name == "layernorm" and c.bias else 1)


def _linear(c: GPTConfig, n_in: int, n_out: int) -> tuple[int, int]:
    """(weights, biases) of one nn.Linear."""
    return n_in * n_out, (n_out if c.bias else 0)


def _layer_linears(c: GPTConfig) -> list[tuple[int, int]]:
    """Every Linear of one transformer block, as (weights, biases)."""
    d, nh, hs = c.n_embd, c.n_head, c.head_size
    if c.attention.name == "mla":
        dc, dr = c.kv_latent_dim, c.rope_dim
        attn = [_linear(c, d, nh * (hs + dr)),  # c_q: content + rotary query parts
                _linear(c, d, dc + dr),         # c_kv_down: latent + shared rotary key
                _linear(c, dc, 2 * nh * hs),    # c_kv_up: per-head keys and values
                _linear(c, d, d)]               # c_proj
    else:
        attn = [_linear(c, d, (nh + 2 * c.n_kv_head) * hs), _linear(c, d, d)]  # c_attn (q,k,v fused), c_proj
    h = c.mlp_hidden
    gated = c.mlp.name in ("swiglu", "geglu")
    mlp = [_linear(c, d, 2 * h if gated else h), _linear(c, h, d)]  # c_fc (gate+up fused if gated), c_proj
    return attn + mlp


def _layer_norm_params(c: GPTConfig) -> int:
    n = 2 * _norm(c, c.n_embd)  # ln_1, ln_2
    if c.norm.qk_norm:
        n += 2 * _norm(c, c.head_size)
        if c.attention.name == "mla" and c.rope_dim:
            n += 2 * _norm(c, c.rope_dim)
    return n


def param_counts(cfg) -> dict:
    """{"params": total, "params_non_embedding": total minus the token embedding and the learned position
    table}. A tied lm_head shares the token embedding and is counted once; an untied one is non-embedding."""
    c = _cfg(cfg)
    tok = c.vocab_size * c.n_embd
    pos = c.block_size * c.n_embd if c.position.name == "learned" else 0
    per_layer = sum(w + b for w, b in _layer_linears(c)) + _layer_norm_params(c)
    final_norm = _norm(c, c.n_embd) if c.norm.placement == "pre" else 0  # post-norm blocks end normalised
    head = 0 if c.tie_weights else c.vocab_size * c.n_embd
    total = tok + pos + c.n_layer * per_layer + final_norm + head
    return {"params": total, "params_non_embedding": total - tok - pos}


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
    T_att keys, again x2 forward and x3 for training. d_qk = d_v = head_size, except MLA where d_qk = head_size +
    rope_dim. T_att = seq_len (default block_size), or min(seq_len, window) for sliding attention. Like PaLM we
    don't halve for causality, so for MHA the term is the familiar 12 * n_layer * n_embd * seq_len.
    """
    c = _cfg(cfg)
    n_matmul = c.n_layer * sum(w for w, _ in _layer_linears(c)) + c.vocab_size * c.n_embd
    d_qk = c.head_size + c.rope_dim
    d_v = c.head_size
    attn = 6 * c.n_layer * c.n_head * (d_qk + d_v) * attention_span(c, seq_len)
    return 6 * n_matmul + attn


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def kv_cache_bytes_per_token(cfg, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes the KV cache holds per token of one sequence: n_layer * (2 * n_kv_head * head_size) numbers for
    MHA/GQA/MQA/sliding, n_layer * (kv_latent_dim + rope_dim) for MLA."""
    c = _cfg(cfg)
    per_layer = c.kv_latent_dim + c.rope_dim if c.attention.name == "mla" else 2 * c.n_kv_head * c.head_size
    return c.n_layer * per_layer * _itemsize(dtype)


def kv_cache_bytes(cfg, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes a cache holds after prefilling/decoding seq_len positions (left padding included) for batch_size
    sequences; sliding windows keep at most `window` positions. Equals `model.new_cache(...).nbytes` then."""
    c = _cfg(cfg)
    held = min(seq_len, c.window) if c.window is not None else seq_len
    return batch_size * held * kv_cache_bytes_per_token(c, dtype)
