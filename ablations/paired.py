"""`python -m ablations.paired [model=small-cpu] [steps=N] [rounds=R] [json=FILE] ARM=OVERRIDES ...`

Paired training-throughput comparison: every arm's model is built in this one process and timed in interleaved
rounds (A B C, C B A, A B C, ...), so every arm meets the same phases of the machine's load and each place in a
round as often (the place alone moved a ratio by about as much as RMSNorm against LayerNorm: docs/bench.md, "Paired
throughput"). A throughput claim between arms needs this: runs made at different times on a shared machine differ
by whatever else was running.

    python -m ablations.paired baseline= rope=position=rope rmsnorm=norm=rmsnorm
    python -m ablations.paired model=small-cpu steps=20 rounds=10 layernorm= rmsnorm=norm=rmsnorm json=p.json
    python -m ablations.paired base= gqa="attention=gqa attention.n_kv_head=2"      # several overrides: one arg

An arm is NAME=OVERRIDES: the Hydra overrides (space-separated; empty for the defaults) composed on conf/ with
`model=<model>`, as the harness composes a run. One step is what training does per batch: forward, fp32
cross-entropy, backward, gradient clipping, fused AdamW step (ablations.bench.BareTrainer). Each arm runs at its own
`trainer.precision` (auto: bf16-mixed where bf16 is native), `trainer.accelerator` (device=: every arm's),
`data.batch_size` and `model.block_size`; arms with the same batch size and context step through the same batches.
An arm that changes what this step cannot honour (optim=muon, trainer.accumulate_grad_batches, threads, ...) is
refused; settings that do not change a step's work (run length, logging, lr schedule, data source) are ignored.

An arm whose precision runs emulated on this CPU (its GEMM peak, timed by the bench's probe, below fp32's: bf16
without AVX512-BF16 or AMX) is named in one line of the summary.

Per round and arm: tokens/s of `steps=` steps. Per arm: the median over rounds, and the ratio to the first arm:
per round r_i = arm's tokens/s / first arm's tokens/s in the same round (a paired ratio), summarised as the
geometric mean of the r_i with a 95% t interval on log r_i over the rounds (needs >= 2 rounds). JSON (`json=`)
holds every round; `python -m analysis.report <experiment> paired=FILE` shows it.

That interval sees only what varies between rounds of one process. Three runs of one code minutes apart read MLA
at x0.933 [0.926, 0.940], x0.963 [0.954, 0.972] and x0.937 [0.928, 0.945] of the baseline (docs/bench.md, "MLA's
attention on the CPU"): a process's memory layout and a neighbour's load over minutes move a ratio by more than its
rounds show. `processes=N` (N >= 2) measures in N fresh processes, one after another, and gives each arm the
geometric mean of the N processes' ratios with a 95% t interval over them (N - 1 degrees of freedom), each
process's own figures beside it (JSON `per_process`; `ratio_per_round` and `tokens_per_sec` pool every round).

The measurement is ablations/bench/paired.py (the bench's norms and roofline sections run it too); this module is
the command: arms from the command line, the summary, the JSON and its history.

Bad input (an arm without `=`, an unknown override, arms that differ in vocabulary, a setting the step cannot
honour, CUDA where there is none) exits 2 with one line.
"""
from __future__ import annotations

import json
import math
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from types import SimpleNamespace

import torch

from ablations.cli import Command, Option
from ablations.bench.paired import ORDER, PATH_RULES, TOOL, PairedError, measure
from ablations.bench.timing import mean_interval
from ablations.malloc import keep_freed_memory
from ablations.tracking import git_state


def parse_arm(text: str) -> tuple[str, list[str]]:
    """`NAME=OVERRIDES` -> (name, [override, ...]); the overrides are space-separated (shell quoting honoured)."""
    name, sep, rest = text.partition("=")
    if not sep or not name or "=" in name or " " in name:
        raise PairedError(f"arm {text!r}: expected NAME=OVERRIDES, e.g. baseline= or rope=position=rope "
                          "(several overrides: rope=\"position=rope norm=rmsnorm\")")
    overrides = shlex.split(rest)
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise PairedError(f"arm {name!r}: override {bad[0]!r} is not KEY=VALUE (e.g. norm=rmsnorm)")
    return name, overrides


HISTORY_KEYS = ("date", "command", "device_name", "precision", "path_rule", "threads", "torch", "rounds",
                "steps_per_round", "load_average_start", "load_average_end", "kernels", "git_commit")
HISTORY_ARM_KEYS = ("name", "overrides", "path", "compiled", "median_tokens_per_sec", "ratio", "ratio_ci_low",
                    "ratio_ci_high")


