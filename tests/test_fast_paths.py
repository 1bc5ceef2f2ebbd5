"""The fast paths of issue 12 against references outside them: the fused RMSNorm against PyTorch's F.rms_norm and
a float64 gradcheck; grouped-query attention without K/V copies against the textbook softmax(q k^T / sqrt(d) + m) v
with every kv head repeated; blocked sliding-window attention against SDPA under the full banded mask; MLA's
absorbed decoding against its expanded form. The model-level invariants (cached == uncached, padding, causality)
run over every variant in test_model_contract.py; here each fast path is also checked to be the one taken."""
import math

import pytest
import torch
import torch.nn.functional as F

from modules.attention.base import math_attention, sdpa
from modules.attention.sliding import blocked_sliding_attention
from modules.config import GPTConfig
from modules.gpt import GPT
from modules.norms.rmsnorm import rms_norm

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(vocab_size=64, block_size=64, n_layer=2, n_head=4, n_embd=32)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=gen(seed), dtype=dtype)


# ---- RMSNorm ---------------------------------------------------------------------------------------------------
def test_rmsnorm_gradcheck_float64():
    x = randn(3, 5, 16, dtype=torch.float64).requires_grad_()
    w = randn(16, seed=1, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, w, 1e-5), (x, w))


@pytest.mark.parametrize("shape,eps", [((7, 32), 1e-5), ((2, 9, 128), 1e-5), ((2, 3, 5, 16), 0.5)])
def test_rmsnorm_forward_backward_match_torch(shape, eps):
    d = shape[-1]
    x = (3 * randn(*shape)).requires_grad_() if eps < 0.1 else randn(*shape).requires_grad_()
    w = randn(d, seed=1).requires_grad_()
    dy = randn(*shape, seed=2)
    ours = rms_norm(x, w, eps)
    gx, gw = torch.autograd.grad(ours, (x, w), dy)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ref = F.rms_norm(x2, (d,), w2, eps)
    rx, rw = torch.autograd.grad(ref, (x2, w2), dy)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gw, rw)


