"""Lightning callbacks a sweep passes to ``ablations.train.train``: pruning and MLflow run-id capture."""
from __future__ import annotations

import math
from typing import Any, Callable

import lightning.pytorch as pl
import optuna


def _active_mlflow_run_id(trainer: "pl.Trainer", pl_module: "pl.LightningModule | None" = None) -> str | None:
    """The run the harness logs to: its LightningModule's ``ckpt_meta``, a callback's or logger's ``run_id``,
    else MLflow's fluent active run."""
    meta = getattr(pl_module, "ckpt_meta", None)
    if isinstance(meta, dict) and isinstance(meta.get("mlflow_run_id"), str) and meta["mlflow_run_id"]:
        return meta["mlflow_run_id"]
    for obj in [*(getattr(trainer, "callbacks", None) or []), *(getattr(trainer, "loggers", None) or [])]:
        run_id = getattr(obj, "run_id", None)
        if isinstance(run_id, str) and run_id:
            return run_id
    import mlflow

    run = mlflow.active_run()
    return run.info.run_id if run is not None else None


class MlflowRunIdCallback(pl.Callback):
    """As soon as training starts, store the MLflow run id in the trial's user attrs (``mlflow_run_id``), so
    even a trial that is pruned, fails or whose worker is killed links to its run."""

    def __init__(self, on_run_id: Callable[[str], None]):
        self.on_run_id = on_run_id
        self.run_id: str | None = None

    def _capture(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.run_id is None and trainer.is_global_zero:
            run_id = _active_mlflow_run_id(trainer, pl_module)
            if run_id:
                self.run_id = run_id
                self.on_run_id(run_id)

    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._capture(trainer, pl_module)

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._capture(trainer, pl_module)


class OptunaPruningCallback(pl.Callback):
    """Report ``monitor`` (default ``val/loss``) from ``trainer.callback_metrics`` to Optuna after every
    validation (step = ``trainer.global_step``) and raise :class:`optuna.TrialPruned` when the pruner says so.

    ``train()`` sees an exception named ``TrialPruned`` and ends the MLflow run as KILLED with ``pruned=true``.
    """

    def __init__(self, trial: optuna.Trial, monitor: str = "val/loss"):
        self.trial = trial
        self.monitor = monitor
        self.reported: dict[int, float] = {}

    def on_validation_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        value: Any = trainer.callback_metrics.get(self.monitor)
        if value is None:
            return
        value = float(value)
        step = int(trainer.global_step)
        if step in self.reported:
            return
        self.reported[step] = value
        self.trial.report(value if math.isfinite(value) else float("nan"), step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step}: {self.monitor}={value:.4g}")
