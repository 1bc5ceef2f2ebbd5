"""Parametrizations: how initialisation, forward multipliers and per-parameter learning rates scale with width.

`sp` (standard parametrization) is the GPT as it always was: GPT-2's N(0, 0.02) init, softmax(q.k / sqrt(d_head)),
plain logits, one lr for every parameter.

`mup` is the Maximal Update Parametrization of Yang et al. 2022 ("Tensor Programs V", Table 3, Adam column, in its
output-multiplier form as Microsoft's `mup` package implements it), relative to a base model: this model with
n_embd = mup.base_width, depth and every other option unchanged. Width grows by heads (mup.width_grows=heads, the
harness's default, as Cerebras-GPT and EleutherAI's muP guide do): every head keeps mup.head_dim (None:
base_width / n_head, n_head then counts the base model's heads) and n_head = n_embd / head_dim, so the attention
scale is the same at every width. mup.width_grows=head_size keeps n_head and widens each head instead (and is what
a config that does not name the rule means: one recorded before it existed). With m the ratio
fan_in / base fan_in of a parameter and s0 = mup.init_std:

    parameter role   init std         Adam lr   Adam decay   Muon lr (match_rms_adamw)         forward
    hidden_matrix    s0 / sqrt(m)     lr / m    wd * m       lr * sqrt(r_out/r_in) / sqrt(M)   -
    embedding        s0               lr        wd           (AdamW)                           -
    head             s0               lr        wd           (AdamW)                           logits * c_out / m
    vector           sp (ones/zeros)  lr        0            (AdamW)                           -
    attention        -                -         -            -                                 q.k * c_attn sqrt(d0)/d

c_out = mup.output_mult and c_attn = mup.attn_mult (the head's m is n_embd / base_width).
d is the score width (head size; MLA: head size + rope width), d0 the base model's (d = d0 when width grows by
heads). r_out, r_in are a block's out/in width ratios and M the ratio of its larger dimension, base to now (see
`ParamRole.muon_lr_mults`). Decoupled weight decay is divided by each lr multiplier (MuAdam's rule; under Muon
per block; ablations/optim.py), so the decay per step, lr * wd, is the same at every width.
mup.init_std, mup.output_mult and mup.attn_mult are the base model's tunable multipliers (Tensor Programs V tunes
them on the small model and transfers them); their defaults (0.02, 1, 1) make every factor exactly 1 at
width = base_width, so mup there *is* sp: the base model's tuned lr is the lr.

The Muon column follows the spectral condition of Yang, Simon & Bernstein 2023 ("A Spectral Condition for Feature
Learning", condition 2): a hidden matrix's update must have spectral norm Theta(sqrt(fan_out / fan_in)).
torch.optim.Muon's update is lr * adjust * O with O's singular values ~1, so its spectral norm is lr * adjust;
with adjust_lr_fn=match_rms_adamw, adjust = 0.2 sqrt(max(out, in)), which grows like sqrt(width): the lr must
shrink like sqrt(r_out/r_in) / sqrt(M) (1/sqrt(m) when both sides grow with width) to keep the spectral norm on
the condition. (Adam's update is nearly low-rank, its spectral norm grows like width, hence Adam's 1/m.)

A parameter's role is declared by the model, not guessed from its name: `param_roles(model)` derives it from the
structure (an nn.Embedding table is an embedding, an nn.Linear weight a hidden matrix, anything with at most one
dimension a vector), and a module overrides only what structure cannot tell with two hooks:

    role_overrides() -> {dotted parameter name below the module: role}   (the GPT declares its lm_head a head)
    fused_blocks()   -> {dotted Linear name below the module: output rows of each block}   (fused q/k/v, gate/up)

Fused blocks matter to Muon (each block is orthogonalised on its own, as if the Linears had not been fused) and
to the Muon mup rule (each block's own shape).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from modules.errors import ConfigError
from modules.options import check_choice, check_int, check_number

SP_INIT_STD = 0.02  # GPT-2's init std, sp's for every matrix and table

PARAMETRIZATIONS = ("sp", "mup")
ROLES = ("hidden_matrix", "embedding", "head", "vector")
WIDTH_GROWS = ("heads", "head_size")


@dataclass(frozen=True)
class MupOptions:
    base_width: int | None = None  # n_embd of the base model (the width the lr was tuned at); mup needs it
    # heads: n_head = n_embd / head_dim; head_size: n_head fixed, heads widen. The harness's default is heads
    # (conf/model/_gpt.yaml); a config that does not name the rule is one recorded before it existed, so it keeps
    # that form and a re-run or resume of such a run rebuilds the same model
    width_grows: str = "head_size"
    head_dim: int | None = None    # heads: every head's size; None: base_width / n_head (the base model's heads)
    init_std: float = SP_INIT_STD  # the base model's init std (sp's 0.02; hidden matrices get it / sqrt(m))
    output_mult: float = 1.0       # the base model's logit multiplier (times base_width / n_embd)
    attn_mult: float = 1.0         # the base model's attention-logit multiplier (times sqrt(d0) / d)

    def __post_init__(self):
        if self.base_width is not None:
            check_int("mup.base_width", self.base_width)
        check_choice("mup.width_grows", self.width_grows, WIDTH_GROWS)
        if self.head_dim is not None:
            check_int("mup.head_dim", self.head_dim)
        for key in ("init_std", "output_mult", "attn_mult"):
            check_number(f"mup.{key}", getattr(self, key), 0, None)


@dataclass(frozen=True)
class ParamRole:
    """One trainable parameter with its declared role and the shapes the parametrization scales by."""
    name: str
    param: nn.Parameter = field(repr=False, compare=False)
    role: str
    blocks: tuple[tuple[int, int], ...]       # (out, in) of each block: one block unless the Linear is fused
    base_blocks: tuple[tuple[int, int], ...]  # the same in the base model (== blocks under sp)

    @property
    def fan_in_mult(self) -> float:
        """m = fan_in / base fan_in (a matrix stored (out, in), as nn.Linear stores it)."""
        return self.blocks[0][1] / self.base_blocks[0][1]

    @property
    def init_mult(self) -> float:
        """Factor on the sp init std: hidden matrices keep variance ~ 1/fan_in; the rest keep sp's init."""
        return 1.0 / math.sqrt(self.fan_in_mult) if self.role == "hidden_matrix" else 1.0

    @property
    def adam_lr_mult(self) -> float:
        """Factor on optim.lr for Adam(W): 1/m for hidden matrices (Tensor Programs V, Table 3), else 1."""
        return 1.0 / self.fan_in_mult if self.role == "hidden_matrix" else 1.0

    @property
    def muon_lr_mults(self) -> tuple[float, ...]:
        """Factor on optim.lr for each block of a hidden matrix under Muon with match_rms_adamw (spectral
        condition, see above); the other roles go to AdamW (adam_lr_mult)."""
        if self.role != "hidden_matrix":
            return tuple(1.0 for _ in self.blocks)
        out = []
        for (o, i), (bo, bi) in zip(self.blocks, self.base_blocks):
            out.append(math.sqrt((o / bo) / (i / bi)) / math.sqrt(max(o, i) / max(bo, bi)))
        return tuple(out)


