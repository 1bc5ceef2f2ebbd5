"""``python -m sweeps.verdict [verdict=<name>] [experiment=<name>] [verdict.KEY=VALUE ...] [training overrides]``

The verdict protocol: for each model size of a ladder (smallest first) and each arm (a variant of the
experiment), an lr search (an Optuna study on conf/sweep/verdict-lr.yaml: one seed, each lr of a log grid once),
then N seeds at that arm's best lr, every run at the size's compute budget (`trainer.budget.flops`, so each arm's
step count follows from its own FLOPs per token). Every run is one MLflow run tagged with the protocol, the arm,
its family, the size, the stage and (seeds) the lr, so `python -m analysis.report` can find them.

Re-running the same command continues: an lr study resumes up to its grid size (Optuna's trial budget, shared by
any number of workers on one storage), and a seed that already has a FINISHED run is not trained again. The lr
stage's seed (verdict.lr.seed) is never reused by the seeds stage: the winner of a search is biased low, so its
run is not one of the seeds the verdict is computed from.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import optuna
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from modules.errors import AblationsError
from ablations.errors import one_line as _short
from sweeps.study import CONF_DIR, Sweep, SweepError, compose_run, parse_overrides as _parse_overrides, tracking_uri

USAGE = """usage: python -m sweeps.verdict [verdict=<name>] [experiment=<name>] [verdict.KEY=VALUE ...] [overrides]

  verdict=NAME              conf/verdict/NAME.yaml (default: default; arms from the experiment's sweeper params)
  experiment=NAME           the experiment every run uses (or verdict.experiment in the verdict file)
  verdict.seeds=N|plan      seeds per arm and size (verdict.seeds_largest=N at the largest size); plan: from
                            python -m sweeps.plan (the pilot in verdict.plan)
  verdict.margin=M          the smallest effect of interest in bpb, fixed before any run (with verdict.margin_reason)
  verdict.allow_dirty=true  start or continue from uncommitted changes or across commits (recorded on every run)
  verdict.storage=URL       Optuna storage of the lr stages (sqlite:///optuna.db | postgresql://...)
  verdict.lr.grid=[...]     the learning rates each arm tries (one seed each)
  any other override        applied to every run (e.g. threads=1 tracking.uri=sqlite:///study.db)

examples:
  python -m sweeps.verdict experiment=positions
  python -m sweeps.verdict verdict=second-study threads=1
  python -m analysis.report second-study        # the verdicts, scaling fits and compute multipliers"""

STAGES = ("lr", "seeds")
HOLM_SCOPES = ("study", "size", "arm-family")  # one Holm family: every primary comparison / per size / per family+size


class VerdictError(SweepError):
    """A bad protocol description (one line, names the key and the fix)."""


@dataclass(frozen=True)
class Arm:
    name: str
    family: str
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class Size:
    name: str
    budget_flops: float
    overrides: tuple[str, ...]


@dataclass
class ProtocolSpec:
    name: str
    experiment: str | None
    baseline: str
    arms: list[Arm]
    sizes: list[Size]
    seeds: int
    seeds_largest: int
    lr_grid: list[float]
    lr_seed: int
    storage: str
    overrides: list[str]      # the verdict file's, then the user's training overrides
    margin: float = float("nan")  # the smallest effect of interest (bpb), fixed before any run
    margin_reason: str = ""
    holm: str = "study"       # the Holm family (HOLM_SCOPES)
    primary_arms: tuple[str, ...] = ()   # () = every non-baseline arm
    primary_sizes: tuple[str, ...] = ()  # () = every size
    allow_dirty: bool = False
    plan: dict = field(default_factory=dict)  # the seed planner's pilot and targets (verdict.plan)
    seeds_by_size: dict = field(default_factory=dict)  # seeds: plan -> {size: seeds} from sweeps.plan
    lr_seeds: tuple[int, ...] = ()     # the lr stage's seeds (verdict.lr.seeds; () = (lr_seed,)): mean over them
    lr_transfer_from: str | None = None  # search lr at this size only; the other sizes reuse it (needs mup)
    lr_extend: int = 0                 # grid points the lr stage may add beyond an edge until the best is interior
    workers: int = 1                   # local processes (verdict.workers): lr studies shared, seeds split
    worker: tuple[int, int] = (0, 1)   # (this process's index, how many): its share of every size's seeds

    def search_seeds(self) -> tuple[int, ...]:
        return self.lr_seeds or (self.lr_seed,)

    def run_overrides(self, arm: Arm, size: Size) -> list[str]:
        """The training overrides of every run of (arm, size); the user's come last and win."""
        head = [f"experiment={self.experiment}"] if self.experiment else []
        return [*head, f"tracking.experiment={self.name}", *size.overrides,
                f"trainer.budget.flops={size.budget_flops:g}", *arm.overrides, *self.overrides]

    def seed_list(self, size_index: int) -> list[int]:
        """Seeds of the seeds stage: 0, 1, 2, ... skipping the lr stage's seeds."""
        n = self.seeds_largest if size_index == len(self.sizes) - 1 else self.seeds
        n = self.seeds_by_size.get(self.sizes[size_index].name, n)
        skip = set(self.search_seeds())
        return [s for s in range(n + len(skip)) if s not in skip][:n]

    def my_seeds(self, size_index: int, arms: list[Arm]) -> dict[str, list[int]]:
        """arm -> the seeds this worker trains at a size: every worker-th (arm, seed) pair, seed-major so each
        worker gets a mix of arms (all of them with one worker)."""
        pairs = [(a.name, s) for s in self.seed_list(size_index) for a in arms]
        i, n = self.worker
        mine = pairs[i::n]
        return {a.name: [s for name, s in mine if name == a.name] for a in arms}

    def tags(self, arm: Arm, size: Size, stage: str) -> dict[str, str]:
        return {"verdict.protocol": self.name, "verdict.arm": arm.name, "verdict.family": arm.family,
                "verdict.baseline": self.baseline, "verdict.size": size.name, "verdict.stage": stage,
                "verdict.budget_flops": f"{size.budget_flops:g}", "verdict.margin": f"{self.margin:g}",
                "verdict.margin_reason": self.margin_reason[:5000], "verdict.holm": self.holm,
                "verdict.primary": self.primary_text(), "verdict.allow_dirty": str(self.allow_dirty).lower()}

    def primary_text(self) -> str:
        """The primary comparisons as a tag: `arms=a,b;sizes=m` (`*`: every non-baseline arm / every size)."""
        return f"arms={','.join(self.primary_arms) or '*'};sizes={','.join(self.primary_sizes) or '*'}"


# ------------------------------------------------------------------------------------------------ config


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the protocol's overrides, the training overrides); `verdict=X` becomes `+verdict=X` (not in the root
    defaults, so training configs never carry the protocol's keys)."""
    verdict, run = [], []
    for o in _parse_overrides(argv):
        key = o.key_or_group.lstrip("+~")
        if key == "verdict" or key.startswith("verdict."):
            line = o.input_line
            verdict.append("+" + line if key == "verdict" and not line.startswith(("+", "~")) else line)
        else:
            run.append(o.input_line)
    if not any(v.lstrip("+").startswith("verdict=") for v in verdict):
        verdict.insert(0, "+verdict=default")
    return verdict, run


def _need(v: Mapping, key: str, kind, what: str):
    value = v.get(key)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise VerdictError(f"invalid verdict.{key}={value!r}: expected {what}")
    return value


def _arms_from_sweeper(params: Mapping[str, Any] | None, experiment: str | None) -> list[Arm]:
    """One family's arms from the experiment's `hydra.sweeper.params` (e.g. position: learned,rope,alibi)."""
    swept = {k: v for k, v in (params or {}).items() if k != "seed"}
    if len(swept) != 1:
        raise VerdictError(f"invalid verdict.arms=null: experiment={experiment} sweeps {sorted(swept) or 'nothing'}; "
                           f"arms can be derived from exactly one swept key, else list them in verdict.arms")
    (key, choices), = swept.items()
    names = [c.strip() for c in str(choices).split(",") if c.strip()]
    return [Arm(name=c, family=key, overrides=(f"{key}={c}",)) for c in names]


def _arms(v: Mapping, params, experiment) -> list[Arm]:
    raw = v.get("arms")
    if raw is None:
        return _arms_from_sweeper(params, experiment)
    if not isinstance(raw, Mapping) or not raw:
        raise VerdictError(f"invalid verdict.arms={raw!r}: expected a mapping arm -> {{family, overrides}}")
    arms = []
    for name, spec in raw.items():
        if not isinstance(spec, Mapping) or not isinstance(spec.get("overrides", []), list):
            raise VerdictError(f"invalid verdict.arms.{name}={spec!r}: expected {{family: F, overrides: [...]}}")
        arms.append(Arm(str(name), str(spec.get("family") or "arms"), tuple(str(o) for o in spec.get("overrides", []))))
    return arms


def _sizes(v: Mapping) -> list[Size]:
    raw = v.get("sizes")
    if not isinstance(raw, list) or not raw:
        raise VerdictError(f"invalid verdict.sizes={raw!r}: expected a list of {{name, budget_flops, overrides}}")
    sizes = []
    for i, s in enumerate(raw):
        flops = s.get("budget_flops") if isinstance(s, Mapping) else None
        if isinstance(flops, bool) or not isinstance(flops, (int, float)) or flops <= 0:
            raise VerdictError(f"invalid verdict.sizes[{i}].budget_flops={flops!r}: expected FLOPs > 0, e.g. 1.2e12")
        sizes.append(Size(str(s.get("name") or f"size{i}"), float(flops), tuple(str(o) for o in s.get("overrides", []))))
    if len({s.name for s in sizes}) != len(sizes):
        raise VerdictError(f"invalid verdict.sizes: names {[s.name for s in sizes]} repeat; give each a unique name")
    return sizes


def load_protocol(argv: list[str], conf_dir: Path = CONF_DIR) -> ProtocolSpec:
    from hydra import compose, initialize_config_dir

    verdict_ov, run_ov = _split(argv)
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3", job_name="verdict"):
        try:
            root = compose(config_name="config", overrides=[*verdict_ov, *run_ov])
            v = OmegaConf.to_container(root.verdict, resolve=True)
            experiment = next((o.split("=", 1)[1] for o in run_ov if o.startswith("experiment=")), None)
            experiment = experiment or v.get("experiment")
            run_ov = [o for o in run_ov if not o.startswith("experiment=")]
            head = [f"experiment={experiment}"] if experiment else []
            probe = compose(config_name="config", overrides=[*head, *run_ov], return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as e:
            raise VerdictError(f"config error: {_short(e)}") from None
    params = OmegaConf.to_container(probe.hydra.sweeper.params, resolve=True) if probe.hydra.sweeper.get("params") \
        else None
    arms = _arms(v, params, experiment)
    baseline = v.get("baseline") or arms[0].name
    if baseline not in {a.name for a in arms}:
        raise VerdictError(f"invalid verdict.baseline={baseline!r}: choose one of the arms {[a.name for a in arms]}")
    grid = v.get("lr", {}).get("grid")
    if not isinstance(grid, list) or not grid or not all(isinstance(x, (int, float)) and x > 0 for x in grid):
        raise VerdictError(f"invalid verdict.lr.grid={grid!r}: expected a list of learning rates > 0")
    name = v.get("name") or OmegaConf.select(probe, "tracking.experiment") or experiment
    sizes = _sizes(v)
    planned = v.get("seeds") == "plan"
    p = ProtocolSpec(
        name=str(name), experiment=experiment, baseline=str(baseline), arms=arms, sizes=sizes,
        seeds=1 if planned else _need(v, "seeds", int, "an integer >= 1 or plan"),
        seeds_largest=1 if planned else _need(v, "seeds_largest", int, "an integer >= 1"),
        lr_grid=[float(x) for x in grid], lr_seed=int(v.get("lr", {}).get("seed", 0)),
        storage=_need(v, "storage", str, "an Optuna storage URL"),
        overrides=[*(str(o) for o in v.get("overrides") or []), *run_ov], **_statistics(v, arms, sizes),
        **_lr_search(v.get("lr", {}), sizes, probe), **_workers(v))
    if planned:
        from sweeps.plan import plan_seeds

        p.seeds_by_size = plan_seeds(p)
    return p


def _lr_search(lr: Mapping, sizes: list[Size], probe) -> dict:
    """The lr stage's design: its seeds (the best lr is the one with the lowest mean over them), how far it may extend
    the grid past an edge, and the size it searches at when the lr is transferred (issue 18: mup only)."""
    seeds = lr.get("seeds") or []
    if not isinstance(seeds, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds) \
            or len(set(seeds)) != len(seeds):
        raise VerdictError(f"invalid verdict.lr.seeds={seeds!r}: expected distinct integer seeds, e.g. [100, 101]")
    extend = lr.get("extend", 0)
    if isinstance(extend, bool) or not isinstance(extend, int) or extend < 0:
        raise VerdictError(f"invalid verdict.lr.extend={extend!r}: expected the number of grid points (>= 0) the "
                           "search may add beyond an edge")
    source = lr.get("transfer_from")
    if source is not None:
        if source not in [s.name for s in sizes]:
            raise VerdictError(f"invalid verdict.lr.transfer_from={source!r}: choose one of the sizes "
                               f"{[s.name for s in sizes]}")
        if OmegaConf.select(probe, "model.parametrization", default="sp") != "mup":
            raise VerdictError(f"invalid verdict.lr.transfer_from={source!r} with model.parametrization="
                               f"{OmegaConf.select(probe, 'model.parametrization', default='sp')}: the lr transfers "
                               "across widths only under mup; set model.parametrization=mup (and model.mup.base_width)"
                               " or remove lr.transfer_from")
    return {"lr_seeds": tuple(seeds), "lr_extend": extend, "lr_transfer_from": source}


def _workers(v: Mapping) -> dict:
    """verdict.workers (a positive integer, or auto: one per core / visible GPU) and verdict.worker (i/N: set by
    `launch` for the processes it starts)."""
    import os

    from sweeps.study import parse_workers, visible_devices, worker_plan

    try:
        n = parse_workers(v.get("workers", 1))
    except SweepError:
        raise VerdictError(f"invalid verdict.workers={v.get('workers')!r}: a positive integer or auto") from None
    if n == "auto":
        n = len(worker_plan("auto", visible_devices(), list(range(os.cpu_count() or 1))))
    raw = str(v.get("worker") or "0/1")
    i, _, count = raw.partition("/")
    if not (i.isdigit() and count.isdigit() and 0 <= int(i) < int(count)):
        raise VerdictError(f"invalid verdict.worker={raw!r}: i/N with 0 <= i < N (set by verdict.workers=N)")
    return {"workers": int(n), "worker": (int(i), int(count))}


def _statistics(v: Mapping, arms: list[Arm], sizes: list[Size]) -> dict:
    """The verdicts' settings fixed before any run: margin (and why), the Holm family, the primary comparisons."""
    margin = v.get("margin")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0:
        raise VerdictError(f"invalid verdict.margin={margin!r}: state the smallest effect of interest in bpb before "
                           "any run, e.g. verdict.margin=0.02 verdict.margin_reason='...'")
    reason = v.get("margin_reason")
    if not isinstance(reason, str) or not reason.strip():
        raise VerdictError(f"invalid verdict.margin_reason={reason!r}: say why {margin:g} bpb is the smallest "
                           "effect of interest (printed in the report)")
    holm = v.get("holm", "study")
    if holm not in HOLM_SCOPES:
        raise VerdictError(f"invalid verdict.holm={holm!r}: choose one of {', '.join(HOLM_SCOPES)}")
    primary = v.get("primary") or {}
    if not isinstance(primary, Mapping):
        raise VerdictError(f"invalid verdict.primary={primary!r}: expected {{arms: [...], sizes: [...]}} or null")
    known = {"arms": [a.name for a in arms], "sizes": [s.name for s in sizes]}
    chosen = {}
    for key, names in known.items():
        got = primary.get(key) or []
        bad = [x for x in got if x not in names]
        if not isinstance(got, list) or bad:
            raise VerdictError(f"invalid verdict.primary.{key}={got!r}: expected a list of {', '.join(names)}")
        chosen[key] = tuple(str(x) for x in got)
    allow = v.get("allow_dirty", False)
    if not isinstance(allow, bool):
        raise VerdictError(f"invalid verdict.allow_dirty={allow!r}: expected true or false")
    return {"margin": float(margin), "margin_reason": reason.strip(), "holm": holm,
            "primary_arms": chosen["arms"], "primary_sizes": chosen["sizes"], "allow_dirty": allow,
            "plan": dict(v.get("plan") or {})}


# ------------------------------------------------------------------------------------------------ stages


def _with_tags(train_fn: Callable | None, extra: Mapping[str, str]) -> Callable:
    def run(cfg, callbacks=(), tags=None):
        fn = train_fn
        if fn is None:
            from ablations.train import train as fn
        return fn(cfg, callbacks=callbacks, tags={**(tags or {}), **extra})
    return run


# ------------------------------------------------------------------------------------------------ one commit
REPO = Path(__file__).resolve().parents[1]
# What the runs execute: a change (or an untracked file) here makes the tree dirty; reports/, docs/ do not.
CODE_PATHS = ("ablations", "modules", "sweeps", "analysis", "conf", "scripts", "pyproject.toml")


def git_tree(root: Path) -> tuple[str | None, list[str]]:
    """(HEAD commit, what makes the tree dirty: changed or untracked files under CODE_PATHS) of the git checkout at
    `root`; (None, []) when it is not one."""
    import subprocess

    def git(*args):
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        return r.stdout if r.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if head is None:
        return None, []
    changed = git("status", "--porcelain", "--untracked-files=all", "--", *CODE_PATHS) or ""
    return head.strip(), sorted({ln[3:] for ln in changed.splitlines()})


def check_commit(root: Path, allow_dirty: bool, earlier: Mapping[str, int]) -> str | None:
    """The commit every run of the protocol uses. Refuses (VerdictError) a dirty tree, and runs already made at
    another commit (`earlier`: commit -> runs), unless allow_dirty (then every run carries verdict.allow_dirty)."""
    head, dirty = git_tree(root)
    if allow_dirty:
        return head
    if head is None:
        raise VerdictError(f"{root} is not a git checkout: the report could not name the commit the runs used; "
                           "run from a clone, or pass verdict.allow_dirty=true (recorded on every run)")
    if dirty:
        shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        raise VerdictError(f"the tree has uncommitted changes ({shown}): commit them so every run uses one commit, "
                           "or pass verdict.allow_dirty=true (recorded on every run)")
    other = {c: n for c, n in earlier.items() if c != head}
    if other:
        c, n = max(other.items(), key=lambda kv: kv[1])
        raise VerdictError(f"{sum(other.values())} run(s) of this protocol were made at another commit ({c[:12]}: "
                           f"{n} runs); HEAD is {head[:12]}: check out {c[:12]} to continue, choose a new verdict.name, "
                           "or pass verdict.allow_dirty=true (recorded on every run)")
    return head


class Verdict:
    def __init__(self, protocol: ProtocolSpec, train_fn: Callable | None = None, out=None, conf_dir: Path = CONF_DIR,
                 repo: Path = REPO):
        self.p, self.train_fn, self.out, self.conf_dir = protocol, train_fn, out or sys.stdout, Path(conf_dir)
        self.repo = Path(repo)
        self.summary: list[tuple[str, str, float | None, int]] = []  # (size, arm, best lr, finished seeds)

    def say(self, msg: str) -> None:
        i, n = self.p.worker
        who = f" worker {i}/{n}" if n > 1 else ""
        print(f"[verdict {self.p.name}{who}] {msg}", file=self.out, flush=True)

    def run(self) -> int:
        p = self.p
        commit = check_commit(self.repo, p.allow_dirty, self._earlier_commits())
        self.say(f"commit {commit or 'unknown'}" + (" (verdict.allow_dirty=true: recorded on every run)"
                                                    if p.allow_dirty else " (clean tree)"))
        self.say(f"margin ±{p.margin:g} bpb ({p.margin_reason}); Holm family: {p.holm}; primary: {p.primary_text()}")
        self.say(f"{len(p.arms)} arms ({', '.join(a.name for a in p.arms)}; baseline {p.baseline}) x "
                 f"{len(p.sizes)} sizes ({', '.join(s.name for s in p.sizes)}); lr grid {p.lr_grid}; "
                 "seeds " + ", ".join(f"{len(p.seed_list(i))} at {s.name}" for i, s in enumerate(p.sizes))
                 + (" (sweeps.plan)" if p.seeds_by_size else ""))
        source = next((s for s in p.sizes if s.name == p.lr_transfer_from), None)
        if source is not None:
            self.say(f"lr searched at {source.name} only (seeds {list(p.search_seeds())}, mean per lr) and reused at "
                     "every size: model.parametrization=mup")
            transferred = {arm.name: self.lr_stage(arm, source) for arm in p.arms}
        for i, size in enumerate(p.sizes):
            best = transferred if source is not None else {arm.name: self.lr_stage(arm, size) for arm in p.arms}
            share = p.my_seeds(i, [a for a in p.arms if best[a.name]])
            for arm in p.arms:
                done = self.seeds_stage(arm, size, best[arm.name], share[arm.name]) if best[arm.name] else 0
                self.summary.append((size.name, arm.name, best[arm.name], done))
        for size, arm, lr, done in self.summary:
            self.say(f"size {size} arm {arm}: best lr {lr if lr is not None else 'none (every lr failed)'}, "
                     f"{done} seed run(s) finished")
        self.say(f"report: python -m analysis.report {p.name}")
        return 0 if all(lr is not None for _, _, lr, _ in self.summary) else 1

    def lr_stage(self, arm: Arm, size: Size) -> float | None:
        """The arm's best lr at this size: every (lr, seed) of the grid once, the lowest mean final val bpb over the
        lr seeds wins (a failed run counts as +inf); while the best lies at an edge and verdict.lr.extend allows,
        the grid grows by one point past that edge (same ratio) and the new point is run."""
        p, grid = self.p, sorted(self.p.lr_grid)
        ratio = grid[1] / grid[0] if len(grid) > 1 else 2.0
        means = self._lr_points(arm, size, grid, f"{p.name}.{size.name}.{arm.name}.lr")
        for _ in range(p.lr_extend):
            best = min(grid, key=lambda lr: means[lr])
            if means[best] == float("inf") or (best not in (grid[0], grid[-1]) and len(grid) > 1):
                break
            new = best / ratio if best == grid[0] and len(grid) > 1 else best * ratio
            self.say(f"size {size.name} arm {arm.name}: best lr {best:g} is at the grid's edge; adding {new:g}")
            grid = sorted([*grid, new])
            means.update(self._lr_points(arm, size, [new], f"{p.name}.{size.name}.{arm.name}.lr+{new:g}"))
        finite = {lr: m for lr, m in means.items() if m != float("inf")}
        if not finite:
            self.say(f"size {size.name} arm {arm.name}: no lr of {grid} finished; no seeds for this arm")
            return None
        best = min(finite, key=finite.get)
        edge = " (at the grid's edge)" if best in (grid[0], grid[-1]) and len(grid) > 1 else ""
        self.say(f"size {size.name} arm {arm.name}: best lr {best:g}{edge}, mean val bpb {finite[best]:.4f} over "
                 f"seeds {list(p.search_seeds())}")
        return float(best)

    def _lr_points(self, arm: Arm, size: Size, lrs: list[float], study_name: str) -> dict[float, float]:
        """Run (or resume) one Optuna grid study over lrs x the lr seeds; {lr: mean val bpb} (+inf if a seed failed)."""
        p, seeds = self.p, list(self.p.search_seeds())
        space = {"optim.lr": {"type": "categorical", "choices": lrs}}
        if len(seeds) > 1:
            space["seed"] = {"type": "categorical", "choices": seeds}
        patch = {"study_name": study_name, "n_trials": len(lrs) * len(seeds), "storage": p.storage,
                 "mlflow_experiment": p.name, "space": space}
        fixed_seed = [f"seed={seeds[0]}"] if len(seeds) == 1 else []  # else the seed is a grid dimension
        overrides = ["sweep=verdict-lr", *p.run_overrides(arm, size), *fixed_seed]
        sweep = Sweep(overrides, train_fn=_with_tags(self.train_fn, p.tags(arm, size, "lr")), out=self.out,
                      conf_dir=self.conf_dir, sweep_patch=patch)
        sweep.run()
        values: dict[float, list[float]] = {float(lr): [] for lr in lrs}
        for t in sweep.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            values[float(t.params["optim.lr"])].append(float(t.value))
        return {lr: (sum(v) / len(v) if len(v) == len(seeds) else float("inf")) for lr, v in values.items()}

    def seeds_stage(self, arm: Arm, size: Size, lr: float, seeds: list[int]) -> int:
        from hydra import initialize_config_dir

        p, finished = self.p, 0
        tags = {**p.tags(arm, size, "seeds"), "verdict.lr": f"{lr:g}",
                "verdict.lr_from": p.lr_transfer_from or size.name}
        for seed in seeds:
            overrides = [*p.run_overrides(arm, size), f"optim.lr={lr:g}", f"seed={seed}"]
            with initialize_config_dir(config_dir=str(self.conf_dir), version_base="1.3", job_name="verdict"):
                try:
                    cfg = compose_run(overrides)
                except (HydraException, OmegaConfBaseException) as e:
                    raise VerdictError(f"config error for arm {arm.name} size {size.name}: {_short(e)}") from None
                if self._finished(cfg, tags, seed):
                    finished += 1
                    continue
                self.say(f"size {size.name} arm {arm.name}: seed {seed} at lr {lr:g}")
                try:
                    _with_tags(self.train_fn, tags)(cfg)
                    finished += 1
                except AblationsError as e:  # diverged / bad data: the run is FAILED in MLflow; the report lists it
                    self.say(f"size {size.name} arm {arm.name}: seed {seed} failed: {_short(e)}")
        return finished

    def _uri(self) -> str:
        from hydra import initialize_config_dir

        with initialize_config_dir(config_dir=str(self.conf_dir), version_base="1.3", job_name="verdict"):
            try:
                return tracking_uri(compose_run(self.p.run_overrides(self.p.arms[0], self.p.sizes[0])))
            except (HydraException, OmegaConfBaseException) as e:
                raise VerdictError(f"config error: {_short(e)}") from None

    def _earlier_commits(self) -> dict[str, int]:
        """commit -> number of runs of this protocol already in MLflow (any stage, any status)."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self._uri())
        exp = client.get_experiment_by_name(self.p.name)
        if exp is None:
            return {}
        runs = client.search_runs([exp.experiment_id], f"tags.`verdict.protocol` = '{self.p.name}'", max_results=50000)
        out: dict[str, int] = {}
        for r in runs:
            c = r.data.tags.get("git_commit", "unknown")
            out[c] = out.get(c, 0) + 1
        return out

    def _finished(self, cfg, tags: Mapping[str, str], seed: int) -> bool:
        """Whether this (protocol, arm, size, seeds stage, seed) already has a FINISHED run in MLflow."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri(cfg))
        exp = client.get_experiment_by_name(self.p.name)
        if exp is None:
            return False
        keys = ("verdict.protocol", "verdict.arm", "verdict.size", "verdict.stage")
        filt = " and ".join(f"tags.`{k}` = '{tags[k]}'" for k in keys)
        runs = client.search_runs([exp.experiment_id], f"{filt} and tags.seed = '{seed}' and "
                                                       f"attributes.status = 'FINISHED'", max_results=1)
        return bool(runs)


def main(argv: list[str] | None = None, train_fn=None, conf_dir: Path | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from sweeps.run import exit_code

    conf = conf_dir or CONF_DIR

    def go() -> int:
        p = load_protocol(argv, conf)
        if p.workers > 1 and p.worker == (0, 1):
            # refuse before starting anything; opening the MLflow store here also creates its tables once (two
            # workers creating them in a fresh SQLite file at once: one fails with 'table ... already exists')
            check_commit(REPO, p.allow_dirty, Verdict(p, conf_dir=conf)._earlier_commits())
            return launch(argv, p)
        return Verdict(p, train_fn=train_fn, conf_dir=conf).run()

    return exit_code(go)


def launch(argv: list[str], p: ProtocolSpec, out=None) -> int:
    """verdict.workers=N: N copies of this command on this machine (placed by sweeps.study.worker_plan: disjoint
    cores, one thread each unless threads= is given), worker i with verdict.worker=i/N. They share every lr study
    through the Optuna storage (each grid point runs once; a worker waits for the others' trials) and split every
    size's seeds (ProtocolSpec.my_seeds), so every run happens exactly once. Returns the first non-zero exit code."""
    import os
    import subprocess

    from sweeps.study import visible_devices, worker_plan

    out = out or sys.stdout
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    slots = worker_plan(p.workers, visible_devices(), cores)
    base = [a for a in argv if not a.lstrip("+~").startswith(("verdict.workers=", "verdict.worker="))]
    user_threads = any(a.lstrip("+~").startswith("threads=") for a in base)
    procs = []
    for i, slot in enumerate(slots):
        extra = ["++verdict.workers=1", f"++verdict.worker={i}/{len(slots)}",  # ++: also where the file lacks the key
                 *([] if user_threads else slot.overrides)]

        def pin(cores=slot.cores):
            if hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, cores)

        procs.append(subprocess.Popen([sys.executable, "-m", "sweeps.verdict", *base, *extra],
                                      env={**os.environ, **slot.env}, preexec_fn=pin))
        print(f"[verdict {p.name}] worker {i}/{len(slots)}: pid {procs[-1].pid}, cores {slot.cores}", file=out,
              flush=True)
    try:
        codes = [proc.wait() for proc in procs]
    except KeyboardInterrupt:  # Ctrl-C reached the workers too (one process group): let them end their runs
        for proc in procs:
            proc.wait()
        raise
    print(f"[verdict {p.name}] workers done, exit codes {codes}", file=out, flush=True)
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main())
