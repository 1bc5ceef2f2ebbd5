"""The report of a verdict protocol (`python -m sweeps.verdict`): its runs carry `verdict.*` tags.

    python -m analysis.report protocol <experiment> [margin=M] [baseline=ARM] [paired=FILE]

(`auto`, the default kind, is this kind, PROTOCOL, when the matched runs carry
`verdict.protocol`). `load_protocol` fills the context: the protocol's runs and recorded design (`select`: stages,
sizes, arms, the declared Holm family and paired test), the margin, the verdict table, the n-gram floor. Its
sections, in order (analysis/engine.py):

- **head**, then the **forest plot** (analysis/forest.py) and the **intro**: the floor's headline, the one commit,
  what ran.
- **Verdicts per size**: at each model size, every arm against the baseline arm on final val bpb, from the *seeds*
  stage only (the lr stage's runs choose the lr; the winner of a search is biased low, so they never enter the
  statistics). Welch and TOST p-values are Holm-adjusted within the family the runs declared (`verdict.holm`); the
  verdict is exactly one of better / worse / equivalent within ±m / inconclusive (analysis/verdict.py). The margin m
  is `margin=`, else the one recorded before the runs (`verdict.margin`), else none. Each row gives the arm's lr
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
  (`python -m ablations.paired json=FILE`) is shown when given with `paired=FILE`; then provenance, left out and
  the Regenerate command.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis import common, forest, lr_search, scaling  # noqa: F401  (common, lr_search: sections register)
from analysis import sequential_verdicts as sv
from analysis.document import ci_text, machine_of, margin_text, mean_std, p_text, params_vs, sci, signed
from analysis.engine import Context, Kind, section
from analysis.floor import floor_for_runs, floor_line, headline
from analysis.paired import UNPAIRED
from analysis.seed_plan import check_protocol, plan_blocks
from analysis.protocol_runs import STAGE_SEEDS, select, verdicts
from analysis.runs import run_table
from analysis.store import AnalysisError, display_uri
from analysis.verdict import VERDICT_METRIC, WIDE_MARGIN, resolve_margin

FILES = ("index.md", "index.html", forest.CSV, "verdicts.csv", "lr_search.csv", "scaling.csv", "scaling_points.csv",
         "runs.csv", "left_out.csv")
RUN_COLUMNS = ("verdict.protocol", "verdict.size", "verdict.family", "verdict.arm", "verdict.stage", "seed",
               "optim.lr", "verdict.budget_flops", "run_id", "run_name", "git_commit", "git_dirty",
               "data_fingerprint", "precision", "device", "final_val_loss", "final_val_bpb", "params",
               "flops_per_token", "flops_seen", "tokens_seen", "final_tokens_per_sec")


SCALING_TOO_FEW = ("the baseline arm `{arm}` has seeds at {levels} distinct compute value(s); "
                   "L(C) = E + A C^-alpha needs >= {needed}")


def scaling_fact(ctx: Context) -> scaling.Scaling:
    """The seeds stage's scaling (analysis.scaling.scaling_of: compute spent, fits when the baseline has seeds at
    >= 3 compute values); its points keep each run's size."""
    return scaling.scaling_of(ctx.runs[ctx.runs["stage"] == STAGE_SEEDS], ctx.baseline, SCALING_TOO_FEW)


# ---------------------------------------------------------------------------------------------------- the report
def load_protocol(ctx: Context) -> None:
    """The protocol's runs (`ctx.extra`: stages, sizes, arms, the declared Holm family), its margin and the n-gram
    floor of the seeds' data."""
    opt = ctx.options
    p = select(ctx.runset, opt.baseline)
    check_protocol(opt.plan, opt.plan_path, p.name)
    try:
        ctx.margin = resolve_margin(opt.margin, p.seeds["verdict.margin"], p.seeds["verdict.margin_reason"])
    except ValueError as exc:
        raise AnalysisError(str(exc)) from None
    res = p.results()
    ctx.runs = run_table(res, res["verdict.arm"], res["verdict.size"], res["verdict.stage"],
                         res["verdict.arm"] == p.baseline)
    ctx.extra, ctx.baseline, ctx.left_out = p, p.baseline, p.left_out
    ctx.floor = floor_for_runs(opt.tracking_uri, p.seeds)


