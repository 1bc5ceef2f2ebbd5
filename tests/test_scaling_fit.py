"""The scaling fitter and compute multipliers (analysis/scaling.py) on data drawn from known laws, and the report's
scaling section on a small MLflow store holding such a ladder.

Tolerances for the noisy recovery (21 points: 7 compute values over 4 decades x 3 seeds, Gaussian noise sd 0.01
nats on losses 1.9-3.8): |E - E*| <= 0.05, |alpha - alpha*| <= 0.03, |ln A - ln A*| <= 0.8. Measured over 30 noise
draws the largest errors were 0.024, 0.011 and 0.32 (ln A inherits alpha's error times ln C ~ 35: A is the least
determined of the three, which is why the fit works in a centred parametrisation).
"""
import math

import numpy as np
import pandas as pd
import pytest

from analysis import report as report_mod
from analysis.ablation import scaling_fact
from analysis.notebook import prepare
from analysis.scaling import (ScalingFit, arm_of, bootstrap_multiplier, compute_multiplier, fit_scaling_law,
                              scaling_table)

E_TRUE, ALPHA_TRUE = 1.8, 0.3
A_TRUE = 2.0 * 1e13**ALPHA_TRUE  # loss excess of 2 nats at 1e13 FLOPs
LADDER = np.logspace(13, 17, 7)


def law(c, e=E_TRUE, a=A_TRUE, alpha=ALPHA_TRUE):
    return e + a * np.asarray(c, float) ** -alpha


@pytest.mark.parametrize("e,a,alpha", [(E_TRUE, A_TRUE, ALPHA_TRUE), (0.0, 50.0, 0.08), (1.0, 1e15, 1.0)])
def test_noiseless_law_is_recovered_exactly(e, a, alpha):
    c = np.logspace(12, 18, 6)
    fit = fit_scaling_law(c, law(c, e, a, alpha))
    assert fit.E == pytest.approx(e, abs=1e-6)
    assert fit.alpha == pytest.approx(alpha, rel=1e-6)
    assert fit.log_A == pytest.approx(math.log(a), abs=1e-5)
    np.testing.assert_allclose(fit.predict(c), law(c, e, a, alpha), rtol=1e-7)


def test_noisy_law_is_recovered_within_tolerance():
    c = np.repeat(LADDER, 3)
    for seed in range(10):
        y = law(c) + np.random.default_rng(seed).normal(0.0, 0.01, len(c))
        fit = fit_scaling_law(c, y)
        assert abs(fit.E - E_TRUE) <= 0.05, (seed, fit)
        assert abs(fit.alpha - ALPHA_TRUE) <= 0.03, (seed, fit)
        assert abs(fit.log_A - math.log(A_TRUE)) <= 0.8, (seed, fit)
        assert fit.n == 21 and fit.n_levels == 7


def test_parameter_at_a_bound_is_flagged_not_identifiable():
    c = np.logspace(12, 18, 6)
    assert fit_scaling_law(c, law(c)).at_bound == ()  # E = 1.8 inside (0, min loss): determined
    pinned = fit_scaling_law(c, law(c, 0.0, 50.0, 0.08))  # a pure power law: the optimum wants E <= 0
    assert pinned.at_bound == ("E at bound 0",) and pinned.E == 0.0 and not pinned.identifiable
    # losses that stop falling (the last rung is worse): the best E would exceed the lowest loss, its upper bound
    flat = fit_scaling_law([1e12, 1e13, 1e14], [3.0, 2.5, 2.55])
    assert "E at bound 2.5" in flat.at_bound and flat.E == 2.5
    table, _ = scaling_table(pd.DataFrame({"arm": ["b"] * 6 + ["x"] * 6, "seed": 0,
                                           "compute": np.tile(c, 2),
                                           "final_val_loss": np.r_[law(c, 0.0, 50.0, 0.08), law(c)]}), "b")
    b, x = table.iloc[0], table.iloc[1]
    assert b["not_identifiable"] == "E at bound 0" and x["not_identifiable"] == ""
    assert math.isnan(x["multiplier"])  # no multiplier against a law the data do not determine
    from analysis.document import fit_param

    assert fit_param(b, "E") == "not identifiable (E at bound 0)" and fit_param(b, "A").startswith("not identifiable")
    assert fit_param(x, "E") == f"{x['E']:.3g}" and x["E"] == float(f"{x['E']:.4g}")  # rounded to 4 digits


