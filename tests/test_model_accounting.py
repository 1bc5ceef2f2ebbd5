"""Analytic sizes: the GPT-2 small parameter count, FLOPs per token, KV-cache bytes per token."""
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from modules import accounting
from modules.config import GPTConfig, build_config
from modules.gpt import GPT

CONF = Path(__file__).resolve().parents[1] / "conf"


pytestmark = pytest.mark.usefixtures("one_thread")


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=list(overrides))


def test_gpt2_124m_has_exactly_gpt2_small_parameter_count():
    """GPT-2 small (HF `gpt2`) has 124,439,808 parameters. With V=50257, T=1024, d=768, 12 layers, biases,
    learned positions, LayerNorm, 4d GELU MLP, fused qkv and a tied lm_head:
      token embedding   50257 * 768                       = 38,597,376
      position table     1024 * 768                       =    786,432
      per layer: ln_1 + ln_2 (weight + bias)   2 * 2 * 768 =      3,072
                 attn c_attn 768 * 2304 + 2304             =  1,771,776
                 attn c_proj 768 * 768 + 768               =    590,592
                 mlp c_fc    768 * 3072 + 3072             =  2,362,368
                 mlp c_proj  3072 * 768 + 768              =  2,360,064
                 one layer                                 =  7,087,872;  x 12 = 85,054,464
      final LayerNorm    2 * 768                          =      1,536
      lm_head: tied to the token embedding                =          0
      total                                               = 124,439,808
    Counted both analytically and on a real model built on the meta device (shapes only, no memory)."""
    cfg = _compose("model=gpt2-124m", "tokenizer=gpt2")
    assert cfg.model.vocab_size == 50257
    counts = accounting.param_counts(cfg.model)
    assert counts["params"] == 124_439_808
    assert counts["params_non_embedding"] == 124_439_808 - 38_597_376 - 786_432
    with torch.device("meta"):
        model = GPT(GPTConfig.from_dict(cfg.model))
    assert sum(p.numel() for p in model.parameters()) == 124_439_808
    assert model.num_params(non_embedding=True) == counts["params_non_embedding"]


def test_gpt2_350m_has_exactly_gpt2_medium_parameter_count():
    """GPT-2 medium (HF `gpt2-medium`) has 354,823,168 parameters: d=1024, 24 layers, the rest as GPT-2 small above:
      token embedding 50257 * 1024 = 51,463,168; position table 1024 * 1024 = 1,048,576
      one layer: 12 d^2 + 13 d = 12,582,912 + 13,312 = 12,596,224;  x 24 = 302,309,376
      final LayerNorm 2 * 1024 = 2,048;  total 354,823,168"""
    cfg = _compose("model=gpt2-350m", "tokenizer=gpt2")
    assert accounting.param_counts(cfg.model)["params"] == 354_823_168
    with torch.device("meta"):
        model = GPT(GPTConfig.from_dict(cfg.model))
    assert sum(p.numel() for p in model.parameters()) == 354_823_168


def test_llama_1b_has_exactly_llama_3_2_1b_parameter_count():
    """Llama 3.2 1B (HF `meta-llama/Llama-3.2-1B`) has 1,235,814,400 parameters: V=128256, d=2048, 16 layers, 32
    query heads of 64, 8 key/value heads, SwiGLU 8192, RMSNorm without bias, no biases, tied embeddings:
      token embedding 128256 * 2048                                   =   262,668,288
      one layer: q, o 2 * 2048^2 = 8,388,608; k, v 2 * 2048 * 512 = 2,097,152;
                 gate, up, down 3 * 2048 * 8192 = 50,331,648; two norms 2 * 2048 = 4,096
                 = 60,821,504;  x 16                                  =   973,144,064
      final RMSNorm 2048;  total                                      = 1,235,814,400
    The preset chooses rope, RMSNorm, SwiGLU and GQA itself: `model=llama-1b` alone is the Llama shape."""
    cfg = _compose("model=llama-1b", "model.vocab_size=128256")
    assert (cfg.position.name, cfg.norm.name, cfg.mlp.name, cfg.attention.name) == ("rope", "rmsnorm", "swiglu", "gqa")
    assert accounting.param_counts(cfg.model)["params"] == 1_235_814_400
    with torch.device("meta"):
        model = GPT(GPTConfig.from_dict(cfg.model))
    assert sum(p.numel() for p in model.parameters()) == 1_235_814_400


@pytest.mark.parametrize("preset", ["tiny", "small-cpu", "baby", "gpt2-124m", "gpt2-350m"])
@pytest.mark.parametrize("family", [[], ["position=rope", "norm=rmsnorm", "mlp=swiglu", "attention=gqa"],
                                    ["attention=mla", "norm.qk_norm=true", "mlp=geglu", "position=alibi"]])
def test_presets_analytic_params_equal_meta_model(preset, family):
    cfg = _compose(f"model={preset}", *family)
    with torch.device("meta"):
        model = GPT(GPTConfig.from_dict(cfg.model))
    assert accounting.param_counts(cfg.model)["params"] == sum(p.numel() for p in model.parameters())


