"""The sweep worker: create/join an Optuna study and run trials through ``ablations.train.train`` until the
study's trial budget (``sweep.n_trials``, a total over all workers and invocations) is used up.

Every worker runs the same loop, so N workers are just N copies of ``python -m sweeps.run sweep=... `` pointed
at the same storage:

1. under the study's budget lock: fail trials whose worker stopped sending heartbeats (and re-queue each once),
   count the trials that use the budget, and ``ask`` for a trial (a queued/retried one first) if any is left;
2. compose the trial's config with Hydra (user overrides + the sweep's fixed overrides + sampled values),
   validate the model config, train, report ``val/loss`` to the pruner at every validation;
3. ``tell`` Optuna COMPLETE / PRUNED / FAIL (user attr ``fail_reason``) and tag the MLflow run ``optuna.state``.

When the budget is used up a worker waits (``sweep.wait_for_running``) while other workers' trials still run,
so a trial whose worker dies is retried rather than lost; then it prints the best trial(s) / Pareto front.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import optuna
import torch
from hydra.errors import HydraException
from mlflow.exceptions import MlflowException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException
from optuna.trial import FrozenTrial, TrialState

from ablations.compose import CONF_DIR, compose_here, compose_run, config_dir
from ablations.errors import one_line
from ablations.tracking import tracking_uri
from modules.errors import AblationsError

from sweeps.space import SearchSpace, SpaceError, format_value, to_overrides
from sweeps.storage import (
    BudgetLock,
    Heartbeat,
    budget_used,
    check_url,
    fail_stale_trials,
    make_storage,
    mask_url,
    normalize_url,
    retried_numbers,
)

log = logging.getLogger("sweeps")
# Heartbeats, retry callback, metric names, multivariate TPE: all "experimental" in Optuna 5 and used on purpose.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

# Keys of the dict ablations.train.train returns (docs/CONTRACTS.md): what an objective may name.
RESULT_METRICS = (
    "val_loss", "val_bpb", "tokens_per_sec", "mfu", "params", "params_non_embedding",
    "kv_cache_bytes_per_token", "decode_tokens_per_sec", "flops_per_token", "steps",
)
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)

TrainFn = Callable[..., Mapping[str, Any]]


class SweepError(AblationsError):
    """A user-facing error: the CLI prints it as one line and exits non-zero."""


# --------------------------------------------------------------------------------------------------- config


def available_sweeps(conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / "sweep").glob("*.yaml"))


def parse_overrides(overrides: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:  # OverrideParseException
        raise SweepError(f"bad override: {str(e).strip().splitlines()[0]}") from None


def _override_key(o) -> str:
    return o.key_or_group


def _is_sweep_key(key: str) -> bool:
    return key == "sweep" or key.startswith("sweep.") or key.startswith("sweep@")


@dataclass
class Objective:
    metric: str
    direction: str  # minimize | maximize


@dataclass
class SweepSettings:
    name: str
    study_name: str
    n_trials: int
    storage: str
    objectives: list[Objective]
    sampler: dict[str, Any]
    pruner: dict[str, Any]
    monitor: str
    heartbeat_interval: int | None
    grace_period: int | None
    max_retry: int | None
    wait_for_running: bool
    timeout: float | None
    mlflow_experiment: str | None
    overrides: list[str]
    enqueue: list[dict[str, Any]]
    space: SearchSpace
    workers: int | str = 1  # processes on this machine (sweep.workers=N|auto): see launch_workers

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    @classmethod
    def from_config(cls, name: str, sweep: Mapping[str, Any]) -> "SweepSettings":
        s = dict(sweep)

        def pop(key: str, default: Any = None) -> Any:
            return s.pop(key, default)

        def as_named(value: Any, what: str) -> dict[str, Any]:
            if value is None:
                return {"name": "none"}
            if isinstance(value, str):
                return {"name": value}
            if isinstance(value, Mapping) and "name" in value:
                return dict(value)
            raise SweepError(f"sweep.{what}: expected a name or a mapping with 'name', got {value!r}")

        objectives = []
        for i, o in enumerate(pop("objectives") or []):
            if isinstance(o, str):
                o = {"metric": o}
            metric, direction = o.get("metric"), str(o.get("direction", "minimize")).lower()
            if metric not in RESULT_METRICS:
                raise SweepError(f"sweep.objectives[{i}].metric={metric!r}: valid metrics: {', '.join(RESULT_METRICS)}")
            if direction not in ("minimize", "maximize"):
                raise SweepError(f"sweep.objectives[{i}].direction={direction!r}: valid: minimize, maximize")
            objectives.append(Objective(metric, direction))
        if not objectives:
            raise SweepError("sweep.objectives is empty: give e.g. [{metric: val_bpb, direction: minimize}]")
        try:
            n_trials = int(pop("n_trials", 10))
        except (TypeError, ValueError):
            raise SweepError(f"sweep.n_trials must be an integer, got {sweep.get('n_trials')!r}") from None
        if n_trials < 1:
            raise SweepError(f"sweep.n_trials must be >= 1, got {n_trials}")
        try:
            space = SearchSpace.from_config(pop("space"))
        except SpaceError as e:
            raise SweepError(str(e)) from None
        enqueue = [dict(p) for p in (pop("enqueue") or [])]
        settings = cls(
            name=name,
            study_name=str(pop("study_name") or name),
            n_trials=n_trials,
            storage=str(pop("storage") or "sqlite:///optuna.db"),
            objectives=objectives,
            sampler=as_named(pop("sampler", "tpe"), "sampler"),
            pruner=as_named(pop("pruner", "none"), "pruner"),
            monitor=str(pop("monitor", "val/loss")),
            heartbeat_interval=pop("heartbeat_interval", 60),
            grace_period=pop("grace_period", 180),
            max_retry=pop("max_retry", 1),
            wait_for_running=bool(pop("wait_for_running", True)),
            timeout=pop("timeout"),
            mlflow_experiment=pop("mlflow_experiment"),
            overrides=[str(o) for o in (pop("overrides") or [])],
            enqueue=enqueue,
            space=space,
            workers=parse_workers(pop("workers", 1)),
        )
        s.pop("description", None)
        if s:
            raise SweepError(f"conf/sweep/{name}.yaml: unknown key(s) {sorted(s)}")
        return settings


def _build(cls, what: str, name: str, args: dict[str, Any], notes: list[str]):
    """``cls(**args)`` keeping only the arguments ``cls`` takes (switching e.g. sweep.pruner.name=hyperband on
    the command line leaves the YAML's median-only arguments behind: they are ignored with a note)."""
    import inspect

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


# --------------------------------------------------------------------------------------------------- mlflow


class MlflowLinks:
    """Small MLflow client wrapper: find a trial's run by tags and tag its final Optuna state."""

    def __init__(self, uri: str, experiment: str | None):
        self.uri = uri
        self.experiment = experiment
        self._client = None

    @property
    def client(self):
        if self._client is None:
            from ablations.tracking import client

            self._client = client(self.uri)
        return self._client

    def check(self) -> None:
        """Fail fast (one line) when the tracking store cannot be used; creates its tables on first use."""
        try:
            from ablations.tracking import check_reachable

            check_reachable(self.uri)
        except AblationsError as e:  # ablations' TrackingError
            raise SweepError(str(e)) from None
        try:
            self.client.search_experiments(max_results=1)
            if self.experiment and self.client.get_experiment_by_name(self.experiment) is None:
                from ablations.tracking import get_or_create_experiment

                get_or_create_experiment(self.client, self.uri, self.experiment)
        except MlflowException as e:
            raise SweepError(f"MLflow tracking store {mask_url(self.uri)} cannot be used: {one_line(e)}") from None

    def find_run(self, study_name: str, number: int) -> str | None:
        try:
            exp = self.client.get_experiment_by_name(self.experiment) if self.experiment else None
            ids = [exp.experiment_id] if exp is not None else [e.experiment_id for e in self.client.search_experiments()]
            runs = self.client.search_runs(
                ids, filter_string=f"tags.`optuna.study` = '{study_name}' and tags.`optuna.trial` = '{number}'",
                order_by=["attributes.start_time DESC"], max_results=1)
            return runs[0].info.run_id if runs else None
        except MlflowException as e:
            log.debug("MLflow lookup failed: %s", e)
            return None

    def run_url(self, run_id: str) -> str | None:
        """The run's page in the MLflow UI, when tracking goes to an MLflow server (http/https)."""
        if not self.uri.startswith(("http://", "https://")):
            return None
        try:
            exp_id = self.client.get_run(run_id).info.experiment_id
            return f"{self.uri.rstrip('/')}/#/experiments/{exp_id}/runs/{run_id}"
        except MlflowException:
            return None

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        try:
            for k, v in tags.items():
                self.client.set_tag(run_id, k, v)
        except MlflowException as e:
            print(f"warning: could not tag MLflow run {run_id}: {type(e).__name__}: {e}", file=sys.stderr)

    def kill_if_running(self, run_id: str, reason: str) -> None:
        try:
            run = self.client.get_run(run_id)
            if run.info.status == "RUNNING":
                self.client.set_tag(run_id, "failure_reason", reason)
                self.client.set_terminated(run_id, status="KILLED")
        except MlflowException as e:
            log.debug("could not end MLflow run %s: %s", run_id, e)


# --------------------------------------------------------------------------------------------------- worker


def _values_of(overrides: list[str]) -> dict[str, Any]:
    """key -> python value for simple (non-sweep) overrides, for ``when`` conditions."""
    out = {}
    for o in parse_overrides(overrides):
        if not o.is_sweep_override():  # a sweep (a,b / range) has no single value
            out[_override_key(o)] = o.value()
    return out


# --------------------------------------------------------------------------------------------------- workers
# sweep.workers=N|auto: N copies of this command on this machine, all in the same study (the storage's budget lock
# keeps n_trials exact, as for workers on several machines). They share the SQLite default: docs/sweeps.md has the
# measurement that chose it over Optuna's journal file.


def parse_workers(value: Any) -> int | str:
    """sweep.workers: a positive integer or "auto" (one per visible GPU; on CPU one per core)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit() \
            or int(value) < 1:
        raise SweepError(f"sweep.workers={value!r} must be a positive integer or auto (one process per visible GPU, "
                         f"on CPU one per core)")
    return int(value)


def visible_devices(environ: Mapping[str, str] | None = None, device_count: Callable[[], int] | None = None) -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries: that variable's list when set (empty: none),
    else 0 .. torch.cuda.device_count()-1."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [d.strip() for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip() and d.strip() != "-1"]
    count = device_count() if device_count is not None else (torch.cuda.device_count() if torch.cuda.is_available()
                                                             else 0)
    return [str(i) for i in range(count)]


@dataclass
class WorkerSlot:
    """Where one local worker runs: its environment (CUDA_VISIBLE_DEVICES or OMP_NUM_THREADS), its CPU cores and
    the overrides added to its command line."""
    env: dict[str, str]
    cores: list[int]
    overrides: list[str]


def worker_plan(workers: int | str, devices: list[str], cores: list[int]) -> list[WorkerSlot]:
    """One slot per worker. With GPUs: worker i sees only devices[i % len(devices)] (auto: one per GPU), and the
    cores are split between them. On CPU (no devices): the cores are split into disjoint sets (auto: one worker
    per core), each worker pinned to its set and training with that many threads; more workers than cores share
    cores one each."""
    n = (len(devices) or len(cores)) if workers == "auto" else int(workers)
    n = max(1, n)
    per = max(1, len(cores) // n)
    slots = []
    for i in range(n):
        mine = cores[i * per:(i + 1) * per] if (i + 1) * per <= len(cores) else [cores[i % len(cores)]]
        env = {"OMP_NUM_THREADS": str(len(mine))}
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = devices[i % len(devices)]
        slots.append(WorkerSlot(env=env, cores=mine, overrides=[f"threads={len(mine)}"]))
    return slots


def local_cores() -> list[int]:
    """The CPU cores this process may run on."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def start_worker(module: str, argv: list[str], slot: WorkerSlot):
    """`python -m <module> <argv>` in the slot's environment, pinned to its cores -> the subprocess.Popen."""
    import subprocess

    def pin(cores=slot.cores):
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)

    return subprocess.Popen([sys.executable, "-m", module, *argv], env={**os.environ, **slot.env}, preexec_fn=pin)


