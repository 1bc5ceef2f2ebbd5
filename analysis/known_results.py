"""The known-results report: does the harness recover what the literature found? A report kind, i.e. a list of
sections over one context (analysis/engine.py):

    python -m analysis.report known-results known-results tracking_uri=sqlite:///study/known-results/mlflow.db

Its runs are a verdict protocol's (conf/verdict/known-results.yaml: every arm against one baseline at one size), so
it reuses the protocol kind's load and most of its sections; it adds the rows of analysis/literature.py: one per
published finding, with the paper's setting and result, our setting, our Δ with its interval and Holm p, our
verdict and whether they agree. Rows can come from other committed reports too (literature.Finding.source):
ALiBi's extrapolation from reports/extrapolation/report/context.csv, μP's Figure 1 from reports/lr-transfer/480-steps.

Agreement: the paper's direction (better / worse / equivalent) against our verdict: the same is *agree*, another
decided verdict is *disagree*, an inconclusive one is *undecided*. A disagreement is reported, never dropped.
"""
from __future__ import annotations

import gzip
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis import protocol
from analysis.compute import cost_of
from analysis.document import ci_text, fixed, lr_text, p_text, signed
from analysis.engine import Context, Kind, section
from analysis.literature import BETTER, EQUIVALENT, EXPECTED, FINDINGS, WORSE, Finding
from analysis.verdict import INCONCLUSIVE, VERDICT_METRIC

EXTRAPOLATION_CSV = "reports/extrapolation/report/context.csv"  # relative to the repository (the scripts' cwd)
LR_TRANSFER_STORE = "reports/lr-transfer/480-steps/mlflow.db.gz"  # the μP re-run (issue 25): μP as it is built now
LR_TRANSFER_EXPERIMENT = "lr-transfer-480"
CSV = "known_results.csv"
KV_FIGURE, LR_FIGURE = "quality_vs_kv_cache", "lr_sensitivity"
KV_ARMS = ("baseline", "gqa", "mqa")  # the attention rows' figure: quality against KV-cache bytes per token
UNDECIDED = "undecided"
# "Trained models" (issue 26): the bar a study's models must clear before their verdicts say anything about
# architectures: the baseline below the 4-gram floor, every arm this far below the trigram floor, at most this many
# passes over the train split
BASELINE_BEATS_ORDER, BELOW_TRIGRAM, MAX_EPOCHS = 4, 0.2, 4.0
# what an undecided comparison would take: the seed planner's power (analysis/power.py) at its defaults, seeds per
# arm up to this many
PLAN_POWER, PLAN_ALPHA, PLAN_MAX_SEEDS = 0.8, 0.05, 500


def agreement(expected: str, verdict: str) -> str:
    """agree / disagree / undecided: the paper's direction against our verdict (better, worse, equivalent within
    ±m, inconclusive)."""
    ours = EQUIVALENT if str(verdict).startswith("equivalent") else str(verdict)
    if ours not in (BETTER, WORSE, EQUIVALENT):
        return UNDECIDED
    return "agree" if ours == expected else "disagree"


def _row(f: Finding, setting: str, delta: str, p_holm: str, verdict: str) -> dict:
    return {"finding": f.key, "citation": f.citation, "paper_setting": f.paper_setting, "paper_result": f.paper_result,
            "expected": f.expected, "our_setting": setting, "our_delta": delta, "p_holm": p_holm, "verdict": verdict,
            "agreement": agreement(f.expected, verdict)}