def test_param_counts_by_hand():
    """The counts come from the model built on the meta device; these are the same figures worked by hand from each
    variant's definition, so a module that builds one parameter too many or too few (or an embedding table counted
    on the wrong side) fails here and not only against itself."""
    V, T, L, nh, d, hs = 96, 32, 2, 4, 32, 8
    base = dict(vocab_size=V, block_size=T, n_layer=L, n_head=nh, n_embd=d)
    counts = lambda **kw: accounting.param_counts(build_config(**base, **kw))  # noqa: E731

    # MLA (d_c 20, d_r 4) with its latent RMSNorm, RMSNorm qk-norm on the content and the rotary parts; swiglu
    # (hidden 8 * round(8 * 32 / 3 / 8) = 88); rope has no parameters; tied head
    dc, dr, h = 20, 4, 88
    attn = d * nh * (hs + dr) + d * (dc + dr) + dc * 2 * nh * hs + d * d + dc + 2 * hs + 2 * dr
    layer = attn + 2 * d + 3 * d * h
    total = V * d + L * layer + d
    assert counts(position="rope", norm={"name": "rmsnorm", "qk_norm": True}, mlp="swiglu",
                  attention={"name": "mla", "kv_latent_dim": dc, "rope_dim": dr, "latent_norm": True}) == {
        "params": total, "params_non_embedding": total - V * d}

    # t5bias (32 buckets x nh, a score bias: non-embedding), DyT (2d + 1 each), GQA with 2 kv heads, biases, and an
    # untied head (non-embedding)
    qkv = (nh + 2 * 2) * hs
    layer = d * qkv + qkv + d * d + d + 2 * (2 * d + 1) + d * 4 * d + 4 * d + 4 * d * d + d
    total = V * d + 32 * nh + L * layer + (2 * d + 1) + V * d
    assert counts(position="t5bias", norm="dyt", attention={"name": "gqa", "n_kv_head": 2}, bias=True,
                  tie_weights=False) == {"params": total, "params_non_embedding": total - V * d}

    # learned positions (a T x d embedding table), post-norm LayerNorm with biases (no final norm), sliding MHA
    layer = d * 3 * d + 3 * d + d * d + d + 2 * 2 * d + d * 4 * d + 4 * d + 4 * d * d + d
    total = V * d + T * d + L * layer
    assert counts(norm={"name": "layernorm", "placement": "post"}, bias=True,
                  attention={"name": "sliding", "window": 4}) == {
        "params": total, "params_non_embedding": total - V * d - T * d}


def test_gated_mlps_are_parameter_matched():
    base = dict(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=384)
    gelu = accounting.param_counts(build_config(**base, mlp="gelu"))["params"]
    for name in ("swiglu", "geglu"):
        gated = accounting.param_counts(build_config(**base, mlp=name))["params"]
        assert gated == gelu  # 384: 8/3 d = 1024 exactly, so the match is exact here
    small = dict(base, n_embd=128)  # 8/3 * 128 = 341.3 -> 344: within 1%
    g, s = (accounting.param_counts(build_config(**small, mlp=m))["params_non_embedding"] for m in ("gelu", "swiglu"))
    assert abs(s - g) / g < 0.01


def test_flops_per_token_formula():
    c = build_config(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=128)
    d, L, V, T = 128, 4, 256, 64
    n_matmul = L * (d * 3 * d + d * d + 2 * d * 4 * d) + V * d  # qkv, proj, mlp; lm_head
    assert accounting.flops_per_token(c) == 6 * n_matmul + 12 * L * d * T  # PaLM: 6N + 12 L d T
    assert accounting.flops_per_token(c, seq_len=16) == 6 * n_matmul + 12 * L * d * 16
    # a sliding window caps the attention term; a window >= T changes nothing
    sl = lambda w: build_config(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=128,  # noqa: E731
                                attention={"name": "sliding", "window": w})
    assert accounting.flops_per_token(sl(16)) == 6 * n_matmul + 12 * L * d * 16
    assert accounting.flops_per_token(sl(64)) == accounting.flops_per_token(c)
    # fewer kv heads: fewer matmul weights
    gqa = build_config(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=128,
                       attention={"name": "gqa", "n_kv_head": 1})
    assert accounting.flops_per_token(gqa) == accounting.flops_per_token(c) - 6 * L * d * 2 * (d - d // 4)


def test_kv_bytes_per_token_by_variant():
    base = dict(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=128)
    per = lambda **kw: accounting.kv_cache_bytes_per_token(build_config(**base, **kw), torch.bfloat16)  # noqa
    assert per() == 4 * 2 * 128 * 2                               # L * (k + v) * d * 2 bytes
    assert per(attention={"name": "gqa", "n_kv_head": 2}) == per() // 2
    assert per(attention="mqa") == per() // 4
    assert per(attention={"name": "mla"}) == 4 * (64 + 16) * 2    # L * (d_c + d_r) * 2 bytes
    sliding = build_config(**base, attention={"name": "sliding", "window": 8})
    assert accounting.kv_cache_bytes(sliding, 1000, batch_size=2) == 2 * 8 * per()
    assert accounting.kv_cache_bytes(sliding, 5, dtype=torch.float32) == 5 * 2 * per()
    assert math.isclose(accounting.kv_cache_bytes_per_token(base, torch.float32), 2 * per())  # plain dict works
