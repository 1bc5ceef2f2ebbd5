"""model.parametrization=sp|mup: sp is today's model bit for bit, mup at the base width is sp, every variant runs
under mup, the multipliers match hand-computed values, and the coordinate check (Yang et al. 2022, as in
Microsoft's `mup` package and EleutherAI's nanoGPT-muP) passes under mup and fails under sp."""
import json
import math

import numpy as np
import pytest
import torch

from ablations.optim import build_optimizer
from modules.config import GPTConfig
from modules.errors import ConfigError
from modules.gpt import GPT
from modules.registry import names
from sp_reference import CASES, CONF, FIXTURE, case_id, close, composed, fingerprint

pytestmark = pytest.mark.usefixtures("one_thread")

# every variant YAML once (the defaults together form the baseline case), sliding with a window that cuts
VARIANTS = [[]] + [[f"{family}={name}"] + (["attention.window=6"] if name == "sliding" else [])
                   for family, default in (("position", "learned"), ("norm", "layernorm"), ("mlp", "gelu"),
                                           ("attention", "mha"))
                   for name in names(family) if name != default]
VIDS = [case_id(c) for c in VARIANTS]
MUP = ["model.parametrization=mup", "model.mup.base_width=16"]  # tiny: n_embd 32 = twice the base width


def build(case, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig.from_dict(composed(case).model))


def sharpen(model, factor=10.0):
    """Multiply the attention's input-side Linears (q, k, v, latents) by `factor`, so the attention logits are
    O(1) instead of the ~1e-3 of a fresh init, where any scale gives a near-uniform softmax and hides a wrong one."""
    with torch.no_grad():
        for block in model.blocks:
            for name, mod in block.attn.named_children():
                if isinstance(mod, torch.nn.Linear) and name not in type(block.attn).residual_projections:
                    mod.weight.mul_(factor)
    return model


# ------------------------------------------------------------------------------------------ sp unchanged
@pytest.fixture(scope="module")
def recorded():
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_sp_is_the_recorded_model(case, recorded):
    """The same init bit for bit, the same logits and 3 AdamW steps (LitGPT.configure_optimizers) within
    sp_reference.TOL as the code before parametrizations (tests/fixtures/sp_reference.json, recorded at the commit
    it names)."""
    assert close(fingerprint(case), recorded["cases"][case_id(case)]) == []


@pytest.mark.parametrize("case", VARIANTS, ids=VIDS)
def test_mup_at_the_base_width_is_sp(case):
    """Every factor is 1 at width = base_width: same init, same logits, same param groups as sp."""
    sp = build([*case, "model.n_embd=16"])
    mup = build([*case, "model.n_embd=16", *MUP])
    for (k, a), (_, b) in zip(sp.state_dict().items(), mup.state_dict().items()):
        assert torch.equal(a, b), k
    x = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(mup(x), sp(x), atol=0, rtol=0)
    o = {"name": "adamw", "lr": 1e-3, "weight_decay": 0.1}
    assert [len(g["params"]) for g in build_optimizer(mup, o).param_groups] == \
        [len(g["params"]) for g in build_optimizer(sp, o).param_groups] == [len([p for p in sp.parameters()
                                                                                 if p.dim() >= 2]),
                                                                            len([p for p in sp.parameters()
                                                                                 if p.dim() < 2])]


@pytest.mark.parametrize("case", VARIANTS, ids=VIDS)
def test_every_variant_runs_under_mup(case):
    """Twice the base width: finite forward/backward with every parameter reached, and cached decoding (prefill,
    chunks, single tokens) equal to the full forward, so the attention's mup scale is the same on every path."""
    model = sharpen(build([*case, *MUP]))
    assert model.output_mult == 0.5
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    logits = model(x)
    torch.nn.functional.cross_entropy(logits.view(-1, 256), x.roll(-1, 1).view(-1)).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
               for p in model.parameters())
    model.eval()
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache(2)
        chunks = [model(x[:, :5], cache=cache), model(x[:, 5:8], cache=cache)]
        chunks += [model(x[:, t: t + 1], cache=cache) for t in range(8, 16)]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, atol=1e-5, rtol=1e-4)


