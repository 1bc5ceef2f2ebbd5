"""RoPE context scaling (position.scaling): the frequency formulas typed from the papers, checked against
transformers' ROPE_INIT_FUNCTIONS as an outside reference, plus the config rules and what the model does with them."""
import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from modules.errors import ConfigError
from modules.config import GPTConfig
from modules.gpt import GPT
from modules.positions.rope import rope_inv_freq

pytestmark = pytest.mark.usefixtures("one_thread")

D, BASE = 32, 10000.0  # rotary width (head size 32) and base used throughout


def theta(i, d=D, base=BASE):
    """Su et al. 2021: pair i turns base^(-2i/d) radians per position."""
    return base ** (-2 * i / d)


def hf(rope_type, seq_len=None, **params):
    """transformers' inverse frequencies and attention factor for a Llama with head size D."""
    cfg = LlamaConfig(hidden_size=4 * D, num_attention_heads=4, max_position_embeddings=64,
                      rope_parameters={"rope_type": rope_type, "rope_theta": BASE, **params})
    kw = {} if seq_len is None else {"seq_len": seq_len}
    inv_freq, factor = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", **kw)
    return inv_freq.double(), float(factor)


def ours(**scaling):
    inv_freq, factor = rope_inv_freq(D, BASE, {**{"beta_fast": 32.0, "beta_slow": 1.0}, **scaling}
                                     if scaling.get("name") == "yarn" else scaling)
    return inv_freq.double(), factor


