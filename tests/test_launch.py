"""ablations/launch.py: CPU ranks of trainer=ddp / trainer=fsdp forked from a fork server get what a spawned rank
gets: the launching process's environment and thread count at launch (not the server's, started at the first
launch), its RNG state, and parameters of their own (not the shared memory a tensor crosses processes in).

Two real launches of Lightning's DDP on 2 CPU processes through `DDPSpawn`, in this process, with the environment,
the thread count and the seed changed between them; each rank writes what it saw. The end-to-end runs: trainer=ddp
in tests/test_harness_run.py and tests/test_harness_errors.py, trainer=fsdp in tests/test_fsdp.py.
"""
import json
import multiprocessing
import multiprocessing.forkserver
import os

import lightning.pytorch as pl
import pytest
import torch

from ablations.launch import DDPSpawn


class Seen(pl.LightningModule):
    """One Linear; at fit start each rank writes what it inherited into `out_dir`, then one SGD step."""

    def __init__(self, out_dir: str):
        super().__init__()
        self.out_dir = out_dir
        self.layer = torch.nn.Linear(4, 1, bias=False)

    def on_fit_start(self):
        seen = {"mark": os.environ.get("ABLATIONS_TEST_MARK"), "threads": torch.get_num_threads(),
                "draw": torch.rand(1).item(), "shared": [p.is_shared() for p in self.parameters()],
                "parent": os.getppid(), "pid": os.getpid()}
        with open(os.path.join(self.out_dir, f"rank{self.global_rank}.json"), "w") as f:
            json.dump(seen, f)

    def training_step(self, batch, _):
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(4, 4), batch_size=2)


def _launch(tmp_path, name: str, mark: str, threads: int, seed: int, monkeypatch) -> tuple[dict, float]:
    """One 2-rank fit with the environment's mark and OMP_NUM_THREADS and the seed given -> ({rank: seen}, the
    draw the parent's RNG would make next)."""
    out = tmp_path / name
    out.mkdir()
    monkeypatch.setenv("ABLATIONS_TEST_MARK", mark)
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    # set by an earlier run's seed_everything in this process, it makes Lightning reseed every rank at set-up
    # (reset_seed), spawned or forked alike; without it a rank draws on from the launching process's state
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    torch.manual_seed(seed)
    module = Seen(str(out))  # its init draws from the RNG: the next draw is the one a rank must make first
    rng = torch.Generator()
    rng.set_state(torch.get_rng_state())
    want = torch.rand(1, generator=rng).item()
    trainer = pl.Trainer(strategy=DDPSpawn(), accelerator="cpu", devices=2, max_steps=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    assert trainer.strategy.launcher._start_method == "forkserver"
    trainer.fit(module)
    seen = {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    assert server is not None and all(s["parent"] == server for s in seen.values())  # forked from it, not spawned
    return seen, want


def test_forked_ranks_see_the_launch_not_the_server(tmp_path, monkeypatch):
    threads = torch.get_num_threads()
    try:
        first, want1 = _launch(tmp_path, "a", "first", 1, 11, monkeypatch)
        second, want2 = _launch(tmp_path, "b", "second", 2, 22, monkeypatch)  # the server still has "first"
    finally:
        torch.set_num_threads(threads)
    for seen, mark, n, want in ((first, "first", 1, want1), (second, "second", 2, want2)):
        for rank in (0, 1):
            s = seen[rank]
            assert s["mark"] == mark and s["threads"] == n  # the environment at this launch
            assert s["draw"] == pytest.approx(want, abs=0)  # the launching process's RNG, as spawn restores it
            assert s["shared"] == [False]  # its own parameters
    assert {first[0]["pid"], first[1]["pid"]}.isdisjoint({second[0]["pid"], second[1]["pid"]})