def _query_rows(attn) -> tuple[torch.nn.Linear, int]:
    """The Linear whose first `rows` output rows are the queries (test-side knowledge of each attention)."""
    if hasattr(attn, "c_attn"):
        return attn.c_attn, attn.n_head * attn.head_size
    return attn.c_q, attn.c_q.out_features  # MLA: content and rotary query parts of every head


@pytest.mark.parametrize("grows", ["heads", "head_size"])
@pytest.mark.parametrize("attention", names("attention"))
def test_attention_scores_use_the_mup_scale(attention, grows):
    """mup's q.k * sqrt(d0)/d equals sp's q.k / sqrt(d) once sp's query rows are multiplied by sqrt(d0)/d *
    sqrt(d); with the head's output multiplier, the two models give the same logits (sliding: its blocked path).
    Width grows by heads: d = d0, the scale is sp's 1/sqrt(d); by head size: d = 2 d0 at twice the base width."""
    case = [f"attention={attention}"] + (["attention.window=6"] if attention == "sliding" else [])
    mup = sharpen(build([*case, *MUP, f"model.mup.width_grows={grows}"])).eval()
    sp = build([*case, f"model.n_head={mup.config.n_head}"]).eval()  # the same heads: 8 (by heads) or 4
    assert mup.config.n_head == {"heads": 8, "head_size": 4}[grows]
    sp.load_state_dict(mup.state_dict())
    d = mup.config.variant("attention").score_dims(mup.config)[0]
    d0 = d if grows == "heads" else d // 2  # base width 16: the same heads, or half the head
    assert mup.blocks[0].attn.scale == pytest.approx(math.sqrt(d0) / d)
    with torch.no_grad():
        for block in sp.blocks:
            lin, rows = _query_rows(block.attn)
            lin.weight[:rows] *= mup.blocks[0].attn.scale * math.sqrt(d)
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(mup(x), sp(x) * 0.5, atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------------------ known answers
def test_multipliers_known_answers():
    """Base width 32, n_head 4, n_layer 2, gelu MLP (4x), typed by hand from Tensor Programs V's Table 3 and the
    spectral rule (parametrization.py). Width 64 (m = 2) and width 256 (m = 8), heads widening (width_grows=
    head_size: the attention scale is 1/d); test_width_grows_by_heads has the default's."""
    expected = {
        64: {"adam_hidden": 0.5, "muon_hidden": 0.7071067811865476, "out": 0.5,
             "attn": 0.1767766952966369,       # sqrt(8) / 16; sp: 1/sqrt(16) = 0.25
             "std_fc": 0.014142135623730952,   # 0.02 / sqrt(2)
             "std_proj": 0.007071067811865476},  # 0.02 / sqrt(2 * 2 layers) / sqrt(2)
        256: {"adam_hidden": 0.125, "muon_hidden": 0.3535533905932738, "out": 0.125,
              "attn": 0.04419417382415922,      # sqrt(8) / 64; sp: 0.125
              "std_fc": 0.007071067811865476,   # 0.02 / sqrt(8)
              "std_proj": 0.0035355339059327377},  # 0.01 / sqrt(8)
    }
    for width, want in expected.items():
        torch.manual_seed(0)
        m = GPT(GPTConfig(256, 32, 2, 4, width, parametrization="mup",
                          mup={"base_width": 32, "width_grows": "head_size"}))
        roles = {r.name: r for r in m.param_roles()}
        for name in ("blocks.0.attn.c_attn.weight", "blocks.1.mlp.c_fc.weight", "blocks.0.mlp.c_proj.weight"):
            assert roles[name].adam_lr_mult == pytest.approx(want["adam_hidden"], rel=1e-12)
            assert roles[name].muon_lr_mults == pytest.approx((want["muon_hidden"],) * len(roles[name].blocks))
        for name in ("wte.weight", "position.wpe.weight", "ln_f.weight", "blocks.0.ln_1.weight"):
            assert roles[name].adam_lr_mult == 1.0 and roles[name].init_mult == 1.0
        assert m.output_mult == want["out"]
        assert m.blocks[0].attn.scale == pytest.approx(want["attn"], rel=1e-12)
        # the init std, measured on the drawn weights (4 * width^2 samples: within 4% at 3 sigma)
        assert m.blocks[0].mlp.c_fc.weight.std().item() == pytest.approx(want["std_fc"], rel=0.04)
        assert m.blocks[0].mlp.c_proj.weight.std().item() == pytest.approx(want["std_proj"], rel=0.04)
        assert m.wte.weight.std().item() == pytest.approx(0.02, rel=0.04)  # embeddings keep sp's init
    sp = GPT(GPTConfig(256, 32, 2, 4, 64))
    assert sp.output_mult is None and sp.blocks[0].attn.scale is None  # sp: SDPA's own 1/sqrt(hs), no multiplier


def test_mla_fused_blocks_and_their_muon_factors():
    """MLA's c_kv_down fuses the latent (n_embd/2 rows) and the shared rotary key (hs/2 rows), c_kv_up the
    per-head keys and values; each block's shape gives its own Muon factor (here all 1/sqrt(2): every dimension
    doubles with the width)."""
    m = GPT(GPTConfig(256, 32, 2, 4, 64, attention="mla", parametrization="mup",
                      mup={"base_width": 32, "width_grows": "head_size"}))
    roles = {r.name: r for r in m.param_roles()}
    assert roles["blocks.0.attn.c_kv_down.weight"].blocks == ((32, 64), (8, 64))
    assert roles["blocks.0.attn.c_kv_down.weight"].base_blocks == ((16, 32), (4, 32))
    assert roles["blocks.0.attn.c_kv_up.weight"].blocks == ((64, 32), (64, 32))
    assert roles["blocks.0.attn.c_q.weight"].blocks == ((96, 64),)  # one query map: whole
    # MLA's score width is hs + rope_dim = 16 + 8 (base: 8 + 4): scale sqrt(12) / 24
    assert m.blocks[0].attn.scale == pytest.approx(math.sqrt(12) / 24, rel=1e-12)
    # a fixed latent width does not grow with the model: its block's factor is then sqrt(r_out/r_in)/sqrt(M) =
    # sqrt(1/2) / sqrt(64/32) = 0.5, the rotary block's still 1/sqrt(2)
    fixed = GPT(GPTConfig(256, 32, 2, 4, 64, attention={"name": "mla", "kv_latent_dim": 16},
                          parametrization="mup", mup={"base_width": 32, "width_grows": "head_size"}))
    r = {r.name: r for r in fixed.param_roles()}["blocks.0.attn.c_kv_down.weight"]
    assert r.muon_lr_mults == pytest.approx((0.5, 1 / math.sqrt(2)))


HEADS = {"base_width": 32, "width_grows": "heads"}  # the harness's default rule (conf/model/_gpt.yaml)
GROWS_BY_HEADS = {  # base width 32 with 4 heads: head_dim 8; by hand per attention: n_kv_head and the numbers
    # one layer's KV cache holds per token at widths 32 / 128 / 256 (MHA 2 * n_head * 8; GQA 2 * 2 * 8; MQA 2 * 8;
    # MLA the latent n_embd/2 plus the shared rotary key 8/2), and the score width (MLA: 8 + 4)
    "mha": {"kv": (4, 16, 32), "cache": (64, 256, 512), "d": 8},
    "gqa": {"kv": (2, 2, 2), "cache": (32, 32, 32), "d": 8},
    "mqa": {"kv": (1, 1, 1), "cache": (16, 16, 16), "d": 8},
    "mla": {"kv": (4, 16, 32), "cache": (20, 68, 132), "d": 12},
}


@pytest.mark.parametrize("attention", list(GROWS_BY_HEADS))
def test_width_grows_by_heads(attention):
    """Default mup (width_grows=heads), base width 32 with 4 heads: every head keeps 8 dimensions and n_head =
    n_embd / 8 (4, 16, 32 at widths 32, 128, 256), so the attention scale is sp's 1/sqrt(d) at every width; GQA's
    and MQA's n_kv_head stay as configured; the KV cache and the base model follow; the config round-trips."""
    from modules.accounting import kv_cache_bytes_per_token
    from modules.parametrization import base_config

    want = GROWS_BY_HEADS[attention]
    att = {"name": "gqa", "n_kv_head": 2} if attention == "gqa" else attention
    for i, width in enumerate((32, 128, 256)):
        cfg = GPTConfig(256, 32, 2, 4, width, attention=att, parametrization="mup", mup=HEADS)
        assert (cfg.n_head, cfg.head_size, cfg.mup.head_dim, cfg.n_kv_head) == (width // 8, 8, 8, want["kv"][i])
        assert kv_cache_bytes_per_token(cfg, torch.float32) == 2 * want["cache"][i] * 4  # 2 layers, 4 bytes
        assert (base_config(cfg).n_head, base_config(cfg).n_embd) == (4, 32)
        assert GPTConfig.from_dict(cfg.to_dict()) == cfg  # a recorded config rebuilds the same model
        m = GPT(cfg)
        assert m.blocks[0].attn.scale == pytest.approx(1 / math.sqrt(want["d"]), rel=1e-12)
    # the fixed-heads form, on request: 4 heads of n_embd / 4
    cfg = GPTConfig(256, 32, 2, 4, 128, attention=att, parametrization="mup",
                    mup={"base_width": 32, "width_grows": "head_size"})
    assert (cfg.n_head, cfg.head_size) == (4, 32)


def test_a_config_without_the_rule_keeps_its_heads():
    """The harness composes mup.width_grows=heads (conf/model/_gpt.yaml); a config that does not name the rule was
    recorded before it existed (its config.yaml, its checkpoint's hyperparameters), so it rebuilds the model it
    trained: 4 heads of 32 at width 128, the attention scale sqrt(8) / 32."""
    recorded = {"vocab_size": 256, "block_size": 32, "n_layer": 2, "n_head": 4, "n_embd": 128,
                "parametrization": "mup", "mup": {"base_width": 32}}
    cfg = GPTConfig.from_dict(recorded)
    assert (cfg.n_head, cfg.head_size, cfg.mup.width_grows) == (4, 32, "head_size")
    assert GPT(cfg).blocks[0].attn.scale == pytest.approx(math.sqrt(8) / 32, rel=1e-12)
    composed_cfg = GPTConfig.from_dict(composed(["model.parametrization=mup", "model.mup.base_width=16",
                                                  "model.n_embd=64"]).model)
    assert (composed_cfg.n_head, composed_cfg.head_size) == (16, 4)  # tiny: 4 heads at base width 16


@pytest.mark.parametrize("grows", ["heads", "head_size"])
def test_tuned_base_multipliers_by_hand(grows):
    """mup.init_std 0.05, output_mult 3 and attn_mult 1.5 (a tuned base, base width 32, 4 heads, 2 layers, untied
    head), at widths 64 (m = 2) and 256 (m = 8), typed by hand: hidden matrices 0.05 / sqrt(m) (the residual
    projections another 1/sqrt(2 * 2 layers)), embedding and head 0.05; logits x 3 * 32 / width; attention
    1.5 * sqrt(8) / d with d = 8 (heads) or width / 4 (head_size)."""
    expected = {
        64: {"std_fc": 0.035355339059327376, "std_proj": 0.017677669529663688, "out": 1.5,
             "attn": {"heads": 0.5303300858899106, "head_size": 0.2651650429449553}},
        256: {"std_fc": 0.017677669529663688, "std_proj": 0.008838834764831844, "out": 0.375,
              "attn": {"heads": 0.5303300858899106, "head_size": 0.06629126073623882}},
    }
    for width, want in expected.items():
        torch.manual_seed(0)
        m = GPT(GPTConfig(256, 32, 2, 4, width, tie_weights=False, parametrization="mup",
                          mup={"base_width": 32, "width_grows": grows, "init_std": 0.05, "output_mult": 3.0,
                               "attn_mult": 1.5}))
        assert m.output_mult == pytest.approx(want["out"], rel=1e-12)
        assert m.blocks[1].attn.scale == pytest.approx(want["attn"][grows], rel=1e-12)
        # the init std, measured on the drawn weights (>= 16k samples each: within 4% at well over 3 sigma)
        assert m.blocks[0].mlp.c_fc.weight.std().item() == pytest.approx(want["std_fc"], rel=0.04)
        assert m.blocks[1].mlp.c_proj.weight.std().item() == pytest.approx(want["std_proj"], rel=0.04)
        assert m.wte.weight.std().item() == pytest.approx(0.05, rel=0.04)
        assert m.lm_head.weight.std().item() == pytest.approx(0.05, rel=0.04)
        x = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():  # the multiplier is applied to the head's output
            torch.testing.assert_close(m(x), m.lm_head(m.ln_f(_residual_stream(m, x))) * want["out"])


def _residual_stream(model, x):
    """The blocks' output for x (the final norm's input), through a forward hook."""
    out = {}
    h = model.ln_f.register_forward_hook(lambda mod, inp, o: out.__setitem__("x", inp[0]))
    model(x)
    h.remove()
    return out["x"]


def test_mup_base_sweep_reaches_the_multipliers():
    """sweep=mup-base: a trial's values reach the model (tiny at base width 32, 4 heads of 8: logits x
    output_mult, attention x attn_mult / sqrt(8), hidden std init_std), its first trial is the defaults that make
    mup at the base width sp, and its search ranges hold those defaults."""
    from omegaconf import OmegaConf

    from sweeps.space import to_overrides
    from sweeps.settings import SweepSettings

    raw = OmegaConf.to_container(OmegaConf.load(CONF / "sweep" / "mup-base.yaml"), resolve=True)
    settings = SweepSettings.from_config("mup-base", raw)
    point = {"optim.lr": 1e-3, "model.mup.init_std": 0.04, "model.mup.output_mult": 2.0, "model.mup.attn_mult": 0.5}
    assert set(settings.space.keys) == set(point)
    cfg = composed([*settings.overrides, "model.mup.base_width=32", *to_overrides(point)])
    assert cfg.optim.lr == 1e-3
    torch.manual_seed(0)
    m = GPT(GPTConfig.from_dict(cfg.model))
    assert m.output_mult == 2.0 and m.blocks[0].attn.scale == pytest.approx(0.5 / math.sqrt(8), rel=1e-12)
    assert m.blocks[0].mlp.c_fc.weight.std().item() == pytest.approx(0.04, rel=0.06)  # 4096 samples
    defaults = {"model.mup.init_std": 0.02, "model.mup.output_mult": 1.0, "model.mup.attn_mult": 1.0}
    assert settings.enqueue[0] == {"optim.lr": 3e-3, **defaults}
    for p in settings.space.params:
        if p.key in defaults:
            assert p.distribution.low < defaults[p.key] < p.distribution.high, p.key


# ------------------------------------------------------------------------------------------ coordinate check
WIDTHS = (32, 64, 128, 256)
SEEDS = (0, 1)


def _activations(model, x) -> dict[str, float]:
    """RMS of every layer's output (forward hooks), of each layer's attention logits q.k * scale (from the q and k
    blocks of the fused c_attn and the module's own scale) and of the model's logits, on batch x."""
    acts, hooks = {}, []
    layers = {"wte": model.wte, "ln_f": model.ln_f}
    for i, b in enumerate(model.blocks):
        layers.update({f"b{i}": b, f"b{i}.attn": b.attn, f"b{i}.mlp": b.mlp, f"b{i}.c_attn": b.attn.c_attn,
                       f"b{i}.c_fc": b.mlp.c_fc})

    def scores(i, out):
        attn = model.blocks[i].attn
        q, k, _ = out.split(list(attn.fused_blocks()["c_attn"]), dim=-1)
        q, k = (t.view(*t.shape[:2], attn.n_head, attn.head_size).transpose(1, 2) for t in (q, k))  # (B, nh, T, hs)
        scale = attn.scale if attn.scale is not None else attn.head_size ** -0.5
        return (q @ k.transpose(-1, -2) * scale).pow(2).mean().sqrt().item()

    for name, mod in layers.items():
        hooks.append(mod.register_forward_hook(
            lambda m, i, out, name=name: acts.__setitem__(name, out.pow(2).mean().sqrt().item())))
    for i, b in enumerate(model.blocks):
        hooks.append(b.attn.c_attn.register_forward_hook(
            lambda m, inp, out, i=i: acts.__setitem__(f"b{i}.scores", scores(i, out))))
    with torch.no_grad():
        acts["logits"] = model(x).pow(2).mean().sqrt().item()
    for h in hooks:
        h.remove()
    return acts


def _coord_run(width, parametrization, optim, seed, data, steps):
    """The activations at init (keys @0) and after `steps` steps at lr 1e-2, on a held-out batch."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(256, 32, 2, 4, width, parametrization=parametrization, mup=HEADS))
    opt = build_optimizer(model, {"name": optim, "lr": 1e-2, "weight_decay": 0.0})
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - 33, (steps + 1, 8), generator=g)
    batches = [torch.stack([data[s: s + 33] for s in row]) for row in starts]
    held_out = batches[-1][:, :-1]
    acts = {f"{k}@0": v for k, v in _activations(model, held_out).items()}
    for b in batches[:-1]:
        logits = model(b[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), b[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return acts | _activations(model, held_out)


def coordinate_slopes(parametrization, optim, data, steps) -> dict[str, float]:
    """Least-squares slope of log RMS (mean over SEEDS) against log width, for every recorded activation."""
    runs = {w: [_coord_run(w, parametrization, optim, s, data, steps) for s in SEEDS] for w in WIDTHS}
    keys = runs[WIDTHS[0]][0]
    logs = {k: [np.mean([math.log(r[k]) for r in runs[w]]) for w in WIDTHS] for k in keys}
    return {k: float(np.polyfit(np.log(WIDTHS), y, 1)[0]) for k, y in logs.items()}


@pytest.fixture(scope="module")
def text_bytes(shakespeare_path):
    return torch.tensor(list(shakespeare_path.read_bytes()[:100_000]), dtype=torch.long)


FLAT = 0.2  # |slope| bound for "stays put": measured |slope| <= 0.06 under mup (Adam and Muon)


def _check_mup(s: dict[str, float]) -> None:
    """After the steps every layer output, the attention logits and the logits stay put across widths. At init
    the logits vanish like width^-1/2 as mup predicts (a readout of variance 1/width^2 reading sqrt(width)
    independent coordinates); the attention logits stay put (the width grows by heads: q.k over a fixed head size
    at a fixed scale; with heads widening they would fall like width^-1/2, q.k ~ sqrt(d) scaled 1/d)."""
    trained = {k: v for k, v in s.items() if "@0" not in k}
    at_init = {k: v for k, v in s.items() if "@0" in k and k != "logits@0"}
    assert all(abs(v) < FLAT for v in trained.values()), trained
    assert all(abs(v) < FLAT for v in at_init.values()), at_init
    assert s["logits@0"] == pytest.approx(-0.5, abs=0.15)


def test_coordinate_check_adam(text_bytes):
    """AdamW at lr 1e-2, widths 32..256 (2 layers), 5 steps: under sp the logits grow like width^0.75 and the
    blocks' outputs faster (measured: logits +0.75, block outputs +1.7); under mup everything stays put."""
    sp = coordinate_slopes("sp", "adamw", text_bytes, steps=5)
    assert sp["logits"] > 0.5, sp
    assert min(sp[f"b{i}"] for i in (0, 1)) > 1.0, sp
    _check_mup(coordinate_slopes("mup", "adamw", text_bytes, steps=5))


def test_coordinate_check_muon(text_bytes):
    """Muon (match_rms_adamw) on the hidden matrices with mup's spectral rule, 3 steps (Newton-Schulz runs in
    bf16, slow on CPUs without it): everything stays put too (measured |slope| <= 0.05; with no width factor on
    Muon's lr the MLP outputs grow like width^0.44)."""
    _check_mup(coordinate_slopes("mup", "muon", text_bytes, steps=3))


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kwargs, match", [
    ({"parametrization": "foo"}, r"^invalid parametrization='foo': choose one of sp, mup$"),
    ({"parametrization": "mup", "mup": {"base_width": 64}},
     r"^invalid mup.base_width=64: larger than n_embd=32; .*use a base_width <= 32\)$"),
    ({"parametrization": "mup"}, r"^invalid mup.base_width=None: parametrization=mup needs .*base_width=64$"),
    ({"parametrization": "mup", "mup": {"base_width": 6, "width_grows": "heads"}},
     r"^invalid mup.base_width=6: must be divisible by n_head=4 \(n_head counts the base model's heads; or set "
     r"model.mup.head_dim\)$"),
    ({"parametrization": "mup", "mup": {"base_width": 6, "width_grows": "head_size"}},
     r"^invalid mup.base_width=6: must be divisible by n_head=4 \(the base model keeps the heads"),
    ({"parametrization": "mup", "mup": {"base_width": 16, "head_dim": 12, "width_grows": "heads"}},
     r"^invalid n_embd=32: must be divisible by mup.head_dim=12 \(under mup the width grows by heads of that size; "
     r"or set model.mup.width_grows=head_size\)$"),
    ({"parametrization": "mup", "mup": {"base_width": 24, "head_dim": 16, "width_grows": "heads"}},
     r"^invalid mup.base_width=24: must be divisible by mup.head_dim=16"),
    ({"parametrization": "mup", "mup": {"base_width": 8, "head_dim": 4, "width_grows": "heads"},
      "attention": {"name": "gqa", "n_kv_head": 4}},
     r"^invalid mup.base_width=8: the base model \(n_embd=8\) is invalid: invalid attention.n_kv_head=4: must "
     r"divide n_head=2"),
    ({"parametrization": "mup", "mup": {"base_width": 16, "head_dim": 4}},
     r"^invalid mup.head_dim=4: with mup.width_grows=head_size the heads widen; set model.mup.width_grows=heads "
     r"to keep heads of 4$"),
    ({"parametrization": "mup", "mup": {"base_width": 16, "width_grows": "width"}},
     r"^invalid mup.width_grows='width': choose one of heads, head_size$"),
    ({"parametrization": "mup", "mup": {"base_width": 16, "init_std": 0}},
     r"^invalid mup.init_std=0: expected a number > 0$"),
    ({"parametrization": "mup", "mup": {"base_width": 16}, "attention": {"name": "mla", "kv_latent_dim": 24}},
     r"^invalid mup.base_width=16: the base model \(n_embd=16\) is invalid: invalid attention.kv_latent_dim=24"),
    ({"mup": {"base": 16}}, r"^invalid mup.base=16: unknown key; valid keys are base_width, width_grows, "
                            r"head_dim, init_std, output_mult, attn_mult$"),
])
def test_bad_parametrization_is_one_line(kwargs, match):
    with pytest.raises(ConfigError, match=match) as e:
        GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=32, **kwargs)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_bad_parametrization_on_the_command_line(tmp_path):
    """`python -m ablations.run model.parametrization=foo`: one line, exit 2, and refused before Lightning is
    imported (a bad model.* answers in ~2 s of CPU, not after ~8 s of imports): the module is run as __main__, as
    -m runs it, and the process says at exit whether Lightning was loaded."""
    from test_harness_run import run_cli

    said = tmp_path / "lightning-loaded"
    run_as_main = ("import runpy, sys\n"
                   "try:\n    runpy.run_module('ablations.run', run_name='__main__', alter_sys=True)\n"
                   f"finally:\n    open({str(said)!r}, 'w').write(str('lightning' in sys.modules))\n")
    r = run_cli(tmp_path / "bad", ["-c", run_as_main, "model=tiny", "model.parametrization=foo",
                                   f"tracking.uri=sqlite:///{tmp_path}/bad/mlflow.db"], module=None)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "parametrization='foo'" in lines[0] and "sp, mup" in lines[0], r.stderr
    assert said.read_text() == "False"


def test_export_refuses_mup():
    """Hugging Face configs have no key for mup's logit and attention multipliers: export names the setting."""
    from ablations.export import ExportError, architecture

    assert architecture(build([])) == "GPT-2"
    with pytest.raises(ExportError, match=r"GPT-2 needs parametrization=sp \(got mup\)"):
        architecture(build(MUP))
