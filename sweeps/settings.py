"""A sweep's settings: conf/sweep/<name>.yaml composed with the command line and checked key by key
(`SweepSettings`), the sweep the command line names (`sweep_name`), and what every trial starts from and the space
left to search (`search_plan`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from ablations.compose import CONF_DIR, compose_here
from ablations.errors import one_line
from sweeps.errors import SweepError
from sweeps.space import SearchSpace, SpaceError, format_value
from sweeps.workers import parse_workers

# Keys of the dict ablations.train.train returns (docs/CONTRACTS.md): what an objective may name.
RESULT_METRICS = (
    "val_loss", "val_bpb", "tokens_per_sec", "mfu", "params", "params_non_embedding",
    "kv_cache_bytes_per_token", "decode_tokens_per_sec", "flops_per_token", "steps",
)


def available_sweeps(conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / "sweep").glob("*.yaml"))


def parse_overrides(overrides: list[str]):
    try:
        return OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:  # OverrideParseException
        raise SweepError(f"bad override: {str(e).strip().splitlines()[0]}") from None


def override_key(o) -> str:
    return o.key_or_group


def is_sweep_key(key: str) -> bool:
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


def sweep_name(overrides: list[str], conf_dir: Path) -> tuple[str, list[str]]:
    """(the sweep's name, the overrides every trial gets: all but the sweep group's). One value per key: a Hydra
    multirun sweep (a,b) is refused."""
    parsed = parse_overrides(overrides)
    for o in parsed:
        if o.is_sweep_override():
            raise SweepError(f"override {o.input_line!r} is a Hydra multirun sweep; a sweep samples values from "
                             f"conf/sweep/<name>.yaml instead (one value per key here)")
    names = available_sweeps(conf_dir)
    sweep_names = [o.value() for o in parsed if override_key(o) == "sweep" and not o.is_delete()]
    if not sweep_names or not sweep_names[-1]:
        raise SweepError(f"no sweep given: use sweep=<name>; valid sweeps: {', '.join(names) or '(none)'}")
    name = str(sweep_names[-1])
    if name not in names:
        raise SweepError(f"unknown sweep '{name}'; valid sweeps: {', '.join(names) or '(none)'} "
                         f"(files in {conf_dir / 'sweep'})")
    # Everything but the sweep group itself is applied to each trial (the sweep YAML is not a training config).
    return name, [o.input_line for o in parsed if not is_sweep_key(override_key(o))]


def compose_checked(overrides: list[str]) -> DictConfig:
    """The config of `overrides` inside config_dir(), a Hydra error as one line."""
    try:
        return compose_here(overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise SweepError(f"config error: {one_line(e)}") from None


def values_of(overrides: list[str]) -> dict[str, Any]:
    """key -> python value for simple (non-sweep) overrides, for ``when`` conditions."""
    out = {}
    for o in parse_overrides(overrides):
        if not o.is_sweep_override():  # a sweep (a,b / range) has no single value
            out[override_key(o)] = o.value()
    return out


@dataclass(frozen=True)
class SearchPlan:
    """What this worker searches and what every trial starts from: the space without the keys an override pins,
    the overrides applied to every trial (the sweep's fixed ones, then the user's; later wins per key), and their
    values (for `when` conditions)."""
    space: SearchSpace
    base: list[str]
    fixed_values: dict[str, Any]


def search_plan(settings: SweepSettings, trial_user_overrides: list[str], say) -> SearchPlan:
    """Step 2: the overrides every trial starts from and the space left to search (a key an override fixes is
    not searched)."""
    fixed = parse_overrides(settings.overrides)
    user = parse_overrides(trial_user_overrides)
    user_keys = {override_key(o) for o in user}
    base = [o.input_line for o in fixed if override_key(o) not in user_keys] + [o.input_line for o in user]
    keys = {override_key(o) for o in fixed} | user_keys
    if settings.mlflow_experiment is not None or not ({"tracking.experiment", "experiment"} & keys):
        exp = settings.mlflow_experiment or settings.study_name
        base = [m for m in base if override_key(parse_overrides([m])[0]) != "tracking.experiment"]
        base.append(f"tracking.experiment={format_value(exp)}")
    fixed_values = values_of(base)
    pinned = {k for k in settings.space.keys if k in fixed_values}
    if pinned:
        say(f"not searching {', '.join(sorted(pinned))}: fixed by an override")
    space = settings.space.without(pinned)
    if not space.params:
        raise SweepError("every parameter of the search space is fixed by an override: nothing to search")
    return SearchPlan(space, base, fixed_values)
