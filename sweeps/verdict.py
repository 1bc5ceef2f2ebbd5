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
from pathlib import Path
from typing import Callable, Mapping

import optuna
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from ablations.compose import CONF_DIR, compose_run, config_dir
from ablations.errors import one_line as _short
from ablations.tracking import client as mlflow_client, tracking_uri
from modules.errors import AblationsError
from sweeps.plan import family_members, plan_seeds
from sweeps.protocol import ProtocolArm, ProtocolSpec, Size, VerdictError, baseline_tokens, load_spec, protocol_uri
from sweeps.study import Sweep
from sweeps.workers import local_cores, start_worker, visible_devices, wait_workers, worker_plan

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


def load_protocol(argv: list[str], conf_dir: Path = CONF_DIR) -> ProtocolSpec:
    """The protocol of a command line, with its seed counts planned by sweeps.plan when it says `seeds: plan`, and the
    baseline's tokens at each size when an arm has `match: tokens`."""
    p = load_spec(argv, conf_dir)
    p.match_tokens = baseline_tokens(p, conf_dir)  # match: tokens arms train the baseline's tokens at each size
    if p.planned:
        p.seeds_by_size = plan_seeds(p, conf_dir=conf_dir)
    return p


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


def check_precision(here: tuple[str, str], earlier: Mapping[str, int]) -> str:
    """The precision every run of the protocol trains in: `here` (precision, why) is what this machine resolves the
    protocol's config to (`trainer.precision=auto`: bf16-mixed where bf16 is native, else 32-true). Refuses
    (VerdictError) to add runs in another precision than the runs already made (`earlier`: precision -> runs), and
    a store whose runs already mix two: a comparison whose seeds trained in two precisions folds a numerics change
    into Δ, and the report could not tell it from the arm's."""
    precision, why = here
    if len(earlier) > 1:
        counts = ", ".join(f"{k}: {n}" for k, n in sorted(earlier.items(), key=lambda kv: -kv[1]))
        raise VerdictError(f"this protocol's runs already trained in {len(earlier)} precisions ({counts}): delete the "
                           "odd ones (`mlflow runs delete --run-id ID`) so its comparisons use one, or choose a new "
                           "verdict.name")
    other = next(iter(earlier), precision)
    if other != precision:
        raise VerdictError(f"{earlier[other]} run(s) of this protocol trained in {other}; here trainer.precision "
                           f"resolves to {precision} ({why}): continue on a machine where it resolves to {other}, "
                           f"or pass trainer.precision={other} (recorded on every run)")
    return precision


def tag_counts(tags: list[Mapping[str, str]], key: str, missing: str | None = None) -> dict[str, int]:
    """value of tag `key` -> number of runs (their `tags`) carrying it; a run without it counts under `missing`, or
    not at all when missing is None."""
    out: dict[str, int] = {}
    for t in tags:
        v = t.get(key, missing)
        if v is not None:
            out[v] = out.get(v, 0) + 1
    return out


