"""Reference parity: our model against outside implementations of the same architecture, not against itself.

Each case builds a small random model of ours, copies its weights into the reference (Hugging Face transformers,
built from a config with random init: nothing is downloaded; or PyTorch's nn.TransformerEncoderLayer for
post-norm), and requires (1) max |logit difference| <= 1e-4 in fp32 over a batch of full-context sequences and
(2) greedy decoding through our KV cache to produce exactly the reference's `generate` tokens.

The weights are re-drawn at O(1) scale (norm gains around 1, non-zero biases, logits of a few units): with
GPT-2's 0.02 init most logits are ~0 and many bugs would hide under the tolerance. Settings that a bug could
silently ignore are set away from their defaults: RoPE base 500, RMSNorm eps 1e-3 (visible against activations
of RMS ~0.5), a sliding window shorter than the sequence, 6 ALiBi heads (not a power of two).

transformers' sliding window (5.x, masking_utils.sliding_window_overlay): key kv is visible to query q when
kv > q - W, i.e. each query sees itself and the W-1 previous tokens: the same convention as ours.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ablations.export import to_hf
from modules.config import GPTConfig
from modules.gpt import GPT

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-4
BASE = dict(vocab_size=96, block_size=32, n_layer=2, n_head=4, n_embd=32)
RMS = {"name": "rmsnorm", "eps": 1e-3}
ROPE = {"name": "rope", "base": 500.0}

CASES = {  # id -> (our config, the architecture it must map onto)
    "gpt2": (dict(position="learned", norm="layernorm", mlp="gelu", attention="mha", bias=True), "GPT-2"),
    "gpt2-nobias-untied": (dict(position="learned", norm="layernorm", mlp="gelu", attention="mha",
                                tie_weights=False), "GPT-2"),
    "llama-mha": (dict(position=ROPE, norm=RMS, mlp="swiglu", attention="mha"), "Llama"),
    "llama-gqa": (dict(position=ROPE, norm=RMS, mlp="swiglu", attention={"name": "gqa", "n_kv_head": 2}), "Llama"),
    "llama-mqa-bias-untied": (dict(position=ROPE, norm=RMS, mlp="swiglu", attention="mqa", bias=True,
                                   tie_weights=False), "Llama"),
    "mistral-sliding": (dict(position=ROPE, norm=RMS, mlp="swiglu",
                             attention={"name": "sliding", "window": 5, "n_kv_head": 2}), "Mistral"),
    "qwen3-qknorm": (dict(position=ROPE, norm={**RMS, "qk_norm": True}, mlp="swiglu",
                          attention={"name": "gqa", "n_kv_head": 2}), "Qwen3"),
    "mpt-alibi-6heads": (dict(position="alibi", norm="layernorm", mlp={"name": "gelu", "approximate": "none"},
                              attention="mha", n_head=6, n_embd=48), "MPT"),
    "mpt-alibi-4heads": (dict(position="alibi", norm="layernorm", mlp={"name": "gelu", "approximate": "none"},
                              attention="mha"), "MPT"),
    "deepseek-v3-mla": (dict(position=ROPE, norm={**RMS, "eps": 1e-6}, mlp="swiglu",
                             attention={"name": "mla", "kv_latent_dim": 12, "rope_dim": 4, "latent_norm": True}),
                        "DeepSeek-V3"),
}


def randomize_(model, seed=0):
    """O(1) random weights: matrices ~ N(0, 1/fan_in) (embeddings N(0, 0.5^2)), norm gains 1 + N(0, 0.2^2),
    biases N(0, 0.1^2); parameters in place, so tied weights stay tied."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                std = 0.5 if name.startswith(("wte", "position")) else p.shape[1] ** -0.5
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
    return model


def ours(seed=0, **kw):
    torch.manual_seed(seed)
    return randomize_(GPT(GPTConfig(**{**BASE, **kw})).eval(), seed)


def ids(B, T, seed=1):
    return torch.randint(0, BASE["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_greedy_tokens_match_transformers(case):
    kw, arch = CASES[case]
    model = ours(**kw)
    got_arch, ref = to_hf(model)
    assert got_arch == arch
    with torch.no_grad():
        x = ids(3, BASE["block_size"])
        diff = (model(x) - ref(x).logits).abs().max().item()
        assert diff <= TOL, f"{case}: max |logit diff| {diff:.3g} vs {arch}"
        prompt = ids(2, 6, seed=2)
        mine = model.generate(prompt, 24, temperature=0)  # prefill + 23 decode steps through our KV cache
        theirs = ref.generate(prompt, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert mine.tolist() == theirs.tolist(), f"{case}: greedy tokens differ from {arch}'s generate"


class TorchPostNormLM(nn.Module):
    """Embeddings + PyTorch's own post-norm encoder layers under a causal mask + our head: the reference for
    norm.placement=post (x = norm1(x + attn(x)); x = norm2(x + ff(x)))."""

    def __init__(self, model):
        super().__init__()
        c = model.config
        self.model = model
        self.layers = nn.ModuleList()
        for b in model.blocks:
            layer = nn.TransformerEncoderLayer(c.n_embd, c.n_head, dim_feedforward=b.mlp.c_fc.out_features,
                                               dropout=0.0, activation="gelu", layer_norm_eps=c.norm.eps,
                                               batch_first=True, norm_first=False, bias=True)
            with torch.no_grad():
                layer.self_attn.in_proj_weight.copy_(b.attn.c_attn.weight)  # q, k, v rows in both
                layer.self_attn.in_proj_bias.copy_(b.attn.c_attn.bias)
                layer.self_attn.out_proj.weight.copy_(b.attn.c_proj.weight)
                layer.self_attn.out_proj.bias.copy_(b.attn.c_proj.bias)
                for mine, theirs in ((b.mlp.c_fc, layer.linear1), (b.mlp.c_proj, layer.linear2),
                                     (b.ln_1, layer.norm1), (b.ln_2, layer.norm2)):
                    theirs.weight.copy_(mine.weight)
                    theirs.bias.copy_(mine.bias)
            self.layers.append(layer.eval())

    def forward(self, idx):
        T = idx.size(1)
        m = self.model
        x = m.wte(idx) + m.position.wpe(torch.arange(T))
        causal = nn.Transformer.generate_square_subsequent_mask(T)
        for layer in self.layers:
            x = layer(x, src_mask=causal, is_causal=True)
        return m.lm_head(x)


def test_post_norm_matches_torch_transformer_encoder_layer():
    model = ours(position="learned", norm={"name": "layernorm", "placement": "post"},
                 mlp={"name": "gelu", "approximate": "none"}, attention="mha", bias=True)
    ref = TorchPostNormLM(model).eval()
    with torch.no_grad():
        x = ids(3, BASE["block_size"])
        diff = (model(x) - ref(x)).abs().max().item()
        assert diff <= TOL, f"post-norm: max |logit diff| {diff:.3g} vs nn.TransformerEncoderLayer"
        prompt = ids(2, 6, seed=2)
        seq = prompt
        for _ in range(24):  # the reference's greedy decoding: re-run the whole context each step
            seq = torch.cat((seq, ref(seq)[:, -1].argmax(-1, keepdim=True)), dim=1)
        assert model.generate(prompt, 24, temperature=0).tolist() == seq.tolist()
