"""The seed planner (sweeps/plan.py; its power functions: analysis/power.py): its power against Monte Carlo
simulation of the very tests the report runs (Welch, TOST), against Cohen's (1988) table 2.4.1 of two-sample t-test
sample sizes (power 0.80, two-sided alpha 0.05: d = 0.5 -> 64, 0.8 -> 26, 1.0 -> 17 per group), the Holm family
sizes, the pilot's spreads, the CLI."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from analysis.power import power_difference, power_tost, sd_upper, seeds_needed
from analysis.stats import tost_from_stats
from sweeps.plan import family_size, pilot_frame, plan_seeds, spread_of
from sweeps.protocol import ProtocolArm, ProtocolSpec, Size

sys.path.insert(0, str(Path(__file__).parent))

SIMS = 20_000


def _mc_welch(delta, sd_a, sd_b, n, alpha, seed):
    """Fraction of simulated experiments in which the two-sided Welch test rejects at `alpha`."""
    from scipy import stats

    rng = np.random.default_rng(seed)
    a = rng.normal(delta, sd_a, size=(SIMS, n))
    b = rng.normal(0.0, sd_b, size=(SIMS, n))
    return float(np.mean(stats.ttest_ind(a, b, axis=1, equal_var=False).pvalue < alpha))


def _mc_tost(delta, margin, sd_a, sd_b, n, alpha, seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(delta, sd_a, size=(SIMS, n))
    b = rng.normal(0.0, sd_b, size=(SIMS, n))
    ma, mb, sa, sb = a.mean(1), b.mean(1), a.std(1, ddof=1), b.std(1, ddof=1)
    ps = [tost_from_stats(ma[i], sa[i], n, mb[i], sb[i], n, margin, alpha)["p_value"] for i in range(4000)]
    return float(np.mean(np.asarray(ps) < alpha))


@pytest.mark.parametrize("delta,sd_a,sd_b,n,alpha", [
    (0.02, 0.01, 0.01, 4, 0.05), (0.02, 0.015, 0.01, 6, 0.05 / 3), (0.03, 0.02, 0.01, 5, 0.05 / 10),
    (0.01, 0.01, 0.01, 12, 0.05)])
def test_difference_power_matches_simulation(delta, sd_a, sd_b, n, alpha):
    exact = power_difference(delta, sd_a, sd_b, n, n, alpha)
    assert 0.1 < exact < 0.99  # informative cases, not saturated
    assert exact == pytest.approx(_mc_welch(delta, sd_a, sd_b, n, alpha, 1), abs=0.05)


@pytest.mark.parametrize("delta,margin,sd_a,sd_b,n,alpha", [
    (0.0, 0.02, 0.01, 0.01, 5, 0.05), (0.0, 0.02, 0.012, 0.008, 8, 0.05 / 4), (0.005, 0.02, 0.01, 0.01, 7, 0.05),
    (0.0, 0.03, 0.02, 0.01, 6, 0.05)])
def test_tost_power_matches_simulation(delta, margin, sd_a, sd_b, n, alpha):
    exact = power_tost(delta, margin, sd_a, sd_b, n, n, alpha)
    assert 0.1 < exact < 0.99
    assert exact == pytest.approx(_mc_tost(delta, margin, sd_a, sd_b, n, alpha, 2), abs=0.05)


def test_sample_sizes_match_cohens_table():
    for d, n in ((0.5, 64), (0.8, 26), (1.0, 17)):
        assert seeds_needed(lambda k: power_difference(d, 1.0, 1.0, k, k, 0.05), 0.8, 200) == n
    assert seeds_needed(lambda k: power_difference(0.1, 1.0, 1.0, k, k, 0.05), 0.8, 30) is None  # > max


def test_sd_upper_bound_is_a_chi_square_bound():
    # 2 seeds (df 1): the 80% upper bound is sd * sqrt(1 / chi2_{0.2,1}) = sd / sqrt(0.0641848) = 3.947 sd
    assert sd_upper(1.0, 1) == pytest.approx(1 / math.sqrt(0.06418475), rel=1e-5)
    assert sd_upper(1.0, 100) < 1.1


def _spec(holm="study", primary_arms=(), primary_sizes=(), sd=0.01):
    arms = [ProtocolArm(name, family, ()) for name, family in
            (("base", "b"), ("rope", "pos"), ("alibi", "pos"), ("rms", "norm"))]
    sizes = [Size("s", 1e11, ()), Size("m", 3e11, ())]
    return ProtocolSpec(name="t", experiment=None, baseline="base", arms=arms, sizes=sizes, seeds=2, seeds_largest=2,
                        lr_grid=[1e-3], lr_seed=0, storage="sqlite:///x.db", overrides=[], margin=0.02,
                        margin_reason="r", holm=holm, primary_arms=primary_arms, primary_sizes=primary_sizes,
                        plan={"sd": sd, "max_seeds": 40})


def test_family_size_follows_the_declared_holm_family():
    assert family_size(_spec("study"), "rope", "m") == 6  # 3 arms x 2 sizes
    assert family_size(_spec("size"), "rope", "m") == 3
    assert family_size(_spec("arm-family"), "rope", "m") == 2  # rope, alibi
    prim = _spec("study", primary_arms=("rope", "rms"), primary_sizes=("m",))
    assert family_size(prim, "rope", "m") == 2
    assert family_size(prim, "alibi", "m") == 4  # secondary: the other 6 - 2 comparisons


def test_plan_seeds_grow_with_the_family_and_shrink_with_the_spread():
    small = plan_seeds(_spec("size", sd=0.005))
    big = plan_seeds(_spec("study", sd=0.005))
    assert set(small) == {"s", "m"} and all(big[k] >= small[k] for k in small)
    assert plan_seeds(_spec("study", sd=0.002))["m"] < big["m"]
    prim = plan_seeds(_spec("study", primary_sizes=("m",), sd=0.005))
    assert prim["s"] == 2  # no primary comparison at s: plan.secondary_seeds


@pytest.fixture(scope="module")
def pilot_store(tmp_path_factory):
    """A protocol store of test_protocol_report's design, made once: (its tracking URI, its pilot frame)."""
    from test_protocol_report import EXPERIMENT, make_store

    uri = f"sqlite:///{tmp_path_factory.mktemp('pilot')}/mlflow.db"
    make_store(uri)
    return uri, pilot_frame(EXPERIMENT, uri)


