"""A verdict protocol as written in conf/verdict/<name>.yaml and the command line: its arms, sizes, seeds, lr
search and statistics, checked key by key (`load_spec`), and where its runs are tracked (`protocol_uri`).

sweeps.verdict runs a protocol and sweeps.plan plans its seeds; both read it from here, so neither imports the
other's command.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ablations.compose import CONF_DIR, compose_here, compose_run, config_dir
from ablations.errors import one_line
from ablations.tracking import tracking_uri
from modules.errors import ConfigError
from analysis.sequential import Design, design_from
from sweeps.errors import SweepError
from sweeps.settings import parse_overrides as _parse_overrides
from sweeps.workers import parse_workers, visible_devices, worker_plan

HOLM_SCOPES = ("study", "size", "arm-family")
MATCHES = ("flops", "tokens")  # verdict.arms.<arm>.match: the size's FLOP budget, or the baseline's tokens at the size
LR_SEARCHES = ("grid", "walk")  # verdict.lr.search: the exhaustive grid, or the lean walk (sweeps/lr_walk.py)  # one Holm family: every primary comparison / per size / per family+size


class VerdictError(SweepError):
    """A bad protocol description (one line, names the key and the fix)."""


@dataclass(frozen=True)
class ProtocolArm:
    """One arm of the protocol: a variant of its family, as the training overrides that select it."""
    name: str
    family: str
    overrides: tuple[str, ...]
    lr_grid: tuple[float, ...] = ()  # this arm's own lr grid (verdict.arms.<arm>.lr_grid; () = verdict.lr.grid)
    match: str = "flops"             # MATCHES: what this arm shares with the baseline at a size (its budget)


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
    arms: list[ProtocolArm]
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
    paired: bool = False      # the declared test pairs arms by seed (arms sharing a seed share its data order)
    plan: dict = field(default_factory=dict)  # the seed planner's pilot and targets (verdict.plan)
    seeds_by_size: dict = field(default_factory=dict)  # seeds: plan -> {size: seeds} from sweeps.plan
    lr_seeds: tuple[int, ...] = ()     # the lr stage's seeds (verdict.lr.seeds; () = (lr_seed,)): mean over them
    lr_transfer_from: str | None = None  # search lr at this size only; the other sizes reuse it (needs mup)
    lr_extend: int = 0                 # grid points the lr stage may add beyond an edge until the best is interior
    lr_search: str = "grid"            # verdict.lr.search (LR_SEARCHES)
    workers: int = 1                   # local processes (verdict.workers): lr studies shared, seeds split
    worker: tuple[int, int] = (0, 1)   # (this process's index, how many): its share of every size's seeds
    planned: bool = False              # verdict.seeds: plan (seeds_by_size still to be filled by sweeps.plan)
    recipe: tuple[str, ...] = ()       # verdict.recipe: the training recipe, before the size's, arm's and user's
    sequential: Design | None = None   # verdict.sequential: the group-sequential design (analysis.sequential)
    stop_early: bool = False           # verdict.seeds: sequential (seeds in batches, each comparison stopped once decided)
    match_tokens: dict = field(default_factory=dict)  # size -> the baseline's training tokens there (`baseline_tokens`)

    def search_seeds(self) -> tuple[int, ...]:
        return self.lr_seeds or (self.lr_seed,)

    def run_overrides(self, arm: ProtocolArm, size: Size) -> list[str]:
        """The training overrides of every run of (arm, size): the recipe first, the user's last (they win)."""
        head = [f"experiment={self.experiment}"] if self.experiment else []
        return [*head, f"tracking.experiment={self.name}", *self.recipe, *size.overrides,
                *self.budget_overrides(arm, size), *arm.overrides, *self.overrides]

    def budget_overrides(self, arm: ProtocolArm, size: Size) -> list[str]:
        """The size's FLOP budget, or (match: tokens) the baseline's tokens at the size in its place: the arm then
        runs the baseline's max_steps whatever its own FLOPs per token."""
        if arm.match == "flops":
            return [f"trainer.budget.flops={size.budget_flops:g}"]
        if size.name not in self.match_tokens:  # filled by baseline_tokens (sweeps.verdict.load_protocol)
            raise VerdictError(f"arm {arm.name} has match: tokens but the baseline's tokens at size {size.name} were "
                               "not computed: load the protocol with sweeps.verdict.load_protocol")
        return ["trainer.budget.flops=null", f"trainer.budget.tokens={self.match_tokens[size.name]:d}"]

    def seed_list(self, size_index: int) -> list[int]:
        """Seeds of the seeds stage: 0, 1, 2, ... skipping the lr stage's seeds."""
        n = self.seeds_largest if size_index == len(self.sizes) - 1 else self.seeds
        n = self.seeds_by_size.get(self.sizes[size_index].name, n)
        skip = set(self.search_seeds())
        return [s for s in range(n + len(skip)) if s not in skip][:n]

    def my_seeds(self, size_index: int, arms: list[ProtocolArm]) -> dict[str, list[int]]:
        """arm -> the seeds this worker trains at a size: every worker-th (arm, seed) pair, seed-major so each
        worker gets a mix of arms (all of them with one worker)."""
        pairs = [(a.name, s) for s in self.seed_list(size_index) for a in arms]
        i, n = self.worker
        mine = pairs[i::n]
        return {a.name: [s for name, s in mine if name == a.name] for a in arms}

    def tags(self, arm: ProtocolArm, size: Size, stage: str) -> dict[str, str]:
        return {"verdict.protocol": self.name, "verdict.arm": arm.name, "verdict.family": arm.family,
                "verdict.baseline": self.baseline, "verdict.size": size.name, "verdict.stage": stage,
                "verdict.budget_flops": f"{size.budget_flops:g}", "verdict.margin": f"{self.margin:g}",
                "verdict.margin_reason": self.margin_reason[:5000], "verdict.holm": self.holm,
                "verdict.primary": self.primary_text(), "verdict.allow_dirty": str(self.allow_dirty).lower(),
                "verdict.paired": str(self.paired).lower(), "verdict.match": arm.match,
                **(self.sequential.tags() if self.stop_early and self.sequential else {})}

    def is_primary(self, arm: str, size: str) -> bool:
        """Whether (arm, size) is a primary comparison: in the declared Holm family and the planner's sizing."""
        return (not self.primary_arms or arm in self.primary_arms) and (not self.primary_sizes or size in
                                                                       self.primary_sizes)

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