def verdict_table(ctx: Context) -> pd.DataFrame:
    """The report's verdict table (`verdicts`), computed once per report: `ctx.once(verdict_table)`."""
    return verdicts(ctx.extra, ctx.margin)


def floor_arms(ctx: Context) -> list:
    return [(f"`{r['arm']}` at `{r['size']}`", float(r["mean"])) for _, r in ctx.once(verdict_table).iterrows()]


def regenerate_args(ctx: Context) -> list[tuple[str, str]]:
    """The options the Regenerate command repeats, as they were given: (key, value)."""
    opt = ctx.options
    args = [("filter", opt.filter_string)] if opt.filter_string else []
    args += [("baseline", opt.baseline)] if opt.baseline else []
    args += [("margin", f"{opt.margin:g}")] if opt.margin is not None else []
    args += [("paired", opt.paired_path)] if opt.paired_path else []
    return args + ([("plan", opt.plan_path)] if opt.plan_path else [])


def protocol_summary(ctx: Context) -> list[str]:
    p = ctx.extra
    lines = [f"protocol report for {ctx.runset.description} (protocol `{p.name}`): {len(p.seeds)} seeds-stage "
             f"and {len(p.lr)} lr-stage runs, {len(p.arms)} arms x {len(p.sizes)} sizes -> {ctx.out / 'index.md'}",
             f"verdicts on {VERDICT_METRIC}: equivalence margin {margin_text(ctx.margin.value)} bits/byte "
             f"({ctx.margin.source}); Holm family: {p.holm} ({p.holm_source})"]
    if sequential_design(p.seeds):
        lines.append(sequential_design(p.seeds))
    return lines + floor_line(ctx.floor) + [f"scaling: {ctx.once(scaling_fact).summary}"]


def _params_text(r) -> str:
    if not np.isfinite(r["params"]):
        return "n/a"
    if r["verdict"] == "baseline" or not np.isfinite(r["params_baseline"]):
        return f"{r['params']:,.0f}"
    same = params_vs(r["params"], r["params_baseline"])
    return f"same ({r['params']:,.0f})" if same == "same" else same


@section("forest")
def forest_section(ctx: Context) -> list:
    return forest.forest_blocks(ctx, ctx.once(verdict_table))


@section("forest.by_size")
def forest_by_size_section(ctx: Context) -> list:
    """The same, one panel per size (the ladder report)."""
    return forest.forest_blocks(ctx, ctx.once(verdict_table), forest.forest_by_size, forest.BY_SIZE_FIGURE)


@section("protocol.head")
def head_section(ctx: Context, title: str = "Verdict protocol report", summary: tuple = ()) -> list:
    """The title (`title`: the protocol's name), the floor's headline (the best arm at the largest size), the commit
    line, then the kind's own `summary` paragraphs (known-results' agreement count, the ladder's held-out size)."""
    p = ctx.extra
    b: list = [("h1", f"{title}: `{p.name}`")]
    table = ctx.once(verdict_table)
    at = table[table["size"] == p.sizes[-1]] if len(table) else table
    if len(at):
        best = at.loc[at["mean"].idxmin()]
        b.extend(headline(ctx.floor, float(best["mean"]), f"the best arm at the largest size (`{best['arm']}` at "
                                                         f"`{best['size']}`)"))
    return b + _commit_headline(ctx.runs) + [("p", text) for text in summary]


@section("protocol.intro")
def intro_section(ctx: Context) -> list:
    p, rs = ctx.extra, ctx.runset
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


