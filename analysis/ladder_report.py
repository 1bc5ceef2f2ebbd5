"""The ladder report: does each verdict hold at the next size? A report kind (analysis/engine.py) over a verdict
protocol's runs at >= 4 sizes, read from MLflow only:

    python -m analysis.report ladder known-results-ladder tracking_uri=sqlite:///study/ladder/mlflow.db \
        [held_out=known-results=reports/known-results/mlflow.db.gz]

It loads the protocol's runs like the protocol kind (analysis/protocol.py: the verdict at each size, Holm within the
declared family, the margin fixed before the runs) and the paper's direction of each arm (analysis/literature.py),
then adds, from the statistics of analysis/ladder.py:

- **Δ against size**: one panel per arm, Δ with its 95% Welch CI at every size, the weighted trend over every size
  with its band (dashed past the largest size: unmeasured), the margin band and the paper's direction; the slope per
  doubling of N with its interval, and the size at which the line reaches the paper's direction;
- **the held-out size** (the protocol's largest, or another store's with held_out=EXPERIMENT=STORE, read through
  the protocol code with that protocol's own Holm family and margin): its Δ predicted from the smaller sizes alone,
  its prediction interval and whether the measurement falls inside; 2x and 4x the largest predicted and labelled
  unmeasured;
- **decision accuracy**: how often a smaller size's verdict (and the sign of its Δ) is the largest size's;
- **trained models per size**: each size's baseline against the n-gram floors and the epochs its runs saw (the
  known-results study's bar, analysis/known_results.py);
- the forest plot with one panel per size, then the protocol's sections (verdicts per size, floor, lr search),
  the ladder's **compute** per size and stage beside the held-out study's (analysis/compute.py), provenance.
"""
from __future__ import annotations

import gzip
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis import forest, ladder, protocol
from analysis.compute import Cost, cost_of
from analysis.document import ci_text, fixed, p_text, signed
from analysis.engine import Context, Kind, section
from analysis.known_results import BASELINE_BEATS_ORDER, BELOW_TRIGRAM, MAX_EPOCHS
from analysis.literature import EXPECTED
from analysis.protocol_runs import STAGE_LR, STAGE_SEEDS, is_protocol
from analysis.sequential_verdicts import recorded_design
from analysis.store import AnalysisError, load_runs
from analysis.verdict import VERDICT_METRIC, resolve_margin

FIGURE = "delta_vs_size"
POINTS_CSV, TRENDS_CSV, PREDICTIONS_CSV, DECISIONS_CSV, COMPUTE_CSV = (
    "ladder_points.csv", "ladder_trends.csv", "ladder_predictions.csv", "decision_accuracy.csv", "ladder_compute.csv")
MIN_SIZES = ladder.MIN_FIT + 1  # a trend over the smaller sizes and the largest held out
SIDE = {"better": "Δ < −m", "worse": "Δ > +m", "equivalent": "|Δ| < m"}


@dataclass(frozen=True)
class HeldOut:
    """The largest rung read from another store (held_out=EXPERIMENT=STORE): its protocol and size, and the rows of
    that protocol's own verdict table there (its Holm family, its margin)."""

    source: str
    protocol: str
    size: str
    table: pd.DataFrame
    cost: Cost  # every result of that protocol (analysis/compute.py)
    tokens_matched: tuple  # its arms that trained the baseline's tokens (match: tokens), not the size's FLOPs