def protocol_row(ctx: Context, f: Finding) -> dict:
    """A finding decided by the protocol: `arm` against the baseline at the largest size it ran at."""
    t = ctx.once(protocol.verdict_table)[(ctx.once(protocol.verdict_table)["arm"] == f.arm) & (ctx.once(protocol.verdict_table)["verdict"] != "baseline")]
    if not len(t):
        return _row(f, f"`{f.arm}` did not run in this study", "n/a", "n/a", "not run")
    r = t.iloc[-1]
    base = ctx.once(protocol.verdict_table)[(ctx.once(protocol.verdict_table)["size"] == r["size"]) & (ctx.once(protocol.verdict_table)["verdict"] == "baseline")].iloc[0]
    setting = (f"`{f.arm}` vs `{ctx.baseline}` at `{r['size']}`: {r['n_seeds']} and {base['n_seeds']} seeds, "
               f"{r['params']:,.0f} vs {base['params']:,.0f} parameters, {r['tokens']:,.0f} tokens")
    delta = signed(r["delta"]) + " " + ci_text(r["ci_low"], r["ci_high"])
    return _row(f, setting, delta, p_text(r["p_holm"]), r["verdict"])


def lr_curves(ctx: Context, arms) -> pd.DataFrame:
    """Mean val bpb of the lr stage per (arm, lr) at the largest size: the curves the lr-sensitivity row reads."""
    p = ctx.extra
    lr = p.lr[(p.lr["verdict.size"] == p.sizes[-1]) & p.lr["verdict.arm"].isin(arms)]
    return lr.groupby(["verdict.arm", "lr_value"])[VERDICT_METRIC].mean().astype(float).reset_index()


def within_tolerance(curve: pd.DataFrame, tolerance: float) -> list[float]:
    """The lrs whose mean is within `tolerance` of the curve's best."""
    best = curve[VERDICT_METRIC].min()
    return sorted(curve.loc[curve[VERDICT_METRIC] <= best + tolerance, "lr_value"])


def mean_excess(curve: pd.DataFrame, lrs) -> float:
    """Wortsman et al. (2023, sec. 2.2)'s LR sensitivity without their cap: the mean over `lrs` of the curve's loss
    minus its best."""
    c = curve[curve["lr_value"].isin(lrs)]
    return float((c[VERDICT_METRIC] - curve[VERDICT_METRIC].min()).mean())


def lr_sensitivity_row(ctx: Context, f: Finding) -> dict:
    """How many lrs of the grid land within the margin m of each arm's best (descriptive: no test)."""
    cur = lr_curves(ctx, (ctx.baseline, f.arm))
    tol = ctx.margin.value
    have = set(cur["verdict.arm"])
    if not {ctx.baseline, f.arm} <= have or not np.isfinite(tol):
        return _row(f, "needs the lr stage of both arms and a margin", "n/a", "n/a", "not run")
    n = {a: len(within_tolerance(cur[cur["verdict.arm"] == a], tol)) for a in (ctx.baseline, f.arm)}
    grid = sorted(cur["lr_value"].unique())
    verdict = BETTER if n[f.arm] > n[ctx.baseline] else WORSE if n[f.arm] < n[ctx.baseline] else "inconclusive"
    setting = (f"lr stage at `{ctx.extra.sizes[-1]}`: grid {', '.join(lr_text(v) for v in grid)}; lrs within "
               f"m = {tol:g} bpb of each arm's best")
    delta = f"{n[f.arm]} vs {n[ctx.baseline]} lrs ({n[f.arm] - n[ctx.baseline]:+d})"
    return _row(f, setting, delta, "n/a (descriptive)", verdict)


def extrapolation_row(ctx: Context, f: Finding) -> dict:
    """`arm`'s change in val bpb (non-overlapping windows) from the training context to the longest one evaluated,
    paired within each run, with a t interval and a one-sample t-test (a family of one)."""
    from scipy import stats

    path = Path(dict(ctx.options.sources).get("extrapolation", EXTRAPOLATION_CSV))
    if not path.is_file():
        return _row(f, f"no `{path}`", "n/a", "n/a", "not run")
    frame = pd.read_csv(path)
    d = frame[(frame["arm"].isin([f.arm, f"position={f.arm}"])) & (frame["mode"] == "nonoverlap")]
    train, longest = int(d["block_size"].iloc[0]), int(d["context"].max())
    by_run = d.pivot_table(index="run_id", columns="context", values="bpb")
    diff = (by_run[longest] - by_run[train]).dropna().to_numpy()
    half = float(stats.t.ppf(0.975, len(diff) - 1)) * diff.std(ddof=1) / math.sqrt(len(diff))
    p = float(stats.ttest_1samp(diff, 0.0).pvalue)
    verdict = "inconclusive" if p >= 0.05 else (BETTER if diff.mean() < 0 else WORSE)
    setting = (f"`{path}`: trained at {train} tokens, evaluated at {longest} (non-overlapping windows), "
               f"{len(diff)} seeds")
    delta = f"bpb@{longest} − bpb@{train}: {signed(diff.mean())} {ci_text(diff.mean() - half, diff.mean() + half)}"
    return _row(f, setting, delta, p_text(p) + " (family of one)", verdict)


