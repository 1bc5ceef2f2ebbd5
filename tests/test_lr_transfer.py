"""analysis.lr_transfer on a synthetic MLflow store whose optima are planted: the right best lr per width, the
right shift/span in grid steps, the right plain statement per panel, and the same bytes on regeneration."""
from __future__ import annotations

import math

import pytest

from analysis import lr_transfer as lt

WIDTHS = (32, 128)  # two widths keep the store small (80 runs): MLflow writes are the test's cost
GRID = tuple(2.0 ** e for e in range(-12, -7))  # 5 lrs, factor 2: steps 0..4
# planted best grid step per width, per (optimizer, parametrization)
PLANTED = {
    ("adamw", "mup"): (2, 2),   # no move: held
    ("muon", "mup"): (2, 3),    # one step up: held (the criterion's boundary)
    ("adamw", "sp"): (3, 0),    # down to the grid's bottom edge: at least 3 steps: failed
    ("muon", "sp"): (3, 4),     # up to the top edge: could be 1 step: not established
}
NOISE = {0: -0.01, 1: 0.01}  # per seed: the seed range at every point is 0.02


def loss(best: int, step: int, seed: int) -> float:
    return 2.0 + 0.1 * (step - best) ** 2 + NOISE[seed]


def _log(cl, exp, params: dict, value: float | None, start: int, status: str = "FINISHED", tags=None):
    from mlflow.entities import Metric, Param, RunTag

    run = cl.create_run(exp, start_time=start)
    tags = {"git_commit": "c0ffee", "git_dirty": "false", **(tags or {})}
    cl.log_batch(run.info.run_id, metrics=[Metric("final_val_loss", value, start, 0)] if value is not None else [],
                 params=[Param(k, str(v)) for k, v in params.items()], tags=[RunTag(k, v) for k, v in tags.items()])
    if status != "RUNNING":
        cl.set_terminated(run.info.run_id, status, end_time=start + 500)
    return run.info.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from ablations.tracking import client as open_store  # a new store: the migrated template

    d = tmp_path_factory.mktemp("lrt")
    uri = f"sqlite:///{d}/mlflow.db"
    cl = open_store(uri)
    exp = cl.create_experiment(lt.EXPERIMENT)
    t = 1_000_000
    ids = {}
    for (o, p), bests in PLANTED.items():
        for w, best in zip(WIDTHS, bests):
            for step, lr in enumerate(GRID):
                for seed in NOISE:
                    t += 1000
                    params = {"optim.name": o, "model.parametrization": p, "model.n_embd": w, "optim.lr": lr,
                              "seed": seed, "trainer.max_steps": 120}
                    if (o, p, w, step) == ("adamw", "sp", 128, 4) and seed == 1:  # diverged: its lr's mean is inf
                        ids["diverged"] = _log(cl, exp, params, None, t, "FAILED",
                                               {"failure_reason": "training loss is nan at step 40 (optim.lr=...)"})
                        continue
                    ids[(o, p, w, step, seed)] = _log(cl, exp, params, loss(best, step, seed), t)
    # an older run of the same point with a much lower loss: superseded by the newer one, else it would win
    old = {"optim.name": "adamw", "model.parametrization": "mup", "model.n_embd": 128, "optim.lr": GRID[0], "seed": 0,
           "trainer.max_steps": 120}
    ids["old"] = _log(cl, exp, old, 0.5, 1000)
    ids["running"] = _log(cl, exp, {**old, "seed": 1}, None, t + 1000, "RUNNING")
    ids["killed"] = _log(cl, exp, {**old, "seed": 0}, None, t + 2000, "KILLED")
    return uri, ids


@pytest.fixture(scope="module")
def analysed(store):
    uri, _ = store
    study = lt.load_study(uri)
    cur = lt.curves(study.points)
    opt = lt.optima(cur)
    return study, cur, opt, lt.transfer(opt)


def test_best_lr_per_width_is_the_planted_one(analysed):
    _, _, opt, _ = analysed
    for (o, p), bests in PLANTED.items():
        got = opt[(opt.optimizer == o) & (opt.parametrization == p)].sort_values("width")
        assert list(got["width"]) == list(WIDTHS)
        assert list(got["step"]) == list(bests)
        assert list(got["best_lr"]) == [GRID[b] for b in bests]
        assert list(got["interior"]) == [0 < b < len(GRID) - 1 for b in bests]
        assert got["spread"].tolist() == pytest.approx([0.02] * 2)  # seed range at the optimum
        assert got["gap"].tolist() == pytest.approx([0.1] * 2)       # next-best lr: one step away, 0.1 * 1^2