def _commit_headline(runs: pd.DataFrame) -> list:
    """One line at the top: the one commit every result used, or a flag when they span several or ran dirty."""
    if not len(runs):
        return []
    commits = sorted(runs["git_commit"].fillna("(not recorded)").astype(str).unique())
    dirty = int(runs["commit"].str.endswith(" (dirty)").sum())
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
    mg, t = ctx.margin, ctx.once(verdict_table)
    if not np.isfinite(mg.value):
        return [("p", f"Equivalence margin: {mg.source}.")]
    text = f"Equivalence margin m = {margin_text(mg.value)} bits/byte, {mg.source}"
    text += f"; reason: {mg.reason}." if mg.reason else "; no reason was recorded."
    base = t[t["verdict"] == "baseline"]
    wide = [f"`{r['size']}` ({mg.value / r['mean']:.1%} of {r['mean']:.4f})" for _, r in base.iterrows()
            if mg.wide(float(r["mean"]))]
    out = [("p", text)]
    if sequential_design(ctx.extra.seeds):
        out.append(("p", sv.rule_paragraph(sequential_design(ctx.extra.seeds))))
        if sv.mismatch_line(t):
            out.append(("p", sv.mismatch_line(t)))
    if wide:
        out.append(("p", f"**Wide margin**: m is more than {WIDE_MARGIN:.0%} of the baseline's val bpb at "
                         + ", ".join(wide) + ". An equivalence that only a wide margin buys is not a finding; "
                         "the reason above is the argument for it."))
    return out


@section("protocol.verdicts")
def verdicts_section(ctx: Context) -> list:
    p, table = ctx.extra, ctx.once(verdict_table)
    ctx.write_csv("verdicts.csv", table)
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
            + _tokens_text(r, table, tokens_matched(p)) + ")" for _, r in differ.iterrows())
            + ". A quality difference mixes the architecture with its size."))
    if tokens_matched(p):
        b.append(("p", "Matched at tokens, not FLOPs (`match: tokens`, tag `verdict.match`): " + ", ".join(
            f"`{a}`" for a in tokens_matched(p)) + " trained the baseline's tokens (its steps) at every size, at "
            "their own FLOPs per token; every other arm, the size's FLOP budget."))
    b.extend(_machines_blocks(ctx))
    b.extend(plan_blocks(ctx, table))
    b.extend(_paired_blocks(ctx))
    b.append(("p", "Machine-readable: `verdicts.csv` (every number above, unrounded)."))
    return b


def _machines_blocks(ctx: Context) -> list:
    """Comparisons whose arm's seeds and baseline's seeds ran on different machines (tag device_name): a seed's
    trajectory is not bit-reproducible across CPUs or GPUs, so the machine is mixed into such a difference."""
    seeds = ctx.extra.seeds
    machines = machine_of(seeds)
    if machines is None or not len(seeds):
        return []
    where = {(str(sz), str(arm)): sorted(set(m)) for (sz, arm), m in machines.groupby(
        [seeds["verdict.size"], seeds["verdict.arm"]])}
    notes = []
    for _, r in ctx.once(verdict_table).iterrows():
        if r["verdict"] == "baseline":
            continue
        arm, base = where.get((str(r["size"]), str(r["arm"]))), where.get((str(r["size"]), ctx.extra.baseline))
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
    if not ctx.extra.paired:
        return []
    rows = [[f"`{r['size']}`", f"`{r['arm']}`", signed(r["delta"]) + " " + ci_text(r["ci_low"], r["ci_high"]),
             str(int(r["paired_n"])), signed(r["paired_delta"]) + " " + ci_text(r["paired_ci_low"], r["paired_ci_high"]),
             "n/a" if not np.isfinite(r["correlation"]) else f"{r['correlation']:+.2f}"]
            for _, r in ctx.once(verdict_table).iterrows() if r["verdict"] != "baseline"]
    return [("p", "**Paired** (declared before the runs, `verdict.paired`: an arm's seed s trained on the same data "
                  "order as the baseline's seed s): the mean over shared seeds of (arm − baseline) with its 95% t "
                  "interval (n − 1 df), beside Welch's, and the correlation r of the two arms' val bpb across those "
                  "seeds, which is what pairing gains from (var(a − b) = var a + var b − 2 r sd a sd b: r > 0 "
                  "narrows the paired interval). The verdicts above rest on Welch's test."),
            ("table", ["size", "arm", "Δ [95% Welch CI]", "shared seeds", "paired Δ [95% t CI]", "r"], rows)]


