"""Regenerate an ablation report from MLflow: figures, a per-variant table, index.md and index.html.

    python -m analysis.report <experiment-or-filter> [--out DIR] [--baseline VARIANT] [--tracking-uri URI]
                              [--filter FILTER] [--format png] [--format svg] [--margin M] [--paired FILE]

`<experiment-or-filter>` is an MLflow experiment name, or else an MLflow search filter over all experiments
(e.g. "tags.choice.norm = 'rmsnorm'"). The tracking URI is `--tracking-uri`, else MLFLOW_TRACKING_URI, else
sqlite:///mlflow.db. Same runs in, same bytes out (no dates, sorted everything, fixed figure metadata, seeded
bootstraps).

Each variant gets one verdict against the baseline on final val bpb: better / worse / equivalent within ±m /
inconclusive (Holm-adjusted Welch tests and TOST against ±m; the rule is in analysis/verdict.py). `--margin M` sets
m in bits/byte; by default m is one baseline seed std, and the margin used is printed. When the runs form a compute
ladder (an arm at >= 3 training-compute values), a scaling section fits L(C) = E + A C^-alpha per arm and gives
compute multipliers against the baseline (analysis/scaling.py).

When the runs come from the verdict protocol (`python -m sweeps.verdict`: tagged `verdict.protocol`), the report is
the protocol's (analysis/protocol.py): verdicts per size from the seeds stage only, Holm within a family at a size,
the lr search, scaling fits over the sizes. Per-run tokens/s are always labelled as runs made at different times
(not paired); `--paired FILE` adds a paired measurement from `python -m ablations.paired --json FILE`.

Exit status: 0 report written; 1 report written but no run was usable (it lists what was left out and why);
2 nothing written: no experiment / no runs matched / bad filter / unknown baseline / missing store.
"""
from __future__ import annotations

import argparse
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import context, protocol, scaling
from analysis.document import fit_param, identifiability_blocks, margin_text, p_text, render_html, render_markdown, sci
from analysis.floor import FLOOR_COMMAND, Floor, floor_blocks, floor_for_runs, headline
from analysis.paired import UNPAIRED, load_paired, paired_blocks
from analysis.plots import loss_curves_figure, quality_figure, save_figure, scaling_figure, variant_styles
from analysis.stats import COMPARE_METRICS, FRONTIERS, SUMMARY_METRICS, variant_table
from analysis.verdict import VERDICT_METRIC, Margin, add_verdicts, resolve_margin
from analysis.store import (AnalysisError, RunSet, default_baseline, display_uri, load_runs, metric_histories,
                            order_variants, shorten, variant_labels)

LOSS_FIGURES = {"loss_vs_step": "step", "loss_vs_tokens": "tokens_seen", "loss_vs_time": "elapsed_sec"}
QUALITY_FIGURES = {  # figure -> frontier name in stats.FRONTIERS
    "quality_vs_kv_cache": "kv_cache",
    "quality_vs_train_throughput": "train_throughput",
    "quality_vs_decode_throughput": "decode_throughput",
}
TOP_FILES = ("index.md", "index.html", "summary.md", "summary.csv", "runs.csv", "left_out.csv", "scaling.csv")
SCALING_FIGURE = "loss_vs_compute"
SCALING_METRIC = "final_val_loss"
RUN_COLUMNS = ("variant", "label", "seed", "run_name", "run_id", "experiment", "git_commit", "git_dirty", "data_fingerprint",
               "tokenizer", "precision", "device", "final_val_loss", "final_val_bpb", "final_tokens_per_sec",
               "final_mfu", "params", "params_non_embedding", "flops_per_token", "kv_cache_bytes_per_token",
               "prefill_tokens_per_sec", "decode_tokens_per_sec", "decode_tokens_per_sec_nocache")
METRIC_NAMES = {
    "final_val_bpb": "val bpb (bits/byte)",
    "final_val_loss": "val loss (nats/token)",
    "final_tokens_per_sec": "train tokens/s (unpaired)",
}


@dataclass
class Report:
    out: Path
    runset: RunSet
    baseline: str | None
    table: pd.DataFrame
    left_out: pd.DataFrame  # run-level and figure-level exclusions
    labels: dict = field(default_factory=dict)
    shared: list = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    margin: Margin = Margin(float("nan"), "none")
    scaling: "Scaling | None" = None
    paired: dict | None = None  # a measurement of python -m ablations.paired (--paired FILE)
    paired_path: str | None = None
    command_args: list = field(default_factory=list)  # options to repeat in the Regenerate command
    floor: Floor | None = None  # the n-gram floor of the runs' data (analysis/floor.py), when the store has one

    @property
    def exit_code(self) -> int:
        return 0 if len(self.runset.included) else 1