def worker_order(arms: list, index: int, count: int) -> list:
    """The arms rotated so that worker `index` of `count` starts a size's lr stage at its own share: every worker
    still searches (or, once another has, reads) every arm's lr, and the results are the same in any order (each
    (lr, seed) is one stored single-trial study), but the workers walk different arms at once instead of queueing
    behind the same running trial."""
    k = len(arms) * index // count if count > 1 else 0
    return arms[k:] + arms[:k]


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
        commit, precision = self.guard()
        self.say(f"commit {commit or 'unknown'}" + (" (verdict.allow_dirty=true: recorded on every run)"
                                                    if p.allow_dirty else " (clean tree)"))
        self.say(f"precision {precision} (every run of the protocol)")
        self.say(f"margin ±{p.margin:g} bpb ({p.margin_reason}); Holm family: {p.holm}; primary: {p.primary_text()}")
        self.say(f"{len(p.arms)} arms ({', '.join(a.name for a in p.arms)}; baseline {p.baseline}) x "
                 f"{len(p.sizes)} sizes ({', '.join(s.name for s in p.sizes)}); lr grid {p.lr_grid}; "
                 "seeds " + ", ".join(f"{len(p.seed_list(i))} at {s.name}" for i, s in enumerate(p.sizes))
                 + (" (sweeps.plan)" if p.seeds_by_size else ""))
        source = next((s for s in p.sizes if s.name == p.lr_transfer_from), None)
        if source is not None:
            self.say(f"lr searched at {source.name} only (seeds {list(p.search_seeds())}, mean per lr) and reused at "
                     "every size: model.parametrization=mup")
            transferred = self.lr_stages(source)
        if p.stop_early:
            self.say(p.sequential.text())
        for i, size in enumerate(p.sizes):
            best = transferred if source is not None else self.lr_stages(size)
            if p.stop_early:
                done = self.sequential_seeds(i, size, best)
            else:
                share = p.my_seeds(i, [a for a in p.arms if best[a.name]])
                done = {a.name: self.seeds_stage(a, size, best[a.name], share[a.name]) for a in p.arms if best[a.name]}
            for arm in p.arms:
                self.summary.append((size.name, arm.name, best[arm.name], done.get(arm.name, 0)))
        for size, arm, lr, done in self.summary:
            self.say(f"size {size} arm {arm}: best lr {lr if lr is not None else 'none (every lr failed)'}, "
                     f"{done} seed run(s) finished")
        self.say(f"report: python -m analysis.report {p.name}")
        return 0 if all(lr is not None for _, _, lr, _ in self.summary) else 1

    def lr_stages(self, size: Size) -> dict[str, float | None]:
        """Every arm's best lr at this size, the baseline's first (the walk starts the other arms from it)."""
        base = next(a for a in self.p.arms if a.name == self.p.baseline)
        best = {base.name: self.lr_stage(base, size)}
        for arm in worker_order([a for a in self.p.arms if a.name != base.name], *self.p.worker):
            best[arm.name] = self.lr_stage(arm, size, start=best[base.name])
        return {a.name: best[a.name] for a in self.p.arms}

    def lr_walk(self, arm: ProtocolArm, size: Size, start: float | None) -> float | None:
        """verdict.lr.search: walk (sweeps/lr_walk.py): each (lr, seed) one single-trial Optuna study, so a probe's
        first seed is reused when the walk confirms it, and a re-run or another worker resumes it."""
        from sweeps import lr_walk

        p, grid = self.p, sorted(arm.lr_grid or self.p.lr_grid)
        ratio = grid[1] / grid[0] if len(grid) > 1 else 2.0
        start = start or grid[(len(grid) - 1) // 2]

        def value(lr, seeds):
            lr = float(f"{lr:.6g}")
            vals = [self._lr_points(arm, size, [lr], f"{p.name}.{size.name}.{arm.name}.lr@{lr:g}/s{s}", (s,))[lr]
                    for s in seeds]
            return sum(vals) / len(vals)

        first, second = p.search_seeds()
        best = float(f"{lr_walk.walk(value, start, ratio, first, second, reverse_first=p.worker[0] % 2 == 1):.6g}")
        mean = value(best, (first, second))
        if mean == float("inf"):
            self.say(f"size {size.name} arm {arm.name}: the walk found no lr that finished; no seeds for this arm")
            return None
        self.say(f"size {size.name} arm {arm.name}: best lr {best:g} by the walk from {start:g}, mean val bpb "
                 f"{mean:.4f} over seeds {[first, second]}")
        return best

    def lr_stage(self, arm: ProtocolArm, size: Size, start: float | None = None) -> float | None:
        """The arm's best lr at this size: every (lr, seed) of the grid once, the lowest mean final val bpb over the
        lr seeds wins (a failed run counts as +inf); while the best lies at an edge and verdict.lr.extend allows,
        the grid grows by one point past that edge (same ratio) and the new point is run. verdict.lr.search: walk
        runs `lr_walk` instead, from `start` (the baseline's lr)."""
        if self.p.lr_search == "walk":
            return self.lr_walk(arm, size, start)
        p, grid = self.p, sorted(arm.lr_grid or self.p.lr_grid)
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

    def _lr_points(self, arm: ProtocolArm, size: Size, lrs: list[float], study_name: str,
                   seeds: tuple[int, ...] | None = None) -> dict[float, float]:
        """Run (or resume) one Optuna grid study over lrs x the lr seeds (`seeds`: these instead); {lr: mean val bpb}
        (+inf if a seed failed)."""
        p, seeds = self.p, list(seeds or self.p.search_seeds())
        space = {"optim.lr": {"type": "categorical", "choices": lrs}}
        if len(seeds) > 1:
            space["seed"] = {"type": "categorical", "choices": seeds}
        patch = {"study_name": study_name, "n_trials": len(lrs) * len(seeds), "storage": p.storage,
                 "mlflow_experiment": p.name, "space": space}
        fixed_seed = [f"seed={seeds[0]}"] if len(seeds) == 1 else []  # else the seed is a grid dimension
        overrides = ["sweep=verdict-lr", *p.run_overrides(arm, size), *fixed_seed]
        sweep = Sweep(overrides, train_fn=_with_tags(self.train_fn, p.tags(arm, size, "lr")), out=self.out,
                      conf_dir=self.conf_dir, sweep_patch=patch)
        study = sweep.run_study()
        values: dict[float, list[float]] = {float(lr): [] for lr in lrs}
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            values[float(t.params["optim.lr"])].append(float(t.value))
        return {lr: (sum(v) / len(v) if len(v) == len(seeds) else float("inf")) for lr, v in values.items()}

    def seeds_stage(self, arm: ProtocolArm, size: Size, lr: float, seeds: list[int]) -> int:
        p, finished = self.p, 0
        tags = {**p.tags(arm, size, "seeds"), "verdict.lr": f"{lr:g}",
                "verdict.lr_from": p.lr_transfer_from or size.name}
        for seed in seeds:
            overrides = [*p.run_overrides(arm, size), f"optim.lr={lr:g}", f"seed={seed}"]
            with config_dir(self.conf_dir, job_name="verdict"):
                try:
                    cfg = compose_run(overrides)
                except (HydraException, OmegaConfBaseException) as e:
                    raise VerdictError(f"config error for arm {arm.name} size {size.name}: {_short(e)}") from None
                earlier = self._earlier_runs(cfg, tags, seed)
                if any(r.info.status == "FINISHED" for r in earlier):
                    finished += 1
                    continue
                self._end_abandoned(cfg, [r for r in earlier if r.info.status == "RUNNING"])
                self.say(f"size {size.name} arm {arm.name}: seed {seed} at lr {lr:g}")
                try:
                    _with_tags(self.train_fn, tags)(cfg)
                    finished += 1
                except AblationsError as e:  # diverged / bad data: the run is FAILED in MLflow; the report lists it
                    self.say(f"size {size.name} arm {arm.name}: seed {seed} failed: {_short(e)}")
        return finished

    def sequential_seeds(self, size_index: int, size: Size, best: Mapping[str, float | None]) -> dict[str, int]:
        """verdict.seeds: sequential. Look by look (verdict.sequential), the baseline and every open comparison's arm
        get the look's seeds (split over the workers as in `my_seeds`); once every run of the look has ended (the
        other workers' too), the declared family is decided by analysis.sequential.decide on the store's values and a
        decided comparison gets no more seeds. The baseline runs while any comparison is open. -> finished runs."""
        p, design = self.p, self.p.sequential
        seeds = p.seed_list(size_index)  # the cap's seeds
        base = next(a for a in p.arms if a.name == p.baseline)
        open_ = [a for a in p.arms if a.name != p.baseline and best[a.name]]
        done: dict[str, int] = {}
        start = 0
        for k, n in enumerate(design.looks()):
            train = [base, *open_] if best[base.name] else []
            pairs = [(a.name, s) for s in seeds[start:n] for a in train]
            i, count = p.worker
            mine = pairs[i::count]
            for a in train:
                done[a.name] = done.get(a.name, 0) + self.seeds_stage(
                    a, size, best[a.name], [s for name, s in mine if name == a.name])
            values = self._wait_for_look(size, {(a.name, s) for a in train for s in seeds[:n]})
            closed = self._decided(size_index, values)
            now = [a.name for a in open_ if a.name in closed]
            open_ = [a for a in open_ if a.name not in closed]
            self.say(f"size {size.name} look {k + 1} ({n} seeds): " + (f"decided {', '.join(now)}; " if now else "")
                     + (f"open {', '.join(a.name for a in open_)}" if open_ else "every comparison decided"))
            start = n
            if not open_:
                break
        if open_:
            self.say(f"size {size.name}: inconclusive at the cap ({design.cap} seeds): "
                     f"{', '.join(a.name for a in open_)}")
        return done

    def _decided(self, size_index: int, values: Mapping[tuple[str, str, int], float]) -> set[str]:
        """The arms at this size whose comparison the sequential rule has decided, on the declared family's values
        (arm, size, seed) -> final val bpb (NaN: the run failed) so far; a look a comparison has no seeds for
        counts as not reached. The rule is analysis.sequential.decided_at, which the report replays."""
        from analysis import sequential as q

        p = self.p
        size = p.sizes[size_index].name
        families = {tuple(family_members(p, a.name, size)) for a in p.arms if a.name != p.baseline}
        orders = {s.name: p.seed_list(i) for i, s in enumerate(p.sizes)}
        return q.decided_at(values, families, size, p.baseline, orders, p.sequential, p.margin)

    def _wait_for_look(self, size: Size, needed: set[tuple[str, int]], poll_s: float = 5.0) -> dict:
        """(arm, size, seed) -> final val bpb of the protocol's seeds-stage runs (NaN: FAILED or KILLED), once every
        (arm, seed) of `needed` at this size has one that ended (another worker may still be training its share)."""
        import time

        client = mlflow_client(protocol_uri(self.p, self.conf_dir))
        said = False
        while True:
            exp = client.get_experiment_by_name(self.p.name)
            runs = [] if exp is None else client.search_runs(
                [exp.experiment_id], f"tags.`verdict.protocol` = '{self.p.name}' and tags.`verdict.stage` = 'seeds'",
                max_results=50000)
            values: dict = {}
            for r in runs:
                if r.info.status not in ("FINISHED", "FAILED", "KILLED") or "seed" not in r.data.tags:
                    continue
                key = (r.data.tags["verdict.arm"], r.data.tags["verdict.size"], int(r.data.tags["seed"]))
                v = r.data.metrics.get("final_val_bpb") if r.info.status == "FINISHED" else None
                if key not in values or v is not None:  # a FINISHED run wins over a failed attempt
                    values[key] = float("nan") if v is None else float(v)
            missing = [(a, s) for a, s in needed if (a, size.name, s) not in values]
            if not missing:
                return values
            if not said:
                self.say(f"size {size.name}: waiting for {len(missing)} run(s) of the look on other workers")
                said = True
            time.sleep(poll_s)

    def guard(self) -> tuple[str | None, str]:
        """(commit, precision) every run of the protocol uses: check_commit, then check_precision against this
        machine's, both on the tags of the protocol's runs so far (one search of the store)."""
        earlier = self._earlier_tags()
        commit = check_commit(self.repo, self.p.allow_dirty, tag_counts(earlier, "git_commit", missing="unknown"))
        return commit, check_precision(self._machine_precision(), tag_counts(earlier, "precision"))

    def _machine_precision(self) -> tuple[str, str]:
        """(precision, why) of the baseline's config at the first size on this machine, resolved by the function
        every run resolves it with (ablations.train.resolve_hardware)."""
        from ablations.train import resolve_hardware  # Lightning takes seconds to import: on use

        base = next(a for a in self.p.arms if a.name == self.p.baseline)
        with config_dir(self.conf_dir, job_name="verdict"):
            try:
                cfg = compose_run(self.p.run_overrides(base, self.p.sizes[0]))
            except (HydraException, OmegaConfBaseException) as e:
                raise VerdictError(f"config error for arm {base.name} size {self.p.sizes[0].name}: {_short(e)}") from None
        hw = resolve_hardware(cfg)
        return hw.precision, hw.precision_reason

    def _earlier_tags(self) -> list[Mapping[str, str]]:
        """The tags of each of this protocol's runs already in MLflow (any stage, any status)."""
        client = mlflow_client(protocol_uri(self.p, self.conf_dir))
        exp = client.get_experiment_by_name(self.p.name)
        if exp is None:
            return []
        runs = client.search_runs([exp.experiment_id], f"tags.`verdict.protocol` = '{self.p.name}'", max_results=50000)
        return [r.data.tags for r in runs]

    def _earlier_runs(self, cfg, tags: Mapping[str, str], seed: int) -> list:
        """This (protocol, arm, size, seeds stage, seed)'s runs already in MLflow, any status."""
        client = mlflow_client(tracking_uri(cfg))
        exp = client.get_experiment_by_name(self.p.name)
        if exp is None:
            return []
        keys = ("verdict.protocol", "verdict.arm", "verdict.size", "verdict.stage")
        filt = " and ".join(f"tags.`{k}` = '{tags[k]}'" for k in keys)
        return client.search_runs([exp.experiment_id], f"{filt} and tags.seed = '{seed}'", max_results=100)

    def _end_abandoned(self, cfg, running: list) -> None:
        """End as KILLED the RUNNING runs of a seed this worker is about to run: each seed belongs to one worker
        (ProtocolSpec.my_seeds), so such a run is an earlier attempt whose process died (kill -9, a machine or
        session that ended) without closing it; its re-run replaces it and no run stays RUNNING."""
        client = mlflow_client(tracking_uri(cfg))
        for r in running:
            client.set_tag(r.info.run_id, "failure_reason", "abandoned: its process ended without closing the run; "
                                                             "the protocol re-ran this seed")
            client.set_terminated(r.info.run_id, status="KILLED")
            self.say(f"ended abandoned run {r.info.run_id} (RUNNING, its process gone) as KILLED")


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
            Verdict(p, conf_dir=conf).guard()
            return launch(argv, p)
        return Verdict(p, train_fn=train_fn, conf_dir=conf).run()

    return exit_code(go)


def launch(argv: list[str], p: ProtocolSpec, out=None) -> int:
    """verdict.workers=N: N copies of this command on this machine (placed by sweeps.workers.worker_plan: disjoint
    cores, one thread each unless threads= is given), worker i with verdict.worker=i/N. They share every lr study
    through the Optuna storage (each grid point runs once; a worker waits for the others' trials) and split every
    size's seeds (ProtocolSpec.my_seeds), so every run happens exactly once. Returns the first non-zero exit code."""
    out = out or sys.stdout
    slots = worker_plan(p.workers, visible_devices(), local_cores())
    base = [a for a in argv if not a.lstrip("+~").startswith(("verdict.workers=", "verdict.worker="))]
    user_threads = any(a.lstrip("+~").startswith("threads=") for a in base)
    procs = []
    for i, slot in enumerate(slots):
        extra = ["++verdict.workers=1", f"++verdict.worker={i}/{len(slots)}",  # ++: also where the file lacks the key
                 *([] if user_threads else slot.overrides)]
        procs.append(start_worker("sweeps.verdict", [*base, *extra], slot))
        print(f"[verdict {p.name}] worker {i}/{len(slots)}: pid {procs[-1].pid}, cores {slot.cores}", file=out,
              flush=True)
    codes = wait_workers(procs)
    print(f"[verdict {p.name}] workers done, exit codes {codes}", file=out, flush=True)
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main())
