"""Power of the verdicts' tests, for planning seeds: the two-sided Welch test (noncentral t, Welch-Satterthwaite
degrees of freedom) and TOST within a margin (integrated over the standard error's chi-square distribution), the
smallest number of seeds that reaches a power, and the upper confidence bound of a seed sd.

Used by the seed planner (sweeps/plan.py) before a study and by the known-results report (what an undecided
comparison would take) after it; checked against Monte Carlo of the report's own tests and Cohen's (1988) table in
tests/test_plan.py.
"""
from __future__ import annotations

import math

SD_UPPER = 0.8  # the one-sided confidence of the seed spread's upper bound


def welch_df(sd_a: float, sd_b: float, n_a: int, n_b: int) -> float:
    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    return (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))


def power_difference(delta: float, sd_a: float, sd_b: float, n_a: int, n_b: int, alpha: float) -> float:
    """P(two-sided Welch test at level alpha rejects) when the true difference is `delta`: noncentral t."""
    from scipy import stats

    se = math.sqrt(sd_a**2 / n_a + sd_b**2 / n_b)
    df = welch_df(sd_a, sd_b, n_a, n_b)
    tc = stats.t.ppf(1 - alpha / 2, df)
    ncp = delta / se
    return float(stats.nct.sf(tc, df, ncp) + stats.nct.cdf(-tc, df, ncp))


def power_tost(delta: float, margin: float, sd_a: float, sd_b: float, n_a: int, n_b: int, alpha: float) -> float:
    """P(TOST at level alpha shows |difference| < margin) when the true difference is `delta`.

    TOST rejects when |d| < margin - t_c * se_hat (t_c the 1 - alpha quantile). d ~ N(delta, se^2) and
    se_hat^2 ~ se^2 chi2_df / df independently, so the power is E[Phi((b - delta)/se) - Phi((-b - delta)/se)] with
    b = max(margin - t_c se_hat, 0), integrated over chi2_df by quadrature."""
    from scipy import integrate, stats

    se = math.sqrt(sd_a**2 / n_a + sd_b**2 / n_b)
    df = welch_df(sd_a, sd_b, n_a, n_b)
    tc = stats.t.ppf(1 - alpha, df)
    x_max = df * (margin / (tc * se)) ** 2  # chi2 values above this leave no acceptance region
    # the integrand is evaluated thousands of times per plan: Phi and the chi2_df density written with math's erfc
    # and lgamma (the same values as scipy.stats.norm.cdf and chi2.pdf, without their per-call argument handling)
    log_norm = (df / 2) * math.log(2.0) + math.lgamma(df / 2)

    def phi(z):
        return 0.5 * math.erfc(-z / math.sqrt(2.0))

    def inner(x):
        if x <= 0.0:  # quadrature never evaluates the end point; the density there is 0 or an integrable pole
            return 0.0
        b = margin - tc * se * math.sqrt(x / df)
        density = math.exp((df / 2 - 1) * math.log(x) - x / 2 - log_norm)
        return (phi((b - delta) / se) - phi((-b - delta) / se)) * density

    val, _ = integrate.quad(inner, 0.0, x_max, limit=200)
    return float(min(max(val, 0.0), 1.0))


def seeds_needed(power_fn, target: float, max_seeds: int) -> int | None:
    """The smallest n in 2..max_seeds with power_fn(n) >= target; None when even max_seeds is not enough."""
    for n in range(2, max_seeds + 1):
        if power_fn(n) >= target:
            return n
    return None


def sd_upper(sd: float, df: int, confidence: float = SD_UPPER) -> float:
    """One-sided upper confidence bound of a normal standard deviation estimated with `df` degrees of freedom."""
    from scipy import stats

    return float(sd * math.sqrt(df / stats.chi2.ppf(1 - confidence, df))) if df >= 1 else math.nan
