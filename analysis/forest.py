"""The forest plot that opens every verdict report: one line per comparison (an arm against the baseline at a size).

Each line draws the comparison's Δ val bpb (arm mean − baseline mean) with its 95% Welch interval, every seed of the
arm as a dot (that seed's value minus the baseline's mean at the size), the preset equivalence margin as a band
around 0, and, when the report knows one (the known-results report), the direction the paper found: ◁ the paper's
arm had the lower loss, ▷ the higher, ◇ no difference. `forest_frame` makes the numbers, `forest_figure` draws
exactly those, and `forest.csv` holds them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.verdict import BETTER, VERDICT_METRIC, WORSE

FIGURE = "forest"
BY_SIZE_FIGURE = "forest_by_size"
CSV = "forest.csv"
COLUMNS = ["label", "size", "arm", "delta", "ci_low", "ci_high", "margin", "verdict", "expected", "seed_deltas"]
COLORS = {BETTER: "#1a9850", WORSE: "#d73027", "equivalent": "#4575b4", "inconclusive": "0.45"}
MARKERS = {BETTER: "<", WORSE: ">", "equivalent": "D"}  # the paper's direction, at the edge of the panel


def forest_frame(table: pd.DataFrame, seeds: pd.DataFrame, expected: dict | None = None) -> pd.DataFrame:
    """One row per non-baseline row of a verdict table (protocol.verdicts), in its order: the numbers the forest
    plot draws. `seeds`: the seeds-stage runs (verdict.size, verdict.arm, seed, final_val_bpb); `expected`: arm ->
    the paper's direction (better / worse / equivalent)."""
    expected = expected or {}
    rows = []
    for _, r in table[table["verdict"] != "baseline"].iterrows():
        at = seeds[seeds["verdict.size"] == r["size"]]
        base = at.loc[at["verdict.arm"] == table.loc[(table["size"] == r["size"]) & (table["verdict"] == "baseline"),
                                                      "arm"].iloc[0], VERDICT_METRIC].astype(float).mean()
        arm = at[at["verdict.arm"] == r["arm"]].sort_values("seed")
        dots = arm[VERDICT_METRIC].astype(float) - base
        rows.append({"label": f"{r['arm']} at {r['size']}", "size": r["size"], "arm": r["arm"],
                     "delta": r["delta"], "ci_low": r["ci_low"], "ci_high": r["ci_high"], "margin": r["margin"],
                     "verdict": r["verdict"], "expected": expected.get(r["arm"], ""),
                     "seed_deltas": ";".join(f"{v:.6g}" for v in dots)})
    return pd.DataFrame(rows, columns=COLUMNS)


def _dots(cell) -> np.ndarray:
    return np.array([float(v) for v in str(cell).split(";") if v not in ("", "nan")])


def _kind(verdict: str) -> str:
    return "equivalent" if str(verdict).startswith("equivalent") else str(verdict)


def _limits(frame: pd.DataFrame) -> tuple[float, float]:
    """(m, lim): the widest margin of the rows (NaN without one) and the half-width of the x axis that shows every
    number drawn."""
    margins = frame["margin"].astype(float)
    m = float(margins[np.isfinite(margins)].max()) if np.isfinite(margins).any() else np.nan
    spread = [abs(v) for r in frame.itertuples() for v in (r.delta, r.ci_low, r.ci_high, *_dots(r.seed_deltas), m)
              if np.isfinite(v)]
    return m, 1.2 * max(spread) if spread else 1.0


def _panel(ax, frame: pd.DataFrame, m: float, lim: float) -> list:
    """Draw the rows of `frame` on `ax` (the first at the top); returns the margin band's artist (none without m)."""
    y = np.arange(len(frame))[::-1].astype(float)
    band = [ax.axvspan(-m, m, color="0.88", zorder=0, label=f"equivalence margin ±{m:.3g}")] if np.isfinite(m) else []
    ax.axvline(0, color="0.3", linewidth=0.8, zorder=1)
    for yi, r in zip(y, frame.itertuples()):
        color = COLORS.get(_kind(r.verdict), "0.45")
        if np.isfinite(r.ci_low):
            ax.hlines(yi, r.ci_low, r.ci_high, color=color, linewidth=2.2, zorder=2)
        ax.plot([r.delta], [yi], "o", color=color, markersize=7, zorder=3)
        dots = _dots(r.seed_deltas)
        ax.plot(dots, np.full(len(dots), yi - 0.22), ".", color=color, alpha=0.7, markersize=6, zorder=3)
        if r.expected in MARKERS:
            ax.plot([0.94 * lim], [yi], MARKERS[r.expected], markersize=9, markerfacecolor="none",
                    markeredgecolor="black", zorder=3)
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-0.8, len(frame) - 0.4)
    ax.set_yticks(y, [f"{r.label}: {r.verdict}" for r in frame.itertuples()])
    ax.grid(True, axis="x", alpha=0.3)
    return band


