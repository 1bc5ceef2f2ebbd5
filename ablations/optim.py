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

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .errors import ConfigError

OPTIMIZERS = ("adamw", "muon")
ADJUST_LR_FNS = ("match_rms_adamw", "original")
NS_DTYPES = ("auto", "bfloat16", "float32")


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
    m = {"momentum": 0.95, "nesterov": True, "ns_steps": 5, "adjust_lr_fn": "match_rms_adamw", "ns_dtype": "auto",
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
    if m["ns_dtype"] not in NS_DTYPES:
        raise ConfigError(f"invalid optim.muon.ns_dtype={m['ns_dtype']!r}: choose one of {', '.join(NS_DTYPES)} "
                          f"(auto: bfloat16 where bf16 matmuls are native, else float32)")
    return m


def ns_dtype(choice: str, device: torch.device | str = "cpu") -> torch.dtype:
    """The dtype Newton-Schulz runs in for optim.muon.ns_dtype `choice` on `device`. auto: bfloat16, as
    torch.optim.Muon always does, where bf16 matmuls are native (CUDA; a CPU on oneDNN's bf16 path, AVX-512 and
    newer); float32 elsewhere, where bf16 matmuls are emulated: on an AVX2-only CPU one 1024x256 orthogonalisation
    takes ~0.66 s in bf16 against ~22 ms in float32 (oneDNN's bf16 path turned off on an AVX-512 CPU: 8.6 ms)."""
    if choice != "auto":
        return getattr(torch, choice)
    if torch.device(device).type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if _cpu_bf16_matmul() else torch.float32


@functools.cache  # a fact of the machine, read once per process, not at every optimizer step
def _cpu_bf16_matmul() -> bool:
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


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
                     ns_steps=int(m["ns_steps"]), adjust_lr_fn=m["adjust_lr_fn"], ns_dtype=m["ns_dtype"])


def build_optimizer(model, o: Mapping) -> torch.optim.Optimizer:
    """AdamW (optim=adamw) or Muon + AdamW as one optimizer (optim=muon), from optim config `o`."""
    groups = plan(model, o)
    lr = _check_lr(o)
    adamw = _adamw([g for g in groups if g.optimizer == "adamw"], o, lr)
    if optimizer_name(o) == "adamw":
        return adamw
    return MuonWithAdamW(_muon([g for g in groups if g.optimizer == "muon"], o, lr), adamw)


def run_params(model, o: Mapping, accelerator: str = "cpu") -> dict[str, str]:
    """What MLflow records at run start: the optimizer, the parametrization and each parameter group (its
    optimizer, roles, tensor and parameter counts, lr at the schedule's peak, multiplier and weight decay); under
    Muon the dtype its Newton-Schulz runs in on `accelerator`."""
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
    if optimizer_name(o) == "muon":
        choice = muon_options(o)["ns_dtype"]
        out["optimizer.muon.ns_dtype"] = f"{choice}: {str(ns_dtype(choice, accelerator)).removeprefix('torch.')}"
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
    momentum buffer per parameter, whole) and state_dict are torch.optim.Muon's.

    Newton-Schulz runs in the group's "ns_dtype" as `ns_dtype` resolves it: in bfloat16 the update is PyTorch's
    own; in float32 it is `_float32_update`, the same steps with the iteration in float32."""

    def __init__(self, params, ns_dtype: str = "auto", **kwargs):
        super().__init__(params, **kwargs)
        self.defaults["ns_dtype"] = ns_dtype
        for group in self.param_groups:
            group.setdefault("ns_dtype", ns_dtype)

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
                update = muon if ns_dtype(group.get("ns_dtype", "auto"), p.device) == torch.bfloat16 \
                    else _float32_update
                # views: the in-place updates of each block land in the parameter and its momentum buffer
                for (_, factor), w, g, buf in zip(blocks, p.split(rows), p.grad.split(rows),
                                                  state["momentum_buffer"].split(rows)):
                    update([w], [g], [buf], lr=group["lr"] * factor, weight_decay=group["weight_decay"] / factor,
                           momentum=group["momentum"], nesterov=group["nesterov"],
                           ns_coefficients=group["ns_coefficients"], eps=group["eps"], ns_steps=group["ns_steps"],
                           adjust_lr_fn=group["adjust_lr_fn"], has_complex=False)
        return loss


def newton_schulz(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Muon's orthogonalisation of a matrix g (r, c) in `dtype`: scaled to Frobenius norm 1 (so every singular
    value is <= 1), then `steps` times X <- a X + (b A + c A^2) X with A = X X^T, the quintic whose coefficients
    (a, b, c) push every singular value towards ~1 while keeping the singular vectors (Jordan et al. 2024). Works
    on the wide orientation, where A is the smaller Gram matrix."""
    a, b, c = coefficients
    x = g.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.mT  # (c, r): the Gram matrix below is (c, c)
    x = x / x.norm().clamp_min(eps)
    for _ in range(steps):
        gram = x @ x.mT  # (k, k), k = min(r, c)
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.mT if tall else x


def lr_ratio(adjust_lr_fn: str | None, shape) -> float:
    """Muon's shape factor on the lr of an (out, in) matrix: match_rms_adamw 0.2 sqrt(max(out, in)) (an update of
    AdamW's RMS); original (Keller Jordan's) sqrt(max(1, out / in))."""
    out, inp = shape[:2]
    return 0.2 * math.sqrt(max(out, inp)) if adjust_lr_fn == "match_rms_adamw" else math.sqrt(max(1.0, out / inp))


def _float32_update(params, grads, bufs, *, lr, weight_decay, momentum, nesterov, ns_coefficients, eps, ns_steps,
                    adjust_lr_fn, has_complex=False):
    """torch.optim._muon.muon's steps (momentum, Nesterov, orthogonalisation, shape-adjusted lr, decoupled decay)
    with Newton-Schulz in float32; the same signature, so BlockMuon calls either."""
    for w, g, buf in zip(params, grads, bufs):
        buf.lerp_(g, 1 - momentum)
        direction = g.lerp(buf, momentum) if nesterov else buf
        o = newton_schulz(direction, ns_coefficients, ns_steps, eps, torch.float32)
        w.mul_(1 - lr * weight_decay)
        w.add_(o.to(w.dtype), alpha=-lr * lr_ratio(adjust_lr_fn, w.shape))


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
