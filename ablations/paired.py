"""`python -m ablations.paired [--model small-cpu] [--steps N] [--rounds R] [--json FILE] ARM=OVERRIDES ...`

Paired training-throughput comparison: every arm's model is built in this one process and timed in interleaved
rounds (A B C, C B A, A B C, ...), so every arm meets the same phases of the machine's load and each place in a
round as often (the place alone moved a ratio by about as much as RMSNorm against LayerNorm: docs/bench.md, "Paired
throughput"). A throughput claim between arms needs this: runs made at different times on a shared machine differ
by whatever else was running.

    python -m ablations.paired baseline= rope=position=rope rmsnorm=norm=rmsnorm
    python -m ablations.paired --model small-cpu --steps 20 --rounds 10 layernorm= rmsnorm=norm=rmsnorm --json p.json
    python -m ablations.paired base= gqa="attention=gqa attention.n_kv_head=2"      # several overrides: one arg

An arm is NAME=OVERRIDES: the Hydra overrides (space-separated; empty for the defaults) composed on conf/ with
`model=<--model>`, as the harness composes a run. One step is what training does per batch: forward, fp32
cross-entropy, backward, gradient clipping, fused AdamW step (ablations.bench.BareTrainer). Each arm runs at its own
`trainer.precision` (auto: bf16-mixed where bf16 is native), `trainer.accelerator` (--device: every arm's),
`data.batch_size` and `model.block_size`; arms with the same batch size and context step through the same batches.
An arm that changes what this step cannot honour (optim=muon, trainer.accumulate_grad_batches, threads, ...) is
refused; settings that do not change a step's work (run length, logging, lr schedule, data source) are ignored.

An arm whose precision runs emulated on this CPU (its GEMM peak, timed by the bench's probe, below fp32's: bf16
without AVX512-BF16 or AMX) is named in one line of the summary.

Per round and arm: tokens/s of `--steps` steps. Per arm: the median over rounds, and the ratio to the first arm:
per round r_i = arm's tokens/s / first arm's tokens/s in the same round (a paired ratio), summarised as the
geometric mean of the r_i with a 95% t interval on log r_i over the rounds (needs >= 2 rounds). JSON (`--json`)
holds every round; `python -m analysis.report <experiment> --paired FILE` shows it.

Bad input (an arm without `=`, an unknown override, arms that differ in vocabulary, a setting the step cannot
honour, CUDA where there is none) exits 2 with one line.
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

from ablations.malloc import describe as malloc_mode, keep_freed_memory
from ablations.repro import cpu_model

TOOL = "ablations.paired"
ORDER = "interleaved rounds: every arm once per round, the order given reversed every other round (A B C, C B A, ...)"


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


def mean_interval(values: list[float]) -> tuple[float, float | None]:
    """(mean, half-width of its 95% t interval) over rounds; the half-width is None with one round."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)


def ratio_summary(reference, arm) -> dict:
    """Paired per-round ratios arm/reference: their geometric mean and a 95% t interval on the log ratios.

    reference, arm: tokens/s of the same rounds. With one round there is no interval (None)."""
    per_round = [a / r for r, a in zip(reference, arm, strict=True)]
    mean, half = mean_interval([math.log(v) for v in per_round])
    out = {"ratio": math.exp(mean), "ratio_ci_low": None, "ratio_ci_high": None, "ratio_median": median(per_round),
           "ratio_per_round": per_round}
    if half is not None:
        out.update(ratio_ci_low=math.exp(mean - half), ratio_ci_high=math.exp(mean + half))
    return out


# Keys an arm may override, against the configuration `model=<--model>` alone: what the paired step honours per arm
# (the model and its variant groups, the batch, the precision, the device, compile, AdamW's own settings, the
# clipping norm), and what does not change a training step's work (the run's length, logging, data source, lr
# schedule). Anything else (optim=muon, accumulate_grad_batches, threads, DDP, ...) would be silently dropped: refused.
HONOURED = ("model.", "position.", "norm.", "mlp.", "attention.", "tokenizer.", "data.batch_size", "compile",
            "trainer.precision", "trainer.accelerator", "optim.lr", "optim.weight_decay", "optim.betas", "optim.eps",
            "trainer.gradient_clip_val")
