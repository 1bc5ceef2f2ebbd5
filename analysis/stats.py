"""Per-variant statistics: mean ± std over seeds, Welch comparisons to a baseline, Pareto frontiers; Holm's
step-down adjustment, TOST equivalence tests and percentile bootstrap CIs (used by analysis/verdict.py)."""
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
    ("final_tokens_per_sec", "train tokens/s (unpaired)"),
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


def holm(pvalues) -> np.ndarray:
    """Holm's (1979) step-down adjusted p-values, in the input order.

    Sort the m p-values ascending; the i-th smallest (i = 1..m) is multiplied by (m - i + 1); a running maximum
    keeps the adjusted values in the same order as the raw ones (the step-down: once a hypothesis is kept, every
    larger p is kept too); capped at 1. Rejecting where adjusted p < alpha controls the family-wise error rate at
    alpha. NaN entries are not hypotheses: they stay NaN and do not count in m.
    """
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, math.nan)
    ok = np.flatnonzero(np.isfinite(p))
    if np.any((p[ok] < 0) | (p[ok] > 1)):
        raise ValueError(f"p-values must lie in [0, 1]; got {p[ok][(p[ok] < 0) | (p[ok] > 1)].tolist()}")
    m = len(ok)
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    scaled = p[order] * (m - np.arange(m))  # (m - i + 1) for i = 1..m
    out[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return out


def tost_from_stats(mean_a: float, sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int, margin: float,
                    alpha: float = ALPHA) -> dict:
    """Equivalence of delta = mean_a - mean_b within ±margin by two one-sided Welch t-tests (Schuirmann 1987).

    Lower test H0: delta <= -margin (t = (d + margin) / se, p = P(T >= t)); upper test H0: delta >= +margin
    (t = (d - margin) / se, p = P(T <= t)); T is Student's t with Welch-Satterthwaite df. The TOST p-value is the
    larger of the two; p < alpha exactly when the (1 - 2 alpha) CI (90% at alpha = 0.05) lies inside
    (-margin, +margin). sd_a, sd_b are sample standard deviations (ddof=1). A NaN margin gives NaN p-values.
    """
    from scipy import stats

    if not margin > 0 and not math.isnan(margin):
        raise ValueError(f"equivalence margin must be > 0, got {margin}")
    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    se = math.sqrt(va + vb)
    delta = float(mean_a - mean_b)
    out = {"delta": delta, "margin": float(margin), "se": se, "df": math.nan, "t_lower": math.nan,
           "p_lower": math.nan, "t_upper": math.nan, "p_upper": math.nan, "p_value": math.nan,
           "ci_low": math.nan, "ci_high": math.nan, "confidence": 1 - 2 * alpha}
    if se == 0.0 or n_a < 2 or n_b < 2:
        return out
    df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
    half = float(stats.t.ppf(1 - alpha, df)) * se
    out.update(df=float(df), ci_low=delta - half, ci_high=delta + half)
    if math.isnan(margin):
        return out
    t_lower, t_upper = (delta + margin) / se, (delta - margin) / se
    p_lower, p_upper = float(stats.t.sf(t_lower, df)), float(stats.t.cdf(t_upper, df))
    out.update(t_lower=t_lower, p_lower=p_lower, t_upper=t_upper, p_upper=p_upper, p_value=max(p_lower, p_upper))
    return out


def tost(a, b, margin: float, alpha: float = ALPHA) -> dict:
    """TOST (two one-sided Welch tests) for mean(a) - mean(b) within ±margin, on raw values (NaNs dropped).

    Returns the dict of `tost_from_stats`: `p_value` (the TOST p), `p_lower`, `p_upper`, the (1 - 2 alpha) CI
    `ci_low`, `ci_high` (90% at the default alpha), `delta`, `se`, `df`. Fewer than two values in a group or no
    variance: NaN p-values.
    """
    a = np.asarray([v for v in a if np.isfinite(v)], dtype=float)
    b = np.asarray([v for v in b if np.isfinite(v)], dtype=float)
    if len(a) == 0 or len(b) == 0:
        return tost_from_stats(math.nan, 0.0, max(len(a), 1), math.nan, 0.0, max(len(b), 1), margin, alpha)
    sd_a = float(a.std(ddof=1)) if len(a) > 1 else 0.0
    sd_b = float(b.std(ddof=1)) if len(b) > 1 else 0.0
    return tost_from_stats(float(a.mean()), sd_a, len(a), float(b.mean()), sd_b, len(b), margin, alpha)


def paired_t(a, b, alpha: float = ALPHA) -> dict:
    """Paired difference of two arms that share their seeds (same seed, same data order): `a`, `b` are Series indexed
    by seed. Over the seeds both have: the mean of a - b with its (1 - alpha) t interval (n - 1 df), and Pearson's
    correlation of a and b (what pairing exploits: var(a - b) = var a + var b - 2 cov(a, b)). NaN with < 2 pairs."""
    from scipy import stats

    pairs = pd.concat([pd.Series(a, dtype=float), pd.Series(b, dtype=float)], axis=1, join="inner").dropna()
    d = (pairs.iloc[:, 0] - pairs.iloc[:, 1]).to_numpy()
    out = {"delta": float(d.mean()) if len(d) else math.nan, "ci_low": math.nan, "ci_high": math.nan,
           "n": len(d), "correlation": math.nan}
    if len(d) < 2:
        return out
    half = float(stats.t.ppf(1 - alpha / 2, len(d) - 1)) * float(d.std(ddof=1)) / math.sqrt(len(d))
    out.update(ci_low=out["delta"] - half, ci_high=out["delta"] + half)
    if pairs.iloc[:, 0].std() > 0 and pairs.iloc[:, 1].std() > 0:
        out["correlation"] = float(np.corrcoef(pairs.iloc[:, 0], pairs.iloc[:, 1])[0, 1])
    return out


def bootstrap_ci(a, b=None, confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0,
                 statistic=np.mean) -> tuple[float, float]:
    """Percentile bootstrap CI (Efron) of statistic(a), or of statistic(a) - statistic(b) when b is given.

    Each group is resampled with replacement on its own (seeds of one variant are exchangeable, the two groups are
    independent); the CI is the (1-c)/2 and (1+c)/2 quantiles of the resampled statistic. Seeded: the same inputs
    give the same CI. `statistic` must reduce along the last axis (np.mean, np.median). With few values (< ~10
    seeds) the percentile bootstrap is too narrow: it cannot see variation that the seeds did not show.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    rng = np.random.default_rng(seed)

    def resampled(x):
        x = np.asarray([v for v in x if np.isfinite(v)], dtype=float)
        if len(x) == 0:
            return None
        idx = rng.integers(0, len(x), size=(n_resamples, len(x)))  # (R, n)
        return statistic(x[idx], axis=-1)  # (R,)

    sa = resampled(a)
    if sa is None:
        return math.nan, math.nan
    if b is not None:
        sb = resampled(b)
        if sb is None:
            return math.nan, math.nan
        sa = sa - sb
    lo, hi = np.quantile(sa, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)