def test_pilot_spreads_from_a_protocol_store(pilot_store):
    from test_protocol_report import BPB

    uri, runs = pilot_store
    assert set(runs["verdict.stage"]) == {"seeds"}  # the lr stage is not a seed spread
    sp = spread_of(runs, "rope", "m")
    assert sp.sd == pytest.approx(float(np.std(BPB["m"]["rope"], ddof=1))) and sp.df == 2
    pooled = spread_of(runs, "rope", "xl")  # no such size: pooled over the arm's three sizes
    ss = sum(((np.array(v) - np.mean(v)) ** 2).sum() for v in (BPB[s]["rope"] for s in BPB))
    assert pooled.sd == pytest.approx(math.sqrt(ss / 6)) and pooled.df == 6


def test_cli_prints_the_plan(capsys):
    from sweeps.plan import main

    assert main(["verdict=second-study", "sd=0.01", "workers=2"]) == 0
    out = capsys.readouterr().out
    assert "margin ±0.02" in out and "size m:" in out and "core-minutes" in out
    assert main(["verdict=second-study"]) == 2  # no pilot and no sd: one line
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "plan.pilot" in err[0]


@pytest.mark.parametrize("spelling", [["sd=null"], ["--sd", "null"]])
def test_an_option_given_as_null_overrides_the_verdict_files_plan(capsys, spelling):
    """third-study's file says plan.sd: 0.008 and names no pilot: sd=null (either spelling) takes the sd away, so the
    planner asks for a seed spread, instead of planning from the file's sd as if the option had not been given."""
    from sweeps.plan import main

    assert main(["verdict=third-study"]) == 0 and "sd=0.008" in capsys.readouterr().out
    assert main(["verdict=third-study", *spelling]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "plan.pilot" in err[-1]


def test_one_pilot_arm_stands_for_every_arm(pilot_store):
    from test_protocol_report import BPB, EXPERIMENT

    from sweeps.plan import plan_rows, settings

    uri, runs = pilot_store
    spec = _spec("study", sd=None)
    spec.plan = {"pilot": EXPERIMENT, "pilot_uri": uri, "pilot_arm": "rope"}
    rows = plan_rows(spec, settings(spec), runs)
    rope_m = float(np.std(BPB["m"]["rope"], ddof=1))  # rope's own seeds at m, for the arm and the baseline alike
    assert {r["size"] for r in rows} >= {"m"}
    assert all(r["sd_arm"] == pytest.approx(rope_m) and r["sd_baseline"] == pytest.approx(rope_m)
               for r in rows if r["size"] == "m")
    spec.plan["pilot_arm"] = "nosuch"
    with pytest.raises(ValueError, match="invalid plan pilot_arm='nosuch': the pilot .* has seeds-stage runs of"):
        plan_rows(spec, settings(spec), runs)


def test_the_lr_stage_estimate_counts_each_arms_grid_and_every_lr_seed():
    from sweeps.plan import render, settings

    spec = _spec("study", sd=0.01)
    spec.lr_grid, spec.lr_seeds = [1e-3, 2e-3, 4e-3], (100, 101)
    spec.arms[1] = ProtocolArm("rope", "pos", (), (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2))
    rows = [{**r, "run_s": 60.0, "baseline_run_s": 60.0} for r in plan_rows_of(spec)]
    text = "\n".join(render(spec, settings(spec), rows))
    # per size: base, alibi, rms 3 lrs x 2 seeds = 18 runs; rope 5 x 2 = 10: 28 one-minute runs
    assert text.count("lr stage (28 runs before any extension) 28.0 core-min") == 2, text
    spec.lr_transfer_from = "s"  # searched at s only
    text = "\n".join(render(spec, settings(spec), rows))
    assert "lr stage (28 runs before any extension) 28.0" in text and "lr stage (0 runs" in text, text


def plan_rows_of(spec):
    from sweeps.plan import plan_rows, settings

    return plan_rows(spec, settings(spec), None)


def test_seeds_at_the_spreads_upper_bound_when_asked():
    from sweeps.plan import chosen

    row = {"detect": 6, "equivalence": 5, "detect_upper": 11, "equivalence_upper": 12}
    assert chosen(row, "both") == 6 and chosen(row, "both", "upper") == 12 and chosen(row, "detect", "upper") == 11
    est = plan_seeds(_spec("study", sd=0.005))
    spec = _spec("study", sd=0.005)
    spec.plan["sd_at"] = "upper"
    assert plan_seeds(spec) == est  # a given sd (plan.sd) has no confidence bound: the same seeds either way
    spec.plan["sd_at"] = "high"
    with pytest.raises(Exception, match="invalid plan sd_at='high'"):
        plan_seeds(spec)


def test_a_pilots_upper_bound_asks_for_more_seeds(pilot_store):
    from test_protocol_report import EXPERIMENT

    uri, _ = pilot_store
    spec = _spec("study", sd=None)
    spec.plan = {"pilot": EXPERIMENT, "pilot_uri": uri, "pilot_arm": "rope", "max_seeds": 200, "min_pilot_seeds": 3}
    at_estimate = plan_seeds(spec)
    spec.plan["sd_at"] = "upper"
    at_upper = plan_seeds(spec)
    assert at_upper["m"] > at_estimate["m"], (at_estimate, at_upper)


def test_a_protocol_never_plans_its_seeds_from_a_pilot_of_fewer_than_five(pilot_store):
    # the pilot store has 3 seeds per arm and size: the printed plan may show such a spread, the seed counts a
    # protocol runs may not come from it (issue 26: "from a committed pilot of >= 5 seeds, never from 2")
    from test_protocol_report import EXPERIMENT

    from sweeps.protocol import VerdictError

    uri, _ = pilot_store
    spec = _spec("study", sd=None)
    spec.plan = {"pilot": EXPERIMENT, "pilot_uri": uri, "pilot_arm": "rope"}
    with pytest.raises(VerdictError, match=r"seeds: plan: the pilot's seed spread for \w+ at \w+ rests on 3 seeds .*"
                                           r"plan.min_pilot_seeds=5: run a pilot of at least 5 seeds, or give "
                                           r"plan.sd=S"):
        plan_seeds(spec)
    spec.plan["min_pilot_seeds"] = 4  # one more than the pilot has (df 2 < 3): refused, in one line
    with pytest.raises(VerdictError, match=r"rests on 3 seeds .*plan.min_pilot_seeds=4: run a pilot of at least 4 "
                                           r"seeds") as e:
        plan_seeds(spec)
    assert "\n" not in str(e.value)
    spec.plan["min_pilot_seeds"] = 3
    assert plan_seeds(spec)  # explicitly allowed
    spec.plan["min_pilot_seeds"] = 1
    with pytest.raises(VerdictError, match="invalid plan min_pilot_seeds=1"):
        plan_seeds(spec)
