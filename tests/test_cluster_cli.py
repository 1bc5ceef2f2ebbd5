"""The small parts of the cluster path that need no server: sweeps.submit's command line (worker count, Hydra
overrides, the worker's own arguments carried through Hydra's override grammar intact), the launcher configs, the
checkpoint-upload switch, and the bench's RMSNorm section."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablations.errors import TrackingError
from ablations.tracking import fit_run_name, logs_checkpoints
from sweeps.submit import parse_args, quoted_list

REPO = Path(__file__).resolve().parents[1]


def test_submit_splits_count_overrides_and_worker_args():
    n, hydra_args, worker = parse_args(["8", "hydra/launcher=submitit_slurm", "--", "sweep=lr", "x=1"])
    assert (n, hydra_args, worker) == (8, ["hydra/launcher=submitit_slurm"], ["sweep=lr", "x=1"])
    for bad, says in ((["8", "sweep=lr"], "no `--`"), (["x", "--"], "number of workers"), (["0", "--"], "number"),
                      (["2", "command=sweeps.bogus", "--"], "command=sweeps.run")):
        with pytest.raises(ValueError, match=says):
            parse_args(bad)


@pytest.mark.parametrize("args", [
    ["sweep.storage=postgresql://u:p@db:5432/sweeps", "tracking.uri=http://mlflow-host:5000"],
    ["norm=layernorm,rmsnorm", "x='quoted'", r"path=C:\dir\file", "a=[1, 2]", "empty=", "tail=x\\", "q=it\\'s"],
])
def test_worker_args_survive_hydra_override_grammar(args):
    """Each job's config holds the worker's arguments exactly as typed: Hydra parses the list sweeps.submit builds."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (o,) = OverridesParser.create().parse_overrides([f"args={quoted_list(args)}"])
    assert o.value() == args and not o.is_sweep_override()


@pytest.mark.parametrize("launcher", ["submitit_slurm", "submitit_local"])
def test_launcher_configs_compose_with_the_plugin(launcher):
    """The shipped configs replace the plugin's defaults; every key is one the plugin's launcher knows."""
    from hydra import compose, initialize_config_dir
    from hydra_plugins.hydra_submitit_launcher import config as plugin

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    node = cfg.hydra.launcher
    schema = plugin.SlurmQueueConf if launcher == "submitit_slurm" else plugin.LocalQueueConf
    assert node._target_ == schema._target_
    assert set(node.keys()) <= set(schema.__dataclass_fields__)
    if launcher == "submitit_slurm":
        assert node.gpus_per_node == 1 and node.timeout_min == 240


def test_checkpoint_upload_switch_and_run_names():
    assert logs_checkpoints("auto", "http://h:5000") and logs_checkpoints(None, "https://h")
    assert not logs_checkpoints("auto", "sqlite:///mlflow.db")
    assert logs_checkpoints(True, "sqlite:///x.db") and not logs_checkpoints(False, "http://h:5000")
    with pytest.raises(TrackingError, match="log_checkpoints='yes'"):
        logs_checkpoints("yes", "http://h")
    assert fit_run_name("a" * 250) == "a" * 250
    long = fit_run_name("b" * 300)
    assert len(long) == 250 and long.endswith("...")  # MLflow's runs.name is VARCHAR(250) on PostgreSQL


@pytest.mark.slow
def test_bench_norms_section_reports_the_paired_ratio(tmp_path, capsys):
    """ablations.bench's main in this process, as tests/test_bench.py runs its other sections (threads restored)."""
    import torch

    from ablations import bench

    out, threads = tmp_path / "bench.json", torch.get_num_threads()
    try:
        assert bench.main(["only=norms", "steps=1", "threads=1", "model=tiny", f"json={out}"]) == 0
    finally:
        torch.set_num_threads(threads)
    r = capsys.readouterr()
    norms = json.loads(out.read_text())["norms"]
    assert set(norms["paired"]) == set(norms["in_training"]) == {"32-true", "bf16-mixed"}  # both precisions
    for precision, paired in norms["paired"].items():
        assert paired["command"].startswith("python -m ablations.paired model=tiny ")
        assert f"trainer.precision={precision}" in paired["command"] and paired["precision"] == precision
        assert paired["ratio_rmsnorm_over_layernorm"] > 0 and set(paired["tokens_per_sec"]) == {"layernorm", "rmsnorm"}
        for norm in ("layernorm", "rmsnorm"):  # tiny: 2 blocks x 2 norms + the final norm, each timed both ways
            t = norms["in_training"][precision][norm]
            assert t["calls_per_step"] == 5 and t["forward"] > 0 and t["backward"] > 0
    assert {"layernorm fwd+bwd", "rmsnorm fwd+bwd", "empty autograd.Function"} <= set(norms["kernel_seconds"])
    assert norms["rmsnorm_floor"] in ("forward", "backward", "autograd.Function")
    assert "paired training rmsnorm / layernorm (tiny, 32-true)" in r.out
    assert "paired training rmsnorm / layernorm (tiny, bf16-mixed)" in r.out