# ---------------------------------------------------------------- formatting
def _fmt(v: float, kind: str) -> str:
    if v is None or not np.isfinite(v):
        return "n/a"
    if kind == "loss":
        return f"{v:.4f}"
    if kind == "pct":
        return f"{100 * v:.2f}%" if abs(v) >= 0.001 else f"{100 * v:.2g}%"
    if kind == "int":
        return f"{v:,.0f}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


KIND = {"final_val_loss": "loss", "final_val_bpb": "loss", "final_mfu": "pct", "params": "int",
        "kv_cache_bytes_per_token": "int", "final_tokens_per_sec": "rate", "decode_tokens_per_sec": "rate"}


def _mean_std(row, m: str) -> str:
    kind = KIND.get(m, "rate")
    mean, std, n = row[f"{m}_mean"], row[f"{m}_std"], row[f"{m}_n"]
    if n == 0:
        return "n/a"
    if n == 1 or not np.isfinite(std) or std == 0:
        return _fmt(mean, kind)
    return f"{_fmt(mean, kind)} ± {_fmt(std, kind)}"


def _signed(v: float, kind: str) -> str:
    s = _fmt(abs(v), kind)
    return s if s == "n/a" else ("+" if v >= 0 else "−") + s


def _delta(row, m: str) -> tuple[str, str, str]:
    """(difference [95% CI], p-value, verdict) strings for metric m of a table row."""
    verdict = row[f"verdict_{m}"]
    if verdict == "baseline":
        return "baseline", "", ""
    kind = KIND.get(m, "rate")
    d, lo, hi, p = row[f"delta_{m}"], row[f"delta_{m}_ci_low"], row[f"delta_{m}_ci_high"], row[f"p_{m}"]
    diff = _signed(d, kind)
    if np.isfinite(lo):
        diff += f" [{_signed(lo, kind)}, {_signed(hi, kind)}]"
    ptxt = "n/a" if not np.isfinite(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")
    return diff, ptxt, verdict


# ---------------------------------------------------------------- tables
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
    for _, r in table.iterrows():
        if r["is_baseline"]:
            continue

        def ci(lo, hi):
            return "n/a" if not np.isfinite(lo) else f"[{_signed(lo, 'loss')}, {_signed(hi, 'loss')}]"

        rows.append([f"`{r.get('label', r['variant'])}`", _signed(r[f"delta_{m}"], "loss"),
                     ci(r[f"delta_{m}_ci_low"], r[f"delta_{m}_ci_high"]), p_text(r[f"p_{m}"]), p_text(r[f"p_holm_{m}"]),
                     ci(r[f"tost_ci_low_{m}"], r[f"tost_ci_high_{m}"]), p_text(r[f"p_tost_{m}"]),
                     p_text(r[f"p_tost_holm_{m}"]), r["verdict"], _params_vs(r["params_mean"], base_params)])
    return headers, rows


def _params_vs(params: float, base: float) -> str:
    """Whether a variant's parameter count differs from the baseline's, with both counts."""
    if not (np.isfinite(params) and np.isfinite(base)):
        return "n/a"
    if params == base:
        return "same"
    return f"**differs**: {params:,.0f} vs {base:,.0f} ({100 * (params / base - 1):+.1f}%)"


def comparison_rows(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    headers = ["variant", "metric", "difference to baseline [95% CI]", "p (Welch)", "Welch test (unadjusted)"]
    rows = []
    for _, r in table.iterrows():
        if r["is_baseline"]:
            continue
        for m in COMPARE_METRICS:
            rows.append([f"`{r.get('label', r['variant'])}`", METRIC_NAMES.get(m, m), *_delta(r, m)])
    return headers, rows


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


def _counts(frame: pd.DataFrame, col: str) -> list[str]:
    vals = frame[col].fillna("(not recorded)").astype(str)
    return [f"`{k}`: {n} run{'s' if n != 1 else ''}" for k, n in sorted(vals.value_counts().items())]


@dataclass
class Prepared:
    """Everything the report (and the notebooks) draw from: runs, baseline, colours, per-variant table, histories."""

    runset: RunSet
    baseline: str | None
    variants: list[str]
    styles: dict
    table: pd.DataFrame
    hist: pd.DataFrame
    left_out: pd.DataFrame  # run-level (scope `report`) and figure-level exclusions
    labels: dict  # variant -> short display label
    shared: list  # override words shared by every variant (dropped from the labels)
    margin: Margin = Margin(float("nan"), "none")  # equivalence margin of the verdicts and how it was chosen


def prepare(query: str, tracking_uri: str | None = None, baseline: str | None = None,
            filter_string: str = "", margin: float | None = None, runset: RunSet | None = None) -> Prepared:
    """Load and summarise the runs of `query` (experiment name or MLflow filter). Raises AnalysisError when no run
    matched or the baseline has no usable runs. `margin`: the equivalence margin of the verdicts in bits/byte
    (default: one baseline seed std). `runset`: runs already loaded for this query."""
    runset = runset if runset is not None else load_runs(query, tracking_uri, filter_string)
    if runset.runs.empty:
        raise AnalysisError(f"no runs for {runset.description} at {display_uri(runset.tracking_uri)}; "
                            "nothing written")
    included = runset.included
    variants = order_variants(included["variant"].unique()) if len(included) else []
    labels, shared = variant_labels(included)
    by_label = {lab: v for v, lab in labels.items()}
    if baseline is not None and baseline not in variants and baseline in by_label:
        baseline = by_label[baseline]
    if baseline is not None and baseline not in variants:
        raise AnalysisError(f"baseline variant {baseline!r} has no usable runs; variants with results: "
                            + (", ".join(repr(labels[v]) for v in variants) or "none"))
    if baseline is None:
        baseline = default_baseline(included)
    variants = order_variants(variants, baseline)
    styles = variant_styles(variants)
    table = variant_table(included, baseline)
    if len(table):
        table.insert(1, "label", table["variant"].map(labels))
    try:
        margin_used = resolve_margin(margin, included.get("verdict.margin", ()), included.get("verdict.margin_reason", ()))
    except ValueError as exc:
        raise AnalysisError(str(exc)) from None
    table = add_verdicts(table, included, baseline, margin_used)
    included.insert(included.columns.get_loc("variant") + 1, "label", included["variant"].map(labels))
    hist = metric_histories(included["run_id"], tracking_uri=runset.tracking_uri) if len(included) else \
        pd.DataFrame(columns=["run_id", "key", "step", "value", "timestamp"])
    left_out = pd.concat([runset.left_out, pd.DataFrame(_figure_left_out(included, hist),
                                                        columns=runset.left_out.columns)], ignore_index=True)
    if len(left_out):
        left_out["seed"] = left_out["seed"].astype("Int64")
        left_out["_order"] = left_out["scope"] != "report"
        left_out = left_out.sort_values(["_order", "scope", "variant", "seed", "run_id"], na_position="last")
        left_out = left_out.drop(columns="_order").reset_index(drop=True)
    return Prepared(runset, baseline, variants, styles, table, hist, left_out, labels, shared, margin_used)


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


# ---------------------------------------------------------------- the report
def build_report(query: str, out: str | Path, baseline: str | None = None, tracking_uri: str | None = None,
                 filter_string: str = "", formats=("png",), margin: float | None = None,
                 paired: str | None = None) -> "Report | protocol.ProtocolReport":
    """Read the runs, write every file of the report into `out`, return a Report (a protocol.ProtocolReport when
    the runs come from the verdict protocol). Raises AnalysisError when nothing can be written (no such experiment,
    no runs, unknown baseline, bad margin, unreadable --paired file, ...)."""
    paired_res = load_paired(paired) if paired else None  # a bad file fails before anything is read or written
    runset = load_runs(query, tracking_uri, filter_string)
    if runset.runs.empty:
        raise AnalysisError(f"no runs for {runset.description} at {display_uri(runset.tracking_uri)}; "
                            "nothing written")
    args = _option_args(filter_string, baseline, margin, paired)
    if protocol.is_protocol(runset):
        return protocol.build(runset, out, baseline=baseline, margin=margin, formats=formats, paired=paired,
                              command_args=args)
    data = prepare(query, tracking_uri=tracking_uri, baseline=baseline, filter_string=filter_string, margin=margin,
                   runset=runset)
    runset, included, baseline, styles, table, hist = (data.runset, data.runset.included, data.baseline,
                                                      data.styles, data.table, data.hist)
    left_out = data.left_out

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figdir = out / "figures"
    all_figs = list(LOSS_FIGURES) + list(QUALITY_FIGURES) + [SCALING_FIGURE]
    for name in TOP_FILES:  # only our own files: never wipe a folder
        (out / name).unlink(missing_ok=True)
    for name in all_figs:
        for ext in ("png", "svg", "pdf"):
            (figdir / f"{name}.{ext}").unlink(missing_ok=True)
    report = Report(out=out, runset=runset, baseline=baseline, table=table, left_out=left_out, labels=data.labels,
                    shared=data.shared, margin=data.margin, paired=paired_res, paired_path=paired)
    report.scaling = scaling_analysis(data) if len(included) else None
    report.floor = floor_for_runs(runset.tracking_uri, included)

    figures: dict[str, str] = {}
    if len(included):
        for name, x in LOSS_FIGURES.items():
            fig = loss_curves_figure(hist, included, styles, x=x, labels=data.labels)
            figures[name] = _save(fig, figdir, name, formats, report)
        for name, frontier in QUALITY_FIGURES.items():
            xm, maximize = FRONTIERS[frontier]
            fig = quality_figure(included, table, styles, xm, maximize_x=maximize, labels=data.labels)
            figures[name] = _save(fig, figdir, name, formats, report)
        if report.scaling and report.scaling.ok:
            sc = report.scaling
            fig = scaling_figure(sc.points, sc.fits, variant_styles(sc.arms), SCALING_METRIC)
            figures[SCALING_FIGURE] = _save(fig, figdir, SCALING_FIGURE, formats, report)
            _write(out / "scaling.csv", sc.table.to_csv(index=False, lineterminator="\n"), report)

    # machine-readable tables
    _write(out / "summary.csv", table.to_csv(index=False, float_format=None, lineterminator="\n"), report)
    runs_csv = included[[c for c in RUN_COLUMNS if c in included.columns]
                        + sorted(c for c in included.columns if c.startswith("choice."))]
    _write(out / "runs.csv", runs_csv.to_csv(index=False, lineterminator="\n"), report)
    _write(out / "left_out.csv", left_out.to_csv(index=False, lineterminator="\n"), report)

    blocks = _blocks(report, figures, filter_string)
    blocks = context.insert_section(blocks, out, included, data.variants, data.labels, runset.tracking_uri, formats,
                                    report.files)  # evaluations at other contexts, when any (analysis/context.py)
    title = f"Ablation report: {runset.description}"
    _write(out / "summary.md", summary_markdown(table), report)
    _write(out / "index.md", render_markdown(blocks), report)
    _write(out / "index.html", render_html(blocks, title), report)
    report.files.sort()
    return report


def _save(fig, figdir: Path, name: str, formats, report: Report) -> str:
    for ext in formats:
        report.files.append(save_figure(fig, figdir / f"{name}.{ext}"))
    return f"figures/{name}.{formats[0]}"


def _write(path: Path, text: str, report: Report) -> None:
    path.write_text(text, encoding="utf-8", newline="\n")
    report.files.append(path)


def _option_args(filter_string: str, baseline: str | None, margin: float | None, paired: str | None) -> list[str]:
    """The options a Regenerate command repeats (besides the query, tracking URI and --out)."""
    args = ["--filter", filter_string] if filter_string else []
    if baseline:
        args += ["--baseline", baseline]
    if margin is not None:
        args += ["--margin", f"{margin:g}"]
    return args + (["--paired", paired] if paired else [])


def _command(report: Report, filter_string: str) -> str:
    args = ["python", "-m", "analysis.report", report.runset.query,
            "--tracking-uri", display_uri(report.runset.tracking_uri)]
    if filter_string:
        args += ["--filter", filter_string]
    if report.baseline:
        args += ["--baseline", report.labels.get(report.baseline, report.baseline)]
    if np.isfinite(report.margin.value) and report.margin.source.startswith("given"):
        args += ["--margin", f"{report.margin.value:g}"]
    if report.paired_path:
        args += ["--paired", report.paired_path]
    return " ".join(shlex.quote(a) for a in args) + " --out DIR"


def _blocks(report: Report, figures: dict, filter_string: str) -> list:
    rs, table = report.runset, report.table
    inc, runs = rs.included, rs.runs
    n_left = int((report.left_out["scope"] == "report").sum()) if len(report.left_out) else 0
    b: list = [("h1", f"Ablation report: {rs.description}")]
    if len(table):
        best = table.loc[table["final_val_bpb_mean"].idxmin()]
        b.extend(headline(report.floor, float(best["final_val_bpb_mean"]),
                          f"the best variant (`{report.labels.get(best['variant'], best['variant'])}`)"))
    b.append(("p", f"MLflow tracking URI `{display_uri(rs.tracking_uri)}`; experiments: "
                   + ", ".join(f"`{e}`" for e in sorted(runs["experiment"].astype(str).unique())) + ". "
                   f"**{len(inc)}** finished runs of **{len(table)}** variants are results; "
                   f"{n_left} of {len(runs)} matched runs were left out (see [Left out](#left-out))."))
    if not len(inc):
        b.append(("p", "**No usable runs**: no finished run with the required metrics (`final_val_loss`, "
                       "`final_val_bpb`). Nothing to plot; see below for what was left out and why."))
    else:
        if report.shared:
            b.append(("p", "Variants are named by their overrides (the MLflow `variant` tag) without those "
                           "shared by all: `" + " ".join(report.shared) + "`."))
        b.append(("p", f"Baseline variant: `{report.labels[report.baseline]}`. Values are mean ± std over seeds (sample std, "
                       "ddof=1); differences are variant minus baseline with a 95% Welch confidence interval and "
                       "Welch's t-test p-value; **not significant** means p ≥ 0.05; n/a with fewer than two "
                       "seeds on either side. Train tokens/s are per run, from " + UNPAIRED + ": a difference "
                       "between variants is not a speed comparison (see [Paired throughput](#paired-throughput))."))
        b.extend(_verdict_intro(report))
        b.append(("h2", "Results per variant"))
        h, r = summary_rows(table)
        b.append(("table", h, r))
        b.extend(floor_blocks(report.floor, [(f"`{report.labels.get(v, v)}`", m) for v, m in
                                             zip(table["variant"], table["final_val_bpb_mean"])], FLOOR_COMMAND))
        h, r = comparison_rows(table)
        if r:
            b.append(("p", "Differences to the baseline:"))
            b.append(("table", h, r))
        h, r = verdict_rows(table)
        if r:
            b.append(("h2", "Verdicts"))
            b.append(("p", "What each verdict rests on (val bpb, variant minus baseline): the 95% Welch CI "
                           "(t-based, Welch-Satterthwaite df), the Welch and TOST p-values, Holm-adjusted across "
                           "every non-baseline variant (one family)."))
            b.append(("table", h, r))
        b.append(("p", "Machine-readable: `summary.csv` (per variant), `runs.csv` (per run), `left_out.csv`."))
        b.append(("h2", "Quality against KV-cache size"))
        b.append(("img", "val bpb against KV-cache bytes per token", figures["quality_vs_kv_cache"]))
        for frontier, label in (("kv_cache", "val bpb vs KV-cache bytes/token"),
                                ("train_throughput", "val bpb vs training tokens/s"),
                                ("decode_throughput", "val bpb vs decode tokens/s")):
            front = [f"`{v}`" for v in table.loc[table[f"pareto_{frontier}"], "label"]]
            b.append(("p", f"Pareto-optimal variants ({label}): " + (", ".join(front) or "none") + "."))
            if frontier == "kv_cache":
                b.append(("h2", "Quality against throughput"))
                b.append(("img", "val bpb against training tokens/s", figures["quality_vs_train_throughput"]))
                b.append(("img", "val bpb against decode tokens/s", figures["quality_vs_decode_throughput"]))
        b.extend(_scaling_blocks(report, figures))
        b.extend(paired_blocks(report.paired, report.paired_path))
        b.append(("h2", "Loss curves"))
        b.append(("p", "Mean over seeds; the band is ±1 std over seeds."))
        b.append(("img", "train and val loss against step", figures["loss_vs_step"]))
        b.append(("img", "train and val loss against training tokens", figures["loss_vs_tokens"]))
        b.append(("img", "train and val loss against wall-clock time", figures["loss_vs_time"]))
    b.append(("h2", "Provenance"))
    src = inc if len(inc) else runs
    b.append(("p", "Git commits of the " + ("results" if len(inc) else "matched runs") + ":"))
    b.append(("ul", _counts(src.assign(git_commit=src["git_commit"].fillna("(not recorded)").astype(str)
                                       + np.where(src["git_dirty"].astype(str).str.lower() == "true",
                                                  " (dirty)", "")), "git_commit")))
    b.append(("p", "Data fingerprints:"))
    b.append(("ul", _counts(src, "data_fingerprint")))
    b.append(("h2", "Left out"))
    lo = report.left_out
    if not len(lo):
        b.append(("p", f"Nothing: all {len(runs)} matched runs are finished, have the required metrics and appear "
                       "in every figure."))
    else:
        b.append(("p", "Runs not shown as results (scope `report`) or missing from one figure, and why:"))
        b.append(("table", *_left_out_rows(lo, report.shared)))
    b.append(("h2", "Regenerate"))
    b.append(("code", _command(report, filter_string)))
    return b


# ---------------------------------------------------------------- verdicts and scaling sections
def _verdict_intro(report: Report) -> list:
    m = report.margin
    return [("p", f"**Verdict** (val bpb, lower is better), exactly one of *better*, *worse*, *equivalent within "
                  f"±m*, *inconclusive*. Equivalence margin m = {margin_text(m.value)} bits/byte ({m.source}). "
                  "Rule: *equivalent within ±m* when the TOST p-value (two one-sided Welch tests against ±m), "
                  "Holm-adjusted across the variants, is < 0.05 (the 90% CI of the difference lies inside ±m); else "
                  "*better* / *worse* when the Welch p-value, Holm-adjusted across the variants, is < 0.05; else "
                  "*inconclusive*: neither a difference nor an equivalence was shown (a non-significant p is not "
                  "evidence of no difference). With fewer than two seeds on either side: *inconclusive*.")]


@dataclass
class Scaling:
    """The scaling section's data: per-run points (arm, seed, compute, loss), fits, the per-arm table."""

    ok: bool
    summary: str  # one line: what was fitted, or why the section is skipped
    points: pd.DataFrame = field(default_factory=pd.DataFrame)
    fits: dict = field(default_factory=dict)
    table: pd.DataFrame = field(default_factory=pd.DataFrame)
    arms: list = field(default_factory=list)


def scaling_analysis(data: Prepared) -> Scaling:
    """Fit L(C) per arm when the baseline's arm has runs at >= 3 training-compute values; else say why not."""
    inc = data.runset.included
    compute = scaling.run_compute(inc, data.hist)
    arms = inc["variant"].map(scaling.arm_of)
    if "verdict.arm" in inc:  # runs of the verdict protocol name their arm
        arms = inc["verdict.arm"].where(inc["verdict.arm"].notna(), arms)
    points = pd.DataFrame({"arm": arms.to_numpy(), "variant": inc["variant"].to_numpy(),
                           "seed": inc["seed"].to_numpy(), "compute": compute.reindex(inc["run_id"]).to_numpy(),
                           SCALING_METRIC: inc[SCALING_METRIC].astype(float).to_numpy()})
    missing = int(points["compute"].isna().sum())
    points = points[np.isfinite(points["compute"].astype(float))]
    base_arm = points.loc[points["variant"] == data.baseline, "arm"].iloc[0] if \
        (points["variant"] == data.baseline).any() else scaling.arm_of(data.baseline)
    levels = points.loc[points["arm"] == base_arm, "compute"].nunique()
    if levels < scaling.MIN_LEVELS:
        why = (f"skipped: the baseline arm `{base_arm}` has runs at {levels} distinct training-compute value(s); a "
               f"fit of L(C) = E + A C^-alpha needs >= {scaling.MIN_LEVELS} (a ladder of model sizes or steps)")
        if missing:
            why += f"; {missing} run(s) lack flops_per_token or a tokens_seen history"
        return Scaling(False, why)
    table, fits = scaling.scaling_table(points, base_arm, SCALING_METRIC)
    arms = list(table["arm"])
    summary = (f"fitted {len(fits)} of {len(arms)} arm(s) over {points['compute'].nunique()} compute values; "
               f"baseline arm `{base_arm}`")
    return Scaling(True, summary, points.reset_index(drop=True), fits, table, arms)


def _scaling_blocks(report: Report, figures: dict) -> list:
    sc = report.scaling
    b: list = [("h2", "Scaling with compute")]
    if sc is None or not sc.ok:
        b.append(("p", "Scaling fits: " + (sc.summary if sc else "skipped: no results") + "."))
        return b
    b.append(("p", "Final val loss (nats/token) against training compute C = flops_per_token × tokens seen, per "
                   "arm (a variant without its model-size / step overrides), fitted as L(C) = E + A·C^−alpha by "
                   "least squares (analysis/scaling.py). Compute multiplier: the compute the baseline's fitted law "
                   "needs to reach the arm's mean loss at the arm's largest compute, divided by that compute "
                   "(> 1: the arm needs less compute); 95% percentile bootstrap CI over seeds (200 resamples, the "
                   "baseline refitted each time). ∞: the baseline's law never reaches that loss."))
    b.append(("img", "final val loss against training compute with fitted laws", figures[SCALING_FIGURE]))
    rows = []
    for _, r in sc.table.iterrows():
        mult = "baseline" if r["is_baseline"] else (
            f"{sci(r['multiplier'])} [{sci(r['multiplier_ci_low'])}, {sci(r['multiplier_ci_high'])}]"
            if np.isfinite(r["multiplier"]) or r["multiplier"] == np.inf else "n/a (baseline law not identifiable)")
        rows.append([f"`{r['arm']}`", str(r["n_runs"]), str(r["n_levels"]), fit_param(r, "E"),
                     fit_param(r, "A"),
                     fit_param(r, "alpha"), sci(r["compute_top"]), _fmt(r["loss_top"], "loss"), mult])
    b.append(("table", ["arm", "runs", "compute values", "E", "A", "alpha", "largest compute (FLOPs)",
                        "mean loss there", "compute multiplier [95% CI]"], rows))
    b.extend(identifiability_blocks(sc.table))
    b.append(("p", "Machine-readable: `scaling.csv`."))
    return b


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("query", help="MLflow experiment name, or an MLflow search filter over all experiments")
    parser.add_argument("--out", default=None, help="output folder (default: reports/<experiment>)")
    parser.add_argument("--baseline", default=None,
                        help="variant to compare against (default: a variant named 'baseline', else the one "
                             "closest to the GPT-2 choices learned/layernorm/gelu/mha, else the first by name)")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    parser.add_argument("--filter", default="", help="extra MLflow filter string on the experiment's runs")
    parser.add_argument("--format", action="append", choices=("png", "svg", "pdf"), dest="formats",
                        help="figure format(s); repeatable (default: png)")
    parser.add_argument("--margin", type=float, default=None,
                        help="equivalence margin m in bits/byte for the verdicts (default: one baseline seed std, "
                             "printed; per size in a protocol report)")
    parser.add_argument("--paired", default=None, metavar="FILE",
                        help="a paired throughput measurement: the JSON of python -m ablations.paired --json FILE")
    args = parser.parse_args(argv)
    out = args.out or str(Path("reports") / (re.sub(r"[^A-Za-z0-9_.-]+", "_", args.query).strip("_") or "report"))
    try:
        report = build_report(args.query, out, baseline=args.baseline, tracking_uri=args.tracking_uri,
                              filter_string=args.filter, formats=tuple(args.formats or ("png",)),
                              margin=args.margin, paired=args.paired)
    except AnalysisError as exc:
        print(f"analysis.report: error: {exc}", file=sys.stderr)
        return 2
    if isinstance(report, protocol.ProtocolReport):
        print("\n".join(report.summary_lines()))
        return report.exit_code
    rs = report.runset
    n_left = int((report.left_out["scope"] == "report").sum()) if len(report.left_out) else 0
    print(f"report for {rs.description}: {len(rs.included)} runs of {len(report.table)} variants, "
          f"{n_left} left out -> {Path(out) / 'index.md'}")
    if report.baseline:
        print(f"verdicts on {VERDICT_METRIC}: equivalence margin {margin_text(report.margin.value)} bits/byte "
              f"({report.margin.source})")
    if report.scaling is not None:
        print(f"scaling: {report.scaling.summary}")
    if report.floor is not None:
        print("n-gram floor (bpb by order): " + ", ".join(f"{n}: {v:.4f}" for n, v in report.floor.bpb.items()))
    if report.exit_code:
        print("analysis.report: no usable run (none finished with final_val_loss and final_val_bpb); the report "
              "lists what was left out", file=sys.stderr)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
