"""Config validation: every bad input fails at construction, before any weights, with a one-line ValueError that
names the field, its value and the valid range or choices. Plus the YAMLs and registries agree with the config."""
from pathlib import Path

import pytest
import torch
import yaml

from dataclasses import asdict

from modules.config import GPTConfig, build_config
from modules.registry import FAMILIES, names, variant
from modules.gpt import GPT

CONF = Path(__file__).resolve().parents[1] / "conf"
BASE = dict(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=32)


pytestmark = pytest.mark.usefixtures("one_thread")


def cfg(**kw):
    return {**BASE, **kw}


BAD = [
    # (kwargs, substrings the message must contain: field, value, what is valid)
    (cfg(n_embd=30), ["n_embd", "30", "n_head=4"]),
    (cfg(attention={"name": "gqa", "n_kv_head": 3}), ["n_kv_head", "3", "n_head=4"]),
    (cfg(attention={"name": "gqa", "n_kv_head": None}), ["n_kv_head", "None", "gqa"]),
    (cfg(attention={"name": "mqa", "n_kv_head": 2}), ["n_kv_head", "2", "1"]),
    (cfg(n_head=8, position="rope", n_embd=24), ["n_embd", "24", "head size", "3", "even"]),
    (cfg(n_embd=36, n_head=4, position="rope", attention={"name": "mla", "rope_dim": 3}),
     ["rope_dim", "3", "even"]),
    (cfg(attention={"name": "sliding", "window": 0}), ["attention.window", "0", "[1, inf]"]),
    (cfg(attention={"name": "sliding", "window": None}), ["attention.window", "None", ">= 1"]),
    (cfg(attention={"name": "sliding", "window": -3}), ["attention.window", "-3"]),
    (cfg(attention={"name": "mha", "window": 4}), ["attention.window", "4", "sliding"]),
    (cfg(attention={"name": "mla", "kv_latent_dim": 33}), ["kv_latent_dim", "33", "[1, n_embd=32]"]),
    (cfg(attention={"name": "mla", "kv_latent_dim": 0}), ["kv_latent_dim", "0", "[1, inf]"]),
    (cfg(position="rotary"), ["position.name", "'rotary'", "alibi, learned, nope, rope, sinusoidal"]),
    (cfg(norm={"name": "batchnorm"}), ["norm.name", "'batchnorm'", "layernorm", "rmsnorm"]),
    (cfg(mlp={"name": "moe"}), ["mlp.name", "'moe'", "geglu, gelu, relu2, swiglu"]),
    (cfg(attention={"name": "linear"}), ["attention.name", "'linear'", "gqa, mha, mla, mqa, sliding"]),
    (cfg(norm={"name": "rmsnorm", "placement": "sandwich"}), ["norm.placement", "'sandwich'", "pre, post"]),
    (cfg(norm={"name": "rmsnorm", "qk_norm": "yes"}), ["norm.qk_norm", "'yes'", "true or false"]),
    (cfg(norm={"name": "rmsnorm", "eps": 0}), ["norm.eps", "0", "(0, 1)"]),
    (cfg(mlp={"name": "swiglu", "hidden": 0}), ["mlp.hidden", "0", "[1, inf]"]),
    (cfg(position={"name": "rope", "base": 1}), ["position.base", "1", "> 1"]),
    (cfg(position={"name": "rope", "bsae": 500}), ["position.bsae", "500", "valid keys", "base"]),
    (cfg(n_layer=0), ["n_layer", "0", "[1, inf]"]),
    (cfg(n_head=2.0), ["n_head", "2.0", "integer"]),
    (cfg(vocab_size=None), ["vocab_size", "None", "integer"]),
    (cfg(block_size=True), ["block_size", "True", "integer"]),
    (cfg(dropout=1.0), ["dropout", "1.0", "[0, 1)"]),
    (cfg(bias="false"), ["bias", "'false'", "true or false"]),
    (cfg(n_layers=2), ["n_layers", "unknown key", "n_layer"]),
    ({k: v for k, v in BASE.items() if k != "n_embd"}, ["n_embd", "missing"]),
]


