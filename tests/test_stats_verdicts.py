"""Holm, TOST, bootstrap CIs and the verdict rule (analysis/stats.py, analysis/verdict.py) against outside answers.

Sources of the typed numbers:
- Holm: the worked example of the Wikipedia article "Holm–Bonferroni method" (four hypotheses, alpha = 0.05,
  p = 0.01, 0.04, 0.03, 0.005: hypotheses 1 and 4 rejected, 2 and 3 not); adjusted p-values worked by hand from
  Holm (1979)'s rule as written by Wright (1992, Biometrics 48:1005), p~(i) = max_{j<=i} min(1, (m-j+1) p(j)).
  Second set: the 15 p-values of the Neuhaus et al. trial in Benjamini & Hochberg (1995, JRSS-B 57:289), Section 4.
- TOST: NCSS's "Two-Sample T-Test for Equivalence" example (yields of two processes, bounds ±110, alpha = 0.025),
  with the Welch results as NCSS prints them and as TOSTER checks them (Lakens/TOSTER, tests/testthat/test-NCSS1.R):
  df 19.169, SE 53.618547, difference -8.1153846, 95% CI [-120.27336, 104.04259], one-sided p 0.03628 (lower
  bound) and 0.02002 (upper bound).
"""
import math

import numpy as np
import pandas as pd
import pytest

from analysis.stats import bootstrap_ci, holm, tost, tost_from_stats, welch
from analysis.verdict import (BETTER, INCONCLUSIVE, WORSE, Margin, add_verdicts, compare_family, compare_pairs,
                              equivalent_label, resolve_margin, verdict)


# ------------------------------------------------------------------ Holm
def test_holm_wikipedia_example():
    p = [0.01, 0.04, 0.03, 0.005]  # H1..H4, typed from the article
    adj = holm(p)
    # by hand: sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.06
    np.testing.assert_allclose(adj, [0.03, 0.06, 0.06, 0.02], rtol=1e-12)
    # the article's decisions at alpha = 0.05: H1 and H4 rejected, H2 and H3 not
    assert (adj < 0.05).tolist() == [True, False, False, True]


def test_holm_benjamini_hochberg_neuhaus_p_values():
    p = [0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459, 0.3240, 0.4262, 0.5719, 0.6528,
         0.7590, 1.0000]
    # by hand, (m - i + 1) p(i) with m = 15, then the running maximum (twice it matters: 0.2682 and 0.2752 -> 0.278)
    expected = [0.0015, 0.0056, 0.0247, 0.114, 0.2211, 0.278, 0.278, 0.278, 0.3213, 1, 1, 1, 1, 1, 1]
    np.testing.assert_allclose(holm(p), expected, rtol=1e-9)
    # Holm rejects the three smallest at 0.05 (0.0095 > 0.05 / 12)
    assert int((holm(p) < 0.05).sum()) == 3


def test_holm_order_nan_and_bad_input():
    # input order is kept, NaNs are not hypotheses (m counts the finite ones)
    adj = holm([0.04, math.nan, 0.01])
    assert math.isnan(adj[1])
    np.testing.assert_allclose(adj[[0, 2]], [0.04, 0.02])
    assert holm([]).shape == (0,)
    with pytest.raises(ValueError, match="1.5"):
        holm([0.1, 1.5])


# ------------------------------------------------------------------ TOST
YIELD_A = [452, 874, 554, 447, 356, 754, 558, 574, 664, 682, 547, 435, 245]
YIELD_B = [546, 547, 774, 465, 459, 665, 467, 365, 589, 534, 456, 651, 654, 665, 546, 537]


def test_tost_ncss_example_welch():
    r = tost(YIELD_A, YIELD_B, margin=110, alpha=0.025)
    assert r["df"] == pytest.approx(19.169, abs=5e-4)
    assert r["se"] == pytest.approx(53.618547, abs=1e-6)
    assert r["delta"] == pytest.approx(-8.1153846, abs=1e-7)
    # the (1 - 2 alpha) = 95% CI at alpha 0.025
    assert r["ci_low"] == pytest.approx(-120.27336, abs=1e-5)
    assert r["ci_high"] == pytest.approx(104.04259, abs=1e-5)
    assert r["p_lower"] == pytest.approx(0.03628, abs=5e-6)
    assert r["p_upper"] == pytest.approx(0.02002, abs=5e-6)
    assert r["p_value"] == pytest.approx(0.03628, abs=5e-6)  # the larger one-sided p