def lr_transfer_row(ctx: Context, f: Finding) -> dict:
    """Tensor Programs V's Figure 1 on the μP re-run (reports/lr-transfer/480-steps), judged by the hypothesis stated
    there before its runs (analysis/lr_hypothesis.py): (a) the μP optimum moves at most one grid step across width,
    (b) the wide μP model at the transferred lr is no worse than SP tuned at that width, (c) under μP wider is
    better. The paper found all three: agree when all held, disagree when any failed, otherwise undecided."""
    from analysis import lr_hypothesis, lr_transfer

    path = Path(dict(ctx.options.sources).get("lr-transfer", LR_TRANSFER_STORE))
    if not path.is_file():
        return _row(f, f"no `{path}`", "n/a", "n/a", "not run")
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "mlflow.db"
        with gzip.open(path) as src, open(db, "wb") as dst:
            shutil.copyfileobj(src, dst)
        study = lr_transfer.load_study(f"sqlite:///{db}", LR_TRANSFER_EXPERIMENT)
    cur = lr_transfer.curves(study.points)
    opt = lr_transfer.optima(cur)
    parts = [(part, verdict, sentence) for o, part, verdict, sentence in
             lr_hypothesis.judge(cur, opt, lr_transfer.transfer(opt)) if o == f.arm]
    if not parts:
        return _row(f, f"no SP and μP runs of `{f.arm}` in `{path}`", "n/a", "n/a", "not run")
    mine = opt[(opt["optimizer"] == f.arm) & (opt["parametrization"] == "mup")].sort_values("width")
    setting = (f"`{path}`: {lr_transfer.LABELS.get(f.arm, f.arm)}, widths {mine['width'].iloc[0]}-"
               f"{mine['width'].iloc[-1]}, final val loss in {lr_hypothesis.UNIT} (not bpb), the hypothesis stated "
               "before its runs (hypothesis.md there)")
    delta = "; ".join(f"({part}) {sentence}" for part, _, sentence in parts)
    verdicts = [verdict for _, verdict, _ in parts]
    verdict = ", ".join(f"({part}) {v}" for (part, _, _), v in zip(parts, verdicts))
    ours = WORSE if "failed" in verdicts else BETTER if set(verdicts) == {"held"} else ""
    return _row(f, setting, delta, "n/a (criteria, no test)", verdict) | {"agreement": agreement(f.expected, ours)}


ROWS = {"protocol": protocol_row, "lr-sensitivity": lr_sensitivity_row, "extrapolation": extrapolation_row,
        "lr-transfer": lr_transfer_row}
COLUMNS = ["finding", "citation", "paper_setting", "paper_result", "expected", "our_setting", "our_delta", "p_holm",
           "verdict", "agreement"]


def known_rows(ctx: Context) -> pd.DataFrame:
    """One row per finding of analysis/literature.py, in its order."""
    return pd.DataFrame([ROWS[f.source](ctx, f) for f in FINDINGS], columns=COLUMNS)


# ---------------------------------------------------------------------------------------------------- sections
@section("known.head")
def head_section(ctx: Context) -> list:
    rows = ctx.once(known_rows)
    counts = rows["agreement"].value_counts()
    return protocol.head_section(ctx, "Known results", (
        f"**{len(rows)} published findings**: {counts.get('agree', 0)} agree, {counts.get('disagree', 0)} disagree, "
        f"{counts.get(UNDECIDED, 0)} undecided (see [Findings](#findings)).",))


