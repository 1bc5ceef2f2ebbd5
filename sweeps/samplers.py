"""The Optuna sampler and pruner a sweep's settings name (sweep.sampler, sweep.pruner), built with the arguments
each takes; pruning is switched off, with a note, where Optuna cannot prune (several objectives, multi-process
training)."""
from __future__ import annotations

import inspect
import warnings
from typing import Any, Mapping

import optuna

from sweeps.errors import SweepError
from sweeps.settings import SweepSettings


def _build(cls, what: str, name: str, args: dict[str, Any], notes: list[str]):
    """``cls(**args)`` keeping only the arguments ``cls`` takes (switching e.g. sweep.pruner.name=hyperband on
    the command line leaves the YAML's median-only arguments behind: they are ignored with a note)."""
    params = inspect.signature(cls).parameters
    keep = {k: v for k, v in args.items() if k in params}
    dropped = sorted(set(args) - set(keep))
    if dropped:
        notes.append(f"note: sweep.{what} '{name}' ignores {', '.join(dropped)}")
    try:
        return cls(**keep)
    except (TypeError, ValueError) as e:
        raise SweepError(f"sweep.{what} '{name}': {e}") from None


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler in our ask/tell loop: the study's trial budget (sweep.n_trials) ends the loop, and
    study.stop(), which the grid sampler calls once the grid is exhausted, only works inside study.optimize."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


def make_sampler(settings: SweepSettings, notes: list[str] | None = None) -> optuna.samplers.BaseSampler:
    notes = [] if notes is None else notes
    args = dict(settings.sampler)
    name = str(args.pop("name")).lower()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            has_conditions = any(p.when for p in settings.space.params)
            # multivariate + group: joint model of (conditional) parameters; constant_liar: parallel workers
            # see each other's running trials and do not all pick the same point.
            kw = dict(multivariate=True, constant_liar=True, group=has_conditions)
            kw.update(args)
            return _build(optuna.samplers.TPESampler, "sampler", name, kw, notes)
        if name in ("nsga2", "nsgaii"):
            return _build(optuna.samplers.NSGAIISampler, "sampler", name, args, notes)
        if name == "random":
            return _build(optuna.samplers.RandomSampler, "sampler", name, args, notes)
        if name == "grid":  # every combination of the (categorical) choices, each once
            not_categorical = [p.key for p in settings.space.params
                               if not isinstance(p.distribution, optuna.distributions.CategoricalDistribution)]
            if not_categorical:
                raise SweepError(f"sweep.sampler=grid needs categorical parameters; {not_categorical[0]} is not "
                                 f"(give it `choices: [...]`)")
            grid = {p.key: list(p.distribution.choices) for p in settings.space.params}
            return _build(_GridSampler, "sampler", name, {"search_space": grid, **args}, notes)
    raise SweepError(f"sweep.sampler={name!r}: valid samplers: tpe, nsga2, random, grid")


def make_pruner(settings: SweepSettings, trainer_cfg: Mapping[str, Any],
                notes: list[str] | None = None) -> optuna.pruners.BasePruner:
    """The pruner (NopPruner, with a note, where pruning is not supported)."""
    notes = [] if notes is None else notes
    args = dict(settings.pruner)
    name = str(args.pop("name")).lower()
    if name not in ("median", "hyperband", "none", "nop"):
        raise SweepError(f"sweep.pruner={name!r}: valid pruners: median, hyperband, none")
    if name in ("none", "nop"):
        return optuna.pruners.NopPruner()
    if settings.multi_objective:
        notes.append(f"note: pruning is not supported for multi-objective studies (Optuna's Trial.report/"
                     f"should_prune are single-objective); pruner '{name}' disabled, every trial trains to the end")
        return optuna.pruners.NopPruner()
    strategy = str(trainer_cfg.get("strategy", "auto"))
    devices = trainer_cfg.get("devices", 1)
    if "ddp" in strategy or (isinstance(devices, int) and devices > 1) or int(trainer_cfg.get("num_nodes", 1) or 1) > 1:
        notes.append(f"note: pruning is not supported with multi-process training (trainer.strategy={strategy}, "
                     f"trainer.devices={devices}); pruner '{name}' disabled. Run one worker per device instead")
        return optuna.pruners.NopPruner()
    if name == "median":
        return _build(optuna.pruners.MedianPruner, "pruner", name, args, notes)
    # Hyperband on training steps: resources default to the first validation step and trainer.max_steps.
    val_every = trainer_cfg.get("val_check_interval")
    if args.get("min_resource") is None:
        args["min_resource"] = int(val_every) if isinstance(val_every, int) and val_every > 0 else 1
    if args.get("max_resource") is None:
        max_steps = trainer_cfg.get("max_steps")
        args["max_resource"] = int(max_steps) if isinstance(max_steps, int) and max_steps > 0 else "auto"
    return _build(optuna.pruners.HyperbandPruner, "pruner", name, args, notes)


def pruner_name(settings: SweepSettings, pruner) -> str:
    return settings.pruner["name"] if not isinstance(pruner, optuna.pruners.NopPruner) else "none"
