"""The ladder's trend statistics (analysis/ladder.py) against answers worked here without its code:

- a four-point weighted fit worked by hand in fractions (slope 51/19, its standard error 18/19, φ = 162/19), and the
  same points at a third of the size, where φ falls below 1 and the floor holds it at 1;
- a planted trend, Δ linear in log2 N with deviations, checked against the matrix form of weighted least squares
  ((XᵀWX)⁻¹XᵀWy, another route than the module's centred sums): slope, its interval, the held-out size's prediction
  interval and whether it covers the measurement; dropping the weights moves every one of them;
- Fieller's interval for the size where the line reaches a value: at both ends the band's edge touches the value;
- decision accuracy counted by hand.
"""
import gzip
import math
import shutil
from fractions import Fraction as F

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.ladder import (AWAY, NOT_DETERMINED, decision_accuracy, fit_trend, ladder_points, reach, trends)

T2 = 4.302652729911275  # Student's t, 97.5% quantile, 2 df (a printed table gives 4.303)


def test_hand_worked_weighted_fit():
    # x = 0..3, var = (1/2, 1, 1, 1/2) -> w = (2, 1, 1, 2), Σw = 6, x̄ = 9/6 = 3/2, S = 2·9/4 + 1/4 + 1/4 + 2·9/4
    # = 19/2;
    # y = (0, 6, 3, 9): ȳ = (0 + 6 + 3 + 18)/6 = 9/2, Σw(x − x̄)(y − ȳ) = 2·(−3/2)(−9/2) + (−1/2)(3/2) + (1/2)(−3/2)
    # + 2·(3/2)(9/2) = 51/2, so b = 51/19 (unweighted: 12/5). Residuals (−9, 54, −54, 9)/19, Q = 324/19, Q/2 = 162/19
    # = φ; se(b) = sqrt(φ/S) = sqrt(324/361) = 18/19.
    tr = fit_trend([0, 1, 2, 3], [0, 6, 3, 9], [0.5, 1, 1, 0.5])
    assert tr.slope == pytest.approx(51 / 19, rel=1e-12)
    assert tr.center == pytest.approx(1.5) and tr.level == pytest.approx(4.5)
    assert tr.q == pytest.approx(324 / 19, rel=1e-12)
    assert tr.dispersion == pytest.approx(162 / 19, rel=1e-12)
    assert tr.slope_se == pytest.approx(18 / 19, rel=1e-12)
    assert tr.slope_ci[1] - tr.slope == pytest.approx(T2 * 18 / 19, rel=1e-9)
    assert not tr.trend_shown  # 51/19 ± 4.08 includes 0
    # prediction of a measurement at x = 4 with var 1/2: Δ = 9/2 + (51/19)(5/2) = 213/19;
    # var = φ(1/6 + (5/2)²/(19/2) + 1/2) = (162/19)(1/6 + 25/38 + 1/2)
    d, lo, hi = tr.prediction(4.0, 0.5)
    var = F(162, 19) * (F(1, 6) + F(25, 38) + F(1, 2))
    assert d == pytest.approx(213 / 19, rel=1e-12)
    assert hi - d == pytest.approx(T2 * math.sqrt(var), rel=1e-9) and d - lo == pytest.approx(hi - d, rel=1e-12)


def test_dispersion_is_never_below_one():
    # the same points a third of the size: residuals (−3, 18, −18, 3)/19, Q = 36/19, Q/2 = 18/19 < 1 -> φ = 1, and
    # se(b) = sqrt(1/S) = sqrt(2/19), not sqrt((18/19)/(19/2)) = 6/19
    tr = fit_trend([0, 1, 2, 3], [0, 2, 1, 3], [0.5, 1, 1, 0.5])
    assert tr.slope == pytest.approx(17 / 19, rel=1e-12)
    assert tr.q == pytest.approx(36 / 19, rel=1e-12)
    assert tr.dispersion == 1.0
    assert tr.slope_se == pytest.approx(math.sqrt(2 / 19), rel=1e-12)
    textbook = fit_trend([0, 1, 2, 3], [0, 2, 1, 3], [0.5, 1, 1, 0.5], floor=0.0)  # scripts/ladder_simulate.py's other
    assert textbook.dispersion == pytest.approx(18 / 19, rel=1e-12)
    assert textbook.slope_se == pytest.approx(6 / 19, rel=1e-12)


