"""End-to-end: run the real `python -m ablations.run` on the tiny preset and read the MLflow store back."""
import os
import sys
from pathlib import Path

import pytest
import torch
import warm_python

REPO = Path(__file__).resolve().parents[1]

CONTRACT_TAGS = ["variant", "seed", "git_commit", "git_dirty", "data_fingerprint", "tokenizer", "tokenizer_hash",
                 "precision", "device", "torch_version", "lightning_version", "num_threads", "mfu_peak_flops",
                 "mfu_peak_source"] + [f"choice.{g}" for g in ("model", "position", "norm", "mlp", "attention",
                                                                "tokenizer", "data")]
STEP_METRICS = ["train/loss", "val/loss", "val/bpb", "lr", "grad_norm", "tokens_per_sec", "mfu", "tokens_seen",
                "elapsed_sec"]
ONCE_METRICS = ["params", "params_non_embedding", "flops_per_token", "kv_cache_bytes_per_token",
                "prefill_tokens_per_sec", "decode_tokens_per_sec", "decode_tokens_per_sec_nocache",
                "kv_cache_bytes_measured", "final_val_loss", "final_val_bpb", "final_tokens_per_sec", "final_mfu"]


def tiny_args(shakespeare_path, **extra):
    args = {"model": "tiny", "data": "shakespeare", "data.path": str(shakespeare_path), "tokenizer": "char",
            "data.batch_size": 8, "data.val_windows": 16, "trainer.max_steps": 12, "trainer.val_check_interval": 5,
            "trainer.log_every_n_steps": 1, "checkpoint.every_n_steps": 5, "trainer.enable_progress_bar": "false",
            "generate.max_new_tokens": 16, "generate.bench_decode_tokens": 8}
    args.update(extra)
    return [f"{k}={v}" for k, v in args.items()]


