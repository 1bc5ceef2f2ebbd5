"""The verdict protocol's report (analysis/protocol.py via python -m analysis.report) on a synthetic MLflow store
written here with the protocol's tags and known values: the tables are checked against numbers computed by hand
(means, seed std margins, Holm within a family at a size, the lr choice), with Welch p-values from scipy.

Store: protocol `synth-proto`, baseline arm `baseline` (family baseline), `rope` (positions), `rmsnorm` (norms),
`swiglu` and `geglu` (mlps); sizes named so that their alphabetical order (m, s, xs) is not their budget order
(xs < s < m). The runs record the statistics fixed before them: margin 0.01 bpb (with its reason) and the Holm family
`arm-family` (the arms of one family at one size). An n-gram floor run for the same data (trigram 1.60 bpb: above
every arm's mean at m but rope's). Seeds stage: seeds 1-3 at each arm's chosen lr. lr stage: seed 0 at lrs 0.003/0.006/0.012, with
values far above the seeds' (a leak into the statistics moves every mean and seed count). One lr-stage run FAILED;
one finished run without protocol tags.
"""
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from commands_testing import run_main
from scipy import stats
import warm_python

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "synth-proto"
SIZES = {"xs": 1e11, "s": 3e11, "m": 9e11}  # name -> budget FLOPs
FAMILY = {"baseline": "baseline", "rope": "positions", "rmsnorm": "norms", "swiglu": "mlps", "geglu": "mlps"}
PARAMS = {"baseline": 804_096, "rope": 795_904, "rmsnorm": 803_072, "swiglu": 808_192, "geglu": 804_096}
BPB = {  # seeds stage, seeds 1, 2, 3
    "xs": {"baseline": [2.00, 2.02, 2.04], "rope": [1.80, 1.81, 1.83], "rmsnorm": [2.01, 2.03, 2.02],
           "swiglu": [1.95, 1.96, 1.97], "geglu": [2.05, 2.10, 2.00]},
    "s": {"baseline": [1.90, 1.91, 1.92], "rope": [1.75, 1.74, 1.76], "rmsnorm": [1.905, 1.910, 1.915],
          "swiglu": [1.88, 1.87, 1.86], "geglu": [1.95, 1.91, 1.99]},
    "m": {"baseline": [1.80, 1.83, 1.86], "rope": [1.65, 1.66, 1.64], "rmsnorm": [1.81, 1.82, 1.83],
          "swiglu": [1.74, 1.73, 1.75], "geglu": [1.85, 1.80, 1.90]},
}
GRID = (0.003, 0.006, 0.012)
LR_OFFSET = {"default": (0.30, 0.20, 0.25), ("xs", "rope"): (0.10, 0.20, 0.30)}  # lr stage: seeds mean + offset
FAILED_LR = ("m", "geglu", 0.012)
LR_SEEDS = ("s", "rope")  # its lr stage ran two seeds per lr
LR_FROM = ("m", "rope")  # its seeds' lr is tagged as searched at xs (verdict.lr.transfer_from)
T0 = 1_700_000_000_000
MARGIN, REASON = 0.01, "a tenth of a percent of nothing: a test"
FLOOR = {1: 4.5, 2: 3.3, 3: 1.60}
OTHER_MACHINE = ("m", "rope")  # its seeds ran on "CPU B", every other run on "CPU A"


def chosen_lr(size, arm):
    off = LR_OFFSET.get((size, arm), LR_OFFSET["default"])
    return GRID[int(np.argmin(off))]


