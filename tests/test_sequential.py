"""Group-sequential verdicts (analysis/sequential.py) against known answers: the O'Brien-Fleming and Pocock boundary
constants of Jennison & Turnbull (2000), Tables 2.1 and 2.3 (two-sided, alpha 0.05, K equally spaced looks); the
Lan-DeMets O'Brien-Fleming-type spending boundaries for K = 5 (alpha 0.05 two-sided: 4.877, 3.357, 2.680, 2.290, 2.031;
Reboussin et al. 2000, as gsDesign and ldbounds print them); a one-look design is the fixed-n test; Welch and TOST
p-values against scipy and analysis.stats; the family-wise error of the one family under the global and mixed
partial nulls, and planted errors (a normal boundary against a small-n t, a nominal test at every look) above it."""
from __future__ import annotations

import re

import numpy as np
import pytest

from modules.errors import AblationsError
from analysis import sequential as q

# Jennison & Turnbull (2000) Table 2.1 (Pocock, C_P) and Table 2.3 (O'Brien & Fleming, C_B): two-sided alpha 0.05
POCOCK = {2: 2.178, 3: 2.289, 4: 2.361, 5: 2.413}
OBRIEN_FLEMING = {2: 1.977, 3: 2.004, 4: 2.024, 5: 2.040}


def _equal(K):
    return tuple((k + 1) / K for k in range(K))


@pytest.mark.parametrize("K", [2, 3, 4, 5])
def test_the_classical_boundaries_of_the_tables_cross_with_probability_alpha(K):
    # the tabled constants are rounded to 3 decimals: d(alpha)/dC ~ -0.15 here, so 0.0005 moves alpha by < 1e-4
    pocock = q.crossing([POCOCK[K]] * K, _equal(K), sides=2)
    obf = q.crossing([OBRIEN_FLEMING[K] * np.sqrt(K / (k + 1)) for k in range(K)], _equal(K), sides=2)
    assert pocock.sum() == pytest.approx(0.05, abs=1e-4)
    assert obf.sum() == pytest.approx(0.05, abs=1e-4)


def test_lan_demets_obrien_fleming_boundaries_as_published():
    got = q.boundaries(_equal(5), 0.05, "obrien-fleming", 2)
    assert np.round(got, 3).tolist() == [4.877, 3.357, 2.680, 2.290, 2.031]
    # the spent error is what the spending function says, look by look
    spent = q.crossing(got, _equal(5), sides=2)
    want = np.diff(2 * q.spent("obrien-fleming", _equal(5), 0.025), prepend=0.0)
    assert spent == pytest.approx(want, rel=1e-6, abs=1e-12)


def test_pocock_spending_is_nearly_flat_and_spends_alpha():
    got = q.boundaries(_equal(5), 0.05, "pocock", 2)
    assert max(got) - min(got) < 0.06 and got[0] > got[-1]
    assert q.crossing(got, _equal(5), sides=2).sum() == pytest.approx(0.05, abs=1e-9)
    one = q.boundaries((0.25, 0.5, 1.0), 0.025, "obrien-fleming", 1)  # unequal looks, one-sided
    assert q.crossing(one, (0.25, 0.5, 1.0), sides=1).sum() == pytest.approx(0.025, abs=1e-9)


def test_a_one_look_design_is_the_fixed_n_test():
    d = q.Design(first=6, batch=3, cap=6, spending="obrien-fleming", alpha=0.05)
    assert d.looks() == (6,)
    two, one = q.level_table(d, 3)
    assert two[1:, 0] == pytest.approx([0.05, 0.025, 0.05 / 3], rel=1e-12)
    assert one[1:, 0] == pytest.approx([0.05, 0.025, 0.05 / 3], rel=1e-12)
    # one comparison: the sequential verdicts are the fixed Welch / TOST tests at alpha, study by study
    r = q.simulate(d, [0.0], sd=0.01, margin=0.02, studies=4000, seed=5)
    assert (r["false"] == r["fixed_false"]).all() and (r["codes"] == r["fixed_codes"]).all()
    assert r["false"].mean() == pytest.approx(0.05, abs=0.012)


def test_welch_and_tost_p_values_at_each_look_match_scipy_and_the_reports_tost():
    from scipy import stats

    from analysis.stats import tost

    rng = np.random.default_rng(0)
    arms, base = rng.normal(0.01, 0.01, (3, 2, 9)), rng.normal(0.0, 0.02, (3, 9))
    delta, p_diff, p_equiv = q.welch_looks(arms, base, (3, 9), margin=0.02)
    for s in range(3):
        for i in range(2):
            for k, n in enumerate((3, 9)):
                assert p_diff[s, i, k] == pytest.approx(
                    stats.ttest_ind(arms[s, i, :n], base[s, :n], equal_var=False).pvalue, rel=1e-9)
                assert p_equiv[s, i, k] == pytest.approx(tost(arms[s, i, :n], base[s, :n], 0.02)["p_value"], rel=1e-9)


