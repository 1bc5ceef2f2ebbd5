"""GELU's tanh form (GPT-2's) on CPU in eager mode: one vectorised pass forward and one backward, fp32 or bf16.

ATen's CPU kernel for this form evaluates tanh at 4.8x the cost of its erf form (1.7 ms forward at (2048, 512)
fp32 against 0.36 ms on an AMX Xeon): forward and backward were ~16-18% of an eager fp32 small-cpu step and ~23%
of an eager bf16-mixed one (docs/bench.md). The kernel (gelu_tanh.cpp beside this file, built on first use by
modules/kernels/build.py) computes the same function as a sigmoid, with an exp that vectorises:

    gelu(x) = 0.5 x (1 + tanh(u)) = x s,    u = sqrt(2/pi) (x + 0.044715 x^3),  s = sigmoid(2u) = 1 / (1 + e^(-2u))
    dgelu/dx = s + x s (1 - s) 2 du/dx,     2 du/dx = 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2)

in fp32 (bf16 in and out are widened and rounded to nearest even), e^v by range reduction and its Taylor series to
v^6 (relative error < 2e-7). It saves x alone, as ATen's gelu does. Under torch.compile inductor fuses the same
sigmoid form itself (modules/mlps/base.py), and off the CPU ATen's kernels stay. With ABLATIONS_GELU_KERNEL=off,
or where it cannot be built, `kernel()` is None and F.gelu runs (the reason warned once).
"""
from __future__ import annotations

from pathlib import Path

from modules.kernels.build import Kernel

KERNEL = Kernel(Path(__file__).with_name("gelu_tanh.cpp"), "ablations_gelu", "gelu_tanh", "ABLATIONS_GELU_KERNEL",
                "GELU: the CPU kernel for its tanh form is not used ({why}); ATen's gelu runs, ~3x slower eager")


def kernel():
    """`torch.ops.ablations_gelu` (gelu_tanh: the op with its C++ autograd node; forward, backward: the two
    kernels), or None where it cannot be had (the reason warned once)."""
    return KERNEL.ops()
