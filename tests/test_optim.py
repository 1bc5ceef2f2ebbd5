"""optim=adamw|muon: every parameter in exactly one group for every variant, Muon's update orthogonalised, fused
matrices orthogonalised block by block, exact resume per optimizer, MLflow records, bad input in one line."""
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from torch import nn

from ablations.errors import ConfigError
from ablations.optim import BlockMuon, MuonWithAdamW, build_optimizer, run_params
from modules.config import GPTConfig
from modules.gpt import GPT
from modules.parametrization import param_roles
from modules.registry import names

CONF = str(Path(__file__).resolve().parents[1] / "conf")
pytestmark = pytest.mark.usefixtures("one_thread")

VARIANTS = [[f"{family}={name}"] + (["attention.window=6"] if name == "sliding" else [])
            for family in ("position", "norm", "mlp", "attention") for name in names(family)]
VARIANTS += [["model.tie_weights=false", "model.bias=true"], ["attention=mla", "attention.latent_norm=true",
                                                               "norm.qk_norm=true", "position=rope"]]
MUP = ["model.parametrization=mup", "model.mup.base_width=16"]


def composed(overrides):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=["model=tiny", *overrides])


def build(overrides, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig.from_dict(composed(overrides).model))


def muon_cfg(**kw):
    return {"name": "muon", "lr": 1e-3, "weight_decay": 0.1, "muon": {}, **kw}


# ------------------------------------------------------------------------------------------ grouping
@pytest.mark.parametrize("parametrization", [[], MUP], ids=["sp", "mup"])
@pytest.mark.parametrize("case", VARIANTS, ids=[" ".join(c) for c in VARIANTS])
def test_every_parameter_in_exactly_one_group(case, parametrization):
    """For every registered variant, both optimizers and both parametrizations: the groups partition the model's
    parameters; Muon holds exactly the Linear weights inside the blocks (never an embedding table, the head or a
    vector); AdamW decays exactly the >= 2-D parameters it holds."""
    model = build([*case, *parametrization])
    every = {id(p) for p in model.parameters()}
    hidden = {id(m.weight) for m in model.blocks.modules() if isinstance(m, nn.Linear)}
    for o in ({"name": "adamw", "lr": 1e-3, "weight_decay": 0.1}, muon_cfg()):
        opt = build_optimizer(model, o)
        seen = [id(p) for g in opt.param_groups for p in g["params"]]
        assert len(seen) == len(set(seen)) and set(seen) == every
        adamw = opt.adamw if isinstance(opt, MuonWithAdamW) else opt
        muon = {id(p) for g in opt.muon.param_groups for p in g["params"]} if adamw is not opt else set()
        assert muon == (hidden if o["name"] == "muon" else set())
        for g in adamw.param_groups:
            assert all((p.dim() >= 2) == (g["weight_decay"] > 0) for p in g["params"])


@pytest.mark.parametrize("case", VARIANTS, ids=[" ".join(c) for c in VARIANTS])
def test_sp_adamw_groups_are_the_two_groups_adamw_always_had(case):
    """sp: [>= 2-D params in model order, decay] + [the rest, no decay], no per-group lr, fused AdamW (the
    bit-for-bit fingerprints of tests/test_mup.py cover the numbers)."""
    model = build(case)
    opt = build_optimizer(model, {"name": "adamw", "lr": 2e-3, "weight_decay": 0.1, "betas": [0.9, 0.95]})
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"]
    params = list(model.parameters())
    decay, rest = opt.param_groups
    assert [id(p) for p in decay["params"]] == [id(p) for p in params if p.dim() >= 2] and decay["weight_decay"] == 0.1
    assert [id(p) for p in rest["params"]] == [id(p) for p in params if p.dim() < 2] and rest["weight_decay"] == 0.0
    assert decay["lr"] == rest["lr"] == 2e-3