NO_STEP_COST = ("seed", "resume", "progress_every_n_steps", "checkpoint.", "generate.", "tracking.", "data.",
                "trainer.max_steps", "trainer.budget.", "trainer.val_check_interval", "trainer.limit_val_batches",
                "trainer.log_every_n_steps", "trainer.enable_progress_bar", "optim.min_lr", "optim.warmup_steps",
                "optim.warmup_frac", "optim.schedule", "optim.decay_frac")


def _leaves(cfg) -> dict:
    """{dotted key: value} of a composed config (lists are one leaf)."""
    from omegaconf import OmegaConf

    out = {}

    def walk(node, prefix):
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v
    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return out


def _matches(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in prefixes)


def _check_honoured(name: str, cfg, base: dict, threads: int) -> None:
    """Refuse (one line) an arm that changes a setting the paired step cannot honour. An arm's `threads` (an
    experiment may set it) is honoured when it is the process's own thread count (--threads), which every arm
    shares."""
    arm = _leaves(cfg)
    for key in sorted(set(arm) | set(base), key=lambda k: (k.count("."), k)):  # optim.name before optim.muon.*
        if key == "threads" and arm.get(key) == threads:
            continue
        if arm.get(key, "(absent)") != base.get(key, "(absent)") and not _matches(key, HONOURED + NO_STEP_COST):
            fix = (f"run with --threads {arm[key]}" if key == "threads" and arm.get(key) else
                   "compare it through ablations.run runs, or drop it from the arm")
            raise PairedError(f"arm {name!r}: {key}={arm.get(key, '(absent)')} changes the training step, and the "
                              "paired step (forward, fp32 cross-entropy, backward, clipping, fused AdamW) cannot "
                              f"honour it; {fix}")


def _compose_arms(model: str | None, arms: list[tuple[str, list[str]]], threads: int):
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ablations.bench import model_dict
    from ablations.compose import compose

    preset = [f"model={model}"] if model else []  # None: conf/config.yaml's default model
    base = _leaves(compose(preset))
    out = []
    for name, overrides in arms:
        try:
            cfg = compose([*preset, *overrides])
        except (HydraException, OmegaConfBaseException) as exc:
            line = " ".join(str(exc).split()) or type(exc).__name__  # Hydra lists the valid options on more lines
            raise PairedError(f"arm {name!r}: {line}") from None
        _check_honoured(name, cfg, base, threads)
        out.append((name, overrides, cfg, model_dict(cfg)))
    vocabs = {m["vocab_size"] for _, _, _, m in out}
    if len(vocabs) > 1:
        raise PairedError(f"arms differ in vocab_size: {sorted(vocabs)}; tokens/s of different tokenizers do not "
                          "compare: pair arms with the same tokenizer")
    return out


def arm_setting(name: str, cfg, device: str | None) -> dict:
    """One arm's device, precision (and why), batch size and context, from its own composed config. --device
    (`device`) applies to every arm; an arm that names another accelerator is refused, as is CUDA where none is."""
    import torch

    from ablations.bench import BareTrainer
    from ablations.lit import resolve_accelerator, resolve_precision

    acc = cfg.trainer.get("accelerator", "auto")
    own = resolve_accelerator(acc)
    if device is not None and acc not in (None, "auto") and own != device:
        raise PairedError(f"arm {name!r}: trainer.accelerator={acc} conflicts with --device {device}; drop one")
    dev = device or own
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise PairedError(f"arm {name!r}: device {dev}: no CUDA device here; use --device cpu or "
                          "trainer.accelerator=cpu")
    precision, why = resolve_precision(cfg.trainer.get("precision", "auto"), dev)
    try:
        BareTrainer.check_precision(precision)
    except ConfigError as exc:
        raise PairedError(f"arm {name!r}: {exc}") from None
    clip = cfg.trainer.get("gradient_clip_val", 1.0)
    return {"device": dev, "precision": precision, "precision_reason": why, "batch_size": int(cfg.data.batch_size),
            "block_size": int(cfg.model.block_size), "clip": float(clip) if clip else None}  # 0: none, as Lightning


