"""Scaling fits L(C) = E + A * C^(-alpha) of final loss against training compute, and compute multipliers.

An *arm* is a run's `verdict.arm` tag when the run frame has one, else its variant without its ladder overrides
(model size, steps, FLOP budget, lr): `model=baby norm=rmsnorm` and `model=tiny norm=rmsnorm` are two rungs of the
arm `norm=rmsnorm`. Compute is the training FLOPs a run spent
(`run_compute`: its last `flops_seen`, i.e. `flops_per_token`, the harness's 6N + attention estimate, times the
tokens it trained on; else flops_per_token times its last `tokens_seen`).

The fit is least squares in the loss, in the parametrisation (E, log A', alpha) with A' = A * C_ref^(-alpha) and
C_ref the geometric mean of the ladder's compute: centring log C keeps log A' and alpha nearly uncorrelated (fitting
A itself at C ~ 1e15 would make it a 1e5-scale number that moves by orders of magnitude with alpha). Bounds:
0 <= E <= min(loss), 1e-3 <= alpha <= 3; several starts (a grid over alpha and E), the best kept.

Compute multiplier of an arm against the baseline, at the arm's loss L reached with compute C: the compute the
baseline's fitted law needs to reach L, divided by C (> 1: the arm gets there with less compute). When L <= E of
the baseline, the baseline never reaches L and the multiplier is infinite.

Identifiability: a parameter that ends at one of its bounds (E = 0, E = min(loss), alpha = 1e-3 or 3) is not
determined by the data (the optimum lies on or past the bound, and which point of a flat valley the optimizer stops
at differs between CPUs in the last digits: E = 5.28e-20 on one machine, 5.2e-20 on another). Such a fit is reported
as "not identifiable (E at bound 0)", its parameter set to the bound, and every number printed or plotted from a fit
is first rounded to PRINT_DIGITS significant digits, so reports regenerate byte for byte on any CPU.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

# Overrides that move a run along the compute ladder (size, steps, FLOP budget) or are re-tuned at every rung (lr)
# rather than define the architecture.
LADDER_WORD = re.compile(r"^(model|model\.(n_layer|n_head|n_embd|n_kv_head)|trainer\.max_steps|trainer\.budget\.flops"
                         r"|optim\.lr)=")
ALPHA_STARTS = (0.05, 0.2, 0.5, 1.2)
E_START_FRACTIONS = (0.0, 0.5, 0.9)
ALPHA_BOUNDS = (1e-3, 3.0)
MIN_LEVELS = 3  # three parameters: at least three distinct compute values
PRINT_DIGITS = 4  # significant digits of every fitted number a report prints, writes or plots
BOUND_TOL = 1e-6  # relative distance to a bound that counts as "at the bound"


def round_sig(v: float, digits: int = PRINT_DIGITS) -> float:
    """`v` rounded to `digits` significant digits (inf and NaN unchanged)."""
    return float(f"{v:.{digits}g}") if np.isfinite(v) else float(v)


@dataclass(frozen=True)
class ScalingFit:
    E: float
    log_A: float  # natural log of A in the original units (A itself may overflow a float for large alpha)
    alpha: float
    log_c_ref: float  # centring used for the fit (geometric mean of the compute values)
    rss: float
    n: int
    n_levels: int
    at_bound: tuple = ()  # e.g. ("E at bound 0",): parameters the data do not determine

    @property
    def identifiable(self) -> bool:
        return not self.at_bound

    def rounded(self) -> "ScalingFit":
        """The fit as printed: E, alpha and log A at PRINT_DIGITS significant digits (what figures draw)."""
        return ScalingFit(round_sig(self.E), round_sig(self.log_A, PRINT_DIGITS + 2), round_sig(self.alpha),
                          self.log_c_ref, round_sig(self.rss), self.n, self.n_levels, self.at_bound)

    @property
    def A(self) -> float:
        return math.exp(self.log_A)

    def predict(self, compute) -> np.ndarray:
        """Fitted loss at `compute` (FLOPs)."""
        logc = np.log(np.asarray(compute, dtype=float))
        return self.E + np.exp(self.log_A - self.alpha * logc)

    def compute_for_loss(self, loss) -> np.ndarray:
        """Compute at which the fitted law reaches `loss`; inf where loss <= E (never reached)."""
        loss = np.asarray(loss, dtype=float)
        excess = loss - self.E
        with np.errstate(divide="ignore", invalid="ignore"):
            logc = (self.log_A - np.log(np.where(excess > 0, excess, np.nan))) / self.alpha
        return np.where(excess > 0, np.exp(logc), np.inf)


def fit_scaling_law(compute, loss, start: ScalingFit | None = None) -> ScalingFit:
    """Least-squares fit of L(C) = E + A * C^(-alpha) (see the module docstring). Raises ValueError with fewer than
    three distinct positive compute values. `start`: one warm start (a fit of similar data) instead of the grid."""
    from scipy.optimize import least_squares

    c = np.asarray(compute, dtype=float)
    y = np.asarray(loss, dtype=float)
    ok = np.isfinite(c) & np.isfinite(y) & (c > 0)
    c, y = c[ok], y[ok]
    levels = len(np.unique(c))
    if levels < MIN_LEVELS:
        raise ValueError(f"a scaling fit needs losses at >= {MIN_LEVELS} distinct compute values; got {levels}")
    log_c_ref = float(np.mean(np.log(c)))
    x = np.log(c) - log_c_ref  # centred log compute
    y_min = float(y.min())

    def residuals(theta):
        e, log_a, alpha = theta
        return e + np.exp(log_a - alpha * x) - y

    lower = [0.0, -50.0, ALPHA_BOUNDS[0]]
    upper = [max(y_min, 1e-12), 50.0, ALPHA_BOUNDS[1]]
    if start is not None:
        starts = [(min(start.E, upper[0]), start.log_A - start.alpha * log_c_ref, start.alpha)]
    else:
        starts = []
        for alpha0 in ALPHA_STARTS:
            for frac in E_START_FRACTIONS:
                e0 = frac * y_min  # log A' from the mean of log(y - E) + alpha x at this (E, alpha)
                starts.append((e0, float(np.clip(np.mean(np.log(y - e0 + 1e-12) + alpha0 * x), -49, 49)), alpha0))
    best = None
    for theta0 in starts:
        res = least_squares(residuals, theta0, bounds=(lower, upper), method="trf",
                            x_scale=[max(y_min, 1e-3), 1.0, 0.1], xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=2000)
        if best is None or res.cost < best.cost:
            best = res
    e, log_a, alpha = (float(v) for v in best.x)
    at_bound = []
    for name, v, lo, hi in (("E", e, lower[0], upper[0]), ("alpha", alpha, lower[2], upper[2])):
        tol = BOUND_TOL * max(abs(hi - lo), 1e-12)
        if v - lo <= tol or hi - v <= tol:
            edge = lo if v - lo <= tol else hi
            at_bound.append(f"{name} at bound {edge:.4g}")
            if name == "E":
                e = float(edge)
            else:
                alpha = float(edge)
    return ScalingFit(E=e, log_A=log_a + alpha * log_c_ref, alpha=alpha, log_c_ref=log_c_ref,
                      rss=float(2 * best.cost), n=len(y), n_levels=levels, at_bound=tuple(at_bound))


def compute_multiplier(baseline_fit: ScalingFit, arm_loss, arm_compute) -> np.ndarray:
    """Compute the baseline needs to reach `arm_loss` (by its fitted law) divided by `arm_compute`, the compute the
    arm spent to get there; inf where the baseline's law never reaches that loss (arm_loss <= E)."""
    return baseline_fit.compute_for_loss(arm_loss) / np.asarray(arm_compute, dtype=float)