def tokens_matched(p) -> list[str]:
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
    p, rs, runs = ctx.extra, ctx.runset, ctx.runs
    ctx.write_csv("runs.csv", runs[[c for c in RUN_COLUMNS if c in runs.columns]])
    ctx.write_csv("left_out.csv", p.left_out)
    b: list = [("h2", "Provenance")]
    if len(runs):
        b += common.provenance_blocks(runs, "results", "arm and stage",
                                      runs["arm"].astype(str) + " " + runs["stage"].astype(str))
    b.append(("h2", "Left out"))
    if not len(p.left_out):
        b.append(("p", f"Nothing: all {len(rs.runs)} matched runs are finished protocol runs with the required "
                       "metrics."))
    else:
        b.append(("table", ["run", "variant", "seed", "status", "reason"],
                  [[f"`{r['run_id']}`", f"`{r['variant']}`", "" if pd.isna(r["seed"]) else str(r["seed"]),
                    r["status"], r["reason"]] for _, r in p.left_out.iterrows()]))
    return b


@section("protocol.scaling")
def scaling_section(ctx: Context) -> list:
    p, sc = ctx.extra, ctx.once(scaling_fact)
    if len(sc.points):
        ctx.write_csv("scaling_points.csv", sc.points)
    b: list = [("h2", "Scaling with compute")]
    means = sc.points.groupby(["arm", "size"]).agg(n=(scaling.METRIC, "size"), compute=("compute", "mean"),
                                                   loss=(scaling.METRIC, "mean"), loss_std=(scaling.METRIC, "std"))
    rows = [[f"`{arm}`", f"`{size}`", str(int(r["n"])), sci(r["compute"]), mean_std(r["loss"], r["loss_std"])]
            for arm in p.arms for size in p.sizes if (arm, size) in means.index for r in [means.loc[(arm, size)]]]
    if rows:
        b.append(("p", "Mean final val loss (nats/token) of the seeds against the compute each run spent (its "
                       "`flops_seen` at the last step: flops_per_token × tokens trained on, the budget actually "
                       "spent, never more than the size's budget" + ("; arms matched at tokens: " + ", ".join(
                           tokens_matched(p)) + ", the baseline's tokens at their own FLOPs per token"
                           if tokens_matched(p) else "") + "):"))
        b.append(("table", ["arm", "size", "seeds", "compute (FLOPs)", "final val loss"], rows))
    b.extend(common.scaling_blocks(ctx, sc, p.arms))
    if sc.ok:
        b.append(("p", "Machine-readable: `scaling.csv` (fits, multipliers), `scaling_points.csv` (one row per "
                       "run)."))
    return b


@section("protocol.throughput")
def throughput_section(ctx: Context) -> list:
    p, s = ctx.extra, ctx.runs[ctx.runs["stage"] == STAGE_SEEDS]
    b: list = [("h2", "Throughput per run (not paired)")]
    if not len(s) or not np.isfinite(s["final_tokens_per_sec"].astype(float)).any():
        b.append(("p", "No per-run tokens/s recorded."))
        return b
    rows = []
    for size in p.sizes:
        for arm in p.arms:
            v = s.loc[(s["size"] == size) & (s["arm"] == arm), "final_tokens_per_sec"].astype(float)
            v = v[np.isfinite(v)]
            if len(v):
                rows.append([f"`{size}`", f"`{arm}`", str(len(v)), f"{v.median():,.0f}",
                             f"{v.min():,.0f} – {v.max():,.0f}"])
    b.append(("p", f"Training tokens/s of each seeds-stage run, from {UNPAIRED}: each run met whatever else "
                   "the machine was doing at its time, so differences between arms here are **not** a speed "
                   "comparison. Paired figures: next section."))
    b.append(("table", ["size", "arm", "runs", f"tokens/s, median ({UNPAIRED})", "range"], rows))
    return b


PROTOCOL = Kind("protocol", load_protocol, lambda ctx: f"Verdict protocol report: {ctx.extra.name}",
                ("protocol.head", "forest", "protocol.intro", "protocol.verdicts", "floor", "protocol.lr", "protocol.scaling",
                 "protocol.throughput", "paired", "protocol.provenance", "regenerate"),
                summary=protocol_summary, args=regenerate_args, floor_arms=floor_arms,
                exit_code=lambda ctx: 0 if len(ctx.extra.seeds) or len(ctx.extra.lr) else 1,
                files=FILES, figures=(common.SCALING_FIGURE, forest.FIGURE))