def _build(composed, device: str | None, steps: int, warmup: int, path: str = "configured") -> list[tuple]:
    """Each arm's trainer on its own device and precision, stepping through batches of its own batch size and
    context (arms that share them share the batches). path "fastest": an arm not set to compile=true gets both
    candidates, eager and compiled, as {"eager": trainer, "compile": trainer}; `choose_paths` keeps one."""
    from ablations.bench import BareTrainer, training_batches

    settings = [arm_setting(name, cfg, device) for name, _, cfg, _ in composed]  # every refusal before building
    batches, trainers = {}, []
    for (name, overrides, cfg, mcfg), s in zip(composed, settings):
        key = (mcfg["vocab_size"], s["batch_size"], s["block_size"])
        if key not in batches:
            batches[key] = training_batches(*key, max(steps + warmup, 8), seed=0)
        data, s["batches"] = batches[key]
        configured = bool(cfg.get("compile"))
        candidates = (False, True) if path == "fastest" and not configured else (configured,)
        try:  # compile=true: torch.compile (the warm-up compiles)
            built = {("compile" if c else "eager"): BareTrainer(mcfg, data, s["precision"], compiled=c,
                                                                  optim=cfg.optim, device=s["device"], clip=s["clip"])
                     for c in candidates}
        except ConfigError as exc:  # a bad model value (named by modules.config)
            raise PairedError(f"arm {name!r}: {exc}") from None
        trainers.append((name, overrides, mcfg, s, built if len(built) > 1 else next(iter(built.values()))))
    return trainers


PATH_RULES = {"configured": "each arm as its config says (compile=true: torch.compile; else eager)",
              "fastest": "each arm on the faster of eager and torch.compile, by a paired probe before the rounds"}


def eager_kernels() -> dict[str, str]:
    """The harness's own fused kernels the eager path uses here: RMSNorm's C++ kernel (built, or why not)."""
    from modules.kernels import rms_norm as rms_kernel

    built = rms_kernel.kernel() is not None
    return {"rmsnorm": "C++ kernel" if built else f"op by op ({rms_kernel._built.get('why', 'not built')})",
            "rope": "fused autograd.Function (modules/positions/base.py)"}


def _first_steps(tr, n: int, device: str) -> float:
    """Seconds of the first n steps of a fresh trainer (compiled: mostly compiling, from inductor's on-disk
    caches where an earlier process filled them)."""
    from ablations.inference_timing import sync

    t0 = time.perf_counter()
    for _ in range(n):
        tr.step()
    sync(device)
    return time.perf_counter() - t0


def choose_paths(trainers: list[tuple], steps: int, rounds: int, log=print) -> list[tuple]:
    """For every arm with two candidates ({"eager": tr, "compile": tr}), time both side by side in `rounds`
    rounds of `steps` steps (alternating which goes first) and keep the faster by the median of the per-round
    ratios; the probe's figures go into the arm's settings (`probe`). Arms with one trainer pass through."""
    from ablations.inference_timing import sync

    out = []
    for name, overrides, mcfg, s, built in trainers:
        if not isinstance(built, dict):
            out.append((name, overrides, mcfg, s, built))
            continue
        rates = {k: [] for k in built}
        for r in range(rounds):
            for k in (list(built) if r % 2 == 0 else list(built)[::-1]):
                sync(s["device"])
                t0 = time.perf_counter()
                tokens = sum(built[k].step() for _ in range(steps))
                sync(s["device"])
                rates[k].append(tokens / (time.perf_counter() - t0))
        ratio = median(c / e for e, c in zip(rates["eager"], rates["compile"]))
        pick = "compile" if ratio > 1 else "eager"
        s["probe"] = {"rounds": rounds, "steps": steps, "compile_over_eager": ratio,
                      **{f"{k}_tokens_per_sec": median(v) for k, v in rates.items()}}
        log(f"[paired] {name}: compile/eager x{ratio:.3f} over {rounds} probe rounds: {pick}")
        out.append((name, overrides, mcfg, s, built[pick]))
    return out


def _shared(arms: list[dict], key: str):
    """The arms' common value of `key`, or each arm's ("a 32-true, b bf16-mixed") where they differ."""
    values = [a[key] for a in arms]
    return values[0] if len(set(values)) == 1 else ", ".join(f"{a['name']} {a[key]}" for a in arms)