@section("known.findings")
def findings_section(ctx: Context) -> list:
    rows = ctx.once(known_rows)
    ctx.write_csv(CSV, rows)
    b: list = [("h2", "Findings"),
               ("p", "One row per published finding (analysis/literature.py, typed from the papers). *Expected*: the "
                     "direction the paper found for the arm against the baseline. Our Δ: val bpb, arm − baseline, "
                     "with its 95% Welch CI and the Holm-adjusted p of the protocol's family, unless the row says "
                     "otherwise. *Agree*: our verdict is the paper's direction; *disagree*: another decided "
                     "verdict; *undecided*: inconclusive here."),
               ("table", ["finding", "paper", "paper's setting", "paper's result", "expected", "our setting",
                          "our Δ", "p (Holm)", "our verdict", "agreement"],
                [[f"`{r.finding}`", r.citation, r.paper_setting, r.paper_result, r.expected, r.our_setting,
                  r.our_delta, r.p_holm, r.verdict, f"**{r.agreement}**"] for r in rows.itertuples()])]
    off = rows[rows["agreement"] == "disagree"]
    if len(off):
        b.append(("p", "**Disagreements** (each investigated: setting, scale, or a bug; see the study's index): "
                       + ", ".join(f"`{k}`" for k in off["finding"]) + "."))
    return b + [("p", f"Machine-readable: `{CSV}`.")]


def kv_frame(ctx: Context) -> pd.DataFrame:
    """Per attention arm at the largest size: KV-cache bytes per token, mean val bpb and its 95% t half-width."""
    from scipy import stats

    s = ctx.extra.seeds
    s = s[(s["verdict.size"] == ctx.extra.sizes[-1]) & s["verdict.arm"].isin(KV_ARMS)]
    rows = []
    for arm in [a for a in KV_ARMS if a in set(s["verdict.arm"])]:
        v = s.loc[s["verdict.arm"] == arm, VERDICT_METRIC].astype(float)
        half = float(stats.t.ppf(0.975, len(v) - 1)) * v.std(ddof=1) / math.sqrt(len(v)) if len(v) > 1 else math.nan
        rows.append({"arm": arm, "kv_cache_bytes_per_token": float(
            s.loc[s["verdict.arm"] == arm, "kv_cache_bytes_per_token"].astype(float).median()),
                     "mean": float(v.mean()), "ci_half": half, "n": len(v)})
    return pd.DataFrame(rows, columns=["arm", "kv_cache_bytes_per_token", "mean", "ci_half", "n"])


@section("known.kv_cache")
def kv_section(ctx: Context) -> list:
    frame = kv_frame(ctx)
    if len(frame) < 2:
        return []
    fig = Figure(figsize=(6.5, 4.2), dpi=110, layout="constrained")
    ax = fig.subplots()
    ax.errorbar(frame["kv_cache_bytes_per_token"], frame["mean"], yerr=frame["ci_half"], fmt="o", capsize=4)
    for r in frame.itertuples():
        ax.annotate(f"{r.arm} (n={r.n})", (r.kv_cache_bytes_per_token, r.mean), textcoords="offset points",
                    xytext=(6, 4), fontsize="small")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("KV cache per token (bytes, bf16)")
    ax.set_ylabel("final val bpb (mean, 95% t CI)")
    ax.grid(True, alpha=0.3)
    fig.suptitle("Quality against KV-cache size: MHA, GQA, MQA (Shazeer 2019; Ainslie et al. 2023)",
                 fontsize="medium")
    path = ctx.figure(fig, KV_FIGURE)
    rows = [[f"`{r.arm}`", f"{r.kv_cache_bytes_per_token:,.0f}", fixed(r.mean), fixed(r.ci_half), str(r.n)]
            for r in frame.itertuples()]
    return [("h2", "Quality against KV-cache size"), ("img", "val bpb against KV-cache bytes per token", path),
            ("table", ["arm", "KV bytes/token", "mean val bpb", "95% t half-width", "seeds"], rows)]


