"""Sections shared by several report kinds: the n-gram floor, the paired throughput, the scaling fits and the
Regenerate command.

Each reads what the kind's load put into the context (`ctx.floor`, analysis/floor.py), the options (paired=FILE)
and what the kind says of itself (`Kind.floor_arms`: (label, mean val bpb) per arm; `Kind.args`: the options the
Regenerate command repeats).
"""
from __future__ import annotations

import shlex

import numpy as np

from analysis.document import fit_param, fixed, identifiability_blocks, machine_counts, multiplier_text, run_counts, sci
from analysis.engine import section
from analysis.floor import FLOOR_COMMAND, floor_blocks
from analysis.paired import paired_blocks
from analysis.plots import scaling_figure, variant_styles
from analysis.runs import commits
from analysis.scaling import METRIC, MIN_LEVELS, Scaling
from analysis.store import display_uri


@section("floor")
def floor_section(ctx) -> list:
    """The n-gram floor of the runs' data beside each arm's mean val bpb."""
    return floor_blocks(ctx.floor, ctx.kind.floor_arms(ctx), FLOOR_COMMAND)


@section("paired")
def paired_section(ctx) -> list:
    return paired_blocks(ctx.options.paired, ctx.options.paired_path)


def provenance_blocks(runs, of: str, by: str, group) -> list:
    """Where the runs came from: their git commits, data fingerprints and machines (`device_name`), each machine
    with the `group` values (one per run, described by `by`) that ran on it."""
    return [("p", f"Git commits of the {of}:"), ("ul", run_counts(commits(runs))), ("p", "Data fingerprints:"),
            ("ul", run_counts(runs["data_fingerprint"].fillna("(not recorded)").astype(str))),
            ("p", f"Machines (the runs' `device_name`; {by}):"),
            ("ul", machine_counts(runs.assign(group=list(group)), "group"))]


SCALING_FIGURE = "loss_vs_compute"


def scaling_blocks(ctx, sc: Scaling, arms: list) -> list:
    """The fits of a report's scaling fact (analysis.scaling.scaling_of), or the line saying why there are none;
    writes scaling.csv and the figure (arms: the kind's order, which fixes the colours)."""
    if not sc.ok:
        return [("p", "Scaling fits: " + sc.summary + ".")]
    figure = ctx.figure(scaling_figure(sc.points, sc.fits, variant_styles(arms), METRIC), SCALING_FIGURE)
    ctx.write_csv("scaling.csv", sc.table)
    b: list = [("p", "Fits of L(C) = E + A·C^−alpha per arm by least squares over every seed "
                     "(analysis/scaling.py). Compute multiplier: the compute the baseline's fitted law needs to "
                     "reach the arm's mean loss at the arm's largest compute, divided by that compute (> 1: the arm "
                     "needs less compute); 95% percentile bootstrap CI over seeds (200 resamples, the baseline "
                     "refitted each time). ∞: the baseline's law never reaches that loss."),
               ("img", "final val loss against compute with fitted laws (log-log)", figure)]
    rows = []
    for _, r in sc.table.iterrows():
        spare = int(r["n_levels"]) - MIN_LEVELS
        law = "n/a" if not np.isfinite(r["E"]) else ("interpolates (not tested)" if spare <= 0 else
                                                     f"{spare} level(s) to spare")
        rows.append([f"`{r['arm']}`", str(r["n_runs"]), str(r["n_levels"]), fit_param(r, "E"), fit_param(r, "A"),
                     fit_param(r, "alpha"), law, sci(r["compute_top"]), fixed(r["loss_top"]), multiplier_text(r)])
    b.append(("table", ["arm", "runs", "compute levels", "E", "A", "alpha", "law", "largest compute (FLOPs)",
                        "mean loss there", "compute multiplier [95% CI]"], rows))
    exact = [r.arm for r in sc.table.itertuples() if np.isfinite(r.E) and r.n_levels <= MIN_LEVELS]
    if exact:  # as many levels as parameters: the law passes through every mean, whatever the true curve
        b.append(("p", f"**The law interpolates, it is not tested**: {', '.join(f'`{a}`' for a in exact)} "
                       f"{'has' if len(exact) == 1 else 'have'} as many compute levels as L(C) has parameters (3: "
                       "E, A, alpha), so the fit can pass through the mean loss at every level whatever the true "
                       "curve; E, alpha and any extrapolation beyond the ladder are not supported by these runs. "
                       "A fourth size would be the first test of the law."))
    return b + identifiability_blocks(sc.table)


def command(ctx) -> str:
    """The command that regenerates this report (its kind, query, store, the options it was given) into DIR:
    `python -m analysis.report KIND QUERY tracking_uri=URI key=value ... out=DIR`, each value shell-quoted."""
    opt = ctx.options
    options = [("tracking_uri", display_uri(opt.tracking_uri)), *ctx.kind.args(ctx)]
    return " ".join(["python -m analysis.report", shlex.quote(ctx.kind.name), shlex.quote(opt.query),
                     *(f"{key}={shlex.quote(value)}" for key, value in options), "out=DIR"])


@section("regenerate")
def regenerate_section(ctx) -> list:
    return [("h2", "Regenerate"), ("code", command(ctx))]
