"""Real sweeps on SQLite through ablations.train.train with the tiny model: runs link both ways, resume,
Pareto front, pruning, and optuna-dashboard serving the study."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from sweeps.run import main
from sweeps_testing import REPO, free_port, get_json, tiny_overrides, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def workdir(tmp_path, monkeypatch, tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "sweeps-token-cache"
    monkeypatch.setenv("ABLATIONS_CACHE_DIR", str(cache))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _runs_by_trial(client: MlflowClient, experiment: str, study: str) -> dict[int, object]:
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r}"
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`optuna.study` = '{study}'")
    out = {}
    for r in runs:
        n = int(r.data.tags["optuna.trial"])
        assert n not in out, f"two MLflow runs for trial {n}"
        out[n] = r
    return out


def test_lr_sweep_links_resume_and_dashboard(workdir, shakespeare_path, capsys):
    args = ["sweep=lr", "sweep.n_trials=2", *tiny_overrides(shakespeare_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "best trial" in out and "mlflow_run_id=" in out
    # Re-running resumes the study: n_trials is its total, so n_trials=3 adds exactly one trial.
    assert main([*args, "sweep.n_trials=3"]) == 0
    study = optuna.load_study(study_name="lr", storage="sqlite:///optuna.db")
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert trials[0].params["optim.lr"] == 3.0e-3  # the enqueued baseline ran first
    client = MlflowClient("sqlite:///mlflow.db")
    runs = _runs_by_trial(client, "lr", "lr")
    assert sorted(runs) == [0, 1, 2]
    for t in trials:
        run = runs[t.number]
        # trial -> run and run -> trial
        assert t.user_attrs["mlflow_run_id"] == run.info.run_id
        assert run.info.status == "FINISHED"
        assert run.data.tags["optuna.state"] == "COMPLETE" and run.data.tags["optuna.study"] == "lr"
        assert float(run.data.params["optim.lr"]) == pytest.approx(t.params["optim.lr"])
        assert t.value == pytest.approx(run.data.metrics["final_val_bpb"])
        assert t.user_attrs["metrics"]["kv_cache_bytes_per_token"] > 0

    # optuna-dashboard on 127.0.0.1 serves the study from the same storage
    port = free_port()
    exe = Path(sys.executable).with_name("optuna-dashboard")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from optuna_dashboard._cli import main; main()"]
    proc = subprocess.Popen([*cmd, "sqlite:///optuna.db", "--host", "127.0.0.1", "--port", str(port), "--quiet"],
                            cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        def studies_or_exit():
            assert proc.poll() is None, f"optuna-dashboard exited with {proc.returncode}"
            return get_json(f"{base}/api/studies")["study_summaries"]

        studies = wait_for(studies_or_exit, timeout=60, what="optuna-dashboard /api/studies")
        summary = next(s for s in studies if s["study_name"] == "lr")
        detail = get_json(f"{base}/api/studies/{summary['study_id']}")
        assert len(detail["trials"]) == 3
        attrs = {a["key"]: a["value"] for a in detail["trials"][0]["user_attrs"]}
        assert attrs["mlflow_run_id"] == trials[0].user_attrs["mlflow_run_id"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_pareto_sweep_front(workdir, shakespeare_path, capsys):
    args = ["sweep=pareto", "sweep.n_trials=3", "sweep.sampler.seed=0", "sweep.pruner.name=median",
            *tiny_overrides(shakespeare_path), "model.n_layer=2", "model.n_embd=32"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "pruning is not supported for multi-objective studies" in out
    assert "not searching model.n_embd, model.n_layer" in out
    study = optuna.load_study(study_name="pareto", storage="sqlite:///optuna.db")
    assert len(study.directions) == 3
    finished = [t for t in study.get_trials() if t.state.is_finished()]
    assert len(finished) == 3
    front = study.best_trials
    assert front, "empty Pareto front"
    assert "Pareto front" in out
    for t in front:
        assert f"trial {t.number}: val_bpb=" in out and t.user_attrs["mlflow_run_id"] in out
        assert t.values[1] == t.user_attrs["metrics"]["kv_cache_bytes_per_token"]
    runs = _runs_by_trial(MlflowClient("sqlite:///mlflow.db"), "pareto", "pareto")
    assert {t.number for t in finished} == set(runs)


def test_pruning_prunes_the_bad_region(workdir, shakespeare_path, tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    # Two good learning rates first, then a huge one (NaN loss: FAIL, or pruned at the first validation) and a
    # far too small one (flat loss: pruned by the median rule at the first validation): the study carries on.
    (conf / "sweep" / "prune.yaml").write_text("""
study_name: prune
n_trials: 4
objectives: [{metric: val_bpb, direction: minimize}]
sampler: {name: random, seed: 0}
pruner: {name: median, n_startup_trials: 2, n_warmup_steps: 0, interval_steps: 1}
enqueue:
  - {optim.lr: 0.01}
  - {optim.lr: 0.005}
  - {optim.lr: 300.0}
  - {optim.lr: 1.0e-07}
space:
  optim.lr: {type: categorical, choices: [0.01, 0.005, 1.0e-07, 300.0]}
""")
    overrides = tiny_overrides(shakespeare_path, max_steps=20, val_every=10) + ["optim.warmup_steps=0"]
    assert main(["sweep=prune", *overrides], conf_dir=conf) == 0
    study = optuna.load_study(study_name="prune", storage="sqlite:///optuna.db")
    trials = {t.params["optim.lr"]: t for t in study.get_trials()}
    assert len(trials) == 4
    for lr in (0.01, 0.005):
        assert trials[lr].state == TrialState.COMPLETE, (lr, trials[lr].user_attrs)
    assert trials[300.0].state in (TrialState.PRUNED, TrialState.FAIL)
    if trials[300.0].state == TrialState.FAIL:
        assert trials[300.0].user_attrs["fail_reason"]
    assert trials[1e-7].state == TrialState.PRUNED
    client = MlflowClient("sqlite:///mlflow.db")
    runs = _runs_by_trial(client, "prune", "prune")
    pruned = runs[trials[1e-7].number]
    assert pruned.info.status == "KILLED"
    assert pruned.data.tags["pruned"] == "true" and pruned.data.tags["optuna.state"] == "PRUNED"
    assert trials[1e-7].user_attrs["mlflow_run_id"] == pruned.info.run_id
    assert max(trials[1e-7].intermediate_values) < 20  # stopped before the end of training
