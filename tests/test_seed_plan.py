"""A verdict report flags an arm whose observed seed sd exceeds the sd its seeds were planned for (issue 38 §3 item 6):
sweeps.plan's `json=FILE` records the planned sds (at plan.sd_at), analysis.report's `plan=FILE` checks the verdict
table against them (analysis/seed_plan.py). On a small synthetic protocol store with planted seed values."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

EXPERIMENT = "plan-proto"
BPB = {  # seeds 0-3 at size m; sds 0.0129 (baseline), 0.0775 (wide), 0.0026 (tight)
    "baseline": [2.30, 2.31, 2.32, 2.33],
    "wide": [2.20, 2.26, 2.32, 2.38],
    "tight": [2.300, 2.302, 2.304, 2.306],
}
# planned for: baseline 0.01 (observed 1.29x), wide 0.02 (3.87x), tight 0.001 but secondary (its seeds were not
# planned from an sd, so it is never flagged)
PLAN = {"tool": "sweeps.plan", "protocol": EXPERIMENT, "sd_at": "upper", "seeds": {"m": 4}, "rows": [
    {"size": "m", "arm": "wide", "primary": True, "sd_arm": 0.02, "sd_baseline": 0.01, "sd_source": "given"},
    {"size": "m", "arm": "tight", "primary": False, "sd_arm": 0.001, "sd_baseline": 0.001, "sd_source": "given"}]}


def make_store(uri: str) -> None:
    from mlflow.entities import Metric, Param, RunTag
    from ablations.tracking import client as open_store  # a new store: the migrated template

    client = open_store(uri)
    exp = client.create_experiment(EXPERIMENT)
    for i, (arm, values) in enumerate(BPB.items()):
        for seed, bpb in enumerate(values):
            start = 1_700_000_000_000 + 60_000 * (4 * i + seed)
            tags = {"verdict.protocol": EXPERIMENT, "verdict.arm": arm, "verdict.family": arm,
                    "verdict.baseline": "baseline", "verdict.size": "m", "verdict.budget_flops": "1e12",
                    "verdict.margin": "0.02", "verdict.margin_reason": "a test", "verdict.holm": "study",
                    "verdict.primary": "arms=wide;sizes=*", "verdict.stage": "seeds", "verdict.lr": "0.003",
                    "seed": str(seed), "variant": f"m {arm}"}
            r = client.create_run(exp, start_time=start, tags=tags, run_name=tags["variant"])
            ms = [("final_val_bpb", bpb), ("final_val_loss", bpb * 0.7), ("params", 1000), ("tokens_seen", 4096),
                  ("flops_per_token", 6000), ("final_tokens_per_sec", 9000)]
            client.log_batch(r.info.run_id, metrics=[Metric(k, float(v), start + 1000, 0) for k, v in ms],
                             params=[Param("optim.lr", "0.003"), Param("seed", str(seed))],
                             tags=[RunTag("git_commit", "c0ffee"), RunTag("git_dirty", "false")])
            client.set_terminated(r.info.run_id, status="FINISHED", end_time=start + 2000)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plan")
    uri = f"sqlite:///{tmp}/mlflow.db"
    make_store(uri)
    return tmp, uri


def report(tmp: Path, uri: str, plan: dict, name: str, capsys):
    """analysis.report's command in this process (its imports paid once): (exit code, stderr, out folder, plan)."""
    from analysis.report import main

    path = tmp / f"{name}.json"
    path.write_text(json.dumps(plan))
    out = tmp / name
    code = main([EXPERIMENT, f"tracking_uri={uri}", f"out={out}", f"plan={path}"])
    return code, capsys.readouterr().err, out, path


