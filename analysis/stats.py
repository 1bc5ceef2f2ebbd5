"""Per-variant statistics: mean ± std over seeds, Welch comparisons to a baseline, Pareto frontiers."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.store import order_variants

ALPHA = 0.05
# (metric, label with unit) shown per variant as mean ± std over seeds.
SUMMARY_METRICS = (
    ("final_val_loss", "val loss (nats/token)"),
    ("final_val_bpb", "val bpb (bits/byte)"),
    ("final_tokens_per_sec", "train tokens/s"),
    ("final_mfu", "MFU"),
    ("params", "params"),
    ("kv_cache_bytes_per_token", "KV cache (bytes/token)"),
    ("decode_tokens_per_sec", "decode tokens/s"),
)
# Metrics compared to the baseline variant (difference, 95% CI, Welch's t-test).
COMPARE_METRICS = ("final_val_bpb", "final_val_loss", "final_tokens_per_sec")
# Pareto frontiers: name -> (x metric, maximize x?); quality is always final_val_bpb, lower is better.
FRONTIERS = {
    "kv_cache": ("kv_cache_bytes_per_token", False),
    "train_throughput": ("final_tokens_per_sec", True),
    "decode_throughput": ("decode_tokens_per_sec", True),
}


def pareto_front(x, y, maximize_x: bool = False, maximize_y: bool = False) -> np.ndarray:
    """Boolean mask of the points not dominated by any other point (default: lower x and lower y are better).

    A point is dominated when another is at least as good in both coordinates and strictly better in one; equal
    points are therefore all on the frontier. Points with a NaN coordinate are never on it.
    """
    x = np.asarray(x, dtype=float) * (-1.0 if maximize_x else 1.0)
    y = np.asarray(y, dtype=float) * (-1.0 if maximize_y else 1.0)
    if x.shape != y.shape:
        raise ValueError(f"x and y differ in shape: {x.shape} vs {y.shape}")
    ok = np.isfinite(x) & np.isfinite(y)
    front = ok.copy()
    for i in np.flatnonzero(ok):
        better_eq = ok & (x <= x[i]) & (y <= y[i])
        strictly = (x < x[i]) | (y < y[i])
        if np.any(better_eq & strictly):
            front[i] = False
    return front


def welch(a, b, alpha: float = ALPHA) -> dict:
    """Difference mean(a) - mean(b) with a (1-alpha) Welch CI and Welch's t-test p-value.

    Needs at least two finite values in each group; otherwise the CI and p-value are NaN and the verdict says why.
    """
    from scipy import stats

    a = np.asarray([v for v in a if np.isfinite(v)], dtype=float)
    b = np.asarray([v for v in b if np.isfinite(v)], dtype=float)
    out = {"delta": math.nan, "ci_low": math.nan, "ci_high": math.nan, "p_value": math.nan, "df": math.nan,
           "n": len(a), "n_baseline": len(b)}
    if len(a) == 0 or len(b) == 0:
        out["verdict"] = "n/a (no values)"
        return out
    out["delta"] = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        out["verdict"] = "n/a (needs >= 2 seeds per variant)"
        return out
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0.0:
        out["verdict"] = "n/a (no variance)"
        return out
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(stats.t.ppf(1 - alpha / 2, df)) * se
    p = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    out.update(ci_low=out["delta"] - half, ci_high=out["delta"] + half, p_value=p, df=float(df))
    out["verdict"] = "significant" if p < alpha else "not significant"
    return out


def variant_table(included: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """One row per variant (baseline first, then by name), machine-readable:

    variant, is_baseline, n_runs, seeds, `<m>_mean`, `<m>_std`, `<m>_n` for SUMMARY_METRICS,
    `delta_<m>`, `delta_<m>_ci_low`, `delta_<m>_ci_high`, `p_<m>`, `verdict_<m>` for COMPARE_METRICS (vs baseline),
    and `pareto_<name>` for FRONTIERS (on the variant means).
    """
    variants = order_variants(included["variant"].unique(), baseline) if len(included) else []
    rows = []
    base = included[included["variant"] == baseline] if baseline else included.iloc[:0]
    for v in variants:
        runs = included[included["variant"] == v]
        seeds = sorted(int(s) for s in runs["seed"].dropna())
        row = {"variant": v, "is_baseline": v == baseline, "n_runs": len(runs),
               "seeds": ";".join(str(s) for s in seeds)}
        for m, _ in SUMMARY_METRICS:
            vals = runs[m].astype(float)
            vals = vals[np.isfinite(vals)]
            row[f"{m}_mean"] = float(vals.mean()) if len(vals) else math.nan
            row[f"{m}_std"] = float(vals.std(ddof=1)) if len(vals) >= 2 else math.nan
            row[f"{m}_n"] = int(len(vals))
        for m in COMPARE_METRICS:
            if v == baseline or baseline is None:
                res = {"delta": math.nan, "ci_low": math.nan, "ci_high": math.nan, "p_value": math.nan,
                       "verdict": "baseline" if v == baseline else "n/a (no baseline)"}
            else:
                res = welch(runs[m].astype(float), base[m].astype(float))
            row[f"delta_{m}"] = res["delta"]
            row[f"delta_{m}_ci_low"] = res["ci_low"]
            row[f"delta_{m}_ci_high"] = res["ci_high"]
            row[f"p_{m}"] = res["p_value"]
            row[f"verdict_{m}"] = res["verdict"]
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    for name, (xm, maximize) in FRONTIERS.items():
        table[f"pareto_{name}"] = pareto_front(table[f"{xm}_mean"], table["final_val_bpb_mean"],
                                               maximize_x=maximize)
    return table