# A planted trend: Δ = 0.01 − 0.012·(log2 N − 15) plus deviations, at N = 2^15 .. 2^18, the held-out rung at 2^19
X = np.array([15.0, 16.0, 17.0, 18.0])
DEV = np.array([0.002, -0.012, 0.003, -0.001])  # the noisiest rung deviates most
VAR = np.array([1e-5, 1.6e-4, 2.5e-5, 1e-5])
DELTA = 0.01 - 0.012 * (X - 15) + DEV
X_OUT, VAR_OUT = 19.0, 1.2e-5
DELTA_OUT = 0.01 - 0.012 * 4 + 0.004  # the measurement at the held-out rung


def matrix_wls(x, y, var):
    """Weighted least squares through the normal equations: (β, φ·(XᵀWX)⁻¹, φ), φ = max(1, rᵀWr/(k − 2))."""
    X = np.column_stack([np.ones_like(x), x])
    W = np.diag(1.0 / var)
    inv = np.linalg.inv(X.T @ W @ X)
    beta = inv @ X.T @ W @ y
    r = y - X @ beta
    phi = max(1.0, float(r @ W @ r) / (len(x) - 2))
    return beta, phi * inv, phi


def test_planted_trend_against_the_matrix_form():
    beta, cov, phi = matrix_wls(X, DELTA, VAR)
    t = stats.t.ppf(0.975, len(X) - 2)
    tr = fit_trend(X, DELTA, VAR)
    assert tr.slope == pytest.approx(beta[1], rel=1e-10)
    assert tr.dispersion == pytest.approx(phi, rel=1e-10)
    lo, hi = tr.slope_ci
    assert lo == pytest.approx(beta[1] - t * math.sqrt(cov[1, 1]), rel=1e-9)
    assert hi == pytest.approx(beta[1] + t * math.sqrt(cov[1, 1]), rel=1e-9)
    assert tr.trend_shown  # planted −0.012 per doubling, far outside the noise
    x0 = np.array([1.0, X_OUT])
    pred = float(x0 @ beta)
    half = t * math.sqrt(float(x0 @ cov @ x0) + phi * VAR_OUT)
    d, plo, phi_ = tr.prediction(X_OUT, VAR_OUT)
    assert (d, plo, phi_) == pytest.approx((pred, pred - half, pred + half), rel=1e-9)
    assert plo <= DELTA_OUT <= phi_  # covered: the measurement is on the planted line
    assert not plo <= DELTA_OUT + 0.05 <= phi_  # a measurement 0.05 off is not


def test_dropping_the_weights_changes_the_answer():
    # the unweighted fit of the same points gives another slope and prediction: the weights matter here
    beta_w, _, _ = matrix_wls(X, DELTA, VAR)
    beta_u, _, _ = matrix_wls(X, DELTA, np.ones_like(VAR))
    tr = fit_trend(X, DELTA, VAR)
    assert abs(beta_w[1] - beta_u[1]) > 1e-3
    assert tr.slope != pytest.approx(beta_u[1], rel=1e-3)
    assert tr.prediction(X_OUT, VAR_OUT)[0] != pytest.approx(beta_u[0] + beta_u[1] * X_OUT, rel=1e-3)


def test_fieller_interval_touches_the_value_at_both_ends():
    tr = fit_trend(X, DELTA, VAR)
    beta, _, _ = matrix_wls(X, DELTA, VAR)
    c = -0.06
    x, lo, hi = tr.crossing(c)
    assert x == pytest.approx((c - beta[0]) / beta[1], rel=1e-9)  # where the line equals c
    assert lo < x < hi
    assert tr.band(lo)[0] == pytest.approx(c, abs=1e-12)  # the band's lower edge at the interval's left end ...
    assert tr.band(hi)[1] == pytest.approx(c, abs=1e-12)  # ... its upper edge at the right end (the slope is < 0)
    flat = fit_trend([0, 1, 2, 3], [0, 6, 3, 9], [0.5, 1, 1, 0.5])
    assert flat.crossing(20.0) is None