def mup_heads(cfg) -> tuple[int, MupOptions]:
    """(n_head, mup options with head_dim filled in) of a mup config (a GPTConfig being built, its n_head as given).
    width_grows=heads: head_dim fixed (None: base_width / n_head), n_head = n_embd / head_dim; head_size: as given."""
    mup = cfg.mup
    if mup.base_width is None:
        raise ConfigError("invalid mup.base_width=None: parametrization=mup needs the width the lr was tuned at, "
                          "e.g. model.mup.base_width=64")
    if mup.width_grows == "head_size":
        if mup.head_dim is not None:
            raise ConfigError(f"invalid mup.head_dim={mup.head_dim}: with mup.width_grows=head_size the heads widen; "
                              f"set model.mup.width_grows=heads to keep heads of {mup.head_dim}")
        return cfg.n_head, mup
    hd = mup.head_dim
    if hd is None:
        if mup.base_width % cfg.n_head:
            raise ConfigError(f"invalid mup.base_width={mup.base_width}: must be divisible by n_head={cfg.n_head} "
                              f"(n_head counts the base model's heads; or set model.mup.head_dim)")
        hd = mup.base_width // cfg.n_head
    for key, width in (("n_embd", cfg.n_embd), ("mup.base_width", mup.base_width)):
        if width % hd:
            raise ConfigError(f"invalid {key}={width}: must be divisible by mup.head_dim={hd} (under mup the width "
                              f"grows by heads of that size; or set model.mup.width_grows=head_size)")
    return cfg.n_embd // hd, replace(mup, head_dim=hd)


def check_mup(cfg) -> None:
    """Cross-field checks of parametrization=mup (cfg is a GPTConfig, heads resolved by mup_heads): a base width
    that builds a valid model."""
    base = cfg.mup.base_width
    if base > cfg.n_embd:
        raise ConfigError(f"invalid mup.base_width={base}: larger than n_embd={cfg.n_embd}; the base model is the "
                          f"narrow one you tune on (use a base_width <= {cfg.n_embd})")
    if cfg.mup.width_grows == "head_size" and base % cfg.n_head:
        raise ConfigError(f"invalid mup.base_width={base}: must be divisible by n_head={cfg.n_head} (the base model "
                          f"keeps the heads and narrows each)")
    try:
        base_config(cfg)
    except ConfigError as e:
        raise ConfigError(f"invalid mup.base_width={base}: the base model (n_embd={base}) is invalid: {e}") from None