def test_rmsnorm_bf16_input_computes_in_fp32():
    """q/k norms see bf16 activations under autocast: statistics and gradients are fp32, results bf16."""
    x = randn(6, 64).to(torch.bfloat16).requires_grad_()
    w = randn(64, seed=1).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = rms_norm(x, w, 1e-5)
    assert y.dtype == torch.bfloat16
    dy = randn(6, 64, seed=2).to(torch.bfloat16)
    gx, gw = torch.autograd.grad(y, (x, w), dy)
    assert gx.dtype == torch.bfloat16 and gw.dtype == torch.float32
    xf = x.detach().float().requires_grad_()
    wf = w.detach().clone().requires_grad_()
    ref = F.rms_norm(xf, (64,), wf, 1e-5)
    rx, rw = torch.autograd.grad(ref, (xf, wf), dy.float())
    torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(gx.float(), rx, atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(gw, rw, atol=1e-4, rtol=1e-4)


# ---- GQA / MQA without K/V copies ----------------------------------------------------------------------------
def reference_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(d) + m) v, every kv head repeated for its group of query heads."""
    g = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    if mask is None:
        T, S = q.size(2), k.size(2)
        mask = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("nkv", [1, 2, 4])
@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("kind", ["causal", "bool", "bias"])
def test_grouped_sdpa_matches_repeated_heads(nkv, T, kind):
    B, nh, S, hs = 2, 4, 9 if kind != "causal" else 5, 8
    S = T if kind == "causal" else S
    q, k, v = randn(B, nh, T, hs), randn(B, nkv, S, hs, seed=1), randn(B, nkv, S, hs, seed=2)
    mask = None
    if kind == "bool":  # padding keys and causality, as the GPT builds them: (B, 1, T, S)
        mask = torch.rand(B, 1, T, S, generator=gen(3)) > 0.3
        mask[..., -1] = True  # every row sees at least one key
    elif kind == "bias":  # a per-head float bias with -inf holes: (B, nh, T, S)
        mask = randn(B, nh, T, S, seed=4).masked_fill(torch.rand(B, nh, T, S, generator=gen(5)) > 0.7, float("-inf"))
        mask[..., -1] = 0.0
    torch.testing.assert_close(sdpa(q, k, v, mask, 0.0), reference_attention(q, k, v, mask))


def test_gqa_never_repeats_kv():
    """The point of GQA: no (B, nh, S, hs) copy of K or V, in decoding or training."""
    model = GPT(GPTConfig(**TINY, attention={"name": "gqa", "n_kv_head": 2})).eval()
    with torch.no_grad(), torch.profiler.profile() as prof:
        cache = model.new_cache(1)
        model(torch.randint(0, 64, (1, 8), generator=gen(0)), cache=cache)
        model(torch.randint(0, 64, (1, 1), generator=gen(1)), cache=cache)
    ops = {e.key for e in prof.key_averages()}
    assert not {"aten::repeat_interleave", "aten::repeat"} & ops


# ---- sliding window: O(T * W) blocks ----------------------------------------------------------------------------
def band_mask(T, W):
    i = torch.arange(T)
    return (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < W)  # (T, T)


@pytest.mark.parametrize("T,W", [(5, 8), (8, 8), (9, 8), (13, 7), (16, 8), (16, 4), (17, 8), (23, 4), (30, 7),
                                 (12, 1)])
@pytest.mark.parametrize("nkv", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_blocked_sliding_matches_banded_sdpa(T, W, nkv, dtype):
    """Every path of the window (plain causal for T <= W, one call under the band up to 2W, blocks past it) against
    the textbook attention under the band mask typed here, forward and backward."""
    B, nh, hs = 2, 4, 8
    q = randn(B, nh, T, hs, dtype=dtype).requires_grad_()
    k = randn(B, nkv, T, hs, seed=1, dtype=dtype).requires_grad_()
    v = randn(B, nkv, T, hs, seed=2, dtype=dtype).requires_grad_()
    ours = blocked_sliding_attention(q, k, v, W, 0.0)
    ref = reference_attention(q, k, v, band_mask(T, W))
    torch.testing.assert_close(ours, ref)
    dy = randn(B, nh, T, hs, seed=3, dtype=dtype)
    for a, b in zip(torch.autograd.grad(ours, (q, k, v), dy), torch.autograd.grad(ref, (q, k, v), dy)):
        torch.testing.assert_close(a, b)


def sliding(W=4, **kw):
    torch.manual_seed(0)
    attention = {"name": "sliding", "window": W, **kw}
    return GPT(GPTConfig(**{**TINY, "attention": attention, "position": "rope"})).eval()


def test_sliding_model_takes_the_blocked_path_and_matches_the_mask_path():
    """Without padding the GPT builds no (T, S) mask and the window is applied blockwise; explicit position ids
    take the banded-mask path instead. Both must give the same logits, and so must a cached prefill."""
    model = sliding(W=4, n_kv_head=2)
    idx = torch.randint(0, 64, (2, 19), generator=gen(0))
    pos = torch.arange(19).expand(2, 19)
    valid = torch.ones(2, 19, dtype=torch.bool)
    assert model._attn_mask(pos, valid, None, padded=False, consecutive=True) is None
    assert model._attn_mask(pos, valid, None, padded=False, consecutive=False) is not None
    with torch.no_grad():
        fast = model(idx)
        masked = model(idx, position_ids=pos)
        prefill = model(idx, cache=model.new_cache(2))
    torch.testing.assert_close(fast, masked)
    torch.testing.assert_close(prefill, masked)


def test_sliding_fast_path_falls_back_for_padding_and_other_windows():
    model = sliding(W=4)
    pos = torch.arange(10).expand(2, 10)
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[0, :3] = False
    assert model._attn_mask(pos, valid, None, padded=True, consecutive=True) is not None
    full = valid | True
    assert model._attn_mask(pos, full, None, padded=False, window=6, consecutive=True) is not None
    alibi = GPT(GPTConfig(**TINY, attention={"name": "sliding", "window": 4}, position="alibi")).eval()
    assert alibi._attn_mask(pos, full, None, padded=False, consecutive=True) is not None
    # a left-padded row computes what the row computes alone (the mask path, position-distance window)
    idx = torch.randint(0, 64, (2, 10), generator=gen(1))
    with torch.no_grad():
        batch = model(idx, attention_mask=valid.long())
        alone = model(idx[:1, 3:])
    torch.testing.assert_close(batch[0, 3:], alone[0])


# ---- MLA: absorbed decoding -------------------------------------------------------------------------------------
def decode_both_ways(model, prompt, mask, steps=3):
    """Prefill, then decode `steps` tokens with the absorbed form and, on a copy of the cache path, expanded."""
    B = prompt.size(0)
    out = {}
    for absorbed in (True, False):
        for block in model.blocks:
            block.attn.absorbs = (lambda T, cache: cache is not None and T == 1) if absorbed else \
                (lambda T, cache: False)
        cache = model.new_cache(B)
        logits = []
        with torch.no_grad():
            model(prompt, attention_mask=mask, cache=cache)
            for s in range(steps):
                tok = torch.randint(0, 64, (B, 1), generator=gen(10 + s))
                logits.append(model(tok, attention_mask=torch.ones(B, 1, dtype=torch.long), cache=cache))
        out[absorbed] = torch.cat(logits, dim=1)
    for block in model.blocks:
        del block.attn.absorbs
    return out[True], out[False]


@pytest.mark.parametrize("kw", [
    dict(position="rope"),
    dict(position="alibi", bias=True),
    dict(position="learned", attention={"name": "mla", "latent_norm": True, "kv_latent_dim": 12, "rope_dim": 0}),
    dict(position="t5bias", attention={"name": "mla", "rope_dim": 4}, bias=True),
])
def test_mla_absorbed_decode_matches_expanded(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY, "attention": "mla", **kw})).eval()
    with torch.no_grad():  # the GPT initialises biases to 0; the absorbed form must handle any
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
    prompt = torch.randint(0, 64, (2, 7), generator=gen(0))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, :3] = 0  # a left-padded row: padding keys must stay invisible in the absorbed form too
    absorbed, expanded = decode_both_ways(model, prompt, mask)
    torch.testing.assert_close(absorbed, expanded, atol=1e-5, rtol=1e-5)


def test_mla_absorbs_only_where_it_is_exact():
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**TINY, attention="mla")).eval()
    qk = GPT(GPTConfig(**TINY, attention="mla", norm={"name": "layernorm", "qk_norm": True})).eval()
    cache = plain.new_cache(1)
    assert plain.blocks[0].attn.absorbs(1, cache)
    assert not plain.blocks[0].attn.absorbs(5, cache)  # prefill/training: expanded
    assert not plain.blocks[0].attn.absorbs(1, None)
    assert not qk.blocks[0].attn.absorbs(1, cache)  # the k norm sits after the up-projection


# ---- MLA's attention on the CPU: q and k wider than v ------------------------------------------------------------
@pytest.mark.parametrize("kind", ["causal", "bool", "bias"])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_math_attention_matches_sdpa_in_float64(kind, scale):
    """The written-out attention MLA's widths take on the CPU against PyTorch's SDPA (its math path: different q/k
    and v widths), forward and every input's gradient, under each mask `sdpa` accepts."""
    B, nh, T, d, dv = 2, 3, 6, 12, 8
    S = T if kind == "causal" else 9
    q, k, v = (randn(B, nh, n, w, seed=i, dtype=torch.float64).requires_grad_()
               for i, (n, w) in enumerate([(T, d), (S, d), (S, dv)]))
    mask = None
    if kind == "bool":
        mask = torch.rand(B, 1, T, S, generator=gen(3)) > 0.4
        mask[..., 0] = True
    elif kind == "bias":
        mask = randn(B, nh, T, S, seed=4, dtype=torch.float64)
        mask = mask.masked_fill(torch.rand(B, nh, T, S, generator=gen(5)) > 0.7, float("-inf"))
        mask[..., 0] = 0.0
    ref_mask = mask if mask is None or mask.dtype == torch.bool else mask.clone()
    got = math_attention(q, k, v, mask, 0.0, scale)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=ref_mask, is_causal=mask is None, scale=scale)
    torch.testing.assert_close(got, want)
    g = randn(B, nh, T, dv, seed=6, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g))