@pytest.mark.parametrize("kwargs,needles", BAD, ids=[" ".join(n[:2]) for _, n in BAD])
def test_bad_input_raises_clear_value_error(kwargs, needles):
    with pytest.raises(ValueError) as err:
        build_config(**kwargs)
    msg = str(err.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    # the model raises the same error at construction, before allocating anything
    if set(kwargs) <= set(GPTConfig.__dataclass_fields__) and all(k in kwargs for k in BASE):
        with pytest.raises(ValueError, match="invalid"):
            with torch.device("meta"):
                GPT(GPTConfig(**kwargs))


def test_good_configs_and_defaults():
    c = build_config(**BASE)
    assert (c.position.name, c.norm.name, c.mlp.name, c.attention.name) == ("learned", "layernorm", "gelu", "mha")
    assert c.n_kv_head == 4 and c.head_size == 8 and c.window is None and c.rotary_dim == 8
    assert c.variant("attention").score_dims(c) == (8, 8)  # no decoupled rotary part outside MLA
    assert build_config(**cfg(attention="mqa")).n_kv_head == 1
    assert build_config(**cfg(attention={"name": "gqa", "n_kv_head": 2})).n_kv_head == 2
    assert build_config(**cfg(attention={"name": "sliding", "window": 3, "n_kv_head": None})).n_kv_head == 4
    mla = build_config(**cfg(attention={"name": "mla", "kv_latent_dim": None, "rope_dim": None}))
    mla_cls = mla.variant("attention")
    assert (mla_cls.latent_dim(mla), mla_cls.rope_dim(mla)) == (16, 4)  # n_embd // 2, head_size // 2
    # gated MLPs are parameter-matched: hidden ~ 8/3 d rounded to a multiple of 8
    assert build_config(**cfg(mlp="swiglu", n_embd=768, n_head=12)).mlp_hidden == 2048
    assert build_config(**cfg(mlp="geglu", n_embd=128)).mlp_hidden == 344
    assert build_config(**cfg(mlp={"name": "swiglu", "hidden": 100})).mlp_hidden == 100
    assert build_config(**cfg(mlp="gelu")).mlp_hidden == 128
    # odd head size is fine without rope; MLA with rope only needs an even rope_dim
    build_config(**cfg(n_head=8, n_embd=24))
    build_config(**cfg(n_head=8, n_embd=24, position="rope", attention={"name": "mla", "rope_dim": 2}))
    # Hydra keys are ignored; the dataclass round-trips
    assert GPTConfig.from_dict({"_target_": "modules.gpt.GPT", "_convert_": "all", **BASE}) == c
    assert GPTConfig.from_dict(c.to_dict()) == c


def test_registries_are_discovered_from_the_variant_files():
    """Every module file of a family registers exactly one variant and is found without being listed anywhere."""
    for family, package in (("position", "positions"), ("norm", "norms"), ("mlp", "mlps"),
                            ("attention", "attention")):
        files = {p.stem for p in (CONF.parent / "modules" / package).glob("*.py")} - {"__init__", "base"}
        found = [variant(family, n).__module__.rsplit(".", 1)[1] for n in names(family)]
        assert sorted(found) == sorted(files), family


@pytest.mark.parametrize("group", FAMILIES)
def test_every_variant_has_a_yaml_that_validates(group):
    files = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
    assert files == sorted(names(group))
    for name in names(group):
        d = yaml.safe_load((CONF / group / f"{name}.yaml").read_text())
        assert d["name"] == name
        build_config(**{**BASE, group: d})
        # The YAML spells out every option the variant has (so `group.key=...` overrides always find a key), each
        # at the Options dataclass's default: `attention=gqa` and GPTConfig(attention="gqa") are one model.
        assert d == asdict(variant(group, name).Options(name=name)), name
    assert yaml.safe_load((CONF / "position/rope.yaml").read_text())["base"] == 10000


@pytest.mark.parametrize("preset,sizes", [("tiny", (32, 2, 4, 32)), ("small-cpu", (64, 4, 4, 128)),
                                          ("baby", (256, 6, 6, 384)), ("gpt2-124m", (1024, 12, 12, 768))])
def test_model_presets(preset, sizes):
    # the presets share conf/model/_gpt.yaml through Hydra defaults: check the composed node, not the raw file
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        d = OmegaConf.to_container(compose("config", overrides=[f"model={preset}"]).model, resolve=False)
    assert not any(str(k).startswith("_") for k in d)  # GPT(GPTConfig.from_dict(cfg.model)) is the one way in
    assert (d["block_size"], d["n_layer"], d["n_head"], d["n_embd"]) == sizes
    assert d["vocab_size"] == "${tokenizer.vocab_size}"
    assert {d[k] for k in ("position", "norm", "mlp", "attention")} == {
        "${position}", "${norm}", "${mlp}", "${attention}"}
    assert d["bias"] is (preset == "gpt2-124m") and d["tie_weights"] is True and d["dropout"] == 0.0
