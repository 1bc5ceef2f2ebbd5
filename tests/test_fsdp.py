"""trainer=fsdp (FSDP2 through Lightning's ModelParallelStrategy, ablations/sharding.py) on 2 CPU processes over gloo.

The reference of every FSDP run is one process at the same global batch: with trainer.devices=2 and
data.batch_size=4, rank r's batch j is global batch 2j + r of 4 windows, i.e. the windows 8j .. 8j + 7 that one
process reads as its batch j of 8 (ablations/data.py), so the two runs see the same tokens at every step and their
losses may differ only by the order of float additions.
"""
import os
from pathlib import Path

import pytest
import torch

from ablations.errors import CheckpointError, ConfigError

REPO = Path(__file__).resolve().parents[1]
STEPS = 20
LLAMA = ["position=rope", "attention=gqa", "mlp=swiglu", "norm=rmsnorm"]
# float32 sums in another order (a reduce-scatter of two half-batch gradients against one full-batch gradient),
# compounded by 20 AdamW steps: measured <= 1.3e-7 relative (both models, every step and validation); a block whose
# gradient is not reduced (planted: set_requires_gradient_sync(False) on block 0) is off by 1.1e-4 at step 2.
REL = 1e-5


def overrides(cwd: Path, shakespeare_path, *extra):
    return ["model=tiny", "data=shakespeare", f"data.path={shakespeare_path}", "tokenizer=char",
            "data.val_windows=8", f"trainer.max_steps={STEPS}", "trainer.val_check_interval=10",
            "trainer.log_every_n_steps=1", "checkpoint.every_n_steps=5", "trainer.enable_progress_bar=false",
            "trainer.precision=32-true", "generate.max_new_tokens=4", "generate.bench_decode_tokens=2",
            "generate.bench_prefill_tokens=8", "threads=1", "tracking.peak_flops=1e11", "tracking.system_metrics=false",
            f"tracking.uri=sqlite:///{cwd}/mlflow.db", *extra]


def one_process(cwd, shakespeare_path, *extra):
    return [*overrides(cwd, shakespeare_path, *extra), "data.batch_size=8"]


def fsdp(cwd, shakespeare_path, devices, *extra):
    return [*overrides(cwd, shakespeare_path, *extra), "trainer=fsdp", f"trainer.devices={devices}",
            f"data.batch_size={8 // devices}"]


def losses(cwd: Path, run_id: str, key="train/loss") -> dict:
    from mlflow import MlflowClient

    hist = MlflowClient(f"sqlite:///{cwd}/mlflow.db").get_metric_history(run_id, key)
    steps = [m.step for m in hist]
    assert len(steps) == len(set(steps)), (key, sorted(steps))  # each step logged once (rank 0 alone)
    return {m.step: m.value for m in hist}