def test_arms_above_their_planned_sd_are_flagged_beside_the_verdicts(store, capsys):
    tmp, uri = store
    code, err, out, path = report(tmp, uri, PLAN, "flagged", capsys)
    assert code == 0, err
    md = (out / "index.md").read_text()
    (flag,) = [ln for ln in md.split("## Verdicts per size")[1].splitlines() if ln.startswith("**Seed sd above")]
    sd = {arm: float(np.std(v, ddof=1)) for arm, v in BPB.items()}
    assert f"`baseline` at `m`: {sd['baseline']:.4f}, {sd['baseline'] / 0.01:.2f}× its planned 0.0100" in flag
    assert f"`wide` at `m`: {sd['wide']:.4f}, {sd['wide'] / 0.02:.2f}× its planned 0.0200" in flag
    assert "each pilot sd at its 80% upper confidence bound, plan.sd_at=upper" in flag
    assert "`tight`" not in flag  # secondary: 2.58x its row's 0.001, but its seeds were not planned from an sd
    assert f"plan={path}" in md.split("## Regenerate")[1]  # the command repeats it


def test_within_the_plan_it_says_so(store, capsys):
    tmp, uri = store
    plan = json.loads(json.dumps(PLAN))
    plan["rows"][0] |= {"sd_arm": 0.08, "sd_baseline": 0.013}  # above wide's 0.0775 and the baseline's 0.0129
    code, err, out, _ = report(tmp, uri, plan, "within", capsys)
    assert code == 0, err
    md = (out / "index.md").read_text()
    assert "**Seed sds within the plan**: no arm's seed sd exceeds the sd its seeds were planned for" in md
    assert "Seed sd above" not in md


def test_another_protocols_plan_is_one_line_and_nothing_written(store, capsys):
    tmp, uri = store
    code, err, out, path = report(tmp, uri, PLAN | {"protocol": "other"}, "other", capsys)
    assert code == 2 and not out.exists()
    (line,) = err.strip().splitlines()
    assert f"plan={path}: a plan of protocol 'other'" in line and "verdict=plan-proto json=FILE" in line
    code, err, out, path = report(tmp, uri, {"tool": "ablations.paired"}, "bad", capsys)
    assert code == 2 and not out.exists() and len(err.strip().splitlines()) == 1
    assert "not a plan of python -m sweeps.plan" in err


def test_the_planner_records_the_sd_at_its_upper_bound_when_asked(tmp_path):
    # the known-results plan: the recipe pilot's 5 seeds, sd 0.0075348 (df 4), at its 80% upper bound; the bound
    # from a chi-square table: chi2(4 df) has 20% of its mass below 1.649, so the bound is sd * sqrt(4 / 1.649)
    from test_plan import _spec

    from sweeps.plan import main, planned, settings

    spec = _spec("study", primary_sizes=("m",), sd=None)
    spec.plan |= {"sd_at": "upper"}
    rows = [{"size": s.name, "arm": a, "sd_arm": 0.0075348, "sd_baseline": 0.0075348, "df_arm": 4, "df_baseline": 4,
             "sd_source": "pilot", "detect": 6, "equivalence": 6, "detect_upper": 11, "equivalence_upper": 12}
            for s in spec.sizes for a in ("rope", "alibi", "rms")]
    rec = planned(spec, settings(spec, {"sd": 1.0}), rows)
    assert rec["seeds"] == {"s": 2, "m": 12} and rec["sd_at"] == "upper"
    for r in rec["rows"]:
        assert r["sd_arm"] == pytest.approx(0.0075348 * math.sqrt(4 / 1.649), rel=2e-4)  # 0.011736
        assert r["sd_baseline"] == r["sd_arm"] and r["sd_arm_estimate"] == 0.0075348
        assert r["primary"] == (r["size"] == "m")
    rec = planned(spec, settings(spec, {"sd": 1.0, "sd_at": "estimate"}), rows)
    assert {r["sd_arm"] for r in rec["rows"]} == {0.0075348}
    # the command writes it; a given sd (plan.sd, no degrees of freedom) is planned as given
    path = tmp_path / "plan.json"
    assert main(["verdict=second-study", "sd=0.01", "sd_at=upper", f"json={path}"]) == 0
    rec = json.loads(path.read_text())
    assert rec["protocol"] == "second-study" and rec["sd_given"] == 0.01
    assert {r["sd_arm"] for r in rec["rows"]} == {0.01}


def test_an_unwritable_json_path_is_one_line(tmp_path, capsys):
    from sweeps.plan import main

    bad = tmp_path / "no-such-folder" / "plan.json"
    assert main(["verdict=second-study", "sd=0.01", f"json={bad}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"json={bad}: cannot write it" in line and not bad.parent.exists()