def _arms_from_sweeper(params: Mapping[str, Any] | None, experiment: str | None) -> list[ProtocolArm]:
    """One family's arms from the experiment's `hydra.sweeper.params` (e.g. position: learned,rope,alibi)."""
    swept = {k: v for k, v in (params or {}).items() if k != "seed"}
    if len(swept) != 1:
        raise VerdictError(f"invalid verdict.arms=null: experiment={experiment} sweeps {sorted(swept) or 'nothing'}; "
                           f"arms can be derived from exactly one swept key, else list them in verdict.arms")
    (key, choices), = swept.items()
    names = [c.strip() for c in str(choices).split(",") if c.strip()]
    return [ProtocolArm(name=c, family=key, overrides=(f"{key}={c}",)) for c in names]


def _arms(v: Mapping, params, experiment) -> list[ProtocolArm]:
    raw = v.get("arms")
    if raw is None:
        return _arms_from_sweeper(params, experiment)
    if not isinstance(raw, Mapping) or not raw:
        raise VerdictError(f"invalid verdict.arms={raw!r}: expected a mapping arm -> {{family, overrides}}")
    arms = []
    for name, spec in raw.items():
        if not isinstance(spec, Mapping) or not isinstance(spec.get("overrides", []), list):
            raise VerdictError(f"invalid verdict.arms.{name}={spec!r}: expected {{family: F, overrides: [...]}}")
        unknown = sorted(set(spec) - {"family", "overrides", "lr_grid", "match"})
        if unknown:
            raise VerdictError(f"invalid verdict.arms.{name}.{unknown[0]}: unknown key; an arm has family, overrides "
                               "and optionally lr_grid and match")
        match = spec.get("match", "flops")
        if match not in MATCHES:
            raise VerdictError(f"invalid verdict.arms.{name}.match={match!r}: choose flops (the size's FLOP budget) or "
                               "tokens (the baseline's tokens at each size)")
        overrides = tuple(str(o) for o in spec.get("overrides", []))
        grid = spec.get("lr_grid") or []
        if not isinstance(grid, list) or not all(_positive(x) for x in grid):
            raise VerdictError(f"invalid verdict.arms.{name}.lr_grid={grid!r}: expected a list of learning rates > 0 "
                               "(or leave it out for verdict.lr.grid)")
        arms.append(ProtocolArm(str(name), str(spec.get("family") or "arms"), overrides,
                                tuple(float(x) for x in grid), match))
    return arms


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


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


