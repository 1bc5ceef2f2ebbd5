"""verdict.lr.seeds: the lr stage picks the lr with the lowest MEAN final val bpb over its seeds, not the first
seed's best. The per-seed values below disagree on the ranking, so the two rules choose different lrs."""
import io
import statistics

import pytest

from sweeps.protocol import ProtocolArm, ProtocolSpec, Size
from sweeps.verdict import Verdict

# (lr, seed) -> final val bpb. Seed 100 ranks 1e-3 first (1.0 < 1.5); seed 101 ranks it last (3.0 > 1.6); the
# means are 2.0 for 1e-3 and 1.55 for 1e-2, so the mean chooses 1e-2 and the first seed alone would choose 1e-3.
BPB = {(1e-3, 100): 1.0, (1e-3, 101): 3.0, (1e-2, 100): 1.5, (1e-2, 101): 1.6}


def test_lr_stage_chooses_by_the_mean_over_its_seeds(tmp_path, monkeypatch):
    # no run reaches MLflow here (the fake training returns no run id): skip creating its store, the test's cost
    monkeypatch.setattr("sweeps.links.MlflowLinks.check", lambda self: None)
    assert statistics.fmean([BPB[1e-2, s] for s in (100, 101)]) < statistics.fmean([BPB[1e-3, s] for s in (100, 101)])
    trained = []

    def fake_train(cfg, callbacks=(), tags=None):  # the lr stage's trials, without training
        key = (float(cfg.optim.lr), int(cfg.seed))
        trained.append(key)
        return {"val_bpb": BPB[key], "run_id": None}

    overrides = ["model=tiny", "tokenizer=byte", f"tracking.uri=sqlite:///{tmp_path}/m.db"]
    spec = ProtocolSpec(name="lrseeds", experiment=None, baseline="a", arms=[ProtocolArm("a", "f", ())],
                        sizes=[Size("s", 1e8, ())], seeds=1, seeds_largest=1, lr_grid=[1e-3, 1e-2], lr_seed=0,
                        storage=f"sqlite:///{tmp_path}/optuna.db", overrides=overrides, margin=0.02,
                        margin_reason="r", lr_seeds=(100, 101))
    out = io.StringIO()
    best = Verdict(spec, train_fn=fake_train, out=out).lr_stage(spec.arms[0], spec.sizes[0])
    assert sorted(trained) == sorted(BPB)  # every lr at both seeds, once
    assert best == pytest.approx(1e-2), out.getvalue()
    assert "best lr 0.01 (at the grid's edge), mean val bpb 1.5500 over seeds [100, 101]" in out.getvalue()


def test_an_arm_searches_its_own_lr_grid(tmp_path, monkeypatch):
    """verdict.arms.<arm>.lr_grid: this arm runs its grid (a wide one, for an lr-sensitivity curve); the others the
    protocol's verdict.lr.grid."""
    monkeypatch.setattr("sweeps.links.MlflowLinks.check", lambda self: None)
    trained = []

    def fake_train(cfg, callbacks=(), tags=None):  # bpb grows with the distance from lr 4e-3
        trained.append(float(cfg.optim.lr))
        return {"val_bpb": abs(float(cfg.optim.lr) - 4e-3), "run_id": None}

    spec = ProtocolSpec(name="armgrid", experiment=None, baseline="a",
                        arms=[ProtocolArm("a", "f", ()), ProtocolArm("wide", "f", (), (1e-3, 4e-3, 1.6e-2))],
                        sizes=[Size("s", 1e8, ())], seeds=1, seeds_largest=1, lr_grid=[8e-3], lr_seed=0,
                        storage=f"sqlite:///{tmp_path}/optuna.db",
                        overrides=["model=tiny", "tokenizer=byte", f"tracking.uri=sqlite:///{tmp_path}/m.db"],
                        margin=0.02, margin_reason="r")
    v = Verdict(spec, train_fn=fake_train, out=io.StringIO())
    assert v.lr_stage(spec.arms[1], spec.sizes[0]) == pytest.approx(4e-3)
    assert sorted(trained) == pytest.approx([1e-3, 4e-3, 1.6e-2])
    trained.clear()
    assert v.lr_stage(spec.arms[0], spec.sizes[0]) == pytest.approx(8e-3)
    assert trained == pytest.approx([8e-3])
