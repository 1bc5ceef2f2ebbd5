"""Several nodes, rehearsed on this machine: `trainer.num_nodes=2` as two torchrun "nodes" of one process each on
127.0.0.1 (docs/cluster.md's command with --nproc_per_node=1), DDP and FSDP. Each node runs the whole command;
Lightning reads torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and starts nothing."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
STEPS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(cwd: Path, args: list[str]) -> list[subprocess.CompletedProcess]:
    """`torchrun --nnodes=2 --node_rank=i --nproc_per_node=1 ... -m ablations.run ARGS` for i = 0, 1 at once."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(ABLATIONS_CACHE_DIR=str(cwd / "token-cache"), PYTHONPATH=str(REPO), HYDRA_FULL_ERROR="0")
    port = free_port()
    procs = [subprocess.Popen([str(TORCHRUN), "--nnodes=2", f"--node_rank={i}", "--nproc_per_node=1",
                               "--master_addr=127.0.0.1", f"--master_port={port}", "-m", "ablations.run", *args],
                              cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


@pytest.mark.parametrize("trainer", [["trainer=ddp", "trainer.strategy=ddp"], ["trainer=fsdp"]],
                         ids=["ddp", "fsdp"])
def test_two_nodes_of_one_process_train_one_run(trainer, tmp_path, shakespeare_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [*trainer, "trainer.devices=1", "trainer.num_nodes=2", "model=tiny", "data=shakespeare",
            f"data.path={shakespeare_path}", "tokenizer=char", "data.batch_size=4", "data.val_windows=8",
            f"trainer.max_steps={STEPS}", f"trainer.val_check_interval={STEPS}", "trainer.log_every_n_steps=1",
            "trainer.enable_progress_bar=false", "trainer.precision=32-true", "generate.max_new_tokens=4",
            "generate.bench_decode_tokens=2", "generate.bench_prefill_tokens=8", "threads=1",
            "tracking.peak_flops=1e11", "tracking.system_metrics=false", f"tracking.uri={uri}"]
    nodes = two_nodes(tmp_path, args)
    for i, r in enumerate(nodes):
        assert r.returncode == 0, (i, r.stderr[-3000:])
    assert "[ablations] done:" in nodes[0].stdout and "[ablations] done:" not in nodes[1].stdout  # rank 0 reports
    cl = MlflowClient(uri)
    (run,) = cl.search_runs([cl.get_experiment_by_name("ablations").experiment_id])  # one run, from rank 0
    assert run.info.status == "FINISHED" and run.data.tags["world_size"] == "2"
    hist = cl.get_metric_history(run.info.run_id, "tokens_seen")
    assert sorted(m.step for m in hist) == list(range(1, STEPS + 1))  # each step once
    assert {m.step: m.value for m in hist}[STEPS] == STEPS * 4 * 32 * 2  # both nodes' tokens
    assert "final_val_loss" in run.data.metrics
