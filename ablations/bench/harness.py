"""Section `harness`: the same model trained through `ablations.train.train` (Lightning + Hydra + MLflow on a
throwaway SQLite store) against the bare loop, paired in one process.

After every harness step a callback runs one step of the bare loop (`BareTrainer`: same model config, precision and
batch shape) and takes its time out of the harness's clock. Per logging window of the harness
(`trainer.log_every_n_steps` optimizer steps; its throughput excludes validation, checkpoints and tracking calls),
the ratio is the harness's tokens/s over that of the bare steps run within the window, summarised as a geometric
mean with a 95% t interval (`timing.ratio_summary`); the first window (start-up) is left out. Runs made
minutes apart on a shared machine differ by the load, not by the harness: the unpaired figure (the harness's
whole-run tokens/s over the `train` section's best 1-s round) is kept in the JSON for comparison.
"""
from __future__ import annotations

import os
import tempfile
import time

from modules.errors import AblationsError

from .core import Bench, Figures, Section, fmt, section
from .timing import ratio_summary
from .train import BareTrainer, training_batches


def bare_steps(bare: BareTrainer):
    """A Lightning callback: after every harness step, one bare-loop step, paused out of the harness's clock; at the
    end of each harness logging window it records the window's tokens/s and those of the bare steps run within it.
    Step by step, both meet the same phases of the machine's load. (Built here: importing Lightning at module level
    would slow every bench section's start.)"""
    import lightning.pytorch as pl

    from ablations.inference_timing import sync
    from ablations.metrics import MetricsCallback

    class BareSteps(pl.Callback):
        def __init__(self):
            self.harness: list[float] = []  # tokens/s of each harness window
            self.bare: list[tuple[float, float]] = []  # (tokens, seconds) of the bare steps run within it
            self.step, self.tokens, self.seconds = None, 0.0, 0.0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if self.step == trainer.global_step:
                return  # still accumulating gradients
            self.step = trainer.global_step
            metrics = next(c for c in trainer.callbacks if isinstance(c, MetricsCallback))
            if metrics.latest.get("step") == trainer.global_step:  # the metrics callback (first) closed a window
                self.harness.append(metrics.latest["tokens_per_sec"])
                self.bare.append((self.tokens, self.seconds))
                self.tokens, self.seconds = 0.0, 0.0
            sync(bare.device)  # CUDA: the harness step's kernels are done before the bare step's clock starts
            t0 = time.perf_counter()
            self.tokens += bare.step()
            sync(bare.device)
            dt = time.perf_counter() - t0
            self.seconds += dt
            metrics.pause(dt)  # the bare step is not the harness's training time

    return BareSteps()


def harness_tokens_per_sec(overrides: list[str], steps: int, callbacks=()) -> dict:
    """Train through the real harness (Lightning + MLflow on a throwaway SQLite store) and read its figure."""
    from ablations.compose import compose
    from ablations.train import train

    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose(overrides + [
            f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "trainer.limit_val_batches=2",
            "trainer.enable_progress_bar=false", f"tracking.uri=sqlite:///{tmp}/mlflow.db",
            "tracking.experiment=bench", f"checkpoint.dir={tmp}/checkpoints",
            "generate.max_new_tokens=4", "generate.bench_decode_tokens=4", "generate.bench_prefill_tokens=16",
        ])
        old = os.getcwd()
        os.chdir(tmp)
        try:
            return train(cfg, callbacks=callbacks)
        finally:
            os.chdir(old)


def paired_harness(bench: Bench, precision: str, steps: int) -> dict:
    """The harness at `precision` for `steps` steps, a bare step after each of its steps; -> figures."""
    log_every = int(bench.cfg.tracking.get("log_every_n_steps") or bench.cfg.trainer.log_every_n_steps)
    T, V = bench.model["block_size"], bench.model["vocab_size"]
    batches, _ = training_batches(V, bench.batch_size, T, n=16)
    bare = BareTrainer(bench.model, batches, precision, False, bench.cfg.optim, bench.device)
    for _ in range(2):  # untimed: first-call allocations
        bare.step()
    steps_cb = bare_steps(bare)
    r = harness_tokens_per_sec(bench.overrides + [f"trainer.precision={precision}"], steps, callbacks=[steps_cb])
    h = steps_cb.harness[1:]  # the first window holds start-up costs
    b = [tokens / seconds for tokens, seconds in steps_cb.bare[1:]]
    paired = ratio_summary(b, h) if h else {}
    return {"harness_tokens_per_sec": r.get("tokens_per_sec"), "harness_mfu": r.get("mfu"),
            "windows": len(h), "steps_per_window": log_every, "harness_window_tokens_per_sec": h,
            "bare_window_tokens_per_sec": b, "ratio": paired.get("ratio"),
            "ratio_ci_low": paired.get("ratio_ci_low"), "ratio_ci_high": paired.get("ratio_ci_high")}


@section
class Harness(Section):
    name, order, uses_precisions = "harness", 30, True

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        steps = 30 if bench.opts.quick else 120
        harness, rows = {}, []
        for precision in bench.precisions.run:  # the configured one, none emulated (ceilings.plan_precisions)
            bench.log(f"harness {precision}: {steps} steps through ablations.train.train, each followed by a "
                      "bare-loop step")
            try:
                r = paired_harness(bench, precision, steps)
            except AblationsError as e:  # the harness refused this config: report it, keep the other sections
                harness[precision] = {"error": f"{type(e).__name__}: {e}"}
                rows.append((f"harness {precision}", f"error: {type(e).__name__}: {str(e)[:120]}"))
                continue
            # unpaired, for comparison: the whole run against the train section's best 1-round throughput
            best = earlier.get("train_bare", {}).get(precision, {}).get("tokens_per_sec_best_round")
            r["ratio_unpaired"] = r["harness_tokens_per_sec"] / best if best and r["harness_tokens_per_sec"] else None
            harness[precision] = r
            ci = "" if r["ratio_ci_low"] is None else f" [{r['ratio_ci_low']:.3f}, {r['ratio_ci_high']:.3f}]"
            paired = (f"  = {r['ratio']:.3f}{ci} of the bare loop, paired over {r['windows']} windows of "
                      f"{r['steps_per_window']} steps" if r["ratio"] else "  (too few windows for a ratio)")
            unpaired = f"; unpaired {r['ratio_unpaired']:.3f}" if r["ratio_unpaired"] else ""
            rows.append((f"harness {precision}", f"{fmt(r['harness_tokens_per_sec'], 'tok/s')}{paired}{unpaired}"))
        return Figures({"harness": harness}, rows)
