"""The report of a protocol that ran `verdict.seeds: sequential` (analysis/sequential_verdicts.py): its verdicts are the
stopping rule's, replayed from the store, not the fixed rule on the seeds each arm got.

Synthetic store, values typed here (known answers): design first 3, batch 3, cap 15, O'Brien-Fleming-type spending
at alpha 0.05, so the looks are at 3, 6, 9, 12, 15 seeds, equally spaced: the Lan-DeMets z boundaries are the
published 4.877, 3.357, 2.680, 2.290, 2.031 (Reboussin et al. 2000; tests/test_sequential.py checks the module
against them). The lr stage ran seed 0, so the seeds stage's order is 1, 2, ..., 15. Holm family `arm-family` and
each arm in its own family, so each comparison is tested at the full alpha (r = 1):

- `fast` (9 seeds): Welch p 0.17, 0.061, 0.0040 at looks 1-3: crosses the third look's boundary (p <= 0.00736),
  *better* at 9 seeds;
- `slow` (15 seeds): p 0.096, 0.10, 0.25, 0.035, 0.046: crosses no boundary (the last: 0.0423), inconclusive at the
  cap, though the fixed rule on its 15 seeds says *better* (p 0.046 < 0.05): the two rules differ;
- `extra` (7 seeds): p 0.0043 then 8.7e-6 at 6 seeds: better at look 2; its 7th seed is one the rule never used;
- `short` (5 seeds): p 0.86 at 3 seeds, then the store has too few for look 2: open, short of the cap.
The margin (0.005) is below every |Δ| shown, so no TOST crosses.
"""
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats
import warm_python

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "synth-seq"
MARGIN = 0.005
OBF_K5 = (4.877, 3.357, 2.680, 2.290, 2.031)  # Lan-DeMets O'Brien-Fleming type, alpha 0.05 two-sided, K = 5
DESIGN = {"first": "3", "batch": "3", "cap": "15", "spending": "obrien-fleming", "alpha": "0.05"}
BPB = {  # seeds 1, 2, ...
    "baseline": [2.0035, 2.0082, 2.0033, 1.987, 2.0091, 2.0045, 1.9946, 2.0058, 2.0036, 2.0029, 2.0003, 2.0055,
                 1.9926, 1.9984, 1.9952],
    "fast": [2.0038, 1.9715, 1.9788, 2.003, 1.9891, 1.9893, 1.9775, 1.9661, 1.9843],
    "slow": [2.0028, 1.9972, 1.9939, 1.989, 1.9942, 1.9969, 1.994, 2.0097, 2.0068, 1.9697, 1.9779, 1.995, 1.9926,
             1.9989, 1.999],
    "extra": [1.975, 1.962, 1.968, 1.959, 1.971, 1.965, 1.999],
    "short": [2.004, 1.999, 2.010, 1.996, 2.003],
}


def make_store(uri: str) -> None:
    from mlflow.entities import Metric, Param, RunTag
    from ablations.tracking import client as open_store  # a new store: the migrated template

    client = open_store(uri)
    exp = client.create_experiment(EXPERIMENT)
    clock = [1_700_000_000_000]

    def run(arm, stage, seed, bpb):
        clock[0] += 60_000
        tags = {"verdict.protocol": EXPERIMENT, "verdict.arm": arm, "verdict.family": f"f-{arm}",
                "verdict.baseline": "baseline", "verdict.size": "s", "verdict.budget_flops": "1e+11",
                "verdict.margin": f"{MARGIN:g}", "verdict.margin_reason": "a test", "verdict.holm": "arm-family",
                "verdict.primary": "arms=*;sizes=*", "verdict.allow_dirty": "false", "verdict.stage": stage,
                "seed": str(seed), "variant": f"s {arm}", **{f"verdict.sequential.{k}": v for k, v in DESIGN.items()},
                **({"verdict.lr": "0.006"} if stage == "seeds" else {})}
        r = client.create_run(exp, start_time=clock[0], tags=tags, run_name=f"{arm} {seed}")
        client.log_batch(r.info.run_id, params=[Param("optim.lr", "0.006"), Param("seed", str(seed))],
                         metrics=[Metric(k, v, clock[0] + 1000, 0) for k, v in (
                             ("final_val_bpb", bpb), ("final_val_loss", bpb * 0.7), ("params", 1000.0),
                             ("flops_per_token", 6000.0), ("tokens_seen", 1e6), ("flops_seen", 6e9))],
                         tags=[RunTag("git_commit", "c0ffee"), RunTag("git_dirty", "false")])
        client.set_terminated(r.info.run_id, status="FINISHED", end_time=clock[0] + 2000)

    for arm, values in BPB.items():
        run(arm, "lr", 0, values[0] + 0.3)  # the lr stage's seed 0: the seeds stage skips it
        for seed, bpb in enumerate(values, start=1):
            run(arm, "seeds", seed, bpb)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sequential")
    uri = f"sqlite:///{tmp}/mlflow.db"
    make_store(uri)
    out = tmp / "report"
    r = warm_python.run([sys.executable, "-m", "analysis.report", EXPERIMENT, f"tracking_uri={uri}", f"out={out}"],
                        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return pd.read_csv(out / "verdicts.csv", keep_default_na=False), (out / "index.md").read_text()


def row(table, arm):
    return table[table["arm"] == arm].iloc[0]


def md_row(md, arm):
    return next(line for line in md.splitlines() if line.startswith("| `s`") and f"`{arm}`" in line)


def welch_df(a, b):
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    return (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))


