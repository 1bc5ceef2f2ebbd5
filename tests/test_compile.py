"""`compile=true` trains through torch.compile (inductor, CPU) before any GPU sees it.

The tiny model trains a few steps through the harness twice, eager and compiled, from the same seed on the same
batches: the compiled run must really have gone through inductor (Dynamo compiled frames, inductor generated
kernels) and reach the eager run's losses at every logged step (inductor reorders float sums: close, not equal).
"""
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from ablations.train import train

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def cfg_for(tmp: Path, corpus, *overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=[
            "model=tiny", "data=shakespeare", f"data.path={corpus}", "tokenizer=byte", "data.batch_size=4",
            "data.val_windows=4", "trainer.max_steps=6", "trainer.val_check_interval=6", "trainer.log_every_n_steps=2",
            "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false", "trainer.precision=32-true",
            "generate.max_new_tokens=4", "generate.bench_decode_tokens=2", "generate.bench_prefill_tokens=8",
            "tracking.peak_flops=1e12", "tracking.system_metrics=false", f"data.cache_dir={tmp / 'cache'}",
            f"checkpoint.dir={tmp / 'ckpt'}", f"tracking.uri=sqlite:///{tmp}/mlflow.db", *overrides])


def losses(tmp: Path, run_id: str) -> list[tuple[int, float]]:
    from mlflow import MlflowClient

    hist = MlflowClient(f"sqlite:///{tmp}/mlflow.db").get_metric_history(run_id, "train/loss")
    return sorted((h.step, h.value) for h in hist)


@pytest.fixture(autouse=True)
def _no_env_uri(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.mark.slow
def test_compiled_training_matches_eager(tmp_path, shakespeare_path, one_thread):
    from torch._dynamo.utils import counters

    eager = train(cfg_for(tmp_path, shakespeare_path, "compile=false", "tracking.experiment=eager"))
    torch._dynamo.reset()
    counters.clear()
    compiled = train(cfg_for(tmp_path, shakespeare_path, "compile=true", "tracking.experiment=compiled"))
    assert counters["stats"]["unique_graphs"] >= 1  # Dynamo captured the model's forward
    assert sum(counters["inductor"].values()) > 0  # and inductor lowered it (no eager fallback backend)
    a, b = losses(tmp_path, eager["run_id"]), losses(tmp_path, compiled["run_id"])
    assert [s for s, _ in a] == [s for s, _ in b] and len(a) >= 3
    for (step, x), (_, y) in zip(a, b):
        assert y == pytest.approx(x, rel=1e-4, abs=1e-5), step
    assert compiled["val_loss"] == pytest.approx(eager["val_loss"], rel=1e-4)


def test_compile_model_keeps_every_models_compiled_version():
    """Many models of one class compiled in one process (the paired arms, a multirun's jobs): past dynamo's own
    limit the 9th and later run eager; through compile_model each is compiled (a counting backend: no inductor)."""
    from torch import nn

    from ablations.compiling import compile_model

    class Block(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.lin = nn.Linear(width, width)

        def forward(self, x):
            return torch.relu(self.lin(x))

    def compiled_models(n, compile_fn):
        torch._dynamo.reset()
        seen = []
        for i in range(n):
            m = compile_fn(Block(4 + i), backend=lambda gm, ex: seen.append(gm) or gm.forward)
            m(torch.randn(2, 4 + i))
        return len(seen)

    # dynamo's defaults, whatever earlier tests in this process compiled; restored after
    with torch._dynamo.config.patch(recompile_limit=8, accumulated_recompile_limit=256):
        assert compiled_models(12, torch.compile) < 12  # the limit guarded against (if torch drops it, this fails)
        assert compiled_models(12, compile_model) == 12
    torch._dynamo.reset()