def measure(model: str | None, arms: list[tuple[str, list[str]]], steps: int, rounds: int, warmup: int = 2,
            device: str | None = None, log=print, path: str = "configured", probe_rounds: int = 4) -> dict:
    """Build every arm with its own device, precision, batch size and context, then time `steps` training steps
    per arm per round over `rounds` interleaved rounds. path "fastest": each arm on the faster of eager and
    compiled, chosen by a paired probe of `probe_rounds` rounds (`choose_paths`); "configured": as its config says."""
    import torch

    from ablations.inference_timing import sync
    from modules import accounting

    trainers = _build(_compose_arms(model, arms, torch.get_num_threads()), device, steps, warmup, path)
    notes = emulated_notes([(name, s) for name, *_, s, _ in trainers])
    for line in notes.values():
        log(f"[paired] {line}")
    for *_, s, built in trainers:  # untimed: first-call allocations, compiling, the lr warm-up's first steps
        for candidate, tr in (built.items() if isinstance(built, dict) else [(None, built)]):
            s.setdefault("warmup_sec", {})[candidate or ("compile" if tr.fwd is not tr.model else "eager")] = \
                _first_steps(tr, warmup, s["device"])
    trainers = choose_paths(trainers, steps, probe_rounds, log)
    rates = {name: [] for name, *_ in trainers}
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    for r in range(rounds):
        for name, _, _, s, tr in (trainers if r % 2 == 0 else trainers[::-1]):
            sync(s["device"])
            t0 = time.perf_counter()
            tokens = sum(tr.step() for _ in range(steps))
            sync(s["device"])
            rates[name].append(tokens / (time.perf_counter() - t0))
        log(f"[paired] round {r + 1}/{rounds}: " + "  ".join(f"{n} {rates[n][-1]:,.0f}" for n in rates) + " tok/s")
    ref = trainers[0][0]
    arms_out = []
    for name, overrides, mcfg, s, tr in trainers:
        arms_out.append({"name": name, "overrides": overrides, "compiled": tr.fwd is not tr.model,
                         "path": "compile" if tr.fwd is not tr.model else "eager",
                         **s, "tokens_per_step": tr.tokens,
                         "logits_dtype": str(tr.logits_dtype).removeprefix("torch."),
                         **accounting.param_counts(mcfg),
                         "flops_per_token": accounting.flops_per_token(mcfg), "tokens_per_sec": rates[name],
                         "median_tokens_per_sec": median(rates[name]), **ratio_summary(rates[ref], rates[name]),
                         "loss_last": float(tr.losses[-1])})
    devices = {a["device"] for a in arms_out}
    return {"tool": TOOL, "version": 2, "model": model,
            **{k: _shared(arms_out, k) for k in ("device", "precision", "precision_reason", "batch_size",
                                                   "block_size", "tokens_per_step", "batches")},
            "device_name": ", ".join(torch.cuda.get_device_name() if d.startswith("cuda") else cpu_model()
                                     for d in sorted(devices)),
            "threads": torch.get_num_threads(), "malloc": malloc_mode(), "torch": torch.__version__,
            "steps_per_round": steps, "path_rule": PATH_RULES[path], "kernels": eager_kernels(),
            "warmup_steps": warmup, "rounds": rounds, "order": ORDER, "load_average_start": load_start,
            "load_average_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "reference": ref, "arms": arms_out, "emulated": notes}


def emulated_notes(settings: list[tuple[str, dict]]) -> dict[str, str]:
    """precision -> one line naming the arms whose precision runs emulated on this CPU (its GEMM peak, measured by
    the bench's probe, below fp32's): their tokens/s say little of a CPU with native bf16. Probed only when an arm
    on the CPU runs other than 32-true."""
    from ablations.bench.ceilings import emulated, gemm_probe

    cpu = {s["precision"] for _, s in settings if s["device"] == "cpu"}
    if cpu <= {"32-true"}:
        return {}
    out = {}
    for precision, why in emulated(gemm_probe("cpu"), "cpu").items():
        names = [name for name, s in settings if s["device"] == "cpu" and s["precision"] == precision]
        if names:
            out[precision] = (f"arm{'s' * (len(names) > 1)} {', '.join(names)} at {why}; "
                              f"{'their' if len(names) > 1 else 'its'} tokens/s say little of a CPU with native "
                              f"{precision.split('-')[0]}")
    return out


HISTORY_KEYS = ("date", "command", "device_name", "precision", "path_rule", "threads", "torch", "rounds",
                "steps_per_round", "load_average_start", "load_average_end", "kernels")
HISTORY_ARM_KEYS = ("name", "overrides", "path", "compiled", "median_tokens_per_sec", "ratio", "ratio_ci_low",
                    "ratio_ci_high")


def history_of(path: str) -> list[dict]:
    """An earlier measurement's summary (what the report shows of it, without its rounds) followed by its own
    history: a new measurement of the same arms keeps the old figures beside it instead of replacing them."""
    try:
        old = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise PairedError(f"--history {path}: cannot read it as JSON ({exc}); pass a file written by "
                          "python -m ablations.paired --json FILE") from None
    if not isinstance(old, dict) or old.get("tool") != TOOL or not isinstance(old.get("arms"), list):
        raise PairedError(f"--history {path}: not a measurement of python -m ablations.paired (no tool/arms keys)")
    entry = {k: old.get(k) for k in HISTORY_KEYS}
    entry["arms"] = [{k: a.get(k) for k in HISTORY_ARM_KEYS} for a in old["arms"]]
    return [entry, *old.get("history", [])]


def summary_lines(res: dict) -> list[str]:
    lines = [f"{res['model']}, {res['precision']} on {res['device']} ({res['threads']} threads), {res['rounds']} "
             f"rounds x {res['steps_per_round']} steps x {res['tokens_per_step']} tokens, {ORDER}"]  # per arm where
    # the arms differ: "a 32-true, b bf16-mixed"
    for a in res["arms"]:
        ci = "" if a["ratio_ci_low"] is None else f" [{a['ratio_ci_low']:.3f}, {a['ratio_ci_high']:.3f}]"
        ratio = "reference" if a["name"] == res["reference"] else f"x{a['ratio']:.3f}{ci} vs {res['reference']}"
        probe = a.get("probe")
        why = "" if not probe else f" (compile/eager x{probe['compile_over_eager']:.3f} in the probe)"
        lines.append(f"  {a['name']:<12} {a['median_tokens_per_sec']:>10,.0f} tok/s (median)  {ratio}  "
                     f"params {a['params']:,}  {a.get('path', 'eager')}{why}")
    cold = [f"{a['name']} {a['warmup_sec']['compile']:.0f} s" for a in res["arms"]
            if "compile" in a.get("warmup_sec", {})]
    if cold:  # compiling happens in the first steps; inductor's on-disk caches make later processes faster
        lines.append(f"  compiled arms' first {res['warmup_steps']} steps (compiling): " + ", ".join(cold))
    return lines + [f"  note: {line}" for line in res.get("emulated", {}).values()]


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
    parser.add_argument("--path", default="configured", choices=tuple(PATH_RULES),
                        help="fastest: each arm on the faster of eager and compiled (a paired probe first); "
                             "configured (default): as each arm's compile setting says")
    parser.add_argument("--probe-rounds", dest="probe_rounds", type=int, default=4,
                        help="rounds of the eager/compiled probe with --path fastest (default 4)")
    parser.add_argument("--history", default=None,
                        help="an earlier --json file of these arms: its figures are kept in the new file's history")
    parser.add_argument("--json", default=None, help="write every round and the summary to this JSON file")
    args = parser.parse_args(argv)
    try:
        for opt in ("steps", "rounds", "probe_rounds"):
            if getattr(args, opt) < 1:
                raise PairedError(f"--{opt.replace('_', '-')} {getattr(args, opt)}: must be >= 1")
        if args.warmup < 0:
            raise PairedError(f"--warmup {args.warmup}: must be >= 0")
        if args.threads is not None and args.threads < 1:
            raise PairedError(f"--threads {args.threads}: must be >= 1")
        history = history_of(args.history) if args.history else []  # read before measuring: --json may be it
        arms = [parse_arm(a) for a in args.arms]
        names = [n for n, _ in arms]
        if len(set(names)) != len(names):
            raise PairedError(f"arm names repeat: {names}; give each arm its own name")
        if len(arms) < 2:
            raise PairedError(f"one arm ({names[0]}): a paired comparison needs >= 2 arms")
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        keep_freed_memory()  # as training does
        res = measure(args.model, arms, args.steps, args.rounds, args.warmup, args.device,
                      log=lambda m: print(m, file=sys.stderr, flush=True), path=args.path,
                      probe_rounds=args.probe_rounds)
    except PairedError as exc:
        print(f"ablations.paired: error: {exc}", file=sys.stderr)
        return 2
    res["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    if history:
        res["history"] = history
    res["command"] = "python -m ablations.paired " + " ".join(shlex.quote(a) for a in (argv if argv is not None
                                                                                        else sys.argv[1:]))
    print("\n".join(summary_lines(res)))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
