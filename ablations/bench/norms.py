"""Section `norms`: RMSNorm against LayerNorm, in the whole model and kernel by kernel.

- paired training, in 32-true and in bf16-mixed: the composed model with norm=layernorm and with norm=rmsnorm,
  built in this process and timed in interleaved rounds (`ablations.bench.paired.measure`): tokens/s of rmsnorm over
  layernorm per round, geometric mean and 95% t interval; the figure `python -m ablations.paired model=small-cpu
  steps=10 rounds=8 'layernorm=trainer.precision=P' 'rmsnorm=trainer.precision=P norm=rmsnorm'` prints.
- in training (CPU): each norm's forward and backward per call inside real training steps (the bare loop), this
  thread's CPU time between hooks on the norm modules (forward) and on their autograd nodes (backward): where the
  two norms' costs differ in the model, with its activations coming from and going to memory, not the cache.
- kernels: one norm's forward + backward at the model's activation shape (batch x block_size, n_embd) in fp32, in
  the shared interleaved rounds: F.layer_norm (one fused kernel each way), this project's RMSNorm as the model runs
  it (modules.norms.rmsnorm: its fused kernel on CPU where it is built, modules/kernels/rms_norm.py), its op-by-op
  path, PyTorch's F.rms_norm, and what RMSNorm's time is made of: its forward alone, its backward alone (the fused
  kernel's; on the op-by-op path LayerNorm's fused backward kernel plus the centring correction) against
  LayerNorm's backward kernel, and an autograd.Function that does nothing (Python's cost of a custom autograd
  function, which the op-by-op path pays and LayerNorm and the fused kernel, C++ nodes, do not). The row
  `rmsnorm: largest part` says which of them sets RMSNorm's time.
"""
from __future__ import annotations

import shlex
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .core import Bench, Figures, Section, model_dict, section
from .paired import measure


class _Nothing(torch.autograd.Function):
    """The least a custom autograd function costs: a view forward, the gradient passed through backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def kernel_items(n: int, d: int, device: str, eps: float = 1e-5) -> dict[str, Callable[[], float]]:
    """name -> one call (returns 1.0): forward + backward of each norm on (n, d) fp32, and RMSNorm's pieces."""
    from modules.norms.rmsnorm import _fused_kernel, rms_norm, rms_norm_backward

    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(n, d, generator=g).to(device).requires_grad_()
    w = (1 + 0.1 * torch.randn(d, generator=g)).to(device).requires_grad_()
    b = torch.zeros(d, device=device, requires_grad=True)
    dy = torch.randn(n, d, generator=g).to(device)
    rstd = torch.rsqrt(x.detach().pow(2).mean(-1, keepdim=True) + eps)  # (n, 1)
    k = _fused_kernel(x, w)

    def rms_backward():  # RMSNorm's backward as the model runs it: the fused kernel's, else the op-by-op one
        if k is not None:
            return k.backward(dy, x.detach(), rstd.view(-1), w.detach(), True)
        return rms_norm_backward(dy, x.detach(), rstd, w.detach(), True)

    def fwd_bwd(fn):
        def call():
            x.grad = w.grad = b.grad = None
            fn().backward(dy)
            return 1.0
        return call

    def no_grad(fn):
        def call():
            with torch.no_grad():
                fn()
            return 1.0
        return call

    return {
        "layernorm fwd+bwd": fwd_bwd(lambda: F.layer_norm(x, (d,), w, b, eps)),
        "rmsnorm fwd+bwd": fwd_bwd(lambda: rms_norm(x, w, eps)),
        "rmsnorm op-by-op fwd+bwd": fwd_bwd(lambda: rms_norm(x, w, eps, fused=False)),
        "F.rms_norm fwd+bwd": fwd_bwd(lambda: F.rms_norm(x, (d,), w, eps)),
        "layernorm fwd": no_grad(lambda: F.layer_norm(x, (d,), w, b, eps)),
        "rmsnorm fwd": no_grad(lambda: rms_norm(x, w, eps)),
        "layernorm bwd kernel": no_grad(lambda: torch.ops.aten.native_layer_norm_backward(
            dy, x, [d], torch.zeros_like(rstd), rstd, w, b, [True, True, True])),
        "rmsnorm bwd": no_grad(rms_backward),
        "empty autograd.Function": fwd_bwd(lambda: _Nothing.apply(x)),
    }


