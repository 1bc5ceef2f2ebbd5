"""Does the verdict hold at the next size? Each arm's Δ over a ladder of model sizes, its trend, a held-out size
predicted (issue 37). Pure functions of a protocol's verdict table (analysis/protocol.py's `verdicts`); the report
kind that prints them is analysis/ladder_report.py.

**Points.** At every size (a rung of the ladder), an arm's Δ val bpb against the baseline and its 95% Welch CI are
the protocol's (one code path for every verdict report). N is the baseline's parameter count at that size (an arm's
own count may differ: GQA, MQA); x = log2 N, so a slope is bpb per doubling of N. var(Δ) is the square of Welch's
standard error, sd_arm²/n_arm + sd_base²/n_base.

**The trend**, fitted per arm: weighted least squares of Δ on x with weights w = 1/var(Δ) (a precise rung counts
more than a noisy one), the textbook closed form: x̄ = Σwx/Σw, ȳ = Σwy/Σw, S = Σw(x − x̄)², slope
b = Σw(x − x̄)(y − ȳ)/S. The model is var(Δ_i) = φ·var_i, the seeds' variances known up to one factor φ, estimated
from the weighted residuals as Q/(k − 2), Q = Σw(y − ȳ − b(x − x̄))², k the sizes fitted; but never below 1 (the
floor of the modified Knapp-Hartung interval of meta-regression): a fit is never more certain than its points say.
Intervals are Student's t with k − 2 degrees of freedom. The floor makes them conservative; without it (textbook
WLS) the slope test errs more often than 0.05 when each var(Δ) comes from four seeds (scripts/ladder_simulate.py;
docs/ladder.md, "Error rates", measures both):

- the slope: b ± t·sqrt(φ/S);
- the fitted Δ at x (the line's band): ȳ + b(x − x̄) ± t·sqrt(φ(1/Σw + (x − x̄)²/S));
- a measurement at x whose seeds give it variance v (the prediction interval): the same, with φ·v added under the
  root.

The arms' slopes are one family of tests: a trend is *shown* when the t-test of slope = 0, Holm-adjusted across the
arms, rejects at 0.05 (the slope intervals printed are each arm's own 95%). Otherwise *no trend shown*: not "the
effect stays" (a non-significant slope is not evidence of a flat line).

**Held out.** The largest rung is predicted from the fit over the smaller ones before its Δ is read: the prediction
interval above, and whether the measured Δ lies inside it. Every other trend number (the slope printed, the sizes
2x and 4x the largest, where the paper's direction is reached) comes from the fit over every size. The 2x and 4x
predictions are the line's band: unmeasured, a measurement there would add its own seed noise.

**Reaching the paper's direction.** The direction a paper found (better / worse / equivalent, analysis/literature.py)
is reached where the fitted Δ crosses the edge of the margin on the paper's side: −m for better, +m for worse, the
nearer of ±m for equivalent (without a margin, 0). The size N* = 2^x* where the line crosses a value c, with the
Fieller interval: every x at which c lies inside the line's band, i.e. the roots of
(ȳ − c + b u)² = t²φ(1/Σw + u²/S) in u = x − x̄. The interval is bounded exactly when the slope's interval excludes
0. N* is *not determined* when no trend is shown (by the Holm-adjusted test above, so never when the slope's own
interval includes 0).

**Decision accuracy** (DataDecide, Magnusson et al. 2025: how often a small-scale decision is the large-scale one):
per smaller size, the arms whose verdict equals their verdict at the largest size, and those whose Δ has the same
sign (which of the two is better: DataDecide's pairwise ranking).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.literature import BETTER, EQUIVALENT, WORSE
from analysis.stats import holm

CONFIDENCE = 0.95
MIN_FIT = 3  # a line has two parameters; φ needs at least one residual degree of freedom
NEXT = (2, 4)  # unmeasured sizes predicted, as multiples of the largest rung's N
NOT_DETERMINED = "not determined (no trend shown)"
AWAY = "never: the trend moves away from the paper's direction"
POINT_COLUMNS = ["arm", "size", "n_params", "x", "delta", "ci_low", "ci_high", "var", "verdict", "held_out"]


@dataclass(frozen=True)
class Trend:
    """Δ = level + slope·(x − center), fitted by weighted least squares (module docstring); x = log2 N."""

    center: float  # x̄, the weighted mean of x
    level: float  # ȳ, the weighted mean of Δ: the fitted Δ at x̄
    slope: float  # bpb per doubling of N
    sxx: float  # S = Σw(x − x̄)²
    weight: float  # Σw
    q: float  # Σw·residual²
    k: int  # sizes fitted
    confidence: float = CONFIDENCE
    floor: float = 1.0  # the least φ (0: the textbook WLS, φ = Q/(k − 2); scripts/ladder_simulate.py compares them)

    @property
    def df(self) -> int:
        return self.k - 2

    @property
    def dispersion(self) -> float:
        """φ = max(floor, Q/(k − 2))."""
        return max(self.floor, self.q / self.df)

    @property
    def t(self) -> float:
        from scipy import stats

        return float(stats.t.ppf((1 + self.confidence) / 2, self.df))

    @property
    def slope_se(self) -> float:
        return math.sqrt(self.dispersion / self.sxx)

    @property
    def slope_ci(self) -> tuple[float, float]:
        return self.slope - self.t * self.slope_se, self.slope + self.t * self.slope_se

    @property
    def trend_shown(self) -> bool:
        """The slope's interval excludes 0 (one arm alone; across arms, `trends` Holm-adjusts `p_value`)."""
        lo, hi = self.slope_ci
        return not lo <= 0.0 <= hi

    @property
    def p_value(self) -> float:
        """Two-sided t-test of slope = 0 (k − 2 df)."""
        from scipy import stats

        return float(2 * stats.t.sf(abs(self.slope) / self.slope_se, self.df))

    def at(self, x):
        """The fitted Δ at x = log2 N."""
        return self.level + self.slope * (np.asarray(x, dtype=float) - self.center)

    def se(self, x):
        """Standard error of the fitted Δ at x."""
        u = np.asarray(x, dtype=float) - self.center
        return np.sqrt(self.dispersion * (1.0 / self.weight + u**2 / self.sxx))

    def band(self, x) -> tuple:
        """The line's confidence band at x: (low, high)."""
        return self.at(x) - self.t * self.se(x), self.at(x) + self.t * self.se(x)

    def prediction(self, x: float, var: float) -> tuple[float, float, float]:
        """(Δ, low, high): the prediction interval of a measurement at x whose own variance is `var`."""
        half = self.t * math.sqrt(float(self.se(x)) ** 2 + self.dispersion * var)
        return float(self.at(x)), float(self.at(x)) - half, float(self.at(x)) + half

    def crossing(self, value: float) -> tuple[float, float, float] | None:
        """(x*, low, high): where the line equals `value`, with Fieller's interval; None when the slope's interval
        includes 0 (the interval is then unbounded)."""
        g = self.t**2 * self.dispersion
        a = self.slope**2 - g / self.sxx
        if not self.trend_shown or a <= 0:
            return None
        d = self.level - value
        root = math.sqrt(d**2 * g / self.sxx + a * g / self.weight)
        lo, hi = sorted(((-d * self.slope - root) / a, (-d * self.slope + root) / a))
        return self.center - d / self.slope, self.center + lo, self.center + hi