def test_mup_groups_carry_the_lr_multipliers():
    """Width 32 at base 16 (m = 2): Adam's hidden matrices at lr/2, Muon's at lr/sqrt(2); everything else at lr.
    The multiplier-1 group comes first, so param_groups[0] (the logged lr) follows optim.lr's schedule."""
    model = build(MUP)
    adam = build_optimizer(model, {"name": "adamw", "lr": 1e-3, "weight_decay": 0.1})
    assert [g["lr"] for g in adam.param_groups] == [1e-3, 5e-4, 1e-3]
    assert [len(g["params"]) for g in adam.param_groups] == [2, 8, 5]  # wte+wpe | 4 Linears x 2 layers | vectors
    mu = build_optimizer(model, muon_cfg())
    assert [g["lr"] for g in mu.param_groups] == pytest.approx([1e-3, 1e-3, 1e-3 / math.sqrt(2)], rel=1e-15)


def _mup(width, **kw) -> GPT:
    """Base width 32 with 4 heads (heads of 8 at every width), 2 layers, at `width`, untied head."""
    torch.manual_seed(0)
    return GPT(GPTConfig(256, 32, 2, 4, width, tie_weights=False, parametrization="mup",
                         mup={"base_width": 32, "width_grows": "heads"}, **kw))


def _mu_adam(model, lr, wd) -> dict[int, tuple[float, float]]:
    """MuAdam's (lr, weight_decay) per parameter, typed from microsoft/mup's optim.py: a matrix whose two
    dimensions both grow with width (infshape.ninf() == 2) gets lr / width_mult and weight_decay * width_mult,
    width_mult = fan_in / base fan_in; everything else lr and wd. (Vectors' wd 0 is our AdamW's grouping, not
    MuAdam's.) The base shapes: the model at width 32."""
    base = dict(_mup(32).named_parameters())
    out = {}
    for name, p in model.named_parameters():
        b = base[name]
        both = p.dim() == 2 and p.shape[0] != b.shape[0] and p.shape[1] != b.shape[1]
        m = p.shape[1] / b.shape[1] if both else 1.0
        out[id(p)] = (lr / m, wd * m if p.dim() >= 2 else 0.0)
    return out


