"""Fault injection for the harness tests: Lightning callbacks a test passes to `ablations.train.train`.

    train(cfg, callbacks=[KillAt(7)])      # the process dies after optimizer step 7, like kill -9
    train(cfg, callbacks=[NanAt(3)])       # the weights become NaN before step 3: the loss is NaN from there
    train(cfg, callbacks=[PruneAt(3)])     # optuna.TrialPruned after step 3, as a pruned sweep trial raises it
    train(cfg, callbacks=[HoldAt(20)])     # after step 20 the run waits until the test removes the file `held`

For a test that runs the command line, `python -m tests.fault_run kill@7 [overrides]` (or hold@20) is
`python -m ablations.run` with such a callback (the product has no fault hook of its own)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import lightning.pytorch as pl
import torch


class KillAt(pl.Callback):
    """After optimizer step `step`: exit at once with status 137, skipping every clean-up (like SIGKILL)."""

    def __init__(self, step: int):
        self.step = int(step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step:
            os._exit(137)


class NanAt(pl.Callback):
    """Before the batch of optimizer step `step`: fill one weight with NaN, so the loss is NaN from then on."""

    def __init__(self, step: int):
        self.step = int(step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= self.step:
            with torch.no_grad():
                next(pl_module.parameters()).fill_(float("nan"))


class PruneAt(pl.Callback):
    """After optimizer step `step`: raise optuna.TrialPruned (train() ends the run as KILLED, tag pruned=true)."""

    def __init__(self, step: int):
        self.step = int(step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        from optuna import TrialPruned

        if trainer.global_step >= self.step:
            raise TrialPruned(f"pruned at step {trainer.global_step}")


class HoldAt(pl.Callback):
    """After optimizer step `step`: write the file `held` (the step) in the working directory and wait until it is
    removed, so a test acts (stops a server, say) while the run is at a known step, whatever the machine's speed."""

    def __init__(self, step: int, marker: str = "held"):
        self.step, self.marker, self.done = int(step), Path(marker), False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step and not self.done:
            self.done = True
            self.marker.write_text(str(trainer.global_step))
            while self.marker.exists():
                time.sleep(0.05)


def from_spec(spec: str) -> pl.Callback:
    """`kill@7` -> KillAt(7), `nan@3` -> NanAt(3), `hold@20` -> HoldAt(20)."""
    kind, step = spec.split("@", 1)
    return {"kill": KillAt, "nan": NanAt, "hold": HoldAt}[kind](int(step))
