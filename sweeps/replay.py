"""``python -m sweeps.replay [orders=2000] [seed=0] [out=reports/cheaper-verdicts]``

Cheaper verdicts replayed on a committed study (issue 36): what the group-sequential seeds stage
(analysis/sequential.py) and the lean lr stage (`walk`) would have spent and decided on the runs the study already
made, drawing the order in which its seeds would have arrived at random `orders=` times (fixed RNG seed: the
report regenerates byte for byte).

* Seeds stage: per order, the study's seeds are taken in that order (the same order for every arm: they share each
  seed's data), look by look; each comparison stops once decided, the baseline runs as long as the largest open
  one. Per row: the verdict's agreement with the fixed design's (every seed, the report's rule), the seeds used.
* lr stage: per order, which of the two lr seeds comes first; the walk's runs, its chosen lr and that lr's
  quality against the exhaustive search's choice (the difference of their two-seed means in the store).
* Cost: core-minutes are the store's own run times (each replayed run costs what it cost), per decided row.
* The planner at a larger cap: `sequential.simulate` with the study's own Δ and sd per arm, its expected and
  95th-percentile cost of deciding every row.
"""
from __future__ import annotations

import gzip
import math
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ablations.cli import Command, Option
from analysis import sequential as q
from sweeps import lr_walk

REPO = Path(__file__).resolve().parents[1]
STUDY = ("known-results", "reports/known-results/mlflow.db.gz")
# the other committed protocol stores with a two-seed lr stage (the lr-transfer stores are lr sweeps, not protocols)
OTHERS = (("third-study", "reports/third-study/mlflow.db.gz"), ("recipe-pilot", "reports/recipe-pilot/mlflow.db.gz"))
DESIGNS = [q.Design(3, 1, 12, "obrien-fleming", 0.05), q.Design(3, 3, 12, "obrien-fleming", 0.05),
           q.Design(4, 4, 12, "obrien-fleming", 0.05), q.Design(3, 3, 12, "pocock", 0.05),
           q.Design(3, 2, 12, "pocock", 0.05)]
CHOSEN = 0  # the design the docs and conf/verdict/default.yaml adopt (DESIGNS[CHOSEN])
LARGE = q.Design(3, 3, 48, "obrien-fleming", 0.05)  # the planner's larger cap: batches of 3 keep it to 16 looks
LR_TOLERANCE = 0.005  # bpb: the lean lr stage's choice may be this much worse than the exhaustive one's
CODE_TEXT = {q.EQUIVALENT: "equivalent", q.BETTER: "better", q.WORSE: "worse", q.INCONCLUSIVE: "inconclusive"}


