"""One worker of one study: read the sweep's settings, create or join its Optuna study, then run trials through
``ablations.train.train`` until the study's trial budget (``sweep.n_trials``, a total over all workers and
invocations) is used up (`Sweep`).

Every worker runs the same loop, so N workers are just N copies of ``python -m sweeps.run sweep=... `` pointed
at the same storage:

1. the settings: conf/sweep/<name>.yaml composed with the command line (settings.py), its sampler and pruner
   (samplers.py); ``sweep.workers=N`` starts N local copies instead (workers.py);
2. the study, created or joined in its storage (storage.py) under the study's budget lock, the MLflow store
   checked (links.py);
3. the trial loop (trials.py): under the budget lock fail trials whose worker stopped sending heartbeats (and
   re-queue each once), count the trials that use the budget, ``ask`` for a trial if any is left; compose, validate
   and train it, reporting ``val/loss`` to the pruner; ``tell`` Optuna COMPLETE / PRUNED / FAIL and tag the MLflow
   run ``optuna.state``;
4. the summary (summary.py).

When the budget is used up a worker waits (``sweep.wait_for_running``) while other workers' trials still run,
so a trial whose worker dies is retried rather than lost; then it prints the best trial(s) / Pareto front.
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import optuna
from omegaconf import OmegaConf
from optuna.trial import TrialState

from ablations.compose import CONF_DIR, config_dir
from ablations.tracking import tracking_uri
from sweeps.errors import SweepError
from sweeps.samplers import make_pruner, make_sampler, pruner_name
from sweeps.settings import SweepSettings, compose_checked, search_plan, sweep_name
from sweeps.storage import BudgetLock, check_url, make_storage, mask_url
from sweeps.summary import summarize
from sweeps.workers import launch_workers

if TYPE_CHECKING:  # imported where a study opens: a refused command line (an unknown sweep, a bad key) is answered
    #                before torch, Lightning and MLflow are imported (~7 s of CPU of a ~9 s refusal before)
    from sweeps.links import MlflowLinks
    from sweeps.trials import TrainFn

# Heartbeats, retry callback, metric names, multivariate TPE: all "experimental" in Optuna 5 and used on purpose.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


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
        self.name, self.trial_user_overrides = sweep_name(self.user_overrides, self.conf_dir)

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
        root = compose_checked(self.user_overrides)
        sweep_cfg = OmegaConf.to_container(root.sweep, resolve=True) if root.get("sweep") else None
        if not sweep_cfg:
            raise SweepError(f"conf/sweep/{self.name}.yaml is empty")
        sweep_cfg.update(self.sweep_patch)
        return SweepSettings.from_config(self.name, sweep_cfg)

    def work(self, settings: SweepSettings) -> optuna.Study:
        """Steps 2-4 inside config_dir(): the search plan, the study in its storage, then trials until the budget is
        used; prints the summary and returns the study."""
        from sweeps.links import MlflowLinks
        from sweeps.trials import TrialRunner

        say = _sayer(settings.study_name, self.out)
        search = search_plan(settings, self.trial_user_overrides, say)
        probe = compose_checked(search.base)  # the base config must compose before the storage is touched
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


def _sayer(study_name: str, out) -> Callable[[str], None]:
    def say(msg: str) -> None:
        print(f"[sweep {study_name}] {msg}", file=out, flush=True)
    return say


def open_study(settings: SweepSettings, links: MlflowLinks, sampler, pruner, say) -> OpenStudy:
    """Step 3: the storage (created on first use), the MLflow store checked, the study created or joined, all
    under the study's budget lock: the first workers on a fresh database would race creating the tables, and two
    workers creating a fresh mlflow.db at once race in MLflow's schema migration."""
    from sweeps.trials import stale_handler

    check_url(settings.storage)
    lock = BudgetLock(settings.storage, settings.study_name)
    directions = [o.direction for o in settings.objectives]
    with lock():
        storage = make_storage(settings.storage, settings.heartbeat_interval, settings.grace_period,
                               settings.max_retry, on_stale=stale_handler(settings, links))
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