def test_an_arm_stopped_at_the_third_look_is_better_there_at_the_textbook_boundary(built):
    table, md = built
    r = row(table, "fast")
    assert (r["rule"], r["verdict"], r["crossed"]) == ("sequential", "better", "difference")
    assert (int(float(r["stop_look"])), int(float(r["stop_seeds"])), int(float(r["crossed_look"]))) == (3, 9, 3)
    fast, base = BPB["fast"], BPB["baseline"][:9]  # the look uses the baseline's first 9 seeds, not its 15
    assert float(r["crossed_p"]) == pytest.approx(stats.ttest_ind(fast, base, equal_var=False).pvalue, rel=1e-9)
    # the boundary: look 3 of 5's published z, read as a nominal p, then as a t quantile at the look's Welch df
    assert stats.norm.isf(float(r["boundary_p"]) / 2) == pytest.approx(OBF_K5[2], abs=5e-4)
    assert int(float(r["boundary_share"])) == 1 and float(r["boundary_df"]) == pytest.approx(welch_df(fast, base), rel=1e-9)
    assert float(r["boundary_t"]) == pytest.approx(stats.t.isf(float(r["boundary_p"]) / 2, welch_df(fast, base)))
    line = md_row(md, "fast")
    assert "**better**" in line and "look 3 (9 seeds)" in line and "≤ 0.00736" in line


def test_the_sequential_rule_not_the_fixed_one_decides_at_the_cap(built):
    table, md = built
    r = row(table, "slow")
    p15 = stats.ttest_ind(BPB["slow"], BPB["baseline"], equal_var=False).pvalue
    assert 2 * stats.norm.sf(OBF_K5[4]) < p15 < 0.05  # the rules differ: past the last boundary, under alpha
    assert float(r["p_welch"]) == pytest.approx(p15, rel=1e-9) and r["fixed_verdict"] == "better"
    assert r["verdict"] == "inconclusive" and str(r["at_cap"]) == "True" and int(float(r["stop_seeds"])) == 15
    assert r["crossed"] == "" and "cap, look 5 (15 seeds)" in md_row(md, "slow")
    assert "**inconclusive**" in md_row(md, "slow") and "none crossed" in md_row(md, "slow")


def test_the_paragraph_names_the_rule_that_decided_and_the_fixed_p_values_are_descriptive(built):
    _, md = built
    assert "so the verdicts below are that rule's, replayed from the store" in md
    assert "this report's fixed rule on the seeds each arm got" not in md
    assert "p (Welch), descriptive" in md and "| stopped at | boundary crossed |" in md


def test_a_store_that_disagrees_with_the_rule_is_one_line(built):
    table, md = built
    extra, short = row(table, "extra"), row(table, "short")
    assert (extra["verdict"], int(float(extra["stop_seeds"]))) == ("better", 6)  # its 7th seed is not used
    assert extra["store_note"] == ("7 seed(s) in the store, the rule stopped it at look 2 (6 seeds): seed(s) 7 beyond "
                                   "it, not used")
    assert short["verdict"] == "inconclusive" and str(short["at_cap"]) == "False" and int(float(short["stop_look"])) == 1
    assert "seed(s) 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 missing" in short["store_note"]
    assert "open at look 1 (3 seeds)" in md_row(md, "short")
    lines = [line for line in md.splitlines() if "The store and the rule disagree" in line]
    assert len(lines) == 1 and "`extra` at `s`" in lines[0] and "`short` at `s`" in lines[0]
    assert "`fast`" not in lines[0] and "`slow`" not in lines[0] and "`baseline`" not in lines[0]



def test_a_family_across_sizes_counts_the_comparisons_of_a_size_not_yet_run():
    """holm: study over two sizes, one look at 3 seeds, then 6. At the first size's first look the second size's
    comparison has no seeds yet but holds its hypothesis, so the boundary is at alpha / 2: an arm whose p lies
    between the alpha / 2 and alpha boundaries is not stopped there (the protocol's family_members counts it)."""
    from scipy import optimize

    from analysis import sequential_verdicts as sv
    from analysis import sequential as q

    design = q.Design(3, 3, 6, "obrien-fleming", 0.05)
    at_alpha, at_half = q.nominal_levels(design, 0.05, 2)[0], q.nominal_levels(design, 0.025, 2)[0]
    base = [2.0, 2.01, 1.99, 2.005, 1.995, 2.0]
    noise = [0.004, -0.003, 0.001, 0.002, -0.004, 0.0]

    def p3(shift):
        return stats.ttest_ind(np.add(base[:3], noise[:3]) + shift, base[:3], equal_var=False).pvalue

    shift = optimize.brentq(lambda x: np.log(p3(x)) - np.log(np.sqrt(at_alpha * at_half)), -0.5, -0.001)
    assert at_half < p3(shift) < at_alpha
    values = {("base", size, s): v for size in ("a", "bb") for s, v in enumerate(base)}
    values |= {("x", "a", s): base[s] + noise[s] + shift for s in range(6)}
    values |= {("x", "bb", s): base[s] + noise[s] for s in range(6)}
    orders = {"a": list(range(6)), "bb": list(range(6))}
    both = sv.replay(values, {("a", "x"): "study", ("bb", "x"): "study"}, ["a", "bb"], "base", orders, design,
                     float("nan"))
    alone = sv.replay(values, {("a", "x"): "a only"}, ["a"], "base", orders, design, float("nan"))
    assert alone.stop[("a", "x")] == 0 and both.stop.get(("a", "x")) != 0

