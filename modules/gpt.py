"""A GPT (decoder-only transformer) whose position scheme, norm, MLP and attention are chosen by name.

Read top to bottom: Block (one transformer layer), then GPT (embeddings, blocks, head, masks, generation).
Shapes: B batch, T new tokens in this call, S keys visible (cached + new), C n_embd, nh heads, hs head size,
V vocabulary.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from modules.attention import build_attention
from modules.cache import KVCache
from modules.config import GPTConfig
from modules.mlps import build_mlp
from modules.norms import build_norm
from modules.parametrization import base_config, init_std, output_mult, param_roles
from modules.positions import build_position


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = build_norm(cfg, cfg.n_embd)
        self.attn = build_attention(cfg, layer_idx)
        self.ln_2 = build_norm(cfg, cfg.n_embd)
        self.mlp = build_mlp(cfg)
        self.post_norm = cfg.norm.placement == "post"

    def forward(self, x, mask, rot, cache=None):  # x: (B, T, C)
        if self.post_norm:  # original Transformer: normalise the sum, so the residual stream itself is normed
            x = self.ln_1(x + self.attn(x, mask, rot, cache))
            return self.ln_2(x + self.mlp(x))
        # pre-norm (GPT-2 onwards): a clean residual path from input to output, which keeps deep stacks stable
        x = x + self.attn(self.ln_1(x), mask, rot, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):  # one way in; GPTConfig.from_dict(d) reads a dict
            raise TypeError(f"GPT(config) takes a GPTConfig, got {type(config).__name__}: "
                            "use GPT(GPTConfig.from_dict(d)) for a dict or a DictConfig")
        self.config = cfg = config
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.position = build_position(cfg)  # holds the learned table (wpe) if any; shared by all layers
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layer)])
        # With post-norm every block already ends in a norm, so a final norm would normalise twice.
        self.ln_f = build_norm(cfg, cfg.n_embd) if cfg.norm.placement == "pre" else nn.Identity()
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight  # one V x C matrix reads tokens in and writes logits out
        # The Linears that write into the residual stream, as each attention/MLP variant declares them by name
        # (a missing name fails here, loudly, instead of silently changing the init).
        self._residual = {id(getattr(part, name)) for block in self.blocks for part in (block.attn, block.mlp)
                          for name in type(part).residual_projections}
        self.output_mult = output_mult(cfg)  # None under sp: the logits are the head's output, untouched
        self._init_mult = {id(r.param): r.init_mult for r in self.param_roles() if r.init_mult != 1.0}
        self.apply(self._init_weights)

    def _init_weights(self, module):
        # GPT-2 init: N(0, 0.02) everywhere; the projections that write into the residual stream are scaled by
        # 1/sqrt(2L) because 2L of them are summed (one attention and one MLP per layer), keeping its variance flat.
        # mup scales each hidden matrix's std by its role's init_mult (variance ~ 1/fan_in; 1 at the base width).
        if isinstance(module, nn.Linear):
            std = init_std(self.config)  # sp: 0.02; mup: mup.init_std, the base model's (tunable) std
            std = std / math.sqrt(2 * self.config.n_layer) if id(module) in self._residual else std
            std *= self._init_mult.get(id(module.weight), 1.0)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=init_std(self.config))

    def role_overrides(self) -> dict[str, str]:
        # the untied head is an nn.Linear, which structure alone would call a hidden matrix (tied: it is wte's table)
        return {} if self.config.tie_weights else {"lm_head.weight": "head"}

    def param_roles(self) -> list:
        """Every trainable parameter once with its role (hidden_matrix, embedding, head, vector), its fused blocks
        and its base model shapes (modules/parametrization.py): what the optimizers and mup's rules read."""
        base = None
        if self.config.parametrization != "sp":  # the base model's shapes, without allocating its weights
            with torch.device("meta"):
                base = GPT(base_config(self.config))
        return param_roles(self, base)

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())  # a tied lm_head is counted once
        if non_embedding:
            n -= self.wte.weight.numel() + self.position.embedding_params()
        return n

    def new_cache(self, batch_size: int, dtype: torch.dtype | None = None, window: int | None = None) -> KVCache:
        """window: keep (and attend to) only the last `window` positions; None: the attention's own window."""
        p = self.wte.weight
        return KVCache(self.config.n_layer, batch_size, dtype or p.dtype, p.device,
                       window=self.config.window if window is None else window, max_len=self.config.block_size)

    # ------------------------------------------------------------------------------------------------------
    def _attn_mask(self, pos, valid, cache, padded: bool, window: int | None = None, consecutive: bool = False,
                   from_zero: bool = False):
        """The mask every layer uses for this call, built once: bool (B, 1, T, S), or a float bias with -inf where
        masked (B, nh, T, S) when the position scheme adds one (alibi, t5bias), or None for plain causal attention;
        B is 1 where every row's positions are 0..T-1.
        window: the band width (None: the attention's own, config.window).
        consecutive: the positions are this call's column indices plus a constant (default position ids).
        from_zero: they are 0..T-1 in every row (no cache, no padding)."""
        cfg = self.config
        window = cfg.window if window is None else window
        past = 0 if cache is None else cache.seq_len
        # None: causal by index over this call's keys alone (no cached keys, no padding, no bias). A window is a
        # distance in positions, so it can ride along only when positions are consecutive and the attention
        # applies its own window (sliding: one (T, T) band per call up to T = 2W, O(T * W) blocks past it).
        own_window = window is None or (consecutive and window == cfg.window
                                        and cfg.variant("attention").applies_own_window(cfg))
        if past == 0 and not padded and own_window and not self.position.adds_attn_bias:
            return None  # SDPA's is_causal fast path, or the attention's own band
        if from_zero:
            # positions 0..T-1 in every row (training's calls): one row's mask, broadcast by SDPA over the batch,
            # where B identical (B, nh, T, S) biases cost B times the building and every layer's reading
            pos, valid = pos[:1], valid[:1]
        B, T = pos.shape
        key_pos = pos if cache is None else torch.cat((cache.key_pos, pos), dim=1)          # (B, S)
        key_valid = valid if cache is None else torch.cat((cache.key_valid, valid), dim=1)  # (B, S)
        # causal by index: all cached keys precede the new queries; new query t sees new keys <= t
        causal = torch.ones(T, past + T, dtype=torch.bool, device=pos.device).tril(diagonal=past)  # (T, S)
        allowed = causal[None] & key_valid[:, None, :]  # (B, T, S): padding keys are never visible
        if window is not None:  # the band: distance in positions (not columns, which include padding) < W
            allowed = allowed & (pos[:, :, None] - key_pos[:, None, :] < window)
        # A real query always sees itself; a padding query may see nothing, and softmax over an empty row is 0/0.
        # Let those rows see every key instead: their outputs are never read (padding is masked out as a key).
        allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
        allowed = allowed[:, None]  # (B, 1, T, S)
        bias = self.position.attn_bias(pos, key_pos)  # (B, nh, T, S) float32 or None
        if bias is None:
            return allowed
        return bias.masked_fill(~allowed, float("-inf"))

    def forward(self, idx, attention_mask=None, position_ids=None, cache=None, window=None):
        """idx (B, T) int64 -> logits (B, T, V).

        attention_mask (B, T): 1 for real tokens, 0 for (left) padding, covering the tokens of this call only.
        position_ids (B, T): default cumsum(mask) - 1, continued from the cache, so padding doesn't shift positions.
        cache: a `new_cache()` object; this call's keys are appended to it and it sees everything cached before.
        window: each query sees at most this many positions (itself included); None: the cache's window when a
        cache is given, else the attention's own (`config.window`). generate() uses it to decode past block_size.
        """
        B, T = idx.size()
        valid = (torch.ones_like(idx, dtype=torch.bool) if attention_mask is None
                 else attention_mask.to(device=idx.device).bool())
        consecutive = position_ids is None  # the default ids below are consecutive where there is no padding
        if position_ids is None:
            start = torch.zeros(B, dtype=torch.long, device=idx.device) if cache is None else cache.next_pos
            position_ids = start[:, None] + (valid.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, T)
        padded = attention_mask is not None and not bool(valid.all())
        if window is None:
            window = cache.window if cache is not None else self.config.window
        from_zero = consecutive and cache is None and not padded  # position_ids is 0..T-1 in every row
        mask = self._attn_mask(position_ids, valid, cache, padded, window, consecutive, from_zero)
        rot = self.position.rotary(position_ids, from_zero)  # (cos, sin) each (B or 1, 1, T, dim/2), or None

        x = self.wte(idx)  # (B, T, C)
        x = self.drop(self.position.add_to_embedding(x, position_ids))
        for block in self.blocks:
            x = block(x, mask, rot, cache)
        if cache is not None:
            cache.advance(position_ids, valid)
        x = self.ln_f(x)
        logits = self.lm_head(x)  # (B, T, V)
        return logits if self.output_mult is None else logits * self.output_mult

    # ------------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True,
                 attention_mask=None, eos_token_id=None, generator=None, max_context=None):
        """Continue idx (B, T) by max_new_tokens tokens -> (B, T + max_new_tokens) int64.

        temperature=0 is greedy. Prompts of different lengths are left-padded, with attention_mask marking real
        tokens (1) and padding (0). With use_cache, the prompt is prefilled once and each new token is decoded
        against the KV cache; use_cache=False re-runs the whole context every step (the reference path).
        After eos_token_id a row keeps emitting eos; generation stops early once every row has.

        Past block_size (max_context=None means block_size):
        - schemes with a position table (learned: `max_positions` is block_size) crop the context to its last
          max_context tokens, positions restarting at 0 as in training; the cached path re-prefills the cropped
          context at those steps.
        - every other scheme keeps decoding against the cache with positions that continue; each token attends to
          the last max_context positions (with a sliding-window attention: the last min(W, max_context), W when
          max_context is None). The cache is a rolling window of that many positions, so memory stays flat. The
          uncached path computes the same thing: one forward over the whole sequence with that band mask.
        """
        was_training = self.training
        self.eval()  # dropout would make every path (and every call) disagree
        cfg, B, start_len = self.config, idx.size(0), idx.size(1)
        crop, window = self._context_limits(max_context)
        mask = torch.ones_like(idx) if attention_mask is None else attention_mask.to(idx.device).long()
        finished = torch.zeros(B, dtype=torch.bool, device=idx.device)
        cache = None
        for _ in range(max_new_tokens):
            if crop is not None:  # a position table: never more than `crop` tokens, positions from 0
                if not use_cache:
                    logits = self(idx[:, -crop:], attention_mask=mask[:, -crop:])
                elif cache is None or idx.size(1) > crop:  # prefill, or re-prefill the cropped context
                    cache = self.new_cache(B)
                    logits = self(idx[:, -crop:], attention_mask=mask[:, -crop:], cache=cache)
                else:
                    logits = self(idx[:, -1:], attention_mask=mask[:, -1:], cache=cache)
            elif not use_cache:  # the band forward over everything (the plain causal mask while it is no wider)
                band = window if cfg.window is not None or idx.size(1) > window else None
                logits = self(idx, attention_mask=mask, window=band)
            elif cache is None:  # prefill the whole prompt into a rolling cache of `window` positions
                cache = self.new_cache(B, window=window)
                logits = self(idx, attention_mask=mask, cache=cache)
            else:  # decode one token against the cache, its position continuing
                logits = self(idx[:, -1:], attention_mask=mask[:, -1:], cache=cache)
            logits = logits[:, -1, :].float()  # (B, V)
            next_id = self._sample(logits, temperature, top_k, top_p, generator)  # (B, 1)
            if eos_token_id is not None:
                next_id = next_id.masked_fill(finished[:, None], eos_token_id)
                finished |= next_id[:, 0] == eos_token_id
            idx = torch.cat((idx, next_id), dim=1)
            mask = torch.cat((mask, torch.ones_like(next_id)), dim=1)
            if eos_token_id is not None and bool(finished.all()):
                break
        remaining = start_len + max_new_tokens - idx.size(1)
        if remaining > 0:  # stopped early on eos: keep the promised shape
            idx = torch.cat((idx, idx.new_full((B, remaining), eos_token_id)), dim=1)
        self.train(was_training)
        return idx

    def _context_limits(self, max_context):
        """-> (crop, window) for generate: exactly one is an int (crop for position tables, a band otherwise)."""
        cfg = self.config
        if max_context is not None and (isinstance(max_context, bool) or not isinstance(max_context, int)
                                        or max_context < 1):
            raise ValueError(f"invalid max_context={max_context!r}: expected an integer >= 1 or None (block_size)")
        cap = cfg.block_size if max_context is None else max_context
        table = type(self.position).max_positions(cfg)
        if table is not None:
            if cap > table:
                raise ValueError(f"invalid max_context={cap}: position={cfg.position.name} has {table} positions; "
                                 f"use max_context <= {table}")
            return cap, None
        if cfg.window is not None:  # a sliding window is already the band; a cap can only narrow it
            return None, cfg.window if max_context is None else min(cfg.window, cap)
        return None, cap

    @staticmethod
    def _sample(logits, temperature, top_k, top_p, generator):
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        logits = logits / temperature
        if top_k is not None:
            kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p is not None and top_p < 1.0:
            # nucleus: keep the smallest set of most likely tokens whose probability reaches top_p
            sorted_logits, order = torch.sort(logits, descending=True)
            probs = F.softmax(sorted_logits, dim=-1)
            drop = probs.cumsum(dim=-1) - probs >= top_p  # mass strictly before this token already reaches top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
        probs = F.softmax(logits, dim=-1)
        return torch.multinomial(probs, num_samples=1, generator=generator)