def load_spec(argv: list[str], conf_dir: Path = CONF_DIR) -> ProtocolSpec:
    """The protocol a command line describes, every key checked (one line naming it). `verdict.seeds: plan` leaves
    `planned` set and the seed counts at 1: sweeps.verdict.load_protocol asks sweeps.plan for them."""
    verdict_ov, run_ov = _split(argv)
    with config_dir(conf_dir, job_name="verdict"):
        try:
            root = compose_here([*verdict_ov, *run_ov])
            v = OmegaConf.to_container(root.verdict, resolve=True)
            experiment = next((o.split("=", 1)[1] for o in run_ov if o.startswith("experiment=")), None)
            experiment = experiment or v.get("experiment")
            run_ov = [o for o in run_ov if not o.startswith("experiment=")]
            head = [f"experiment={experiment}"] if experiment else []
            probe = compose_here([*head, *run_ov], hydra_config=True)
        except (HydraException, OmegaConfBaseException) as e:
            raise VerdictError(f"config error: {one_line(e)}") from None
    params = OmegaConf.to_container(probe.hydra.sweeper.params, resolve=True) if probe.hydra.sweeper.get("params") \
        else None
    arms = _arms(v, params, experiment)
    baseline = v.get("baseline") or arms[0].name
    if baseline not in {a.name for a in arms}:
        raise VerdictError(f"invalid verdict.baseline={baseline!r}: choose one of the arms {[a.name for a in arms]}")
    grid = v.get("lr", {}).get("grid")
    if not isinstance(grid, list) or not grid or not all(_positive(x) for x in grid):
        raise VerdictError(f"invalid verdict.lr.grid={grid!r}: expected a list of learning rates > 0")
    name = v.get("name") or OmegaConf.select(probe, "tracking.experiment") or experiment
    sizes = _sizes(v)
    planned = v.get("seeds") == "plan"
    stop_early = v.get("seeds") == "sequential"
    try:
        design = design_from(v["sequential"]) if v.get("sequential") is not None else None
    except ConfigError as e:
        raise VerdictError(str(e)) from None
    if stop_early and design is None:
        raise VerdictError("invalid verdict.seeds=sequential without verdict.sequential: give the design, e.g. "
                           "sequential: {first: 3, batch: 3, cap: 12, spending: obrien-fleming, alpha: 0.05}")
    recipe = v.get("recipe") or []
    if not isinstance(recipe, list) or not all(isinstance(o, str) and "=" in o for o in recipe):
        raise VerdictError(f"invalid verdict.recipe={recipe!r}: expected a list of KEY=VALUE training overrides "
                           "(e.g. [optim.schedule=wsd]), or [] for the experiment's own recipe")
    return ProtocolSpec(
        name=str(name), experiment=experiment, baseline=str(baseline), arms=arms, sizes=sizes,
        seeds=design.cap if stop_early else 1 if planned else _need(v, "seeds", int, "an integer >= 1, plan or sequential"),
        seeds_largest=design.cap if stop_early else 1 if planned else _need(v, "seeds_largest", int, "an integer >= 1"),
        lr_grid=[float(x) for x in grid], lr_seed=int(v.get("lr", {}).get("seed", 0)),
        storage=_need(v, "storage", str, "an Optuna storage URL"),
        overrides=[*(str(o) for o in v.get("overrides") or []), *run_ov], **_statistics(v, arms, sizes),
        **_lr_search(v.get("lr", {}), sizes, probe), **_workers(v), planned=planned, recipe=tuple(recipe),
        sequential=design, stop_early=stop_early)


