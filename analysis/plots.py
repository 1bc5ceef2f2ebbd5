"""Figures: loss curves (mean over seeds with a ±1 std band) and quality against cost with the Pareto frontier.

Figures are `matplotlib.figure.Figure` objects built without pyplot (no global state); `save_figure` writes them
byte-for-byte reproducibly (no dates or software versions in the metadata, fixed SVG ids).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.stats import pareto_front
from analysis.store import curves

LINESTYLES = ("-", "--", ":", "-.")
X_LABELS = {
    "step": "training step",
    "tokens_seen": "training tokens seen",
    "elapsed_sec": "wall-clock training time (s)",
}
Y_LABELS = {
    "train/loss": "train loss (nats/token)",
    "val/loss": "val loss (nats/token)",
    "val/bpb": "val bits per byte",
}
COST_LABELS = {
    "kv_cache_bytes_per_token": "KV cache per token (bytes)",
    "final_tokens_per_sec": "training throughput (tokens/s per run, not paired)",
    "decode_tokens_per_sec": "decode throughput (tokens/s, batch 1, KV cache)",
}
QUALITY = "final_val_bpb"
QUALITY_LABEL = "final val bits per byte (lower is better)"


def variant_styles(variants) -> dict[str, dict]:
    """One colour (and line style past 10 variants) per variant, in the given order; reuse it for every figure."""
    cmap = matplotlib.colormaps["tab10"]
    styles = {}
    for i, v in enumerate(variants):
        styles[v] = {"color": matplotlib.colors.to_hex(cmap(i % 10)), "linestyle": LINESTYLES[(i // 10) % 4]}
    return styles


def _wrap(text: str, width: int = 40) -> str:
    import textwrap

    return textwrap.fill(text, width, break_long_words=True, break_on_hyphens=False)


def _legend_label(variant: str, n: int) -> str:
    return _wrap(f"{variant} (n={n})")


def aggregate_runs(per_run) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and std (ddof=1; 0 with one run) over runs of curves, each given as (steps, x, y) arrays.

    Runs logged at the same steps (seeds of one config) are averaged step by step: mean x, mean y, std y.
    Otherwise each run is linearly interpolated onto the union of x values within the range every run covers.
    """
    per_run = [tuple(np.asarray(a, float) for a in r) for r in per_run if len(r[0])]
    if not per_run:
        return np.array([]), np.array([]), np.array([])
    first = per_run[0][0]
    if all(len(s) == len(first) and np.array_equal(s, first) for s, _, _ in per_run):
        grid = np.vstack([x for _, x, _ in per_run]).mean(axis=0)
        ys = np.vstack([y for _, _, y in per_run])
    else:
        lo = max(x.min() for _, x, _ in per_run)
        hi = min(x.max() for _, x, _ in per_run)
        grid = np.unique(np.concatenate([x for _, x, _ in per_run]))
        grid = grid[(grid >= lo) & (grid <= hi)]
        ys = np.vstack([np.interp(grid, x, y) for _, x, y in per_run])
    mean = ys.mean(axis=0)
    std = ys.std(axis=0, ddof=1) if len(ys) > 1 else np.zeros_like(mean)
    return grid, mean, std


def loss_curves_figure(hist: pd.DataFrame, included: pd.DataFrame, styles: dict, x: str = "step",
                       title: str | None = None, labels: dict | None = None) -> Figure:
    """Train and val loss against `x` (step, tokens_seen or elapsed_sec); per variant the mean over seeds as a line
    and ±1 std over seeds as a band."""
    fig = Figure(figsize=(11, 4.2), dpi=110, layout="constrained")
    axes = fig.subplots(1, 2)
    variant_of = dict(zip(included["run_id"], included["variant"]))
    for ax, key in zip(axes, ("train/loss", "val/loss")):
        c = curves(hist[hist["run_id"].isin(variant_of)], key, x)
        for v, style in styles.items():
            ids = sorted(r for r, vv in variant_of.items() if vv == v)
            per_run = []
            for r in ids:
                part = c[c["run_id"] == r].sort_values("step")
                if len(part):
                    per_run.append((part["step"].to_numpy(), part[x].to_numpy(), part[key].to_numpy()))
            grid, mean, std = aggregate_runs(per_run)
            if not len(grid):
                continue
            ax.plot(grid, mean, label=_legend_label((labels or {}).get(v, v), len(per_run)),
                    marker="o" if len(grid) < 8 else None, markersize=3, **style)
            if len(per_run) > 1:
                ax.fill_between(grid, mean - std, mean + std, color=style["color"], alpha=0.2, linewidth=0)
        ax.set_xlabel(X_LABELS.get(x, x))
        ax.set_ylabel(Y_LABELS.get(key, key))
        ax.grid(True, alpha=0.3)
        if not ax.has_data():
            ax.text(0.5, 0.5, f"no {key} history", transform=ax.transAxes, ha="center", va="center")
    handles, names = axes[0].get_legend_handles_labels()
    if not handles:
        handles, names = axes[1].get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="outside lower center", fontsize="small", title="variant (seeds)",
                   ncols=min(len(handles), 3))
    fig.suptitle(title or f"Loss against {X_LABELS.get(x, x)}: mean over seeds, band = ±1 std")
    return fig


def _use_log(values) -> bool:
    v = np.asarray(values, float)
    v = v[np.isfinite(v) & (v > 0)]
    return len(v) >= 2 and v.max() / v.min() >= 10.0


