"""Section `gelu`: GELU's tanh form eager on CPU, the harness's C++ kernel (modules/kernels/gelu_tanh.py) against
ATen's gelu, which evaluates that form's tanh at several times the cost of its erf form.

- kernels: forward + backward at the MLP's activation shape (batch x block_size, hidden) in fp32 and bf16, in the
  shared interleaved rounds, through autograd as the model calls them: the kernel, ATen's tanh form, and ATen's erf
  form (the cheap form's time, for scale).
- paired training: the composed model trained eager at each of the bench's precisions, one trainer with the
  kernel and one with ATen's gelu (the same initial weights and batches), in rounds whose order alternates (kernel
  first, then ATen first, ...): tokens/s of the kernel's over ATen's per round, geometric mean and 95% t interval.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from modules.kernels import gelu_tanh as gelu_kernel

from .core import DTYPES, Bench, Figures, Section, section
from .timing import ratio_summary


@contextmanager
def kernel_set(ops):
    """The kernel the model's gelu sees inside the block: `ops` (the built one) or None (ATen's gelu)."""
    saved = dict(gelu_kernel.KERNEL.built)
    gelu_kernel.KERNEL.built.update(module=ops)
    try:
        yield
    finally:
        gelu_kernel.KERNEL.built.clear()
        gelu_kernel.KERNEL.built.update(saved)


def kernel_items(n: int, h: int, ops) -> dict[str, Callable[[], float]]:
    """name -> one forward + backward (returns 1.0) at (n, h) of each form, in fp32 and bf16."""
    g = torch.Generator().manual_seed(0)
    items = {}
    for tag, dtype in DTYPES.items():
        x = torch.randn(n, h, generator=g).to(dtype).requires_grad_()
        dy = torch.randn(n, h, generator=g).to(dtype)

        def call(fn, x=x, dy=dy):
            def once():
                x.grad = None
                fn(x).backward(dy)
                return 1.0
            return once

        items[f"gelu tanh kernel {tag}"] = call(ops.gelu_tanh)
        items[f"gelu tanh ATen {tag}"] = call(lambda t: F.gelu(t, approximate="tanh"))
        items[f"gelu erf ATen {tag}"] = call(F.gelu)
    return items


@section
class Gelu(Section):
    name, order, uses_precisions = "gelu", 77, True

    def check(self, bench: Bench) -> None:
        if bench.cuda:
            raise SystemExit("ablations.bench: only=gelu measures a CPU kernel (ATen's own runs on CUDA); "
                             "run it with device=cpu")
        if bench.cfg.mlp.name != "gelu" or bench.cfg.mlp.get("approximate", "tanh") != "tanh":
            raise SystemExit(f"ablations.bench: only=gelu needs mlp=gelu with its tanh form (the composed model has "
                             f"mlp={bench.cfg.mlp.name}); drop the mlp override")

    def work(self, bench: Bench) -> dict[str, Callable[[], float]]:
        ops = gelu_kernel.kernel()
        if ops is None:
            return {}
        m = bench.model
        hidden = bench.cfg.mlp.get("hidden") or 4 * int(m["n_embd"])
        return kernel_items(bench.batch_size * int(m["block_size"]), int(hidden), ops)

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        ops = gelu_kernel.kernel()
        if ops is None:
            why = gelu_kernel.KERNEL.built.get("why")
            return Figures({"gelu": {"kernel": None, "why": why}}, [("gelu: the C++ kernel", f"not built ({why})")])
        values, rows = {"kernel_ms": {}, "paired": {}}, []
        for tag in DTYPES:
            ms = {form: 1e3 / rates[f"gelu {form} {tag}"]["best"] for form in ("tanh kernel", "tanh ATen", "erf ATen")}
            values["kernel_ms"][tag] = ms
            slower = ms["tanh ATen"] / ms["tanh kernel"]
            rows.append((f"gelu fwd+bwd {tag}, best round",
                         f"kernel {ms['tanh kernel']:.3f} ms | ATen tanh {ms['tanh ATen']:.3f} ms "
                         f"(x{slower:.2f} the kernel's) | ATen erf {ms['erf ATen']:.3f} ms"))
        steps = bench.opts.steps or 2
        rounds = 2 if (bench.opts.quick or bench.opts.steps) else 20
        for precision in bench.precisions.run:
            values["paired"][precision] = summary = paired_steps(bench, precision, ops, steps, rounds)
            ci = "" if summary["ratio_ci_low"] is None else \
                f" [{summary['ratio_ci_low']:.3f}, {summary['ratio_ci_high']:.3f}]"
            rows.append((f"paired training, kernel / ATen ({precision}, eager)",
                         f"x{summary['ratio']:.3f}{ci}  ({rounds} rounds x {steps} steps)"))
        return Figures({"gelu": values}, rows)


def paired_steps(bench: Bench, precision: str, ops, steps: int, rounds: int) -> dict:
    """Eager training tokens/s with the kernel over ATen's gelu, two trainers of the composed model paired by round."""
    from .train import BareTrainer, training_batches

    m = bench.model
    batches, _ = training_batches(m["vocab_size"], bench.batch_size, m["block_size"], n=max(steps + 2, 4))
    arms = {}
    for name in ("kernel", "aten"):
        torch.manual_seed(0)  # the same initial weights in both
        arms[name] = BareTrainer(m, batches, precision, False, bench.cfg.optim, "cpu")
    rates = {name: [] for name in arms}

    def timed(name):
        with kernel_set(ops if name == "kernel" else None):
            t0 = time.perf_counter()
            tokens = sum(arms[name].step() for _ in range(steps))
            return tokens / (time.perf_counter() - t0)

    for name in arms:  # untimed: first-call allocations
        timed(name)
    for r in range(rounds):
        for name in (("kernel", "aten") if r % 2 == 0 else ("aten", "kernel")):
            rates[name].append(timed(name))
    return {"steps": steps, "rounds": rounds, "tokens_per_sec": rates, **ratio_summary(rates["aten"], rates["kernel"])}