@pytest.mark.parametrize("width", [64, 256])
def test_mup_adamw_decay_is_muadams(width):
    """Every parameter's lr and weight decay are MuAdam's (hidden matrices at width 256: lr / 8, wd * 8), so
    lr * wd is the same at every width; and one AdamW step on zero gradients multiplies every decayed tensor by
    exactly 1 - lr * wd = 1 - 1e-3 (decoupled decay alone), at both widths."""
    model = _mup(width)
    opt = build_optimizer(model, {"name": "adamw", "lr": 1e-2, "weight_decay": 0.1})
    want = _mu_adam(model, 1e-2, 0.1)
    got = {id(p): (g["lr"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}
    assert got.keys() == want.keys()
    for k in got:
        assert got[k] == pytest.approx(want[k], rel=1e-12)
    assert any(w[0] == pytest.approx(1e-2 * 32 / width) for w in want.values())  # the rule was exercised
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        factor = 1 - 1e-3 if p.dim() >= 2 else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor, atol=0, rtol=1e-6)


def test_mup_muon_decay_keeps_lr_times_wd():
    """Muon's matching rule: each block's decoupled decay is divided by its lr factor, so one step on zero
    gradients (Newton-Schulz of zero is zero) multiplies every block of every hidden matrix by exactly
    1 - lr * wd, at width 256 with MLA's fused blocks whose factors differ (0.25 and 0.125, see below)."""
    model = _mup(256, attention="mla")
    opt = build_optimizer(model, muon_cfg(lr=1e-2, weight_decay=0.1))
    hidden = {id(p) for g in opt.muon.param_groups for p in g["params"]}
    before = {n: p.detach().clone() for n, p in model.named_parameters() if id(p) in hidden}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.muon.step()
    for n, p in model.named_parameters():
        if id(p) in hidden:
            torch.testing.assert_close(p.detach(), before[n] * (1 - 1e-3), atol=0, rtol=1e-6)


def test_block_muon_applies_mla_block_factors_under_mup(monkeypatch):
    """The lr BlockMuon hands PyTorch's Muon for each block of MLA's fused matrices under mup (issue 27: an
    inverted factor went unnoticed). Width 128, base 32, 4 base heads of 8 (16 heads at 128), latent n_embd/2,
    rotary width 4, lr 1e-2; factor sqrt(r_out / r_in) / sqrt(M) per block, by hand:
        c_kv_down latent (64, 128), base (16, 32): sqrt(4 / 4) / sqrt(128 / 32) = 0.5     -> lr 5e-3
        c_kv_down rotary (4, 128), base (4, 32):   sqrt(1 / 4) / sqrt(128 / 32) = 0.25    -> lr 2.5e-3
        c_kv_up k and v (128, 64), base (32, 16):  sqrt(4 / 4) / sqrt(128 / 32) = 0.5     -> lr 5e-3 each
        c_q (192, 128), base (48, 32):             0.5                                     -> lr 5e-3
    and each block's decay 0.1 / factor."""
    import torch.optim._muon as tmuon

    calls = []
    monkeypatch.setattr(tmuon, "muon", lambda params, grads, bufs, **kw: calls.append(
        (params[0].data_ptr(), tuple(params[0].shape), kw["lr"], kw["weight_decay"])))
    model = _mup(128, attention="mla")
    opt = build_optimizer(model, muon_cfg(lr=1e-2, weight_decay=0.1, muon={"ns_dtype": "bfloat16"})).muon
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    attn = model.blocks[0].attn
    got = {}
    for name, lin in (("c_kv_down", attn.c_kv_down), ("c_kv_up", attn.c_kv_up), ("c_q", attn.c_q)):
        ptr, row = lin.weight.data_ptr(), lin.weight.stride(0) * lin.weight.element_size()
        got[name] = [(shape, lr, wd) for p0, shape, lr, wd in calls if ptr <= p0 < ptr + row * lin.weight.shape[0]]
    want = {"c_kv_down": [((64, 128), 5e-3, 0.2), ((4, 128), 2.5e-3, 0.4)],
            "c_kv_up": [((128, 64), 5e-3, 0.2), ((128, 64), 5e-3, 0.2)],
            "c_q": [((192, 128), 5e-3, 0.2)]}
    for name, blocks in want.items():
        assert [s for s, _, _ in got[name]] == [s for s, _, _ in blocks], name
        assert [x for _, lr, wd in got[name] for x in (lr, wd)] == \
            pytest.approx([x for _, lr, wd in blocks for x in (lr, wd)], rel=1e-12), name


# ------------------------------------------------------------------------------------------ Muon's update
@pytest.mark.parametrize("shape", [(64, 32), (32, 96)])
def test_muon_update_is_orthogonalised(shape):
    """One torch.optim.Muon step on a known gradient G = U diag(s) V^T whose singular values span 100x (1 .. 0.01):
    the update is -lr * 0.2 * sqrt(max(A, B)) * O (match_rms_adamw; momentum only rescales G, which the
    iteration normalises away). O's singular values lie in [0.6, 1.25] (Keller Jordan's quintic coefficients after
    5 steps land in ~[0.68, 1.2]; bf16), O points along the polar factor U V^T (cosine >= 0.97), and the update's
    RMS is 0.2 * lr times O's singular-value RMS: the AdamW-like RMS the lr adjustment is named for."""
    A, B = shape
    k = min(A, B)
    g = torch.Generator().manual_seed(0)
    U = torch.linalg.qr(torch.randn(A, k, generator=g, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn(B, k, generator=g, dtype=torch.float64))[0]
    s = torch.logspace(0, -2, k, dtype=torch.float64)
    W = nn.Parameter(torch.zeros(A, B))
    W.grad = ((U * s) @ V.T).float()
    lr = 0.1
    torch.optim.Muon([W], lr=lr, weight_decay=0.0, adjust_lr_fn="match_rms_adamw").step()
    adjusted = {(64, 32): 1.6, (32, 96): 0.2 * math.sqrt(96)}[shape]  # 0.2 * sqrt(max(A, B)), by hand
    O = -W.detach().double() / (lr * adjusted)
    sv = torch.linalg.svdvals(O)
    assert sv.min() > 0.6 and sv.max() < 1.25, sv
    polar = U @ V.T
    assert (O * polar).sum() / (O.norm() * polar.norm()) > 0.97
    rms = W.detach().double().pow(2).mean().sqrt().item()
    assert rms == pytest.approx(0.2 * lr * sv.pow(2).mean().sqrt().item(), rel=1e-4)  # RMS(O) = rms(sv) / sqrt(max)
    assert (s.max() / s.min()).item() == pytest.approx(100) and sv.max() / sv.min() < 2.1  # 100x in, at most ~2x out


def _steps(opt, params, grads):
    for g in grads:
        for p, gp in zip(params, g):
            p.grad = gp.clone()
        opt.step()


def _against_torch_muon(ns_dtype: str):
    """Two matrices (one tall, one wide) stepped 3 times with the same gradients by BlockMuon (each one block, the
    given ns_dtype) and by torch.optim.Muon -> (initial weights, (BlockMuon, its params), (Muon, its params))."""
    g = torch.Generator().manual_seed(1)
    init = [torch.randn(48, 16, generator=g), torch.randn(16, 40, generator=g)]
    grads = [[torch.randn_like(w) for w in init] for _ in range(3)]
    ours = [nn.Parameter(w.clone()) for w in init]
    theirs = [nn.Parameter(w.clone()) for w in init]
    a = BlockMuon([{"params": ours, "blocks": [[(48, 1.0)], [(16, 1.0)]]}], lr=0.02, weight_decay=0.1,
                  adjust_lr_fn="match_rms_adamw", ns_dtype=ns_dtype)
    b = torch.optim.Muon(theirs, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    _steps(a, ours, grads)
    _steps(b, theirs, grads)
    return init, (a, ours), (b, theirs)


def test_block_muon_with_one_block_is_torch_muon():
    """BlockMuon runs PyTorch's own Muon update: with each parameter one block, 3 steps (momentum, Nesterov,
    weight decay) give torch.optim.Muon's weights bit for bit, and the same state_dict layout."""
    init, (a, ours), (b, theirs) = _against_torch_muon("bfloat16")
    assert all(torch.equal(x, y) for x, y in zip(ours, theirs))
    assert all(torch.equal(a.state[x]["momentum_buffer"], b.state[y]["momentum_buffer"]) for x, y in zip(ours, theirs))


def test_float32_newton_schulz_is_torch_muons_update_to_bf16_rounding():
    """ns_dtype=float32 (auto on a CPU without native bf16 matmuls): the same 3 steps as torch.optim.Muon (whose
    Newton-Schulz is bf16): momentum buffers bit for bit, weights within bf16's rounding of the update (5% of the
    three updates' size) and not equal to it (the other path ran)."""
    init, (a, ours), (b, theirs) = _against_torch_muon("float32")
    assert all(torch.equal(a.state[x]["momentum_buffer"], b.state[y]["momentum_buffer"]) for x, y in zip(ours, theirs))
    for x, y, w in zip(ours, theirs, init):
        moved = (y - w).abs().max()  # three updates' size
        gap = (x - y).abs().max()
        assert 0 < gap < 0.05 * moved, (float(gap), float(moved))  # measured 1.1-1.5%


def test_newton_schulz_applies_the_quintic_to_each_singular_value():
    """Known answer from the SVD: for G = U diag(s) V^T, X <- aX + (b XX^T + c (XX^T)^2) X keeps U and V and maps
    each singular value of G / |G|_F through phi(x) = a x + b x^3 + c x^5, `steps` times; in float64 exactly that
    (to rounding), in float32 to 1e-5. Both orientations (the iteration runs on the wide one)."""
    from ablations.optim import newton_schulz

    coeffs = (3.4445, -4.7750, 2.0315)  # Keller Jordan's, torch.optim.Muon's default
    gen = torch.Generator().manual_seed(3)
    for shape in ((24, 10), (10, 24)):
        k = min(shape)
        u, _ = torch.linalg.qr(torch.randn(shape[0], k, generator=gen, dtype=torch.float64))
        v, _ = torch.linalg.qr(torch.randn(shape[1], k, generator=gen, dtype=torch.float64))
        s = torch.logspace(0, -2, k, dtype=torch.float64)  # 1 .. 0.01
        x = s / s.norm()
        for _ in range(5):
            x = coeffs[0] * x + coeffs[1] * x ** 3 + coeffs[2] * x ** 5
        want = u @ torch.diag(x) @ v.T
        got = newton_schulz(u @ torch.diag(s) @ v.T, coeffs, 5, 1e-7, torch.float64)
        assert torch.allclose(got, want, atol=1e-12), float((got - want).abs().max())
        got32 = newton_schulz((u @ torch.diag(s) @ v.T).float(), coeffs, 5, 1e-7, torch.float32)
        assert got32.dtype == torch.float32 and torch.allclose(got32.double(), want, atol=1e-5)


@pytest.mark.parametrize("fn", ["match_rms_adamw", "original"])
def test_lr_ratio_is_torchs(fn):
    from torch.optim._muon import _adjust_lr

    from ablations.optim import lr_ratio

    for shape in ((48, 16), (16, 40), (7, 7), (1, 300)):
        assert lr_ratio(fn, torch.Size(shape)) == pytest.approx(_adjust_lr(1.0, fn, torch.Size(shape)), rel=1e-15)


def test_ns_dtype_auto_follows_the_hardware(monkeypatch):
    """auto: bf16 on CUDA and on a CPU with oneDNN's bf16 matmul, float32 on a CPU without (an AVX2 one); an explicit
    choice is kept; the run records the choice and what it resolved to; a bad value is one line."""
    from ablations import optim

    monkeypatch.setattr(optim, "_cpu_bf16_matmul", lambda: False)
    assert optim.ns_dtype("auto", "cpu") == torch.float32 and optim.ns_dtype("auto", "cuda") == torch.bfloat16
    assert optim.ns_dtype("bfloat16", "cpu") == torch.bfloat16
    assert run_params(build(MUP), muon_cfg(lr=4e-3))["optimizer.muon.ns_dtype"] == "auto: float32"
    assert run_params(build(MUP), muon_cfg(lr=4e-3), "cuda")["optimizer.muon.ns_dtype"] == "auto: bfloat16"
    monkeypatch.setattr(optim, "_cpu_bf16_matmul", lambda: True)
    assert optim.ns_dtype("auto", "cpu") == torch.bfloat16 and optim.ns_dtype("float32", "cpu") == torch.float32
    with pytest.raises(ConfigError, match=r"^invalid optim.muon.ns_dtype='fp8': choose one of auto, bfloat16, "
                                          r"float32 \(auto: bfloat16 where bf16 matmuls are native, else float32\)$"):
        optim.muon_options(muon_cfg(muon={"ns_dtype": "fp8"}))


def test_fused_qkv_is_orthogonalised_per_block():
    """GQA's fused c_attn (q: 32 rows, k: 16, v: 16 at n_embd 32, 2 kv heads) declares three blocks; Muon updates
    each exactly as torch.optim.Muon updates three separate q, k, v matrices (bit for bit, 3 steps), which differs
    from orthogonalising the whole (64, 32) matrix at once."""
    model = build(["attention=gqa"])
    attn = model.blocks[0].attn
    assert attn.fused_blocks() == {"c_attn": (32, 16, 16)}
    w0 = attn.c_attn.weight.detach().clone()
    gen = torch.Generator().manual_seed(2)
    grads = [torch.randn(w0.shape, generator=gen) for _ in range(3)]
    opt = build_optimizer(model, muon_cfg(lr=0.02, muon={"ns_dtype": "bfloat16"})).muon
    fused = attn.c_attn.weight
    for g in grads:
        for p in model.parameters():
            p.grad = None
        fused.grad = g.clone()
        opt.step()
    parts = [nn.Parameter(w.clone()) for w in w0.split([32, 16, 16])]
    ref = torch.optim.Muon(parts, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    _steps(ref, parts, [g.split([32, 16, 16]) for g in grads])
    assert torch.equal(fused.detach(), torch.cat([p.detach() for p in parts]))
    whole = nn.Parameter(w0.clone())
    _steps(torch.optim.Muon([whole], lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"), [whole],
           [[g] for g in grads])
    assert (whole.detach() - fused.detach()).abs().max() > 1e-3


@pytest.mark.parametrize("case, blocks", [
    (["mlp=swiglu"], {"blocks.0.mlp.c_fc.weight": ((88, 32), (88, 32))}),
    (["mlp=geglu"], {"blocks.0.mlp.c_fc.weight": ((88, 32), (88, 32))}),
    (["attention=mqa"], {"blocks.0.attn.c_attn.weight": ((32, 32), (8, 32), (8, 32))}),
    (["attention=mla"], {"blocks.0.attn.c_kv_down.weight": ((16, 32), (4, 32)),
                         "blocks.0.attn.c_kv_up.weight": ((32, 16), (32, 16)),
                         "blocks.0.attn.c_q.weight": ((48, 32),)}),
    (["attention=mla", "attention.rope_dim=0"], {"blocks.0.attn.c_kv_down.weight": ((16, 32),)}),
])
def test_declared_fused_blocks(case, blocks):
    roles = {r.name: r for r in build(case).param_roles()}
    for name, want in blocks.items():
        assert roles[name].blocks == want


def test_a_raw_matrix_needs_a_declared_role():
    """A 2-D parameter that is neither a Linear weight nor an Embedding table has no structural role: the roles
    refuse it in one line until its module declares one."""
    model = build([])
    model.blocks[0].attn.extra = nn.Parameter(torch.zeros(4, 4))
    with pytest.raises(ConfigError, match=r"^parameter blocks.0.attn.extra \(4, 4\) of .* has no role \(None\): "
                                          r"declare it in role_overrides\(\)"):
        model.param_roles()
    model.blocks[0].attn.role_overrides = lambda: {"extra": "vector"}
    assert {r.name: r.role for r in model.param_roles()}["blocks.0.attn.extra"] == "vector"


# ------------------------------------------------------------------------------------------ bad input
class Embeddings(nn.Module):
    """A model with no hidden matrix: one embedding table and a gain."""

    def __init__(self):
        super().__init__()
        self.emb, self.gain = nn.Embedding(10, 4), nn.Parameter(torch.ones(4))

    def param_roles(self):
        return param_roles(self)


@pytest.mark.parametrize("model, o, match", [
    (Embeddings(), muon_cfg(), r"^optim=muon: Embeddings declares no 2-D hidden matrix for Muon to orthogonalise "
                               r"\(only embedding, vector\); use optim=adamw$"),
    (None, {"name": "sgd", "lr": 1e-3}, r"^invalid optim.name='sgd': choose one of adamw, muon"),
    (None, muon_cfg(muon={"adjust_lr_fn": "spectral"}), r"^invalid optim.muon.adjust_lr_fn='spectral': choose one "
                                                        r"of match_rms_adamw, original"),
    (None, muon_cfg(muon={"beta": 0.9}), r"^invalid optim.muon.beta=0.9: unknown key; valid keys are adjust_lr_fn"),
    (None, {"name": "adamw", "lr": -1.0}, r"^optim.lr=-1.0 must be a positive number"),
    (None, {"name": "muon", "lr": "fast"}, r"^optim.lr=fast must be a positive number"),
])
def test_bad_optimizer_config_is_one_line(model, o, match):
    with pytest.raises(ConfigError, match=match) as e:
        build_optimizer(model or GPT(GPTConfig(256, 32, 1, 2, 16)), o)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------ resume, MLflow
def cfg_for(tmp: Path, shakespeare_path, *overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=[
            "model=tiny", "data=shakespeare", f"data.path={shakespeare_path}", "tokenizer=byte", "data.batch_size=4",
            "data.val_windows=8", "trainer.max_steps=8", "trainer.val_check_interval=4", "checkpoint.every_n_steps=4",
            "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "generate.max_new_tokens=4",
            "generate.bench_decode_tokens=2", "optim.warmup_steps=2", f"data.cache_dir={tmp.parent / 'cache'}",
            f"checkpoint.dir={tmp / 'ckpt'}", f"tracking.uri=sqlite:///{tmp}/mlflow.db", *overrides])


def history(tmp: Path, key: str) -> tuple[object, list[tuple[int, float]]]:
    from mlflow import MlflowClient

    c = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    (run,) = c.search_runs([c.get_experiment_by_name("ablations").experiment_id])
    ms = sorted(c.get_metric_history(run.info.run_id, key), key=lambda m: (m.timestamp, m.step))
    return run, [(m.step, m.value) for m in ms]


@pytest.mark.parametrize("overrides", [["optim=adamw"], ["optim=muon", *MUP]], ids=["adamw-sp", "muon-mup"])
@pytest.mark.slow
def test_killed_and_resumed_equals_uninterrupted(tmp_path, shakespeare_path, monkeypatch, overrides):
    """Uninterrupted 8 steps vs. stopped after step 5 (checkpoint at 4) and resumed: the resumed process's steps
    repeat the uninterrupted losses, lrs and final val loss exactly, so both optimizers' states (moments, momentum
    buffers, per-group lrs) and the schedule round-trip through the checkpoint. The run records the optimizer and its groups."""
    from faults import PruneAt
    from optuna import TrialPruned

    from ablations.train import train

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    cut.mkdir()
    train(cfg_for(whole, shakespeare_path, *overrides))
    with pytest.raises(TrialPruned):
        train(cfg_for(cut, shakespeare_path, *overrides), callbacks=[PruneAt(5)])
    train(cfg_for(cut, shakespeare_path, *overrides, "resume=auto"))
    run, ref = history(whole, "train/loss")
    resumed_run, resumed = history(cut, "train/loss")
    assert resumed_run.data.tags["resumed_from_step"] == "4"
    # by step, the latest value (steps 6..8 come from the resumed process), equal to the uninterrupted run's
    assert dict(resumed) == dict(ref) and sorted(dict(ref)) == list(range(1, 9))
    assert dict(history(cut, "lr")[1]) == dict(history(whole, "lr")[1])
    assert dict(history(cut, "val/loss")[1])[8] == dict(history(whole, "val/loss")[1])[8]
    p = run.data.params
    name = "muon" if "optim=muon" in overrides else "adamw"
    assert p["optimizer"] == ("muon+adamw" if name == "muon" else "adamw") and p["optim.name"] == name
    assert int(p["optimizer.groups"]) == sum(k.startswith("optimizer.group.") for k in p)
    if name == "muon":
        assert p["parametrization"] == "mup (base_width 16)" and p["model.parametrization"] == "mup"
        assert p["optimizer.group.2"] == ("muon hidden_matrix: 8 tensors, 24576 params, lr 0.002121 (x0.7071), "
                                          "weight_decay 0.141421")  # 0.1 / 0.7071
    else:
        assert p["parametrization"] == "sp"
        assert p["optimizer.group.0"] == ("adamw embedding+hidden_matrix: 10 tensors, 33792 params, lr 0.003 (x1), "
                                          "weight_decay 0.1")


def test_run_params_name_every_group():
    model = build(MUP)
    p = run_params(model, muon_cfg(lr=4e-3))
    assert p["optimizer"] == "muon+adamw" and p["parametrization"] == "mup (base_width 16)"
    assert p["optimizer.groups"] == "3"
    assert p["optimizer.group.0"] == "adamw embedding: 2 tensors, 9216 params, lr 0.004 (x1), weight_decay 0.1"
    assert p["optimizer.group.1"] == "adamw vector: 5 tensors, 160 params, lr 0.004 (x1), weight_decay 0"
    assert p["optimizer.group.2"] == ("muon hidden_matrix: 8 tensors, 24576 params, lr 0.002828 (x0.7071), "
                                      "weight_decay 0.141421")  # 0.1 / 0.7071: lr * wd as at the base width