def quality_figure(included: pd.DataFrame, table: pd.DataFrame, styles: dict, x_metric: str,
                   maximize_x: bool = False, title: str | None = None, labels: dict | None = None) -> Figure:
    """Final val bpb against a cost/speed metric: seeds as faint dots, variant means with ±1 std error bars (from
    `table`, the output of `stats.variant_table`), the Pareto frontier of the variant means (lower bpb and lower/higher
    x) as a dashed step line with ringed points. Log x when the values span an order of magnitude or more."""
    fig = Figure(figsize=(8.5, 5.0), dpi=110, layout="constrained")
    ax = fig.subplots()
    pts = []
    for v, style in styles.items():
        runs = included[included["variant"] == v]
        xs, ys = runs[x_metric].to_numpy(float), runs[QUALITY].to_numpy(float)
        ok = np.isfinite(xs) & np.isfinite(ys)
        if not ok.any():
            continue
        ax.scatter(xs[ok], ys[ok], color=style["color"], alpha=0.35, s=18, linewidths=0)
        row = table[table["variant"] == v] if len(table) else table
        if len(row):  # the variant's means and stds exactly as in the table (and its Pareto flags)
            row = row.iloc[0]
            mx, my = float(row[f"{x_metric}_mean"]), float(row[f"{QUALITY}_mean"])
            sx, sy = (float(np.nan_to_num(row[f"{m}_std"])) for m in (x_metric, QUALITY))
        else:
            mx, my = float(np.mean(xs[ok])), float(np.mean(ys[ok]))
            sx = float(np.std(xs[ok], ddof=1)) if ok.sum() > 1 else 0.0
            sy = float(np.std(ys[ok], ddof=1)) if ok.sum() > 1 else 0.0
        ax.errorbar([mx], [my], xerr=[sx], yerr=[sy], fmt="o", color=style["color"], markersize=7, capsize=3,
                    label=_legend_label((labels or {}).get(v, v), int(ok.sum())))
        if len(styles) > 1:  # with one variant the legend says it all
            ax.annotate(_wrap((labels or {}).get(v, v), 30), (mx, my), textcoords="offset points", xytext=(6, 5),
                        fontsize="x-small", color=style["color"])
        pts.append((v, mx, my))
    if pts:
        px = np.array([p[1] for p in pts])
        py = np.array([p[2] for p in pts])
        front = pareto_front(px, py, maximize_x=maximize_x)
        order = np.argsort(px[front] * (-1 if maximize_x else 1), kind="stable")
        fx, fy = px[front][order], py[front][order]
        ax.step(fx, fy, where="post", color="0.3", linestyle="--", linewidth=1, label="Pareto frontier", zorder=1)
        ax.scatter(fx, fy, s=160, facecolors="none", edgecolors="0.2", linewidths=1.2, zorder=3)
        if _use_log(px):
            ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, f"no runs with {x_metric}", transform=ax.transAxes, ha="center", va="center")
    ax.set_xlabel(COST_LABELS.get(x_metric, x_metric))
    ax.set_ylabel(QUALITY_LABEL)
    ax.grid(True, alpha=0.3, which="both")
    if pts:
        ax.legend(fontsize="small", title="variant (seeds)", loc="best")
    better = "higher" if maximize_x else "lower"
    fig.suptitle(title or f"Quality against {COST_LABELS.get(x_metric, x_metric)}\n"
                          f"(ringed: Pareto frontier of variant means; better = lower bpb, {better} x)",
                 fontsize="medium")
    return fig


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write `fig` (format from the suffix) reproducibly: same figure, same bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = path.suffix.lstrip(".").lower()
    metadata = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None},
                "pdf": {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}}.get(fmt)
    with matplotlib.rc_context({"svg.hashsalt": "analysis", "svg.fonttype": "path"}):
        fig.savefig(path, format=fmt, metadata=metadata)
    return path


def fit_label(fit) -> str:
    """E and alpha of a fit as a figure or table prints them; a parameter at its bound is named, not numbered."""
    if fit.at_bound:
        return "not identifiable (" + "; ".join(fit.at_bound) + f"), alpha={fit.alpha:.3g}"
    return f"E={fit.E:.3g}, alpha={fit.alpha:.3g}"


def scaling_figure(points: pd.DataFrame, fits: dict, styles: dict, metric: str = "final_val_loss",
                   labels: dict | None = None) -> Figure:
    """Final loss against training compute on log-log axes: one dot per run, the fitted L(C) = E + A C^-alpha of
    each arm that has one (`fits`: arm -> analysis.scaling.ScalingFit) as a line over the compute it covers."""
    fig = Figure(figsize=(8.5, 5.0), dpi=110, layout="constrained")
    ax = fig.subplots()
    for arm, style in styles.items():
        part = points[points["arm"] == arm]
        if not len(part):
            continue
        name = (labels or {}).get(arm, arm)
        fit = fits.get(arm)
        fit = fit.rounded() if fit is not None else None  # draw what the report prints: the same on any CPU
        label = _wrap(f"{name}: {fit_label(fit)}" if fit else f"{name} (no fit: < 3 sizes)")
        ax.scatter(part["compute"], part[metric], color=style["color"], s=18, alpha=0.7, linewidths=0, label=label)
        if fit is not None:
            grid = np.geomspace(part["compute"].min(), part["compute"].max(), 100)
            ax.plot(grid, fit.predict(grid), color=style["color"], linestyle=style["linestyle"], linewidth=1.3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training compute (FLOPs = flops_per_token x tokens seen)")
    ax.set_ylabel(Y_LABELS.get("val/loss", metric).replace("val loss", "final val loss"))
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize="small", title="arm (fit)", loc="best")
    fig.suptitle("Final loss against training compute; lines: L(C) = E + A C^-alpha fitted per arm",
                 fontsize="medium")
    return fig
