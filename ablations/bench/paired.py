"""The paired training measurement: every arm's model built in this one process and timed in interleaved rounds
(A B C, C B A, ...), each arm at its own device, precision, batch size and context; what `python -m
ablations.paired` runs (the command, its arm syntax and JSON: ablations/paired.py) and the norms and roofline
sections of the bench measure with.

Arms come as (name, Hydra overrides) composed on conf/ with `model=<model>`; an arm that changes what the bare
training step (ablations.bench.train.BareTrainer) cannot honour is refused with one line (`PairedError`).
"""
from __future__ import annotations

import os
import time
from statistics import median

import torch
from hydra.errors import HydraException
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from ablations.compose import CONF_DIR, compose, compose_here, config_dir
from ablations.inference_timing import sync
from ablations.malloc import describe as malloc_mode
from ablations.repro import cpu_model
from modules import accounting
from modules.errors import ConfigError
from modules.kernels import gelu_tanh as gelu_kernel
from modules.kernels import glu as glu_kernel
from modules.kernels import head_norm as head_kernel
from modules.kernels import rms_norm as rms_kernel
from modules.kernels import rotary as rotary_kernel

from . import ceilings
from .core import model_dict
from .timing import ratio_summary
from .train import BareTrainer, training_batches

TOOL = "ablations.paired"
ORDER = "interleaved rounds: every arm once per round, the order given reversed every other round (A B C, C B A, ...)"


class PairedError(ConfigError):
    """Bad input: one line naming the bad value and the fix."""


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
    experiment may set it) is honoured when it is the process's own thread count (threads=), which every arm
    shares."""
    arm = _leaves(cfg)
    for key in sorted(set(arm) | set(base), key=lambda k: (k.count("."), k)):  # optim.name before optim.muon.*
        if key == "threads" and arm.get(key) == threads:
            continue
        if arm.get(key, "(absent)") != base.get(key, "(absent)") and not _matches(key, HONOURED + NO_STEP_COST):
            fix = (f"run with threads={arm[key]}" if key == "threads" and arm.get(key) else
                   "compare it through ablations.run runs, or drop it from the arm")
            raise PairedError(f"arm {name!r}: {key}={arm.get(key, '(absent)')} changes the training step, and the "
                              "paired step (forward, fp32 cross-entropy, backward, clipping, fused AdamW) cannot "
                              f"honour it; {fix}")


def _compose_arm(overrides: list[str]):
    """An arm's config and the model preset it resolved to: the arm's own `model=`, its experiment's, or the
    command's (an arm's `model=gpt2-124m` overrides the command's `model=`, so the command's is not the arms')."""
    with config_dir(CONF_DIR):
        cfg = compose_here(overrides, hydra_config=True)
    preset = cfg.hydra.runtime.choices.get("model")
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, preset


def _compose_arms(model: str | None, arms: list[tuple[str, list[str]]], threads: int):
    preset = [f"model={model}"] if model else []  # None: conf/config.yaml's default model
    base = _leaves(compose(preset))
    out = []
    for name, overrides in arms:
        try:
            cfg, model_preset = _compose_arm([*preset, *overrides])
        except (HydraException, OmegaConfBaseException) as exc:
            line = " ".join(str(exc).split()) or type(exc).__name__  # Hydra lists the valid options on more lines
            raise PairedError(f"arm {name!r}: {line}") from None
        _check_honoured(name, cfg, base, threads)
        out.append((name, overrides, cfg, model_dict(cfg), model_preset))
    vocabs = {m["vocab_size"] for _, _, _, m, _ in out}
    if len(vocabs) > 1:
        raise PairedError(f"arms differ in vocab_size: {sorted(vocabs)}; tokens/s of different tokenizers do not "
                          "compare: pair arms with the same tokenizer")
    return out