def test_reach_the_papers_direction():
    tr = fit_trend(X, DELTA, VAR)
    beta, _, _ = matrix_wls(X, DELTA, VAR)
    better = reach(tr, "better", 0.02, X.max(), X.min())  # Δ falls: −0.02 is crossed; where the line is −0.02
    assert better["reach_n"] == pytest.approx(2 ** ((-0.02 - beta[0]) / beta[1]), rel=1e-9)
    assert better["reach_low"] < better["reach_n"] < better["reach_high"]
    assert better["reach_status"] == "within the ladder"  # at log2 N ≈ 17.3 < 18
    assert reach(tr, "worse", 0.02, X.max())["reach_status"] == AWAY
    far = reach(tr, "better", 0.05, X.max())  # −0.05 is crossed past the largest size
    assert far["reach_status"].startswith("beyond") and math.log2(far["reach_n"]) > 18
    flat = fit_trend([0, 1, 2, 3], [0, 6, 3, 9], [0.5, 1, 1, 0.5])
    assert reach(flat, "better", 0.02, 3.0)["reach_status"] == NOT_DETERMINED
    assert math.isnan(reach(flat, "better", 0.02, 3.0)["reach_n"])


def table_of(deltas: dict, verdicts: dict, sd=0.01, n=4):
    """A verdict table as analysis.protocol.verdicts writes it, for sizes named by log2 N: every arm's std `sd`."""
    rows = []
    for size, per_arm in deltas.items():
        rows.append({"size": size, "arm": "baseline", "std": sd, "n_seeds": n, "params": 2.0 ** int(size[1:]),
                     "delta": math.nan, "ci_low": math.nan, "ci_high": math.nan, "verdict": "baseline"})
        for arm, d in per_arm.items():
            rows.append({"size": size, "arm": arm, "std": sd, "n_seeds": n, "params": 2.0 ** int(size[1:]),
                         "delta": d, "ci_low": d - 0.01, "ci_high": d + 0.01, "verdict": verdicts[size][arm]})
    return pd.DataFrame(rows)


def test_decision_accuracy_counted_by_hand():
    sizes = ["n15", "n16", "n17"]
    deltas = {"n15": {"a": 0.01, "b": -0.02}, "n16": {"a": -0.01, "b": -0.03}, "n17": {"a": -0.03, "b": -0.04}}
    verdicts = {"n15": {"a": "inconclusive", "b": "better"}, "n16": {"a": "equivalent within ±0.02", "b": "better"},
                "n17": {"a": "equivalent within ±0.02", "b": "better"}}
    acc = decision_accuracy(ladder_points(table_of(deltas, verdicts), sizes)).set_index("size")
    # n15: a differs (inconclusive vs equivalent), b agrees; signs: a + vs −, b − vs −
    assert acc.loc["n15", ["arms", "same_verdict", "same_sign"]].tolist() == [2, 1, 1]
    assert acc.loc["n16", ["arms", "same_verdict", "same_sign"]].tolist() == [2, 2, 2]
    assert acc.loc["all", ["arms", "same_verdict", "same_sign"]].tolist() == [4, 3, 3]


def test_a_size_without_baseline_seeds_gives_no_delta():
    table = table_of({"n15": {"a": 0.01}, "n16": {"a": 0.02}}, {"n15": {"a": "better"}, "n16": {"a": "better"}})
    table = table[~((table["size"] == "n15") & (table["arm"] == "baseline"))]
    assert ladder_points(table, ["n15", "n16"])["size"].tolist() == ["n16"]


