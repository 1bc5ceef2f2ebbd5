"""`ablations.train.train` called in-process (as the sweeps do): bad input fails clearly and leaves nothing behind."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from optuna import TrialPruned  # train() recognises it (isinstance) and ends the run as KILLED

from ablations.errors import CheckpointError, DataError, TrackingError
from ablations.train import config_hash, train
from faults import PruneAt

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def cfg_for(tmp: Path, shakespeare_path, *overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=[
            "model=tiny", "data=shakespeare", f"data.path={shakespeare_path}", "tokenizer=byte", "data.batch_size=4",
            "data.val_windows=8", "trainer.max_steps=6", "trainer.val_check_interval=3", "checkpoint.every_n_steps=2",
            "trainer.enable_progress_bar=false", "generate.max_new_tokens=8", f"data.cache_dir={tmp / 'cache'}",
            f"checkpoint.dir={tmp / 'ckpt'}", f"tracking.uri=sqlite:///{tmp}/mlflow.db", *overrides])


def runs(tmp: Path):
    from mlflow import MlflowClient

    if not (tmp / "mlflow.db").exists():
        return []
    c = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    exp = c.get_experiment_by_name("ablations")
    return [] if exp is None else c.search_runs([exp.experiment_id])


@pytest.fixture(autouse=True)
def _no_env_uri(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_unreachable_tracking_uri_fails_before_anything(tmp_path, shakespeare_path):
    cfg = cfg_for(tmp_path, shakespeare_path, "tracking.uri=http://127.0.0.1:9")
    with pytest.raises(TrackingError, match=r"tracking.uri=http://127.0.0.1:9 is unreachable .*sqlite:///mlflow.db"):
        train(cfg)
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "cache").exists()


def test_corpus_shorter_than_a_window_creates_no_run(tmp_path, shakespeare_path):
    short = tmp_path / "short.txt"
    short.write_text("a few words\n" * 4)
    cfg = cfg_for(tmp_path, shakespeare_path, "data=text", f"data.path={short}")
    with pytest.raises(DataError, match=r"split has \d+ tokens, fewer than one window of model.block_size\+1=33"):
        train(cfg)
    assert runs(tmp_path) == [] and not (tmp_path / "ckpt").exists()


def test_corrupt_checkpoint_is_refused_before_any_run(tmp_path, shakespeare_path):
    cfg = cfg_for(tmp_path, shakespeare_path, "resume=auto")
    d = tmp_path / "ckpt" / config_hash(cfg)[:16]
    d.mkdir(parents=True)
    (d / "last.ckpt").write_bytes(b"PK\x03\x04 half-written garbage")
    with pytest.raises(CheckpointError, match=r"last.ckpt is corrupt or not a checkpoint .*resume=null"):
        train(cfg)
    assert runs(tmp_path) == []


def test_pruned_trial_is_killed_and_mismatched_resume_is_refused(tmp_path, shakespeare_path):
    cfg = cfg_for(tmp_path, shakespeare_path)
    with pytest.raises(TrialPruned):
        train(cfg, callbacks=[PruneAt(3)], tags={"optuna.trial": "7", "mlflow.runName": "trial-7"})
    (run,) = runs(tmp_path)
    assert run.info.status == "KILLED" and run.data.tags["pruned"] == "true" and run.info.run_name == "trial-7"
    assert run.data.tags["optuna.trial"] == "7" and "failure_reason" not in run.data.tags
    last = tmp_path / "ckpt" / config_hash(cfg)[:16] / "last.ckpt"
    assert last.is_file()
    bigger = cfg_for(tmp_path, shakespeare_path, "model.n_embd=64", f"resume={last}")
    with pytest.raises(CheckpointError, match=r"does not match this model \(first difference: model\..*resume=null"):
        train(bigger)
    assert len(runs(tmp_path)) == 1  # the refused resume created nothing
    # and the checkpoint itself resumes: same run, FINISHED, continues from step 2
    out = train(cfg_for(tmp_path, shakespeare_path, "resume=auto"))
    (run,) = runs(tmp_path)
    assert out["run_id"] == run.info.run_id and run.info.status == "FINISHED" and out["steps"] == 6
    assert run.data.tags["resumed_from_step"] == "2"
    assert set(out) == {"run_id", "val_loss", "val_bpb", "tokens_per_sec", "mfu", "params", "params_non_embedding",
                        "kv_cache_bytes_per_token", "decode_tokens_per_sec", "flops_per_token", "steps"}
    assert out["val_bpb"] > 0 and out["params"] > 0


@pytest.mark.parametrize("override, match", [
    ("trainer.precision=bf17", r"trainer: Precision 'bf17' is invalid"),
    ("model.n_head=3", r"model: invalid n_embd=32: must be divisible by n_head=3"),
    ("trainer.max_steps=0", r"trainer.max_steps=0 must be a positive integer"),
])
def test_bad_values_fail_before_any_run(tmp_path, shakespeare_path, override, match):
    from ablations.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        train(cfg_for(tmp_path, shakespeare_path, override))
    assert runs(tmp_path) == [] and not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("extra", [[], pytest.param(["trainer=ddp"], marks=pytest.mark.slow)],
                         ids=["one-process", "ddp_spawn"])
def test_nan_loss_raises_divergence_error_and_fails_the_run(tmp_path, shakespeare_path, extra):
    """A NaN loss is a DivergenceError (recognised with isinstance), also when a ddp_spawn worker raises it."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ablations.errors import DivergenceError
    from faults import NanAt

    with pytest.raises(DivergenceError, match=r"training loss is nan at step 2 .*optim.lr"):
        train(cfg_for(tmp_path, shakespeare_path, *extra, "checkpoint.every_n_steps=100"), callbacks=[NanAt(2)])
    (run,) = runs(tmp_path)
    assert run.info.status == "FAILED" and run.data.tags["failure_reason"].startswith("DivergenceError: training loss")
