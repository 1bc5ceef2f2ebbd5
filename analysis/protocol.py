"""The report of a verdict protocol (`python -m sweeps.verdict`): its runs carry `verdict.*` tags.

    python -m analysis.report <experiment> [--margin M] [--baseline ARM] [--paired FILE]

(the same command as any report: it switches to this kind, PROTOCOL, when the matched runs carry
`verdict.protocol`). `load_protocol` fills the context: the protocol's runs and recorded design (`select`: stages,
sizes, arms, the declared Holm family and paired test), the margin, the verdict table, the n-gram floor. Its
sections, in order (analysis/engine.py):

- **head**, then the **forest plot** (analysis/forest.py) and the **intro**: the floor's headline, the one commit,
  what ran.
- **Verdicts per size**: at each model size, every arm against the baseline arm on final val bpb, from the *seeds*
  stage only (the lr stage's runs choose the lr; the winner of a search is biased low, so they never enter the
  statistics). Welch and TOST p-values are Holm-adjusted within the family the runs declared (`verdict.holm`); the
  verdict is exactly one of better / worse / equivalent within ±m / inconclusive (analysis/verdict.py). The margin m
  is `--margin`, else the one recorded before the runs (`verdict.margin`), else none. Each row gives the arm's lr
  and whether its parameter count differs from the baseline's; with a paired test declared (`verdict.paired`), the
  paired Δ and the correlation beside Welch's. Runs that added their seeds sequentially (`verdict.sequential.*`)
  get the stopping rule's verdicts instead, replayed from the store (analysis/sequential_verdicts.py), the fixed
  rule's p-values kept as descriptive columns.
- **n-gram floor** (analysis/common.py), **lr search**: per size and arm, final val bpb at each lr of the grid, the
  chosen lr (the one the seeds ran at) marked, and a note when it is at an edge of the grid.
- **Scaling**: per arm, mean final loss against compute (analysis.scaling.run_compute: a run's `flops_seen` at its
  last step, the budget actually spent) over the sizes, the fits L(C) = E + A C^-alpha, compute multipliers against
  the baseline with bootstrap CIs over seeds, a log-log figure; with as many compute levels as the law has
  parameters (3) the fit interpolates and the report says so.
- **Throughput**: per-run tokens/s labelled as runs made at different times (not paired); a paired measurement
  (`python -m ablations.paired --json FILE`) is shown when given with `--paired FILE`; then provenance, left out and
  the Regenerate command.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis import common, forest, scaling  # noqa: F401  (common, forest: their sections register)
from analysis import sequential_verdicts as sv
from analysis.document import (ci_text, fit_param, fixed, identifiability_blocks, machine_counts, machine_of,
                               margin_text, mean_std, multiplier_text, p_text, run_counts, sci, signed)
from analysis.engine import Context, Kind, section
from analysis.floor import floor_for_runs, headline
from analysis.paired import UNPAIRED
from analysis.plots import scaling_figure, variant_styles
from analysis.seed_plan import check_protocol, plan_blocks
from analysis.stats import paired_t
from analysis.store import AnalysisError, RunSet, display_uri
from analysis.verdict import VERDICT_METRIC, WIDE_MARGIN, Margin, compare_pairs, resolve_margin

STAGE_LR, STAGE_SEEDS = "lr", "seeds"
SCALING_METRIC = "final_val_loss"
SCALING_FIGURE = "loss_vs_compute"
FILES = ("index.md", "index.html", forest.CSV, "verdicts.csv", "lr_search.csv", "scaling.csv", "scaling_points.csv", "runs.csv",
         "left_out.csv")
RUN_COLUMNS = ("verdict.protocol", "verdict.size", "verdict.family", "verdict.arm", "verdict.stage", "seed",
               "optim.lr", "verdict.budget_flops", "run_id", "run_name", "git_commit", "git_dirty",
               "data_fingerprint", "precision", "device", "final_val_loss", "final_val_bpb", "params",
               "flops_per_token", "flops_seen", "tokens_seen", "final_tokens_per_sec")


def is_protocol(runset: RunSet) -> bool:
    """Whether the matched runs come from the verdict protocol (any run tagged `verdict.protocol`)."""
    runs = runset.runs
    return "verdict.protocol" in runs and bool(runs["verdict.protocol"].notna().any())


def _lr_key(v) -> float:
    """lrs compare by value, not by spelling ('0.006' param, '6e-03' tag): 6 significant digits."""
    v = float(v)
    return float(f"{v:.6g}") if math.isfinite(v) else math.nan


@dataclass
class ProtocolRuns:
    """The runs of one protocol, split by stage, with its sizes (smallest budget first), arms and families."""

    name: str
    runset: RunSet
    seeds: pd.DataFrame  # FINISHED seeds-stage runs with the required metrics: the statistics use only these
    lr: pd.DataFrame  # FINISHED lr-stage runs with the required metrics
    lr_failed: pd.DataFrame  # lr-stage runs that are not results (FAILED, KILLED, ...)
    sizes: list
    baseline: str
    arms: list  # baseline first, then by (family, name)
    family: dict  # arm -> family
    left_out: pd.DataFrame
    holm: str = "study"  # the declared Holm family (verdict.holm): study | size | arm-family
    holm_source: str = ""  # how it is known, in words
    primary_arms: tuple = ()  # () = every non-baseline arm
    primary_sizes: tuple = ()  # () = every size
    paired: bool = False  # a paired test declared before the runs (verdict.paired): arms share each seed's data

    def results(self) -> pd.DataFrame:
        """Every run that is a result, both stages (seeds first)."""
        return pd.concat([self.seeds, self.lr], ignore_index=True)


def declared(inc: pd.DataFrame) -> dict:
    """The Holm family and primary comparisons the runs recorded (verdict.holm, verdict.primary); the default when
    they recorded none (runs from before the tags): one family of every comparison. AnalysisError if they differ.
    `paired`: whether they recorded a paired test declared before the runs (verdict.paired = true)."""
    holm = sorted(set(inc.get("verdict.holm", pd.Series(dtype=object)).dropna().astype(str)))
    prim = sorted(set(inc.get("verdict.primary", pd.Series(dtype=object)).dropna().astype(str)))
    if len(holm) > 1 or len(prim) > 1:
        raise AnalysisError(f"the runs recorded different Holm families ({', '.join(holm + prim)}): one protocol "
                            "declares one family; report its runs of one declaration with --filter")
    paired = {"paired": "true" in set(inc.get("verdict.paired", pd.Series(dtype=object)).dropna().astype(str))}
    if not holm:
        return {"holm": "study", "holm_source": "not declared before the runs (no verdict.holm tag): the default, "
                                                "every comparison of the study in one family"} | paired
    parts = dict(kv.split("=", 1) for kv in (prim[0].split(";") if prim else []) if "=" in kv)

    def names(key):
        v = parts.get(key, "*")
        return () if v in ("*", "") else tuple(v.split(","))

    return {"holm": holm[0], "holm_source": "declared before the runs (verdict.holm, verdict.primary)",
            "primary_arms": names("arms"), "primary_sizes": names("sizes")} | paired


def select(runset: RunSet, baseline: str | None = None) -> ProtocolRuns:
    """The protocol's runs from a RunSet (AnalysisError when several protocols match or the baseline is unknown).
    Runs without protocol tags are left out, with the reason."""
    runs, inc = runset.runs, runset.included
    names = sorted(runs["verdict.protocol"].dropna().astype(str).unique())
    if len(names) > 1:
        raise AnalysisError(f"runs of {len(names)} verdict protocols match ({', '.join(names)}); report one with "
                            f"--filter \"tags.`verdict.protocol` = '{names[0]}'\"")
    name = names[0]
    lo = runset.left_out.copy()
    foreign = inc[inc["verdict.protocol"] != name]
    if len(foreign):
        extra = pd.DataFrame({"run_id": foreign["run_id"], "run_name": foreign["run_name"],
                              "variant": foreign["variant"], "seed": foreign["seed"], "status": foreign["status"],
                              "scope": "report", "reason": f"not a run of the verdict protocol `{name}`"})
        lo = pd.concat([lo, extra], ignore_index=True)
    inc = inc[inc["verdict.protocol"] == name].copy()
    missing = inc[inc["verdict.arm"].isna() | inc["verdict.size"].isna() | ~inc["verdict.stage"].isin(
        [STAGE_LR, STAGE_SEEDS])]
    if len(missing):
        extra = pd.DataFrame({"run_id": missing["run_id"], "run_name": missing["run_name"],
                              "variant": missing["variant"], "seed": missing["seed"], "status": missing["status"],
                              "scope": "report", "reason": "verdict.arm, verdict.size or verdict.stage tag missing"})
        lo = pd.concat([lo, extra], ignore_index=True)
        inc = inc.drop(missing.index)
    if len(lo):
        lo["seed"] = lo["seed"].astype("Int64")
        lo = lo.sort_values(["variant", "seed", "run_id"], na_position="last").reset_index(drop=True)
    inc["lr_value"] = inc["optim.lr"].map(_lr_key)
    seeds = inc[inc["verdict.stage"] == STAGE_SEEDS].reset_index(drop=True)
    lr = inc[inc["verdict.stage"] == STAGE_LR].reset_index(drop=True)
    mine = runs[(runs["verdict.protocol"] == name) & (runs["verdict.stage"] == STAGE_LR)]
    lr_failed = mine[~mine["run_id"].isin(inc["run_id"])].assign(lr_value=lambda f: f["optim.lr"].map(_lr_key))
    budgets = inc.groupby("verdict.size")["verdict.budget_flops"].first().map(
        lambda b: float(b) if b is not None else math.inf)
    sizes = sorted(budgets.index, key=lambda s: (budgets[s], s))
    family = {a: str(f) for a, f in inc.groupby("verdict.arm")["verdict.family"].first().items()}
    tagged = sorted(inc["verdict.baseline"].dropna().astype(str).unique())
    if baseline is None:
        if len(tagged) != 1:
            raise AnalysisError(f"the runs name {len(tagged)} baseline arms ({', '.join(tagged) or 'none'}); "
                                "choose one with --baseline ARM")
        baseline = tagged[0]
    if baseline not in family:
        raise AnalysisError(f"baseline arm {baseline!r} has no usable runs; arms: {', '.join(sorted(family))}")
    arms = [baseline] + sorted((a for a in family if a != baseline), key=lambda a: (family[a], a))
    return ProtocolRuns(name, runset, seeds, lr, lr_failed, sizes, baseline, arms, family, lo, **declared(inc))


# ---------------------------------------------------------------------------------------------------- statistics
def _arm_lr(runs: pd.DataFrame) -> float:
    tags = runs["verdict.lr"].dropna()
    vals = sorted({_lr_key(v) for v in tags} or set(runs["lr_value"].dropna()))
    return vals[0] if len(vals) == 1 else math.nan


def _params(runs: pd.DataFrame) -> float:
    v = runs["params"].astype(float)
    v = v[np.isfinite(v)]
    return float(v.iloc[0]) if len(v) else math.nan


def family_of(p: ProtocolRuns, size: str, arm: str) -> str:
    """The Holm family a comparison belongs to, as the protocol declared it (`verdict.holm`, `verdict.primary`):
    `study` (every primary comparison), `size <s>`, `<family> at <s>`; the non-primary ones form `secondary`."""
    if (p.primary_arms and arm not in p.primary_arms) or (p.primary_sizes and size not in p.primary_sizes):
        return "secondary"
    if p.holm == "size":
        return f"size {size}"
    if p.holm == "arm-family":
        return f"{p.family[arm]} at {size}"
    return "study"


def verdicts(p: ProtocolRuns, margin: Margin) -> pd.DataFrame:
    """One row per (size, arm) of the seeds stage; every non-baseline arm against the baseline at that size, its
    p-values Holm-adjusted within its declared family (`family_of`), its Δ with a 95% Welch CI."""
    m = VERDICT_METRIC
    groups: dict = {}
    for size in p.sizes:
        at = p.seeds[p.seeds["verdict.size"] == size]
        base = at.loc[at["verdict.arm"] == p.baseline, m].astype(float)
        for a in p.arms:
            if a != p.baseline and (at["verdict.arm"] == a).any():
                vals = at.loc[at["verdict.arm"] == a, m].astype(float)
                groups.setdefault(family_of(p, size, a), {})[(size, a)] = (vals, base)
    results = {}
    for name, pairs in groups.items():
        res = compare_pairs(pairs, margin.value)
        for key, r in zip(pairs, res.itertuples()):
            results[key] = r._asdict() | {"holm_family": name, "holm_family_size": len(pairs)}
    rows = []
    for size in p.sizes:
        at = p.seeds[p.seeds["verdict.size"] == size]
        base = at[at["verdict.arm"] == p.baseline]
        base_params = _params(base)
        for a in p.arms:
            arm_runs = at[at["verdict.arm"] == a]
            if a == p.baseline and len(base):
                rows.append(_row(size, a, p.family[a], base, base_params, m) | {"margin": margin.value,
                                                                               "verdict": "baseline"})
            elif (size, a) in results:
                r = results[(size, a)]
                rows.append(_row(size, a, p.family[a], arm_runs, base_params, m) | {
                    k: r[k] for k in ("delta", "ci_low", "ci_high", "p_welch", "p_holm", "p_tost", "p_tost_holm",
                                      "tost_ci_low", "tost_ci_high", "holm_family", "holm_family_size", "margin",
                                      "verdict")})
    table = pd.DataFrame(rows, columns=VERDICT_COLUMNS)
    table = with_paired(p, table) if p.paired else table
    design = sv.recorded_design(p.seeds)
    if design is None:
        return table
    # seeds added sequentially: the verdict is the stopping rule's, replayed (analysis/sequential_verdicts.py)
    families = {(s, a): family_of(p, s, a) for s in p.sizes for a in p.arms if a != p.baseline}
    return sv.apply(p, table, margin.value, families, design)


PAIRED_COLUMNS = ["paired_n", "paired_delta", "paired_ci_low", "paired_ci_high", "correlation"]


def with_paired(p: ProtocolRuns, table: pd.DataFrame) -> pd.DataFrame:
    """The verdict table with the paired difference of each comparison (stats.paired_t over the seeds the arm and
    the baseline share at that size: same seed, same data order) and the correlation the pairing exploits."""
    rows = []
    for _, r in table.iterrows():
        at = p.seeds[p.seeds["verdict.size"] == r["size"]]

        def by_seed(arm):
            runs = at[at["verdict.arm"] == arm]
            return pd.Series(runs[VERDICT_METRIC].astype(float).to_numpy(), index=runs["seed"].astype(int))

        res = paired_t(by_seed(r["arm"]), by_seed(p.baseline)) if r["verdict"] != "baseline" else {}
        rows.append([res.get("n", 0), res.get("delta", math.nan), res.get("ci_low", math.nan),
                     res.get("ci_high", math.nan), res.get("correlation", math.nan)])
    return pd.concat([table, pd.DataFrame(rows, columns=PAIRED_COLUMNS, index=table.index)], axis=1)


VERDICT_COLUMNS = ["size", "arm", "family", "n_seeds", "seeds", "lr", "mean", "std", "params", "params_baseline",
                   "params_differ", "tokens", "delta", "ci_low", "ci_high", "p_welch", "p_holm", "p_tost", "p_tost_holm",
                   "tost_ci_low", "tost_ci_high", "holm_family", "holm_family_size", "margin", "verdict"]


def _row(size, arm, fam, runs: pd.DataFrame, base_params: float, m: str) -> dict:
    vals = runs[m].astype(float)
    params = _params(runs)
    return {"size": size, "arm": arm, "family": fam, "n_seeds": len(runs),
            "seeds": ";".join(str(int(s)) for s in sorted(runs["seed"].dropna())), "lr": _arm_lr(runs),
            "mean": float(vals.mean()), "std": float(vals.std(ddof=1)) if len(vals) > 1 else math.nan,
            "params": params, "params_baseline": base_params,
            "tokens": float(runs["tokens_seen"].astype(float).median()) if len(runs) else math.nan,
            "params_differ": bool(np.isfinite(params) and np.isfinite(base_params) and params != base_params),
            "delta": math.nan, "ci_low": math.nan, "ci_high": math.nan, "p_welch": math.nan,
            "p_holm": math.nan, "p_tost": math.nan, "p_tost_holm": math.nan, "tost_ci_low": math.nan,
            "tost_ci_high": math.nan, "holm_family": "", "holm_family_size": 0}


def lr_search(p: ProtocolRuns) -> tuple[pd.DataFrame, list]:
    """Per (size, arm): final val bpb of the lr stage at each lr tried, the mean over its seeds as the protocol
    chooses (`verdict.lr.seeds`; NaN: not tried; failed runs in `failed`), the chosen lr (the seeds stage's
    `verdict.lr`; without seeds runs, the lr stage's best), whether it is at an edge of the grid, and where an lr
    searched at another size came from (`verdict.lr_from`). Returns (table, sorted grid of every lr tried)."""
    grid = sorted(set(p.lr["lr_value"].dropna()) | set(p.lr_failed["lr_value"].dropna()))
    rows = []
    for size in p.sizes:
        for arm in p.arms:
            lr_runs = p.lr[(p.lr["verdict.size"] == size) & (p.lr["verdict.arm"] == arm)]
            bad = p.lr_failed[(p.lr_failed["verdict.size"] == size) & (p.lr_failed["verdict.arm"] == arm)]
            seeds = p.seeds[(p.seeds["verdict.size"] == size) & (p.seeds["verdict.arm"] == arm)]
            if not len(lr_runs) and not len(bad) and not len(seeds):
                continue
            tried = sorted(set(lr_runs["lr_value"].dropna()) | set(bad["lr_value"].dropna()))
            by_lr = lr_runs.groupby("lr_value")[VERDICT_METRIC].mean().astype(float)
            n_seeds = int(lr_runs.groupby("lr_value")["seed"].nunique().max()) if len(lr_runs) else 0
            source = seeds["verdict.lr_from"].dropna() if "verdict.lr_from" in seeds else pd.Series(dtype=str)
            lr_from = str(source.iloc[0]) if len(source) and str(source.iloc[0]) != size else ""
            chosen = _arm_lr(seeds) if len(seeds) else (float(by_lr.idxmin()) if len(by_lr) else math.nan)
            best = float(by_lr.idxmin()) if len(by_lr) else math.nan
            edge = ""
            if np.isfinite(chosen) and len(tried) > 1:
                edge = "lowest" if chosen == tried[0] else ("highest" if chosen == tried[-1] else "")
            row = {"size": size, "arm": arm, "chosen_lr": chosen, "lr_stage_best": best, "edge": edge,
                   "lr_seeds": n_seeds, "lr_from": lr_from,
                   "tried": ";".join(f"{v:g}" for v in tried),
                   "failed": ";".join(f"{v:g}" for v in sorted(bad["lr_value"].dropna()))}
            for lr in grid:
                row[f"bpb@{lr:g}"] = float(by_lr.get(lr, math.nan))
            rows.append(row)
    return pd.DataFrame(rows), grid


@dataclass
class ScalingResult:
    ok: bool
    summary: str
    points: pd.DataFrame = field(default_factory=pd.DataFrame)
    means: pd.DataFrame = field(default_factory=pd.DataFrame)  # per (arm, size): mean compute and loss
    table: pd.DataFrame = field(default_factory=pd.DataFrame)
    fits: dict = field(default_factory=dict)


def scaling_of(ctx: Context) -> ScalingResult:
    """Points (seeds stage, compute spent: analysis.scaling.run_compute), means per (arm, size), and the fits when
    the baseline has seeds at >= 3 compute values."""
    p = ctx.protocol
    s = p.seeds
    points = pd.DataFrame({"arm": s["verdict.arm"], "size": s["verdict.size"], "seed": s["seed"],
                           "compute": scaling.run_compute(s), SCALING_METRIC: s[SCALING_METRIC].astype(float)})
    missing = int((~np.isfinite(points["compute"])).sum())
    points = points[np.isfinite(points["compute"])].reset_index(drop=True)
    means = points.groupby(["arm", "size"]).agg(n=(SCALING_METRIC, "size"), compute=("compute", "mean"),
                                                 loss=(SCALING_METRIC, "mean"),
                                                 loss_std=(SCALING_METRIC, "std")).reset_index()
    levels = points.loc[points["arm"] == p.baseline, "compute"].nunique()
    if levels < scaling.MIN_LEVELS:
        why = (f"skipped: the baseline arm `{p.baseline}` has seeds at {levels} distinct compute value(s); "
               f"L(C) = E + A C^-alpha needs >= {scaling.MIN_LEVELS}")
        if missing:
            why += f"; {missing} run(s) lack flops_seen (and flops_per_token x tokens_seen)"
        return ScalingResult(False, why, points, means)
    table, fits = scaling.scaling_table(points, p.baseline, SCALING_METRIC)
    summary = f"fitted {len(fits)} of {len(table)} arm(s) over {points['compute'].nunique()} compute values"
    return ScalingResult(True, summary, points, means, table, fits)


# ---------------------------------------------------------------------------------------------------- the report
def load_protocol(ctx: Context) -> None:
    """The protocol's runs (`ctx.protocol`: stages, sizes, arms, the declared Holm family), its margin, the verdict
    table (`ctx.table`) and the n-gram floor of the seeds' data."""
    p = select(ctx.runset, ctx.given_baseline)
    check_protocol(ctx.plan, ctx.plan_path, p.name)
    try:
        ctx.margin = resolve_margin(ctx.given_margin, p.seeds["verdict.margin"], p.seeds["verdict.margin_reason"])
    except ValueError as exc:
        raise AnalysisError(str(exc)) from None
    ctx.protocol, ctx.baseline = p, p.baseline
    ctx.table = verdicts(p, ctx.margin)
    ctx.left_out = p.left_out
    ctx.floor = floor_for_runs(ctx.tracking_uri, p.seeds)
    ctx.floor_arms = [(f"`{r['arm']}` at `{r['size']}`", float(r["mean"])) for _, r in ctx.table.iterrows()]
    args = ["--filter", ctx.filter_string] if ctx.filter_string else []
    args += ["--baseline", ctx.given_baseline] if ctx.given_baseline else []
    args += ["--margin", f"{ctx.given_margin:g}"] if ctx.given_margin is not None else []
    args += ["--paired", ctx.paired_path] if ctx.paired_path else []
    ctx.option_args = args + (["--plan", ctx.plan_path] if ctx.plan_path else [])


def protocol_summary(ctx: Context) -> list[str]:
    p = ctx.protocol
    lines = [f"protocol report for {ctx.runset.description} (protocol `{p.name}`): {len(p.seeds)} seeds-stage "
             f"and {len(p.lr)} lr-stage runs, {len(p.arms)} arms x {len(p.sizes)} sizes -> {ctx.out / 'index.md'}",
             f"verdicts on {VERDICT_METRIC}: equivalence margin {margin_text(ctx.margin.value)} bits/byte "
             f"({ctx.margin.source}); Holm family: {p.holm} ({p.holm_source})"]
    if sequential_design(p.seeds):
        lines.append(sequential_design(p.seeds))
    if ctx.floor is not None:
        lines.append("n-gram floor (bpb by order): " + ", ".join(f"{n}: {v:.4f}" for n, v in ctx.floor.bpb.items()))
    return lines + [f"scaling: {ctx.once(scaling_of).summary}"]


def _params_text(r) -> str:
    if not np.isfinite(r["params"]):
        return "n/a"
    if r["verdict"] == "baseline" or not np.isfinite(r["params_baseline"]):
        return f"{r['params']:,.0f}"
    if not r["params_differ"]:
        return f"same ({r['params']:,.0f})"
    rel = r["params"] / r["params_baseline"] - 1
    return f"**differs**: {r['params']:,.0f} vs {r['params_baseline']:,.0f} ({100 * rel:+.1f}%)"


@section("protocol.head")
def head_section(ctx: Context) -> list:
    """The title, the floor's headline (the best arm at the largest size) and the commit line."""
    p = ctx.protocol
    b: list = [("h1", f"Verdict protocol report: `{p.name}`")]
    at = ctx.table[ctx.table["size"] == p.sizes[-1]] if len(ctx.table) else ctx.table
    if len(at):
        best = at.loc[at["mean"].idxmin()]
        b.extend(headline(ctx.floor, float(best["mean"]), f"the best arm at the largest size (`{best['arm']}` at "
                                                         f"`{best['size']}`)"))
    return b + _commit_headline(p)


@section("protocol.intro")
def intro_section(ctx: Context) -> list:
    p, rs = ctx.protocol, ctx.runset
    n_left = int((p.left_out["scope"] == "report").sum()) if len(p.left_out) else 0
    b: list = [("p", f"MLflow tracking URI `{display_uri(rs.tracking_uri)}`; {rs.description}. Protocol `{p.name}` "
                   f"(`python -m sweeps.verdict`): **{len(p.arms)}** arms × **{len(p.sizes)}** sizes "
                   f"({', '.join(f'`{s}`' for s in p.sizes)}, smallest compute budget first); **{len(p.seeds)}** "
                   f"seeds-stage runs and **{len(p.lr)}** lr-stage runs are results; {n_left} of {len(rs.runs)} "
                   "matched runs were left out (see [Left out](#left-out)). Baseline arm: "
                   f"`{p.baseline}`. Arms: " + ", ".join(f"`{a}` ({p.family[a]})" for a in p.arms) + ".")]
    b.append(("p", "Only the **seeds** stage (every arm at its own best lr, seeds other than the lr search's) "
                   "enters the statistics; the lr-stage runs only choose the lr (the winner of a search is biased "
                   "low) and appear in the lr search table alone."))
    return b


def _commit_headline(p: ProtocolRuns) -> list:
    """One line at the top: the one commit every result used, or a flag when they span several or ran dirty."""
    runs = p.results()
    if not len(runs):
        return []
    commits = sorted(runs["git_commit"].fillna("(not recorded)").astype(str).unique())
    dirty = int((runs["git_dirty"].astype(str).str.lower() == "true").sum())
    allowed = int((runs.get("verdict.allow_dirty", pd.Series(dtype=object)).astype(str) == "true").sum())
    if len(commits) == 1 and not dirty:
        return [("p", f"Every result ran at one commit, `{commits[0]}`, with a clean tree.")]
    return [("p", f"**Provenance flag**: the {len(runs)} results span {len(commits)} commit(s) and {dirty} ran "
                  f"with uncommitted changes ({allowed} with verdict.allow_dirty=true recorded); arms compared "
                  "here may have run different code (see [Provenance](#provenance)).")]


def sequential_design(seeds: pd.DataFrame) -> str:
    """The group-sequential design the seeds-stage runs recorded (verdict.sequential.* tags, issue 36), in words;
    "" for runs of a fixed seed count."""
    keys = ("first", "batch", "cap", "spending", "alpha")
    cols = [f"verdict.sequential.{k}" for k in keys]
    if not all(c in seeds for c in cols) or seeds[cols].dropna().empty:
        return ""
    got = {k: ", ".join(sorted(seeds[c].dropna().astype(str).unique())) for k, c in zip(keys, cols)}
    return (f"Seeds added sequentially (fixed before the runs, recorded on every run): a look at {got['first']} seeds "
            f"per arm, then every {got['batch']} more, to a cap of {got['cap']}; {got['spending']} alpha spending "
            f"(Lan-DeMets) at family-wise alpha {got['alpha']} over one family of differences and equivalences")


def _margin_blocks(ctx: Context) -> list:
    mg, t = ctx.margin, ctx.table
    if not np.isfinite(mg.value):
        return [("p", f"Equivalence margin: {mg.source}.")]
    text = f"Equivalence margin m = {margin_text(mg.value)} bits/byte, {mg.source}"
    text += f"; reason: {mg.reason}." if mg.reason else "; no reason was recorded."
    base = t[t["verdict"] == "baseline"]
    wide = [f"`{r['size']}` ({mg.value / r['mean']:.1%} of {r['mean']:.4f})" for _, r in base.iterrows()
            if mg.wide(float(r["mean"]))]
    out = [("p", text)]
    if sequential_design(ctx.protocol.seeds):
        out.append(("p", sv.rule_paragraph(sequential_design(ctx.protocol.seeds))))
        if sv.mismatch_line(t):
            out.append(("p", sv.mismatch_line(t)))
    if wide:
        out.append(("p", f"**Wide margin**: m is more than {WIDE_MARGIN:.0%} of the baseline's val bpb at "
                         + ", ".join(wide) + ". An equivalence that only a wide margin buys is not a finding; "
                         "the reason above is the argument for it."))
    return out


@section("protocol.verdicts")
def verdicts_section(ctx: Context) -> list:
    p, table = ctx.protocol, ctx.table
    ctx.write("verdicts.csv", table.to_csv(index=False, lineterminator="\n"))
    b: list = [("h2", "Verdicts per size")]
    b.append(("p", "Final val bpb (bits/byte, lower is better), mean ± std over seeds (ddof=1); Δ = arm − baseline "
                   "at the same size with its 95% Welch confidence interval (t-based, Welch-Satterthwaite df). "
                   "p (Welch): two-sided Welch t-test; p (Holm): Holm-adjusted within the comparison's declared "
                   "family (the `Holm family` column, with its number of comparisons); p (TOST, Holm): two "
                   "one-sided Welch tests against ±m, Holm-adjusted the same way. **Verdict**, exactly one of "
                   "*better*, *worse*, *equivalent within ±m*, *inconclusive*: equivalent when p (TOST, Holm) < "
                   "0.05; else better / worse when p (Holm) < 0.05; else inconclusive: neither a difference nor an "
                   "equivalence was shown (a non-significant p is not evidence of no difference). lr: the arm's "
                   "best lr (the seeds ran at it). params: whether the arm's parameter count differs from the "
                   "baseline's."))
    sequential = sv.decided_sequentially(table)
    if sequential:  # the stopping rule decided: its method replaces the fixed rule's
        b[-1] = ("p", sv.METHOD)
    b.extend(_margin_blocks(ctx))
    fams = table.loc[table["verdict"] != "baseline"].groupby("holm_family", sort=True)["holm_family_size"].first()
    b.append(("p", f"Holm families ({p.holm_source}; `verdict.holm` = `{p.holm}`): "
                   + "; ".join(f"`{f}`: {n} comparison{'s' if n != 1 else ''}" for f, n in fams.items()) + "."))
    rows = []
    for _, r in table.iterrows():
        is_base = r["verdict"] == "baseline"
        ci = "" if not np.isfinite(r["ci_low"]) else " " + ci_text(r["ci_low"], r["ci_high"])
        mean = mean_std(r["mean"], r["std"])
        rows.append([f"`{r['size']}`", r["family"], f"`{r['arm']}`", f"{r['n_seeds']} ({r['seeds'].replace(';', ', ')})",
                     sci(r["lr"]), mean, "baseline" if is_base else signed(r["delta"]) + ci,
                     "" if is_base else p_text(r["p_welch"]), "" if is_base else p_text(r["p_holm"]),
                     "" if is_base else f"{r['holm_family']} ({r['holm_family_size']})",
                     "" if is_base else p_text(r["p_tost_holm"]),
                     "baseline" if is_base else f"**{r['verdict']}**", _params_text(r)])
    headers = ["size", "family", "arm", "seeds", "lr", "val bpb", "Δ vs baseline [95% Welch CI]", "p (Welch)",
               "p (Holm)", "Holm family (m)", "p (TOST, Holm)", "verdict", "params"]
    b.append(("table", *(sv.table_columns(headers, rows, table) if sequential else (headers, rows))))
    differ = table[table["params_differ"]]
    if len(differ):
        b.append(("p", "Not parameter-matched (each size has one FLOP budget: an arm's tokens follow from its FLOPs "
                       "per token, not from its parameter count): " + "; ".join(
            f"`{r['arm']}` at `{r['size']}` ({r['params']:,.0f} vs {r['params_baseline']:,.0f} parameters; "
            + _tokens_text(r, table, _tokens_matched(p)) + ")" for _, r in differ.iterrows())
            + ". A quality difference mixes the architecture with its size."))
    if _tokens_matched(p):
        b.append(("p", "Matched at tokens, not FLOPs (`match: tokens`, tag `verdict.match`): " + ", ".join(
            f"`{a}`" for a in _tokens_matched(p)) + " trained the baseline's tokens (its steps) at every size, at "
            "their own FLOPs per token; every other arm, the size's FLOP budget."))
    b.extend(_machines_blocks(ctx))
    b.extend(plan_blocks(ctx))
    b.extend(_paired_blocks(ctx))
    b.append(("p", "Machine-readable: `verdicts.csv` (every number above, unrounded)."))
    return b


def _machines_blocks(ctx: Context) -> list:
    """Comparisons whose arm's seeds and baseline's seeds ran on different machines (tag device_name): a seed's
    trajectory is not bit-reproducible across CPUs or GPUs, so the machine is mixed into such a difference."""
    seeds = ctx.protocol.seeds
    machines = machine_of(seeds)
    if machines is None or not len(seeds):
        return []
    where = {(str(sz), str(arm)): sorted(set(m)) for (sz, arm), m in machines.groupby(
        [seeds["verdict.size"], seeds["verdict.arm"]])}
    notes = []
    for _, r in ctx.table.iterrows():
        if r["verdict"] == "baseline":
            continue
        arm, base = where.get((str(r["size"]), str(r["arm"]))), where.get((str(r["size"]), ctx.protocol.baseline))
        if arm and base and arm != base:
            notes.append(f"`{r['arm']}` at `{r['size']}` (its seeds on {', '.join(arm)}; the baseline's on "
                         f"{', '.join(base)})")
    if not notes:
        return []
    return [("p", "**Measured on different machines** (the runs' `device_name`): " + "; ".join(notes) + ". The "
                  "same config and seed on another machine follows another trajectory (other kernels round "
                  "differently): such a difference mixes the architecture with the machine.")]


def _paired_blocks(ctx: Context) -> list:
    """Beside Welch's Δ: the paired Δ over the seeds an arm shares with the baseline, when the protocol declared a
    paired test before the runs (nothing otherwise: pairing chosen after seeing the data would be a forking path)."""
    if not ctx.protocol.paired:
        return []
    rows = [[f"`{r['size']}`", f"`{r['arm']}`", signed(r["delta"]) + " " + ci_text(r["ci_low"], r["ci_high"]),
             str(int(r["paired_n"])), signed(r["paired_delta"]) + " " + ci_text(r["paired_ci_low"], r["paired_ci_high"]),
             "n/a" if not np.isfinite(r["correlation"]) else f"{r['correlation']:+.2f}"]
            for _, r in ctx.table.iterrows() if r["verdict"] != "baseline"]
    return [("p", "**Paired** (declared before the runs, `verdict.paired`: an arm's seed s trained on the same data "
                  "order as the baseline's seed s): the mean over shared seeds of (arm − baseline) with its 95% t "
                  "interval (n − 1 df), beside Welch's, and the correlation r of the two arms' val bpb across those "
                  "seeds, which is what pairing gains from (var(a − b) = var a + var b − 2 r sd a sd b: r > 0 "
                  "narrows the paired interval). The verdicts above rest on Welch's test."),
            ("table", ["size", "arm", "Δ [95% Welch CI]", "shared seeds", "paired Δ [95% t CI]", "r"], rows)]


def _tokens_matched(p) -> list[str]:
    """The arms whose seeds ran at the baseline's tokens (tag verdict.match=tokens; untagged runs: flops)."""
    tag = p.seeds["verdict.match"] if "verdict.match" in p.seeds else pd.Series("flops", index=p.seeds.index)
    return sorted(set(p.seeds.loc[tag == "tokens", "verdict.arm"]))


def _tokens_text(r, table: pd.DataFrame, matched=()) -> str:
    """Whether an arm trained on as many tokens as the baseline at its size (from the runs' tokens_seen)."""
    base = table[(table["size"] == r["size"]) & (table["verdict"] == "baseline")]
    if not len(base) or not np.isfinite(r["tokens"]) or not np.isfinite(base["tokens"].iloc[0]):
        return "tokens not recorded"
    t, tb = r["tokens"], base["tokens"].iloc[0]
    if t == tb:  # at the baseline's tokens by design (match: tokens), else because the FLOPs per token agree
        return f"the baseline's {t:,.0f} tokens (match: tokens)" if r["arm"] in matched else \
            f"the same FLOPs per token and the same {t:,.0f} tokens as the baseline"
    cost = "fewer" if t > tb else "more"
    return f"{t:,.0f} tokens vs the baseline's {tb:,.0f}: {cost} FLOPs per token"


@section("protocol.provenance")
def provenance_section(ctx: Context) -> list:
    p, rs = ctx.protocol, ctx.runset
    runs = p.results()
    ctx.write("runs.csv", runs[[c for c in RUN_COLUMNS if c in runs.columns]].to_csv(index=False, lineterminator="\n"))
    ctx.write("left_out.csv", p.left_out.to_csv(index=False, lineterminator="\n"))
    b: list = [("h2", "Provenance")]
    if len(runs):
        commits = runs["git_commit"].fillna("(not recorded)").astype(str) + np.where(
            runs["git_dirty"].astype(str).str.lower() == "true", " (dirty)", "")
        b.append(("p", "Git commits of the results:"))
        b.append(("ul", run_counts(commits)))
        b.append(("p", "Data fingerprints:"))
        b.append(("ul", run_counts(runs["data_fingerprint"].fillna("(not recorded)").astype(str))))
        where = runs.assign(group=runs["verdict.arm"].astype(str) + " " + runs["verdict.stage"].astype(str))
        b.append(("p", "Machines (the runs' `device_name`; arm and stage):"))
        b.append(("ul", machine_counts(where, "group")))
    b.append(("h2", "Left out"))
    if not len(p.left_out):
        b.append(("p", f"Nothing: all {len(rs.runs)} matched runs are finished protocol runs with the required "
                       "metrics."))
    else:
        b.append(("table", ["run", "variant", "seed", "status", "reason"],
                  [[f"`{r['run_id']}`", f"`{r['variant']}`", "" if pd.isna(r["seed"]) else str(r["seed"]),
                    r["status"], r["reason"]] for _, r in p.left_out.iterrows()]))
    return b


@section("protocol.lr")
def lr_section(ctx: Context) -> list:
    p = ctx.protocol
    lrs, grid = lr_search(p)
    ctx.write("lr_search.csv", lrs.to_csv(index=False, lineterminator="\n"))
    b: list = [("h2", "lr search")]
    if not len(lrs):
        b.append(("p", "No lr-stage runs."))
        return b
    n = sorted({int(v) for v in lrs["lr_seeds"] if v})
    per = "one seed per lr" if n == [1] else f"mean over {'/'.join(map(str, n))} seeds per lr (the protocol's choice)"
    b.append(("p", f"Final val bpb of the lr stage ({per}) at each lr of the grid; **bold ✓**: the lr "
                   "the seeds ran at (the chosen lr); `failed`: the run did not finish; blank: not tried. An lr "
                   "at an edge of the grid may not be the optimum: it may lie outside the grid."))
    rows, edges = [], []
    for _, r in lrs.iterrows():
        cells = []
        failed = {float(v) for v in str(r["failed"]).split(";") if v}
        for lr in grid:
            v = r[f"bpb@{lr:g}"]
            cell = fixed(v) if np.isfinite(v) else ("failed" if _lr_key(lr) in failed else "")
            if np.isfinite(r["chosen_lr"]) and _lr_key(lr) == r["chosen_lr"] and cell:
                cell = f"**{cell}** ✓"
            cells.append(cell)
        note = ""
        if r["edge"]:
            note = f"chosen lr is the {r['edge']} tried: the optimum may lie outside the grid"
            edges.append(f"`{r['arm']}` at `{r['size']}`")
        if r["lr_from"]:
            note = f"lr searched at `{r['lr_from']}` (verdict.lr.transfer_from), not here"
        if np.isfinite(r["lr_stage_best"]) and np.isfinite(r["chosen_lr"]) and r["lr_stage_best"] != r["chosen_lr"]:
            note = (note + "; " if note else "") + f"the lr stage's best is {r['lr_stage_best']:g}"
        rows.append([f"`{r['size']}`", f"`{r['arm']}`", *cells, sci(r["chosen_lr"]), note])
    b.append(("table", ["size", "arm", *[f"lr {lr:g}" for lr in grid], "chosen lr", "note"], rows))
    if edges:
        b.append(("p", f"**At an edge of the grid** ({len(edges)} of {len(lrs)}): " + ", ".join(edges) + "."))
    b.append(("p", "Machine-readable: `lr_search.csv`."))
    return b


@section("protocol.scaling")
def scaling_section(ctx: Context) -> list:
    p, sc = ctx.protocol, ctx.once(scaling_of)
    if len(sc.points):
        ctx.write("scaling_points.csv", sc.points.to_csv(index=False, lineterminator="\n"))
    b: list = [("h2", "Scaling with compute")]
    if len(sc.means):
        rows = []
        for arm in p.arms:
            for size in p.sizes:
                m = sc.means[(sc.means["arm"] == arm) & (sc.means["size"] == size)]
                if len(m):
                    r = m.iloc[0]
                    loss = mean_std(r["loss"], r["loss_std"])
                    rows.append([f"`{arm}`", f"`{size}`", str(int(r["n"])), sci(r["compute"]), loss])
        b.append(("p", "Mean final val loss (nats/token) of the seeds against the compute each run spent (its "
                       "`flops_seen` at the last step: flops_per_token × tokens trained on, the budget actually "
                       "spent, never more than the size's budget" + ("; arms matched at tokens: " + ", ".join(
                           _tokens_matched(p)) + ", the baseline's tokens at their own FLOPs per token"
                           if _tokens_matched(p) else "") + "):"))
        b.append(("table", ["arm", "size", "seeds", "compute (FLOPs)", "final val loss"], rows))
    if not sc.ok:
        b.append(("p", "Scaling fits: " + sc.summary + "."))
        return b
    figure = ctx.figure(scaling_figure(sc.points, sc.fits, variant_styles(p.arms), SCALING_METRIC), SCALING_FIGURE)
    ctx.write("scaling.csv", sc.table.to_csv(index=False, lineterminator="\n"))
    b.append(("p", "Fits of L(C) = E + A·C^−alpha per arm by least squares over every seed "
                   "(analysis/scaling.py). Compute multiplier: the compute the baseline's fitted law needs to "
                   "reach the arm's mean loss at the arm's largest compute, divided by that compute (> 1: the arm "
                   "needs less compute); 95% percentile bootstrap CI over seeds (200 resamples, the baseline "
                   "refitted each time). ∞: the baseline's law never reaches that loss."))
    b.append(("img", "final val loss against compute with fitted laws (log-log)", figure))
    rows = []
    for _, r in sc.table.iterrows():
        test = "n/a" if not np.isfinite(r["E"]) else (
            "interpolates (not tested)" if r["n_levels"] <= 3 else f"{int(r['n_levels']) - 3} level(s) to spare")
        rows.append([f"`{r['arm']}`", str(r["n_runs"]), str(r["n_levels"]), fit_param(r, "E"),
                     fit_param(r, "A"),
                     fit_param(r, "alpha"), test, sci(r["compute_top"]), fixed(r["loss_top"]), multiplier_text(r)])
    b.append(("table", ["arm", "runs", "compute levels", "E", "A", "alpha", "law", "largest compute (FLOPs)",
                        "mean loss there", "compute multiplier [95% CI]"], rows))
    exact = [r.arm for r in sc.table.itertuples() if np.isfinite(r.E) and r.n_levels <= 3]
    if exact:
        b.append(("p", f"**The law interpolates, it is not tested**: {', '.join(f'`{a}`' for a in exact)} "
                       f"{'has' if len(exact) == 1 else 'have'} as many compute levels as L(C) has parameters (3: "
                       "E, A, alpha), so the fit can pass through the mean loss at every level whatever the true "
                       "curve; E, alpha and any extrapolation beyond the ladder are not supported by these runs. "
                       "A fourth size would be the first test of the law."))
    b.extend(identifiability_blocks(sc.table))
    b.append(("p", "Machine-readable: `scaling.csv` (fits, multipliers), `scaling_points.csv` (one row per run)."))
    return b


@section("protocol.throughput")
def throughput_section(ctx: Context) -> list:
    p = ctx.protocol
    b: list = [("h2", "Throughput per run (not paired)")]
    s = p.seeds
    if not len(s) or not np.isfinite(s["final_tokens_per_sec"].astype(float)).any():
        b.append(("p", "No per-run tokens/s recorded."))
        return b
    rows = []
    for size in p.sizes:
        for arm in p.arms:
            v = s.loc[(s["verdict.size"] == size) & (s["verdict.arm"] == arm), "final_tokens_per_sec"].astype(float)
            v = v[np.isfinite(v)]
            if len(v):
                rows.append([f"`{size}`", f"`{arm}`", str(len(v)), f"{v.median():,.0f}",
                             f"{v.min():,.0f} – {v.max():,.0f}"])
    b.append(("p", f"Training tokens/s of each seeds-stage run, from {UNPAIRED}: each run met whatever else "
                   "the machine was doing at its time, so differences between arms here are **not** a speed "
                   "comparison. Paired figures: next section."))
    b.append(("table", ["size", "arm", "runs", f"tokens/s, median ({UNPAIRED})", "range"], rows))
    return b


PROTOCOL = Kind("protocol", load_protocol, lambda ctx: f"Verdict protocol report: {ctx.protocol.name}",
                ("protocol.head", "forest", "protocol.intro", "protocol.verdicts", "floor", "protocol.lr", "protocol.scaling",
                 "protocol.throughput", "paired", "protocol.provenance", "regenerate"),
                summary=protocol_summary,
                exit_code=lambda ctx: 0 if len(ctx.protocol.seeds) or len(ctx.protocol.lr) else 1,
                files=FILES, figures=(SCALING_FIGURE, forest.FIGURE))