def history_of(path: str) -> list[dict]:
    """An earlier measurement's summary (what the report shows of it, without its rounds) followed by its own
    history: a new measurement of the same arms keeps the old figures beside it instead of replacing them."""
    try:
        old = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise PairedError(f"history={path}: cannot read it as JSON ({exc}); pass a file written by "
                          "python -m ablations.paired json=FILE") from None
    if not isinstance(old, dict) or old.get("tool") != TOOL or not isinstance(old.get("arms"), list):
        raise PairedError(f"history={path}: not a measurement of python -m ablations.paired (no tool/arms keys)")
    entry = {k: old.get(k) for k in HISTORY_KEYS}
    entry["arms"] = [{k: a.get(k) for k in HISTORY_ARM_KEYS} for a in old["arms"]]
    return [entry, *old.get("history", [])]


def summary_lines(res: dict) -> list[str]:
    procs = f"{res['processes']} processes x " if res.get("processes", 1) > 1 else ""
    lines = [f"{res['model']}, {res['precision']} on {res['device']} ({res['threads']} threads), "
             f"{procs}{res['rounds']} rounds x {res['steps_per_round']} steps x {res['tokens_per_step']} tokens, "
             f"{ORDER}"]  # per arm where the arms differ: "a 32-true, b bf16-mixed"
    if procs:
        lines.append(f"  intervals: {res['interval']}")
    for a in res["arms"]:
        ci = "" if a["ratio_ci_low"] is None else f" [{a['ratio_ci_low']:.3f}, {a['ratio_ci_high']:.3f}]"
        ratio = "reference" if a["name"] == res["reference"] else f"x{a['ratio']:.3f}{ci} vs {res['reference']}"
        probe = a.get("probe")
        why = "" if not probe else f" (compile/eager x{probe['compile_over_eager']:.3f} in the probe)"
        lines.append(f"  {a['name']:<12} {a['median_tokens_per_sec']:>10,.0f} tok/s (median)  {ratio}  "
                     f"params {a['params']:,}  {a.get('path', 'eager')}{why}")
        if a.get("per_process") and a["name"] != res["reference"]:
            lines.append(f"  {'':<12} per process: " + ", ".join(f"x{p['ratio']:.3f}" for p in a["per_process"]))
    cold = [f"{a['name']} {a['warmup_sec']['compile']:.0f} s" for a in res["arms"]
            if "compile" in a.get("warmup_sec", {})]
    if cold:  # compiling happens in the first steps; inductor's on-disk caches make later processes faster
        lines.append(f"  compiled arms' first {res['warmup_steps']} steps (compiling): " + ", ".join(cold))
    return lines + [f"  note: {line}" for line in res.get("emulated", {}).values()]


COMMAND = Command(
    "ablations.paired", "[key=value ...] NAME=OVERRIDES NAME=OVERRIDES ...", __doc__.split("\n\n")[1],
    options=(
        Option("model", "model preset (conf/model/) every arm is composed on", "small-cpu", str),
        Option("steps", "timed training steps per arm per round", 10),
        Option("rounds", "interleaved rounds", 8),
        Option("warmup", "untimed steps per arm before the rounds", 2),
        Option("threads", "torch intra-op threads (default: torch's)"),
        Option("device", "cpu | cuda (default: trainer.accelerator, auto)", parse=str),
        Option("path", f"{' | '.join(PATH_RULES)}: fastest runs each arm on the faster of eager and compiled (a "
                       "paired probe first), configured as each arm's compile setting says", "configured", str),
        Option("probe_rounds", "rounds of the eager/compiled probe with path=fastest", 4),
        Option("processes", "measure in this many fresh processes, one after another; the interval is then the "
                            "processes' spread (docs above)", 1),
        Option("history", "an earlier json= file of these arms: its figures are kept in the new file's history",
               parse=str),
        Option("json", "write every round and the summary to this JSON file", parse=str)),
    positional="an arm (refused: an arm is NAME=OVERRIDES)",
    rest="the arms, NAME=OVERRIDES: Hydra overrides of the training config, space-separated in one argument (an "
         "arm cannot be named like an option)",
    examples=("baseline= rope=position=rope rmsnorm=norm=rmsnorm",
              "model=small-cpu steps=20 rounds=10 layernorm= rmsnorm=norm=rmsnorm json=p.json"))


def check_options(o: dict) -> None:
    for key, least in (("steps", 1), ("rounds", 1), ("probe_rounds", 1), ("warmup", 0), ("processes", 1)):
        if isinstance(o[key], bool) or not isinstance(o[key], int) or o[key] < least:
            raise PairedError(f"{key}={o[key]}: must be an integer >= {least}")
    if o["threads"] is not None and (isinstance(o["threads"], bool) or not isinstance(o["threads"], int)
                                     or o["threads"] < 1):
        raise PairedError(f"threads={o['threads']}: must be an integer >= 1")
    if o["path"] not in PATH_RULES:
        raise PairedError(f"path={o['path']}: choose {' or '.join(PATH_RULES)}")


def log_err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