def run_cli(cwd: Path, args, env_extra=None, module="ablations.run", timeout=300):
    """`python -m module args` in `cwd` (its token cache beside it, this checkout first on the path) -> the
    CompletedProcess; module=None: `python args` (e.g. `-c CODE ...`)."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update({"ABLATIONS_CACHE_DIR": str(cwd.parent / "token-cache"), "HYDRA_FULL_ERROR": "0",
                "PYTHONPATH": str(REPO)}, **(env_extra or {}))
    cwd.mkdir(parents=True, exist_ok=True)
    return warm_python.run([sys.executable, *(["-m", module] if module else []), *args], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=timeout)


def store(cwd: Path):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{cwd}/mlflow.db")


def runs_of(cwd: Path, experiment="ablations"):
    c = store(cwd)
    exp = c.get_experiment_by_name(experiment)
    return c, ([] if exp is None else c.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"]))


def history(c, run_id, key):
    return [(m.step, m.value) for m in sorted(c.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))]


@pytest.fixture(scope="module")
def single(tmp_path_factory, shakespeare_path):
    """One CLI run of tiny_args (12 steps), its stdout a pipe with the progress bar asked for: the summary line, the
    MLflow record, the artifacts, the progress lines and the uninterrupted reference of the kill/resume test all
    read this one run (trainer.enable_progress_bar does not change the training)."""
    cwd = tmp_path_factory.mktemp("single") / "job"
    r = run_cli(cwd, tiny_args(shakespeare_path, **{"tracking.uri": f"sqlite:///{cwd}/mlflow.db",
                                                    "trainer.enable_progress_bar": "true"}))
    assert r.returncode == 0, r.stderr[-3000:]
    return cwd, r


@pytest.mark.slow
def test_single_run_summary_line(single):
    cwd, r = single
    last = r.stdout.strip().splitlines()[-1]
    c, runs = runs_of(cwd)
    assert len(runs) == 1
    assert last.startswith("[ablations] done: val_loss ") and "val_bpb" in last and "tokens/s" in last
    assert runs[0].info.run_id in last and f"mlflow ui --backend-store-uri sqlite:///{cwd}/mlflow.db" in last


@pytest.mark.slow
def test_single_run_mlflow_record(single, shakespeare_path):
    cwd, _ = single
    c, (run,) = runs_of(cwd)
    assert run.info.status == "FINISHED"
    assert run.info.run_name.startswith("model=tiny data=shakespeare tokenizer=char")
    assert "tracking.uri" not in run.info.run_name and str(shakespeare_path) not in run.info.run_name
    tags = run.data.tags
    missing = [t for t in CONTRACT_TAGS if t not in tags]
    assert not missing, missing
    assert tags["choice.model"] == "tiny" and tags["choice.norm"] == "layernorm" and tags["tokenizer"] == "char"
    assert tags["mfu_peak_source"] in ("measured", "configured") and float(tags["mfu_peak_flops"]) > 0
    assert tags["precision"] in ("bf16-mixed", "32-true") and tags["seed"] == "1337"
    p = run.data.params
    assert p["model.n_layer"] == "2" and p["model.vocab_size"] == "65" and p["optim.lr"] == "0.003"
    assert p["trainer.max_steps"] == "12" and p["data.batch_size"] == "8" and "resume" not in p
    m = run.data.metrics
    missing = [k for k in STEP_METRICS + ONCE_METRICS if k not in m]
    assert not missing, missing
    loss = history(c, run.info.run_id, "train/loss")
    assert [s for s, _ in loss] == list(range(1, 13))
    assert loss[-1][1] < loss[0][1]  # it learns
    assert [s for s, _ in history(c, run.info.run_id, "val/loss")] == [5, 10, 12]  # periodic + final validation
    assert m["final_val_loss"] == m["val/loss"] and m["tokens_seen"] == 12 * 8 * 32
    assert m["val/bpb"] == pytest.approx(m["val/loss"] / 0.6931471805599453, rel=1e-6)  # char: 1 token per byte
    assert m["kv_cache_bytes_measured"] > 0 and m["decode_tokens_per_sec"] > 0


@pytest.mark.slow
def test_single_run_artifacts_and_final_checkpoint(single):
    cwd, _ = single
    c, (run,) = runs_of(cwd)
    names = {a.path for a in c.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "sample.txt", "tokenizer.json", "checkpoints"} <= names
    d = Path(c.download_artifacts(run.info.run_id, "", str(cwd / "dl")))
    assert "n_layer: 2" in (d / "config.yaml").read_text()
    assert len((d / "sample.txt").read_text()) > 0
    ck = torch.load(d / "checkpoints" / "final.ckpt", weights_only=True)
    assert ck["tokenizer"]["name"] == "char" and ck["tokenizer_hash"] == run.data.tags["tokenizer_hash"]
    assert ck["step"] == 12 and "wte.weight" in ck["state_dict"]
    ckdir = next((cwd / "checkpoints").iterdir())
    assert sorted(p.name for p in ckdir.iterdir()) == ["last.ckpt", "run.json"]  # no temp files left


@pytest.mark.slow
def test_generate_cli(single, monkeypatch, capsys):
    """`python -m ablations.generate`'s main, in this process (a second interpreter would only import torch again;
    its --help and entry: tests/test_cli.py)."""
    from ablations.errors import TokenizerError
    from ablations.generate import load_run, main

    cwd, _ = single
    c, (run,) = runs_of(cwd)
    uri = f"tracking.uri=sqlite:///{cwd}/mlflow.db"
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    code = main([f"run_id={run.info.run_id}", "prompt=ROMEO:", "max_new_tokens=40", "temperature=0.7", "top_k=10",
                 "top_p=0.9", uri])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    assert out.out.startswith("ROMEO:") and len(out.out.strip()) >= 40  # crosses block_size=32

    with pytest.raises(TokenizerError, match="tokenizer=byte does not match the checkpoint's tokenizer 'char'"):
        load_run(run.info.run_id, f"sqlite:///{cwd}/mlflow.db", "byte")


@pytest.mark.slow
def test_multirun_two_choices_two_grouped_runs(multirun):
    """`-m position=learned,rope`: the session's multirun (tests/conftest.py; the context-length tests read it too)."""
    r, cwd = multirun.result, multirun.cwd
    assert r.returncode == 0, r.stderr[-3000:]
    c, runs = runs_of(cwd)
    assert len(runs) == 2 and all(x.info.status == "FINISHED" for x in runs)
    assert sorted(x.data.tags["variant"].split()[0] for x in runs) == ["position=learned", "position=rope"]
    assert all("seed=" not in x.data.tags["variant"] and "tracking" not in x.data.tags["variant"] for x in runs)
    assert sorted(x.data.tags["choice.position"] for x in runs) == ["learned", "rope"]
    assert sorted(x.info.run_name.split()[0] for x in runs) == ["position=learned", "position=rope"]
    groups = {x.data.tags.get("multirun_group") for x in runs}
    assert len(groups) == 1 and None not in groups


@pytest.mark.slow
def test_kill_and_resume_is_one_continuous_run(tmp_path, shakespeare_path, single):
    cwd = tmp_path / "resume"
    args = tiny_args(shakespeare_path, **{"tracking.uri": f"sqlite:///{cwd}/mlflow.db"})
    # dies like kill -9 after step 7 (checkpoint at 5): ablations.run with the KillAt callback of tests/faults.py
    r1 = run_cli(cwd, ["kill@7", *args], module="tests.fault_run")
    assert r1.returncode == 137, r1.stderr[-2000:]
    c, runs = runs_of(cwd)
    assert len(runs) == 1 and runs[0].info.status == "RUNNING"  # a killed process cannot clean up
    run_id = runs[0].info.run_id
    assert max(s for s, _ in history(c, run_id, "train/loss")) == 7
    before = dict(history(c, run_id, "train/loss"))

    r2 = run_cli(cwd, [*args, "resume=auto"])
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert f"[ablations] resumed from step 5 (checkpoint checkpoints/" in r2.stdout
    c, runs = runs_of(cwd)
    assert len(runs) == 1 and runs[0].info.run_id == run_id and runs[0].info.status == "FINISHED"
    assert runs[0].data.tags["resumed_from_step"] == "5"
    for key in ("train/loss", "val/loss", "tokens_seen", "params"):  # in logging order: each step once
        steps = [m.step for m in sorted(c.get_metric_history(run_id, key), key=lambda m: (m.timestamp, m.step))]
        assert steps == sorted(set(steps)), (key, steps)
    loss = dict(history(c, run_id, "train/loss"))
    assert sorted(loss) == list(range(1, 13))
    assert {s: loss[s] for s in range(1, 8)} == before  # steps 6, 7 recomputed after the restart, not re-logged
    # same data position + optimizer state: the resumed steps are those of the uninterrupted run (same config)
    sc, (whole,) = runs_of(single[0])
    uninterrupted = dict(history(sc, whole.info.run_id, "train/loss"))
    for s in range(8, 13):
        assert loss[s] == pytest.approx(uninterrupted[s], rel=1e-5), s
    assert dict(history(c, run_id, "tokens_seen"))[12] == 12 * 8 * 32


