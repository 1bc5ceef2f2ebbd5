"""The trial loop of one worker: under the study's budget lock ask for a trial (a re-queued one first), compose
and validate its config, train it through ``ablations.train.train`` reporting to the pruner, and tell Optuna
COMPLETE / PRUNED / FAIL, tagging its MLflow run the same; a trial whose worker stopped sending heartbeats is
failed, its run ended, and re-queued (`stale_handler`)."""
from __future__ import annotations

import contextlib
import copy
import gc
import math
import os
import socket
import time
import warnings
from typing import Any, Callable, Mapping

import optuna
import torch
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException
from optuna.trial import FrozenTrial, TrialState

from ablations.compose import compose_run
from ablations.errors import one_line
from modules.config import GPTConfig
from modules.errors import AblationsError
from sweeps.callbacks import MlflowRunIdCallback, OptunaPruningCallback
from sweeps.links import MlflowLinks
from sweeps.settings import SearchPlan, SweepSettings
from sweeps.space import format_value, to_overrides
from sweeps.storage import (BudgetLock, Heartbeat, budget_used, fail_stale_trials, mask_url, retry_callback,
                            storage_of)

TrainFn = Callable[..., Mapping[str, Any]]


def stale_reason(settings: SweepSettings) -> str:
    return (f"worker lost: no heartbeat for {settings.grace_period or 2 * settings.heartbeat_interval}s "
            f"(killed, preempted or out of memory)")


def stale_handler(settings: SweepSettings, links: MlflowLinks) -> Callable[[optuna.Study, FrozenTrial], None]:
    """Before a stale trial is re-queued: end its MLflow run and keep run-specific attrs off the retry."""
    def on_stale(study: optuna.Study, trial: FrozenTrial) -> None:
        run_id = trial.user_attrs.get("mlflow_run_id") or links.find_run(study.study_name, trial.number)
        if run_id:
            links.kill_if_running(run_id, stale_reason(settings))
            links.set_tags(run_id, {"optuna.state": "FAIL"})
        # RetryHeartbeatStaleTrialCallback copies user attrs to the retry; these describe the dead attempt only.
        for key in ("mlflow_run_id", "fail_reason", "metrics"):
            trial.user_attrs.pop(key, None)
    return on_stale