def test_rounded_fit_draws_the_printed_numbers():
    fit = ScalingFit(E=5.28e-20, log_A=3.123456789, alpha=0.0739712345, log_c_ref=1.0, rss=0.1, n=3, n_levels=3)
    r = fit.rounded()
    assert (r.E, r.alpha, r.log_A) == (5.28e-20, 0.07397, 3.12346)
    other = ScalingFit(E=5.2e-20 + 1e-30, log_A=3.1234567, alpha=0.07397123, log_c_ref=1.0, rss=0.1, n=3, n_levels=3)
    assert other.rounded().alpha == r.alpha and other.rounded().log_A == r.log_A  # last-digit CPU noise vanishes


def test_fit_needs_three_compute_values():
    with pytest.raises(ValueError, match=">= 3 distinct compute values; got 2"):
        fit_scaling_law([1e12, 1e12, 1e13, 1e13], [3.0, 3.1, 2.5, 2.6])


def test_compute_multiplier_known_answer():
    # an arm that is k times as compute-efficient: L_arm(C) = L_base(k C); its multiplier is k at every C
    k = 4.0
    base = fit_scaling_law(LADDER, law(LADDER))
    arm_c = np.array([1e14, 3e15, 1e17])
    np.testing.assert_allclose(compute_multiplier(base, law(k * arm_c), arm_c), k, rtol=1e-6)
    np.testing.assert_allclose(compute_multiplier(base, law(arm_c / 2), arm_c), 0.5, rtol=1e-6)
    # a loss the baseline's law never reaches (below E): infinite multiplier
    assert compute_multiplier(base, E_TRUE - 0.01, 1e15) == np.inf
    fixed = ScalingFit(E=1.0, log_A=math.log(100.0), alpha=0.5, log_c_ref=0.0, rss=0.0, n=3, n_levels=3)
    assert fixed.compute_for_loss(2.0) == pytest.approx(1e4)  # 1 + 100 / sqrt(C) = 2  <=>  C = 1e4


def test_bootstrap_multiplier_ci_covers_truth_and_is_seeded():
    k, c_arm = 4.0, 1e16
    rng = np.random.default_rng(0)
    base_c = np.repeat(LADDER, 3)
    base_y = law(base_c) + rng.normal(0, 0.01, len(base_c))
    arm_y = law(k * c_arm) + rng.normal(0, 0.01, 3)
    lo, hi = bootstrap_multiplier(base_c, base_y, arm_y, c_arm, n_resamples=100, seed=1)
    assert lo < k < hi and hi / lo < 4
    assert (lo, hi) == bootstrap_multiplier(base_c, base_y, arm_y, c_arm, n_resamples=100, seed=1)


def test_arm_of_drops_ladder_overrides():
    assert arm_of("model=baby norm=rmsnorm") == "norm=rmsnorm"
    assert arm_of("model.n_layer=8 trainer.max_steps=400 mlp=swiglu") == "mlp=swiglu"
    assert arm_of("model=tiny") == "baseline"
    assert arm_of("model.n_layer=2 trainer.budget.flops=5.84e+11 position=rope optim.lr=0.006") == "position=rope"
    assert arm_of("norm=rmsnorm optim.weight_decay=0.1") == "norm=rmsnorm optim.weight_decay=0.1"


def test_scaling_table_rows():
    c = np.repeat(LADDER[:4], 2)
    pts = pd.DataFrame({"arm": ["base"] * 8 + ["fast"] * 8, "seed": [0, 1] * 8,
                        "compute": np.concatenate([c, c]),
                        "final_val_loss": np.concatenate([law(c), law(3 * c)]) + np.tile([0.002, -0.002], 8)})
    table, fits = scaling_table(pts, "base", n_resamples=50)
    assert list(table["arm"]) == ["base", "fast"] and set(fits) == {"base", "fast"}
    fast = table.set_index("arm").loc["fast"]
    assert fast["multiplier"] == pytest.approx(3.0, rel=0.05)
    assert fast["multiplier_ci_low"] <= fast["multiplier"] <= fast["multiplier_ci_high"]
    assert fast["alpha"] == pytest.approx(ALPHA_TRUE, abs=0.03)


