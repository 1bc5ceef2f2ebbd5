"""Reproducibility: same config + seed => the same loss curve in MLflow, bit for bit (CPU, 32-true, with dropout);
another seed differs; the run records its environment; `python -m ablations.rerun` reproduces a recorded run."""
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
CURVES = ("train/loss", "val/loss")


def overrides(shakespeare_path, db: Path, **extra):
    args = {"model": "tiny", "data": "shakespeare", "data.path": str(shakespeare_path), "tokenizer": "char",
            "data.batch_size": 8, "data.val_windows": 16, "trainer.max_steps": 16, "trainer.val_check_interval": 4,
            "trainer.log_every_n_steps": 1, "trainer.precision": "32-true", "trainer.enable_progress_bar": "false",
            "model.dropout": 0.1,  # dropout draws from the global RNG: the strictest case
            "checkpoint.every_n_steps": 8, "checkpoint.dir": str(db.parent / "ckpt"),
            "generate.max_new_tokens": 8, "generate.bench_decode_tokens": 4, "generate.bench_prefill_tokens": 16,
            "tracking.uri": f"sqlite:///{db}", "tracking.experiment": "repro", "seed": 3}
    args.update(extra)
    return [f"{k}={v}" for k, v in args.items()]


def train_in_process(args):
    from hydra import compose, initialize_config_dir

    from ablations.train import train

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=args, return_hydra_config=True)
    return train(cfg)["run_id"]


