"""Known answers for what no library implements as we use it, computed independently of our code: formulas and
tables typed from the papers, PyTorch's own ops, and plain-Python arithmetic (math, complex numbers).

Each test reads the component through a built GPT (model.position, model.ln_f, a block's norm), so it checks what
the model actually runs.
"""
import cmath
import math

import pytest
import torch
import torch.nn.functional as F

from modules.config import GPTConfig
from modules.gpt import GPT
from modules.positions import apply_rotary

pytestmark = pytest.mark.usefixtures("one_thread")


def gpt(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**dict(vocab_size=32, block_size=64, n_layer=1, n_head=4, n_embd=16), **kw})).eval()


# ------------------------------------------------------------------------------------------------ sinusoidal
def test_sinusoidal_table_is_vaswani_et_al():
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (Vaswani et al. 2017, 3.5),
    scaled by the documented 0.02 * sqrt(2) (each dimension then has RMS 0.02, like GPT-2's embeddings)."""
    d = 16
    model = gpt(position="sinusoidal", n_embd=d)
    pos = torch.arange(50)[None]  # (1, T)
    pe = model.position.add_to_embedding(torch.zeros(1, 50, d), pos)[0]  # (T, d)
    scale = 0.02 * math.sqrt(2)
    for p in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert pe[p, 2 * i].item() == pytest.approx(scale * math.sin(angle), abs=1e-7)
            assert pe[p, 2 * i + 1].item() == pytest.approx(scale * math.cos(angle), abs=1e-7)


# ---------------------------------------------------------------------------------------------------- alibi
# Press et al. 2022, section 3: for n heads the slopes are the geometric sequence starting at 2^(-8/n) with ratio
# 2^(-8/n): for 8 heads 1/2^1 ... 1/2^8. For a head count that is not a power of two (their code, referenced in
# the paper): the 8 slopes of the closest lower power of two, then every other slope of the next one (16 heads:
# 1/2^0.5, 1/2^1, 1/2^1.5, ...), starting with the first: 1/2^0.5, 1/2^1.5, 1/2^2.5, 1/2^3.5 for 12 heads.
ALIBI_SLOPES = {
    8: [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256],
    12: [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256,
         2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5],
}


@pytest.mark.parametrize("n_head", [8, 12])
def test_alibi_slopes_are_press_et_al(n_head):
    model = gpt(position="alibi", n_head=n_head, n_embd=4 * n_head)
    pos_q, pos_k = torch.tensor([[5]]), torch.tensor([[0, 2, 4, 5]])
    bias = model.position.attn_bias(pos_q, pos_k)  # (1, nh, 1, 4): -slope * distance
    for h, m in enumerate(ALIBI_SLOPES[n_head]):
        assert bias[0, h, 0].tolist() == pytest.approx([-5 * m, -3 * m, -1 * m, 0.0], abs=1e-7)


# ----------------------------------------------------------------------------------------------------- rope
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rope_is_complex_multiplication(base):
    """RoPE (Su et al. 2021) in the half-split layout: dimensions (i, i + d/2) form z_i = x_i + j x_{i+d/2},
    rotated by z_i * exp(j * pos * base^(-2i/d)); the score q.k then depends only on the offset."""
    hs = 8
    model = gpt(position={"name": "rope", "base": base}, n_head=2, n_embd=2 * hs)
    x = torch.randn(1, 1, 5, hs, generator=torch.Generator().manual_seed(0))  # (B, nh, T, hs)
    pos = torch.tensor([[0, 1, 3, 17, 60]])
    out = apply_rotary(x, model.position.rotary(pos))
    for t, p in enumerate(pos[0].tolist()):
        for i in range(hs // 2):
            z = complex(x[0, 0, t, i].item(), x[0, 0, t, i + hs // 2].item())
            w = z * cmath.exp(1j * p * base ** (-2 * i / hs))
            assert out[0, 0, t, i].item() == pytest.approx(w.real, abs=1e-5)
            assert out[0, 0, t, i + hs // 2].item() == pytest.approx(w.imag, abs=1e-5)


# -------------------------------------------------------------------------------------------------- rmsnorm
@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_rmsnorm_equals_torch_rms_norm(eps):
    """Against F.rms_norm, on activations small enough (RMS ~0.01, mean square ~1e-4) that eps moves the result
    by several percent: dropping eps, or normalising by mean |x|, is far outside the tolerance."""
    model = gpt(norm={"name": "rmsnorm", "eps": eps})
    norm = model.ln_f
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(16, generator=torch.Generator().manual_seed(1)))
    x = 0.01 * torch.randn(4, 7, 16, generator=torch.Generator().manual_seed(2))
    expected = F.rms_norm(x, (16,), norm.weight, eps)
    assert torch.allclose(norm(x), expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------------ dyt
def test_dyt_is_zhu_et_al():
    """DyT(x) = gamma * tanh(alpha * x) + beta (Zhu et al. 2025, eq. 1), alpha a learnable scalar initialised to
    0.5, gamma per channel initialised to 1, beta to 0; checked element by element with math.tanh."""
    model = gpt(norm="dyt")
    norm = model.blocks[0].ln_1
    assert norm.alpha.numel() == 1 and norm.alpha.item() == 0.5
    assert torch.equal(norm.weight, torch.ones(16)) and torch.equal(norm.bias, torch.zeros(16))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        norm.alpha.fill_(0.8)
        norm.weight.copy_(torch.randn(16, generator=g))
        norm.bias.copy_(torch.randn(16, generator=g))
    x = 3 * torch.randn(2, 3, 16, generator=g)
    y = norm(x)
    for idx in [(0, 0, 0), (0, 2, 5), (1, 1, 15), (1, 2, 8)]:
        c = idx[-1]
        want = norm.weight[c].item() * math.tanh(0.8 * x[idx].item()) + norm.bias[c].item()
        assert y[idx].item() == pytest.approx(want, abs=1e-6)


# ------------------------------------------------------------------------------------------------ scalenorm
def test_scalenorm_is_nguyen_and_salazar():
    """ScaleNorm(x; g) = g * x / ||x|| (Nguyen & Salazar 2019, "Transformers without Tears", eq. 5), one learned
    scalar g initialised to sqrt(d); checked element by element with math.sqrt over the row. eps bounds ||x|| from
    below, as the authors' code clamps it: a row of norm 1e-7 is divided by eps=1e-5 instead."""
    model = gpt(norm="scalenorm")
    norm = model.blocks[0].ln_1
    assert norm.g.numel() == 1 and norm.g.item() == pytest.approx(4.0)  # sqrt(16)
    assert sum(p.numel() for p in norm.parameters()) == 1
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        norm.g.fill_(1.7)
    x = 3 * torch.randn(2, 3, 16, generator=g)
    x[1, 2] = 1e-7 / 4 * torch.ones(16)  # ||row|| = 1e-7 < eps
    y = norm(x)
    for idx in [(0, 0, 0), (0, 2, 5), (1, 1, 15), (1, 0, 8)]:
        length = math.sqrt(sum(v * v for v in x[idx[:-1]].tolist()))
        assert y[idx].item() == pytest.approx(1.7 * x[idx].item() / length, rel=1e-5)
    assert y[1, 2, 3].item() == pytest.approx(1.7 * 1e-7 / 4 / 1e-5, rel=1e-5)


# ---------------------------------------------------------------------------------------------------- t5 bias
# T5's causal buckets (Raffel et al. 2020; bidirectional=False): half the buckets (16 of 32) hold distances 0..15
# exactly, the other 16 are log-spaced up to max_distance=128: bucket(n) = 16 + floor(ln(n/16) / ln(128/16) * 16),
# capped at 31. Worked by hand: n=17 -> 16 + floor(0.466) = 16; 20 -> 16 + floor(1.717) = 17;
# 24 -> 16 + floor(3.120) = 19; 32 -> 16 + floor(5.333) = 21; 45 -> 16 + floor(7.956) = 23;
# 46 -> 16 + floor(8.126) = 24; 64 -> 16 + floor(10.667) = 26; 127 -> 16 + floor(15.94) = 31; 128 and 1000 -> 31.
T5_BUCKETS = {0: 0, 1: 1, 7: 7, 15: 15, 16: 16, 17: 16, 20: 17, 24: 19, 32: 21, 45: 23, 46: 24, 64: 26,
              127: 31, 128: 31, 1000: 31}


def test_t5_bias_buckets_and_lookup_are_raffel_et_al():
    model = gpt(position={"name": "t5bias", "num_buckets": 32, "max_distance": 128}, block_size=2048)
    table = model.position.rel_bias.weight  # (num_buckets, nh)
    with torch.no_grad():
        table.copy_(torch.randn(table.shape, generator=torch.Generator().manual_seed(4)))
    dists = list(T5_BUCKETS)
    q = 1000
    bias = model.position.attn_bias(torch.tensor([[q]]), torch.tensor([[q - n for n in dists]]))  # (1, nh, 1, K)
    for j, n in enumerate(dists):
        assert bias[0, :, 0, j].tolist() == pytest.approx(table[T5_BUCKETS[n]].tolist(), abs=0), n


def test_t5_buckets_agree_with_transformers_t5():
    from transformers.models.t5.modeling_t5 import T5Attention

    model = gpt(position={"name": "t5bias", "num_buckets": 32, "max_distance": 128}, block_size=2048)
    with torch.no_grad():
        model.position.rel_bias.weight.copy_(torch.arange(32.0)[:, None].expand(32, 4))  # value = bucket index
    n = torch.arange(0, 1500)
    ours = model.position.attn_bias(torch.tensor([[1499]]), (1499 - n)[None])[0, 0, 0].long()
    theirs = T5Attention._relative_position_bucket(-n, bidirectional=False, num_buckets=32, max_distance=128)
    assert torch.equal(ours, theirs)
