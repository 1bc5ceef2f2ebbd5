"""Section `harness`: the same model trained through `ablations.train.train` (Lightning + Hydra + MLflow on a
throwaway SQLite store), its tokens/sec over the bare loop's (section `train`, when it ran)."""
from __future__ import annotations

import os
import tempfile

from modules.errors import AblationsError

from .core import Bench, Figures, Section, fmt, section


def harness_tokens_per_sec(overrides: list[str], steps: int) -> dict:
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
            return train(cfg)
        finally:
            os.chdir(old)


@section
class Harness(Section):
    name, order = "harness", 30

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        steps = 30 if bench.opts.quick else 120
        harness, rows = {}, []
        for precision in ("32-true", "bf16-mixed"):
            bench.log(f"harness {precision}: {steps} steps through ablations.train.train")
            try:
                r = harness_tokens_per_sec(bench.overrides + [f"trainer.precision={precision}"], steps)
            except AblationsError as e:  # the harness refused this config: report it, keep the other sections
                harness[precision] = {"error": f"{type(e).__name__}: {e}"}
                rows.append((f"harness {precision}", f"error: {type(e).__name__}: {str(e)[:120]}"))
                continue
            # the harness reports throughput over whole logging windows: compare with the bare loop's best window
            bare = earlier.get("train_bare", {}).get(precision, {}).get("tokens_per_sec_best_round")
            ratio = r["tokens_per_sec"] / bare if bare and r.get("tokens_per_sec") else None
            harness[precision] = {"harness_tokens_per_sec": r.get("tokens_per_sec"), "harness_mfu": r.get("mfu"),
                                  "bare_tokens_per_sec": bare, "ratio": ratio}
            rows.append((f"harness {precision}", f"{fmt(r.get('tokens_per_sec'), 'tok/s')}"
                         + (f"  = {ratio:.3f} of the bare loop's best 1-round throughput ({fmt(bare, 'tok/s')})"
                            if ratio else "  (run the train section for the ratio)")))
        return Figures({"harness": harness}, rows)
