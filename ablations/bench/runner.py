"""One bench run: compose the config, check the chosen sections' options, time their shared work in interleaved
rounds, then run each section in table order; returns the JSON (with the printed table under "table")."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

import torch

from ablations.compose import compose
from ablations.malloc import describe as malloc_mode

from .ceilings import plan_precisions
from .core import Bench, Options, Row, Section, model_dict
from .timing import fixed_steps, interleaved


def selected(registry: dict[str, type[Section]], chosen: list[str]) -> list[Section]:
    """The chosen sections and those they need, in table order (the registry's), each a fresh instance."""
    wanted = set(chosen)
    for name in chosen:
        wanted.update(registry[name].needs)
    return [cls() for name, cls in registry.items() if name in wanted]


def header(bench: Bench) -> dict:
    """What the JSON says before any section: the config, the machine, the model's size."""
    from modules import accounting

    device = bench.device
    out = {"overrides": bench.overrides, "model": bench.model, "batch_size": bench.batch_size, "device": device,
           "threads": torch.get_num_threads(), "malloc": malloc_mode(), "torch": torch.__version__,
           "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
           "flops_per_token": accounting.flops_per_token(bench.model), **accounting.param_counts(bench.model),
           "mfu_peak_source": "configured (bf16)" if bench.opts.peak_flops else "measured"}
    if bench.cuda:
        out["gpu"] = torch.cuda.get_device_name()
    return out


def shared_rounds(bench: Bench, work: dict[str, dict[str, Callable[[], float]]], warmup: int) -> dict[str, dict]:
    """Every section's work items timed side by side (or, with steps=, a fixed number of calls each)."""
    items = {name: fn for section_items in work.values() for name, fn in section_items.items()}
    if not items:
        return {}
    if bench.opts.steps:  # dry run: a fixed number of steps per item, no timing rounds
        return fixed_steps(items, bench.opts.steps, bench.device)
    bench.log(f"measuring {', '.join(items)} in {bench.rounds} interleaved rounds of {bench.window:g} s each")
    return interleaved(items, bench.window, bench.rounds, bench.device, warmup=warmup)


def run(overrides: list[str], chain: list[Section], opts: Options,
        log: Callable[[str], None] = lambda msg: None) -> dict:
    cfg = compose(overrides)
    bench = Bench(overrides, cfg, model_dict(cfg), opts, window=opts.window or (0.25 if opts.quick else 1.0),
                  rounds=opts.rounds or (2 if opts.quick else 3), log=log)
    out = header(bench)
    for s in chain:  # refuse bad options before measuring anything
        s.check(bench)
    rows: list[Row] = []
    if any(s.uses_precisions for s in chain):  # before any model is built: an emulated precision takes minutes
        plan = plan_precisions(bench)
        bench = replace(bench, precisions=plan)
        out["precisions"] = {"run": plan.run, "skipped": plan.skipped, "probe_gemm_flops": plan.peaks}
        if plan.skipped:
            log(plan.line())
            rows.append(("precisions", plan.line()))
    work = {s.name: s.work(bench) for s in chain}
    rates = shared_rounds(bench, work, warmup=max((s.warmup for s in chain), default=1))
    for s in chain:
        mine = {name: rates[name] for name in work.pop(s.name)}  # the items go: a section frees what it built
        figures = s.run(bench, mine, out)
        out.update(figures.values)
        rows += figures.rows
    out["table"] = rows
    return out
