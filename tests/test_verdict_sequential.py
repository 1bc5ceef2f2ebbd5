"""verdict.seeds: sequential (sweeps/verdict.py's sequential_seeds): seeds are added look by look and a comparison
gets no more once the sequential rule (analysis/sequential.py) has decided it; the baseline runs while any comparison
is open; every run carries the design as tags. Training is faked: each run is an MLflow run with a final val bpb
drawn from the arm's true value and seed sd, so the decisions are read from the store as in a real study."""
from __future__ import annotations

import io

import numpy as np
import pytest

from sweeps.protocol import ProtocolArm, ProtocolSpec, Size
from analysis.sequential import Design
from sweeps.verdict import Verdict

# arm -> (true val bpb, seed sd): far is 20 sd better, same is the baseline within 0.001, noisy cannot be decided in 9
TRUTH = {"base": (2.40, 0.002), "far": (2.20, 0.002), "same": (2.40, 0.001), "noisy": (2.41, 0.08)}


@pytest.mark.slow
def test_seeds_stop_once_decided_and_the_baseline_runs_while_any_is_open(tmp_path, monkeypatch):
    from ablations.tracking import client as mlflow_client

    monkeypatch.setattr("sweeps.links.MlflowLinks.check", lambda self: None)
    uri = f"sqlite:///{tmp_path}/m.db"
    trained: dict[str, list[int]] = {}

    def fake_train(cfg, callbacks=(), tags=None):
        arm, seed = tags["verdict.arm"], int(cfg.seed)
        trained.setdefault(arm, []).append(seed)
        mean, sd = TRUTH[arm]
        value = mean + sd * np.random.default_rng(1000 * len(arm) + seed).standard_normal()
        c = mlflow_client(uri)
        exp = c.get_experiment_by_name(cfg.tracking.experiment) or c.get_experiment(
            c.create_experiment(cfg.tracking.experiment))
        run = c.create_run(exp.experiment_id, tags={**tags, "seed": str(seed)})
        c.log_metric(run.info.run_id, "final_val_bpb", float(value))
        c.set_terminated(run.info.run_id)
        return {"val_bpb": float(value), "run_id": run.info.run_id}

    design = Design(first=3, batch=3, cap=9, spending="pocock", alpha=0.05)
    spec = ProtocolSpec(name="seq", experiment=None, baseline="base",
                        arms=[ProtocolArm(a, "f", ()) for a in TRUTH], sizes=[Size("s", 1e8, ())], seeds=9,
                        seeds_largest=9, lr_grid=[1e-3], lr_seed=100, storage=f"sqlite:///{tmp_path}/optuna.db",
                        overrides=["model=tiny", "tokenizer=byte", f"tracking.uri={uri}"], margin=0.02,
                        margin_reason="r", sequential=design, stop_early=True)
    out = io.StringIO()
    v = Verdict(spec, train_fn=fake_train, out=out)
    done = v.sequential_seeds(0, spec.sizes[0], {a: 1e-3 for a in TRUTH})
    log = out.getvalue()
    assert sorted(trained["far"]) == sorted(trained["same"]) == [0, 1, 2], log  # decided at the first look
    assert sorted(trained["noisy"]) == sorted(trained["base"]) == list(range(9)), log  # open to the cap
    assert done == {"base": 9, "far": 3, "same": 3, "noisy": 9}
    assert "look 1 (3 seeds): decided far, same; open noisy" in log and "inconclusive at the cap (9 seeds): noisy" in log
    c = mlflow_client(uri)
    runs = c.search_runs([c.get_experiment_by_name("seq").experiment_id])
    assert len(runs) == 24 and {r.data.tags["verdict.sequential.spending"] for r in runs} == {"pocock"}
    assert {r.data.tags["verdict.sequential.cap"] for r in runs} == {"9"}
    # a re-run continues: nothing is trained again and the same comparisons are decided
    trained.clear()
    assert Verdict(spec, train_fn=fake_train, out=io.StringIO()).sequential_seeds(
        0, spec.sizes[0], {a: 1e-3 for a in TRUTH}) == done
    assert trained == {}


@pytest.mark.slow
def test_the_lr_walk_starts_each_arm_from_the_baselines_lr(tmp_path, monkeypatch):
    """verdict.lr.search: walk. The baseline walks from the middle of its grid, the arm from the baseline's choice;
    each (lr, seed) runs once (a probe's first seed is reused when the walk confirms it)."""
    monkeypatch.setattr("sweeps.links.MlflowLinks.check", lambda self: None)
    trained = []
    optimum = {"base": 4e-3, "arm": 1.6e-2}

    def fake_train(cfg, callbacks=(), tags=None):  # bpb: |log2 distance| from the arm's optimum, seed 101 + 0.001
        lr, seed, arm = float(cfg.optim.lr), int(cfg.seed), tags["verdict.arm"]
        trained.append((arm, lr, seed))
        return {"val_bpb": 2.0 + abs(np.log2(lr / optimum[arm])) * 0.01 + 0.001 * (seed == 101), "run_id": None}

    spec = ProtocolSpec(name="walk", experiment=None, baseline="base",
                        arms=[ProtocolArm("arm", "f", ()), ProtocolArm("base", "f", ())], sizes=[Size("s", 1e8, ())],
                        seeds=1, seeds_largest=1, lr_grid=[1e-3, 2e-3, 4e-3, 8e-3], lr_seed=0,
                        storage=f"sqlite:///{tmp_path}/optuna.db",
                        overrides=["model=tiny", "tokenizer=byte", f"tracking.uri=sqlite:///{tmp_path}/m.db"],
                        margin=0.02, margin_reason="r", lr_seeds=(100, 101), lr_search="walk")
    best = Verdict(spec, train_fn=fake_train, out=io.StringIO()).lr_stages(spec.sizes[0])
    assert best == pytest.approx({"arm": 1.6e-2, "base": 4e-3})
    # the baseline from 2e-3 (the grid's middle): 2e-3, 1e-3, 4e-3, then 8e-3 (worse), the second seed at 4e-3
    assert [t for t in trained if t[0] == "base"] == [
        ("base", 2e-3, 100), ("base", 1e-3, 100), ("base", 4e-3, 100), ("base", 8e-3, 100), ("base", 4e-3, 101)]
    # the arm from 4e-3: 4e-3, 2e-3, 8e-3, 1.6e-2, 3.2e-2 (worse), the second seed at 1.6e-2
    assert sorted(lr for a, lr, s in trained if a == "arm") == [2e-3, 4e-3, 8e-3, 1.6e-2, 1.6e-2, 3.2e-2]
    assert len(trained) == len(set(trained))


def test_sequential_seeds_need_a_design():
    from sweeps.protocol import VerdictError, load_spec

    with pytest.raises(VerdictError, match="verdict.seeds=sequential without verdict.sequential"):
        load_spec(["experiment=norms", "verdict.seeds=sequential", "verdict.sequential=null"])
    p = load_spec(["experiment=norms", "verdict.seeds=4"])  # a fixed count: the design is kept but not used
    assert not p.stop_early and p.seeds == 4 and "verdict.sequential.cap" not in p.tags(p.arms[1], p.sizes[0], "seeds")
