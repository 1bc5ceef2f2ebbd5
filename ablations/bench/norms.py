"""Section `norms`: RMSNorm against LayerNorm, in the whole model and kernel by kernel.

- paired training: the composed model with norm=layernorm and with norm=rmsnorm, built in this process and timed in
  interleaved rounds (`ablations.paired.measure`): tokens/s of rmsnorm over layernorm per round, geometric mean and
  95% t interval; the figure `python -m ablations.paired --model small-cpu --steps 10 --rounds 8 layernorm=
  rmsnorm=norm=rmsnorm` prints, at the harness's precision (auto: bf16-mixed where bf16 is native).
- kernels: one norm's forward + backward at the model's activation shape (batch x block_size, n_embd) in fp32, in
  the shared interleaved rounds: F.layer_norm (one fused kernel each way), this project's RMSNorm
  (modules.norms.rmsnorm), PyTorch's F.rms_norm, and what RMSNorm's time is made of: its forward alone, LayerNorm's
  fused backward kernel alone (RMSNorm's backward runs it), the centring correction, and an autograd.Function that
  does nothing (Python's cost of a custom autograd function, which LayerNorm, all C++, does not pay). The row
  `rmsnorm floor` says which of them sets RMSNorm's time.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .core import Bench, Figures, Section, section


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
    from modules.norms.rmsnorm import rms_norm_backward, rms_norm

    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(n, d, generator=g).to(device).requires_grad_()
    w = (1 + 0.1 * torch.randn(d, generator=g)).to(device).requires_grad_()
    b = torch.zeros(d, device=device, requires_grad=True)
    dy = torch.randn(n, d, generator=g).to(device)
    rstd = torch.rsqrt(x.detach().pow(2).mean(-1, keepdim=True) + eps)  # (n, 1)

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
        "F.rms_norm fwd+bwd": fwd_bwd(lambda: F.rms_norm(x, (d,), w, eps)),
        "layernorm fwd": no_grad(lambda: F.layer_norm(x, (d,), w, b, eps)),
        "rmsnorm fwd": no_grad(lambda: rms_norm(x, w, eps)),
        "layernorm bwd kernel": no_grad(lambda: torch.ops.aten.native_layer_norm_backward(
            dy, x, [d], torch.zeros_like(rstd), rstd, w, b, [True, True, True])),
        "rmsnorm bwd (kernel + centring)": no_grad(
            lambda: rms_norm_backward(dy, x.detach(), rstd, w.detach(), True)),
        "empty autograd.Function": fwd_bwd(lambda: _Nothing.apply(x)),
    }


def paired_arms(overrides: list[str]) -> tuple[str, list[tuple[str, list[str]]]]:
    """The bench's overrides -> (model preset, the two arms): the model choice goes to --model, norm= is the arm."""
    model, rest = "small-cpu", []
    for o in overrides:
        key = o.split("=", 1)[0]
        if key == "model":
            model = o.split("=", 1)[1]
        elif key != "norm" and not key.startswith("norm."):
            rest.append(o)
    return model, [("layernorm", [*rest, "norm=layernorm"]), ("rmsnorm", [*rest, "norm=rmsnorm"])]


@section
class Norms(Section):
    name, order = "norms", 75

    def work(self, bench: Bench) -> dict[str, Callable[[], float]]:
        m = bench.model
        return kernel_items(bench.batch_size * int(m["block_size"]), int(m["n_embd"]), bench.device)

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        from ablations.paired import measure

        model, arms = paired_arms(bench.overrides)
        steps = bench.opts.steps or (4 if bench.opts.quick else 10)
        rounds = 2 if (bench.opts.quick or bench.opts.steps) else 8
        bench.log(f"norms: paired training layernorm vs rmsnorm ({model}, {rounds} rounds x {steps} steps)")
        res = measure(model, arms, steps, rounds, device=bench.device, log=bench.log)
        rms = next(a for a in res["arms"] if a["name"] == "rmsnorm")
        secs = {k: 1.0 / v["best"] for k, v in rates.items()}  # seconds per call, best round
        ln = secs["layernorm fwd+bwd"]
        pieces = {"forward": secs["rmsnorm fwd"], "backward": secs["rmsnorm bwd (kernel + centring)"],
                  "autograd.Function": secs["empty autograd.Function"]}
        floor = max(pieces, key=pieces.get)
        m = bench.model
        shape = [bench.batch_size * int(m["block_size"]), int(m["n_embd"])]
        ci = "" if rms["ratio_ci_low"] is None else f" [{rms['ratio_ci_low']:.3f}, {rms['ratio_ci_high']:.3f}]"
        command = (f"python -m ablations.paired --model {model} --steps {steps} --rounds {rounds} layernorm= "
                   f"rmsnorm=norm=rmsnorm")
        values = {"norms": {
            "paired": {"command": command, "model": model, "precision": res["precision"], "steps": steps,
                       "rounds": rounds, "ratio_rmsnorm_over_layernorm": rms["ratio"],
                       "ratio_ci_low": rms["ratio_ci_low"], "ratio_ci_high": rms["ratio_ci_high"],
                       "tokens_per_sec": {a["name"]: a["median_tokens_per_sec"] for a in res["arms"]}},
            "kernel_shape": shape, "kernel_seconds": secs, "rmsnorm_floor": floor}}
        us = lambda s: f"{s * 1e6:,.0f} µs"  # noqa: E731
        rows = [(f"paired training rmsnorm / layernorm ({model}, {res['precision']})",
                 f"x{rms['ratio']:.3f}{ci}  ({rounds} rounds x {steps} steps; {command})"),
                (f"norm fwd+bwd {shape[0]}x{shape[1]} fp32",
                 f"layernorm {us(ln)} | rmsnorm {us(secs['rmsnorm fwd+bwd'])} "
                 f"(x{secs['rmsnorm fwd+bwd'] / ln:.2f}) | F.rms_norm {us(secs['F.rms_norm fwd+bwd'])}"),
                ("rmsnorm pieces", f"forward {us(pieces['forward'])} (layernorm's {us(secs['layernorm fwd'])}), "
                                   f"backward {us(pieces['backward'])} "
                                   f"(layernorm's kernel {us(secs['layernorm bwd kernel'])}), empty "
                                   f"autograd.Function {us(pieces['autograd.Function'])}"),
                ("rmsnorm: largest part", f"its {floor} ({us(pieces[floor])} of {us(secs['rmsnorm fwd+bwd'])})")]
        return Figures(values, rows)
