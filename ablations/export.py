"""Export a recorded run as a Hugging Face model directory: `python -m ablations.export run_id=<id> out=DIR [log=true]`.

The directory holds `config.json`, `model.safetensors` and tokenizer files, so that
`AutoModelForCausalLM.from_pretrained(DIR)` computes our logits (checked here after writing: the largest absolute
logit difference is printed) and `lm_eval --model hf --model_args pretrained=DIR` runs on it.

Which combinations map onto which Hugging Face architecture (every other one is refused with one line naming the
settings that do not map, against the closest architecture):

    GPT-2        position=learned, norm=layernorm (pre), mlp=gelu (tanh), attention=mha; bias false -> zero biases
    Llama        position=rope, norm=rmsnorm (pre), mlp=swiglu, attention=mha|gqa|mqa; bias -> attention/mlp_bias
    Mistral      Llama with attention=sliding (window W: query t sees keys t-W+1..t in both), bias=false
    Qwen3        Llama with norm.qk_norm=true (q_norm/k_norm over each head, before the rotation), bias=false
    MPT          position=alibi, norm=layernorm (pre, no bias), mlp=gelu with mlp.approximate=none and a hidden
                 width that is a multiple of n_embd, attention=mha, bias=false
    DeepSeek-V3  position=rope, norm=rmsnorm (pre), mlp=swiglu, attention=mla with attention.latent_norm=true and
                 rope_dim > 0 (uncompressed queries: q_lora_rank=null; rope_interleave=false), bias=false

Tokenizers: gpt2 as the GPT-2 tokenizer files (vocab.json, merges.txt, from the tiktoken cache the run used);
byte and char as a `tokenizers` tokenizer.json whose ids are ours (byte: the id of a byte is its value; char: the
id of a character is its index in the run's vocabulary). `log=true` uploads the directory to the run as the artifact
folder `hf/`. Options: run_id=<id> out=DIR [tracking.uri=URI] [log=true].
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import torch

from .cli import Command, Option
from .errors import AblationsError, ConfigError

USAGE = "usage: python -m ablations.export run_id=<MLflow run id> out=DIR [tracking.uri=URI] [log=true]"
TOLERANCE = 1e-4  # fp32 max |logit difference| accepted between our model and the exported one


class ExportError(ConfigError):
    """The run's combination has no Hugging Face architecture (or the directory cannot be written)."""


# ------------------------------------------------------------------------------------------ what maps where
def _facts(model) -> dict:
    """Every setting an architecture may constrain, read from the model's config and its built modules (the
    modules give the derived widths: kv heads, MLP hidden, MLA latent and rotary widths)."""
    c = model.config
    b = model.blocks[0]
    attn, mlp = b.attn, b.mlp
    f = {
        "position": c.position.name, "norm": c.norm.name, "norm.placement": c.norm.placement,
        "norm.qk_norm": bool(c.norm.qk_norm), "mlp": c.mlp.name, "attention": c.attention.name,
        "bias": bool(c.bias), "mlp.approximate": getattr(c.mlp, "approximate", None),
        "attention.latent_norm": bool(getattr(c.attention, "latent_norm", False)),
        "position.scaling": (getattr(c.position, "scaling", None) or {}).get("name"),
        "hidden": mlp.c_proj.in_features, "n_embd": c.n_embd, "head_size": c.n_embd // c.n_head,
        "parametrization": c.parametrization,  # mup's logit and attention multipliers have no HF config key
    }
    if hasattr(attn, "c_attn"):
        f["n_kv_head"] = c.n_kv_head
    if hasattr(attn, "c_kv_up"):
        f["kv_latent_dim"] = attn.c_kv_up.in_features
        f["rope_dim"] = c.rotary_dim
    f["window"] = c.window  # the attention's own window (None: full causal)
    return f


def _show(v) -> str:
    """A value as it is written on the command line (true/false/null)."""
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _needs(f: dict, **want) -> list[str]:
    """The settings of f that differ from want (a value, or a tuple of allowed values)."""
    out = []
    for key, allowed in want.items():
        key = key.replace("__", ".")
        ok = allowed if isinstance(allowed, tuple) else (allowed,)
        if f.get(key) not in ok:
            out.append(f"{key}={'|'.join(_show(a) for a in ok)} (got {_show(f.get(key))})")
    return out