def test_math_attention_drops_attention_weights():
    q, k, v = randn(1, 2, 4, 6), randn(1, 2, 4, 6, seed=1), randn(1, 2, 4, 4, seed=2)
    assert torch.equal(math_attention(q, k, v, None, 1.0), torch.zeros(1, 2, 4, 4))  # every weight dropped


def test_mla_trains_on_the_cpu_through_math_attention(monkeypatch):
    """SDPA's CPU flash kernel needs one width: MLA's q and k (hs + dr) against v (hs) take the written-out form,
    in fp32 under bf16 autocast as `sdpa` computes attention on the CPU; equal widths (rope_dim 0) keep SDPA."""
    import modules.attention.base as base
    widths, real = [], base.math_attention

    def spy(q, k, v, *rest):
        widths.append((q.size(-1), q.dtype))
        return real(q, k, v, *rest)

    monkeypatch.setattr(base, "math_attention", spy)
    idx = torch.randint(0, 64, (2, 16), generator=gen(0))
    for rope_dim, calls in ((4, [(12, torch.float32)] * 2), (0, [])):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**TINY, attention={"name": "mla", "rope_dim": rope_dim}))
        widths.clear()
        with torch.autocast("cpu", torch.bfloat16):
            model(idx).float().sum().backward()
        assert widths == calls


