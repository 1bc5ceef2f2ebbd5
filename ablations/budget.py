"""Budgets: `trainer.budget.flops`, `trainer.budget.tokens_per_param` or `trainer.budget.tokens` -> trainer.max_steps.

Arms and sizes are compared at matched compute only if each run's step count is derived from its own cost: a
variant with more FLOPs per token (a wider MLP, a longer attention span) gets fewer steps for the same budget.

    tokens per step  = data.batch_size * model.block_size * trainer.accumulate_grad_batches * world size
    FLOPs per step   = tokens per step * flops_per_token(model)  (modules.accounting: 6N + attention, PaLM)
    max_steps        = floor(budget_flops / FLOPs per step)
    tokens_per_param = r  ->  budget_flops = r * params * flops_per_token  (Chinchilla's D = r N, N = all params)
    tokens           = T  ->  max_steps = floor(T / tokens per step); budget_flops = T * flops_per_token

A tokens budget holds the data fixed instead of the compute: the verdict protocol's `match: tokens` arms train the
baseline's tokens (sweeps/protocol.py), whatever their own FLOPs per token. At most one of the three may be set.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from modules import accounting
from modules.config import GPTConfig
from modules.errors import ConfigError


def tokens_per_step(batch_size: int, block_size: int, accumulate: int = 1, world_size: int = 1) -> int:
    return batch_size * block_size * accumulate * world_size


BUDGET_KEYS = ("flops", "tokens_per_param", "tokens")


def _number(key: str, value, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"invalid trainer.budget.{key}={value!r}: expected a number > 0, e.g. {example}")
    return value


def budget_tokens(budget: Mapping | None) -> int | float | None:
    """trainer.budget.tokens checked (None: not set); the other keys are checked by budget_flops."""
    tokens = dict(budget or {}).get("tokens")
    return None if tokens is None else _number("tokens", tokens, "3e8 (training tokens)")


def budget_flops(budget: Mapping | None, model_cfg) -> float | None:
    """The run's compute budget in FLOPs, or None when no budget is set (max_steps rules). A tokens budget is the
    FLOPs those tokens cost this model (T * flops_per_token): what the run may spend, logged as budget_flops."""
    budget = dict(budget or {})
    given = [k for k in BUDGET_KEYS if budget.get(k) is not None]
    if len(given) > 1:  # two budgets could disagree on max_steps: refuse rather than pick one silently
        shown = ", ".join(f"trainer.budget.{k}={budget[k]!r}" for k in given)
        raise ConfigError(f"invalid {shown}: set exactly one of trainer.budget.flops / tokens_per_param / tokens "
                          f"(the others null, e.g. trainer.budget.{given[0]}=null)")
    if "flops" in given:
        return float(_number("flops", budget["flops"], "3e13"))
    if "tokens_per_param" in given:
        tpp = _number("tokens_per_param", budget["tokens_per_param"], "20")
        params = accounting.param_counts(model_cfg)["params"]
        return float(tpp) * params * accounting.flops_per_token(model_cfg)
    if "tokens" in given:
        return float(budget_tokens(budget)) * accounting.flops_per_token(model_cfg)
    return None


def steps_for_tokens(tokens: int | float, model_cfg, batch_size: int, accumulate: int = 1, world_size: int = 1) -> int:
    """Optimizer steps that train on at most `tokens` tokens (at least one step, or the budget is refused). Integer
    arithmetic where the budget is a whole number, so T = k x tokens per step gives exactly k steps at any size."""
    per_step = tokens_per_step(batch_size, GPTConfig.from_dict(model_cfg).block_size, accumulate, world_size)
    whole = isinstance(tokens, int) or float(tokens).is_integer()
    steps = int(tokens) // per_step if whole else math.floor(tokens / per_step)
    if steps < 1:
        raise ConfigError(f"invalid trainer.budget.tokens={tokens:.6g}: less than one optimizer step ({per_step:,} "
                          "tokens); raise the budget or shrink the batch")
    return steps


def steps_for_budget(flops: float, model_cfg, batch_size: int, accumulate: int = 1, world_size: int = 1) -> int:
    """Optimizer steps that spend at most `flops` (at least one step, or the budget is refused)."""
    block_size = GPTConfig.from_dict(model_cfg).block_size
    per_step = tokens_per_step(batch_size, block_size, accumulate, world_size) * accounting.flops_per_token(model_cfg)
    steps = math.floor(flops / per_step)
    if steps < 1:
        raise ConfigError(f"invalid trainer.budget flops={flops:.3g}: less than one optimizer step "
                          f"({per_step:.3g} FLOPs); raise the budget or shrink the batch")
    return steps