@pytest.mark.slow
def test_nan_loss_marks_run_failed_and_exits_nonzero(tmp_path, shakespeare_path):
    cwd = tmp_path / "nan"
    r = run_cli(cwd, tiny_args(shakespeare_path, **{"optim.lr": "1e6", "trainer.max_steps": 50,
                                                    "tracking.uri": f"sqlite:///{cwd}/mlflow.db"}))
    assert r.returncode != 0
    err = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "loss is" in err[0] and "optim.lr" in err[0]
    c, (run,) = runs_of(cwd)
    assert run.info.status == "FAILED" and run.data.tags["failure_reason"].startswith("DivergenceError")


def test_unknown_group_option_is_one_line(tmp_path):
    r = run_cli(tmp_path / "bad", ["norm=foo"])
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "norm=foo" in lines[0] and "layernorm, rmsnorm" in lines[0]
    assert not (tmp_path / "bad" / "mlflow.db").exists()


@pytest.mark.slow
def test_ddp_two_cpu_processes_one_run(tmp_path, shakespeare_path):
    cwd = tmp_path / "ddp"
    r = run_cli(cwd, ["trainer=ddp", *tiny_args(shakespeare_path, **{
        "trainer.max_steps": 4, "trainer.val_check_interval": 2, "trainer.log_every_n_steps": 2,
        "checkpoint.every_n_steps": 2, "tracking.uri": f"sqlite:///{cwd}/mlflow.db"})], timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    c, runs = runs_of(cwd)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run = runs[0]
    assert run.data.tags["world_size"] == "2"
    assert dict(history(c, run.info.run_id, "tokens_seen"))[4] == 4 * 8 * 32 * 2  # both ranks' tokens
    assert [s for s, _ in history(c, run.info.run_id, "train/loss")] == [2, 4]  # logged once (rank 0 only)
    assert "final_val_loss" in run.data.metrics


def test_unknown_config_key_is_one_line(tmp_path):
    r = run_cli(tmp_path / "badkey", ["model.n_layers=4"])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.n_layers" in lines[0] and "model.n_layer" in lines[0].split("mean", 1)[1]
    assert not (tmp_path / "badkey" / "mlflow.db").exists()


@pytest.mark.slow
def test_redirected_output_is_progress_lines(single):
    """stdout to a pipe (a log file, CI): a progress line every N steps, no progress-bar carriage returns."""
    _, r = single
    assert "\r" not in r.stdout + r.stderr
    progress = [ln for ln in r.stdout.splitlines() if ln.startswith("[ablations] step ") and "| loss " in ln]
    assert [ln.split()[2] for ln in progress] == [f"{s}/12" for s in range(1, 13)]  # line_every(12, 1) = 1
    assert all("tokens/s" in ln and "| eta " in ln for ln in progress)
    val = [ln.split()[2] for ln in r.stdout.splitlines() if ln.startswith("[ablations] step ") and "| val_loss " in ln]
    assert val == ["5/12", "10/12", "12/12"]  # one line per validation: every 5 steps and the final one


def test_progress_lines_follow_the_logging_cadence():
    """In process, the run above's LineProgress at another cadence: MLflow logging every 2 steps of 100, a line every
    line_every(100, 2) = 6 steps, each at a step whose metrics were just logged, the last step always."""
    import io
    from types import SimpleNamespace

    from ablations.progress import LineProgress, line_every

    max_steps, log_every = 100, 2
    metrics = SimpleNamespace(latest={}, last_val_step=-1)
    out = io.StringIO()
    bar = LineProgress(metrics, line_every(max_steps, log_every), max_steps, stream=out)
    trainer = SimpleNamespace(global_step=0, is_global_zero=True, sanity_checking=False)
    bar.on_train_start(trainer, None)
    for step in range(1, max_steps + 1):
        trainer.global_step = step
        if step % log_every == 0 or step == max_steps:  # what MetricsCallback logs (and then LineProgress reads)
            metrics.latest = {"step": step, "train/loss": 1.0, "tokens_per_sec": 100.0}
        bar.on_train_batch_end(trainer, None, None, None, step - 1)
    steps = [ln.split()[2] for ln in out.getvalue().splitlines()]
    assert steps == [f"{s}/100" for s in (*range(6, 100, 6), 100)]