PRECISIONS = ("32-true", "bf16-mixed")


def paired_arms(overrides: list[str], precision: str) -> tuple[str, list[tuple[str, list[str]]]]:
    """The bench's overrides -> (model preset, the two arms at `precision`): the model choice goes to --model,
    norm= is the arm."""
    model, rest = "small-cpu", []
    for o in overrides:
        key = o.split("=", 1)[0]
        if key == "model":
            model = o.split("=", 1)[1]
        elif key not in ("norm", "trainer.precision") and not key.startswith("norm."):
            rest.append(o)
    rest.append(f"trainer.precision={precision}")
    return model, [("layernorm", [*rest, "norm=layernorm"]), ("rmsnorm", [*rest, "norm=rmsnorm"])]


class _Clock:
    """Hooks: this thread's CPU time between `start` and `stop`, summed over calls."""

    def __init__(self):
        self.total, self.calls, self._t0 = 0.0, 0, []

    def start(self, *_):
        self._t0.append(time.thread_time())

    def stop(self, *_):  # returns None: a forward hook's return value would replace the module's output
        self.total += time.thread_time() - self._t0.pop()
        self.calls += 1


def in_training_seconds(model_cfg: dict, optim, batch_size: int, precision: str, steps: int) -> dict[str, float]:
    """Seconds of this thread's CPU per call of a norm's forward and backward inside `steps` bare-loop training
    steps on CPU (after 2 untimed): forward between the module's pre- and post-hook, backward between the pre-
    and post-hook of the autograd node that made its output (on CPU the calling thread runs the backward)."""
    from modules.norms.base import Norm

    from .train import BareTrainer, training_batches

    batches, _ = training_batches(model_cfg["vocab_size"], batch_size, model_cfg["block_size"], n=4)
    tr = BareTrainer(model_cfg, batches, precision, False, optim, "cpu")
    fwd, bwd = _Clock(), _Clock()

    def after_forward(module, inputs, output):
        fwd.stop()
        if output.grad_fn is not None:
            output.grad_fn.register_prehook(bwd.start)
            output.grad_fn.register_hook(bwd.stop)

    for m in tr.model.modules():
        if isinstance(m, Norm):
            m.register_forward_pre_hook(fwd.start)
            m.register_forward_hook(after_forward)
    for _ in range(2):
        tr.step()
    fwd.total = bwd.total = 0.0
    fwd.calls = bwd.calls = 0
    for _ in range(steps):
        tr.step()
    return {"forward": fwd.total / max(1, fwd.calls), "backward": bwd.total / max(1, bwd.calls),
            "calls_per_step": fwd.calls / steps}


@section
class Norms(Section):
    name, order = "norms", 75

    def work(self, bench: Bench) -> dict[str, Callable[[], float]]:
        m = bench.model
        return kernel_items(bench.batch_size * int(m["block_size"]), int(m["n_embd"]), bench.device)

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        steps = bench.opts.steps or (4 if bench.opts.quick else 10)
        rounds = 2 if (bench.opts.quick or bench.opts.steps) else 8
        values, rows = {"paired": {}, "in_training": {}}, []
        for precision in PRECISIONS:
            values["paired"][precision], row = paired_training(bench, precision, steps, rounds)
            rows.append(row)
        if not bench.cuda:  # on CUDA the hooks would time kernel launches, not kernels
            for precision in PRECISIONS:
                values["in_training"][precision], row = in_training(bench, precision, min(steps, 4))
                rows.append(row)
        kernel_values, kernel_rows = kernels(bench, rates)
        return Figures({"norms": values | kernel_values}, rows + kernel_rows)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs"