def _legend(fig: Figure, ax, frame: pd.DataFrame, band: list) -> None:
    handles = [ax.plot([], [], "o-", color="0.3", label="Δ and its 95% Welch CI")[0],
               ax.plot([], [], ".", color="0.3", label="each seed − the baseline's mean")[0]]
    if frame["expected"].isin(list(MARKERS)).any():
        handles.append(ax.plot([], [], "<", markerfacecolor="none", markeredgecolor="black",
                               label="the paper: ◁ lower loss, ▷ higher, ◇ no difference")[0])
    fig.legend(handles=band + handles, fontsize="small", loc="outside lower center", ncols=2)


XLABEL = "Δ val bpb, arm − baseline (< 0: the arm is better)"


def forest_figure(frame: pd.DataFrame) -> Figure:
    """The forest plot of `forest_frame`'s rows, the first at the top."""
    fig = Figure(figsize=(8.5, 1.6 + 0.55 * len(frame)), dpi=110, layout="constrained")
    ax = fig.subplots()
    m, lim = _limits(frame)
    band = _panel(ax, frame, m, lim)
    ax.set_xlabel(XLABEL)
    _legend(fig, ax, frame, band)
    fig.suptitle("Every comparison at a glance: val bpb, arm − baseline (colour: the verdict)", fontsize="medium")
    return fig


def forest_by_size(frame: pd.DataFrame) -> Figure:
    """The forest plot with one panel per size (in the rows' order), one x axis for all: how each comparison moves
    from size to size."""
    sizes = list(dict.fromkeys(frame["size"]))
    rows = [int((frame["size"] == s).sum()) for s in sizes]
    fig = Figure(figsize=(8.5, 1.6 + 0.55 * len(frame) + 0.45 * len(sizes)), dpi=110, layout="constrained")
    axes = fig.subplots(len(sizes), 1, sharex=True, squeeze=False, height_ratios=[n + 0.6 for n in rows])[:, 0]
    m, lim = _limits(frame)
    for ax, size in zip(axes, sizes):
        band = _panel(ax, frame[frame["size"] == size], m, lim)
        ax.set_title(f"size {size}", fontsize="small", loc="left")
    axes[-1].set_xlabel(XLABEL)
    _legend(fig, axes[-1], frame, band)
    fig.suptitle("Every comparison, size by size: val bpb, arm − baseline (colour: the verdict)", fontsize="medium")
    return fig


def forest_blocks(ctx, table: pd.DataFrame, draw=forest_figure, name: str = FIGURE) -> list:
    """The forest plot of a verdict table's comparisons drawn by `draw` into figure `name` (nothing when there are
    none), and forest.csv; the direction a paper found marked for the kinds that check findings (`Kind.expected`)."""
    expected = dict(ctx.kind.expected)
    frame = forest_frame(table, ctx.extra.seeds, expected)
    if frame.empty:
        return []
    ctx.write_csv(CSV, frame)
    path = ctx.figure(draw(frame), name)
    margin = ("fixed before the runs" if ctx.margin.preset else "none" if not np.isfinite(ctx.margin.value)
              else "given at report time")
    return [("img", "forest plot: every comparison's Δ val bpb with its 95% Welch CI, its seeds and the margin", path),
            ("p", "**At a glance**: one line per comparison (an arm against the baseline at a size); the dot and bar "
                  "are Δ val bpb (arm − baseline) and its 95% Welch confidence interval, the small dots each seed of "
                  f"the arm minus the baseline's mean, the grey band the equivalence margin ±m ({margin}); colour: "
                  "the verdict (green better, red worse, blue equivalent, grey inconclusive)"
                  + ("; ◁ ▷ ◇: the direction the paper found" if expected else "")
                  + ". Numbers: `forest.csv` and the verdict table below.")]
