"""Rotary position embeddings (Su et al. 2021): q and k are rotated by position-dependent angles, so their dot
product depends only on the relative offset. The frequency base is configurable (position.base).

`position.scaling` stretches a trained model's context at evaluation or generation time, without retraining
(null: plain rope). Pair i of the rotated width d turns at theta_i = base^(-2i/d) radians per position; s is
`factor`, L is `original_max` (the training context):

- linear (Chen et al. 2023, position interpolation): positions are divided by s, i.e. theta_i / s for every i.
- ntk ("NTK-aware", bloc97 2023): the base grows to base * s^(d/(d-2)), so the fastest pair keeps its frequency
  (high-frequency detail is not squeezed) and the slowest is interpolated by exactly s.
- yarn (Peng et al. 2023, "NTK-by-parts" plus a temperature): a pair that turns r_i = L / (2 pi / theta_i) times
  over the training context is kept when r_i >= beta_fast (32), interpolated (theta_i / s) when r_i <= beta_slow
  (1), and blended linearly in between. As in the paper's reference code (and transformers), the blend is linear
  in the pair index between the (floored / ceiled) indices where r = beta_fast and r = beta_slow. The attention
  logits are multiplied by (0.1 ln s + 1)^2 (the paper's sqrt(1/t) = 0.1 ln s + 1, applied to q and k alike by
  scaling cos and sin).
"""
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from modules.options import check_int, check_number, fail
from modules.positions.base import Position, PositionOptions
from modules.registry import register

# method -> {key: default}; None marks a required key
SCALING_KEYS = {
    "linear": {"factor": None},
    "ntk": {"factor": None},
    "yarn": {"factor": None, "original_max": None, "beta_fast": 32.0, "beta_slow": 1.0},
}


def check_scaling(key: str, scaling) -> dict | None:
    """Validate a `position.scaling` mapping; return it with the method's defaults filled in (or None)."""
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        fail(key, scaling, "expected null or a mapping like {name: yarn, factor: 4, original_max: 64}")
    d = {str(k): v for k, v in scaling.items()}
    name = d.pop("name", None)
    if name not in SCALING_KEYS:
        fail(f"{key}.name", name, f"choose one of {', '.join(SCALING_KEYS)}")
    allowed = SCALING_KEYS[name]
    for k in sorted(set(d) - set(allowed)):
        fail(f"{key}.{k}", d[k], f"unknown key for {name} scaling; valid keys are {', '.join(['name', *allowed])}")
    out = {"name": name}
    for k, default in allowed.items():
        v = d.get(k, default)
        if v is None:
            fail(f"{key}.{k}", None, f"{name} scaling needs {k}")
        out[k] = v
    check_number(f"{key}.factor", out["factor"], 1, lo_open=False)
    if name == "yarn":
        check_int(f"{key}.original_max", out["original_max"])
        check_number(f"{key}.beta_slow", out["beta_slow"], 0)
        check_number(f"{key}.beta_fast", out["beta_fast"], out["beta_slow"])
    return out


@dataclass(frozen=True)
class RopeOptions(PositionOptions):
    base: float = 10000.0  # sets the slowest rotation frequency
    scaling: dict | None = None  # context extension at inference: null, or {name: linear|ntk|yarn, factor, ...}

    def __post_init__(self):
        check_number(self.key("base"), self.base, 1)
        object.__setattr__(self, "scaling", check_scaling(self.key("scaling"), self.scaling))


def rope_inv_freq(dim: int, base: float, scaling: dict | None = None) -> tuple[torch.Tensor, float]:
    """-> (inverse frequencies theta_i (dim/2,) float32, attention factor multiplying cos and sin)."""
    if scaling is None:  # float32 as always, so unscaled models are bit-for-bit unchanged
        return base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim), 1.0
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim  # 2i/d
    s, name = float(scaling["factor"]), scaling["name"]
    if name == "linear":
        return (base ** -exponents / s).float(), 1.0
    if name == "ntk":
        return ((base * s ** (dim / (dim - 2))) ** -exponents).float(), 1.0
    # yarn: the pair index at which a pair turns r times over the original context L
    theta = base ** -exponents
    L = scaling["original_max"]

    def pair_index(r):  # solve L * theta_i / (2 pi) = r for i
        return dim * math.log(L / (2 * math.pi * r)) / (2 * math.log(base))

    lo = max(math.floor(pair_index(scaling["beta_fast"])), 0)        # faster pairs: kept as trained
    hi = min(math.ceil(pair_index(scaling["beta_slow"])), dim - 1)   # slower pairs: interpolated by s
    hi = hi + 0.001 if hi == lo else hi                               # one-pair ramp: avoid 0/0
    interp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)  # 0 keep .. 1 interpolate
    inv_freq = theta * (1 - interp) + theta / s * interp
    temperature = 0.1 * math.log(s) + 1.0 if s > 1 else 1.0
    return inv_freq.float(), temperature


@register("position", "rope")
class RotaryPosition(Position):
    Options = RopeOptions

    @classmethod
    def validate(cls, cfg):
        # the attention decides which width is rotated (the whole head, or MLA's decoupled part)
        dim = cfg.rotary_dim
        if dim == 0 or dim % 2:
            key, value = cfg.variant("attention").rotary_dim_source(cfg)
            width = "head size n_embd/n_head" if key == "n_embd" else "rotary width"
            fail(key, value, f"{width}={dim} is odd or zero; rope rotates pairs of dimensions, so it must be even")
        if cfg.position.scaling is not None and cfg.position.scaling["name"] == "ntk" and dim < 4:
            fail("position.scaling.name", "ntk", f"ntk needs a rotary width >= 4 (it is {dim}): use linear")

    def __init__(self, cfg):
        super().__init__(cfg)
        inv_freq, self.attention_factor = rope_inv_freq(cfg.rotary_dim, cfg.position.base, cfg.position.scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (dim/2,)
        # cos and sin of positions 0..block_size-1, for training's calls (positions from 0, the same in every row):
        # computed from positions in the step, torch.compile fuses cos and sin into every layer's rotation and
        # evaluates them again per element of q and k, forward and backward (~2% of a compiled small-cpu step)
        cos, sin = self._angles(torch.arange(cfg.block_size)[None])
        self.register_buffer("cos_table", cos, persistent=False)  # (1, 1, block_size, dim/2)
        self.register_buffer("sin_table", sin, persistent=False)

    def _angles(self, pos):
        angles = pos.float()[:, None, :, None] * self.inv_freq.to(pos.device)  # (B, 1, T, dim/2)
        if self.attention_factor == 1.0:
            return angles.cos(), angles.sin()
        return angles.cos() * self.attention_factor, angles.sin() * self.attention_factor

    def rotary(self, pos, from_zero=False):
        T = pos.size(1)
        if from_zero and T <= self.cos_table.size(2) and self.cos_table.dtype == torch.float32:
            return self.cos_table[:, :, :T], self.sin_table[:, :, :T]  # (1, 1, T, dim/2): broadcast over rows
        return self._angles(pos)  # a model cast to bf16 recomputes: its tables would have lost the mantissa