def fit_trend(x, delta, var, confidence: float = CONFIDENCE, floor: float = 1.0) -> Trend:
    """The weighted least-squares trend of Δ on x with weights 1/var, φ at least `floor`. ValueError with fewer
    than MIN_FIT points, fewer than two distinct x, or a variance that is not a positive number."""
    x, y, v = (np.asarray(a, dtype=float) for a in (x, delta, var))
    if len(x) < MIN_FIT or len(np.unique(x)) < 2:
        raise ValueError(f"a trend needs Δ at >= {MIN_FIT} sizes (two distinct); got {len(np.unique(x))}")
    if not (np.all(np.isfinite(v)) and np.all(v > 0)):
        raise ValueError(f"every var(Δ) must be a positive number; got {v.tolist()}")
    w = 1.0 / v
    center, level = float(np.sum(w * x) / w.sum()), float(np.sum(w * y) / w.sum())
    sxx = float(np.sum(w * (x - center) ** 2))
    slope = float(np.sum(w * (x - center) * (y - level)) / sxx)
    q = float(np.sum(w * (y - level - slope * (x - center)) ** 2))
    return Trend(center, level, slope, sxx, float(w.sum()), q, len(x), confidence, floor)


def ladder_points(table: pd.DataFrame, sizes: list) -> pd.DataFrame:
    """One row per comparison of a protocol's verdict table (analysis.protocol.verdicts): the arm, its size, N (the
    baseline's parameters there), x = log2 N, Δ with its Welch CI, var(Δ), the verdict; `held_out` marks the
    largest size (the last of `sizes`, smallest budget first)."""
    base = table[table["verdict"] == "baseline"].set_index("size")
    rows = []
    for r in table[table["verdict"] != "baseline"].itertuples():
        if r.size not in base.index:  # no baseline seeds at this size: no Δ
            continue
        b = base.loc[r.size]
        var = r.std**2 / r.n_seeds + b["std"] ** 2 / b["n_seeds"]  # Welch's standard error, squared
        rows.append([r.arm, r.size, float(b["params"]), math.log2(b["params"]), r.delta, r.ci_low, r.ci_high,
                     float(var), r.verdict, r.size == sizes[-1]])
    return pd.DataFrame(rows, columns=POINT_COLUMNS)