def test_points_weigh_each_delta_by_welchs_variance_and_hold_out_the_largest():
    sizes = ["n15", "n16", "n17", "n18", "n19"]
    deltas = {s: {"a": float(d)} for s, d in zip(sizes, [*DELTA, DELTA_OUT])}
    verdicts = {s: {"a": "inconclusive"} for s in sizes}
    pts = ladder_points(table_of(deltas, verdicts, sd=0.02, n=5), sizes)
    assert pts["var"].tolist() == pytest.approx([2 * 0.02**2 / 5] * 5)  # sd_a²/n_a + sd_b²/n_b
    assert pts["x"].tolist() == [15.0, 16.0, 17.0, 18.0, 19.0]
    assert pts["held_out"].tolist() == [False, False, False, False, True]
    tr, pred, fits = trends(pts, {"a": "better"}, 0.02)
    full, part = fits["a"]
    assert part.k == 4 and full.k == 5  # the held-out size never enters its own prediction
    beta, cov, phi = matrix_wls(X, DELTA, np.full(4, 2 * 0.02**2 / 5))
    held = pred[pred["size"] == "n19"].iloc[0]
    assert held["predicted"] == pytest.approx(beta[0] + beta[1] * 19, rel=1e-9)
    assert held["covered"] == "yes"
    nxt = pred[pred["covered"] == "unmeasured"]
    assert nxt["n_params"].tolist() == [2 * 2.0**19, 4 * 2.0**19]
    assert nxt["predicted"].tolist() == pytest.approx([full.at(20.0), full.at(21.0)], rel=1e-12)


# ---------------------------------------------------------------------------------------------------- the report
# A synthetic verdict-protocol store with a planted trend: five sizes N = 2^15 .. 2^19 (the baseline's parameters),
# four seeds per arm and size, every arm's Δ linear in log2 N plus small deviations, each size with its own seed
# spread (so the weights differ). The report (kind `ladder`) must give the slope, the held-out prediction and its
# coverage that the matrix form computes here from the planted values.
PROTOCOL = "ladder-synth"
SIZES = {"w16": 15, "w24": 16, "w32": 17, "w48": 18, "w64": 19}  # name -> log2 N
SPREAD = {"w16": 0.002, "w24": 0.004, "w32": 0.001, "w48": 0.003, "w64": 0.002}  # seed spread per size
OFFSETS = np.array([-3.0, -1.0, 1.0, 3.0])  # seeds 1-4, times the spread (arms: 1.5x it)
RUN_MS = {"w16": 2000, "w24": 3000, "w32": 4000, "w48": 5000, "w64": 6000}  # each run's start to end, per size
PLANTED = {  # arm -> Δ at log2 N = 15 .. 19
    "rope": -0.03 - 0.01 * np.arange(5) + np.array([0.001, -0.004, 0.002, 0.0, 0.0]),
    "swiglu": 0.01 - 0.007 * np.arange(5) + np.array([-0.002, 0.003, -0.001, 0.001, 0.002]),
    "rmsnorm": np.array([0.002, -0.002, 0.001, -0.001, 0.0]),
}
LADDER_MARGIN = 0.02
# the n-gram floor of the data: the baselines' means 2.6 .. 2.2 (smallest first) are 0.05 .. 0.45 below the trigram
# and 0.15 above .. 0.25 below the 4-gram; every run saw 2e4 of 1e5 train tokens, 0.2 epochs
LADDER_FLOOR = {2: 2.9, 3: 2.65, 4: 2.45, 5: 2.3}


def seed_values(size: str, arm: str) -> np.ndarray:
    i = list(SIZES).index(size)
    base = 2.6 - 0.1 * i
    if arm == "baseline":
        return base + OFFSETS * SPREAD[size]
    return base + PLANTED[arm][i] + 1.5 * OFFSETS[::-1] * SPREAD[size]


