"""Learning-rate transfer across width (issue 18, item 4): does the best lr move when the model gets wider?

Reads the runs of one MLflow experiment (default `lr-transfer`, written by scripts/lr_transfer.sh) and nothing
else. Each run is a point (optimizer, parametrization, width, lr, seed) -> final val loss, identified by the MLflow
params `optim.name`, `model.parametrization`, `model.n_embd`, `optim.lr`, `seed`. Writes into out=:

    index.md           the generated report (never hand-edited): tables and plain statements
    lr_transfer.svg    Tensor Programs V's Figure 1 shape: final val loss against log2(lr), one curve per width
                       (mean over seeds, band = the seeds' range), one panel per (optimizer, parametrization)

    python -m analysis.report lr-transfer lr-transfer tracking_uri=sqlite:///study/lr-transfer/mlflow.db \
        out=reports/lr-transfer

(`python -m analysis.lr_transfer tracking_uri=URI out=DIR [experiment=E]`, the older command that earlier pages name,
still works, and so do its flags: `--tracking-uri URI --out DIR`.)

Definitions (stated once here, repeated in the report): the best lr of a width is the lr with the lowest mean
final val loss over seeds; a diverged run (the harness stops it with "training loss is nan/inf") makes its lr's
mean infinite. Positions are grid steps (index in the panel's sorted lr grid; the study's grid is factor 2).
The optimum is interior when it is neither the smallest nor the largest lr run at that width. Transfer holds in a
panel when every width's optimum is interior and the optima span at most one grid step across all widths; it failed
when even the least span the data allow (an edge optimum may lie beyond the grid) exceeds one step; otherwise
(edge optima that could still lie within one step) it is not established.
Same store, same bytes: numbers are printed at fixed precision and the SVG carries no date.
"""
from __future__ import annotations

import math
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ablations.cli import Command, CommandLineError, Option  # the one command-line parser: a leaf

from .document import fixed, lr_text
from .engine import Context, Kind, Options, build as build_kind, section
from .plots import save_figure
from .store import AnalysisError, display_uri, resolve_tracking_uri, search_runs

EXPERIMENT = "lr-transfer"
FIGURE = "lr_transfer.svg"
SCRIPT = "scripts/lr_transfer.sh"  # the default study's script (its --report regenerates the page)
# panel order: rows = optimizer, columns = parametrization (unknown values sort after these)
OPTIMIZERS = ("adamw", "muon")
PARAMETRIZATIONS = ("sp", "mup")
LABELS = {"adamw": "AdamW", "muon": "Muon", "sp": "SP", "mup": "μP"}
MAX_SHIFT = 1  # grid steps: the transfer criterion
KEY = ["optimizer", "parametrization", "width", "lr", "seed"]
DIVERGED = "training loss is"  # the harness's DivergenceError message (ablations/lit.py)
UNIT = "nats per token"  # the loss these reports read (final_val_loss): not bits per byte
INF_TEXT = "inf (diverged)"  # a loss mean with a diverged seed (document.fixed prints +inf as this)
# design params shown in the report when the runs agree on them
DESIGN_PARAMS = ("data.name", "tokenizer.name", "model.n_layer", "model.n_head", "model.block_size",
                 "data.batch_size", "trainer.max_steps", "optim.warmup_steps", "optim.min_lr",
                 "optim.weight_decay", "trainer.gradient_clip_val", "data.val_windows", "model.mup.base_width",
                 "threads", "torch_version")


@dataclass
class Study:
    uri: str
    experiment: str
    points: pd.DataFrame    # one row per counted run: KEY + loss, diverged, run_id, timing, commit
    left_out: pd.DataFrame  # run_id, reason
    runs: pd.DataFrame      # every run of the experiment (timing of the whole study)
    design: dict            # param -> value (or "varies")


def _order(values, known) -> list:
    return sorted(set(values), key=lambda v: (known.index(v) if v in known else len(known), str(v)))