def protocol_uri(p: ProtocolSpec, conf_dir: Path = CONF_DIR) -> str:
    """The tracking URI of the protocol's runs (they all share it: its first arm at its first size tells)."""
    with config_dir(conf_dir, job_name="verdict"):
        try:
            # the flops form of the arm: the URI does not depend on the budget, which may not be computed yet
            return tracking_uri(compose_run(p.run_overrides(replace(p.arms[0], match="flops"), p.sizes[0])))
        except (HydraException, OmegaConfBaseException) as e:
            raise VerdictError(f"config error: {one_line(e)}") from None


def baseline_tokens(p: ProtocolSpec, conf_dir: Path = CONF_DIR) -> dict[str, int]:
    """size -> the tokens the baseline trains on at that size: its steps under the size's FLOP budget x tokens per
    step, from its config composed exactly as its runs compose it, through the functions its runs use
    (ablations.train.check_config, ablations.budget.steps_for_budget), so a `match: tokens` arm given these tokens
    runs exactly the baseline's max_steps. {} when no arm has match: tokens."""
    from ablations.budget import steps_for_budget
    from ablations.train import check_config

    if all(a.match == "flops" for a in p.arms):
        return {}
    base = replace(next(a for a in p.arms if a.name == p.baseline), match="flops")  # its own budget
    out = {}
    with config_dir(conf_dir, job_name="verdict"):
        for size in p.sizes:
            try:
                cfg = compose_run(p.run_overrides(base, size))
            except (HydraException, OmegaConfBaseException) as e:
                raise VerdictError(f"config error for the baseline at size {size.name}: {one_line(e)}") from None
            try:
                shape = check_config(cfg)
                if cfg.tokenizer.get("vocab_size") is None:  # char: the corpus's vocabulary, as the run fills it in
                    from ablations.data import prepare_data

                    cfg.tokenizer.vocab_size = prepare_data(cfg.data, str(cfg.tokenizer.name)).tokenizer.vocab_size
                model = OmegaConf.to_container(cfg.model, resolve=True)
                steps = steps_for_budget(size.budget_flops, model, shape.batch_size, shape.accumulate, shape.world)
            except ConfigError as e:
                raise VerdictError(f"the baseline at size {size.name}: {e}") from None
            out[size.name] = steps * shape.tokens
    return out


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
    search = lr.get("search", "grid")
    if search not in LR_SEARCHES:
        raise VerdictError(f"invalid verdict.lr.search={search!r}: choose grid (every lr of the grid at every lr seed) "
                           "or walk (sweeps/lr_walk.py)")
    if search == "walk" and len(seeds) != 2:
        raise VerdictError(f"invalid verdict.lr.seeds={seeds!r} with verdict.lr.search=walk: the walk probes with the "
                           "first seed and confirms with the second; give two, e.g. [100, 101]")
    return {"lr_seeds": tuple(seeds), "lr_extend": extend, "lr_transfer_from": source, "lr_search": search}


def _workers(v: Mapping) -> dict:
    """verdict.workers (a positive integer, or auto: one per core / visible GPU) and verdict.worker (i/N: set by
    `launch` for the processes it starts)."""
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


def _statistics(v: Mapping, arms: list[ProtocolArm], sizes: list[Size]) -> dict:
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
    flags = {key: v.get(key, False) for key in ("allow_dirty", "paired")}
    for key, flag in flags.items():
        if not isinstance(flag, bool):
            raise VerdictError(f"invalid verdict.{key}={flag!r}: expected true or false")
    return {"margin": float(margin), "margin_reason": reason.strip(), "holm": holm,
            "primary_arms": chosen["arms"], "primary_sizes": chosen["sizes"], **flags,
            "plan": dict(v.get("plan") or {})}