PRE = dict(norm__placement="pre", position__scaling=None,  # rope's context scaling is not exported (yet)
           parametrization="sp")
ARCHS = {
    "GPT-2": lambda f: _needs(f, position="learned", norm="layernorm", norm__qk_norm=False, mlp="gelu",
                              mlp__approximate="tanh", attention="mha", **PRE),
    "Llama": lambda f: _needs(f, position="rope", norm="rmsnorm", norm__qk_norm=False, mlp="swiglu",
                              attention=("mha", "gqa", "mqa"), **PRE),
    "Mistral": lambda f: _needs(f, position="rope", norm="rmsnorm", norm__qk_norm=False, mlp="swiglu",
                                attention="sliding", bias=False, **PRE),
    "Qwen3": lambda f: _needs(f, position="rope", norm="rmsnorm", norm__qk_norm=True, mlp="swiglu",
                              attention=("mha", "gqa", "mqa"), bias=False, **PRE),
    "MPT": lambda f: _needs(f, position="alibi", norm="layernorm", norm__qk_norm=False, mlp="gelu",
                            mlp__approximate="none", attention="mha", bias=False, **PRE)
    + ([] if f["hidden"] % f["n_embd"] == 0 else [f"mlp.hidden a multiple of n_embd={f['n_embd']} "
                                                 f"(got {f['hidden']})"]),
    "DeepSeek-V3": lambda f: _needs(f, position="rope", norm="rmsnorm", norm__qk_norm=False, mlp="swiglu",
                                    attention="mla", attention__latent_norm=True, bias=False, **PRE)
    + ([] if f.get("rope_dim", 0) > 0 else ["attention.rope_dim>0 (got 0)"]),
}


def architecture(model) -> str:
    """The Hugging Face architecture this model maps onto exactly, or ExportError naming what does not map."""
    f = _facts(model)
    misses = {name: check(f) for name, check in ARCHS.items()}
    fits = [name for name, m in misses.items() if not m]
    if fits:
        return fits[0]
    fewest = min(len(m) for m in misses.values())
    closest = [f"{name} needs {', '.join(m)}" for name, m in misses.items() if len(m) == fewest]
    raise ExportError(f"no Hugging Face architecture fits this model; the closest: {'; '.join(closest)}")