def make_store(uri: str) -> None:
    from mlflow.entities import Metric, Param, RunTag
    from ablations.tracking import client as open_store  # a new store: the migrated template

    client = open_store(uri)
    exp = client.create_experiment(EXPERIMENT)
    clock = [T0]

    def run(tags, params, metrics, status="FINISHED"):
        clock[0] += 60_000
        r = client.create_run(exp, start_time=clock[0], tags=tags, run_name=tags.get("variant", "run"))
        ms = [Metric(k, float(v), clock[0] + 1000, step) for k, v, step in metrics]
        client.log_batch(r.info.run_id, metrics=ms, params=[Param(k, str(v)) for k, v in params.items()],
                         tags=[RunTag("git_commit", "c0ffee"), RunTag("data_fingerprint", "fp"),
                               RunTag("tokenizer", "char"), RunTag("git_dirty", "false")])
        client.set_terminated(r.info.run_id, status=status, end_time=clock[0] + 2000)

    for size in ("m", "xs", "s"):  # not the budget order: the report must sort by budget
        budget = SIZES[size]
        for arm in FAMILY:
            base = {"verdict.protocol": EXPERIMENT, "verdict.arm": arm, "verdict.family": FAMILY[arm],
                    "verdict.baseline": "baseline", "verdict.size": size, "verdict.budget_flops": f"{budget:g}",
                    "verdict.margin": f"{MARGIN:g}", "verdict.margin_reason": REASON, "verdict.holm": "arm-family",
                    "verdict.primary": "arms=*;sizes=*", "verdict.allow_dirty": "false", "device_name": "CPU A"}
            fpt = 6 * PARAMS[arm]
            steps = int(budget // (fpt * 2048))
            spent = steps * 2048 * fpt

            def metrics(bpb, tps):
                return [("final_val_bpb", bpb, 0), ("final_val_loss", bpb * 0.7, 0), ("params", PARAMS[arm], 0),
                        ("flops_per_token", fpt, 0), ("final_tokens_per_sec", tps, 0),
                        ("flops_seen", spent / 2, steps // 2), ("flops_seen", spent, steps),  # the last step counts
                        ("tokens_seen", steps * 2048, steps)]

            mean = float(np.mean(BPB[size][arm]))
            off = LR_OFFSET.get((size, arm), LR_OFFSET["default"])
            for lr, o in zip(GRID, off):
                failed = (size, arm, lr) == FAILED_LR
                # (s, rope) searched at two seeds per lr (verdict.lr.seeds): the table shows their mean
                for seed, d in (((100, 0.05), (101, -0.05)) if (size, arm) == LR_SEEDS else ((0, 0.0),)):
                    tags = base | {"verdict.stage": "lr", "seed": str(seed), "variant": f"{size} {arm} optim.lr={lr:g}"}
                    run(tags, {"optim.lr": lr, "seed": seed}, [] if failed else metrics(mean + o + d, 1000.0),
                        status="FAILED" if failed else "FINISHED")
            lr = chosen_lr(size, arm)
            for seed, bpb in zip((1, 2, 3), BPB[size][arm]):
                tags = base | {"verdict.stage": "seeds", "seed": str(seed), "verdict.lr": f"{lr:g}",
                               **({"verdict.lr_from": "xs"} if (size, arm) == LR_FROM else {}),
                               **({"device_name": "CPU B"} if (size, arm) == OTHER_MACHINE else {}),
                               "variant": f"{size} {arm} optim.lr={lr:g}"}
                run(tags, {"optim.lr": lr, "seed": seed}, metrics(bpb, 9000.0 + seed))
    run({"variant": "stray", "seed": "0"}, {"optim.lr": 0.006}, [("final_val_bpb", 0.001, 0),
                                                                   ("final_val_loss", 0.001, 0)])
    from sweeps.floor import log_floor

    log_floor(uri, FLOOR, {"kind": "ngram", "smoothing": "modified-kn", "scope": "full", "data": "synthetic",
                           "data_fingerprint": "fp", "tokenizer": "char", "block_size": 64, "val_windows": 8,
                           "n_train": 1000, "n_targets": 99})


def welch_p(a, b):
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def holm2(p1, p2):
    """Holm's adjustment of two p-values, by hand: the smaller times 2; the larger max(itself, the first)."""
    lo, hi = sorted((p1, p2))
    a_lo, a_hi = min(1.0, 2 * lo), min(1.0, max(2 * lo, hi))
    return (a_lo, a_hi) if p1 <= p2 else (a_hi, a_lo)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("protocol")
    uri = f"sqlite:///{tmp}/mlflow.db"
    make_store(uri)
    out = tmp / "report"
    r = run_main("analysis.report", [EXPERIMENT, f"tracking_uri={uri}", f"out={out}"])  # across processes: test_rerun_...
    assert r.returncode == 0, r.stderr[-3000:]
    table = pd.read_csv(out / "verdicts.csv")
    return tmp, uri, out, r, table


def row(table, size, arm):
    r = table[(table["size"] == size) & (table["arm"] == arm)]
    assert len(r) == 1, (size, arm)
    return r.iloc[0]


def test_sizes_in_budget_order_and_only_seeds_stage_counted(built):
    _, _, _, _, table = built
    assert list(dict.fromkeys(table["size"])) == ["xs", "s", "m"]
    for size, arms in BPB.items():
        for arm, vals in arms.items():
            r = row(table, size, arm)
            assert r["n_seeds"] == 3 and r["seeds"] == "1;2;3"  # the lr stage's seed 0 never enters
            assert r["mean"] == pytest.approx(sum(vals) / 3, abs=1e-12)
            assert r["lr"] == chosen_lr(size, arm)


def test_margin_is_the_recorded_one_never_the_data(built):
    _, _, out, r, table = built
    md = (out / "index.md").read_text()
    assert set(table.loc[table["verdict"] != "baseline", "margin"]) == {MARGIN}  # not a seed std (0.02/0.01/0.03)
    assert f"m = ±{MARGIN:g} bits/byte, fixed before the runs" in md and f"reason: {REASON}" in md
    assert "**Wide margin**" not in md  # 0.01 < 1% of 1.8
    assert f"equivalence margin ±{MARGIN:g} bits/byte (fixed before the runs" in r.stdout


def test_welch_interval_is_t_based(built):
    _, _, out, _, table = built
    a, b = np.array(BPB["m"]["swiglu"]), np.array(BPB["m"]["baseline"])
    va, vb = a.var(ddof=1) / 3, b.var(ddof=1) / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    r = row(table, "m", "swiglu")
    assert r["ci_low"] == pytest.approx(a.mean() - b.mean() - half, abs=1e-12)
    assert r["ci_high"] == pytest.approx(a.mean() - b.mean() + half, abs=1e-12)
    sec = (out / "index.md").read_text().split("## Verdicts per size")[1].split("## ")[0]
    assert "95% Welch CI" in sec and "bootstrap" not in sec


def test_floor_beside_the_arms_and_at_the_top(built):
    _, _, out, r, _ = built
    md = (out / "index.md").read_text()
    top = md.split("## ")[0]
    # best arm at the largest size: rope at m, 1.65 > trigram 1.60
    assert "**The best model does not beat the trigram floor**" in top and "(+0.0500)" in top
    sec = md.split("## n-gram floor")[1].split("## ")[0]
    assert "| 3 | 1.6000 |" in sec and "| `rope` at `m` | 1.6500 | +0.0500 | 1, 2 |" in sec
    assert "n-gram floor (bpb by order): 1: 4.5000, 2: 3.3000, 3: 1.6000" in r.stdout


def test_one_commit_named_at_the_top(built):
    _, _, out, _, _ = built
    assert "Every result ran at one commit, `c0ffee`, with a clean tree." in (out / "index.md").read_text()


def test_holm_within_a_family_at_one_size(built):
    _, _, _, _, table = built
    for size in BPB:
        base = BPB[size]["baseline"]
        p_sw, p_ge = welch_p(BPB[size]["swiglu"], base), welch_p(BPB[size]["geglu"], base)
        h_sw, h_ge = holm2(p_sw, p_ge)
        assert row(table, size, "swiglu")["p_welch"] == pytest.approx(p_sw, rel=1e-9)
        assert row(table, size, "swiglu")["p_holm"] == pytest.approx(h_sw, rel=1e-9)
        assert row(table, size, "geglu")["p_holm"] == pytest.approx(h_ge, rel=1e-9)
        assert row(table, size, "swiglu")["holm_family_size"] == 2
        for arm in ("rope", "rmsnorm"):  # alone in their family: nothing to adjust
            r = row(table, size, arm)
            assert r["holm_family_size"] == 1
            assert r["p_holm"] == pytest.approx(welch_p(BPB[size][arm], base), rel=1e-9)


def test_verdict_labels(built):
    _, _, _, _, table = built
    labels = set(table.loc[table["verdict"] != "baseline", "verdict"])
    assert all(v in ("better", "worse", "inconclusive") or v.startswith("equivalent within ±") for v in labels)
    # rope at xs: Δ = -0.207 with seed stds ~0.02, p ~ 2e-4, alone in its family -> better
    assert row(table, "xs", "rope")["verdict"] == "better"
    # rmsnorm at s: Δ = 0 but the TOST at ±0.01 with 3 seeds is far from 0.05 -> inconclusive, not "equal"
    assert row(table, "s", "rmsnorm")["verdict"] == "inconclusive"


def test_margin_option_is_flagged_and_wide_margins_need_an_argument(built):
    from analysis import protocol
    from analysis.store import load_runs
    from analysis.verdict import resolve_margin

    _, uri, _, _, _ = built
    p = protocol.select(load_runs(EXPERIMENT, uri))
    mg = resolve_margin(0.05)
    assert "not recorded before the runs" in mg.source and not mg.preset
    table = protocol.verdicts(p, mg)
    # rmsnorm at s: Δ = 0, se = sqrt((1e-4 + 2.5e-5) / 3): the 90% CI lies well inside ±0.05 -> equivalent
    assert row(table, "s", "rmsnorm")["verdict"] == "equivalent within ±0.05"
    from analysis.engine import Context

    ctx = Context(Path("."), runset=p.runset, extra=p, margin=mg)
    text = " ".join(b[1] for b in protocol._margin_blocks(ctx))
    assert "**Wide margin**" in text and "`m` (2.7% of 1.8300)" in text  # 0.05 > 1% of every baseline mean


def test_undeclared_runs_get_one_study_family(built):
    from dataclasses import replace

    from analysis import protocol
    from analysis.stats import holm
    from analysis.store import load_runs
    from analysis.verdict import resolve_margin

    _, uri, _, _, _ = built
    p = replace(protocol.select(load_runs(EXPERIMENT, uri)), holm="study")
    table = protocol.verdicts(p, resolve_margin(None))
    arms = table[table["verdict"] != "baseline"]
    assert set(arms["holm_family"]) == {"study"} and set(arms["holm_family_size"]) == {12}
    np.testing.assert_allclose(arms["p_holm"], holm(arms["p_welch"]))
    assert arms["p_tost"].isna().all() and not arms["verdict"].str.startswith("equivalent").any()  # no margin
    prim = replace(p, primary_sizes=("m",))
    t2 = protocol.verdicts(prim, resolve_margin(None))
    assert set(t2.loc[(t2["size"] == "m") & (t2["verdict"] != "baseline"), "holm_family_size"]) == {4}
    assert set(t2.loc[(t2["size"] == "xs") & (t2["verdict"] != "baseline"), "holm_family"]) == {"secondary"}


def test_parameter_mismatch_flagged_with_both_counts(built):
    _, _, out, _, table = built
    assert bool(row(table, "m", "swiglu")["params_differ"]) and not bool(row(table, "m", "geglu")["params_differ"])
    md = (out / "index.md").read_text()
    assert "**differs**: 808,192 vs 804,096 (+0.5%)" in md
    assert "same (804,096)" in md
    assert "**differs**: 795,904 vs 804,096 (-1.0%)" in md


def test_comparisons_across_machines_are_flagged_and_machines_listed(built):
    _, _, out, _, _ = built
    md = (out / "index.md").read_text()
    note = next(line for line in md.splitlines() if line.startswith("**Measured on different machines**"))
    # exactly the one comparison whose seeds ran elsewhere than the baseline's, with both machines named
    assert "`rope` at `m` (its seeds on CPU B; the baseline's on CPU A)" in note
    assert note.count(" at `") == 1
    # provenance: each machine with its count of result runs and the arm/stage groups that ran there (3 rope seeds
    # at m on B; 5 arms x 3 sizes x (3 seeds + 3 lrs) + rope at s's 3 extra lr seeds - those 3 - the FAILED lr run
    # = 89 on A)
    assert "- `CPU B`: 3 runs (rope seeds)" in md
    assert "- `CPU A`: 89 runs (baseline lr, baseline seeds, geglu lr, geglu seeds, rmsnorm lr, rmsnorm seeds, " \
           "rope lr, rope seeds, swiglu lr, swiglu seeds)" in md


def test_lr_search_table(built):
    _, _, out, _, _ = built
    lrs = pd.read_csv(out / "lr_search.csv", dtype={"failed": str, "tried": str, "edge": str})
    assert len(lrs) == 15
    for size in BPB:
        for arm in FAMILY:
            r = lrs[(lrs["size"] == size) & (lrs["arm"] == arm)].iloc[0]
            mean = float(np.mean(BPB[size][arm]))
            off = LR_OFFSET.get((size, arm), LR_OFFSET["default"])
            for lr, o in zip(GRID, off):
                if (size, arm, lr) == FAILED_LR:
                    assert math.isnan(r[f"bpb@{lr:g}"]) and r["failed"] == f"{lr:g}"
                else:
                    assert r[f"bpb@{lr:g}"] == pytest.approx(mean + o, abs=1e-12)
            assert r["chosen_lr"] == chosen_lr(size, arm)
            assert r["lr_seeds"] == (2 if (size, arm) == LR_SEEDS else 1)
            assert (r["lr_from"] if isinstance(r["lr_from"], str) else "") == ("xs" if (size, arm) == LR_FROM else "")
            assert (r["edge"] if isinstance(r["edge"], str) else "") == ("lowest" if (size, arm) == ("xs", "rope")
                                                                          else "")
    md = (out / "index.md").read_text()
    line = next(ln for ln in md.splitlines() if ln.startswith("| `xs` | `rope` |"))
    assert "**1.9133** ✓" in line and "chosen lr is the lowest tried: the optimum may lie outside the grid" in line
    line = next(ln for ln in md.splitlines() if ln.startswith("| `m` | `rope` |"))
    assert "lr searched at `xs` (verdict.lr.transfer_from), not here" in line
    assert "(mean over 1/2 seeds per lr (the protocol's choice))" in md
    assert "| `m` | `geglu` |" in md and "failed" in next(ln for ln in md.splitlines() if ln.startswith("| `m` | `geglu` |"))


def test_scaling_uses_the_spent_compute_and_says_it_interpolates(built):
    _, _, out, _, _ = built
    pts = pd.read_csv(out / "scaling_points.csv")
    assert len(pts) == 45  # seeds stage only
    r = pts[(pts["arm"] == "swiglu") & (pts["size"] == "m")].iloc[0]
    steps = int(9e11 // (6 * 808_192 * 2048))
    assert r["compute"] == steps * 2048 * 6 * 808_192  # flops_seen at the last step, not the budget
    sc = pd.read_csv(out / "scaling.csv")
    assert set(sc["n_levels"]) == {3}
    md = (out / "index.md").read_text()
    assert "**The law interpolates, it is not tested**" in md
    assert (out / "figures" / "loss_vs_compute.png").stat().st_size > 1000


def test_throughput_labelled_unpaired_and_strays_left_out(built):
    _, _, out, _, _ = built
    md = (out / "index.md").read_text()
    sec = md.split("## Throughput per run (not paired)")[1].split("## ")[0]
    assert "runs made at different times (not paired)" in sec
    assert "No paired measurement was given" in md
    lo = pd.read_csv(out / "left_out.csv")
    assert set(lo["reason"]) >= {f"not a run of the verdict protocol `{EXPERIMENT}`", "run FAILED"}
    assert "stray" not in md.split("## Left out")[0]  # the untagged run is no result (its bpb is an absurd 0.001)
    assert "stray" in md.split("## Left out")[1]


@pytest.mark.slow
def test_rerun_is_byte_identical(built):
    """Rebuilt into a folder an earlier build wrote in other formats (--format svg, pdf), beside the user's own
    files: the report's figures of every format are gone, the user's files kept, the report byte for byte the same."""
    tmp, uri, out, _, _ = built
    out2 = tmp / "again"
    stale = [out2 / "figures" / "forest.svg", out2 / "figures" / "loss_vs_compute.pdf"]
    mine = [out2 / "figures" / "mine.svg", out2 / "notes.md"]
    (out2 / "figures").mkdir(parents=True)
    for p in stale + mine:
        p.write_text(f"{p.name}: written before the rebuild\n")
    r = warm_python.run([sys.executable, "-m", "analysis.report", EXPERIMENT, f"tracking_uri={uri}", f"out={out2}"],
                        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not any(p.exists() for p in stale)
    assert all(p.read_text() == f"{p.name}: written before the rebuild\n" for p in mine)
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(out2) for p in out2.rglob("*") if p.is_file() and p not in mine)
    for f in files:
        assert (out / f).read_bytes() == (out2 / f).read_bytes(), f


def test_forest_plot_opens_the_report_and_draws_the_table_numbers(built):
    """The forest plot's data, by hand: Δ = mean(arm) − mean(baseline), its Welch CI, and each seed of the arm minus
    the baseline's mean (rope at m: 1.65, 1.66, 1.64 against a baseline mean of 1.83)."""
    from analysis.forest import forest_figure

    _, _, out, _, table = built
    forest = pd.read_csv(out / "forest.csv", keep_default_na=False)
    # the verdict table's order: sizes by budget, arms by (family, name)
    assert len(forest) == 12 and list(forest["label"][:4]) == ["geglu at xs", "swiglu at xs", "rmsnorm at xs",
                                                                "rope at xs"]
    r = forest[forest["label"] == "rope at m"].iloc[0]
    base = float(np.mean(BPB["m"]["baseline"]))
    assert r["delta"] == pytest.approx(np.mean(BPB["m"]["rope"]) - base, abs=1e-12)
    assert (r["ci_low"], r["ci_high"]) == (row(table, "m", "rope")["ci_low"], row(table, "m", "rope")["ci_high"])
    dots = [float(v) for v in r["seed_deltas"].split(";")]
    np.testing.assert_allclose(dots, [v - base for v in BPB["m"]["rope"]], atol=1e-6)
    assert r["margin"] == MARGIN and r["verdict"] == "better" and r["expected"] == ""
    # the figure draws exactly these numbers: the seeds' dots and the interval of the last row (at the bottom, y=0)
    ax = forest_figure(forest).axes[0]
    last = forest.iloc[-1]
    seeds_line = [ln for ln in ax.lines if len(ln.get_xdata()) == 3 and ln.get_ydata()[0] == pytest.approx(-0.22)]
    np.testing.assert_allclose(seeds_line[0].get_xdata(), [float(v) for v in last["seed_deltas"].split(";")])
    segs = [c for c in ax.collections if len(c.get_segments())]
    lo_hi = sorted(tuple(s[:, 0]) for c in segs for s in c.get_segments() if s[0, 1] == 0)
    assert lo_hi == [(last["ci_low"], last["ci_high"])]
    md = (out / "index.md").read_text()
    assert md.index("](figures/forest.png)") < md.index("MLflow tracking URI") < md.index("## Verdicts per size")
    assert "**Paired**" not in md  # no paired test declared before these runs