def wait_workers(procs: list) -> list[int]:
    """The exit codes of every worker. Ctrl-C reaches the workers too (one process group): they are left to end
    their trials before the interrupt goes on."""
    try:
        return [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:
            p.wait()
        raise


def launch_workers(user_overrides: list[str], settings: SweepSettings, out=None) -> int:
    """Start settings.workers copies of `python -m sweeps.run` (each with sweep.workers=1) placed by worker_plan,
    wait for all, return the first non-zero exit code (0 when all succeeded)."""
    out = out or sys.stdout
    cores = local_cores()
    devices = visible_devices()
    slots = worker_plan(settings.workers, devices, cores)
    base = [o for o in user_overrides if not o.lstrip("+~").startswith("sweep.workers=")]
    user_threads = any(o.lstrip("+~").startswith("threads=") for o in base)
    seed = settings.sampler.get("seed")
    where = f"GPUs {','.join(devices)}" if devices else f"{len(cores)} CPU cores"
    print(f"[sweep {settings.study_name}] {len(slots)} local workers on {where}, one study in "
          f"{mask_url(settings.storage)}", file=out, flush=True)
    procs = []
    for i, slot in enumerate(slots):
        extra = ["sweep.workers=1"] + ([] if user_threads else slot.overrides)
        if seed is not None:  # equal seeds would sample equal start-up points in every worker
            extra.append(f"sweep.sampler.seed={int(seed) + i}")
        procs.append(start_worker("sweeps.run", [*base, *extra], slot))
        print(f"[sweep {settings.study_name}] worker {i}: pid {procs[-1].pid}, "
              + ", ".join(f"{k}={v}" for k, v in slot.env.items()) + f", cores {slot.cores}", file=out, flush=True)
    codes = wait_workers(procs)
    print(f"[sweep {settings.study_name}] workers done, exit codes {codes}", file=out, flush=True)
    return next((c for c in codes if c), 0)


@dataclass(frozen=True)
class SearchPlan:
    """What this worker searches and what every trial starts from: the space without the keys an override pins,
    the overrides applied to every trial (the sweep's fixed ones, then the user's; later wins per key), and their
    values (for `when` conditions)."""
    space: SearchSpace
    base: list[str]
    fixed_values: dict[str, Any]


@dataclass(frozen=True)
class OpenStudy:
    """The study joined (or created) in its storage, with the storage (heartbeats) and the study's budget lock."""
    study: optuna.Study
    storage: Any
    lock: BudgetLock
    created: bool


class Sweep:
    """One worker of one study: settings -> search space -> storage and study -> loop, each step returning what
    the next one takes. ``run()`` returns the process exit code; ``run_study()`` the study (sweeps.verdict)."""

    def __init__(self, overrides: list[str], train_fn: TrainFn | None = None, out=None, conf_dir: Path = CONF_DIR,
                 sweep_patch: Mapping[str, Any] | None = None):
        """sweep_patch: keys that replace those of conf/sweep/<name>.yaml (for callers such as sweeps.verdict that
        build a study programmatically, e.g. a space whose keys contain dots and so cannot be a Hydra override)."""
        self.out = out or sys.stdout
        self.sweep_patch = dict(sweep_patch or {})
        self.conf_dir = Path(conf_dir)
        self.train_fn = train_fn
        self.user_overrides = list(overrides)
        self.name, self.trial_user_overrides = _sweep_name(self.user_overrides, self.conf_dir)

    def run(self) -> int:
        """Start the local workers (sweep.workers > 1) or be the one worker."""
        with config_dir(self.conf_dir, job_name="sweep"):
            settings = self.read_settings()
            if settings.workers != 1:
                return launch_workers(self.user_overrides, settings, out=self.out)
            self.work(settings)
        return 0

    def run_study(self) -> optuna.Study:
        """This process's share of the study's trials; the study, every worker's trials in it."""
        with config_dir(self.conf_dir, job_name="sweep"):
            return self.work(self.read_settings())

    def read_settings(self) -> SweepSettings:
        """Step 1: conf/sweep/<name>.yaml as composed with the command line (and sweep_patch), checked."""
        root = _compose(self.user_overrides)
        sweep_cfg = OmegaConf.to_container(root.sweep, resolve=True) if root.get("sweep") else None
        if not sweep_cfg:
            raise SweepError(f"conf/sweep/{self.name}.yaml is empty")
        sweep_cfg.update(self.sweep_patch)
        return SweepSettings.from_config(self.name, sweep_cfg)

    def work(self, settings: SweepSettings) -> optuna.Study:
        """Steps 2-4 inside config_dir(): the search plan, the study in its storage, then trials until the budget is
        used; prints the summary and returns the study."""
        say = _sayer(settings.study_name, self.out)
        search = search_plan(settings, self.trial_user_overrides, say)
        probe = _compose(search.base)  # the base config must compose before the storage is touched
        links = MlflowLinks(tracking_uri(probe), OmegaConf.select(probe, "tracking.experiment", default=None))
        notes: list[str] = []
        sampler = make_sampler(settings, notes)
        trainer_cfg = OmegaConf.to_container(probe.trainer, resolve=True) if "trainer" in probe else {}
        pruner = make_pruner(settings, trainer_cfg, notes)
        pruning = not isinstance(pruner, optuna.pruners.NopPruner)
        for note in notes:
            say(note)
        opened = open_study(settings, links, sampler, pruner, say)
        runner = TrialRunner(settings, search, links, opened.storage, pruning, self.train_fn, say)
        try:
            runner.loop(opened.study, opened.lock)
        finally:
            opened.lock.close()
        print(summarize(opened.study, settings), file=self.out, flush=True)
        return opened.study


def _sweep_name(overrides: list[str], conf_dir: Path) -> tuple[str, list[str]]:
    """(the sweep's name, the overrides every trial gets: all but the sweep group's). One value per key: a Hydra
    multirun sweep (a,b) is refused."""
    parsed = parse_overrides(overrides)
    for o in parsed:
        if o.is_sweep_override():
            raise SweepError(f"override {o.input_line!r} is a Hydra multirun sweep; a sweep samples values from "
                             f"conf/sweep/<name>.yaml instead (one value per key here)")
    names = available_sweeps(conf_dir)
    sweep_names = [o.value() for o in parsed if _override_key(o) == "sweep" and not o.is_delete()]
    if not sweep_names or not sweep_names[-1]:
        raise SweepError(f"no sweep given: use sweep=<name>; valid sweeps: {', '.join(names) or '(none)'}")
    name = str(sweep_names[-1])
    if name not in names:
        raise SweepError(f"unknown sweep '{name}'; valid sweeps: {', '.join(names) or '(none)'} "
                         f"(files in {conf_dir / 'sweep'})")
    # Everything but the sweep group itself is applied to each trial (the sweep YAML is not a training config).
    return name, [o.input_line for o in parsed if not _is_sweep_key(_override_key(o))]


def _compose(overrides: list[str]) -> DictConfig:
    """The config of `overrides` inside config_dir(), a Hydra error as one line."""
    try:
        return compose_here(overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise SweepError(f"config error: {one_line(e)}") from None


def _sayer(study_name: str, out) -> Callable[[str], None]:
    def say(msg: str) -> None:
        print(f"[sweep {study_name}] {msg}", file=out, flush=True)
    return say


def search_plan(settings: SweepSettings, trial_user_overrides: list[str], say) -> SearchPlan:
    """Step 2: the overrides every trial starts from and the space left to search (a key an override fixes is
    not searched)."""
    fixed = parse_overrides(settings.overrides)
    user = parse_overrides(trial_user_overrides)
    user_keys = {_override_key(o) for o in user}
    base = [o.input_line for o in fixed if _override_key(o) not in user_keys] + [o.input_line for o in user]
    keys = {_override_key(o) for o in fixed} | user_keys
    if settings.mlflow_experiment is not None or not ({"tracking.experiment", "experiment"} & keys):
        exp = settings.mlflow_experiment or settings.study_name
        base = [m for m in base if _override_key(parse_overrides([m])[0]) != "tracking.experiment"]
        base.append(f"tracking.experiment={format_value(exp)}")
    fixed_values = _values_of(base)
    pinned = {k for k in settings.space.keys if k in fixed_values}
    if pinned:
        say(f"not searching {', '.join(sorted(pinned))}: fixed by an override")
    space = settings.space.without(pinned)
    if not space.params:
        raise SweepError("every parameter of the search space is fixed by an override: nothing to search")
    return SearchPlan(space, base, fixed_values)


def open_study(settings: SweepSettings, links: MlflowLinks, sampler, pruner, say) -> OpenStudy:
    """Step 3: the storage (created on first use), the MLflow store checked, the study created or joined, all
    under the study's budget lock: the first workers on a fresh database would race creating the tables, and two
    workers creating a fresh mlflow.db at once race in MLflow's schema migration."""
    check_url(settings.storage)
    lock = BudgetLock(settings.storage, settings.study_name)
    directions = [o.direction for o in settings.objectives]
    with lock():
        storage = make_storage(settings.storage, settings.heartbeat_interval, settings.grace_period,
                               settings.max_retry, on_stale=_stale_handler(settings, links))
        links.check()
        try:
            study = optuna.create_study(storage=storage, study_name=settings.study_name, sampler=sampler,
                                        pruner=pruner, directions=directions, load_if_exists=False)
            created = True
        except optuna.exceptions.DuplicatedStudyError:
            study = optuna.load_study(study_name=settings.study_name, storage=storage, sampler=sampler, pruner=pruner)
            created = False
        if list(study.directions) != [optuna.study.StudyDirection[d.upper()] for d in directions]:
            have = ", ".join(d.name.lower() for d in study.directions)
            raise SweepError(f"study '{settings.study_name}' in {mask_url(settings.storage)} has directions "
                             f"[{have}], the sweep asks for [{', '.join(directions)}]: use another sweep.study_name")
        if created:
            _describe_new_study(study, settings, links)
    if lock.warning:
        say(f"warning: {lock.warning}")
    n_done = len([t for t in study.get_trials(deepcopy=False) if t.state in FINISHED])
    say(f"{'created' if created else 'joined'} study in {mask_url(settings.storage)}: "
        f"{n_done} finished of n_trials={settings.n_trials} (total over all workers); "
        f"objectives: {', '.join(f'{o.direction} {o.metric}' for o in settings.objectives)}; "
        f"sampler {settings.sampler['name']}, pruner {pruner_name(settings, pruner)}")
    return OpenStudy(study, storage, lock, created)


def pruner_name(settings: SweepSettings, pruner) -> str:
    return settings.pruner["name"] if not isinstance(pruner, optuna.pruners.NopPruner) else "none"


def _describe_new_study(study: optuna.Study, settings: SweepSettings, links: MlflowLinks) -> None:
    """A new study's metric names, user attrs (sweep, objectives, where its runs are) and enqueued points."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([o.metric for o in settings.objectives])
    study.set_user_attr("sweep", settings.name)
    study.set_user_attr("objectives", [f"{o.direction} {o.metric}" for o in settings.objectives])
    study.set_user_attr("mlflow_tracking_uri", mask_url(links.uri))
    study.set_user_attr("mlflow_experiment", links.experiment)
    for params in settings.enqueue[: settings.n_trials]:
        study.enqueue_trial(params, skip_if_exists=True)


def stale_reason(settings: SweepSettings) -> str:
    return (f"worker lost: no heartbeat for {settings.grace_period or 2 * settings.heartbeat_interval}s "
            f"(killed, preempted or out of memory)")


def _stale_handler(settings: SweepSettings, links: MlflowLinks) -> Callable[[optuna.Study, FrozenTrial], None]:
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
                raise
            finally:
                heartbeat.__exit__()

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
        from sweeps.callbacks import MlflowRunIdCallback, OptunaPruningCallback

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
    from modules.config import GPTConfig

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
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _fmt_params(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={format_value(v)}" for k, v in params.items())


def summarize(study: optuna.Study, settings: SweepSettings) -> str:
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    counts = {s: sum(1 for t in trials if t.state == s) for s in TrialState}
    lost = len(retried)
    lines = [
        f"study '{study.study_name}' ({mask_url(settings.storage)}): "
        + ", ".join(f"{counts[s]} {s.name.lower()}" for s in
                    (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING))
        + (f" ({lost} failed trial(s) retried)" if lost else "")
        + f"; budget {budget_used(trials)}/{settings.n_trials}"
    ]
    names = [o.metric for o in settings.objectives]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not complete:
        lines.append("no completed trial yet")
    elif len(names) == 1:
        best = study.best_trial
        lines.append(f"best trial {best.number}: {names[0]}={best.value:.6g}  {_fmt_params(best.params)}  "
                     f"mlflow_run_id={best.user_attrs.get('mlflow_run_id')}")
    else:
        front = sorted(study.best_trials, key=lambda t: t.values[0])
        lines.append(f"Pareto front ({len(front)} trial(s); "
                     + ", ".join(f"{o.direction[:3]} {o.metric}" for o in settings.objectives) + "):")
        for t in front:
            vals = " ".join(f"{n}={v:.6g}" for n, v in zip(names, t.values))
            lines.append(f"  trial {t.number}: {vals}  {_fmt_params(t.params)}  "
                         f"mlflow_run_id={t.user_attrs.get('mlflow_run_id')}")
    url = normalize_url(settings.storage)  # the driver SQLAlchemy can load here (postgresql+psycopg2://...)
    lines.append(f"dashboard: optuna-dashboard {mask_url(url)}    runs: mlflow ui (experiment "
                 f"'{study.user_attrs.get('mlflow_experiment')}')")
    return "\n".join(lines)
