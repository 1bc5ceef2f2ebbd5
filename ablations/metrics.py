"""All training metrics in one callback (torchtitan style), logged to MLflow from global rank 0 only.

Step metrics (every `log_every_n_steps` optimizer steps): train/loss (mean over the window), lr, grad_norm
(pre-clipping total norm), tokens_per_sec (training tokens of all ranks / wall time), mfu (flops_per_token *
tokens_per_sec / peak), tokens_seen, elapsed_sec (training wall-clock, continued across resumes),
tracking_stall_sec (seconds blocked on the tracking store so far, continued across resumes). The time spent in
validation, checkpoints and tracking calls is not training time: a throughput figure must not depend on the
tracking server's health. At each validation: val/loss, val/bpb. At the end: final_* summaries.
"""
from __future__ import annotations

import math
import time

import lightning.pytorch as pl
import torch

from .errors import TrackingError, one_line
from .tracking import DEFAULT_MAX_OUTAGE_S, OutageBound, client

_PEAK_CACHE: dict = {}


def measure_peak_flops(device: str = "cpu", dtype: torch.dtype = torch.float32, n: int | None = None,
                       seconds: float = 0.3) -> float:
    """Best-of GEMM throughput (FLOP/s) of an n x n matmul in `dtype` on `device` (cached per process)."""
    n = n or (8192 if device.startswith("cuda") else 1024)
    key = (device, dtype, n, torch.get_num_threads())
    if key in _PEAK_CACHE:
        return _PEAK_CACHE[key]
    g = torch.Generator(device=device).manual_seed(0)  # never the global RNG: runs stay reproducible
    a = torch.randn(n, n, device=device, generator=g).to(dtype)
    b = torch.randn(n, n, device=device, generator=g).to(dtype)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(2):
        a @ b
    sync()
    best, t_end = 0.0, time.perf_counter() + seconds
    reps = 1
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync()
        dt = time.perf_counter() - t0
        best = max(best, 2.0 * n**3 * reps / dt)
        if dt < 0.01:
            reps *= 2
    _PEAK_CACHE[key] = best
    return best