def test_shift_span_and_verdict_per_panel(analysed):
    _, _, _, tr = analysed
    got = {(r.optimizer, r.parametrization): (r.shift, r.span, r.least_span, r.interior, r.verdict)
           for r in tr.itertuples()}
    assert got == {("adamw", "sp"): (-3, 3, 3, False, "failed"), ("adamw", "mup"): (0, 0, 0, True, "held"),
                   ("muon", "sp"): (1, 1, 1, False, "not established"), ("muon", "mup"): (1, 1, 1, True, "held")}
    # panel order: rows AdamW then Muon, SP before μP
    assert [(r.optimizer, r.parametrization) for r in tr.itertuples()] == \
        [("adamw", "sp"), ("adamw", "mup"), ("muon", "sp"), ("muon", "mup")]
    s = dict(zip(zip(tr.optimizer, tr.parametrization), tr.statement))
    assert s[("adamw", "mup")].startswith("**Transfer held** for AdamW + μP") and "did not move" in s[("adamw", "mup")]
    assert s[("muon", "mup")].startswith("**Transfer held**") and "moved 1 grid step up" in s[("muon", "mup")]
    assert s[("adamw", "sp")].startswith("**Transfer failed** for AdamW + SP (optimum at the grid's edge at w128)")
    assert "moved 3 grid steps down" in s[("adamw", "sp")] and "at least 3 even if" in s[("adamw", "sp")]
    assert s[("muon", "sp")].startswith("**Transfer not established**") and "edge at w128" in s[("muon", "sp")]


def test_diverged_superseded_and_unfinished_runs(store, analysed):
    _, ids = store
    study, cur, _, _ = analysed
    # the diverged run counts, as an infinite mean at its lr; its finite seed still shows in min
    div = cur[(cur.optimizer == "adamw") & (cur.parametrization == "sp") & (cur.width == 128) & (cur.lr == GRID[4])]
    assert div["diverged"].item() == 1 and div["mean"].item() == math.inf and div["n"].item() == 2
    assert len(study.points) == 4 * 2 * 5 * 2
    reasons = dict(zip(study.left_out.run_id, study.left_out.reason))
    assert reasons[ids["old"]].startswith("superseded by newer run " + ids[("adamw", "mup", 128, 0, 0)])
    assert reasons[ids["running"]] == "run RUNNING"
    assert reasons[ids["killed"]] == "run KILLED"
    assert len(reasons) == 3


def test_report_is_regenerated_byte_for_byte(store, tmp_path):
    uri, _ = store
    a = [p.read_bytes() for p in lt.build(tmp_path, uri)]
    b = [p.read_bytes() for p in lt.build(tmp_path, uri)]
    assert a == b
    text = a[0].decode()
    assert "git commit `c0ffee`" in text and "lr_transfer.svg" in text
    assert "| AdamW | μP | 2 (4x) | +0 | 0 | 0 | yes | 0.020 | **held** |" in text
    assert "| Muon | SP | 2 (4x) | +1 | 1 | 1 | no | 0.020 | not established |" in text
    assert text.startswith("# Learning-rate transfer across width: SP and μP, AdamW and Muon\n")
    assert "`scripts/lr_transfer.sh --report` regenerates" in text
    # its losses are nats per token, not the bits per byte of the verdict reports beside it: every table says so
    assert "| max seed range at optimum (nats per token) |" in text and "| mean loss (nats per token) |" in text
    assert "Mean [min, max] over seeds, nats per token." in text


def test_the_page_names_its_own_script_and_optimizers(store, tmp_path):
    uri, _ = store
    text = lt.build(tmp_path, uri, script="scripts/other.sh")[0].read_text()
    assert "script=scripts/other.sh` from" in text and "`scripts/other.sh --report` regenerates" in text


def test_unknown_experiment_is_one_line(store, capsys):
    uri, _ = store
    assert lt.main([f"tracking_uri={uri}", "experiment=nope", "out=/nonexistent/x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("analysis.lr_transfer: error: no experiment named 'nope'")


@pytest.mark.parametrize("steps, interior, lr_min, verdict, least", [
    ((2, 4), (True, True), (False, False), "failed", 2),              # both interior: least span = span
    ((2, 3), (True, True), (False, False), "held", 1),
    ((1, 0), (True, False), (False, True), "not established", 1),     # bottom edge one step below an interior one
    ((3, 0), (True, False), (False, True), "failed", 3),
    ((0, 4), (False, False), (True, False), "failed", 4),             # bottom edge then top edge: at least 4
    ((4, 0), (False, False), (False, True), "failed", 4),             # top edge then bottom edge
    ((4, 4), (False, False), (False, False), "not established", 0),   # both beyond the top: could be one lr
])
def test_least_span_and_verdict(steps, interior, lr_min, verdict, least):
    import pandas as pd

    opt = pd.DataFrame({"optimizer": "adamw", "parametrization": "sp", "width": [32, 256], "step": steps,
                        "best_lr": [GRID[s] for s in steps], "interior": interior, "lr_min": lr_min,
                        "spread": 0.0})
    t = lt.transfer(opt).iloc[0]
    assert (t.verdict, t.least_span, t.ratio) == (verdict, least, 8)


def test_the_one_entry_writes_the_same_page(store, tmp_path):
    """`python -m analysis.report lr-transfer EXPERIMENT` is the kind the older `analysis.lr_transfer` builds."""
    from analysis.report import main

    uri, _ = store
    old, new = tmp_path / "old", tmp_path / "new"
    lt.build(old, uri)
    assert main(["lr-transfer", "lr-transfer", f"tracking_uri={uri}", f"out={new}"]) == 0
    assert (new / "lr_transfer.svg").read_bytes() == (old / "lr_transfer.svg").read_bytes()
    # the page names its output folder in its command line; everything else is the same
    assert (new / "index.md").read_text().replace(str(new), str(old)) == (old / "index.md").read_text()
