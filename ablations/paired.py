"""`python -m ablations.paired [--model small-cpu] [--steps N] [--rounds R] [--json FILE] ARM=OVERRIDES ...`

Paired training-throughput comparison: every arm's model is built in this one process and timed in interleaved
rounds (A B C, A B C, ...), so every arm meets the same phases of the machine's load. A throughput claim between
arms needs this: runs made at different times on a shared machine differ by whatever else was running.

    python -m ablations.paired baseline= rope=position=rope rmsnorm=norm=rmsnorm
    python -m ablations.paired --model small-cpu --steps 20 --rounds 10 layernorm= rmsnorm=norm=rmsnorm --json p.json
    python -m ablations.paired base= gqa="attention=gqa attention.n_kv_head=2"      # several overrides: one arg

An arm is NAME=OVERRIDES: the Hydra overrides (space-separated; empty for the defaults) composed on conf/ with
`model=<--model>`, as the harness composes a run. One step is what training does per batch: forward, fp32
cross-entropy, backward, gradient clipping, fused AdamW step (ablations.bench.BareTrainer), at the harness's
precision (`trainer.precision`, auto: bf16-mixed where bf16 is native). Every arm steps through the same batches.

Per round and arm: tokens/s of `--steps` steps. Per arm: the median over rounds, and the ratio to the first arm:
per round r_i = arm's tokens/s / first arm's tokens/s in the same round (a paired ratio), summarised as the
geometric mean of the r_i with a 95% t interval on log r_i over the rounds (needs >= 2 rounds). JSON (`--json`)
holds every round; `python -m analysis.report <experiment> --paired FILE` shows it.

Bad input (an arm without `=`, an unknown override, arms that differ in vocabulary or context) exits 2 with one line.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path
from statistics import median

from modules.errors import ConfigError

from ablations.repro import cpu_model

TOOL = "ablations.paired"
ORDER = "interleaved rounds: every arm once per round, in the order given (A B C, A B C, ...)"


class PairedError(ConfigError):
    """Bad input: one line naming the bad value and the fix."""


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


def ratio_summary(reference, arm) -> dict:
    """Paired per-round ratios arm/reference: their geometric mean and a 95% t interval on the log ratios.

    reference, arm: tokens/s of the same rounds. With one round there is no interval (None)."""
    from scipy import stats

    per_round = [a / r for r, a in zip(reference, arm, strict=True)]
    logs = [math.log(v) for v in per_round]
    n = len(logs)
    mean = sum(logs) / n
    out = {"ratio": math.exp(mean), "ratio_ci_low": None, "ratio_ci_high": None, "ratio_median": median(per_round),
           "ratio_per_round": per_round}
    if n >= 2:
        sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / (n - 1))
        half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
        out.update(ratio_ci_low=math.exp(mean - half), ratio_ci_high=math.exp(mean + half))
    return out


def _compose_arms(model: str, arms: list[tuple[str, list[str]]]):
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ablations.bench import model_dict
    from ablations.compose import compose

    out = []
    for name, overrides in arms:
        try:
            cfg = compose([f"model={model}", *overrides])
        except (HydraException, OmegaConfBaseException) as exc:
            line = " ".join(str(exc).split()) or type(exc).__name__  # Hydra lists the valid options on more lines
            raise PairedError(f"arm {name!r}: {line}") from None
        out.append((name, overrides, cfg, model_dict(cfg)))
    shapes = {(m["vocab_size"], m["block_size"]) for _, _, _, m in out}
    if len(shapes) > 1:
        raise PairedError(f"arms differ in (vocab_size, block_size): {sorted(shapes)}; pair arms that read the same "
                          "batches (same tokenizer and model.block_size)")
    return out


def measure(model: str, arms: list[tuple[str, list[str]]], steps: int, rounds: int, warmup: int = 2,
            device: str | None = None, log=print) -> dict:
    """Build every arm, then time `steps` training steps per arm per round over `rounds` interleaved rounds."""
    import torch

    from ablations.bench import BareTrainer, training_batches
    from ablations.inference_timing import sync
    from ablations.lit import resolve_accelerator, resolve_precision
    from modules import accounting

    composed = _compose_arms(model, arms)
    cfg0 = composed[0][2]
    device = device or resolve_accelerator(cfg0.trainer.get("accelerator", "auto"))
    precision, why = resolve_precision(cfg0.trainer.get("precision", "auto"), device)
    m0 = composed[0][3]
    batch_size, T, V = int(cfg0.data.batch_size), m0["block_size"], m0["vocab_size"]
    batches, source = training_batches(V, batch_size, T, max(steps + warmup, 8), seed=0)
    trainers = []
    for name, overrides, cfg, mcfg in composed:
        try:
            tr = BareTrainer(mcfg, batches, precision, compiled=bool(cfg.get("compile")), optim=cfg.optim,
                             device=device)  # compile=true: torch.compile, as the harness (warm-up compiles)
        except ConfigError as exc:  # a bad model value (named by modules.config)
            raise PairedError(f"arm {name!r}: {exc}") from None
        trainers.append((name, overrides, mcfg, tr))
    for _, _, _, tr in trainers:  # untimed: first-call allocations, autotuning, the lr warm-up's first steps
        for _ in range(warmup):
            tr.step()
    sync(device)
    rates = {name: [] for name, *_ in trainers}
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    for r in range(rounds):
        for name, _, _, tr in trainers:
            sync(device)
            t0 = time.perf_counter()
            tokens = sum(tr.step() for _ in range(steps))
            sync(device)
            rates[name].append(tokens / (time.perf_counter() - t0))
        log(f"[paired] round {r + 1}/{rounds}: " + "  ".join(f"{n} {rates[n][-1]:,.0f}" for n in rates) + " tok/s")
    ref = trainers[0][0]
    arms_out = []
    for name, overrides, mcfg, tr in trainers:
        arms_out.append({"name": name, "overrides": overrides, "compiled": tr.fwd is not tr.model,
                         **accounting.param_counts(mcfg),
                         "flops_per_token": accounting.flops_per_token(mcfg), "tokens_per_sec": rates[name],
                         "median_tokens_per_sec": median(rates[name]), **ratio_summary(rates[ref], rates[name]),
                         "loss_last": float(tr.losses[-1])})
    return {"tool": TOOL, "version": 1, "model": model, "device": device,
            "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else cpu_model(),
            "precision": precision, "precision_reason": why, "threads": torch.get_num_threads(),
            "torch": torch.__version__, "steps_per_round": steps, "warmup_steps": warmup, "rounds": rounds,
            "order": ORDER, "batch_size": batch_size, "block_size": T, "tokens_per_step": batch_size * T,
            "batches": source, "load_average_start": load_start,
            "load_average_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "reference": ref, "arms": arms_out}


def summary_lines(res: dict) -> list[str]:
    lines = [f"{res['model']}, {res['precision']} on {res['device']} ({res['threads']} threads), {res['rounds']} "
             f"rounds x {res['steps_per_round']} steps x {res['tokens_per_step']} tokens, {ORDER}"]
    for a in res["arms"]:
        ci = "" if a["ratio_ci_low"] is None else f" [{a['ratio_ci_low']:.3f}, {a['ratio_ci_high']:.3f}]"
        ratio = "reference" if a["name"] == res["reference"] else f"x{a['ratio']:.3f}{ci} vs {res['reference']}"
        lines.append(f"  {a['name']:<12} {a['median_tokens_per_sec']:>10,.0f} tok/s (median)  {ratio}  "
                     f"params {a['params']:,}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations.paired", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arms", nargs="+", metavar="ARM=OVERRIDES", help="e.g. baseline= rmsnorm=norm=rmsnorm")
    parser.add_argument("--model", default="small-cpu", help="model preset (conf/model/; default small-cpu)")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per arm per round (default 10)")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds (default 8)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per arm before the rounds (default 2)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default=None, help="cpu | cuda (default: trainer.accelerator, auto)")
    parser.add_argument("--json", default=None, help="write every round and the summary to this JSON file")
    args = parser.parse_args(argv)
    try:
        for opt in ("steps", "rounds"):
            if getattr(args, opt) < 1:
                raise PairedError(f"--{opt} {getattr(args, opt)}: must be >= 1")
        if args.warmup < 0:
            raise PairedError(f"--warmup {args.warmup}: must be >= 0")
        if args.threads is not None and args.threads < 1:
            raise PairedError(f"--threads {args.threads}: must be >= 1")
        arms = [parse_arm(a) for a in args.arms]
        names = [n for n, _ in arms]
        if len(set(names)) != len(names):
            raise PairedError(f"arm names repeat: {names}; give each arm its own name")
        if len(arms) < 2:
            raise PairedError(f"one arm ({names[0]}): a paired comparison needs >= 2 arms")
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        res = measure(args.model, arms, args.steps, args.rounds, args.warmup, args.device,
                      log=lambda m: print(m, file=sys.stderr, flush=True))
    except PairedError as exc:
        print(f"ablations.paired: error: {exc}", file=sys.stderr)
        return 2
    res["command"] = "python -m ablations.paired " + " ".join(shlex.quote(a) for a in (argv if argv is not None
                                                                                        else sys.argv[1:]))
    print("\n".join(summary_lines(res)))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
