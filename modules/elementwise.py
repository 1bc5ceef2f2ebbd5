"""Bytes a variant's element-wise (non-matmul) work must move per training step, in its fused form: the memory
roofline of what the variant costs beside the matmuls, which it shares (nearly) with the baseline.

Fused form: each of the variant's element-wise passes is one kernel forward and one backward, reading each input
once from memory and writing each output once (nothing kept in cache between kernels, nothing fused into a
neighbouring matmul). Work every variant of a family shares (residual adds, softmax inside attention, the loss) is
not counted: only differences between variants are meant to be read. Per step, N = batch x context tokens:

    position   learned     forward x + wpe: read x, write x (4 bytes each, the fp32 embedding); backward: the
                           table's gradient reads dx (dx itself passes through): 3 N C 4 + table read and written
               sinusoidal  forward as learned, no backward pass (a constant table): 2 N C 4 + table read
               rope        every layer, q and k rotated in place forward (read, write) and backward (the inverse
                           rotation of dq, dk: read, write): 4 L N (q + k rotated numbers) e
               nope, alibi, t5bias   0 (alibi's and t5's biases are computed inside a fused attention kernel)
    norm       2L + 1 norms (pre-norm; post-norm 2L) of (N, C) rows in fp32 (the residual stream), plus QK-norm:
               forward read x, write y (+ per-row statistics), backward read dy and x (+ statistics), write dx:
               5 R d s + R x (stats written + read); layernorm 2 stats (mean, rstd), rmsnorm and scalenorm 1, dyt 0
    mlp        per layer, R = N rows of the hidden width H: gelu, relu2: forward read h, write a; backward read
               da and h, write dh: 5 N H e. swiglu, geglu: forward read g and u, write a; backward read da, g
               and u, write dg and du: 8 N H e (H is 2/3 of GELU's 4C at equal parameters)
    attention  0 of their own (their differences are in the matmuls and the attention kernel); MLA's latent norm,
               where on, is a norm of (N, d_c)

e is the element size of activations leaving a matmul (4 in 32-true, 2 in bf16-mixed); the residual stream and
the norms on it are fp32 (4 bytes) in both. Dropout is not counted (p = 0 in every comparison here).
"""
from __future__ import annotations

from modules.config import GPTConfig

FP32 = 4
# per-row statistics a norm writes forward and reads backward
NORM_STATS = {"layernorm": 2, "rmsnorm": 1, "scalenorm": 1, "dyt": 0}


def norm_bytes(name: str, rows: int, width: int, size: int) -> int:
    """One norm's forward and backward over (rows, width) elements of `size` bytes (its per-row statistics fp32)."""
    return 5 * rows * width * size + 2 * rows * NORM_STATS[name] * FP32


def _position(cfg: GPTConfig, n: int, e: int) -> int:
    name, C, T = cfg.position.name, cfg.n_embd, cfg.block_size
    if name == "learned":
        return 3 * n * C * FP32 + 2 * T * C * FP32
    if name == "sinusoidal":
        return 2 * n * C * FP32 + T * C * FP32
    if name == "rope":
        q, k = cfg.variant("attention").rotated_numbers(cfg)
        return 4 * cfg.n_layer * n * (q + k) * e
    return 0  # nope, alibi, t5bias


def _norm(cfg: GPTConfig, n: int, e: int) -> int:
    name, L = cfg.norm.name, cfg.n_layer
    count = 2 * L + (1 if cfg.norm.placement == "pre" else 0)  # every block's two, and the final one (pre-norm)
    out = count * norm_bytes(name, n, cfg.n_embd, FP32)
    if cfg.norm.qk_norm:
        out += L * sum(norm_bytes(name, n * heads, width, e)
                       for heads, width in cfg.variant("attention").qk_norm_rows(cfg))
    return out


def _mlp(cfg: GPTConfig, n: int, e: int) -> int:
    passes = 8 if cfg.mlp.name in ("swiglu", "geglu") else 5  # a gate and an up half: three reads, two writes more
    return cfg.n_layer * passes * n * cfg.mlp_hidden * e


def _attention(cfg: GPTConfig, n: int, e: int) -> int:
    if getattr(cfg.attention, "latent_norm", False):  # MLA's RMSNorm of the latent (rmsnorm: one statistic)
        return cfg.n_layer * norm_bytes("rmsnorm", n, cfg.variant("attention").latent_dim(cfg), e)
    return 0


FAMILY_BYTES = {"position": _position, "norm": _norm, "mlp": _mlp, "attention": _attention}
# every registered variant the formulas above know; a new variant must be added (tests/test_roofline.py checks)
KNOWN = {"position": ("alibi", "learned", "nope", "rope", "sinusoidal", "t5bias"),
         "norm": tuple(NORM_STATS), "mlp": ("geglu", "gelu", "relu2", "swiglu"),
         "attention": ("gqa", "mha", "mla", "mqa", "sliding")}


def bytes_per_step(cfg: GPTConfig, tokens: int, act_size: int) -> dict[str, int]:
    """{family: bytes} the model's element-wise work moves in one training step of `tokens` tokens (fused form),
    activations leaving matmuls `act_size` bytes each (4: 32-true, 2: bf16-mixed)."""
    for family, names in KNOWN.items():
        name = getattr(cfg, family).name
        if name not in names:
            raise KeyError(f"modules.elementwise has no byte count for {family}={name}; add it to KNOWN and "
                           f"_{family}")
    return {family: fn(cfg, tokens, act_size) for family, fn in FAMILY_BYTES.items()}


def extra_bytes(cfg: GPTConfig, base: GPTConfig, tokens: int, act_size: int) -> int:
    """Bytes per step `cfg`'s element-wise work moves beyond `base`'s (negative: fewer)."""
    return sum(bytes_per_step(cfg, tokens, act_size).values()) - sum(bytes_per_step(base, tokens, act_size).values())
