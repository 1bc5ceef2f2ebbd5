"""Progress for a log file: one line every N optimizer steps when stdout is not a terminal (a redirect, CI, SLURM),
instead of a progress bar's carriage-return stream. In a terminal, Lightning's live bar stays."""
from __future__ import annotations

import math
import sys
import time

import lightning.pytorch as pl


def wants_lines(stream=None) -> bool:
    """True when progress goes to a file or pipe rather than a terminal."""
    stream = sys.stdout if stream is None else stream
    return not (hasattr(stream, "isatty") and stream.isatty())


def line_every(max_steps: int, log_every: int, lines: int = 20) -> int:
    """About `lines` progress lines per run, on the MLflow logging cadence (the loss is averaged over that window)."""
    log_every = max(1, int(log_every))
    return log_every * max(1, math.ceil(max_steps / lines / log_every))


def _eta(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class LineProgress(pl.Callback):
    """`step 120/600 | loss 2.3141 | 29,811 tokens/s | eta 0:41` every `every` steps, and one line per validation.

    Reads the figures the MetricsCallback (`metrics`) has just logged, so the two always agree; it must come after
    it in the callback list."""

    def __init__(self, metrics, every: int, max_steps: int, stream=None):
        self.metrics, self.every, self.max_steps = metrics, max(1, int(every)), int(max_steps)
        self.stream = stream
        self._t0, self._step0 = None, 0

    def _say(self, text: str) -> None:
        print(f"[ablations] {text}", file=self.stream or sys.stdout, flush=True)

    def on_train_start(self, trainer, pl_module):
        self._t0, self._step0 = time.perf_counter(), trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        m = self.metrics.latest
        if not trainer.is_global_zero or m.get("step") != step or (step % self.every and step < self.max_steps):
            return
        done = step - self._step0
        eta = (time.perf_counter() - self._t0) / done * (self.max_steps - step) if done > 0 else float("nan")
        loss = m.get("train/loss")
        self._say(f"step {step}/{self.max_steps} | loss {loss:.4f} | {m.get('tokens_per_sec', 0):,.0f} tokens/s | "
                  f"eta {_eta(eta) if math.isfinite(eta) else '?'}" if loss is not None else f"step {step}")

    def on_validation_end(self, trainer, pl_module):
        if trainer.is_global_zero and not trainer.sanity_checking and self.metrics.last_val_step == trainer.global_step:
            v = self.metrics.last_val_loss
            self._say(f"step {trainer.global_step}/{self.max_steps} | val_loss {v:.4f} | "
                      f"val_bpb {self.metrics.bpb(v):.4f}")