def make_ladder_store(uri: str, sizes=tuple(SIZES), name: str = PROTOCOL, tokens_matched=()) -> None:
    """The planted ladder at `sizes`, as protocol and experiment `name`; the arms in `tokens_matched` tagged as
    trained at the baseline's tokens (verdict.match=tokens)."""
    from mlflow.entities import Metric, Param, RunTag
    from ablations.tracking import client as open_store  # a new store: the migrated template

    client = open_store(uri)
    exp = client.create_experiment(name)
    clock = [1_700_000_000_000]
    for size in sizes:
        n = 2 ** SIZES[size]
        for arm in ("baseline", *PLANTED):
            tags = {"verdict.protocol": name, "verdict.arm": arm, "verdict.family": arm,
                    "verdict.baseline": "baseline", "verdict.size": size, "verdict.budget_flops": f"{6 * n * 2e4:g}",
                    "verdict.margin": f"{LADDER_MARGIN:g}", "verdict.margin_reason": "a test", "verdict.holm": "size",
                    "verdict.primary": "arms=*;sizes=*", "verdict.stage": "seeds", "verdict.lr": "0.003",
                    **({"verdict.match": "tokens"} if arm in tokens_matched else {})}
            for seed, bpb in zip((1, 2, 3, 4), seed_values(size, arm)):
                clock[0] += 60_000
                r = client.create_run(exp, start_time=clock[0], run_name=f"{size} {arm} {seed}",
                                      tags=tags | {"seed": str(seed), "variant": f"{size} {arm}"})
                ms = [("final_val_bpb", bpb), ("final_val_loss", 0.7 * bpb), ("params", n), ("flops_per_token", 6 * n),
                      ("tokens_seen", 2e4), ("flops_seen", 6 * n * 2e4), ("final_tokens_per_sec", 9000.0)]
                client.log_batch(r.info.run_id, metrics=[Metric(k, float(v), clock[0] + 1000, 0) for k, v in ms],
                                 params=[Param("optim.lr", "0.003"), Param("seed", str(seed))],
                                 tags=[RunTag("git_commit", "c0ffee"), RunTag("data_fingerprint", "fp"),
                                       RunTag("tokenizer", "char"), RunTag("git_dirty", "false")])
                client.set_terminated(r.info.run_id, status="FINISHED", end_time=clock[0] + RUN_MS[size])
    from sweeps.floor import log_floor

    log_floor(uri, LADDER_FLOOR, {"kind": "ngram", "smoothing": "modified-kn", "data": "shakespeare",
                                  "tokenizer": "char", "scope": "full", "block_size": 64, "val_windows": 8,
                                  "n_train": 100_000, "n_targets": 512, "data_fingerprint": "fp"})