class TrialRunner:
    """Step 4: ask, train and tell until the study's budget is used. Holds what every trial reads, set once."""

    def __init__(self, settings: SweepSettings, search: SearchPlan, links: MlflowLinks, storage, pruning: bool,
                 train_fn: TrainFn | None, say: Callable[[str], None]):
        self.settings, self.search, self.links, self.storage = settings, search, links, storage
        self.pruning, self.train_fn, self.say = pruning, train_fn, say

    def loop(self, study: optuna.Study, lock: BudgetLock) -> None:
        settings = self.settings
        started = time.monotonic()
        poll = max(1.0, min(10.0, float(settings.heartbeat_interval or 5)))
        waiting_said = False
        while True:
            if settings.timeout and time.monotonic() - started > float(settings.timeout):
                self.say(f"sweep.timeout={settings.timeout}s reached: no new trials from this worker")
                return
            trial, heartbeat, trials = self._ask(study, lock)
            if trial is None:
                running = [t.number for t in trials if t.state == TrialState.RUNNING]
                if not running or not settings.wait_for_running:
                    return
                if not waiting_said:
                    self.say(f"budget of {settings.n_trials} trials used; waiting for running trial(s) {running} "
                             f"(retried here if their worker died)")
                    waiting_said = True
                time.sleep(poll)
                continue
            waiting_said = False
            try:
                self.run_trial(study, trial)
            except BaseException as e:
                # A bug or Ctrl-C in the worker itself: never leave the trial RUNNING.
                with contextlib.suppress(Exception):
                    if study._storage.get_trial(trial._trial_id).state == TrialState.RUNNING:
                        trial.set_user_attr("fail_reason", f"sweep worker error: {one_line(e)}")
                        study.tell(trial, state=TrialState.FAIL)
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    self._requeue_interrupted(study, trial)
                raise
            finally:
                heartbeat.__exit__()

    def _requeue_interrupted(self, study: optuna.Study, trial: optuna.Trial) -> None:
        """A trial stopped by Ctrl-C or SIGTERM (the worker was stopped; its point did not fail) is re-queued with its
        params by the storage's retry callback, as a trial whose worker died is, so a resumed study runs it again
        instead of counting it as a failed point (an lr walk would read a failed lr as diverged)."""
        storage = storage_of(study)
        with contextlib.suppress(Exception):  # on the way out: a store that cannot take it keeps the FAIL
            retry = retry_callback(storage)
            frozen = copy.deepcopy(storage.get_trial(trial._trial_id))
            if retry is not None and frozen.state == TrialState.FAIL:
                retry(study, frozen)
                self.say(f"trial {frozen.number} interrupted: re-queued, a resumed study runs it again")

    def _ask(self, study: optuna.Study, lock: BudgetLock):
        """Under the budget lock: fail the trials whose worker stopped (re-queued), then ask for a trial if the
        budget allows. -> (trial or None, its heartbeat or None, the study's trials as seen)."""
        settings = self.settings
        with lock():
            if settings.heartbeat_interval:
                stale = fail_stale_trials(study, stale_reason(settings))
                if stale:
                    self.say(f"trial(s) {stale} lost their worker (no heartbeat): marked FAIL, re-queued "
                             f"up to {settings.max_retry} time(s)")
            trials = study.get_trials(deepcopy=False)
            queued = any(t.state == TrialState.WAITING for t in trials)
            if budget_used(trials) >= settings.n_trials and not queued:
                return None, None, trials
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Heartbeat ... supposed to be used with Study.optimize"
                trial = study.ask()
            return trial, Heartbeat(self.storage, trial._trial_id).__enter__(), trials

    def run_trial(self, study: optuna.Study, trial: optuna.Trial) -> TrialState:
        retry_of = study._storage.get_trial(trial._trial_id).system_attrs.get("failed_trial")
        if retry_of is not None:
            trial.set_user_attr("retry_of", int(retry_of))
        prepared = self._trial_config(study, trial, retry_of)
        if isinstance(prepared, TrialState):  # failed before training: nothing ran
            return prepared
        cfg, shown = prepared
        run_ids: list[str] = []
        callbacks = self._trial_callbacks(trial, run_ids)
        train = self.train_fn
        if train is None:
            from ablations.train import train
        try:
            result = train(cfg, callbacks=callbacks, tags=self._trial_tags(study, trial, shown, retry_of))
        except optuna.TrialPruned as e:
            run_id = self._link_run(study, trial, run_ids)
            study.tell(trial, state=TrialState.PRUNED)
            if run_id:
                self.links.set_tags(run_id, {"optuna.state": "PRUNED", "pruned": "true"})
            self.say(f"trial {trial.number} PRUNED ({e}){self._run_note(run_id)}")
            return TrialState.PRUNED
        except KeyboardInterrupt:
            self._link_run(study, trial, run_ids)
            self._fail(study, trial, "interrupted (KeyboardInterrupt)")
            raise
        except (AblationsError, torch.OutOfMemoryError, MemoryError) as e:  # diverged, OOM, bad data/config: FAIL
            # and keep going. Anything else is a bug: the outer loop fails the trial and stops with its traceback.
            return self._fail(study, trial, one_line(e), run_ids)
        finally:
            _free_memory()
        return self._complete(study, trial, result, run_ids)

    def _trial_config(self, study: optuna.Study, trial: optuna.Trial,
                      retry_of: int | None) -> tuple[DictConfig, str] | TrialState:
        """The trial's sampled parameters composed into a validated training config, and how they are shown;
        or the FAIL state when sampling, composing or the model config fails."""
        try:
            params = self.search.space.suggest(trial, self.search.fixed_values)
        except ValueError as e:  # a conditional space / enqueued params mismatch (Optuna raises ValueError)
            return self._fail(study, trial, f"cannot sample parameters: {one_line(e)}")
        sampled = to_overrides(params)
        trial.set_user_attr("overrides", " ".join(sampled))
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")  # which of many workers ran it
        shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={format_value(v)}" for k, v in params.items())
        self.say(f"trial {trial.number} start{f' (retry of {retry_of})' if retry_of is not None else ''}: {shown}")
        try:
            cfg = compose_run(self.search.base + sampled)
        except (HydraException, OmegaConfBaseException) as e:
            return self._fail(study, trial, f"config error: {one_line(e)}")
        try:
            validate_model(cfg)
        except (ValueError, AssertionError) as e:
            return self._fail(study, trial, f"invalid model config: {one_line(e)}")
        return cfg, shown

    def _trial_callbacks(self, trial: optuna.Trial, run_ids: list[str]) -> list[Any]:
        """Lightning callbacks of the trial's training: the MLflow run id into `run_ids` and the trial's user
        attrs as soon as the run exists, and the pruner's report at every validation."""
        def on_run_id(run_id: str) -> None:
            run_ids.append(run_id)
            trial.set_user_attr("mlflow_run_id", run_id)
            url = self.links.run_url(run_id)
            if url:
                trial.set_user_attr("mlflow_run_url", url)

        callbacks: list[Any] = [MlflowRunIdCallback(on_run_id)]
        if self.pruning:
            callbacks.append(OptunaPruningCallback(trial, monitor=self.settings.monitor))
        return callbacks

    def _trial_tags(self, study: optuna.Study, trial: optuna.Trial, shown: str,
                    retry_of: int | None) -> dict[str, str]:
        """The MLflow tags that link the run to its study and trial (and the trial it retries)."""
        tags = {
            "optuna.study": study.study_name,
            "optuna.trial": str(trial.number),
            "optuna.storage": mask_url(self.settings.storage),
            "optuna.sweep": self.settings.name,
            "mlflow.runName": f"{study.study_name} #{trial.number}: {shown}"[:250],
        }
        if retry_of is not None:
            tags["optuna.retry_of"] = str(retry_of)
        return tags

    def _complete(self, study: optuna.Study, trial: optuna.Trial, result: Mapping[str, Any],
                  run_ids: list[str]) -> TrialState:
        """Tell Optuna the objectives of a finished training (FAIL when one is missing or not finite)."""
        run_id = result.get("run_id") or (run_ids[-1] if run_ids else None)
        if run_id:
            trial.set_user_attr("mlflow_run_id", run_id)
        metrics = {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v)}
        trial.set_user_attr("metrics", metrics)
        values = []
        for o in self.settings.objectives:
            v = result.get(o.metric)
            if not isinstance(v, (int, float)) or not math.isfinite(float(v)):
                return self._fail(study, trial, f"objective {o.metric} is {v!r}", run_ids, run_id=run_id)
            values.append(float(v))
        study.tell(trial, values)
        if run_id:
            self.links.set_tags(run_id, {"optuna.state": "COMPLETE"})
        shown = ", ".join(f"{o.metric}={v:.4g}" for o, v in zip(self.settings.objectives, values))
        self.say(f"trial {trial.number} COMPLETE {shown}{self._run_note(run_id)}")
        return TrialState.COMPLETE

    def _link_run(self, study: optuna.Study, trial: optuna.Trial, run_ids: list[str]) -> str | None:
        run_id = run_ids[-1] if run_ids else self.links.find_run(study.study_name, trial.number)
        if run_id and not run_ids:
            trial.set_user_attr("mlflow_run_id", run_id)
        return run_id

    @staticmethod
    def _run_note(run_id: str | None) -> str:
        return f" [mlflow run {run_id}]" if run_id else ""

    def _fail(self, study: optuna.Study, trial: optuna.Trial, reason: str, run_ids: list[str] | None = None,
              run_id: str | None = None) -> TrialState:
        if run_ids is not None and run_id is None:
            run_id = self._link_run(study, trial, run_ids)
        trial.set_user_attr("fail_reason", reason)
        study.tell(trial, state=TrialState.FAIL)
        if run_id:
            self.links.set_tags(run_id, {"optuna.state": "FAIL"})
        self.say(f"trial {trial.number} FAIL: {reason}{self._run_note(run_id)}")
        return TrialState.FAIL


def validate_model(cfg: DictConfig) -> None:
    """Raise ValueError (modules' ConfigError) for an invalid model config, before any weights, data or MLflow run
    exist."""
    probe = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    try:
        vocab = OmegaConf.select(cfg, "model.vocab_size", default=None, throw_on_missing=False)
    except OmegaConfBaseException:  # an interpolation that cannot resolve yet
        vocab = None
    with open_dict(probe):
        probe.model.vocab_size = vocab if isinstance(vocab, int) else 256  # char tokenizer: known at run time
    GPTConfig.from_dict(OmegaConf.to_container(probe.model, resolve=True))


def _free_memory() -> None:
    gc.collect()
    with contextlib.suppress(Exception):
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