def arm_setting(name: str, cfg, device: str | None) -> dict:
    """One arm's device, precision (and why), batch size and context, from its own composed config. `device`
    (the command's device=) applies to every arm; an arm that names another accelerator is refused, as is CUDA
    where none is."""
    from ablations.lit import resolve_accelerator, resolve_precision  # Lightning takes seconds to import: on use

    acc = cfg.trainer.get("accelerator", "auto")
    own = resolve_accelerator(acc)
    if device is not None and acc not in (None, "auto") and own != device:
        raise PairedError(f"arm {name!r}: trainer.accelerator={acc} conflicts with device={device}; drop one")
    dev = device or own
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise PairedError(f"arm {name!r}: device {dev}: no CUDA device here; use device=cpu or "
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
    settings = [arm_setting(name, cfg, device) for name, _, cfg, *_ in composed]  # every refusal before building
    batches, trainers = {}, []
    for (name, overrides, cfg, mcfg, model_preset), s in zip(composed, settings):
        s["model"] = model_preset
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
    """The harness's own fused kernels the eager path uses here: RMSNorm's, GELU-tanh's, rope's, the GLU gate's and
    QK-norm's LayerNorm's C++ kernels (built, or why not and what runs instead)."""
    def state(k, fallback):
        return "C++ kernel" if k.ops() is not None else f"{fallback} ({k.built.get('why', 'not built')})"

    return {"rmsnorm": state(rms_kernel.KERNEL, "op by op"), "gelu_tanh": state(gelu_kernel.KERNEL, "ATen's gelu"),
            "rope": state(rotary_kernel.KERNEL, "fused autograd.Function, modules/positions/base.py"),
            "glu": state(glu_kernel.KERNEL, "PyTorch ops"), "qk_layernorm": state(head_kernel.KERNEL, "F.layer_norm")}


def _first_steps(tr, n: int, device: str) -> float:
    """Seconds of the first n steps of a fresh trainer (compiled: mostly compiling, from inductor's on-disk
    caches where an earlier process filled them)."""
    t0 = time.perf_counter()
    for _ in range(n):
        tr.step()
    sync(device)
    return time.perf_counter() - t0


def choose_paths(trainers: list[tuple], steps: int, rounds: int, log=print) -> list[tuple]:
    """For every arm with two candidates ({"eager": tr, "compile": tr}), time both side by side in `rounds`
    rounds of `steps` steps (alternating which goes first) and keep the faster by the median of the per-round
    ratios; the probe's figures go into the arm's settings (`probe`). Arms with one trainer pass through."""
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
    return {"tool": TOOL, "version": 2,
            **{k: _shared(arms_out, k) for k in ("model", "device", "precision", "precision_reason", "batch_size",
                                                   "block_size", "tokens_per_step", "batches")},
            "device_name": ", ".join(torch.cuda.get_device_name() if d.startswith("cuda") else cpu_model()
                                     for d in sorted(devices)),
            "threads": torch.get_num_threads(), "malloc": malloc_mode(), "torch": torch.__version__,
            "steps_per_round": steps, "path_rule": PATH_RULES[path],
            "kernels": eager_kernels() if "cpu" in devices else {},  # CPU kernels: none on an accelerator
            "warmup_steps": warmup, "rounds": rounds, "order": ORDER, "load_average_start": load_start,
            "load_average_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "reference": ref, "arms": arms_out, "emulated": notes}


def emulated_notes(settings: list[tuple[str, dict]]) -> dict[str, str]:
    """precision -> one line naming the arms whose precision runs emulated on this CPU (its GEMM peak, measured by
    the bench's probe, below fp32's): their tokens/s say little of a CPU with native bf16. Probed only when an arm
    on the CPU runs other than 32-true."""
    cpu = {s["precision"] for _, s in settings if s["device"] == "cpu"}
    if cpu <= {"32-true"}:
        return {}
    out = {}
    for precision, why in ceilings.emulated(ceilings.gemm_probe("cpu"), "cpu").items():
        names = [name for name, s in settings if s["device"] == "cpu" and s["precision"] == precision]
        if names:
            out[precision] = (f"arm{'s' * (len(names) > 1)} {', '.join(names)} at {why}; "
                              f"{'their' if len(names) > 1 else 'its'} tokens/s say little of a CPU with native "
                              f"{precision.split('-')[0]}")
    return out
