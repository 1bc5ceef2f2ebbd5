"""MLflow system metrics on every run (`tracking.system_metrics`), for the harness's MlflowClient-created runs.

A tiny in-process training with a short sampling interval records `system/cpu_utilization_percentage` and the
memory figures at consecutive steps; the memory in use agrees with psutil's own reading taken during the test;
the monitor thread is gone when the run ends (FINISHED or KILLED); `tracking.system_metrics=false` records none.
"""
import threading
import time
from pathlib import Path

import lightning.pytorch as pl
import psutil
import pytest
from hydra import compose, initialize_config_dir
from optuna import TrialPruned

from ablations.train import config_hash, train
from faults import PruneAt

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def cfg_for(tmp: Path, corpus, *overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=[
            "model=tiny", "data=shakespeare", f"data.path={corpus}", "tokenizer=byte", "data.batch_size=4",
            "data.val_windows=8", "trainer.max_steps=30", "trainer.val_check_interval=15",
            "trainer.enable_progress_bar=false", "generate.max_new_tokens=8", "generate.bench_decode_tokens=4",
            "generate.bench_prefill_tokens=16", "tracking.peak_flops=1e12", "trainer.precision=32-true",
            f"data.cache_dir={tmp / 'cache'}", f"checkpoint.dir={tmp / 'ckpt'}",
            f"tracking.uri=sqlite:///{tmp}/mlflow.db", "tracking.system_metrics_interval=0.3", *overrides])


def client(tmp: Path):
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{tmp}/mlflow.db")


def monitor_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "SystemMetricsMonitor" and t.is_alive()]




@pytest.fixture(autouse=True)
def _no_env_uri(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", raising=False)


class _PauseAt(pl.Callback):
    """Sleeps `seconds` once at step `step`: the run outlasts several sampling intervals however fast or loaded the
    machine is (a sleep releases the GIL, so the monitor thread samples meanwhile)."""

    def __init__(self, step: int, seconds: float):
        self.step, self.seconds, self.done = step, seconds, False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step and not self.done:
            self.done = True
            time.sleep(self.seconds)


def test_run_records_system_metrics(tmp_path, shakespeare_path, one_thread):
    used_mb = psutil.virtual_memory().used / 1e6
    out = train(cfg_for(tmp_path, shakespeare_path), callbacks=[_PauseAt(10, 1.5)])  # >= 5 intervals of 0.3 s
    assert not monitor_threads()  # stopped with the run
    c = client(tmp_path)
    run = c.get_run(out["run_id"])
    assert run.info.status == "FINISHED"
    m = run.data.metrics
    assert 0.0 <= m["system/cpu_utilization_percentage"] <= 100.0
    assert 0.0 < m["system/system_memory_usage_percentage"] < 100.0
    # the machine's memory in use, as psutil read it before the run: same order (other jobs come and go)
    assert 0.5 * used_mb < m["system/system_memory_usage_megabytes"] < 2.0 * used_mb + 2000
    steps = [h.step for h in c.get_metric_history(out["run_id"], "system/cpu_utilization_percentage")]
    assert steps == list(range(len(steps))) and len(steps) >= 2  # a sample per interval, and the last one at the end
    assert not any(k.startswith("system/gpu") for k in m)  # no GPU here


def test_switch_off_records_none(tmp_path, shakespeare_path, one_thread):
    cfg = cfg_for(tmp_path, shakespeare_path, "tracking.system_metrics=false")
    out = train(cfg)
    m = client(tmp_path).get_run(out["run_id"]).data.metrics
    assert m["final_val_loss"] > 0  # the run itself is complete
    assert not [k for k in m if k.startswith("system/")]
    # how a run is watched does not decide which checkpoint it resumes
    assert config_hash(cfg) == config_hash(cfg_for(tmp_path, shakespeare_path))


def test_killed_run_stops_its_monitor(tmp_path, shakespeare_path, one_thread):
    with pytest.raises(TrialPruned):
        train(cfg_for(tmp_path, shakespeare_path), callbacks=[PruneAt(3)])
    assert not monitor_threads()
    c = client(tmp_path)
    (run,) = c.search_runs([c.get_experiment_by_name("ablations").experiment_id])
    assert run.info.status == "KILLED"
    assert "system/cpu_utilization_percentage" in run.data.metrics  # the last sample went in before the end
