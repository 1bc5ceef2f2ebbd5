"""Context-length section of a report: val bpb against evaluation context, and against KV-cache bytes at each context.

Reads what `python -m ablations.evaluate` logs into each run: `eval/<mode>/bpb`, `eval/<mode>/loss`,
`eval/<mode>/tokens`, `eval/<mode>/kv_cache_bytes` with the evaluation context as the step, and the same under
`eval/<mode>/<scaling>/` for rope with a position.scaling (an *arm* `<variant> +<scaling>`, e.g. `rope +yarn4`).
The latest value per (run, key, context) counts. Runs without evaluations add nothing; without any, no section.

Statistics, as in the rest of the report (seeds are the unit): mean ± std over seeds (ddof=1); the change from the
shortest context is paired within each run (mean and 95% t interval over seeds); at each context every arm is
compared with that context's best arm by Welch's t-test, Holm-adjusted across the arms.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.document import mean_std, p_text, signed_ascii
from analysis.engine import section
from analysis.plots import variant_styles
from analysis.stats import holm, welch
from analysis.store import _client

MODES = ("nonoverlap", "sliding")
MODE_TITLES = {"nonoverlap": "non-overlapping windows", "sliding": "sliding windows"}
FIGURES = ("bpb_vs_context", "bpb_vs_kv_cache_at_context")
CSV = "context.csv"
_KEY = re.compile(r"^eval/(nonoverlap|sliding)/(?:([A-Za-z0-9_.-]+)/)?(bpb|loss|tokens|kv_cache_bytes)$")
COLUMNS = ["arm", "variant", "scaling", "run_id", "seed", "mode", "context", "bpb", "loss", "tokens",
           "kv_cache_bytes", "block_size"]


def load(included: pd.DataFrame, labels: dict, tracking_uri: str) -> pd.DataFrame:
    """One row per (run, mode, scaling, context) with the evaluation metrics; empty when nothing was evaluated."""
    client = _client(tracking_uri)
    rows = []
    for _, r in included.sort_values("run_id").iterrows():
        run = client.get_run(r["run_id"])
        keys = sorted(k for k in run.data.metrics if _KEY.match(k))
        if not keys:
            continue
        values: dict = {}
        for key in keys:
            mode, scaling, name = _KEY.match(key).groups()
            for m in sorted(client.get_metric_history(r["run_id"], key), key=lambda m: (m.step, m.timestamp)):
                values.setdefault((mode, scaling or "", int(m.step)), {})[name] = float(m.value)  # latest wins
        block = float(run.data.params.get("model.block_size", "nan"))
        label = labels.get(r["variant"], r["variant"])
        for (mode, scaling, ctx), v in sorted(values.items()):
            rows.append({"arm": label + (f" +{scaling}" if scaling else ""), "variant": label, "scaling": scaling,
                         "run_id": r["run_id"], "seed": r["seed"], "mode": mode, "context": ctx,
                         "bpb": v.get("bpb", math.nan), "loss": v.get("loss", math.nan),
                         "tokens": v.get("tokens", math.nan), "kv_cache_bytes": v.get("kv_cache_bytes", math.nan),
                         "block_size": block})
    return pd.DataFrame(rows, columns=COLUMNS)


def arm_order(frame: pd.DataFrame, variants: list[str], labels: dict) -> list[str]:
    """The report's variant order, each variant followed by its scaled arms (alphabetical)."""
    order = []
    for v in variants:
        lab = labels.get(v, v)
        arms = frame.loc[frame["variant"] == lab, "arm"].unique()
        order += sorted(arms, key=lambda a: (a != lab, a))
    return order


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean/std/n of bpb over seeds per (mode, arm, context)."""
    g = frame.groupby(["mode", "arm", "context"])["bpb"]
    out = g.agg(["mean", "count"]).rename(columns={"count": "n"})
    out["std"] = g.std(ddof=1)
    return out.reset_index()


def _band(ax, x, mean, std, style, label):
    ax.plot(x, mean, marker="o", color=style["color"], linestyle=style["linestyle"], label=label)
    ok = np.isfinite(std)
    if ok.any():
        ax.fill_between(x[ok], (mean - std)[ok], (mean + std)[ok], color=style["color"], alpha=0.15, linewidth=0)


def context_figure(frame: pd.DataFrame, arms: list[str], styles: dict) -> Figure:
    """val bpb against evaluation context (log2 x), one panel per mode, mean over seeds with a ±1 std band."""
    s = summary(frame)
    fig = Figure(figsize=(11, 5), layout="constrained")
    axes = fig.subplots(1, len(MODES), sharey=True, sharex=True)
    block = frame["block_size"].dropna().unique()
    for ax, mode in zip(axes, MODES):
        for arm in arms:
            d = s[(s["mode"] == mode) & (s["arm"] == arm)].sort_values("context")
            if len(d):
                n = int(d["n"].max())
                _band(ax, d["context"].to_numpy(float), d["mean"].to_numpy(), d["std"].to_numpy(), styles[arm],
                      f"{arm} (n={n})")
        for b in block:
            ax.axvline(b, color="0.5", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation context (tokens; dotted: training)")
        ax.set_title(MODE_TITLES[mode])
        ax.grid(True, alpha=0.3)
    _legend(fig, axes)
    return fig


def kv_figure(frame: pd.DataFrame, arms: list[str], styles: dict) -> Figure:
    """val bpb against the KV-cache bytes a sequence of each evaluation context holds (bf16, batch 1)."""
    s = summary(frame).merge(frame.groupby(["mode", "arm", "context"])["kv_cache_bytes"].mean().reset_index(),
                             on=["mode", "arm", "context"])
    fig = Figure(figsize=(11, 5), layout="constrained")
    axes = fig.subplots(1, len(MODES), sharey=True)
    for ax, mode in zip(axes, MODES):
        for arm in arms:
            d = s[(s["mode"] == mode) & (s["arm"] == arm)].sort_values("context")
            if len(d):
                _band(ax, d["kv_cache_bytes"].to_numpy(float), d["mean"].to_numpy(), d["std"].to_numpy(),
                      styles[arm], arm)
                for x, y, c in zip(d["kv_cache_bytes"], d["mean"], d["context"]):
                    ax.annotate(str(int(c)), (x, y), textcoords="offset points", xytext=(3, 3), fontsize="x-small",
                                color=styles[arm]["color"])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("KV cache of one sequence at that context (bytes, bf16)")
        ax.set_title(MODE_TITLES[mode])
        ax.grid(True, alpha=0.3)
    _legend(fig, axes)
    return fig


def _legend(fig, axes):
    axes[0].set_ylabel("val bits per byte (lower is better)")
    handles, names = {}, []
    for ax in axes:  # one entry per arm, whichever panel has it
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in handles:
                handles[n] = h
                names.append(n)
    if names:
        fig.legend([handles[n] for n in names], names, loc="outside lower center", ncol=min(4, len(names)),
                   fontsize="small")


# ---------------------------------------------------------------- tables
def bpb_rows(frame: pd.DataFrame, mode: str, arms: list[str]):
    s = summary(frame)
    s = s[s["mode"] == mode]
    contexts = sorted(s["context"].unique())
    rows = []
    for arm in arms:
        d = s[s["arm"] == arm].set_index("context")
        if len(d):
            rows.append([f"`{arm}`", str(int(d["n"].max()))] + [
                mean_std(d.loc[c, "mean"], d.loc[c, "std"]) if c in d.index else "—" for c in contexts])
    return ["arm", "seeds"] + [f"bpb@{c}" for c in contexts], rows


def degradation_rows(frame: pd.DataFrame, mode: str, arms: list[str]):
    """bpb@c - bpb@(shortest context), paired within each run: mean [95% t CI] over seeds."""
    from scipy import stats

    d = frame[frame["mode"] == mode]
    contexts = sorted(d["context"].unique())
    if len(contexts) < 2:
        return None
    c0 = contexts[0]
    rows = []
    for arm in arms:
        a = d[d["arm"] == arm].pivot_table(index="run_id", columns="context", values="bpb")
        if c0 not in a.columns or len(a.columns) < 2:
            continue
        cells = []
        for c in contexts[1:]:
            if c not in a.columns:
                cells.append("—")
                continue
            diff = (a[c] - a[c0]).dropna().to_numpy()
            if len(diff) == 0:
                cells.append("—")
            elif len(diff) == 1:
                cells.append(signed_ascii(diff[0]))
            else:
                half = stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / math.sqrt(len(diff))
                m = diff.mean()
                cells.append(f"{signed_ascii(m)} [{signed_ascii(m - half)}, {signed_ascii(m + half)}]")
        rows.append([f"`{arm}`"] + cells)
    return ["arm"] + [f"bpb@{c} − bpb@{c0} [95% CI]" for c in contexts[1:]], rows


def ranking_rows(frame: pd.DataFrame, mode: str, arms: list[str]):
    """At each context: arms by mean bpb, each against the best (Welch, Holm-adjusted across the arms)."""
    d = frame[frame["mode"] == mode]
    rows = []
    for c in sorted(d["context"].unique()):
        at = d[d["context"] == c]
        vals = {arm: at.loc[at["arm"] == arm, "bpb"].to_numpy() for arm in arms if (at["arm"] == arm).any()}
        ranked = sorted(vals, key=lambda a: (float(np.mean(vals[a])), a))
        best = ranked[0]
        tests = [welch(vals[a], vals[best]) for a in ranked[1:]]
        adj = holm([t["p_value"] for t in tests]) if tests else []
        rows.append([str(c), f"`{best}`", f"{np.mean(vals[best]):.4f}", "best", "", ""])
        for a, t, p in zip(ranked[1:], tests, adj):
            ci = "n/a" if not np.isfinite(t["ci_low"]) else \
                f"[{signed_ascii(t['ci_low'])}, {signed_ascii(t['ci_high'])}]"
            rows.append(["", f"`{a}`", f"{np.mean(vals[a]):.4f}", f"{signed_ascii(t['delta'])} {ci}",
                         p_text(t["p_value"]), p_text(p)])
    return ["context", "arm", "mean bpb", "Δ vs best [95% Welch CI]", "p (Welch)", "p (Holm)"], rows


# ---------------------------------------------------------------- the section
@section("context_length")
def context_section(ctx) -> list:
    """The context-length section with its figures and context.csv; nothing when no run has evaluations."""
    included, ab = ctx.runs, ctx.extra
    frame = load(included, ab.labels, ctx.options.tracking_uri) if len(included) else pd.DataFrame(columns=COLUMNS)
    if frame.empty:
        return []
    frame = frame.sort_values(["mode", "arm", "context", "seed", "run_id"]).reset_index(drop=True)
    arms = arm_order(frame, ab.variants, ab.labels)
    styles = variant_styles(arms)
    paths = {"bpb_vs_context": ctx.figure(context_figure(frame, arms, styles), "bpb_vs_context"),
             "bpb_vs_kv_cache_at_context": ctx.figure(kv_figure(frame, arms, styles), "bpb_vs_kv_cache_at_context")}
    ctx.write_csv(CSV, frame)
    b = [("h2", "Context length"),
         ("p", "Each run's final checkpoint scored on the validation split at each evaluation context by "
               "`python -m ablations.evaluate` (metrics `eval/<mode>/bpb` at step = context). *Non-overlapping*: "
               "disjoint windows, every token scored once, many with little context. *Sliding*: windows advance by "
               "a stride and score only their last tokens, so almost every token has nearly the full context. "
               "`+<scaling>` arms are rope runs evaluated with that `position.scaling` (no retraining). Mean over "
               "seeds; the band is ±1 std over seeds; the dotted line is the training context."),
         ("img", "val bpb against evaluation context", paths["bpb_vs_context"]),
         ("p", "Quality against the KV cache one sequence of each context needs (the numbers are the contexts): a "
               "sliding-window attention's cache stops growing at its window."),
         ("img", "val bpb against KV-cache bytes at each context", paths["bpb_vs_kv_cache_at_context"])]
    for mode in MODES:
        if not (frame["mode"] == mode).any():
            continue
        b.append(("p", f"**{MODE_TITLES[mode].capitalize()}**: val bpb, mean ± std over seeds."))
        b.append(("table", *bpb_rows(frame, mode, arms)))
        deg = degradation_rows(frame, mode, arms)
        if deg and deg[1]:
            b.append(("p", f"Change from the shortest context ({MODE_TITLES[mode]}), paired within each run: "
                           "positive = worse at the longer context."))
            b.append(("table", *deg))
        b.append(("p", f"Ranking at each context ({MODE_TITLES[mode]}): each arm against the best one."))
        b.append(("table", *ranking_rows(frame, mode, arms)))
    b.append(("p", f"Machine-readable: `{CSV}` (one row per run, mode, scaling and context)."))
    return b
