"""The optimizers of the `optim` config group, built from the roles the model declares (GPT.param_roles).

    optim=adamw   AdamW on everything: decay on matrices and tables, none on vectors (norm gains, biases, scalars).
    optim=muon    torch.optim.Muon on the hidden matrices (each fused block orthogonalised on its own), AdamW on
                  embeddings, the head and vectors, as modded-nanogpt and nanochat split them. adjust_lr_fn
                  match_rms_adamw scales Muon's update to AdamW's RMS (0.2 * lr, Liu et al. 2025, "Muon is
                  Scalable for LLM Training"), so one optim.lr, tuned for AdamW, serves both parts.

Under model.parametrization=mup each group's lr is optim.lr times the parametrization's multiplier for its role
(modules/parametrization.py: hidden matrices 1/m under Adam, per-block spectral rule under Muon, 1 elsewhere), and
its decoupled weight decay is divided by that multiplier (MuAdam's rule: wd * m where the lr is lr / m), so the
decay per step, lr * wd, is the same at every width; the lr schedule (LambdaLR over every group) multiplies each
group's own lr. Nothing here reads a parameter's name.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .errors import ConfigError

OPTIMIZERS = ("adamw", "muon")
ADJUST_LR_FNS = ("match_rms_adamw", "original")


@dataclass
class Group:
    """One optimizer parameter group: which optimizer, which roles, its lr multiplier and decay."""
    optimizer: str
    roles: tuple[str, ...]
    params: list = field(repr=False)
    lr_mult: float
    weight_decay: float
    blocks: list = field(default_factory=list, repr=False)  # muon: per param, [(rows, lr factor vs the group)]


def optimizer_name(o: Mapping) -> str:
    name = o.get("name", "adamw")
    if name not in OPTIMIZERS:
        raise ConfigError(f"invalid optim.name={name!r}: choose one of {', '.join(OPTIMIZERS)} (optim=adamw|muon)")
    return name


def _adamw_groups(roles, weight_decay: float) -> list[Group]:
    """Decay on matrices and tables (everything but vectors), one group per lr multiplier; the multiplier-1 decay
    group first and the no-decay group last, so sp gives exactly the two groups AdamW always had."""
    decay: dict[float, list] = {}
    for r in roles:
        if r.role != "vector":
            decay.setdefault(r.adam_lr_mult, []).append(r)
    order = sorted(decay, key=lambda m: m != 1.0)  # stable: 1.0 first, then first appearance
    # MuAdam: the decay is multiplied back by what divides the lr (1/m -> wd * m), so lr * wd stays put
    groups = [Group("adamw", tuple(dict.fromkeys(r.role for r in decay[m])), [r.param for r in decay[m]], m,
                    weight_decay / m) for m in order]
    vectors = [r for r in roles if r.role == "vector"]
    groups.append(Group("adamw", ("vector",), [r.param for r in vectors], 1.0, 0.0))
    return groups


def _muon_groups(roles, weight_decay: float) -> list[Group]:
    """Hidden matrices grouped by their first block's lr multiplier; a block whose multiplier differs (a fused
    matrix whose parts scale differently with width) carries its factor relative to the group. The decay is
    divided by the same multipliers (BlockMuon divides by the block's factor), so lr * wd stays put, as under Adam."""
    groups: dict[float, Group] = {}
    for r in roles:
        mults = r.muon_lr_mults
        g = groups.setdefault(mults[0], Group("muon", ("hidden_matrix",), [], mults[0], weight_decay / mults[0]))
        g.params.append(r.param)
        g.blocks.append([(rows, m / mults[0]) for (rows, _), m in zip(r.blocks, mults)])
    return list(groups.values())


def muon_options(o: Mapping) -> dict:
    """optim.muon, checked, with its defaults (torch.optim.Muon's, adjust_lr_fn match_rms_adamw)."""
    if not hasattr(torch.optim, "Muon"):
        raise ConfigError(f"optim=muon needs torch.optim.Muon (torch >= 2.9; this is {torch.__version__}): "
                          f"upgrade torch or use optim=adamw")
    m = {"momentum": 0.95, "nesterov": True, "ns_steps": 5, "adjust_lr_fn": "match_rms_adamw",
         "weight_decay": float(o.get("weight_decay", 0.0))}
    given = dict(o.get("muon") or {})
    unknown = sorted(set(given) - set(m))
    if unknown:
        raise ConfigError(f"invalid optim.muon.{unknown[0]}={given[unknown[0]]!r}: unknown key; valid keys are "
                          f"{', '.join(sorted(m))}")
    m.update(given)
    if m["adjust_lr_fn"] not in ADJUST_LR_FNS:
        raise ConfigError(f"invalid optim.muon.adjust_lr_fn={m['adjust_lr_fn']!r}: choose one of "
                          f"{', '.join(ADJUST_LR_FNS)} (match_rms_adamw lets AdamW-tuned lrs carry over)")
    return m


def plan(model, o: Mapping) -> list[Group]:
    """The parameter groups of optim config `o` for `model` (every trainable parameter in exactly one); checks `o`
    against the model, so a bad optimizer config fails here, before any run exists."""
    _check_lr(o)
    name = optimizer_name(o)
    roles = model.param_roles()
    wd = float(o.get("weight_decay", 0.0))
    if name == "adamw":
        return _adamw_groups(roles, wd)
    muon_wd = float(muon_options(o)["weight_decay"])
    hidden = [r for r in roles if r.role == "hidden_matrix"]
    if not hidden:
        raise ConfigError(f"optim=muon: {type(model).__name__} declares no 2-D hidden matrix for Muon to "
                          f"orthogonalise (only {', '.join(sorted({r.role for r in roles}))}); use optim=adamw")
    return _adamw_groups([r for r in roles if r.role != "hidden_matrix"], wd) + _muon_groups(hidden, muon_wd)


def _check_lr(o: Mapping) -> float:
    lr = o.get("lr")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (lr > 0 and math.isfinite(lr)):
        raise ConfigError(f"optim.lr={lr} must be a positive number, e.g. 3e-3")
    return float(lr)


def _adamw(groups: list[Group], o: Mapping, lr: float) -> torch.optim.AdamW:
    # a group without its own "lr" takes the default: sp builds exactly the param groups it always built
    pg = [{"params": g.params, "weight_decay": g.weight_decay, **({"lr": lr * g.lr_mult} if g.lr_mult != 1.0 else {})}
          for g in groups]
    betas = tuple(float(b) for b in o.get("betas", (0.9, 0.95)))
    # fused: one kernel for the whole update instead of a loop of small ops (1.06x a small-cpu step on CPU)
    return torch.optim.AdamW(pg, lr=lr, betas=betas, eps=float(o.get("eps", 1e-8)), fused=True)


def _muon(groups: list[Group], o: Mapping, lr: float) -> BlockMuon:
    m = muon_options(o)
    pg = [{"params": g.params, "lr": lr * g.lr_mult, "weight_decay": g.weight_decay, "blocks": g.blocks}
          for g in groups]
    return BlockMuon(pg, lr=lr, momentum=float(m["momentum"]), nesterov=bool(m["nesterov"]),
                     ns_steps=int(m["ns_steps"]), adjust_lr_fn=m["adjust_lr_fn"])


def build_optimizer(model, o: Mapping) -> torch.optim.Optimizer:
    """AdamW (optim=adamw) or Muon + AdamW as one optimizer (optim=muon), from optim config `o`."""
    groups = plan(model, o)
    lr = _check_lr(o)
    adamw = _adamw([g for g in groups if g.optimizer == "adamw"], o, lr)
    if optimizer_name(o) == "adamw":
        return adamw
    return MuonWithAdamW(_muon([g for g in groups if g.optimizer == "muon"], o, lr), adamw)


def run_params(model, o: Mapping) -> dict[str, str]:
    """What MLflow records at run start: the optimizer, the parametrization and each parameter group (its
    optimizer, roles, tensor and parameter counts, lr at the schedule's peak, multiplier and weight decay)."""
    groups = plan(model, o)
    lr = _check_lr(o)
    cfg = model.config
    out = {"optimizer": "adamw" if optimizer_name(o) == "adamw" else "muon+adamw",
           "parametrization": cfg.parametrization if cfg.parametrization == "sp"
           else f"{cfg.parametrization} (base_width {cfg.mup.base_width})",
           "optimizer.groups": str(len(groups))}
    for i, g in enumerate(groups):
        out[f"optimizer.group.{i}"] = (f"{g.optimizer} {'+'.join(g.roles)}: {len(g.params)} tensors, "
                                       f"{sum(p.numel() for p in g.params)} params, lr {lr * g.lr_mult:.4g} "
                                       f"(x{g.lr_mult:.4g}), weight_decay {g.weight_decay:g}")
    return out


# ------------------------------------------------------------------------------------------------ optimizers
def _closure_loss(closure):
    """torch.optim's closure protocol: the loss it recomputes (with gradients), or None without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class BlockMuon(torch.optim.Muon if hasattr(torch.optim, "Muon") else torch.optim.Optimizer):
    """torch.optim.Muon whose step runs PyTorch's own Muon update (torch.optim._muon.muon: momentum, Newton-Schulz,
    lr adjustment, decoupled decay) on each declared block of a parameter separately: rows [0, r1), [r1, r1 + r2)
    ... of a fused matrix get their own momentum slice, orthogonalisation and shape-adjusted lr, exactly as if the
    blocks were separate parameters. The group key "blocks" lists, per parameter, (rows, lr factor) pairs; a
    block's lr is the group's times its factor and its decoupled decay the group's divided by it (lr * wd, the
    decay per step, is the group's); one block of all rows with factor 1 is torch.optim.Muon's step. State (one
    momentum buffer per parameter, whole) and state_dict are torch.optim.Muon's."""

    @torch.no_grad()
    def step(self, closure=None):
        from torch.optim._muon import muon

        loss = _closure_loss(closure)
        for group in self.param_groups:
            for p, blocks in zip(group["params"], group["blocks"]):
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                rows = [r for r, _ in blocks]
                # views: the in-place updates of each block land in the parameter and its momentum buffer
                for (_, factor), w, g, buf in zip(blocks, p.split(rows), p.grad.split(rows),
                                                  state["momentum_buffer"].split(rows)):
                    muon([w], [g], [buf], lr=group["lr"] * factor, weight_decay=group["weight_decay"] / factor,
                         momentum=group["momentum"], nesterov=group["nesterov"],
                         ns_coefficients=group["ns_coefficients"], eps=group["eps"], ns_steps=group["ns_steps"],
                         adjust_lr_fn=group["adjust_lr_fn"], has_complex=False)
        return loss