def bootstrap_baseline_fits(base_compute, base_loss, n_resamples: int = 200, seed: int = 0) -> list[ScalingFit]:
    """The baseline's law refitted on `n_resamples` resamples of its runs: with replacement within each compute
    level (every rung keeps its size), warm-started from the fit of all runs. Shared by every arm's CI."""
    rng = np.random.default_rng(seed)
    base_compute = np.asarray(base_compute, dtype=float)
    base_loss = np.asarray(base_loss, dtype=float)
    rungs = [np.flatnonzero(base_compute == c) for c in np.unique(base_compute)]
    full = fit_scaling_law(base_compute, base_loss)
    fits = []
    for _ in range(n_resamples):
        idx = np.concatenate([rng.choice(r, size=len(r), replace=True) for r in rungs])
        fits.append(fit_scaling_law(base_compute[idx], base_loss[idx], start=full))
    return fits


def bootstrap_multiplier(base_compute, base_loss, arm_loss, arm_compute: float, n_resamples: int = 200,
                         confidence: float = 0.95, seed: int = 0, base_fits: list | None = None) -> tuple[float, float]:
    """Percentile bootstrap CI of the compute multiplier over seeds: in resample i the baseline's law is refitted
    on a resample of its runs (`bootstrap_baseline_fits`, or `base_fits` already made so) and the arm's seeds at
    `arm_compute` are resampled and averaged (their own random stream, seeded by `seed`). Quantiles without
    interpolation (an infinite multiplier stays one)."""
    fits = base_fits if base_fits is not None else bootstrap_baseline_fits(base_compute, base_loss, n_resamples,
                                                                             seed)
    rng = np.random.default_rng([seed, 1])
    arm_loss = np.asarray([v for v in arm_loss if np.isfinite(v)], dtype=float)
    out = np.empty(len(fits))
    for i, fit in enumerate(fits):
        loss = rng.choice(arm_loss, size=len(arm_loss), replace=True).mean()
        out[i] = compute_multiplier(fit, loss, arm_compute)
    lo, hi = np.quantile(out, [(1 - confidence) / 2, (1 + confidence) / 2], method="inverted_cdf")
    return float(lo), float(hi)


