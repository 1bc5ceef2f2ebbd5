"""`python -m sweeps.run ... sweep.workers=N|auto`: N local worker processes sharing one study.

The placement (which GPU, which cores, how many threads) is checked with faked device and core lists; two real CPU
workers on tiny trials must use exactly the study's budget, each trial once, none left RUNNING, each trial run by
one of the launched worker processes (the pid on the trial), every run trained with the one thread of its own core.
Whether the two workers' trials overlap in time depends on how fast each process starts on a loaded machine, so it
is not asserted.
"""
import os
import re
import sys

import optuna
import pytest

from sweeps.errors import SweepError
from sweeps.workers import parse_workers, visible_devices, worker_plan
from sweeps_testing import REPO, tiny_overrides, worker_env
import warm_python


def test_one_worker_per_gpu_with_auto():
    slots = worker_plan("auto", ["0", "1", "2"], cores=list(range(12)))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0", "1", "2"]
    assert [s.cores for s in slots] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # the cores split too
    assert [s.env["OMP_NUM_THREADS"] for s in slots] == ["4", "4", "4"]


def test_more_workers_than_gpus_take_turns():
    slots = worker_plan(5, ["4", "6"], cores=list(range(10)))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == ["4", "6", "4", "6", "4"]
    assert sorted(c for s in slots for c in s.cores) == list(range(10))  # disjoint, all used


def test_fewer_workers_than_gpus_use_the_first():
    slots = worker_plan(2, ["0", "1", "2", "3"], cores=[0, 1])
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0", "1"]
    assert [s.cores for s in slots] == [[0], [1]]


def test_cpu_workers_split_the_cores():
    slots = worker_plan(2, [], cores=[0, 1, 2, 3, 4, 5, 6, 7])
    assert [s.cores for s in slots] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [s.overrides for s in slots] == [["threads=4"], ["threads=4"]]
    assert all("CUDA_VISIBLE_DEVICES" not in s.env for s in slots)
    auto = worker_plan("auto", [], cores=[2, 3, 5])  # one per core: the cores this process may use
    assert [s.cores for s in auto] == [[2], [3], [5]] and [s.overrides for s in auto] == [["threads=1"]] * 3
    crowded = worker_plan(3, [], cores=[0, 1])  # more workers than cores: one core each, shared
    assert [s.cores for s in crowded] == [[0], [1], [0]]


def test_visible_devices_from_the_environment():
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "2, 5"}, lambda: 8) == ["2", "5"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}, lambda: 8) == []  # set but empty: no GPU
    assert visible_devices({}, lambda: 3) == ["0", "1", "2"]
    assert visible_devices({}, lambda: 0) == []


@pytest.mark.parametrize("value", [0, -1, "two", 1.5, True])
def test_bad_workers_value_is_one_line(value):
    with pytest.raises(SweepError, match=r"sweep.workers=.* must be a positive integer or auto"):
        parse_workers(value)
    assert parse_workers("auto") == "auto" and parse_workers("3") == 3


@pytest.mark.slow
def test_two_cpu_workers_share_one_study(tmp_path, shakespeare_path):
    env = worker_env(tmp_path / "cache")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    args = ["sweep=lr", "sweep.workers=2", "sweep.n_trials=3", f"sweep.storage=sqlite:///{tmp_path}/optuna.db",
            "sweep.pruner.name=none", "sweep.heartbeat_interval=2", "sweep.grace_period=30",
            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", "tracking.system_metrics=false",
            *tiny_overrides(shakespeare_path, max_steps=10, val_every=5)]
    proc = warm_python.run([sys.executable, "-m", "sweeps.run", *args], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 local workers" in proc.stdout and "exit codes [0, 0]" in proc.stdout
    trials = optuna.load_study(study_name="lr", storage=f"sqlite:///{tmp_path}/optuna.db").get_trials()
    assert len(trials) == 3 and sorted(t.number for t in trials) == [0, 1, 2]  # the budget, exactly
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)  # none left RUNNING
    runs = [t.user_attrs["mlflow_run_id"] for t in trials]
    assert len(set(runs)) == 3  # one MLflow run per trial, none trained twice
    pids = re.findall(r"worker \d: pid (\d+)", proc.stdout)
    assert len(set(pids)) == 2
    assert {t.user_attrs["worker"].rsplit(":", 1)[1] for t in trials} <= set(pids)  # the workers ran them
    if len(os.sched_getaffinity(0)) >= 2:  # each worker pinned to its own core, one thread
        from mlflow import MlflowClient

        c = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
        assert {c.get_run(r).data.tags["num_threads"] for r in runs} == {"1"}
    assert str(REPO) in env["PYTHONPATH"]