class _States(Mapping):
    """The union of the parts' `state` dicts, read-only and live (a lookup never creates an entry)."""

    def __init__(self, *parts):
        self.parts = parts

    def __getitem__(self, p):
        for s in self.parts:
            if p in s:
                return s[p]
        raise KeyError(p)

    def __iter__(self):
        for s in self.parts:
            yield from s

    def __len__(self):
        return sum(len(s) for s in self.parts)


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon and AdamW as the one optimizer Lightning's automatic optimization and LambdaLR expect: param_groups are
    the parts' own group dicts (AdamW's first, so param_groups[0] is at optim.lr's schedule), step runs the closure
    once and then both parts, and state_dict is {"muon": ..., "adamw": ...}, each part's own, so a checkpoint
    restores both exactly."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer):
        self.muon, self.adamw = muon, adamw
        super().__init__(adamw.param_groups + muon.param_groups, {})  # the same dicts: the schedule edits the parts
        self.state = _States(adamw.state, muon.state)

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        self.adamw.step()
        self.muon.step()
        return loss

    def state_dict(self):
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict):
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        # loading replaces each part's group dicts: share the new ones again, or the schedule would edit stale ones
        self.param_groups = self.adamw.param_groups + self.muon.param_groups
        self.state = _States(self.adamw.state, self.muon.state)