def planted(arm: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(log2 N, Δ, var Δ) per size, from the seed values: numpy's mean and ddof=1 variance."""
    d, v = [], []
    for size in SIZES:
        a, b = seed_values(size, arm), seed_values(size, "baseline")
        d.append(a.mean() - b.mean())
        v.append(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    return np.array(list(SIZES.values()), dtype=float), np.array(d), np.array(v)


@pytest.fixture(scope="module")
def ladder_report(tmp_path_factory):
    from analysis.report import main

    tmp = tmp_path_factory.mktemp("ladder")
    uri = f"sqlite:///{tmp}/mlflow.db"
    make_ladder_store(uri)
    out = tmp / "report"
    assert main(["ladder", PROTOCOL, f"tracking_uri={uri}", f"out={out}"]) == 0
    return uri, out


def holm3(p):
    """Holm's step-down for three p-values, by hand: the smallest x3, the next x2, the largest x1, each at least the
    one before, capped at 1; in the input order."""
    order = np.argsort(p)
    adj, run = np.empty(3), 0.0
    for rank, i in enumerate(order):
        run = max(run, (3 - rank) * p[i])
        adj[i] = min(1.0, run)
    return adj


def test_report_trend_is_the_weighted_fit_of_the_planted_deltas(ladder_report):
    _, out = ladder_report
    tr = pd.read_csv(out / "ladder_trends.csv", keep_default_na=False).set_index("arm")
    p = []
    for arm in PLANTED:
        x, d, v = planted(arm)
        beta, cov, _ = matrix_wls(x, d, v)
        half = stats.t.ppf(0.975, len(x) - 2) * math.sqrt(cov[1, 1])
        assert tr.loc[arm, "slope"] == pytest.approx(beta[1], rel=1e-9), arm
        assert (tr.loc[arm, "slope_low"], tr.loc[arm, "slope_high"]) == pytest.approx(
            (beta[1] - half, beta[1] + half), rel=1e-9)
        p.append(2 * stats.t.sf(abs(beta[1]) / math.sqrt(cov[1, 1]), len(x) - 2))
    adj = holm3(np.array(p))
    assert tr.loc[list(PLANTED), "p_slope_holm"].astype(float).tolist() == pytest.approx(adj.tolist(), rel=1e-9)
    # rope's slope survives Holm (p ≈ 0.008, x3); swiglu's own interval excludes 0 (p ≈ 0.031) but x2 it does not
    assert adj[0] < 0.05 < adj[1] and tr.loc["swiglu", "slope_high"] < 0
    assert tr.loc["rope", "trend"] == "Δ falls with size, toward the paper's"  # RoFormer: better
    assert tr.loc["swiglu", "trend"].startswith("no trend shown")
    assert tr.loc["swiglu", "reach_status"] == NOT_DETERMINED
    assert tr.loc["rmsnorm", "trend"].startswith("no trend shown")
    assert tr.loc["rmsnorm", "reach_status"].startswith("inside ±m")  # the paper: equivalent
    # rope: −0.02 is crossed at log2 N ≈ 14.2, below the smallest size (15)
    assert tr.loc["rope", "reach_status"] == "below the smallest size (extrapolated)"


def test_report_predicts_the_held_out_size_from_the_smaller_ones(ladder_report):
    _, out = ladder_report
    pred = pd.read_csv(out / "ladder_predictions.csv")
    for arm in PLANTED:
        x, d, v = planted(arm)
        beta, cov, phi = matrix_wls(x[:4], d[:4], v[:4])  # the largest size never enters its own prediction
        x0 = np.array([1.0, 19.0])
        p = float(x0 @ beta)
        half = stats.t.ppf(0.975, 2) * math.sqrt(float(x0 @ cov @ x0) + phi * v[4])
        row = pred[(pred["arm"] == arm) & (pred["size"] == "w64")].iloc[0]
        assert (row["predicted"], row["low"], row["high"]) == pytest.approx((p, p - half, p + half), rel=1e-9)
        assert row["measured"] == pytest.approx(d[4], rel=1e-9)
        assert row["covered"] == ("yes" if p - half <= d[4] <= p + half else "no")
        nxt = pred[(pred["arm"] == arm) & (pred["covered"] == "unmeasured")]
        assert nxt["n_params"].tolist() == [2 * 2**19, 4 * 2**19]  # 2x and 4x the largest, labelled unmeasured
    md = (out / "index.md").read_text(encoding="utf-8")
    assert "predictions, unmeasured" in md and "2x the largest (unmeasured)" in md


def test_report_counts_decisions_against_the_largest_size(ladder_report):
    _, out = ladder_report
    v = pd.read_csv(out / "verdicts.csv")
    v = v[v["verdict"] != "baseline"]
    top = v[v["size"] == "w64"].set_index("arm")
    small = v[v["size"] != "w64"]
    same = sum(r.verdict == top.loc[r.arm, "verdict"] for r in small.itertuples())
    sign = sum(np.sign(r.delta) == np.sign(top.loc[r.arm, "delta"]) for r in small.itertuples())
    dec = pd.read_csv(out / "decision_accuracy.csv", keep_default_na=False).set_index("size")
    assert dec.loc["all", ["arms", "same_verdict", "same_sign"]].astype(int).tolist() == [12, same, sign]
    assert dec.index.tolist() == ["w16", "w24", "w32", "w48", "all"]  # smallest N first


def test_report_sections_figures_and_byte_identical_rerun(ladder_report, tmp_path):
    from analysis.report import main

    uri, out = ladder_report
    md = (out / "index.md").read_text(encoding="utf-8")
    for heading in ("## Trend with size", "## The held-out size, predicted then measured", "## Decision accuracy",
                    "## Verdicts per size"):
        assert heading in md
    assert "](figures/delta_vs_size.png)" in md and "](figures/forest_by_size.png)" in md
    assert md.index("## Trend with size") < md.index("figures/forest_by_size.png") < md.index("## Verdicts per size")
    again = tmp_path / "again"
    assert main(["ladder", PROTOCOL, f"tracking_uri={uri}", f"out={again}"]) == 0
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for f in files:
        assert (out / f).read_bytes() == (again / f).read_bytes(), f


def test_an_arm_matched_differently_at_the_held_out_rung_is_flagged(ladder_report, tmp_path):
    """rope at the baseline's tokens on the ladder, at the size's FLOPs at the held-out rung (as GQA and MQA against
    the known-results study): its held-out row and the head say so; an arm matched alike (swiglu: tokens at both),
    the unmeasured rows, and a rung of the same store are not flagged."""
    from analysis.report import main

    _, out = ladder_report
    assert "matched differently" not in (out / "index.md").read_text(encoding="utf-8")
    small, top = f"sqlite:///{tmp_path}/small.db", f"sqlite:///{tmp_path}/top.db"
    make_ladder_store(small, sizes=("w16", "w24", "w32", "w48"), tokens_matched=("rope", "swiglu"))
    make_ladder_store(top, sizes=("w64",), name="ladder-top", tokens_matched=("swiglu",))
    split = tmp_path / "split"
    assert main(["ladder", PROTOCOL, f"tracking_uri={small}", f"out={split}", f"held_out=ladder-top={top}"]) == 0
    md = (split / "index.md").read_text(encoding="utf-8")
    rows = [ln for ln in md.splitlines() if ln.startswith("| `") and "| `w64` |" in ln]
    flagged = {ln.split(" | ")[0].strip("| `") for ln in rows if ln.endswith(" (matched differently) |")}
    assert flagged == {"rope"}, rows  # swiglu: tokens at both
    assert not [ln for ln in md.splitlines() if "unmeasured" in ln and "matched differently" in ln]
    assert "**Matched differently at the held-out size**: `rope` trained the baseline's tokens on the ladder and " \
           "the size's FLOP budget at `w64` (`ladder-top`)" in md
    assert "arms (`rope` matched differently there" in md
    # the same numbers: only the text flags it
    assert (split / "ladder_predictions.csv").read_bytes() == (out / "ladder_predictions.csv").read_bytes()


def test_compute_per_size_and_stage_with_the_runs_left_out(tmp_path):
    """Run-hours per size and stage from the runs' own start and end times (16 runs a size, each 2-6 s by size), and
    a killed run's time counted apart from the results'."""
    from mlflow.entities import RunTag
    from ablations.tracking import client as open_store
    from analysis.report import main

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    make_ladder_store(uri)
    client = open_store(uri)
    exp = client.get_experiment_by_name(PROTOCOL).experiment_id
    r = client.create_run(exp, start_time=1_800_000_000_000, run_name="killed",
                          tags={"verdict.protocol": PROTOCOL, "verdict.arm": "rope", "verdict.size": "w32",
                                "verdict.stage": "seeds", "seed": "9", "variant": "w32 rope"})
    client.log_batch(r.info.run_id, tags=[RunTag("git_commit", "c0ffee")])
    client.set_terminated(r.info.run_id, status="KILLED", end_time=1_800_000_000_000 + 7200_000)  # two hours
    design = {"first": "3", "batch": "1", "cap": "12", "spending": "obrien-fleming", "alpha": "0.05"}
    for run in client.search_runs([exp]):
        if run.info.status == "FINISHED":
            client.log_batch(run.info.run_id, tags=[RunTag(f"verdict.sequential.{k}", v) for k, v in design.items()])
    out = tmp_path / "report"
    assert main(["ladder", PROTOCOL, f"tracking_uri={uri}", f"out={out}"]) == 0
    c = pd.read_csv(out / "ladder_compute.csv", keep_default_na=False)
    seeds = c[c["stage"] == "seeds"].set_index("size")
    assert seeds["runs"].to_dict() == {s: 16 for s in SIZES}
    for size, ms in RUN_MS.items():
        assert seeds.loc[size, "run_hours"] == pytest.approx(16 * ms / 3.6e6, rel=1e-12)
    assert c.loc[c["stage"] == "lr", "runs"].tolist() == [0] * len(SIZES)
    left = c[c["size"] == "left out"].iloc[0]
    assert left["runs"] == 1 and left["run_hours"] == pytest.approx(2.0, rel=1e-12)
    md = (out / "index.md").read_text(encoding="utf-8")
    section = md[md.index("## Compute"):]
    # 80 runs, 16 x (2 + 3 + 4 + 5 + 6) s = 320 s: 0.09 run-hours, 4.00 s = 0.07 run-minutes a run
    assert "took **0.09 run-hours** (80 runs" in section and "1 runs left out" in section
    assert "ran 2.00 run-hours more" in section
    # 4 arms x 5 sizes x the cap's 12 seeds
    assert "The seeds stage trained 80 runs of the 240 that 12 seeds (the sequential design's cap) for each of 4 " \
           "arms at 5 sizes would take" in section
    assert "| all sizes |  | 0 / 0.00 | 80 / 0.09 | **80 / 0.09** | 0.07 |" in section
    assert "| `w16` | 32,768 | 0 / 0.00 | 16 / 0.01 | 16 / 0.01 | 0.03 |" in section


def test_too_few_sizes_is_one_line(ladder_report, tmp_path, capsys):
    from analysis.report import main

    uri, _ = ladder_report
    code = main(["ladder", PROTOCOL, f"tracking_uri={uri}", f"out={tmp_path / 'r'}",
                 "filter=tags.`verdict.size` != 'w64' and tags.`verdict.size` != 'w48'"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "3 size(s) (w16, w24, w32)" in err and "needs >= 4" in err


def test_report_says_which_sizes_are_trained_models(ladder_report):
    _, out = ladder_report
    md = (out / "index.md").read_text(encoding="utf-8")
    start = md.index("## Trained models per size")
    section = md[start:md.index("\n## ", start + 1)]
    rows = {line.split(" | ")[0].strip("| `"): line for line in section.splitlines() if line.startswith("| `w")}
    # w16: 2.6 is 0.05 below the trigram (not 0.2) and above the 4-gram; w24: 0.15 below, above; w32 on: both cleared
    assert "| +0.1500 | 0.20-0.20 | **no** |" in rows["w16"] and "−0.0500" in rows["w16"]
    assert rows["w24"].endswith("| **no** |")
    assert all(rows[s].endswith("| yes |") for s in ("w32", "w48", "w64"))
    assert "| 2.4000 | −0.2500 | −0.0500 |" in rows["w32"]


def test_held_out_rung_from_another_store(ladder_report, tmp_path, capsys):
    """The largest rung read from its own (gzipped) store, as the ladder will read the known-results study's: the
    same numbers as the one-store report, and the head and Regenerate command name where it came from."""
    from analysis.report import main

    _, out = ladder_report
    small, top = f"sqlite:///{tmp_path}/small.db", tmp_path / "top.db"
    make_ladder_store(small, sizes=("w16", "w24", "w32", "w48"))
    make_ladder_store(f"sqlite:///{top}", sizes=("w64",), name="ladder-top")
    with open(top, "rb") as src, gzip.open(tmp_path / "top.db.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    split = tmp_path / "split"
    held = f"ladder-top={tmp_path}/top.db.gz"
    assert main(["ladder", PROTOCOL, f"tracking_uri={small}", f"out={split}", f"held_out={held}"]) == 0
    for name in ("ladder_points.csv", "ladder_trends.csv", "ladder_predictions.csv", "decision_accuracy.csv"):
        assert (split / name).read_bytes() == (out / name).read_bytes(), name
    md = (split / "index.md").read_text(encoding="utf-8")
    assert "`w64` of protocol `ladder-top`" in md and f"held_out={held}" in md
    # its cost beside the ladder's: 16 runs of 6 s (96 s) against 16 runs each of 2, 3, 4 and 5 s (224 s)
    assert "protocol `ladder-top` (one size, every result of it), took 0.03 run-hours (16 runs): the ladder cost " \
           "2.33x that, more than the size it predicts" in md
    # a held-out rung must be another, larger size: the ladder's own store names w48 again
    capsys.readouterr()  # MLflow's log lines from making the stores
    code = main(["ladder", PROTOCOL, f"tracking_uri={small}", f"out={tmp_path / 'bad'}",
                 f"held_out={PROTOCOL}={tmp_path}/small.db"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "`w48` is also a size" in err
    assert main([PROTOCOL, f"tracking_uri={small}", f"out={tmp_path / 'bad'}", f"held_out={held}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "only the ladder kind reads a held-out rung" in err