def test_alpha_is_recycled_only_from_a_comparison_with_both_hypotheses_rejected():
    d = q.Design(first=4, batch=4, cap=4, spending="obrien-fleming", alpha=0.05)
    two, one = q.level_table(d, 2)  # one look: alpha / r
    # comparison 0 shows a difference and equivalence (0 < |delta| < margin): it holds no true hypothesis, so its
    # 0.025 goes to comparison 1, whose p = 0.04 then passes at 0.05
    both = q.decide([[[0.001], [0.04]]], [[[0.001], [0.9]]], two, one)
    assert both.reject_diff.tolist() == [[True, True]]
    # comparison 0 shows only a difference: its equivalence null may be true, it keeps its share: 0.04 > 0.025
    one_only = q.decide([[[0.001], [0.04]]], [[[0.9], [0.9]]], two, one)
    assert one_only.reject_diff.tolist() == [[True, False]]


def test_a_decided_comparison_stops_and_the_baseline_grows_with_the_largest_open_one():
    d = q.Design(first=3, batch=3, cap=9, spending="pocock", alpha=0.05)
    r = q.simulate(d, [-0.2, 0.0], sd=0.01, margin=0.02, studies=200, seed=1)
    assert (r["seeds"][:, 0] == 3).mean() > 0.9  # 20 sd away: decided at the first look
    assert (r["baseline_seeds"] == r["seeds"].max(1)).all()
    assert set(np.unique(r["seeds"])) <= {3, 6, 9}


@pytest.mark.parametrize("spending", q.SPENDING)
def test_the_family_wise_error_stays_below_alpha_where_todays_fixed_rule_does_not(spending):
    d = q.Design(first=3, batch=3, cap=12, spending=spending, alpha=0.05)
    for deltas in ([0.0] * 7, [0.0, 0.0, 0.0, 0.02, -0.02, 0.02, 0.0]):  # global null; mixed partial null
        r = q.simulate(d, deltas, sd=0.0117, margin=0.02, studies=10_000, seed=7)
        assert q.rate(r["false"])[2] <= 0.055
    assert q.rate(r["fixed_false"])[1] > 0.05  # two Holm families, each at alpha: over alpha in the mixed null


def test_planted_errors_push_the_family_wise_error_above_alpha():
    d = q.Design(first=3, batch=3, cap=12, spending="obrien-fleming", alpha=0.05)
    normal = q.simulate(d, [0.0] * 7, sd=0.0117, margin=0.02, studies=10_000, seed=7, reference="normal")
    assert q.rate(normal["false"])[1] > 0.05  # the z boundary against Welch's t at 3 seeds (measured ~0.11)
    rng = np.random.default_rng(3)
    arms, base = rng.normal(0, 0.0117, (10_000, 7, 12)), rng.normal(0, 0.0117, (10_000, 12))
    _, p_diff, p_equiv = q.welch_looks(arms, base, d.looks(), 0.02)
    nominal = np.array([[0.05 / max(r, 1)] * len(d.looks()) for r in range(8)])  # alpha / r at every look
    repeated = q.decide(p_diff, p_equiv, nominal, nominal)
    assert q.rate(repeated.reject_diff.any(1))[1] > 0.05


@pytest.mark.parametrize("raw,key", [
    ({"first": 4, "batch": 2, "cap": 3}, "cap=3: below the first batch"),
    ({"first": 3, "batch": 3, "cap": 12, "spending": "haybittle"}, "spending='haybittle'"),
    ({"first": 3, "batch": 3, "cap": 12, "alpha": 1.5}, "alpha=1.5"),
    ({"first": 3, "batch": 3, "cap": 12, "alpha": 0}, "alpha=0"),
    ({"first": 1, "batch": 3, "cap": 12}, "first=1"),
    ({"first": 3, "batch": 3, "cap": 12, "looks": 4}, "looks: unknown key"),
])
def test_bad_designs_are_one_line(raw, key):
    with pytest.raises(AblationsError) as e:
        q.design_from(raw)
    assert key in str(e.value) and "\n" not in str(e.value)


def test_the_planner_simulates_a_protocols_design(capsys):
    from sweeps.plan import main

    design = "+verdict.sequential={first: 3, batch: 3, cap: 9, spending: pocock}"
    assert main(["verdict=second-study", "sd=0.01", design, "simulate=true", "studies=2000"]) == 0
    out = capsys.readouterr().out
    assert "looks 3, 6, 9" in out and "pocock" in out and "mixed partial null" in out and "power: better" in out
    fwer = re.findall(r"^global null \(every Δ 0\)\s+([0-9.]+) \[", out, re.M)
    assert len(fwer) == 1 and 0 < float(fwer[0]) < 0.07
    assert main(["verdict=second-study", "sd=0.01", "simulate=true"]) == 2  # no design: one line
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "verdict.sequential" in err[0]


def test_the_report_prints_the_recorded_design():
    import pandas as pd

    from analysis.protocol import sequential_design

    tags = {"verdict.sequential.first": "3", "verdict.sequential.batch": "1", "verdict.sequential.cap": "12",
            "verdict.sequential.spending": "obrien-fleming", "verdict.sequential.alpha": "0.05"}
    text = sequential_design(pd.DataFrame([tags, tags]))
    assert "a look at 3 seeds per arm, then every 1 more, to a cap of 12; obrien-fleming" in text and "0.05" in text
    assert sequential_design(pd.DataFrame([{"verdict.margin": "0.02"}])) == ""  # a fixed seed count: no line
