"""Compute budgets: `trainer.budget.flops` or `trainer.budget.tokens_per_param` -> trainer.max_steps.

Arms and sizes are compared at matched compute only if each run's step count is derived from its own cost: a
variant with more FLOPs per token (a wider MLP, a longer attention span) gets fewer steps for the same budget.

    tokens per step  = data.batch_size * model.block_size * trainer.accumulate_grad_batches * world size
    FLOPs per step   = tokens per step * flops_per_token(model)  (modules.accounting: 6N + attention, PaLM)
    max_steps        = floor(budget_flops / FLOPs per step)
    tokens_per_param = r  ->  budget_flops = r * params * flops_per_token  (Chinchilla's D = r N, N = all params)
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from modules import accounting
from modules.config import GPTConfig
from modules.errors import ConfigError


def tokens_per_step(batch_size: int, block_size: int, accumulate: int = 1, world_size: int = 1) -> int:
    return batch_size * block_size * accumulate * world_size


def budget_flops(budget: Mapping | None, model_cfg) -> float | None:
    """The run's compute budget in FLOPs, or None when no budget is set (max_steps rules)."""
    budget = dict(budget or {})
    flops, tpp = budget.get("flops"), budget.get("tokens_per_param")
    if flops is not None and tpp is not None:
        raise ConfigError(f"invalid trainer.budget={budget}: set flops or tokens_per_param, not both")
    if flops is not None:
        if isinstance(flops, bool) or not isinstance(flops, (int, float)) or not flops > 0:
            raise ConfigError(f"invalid trainer.budget.flops={flops!r}: expected a number of FLOPs > 0, e.g. 3e13")
        return float(flops)
    if tpp is not None:
        if isinstance(tpp, bool) or not isinstance(tpp, (int, float)) or not tpp > 0:
            raise ConfigError(f"invalid trainer.budget.tokens_per_param={tpp!r}: expected a number > 0, e.g. 20")
        params = accounting.param_counts(model_cfg)["params"]
        return float(tpp) * params * accounting.flops_per_token(model_cfg)
    return None


def steps_for_budget(flops: float, model_cfg, batch_size: int, accumulate: int = 1, world_size: int = 1) -> int:
    """Optimizer steps that spend at most `flops` (at least one step, or the budget is refused)."""
    block_size = GPTConfig.from_dict(model_cfg).block_size
    per_step = tokens_per_step(batch_size, block_size, accumulate, world_size) * accounting.flops_per_token(model_cfg)
    steps = math.floor(flops / per_step)
    if steps < 1:
        raise ConfigError(f"invalid trainer.budget flops={flops:.3g}: less than one optimizer step "
                          f"({per_step:.3g} FLOPs); raise the budget or shrink the batch")
    return steps