def test_tost_is_symmetric_in_the_sign_of_the_difference():
    # swapping the groups swaps the two one-sided tests; a "one side only" TOST would not survive this
    r = tost(YIELD_B, YIELD_A, margin=110, alpha=0.025)
    assert r["p_lower"] == pytest.approx(0.02002, abs=5e-6) and r["p_upper"] == pytest.approx(0.03628, abs=5e-6)
    assert r["p_value"] == pytest.approx(0.03628, abs=5e-6)


def test_tost_far_difference_is_not_equivalent_and_ci_matches_p():
    # delta = 1 with margin 0.5: the upper test can never reject, whatever the noise
    r = tost_from_stats(2.0, 0.1, 50, 1.0, 0.1, 50, margin=0.5)
    assert r["p_upper"] > 0.99 and r["p_value"] > 0.99 and r["p_lower"] < 1e-10
    # p < alpha exactly when the 90% CI is inside (-m, m): sweep the difference across the boundary
    for d in np.linspace(-0.3, 0.3, 25):
        r = tost_from_stats(d, 0.2, 10, 0.0, 0.2, 10, margin=0.25)
        inside = -0.25 < r["ci_low"] and r["ci_high"] < 0.25
        assert (r["p_value"] < 0.05) == inside, d
    with pytest.raises(ValueError, match="margin"):
        tost([1, 2], [1, 2], margin=0.0)
    assert math.isnan(tost([1.0], [1.0, 2.0], margin=1.0)["p_value"])


# ------------------------------------------------------------------ bootstrap
def test_bootstrap_ci_coverage_of_a_normal_mean():
    rng = np.random.default_rng(1)
    reps, n, mu = 400, 40, 3.0
    hits = 0
    widths = []
    for i in range(reps):
        x = rng.normal(mu, 2.0, n)
        lo, hi = bootstrap_ci(x, n_resamples=2000, seed=i)
        hits += lo <= mu <= hi
        widths.append(hi - lo)
    coverage = hits / reps
    # nominal 95% (percentile bootstrap of a mean runs slightly under: ~0.94 at n = 40); 400 reps: SE ~ 0.011
    assert 0.915 <= coverage <= 0.975, coverage
    # and the width is about the normal-theory 2 * 1.96 * sigma / sqrt(n) = 1.24
    assert np.mean(widths) == pytest.approx(2 * 1.96 * 2.0 / math.sqrt(n), rel=0.06)


def test_bootstrap_ci_difference_is_seeded_and_centred():
    a, b = np.arange(10.0), np.arange(10.0) + 5.0
    lo, hi = bootstrap_ci(a, b, seed=3)
    assert (lo, hi) == bootstrap_ci(a, b, seed=3)
    assert lo < -5.0 < hi and hi < 0  # mean(a) - mean(b) = -5
    assert all(math.isnan(v) for v in bootstrap_ci([], [1.0]))


# ------------------------------------------------------------------ the verdict rule
def test_verdict_rule_on_constructed_cases():
    m = 0.02
    eq = equivalent_label(m)
    assert eq == "equivalent within ±0.02"
    assert verdict(0.001, 0.30, -0.1, m) == BETTER
    assert verdict(0.001, 0.30, +0.1, m) == WORSE
    assert verdict(0.40, 0.01, 0.001, m) == eq
    assert verdict(0.001, 0.01, -0.005, m) == eq  # significant but smaller than the margin: equivalent
    assert verdict(0.40, 0.30, 0.01, m) == INCONCLUSIVE  # never "no difference" from a large p
    assert verdict(math.nan, math.nan, 0.0, m) == INCONCLUSIVE
    assert verdict(0.05, 0.05, -1.0, m) == INCONCLUSIVE  # p must be < alpha


def _seeds(mean, spread=0.01, n=5):
    # symmetric around the mean with sample std = spread
    z = np.array([-1.2649110640673518, -0.6324555320336759, 0.0, 0.6324555320336759, 1.2649110640673518])[:n]
    return mean + spread * z