def paired_training(bench: Bench, precision: str, steps: int, rounds: int) -> tuple[dict, tuple[str, str]]:
    """Paired training tokens/s, rmsnorm over layernorm, at `precision` (`ablations.bench.paired.measure`)."""
    model, arms = paired_arms(bench.overrides, precision)
    bench.log(f"norms: paired training layernorm vs rmsnorm ({model}, {precision}, {rounds} rounds x {steps} steps)")
    res = measure(model, arms, steps, rounds, device=bench.device, log=bench.log)
    rms = next(a for a in res["arms"] if a["name"] == "rmsnorm")
    ci = "" if rms["ratio_ci_low"] is None else f" [{rms['ratio_ci_low']:.3f}, {rms['ratio_ci_high']:.3f}]"
    command = (f"python -m ablations.paired model={model} steps={steps} rounds={rounds} "
               + " ".join(shlex.quote(f"{name}={' '.join(o)}") for name, o in arms))
    values = {"command": command, "model": model, "precision": res["precision"], "steps": steps,
              "rounds": rounds, "ratio_rmsnorm_over_layernorm": rms["ratio"], "ratio_ci_low": rms["ratio_ci_low"],
              "ratio_ci_high": rms["ratio_ci_high"],
              "tokens_per_sec": {a["name"]: a["median_tokens_per_sec"] for a in res["arms"]}}
    return values, (f"paired training rmsnorm / layernorm ({model}, {res['precision']})",
                    f"x{rms['ratio']:.3f}{ci}  ({rounds} rounds x {steps} steps)")


def in_training(bench: Bench, precision: str, steps: int) -> tuple[dict, tuple[str, str]]:
    """Each norm's forward and backward per call inside training steps of the bench's model at `precision`."""
    from ablations.compose import compose

    model, arms = paired_arms(bench.overrides, precision)
    out = {}
    for name, overrides in arms:
        cfg = compose([f"model={model}", *overrides])
        out[name] = in_training_seconds(model_dict(cfg), cfg.optim, int(cfg.data.batch_size), precision, steps)
    ln, rms = out["layernorm"], out["rmsnorm"]
    extra = (rms["forward"] + rms["backward"] - ln["forward"] - ln["backward"]) * rms["calls_per_step"]
    return out, (f"per norm call in training ({model}, {precision}, CPU time)",
                 f"forward layernorm {_us(ln['forward'])} / rmsnorm {_us(rms['forward'])}, backward "
                 f"{_us(ln['backward'])} / {_us(rms['backward'])}; rmsnorm {extra * 1e3:+.2f} ms per step "
                 f"({rms['calls_per_step']:g} calls)")


def kernels(bench: Bench, rates: dict[str, dict]) -> tuple[dict, list[tuple[str, str]]]:
    """The kernel items of the shared rounds: one norm's fwd+bwd at the activation shape, RMSNorm's parts."""
    secs = {k: 1.0 / v["best"] for k, v in rates.items()}  # seconds per call, best round
    ln = secs["layernorm fwd+bwd"]
    from modules.kernels import rms_norm as rms_kernel

    fused = rms_kernel.kernel() is not None and bench.device == "cpu"
    pieces = {"forward": secs["rmsnorm fwd"], "backward": secs["rmsnorm bwd"]}
    if not fused:  # the op-by-op path runs a Python autograd.Function; the fused kernel's node is C++
        pieces["autograd.Function"] = secs["empty autograd.Function"]
    floor = max(pieces, key=pieces.get)
    m = bench.model
    shape = [bench.batch_size * int(m["block_size"]), int(m["n_embd"])]
    rows = [(f"norm fwd+bwd {shape[0]}x{shape[1]} fp32",
             f"layernorm {_us(ln)} | rmsnorm {_us(secs['rmsnorm fwd+bwd'])} "
             f"(x{secs['rmsnorm fwd+bwd'] / ln:.2f}, {'fused kernel' if fused else 'op by op: no fused kernel'}) | "
             f"rmsnorm op by op {_us(secs['rmsnorm op-by-op fwd+bwd'])} | "
             f"F.rms_norm {_us(secs['F.rms_norm fwd+bwd'])}"),
            ("rmsnorm pieces", f"forward {_us(pieces['forward'])} (layernorm's {_us(secs['layernorm fwd'])}), "
                               f"backward {_us(pieces['backward'])} "
                               f"(layernorm's kernel {_us(secs['layernorm bwd kernel'])}), empty "
                               f"autograd.Function {_us(secs['empty autograd.Function'])}"),
            ("rmsnorm: largest part", f"its {floor} ({_us(pieces[floor])} of {_us(secs['rmsnorm fwd+bwd'])})")]
    return {"kernel_shape": shape, "kernel_seconds": secs, "rmsnorm_floor": floor, "rmsnorm_fused": fused}, rows