# ------------------------------------------------------------------------------------------ config + weights
def _common(c, f) -> dict:
    return dict(vocab_size=c.vocab_size, hidden_size=c.n_embd, num_hidden_layers=c.n_layer,
                num_attention_heads=c.n_head, max_position_embeddings=c.block_size,
                tie_word_embeddings=bool(c.tie_weights), bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _hf_config(arch: str, model):
    from transformers import (DeepseekV3Config, GPT2Config, LlamaConfig, MistralConfig, MptConfig,
                              Qwen3Config)

    c, f = model.config, _facts(model)
    rope = {"rope_type": "default", "rope_theta": float(c.position.base)} if c.position.name == "rope" else None
    if arch == "GPT-2":
        return GPT2Config(vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer,
                          n_head=c.n_head, n_inner=f["hidden"], activation_function="gelu_new",
                          layer_norm_epsilon=c.norm.eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                          tie_word_embeddings=bool(c.tie_weights), bos_token_id=None, eos_token_id=None)
    if arch == "MPT":
        return MptConfig(d_model=c.n_embd, n_heads=c.n_head, n_layers=c.n_layer, vocab_size=c.vocab_size,
                         expansion_ratio=f["hidden"] // c.n_embd, max_seq_len=c.block_size,
                         layer_norm_epsilon=c.norm.eps, no_bias=True, tie_word_embeddings=bool(c.tie_weights),
                         attn_config={"alibi": True, "alibi_bias_max": 8, "attn_pdrop": 0})
    llama_like = dict(_common(c, f), intermediate_size=f["hidden"], hidden_act="silu", rms_norm_eps=c.norm.eps,
                      rope_parameters=rope, attention_dropout=0.0)
    if arch == "DeepSeek-V3":
        return DeepseekV3Config(**llama_like, num_key_value_heads=c.n_head, q_lora_rank=None,
                                kv_lora_rank=f["kv_latent_dim"], qk_rope_head_dim=f["rope_dim"],
                                qk_nope_head_dim=f["head_size"], v_head_dim=f["head_size"],
                                first_k_dense_replace=c.n_layer, n_routed_experts=1, n_shared_experts=1,
                                num_experts_per_tok=1, n_group=1, topk_group=1, moe_intermediate_size=8,
                                rope_interleave=False, attention_bias=False)
    kw = dict(llama_like, num_key_value_heads=f["n_kv_head"], head_dim=f["head_size"])
    if arch == "Llama":
        return LlamaConfig(**kw, attention_bias=f["bias"], mlp_bias=f["bias"])
    if arch == "Mistral":
        return MistralConfig(**kw, sliding_window=f["window"])
    if arch == "Qwen3":
        return Qwen3Config(**kw, attention_bias=False, use_sliding_window=False)
    raise ExportError(f"architecture {arch!r} is unknown")  # unreachable: ARCHS and this function agree


def _t(w):
    return w.detach().clone().contiguous()


def _state_dict(arch: str, model) -> dict:
    """Our weights under the Hugging Face names (a bias=false model exports zero biases where GPT-2 has them)."""
    c, f = model.config, _facts(model)
    nh, hs, H = c.n_head, f["head_size"], f["hidden"]
    sd = {}

    def bias_of(lin):
        return _t(lin.bias) if lin.bias is not None else torch.zeros(lin.out_features)

    if arch == "GPT-2":
        sd["transformer.wte.weight"] = _t(model.wte.weight)
        sd["transformer.wpe.weight"] = _t(model.position.wpe.weight)
        for i, b in enumerate(model.blocks):
            p = f"transformer.h.{i}."
            for ours, theirs in ((b.ln_1, "ln_1"), (b.ln_2, "ln_2")):
                sd[p + theirs + ".weight"] = _t(ours.weight)
                sd[p + theirs + ".bias"] = _norm_bias(ours)
            for ours, theirs in ((b.attn.c_attn, "attn.c_attn"), (b.attn.c_proj, "attn.c_proj"),
                                 (b.mlp.c_fc, "mlp.c_fc"), (b.mlp.c_proj, "mlp.c_proj")):
                sd[p + theirs + ".weight"] = _t(ours.weight.t())  # GPT-2's Conv1D stores (in, out)
                sd[p + theirs + ".bias"] = bias_of(ours)
        sd["transformer.ln_f.weight"] = _t(model.ln_f.weight)
        sd["transformer.ln_f.bias"] = _norm_bias(model.ln_f)
    elif arch == "MPT":
        sd["transformer.wte.weight"] = _t(model.wte.weight)
        for i, b in enumerate(model.blocks):
            p = f"transformer.blocks.{i}."
            sd[p + "norm_1.weight"], sd[p + "norm_2.weight"] = _t(b.ln_1.weight), _t(b.ln_2.weight)
            sd[p + "attn.Wqkv.weight"] = _t(b.attn.c_attn.weight)  # q, k, v rows, as ours
            sd[p + "attn.out_proj.weight"] = _t(b.attn.c_proj.weight)
            sd[p + "ffn.up_proj.weight"] = _t(b.mlp.c_fc.weight)
            sd[p + "ffn.down_proj.weight"] = _t(b.mlp.c_proj.weight)
        sd["transformer.norm_f.weight"] = _t(model.ln_f.weight)
    else:  # the Llama family: Llama, Mistral, Qwen3, DeepSeek-V3
        sd["model.embed_tokens.weight"] = _t(model.wte.weight)
        for i, b in enumerate(model.blocks):
            p = f"model.layers.{i}."
            sd[p + "input_layernorm.weight"] = _t(b.ln_1.weight)
            sd[p + "post_attention_layernorm.weight"] = _t(b.ln_2.weight)
            a = b.attn
            if arch == "DeepSeek-V3":
                dc = f["kv_latent_dim"]
                sd[p + "self_attn.q_proj.weight"] = _t(a.c_q.weight)  # per head [content, rotary], as ours
                sd[p + "self_attn.kv_a_proj_with_mqa.weight"] = _t(a.c_kv_down.weight)  # [latent, rotary key]
                sd[p + "self_attn.kv_a_layernorm.weight"] = _t(a.latent_norm.weight)
                # ours: all heads' keys, then all heads' values; DeepSeek: per head [key, value]
                up = a.c_kv_up.weight.view(2, nh, hs, dc).transpose(0, 1)  # (nh, 2, hs, dc)
                sd[p + "self_attn.kv_b_proj.weight"] = _t(up.reshape(nh * 2 * hs, dc))
                sd[p + "self_attn.o_proj.weight"] = _t(a.c_proj.weight)
            else:
                nkv = f["n_kv_head"]
                splits = [nh * hs, nkv * hs, nkv * hs]
                for name, w in zip(("q_proj", "k_proj", "v_proj"), a.c_attn.weight.split(splits, dim=0)):
                    sd[p + f"self_attn.{name}.weight"] = _t(w)
                if a.c_attn.bias is not None:
                    for name, w in zip(("q_proj", "k_proj", "v_proj"), a.c_attn.bias.split(splits, dim=0)):
                        sd[p + f"self_attn.{name}.bias"] = _t(w)
                sd[p + "self_attn.o_proj.weight"] = _t(a.c_proj.weight)
                if a.c_proj.bias is not None:
                    sd[p + "self_attn.o_proj.bias"] = _t(a.c_proj.bias)
                if arch == "Qwen3":
                    sd[p + "self_attn.q_norm.weight"] = _t(a.q_norm.weight)
                    sd[p + "self_attn.k_norm.weight"] = _t(a.k_norm.weight)
            gate, up = b.mlp.c_fc.weight.split([H, H], dim=0)  # fused: gate rows, then up rows
            sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"] = _t(gate), _t(up)
            sd[p + "mlp.down_proj.weight"] = _t(b.mlp.c_proj.weight)
            if b.mlp.c_fc.bias is not None:
                g, u = b.mlp.c_fc.bias.split([H, H])
                sd[p + "mlp.gate_proj.bias"], sd[p + "mlp.up_proj.bias"] = _t(g), _t(u)
                sd[p + "mlp.down_proj.bias"] = _t(b.mlp.c_proj.bias)
        sd["model.norm.weight"] = _t(model.ln_f.weight)
    sd["lm_head.weight"] = _t(model.lm_head.weight)
    return sd


def _norm_bias(norm):
    b = getattr(norm, "bias", None)
    return _t(b) if b is not None else torch.zeros_like(norm.weight)


def to_hf(model):
    """-> (architecture name, a Hugging Face model in fp32 eval mode holding our weights)."""
    from transformers import AutoModelForCausalLM

    arch = architecture(model)
    config = _hf_config(arch, model)
    config._attn_implementation = "eager"  # noqa: SLF001 - exact fp32 softmax; MPT has no other
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    missing, unexpected = hf.load_state_dict(_state_dict(arch, model), strict=False)
    tied = {"lm_head.weight"} if model.config.tie_weights else set()
    if unexpected or set(missing) - tied:
        raise ExportError(f"{arch}: weight names do not match transformers here (missing "
                          f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}): "
                          f"this exporter was written for transformers 5.x")
    if model.config.tie_weights:
        hf.tie_weights()
    return arch, hf


