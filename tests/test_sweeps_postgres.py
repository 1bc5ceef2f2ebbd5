"""Many workers against a real PostgreSQL server: an exact shared trial budget, and a killed worker's trial retried.

The server: $ABLATIONS_TEST_POSTGRES_URL (any database on it; .ci/run sets it), else a throwaway cluster started
with initdb/pg_ctl (Debian's postgresql package), one for the session (tests/conftest.py: pg_server, pg_url). Missing
PostgreSQL FAILS these tests when CI=true, and skips them with the reason otherwise. Each test gets a fresh database.
"""
from __future__ import annotations

import os
import signal
import time
from collections import Counter

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from sweeps.storage import normalize_url, retried_numbers
from sweeps_testing import start_worker, tiny_overrides, wait_for, worker_env

pytestmark = pytest.mark.slow


def _args(url: str, n_trials: int, corpus, max_steps: int) -> list[str]:
    return ["sweep=lr", f"sweep.storage={url}", f"sweep.n_trials={n_trials}", "sweep.heartbeat_interval=1",
            "sweep.grace_period=5", "sweep.enqueue=[]", "sweep.study_name=pg", "sweep.pruner.name=none",
            *tiny_overrides(corpus, max_steps=max_steps, val_every=max_steps)]


def _finish(procs, timeout: float = 240):
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except Exception:
            os.killpg(p.pid, signal.SIGKILL)
            raise


def _check_links(study: optuna.Study, client: MlflowClient) -> None:
    for t in study.get_trials():
        if t.state == TrialState.COMPLETE:
            run = client.get_run(t.user_attrs["mlflow_run_id"])
            assert run.info.status == "FINISHED"
            assert run.data.tags["optuna.study"] == "pg" and run.data.tags["optuna.trial"] == str(t.number)


def test_two_workers_share_an_exact_budget(pg_url, tmp_path, tmp_path_factory, shakespeare_path):
    env = worker_env(tmp_path_factory.getbasetemp() / "sweeps-token-cache")
    n = 4
    args = _args(pg_url, n, shakespeare_path, max_steps=40)
    logs = [tmp_path / f"worker{i}.log" for i in (1, 2)]
    procs = [start_worker(args, tmp_path, env, log) for log in logs]
    try:
        _finish(procs)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    outputs = [log.read_text() for log in logs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    study = optuna.load_study(study_name="pg", storage=normalize_url(pg_url))
    trials = study.get_trials()
    states = Counter(t.state for t in trials)
    assert states == Counter({TrialState.COMPLETE: n}), (states, outputs)  # none lost, none RUNNING, no extra
    assert sorted(t.number for t in trials) == list(range(n))  # none duplicated
    run_ids = [t.user_attrs["mlflow_run_id"] for t in trials]
    assert len(set(run_ids)) == n
    # both workers took part, each trial ran exactly once
    started = [line for out in outputs for line in out.splitlines() if " start" in line and "] trial " in line]
    assert len(started) == n, outputs
    assert all(" COMPLETE " in out for out in outputs), outputs
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("pg")
    runs = client.search_runs([exp.experiment_id])
    assert sorted(int(r.data.tags["optuna.trial"]) for r in runs) == list(range(n))
    _check_links(study, client)


def test_killed_worker_trial_is_retried(pg_url, tmp_path, tmp_path_factory, shakespeare_path):
    env = worker_env(tmp_path_factory.getbasetemp() / "sweeps-token-cache")
    n = 2
    args = _args(pg_url, n, shakespeare_path, max_steps=300)
    victim = start_worker(args, tmp_path, env, tmp_path / "victim.log")
    # one storage (one connection pool) for the polling: a new one per poll would hold a connection each until
    # collected, and the server's max_connections is shared with the workers
    polled = optuna.storages.RDBStorage(normalize_url(pg_url))
    try:
        def training():
            study = optuna.load_study(study_name="pg", storage=polled)
            running = [t for t in study.get_trials() if t.state == TrialState.RUNNING]
            return running and "mlflow_run_id" in running[0].user_attrs and running[0]

        killed = wait_for(training, timeout=180, interval=0.3, what="the first trial to start training")
    finally:
        os.killpg(victim.pid, signal.SIGKILL)  # mid-trial: no chance to clean up
        victim.wait(timeout=30)
        polled.engine.dispose()
    survivor = start_worker(args, tmp_path, env, tmp_path / "survivor.log")
    try:
        _finish([survivor])
    finally:
        if survivor.poll() is None:
            os.killpg(survivor.pid, signal.SIGKILL)
    out = (tmp_path / "survivor.log").read_text()
    assert survivor.returncode == 0, out
    study = optuna.load_study(study_name="pg", storage=normalize_url(pg_url))
    trials = study.get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)], out
    dead = trials[killed.number]
    assert dead.state == TrialState.FAIL and "worker lost" in dead.user_attrs["fail_reason"]
    assert retried_numbers(trials) == {killed.number}
    retry = next(t for t in trials if t.user_attrs.get("retry_of") == killed.number)
    assert retry.state == TrialState.COMPLETE and retry.params == killed.params
    assert retry.user_attrs["mlflow_run_id"] != killed.user_attrs["mlflow_run_id"]
    # the study completed its budget: n finished trials besides the one that was replaced by its retry
    assert len([t for t in trials if t.state.is_finished() and t.number != killed.number]) == n
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    dead_run = client.get_run(killed.user_attrs["mlflow_run_id"])
    assert dead_run.info.status == "KILLED" and dead_run.data.tags["optuna.state"] == "FAIL"
    assert "worker lost" in dead_run.data.tags["failure_reason"]
    assert client.get_run(retry.user_attrs["mlflow_run_id"]).data.tags["optuna.retry_of"] == str(killed.number)
    _check_links(study, client)