def base_config(cfg):
    """The base model's GPTConfig: this one at n_embd = mup.base_width (and its heads), in sp (sp: itself)."""
    if cfg.parametrization == "sp":
        return cfg
    heads = cfg.n_head if cfg.mup.width_grows == "head_size" else cfg.mup.base_width // cfg.mup.head_dim
    return replace(cfg, n_embd=cfg.mup.base_width, n_head=heads, parametrization="sp")


def init_std(cfg) -> float:
    """The base init std of matrices and tables: sp's 0.02, or mup.init_std (hidden matrices: / sqrt(m) on top)."""
    return SP_INIT_STD if cfg.parametrization == "sp" else cfg.mup.init_std


def attn_scale(cfg) -> float | None:
    """The attention logits' scale: None under sp (SDPA's own 1/sqrt(d)); attn_mult * sqrt(d0)/d under mup (d = d0
    when width grows by heads; 1/d when heads widen), d the score width the attention variant declares
    (`score_dims`). At the base width with attn_mult 1 it is sp's 1/sqrt(d)."""
    if cfg.parametrization == "sp":
        return None
    d = cfg.variant("attention").score_dims(cfg)[0]
    d0 = cfg.variant("attention").score_dims(base_config(cfg))[0]
    return cfg.mup.attn_mult * math.sqrt(d0) / d


def output_mult(cfg) -> float | None:
    """The logits' multiplier: None under sp; output_mult * base_width / n_embd under mup (the head's 1/m)."""
    return None if cfg.parametrization == "sp" else cfg.mup.output_mult * cfg.mup.base_width / cfg.n_embd


# ------------------------------------------------------------------------------------------------ roles
def _structural_role(module: nn.Module, leaf: str, p: torch.Tensor) -> str | None:
    if isinstance(module, nn.Embedding) and leaf == "weight":
        return "embedding"
    if isinstance(module, nn.Linear) and leaf == "weight":
        return "hidden_matrix"
    if p.dim() <= 1:
        return "vector"  # norm gains, biases, scalars (DyT's alpha)
    return None


def _declarations(model: nn.Module) -> tuple[dict[str, str], dict[str, tuple[int, ...]]]:
    """The role overrides and fused blocks every module declares, keyed by full parameter name."""
    roles, blocks = {}, {}
    for mname, m in model.named_modules():
        prefix = f"{mname}." if mname else ""
        if hasattr(m, "role_overrides"):
            roles.update({prefix + k: v for k, v in m.role_overrides().items()})
        if hasattr(m, "fused_blocks"):
            blocks.update({f"{prefix}{k}.weight": tuple(r for r in rows if r)
                           for k, rows in m.fused_blocks().items()})
    return roles, blocks


def _roles_and_blocks(model: nn.Module) -> list[tuple[str, nn.Parameter, str, tuple[tuple[int, int], ...]]]:
    roles, fused = _declarations(model)
    out = []
    for name, p in model.named_parameters():  # each parameter once (a tied head is the embedding it shares)
        if not p.requires_grad:
            continue
        mname, _, leaf = name.rpartition(".")
        module = model.get_submodule(mname)
        role = roles.get(name) or _structural_role(module, leaf, p)
        if role not in ROLES:
            raise ConfigError(f"parameter {name} {tuple(p.shape)} of {type(module).__name__} has no role "
                              f"({role!r}): declare it in role_overrides() as one of {', '.join(ROLES)}")
        if p.dim() == 2:
            rows = fused.get(name, (p.shape[0],))
            if sum(rows) != p.shape[0]:
                raise ConfigError(f"fused_blocks of {name}: rows {rows} do not add up to {p.shape[0]}")
            blocks = tuple((r, p.shape[1]) for r in rows)
        else:
            blocks = ((p.numel(), 1),)
        out.append((name, p, role, blocks))
    return out


def param_roles(model: nn.Module, base_model: nn.Module | None = None) -> list[ParamRole]:
    """Every trainable parameter of `model` exactly once, in `named_parameters` order, with its role and block
    shapes; base_model (same structure, base width; None: the model itself) gives the base shapes."""
    mine = _roles_and_blocks(model)
    base = mine if base_model is None else _roles_and_blocks(base_model)
    if [n for n, *_ in mine] != [n for n, *_ in base]:
        raise ConfigError("the base model's parameters differ from the model's: mup.base_width must only change "
                          "widths, not the structure")
    return [ParamRole(n, p, role, blocks, b[3]) for (n, p, role, blocks), b in zip(mine, base)]