PROCESS_ARM_KEYS = ("ratio", "ratio_ci_low", "ratio_ci_high", "median_tokens_per_sec", "path", "probe")


def combine_processes(results: list[dict]) -> dict:
    """N processes' measurements of the same arms as one: per arm the geometric mean of the processes' ratios and a
    95% t interval on their logs (N - 1 degrees of freedom), the median of their median tokens/s, every round
    pooled, and each process's own figures under `per_process`. The first process's file is the template (its
    settings are every process's: one command)."""
    names = [a["name"] for a in results[0]["arms"]]
    if any([a["name"] for a in r["arms"]] != names for r in results):
        raise PairedError(f"the processes measured different arms: {[[a['name'] for a in r['arms']] for r in results]}")
    out = json.loads(json.dumps(results[0]))  # a deep copy
    out.update(processes=len(results), interval="95% t interval over the processes' ratios (N - 1 degrees of "
               "freedom); per_process: each process's own", load_average_end=results[-1]["load_average_end"])
    for i, arm in enumerate(out["arms"]):
        per = [r["arms"][i] for r in results]
        mean, half = mean_interval([math.log(a["ratio"]) for a in per])
        pooled = [v for a in per for v in a["ratio_per_round"]]
        arm.update(ratio=math.exp(mean), ratio_ci_low=math.exp(mean - half), ratio_ci_high=math.exp(mean + half),
                   ratio_median=median(pooled), ratio_per_round=pooled,
                   tokens_per_sec=[v for a in per for v in a["tokens_per_sec"]],
                   median_tokens_per_sec=median(a["median_tokens_per_sec"] for a in per),
                   per_process=[{k: a.get(k) for k in PROCESS_ARM_KEYS} for a in per])
        paths = [a.get("path") for a in per]
        if len(set(paths)) > 1:  # path=fastest: each process's probe chose for itself
            arm["path"] = "mixed: " + ", ".join(map(str, paths))
    return out


def run_processes(argv: list[str], n: int, log=log_err) -> dict:
    """The same command (less processes=, json= and history=) in n fresh processes, one after another; their files
    combined. A process that fails stops the rest: its own message is on stderr, and its exit code is raised."""
    own = ("processes=", "json=", "history=")
    child = [a for a in argv if not a.startswith(own)] + ["processes=1"]
    results = []
    with tempfile.TemporaryDirectory(prefix="paired-") as tmp:
        for i in range(n):
            path = Path(tmp) / f"process{i}.json"
            log(f"[paired] process {i + 1}/{n}")
            done = subprocess.run([sys.executable, "-m", "ablations.paired", *child, f"json={path}"], check=False,
                                  stdout=subprocess.PIPE, text=True)  # its summary to stderr: stdout is the whole's
            for line in done.stdout.splitlines():
                log(f"[paired] process {i + 1}/{n}: {line}")
            if done.returncode:
                raise ChildFailed(done.returncode, i + 1)
            results.append(json.loads(path.read_text(encoding="utf-8")))
    return combine_processes(results)


class ChildFailed(Exception):
    def __init__(self, code: int, index: int):
        super().__init__(f"process {index} exited with code {code}")
        self.code, self.index = code, index


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    o, arm_args = COMMAND.read(argv)
    args = SimpleNamespace(**o)
    try:
        check_options(o)
        history = history_of(args.history) if args.history else []  # read before measuring: json= may be it
        if not arm_args:
            raise PairedError("no arms: give two or more NAME=OVERRIDES, e.g. baseline= rmsnorm=norm=rmsnorm")
        arms = [parse_arm(a) for a in arm_args]
        names = [n for n, _ in arms]
        if len(set(names)) != len(names):
            raise PairedError(f"arm names repeat: {names}; give each arm its own name")
        if len(arms) < 2:
            raise PairedError(f"one arm ({names[0]}): a paired comparison needs >= 2 arms")
        if args.processes > 1:
            res = run_processes(argv, args.processes, log_err)
        else:
            if args.threads:
                torch.set_num_threads(args.threads)
            keep_freed_memory()  # as training does
            res = measure(args.model, arms, args.steps, args.rounds, args.warmup, args.device, log=log_err,
                          path=args.path, probe_rounds=args.probe_rounds)
    except PairedError as exc:
        print(f"ablations.paired: error: {exc}", file=sys.stderr)
        return 2
    except ChildFailed as exc:  # bad input (2) was said in one line by the process itself
        if exc.code != 2:
            print(f"ablations.paired: error: {exc}; nothing written", file=sys.stderr)
        return exc.code
    res["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    git = git_state()  # the code measured: a figure of our implementation is a figure of one commit
    res["git_commit"] = git["git_commit"] + (" (dirty)" if git["git_dirty"] == "true" else "")
    if history:
        res["history"] = history
    res["command"] = "python -m ablations.paired " + " ".join(shlex.quote(a) for a in argv)
    print("\n".join(summary_lines(res)))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