def curve(cl, run_id, key):
    from ablations.repro import metric_curve

    return metric_curve(cl, run_id, key)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shakespeare_path):
    """A: the real CLI in a subprocess; C (seed 4) then B (seed 3, same config as A) in this process, so B runs
    after a peak-FLOP/s probe was cached and Lightning/MLflow ran once: nothing of that may move its curve;
    D: `ablations.rerun` of A (its CLI entry point, in process)."""
    from mlflow import MlflowClient

    tmp = tmp_path_factory.mktemp("repro")
    db = tmp / "mlflow.db"
    cache = str(tmp / "token-cache")
    os.environ["ABLATIONS_CACHE_DIR"] = cache  # same token cache for the subprocess and this process
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(PYTHONPATH=str(REPO), HYDRA_FULL_ERROR="0", OMP_NUM_THREADS="1")  # tiny models: 1 thread is fastest
    r = subprocess.run([sys.executable, "-m", "ablations.run", *overrides(shakespeare_path, db)], cwd=tmp, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    cl = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = cl.get_experiment_by_name("repro")
    (a,) = [x.info.run_id for x in cl.search_runs([exp.experiment_id])]
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # the same thread count as A (it decides the float reduction order)
    try:
        c = train_in_process(overrides(shakespeare_path, db, seed=4))
        b = train_in_process(overrides(shakespeare_path, db))
    finally:
        torch.set_num_threads(n)
    return {"cl": cl, "db": db, "A": a, "B": b, "C": c, "tmp": tmp}


@pytest.mark.slow
def test_same_config_and_seed_gives_identical_curves(runs):
    cl = runs["cl"]
    for key in CURVES:
        a, b = curve(cl, runs["A"], key), curve(cl, runs["B"], key)
        assert len(a) == (16 if key == "train/loss" else 4)
        assert a == b, f"{key} differs between two runs of the same config and seed"
    ma, mb = cl.get_run(runs["A"]).data.metrics, cl.get_run(runs["B"]).data.metrics
    assert ma["final_val_loss"] == mb["final_val_loss"] and ma["final_val_bpb"] == mb["final_val_bpb"]
    sample = [Path(cl.download_artifacts(r, "sample.txt", str(runs["tmp"] / f"s{r}"))).read_text()
              for r in (runs["A"], runs["B"])]
    assert sample[0] == sample[1]


@pytest.mark.slow
def test_different_seed_differs(runs):
    cl = runs["cl"]
    for key in CURVES:
        a, c = curve(cl, runs["A"], key), curve(cl, runs["C"], key)
        assert [s for s, _ in a] == [s for s, _ in c]
        assert all(x != y for (_, x), (_, y) in zip(a, c)), f"{key}: seeds 3 and 4 gave equal values"
    ta, tc = cl.get_run(runs["A"]).data.tags, cl.get_run(runs["C"]).data.tags
    assert (ta["seed"], tc["seed"]) == ("3", "4") and ta["variant"] == tc["variant"]


@pytest.mark.slow
def test_run_records_its_environment(runs):
    from ablations.repro import ENV_TAGS

    tags = runs["cl"].get_run(runs["A"]).data.tags
    missing = [t for t in ENV_TAGS if t not in tags and t != "cudnn_version"]
    assert not missing, f"environment tags missing: {missing}"
    assert tags["python_version"] == platform.python_version()
    assert tags["torch_version"] == torch.__version__
    assert tags["num_threads"] == "1" and tags["omp_num_threads"] == "1"
    assert tags["precision"] == "32-true" and tags["device"] == "cpu" and tags["deterministic"] == "false"
    assert tags["cuda_version"] == "none" and tags["cpu_model"] and tags["cpu_capability"]
    assert tags["malloc"].startswith("glibc, freed memory kept")  # training kept it (ablations.malloc)
    assert tags["git_dirty"] in ("true", "false")
    assert len(tags["git_commit"]) == 40 or tags["git_commit"] == "unknown"
    assert (tags["git_diff_hash"] == "clean") == (tags["git_dirty"] == "false")
    assert len(tags["data_fingerprint"]) == 64
    # the config is an artifact from the start (a FAILED run can be re-run too)
    assert "config.yaml" in {f.path for f in runs["cl"].list_artifacts(runs["A"])}


def test_deterministic_flag_is_recorded():
    from ablations.repro import environment_tags

    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert environment_tags("cpu")["deterministic"] == "true"
    finally:
        torch.use_deterministic_algorithms(was)


@pytest.mark.slow
def test_rerun_reproduces_the_original(runs, capsys):
    from ablations import rerun

    cl, a = runs["cl"], runs["A"]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # not the original's 1 (the tests' default, tests/conftest.py): switched and back
    try:
        code = rerun.main([f"run_id={a}", f"tracking.uri=sqlite:///{runs['db']}", "check=true"])
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert code == 0, out
    assert after == 2  # matched the original's 1 thread only for the re-run
    assert f"reproduces {a}: identical curves" in out
    exp = cl.get_experiment_by_name("repro")
    (d,) = cl.search_runs([exp.experiment_id], filter_string=f"tags.rerun_of = '{a}'")
    assert d.info.status == "FINISHED"
    for key in CURVES:
        assert curve(cl, d.info.run_id, key) == curve(cl, a, key)
    orig = cl.get_run(a)
    for k, v in orig.data.tags.items():
        if k == "variant" or k.startswith("choice."):
            assert d.data.tags.get(k) == v, k
    assert d.data.tags["rerun_match"] == "identical" and d.data.tags["rerun_overrides"] == "none"
    assert d.info.run_name == orig.info.run_name
    assert d.data.params == orig.data.params


@pytest.mark.slow
def test_rerun_errors_are_one_line(runs, capsys):
    from ablations import rerun

    uri = f"sqlite:///{runs['db']}"
    assert rerun.main(["run_id=0123456789abcdef", f"tracking.uri={uri}"]) == 2
    assert "not found" in capsys.readouterr().err
    assert rerun.main([f"run_id={runs['A']}", f"tracking.uri={uri}", "optim.lrr=1"]) == 2
    assert "optim.lrr is not a key of the recorded config" in capsys.readouterr().err
    assert rerun.main([f"run_id={runs['A']}", f"tracking.uri={uri}", "norm=rmsnorm"]) == 2
    assert "group choice" in capsys.readouterr().err
    assert rerun.main([f"tracking.uri={uri}"]) == 2
    assert "run_id=<MLflow run id> is required" in capsys.readouterr().err


def test_rerun_overrides_name_variant_and_values():
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from ablations.rerun import apply_overrides, rerun_tags, run_name

    cfg = OmegaConf.create({"seed": 1, "model": {"n_layer": 2}, "optim": {"lr": 0.003}, "resume": None})
    out = apply_overrides(cfg, ["seed=2", "optim.lr=1e-3", "+optim.foo=null"])
    assert out.seed == 2 and out.optim.lr == pytest.approx(1e-3) and out.optim.foo is None and cfg.seed == 1
    assert run_name("norm=rmsnorm seed=1", ["seed=2", "tracking.uri=x"]) == "norm=rmsnorm seed=2"
    assert run_name("default", ["optim.lr=0.01"]) == "optim.lr=0.01"
    run = SimpleNamespace(info=SimpleNamespace(run_id="abc", run_name="norm=rmsnorm seed=1"),
                          data=SimpleNamespace(tags={"variant": "norm=rmsnorm", "choice.norm": "rmsnorm",
                                                     "multirun_group": "g", "optuna.trial": "3"}))
    t = rerun_tags(run, ["seed=2", "checkpoint.dir=/x"])
    assert t["variant"] == "norm=rmsnorm" and t["choice.norm"] == "rmsnorm" and t["rerun_of"] == "abc"
    assert "multirun_group" not in t and "optuna.trial" not in t
    assert rerun_tags(run, ["optim.lr=0.01"])["variant"] == "norm=rmsnorm optim.lr=0.01"


def test_config_dir_shadowing_is_refused(tmp_path):
    from ablations.compose import check_config_dir

    (tmp_path / "config.yaml").write_text("seed: 1\n")
    err = check_config_dir(["--config-dir", str(tmp_path), "trainer.max_steps=5"])
    assert err and "--config-path" in err and "ablations.rerun" in err
    assert check_config_dir([f"--config-path={tmp_path}", "--config-name", "config"]) is None
    assert check_config_dir(["--config-dir", str(tmp_path), "--config-name", "other"]) is None