def _kind(verdict: str) -> str:
    return EQUIVALENT if str(verdict).startswith("equivalent") else str(verdict)


def target(expected: str, fitted: float, margin: float) -> float:
    """The Δ at which the paper's direction is reached: −m (better), +m (worse), the nearer of ±m from the fitted
    Δ `fitted` (equivalent); 0 in place of m without a margin."""
    m = margin if np.isfinite(margin) else 0.0
    if expected == BETTER:
        return -m
    if expected == WORSE:
        return m
    return m if fitted >= 0 else -m


def toward(expected: str, slope: float, fitted: float) -> bool:
    """Whether a slope moves the fitted Δ (at the largest size) toward the paper's direction."""
    if expected == BETTER:
        return slope < 0
    if expected == WORSE:
        return slope > 0
    return slope * fitted < 0  # equivalent: toward 0


def trend_words(trend: Trend, expected: str, fitted: float, shown: bool) -> str:
    """What the slope says, in words; `shown`: whether its test rejected slope = 0 (in its family)."""
    if not shown:
        return "no trend shown (slope = 0 not rejected)"
    grows = "Δ falls" if trend.slope < 0 else "Δ rises"
    if expected not in (BETTER, WORSE, EQUIVALENT):
        return f"{grows} with size"
    return f"{grows} with size, {'toward' if toward(expected, trend.slope, fitted) else 'away from'} the paper's"


def reach(trend: Trend, expected: str, margin: float, x_top: float, x_bottom: float = -math.inf,
          shown: bool | None = None) -> dict:
    """Where the fitted line reaches the paper's direction (module docstring): `status` in words (whether N* lies
    below, within or beyond the sizes measured, x_bottom to x_top) and N* with its Fieller interval (NaN when not
    determined: no trend `shown`, by default the slope's own interval including 0)."""
    fitted = float(trend.at(x_top))
    c = target(expected, fitted, margin)
    out = {"target": c, "reach_status": "", "reach_n": math.nan, "reach_low": math.nan, "reach_high": math.nan}
    if expected == EQUIVALENT and abs(fitted) < abs(c):
        return out | {"reach_status": "inside ±m at the largest size (the fitted Δ)"}
    if not (trend.trend_shown if shown is None else shown):
        return out | {"reach_status": NOT_DETERMINED}
    if not toward(expected, trend.slope, fitted):
        return out | {"reach_status": AWAY}
    x, lo, hi = trend.crossing(c)
    status = ("below the smallest size (extrapolated)" if x < x_bottom else "within the ladder" if x <= x_top
              else "beyond the largest size (unmeasured)")
    return out | {"reach_status": status, "reach_n": 2.0**x, "reach_low": 2.0**lo, "reach_high": 2.0**hi}


TREND_COLUMNS = ["arm", "expected", "sizes", "slope", "slope_low", "slope_high", "p_slope", "p_slope_holm",
                 "dispersion", "trend", "target", "reach_status", "reach_n", "reach_low", "reach_high"]
PREDICTION_COLUMNS = ["arm", "size", "n_params", "fit_sizes", "predicted", "low", "high", "interval", "measured",
                      "measured_low", "measured_high", "covered"]


