"""One verdict per arm against the baseline that never overclaims: better, worse, equivalent within ±m, inconclusive.

A family is a set of comparisons (arm - baseline on one loss metric, lower is better) whose p-values are adjusted
together; which comparisons form it is declared before the runs (the verdict config's `holm` and `primary`: by default
every primary comparison of the study). For each comparison:

  * difference test: Welch's two-sided t-test of arm - baseline, p-values Holm-adjusted across the family;
  * equivalence test: TOST (two one-sided Welch tests) against ±m, p-values Holm-adjusted across the family too
    (each equivalence claim is a rejection as well, so it pays the same multiplicity price);
  * interval: the 95% Welch (t-based, Welch-Satterthwaite df) confidence interval of the difference. With a handful
    of seeds a percentile bootstrap is too narrow (it cannot see spread the seeds did not show), so it is not used.

Rule (`verdict`), at alpha = 0.05:
  1. Holm-adjusted TOST p < alpha  -> "equivalent within ±m": the 90% CI of the difference lies inside ±m, so any
     difference is smaller than the smallest one of interest -- even when the difference test is significant too.
  2. else Holm-adjusted Welch p < alpha -> "better" (arm's mean loss lower) or "worse" (higher).
  3. else "inconclusive": neither a difference nor an equivalence was shown. A non-significant p is never read as
     "no difference".
Fewer than two seeds on either side leave the tests undefined: "inconclusive".

Margin m: the smallest effect of interest, fixed before the runs (the verdict config's `margin`, recorded on every
run as the tag `verdict.margin`), or given to the report (`margin=`, flagged as not fixed in advance). It is never
derived from the data it judges; without one no equivalence is tested. A margin wider than 1% of the baseline's
mean (WIDE_MARGIN) needs its reason printed beside it: an equivalence that only a wide margin buys is not a finding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.stats import ALPHA, holm, tost, welch

VERDICT_METRIC = "final_val_bpb"  # lower is better; bpb compares across tokenizers, nats/token does not
BETTER, WORSE, INCONCLUSIVE = "better", "worse", "inconclusive"
WIDE_MARGIN = 0.01  # a margin wider than this fraction of the baseline's mean is flagged


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
    value: float  # NaN: no margin, no equivalence test
    source: str  # where it came from, in words (printed in the report)
    reason: str = ""  # why this is the smallest effect of interest (the config's margin_reason)
    preset: bool = False  # fixed before the runs (recorded on them), not given at report time

    def wide(self, baseline_mean: float) -> bool:
        """Wider than WIDE_MARGIN of the baseline's mean: needs an argument (the reason) in the report."""
        return bool(np.isfinite(self.value) and np.isfinite(baseline_mean) and self.value > WIDE_MARGIN * baseline_mean)


def resolve_margin(given: float | None, tagged=(), reasons=(), metric: str = VERDICT_METRIC) -> Margin:
    """The margin of a report: `given` (margin=) when set, else the one value of the runs' `verdict.margin` tags,
    else none. ValueError for a bad margin= or runs that recorded different margins."""
    if given is not None:
        if not (np.isfinite(given) and given > 0):
            raise ValueError(f"margin= must be a positive number in {metric} units, got {given}")
        return Margin(float(given), f"given on the report's command line (margin={given:g}), not recorded before "
                                    "the runs")
    vals = sorted({float(v) for v in tagged if v is not None and str(v) not in ("", "nan")})
    if len(vals) > 1:
        raise ValueError(f"the runs recorded {len(vals)} different margins ({', '.join(f'{v:g}' for v in vals)}); "
                         "report one protocol, or pass margin=M")
    if not vals:
        return Margin(math.nan, "none fixed before the runs (no verdict.margin tag): no equivalence is tested")
    texts = sorted({str(r) for r in reasons if r is not None and str(r) not in ("", "nan")})
    return Margin(vals[0], "fixed before the runs (verdict.margin, recorded on every run)", "; ".join(texts), True)


def compare_pairs(pairs: dict, margin: float, alpha: float = ALPHA) -> pd.DataFrame:
    """One row per comparison key (in the given order) from `pairs` {key: (arm values, baseline values)}, all one
    Holm family: delta, its 95% Welch CI, Welch p (raw, Holm-adjusted), TOST p (raw, Holm-adjusted), the
    (1 - 2 alpha) TOST CI, the margin and the verdict."""
    rows = []
    for key, (values, baseline_values) in pairs.items():
        w = welch(values, baseline_values, alpha)
        t = tost(values, baseline_values, margin, alpha)
        rows.append({"arm": key, "delta": w["delta"], "ci_low": w["ci_low"], "ci_high": w["ci_high"],
                     "p_welch": w["p_value"], "p_tost": t["p_value"], "tost_ci_low": t["ci_low"],
                     "tost_ci_high": t["ci_high"]})
    out = pd.DataFrame(rows, columns=["arm", "delta", "ci_low", "ci_high", "p_welch", "p_tost", "tost_ci_low",
                                      "tost_ci_high"])
    out.insert(5, "p_holm", holm(out["p_welch"]) if len(out) else [])
    out.insert(7, "p_tost_holm", holm(out["p_tost"]) if len(out) else [])
    out["margin"] = margin
    out["verdict"] = [verdict(r.p_holm, r.p_tost_holm, r.delta, margin, alpha) for r in out.itertuples()]
    return out


def compare_family(arms: dict, baseline_values, margin: float, alpha: float = ALPHA) -> pd.DataFrame:
    """`compare_pairs` for arms {name: values} that share one baseline."""
    return compare_pairs({name: (values, baseline_values) for name, values in arms.items()}, margin, alpha)


def add_verdicts(table: pd.DataFrame, included: pd.DataFrame, baseline: str | None, margin: Margin,
                 metric: str = VERDICT_METRIC, alpha: float = ALPHA) -> pd.DataFrame:
    """The per-variant table (from stats.variant_table) with columns `margin`, `p_holm_<metric>`,
    `p_tost_<metric>`, `p_tost_holm_<metric>`, `tost_ci_low/high_<metric>` and `verdict` (baseline row:
    "baseline"); every non-baseline variant in one Holm family."""
    table = table.copy()
    cols = [f"p_holm_{metric}", f"p_tost_{metric}", f"p_tost_holm_{metric}", f"tost_ci_low_{metric}",
            f"tost_ci_high_{metric}"]
    table["margin"] = margin.value
    for c in cols:
        table[c] = math.nan
    table["verdict"] = "baseline" if baseline else "n/a (no baseline)"
    if table.empty or not baseline:
        return table
    base = included.loc[included["variant"] == baseline, metric].astype(float)
    arms = {v: included.loc[included["variant"] == v, metric].astype(float) for v in table["variant"] if v != baseline}
    fam = compare_family(arms, base, margin.value, alpha).set_index("arm")
    rows = table["variant"] != baseline
    for c, src in zip(cols, ["p_holm", "p_tost", "p_tost_holm", "tost_ci_low", "tost_ci_high"]):
        table.loc[rows, c] = table.loc[rows, "variant"].map(fam[src]).to_numpy(dtype=float)
    table.loc[rows, "verdict"] = table.loc[rows, "variant"].map(fam["verdict"]).to_numpy()
    return table