def assert_same_trajectory(got: dict, want: dict, steps):
    for s in steps:
        assert got[s] == pytest.approx(want[s], rel=REL), (s, got[s], want[s])


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("fsdp-token-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ABLATIONS_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def reference(tmp_path_factory, shakespeare_path, train_here, cache):
    """One process, 20 steps at a global batch of 8, rope + GQA + SwiGLU + RMSNorm: (train losses, val losses)."""
    cwd = tmp_path_factory.mktemp("one-llama")
    res = train_here(cwd, one_process(cwd, shakespeare_path, *LLAMA))
    return losses(cwd, res["run_id"]), losses(cwd, res["run_id"], "val/loss")


@pytest.mark.slow
def test_sharded_training_and_resume_across_world_sizes_is_one_exact_run(tmp_path, shakespeare_path, train_here,
                                                                          reference):
    """Rope + GQA + SwiGLU + RMSNorm, sharded on 2 processes, killed after step 7 (checkpoint at 5) -> resumed on 1
    (resume=PATH), killed after 12 (checkpoint at 10) -> the same command with resume=auto, killed after 16
    (checkpoint at 15) -> resumed on 2 to step 20: one MLflow run whose every step's loss and both validations equal
    the uninterrupted one-process run's at the same global batch (so steps 1-7 and 16-20 are FSDP on 2 processes
    against one process, steps 8-15 the sharded checkpoints read by one). The launch paths' other halves: the
    default model in tests/test_nodes.py (two torchrun nodes), every variant's gradient below."""
    from faults import KillAt
    from mlflow import MlflowClient

    def segment(devices, name, *extra, callbacks=()):
        return train_here(tmp_path, [*fsdp(tmp_path, shakespeare_path, devices, *LLAMA), f"checkpoint.dir={name}",
                                     *extra], callbacks=callbacks)

    with pytest.raises(Exception):  # the workers die like kill -9; the parent marks the run FAILED
        segment(2, "a", callbacks=[KillAt(7)])
    (first,) = (tmp_path / "a").glob("*/last.ckpt")
    # sharded for real: the checkpoint is one shard per rank (torch.distributed.checkpoint), the link to it atomic
    assert first.is_symlink() and sorted(p.name for p in first.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    # a sharded checkpoint needs the sharded strategy: refused in one line before any run is touched
    with pytest.raises(CheckpointError, match=r"is sharded \(trainer.strategy=fsdp\): resume it with trainer=fsdp"):
        train_here(tmp_path, [*one_process(tmp_path, shakespeare_path, *LLAMA), f"resume={first}"])
    with pytest.raises(Exception):
        segment(1, "b", f"resume={first}", callbacks=[KillAt(12)])
    with pytest.raises(Exception):  # resume=auto finds this config's link to its step-10 folder
        segment(1, "b", "resume=auto", callbacks=[KillAt(16)])
    (third,) = (tmp_path / "b").glob("*/last.ckpt")
    assert os.readlink(third).startswith("shards-15-")
    res = segment(2, "c", f"resume={third}")

    cl = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = cl.search_runs([cl.get_experiment_by_name("ablations").experiment_id])
    assert run.info.run_id == res["run_id"] and run.info.status == "FINISHED"
    assert run.data.tags["resumed_from_step"] == "15" and run.data.tags["world_size"] == "2"
    got = losses(tmp_path, res["run_id"])
    assert sorted(got) == list(range(1, STEPS + 1))
    want_train, want_val = reference
    assert_same_trajectory(got, want_train, range(1, STEPS + 1))
    assert_same_trajectory(losses(tmp_path, res["run_id"], "val/loss"), want_val, (10, 20))
    # the run's final weights are the gathered full model: its final checkpoint's val loss is the run's last one
    assert res["val_loss"] == pytest.approx(want_val[20], rel=REL)


def _variant_worker(rank: int, world: int, port: int, configs: list, out: str) -> None:
    """One rank: each config's GPT sharded by ablations.sharding.shard_model, one forward and backward on this
    rank's half of a batch; rank 0 compares the reduced gradients with one process's on the whole batch."""
    import json

    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from ablations.sharding import shard_model
    from modules.config import GPTConfig
    from modules.gpt import GPT

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    worst = []

    def loss_of(model, x, y):
        logits = model(x)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))

    for d in configs:
        cfg = GPTConfig.from_dict(d)
        torch.manual_seed(0)
        model = GPT(cfg)
        x = torch.randint(0, cfg.vocab_size, (4, 17), generator=torch.Generator().manual_seed(1))
        x, y = x[:, :-1], x[:, 1:]  # (4, 16) inputs, targets shifted by one
        ref = GPT(cfg)
        ref.load_state_dict(model.state_dict())
        shard_model(model, mesh, "32-true")
        loss_of(model, x[2 * rank:2 * rank + 2], y[2 * rank:2 * rank + 2]).backward()
        got = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad  # collective: all ranks
               for n, p in model.named_parameters()}
        if rank == 0:
            loss_of(ref, x, y).backward()
            worst.append(max(float((got[n] - p.grad).abs().max() / p.grad.abs().max().clamp_min(1e-12))
                             for n, p in ref.named_parameters()))
    if rank == 0:
        Path(out).write_text(json.dumps(worst))
    dist.destroy_process_group()


@pytest.mark.slow
def test_every_variant_shards_and_its_gradient_is_one_process_s(tmp_path):
    """Every variant YAML (MLA, GQA, MQA, sliding, every position, norm and MLP; tied and untied heads) sharded per
    block over 2 gloo processes, each on half the batch: the reduced gradient of every parameter equals one
    process's on the whole batch (float32, relative to the parameter's largest gradient)."""
    import json
    import multiprocessing
    import socket

    import torch.multiprocessing as mp
    from test_model_contract import EXTRA_CASES, YAML_CASES, _with_window, composed

    from ablations.launch import PRELOAD
    from modules.config import GPTConfig

    cases = [_with_window(c) for c in YAML_CASES + EXTRA_CASES]
    configs = [GPTConfig.from_dict(composed(tuple(c)).model).to_dict() for c in cases]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    multiprocessing.set_forkserver_preload(PRELOAD)  # the server trainer=fsdp's ranks use (it may be running)
    mp.start_processes(_variant_worker, args=(2, port, configs, str(tmp_path / "worst.json")), nprocs=2,
                       start_method="forkserver")
    worst = json.loads((tmp_path / "worst.json").read_text())
    assert len(worst) == len(cases)
    bad = [(c, w) for c, w in zip(cases, worst) if not w < 1e-5]
    assert not bad, bad


def test_muon_under_fsdp_is_refused_in_one_line(shakespeare_path, tmp_path):
    from hydra import compose, initialize_config_dir

    from ablations.train import check_config

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=fsdp(tmp_path, shakespeare_path, 2, "optim=muon"))
    with pytest.raises(ConfigError) as e:
        check_config(cfg)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("optim=muon with trainer.strategy=fsdp") and "optim=adamw" in msg


def test_publish_folder_swaps_the_link_and_removes_what_it_no_longer_names(tmp_path):
    """A sharded checkpoint is a folder: `last.ckpt` is a link swapped atomically to each new one; the previous
    folder and a save a kill left unfinished are removed once the new one is published."""
    from ablations.checkpoints import publish_folder

    last = tmp_path / "last.ckpt"
    for name in ("shards-5-1", "shards-3-9"):  # shards-3-9: a save a kill left unfinished
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.pt").write_text(name)
    publish_folder(tmp_path / "shards-5-1", last)
    assert os.readlink(last) == "shards-5-1" and (last / "meta.pt").read_text() == "shards-5-1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "shards-5-1"]
    (tmp_path / "shards-10-1").mkdir()
    publish_folder(tmp_path / "shards-10-1", last)
    assert os.readlink(last) == "shards-10-1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "shards-10-1"]