# arm -> (true val bpb, seed sd) per size: at both sizes `far` is decided at once and `noisy` never; `near` (1.5 sd
# of a seed better) is decided somewhere past the first look, so the study-wide family's recycling matters
TRUTH = {"base": (2.40, 0.004), "far": (2.30, 0.004), "near": (2.394, 0.004), "noisy": (2.41, 0.05)}


@pytest.mark.slow
def test_the_report_replays_the_looks_the_protocol_ran(tmp_path, monkeypatch):
    """The protocol itself (sweeps.verdict.Verdict.sequential_seeds, training faked) at two sizes with one
    study-wide family, then the report on its store: every comparison stopped where the protocol stopped giving it
    seeds, the baseline ran to the largest open one, and the store agrees with the rule."""
    import io

    from ablations.tracking import client as mlflow_client
    from analysis.protocol import select, verdicts
    from analysis.store import load_runs
    from analysis.verdict import resolve_margin
    from sweeps.protocol import ProtocolArm, ProtocolSpec, Size
    from analysis.sequential import Design
    from sweeps.verdict import Verdict

    monkeypatch.setattr("sweeps.links.MlflowLinks.check", lambda self: None)
    uri = f"sqlite:///{tmp_path}/m.db"
    trained: dict = {}

    def fake_train(cfg, callbacks=(), tags=None):
        arm, size, seed = tags["verdict.arm"], tags["verdict.size"], int(cfg.seed)
        trained.setdefault((size, arm), []).append(seed)
        mean, sd = TRUTH[arm]
        value = mean + sd * np.random.default_rng([len(arm), len(size), seed]).standard_normal()
        c = mlflow_client(uri)
        exp = c.get_experiment_by_name(cfg.tracking.experiment) or c.get_experiment(
            c.create_experiment(cfg.tracking.experiment))
        run = c.create_run(exp.experiment_id, tags={**tags, "seed": str(seed)})
        for k, v in (("final_val_bpb", value), ("final_val_loss", 0.7 * value)):
            c.log_metric(run.info.run_id, k, float(v))
        c.set_terminated(run.info.run_id)
        return {"val_bpb": float(value), "run_id": run.info.run_id}

    spec = ProtocolSpec(name="seq2", experiment=None, baseline="base",
                        arms=[ProtocolArm(a, "f", ()) for a in TRUTH], sizes=[Size("a", 1e8, ()), Size("bb", 2e8, ())],
                        seeds=9, seeds_largest=9, lr_grid=[1e-3], lr_seed=100, storage=f"sqlite:///{tmp_path}/o.db",
                        overrides=["model=tiny", "tokenizer=byte", f"tracking.uri={uri}"], margin=0.02,
                        margin_reason="r", sequential=Design(3, 2, 9, "obrien-fleming", 0.05), stop_early=True)
    v = Verdict(spec, train_fn=fake_train, out=io.StringIO())
    for i, size in enumerate(spec.sizes):
        v.sequential_seeds(i, size, {a: 1e-3 for a in TRUTH})
    p = select(load_runs("seq2", uri))
    table = verdicts(p, resolve_margin(None, p.seeds["verdict.margin"], p.seeds["verdict.margin_reason"]))
    assert set(table["holm_family"].dropna()) - {""} == {"study"}
    for _, r in table.iterrows():
        assert r["store_note"] == "", r.to_dict()
        if r["verdict"] != "baseline":
            assert r["stop_seeds"] == len(trained[(r["size"], r["arm"])]), r.to_dict()
    stops = {(r["size"], r["arm"]): r["stop_seeds"] for _, r in table.iterrows() if r["verdict"] != "baseline"}
    verdict = {(r["size"], r["arm"]): r["verdict"] for _, r in table.iterrows()}
    assert verdict[("a", "far")] == verdict[("bb", "far")] == "better"
    assert verdict[("a", "noisy")] == verdict[("bb", "noisy")] == "inconclusive"
    assert stops[("a", "noisy")] == stops[("bb", "noisy")] == 9
    assert any(3 < n < 9 for n in stops.values()), stops  # a later look decided something
    for size in ("a", "bb"):
        assert len(trained[(size, "base")]) == max(n for (s, _), n in stops.items() if s == size)
