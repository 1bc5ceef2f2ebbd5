"""Section `malloc`: training with the C heap's freed memory kept between steps (ablations.malloc) against glibc's
default thresholds, which hand it back to the kernel and fault it in again.

The setting is the process's, so each arm is its own child process: the bare loop (`BareTrainer`, the bench's model
and batch) for 2 untimed steps then `steps` timed ones, under ABLATIONS_MALLOC=default and under the kept setting,
the two in alternating order (AB, BA, ...) over the rounds. Per round the ratio of the kept arm's tokens/s to the
default's; summarised as in `ablations.paired` (geometric mean, 95% t interval over the rounds). Each child also
counts its minor page faults and its time in the kernel (getrusage's system time, where a fault is served) per timed
step: what the setting removes, measured inside the process, where the load's drift between processes does not
reach.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from statistics import median

from ablations.compose import CONF_DIR
from ablations.malloc import GLIBC_ENV

from .core import Bench, Figures, Section, section
from .timing import ratio_summary

_CHILD = """
import json, resource, sys, time
import torch
from ablations.malloc import keep_freed_memory
from ablations.bench.train import BareTrainer, training_batches
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"])
mode = keep_freed_memory()
m = a["model"]
batches, _ = training_batches(m["vocab_size"], a["batch_size"], m["block_size"], n=8)
tr = BareTrainer(m, batches, a["precision"], False, a["optim"], a["device"])
for _ in range(a["warmup"]):
    tr.step()
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
tokens = sum(tr.step() for _ in range(a["steps"]))
seconds = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"mode": mode, "tokens_per_sec": tokens / seconds,
                  "faults_per_step": (r1.ru_minflt - r0.ru_minflt) / a["steps"],
                  "kernel_sec_per_step": (r1.ru_stime - r0.ru_stime) / a["steps"]}))
"""
ARMS = (("default", "default"), ("kept", "keep"))  # (name, ABLATIONS_MALLOC)
PRECISIONS = ("32-true", "bf16-mixed")


def child_rate(bench: Bench, precision: str, steps: int, setting: str) -> dict:
    """One child process's bare-loop training under ABLATIONS_MALLOC=`setting` (glibc's own MALLOC_*_ settings
    removed, so `default` is glibc's defaults): its tokens/s, page faults and kernel seconds per step."""
    from omegaconf import OmegaConf

    args = {"model": bench.model, "batch_size": bench.batch_size, "precision": precision, "device": bench.device,
            "optim": OmegaConf.to_container(bench.cfg.optim, resolve=True), "threads": 1 if bench.opts.threads is None
            else bench.opts.threads, "warmup": 2, "steps": steps}
    env = {k: v for k, v in os.environ.items() if k not in GLIBC_ENV}
    env.update(ABLATIONS_MALLOC=setting, PYTHONPATH=os.pathsep.join([str(CONF_DIR.parent), env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], capture_output=True, text=True, env=env)
    if proc.returncode:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(f"malloc section: child ({setting}, {precision}) failed: {err[-1] if err else ''}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@section
class Malloc(Section):
    name, order = "malloc", 78

    def check(self, bench: Bench) -> None:
        if bench.cuda:
            raise SystemExit("ablations.bench: the malloc section measures CPU training; run it with device=cpu")

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        steps = bench.opts.steps or (5 if bench.opts.quick else 40)
        rounds = bench.opts.rounds or (2 if (bench.opts.quick or bench.opts.steps) else 8)
        values, rows = {}, []
        for precision in PRECISIONS:
            got = {name: [] for name, _ in ARMS}
            for r in range(rounds):
                for name, setting in (ARMS if r % 2 == 0 else ARMS[::-1]):
                    got[name].append(child_rate(bench, precision, steps, setting))
                bench.log(f"malloc: {precision} round {r + 1}/{rounds}: " + "  ".join(
                    f"{n} {g[-1]['tokens_per_sec']:,.0f} tok/s ({g[-1]['faults_per_step']:,.0f} faults/step)"
                    for n, g in got.items()))
            tps = {n: [g["tokens_per_sec"] for g in got[n]] for n in got}
            faults = {n: median(g["faults_per_step"] for g in got[n]) for n in got}
            kernel = {n: median(g["kernel_sec_per_step"] for g in got[n]) for n in got}  # faults are kernel time
            s = ratio_summary(tps["default"], tps["kept"])
            values[precision] = {"rounds": rounds, "steps": steps, "mode": {n: got[n][0]["mode"] for n in got},
                                 "tokens_per_sec": tps, "faults_per_step_median": faults,
                                 "kernel_sec_per_step_median": kernel,
                                 **{k: s[k] for k in ("ratio", "ratio_ci_low", "ratio_ci_high", "ratio_per_round")}}
            ci = "" if s["ratio_ci_low"] is None else f" [{s['ratio_ci_low']:.3f}, {s['ratio_ci_high']:.3f}]"
            rows.append((f"freed memory kept / glibc default ({precision})",
                         f"x{s['ratio']:.3f}{ci} tokens/s; per step {faults['kept']:,.0f} vs {faults['default']:,.0f} "
                         f"page faults, {kernel['kept'] * 1e3:.1f} vs {kernel['default'] * 1e3:.1f} ms in the kernel  "
                         f"({rounds} rounds x {steps} steps, one process per arm)"))
        return Figures({"malloc": values}, rows)