def test_compare_family_each_verdict_and_holm_across_arms():
    base = _seeds(2.0)
    arms = {"better": _seeds(1.95), "worse": _seeds(2.05), "same": _seeds(2.0005),
            "noisy": 2.0 + 0.2 * np.array([-1.0, 1.0, 0.5, -0.5, 0.0])}
    fam = compare_family(arms, base, margin=0.02).set_index("arm")
    assert fam.loc["better", "verdict"] == BETTER and fam.loc["worse", "verdict"] == WORSE
    assert fam.loc["same", "verdict"] == "equivalent within ±0.02"
    assert fam.loc["noisy", "verdict"] == INCONCLUSIVE
    np.testing.assert_allclose(fam["p_holm"], holm(fam["p_welch"]))
    np.testing.assert_allclose(fam["p_tost_holm"], holm(fam["p_tost"]))
    # Holm matters: an arm significant alone (p ~ 0.025) is not once 4 arms share the family (4 p > 0.05)
    base3, arm3 = _seeds(2.0, n=3), _seeds(2.0, n=3) + 0.018
    alone = compare_family({"a": arm3}, base3, margin=0.001).iloc[0]
    assert 0.0125 < alone["p_welch"] < 0.05 and alone["verdict"] == WORSE
    crowd = compare_family({"a": arm3, "b": base3 + 1e-9, "c": base3 - 1e-9, "d": base3 + 2e-9}, base3,
                           margin=0.001).set_index("arm")
    assert crowd.loc["a", "p_holm"] > 0.05 and crowd.loc["a", "verdict"] == INCONCLUSIVE


def test_margin_is_never_derived_from_the_data():
    m = resolve_margin(None, ["0.02", "0.02"], ["why", "why"])
    assert (m.value, m.reason, m.preset) == (0.02, "why", True) and "fixed before the runs" in m.source
    none = resolve_margin(None, [None, None])
    assert math.isnan(none.value) and "no equivalence is tested" in none.source
    given = resolve_margin(0.05, ["0.02"])
    assert given.value == 0.05 and not given.preset and "not recorded before the runs" in given.source
    with pytest.raises(ValueError, match="margin="):
        resolve_margin(-1.0)
    with pytest.raises(ValueError, match="2 different margins"):
        resolve_margin(None, ["0.02", "0.03"])
    assert Margin(0.05, "x").wide(3.0) and not Margin(0.02, "x").wide(3.0)  # 1% of 3.0 = 0.03


def test_welch_ci_matches_the_ncss_worked_example():
    # two-sided 95% Welch CI = the (1 - 2 * 0.025) TOST interval NCSS prints for these data
    r = welch(YIELD_A, YIELD_B)
    assert r["ci_low"] == pytest.approx(-120.27336, abs=1e-5)
    assert r["ci_high"] == pytest.approx(104.04259, abs=1e-5)
    assert r["df"] == pytest.approx(19.169, abs=5e-4)
    row = compare_pairs({"k": (YIELD_A, YIELD_B)}, 110.0).iloc[0]
    assert (row["ci_low"], row["ci_high"]) == (r["ci_low"], r["ci_high"])


def test_add_verdicts_on_a_table():
    included = pd.DataFrame({"variant": ["b"] * 3 + ["x"] * 3, "final_val_bpb": [2.0, 2.01, 1.99, 1.5, 1.51, 1.49]})
    table = pd.DataFrame({"variant": ["b", "x"], "is_baseline": [True, False]})
    out = add_verdicts(table, included, "b", Margin(0.01, "given"))
    assert out["verdict"].tolist() == ["baseline", BETTER]
    assert out.loc[1, "p_holm_final_val_bpb"] < 0.05 and out.loc[1, "margin"] == pytest.approx(0.01)
    # no margin: equivalence cannot be claimed, a difference still can
    out = add_verdicts(table, included, "b", resolve_margin(None))
    assert math.isnan(out.loc[1, "p_tost_final_val_bpb"]) and out.loc[1, "verdict"] == BETTER
    out = add_verdicts(table, included.iloc[2:], "b", Margin(0.01, "given"))
    assert out.loc[1, "verdict"] == INCONCLUSIVE  # one baseline seed: no Welch test either


def test_welch_signature_still_works():
    r = welch([1.0, 1.2, 1.1], [2.0, 2.1, 2.2])
    assert set(r) >= {"delta", "ci_low", "ci_high", "p_value", "verdict"}