def trends(points: pd.DataFrame, expected: dict, margin: float) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Per arm (in the points' order): the trend over every size and where it reaches the paper's direction
    (TREND_COLUMNS); the held-out size predicted from the smaller sizes against its measurement, and the sizes
    NEXT x the largest predicted and unmeasured (PREDICTION_COLUMNS); and the fits {arm: (all sizes, smaller
    sizes)}, None where too few sizes. An arm with fewer than MIN_FIT sizes gets NaN numbers and says so.

    The arms' slope tests are one family: a trend is shown when the slope's p-value, Holm-adjusted across the arms,
    is below 1 − CONFIDENCE (the intervals printed are each arm's own 95%)."""
    arms = list(dict.fromkeys(points["arm"]))
    usable = points[np.isfinite(points["var"]) & (points["var"] > 0)]  # a Δ from one seed has no variance to weigh
    fits = {}
    for arm in arms:
        pts = usable[usable["arm"] == arm]
        small = pts[~pts["held_out"]]
        fits[arm] = (fit_trend(pts["x"], pts["delta"], pts["var"]) if len(pts) >= MIN_FIT else None,
                     fit_trend(small["x"], small["delta"], small["var"]) if len(small) >= MIN_FIT else None)
    p_raw = [fits[a][0].p_value if fits[a][0] is not None else math.nan for a in arms]
    p_holm = dict(zip(arms, holm(p_raw)))
    trows, prows = [], []
    for arm, p in zip(arms, p_raw):
        pts = usable[usable["arm"] == arm].sort_values("x")
        small, top = pts[~pts["held_out"]], pts[pts["held_out"]]
        full, part = fits[arm]
        exp = expected.get(arm, "")
        row = dict.fromkeys(TREND_COLUMNS, math.nan) | {"arm": arm, "expected": exp, "sizes": len(pts)}
        if full is None:
            row |= {"trend": f"not fitted: Δ at {len(pts)} size(s), a trend needs {MIN_FIT}", "reach_status": ""}
        else:
            x_top = float(pts["x"].max())
            shown = bool(p_holm[arm] < 1 - CONFIDENCE)
            lo, hi = full.slope_ci
            row |= {"slope": full.slope, "slope_low": lo, "slope_high": hi, "p_slope": p, "p_slope_holm": p_holm[arm],
                    "dispersion": full.dispersion, "trend": trend_words(full, exp, float(full.at(x_top)), shown)}
            if exp in (BETTER, WORSE, EQUIVALENT):
                row |= reach(full, exp, margin, x_top, float(pts["x"].min()), shown)
            else:
                row["reach_status"] = ""
        trows.append(row)
        if len(top):
            t = top.iloc[0]
            pred = part.prediction(t["x"], t["var"]) if part is not None else (math.nan,) * 3
            covered = "n/a" if part is None else "yes" if pred[1] <= t["delta"] <= pred[2] else "no"
            prows.append([arm, t["size"], t["n_params"], len(small), *pred, "prediction interval", t["delta"],
                          t["ci_low"], t["ci_high"], covered])
        if full is not None:
            n_top = float(pts["n_params"].max())
            for k in NEXT:
                x = math.log2(k * n_top)
                lo, hi = full.band(x)
                prows.append([arm, f"{k}x the largest (unmeasured)", k * n_top, len(pts), float(full.at(x)),
                              float(lo), float(hi), "the line's band", math.nan, math.nan, math.nan, "unmeasured"])
    return pd.DataFrame(trows, columns=TREND_COLUMNS), pd.DataFrame(prows, columns=PREDICTION_COLUMNS), fits


def decision_accuracy(points: pd.DataFrame) -> pd.DataFrame:
    """Per smaller size (smallest N first): the arms measured there and at the largest size, how many have the
    largest size's verdict, and how many the sign of its Δ; then one row `all` over every smaller size."""
    top = points[points["held_out"]].set_index("arm")
    rows = []
    for size, at in points[~points["held_out"]].groupby("size", sort=False):
        at = at[at["arm"].isin(top.index)]
        same = [_kind(v) == _kind(top.loc[a, "verdict"]) for a, v in zip(at["arm"], at["verdict"])]
        sign = [np.sign(d) == np.sign(top.loc[a, "delta"]) for a, d in zip(at["arm"], at["delta"])]
        rows.append([size, float(at["n_params"].iloc[0]) if len(at) else math.nan, len(at), int(sum(same)),
                     int(sum(sign))])
    out = pd.DataFrame(rows, columns=["size", "n_params", "arms", "same_verdict", "same_sign"])
    out = out.sort_values("n_params", kind="stable").reset_index(drop=True)
    total = pd.DataFrame([["all", math.nan, out["arms"].sum(), out["same_verdict"].sum(), out["same_sign"].sum()]],
                         columns=out.columns)
    return pd.concat([out, total], ignore_index=True)