# ---------------------------------------------------------------------------------------------------- rope
def rope_tables(B, T, half, dtype, seed):
    angles = (torch.arange(T, dtype=dtype)[None, None, :, None] + 3.0) * (1 + randn(B, 1, 1, half, seed=seed,
                                                                                     dtype=dtype))
    return angles.cos(), angles.sin()  # (B, 1, T, d/2), different per sample and pair


def rotated_by_matrix(x, cos, sin):
    """Each pair (x_i, x_{i+d/2}) times the 2x2 rotation [[cos, -sin], [sin, cos]], written out as matrices."""
    half = x.size(-1) // 2
    pair = torch.stack((x[..., :half], x[..., half:]), dim=-1).unsqueeze(-1)  # (..., d/2, 2, 1)
    rot = torch.stack((torch.stack((cos, -sin), -1), torch.stack((sin, cos), -1)), -2)  # (..., d/2, 2, 2)
    out = (rot @ pair).squeeze(-1)  # (..., d/2, 2)
    return torch.cat((out[..., 0], out[..., 1]), dim=-1)


@pytest.mark.parametrize("fused", [True, False])
def test_rope_forward_and_backward_match_the_rotation_matrix_in_float64(fused):
    from modules.positions.base import apply_rotary

    B, nh, T, hs = 2, 3, 5, 8
    qkv = randn(B, T, 3 * nh * hs, seed=1, dtype=torch.float64)
    x = qkv[..., nh * hs:2 * nh * hs].view(B, T, nh, hs).transpose(1, 2)  # a strided view, as attention's k
    cos, sin = rope_tables(B, T, hs // 2, torch.float64, seed=2)
    dy = randn(B, nh, T, hs, seed=3, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = apply_rotary(xa, (cos, sin), fused=fused)
    ref = rotated_by_matrix(xb, cos, sin)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    out.backward(dy)
    ref.backward(dy)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: apply_rotary(t, (cos, sin), fused=fused), (xa.detach().clone()
                                                                                           .requires_grad_(),))


def test_rope_fused_matches_the_formula_in_bf16():
    # under bf16 autocast q and k are bf16: both paths rotate in fp32 and round once to bf16
    from modules.positions.base import apply_rotary

    x = (4 * randn(2, 4, 16, 32, seed=4)).bfloat16().requires_grad_()
    cos, sin = rope_tables(2, 16, 16, torch.float32, seed=5)
    dy = randn(2, 4, 16, 32, seed=6).bfloat16()
    outs, grads = [], []
    for fused in (True, False):
        xi = x.detach().clone().requires_grad_()
        out = apply_rotary(xi, (cos, sin), fused=fused)
        out.backward(dy)
        outs.append(out)
        grads.append(xi.grad)
    assert outs[0].dtype == grads[0].dtype == torch.bfloat16
    torch.testing.assert_close(outs[0], outs[1], rtol=8e-3, atol=1e-2)
    torch.testing.assert_close(grads[0], grads[1], rtol=8e-3, atol=1e-2)


def test_rope_model_takes_the_fused_path_in_eager(monkeypatch):
    """Eager on CPU the rotation is the C++ kernel's (modules/kernels/rotary.py), q and k of every layer; in float64,
    or with the kernel off, `_Rotate` (PyTorch ops)."""
    from modules.kernels import rotary as rotary_kernel
    from modules.positions import base as positions

    calls = {"kernel": 0, "ops": 0}
    real, ops = positions._Rotate.apply, rotary_kernel.kernel()

    class Counting:
        def rotary(self, *a):
            calls["kernel"] += 1
            return ops.rotary(*a)

    monkeypatch.setattr(positions._Rotate, "apply", lambda *a: calls.__setitem__("ops", calls["ops"] + 1) or real(*a))
    monkeypatch.setitem(rotary_kernel.KERNEL.built, "module", Counting())
    model = GPT(GPTConfig(**{**TINY, "position": "rope"}))
    idx = torch.randint(0, 64, (2, 8))
    model(idx)
    assert calls == {"kernel": 2 * TINY["n_layer"], "ops": 0}  # q and k of every layer
    model.double()(idx)
    assert calls == {"kernel": 2 * TINY["n_layer"], "ops": 2 * TINY["n_layer"]}
    monkeypatch.setitem(rotary_kernel.KERNEL.built, "module", None)  # off, or not built
    model.float()(idx)
    assert calls == {"kernel": 2 * TINY["n_layer"], "ops": 4 * TINY["n_layer"]}


# ---- GELU (tanh form) under torch.compile -----------------------------------------------------------------------
def traced_by_dynamo(fn, *args):
    """fn(*args) as torch.compile traces it (dynamo only, no inductor: cheap), with the ops of the traced graph."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    out = torch.compile(fn, backend=record, fullgraph=True)(*args)
    return out, [node.target for gm in graphs for node in gm.graph.nodes if node.op == "call_function"]


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_as_compiled_matches_torch_in_float64(approximate):
    from modules.mlps.base import gelu

    torch._dynamo.reset()
    x = (3 * randn(4, 7, 24, seed=7, dtype=torch.float64)).requires_grad_()
    dy = randn(4, 7, 24, seed=8, dtype=torch.float64)
    out, ops = traced_by_dynamo(lambda t: gelu(t, approximate), x)
    # the tanh form is rewritten as a sigmoid when compiled; the erf form stays F.gelu
    assert (torch.sigmoid in ops) == (approximate == "tanh") and (F.gelu in ops) == (approximate == "none")
    xr = x.detach().clone().requires_grad_()
    ref = F.gelu(xr, approximate=approximate)  # PyTorch's own GELU: the reference
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    (gx,) = torch.autograd.grad(out, x, dy)
    (rx,) = torch.autograd.grad(ref, xr, dy)
    torch.testing.assert_close(gx, rx, rtol=1e-12, atol=1e-12)
    assert torch.equal(gelu(xr, approximate), ref)  # eager: ATen's kernel itself


@pytest.mark.parametrize("mlp", ["gelu", "geglu"])
def test_gelu_mlps_take_the_compiled_form_under_compile(mlp):
    torch._dynamo.reset()
    model = GPT(GPTConfig(**{**TINY, "mlp": mlp}))
    idx = torch.randint(0, 64, (2, 8), generator=gen(9))
    out, ops = traced_by_dynamo(model, idx)
    assert torch.sigmoid in ops and F.gelu not in ops
    torch.testing.assert_close(out, model(idx), rtol=1e-5, atol=1e-5)


# ---- DyT's tanh under torch.compile on CPU ---------------------------------------------------------------------
def test_dyt_as_compiled_matches_tanh_in_float64():
    """Compiled on CPU, DyT's tanh(alpha x) is 2 sigmoid(2 alpha x) - 1 (modules/norms/dyt.py): against torch.tanh
    in float64, the output and the gradients of x, alpha, weight and bias; eager it is torch.tanh itself."""
    torch._dynamo.reset()
    norm = GPT(GPTConfig(**{**TINY, "norm": "dyt"})).blocks[0].ln_1.double()
    with torch.no_grad():
        norm.alpha.fill_(0.8)
        norm.weight.copy_(randn(32, seed=10, dtype=torch.float64))
        norm.bias.copy_(randn(32, seed=11, dtype=torch.float64))
    x = (3 * randn(4, 7, 32, seed=12, dtype=torch.float64)).requires_grad_()
    dy = randn(4, 7, 32, seed=13, dtype=torch.float64)
    out, ops = traced_by_dynamo(norm, x)
    assert torch.sigmoid in ops and torch.tanh not in ops
    params = [x, norm.alpha, norm.weight, norm.bias]
    ref = torch.tanh(norm.alpha * x) * norm.weight + norm.bias  # eq. 1 of Zhu et al. 2025, written here
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(torch.autograd.grad(out, params, dy), torch.autograd.grad(ref, params, dy)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(norm(x), ref)  # eager: torch.tanh


def test_dyt_compiled_form_in_fp32_is_within_its_stated_error():
    """The docstring's bound: in fp32 the sigmoid form is off tanh (float64) by at most ~2e-7, absolute, from the
    saturated tails through 0."""
    torch._dynamo.reset()
    norm = GPT(GPTConfig(**{**TINY, "norm": "dyt"})).blocks[0].ln_1
    with torch.no_grad():
        norm.alpha.fill_(1.0)
    z = torch.linspace(-20, 20, 100_001).unsqueeze(-1).expand(-1, 32)
    out, _ = traced_by_dynamo(norm, z)
    assert (out.double() - torch.tanh(z.double())).abs().max().item() < 2.5e-7


def test_dyt_model_takes_the_compiled_form_under_compile():
    torch._dynamo.reset()
    model = GPT(GPTConfig(**{**TINY, "norm": "dyt"}))
    idx = torch.randint(0, 64, (2, 8), generator=gen(9))
    out, ops = traced_by_dynamo(model, idx)
    assert torch.sigmoid in ops and torch.tanh not in ops
    torch.testing.assert_close(out, model(idx), rtol=1e-5, atol=1e-5)


# ---- rope's tables for positions from zero ------------------------------------------------------------------------
def test_rope_table_rows_are_cos_and_sin_of_position_times_frequency():
    model = GPT(GPTConfig(**{**TINY, "position": "rope"}))
    T, half = 48, TINY["n_embd"] // TINY["n_head"] // 2
    cos, sin = model.position.rotary(torch.arange(T)[None], from_zero=True)
    assert cos.shape == sin.shape == (1, 1, T, half) and cos.data_ptr() == model.position.cos_table.data_ptr()
    # RoFormer's angles: position p times theta_i = 10000^(-2i/d), i < d/2, written out in float64
    p = torch.arange(T, dtype=torch.float64)[:, None]
    theta = 10000.0 ** (-2 * torch.arange(half, dtype=torch.float64) / (2 * half))
    torch.testing.assert_close(cos[0, 0].double(), torch.cos(p * theta), rtol=0, atol=2e-6)
    torch.testing.assert_close(sin[0, 0].double(), torch.sin(p * theta), rtol=0, atol=2e-6)


def test_gpt_reads_rope_tables_only_for_positions_from_zero(monkeypatch):
    from modules.positions.rope import RotaryPosition

    model = GPT(GPTConfig(**{**TINY, "position": "rope"})).eval()
    computed = []
    real = RotaryPosition._angles
    monkeypatch.setattr(RotaryPosition, "_angles", lambda self, pos: computed.append(pos.clone()) or real(self, pos))
    idx = torch.randint(0, 64, (2, 12), generator=gen(10))
    with torch.no_grad():
        full = model(idx)  # training's call: the table
        assert computed == []
        padded = model(idx, attention_mask=torch.tensor([[0] * 3 + [1] * 9, [1] * 12]))  # left padding: computed
        assert len(computed) == 1 and computed[0][0, 3].item() == 0
        cache = model.new_cache(2)
        model(idx[:, :7], cache=cache)  # a cache: computed, even from position 0
        step = model(idx[:, 7:8], cache=cache)
        assert len(computed) == 3 and computed[-1].tolist() == [[7], [7]]
    torch.testing.assert_close(step[:, -1], full[:, 7], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded[1], full[1], rtol=1e-5, atol=1e-5)
    bf16 = GPT(GPTConfig(**{**TINY, "position": "rope"})).to(torch.bfloat16)  # its tables lost the mantissa
    before = len(computed)  # (building it computed its tables)
    with torch.no_grad():
        bf16(idx)
    assert len(computed) == before + 1


# ---- one row's bias for positions from zero (alibi, t5bias) ------------------------------------------------------
@pytest.mark.parametrize("position", ["alibi", "t5bias"])
def test_bias_of_one_row_for_positions_from_zero_matches_every_rows_own(position, monkeypatch):
    model = GPT(GPTConfig(**{**TINY, "position": position}))
    masks = []
    real = GPT._attn_mask
    monkeypatch.setattr(GPT, "_attn_mask", lambda self, *a: masks.append(real(self, *a)) or masks[-1])
    idx = torch.randint(0, 64, (3, 16), generator=gen(11))
    fast = model(idx)  # positions from zero: one row's bias, broadcast over the batch
    assert masks[-1].shape == (1, TINY["n_head"], 16, 16)
    fast.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    rows = model(idx, position_ids=torch.arange(16).expand(3, 16))  # the same positions, given: a bias per row
    assert masks[-1].shape == (3, TINY["n_head"], 16, 16)
    torch.testing.assert_close(masks[0].expand(3, -1, -1, -1), masks[-1])
    torch.testing.assert_close(fast, rows, rtol=1e-6, atol=1e-6)
    rows.square().mean().backward()
    for n, p in model.named_parameters():  # t5bias's learned table included: its gradient sums over the batch
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-5, atol=1e-7, msg=n)
    # one query per row under grouped heads (sdpa's decoding form) takes the one-row bias too
    gqa = GPT(GPTConfig(**{**TINY, "position": position}, attention={"name": "gqa", "n_kv_head": 2}))
    one = idx[:, :1]
    torch.testing.assert_close(gqa(one), gqa(one, position_ids=torch.zeros(3, 1, dtype=torch.long)))
    assert masks[-2].shape == (1, TINY["n_head"], 1, 1) and masks[-1].shape == (3, TINY["n_head"], 1, 1)
