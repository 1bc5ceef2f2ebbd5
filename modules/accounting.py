"""Sizes as pure functions of the config: parameters, training FLOPs per token, KV-cache bytes.

Parameters and matmul weights are counted from the model itself, built on the meta device (shapes only, no
memory, no random numbers drawn; one build per config, cached): every parameter once (a tied lm_head is the
token embedding), and the (in, out) of every nn.Linear. What a module cannot show is declared by the chosen
attention variant, never found by comparing names: `score_dims` (the widths of the attention products),
`kv_numbers_per_token` (what the cache holds) and `window`. Tests check each figure against a real model and
against torch's FlopCounterMode. `cfg` may be a GPTConfig, a GPT (its .config), or the dict / DictConfig you would
pass to GPT.
"""
from dataclasses import dataclass

import torch
from torch import nn

from modules.config import GPTConfig
from modules.gpt import GPT


def _cfg(cfg) -> GPTConfig:
    if hasattr(cfg, "config") and isinstance(cfg.config, GPTConfig):
        return cfg.config
    return GPTConfig.from_dict(cfg)


@dataclass(frozen=True)
class _Counts:
    params: int
    params_non_embedding: int
    matmul_weights: int  # in * out summed over every nn.Linear, the lm_head included even when tied


_COUNTS: dict[str, _Counts] = {}  # by repr(config): a config may hold a dict (rope scaling), so it can't be a key


def _counts(c: GPTConfig) -> _Counts:
    key = repr(c)
    if key not in _COUNTS:
        with torch.device("meta"):
            model = GPT(c)
        linear = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))
        if len(_COUNTS) >= 1024:  # a sweep planner may ask about many configs; the figures are cheap to redo
            _COUNTS.clear()
        _COUNTS[key] = _Counts(model.num_params(), model.num_params(non_embedding=True), linear)
    return _COUNTS[key]


def param_counts(cfg) -> dict:
    """{"params": total, "params_non_embedding": total minus the token embedding and any position table}. A tied
    lm_head shares the token embedding and is counted once; an untied one is non-embedding."""
    n = _counts(_cfg(cfg))
    return {"params": n.params, "params_non_embedding": n.params_non_embedding}


def attention_span(cfg, seq_len: int | None = None) -> int:
    """Keys each query is charged for: the context length, capped at the window for sliding attention."""
    c = _cfg(cfg)
    t = c.block_size if seq_len is None else seq_len
    return min(t, c.window) if c.window is not None else t


def flops_per_token(cfg, seq_len: int | None = None) -> int:
    """Training FLOPs per token (forward + backward), the PaLM-appendix estimate:

        6 * N_matmul + 6 * n_layer * n_head * (d_qk + d_v) * T_att

    N_matmul counts the weights of every matrix multiply a token goes through: in * out of every nn.Linear of the
    model, each applied once per token (the lm_head is one even when tied; embedding lookups, norms and biases are
    not matmuls); 2 FLOPs per weight forward, 4 backward. The second term is the score (q.k, width d_qk) and value
    (width d_v) products against T_att keys, again x2 forward and x3 for training; (d_qk, d_v) is the attention's
    `score_dims` (head_size each, MLA: head_size + rope_dim for the scores). T_att = seq_len (default
    block_size), capped at the attention's window. Like PaLM we don't halve for causality, so for MHA the term is
    the familiar 12 * n_layer * n_embd * T.
    """
    c = _cfg(cfg)
    d_qk, d_v = c.variant("attention").score_dims(c)
    attn = 6 * c.n_layer * c.n_head * (d_qk + d_v) * attention_span(c, seq_len)
    return 6 * _counts(c).matmul_weights + attn


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