@contextmanager
def unpacked(gz: Path):
    """A sqlite URI of the committed store, unpacked into a temporary directory."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "mlflow.db"
        with gzip.open(gz) as src, open(db, "wb") as dst:
            shutil.copyfileobj(src, dst)
        yield f"sqlite:///{db}"


@dataclass
class Study:
    name: str
    baseline: str
    arms: list[str]          # the compared arms, in the store's order
    margin: float
    values: np.ndarray       # (m, n) final val bpb of each arm's seeds-stage runs, by seed
    base: np.ndarray         # (n,) the baseline's
    wall: np.ndarray         # (m + 1, n) their wall seconds (the baseline last)
    seeds: list[int]
    lr: dict                 # arm -> {lr: {seed: (bpb, wall seconds)}}
    lr_seeds: list[int]


def load_study(name: str, uri: str) -> Study:
    from analysis.store import load_runs

    runs = load_runs(name, uri).included
    baseline = str(runs["verdict.baseline"].dropna().iloc[0])
    margin = float(runs["verdict.margin"].dropna().astype(float).iloc[0])
    seeds_runs = runs[runs["verdict.stage"] == "seeds"]
    # the size with the most seeds (a ladder's secondary sizes get a few): the comparisons replayed
    size = seeds_runs.groupby("verdict.size").size().idxmax()
    seeds_runs = seeds_runs[seeds_runs["verdict.size"] == size]
    seeds = sorted({int(s) for s in seeds_runs["seed"]})
    order = [a for a in dict.fromkeys(seeds_runs["verdict.arm"]) if a != baseline]

    def by_seed(arm, col):
        mine = seeds_runs[seeds_runs["verdict.arm"] == arm].assign(s=lambda f: f["seed"].astype(int))
        got = dict(zip(mine["s"], mine[col].astype(float)))
        return np.array([got[s] for s in seeds])

    lr: dict = {}
    for _, r in runs[runs["verdict.stage"] == "lr"].iterrows():
        lr.setdefault(r["verdict.arm"], {}).setdefault(float(r["optim.lr"]), {})[int(r["seed"])] = \
            (float(r["final_val_bpb"]), float(r["wall_sec"]))
    lr_seeds = sorted({s for points in lr.values() for p in points.values() for s in p})
    return Study(name, baseline, order, margin, np.stack([by_seed(a, "final_val_bpb") for a in order]),
                 by_seed(baseline, "final_val_bpb"),
                 np.stack([by_seed(a, "wall_sec") for a in [*order, baseline]]), seeds, lr, lr_seeds)


# --------------------------------------------------------------------------------------------- seeds stage
def fixed_verdicts(st: Study) -> list[str]:
    """The fixed design's verdicts (every seed; the report's rule: analysis.verdict)."""
    from analysis.verdict import BETTER, WORSE, compare_family

    fam = compare_family({a: st.values[i] for i, a in enumerate(st.arms)}, st.base, st.margin)
    return ["better" if v == BETTER else "worse" if v == WORSE else "inconclusive" if v == "inconclusive"
            else "equivalent" for v in fam["verdict"]]


def replay_seeds(st: Study, design: q.Design, orders: np.ndarray) -> dict:
    """The sequential design on the study's seeds taken in each order (O, n): verdicts (O, m), seeds per arm (O, m),
    the baseline's (O,), and the seeds stage's core-seconds (O,) from the runs' own wall times."""
    arms, base = st.values[:, orders].transpose(1, 0, 2), st.base[orders]  # (O, m, n), (O, n)
    delta, p_diff, p_equiv = q.welch_looks(arms, base, design.looks(), st.margin)
    d = q.decide(p_diff, p_equiv, *q.level_table(design, len(st.arms)))
    n = np.asarray(design.looks())
    seeds, base_seeds = n[d.stop], n[d.stop.max(1)]
    wall = st.wall[:, orders].transpose(1, 0, 2).cumsum(-1)  # (O, m + 1, n): seconds of the first j seeds
    used = np.concatenate([seeds, base_seeds[:, None]], 1) - 1  # (O, m + 1)
    core = np.take_along_axis(wall, used[..., None], -1)[..., 0].sum(1)
    return {"codes": q.verdict_codes(d, delta), "seeds": seeds, "baseline_seeds": base_seeds, "core_s": core}


# --------------------------------------------------------------------------------------------- lr stage
def walk(points: dict, start: float, first: int, second: int) -> tuple[float, list[tuple[float, int]]]:
    """sweeps.lr_walk.walk on one arm's stored points {lr: {seed: (bpb, wall)}} (an lr the store lacks cannot be
    run): (the chosen lr, [(lr, seed) run, in order])."""
    grid = sorted(points)
    ran: list[tuple[float, int]] = []

    def value(lr, seeds):
        near = min(grid, key=lambda g: abs(math.log(g / lr)))
        if abs(math.log(near / lr)) > 1e-6:
            return None
        for s in seeds:
            if (near, s) not in ran:
                ran.append((near, s))
        return float(np.mean([points[near][s][0] for s in seeds]))

    ratio = grid[1] / grid[0] if len(grid) > 1 else 2.0
    at = min(grid, key=lambda g: abs(math.log(g / start)))
    lr = lr_walk.walk(value, at, ratio, first, second)
    return min(grid, key=lambda g: abs(math.log(g / lr))), ran