# ------------------------------------------------------------------ the report's scaling section, end to end
K_FAST = 4.0
FLOPS_PER_TOKEN = (1e6, 1e7, 1e8, 1e9)  # four model sizes; every run trains on TOKENS tokens
TOKENS = 1e6


def make_ladder_store(uri: str, experiment: str = "ladder") -> None:
    """Two arms (baseline and norm=rmsnorm, K_FAST x as compute-efficient) x 4 sizes x 2 seeds, contract names."""
    from ablations.tracking import client as open_store  # a new store: the migrated template
    from mlflow.entities import Metric, RunTag

    client = open_store(uri)
    exp = client.create_experiment(experiment)
    t0 = 1_700_000_000_000
    for size, fpt in enumerate(FLOPS_PER_TOKEN):
        for arm, k in (("", 1.0), ("norm=rmsnorm", K_FAST)):
            for seed in (0, 1):
                variant = " ".join(w for w in (f"model=s{size}", arm) if w)
                loss = float(law(k * fpt * TOKENS, 1.5, 1.5 * 1e12**0.25, 0.25)) + (0.003 if seed else -0.003)
                run = client.create_run(exp, start_time=t0, run_name=f"{variant} seed={seed}",
                                        tags={"variant": variant, "seed": str(seed), "git_commit": "c0ffee",
                                              "data_fingerprint": "fp"})
                rid = run.info.run_id
                ms = [Metric("final_val_loss", loss, t0, 0), Metric("final_val_bpb", loss / math.log(2), t0, 0),
                      Metric("flops_per_token", fpt, t0, 0), Metric("params", fpt / 6, t0, 0)]
                for step in (1, 2):
                    ms += [Metric("tokens_seen", TOKENS * step / 2, t0 + step, step),
                           Metric("train/loss", loss + 0.1 / step, t0 + step, step),
                           Metric("val/loss", loss + 0.1 / step, t0 + step, step)]
                client.log_batch(rid, metrics=ms, tags=[RunTag("mlflow.runName", f"{variant} seed={seed}")])
                client.set_terminated(rid, "FINISHED", end_time=t0 + 10)
                t0 += 100


@pytest.fixture(scope="module")
def ladder_store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('ladder') / 'mlflow.db'}"
    make_ladder_store(uri)
    return uri


def test_report_scaling_section(ladder_store, tmp_path, capsys):
    out = tmp_path / "r"
    assert report_mod.main(["ladder", f"tracking_uri={ladder_store}", f"out={out}", "baseline=model=s3"]) == 0
    printed = capsys.readouterr().out
    assert "scaling: fitted 2 of 2 arm(s) over 4 compute values" in printed
    table = pd.read_csv(out / "scaling.csv").set_index("arm")
    assert list(table.index) == ["baseline", "norm=rmsnorm"]
    fast = table.loc["norm=rmsnorm"]
    assert fast["compute_top"] == pytest.approx(1e15)
    assert fast["multiplier"] == pytest.approx(K_FAST, rel=0.1)
    assert fast["multiplier_ci_low"] <= K_FAST <= fast["multiplier_ci_high"]
    assert table.loc["baseline", "alpha"] == pytest.approx(0.25, abs=0.02)
    md = (out / "index.md").read_text()
    assert "## Scaling with compute" in md and "](figures/loss_vs_compute.png)" in md
    # the one scaling section of every kind: four compute levels test a three-parameter law by one level
    assert "| `baseline` | 8 | 4 |" in md and "| 1 level(s) to spare |" in md
    assert (out / "figures" / "loss_vs_compute.png").stat().st_size > 10_000
    # same runs in, same bytes out (seeded bootstraps)
    again = scaling_fact(prepare("ladder", tracking_uri=ladder_store, baseline="model=s3"))
    assert again.table.to_csv(index=False, lineterminator="\n") == (out / "scaling.csv").read_text()


def test_report_without_a_ladder_says_why(ladder_store, tmp_path, capsys):
    out = tmp_path / "one"
    code = report_mod.main(["ladder", f"tracking_uri={ladder_store}", f"out={out}", "baseline=model=s3",
                            "filter=tags.variant LIKE 'model=s3%'"])
    assert code == 0
    assert "scaling: skipped: the baseline arm `baseline` has runs at 1 distinct" in capsys.readouterr().out
    md = (out / "index.md").read_text()
    assert "Scaling fits: skipped" in md and not (out / "scaling.csv").exists()