@section("known.lr_sensitivity")
def lr_sensitivity_section(ctx: Context) -> list:
    arms = [f.arm for f in FINDINGS if f.source == "lr-sensitivity"]
    cur = lr_curves(ctx, [ctx.baseline, *arms])
    if cur["verdict.arm"].nunique() < 2:
        return []
    tol = ctx.margin.value
    grid = sorted(cur["lr_value"].unique())
    common = set.intersection(*(set(c["lr_value"]) for _, c in cur.groupby("verdict.arm")))
    fig = Figure(figsize=(6.5, 4.2), dpi=110, layout="constrained")
    ax = fig.subplots()
    rows = []
    for arm, c in cur.groupby("verdict.arm", sort=True):
        c = c.sort_values("lr_value")
        ax.plot(c["lr_value"], c[VERDICT_METRIC], "o-", label=arm)
        best = c[VERDICT_METRIC].min()
        if np.isfinite(tol):
            ax.axhline(best + tol, linestyle=":", linewidth=1, color=ax.lines[-1].get_color())
        ok = within_tolerance(c, tol) if np.isfinite(tol) else []
        at = dict(zip(c["lr_value"], c[VERDICT_METRIC]))
        rows.append([f"`{arm}`", *[fixed(at[v]) if v in at else "" for v in grid], ", ".join(lr_text(v) for v in ok),
                     fixed(mean_excess(c, common))])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("peak lr")
    ax.set_ylabel("final val bpb (mean over the lr stage's seeds)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.suptitle("lr sensitivity with and without QK-norm (Wortsman et al. 2023); dotted: best + m", fontsize="medium")
    path = ctx.figure(fig, LR_FIGURE)
    worst = float(cur.loc[cur["lr_value"].isin(common), VERDICT_METRIC].max())
    return [("h2", "lr sensitivity"), ("img", "final val bpb against lr with and without QK-norm", path),
            ("table", ["arm", *[f"lr {lr_text(v)}" for v in grid], "lrs within m of the best",
                       "mean excess over its best"], rows),
            ("p", "The finding's verdict counts the lrs within m of each arm's best (fixed before the runs). *Mean "
                  "excess over its best*: Wortsman et al.'s own LR sensitivity, the mean over the lrs both arms ran "
                  f"({', '.join(lr_text(v) for v in sorted(common))}) of the loss above the arm's best, added after "
                  "the runs as a description, not a verdict; they cap each loss at the loss at initialisation, here it "
                  f"is uncapped (the largest mean is {fixed(worst)}).")]


def trained_frame(ctx: Context) -> pd.DataFrame:
    """Per arm at the largest size (seeds stage): mean val bpb, its distance to the trigram and the 4-gram floors,
    and the epochs its runs saw (tokens_seen over the floor's train-split size), min and max over every run of the
    arm (both stages)."""
    from analysis.floor import TRIGRAM

    fl, p = ctx.floor, ctx.extra
    n_train = float(fl.n_train) if fl is not None and str(fl.n_train).isdigit() else math.nan
    s = p.seeds[p.seeds["verdict.size"] == p.sizes[-1]]
    runs = p.results()
    rows = []
    for arm in p.arms:
        v = s.loc[s["verdict.arm"] == arm, VERDICT_METRIC].astype(float)
        if not len(v):
            continue
        epochs = runs.loc[runs["verdict.arm"] == arm, "tokens_seen"].astype(float) / n_train
        mean = float(v.mean())
        rows.append({"arm": arm, "mean": mean, "n": len(v),
                     "vs_trigram": mean - fl.bpb.get(TRIGRAM, math.nan) if fl else math.nan,
                     "vs_4gram": mean - fl.bpb.get(BASELINE_BEATS_ORDER, math.nan) if fl else math.nan,
                     "epochs_min": float(epochs.min()), "epochs_max": float(epochs.max())})
    return pd.DataFrame(rows, columns=["arm", "mean", "n", "vs_trigram", "vs_4gram", "epochs_min", "epochs_max"])


@section("known.trained")
def trained_section(ctx: Context) -> list:
    """Whether the models are trained enough for their verdicts to be about architectures (issue 26's bar)."""
    frame = ctx.once(trained_frame)
    if not len(frame):
        return []
    b: list = [("h2", "Trained models")]
    if ctx.floor is None:
        return b + [("p", "No n-gram floor is recorded for these runs' data: the bar below cannot be checked (see "
                          "[n-gram floor](#n-gram-floor)).")]
    base = frame[frame["arm"] == ctx.baseline]
    deep = frame["vs_trigram"] <= -BELOW_TRIGRAM
    lo, hi = frame["epochs_min"].min(), frame["epochs_max"].max()
    sentences = []
    if len(base):
        r = base.iloc[0]
        sentences.append(f"the baseline (`{r.arm}`, {fixed(r['mean'])}) is "
                         f"{'below' if r.vs_4gram < 0 else '**not below**'} the {BASELINE_BEATS_ORDER}-gram floor "
                         f"({signed(r.vs_4gram)})")
    sentences.append(f"{int(deep.sum())} of {len(frame)} arms are at least {BELOW_TRIGRAM:g} bpb below the trigram "
                     "floor" + ("" if deep.all() else " (not: " + ", ".join(f"`{a}`" for a in frame.loc[~deep, "arm"])
                                + ")"))
    if np.isfinite(lo):
        n_train = int(float(ctx.floor.n_train))
        sentences.append(f"every run saw {lo:.2f}-{hi:.2f} epochs of the train split ({n_train:,} "
                         f"tokens), {'within' if hi <= MAX_EPOCHS else '**more than**'} {MAX_EPOCHS:g}")
    b.append(("p", "The bar a model must clear before its verdict says something about architectures, not about "
                   f"how fast it picks up local statistics: at the largest size, {'; '.join(sentences)}."))
    rows = [[f"`{r.arm}`", fixed(r.mean), str(r.n), signed(r.vs_trigram), signed(r.vs_4gram),
             f"{r.epochs_min:.2f}-{r.epochs_max:.2f}"] for r in frame.itertuples()]
    return b + [("table", ["arm", "mean val bpb", "seeds", "Δ vs trigram floor",
                           f"Δ vs {BASELINE_BEATS_ORDER}-gram floor", "epochs (min-max, every run)"], rows)]


def undecided_frame(ctx: Context) -> pd.DataFrame:
    """Per inconclusive comparison: the seeds per arm (the baseline the same) that the seed planner's power functions
    (analysis/power.py) say would decide it with probability PLAN_POWER if the true difference were the observed
    one: to detect it (two-sided Welch at alpha / m, m its Holm family's size), and, when it lies inside the
    margin, to show equivalence within ±m (TOST at alpha / m); at the observed seed sds and at their 80% upper
    bounds."""
    from analysis.power import power_difference, power_tost, sd_upper, seeds_needed

    t, margin = ctx.once(protocol.verdict_table), ctx.margin.value
    base = t[t["verdict"] == "baseline"].set_index("size")
    rows = []
    for r in t[t["verdict"] == INCONCLUSIVE].itertuples():
        b = base.loc[r.size]
        alpha = PLAN_ALPHA / max(1, int(r.holm_family_size))
        delta = abs(float(r.delta))
        out = {"size": r.size, "arm": r.arm, "delta": float(r.delta), "sd": float(r.std), "sd_base": float(b["std"]),
               "n": int(r.n_seeds), "n_base": int(b["n_seeds"]), "m": int(r.holm_family_size)}
        upper = (sd_upper(out["sd"], out["n"] - 1), sd_upper(out["sd_base"], out["n_base"] - 1))
        for at, sd_a, sd_b in (("estimate", out["sd"], out["sd_base"]), ("upper", *upper)):
            detect = seeds_needed(lambda n: power_difference(delta, sd_a, sd_b, n, n, alpha), PLAN_POWER,
                                  PLAN_MAX_SEEDS) if delta > 0 else None
            equiv = seeds_needed(lambda n: power_tost(delta, margin, sd_a, sd_b, n, n, alpha), PLAN_POWER,
                                 PLAN_MAX_SEEDS) if np.isfinite(margin) and delta < margin else None
            out |= {f"detect_{at}": detect, f"equivalence_{at}": equiv}
        rows.append(out)
    return pd.DataFrame(rows, columns=["size", "arm", "delta", "sd", "sd_base", "n", "n_base", "m", "detect_estimate",
                                       "equivalence_estimate", "detect_upper", "equivalence_upper"])


@section("known.undecided")
def undecided_section(ctx: Context) -> list:
    frame = ctx.once(undecided_frame)
    if not len(frame):
        return []
    margin = ctx.margin.value

    def n(v, applies: bool) -> str:
        if not applies:
            return "n/a"
        missing = v is None or (isinstance(v, float) and not np.isfinite(v))
        return f"more than {PLAN_MAX_SEEDS}" if missing else str(int(v))

    rows = []
    for r in frame.itertuples():
        inside = np.isfinite(margin) and abs(r.delta) < margin
        spreads = f"{fixed(r.sd)} ({r.n}) / {fixed(r.sd_base)} ({r.n_base})"
        rows.append([f"`{r.arm}` at `{r.size}`", signed(r.delta), spreads,
                     str(r.m), n(r.detect_estimate, r.delta != 0), n(r.detect_upper, r.delta != 0),
                     n(r.equivalence_estimate, inside), n(r.equivalence_upper, inside)])
    return [("h2", "What the undecided comparisons would take"),
            ("p", f"For each inconclusive comparison, the seeds per arm (the baseline the same) that would decide it "
                  f"with probability {PLAN_POWER:g} if the true difference were the observed Δ, by the seed planner's "
                  f"power functions: to detect it (two-sided Welch test at {PLAN_ALPHA:g}/m, m the size of its Holm "
                  "family: Holm's first step) and, when Δ lies inside the margin, to show equivalence within ±m "
                  f"(TOST at {PLAN_ALPHA:g}/m); at this study's seed sds and at their 80% upper confidence bounds. "
                  "A planning figure, not a result: the observed Δ of an inconclusive comparison is itself "
                  "uncertain."),
            ("table", ["comparison", "Δ (observed)", "sd arm (n) / baseline (n)", "m", "seeds to detect Δ",
                       "(sd upper)", "seeds for equivalence", "(sd upper)"], rows)]


@section("known.compute")
def compute_section(ctx: Context) -> list:
    """What the study cost (analysis/compute.py): its results' run-hours, busy wall time and elapsed time."""
    c = cost_of(ctx.extra.results())
    if not c.runs:
        return []
    return [("h2", "Compute"),
            ("p", f"{c.runs} runs counted (seeds and lr stages): {c.run_hours:.1f} run-hours (each run one process "
                  f"of one thread), {c.busy_seconds / 3600:.1f} h of wall time with at least one run going, so on "
                  f"average {c.concurrency:.2f} runs at once; {c.elapsed_seconds / 3600:.1f} h from the first start to "
                  "the last end, pauses between sessions included. The runs' own start and end times in MLflow "
                  "(start-up and the final evaluation included).")]


KNOWN_RESULTS = Kind("known-results", protocol.load_protocol, lambda ctx: f"Known results: {ctx.extra.name}",
                     ("known.head", "forest", "known.findings", "known.undecided", "known.trained", "known.kv_cache",
                      "known.lr_sensitivity", "protocol.intro", "protocol.verdicts", "floor", "protocol.lr",
                      "protocol.throughput", "paired",
                      "known.compute", "protocol.provenance", "regenerate"),
                     summary=protocol.protocol_summary, exit_code=protocol.PROTOCOL.exit_code, args=protocol.regenerate_args,
                     floor_arms=protocol.floor_arms, expected=EXPECTED,
                     files=protocol.FILES + (CSV,), figures=protocol.PROTOCOL.figures + (KV_FIGURE, LR_FIGURE))
