"""The ablation report kind: variants of one experiment (or MLflow filter) against a baseline variant.

    python -m analysis.report ablation <experiment-or-filter> [out=DIR] [baseline=VARIANT] [margin=M] ...

(the entry, analysis/report.py, picks this kind as `auto` for runs without a `verdict.protocol` tag). `load_ablation` fills the
context: baseline, labels, colours, the per-variant table with verdicts (`Ablation`, the kind's extra), what was
left out (runs and figure entries), the n-gram floor. Each variant gets one verdict against the baseline on final val
bpb: better / worse / equivalent within ±m / inconclusive (Holm-adjusted Welch tests and TOST against ±m; the rule is
in analysis/verdict.py). m is `margin=M` when given, else the margin the runs recorded before they ran
(`verdict.margin`), else none. When the runs form a compute ladder (an arm at >= 3 training-compute values) the
scaling section fits L(C) = E + A C^-alpha per arm (analysis/scaling.py, rendered by analysis/common.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import common, context, scaling  # context: its section registers
from analysis.document import margin_text, p_text, params_vs, render_markdown, signed_value, value
from analysis.engine import Context, Kind, section
from analysis.floor import floor_for_runs, floor_line, headline
from analysis.paired import UNPAIRED
from analysis.plots import loss_curves_figure, quality_figure, variant_styles
from analysis.protocol_runs import STAGE_SEEDS
from analysis.runs import run_table
from analysis.stats import COMPARE_METRICS, FRONTIERS, SUMMARY_METRICS, variant_table
from analysis.store import AnalysisError, default_baseline, display_uri, order_variants, shorten, variant_labels
from analysis.verdict import VERDICT_METRIC, add_verdicts, resolve_margin

LOSS_FIGURES = {"loss_vs_step": "step", "loss_vs_tokens": "tokens_seen", "loss_vs_time": "elapsed_sec"}
QUALITY_FIGURES = {  # figure -> frontier name in stats.FRONTIERS
    "quality_vs_kv_cache": "kv_cache",
    "quality_vs_train_throughput": "train_throughput",
    "quality_vs_decode_throughput": "decode_throughput",
}
TOP_FILES = ("index.md", "index.html", "summary.md", "summary.csv", "runs.csv", "left_out.csv", "scaling.csv")
RUN_COLUMNS = ("variant", "label", "seed", "run_name", "run_id", "experiment", "git_commit", "git_dirty", "data_fingerprint",
               "tokenizer", "precision", "device", "final_val_loss", "final_val_bpb", "final_tokens_per_sec",
               "final_mfu", "params", "params_non_embedding", "flops_per_token", "kv_cache_bytes_per_token",
               "prefill_tokens_per_sec", "decode_tokens_per_sec", "decode_tokens_per_sec_nocache")
METRIC_NAMES = {
    "final_val_bpb": "val bpb (bits/byte)",
    "final_val_loss": "val loss (nats/token)",
    "final_tokens_per_sec": "train tokens/s (unpaired)",
}
KIND = {"final_val_loss": "loss", "final_val_bpb": "loss", "final_mfu": "pct", "params": "int",
        "kv_cache_bytes_per_token": "int", "final_tokens_per_sec": "rate", "decode_tokens_per_sec": "rate"}




@dataclass
class Ablation:
    """What only an ablation report has: its variants (baseline first), their short labels (without the override
    words `shared` by all), colours, and the per-variant table with the verdicts (analysis.stats.variant_table)."""

    variants: list
    labels: dict
    shared: list
    styles: dict
    table: pd.DataFrame


# ---------------------------------------------------------------- table cells
def _mean_std(row, m: str) -> str:
    kind = KIND.get(m, "rate")
    mean, std, n = row[f"{m}_mean"], row[f"{m}_std"], row[f"{m}_n"]
    if n == 0:
        return "n/a"
    if n == 1 or not np.isfinite(std) or std == 0:
        return value(mean, kind)
    return f"{value(mean, kind)} ± {value(std, kind)}"


def _delta(row, m: str) -> tuple[str, str, str]:
    """(difference [95% CI], p-value, verdict) strings for metric m of a table row."""
    verdict = row[f"verdict_{m}"]
    if verdict == "baseline":
        return "baseline", "", ""
    kind = KIND.get(m, "rate")
    d, lo, hi, p = row[f"delta_{m}"], row[f"delta_{m}_ci_low"], row[f"delta_{m}_ci_high"], row[f"p_{m}"]
    diff = signed_value(d, kind)
    if np.isfinite(lo):
        diff += f" [{signed_value(lo, kind)}, {signed_value(hi, kind)}]"
    return diff, p_text(p), verdict


def summary_rows(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    headers = ["variant", "seeds"] + [label for _, label in SUMMARY_METRICS] + [
        "Δ val bpb vs baseline [95% CI]", "p (Welch)", "p (Holm)", "margin", "p (TOST, Holm)", "verdict"]
    rows = []
    for _, r in table.iterrows():
        seeds = f"{r['n_runs']} ({r['seeds'].replace(';', ', ')})" if r["seeds"] else str(r["n_runs"])
        diff, p_welch, _ = _delta(r, VERDICT_METRIC)
        if r["is_baseline"]:
            tail = [diff, "", "", "", "", "baseline"]
        else:
            tail = [diff, p_welch, p_text(r[f"p_holm_{VERDICT_METRIC}"]), margin_text(r["margin"]),
                    p_text(r[f"p_tost_holm_{VERDICT_METRIC}"]), f"**{r['verdict']}**"]
        rows.append([f"`{r.get('label', r['variant'])}`", seeds] + [_mean_std(r, m) for m, _ in SUMMARY_METRICS]
                    + tail)
    return headers, rows


def verdict_rows(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Per non-baseline variant: every number behind its verdict (val bpb)."""
    m = VERDICT_METRIC
    headers = ["variant", "Δ val bpb", "95% Welch CI", "p (Welch)", "p (Holm)",
               "90% CI (TOST)", "p (TOST)", "p (TOST, Holm)", "verdict", "params vs baseline"]
    rows = []
    base = table[table["is_baseline"]]
    base_params = float(base["params_mean"].iloc[0]) if len(base) else float("nan")

    def ci(lo, hi):
        return "n/a" if not np.isfinite(lo) else f"[{signed_value(lo, 'loss')}, {signed_value(hi, 'loss')}]"

    for _, r in table.iterrows():
        if r["is_baseline"]:
            continue
        rows.append([f"`{r.get('label', r['variant'])}`", signed_value(r[f"delta_{m}"], "loss"),
                     ci(r[f"delta_{m}_ci_low"], r[f"delta_{m}_ci_high"]), p_text(r[f"p_{m}"]), p_text(r[f"p_holm_{m}"]),
                     ci(r[f"tost_ci_low_{m}"], r[f"tost_ci_high_{m}"]), p_text(r[f"p_tost_{m}"]),
                     p_text(r[f"p_tost_holm_{m}"]), r["verdict"], params_vs(r["params_mean"], base_params)])
    return headers, rows