def arm_of(variant: str) -> str:
    """The variant without its ladder overrides (model size / steps); `baseline` when nothing else is left."""
    words = [w for w in str(variant).split() if not LADDER_WORD.match(w)]
    return " ".join(words) or "baseline"


def rung_of(variant: str) -> str:
    """The variant's ladder overrides (model size / steps), the rest being its arm (`arm_of`)."""
    return " ".join(w for w in str(variant).split() if LADDER_WORD.match(w))


def run_compute(runs: pd.DataFrame) -> pd.Series:
    """Training FLOPs each run spent (the one rule of every report): its `flops_seen` at the last step (the harness
    logs tokens_seen x flops_per_token as it trains: the budget actually spent), else flops_per_token x its last
    `tokens_seen` (runs from before flops_seen was logged); NaN when neither is recorded. Index: the frame's."""
    fallback = runs["flops_per_token"].astype(float) * runs["tokens_seen"].astype(float)
    seen = runs["flops_seen"].astype(float)
    return seen.where(np.isfinite(seen), fallback).rename("compute")


def scaling_table(points: pd.DataFrame, baseline_arm: str, metric: str = "final_val_loss",
                  n_resamples: int = 200, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """Fits and multipliers from `points` (columns arm, seed, compute, <metric>).

    Returns (table, fits): one row per arm with its fit (NaN with < 3 compute levels), which parameters are at a bound
    (`not_identifiable`), its largest compute and mean loss there, and the compute multiplier against the baseline
    arm at that point with a bootstrap CI over seeds (NaN when the baseline's fit is not identifiable); fitted
    numbers rounded to PRINT_DIGITS significant digits;
    `fits` maps arm -> ScalingFit for the arms that could be fitted.
    """
    fits = {}
    for arm, part in points.groupby("arm", sort=True):
        if part["compute"].nunique() >= MIN_LEVELS:
            fits[arm] = fit_scaling_law(part["compute"], part[metric])
    base_fit = fits.get(baseline_arm)
    if base_fit is not None and not base_fit.identifiable:  # a law the data do not determine gives no multipliers
        base_fit = None
    base = points[points["arm"] == baseline_arm]
    base_fits = bootstrap_baseline_fits(base["compute"], base[metric], n_resamples, seed) \
        if base_fit is not None and points["arm"].nunique() > 1 else None
    rows = []
    arms = [baseline_arm] + sorted(a for a in points["arm"].unique() if a != baseline_arm)
    for arm in arms:
        part = points[points["arm"] == arm]
        top = float(part["compute"].max())
        at_top = part.loc[part["compute"] == top, metric].astype(float)
        f = fits.get(arm)
        row = {"arm": arm, "is_baseline": arm == baseline_arm, "n_runs": len(part),
               "n_levels": int(part["compute"].nunique()), "E": f.E if f else math.nan,
               "A": f.A if f else math.nan, "alpha": f.alpha if f else math.nan,
               "rss": f.rss if f else math.nan, "not_identifiable": "; ".join(f.at_bound) if f else "",
               "compute_top": top, "loss_top": float(at_top.mean()),
               "multiplier": math.nan, "multiplier_ci_low": math.nan, "multiplier_ci_high": math.nan}
        if base_fit is not None and arm != baseline_arm:
            row["multiplier"] = float(compute_multiplier(base_fit, at_top.mean(), top))
            row["multiplier_ci_low"], row["multiplier_ci_high"] = bootstrap_multiplier(
                base["compute"], base[metric], at_top, top, n_resamples=n_resamples, seed=seed, base_fits=base_fits)
        rows.append({k: round_sig(v) if k in FITTED else v for k, v in row.items()})
    return pd.DataFrame(rows), fits


FITTED = ("E", "A", "alpha", "rss", "multiplier", "multiplier_ci_low", "multiplier_ci_high")  # rounded in the table


METRIC = "final_val_loss"  # what every report's scaling fit reads


@dataclass
class Scaling:
    """A report's scaling fact: one row per run (arm, seed, compute, final_val_loss), the fits, the per-arm table;
    `ok` False (no table, no fits) when the baseline arm has too few compute levels, `summary` saying why."""

    ok: bool
    summary: str  # one line: what was fitted, or why not
    points: pd.DataFrame
    table: pd.DataFrame = field(default_factory=pd.DataFrame)
    fits: dict = field(default_factory=dict)


def scaling_of(runs: pd.DataFrame, baseline_arm: str, too_few: str) -> Scaling:
    """Fit every arm of a report's runs (analysis/runs.py: arm, size, seed, compute, final_val_loss; compute NaN
    where a run recorded none) when the baseline arm has >= MIN_LEVELS compute values. `too_few`: the kind's sentence
    for the skip, with {arm}, {levels} and {needed} (the pages are committed and regenerate byte for byte)."""
    points = runs[["arm", "size", "seed", "compute", METRIC]].reset_index(drop=True)
    missing = int((~np.isfinite(points["compute"].astype(float))).sum())
    points = points[np.isfinite(points["compute"].astype(float))].reset_index(drop=True)
    levels = points.loc[points["arm"] == baseline_arm, "compute"].nunique()
    if levels < MIN_LEVELS:
        why = "skipped: " + too_few.format(arm=baseline_arm, levels=levels, needed=MIN_LEVELS)
        if missing:
            why += f"; {missing} run(s) record neither flops_seen nor flops_per_token and tokens_seen"
        return Scaling(False, why, points)
    table, fits = scaling_table(points, baseline_arm, METRIC)
    return Scaling(True, f"fitted {len(fits)} of {len(table)} arm(s) over {points['compute'].nunique()} compute "
                         "values", points, table, fits)
