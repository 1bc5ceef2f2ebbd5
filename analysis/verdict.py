"""One verdict per arm against the baseline that never overclaims: better, worse, equivalent within ±m, inconclusive.

The family is every non-baseline arm of one report, compared with the baseline on one loss metric (lower is
better). For each arm:

  * difference test: Welch's two-sided t-test of arm - baseline, p-values Holm-adjusted across the family;
  * equivalence test: TOST (two one-sided Welch tests) against ±m, p-values Holm-adjusted across the family too
    (each equivalence claim is a rejection as well, so it pays the same multiplicity price);
  * bootstrap: a percentile bootstrap 95% CI of the difference (resampling seeds), shown alongside, never used to
    decide (with 3 seeds it is too narrow to decide on).

Rule (`verdict`), at alpha = 0.05:
  1. Holm-adjusted TOST p < alpha  -> "equivalent within ±m": the 90% CI of the difference lies inside ±m, so any
     difference is smaller than the smallest one of interest -- even when the difference test is significant too.
  2. else Holm-adjusted Welch p < alpha -> "better" (arm's mean loss lower) or "worse" (higher).
  3. else "inconclusive": neither a difference nor an equivalence was shown. A non-significant p is never read as
     "no difference".
Fewer than two seeds on either side, or no margin, leave the tests undefined: "inconclusive".

Margin m: `--margin` when given (in the metric's units), else one sample standard deviation (ddof=1) of the
baseline's seeds on that metric -- an arm within one seed-to-seed std of the baseline is called equivalent. Without
at least two baseline seeds (or with zero spread) there is no default margin and no equivalence can be claimed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.stats import ALPHA, bootstrap_ci, holm, tost, welch

VERDICT_METRIC = "final_val_bpb"  # lower is better; bpb compares across tokenizers, nats/token does not
BETTER, WORSE, INCONCLUSIVE = "better", "worse", "inconclusive"
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def equivalent_label(margin: float) -> str:
    return f"equivalent within ±{margin:.3g}"


def verdict(p_diff_holm: float, p_tost_holm: float, delta: float, margin: float, alpha: float = ALPHA) -> str:
    """Exactly one of "better", "worse", "equivalent within ±m", "inconclusive" (lower loss is better); the rule is
    in the module docstring. NaN p-values (too few seeds, no margin) never support a claim."""
    if np.isfinite(p_tost_holm) and p_tost_holm < alpha:
        return equivalent_label(margin)
    if np.isfinite(p_diff_holm) and p_diff_holm < alpha:
        return BETTER if delta < 0 else WORSE
    return INCONCLUSIVE


@dataclass(frozen=True)
class Margin:
    value: float  # NaN when no default could be derived
    source: str  # how it was chosen, in words (printed and written into the report)


def default_margin(baseline_values, metric: str = VERDICT_METRIC) -> Margin:
    """One sample std (ddof=1) of the baseline's seeds; NaN (with the reason) with < 2 seeds or zero spread."""
    v = np.asarray([x for x in baseline_values if np.isfinite(x)], dtype=float)
    if len(v) < 2:
        return Margin(math.nan, f"none: the baseline has {len(v)} seed(s) of {metric}, a default margin needs >= 2")
    sd = float(v.std(ddof=1))
    if sd == 0.0:
        return Margin(math.nan, f"none: the baseline's {len(v)} seeds of {metric} are identical (zero spread)")
    return Margin(sd, f"one baseline seed std (ddof=1) of {metric} over {len(v)} seeds")


def choose_margin(baseline_values, margin: float | None, metric: str = VERDICT_METRIC) -> Margin:
    """`margin` when given (must be a positive number), else `default_margin`."""
    if margin is None:
        return default_margin(baseline_values, metric)
    if not (np.isfinite(margin) and margin > 0):
        raise ValueError(f"--margin must be a positive number in {metric} units, got {margin}")
    return Margin(float(margin), f"given (--margin {margin:g})")


def compare_family(arms: dict, baseline_values, margin: float, alpha: float = ALPHA) -> pd.DataFrame:
    """One row per arm (in the given order): delta, Welch p, Holm-adjusted p, TOST p (raw and Holm-adjusted), the
    (1 - 2 alpha) TOST CI, a bootstrap 95% CI of the difference, and the verdict. `arms` maps name -> values."""
    rows = []
    for name, values in arms.items():
        w = welch(values, baseline_values, alpha)
        t = tost(values, baseline_values, margin, alpha)
        lo, hi = bootstrap_ci(values, baseline_values, 1 - alpha, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED)
        rows.append({"arm": name, "delta": w["delta"], "p_welch": w["p_value"], "p_tost": t["p_value"],
                     "tost_ci_low": t["ci_low"], "tost_ci_high": t["ci_high"], "boot_ci_low": lo, "boot_ci_high": hi})
    out = pd.DataFrame(rows, columns=["arm", "delta", "p_welch", "p_tost", "tost_ci_low", "tost_ci_high",
                                      "boot_ci_low", "boot_ci_high"])
    out.insert(3, "p_holm", holm(out["p_welch"]) if len(out) else [])
    out.insert(5, "p_tost_holm", holm(out["p_tost"]) if len(out) else [])
    out["margin"] = margin
    out["verdict"] = [verdict(r.p_holm, r.p_tost_holm, r.delta, margin, alpha) for r in out.itertuples()]
    return out


def add_verdicts(table: pd.DataFrame, included: pd.DataFrame, baseline: str | None, margin: float | None = None,
                 metric: str = VERDICT_METRIC, alpha: float = ALPHA) -> tuple[pd.DataFrame, Margin]:
    """The per-variant table (from stats.variant_table) with columns `margin`, `p_holm_<metric>`,
    `p_tost_<metric>`, `p_tost_holm_<metric>`, `tost_ci_low/high_<metric>`, `boot_ci_low/high_<metric>` and
    `verdict` (baseline row: "baseline"); also returns the margin used and how it was chosen."""
    table = table.copy()
    cols = [f"p_holm_{metric}", f"p_tost_{metric}", f"p_tost_holm_{metric}", f"tost_ci_low_{metric}",
            f"tost_ci_high_{metric}", f"boot_ci_low_{metric}", f"boot_ci_high_{metric}"]
    base = included.loc[included["variant"] == baseline, metric].astype(float) if baseline else \
        pd.Series([], dtype=float)
    m = choose_margin(base, margin, metric) if baseline else Margin(math.nan, "none: no baseline")
    table["margin"] = m.value
    for c in cols:
        table[c] = math.nan
    table["verdict"] = "baseline" if baseline else "n/a (no baseline)"
    if table.empty or not baseline:
        return table, m
    arms = {v: included.loc[included["variant"] == v, metric].astype(float) for v in table["variant"] if v != baseline}
    fam = compare_family(arms, base, m.value, alpha).set_index("arm")
    rows = table["variant"] != baseline
    for c, src in zip(cols, ["p_holm", "p_tost", "p_tost_holm", "tost_ci_low", "tost_ci_high", "boot_ci_low",
                             "boot_ci_high"]):
        table.loc[rows, c] = table.loc[rows, "variant"].map(fam[src]).to_numpy(dtype=float)
    table.loc[rows, "verdict"] = table.loc[rows, "variant"].map(fam["verdict"]).to_numpy()
    return table, m