def held_out_of(ctx: Context) -> HeldOut | None:
    """The rung given with held_out=EXPERIMENT=STORE (STORE: a tracking URI, or an SQLite file, .db or .db.gz,
    read from a temporary copy), through the protocol code on that store's runs; None without one."""
    source = ctx.options.held_out
    if not source:
        return None
    experiment, sep, store = source.partition("=")
    if not sep or not experiment or not store:
        raise AnalysisError(f"held_out={source}: expected EXPERIMENT=STORE, e.g. "
                            "known-results=reports/known-results/mlflow.db.gz")
    if "://" in store:
        runset = load_runs(experiment, store)
    elif not Path(store).is_file():
        raise AnalysisError(f"held_out={source}: no file {store}; give an SQLite store (.db or .db.gz) or a "
                            "tracking URI")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(store)
            if db.suffix == ".gz":
                db = Path(tmp) / "mlflow.db"
                with gzip.open(store) as src, open(db, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            runset = load_runs(experiment, f"sqlite:///{db.resolve()}")
    if not is_protocol(runset):
        raise AnalysisError(f"held_out={source}: its runs carry no verdict.protocol tag")
    p = protocol.select(runset)
    try:
        margin = resolve_margin(None, p.seeds["verdict.margin"], p.seeds["verdict.margin_reason"])
    except ValueError as exc:
        raise AnalysisError(f"held_out={source}: {exc}") from None
    table = protocol.verdicts(p, margin)
    size = p.sizes[-1]
    if size in ctx.extra.sizes:
        raise AnalysisError(f"held_out={source}: its largest size `{size}` is also a size of `{ctx.extra.name}`; "
                            "a held-out rung must be another size")
    return HeldOut(source, p.name, size, table[table["size"] == size].reset_index(drop=True), cost_of(p.results()),
                   tuple(protocol.tokens_matched(p)))


def load_ladder(ctx: Context) -> None:
    protocol.load_protocol(ctx)
    p, held = ctx.extra, ctx.once(held_out_of)
    if len(p.sizes) + (held is not None) < MIN_SIZES:
        raise AnalysisError(f"kind ladder: protocol `{p.name}` ran {len(p.sizes)} size(s) "
                            f"({', '.join(p.sizes)}){' and held_out= one' if held else ''}; a ladder needs "
                            f">= {MIN_SIZES}: {ladder.MIN_FIT} to fit the trend and the largest held out. Report it "
                            "with kind auto")
    ctx.once(ladder_of)  # a held-out rung that is not the largest fails here, before anything is written


def regenerate_args(ctx: Context) -> list[str]:
    held = ctx.once(held_out_of)
    return [*([("held_out", held.source)] if held else []), *protocol.regenerate_args(ctx)]


def ladder_of(ctx: Context) -> dict:
    """The ladder's numbers, computed once: points, trends, predictions, fits, decision accuracy; the held-out rung
    is the protocol's largest size, or the one given with held_out=."""
    held, table, sizes = ctx.once(held_out_of), ctx.once(protocol.verdict_table), list(ctx.extra.sizes)
    if held is not None:
        table, sizes = pd.concat([table, held.table], ignore_index=True), sizes + [held.size]
    points = ladder.ladder_points(table, sizes)
    top, rest = points.loc[points["held_out"], "n_params"], points.loc[~points["held_out"], "n_params"]
    if held is not None and len(top) and len(rest) and top.min() <= rest.max():
        raise AnalysisError(f"held_out={held.source}: its size `{held.size}` ({top.min():,.0f} parameters) is not "
                            f"larger than the ladder's largest ({rest.max():,.0f})")
    trends, predictions, fits = ladder.trends(points, dict(EXPECTED), ctx.margin.value)
    return {"points": points, "trends": trends, "predictions": predictions, "fits": fits,
            "decisions": ladder.decision_accuracy(points)}


def n_text(n: float) -> str:
    """A parameter count: 804,096; 1.61M past ten million (the 2x and 4x rungs, the crossing sizes)."""
    if not np.isfinite(n):
        return "n/a"
    return f"{n:,.0f}" if n < 1e7 else f"{n / 1e6:.3g}M"


def reach_text(r) -> str:
    if not np.isfinite(r.reach_n):
        return r.reach_status or "n/a"
    return (f"N ≈ {n_text(r.reach_n)} [{n_text(r.reach_low)}, {n_text(r.reach_high)}] ({r.reach_status}; "
            f"where the line crosses {signed(r.target)})")


# ---------------------------------------------------------------------------------------------------- the figure
def ladder_figure(points: pd.DataFrame, fits: dict, predictions: pd.DataFrame, expected: dict,
                  margin: float) -> Figure:
    """One panel per arm: Δ against N (log2 axis) with 95% Welch CIs, the held-out size's measurement and its
    prediction from the smaller sizes, the trend over every size with its 95% band (dashed where unmeasured), the
    margin band and the paper's direction."""
    arms = list(dict.fromkeys(points["arm"]))
    cols = 2 if len(arms) > 1 else 1
    rows = math.ceil(len(arms) / cols)
    fig = Figure(figsize=(5.2 * cols, 3.0 * rows + 0.8), dpi=110, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True).ravel()
    for ax in axes[len(arms):]:
        ax.set_visible(False)
    for ax, arm in zip(axes, arms):
        pts = points[points["arm"] == arm]
        if np.isfinite(margin):
            ax.axhspan(-margin, margin, color="0.9", zorder=0)
        ax.axhline(0, color="0.3", linewidth=0.8, zorder=1)
        full = fits[arm][0]
        if full is not None:
            top = float(pts["x"].max())
            for lo, hi, style in ((float(pts["x"].min()), top, "-"), (top, top + math.log2(max(ladder.NEXT)), "--")):
                x = np.linspace(lo, hi, 50)
                band = full.band(x)
                ax.fill_between(2.0**x, band[0], band[1], color="C0", alpha=0.15, linewidth=0, zorder=1)
                ax.plot(2.0**x, full.at(x), style, color="C0", linewidth=1.3, zorder=2)
        for held, marker, color in ((False, "o", "black"), (True, "s", "C3")):
            p = pts[pts["held_out"] == held]
            ax.errorbar(p["n_params"], p["delta"], yerr=[p["delta"] - p["ci_low"], p["ci_high"] - p["delta"]],
                        fmt=marker, color=color, markerfacecolor="white" if held else color, capsize=3, zorder=3)
        pred = predictions[(predictions["arm"] == arm) & (predictions["interval"] == "prediction interval")]
        for r in pred.itertuples():
            if np.isfinite(r.predicted):
                ax.errorbar([r.n_params / 1.12], [r.predicted], yerr=[[r.predicted - r.low], [r.high - r.predicted]],
                            fmt="x", color="C1", capsize=3, zorder=3)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        exp = expected.get(arm, "")
        ax.set_title(f"{arm}: the paper found {exp} ({SIDE[exp]})" if exp in SIDE else arm, fontsize="small")
    for ax in axes[:len(arms)]:
        ax.set_ylabel("Δ val bpb (arm − baseline)", fontsize="small")
    for ax in axes[max(0, len(arms) - cols):len(arms)]:  # the lowest panel of each column, above an empty slot too
        ax.set_xlabel("N, the baseline's parameters (log2)")
        ax.xaxis.set_tick_params(labelbottom=True)
    handles = [axes[0].plot([], [], "o", color="black", label="Δ and its 95% Welch CI")[0],
               axes[0].plot([], [], "s", color="C3", markerfacecolor="white", label="the largest size (held out)")[0],
               axes[0].plot([], [], "x", color="C1", label="its prediction from the smaller sizes (95% PI)")[0],
               axes[0].plot([], [], "-", color="C0", label="trend over every size, 95% band (dashed: unmeasured)")[0]]
    if np.isfinite(margin):
        handles.append(axes[0].fill_between([], [], color="0.9", label=f"equivalence margin ±{margin:.3g}"))
    fig.legend(handles=handles, fontsize="small", loc="outside lower center", ncols=2)
    fig.suptitle("Δ against model size per arm, with the weighted trend in log N", fontsize="medium")
    return fig


# ---------------------------------------------------------------------------------------------------- sections
@section("ladder.head")
def head_section(ctx: Context) -> list:
    lad = ctx.once(ladder_of)
    p, pts = ctx.extra, lad["points"]
    n = pts.groupby("size")["n_params"].first()
    held = lad["predictions"][lad["predictions"]["interval"] == "prediction interval"]
    judged = held[held["covered"].isin(["yes", "no"])]
    total = lad["decisions"].iloc[-1]
    held, crossed = ctx.once(held_out_of), ctx.once(matched_differently)
    crossed_text = (f" ({', '.join(f'`{a}`' for a in crossed)} matched differently there: see [the held-out size]"
                    "(#the-held-out-size-predicted-then-measured))" if crossed else "")
    top = (f"`{held.size}` of protocol `{held.protocol}` (`held_out={held.source}`, its own verdicts)" if held
           else f"`{p.sizes[-1]}`")
    return protocol.head_section(ctx, "Ladder", (
        f"**{len(n)} sizes**, N = {n_text(n.min())} to {n_text(n.max())} parameters (the baseline's; "
        f"{n.max() / n.min():.1f}x); the largest, {top}, is held out: its Δ is predicted from the smaller sizes alone. "
        f"**Held out**: the measured Δ lies inside its 95% prediction interval for "
        f"{int((judged['covered'] == 'yes').sum())} of {len(judged)} arms{crossed_text}. **Decision accuracy**: a "
        f"smaller size's verdict is the largest size's in {int(total['same_verdict'])} of {int(total['arms'])} comparisons, the sign "
        f"of its Δ in {int(total['same_sign'])}. See [Trend with size](#trend-with-size).",))


@section("ladder.trend")
def trend_section(ctx: Context) -> list:
    lad = ctx.once(ladder_of)
    pts, tr = lad["points"], lad["trends"]
    ctx.write_csv(POINTS_CSV, pts)
    ctx.write_csv(TRENDS_CSV, tr)
    path = ctx.figure(ladder_figure(pts, lad["fits"], lad["predictions"], dict(EXPECTED), ctx.margin.value), FIGURE)
    rows = [[f"`{r.arm}`", r.expected or "n/a", str(r.sizes),
             "n/a" if not np.isfinite(r.slope) else f"{signed(r.slope)} {ci_text(r.slope_low, r.slope_high)}",
             p_text(r.p_slope_holm), "n/a" if not np.isfinite(r.dispersion) else f"{r.dispersion:.2f}", r.trend,
             reach_text(r)]
            for r in tr.itertuples()]
    return [("h2", "Trend with size"),
            ("p", "Per arm, Δ val bpb (arm − baseline) at every size with its 95% Welch CI (the verdict table's), "
                  "against N, the baseline's parameter count at that size. **Trend**: weighted least squares of Δ on "
                  "log2 N, each size weighted by 1/var(Δ) (var: Welch's standard error squared), so the slope is "
                  "bpb per doubling of N; the sizes' variances are taken as known up to one factor φ, estimated from "
                  "the residuals but never below 1; intervals are Student's t with (sizes − 2) degrees of freedom "
                  "(analysis/ladder.py). The arms' slopes are one family: a trend is shown when the t-test of "
                  "slope = 0, Holm-adjusted across the arms, gives p < 0.05 (the intervals are each arm's own "
                  "95%); otherwise **no trend shown**, which is not evidence of a flat one. **Reaches the paper's "
                  "direction**: the N at which the line crosses the edge of the margin on the paper's side (−m for "
                  "better, +m for worse, the nearer of ±m for equivalent), with Fieller's 95% interval; *not "
                  "determined* when no trend is shown. Any N past "
                  "the largest size is an extrapolation of a line fitted over this ladder, not a measurement."),
            ("img", "Δ against model size per arm with the weighted trend, its band, the margin and the held-out size",
             path),
            ("table", ["arm", "paper", "sizes", "slope per doubling of N [95% CI]", "p (Holm)", "φ", "trend",
                       "reaches the paper's direction"], rows),
            ("p", f"Machine-readable: `{POINTS_CSV}` (every Δ, its variance, N), `{TRENDS_CSV}`.")]


@section("ladder.predictions")
def predictions_section(ctx: Context) -> list:
    pred = ctx.once(ladder_of)["predictions"]
    ctx.write_csv(PREDICTIONS_CSV, pred)
    rows = []
    for r in pred.itertuples():
        measured = r.covered != "unmeasured"
        rows.append([f"`{r.arm}`", f"`{r.size}`" if measured else r.size, n_text(r.n_params), str(r.fit_sizes),
                     f"{signed(r.predicted)} {ci_text(r.low, r.high)} ({r.interval})" if np.isfinite(r.predicted)
                     else f"n/a (a trend needs Δ at {ladder.MIN_FIT} smaller sizes)",
                     f"{signed(r.measured)} {ci_text(r.measured_low, r.measured_high)}" if measured else "unmeasured",
                     f"**{r.covered}**" if r.covered in ("yes", "no") else r.covered])
    crossed, notes = ctx.once(matched_differently), []
    if crossed:
        for row, r in zip(rows, pred.itertuples()):
            if r.arm in crossed and r.covered in ("yes", "no"):
                row[-1] += " (matched differently)"
        held, mine = ctx.once(held_out_of), set(protocol.tokens_matched(ctx.extra))

        def budget(tokens: bool) -> str:
            return "the baseline's tokens" if tokens else "the size's FLOP budget"

        notes = [("p", "**Matched differently at the held-out size**: " + "; ".join(
            f"`{a}` trained {budget(a in mine)} on the ladder and {budget(a in held.tokens_matched)} at "
            f"`{held.size}` (`{held.protocol}`)" for a in crossed) + ": the trend predicts the ladder's matching, "
            "so each is compared with a differently matched measurement, and whether it is covered says less about "
            "the trend.")]
    return [("h2", "The held-out size, predicted then measured"),
            ("p", "For each arm, the largest size's Δ predicted by the trend over the smaller sizes alone (the "
                  "largest size's runs do not enter that fit), with its 95% prediction interval (the line's "
                  "uncertainty and the measurement's own seed variance), against the Δ measured there. *Covered*: "
                  "the measurement lies inside the interval; at 95%, about one arm in twenty misses by chance when "
                  "the line is right. Below each arm, the sizes 2x and 4x the largest, from the trend over every "
                  "size: **predictions, unmeasured**, with the line's 95% band (a measurement there would add its "
                  "own seed noise)."),
            ("table", ["arm", "size", "N", "sizes fitted", "predicted Δ [95%]", "measured Δ [95% Welch CI]",
                       "covered"], rows),
            *notes,
            ("p", f"Machine-readable: `{PREDICTIONS_CSV}`.")]


def matched_differently(ctx: Context) -> list[str]:
    """The arms matched at tokens on the ladder and at FLOPs at the held-out rung of another store, or the other
    way round (a held-out size of the protocol itself shares its matching)."""
    held = ctx.once(held_out_of)
    if held is None:
        return []
    mine, theirs = set(protocol.tokens_matched(ctx.extra)), set(held.tokens_matched)
    return [a for a in ctx.extra.arms if (a in mine) != (a in theirs)]


@section("ladder.decisions")
def decisions_section(ctx: Context) -> list:
    dec = ctx.once(ladder_of)["decisions"]
    ctx.write_csv(DECISIONS_CSV, dec)

    def share(k, n):
        return f"{int(k)} of {int(n)}" + (f" ({k / n:.0%})" if n else "")

    rows = [["all smaller sizes" if r.size == "all" else f"`{r.size}`", n_text(r.n_params), str(int(r.arms)),
             share(r.same_verdict, r.arms), share(r.same_sign, r.arms)] for r in dec.itertuples()]
    return [("h2", "Decision accuracy"),
            ("p", "How often the decision at a smaller size is the decision at the largest (DataDecide's *decision "
                  "accuracy*, Magnusson et al. 2025): per smaller size, the arms whose verdict (better / worse / "
                  "equivalent within ±m / inconclusive) equals their verdict at the largest size, and those whose "
                  "Δ has the same sign there (which of arm and baseline has the lower loss, whatever the test "
                  "says). A count over this ladder's arms, not an estimate with an interval."),
            ("table", ["size", "N", "arms", "same verdict as the largest", "same sign of Δ"], rows),
            ("p", f"Machine-readable: `{DECISIONS_CSV}`.")]


def trained_by_size(ctx: Context) -> pd.DataFrame:
    """Per size (smallest budget first): the baseline's mean val bpb over its seeds, its distance to the trigram and
    the 4-gram floors of the runs' data, and the epochs of the train split the size's runs saw (tokens_seen over the
    floor's train tokens; min and max over every run at the size, both stages)."""
    from analysis.floor import TRIGRAM

    fl, p = ctx.floor, ctx.extra
    n_train = float(fl.n_train) if fl is not None and str(fl.n_train).isdigit() else math.nan
    runs, rows = p.results(), []
    for size in p.sizes:
        v = p.seeds.loc[(p.seeds["verdict.size"] == size) & (p.seeds["verdict.arm"] == p.baseline), VERDICT_METRIC]
        epochs = runs.loc[runs["verdict.size"] == size, "tokens_seen"].astype(float) / n_train
        mean = float(v.astype(float).mean()) if len(v) else math.nan
        rows.append([size, mean, mean - fl.bpb.get(TRIGRAM, math.nan) if fl else math.nan,
                     mean - fl.bpb.get(BASELINE_BEATS_ORDER, math.nan) if fl else math.nan, float(epochs.min()),
                     float(epochs.max())])
    return pd.DataFrame(rows, columns=["size", "mean", "vs_trigram", "vs_4gram", "epochs_min", "epochs_max"])


@section("ladder.trained")
def trained_section(ctx: Context) -> list:
    """Whether each size's baseline is a trained model by issue 26's bar (analysis/known_results.py): a size below
    it decides about local statistics more than about architectures, and so does its decision accuracy."""
    b: list = [("h2", "Trained models per size")]
    if ctx.floor is None:
        return b + [("p", "No n-gram floor is recorded for these runs' data: whether each size's baseline is a "
                          "trained model cannot be checked here.")]
    frame = trained_by_size(ctx)
    n = ctx.once(ladder_of)["points"].groupby("size")["n_params"].first()
    rows = []
    for r in frame.itertuples():
        clears = r.vs_4gram < 0 and r.vs_trigram <= -BELOW_TRIGRAM and r.epochs_max <= MAX_EPOCHS
        rows.append([f"`{r.size}`", n_text(n.get(r.size, math.nan)), fixed(r.mean), signed(r.vs_trigram),
                     signed(r.vs_4gram), f"{r.epochs_min:.2f}-{r.epochs_max:.2f}", "yes" if clears else "**no**"])
    return b + [("p", f"The known-results study's bar for a model whose verdicts are about architectures, at every "
                      f"size: the baseline below the {BASELINE_BEATS_ORDER}-gram floor and at least "
                      f"{BELOW_TRIGRAM:g} bpb below the trigram floor, every run within {MAX_EPOCHS:g} epochs of the "
                      "train split. A size that does not clear it decides about how fast a model picks up local "
                      "statistics more than about architectures, and so does its decision accuracy."),
                ("table", ["size", "N", "baseline val bpb", "Δ vs trigram floor", f"Δ vs {BASELINE_BEATS_ORDER}-gram "
                           "floor", "epochs (min-max)", "clears the bar"], rows)]


def compute_by_size(ctx: Context) -> pd.DataFrame:
    """Per size (smallest budget first) and stage: the results' runs and run-hours (analysis/compute.py); then the
    runs left out (killed by a stopped session, superseded, ...) with the time they ran, which the study spent too."""
    p, runs = ctx.extra, ctx.runs
    rows = []
    for size in p.sizes:
        for stage in (STAGE_LR, STAGE_SEEDS):
            c = cost_of(runs[(runs["size"] == size) & (runs["stage"] == stage)])
            rows.append([size, stage, c.runs, c.run_hours])
    left = cost_of(ctx.runset.runs[ctx.runset.runs["run_id"].isin(p.left_out["run_id"] if len(p.left_out) else [])])
    rows.append(["left out", "", left.runs, left.run_hours])
    return pd.DataFrame(rows, columns=["size", "stage", "runs", "run_hours"])


@section("ladder.compute")
def compute_section(ctx: Context) -> list:
    """What the ladder cost, per size and stage, beside the held-out study's own cost (its every result)."""
    frame, held = compute_by_size(ctx), ctx.once(held_out_of)
    ctx.write_csv(COMPUTE_CSV, frame)
    n = ctx.once(ladder_of)["points"].groupby("size")["n_params"].first()
    res = frame[frame["size"] != "left out"]
    rows = []
    for size, g in res.groupby("size", sort=False):
        by = g.set_index("stage")
        total = by["run_hours"].sum()
        rows.append([f"`{size}`", n_text(n.get(size, math.nan)),
                     *(f"{int(by.loc[s, 'runs'])} / {by.loc[s, 'run_hours']:.2f}"
                       for s in (STAGE_LR, STAGE_SEEDS)),
                     f"{int(by['runs'].sum())} / {total:.2f}",
                     f"{60 * total / by['runs'].sum():.2f}" if by["runs"].sum() else "n/a"])
    all_c = cost_of(ctx.runs)
    stage = res.groupby("stage")[["runs", "run_hours"]].sum()
    rows.append(["all sizes", "", *(f"{int(stage.loc[s, 'runs'])} / {stage.loc[s, 'run_hours']:.2f}"
                                    for s in (STAGE_LR, STAGE_SEEDS)),
                 f"**{all_c.runs} / {all_c.run_hours:.2f}**",
                 f"{60 * all_c.run_hours / all_c.runs:.2f}" if all_c.runs else "n/a"])
    left = frame[frame["size"] == "left out"].iloc[0]
    text = (f"The results of the ladder's {len(ctx.extra.sizes)} sizes took **{all_c.run_hours:.2f} run-hours** "
            f"({all_c.runs} runs, each one process of one thread; {all_c.busy_seconds / 3600:.1f} h of wall time "
            f"with at least one run going, {all_c.concurrency:.2f} runs at once on average). ")
    design = recorded_design(ctx.extra.seeds)
    if design is not None:
        cap_runs = design.cap * len(ctx.extra.arms) * len(ctx.extra.sizes)
        text += (f"The seeds stage trained {int(stage.loc[STAGE_SEEDS, 'runs'])} runs of the {cap_runs} that "
                 f"{design.cap} seeds (the sequential design's cap) for each of {len(ctx.extra.arms)} arms at "
                 f"{len(ctx.extra.sizes)} sizes would take: the sequential rule stopped the rest. ")
    if left["runs"]:
        text += (f"{int(left['runs'])} runs left out (not results: see [Left out](#left-out)) ran "
                 f"{left['run_hours']:.2f} run-hours more. ")
    if held is not None:
        ratio = all_c.run_hours / held.cost.run_hours if held.cost.run_hours else math.nan
        text += (f"The held-out size's study, protocol `{held.protocol}` (one size, every result of it), took "
                 f"{held.cost.run_hours:.2f} run-hours ({held.cost.runs} runs): the ladder cost {ratio:.2f}x that, "
                 f"{'less' if ratio < 1 else 'more'} than the size it predicts. ")
    text += ("Run-hours are the runs' own start-to-end times in MLflow (start-up and the final evaluation included), "
             "on whatever machine and load each met: a cost, not a speed comparison.")
    return [("h2", "Compute"), ("p", text),
            ("table", ["size", "N", "lr stage: runs / run-hours", "seeds stage: runs / run-hours",
                       "all: runs / run-hours", "run-minutes per run"], rows),
            ("p", f"Machine-readable: `{COMPUTE_CSV}`.")]


def ladder_summary(ctx: Context) -> list[str]:
    lad, p, held = ctx.once(ladder_of), ctx.extra, ctx.once(held_out_of)
    top = f"`{held.size}` of `{held.protocol}` ({held.source})" if held else f"`{p.sizes[-1]}`"
    lines = [f"ladder report for {ctx.runset.description} (protocol `{p.name}`): {len(p.arms)} arms x "
             f"{len(p.sizes)} sizes, {top} held out -> {ctx.out / 'index.md'}",
             protocol.protocol_summary(ctx)[1]]
    for r in lad["trends"].itertuples():
        slope = "n/a" if not np.isfinite(r.slope) else f"{r.slope:+.4f} [{r.slope_low:+.4f}, {r.slope_high:+.4f}]"
        lines.append(f"{r.arm}: slope per doubling {slope}; {r.trend}")
    return lines


LADDER = Kind("ladder", load_ladder, lambda ctx: f"Ladder: {ctx.extra.name}",
              ("ladder.head", "ladder.trend", "ladder.predictions", "ladder.decisions", "ladder.trained",
               "forest.by_size",
               "protocol.intro", "protocol.verdicts", "floor", "protocol.lr", "ladder.compute", "protocol.throughput",
               "paired", "protocol.provenance", "regenerate"),
              summary=ladder_summary, exit_code=protocol.PROTOCOL.exit_code, args=regenerate_args,
              floor_arms=protocol.floor_arms, expected=EXPECTED,
              files=protocol.FILES + (POINTS_CSV, TRENDS_CSV, PREDICTIONS_CSV, DECISIONS_CSV, COMPUTE_CSV),
              figures=protocol.PROTOCOL.figures + (FIGURE, forest.BY_SIZE_FIGURE))