def _num(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def run_row(run) -> dict:
    """One MLflow run as a flat row (params, the final loss, timing, commit, failure reason)."""
    p, t, m = run.data.params, run.data.tags, run.data.metrics
    row = {"run_id": run.info.run_id, "status": run.info.status, "start": run.info.start_time,
           "end": run.info.end_time, "optimizer": p.get("optim.name", p.get("optimizer")),
           "parametrization": p.get("model.parametrization", p.get("parametrization", "sp")),
           "width": _num(p.get("model.n_embd")), "lr": _num(p.get("optim.lr")), "seed": _num(p.get("seed")),
           "loss": _num(m.get("final_val_loss")), "elapsed": _num(m.get("elapsed_sec")),
           "commit": t.get("git_commit", "unknown"), "dirty": t.get("git_dirty", "unknown"),
           "failure": t.get("failure_reason") or ""}
    row.update({f"param:{k}": p.get(k, t.get(k)) for k in DESIGN_PARAMS})
    return row


def classify(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(points, left_out): finished runs with a finite loss and diverged runs count (newest run per KEY);
    every other run is left out with its reason."""
    left, keep = [], []
    for _, r in runs.iterrows():
        missing = [k for k in ("width", "lr", "seed") if not math.isfinite(r[k])] + \
                  [k for k in ("optimizer",) if not r[k]]
        diverged = r["status"] == "FAILED" and DIVERGED in r["failure"]
        if missing:
            left.append((r["run_id"], "missing param " + ", ".join(missing)))
        elif diverged:
            keep.append({**r, "loss": math.inf, "diverged": True})
        elif r["status"] != "FINISHED":
            left.append((r["run_id"], f"run {r['status']}" + (f" ({r['failure'][:120]})" if r["failure"] else "")))
        elif not math.isfinite(r["loss"]):
            left.append((r["run_id"], "no final_val_loss"))
        else:
            keep.append({**r, "diverged": False})
    points = pd.DataFrame(keep, columns=[*runs.columns, "diverged"])
    if len(points):
        points = points.sort_values(["start", "run_id"], ascending=False)
        dup = points.duplicated(KEY, keep="first")
        newest = points[~dup].set_index(KEY)["run_id"]
        for _, r in points[dup].iterrows():
            left.append((r["run_id"], f"superseded by newer run {newest.loc[tuple(r[KEY])]} (same point and seed)"))
        points = points[~dup]
        points = points.astype({"width": int, "seed": int}).sort_values(KEY).reset_index(drop=True)
    left_out = pd.DataFrame(left, columns=["run_id", "reason"]).sort_values("run_id").reset_index(drop=True)
    return points, left_out


def load_study(tracking_uri: str | None = None, experiment: str = EXPERIMENT) -> Study:
    """The study's runs from MLflow: counted points, what was left out, and the shared design."""
    uri = resolve_tracking_uri(tracking_uri)
    runs, _, _ = search_runs(experiment, uri)
    frame = pd.DataFrame([run_row(r) for r in runs])
    if frame.empty:
        raise AnalysisError(f"experiment {experiment!r} at {display_uri(uri)} has no runs: run scripts/lr_transfer.sh")
    points, left_out = classify(frame)
    if points.empty:
        raise AnalysisError(f"experiment {experiment!r} at {display_uri(uri)} has no finished run with "
                            f"final_val_loss ({len(left_out)} left out)")
    design = {}
    for k in DESIGN_PARAMS:
        vals = sorted(set(points[f"param:{k}"].dropna().astype(str)))
        if vals:
            design[k] = vals[0] if len(vals) == 1 else "varies: " + ", ".join(vals)
    return Study(uri, experiment, points, left_out, frame, design)


def curves(points: pd.DataFrame) -> pd.DataFrame:
    """Per (optimizer, parametrization, width, lr): seeds, mean, min, max of the final val loss (inf if one
    seed diverged), diverged count, and the lr's grid step within its panel."""
    g = points.groupby(KEY[:-1], sort=True)
    out = g["loss"].agg(n="size", mean="mean", lo="min", hi="max").reset_index()
    out["diverged"] = g["diverged"].sum().to_numpy().astype(int)
    out["step"] = -1
    for _, idx in out.groupby(["optimizer", "parametrization"]).groups.items():
        grid = sorted(out.loc[idx, "lr"].unique())
        out.loc[idx, "step"] = out.loc[idx, "lr"].map({lr: i for i, lr in enumerate(grid)})
    return out


def optima(cur: pd.DataFrame) -> pd.DataFrame:
    """Per (optimizer, parametrization, width): the best lr (lowest mean; ties: the smaller lr), its grid step,
    whether it is interior, its mean loss, the seeds' range there and the gap to the next-best lr."""
    rows = []
    for (o, p, w), c in cur.groupby(["optimizer", "parametrization", "width"], sort=True):
        c = c.sort_values(["mean", "lr"], kind="stable")
        best = c.iloc[0]
        gap = c.iloc[1]["mean"] - best["mean"] if len(c) > 1 else math.nan
        rows.append({"optimizer": o, "parametrization": p, "width": int(w), "best_lr": best["lr"],
                     "step": int(best["step"]), "interior": bool(c["lr"].min() < best["lr"] < c["lr"].max()),
                     "lr_min": bool(best["lr"] == c["lr"].min() and len(c) > 1),
                     "loss": best["mean"], "spread": best["hi"] - best["lo"], "seeds": int(best["n"]),
                     "gap": gap, "lrs": len(c)})
    return pd.DataFrame(rows)


def transfer(opt: pd.DataFrame) -> pd.DataFrame:
    """Per panel: the optimum's signed shift from the narrowest to the widest width and its span over all widths
    (grid steps); the least span consistent with the data (an optimum at the grid's edge may lie beyond it); and
    the verdict: held (all interior, span <= MAX_SHIFT), failed (least span > MAX_SHIFT), else not established."""
    rows = []
    for (o, p), t in opt.groupby(["optimizer", "parametrization"], sort=False):
        t = t.sort_values("width")
        span = int(t["step"].max() - t["step"].min())
        interior = bool(t["interior"].all())
        least = least_span(t)
        verdict = ("held" if interior and span <= MAX_SHIFT and len(t) > 1 else
                   "failed" if least > MAX_SHIFT else "not established")
        rows.append({"optimizer": o, "parametrization": p, "widths": len(t),
                     "ratio": int(t["width"].max() // t["width"].min()),
                     "shift": int(t["step"].iloc[-1] - t["step"].iloc[0]), "span": span, "least_span": least,
                     "interior": interior, "max_spread": float(t["spread"].max()), "held": verdict == "held",
                     "verdict": verdict, "statement": statement(t, span, least, verdict)})
    out = pd.DataFrame(rows)
    out["_o"] = out["optimizer"].map(lambda v: _order(out["optimizer"], OPTIMIZERS).index(v))
    out["_p"] = out["parametrization"].map(lambda v: _order(out["parametrization"], PARAMETRIZATIONS).index(v))
    return out.sort_values(["_o", "_p"]).drop(columns=["_o", "_p"]).reset_index(drop=True)


def least_span(t: pd.DataFrame) -> int:
    """The smallest span of the true optima the data allow: an optimum at the lowest lr of its width may lie
    lower, one at the highest higher; interior optima are where they are."""
    lo = [-math.inf if not r.interior and r.lr_min else r.step for r in t.itertuples()]
    hi = [math.inf if not r.interior and not r.lr_min else r.step for r in t.itertuples()]
    return int(max(0, max(lo) - min(hi)))


def statement(t: pd.DataFrame, span: int, least: int, verdict: str) -> str:
    """The plain sentence for one panel (t: its optima sorted by width)."""
    o, p = (LABELS.get(t[k].iloc[0], t[k].iloc[0]) for k in ("optimizer", "parametrization"))
    w0, w1 = int(t["width"].iloc[0]), int(t["width"].iloc[-1])
    lrs = ", ".join(f"{lr_text(r.best_lr)} (w{r.width})" for r in t.itertuples())
    shift = int(t["step"].iloc[-1] - t["step"].iloc[0])
    move = "did not move" if shift == 0 else f"moved {abs(shift)} grid step{'s' * (abs(shift) != 1)} " \
                                              f"{'up' if shift > 0 else 'down'}"
    edges = [f"w{r.width}" for r in t.itertuples() if not r.interior]
    edge = f" (optimum at the grid's edge at {', '.join(edges)})" if edges else ""
    head = {"held": f"**Transfer held** for {o} + {p}: ",
            "failed": f"**Transfer failed** for {o} + {p}{edge}: ",
            "not established": f"**Transfer not established** for {o} + {p}{edge}: "}[verdict]
    at_least = f", at least {least} even if each edge optimum lies just beyond the grid" if edges and verdict == \
        "failed" else ""
    return (f"{head}from width {w0} to {w1} ({w1 // w0}x) the best lr {move} (span over all widths {span} "
            f"step{'s' * (span != 1)}{at_least}; best lrs {lrs}).")


# ------------------------------------------------------------------------------------------------ figure
def figure(cur: pd.DataFrame, opt: pd.DataFrame):
    """Final val loss against log2(lr): a row per optimizer, a column per parametrization, a curve per width
    (mean over seeds, band = the seeds' min..max, star = the width's best lr, x at the top = a diverged lr)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    os_ = _order(cur["optimizer"], OPTIMIZERS)
    ps = _order(cur["parametrization"], PARAMETRIZATIONS)
    widths = sorted(cur["width"].unique())
    colors = {w: colormaps["viridis"](0.9 * i / max(1, len(widths) - 1)) for i, w in enumerate(widths)}
    fig = Figure(figsize=(4.2 * len(ps), 3.4 * len(os_)), dpi=100, layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(os_), len(ps), squeeze=False))
    for i, o in enumerate(os_):
        finite = cur[(cur["optimizer"] == o) & np.isfinite(cur["hi"])]
        best = opt.loc[opt["optimizer"] == o, "loss"].min()
        lo = finite["lo"].min() if len(finite) else 0.0
        top = min(finite["hi"].max(), best + 1.5) if len(finite) else 1.0
        pad = 0.04 * (top - lo) or 0.1
        for j, p in enumerate(ps):
            ax = axes[i][j]
            for w in widths:
                c = cur[(cur["optimizer"] == o) & (cur["parametrization"] == p) & (cur["width"] == w)]
                if c.empty:
                    continue
                c = c.sort_values("lr")
                ok = c[np.isfinite(c["mean"])]
                x = np.log2(ok["lr"].to_numpy())
                ax.plot(x, ok["mean"], "-o", ms=3, lw=1.4, color=colors[w], label=f"width {w}")
                ax.fill_between(x, ok["lo"], ok["hi"], color=colors[w], alpha=0.2, lw=0)
                bad = c[~np.isfinite(c["mean"])]
                ax.plot(np.log2(bad["lr"].to_numpy()), np.full(len(bad), top + pad / 2), "x", color=colors[w])
                b = opt[(opt["optimizer"] == o) & (opt["parametrization"] == p) & (opt["width"] == w)]
                ax.plot(np.log2(b["best_lr"].to_numpy()), b["loss"], "*", ms=11, color=colors[w], mec="black",
                        mew=0.6)
            ax.set_ylim(lo - pad, top + pad)
            ax.set_title(f"{LABELS.get(o, o)}, {LABELS.get(p, p)}", fontsize="medium")
            ax.set_xlabel("log2 learning rate")
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel("final val loss (nats/token)")
    axes[0][-1].legend(fontsize="small", loc="upper right")
    fig.suptitle("Final val loss against lr per width (mean over seeds, band: seed range, star: best lr)",
                 fontsize="medium")
    return fig


# ------------------------------------------------------------------------------------------------ report
def optima_rows(opt: pd.DataFrame, tr: pd.DataFrame) -> list[list[str]]:
    rows = []
    for t in tr.itertuples():
        for r in opt[(opt["optimizer"] == t.optimizer) & (opt["parametrization"] == t.parametrization)] \
                .sort_values("width").itertuples():
            rows.append([LABELS.get(r.optimizer, r.optimizer), LABELS.get(r.parametrization, r.parametrization),
                         str(r.width), lr_text(r.best_lr), f"{math.log2(r.best_lr):.1f}", str(r.step),
                         "yes" if r.interior else "**edge**", *[fixed(v, 3, INF_TEXT) for v in (r.loss, r.spread)],
                         str(r.seeds), fixed(r.gap, 3, INF_TEXT)])
    return rows


def transfer_rows(tr: pd.DataFrame) -> list[list[str]]:
    return [[LABELS.get(t.optimizer, t.optimizer), LABELS.get(t.parametrization, t.parametrization),
             f"{t.widths} ({t.ratio}x)", f"{t.shift:+d}", str(t.span), str(t.least_span),
             "yes" if t.interior else "no",
             fixed(t.max_spread, 3, INF_TEXT), f"**{t.verdict}**" if t.held else t.verdict] for t in tr.itertuples()]


def grid_rows(cur: pd.DataFrame, o: str, p: str) -> tuple[list[str], list[list[str]]]:
    """One panel's lr x width table: mean [min, max] over seeds."""
    c = cur[(cur["optimizer"] == o) & (cur["parametrization"] == p)]
    widths = sorted(c["width"].unique())
    rows = []
    for lr, g in c.groupby("lr", sort=True):
        cells = []
        for w in widths:
            x = g[g["width"] == w]
            mean = x["mean"].iloc[0] if len(x) else math.nan
            cells.append("—" if x.empty else fixed(mean, 3, INF_TEXT) if not math.isfinite(mean) else
                         f"{fixed(mean, 3)} [{fixed(x['lo'].iloc[0], 3)}, {fixed(x['hi'].iloc[0], 3)}]")
        rows.append([lr_text(lr), *cells])
    return ["lr", *[f"width {w}" for w in widths]], rows


def timing_lines(study: Study) -> list[str]:
    """Wall time of the study and the per-run overhead, from the runs' own MLflow timestamps and elapsed_sec."""
    r = study.runs.dropna(subset=["start", "end"])
    if r.empty:
        return []
    span = (r["end"].max() - r["start"].min()) / 1000
    inside = (r["end"] - r["start"]).sum() / 1000
    train = r["elapsed"].fillna(0).sum()
    n = len(r)
    return [f"{n} runs from the first run's start to the last run's end: {span / 60:.1f} min wall "
            f"({span:.0f} s). Training steps (MLflow `elapsed_sec`, validation excluded): {train:.0f} s; "
            f"per run overhead (model build, final validation, sample, artifacts, MLflow logging: run duration "
            f"minus training) {(inside - train) / n:.2f} s; between runs (Hydra job set-up, process start-ups "
            f"between sweeps) {(span - inside) / n:.2f} s per run."]


def _design_lines(study: Study, cur: pd.DataFrame) -> list[str]:
    pts = study.points
    commits = sorted(set(pts["commit"]))
    dirty = sorted(set(pts["dirty"]))
    lines = [f"Runs: **{len(pts)}** counted ({int(pts['diverged'].sum())} diverged), {len(study.left_out)} left "
             f"out (listed at the end), from MLflow experiment `{study.experiment}`.",
             f"Code: git commit{'s' * (len(commits) != 1)} " + ", ".join(f"`{c}`" for c in commits)
             + f" (working tree dirty: {', '.join(dirty)}).",
             f"Widths (n_embd): {', '.join(str(w) for w in sorted(pts['width'].unique()))}; seeds: "
             f"{', '.join(str(s) for s in sorted(pts['seed'].unique()))}."]
    for o in _order(cur["optimizer"], OPTIMIZERS):
        grid = sorted(cur.loc[cur["optimizer"] == o, "lr"].unique())
        ratios = sorted({round(b / a, 3) for a, b in zip(grid, grid[1:])})
        lines.append(f"lr grid for {LABELS.get(o, o)}: " + ", ".join(lr_text(x) for x in grid)
                     + f" (log2 {math.log2(grid[0]):.0f} to {math.log2(grid[-1]):.0f}; step ratio "
                     + ", ".join(f"{r:g}" for r in ratios) + ").")
    lines.append("Shared settings (MLflow params): " + ", ".join(f"`{k}={v}`" for k, v in study.design.items())
                 + ".")
    return lines


def base_check(study: Study) -> list[str]:
    """At mup's base width mup is sp: the largest loss difference between the two there (a check of the runs)."""
    base = study.design.get("model.mup.base_width", "")
    if not base.isdigit():
        return []
    pts = study.points[(study.points["width"] == int(base)) & ~study.points["diverged"]]
    pair = pts.pivot_table(index=["optimizer", "lr", "seed"], columns="parametrization", values="loss")
    if not {"sp", "mup"} <= set(pair.columns) or pair.dropna().empty:
        return []
    d = (pair["mup"] - pair["sp"]).abs().dropna()
    return [f"Check: at width {base}, μP's base width (where μP is SP), μP and SP runs of the same optimizer, lr "
            f"and seed differ by at most {d.max():.2e} in final val loss ({UNIT}; {len(d)} pairs)."]


def load_lr_transfer(ctx: Context) -> None:
    """The study's points, left-out runs and design (`ctx.extra`, a Study)."""
    ctx.extra = load_study(ctx.options.tracking_uri or None, ctx.options.query or EXPERIMENT)


def analysed(ctx: Context) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(curves, optima, transfer) of the study, computed once per report (`ctx.once(analysed)`)."""
    cur = curves(ctx.extra.points)
    opt = optima(cur)
    return cur, opt, transfer(opt)


@section("lr.setting")
def setting_section(ctx: Context) -> list:
    study, script = ctx.extra, ctx.options.script or SCRIPT
    options = [("tracking_uri", display_uri(study.uri)), ("out", str(ctx.out))] \
        + ([("script", script)] if script != SCRIPT else [])
    command = " ".join(["python -m analysis.report lr-transfer", shlex.quote(study.experiment),
                        *(f"{key}={shlex.quote(value)}" for key, value in options)])
    optimizers = " and ".join(LABELS.get(o, o) for o in _order(ctx.extra.points["optimizer"], OPTIMIZERS))
    return [("h1", f"Learning-rate transfer across width: SP and μP, {optimizers}"),
            ("p", f"Generated by `{command}` from the MLflow store (committed compactly as `mlflow.db.gz` beside "
                  f"this file; `{script} --report` regenerates this page byte for byte). Do not edit "
                  "by hand."),
            ("h2", "Setting"), ("ul", _design_lines(ctx.extra, ctx.once(analysed)[0]))]


@section("lr.result")
def result_section(ctx: Context) -> list:
    cur, opt, tr = ctx.once(analysed)
    ctx.files.append(save_figure(figure(cur, opt), ctx.out / FIGURE))  # the page's one figure, always SVG
    return [("h2", "Result"), ("ul", [t.statement for t in tr.itertuples()] + base_check(ctx.extra)),
            ("img", "final val loss against lr per width", FIGURE),
            ("p", f"Transfer criterion (fixed before the runs): **held** when at every width the best lr (lowest "
                  f"mean over seeds) is interior to the grid and the best lrs of all widths span at most {MAX_SHIFT} "
                  f"grid step; **failed** when even the least span the data allow (an optimum at the grid's edge "
                  f"may lie beyond it) exceeds {MAX_SHIFT} step; otherwise **not established**. Shift: the best "
                  "lr's grid position at the widest minus at the narrowest width (+ = the wide model wants a larger "
                  "lr). The seed range at the optimum (max - min over seeds) is the noise a shift competes with: "
                  "where the gap to the next-best lr is below it, the optimum's position is uncertain by a step."),
            ("table", ["optimizer", "parametrization", "widths", "shift (steps)", "span (steps)", "least span",
                       "all interior", f"max seed range at optimum ({UNIT})", "transfer"], transfer_rows(tr)),
            ("h3", "Best lr per width"),
            ("table", ["optimizer", "param.", "width", "best lr", "log2 lr", "grid step", "interior",
                       f"mean loss ({UNIT})", "seed range", "seeds", "gap to next-best lr"], optima_rows(opt, tr))]


@section("lr.grid")
def grid_section(ctx: Context) -> list:
    b: list = [("h2", "Final val loss at every grid point"), ("p", f"Mean [min, max] over seeds, {UNIT}.")]
    cur, _, tr = ctx.once(analysed)
    for t in tr.itertuples():
        b.append(("h3", f"{LABELS.get(t.optimizer, t.optimizer)}, {LABELS.get(t.parametrization, t.parametrization)}"))
        b.append(("table", *grid_rows(cur, t.optimizer, t.parametrization)))
    return b


@section("lr.time")
def time_section(ctx: Context) -> list:
    lo = ctx.extra.left_out
    return [("h2", "Time"), *[("p", line) for line in timing_lines(ctx.extra)], ("h2", "Left out"),
            ("table", ["run", "reason"], [[r.run_id, r.reason] for r in lo.itertuples()]) if len(lo) else
            ("p", "None.")]


LR_TRANSFER = Kind("lr-transfer", load_lr_transfer, lambda ctx: "Learning-rate transfer across width",
                   ("lr.setting", "lr.result", "lr.grid", "lr.time"), files=("index.md", FIGURE), html=False,
                   summary=lambda ctx: [str(p) for p in ctx.files])


def build(out: str | Path, tracking_uri: str | None = None, experiment: str = EXPERIMENT,
          script: str = SCRIPT) -> list[Path]:
    """Write index.md and the figure into `out`; returns the paths written."""
    options = Options(query=experiment, tracking_uri=tracking_uri or "", script=script)
    return build_kind(LR_TRANSFER, Context(out=Path(out), options=options)).files


COMMAND = Command(
    "analysis.lr_transfer", "[key=value ...]",
    "The older command of `python -m analysis.report lr-transfer EXPERIMENT`, which earlier pages name: writes the "
    "lr-transfer report (index.md and its figure) of one MLflow experiment. " + __doc__.split("\n\n")[0],
    options=(Option("tracking_uri", "MLflow tracking URI (default: $MLFLOW_TRACKING_URI)", parse=str),
             Option("experiment", "MLflow experiment", EXPERIMENT, str),
             Option("out", "output folder", "reports/lr-transfer", str),
             Option("script", "the script whose --report regenerates the page", SCRIPT, str)),
    examples=("tracking_uri=sqlite:///study/lr-transfer/mlflow.db out=reports/lr-transfer",))


def main(argv: list[str] | None = None) -> int:
    """`python -m analysis.lr_transfer`: kept so that the command earlier pages name (`--tracking-uri URI --out DIR`)
    still runs; analysis.report's lr-transfer kind is the same build."""
    try:
        o, _ = COMMAND.parse_or_help(list(sys.argv[1:] if argv is None else argv))
        for p in build(o["out"], o["tracking_uri"], o["experiment"], o["script"]):
            print(p)
    except (CommandLineError, AnalysisError) as e:
        return COMMAND.fail(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