def replay_lr(st: Study, orders: int, rng: np.random.Generator) -> dict:
    """Per arm and order (which lr seed comes first): runs, chosen lr, quality gap (two-seed mean at the chosen lr
    minus the exhaustive best's), core-seconds; the baseline walks from the middle of its grid, every other arm from
    the baseline's choice in the same order."""
    first = rng.integers(0, 2, size=orders)
    arms = [st.baseline, *st.arms]
    mean = {a: {lr: float(np.mean([v[0] for v in pt.values()])) for lr, pt in st.lr[a].items()} for a in arms}
    out = {a: {"runs": [], "lr": [], "gap": [], "core_s": []} for a in arms}
    for o in range(orders):
        s1, s2 = (st.lr_seeds[0], st.lr_seeds[1]) if first[o] == 0 else (st.lr_seeds[1], st.lr_seeds[0])
        grid = sorted(st.lr[st.baseline])
        start = grid[(len(grid) - 1) // 2]
        for a in arms:
            lr, ran = walk(st.lr[a], start, s1, s2)
            if a == st.baseline:
                start = lr
            out[a]["runs"].append(len(ran))
            out[a]["lr"].append(lr)
            out[a]["gap"].append(mean[a][lr] - min(mean[a].values()))
            out[a]["core_s"].append(sum(st.lr[a][x][s][1] for x, s in ran))
    return {a: {k: np.asarray(v) for k, v in d.items()} for a, d in out.items()}


# --------------------------------------------------------------------------------------------- report
def _f(x, nd=1) -> str:
    return f"{x:.{nd}f}"


def report(st: Study, orders: int, seed: int, command: str) -> str:
    rng = np.random.default_rng(seed)
    n = len(st.seeds)
    perms = np.stack([rng.permutation(n) for _ in range(orders)])  # (O, n)
    fixed = fixed_verdicts(st)
    decided_fixed = [v != "inconclusive" for v in fixed]
    lr = replay_lr(st, orders, rng)
    lr_runs_before = sum(len(pt) for a in lr for pt in st.lr[a].values())
    lr_core_before = sum(w for a in lr for pt in st.lr[a].values() for _, w in pt.values())
    lr_runs = sum(lr[a]["runs"] for a in lr)  # (O,)
    lr_core = sum(lr[a]["core_s"] for a in lr)
    seeds_core_before = float(st.wall.sum())
    before = (lr_core_before + seeds_core_before) / 60 / sum(decided_fixed)
    lines = [f"# Cheaper verdicts, replayed on `{STUDY[1]}`", "",
             f"Generated by `{command}` (issue 36; sweeps/replay.py) from the committed store: {orders:,} random "
             f"orders of its seeds (RNG seed {seed}). Do not edit by hand.", "",
             f"The study: {len(st.arms)} comparisons against `{st.baseline}`, margin ±{st.margin:g} bpb, "
             f"{n} seeds per arm ({(len(st.arms) + 1) * n} seeds-stage runs, {seeds_core_before / 60:.1f} "
             f"core-min), an exhaustive lr stage ({lr_runs_before} runs, {lr_core_before / 60:.1f} core-min); the "
             f"fixed design decided {sum(decided_fixed)} of {len(st.arms)} rows: **{before:.1f} core-minutes per "
             "decided row**.", "",
             "## Seeds stage: the sequential designs (cap = the study's seeds)", "",
             "Agreement: the share of orders whose sequential verdict is the fixed design's (rows the fixed design "
             "decided; its inconclusive rows show how often the sequential design decided them). Seeds: the expected "
             "seeds per arm (all orders).", ""]
    head = "| design | runs (expected) | fewer runs | " + " | ".join(
        f"{a} ({fixed[i]})" for i, a in enumerate(st.arms)) + " | core-min per decided row |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    results = []
    for design in DESIGNS:
        r = replay_seeds(st, design, perms)
        runs = r["seeds"].sum(1) + r["baseline_seeds"]  # (O,)
        codes = [[CODE_TEXT[c] for c in row] for row in r["codes"].T.tolist()]  # m x O
        agree = [float(np.mean([c == fixed[i] for c in codes[i]])) for i in range(len(st.arms))]
        decided = (r["codes"] != q.INCONCLUSIVE).sum(1)
        per_row = (r["core_s"].mean() + lr_core.mean()) / 60 / decided.mean()
        results.append((design, r, runs, agree, decided, per_row))
        cells = []
        for i in range(len(st.arms)):
            share = agree[i] if decided_fixed[i] else float(np.mean(r["codes"][:, i] != q.INCONCLUSIVE))
            cells.append(f"{share:.3f}{'' if decided_fixed[i] else ' decided'}, {r['seeds'][:, i].mean():.1f} seeds")
        lines.append(f"| {design.spending} {design.looks()} | {runs.mean():.1f} (p95 {np.percentile(runs, 95):.0f}) | "
                     f"{1 - runs.mean() / ((len(st.arms) + 1) * n):.1%} | " + " | ".join(cells) + f" | {per_row:.1f} |")
    design, r, runs, agree, decided, per_row = results[CHOSEN]
    lines += ["", f"Core-minutes per decided row: (the design's seeds-stage core-min + the lean lr stage's, both "
              "expected over the orders) / expected decided rows; the fixed design's is "
              f"{before:.1f}.", "",
              "## lr stage: the walk against the exhaustive search", "",
              "One lr seed per probe, from the baseline's choice (the baseline: from the middle of its grid) by "
              "factors of 2 toward the better side until a local minimum, a second seed at the best and, only when "
              "its better neighbour's one seed is below the best's two-seed mean, at that neighbour; the lowest mean "
              "wins. Gap: the two-seed mean in the store at the walk's lr minus the exhaustive choice's.", "",
              "| arm | exhaustive runs | walk runs (mean) | lr chosen (share of orders) | gap mean | gap max |",
              "|---|---|---|---|---|---|"]
    for a in lr:
        chosen = {x: float(np.mean(lr[a]["lr"] == x)) for x in sorted(set(lr[a]["lr"].tolist()))}
        lines.append(f"| {a} | {sum(len(p) for p in st.lr[a].values())} | {lr[a]['runs'].mean():.2f} | "
                     + ", ".join(f"{x:g} ({s:.2f})" for x, s in chosen.items())
                     + f" | {lr[a]['gap'].mean():.4f} | {lr[a]['gap'].max():.4f} |")
    worst = max(lr[a]["gap"].max() for a in lr)
    lines += ["", f"Runs: {lr_runs.mean():.1f} of {lr_runs_before} ({lr_runs.mean() / lr_runs_before:.1%}; at most "
              f"{lr_runs.max()}); core-min {lr_core.mean() / 60:.1f} of {lr_core_before / 60:.1f}; every arm's lr "
              f"within {worst:.4f} bpb of the exhaustive choice in every order (target: {LR_TOLERANCE:g}).", "",
              f"## Together ({design.spending}, looks {design.looks()})", "",
              f"- seeds-stage runs: {runs.mean():.1f} expected (p95 {np.percentile(runs, 95):.0f}) of "
              f"{(len(st.arms) + 1) * n}: {1 - runs.mean() / ((len(st.arms) + 1) * n):.1%} fewer;",
              f"- lr-stage runs: {lr_runs.mean():.1f} of {lr_runs_before};",
              f"- verdicts: every row the fixed design decided agrees in at least "
              f"{min(a for a, d in zip(agree, decided_fixed) if d):.1%} of orders; rows decided {decided.mean():.2f} "
              f"expected;",
              f"- **{per_row:.1f} core-minutes per decided row** (fixed design: {before:.1f}).", ""]
    lines += error_rates(design, len(st.arms), st.margin)
    lines += large_cap(st, lr_core.mean())
    return "\n".join(lines) + "\n"


PLANNED_SD = (0.0075, 0.0117)  # the recipe pilot's seed sd that planned the study, and its 80% upper bound


def error_rates(design: q.Design, m: int, margin: float, studies: int = 10_000) -> list[str]:
    """The chosen design's error rates and power by simulation at the sds the study was planned with."""
    lines = [f"## Error rates of {design.spending} {design.looks()} (simulation)", "",
             f"{studies:,} simulated studies of {m} comparisons per row (analysis.sequential.simulate, RNG seed 0), "
             "seeds normal at the sd the study was planned with (the recipe pilot's 0.0075) and at its 80% upper "
             "bound (0.0117); today's fixed rule (two Holm families at the cap) beside it.", "",
             "| sd | scenario | FWER [95% CI] | fixed rule's FWER | better at Δ = -margin | equivalent at Δ = 0 | seeds (mean) |",
             "|---|---|---|---|---|---|---|"]
    for sd in PLANNED_SD:
        for name, deltas in (("global null", np.zeros(m)), ("mixed partial null", q.mixed_null(m, margin)),
                             ("planned Δ", np.full(m, -margin))):
            r = q.simulate(design, deltas, sd, margin, studies=studies, seed=0)
            fwer, lo, hi = q.rate(r["false"])
            power = f"{(r['codes'] == q.BETTER).mean():.3f}" if name == "planned Δ" else ""
            equiv = f"{(r['codes'] == q.EQUIVALENT).mean():.3f}" if name == "global null" else ""
            lines.append(f"| {sd:g} | {name} | {fwer:.4f} [{lo:.4f}, {hi:.4f}] | {r['fixed_false'].mean():.4f} | "
                         f"{power} | {equiv} | {r['seeds'].mean():.1f} |")
    return [*lines, ""]


def others(studies: list[Study], orders: int, seed: int) -> list[str]:
    """The chosen design (capped at each study's own seeds) and the walk on the other committed stores."""
    design = DESIGNS[CHOSEN]
    lines = ["## The other committed studies", "",
             f"The chosen seeds design ({design.spending}, a look at every {design.batch} seed(s) from "
             f"{design.first}) capped at each study's seeds at its largest seeds-stage size, and the walk on its "
             "lr stage; same orders and rules as above.", "",
             "| study | comparisons (fixed verdict: agreement, seeds) | seeds-stage runs | lr-stage runs | lr gap max |",
             "|---|---|---|---|---|"]
    for st in studies:
        rng = np.random.default_rng(seed)
        n = len(st.seeds)
        perms = np.stack([rng.permutation(n) for _ in range(orders)])
        fixed = fixed_verdicts(st)
        lr = replay_lr(st, orders, rng)
        lr_runs = sum(lr[a]["runs"] for a in lr)
        lr_before = sum(len(pt) for a in lr for pt in st.lr[a].values())
        cells, runs_text = [], f"{(len(st.arms) + 1) * n} (cap {n} < first look {design.first}: not replayed)"
        if n >= design.first:
            d = q.Design(design.first, design.batch, n, design.spending, design.alpha)
            r = replay_seeds(st, d, perms)
            runs = r["seeds"].sum(1) + r["baseline_seeds"]
            runs_text = f"{runs.mean():.1f} of {(len(st.arms) + 1) * n} (looks {d.looks()})"
            for i, arm in enumerate(st.arms):
                agree = np.mean([CODE_TEXT[c] == fixed[i] for c in r["codes"][:, i]])
                cells.append(f"{arm} ({fixed[i]}: {agree:.3f}, {r['seeds'][:, i].mean():.1f})")
        lines.append(f"| {st.name} | {'; '.join(cells) or ', '.join(st.arms)} | {runs_text} | "
                     f"{lr_runs.mean():.1f} of {lr_before} | {max(lr[a]['gap'].max() for a in lr):.4f} |")
    return [*lines, ""]


def large_cap(st: Study, lr_core_s: float, studies: int = 10_000) -> list[str]:
    """The planner at a larger cap (LARGE): simulated studies with the study's own Δ and sd per arm (the baseline's at its
    own), run times the store's mean per arm: the expected and 95th-percentile cost of deciding every row."""
    design = LARGE
    deltas = st.values.mean(1) - st.base.mean()
    sd = st.values.std(1, ddof=1)
    r = q.simulate(design, deltas, sd, st.margin, sd_base=float(st.base.std(ddof=1)), studies=studies, seed=0)
    run_s = st.wall.mean(1)  # (m + 1,)
    core = (r["seeds"] * run_s[:-1]).sum(1) + r["baseline_seeds"] * run_s[-1]
    decided = (r["codes"] != q.INCONCLUSIVE)
    lines = [f"## The planner at cap {design.cap}: deciding every row", "",
             f"{studies:,} simulated studies of {design.text()}, each arm's seeds normal at the study's own Δ and sd "
             "(the estimates from its 12 seeds, so this is a plan for a re-run, not a replay), each run costing "
             "its arm's mean run time in the store; the lean lr stage's expected cost added.", "",
             "| arm | Δ | sd | decided | verdicts | seeds (mean) | p95 |", "|---|---|---|---|---|---|---|"]
    for i, a in enumerate(st.arms):
        kinds = {CODE_TEXT[c]: float(np.mean(r["codes"][:, i] == c)) for c in CODE_TEXT}
        text = ", ".join(f"{k} {v:.2f}" for k, v in kinds.items() if v >= 0.005)
        lines.append(f"| {a} | {deltas[i]:+.4f} | {sd[i]:.4f} | {decided[:, i].mean():.3f} | {text} | "
                     f"{r['seeds'][:, i].mean():.1f} | {np.percentile(r['seeds'][:, i], 95):.0f} |")
    all_rows = decided.all(1).mean()
    lines += ["", f"Every row decided in {all_rows:.1%} of studies; the baseline's seeds {r['baseline_seeds'].mean():.1f} "
              f"(p95 {np.percentile(r['baseline_seeds'], 95):.0f}); seeds stage {core.mean() / 60:.1f} core-min "
              f"expected, {np.percentile(core, 95) / 60:.1f} at the 95th percentile; with the lr stage "
              f"{(core.mean() + lr_core_s) / 60:.1f} and {(np.percentile(core, 95) + lr_core_s) / 60:.1f}: "
              f"{(core.mean() + lr_core_s) / 60 / decided.sum(1).mean():.1f} core-minutes per decided row "
              "expected.", ""]
    return lines


COMMAND = Command(
    "sweeps.replay", "[orders=2000] [seed=0] [out=reports/cheaper-verdicts]", __doc__.split("\n\n")[1],
    options=(Option("orders", "random seed orders", 2000),
             Option("seed", "the RNG seed of the orders", 0),
             Option("out", "the report's folder", "reports/cheaper-verdicts", str)))


def main(argv: list[str] | None = None) -> int:
    o, _ = COMMAND.read(list(sys.argv[1:] if argv is None else argv))
    a = SimpleNamespace(**o)
    if isinstance(a.orders, bool) or not isinstance(a.orders, int) or a.orders < 10 or not isinstance(a.seed, int):
        print(f"error: orders={a.orders} seed={a.seed}: integers, at least 10 orders (2000 give shares to about "
              "±0.01)", file=sys.stderr)
        return 2
    studies = []
    for name, gz in (STUDY, *OTHERS):
        with unpacked(REPO / gz) as uri:
            studies.append(load_study(name, uri))
    st = studies[0]
    cmd = "python -m sweeps.replay" + (f" orders={a.orders}" if a.orders != 2000 else "") + \
        (f" seed={a.seed}" if a.seed else "")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.md").write_text(report(st, a.orders, a.seed, cmd) + "\n".join(others(studies[1:], a.orders, a.seed)))
    print(f"wrote {out / 'index.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