def comparison_rows(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    headers = ["variant", "metric", "difference to baseline [95% CI]", "p (Welch)", "Welch test (unadjusted)"]
    rows = []
    for _, r in table.iterrows():
        if r["is_baseline"]:
            continue
        for m in COMPARE_METRICS:
            rows.append([f"`{r.get('label', r['variant'])}`", METRIC_NAMES.get(m, m), *_delta(r, m)])
    return headers, rows


def summary_markdown(table: pd.DataFrame) -> str:
    """The per-variant table (mean ± std, difference to baseline) as Markdown."""
    if table.empty:
        return "No usable runs.\n"
    return render_markdown([("table", *summary_rows(table))])


def left_out_markdown(left_out: pd.DataFrame, shared=()) -> str:
    """What was left out and why, as Markdown (variants shortened by the words `shared` by all results)."""
    if left_out.empty:
        return "Nothing was left out.\n"
    return render_markdown([("table", *_left_out_rows(left_out, shared))])


def _left_out_rows(lo: pd.DataFrame, shared=()):
    rows = [[f"{shorten(r['run_name'], shared)} (`{r['run_id']}`)", f"`{shorten(r['variant'], shared)}`",
             "" if pd.isna(r["seed"]) else str(r["seed"]), r["status"], r["scope"], r["reason"]]
            for _, r in lo.iterrows()]
    return ["run", "variant", "seed", "status", "scope", "reason"], rows


# ---------------------------------------------------------------- the context of an ablation report
def _figure_left_out(included: pd.DataFrame, hist: pd.DataFrame) -> list[dict]:
    """Runs that are results but are missing from one figure (missing metric / history)."""
    rows = []

    def add(r, scope, reason):
        rows.append({"run_id": r["run_id"], "run_name": r["run_name"], "variant": r["variant"], "seed": r["seed"],
                     "status": r["status"], "scope": scope, "reason": reason})

    keys = {rid: set(g["key"]) for rid, g in hist.groupby("run_id")} if len(hist) else {}
    for _, r in included.iterrows():
        have = keys.get(r["run_id"], set())
        for fig, x in LOSS_FIGURES.items():
            missing = [k for k in ("train/loss", "val/loss") if k not in have]
            if x != "step" and x not in have:
                missing.append(x)
            if missing:
                add(r, f"figure {fig}", "missing metric history " + ", ".join(missing))
        for fig, frontier in QUALITY_FIGURES.items():
            xm = FRONTIERS[frontier][0]
            if not np.isfinite(float(r[xm])):
                add(r, f"figure {fig}", f"missing metric {xm}")
    return rows


def _resolve_baseline(asked: str | None, variants: list, labels: dict, included: pd.DataFrame) -> str | None:
    """The asked-for baseline (a variant or its label), else the default one; AnalysisError when it has no runs."""
    by_label = {lab: v for v, lab in labels.items()}
    baseline = by_label.get(asked, asked) if asked not in variants else asked
    if baseline is not None and baseline not in variants:
        raise AnalysisError(f"baseline variant {asked!r} has no usable runs; variants with results: "
                            + (", ".join(repr(labels[v]) for v in variants) or "none"))
    return baseline if baseline is not None else default_baseline(included)


def load_ablation(ctx: Context) -> None:
    """Fill the context of an ablation report: baseline, margin, the kind's `Ablation` (labels, colours, the
    per-variant table with verdicts), the results with their labels, the left-out list (runs and figures), the
    n-gram floor. AnalysisError when nothing can be written."""
    rs, opt = ctx.runset, ctx.options
    if rs.runs.empty:
        raise AnalysisError(f"no runs for {rs.description} at {display_uri(rs.tracking_uri)}; nothing written")
    included = rs.included
    variants = order_variants(included["variant"].unique()) if len(included) else []
    labels, shared = variant_labels(included)
    ctx.baseline = _resolve_baseline(opt.baseline, variants, labels, included)
    variants = order_variants(variants, ctx.baseline)
    table = variant_table(included, ctx.baseline)
    if len(table):
        table.insert(1, "label", table["variant"].map(labels))
    try:
        ctx.margin = resolve_margin(opt.margin, included.get("verdict.margin", ()),
                                    included.get("verdict.margin_reason", ()))
    except ValueError as exc:
        raise AnalysisError(str(exc)) from None
    table = add_verdicts(table, included, ctx.baseline, ctx.margin)
    ctx.extra = Ablation(variants, labels, shared, variant_styles(variants), table)
    included.insert(included.columns.get_loc("variant") + 1, "label", included["variant"].map(labels))
    arms = included["variant"].map(scaling.arm_of)
    if "verdict.arm" in included:  # runs of the verdict protocol name their arm
        arms = included["verdict.arm"].where(included["verdict.arm"].notna(), arms)
    ctx.runs = run_table(included, arms, included["variant"].map(scaling.rung_of), STAGE_SEEDS,
                         included["variant"] == ctx.baseline)
    left_out = pd.concat([rs.left_out, pd.DataFrame(_figure_left_out(included, ctx.hist),
                                                    columns=rs.left_out.columns)], ignore_index=True)
    if len(left_out):
        left_out["seed"] = left_out["seed"].astype("Int64")
        left_out["_order"] = left_out["scope"] != "report"
        left_out = left_out.sort_values(["_order", "scope", "variant", "seed", "run_id"], na_position="last")
        left_out = left_out.drop(columns="_order").reset_index(drop=True)
    ctx.left_out = left_out
    ctx.floor = floor_for_runs(rs.tracking_uri, included)


def floor_arms(ctx: Context) -> list:
    t, labels = ctx.extra.table, ctx.extra.labels
    return [(f"`{labels.get(v, v)}`", m) for v, m in zip(t["variant"], t["final_val_bpb_mean"])] if len(t) else []


def regenerate_args(ctx: Context) -> list[tuple[str, str]]:
    """The options the Regenerate command repeats, (key, value): the filter, the baseline (always, by label), a margin
    given here, the paired file."""
    opt = ctx.options
    args = [("filter", opt.filter_string)] if opt.filter_string else []
    if ctx.baseline:
        args += [("baseline", ctx.extra.labels.get(ctx.baseline, ctx.baseline))]
    if np.isfinite(ctx.margin.value) and ctx.margin.source.startswith("given"):
        args += [("margin", f"{ctx.margin.value:g}")]
    return args + ([("paired", opt.paired_path)] if opt.paired_path else [])


# ---------------------------------------------------------------- sections
@section("ablation.head")
def head_section(ctx: Context) -> list:
    rs, table = ctx.runset, ctx.extra.table
    inc, runs = rs.included, rs.runs
    n_left = _n_left(ctx)
    b: list = [("h1", f"Ablation report: {rs.description}")]
    if len(table):
        best = table.loc[table["final_val_bpb_mean"].idxmin()]
        b.extend(headline(ctx.floor, float(best["final_val_bpb_mean"]),
                          f"the best variant (`{ctx.extra.labels.get(best['variant'], best['variant'])}`)"))
    b.append(("p", f"MLflow tracking URI `{display_uri(rs.tracking_uri)}`; experiments: "
                   + ", ".join(f"`{e}`" for e in sorted(runs["experiment"].astype(str).unique())) + ". "
                   f"**{len(inc)}** finished runs of **{len(table)}** variants are results; "
                   f"{n_left} of {len(runs)} matched runs were left out (see [Left out](#left-out))."))
    if not len(inc):
        b.append(("p", "**No usable runs**: no finished run with the required metrics (`final_val_loss`, "
                       "`final_val_bpb`). Nothing to plot; see below for what was left out and why."))
        return b
    if ctx.extra.shared:
        b.append(("p", "Variants are named by their overrides (the MLflow `variant` tag) without those "
                       "shared by all: `" + " ".join(ctx.extra.shared) + "`."))
    b.append(("p", f"Baseline variant: `{ctx.extra.labels[ctx.baseline]}`. Values are mean ± std over seeds (sample std, "
                   "ddof=1); differences are variant minus baseline with a 95% Welch confidence interval and "
                   "Welch's t-test p-value; **not significant** means p ≥ 0.05; n/a with fewer than two "
                   "seeds on either side. Train tokens/s are per run, from " + UNPAIRED + ": a difference "
                   "between variants is not a speed comparison (see [Paired throughput](#paired-throughput))."))
    m = ctx.margin
    b.append(("p", f"**Verdict** (val bpb, lower is better), exactly one of *better*, *worse*, *equivalent within "
                   f"±m*, *inconclusive*. Equivalence margin m = {margin_text(m.value)} bits/byte ({m.source}). "
                   "Rule: *equivalent within ±m* when the TOST p-value (two one-sided Welch tests against ±m), "
                   "Holm-adjusted across the variants, is < 0.05 (the 90% CI of the difference lies inside ±m); else "
                   "*better* / *worse* when the Welch p-value, Holm-adjusted across the variants, is < 0.05; else "
                   "*inconclusive*: neither a difference nor an equivalence was shown (a non-significant p is not "
                   "evidence of no difference). With fewer than two seeds on either side: *inconclusive*."))
    return b


def _n_left(ctx: Context) -> int:
    lo = ctx.left_out
    return int((lo["scope"] == "report").sum()) if len(lo) else 0


@section("ablation.results")
def results_section(ctx: Context) -> list:
    """The per-variant table, the floor, the differences and the verdicts; writes summary.md and the CSVs."""
    table, inc = ctx.extra.table, ctx.runs
    ctx.write_csv("summary.csv", table)
    runs_csv = inc[[c for c in RUN_COLUMNS if c in inc.columns] + sorted(c for c in inc.columns
                                                                        if c.startswith("choice."))]
    ctx.write_csv("runs.csv", runs_csv)
    ctx.write_csv("left_out.csv", ctx.left_out)
    ctx.write("summary.md", summary_markdown(table))
    if not len(inc):
        return []
    b: list = [("h2", "Results per variant"), ("table", *summary_rows(table))]
    b.extend(common.floor_section(ctx))
    h, r = comparison_rows(table)
    if r:
        b += [("p", "Differences to the baseline:"), ("table", h, r)]
    h, r = verdict_rows(table)
    if r:
        b.append(("h2", "Verdicts"))
        b.append(("p", "What each verdict rests on (val bpb, variant minus baseline): the 95% Welch CI "
                       "(t-based, Welch-Satterthwaite df), the Welch and TOST p-values, Holm-adjusted across "
                       "every non-baseline variant (one family)."))
        b.append(("table", h, r))
    b.append(("p", "Machine-readable: `summary.csv` (per variant), `runs.csv` (per run), `left_out.csv`."))
    return b


@section("ablation.quality")
def quality_section(ctx: Context) -> list:
    """Quality against KV-cache bytes and against training and decode throughput, with the Pareto-optimal variants."""
    if not len(ctx.runs):
        return []
    figures = {}
    for name, frontier in QUALITY_FIGURES.items():
        xm, maximize = FRONTIERS[frontier]
        fig = quality_figure(ctx.runs, ctx.extra.table, ctx.extra.styles, xm, maximize_x=maximize, labels=ctx.extra.labels)
        figures[name] = ctx.figure(fig, name)
    b: list = [("h2", "Quality against KV-cache size"),
               ("img", "val bpb against KV-cache bytes per token", figures["quality_vs_kv_cache"])]
    for frontier, label in (("kv_cache", "val bpb vs KV-cache bytes/token"),
                            ("train_throughput", "val bpb vs training tokens/s"),
                            ("decode_throughput", "val bpb vs decode tokens/s")):
        front = [f"`{v}`" for v in ctx.extra.table.loc[ctx.extra.table[f"pareto_{frontier}"], "label"]]
        b.append(("p", f"Pareto-optimal variants ({label}): " + (", ".join(front) or "none") + "."))
        if frontier == "kv_cache":
            b.append(("h2", "Quality against throughput"))
            b.append(("img", "val bpb against training tokens/s", figures["quality_vs_train_throughput"]))
            b.append(("img", "val bpb against decode tokens/s", figures["quality_vs_decode_throughput"]))
    return b


SCALING_TOO_FEW = ("the baseline arm `{arm}` has runs at {levels} distinct training-compute value(s); a fit of "
                   "L(C) = E + A C^-alpha needs >= {needed} (a ladder of model sizes or steps)")


def scaling_fact(ctx: Context) -> scaling.Scaling:
    """The runs' scaling (analysis.scaling.scaling_of), an arm being a variant without its ladder overrides."""
    base = ctx.runs.loc[ctx.runs["is_baseline"], "arm"]
    return scaling.scaling_of(ctx.runs, base.iloc[0] if len(base) else scaling.arm_of(ctx.baseline), SCALING_TOO_FEW)


@section("ablation.scaling")
def scaling_section(ctx: Context) -> list:
    if not len(ctx.runs):
        return []
    sc = ctx.once(scaling_fact)
    b: list = [("h2", "Scaling with compute")]
    if sc.ok:
        b.append(("p", "Final val loss (nats/token) against training compute C = flops_per_token × tokens seen, per "
                       "arm (a variant without its model-size / step overrides)."))
    b.extend(common.scaling_blocks(ctx, sc, list(sc.table["arm"]) if sc.ok else []))
    return b + ([("p", "Machine-readable: `scaling.csv`.")] if sc.ok else [])


@section("ablation.paired")
def paired_section(ctx: Context) -> list:
    return common.paired_section(ctx) if len(ctx.runs) else []


@section("ablation.loss_curves")
def loss_curves_section(ctx: Context) -> list:
    if not len(ctx.runs):
        return []
    figures = {name: ctx.figure(loss_curves_figure(ctx.hist, ctx.runs, ctx.extra.styles, x=x, labels=ctx.extra.labels), name)
               for name, x in LOSS_FIGURES.items()}
    return [("h2", "Loss curves"), ("p", "Mean over seeds; the band is ±1 std over seeds."),
            ("img", "train and val loss against step", figures["loss_vs_step"]),
            ("img", "train and val loss against training tokens", figures["loss_vs_tokens"]),
            ("img", "train and val loss against wall-clock time", figures["loss_vs_time"])]


@section("ablation.provenance")
def provenance_section(ctx: Context) -> list:
    inc, runs, ab = ctx.runs, ctx.runset.runs, ctx.extra
    src = inc if len(inc) else runs
    labels = [ab.labels.get(v, shorten(v, ab.shared)) for v in src["variant"]]
    b: list = [("h2", "Provenance"), *common.provenance_blocks(src, "results" if len(inc) else "matched runs",
                                                               "variants", labels),
               ("h2", "Left out")]
    lo = ctx.left_out
    if not len(lo):
        return b + [("p", f"Nothing: all {len(runs)} matched runs are finished, have the required metrics and "
                          "appear in every figure.")]
    return b + [("p", "Runs not shown as results (scope `report`) or missing from one figure, and why:"),
                ("table", *_left_out_rows(lo, ctx.extra.shared))]


def ablation_summary(ctx: Context) -> list[str]:
    rs = ctx.runset
    lines = [f"report for {rs.description}: {len(rs.included)} runs of {len(ctx.extra.table)} variants, "
             f"{_n_left(ctx)} left out -> {ctx.out / 'index.md'}"]
    if ctx.baseline:
        lines.append(f"verdicts on {VERDICT_METRIC}: equivalence margin {margin_text(ctx.margin.value)} bits/byte "
                     f"({ctx.margin.source})")
    if len(rs.included):
        lines.append(f"scaling: {ctx.once(scaling_fact).summary}")
    return lines + floor_line(ctx.floor)


ABLATION = Kind("ablation", load_ablation, lambda ctx: f"Ablation report: {ctx.runset.description}",
                ("ablation.head", "ablation.results", "ablation.quality", "ablation.scaling", "ablation.paired",
                 "context_length", "ablation.loss_curves", "ablation.provenance", "regenerate"),
                summary=ablation_summary, exit_code=lambda ctx: 0 if len(ctx.runs) else 1, args=regenerate_args,
                floor_arms=floor_arms,
                files=TOP_FILES + (context.CSV,),
                figures=tuple(LOSS_FIGURES) + tuple(QUALITY_FIGURES) + (common.SCALING_FIGURE,) + context.FIGURES)