def test_unscaled_frequencies_are_su_et_al():
    inv_freq, factor = rope_inv_freq(D, BASE, None)
    assert factor == 1.0
    torch.testing.assert_close(inv_freq.double(), torch.tensor([theta(i) for i in range(D // 2)], dtype=torch.float64))


def test_linear_is_position_interpolation():
    """Chen et al. 2023: position m is mapped to m / s, i.e. every frequency is divided by s."""
    inv_freq, factor = ours(name="linear", factor=4)
    torch.testing.assert_close(inv_freq, torch.tensor([theta(i) / 4 for i in range(D // 2)], dtype=torch.float64))
    assert factor == 1.0
    ref, ref_factor = hf("linear", factor=4.0)
    torch.testing.assert_close(inv_freq, ref, rtol=1e-6, atol=0)
    assert ref_factor == factor
    # in the model: the angles at position m equal the unscaled angles at m / 4
    linear4 = {"name": "rope", "scaling": {"name": "linear", "factor": 4}}
    model = GPT(GPTConfig(64, 32, 1, 4, 4 * D, position=linear4))
    plain = GPT(GPTConfig(64, 32, 1, 4, 4 * D, position="rope"))
    cos, sin = model.position.rotary(torch.tensor([[8, 20, 100]]))
    angles = torch.tensor([[2.0, 5.0, 25.0]])[:, None, :, None] * plain.position.inv_freq
    torch.testing.assert_close(cos, angles.cos())
    torch.testing.assert_close(sin, angles.sin())


def test_ntk_aware_base():
    """bloc97 2023: base' = base * s^(d/(d-2)): the fastest pair is unchanged, the slowest is divided by exactly s."""
    s = 4
    inv_freq, factor = ours(name="ntk", factor=s)
    new_base = BASE * s ** (D / (D - 2))
    torch.testing.assert_close(inv_freq, torch.tensor([theta(i, base=new_base) for i in range(D // 2)],
                                                      dtype=torch.float64), rtol=1e-6, atol=0)
    assert inv_freq[0] == 1.0 and factor == 1.0
    assert math.isclose(inv_freq[-1], theta(D // 2 - 1) / s, rel_tol=1e-6)
    # transformers' dynamic NTK at a length where its growing scale equals s: f * n / L - (f - 1) = s
    f, L = 4.0, 64
    ref, _ = hf("dynamic", seq_len=int(L * (s + f - 1) / f), factor=f)
    torch.testing.assert_close(inv_freq, ref, rtol=1e-5, atol=0)


def test_yarn_worked_example():
    """Peng et al. 2023 with d=32, base 1e4, L=64, s=4, alpha=1, beta=32, worked by hand:
    pair i turns r_i = 64 * 1e4^(-i/16) / (2 pi) times over L. r_i = 32 at i = 16 ln(64/(64 pi)) / ln 1e4 = -1.99
    (floored, clamped: 0); r_i = 1 at i = 16 ln(64/(2 pi)) / ln 1e4 = 4.03 (ceiled: 5). So pair i is blended with
    weight w = min(i/5, 1) toward theta_i / 4; the temperature is sqrt(1/t) = 0.1 ln 4 + 1 = 1.138629436."""
    inv_freq, factor = ours(name="yarn", factor=4, original_max=64)
    w = [min(i / 5, 1.0) for i in range(D // 2)]
    want = torch.tensor([theta(i) * (1 - wi) + theta(i) / 4 * wi for i, wi in enumerate(w)], dtype=torch.float64)
    torch.testing.assert_close(inv_freq, want, rtol=1e-6, atol=0)
    assert inv_freq[0] == 1.0                                  # r_0 = 10.2 turns: high frequency, kept
    assert math.isclose(inv_freq[5], theta(5) / 4, rel_tol=1e-6)  # r_5 < 1: interpolated like PI
    assert math.isclose(factor, 1.138629436, rel_tol=1e-9)
    ref, ref_factor = hf("yarn", factor=4.0, original_max_position_embeddings=64)
    torch.testing.assert_close(inv_freq, ref, rtol=1e-6, atol=0)
    assert math.isclose(factor, ref_factor, rel_tol=1e-12)


@pytest.mark.parametrize("s,L,beta_fast,beta_slow", [(2, 64, 32, 1), (8, 256, 16, 2), (16, 4096, 32, 1)])
def test_yarn_matches_transformers_across_settings(s, L, beta_fast, beta_slow):
    inv_freq, factor = ours(name="yarn", factor=s, original_max=L, beta_fast=beta_fast, beta_slow=beta_slow)
    ref, ref_factor = hf("yarn", factor=float(s), original_max_position_embeddings=L, beta_fast=beta_fast,
                         beta_slow=beta_slow)
    torch.testing.assert_close(inv_freq, ref, rtol=1e-6, atol=0)
    assert math.isclose(factor, 0.1 * math.log(s) + 1, rel_tol=1e-12) and math.isclose(factor, ref_factor)


def test_yarn_temperature_scales_the_attention_logits():
    """cos and sin carry the factor t' = 0.1 ln s + 1, so a rotated q.k is multiplied by t'^2."""
    scaling = {"name": "yarn", "factor": 4, "original_max": 32}
    model = GPT(GPTConfig(64, 32, 1, 4, 4 * D, position={"name": "rope", "scaling": scaling}))
    cos, sin = model.position.rotary(torch.arange(40)[None])
    torch.testing.assert_close(cos**2 + sin**2, torch.full_like(cos, (0.1 * math.log(4) + 1) ** 2))


def test_scaling_loads_an_unscaled_checkpoint():
    """Scaling is chosen at evaluation time: the frequencies are not weights, so a trained state dict loads."""
    plain = GPT(GPTConfig(64, 32, 2, 4, 64, position="rope"))
    scaled = GPT(GPTConfig(64, 32, 2, 4, 64, position={"name": "rope", "scaling": {"name": "ntk", "factor": 2}}))
    scaled.load_state_dict(plain.state_dict())  # strict
    idx = torch.randint(0, 64, (1, 48))
    with torch.no_grad():
        assert not torch.allclose(scaled(idx), plain(idx))
    one = GPT(GPTConfig(64, 32, 2, 4, 64, position={"name": "rope", "scaling": {"name": "linear", "factor": 1}}))
    one.load_state_dict(plain.state_dict())
    with torch.no_grad():  # factor 1 is the identity
        torch.testing.assert_close(one(idx), plain(idx))


@pytest.mark.parametrize("scaling,match", [
    ({"name": "yarn", "factor": 4}, r"position\.scaling\.original_max=None: yarn scaling needs original_max"),
    ({"name": "rescale", "factor": 4}, r"position\.scaling\.name='rescale': choose one of linear, ntk, yarn"),
    ({"name": "linear", "factor": 0.5}, r"position\.scaling\.factor=0\.5: expected a number >= 1"),
    ({"name": "ntk", "factor": 2, "original_max": 64}, r"position\.scaling\.original_max=64: unknown key"),
    ({"name": "yarn", "factor": 2, "original_max": 64, "beta_fast": 0.5}, r"position\.scaling\.beta_fast=0\.5"),
    ("yarn", r"position\.scaling='yarn': expected null or a mapping"),
])
def test_bad_scaling_is_one_line(scaling, match):
    with pytest.raises(ConfigError, match=match) as e:
        GPT(GPTConfig(64, 32, 1, 4, 64, position={"name": "rope", "scaling": scaling}))
    assert "\n" not in str(e.value)