class MetricsCallback(pl.Callback):
    def __init__(self, run_id: str | None, tracking_uri: str, tokens_per_step: int, flops_per_token: int,
                 peak_flops: float, log_every: int, val_tokens_per_byte: float, max_steps: int,
                 max_outage_s: float = DEFAULT_MAX_OUTAGE_S):
        self.run_id, self.uri = run_id, tracking_uri
        self.outage = OutageBound(tracking_uri, max_outage_s)
        self.tokens_per_step, self.flops_per_token = int(tokens_per_step), int(flops_per_token)
        self.peak_flops, self.log_every = float(peak_flops), max(1, int(log_every))
        self.val_tokens_per_byte, self.max_steps = float(val_tokens_per_byte), int(max_steps)
        # persisted in checkpoints
        self.tokens_seen, self.elapsed_sec, self.tracking_stall_sec = 0, 0.0, 0.0
        self.last_val_loss, self.last_val_step = None, -1
        self.latest: dict = {}  # the step metrics logged last, with their "step" (read by ablations.progress)
        self._client = None
        self._buffer: list = []
        self._last_step = None
        self._paused = self._session_paused = 0.0  # seconds of this window / this session that are not training
        self.logged_through: dict = {}  # a resumed run: key -> last step logged before (tracking.logged_through)

    # -------------------------------------------------------------------------------- state & logging
    def state_dict(self):
        return {"tokens_seen": self.tokens_seen, "elapsed_sec": self.elapsed_sec,
                "tracking_stall_sec": self.tracking_stall_sec, "last_val_loss": self.last_val_loss,
                "last_val_step": self.last_val_step}

    def load_state_dict(self, state):
        self.tokens_seen = int(state.get("tokens_seen", 0))
        self.elapsed_sec = float(state.get("elapsed_sec", 0.0))
        self.tracking_stall_sec = float(state.get("tracking_stall_sec", 0.0))
        self.last_val_loss = state.get("last_val_loss")
        self.last_val_step = int(state.get("last_val_step", -1))

    def __getstate__(self):  # ddp_spawn pickles callbacks: the MLflow client is rebuilt in the worker
        d = dict(self.__dict__)
        d["_client"] = None
        return d

    def _log(self, trainer, metrics: dict, step: int):
        if not trainer.is_global_zero or not self.run_id:
            return
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        self._buffer += [Metric(k, float(v), ts, int(step)) for k, v in metrics.items()
                         if v is not None and math.isfinite(float(v)) and step > self.logged_through.get(k, -1)]

    def call(self, fn, *args, **kwargs):
        """A tracking call made during training (fn(*args, **kwargs)): bounded by tracking.max_outage_s, its time
        counted in tracking_stall_sec. The caller excludes it from training time (flush does, checkpoints do)."""
        t0 = time.perf_counter()
        try:
            return self.outage.call(fn, *args, **kwargs)
        finally:
            self.tracking_stall_sec += time.perf_counter() - t0

    def flush(self, trainer):
        """Log the buffered points; the time this blocks is not training time. A store that stays down past
        tracking.max_outage_s ends the run (TrackingError), the points kept in the buffer."""
        if not self._buffer or not trainer.is_global_zero or not self.run_id:
            return
        from mlflow.exceptions import MlflowException

        if self._client is None:
            self._client = client(self.uri)
        t0 = time.perf_counter()
        try:
            for i in range(0, len(self._buffer), 1000):
                self.call(self._client.log_batch, self.run_id, metrics=self._buffer[i:i + 1000])
        except MlflowException as e:  # a refusal, not an outage
            raise TrackingError(f"tracking.uri={self.uri}: metrics not logged ({one_line(e, 160)}): when the "
                                f"store takes them again, continue with resume=auto") from None
        finally:
            self.pause(time.perf_counter() - t0)
        self._buffer = []

    # ------------------------------------------------------------------------------------------ timing
    def _now(self, device) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def on_train_start(self, trainer, pl_module):
        now = self._now(pl_module.device)
        self._fit_t0 = now
        self._win_t0, self._win_tokens, self._paused = now, 0, 0.0
        self._session_tokens, self._session_paused = 0, 0.0
        self._elapsed0 = self.elapsed_sec
        self._last_step = trainer.global_step
        self._steady_t0 = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == self._last_step:
            return  # still accumulating gradients
        self._last_step = step
        self.tokens_seen += self.tokens_per_step
        self._win_tokens += self.tokens_per_step
        self._session_tokens += self.tokens_per_step
        if step % self.log_every == 0 or step >= self.max_steps:
            now = self._now(pl_module.device)
            dt = max(1e-9, now - self._win_t0 - self._paused)
            self.elapsed_sec = self._elapsed0 + (now - self._fit_t0 - self._session_paused)
            tps = self._win_tokens / dt
            gn = pl_module.grad_norm
            m = {"train/loss": pl_module.pop_train_loss(), "lr": trainer.optimizers[0].param_groups[0]["lr"],
                 "grad_norm": float(gn) if gn is not None else None, "tokens_per_sec": tps,
                 "mfu": self.flops_per_token * tps / self.peak_flops if self.peak_flops > 0 else None,
                 "tokens_seen": self.tokens_seen, "flops_seen": self.tokens_seen * self.flops_per_token,
                 "elapsed_sec": self.elapsed_sec, "tracking_stall_sec": self.tracking_stall_sec}
            self._log(trainer, m, step)
            self.latest = {**m, "step": step}
            if self._steady_t0 is None:  # the first window holds start-up costs: final_tokens_per_sec skips it
                self._steady_t0, self._steady_tokens0, self._steady_paused0 = now, self._session_tokens, self._session_paused
            self._win_t0, self._win_tokens, self._paused = now, 0, 0.0
            self.flush(trainer)  # after `now`: its pause belongs to the next window, which starts at `now`
        if step >= self.max_steps and self.last_val_step != step:
            trainer.should_stop = True  # makes Lightning run a final validation at this step

    def pause(self, seconds: float) -> None:
        """Exclude `seconds` (checkpointing, validation) from training time."""
        self._paused += seconds
        self._session_paused += seconds

    def on_validation_start(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self._val_t0 = self._now(pl_module.device)

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        now = self._now(pl_module.device)
        self.pause(now - self._val_t0)
        v = trainer.callback_metrics.get("val/loss")
        if v is None:
            return
        v = float(v)
        step = trainer.global_step
        self.last_val_loss, self.last_val_step = v, step
        m = {"val/loss": v, "val/bpb": self.bpb(v)}
        if step % self.log_every != 0 and step < self.max_steps:
            # a validation off the logging cadence (e.g. trainer.max_time stopped the run): give it its own
            # clock and token count, so loss-against-time curves and time-to-quality can read it
            self.elapsed_sec = self._elapsed0 + (now - self._fit_t0 - self._session_paused)
            m.update(elapsed_sec=self.elapsed_sec, tokens_seen=self.tokens_seen,
                     flops_seen=self.tokens_seen * self.flops_per_token)
        self._log(trainer, m, step)
        self.flush(trainer)

    def bpb(self, val_loss: float) -> float:
        return val_loss / math.log(2) * self.val_tokens_per_byte

    def on_train_end(self, trainer, pl_module):
        now = self._now(pl_module.device)
        t0, tok0, p0 = self._fit_t0, 0, 0.0
        if self._steady_t0 is not None and self._session_tokens > self._steady_tokens0:
            t0, tok0, p0 = self._steady_t0, self._steady_tokens0, self._steady_paused0
        train_time = max(1e-9, now - t0 - (self._session_paused - p0))
        tps = (self._session_tokens - tok0) / train_time if self._session_tokens else None
        m = {"final_tokens_per_sec": tps,
             "final_mfu": self.flops_per_token * tps / self.peak_flops if tps and self.peak_flops > 0 else None}
        if self.last_val_loss is not None:
            m.update(final_val_loss=self.last_val_loss, final_val_bpb=self.bpb(self.last_val_loss))
        self._log(trainer, m, trainer.global_step)
        self.flush(trainer)