# ------------------------------------------------------------------------------------------------- tokenizers
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes are shifted
    to code points 256.. so every byte is one visible character (what the ByteLevel pre-tokenizer produces)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def hf_tokenizer(tok, max_length: int | None = None):
    """Our tokenizer as a transformers fast tokenizer with identical ids (max_length: the model's context)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if tok.name == "gpt2":
        import hashlib
        import tempfile

        from transformers import GPT2TokenizerFast

        from .tokenizers import GPT2_URLS, _tiktoken_cache_dir

        cache = _tiktoken_cache_dir()
        bpe, enc = (cache / hashlib.sha1(u.encode()).hexdigest() for u in GPT2_URLS)  # vocab.bpe, encoder.json
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(enc, Path(tmp) / "vocab.json")
            shutil.copy(bpe, Path(tmp) / "merges.txt")
            kw = {} if max_length is None else {"model_max_length": max_length}
            return GPT2TokenizerFast.from_pretrained(tmp, **kw)  # reads vocab.json + merges.txt
    if tok.name == "byte":
        b2u = _bytes_to_unicode()
        vocab = {b2u[b]: b for b in range(256)}  # the id of a byte is its value
        t = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        t.decoder = decoders.ByteLevel()
        special = b2u[tok.sep_id]
    elif tok.name == "char":
        t = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(tok.chars)}, merges=[]))
        t.decoder = decoders.Fuse()  # join characters without the spaces a plain decode puts between tokens
        special = tok.chars[tok.sep_id if tok.sep_id is not None else 0]
    else:
        raise ExportError(f"tokenizer {tok.name!r} has no Hugging Face export: use tokenizer=byte|char|gpt2")
    # lm_eval pads with eos; without one it would add a token the model has no row for
    kw = {} if max_length is None else {"model_max_length": max_length}
    return PreTrainedTokenizerFast(tokenizer_object=t, eos_token=special, pad_token=special, **kw)


# -------------------------------------------------------------------------------------------------- export
@torch.no_grad()
def max_logit_difference(model, hf, n_tokens: int = 32, seed: int = 0) -> float:
    """Largest |our logit - theirs| in fp32 on random ids (one batch row, positions 0..T-1)."""
    T = min(n_tokens, model.config.block_size)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, model.config.vocab_size, (2, T), generator=g)
    model = model.float().eval()
    return float((model(idx) - hf(idx).logits).abs().max())


def export(model, tok, out) -> dict:
    """Write the Hugging Face directory; -> {"architecture", "max_abs_logit_diff", "files"}."""
    arch, hf = to_hf(model)
    diff = max_logit_difference(model, hf)
    if not diff <= TOLERANCE:
        raise ExportError(f"{arch} export computes different logits (max |diff| {diff:.3g} > {TOLERANCE}): "
                          f"report this model config as an exporter bug")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    hf.config.architectures = [type(hf).__name__]
    hf.save_pretrained(out)  # config.json + model.safetensors
    hf_tokenizer(tok, model.config.block_size).save_pretrained(out)
    meta = {"architecture": arch, "max_abs_logit_diff": diff, "tokenizer": tok.name,
            "files": sorted(p.name for p in out.iterdir())}
    return meta


COMMAND = Command(
    "ablations.export", "run_id=<id> out=DIR [tracking.uri=URI] [log=true]", __doc__.split("\n\n")[0],
    options=(Option("run_id", "the MLflow run whose checkpoints/final.ckpt is exported", parse=str),
             Option("out", "the Hugging Face model directory to write", parse=str),
             Option("tracking.uri", "the store (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)", parse=str),
             Option("log", "also upload the directory to the run as the artifact folder hf/", False, switch=True)),
    examples=("run_id=<id> out=hf-model", "run_id=<id> out=hf-model log=true"))


def parse_args(argv: list[str]) -> dict:
    opts, _ = COMMAND.parse_or_help(argv)
    for k in ("run_id", "out"):
        if not opts[k]:
            raise ConfigError(f"{k}= is required: {USAGE}")
    return opts


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        from .generate import load_run
        from .tracking import client, tracking_uri

        o = parse_args(sys.argv[1:] if argv is None else argv)
        uri = o["tracking.uri"] or tracking_uri()  # else $MLFLOW_TRACKING_URI, else the default
        model, tok, _ = load_run(o["run_id"], uri)
        try:
            meta = export(model.float(), tok, o["out"])
        except ExportError as e:
            raise ExportError(f"run {o['run_id']} does not export: {e}") from None
        if o["log"]:
            client(uri).log_artifacts(o["run_id"], str(o["out"]), artifact_path="hf")
    except AblationsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logged = f"; logged to run {o['run_id']} as artifacts hf/" if o["log"] else ""
    print(f"[ablations] exported {meta['architecture']} to {o['out']} (max |logit diff| "
          f"{meta['max_abs_logit_diff']:.2e} in fp32; tokenizer {meta['tokenizer']}){logged}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
