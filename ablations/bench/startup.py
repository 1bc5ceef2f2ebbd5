"""Section `startup`: seconds from launching `python -m ablations.run` to the end of its first optimizer step."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ablations.compose import CONF_DIR

from .core import Bench, Figures, Section, section

REPO = CONF_DIR.parent
_FIRST_STEP_HOOK = """
import sys, time, runpy, torch.optim.optimizer as o
_out = sys.argv.pop(1)
def _hook(opt, args, kwargs):
    if not getattr(_hook, "done", False):
        _hook.done = True
        open(_out, "w").write(repr(time.time()))
o.register_optimizer_step_post_hook(_hook)
sys.argv[0] = "ablations/run.py"
runpy.run_module("ablations.run", run_name="__main__", alter_sys=False)
"""


def startup_seconds(overrides: list[str]) -> dict:
    """Launch `python -m ablations.run` for one optimizer step; a global optimizer hook (installed before the
    harness starts: it costs what `import torch` costs, which the harness pays anyway) records when that step
    ended. first_step_sec = that moment minus the launch, in wall-clock seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        stamp = Path(tmp) / "first_step"
        cmd = [sys.executable, "-c", _FIRST_STEP_HOOK, str(stamp), *overrides, "trainer.max_steps=1",
               "trainer.val_check_interval=1", "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false",
               f"tracking.uri=sqlite:///{tmp}/mlflow.db", "tracking.experiment=startup",
               f"checkpoint.dir={tmp}/checkpoints", "generate.max_new_tokens=4", "generate.bench_decode_tokens=4"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        t_launch = time.time()
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, env=env)
        wall = time.time() - t_launch
        if not stamp.exists():
            err = (proc.stderr or proc.stdout).strip().splitlines()
            return {"error": err[-1] if err else f"exit {proc.returncode}, no optimizer step"}
        return {"first_step_sec": float(stamp.read_text()) - t_launch, "whole_command_sec": wall}


@section
class Startup(Section):
    name, order = "startup", 50

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        bench.log("startup: launching python -m ablations.run for one step")
        s = startup_seconds(bench.overrides)
        row = ("launch -> first optimizer step", "error: " + s["error"] if "error" in s else
               f"{s['first_step_sec']:.2f} s  (whole 1-step command {s['whole_command_sec']:.1f} s)")
        return Figures({"startup": s}, [row])
