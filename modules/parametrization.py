"""Parametrizations: how initialisation, forward multipliers and per-parameter learning rates scale with width.

`sp` (standard parametrization) is the GPT as it always was: GPT-2's N(0, 0.02) init, softmax(q.k / sqrt(d_head)),
plain logits, one lr for every parameter.

`mup` is the Maximal Update Parametrization of Yang et al. 2022 ("Tensor Programs V", Table 3, Adam column, in its
output-multiplier form as Microsoft's `mup` package implements it), relative to a base model: this model with
n_embd = mup.base_width (n_head, depth and every other option unchanged; width grows by head size). With m the
ratio fan_in / base fan_in of a parameter:

    parameter role   init std          Adam lr      Muon lr (match_rms_adamw)         forward
    hidden_matrix    sp std / sqrt(m)  lr / m       lr * sqrt(r_out/r_in) / sqrt(M)   -
    embedding        sp std            lr           (AdamW)                           -
    head             sp std            lr           (AdamW)                           logits * base_width / n_embd
    vector           sp (ones/zeros)   lr           (AdamW)                           -
    attention        -                 -            -                                 q.k * sqrt(d0) / d

d is the score width (head size; MLA: head size + rope width), d0 the base model's. r_out, r_in are a block's
out/in width ratios and M the ratio of its larger dimension, base to now (see `ParamRole.muon_lr_mults`).
At width = base_width every factor is exactly 1, so mup there *is* sp: the base model's tuned lr is the lr.

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
from dataclasses import dataclass, field

import torch
from torch import nn

from modules.errors import ConfigError
from modules.options import check_int

PARAMETRIZATIONS = ("sp", "mup")
ROLES = ("hidden_matrix", "embedding", "head", "vector")


@dataclass(frozen=True)
class MupOptions:
    base_width: int | None = None  # n_embd of the base model (the width the lr was tuned at); mup needs it

    def __post_init__(self):
        if self.base_width is not None:
            check_int("mup.base_width", self.base_width)


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


def check_mup(cfg) -> None:
    """Cross-field checks of parametrization=mup (cfg is a GPTConfig): a base width that builds a valid model."""
    base = cfg.mup.base_width
    if base is None:
        raise ConfigError("invalid mup.base_width=None: parametrization=mup needs the width the lr was tuned at, "
                          "e.g. model.mup.base_width=64")
    if base > cfg.n_embd:
        raise ConfigError(f"invalid mup.base_width={base}: larger than n_embd={cfg.n_embd}; the base model is the "
                          f"narrow one you tune on (use a base_width <= {cfg.n_embd})")
    if base % cfg.n_head:
        raise ConfigError(f"invalid mup.base_width={base}: must be divisible by n_head={cfg.n_head} (the base model "
                          f"keeps the heads and narrows each)")
    try:
        base_config(cfg)
    except ConfigError as e:
        raise ConfigError(f"invalid mup.base_width={base}: the base model (n_embd={base}) is invalid: {e}") from None


def base_config(cfg):
    """The base model's GPTConfig: this one at n_embd = mup.base_width, in sp (sp: the config itself)."""
    from dataclasses import replace

    if cfg.parametrization == "sp":
        return cfg
    return replace(cfg, n_embd=cfg.mup.base_width, parametrization="sp")


def attn_scale(cfg) -> float | None:
    """The attention logits' scale: None under sp (SDPA's own 1/sqrt(d)); sqrt(d0)/d under mup (1/d, equal to
    1/sqrt(d) at the base width), d the score width the attention variant declares (`score_dims`)."""
    if cfg.parametrization == "sp":
        return None
    d = cfg.variant("attention").score_dims(cfg)[0]
    d0 = cfg.variant("attention").score_dims(base_config(cfg))[0]
    return math.sqrt(d0) / d


def output_mult(cfg) -> float | None:
    """The logits' multiplier: None under sp; base_width / n_embd under mup (the head's 1/m)."""
    return None if cfg.parametrization == "sp" else cfg.mup.base_width / cfg.n_embd


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
