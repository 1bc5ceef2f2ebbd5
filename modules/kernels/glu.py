"""The gated MLPs' gate on CPU in eager mode (SwiGLU, GEGLU with GELU's tanh form): one C++ pass each way.

    h = [g, u] (..., 2H), the fused gate-and-up projection's output
    a = act(g) u,                      act(g) = g sigmoid(z): z = g (SiLU) or z = g (2 sqrt(2/pi)) (1 + 0.044715 g^2)
    dg = da u act'(g), du = da act(g), act'(g) = s + g s (1 - s) dz/dg,  s = sigmoid(z)

in fp32 (bf16 in and out widened and rounded to nearest even), the sigmoid as in modules/kernels/gelu_tanh.py. In
PyTorch ops the same is a chunk, the activation and a product forward, and backward the product's two gradients, the
activation's and a copy of both halves into one buffer: an eager known-results SwiGLU step was ×0.943 and GEGLU's
×0.916 of the GELU baseline on an AMX Xeon (bf16-mixed), at the same FLOPs. The kernel is glu.cpp beside this file,
built on first use (modules/kernels/build.py); with ABLATIONS_GLU_KERNEL=off, or where it cannot be built,
`kernel()` is None and the MLPs run in PyTorch ops (the reason warned once). Under torch.compile inductor fuses the
PyTorch ops itself.
"""
from __future__ import annotations

from pathlib import Path

from modules.kernels.build import Kernel

GATES = {"silu": 0, "gelu_tanh": 1}  # the kernel's gate codes (glu.cpp's Gate)

KERNEL = Kernel(Path(__file__).with_name("glu.cpp"), "ablations_glu", "glu", "ABLATIONS_GLU_KERNEL",
                "GLU: the CPU kernel for the gated MLPs' gate is not used ({why}); it runs in PyTorch ops, slower "
                "eager")


def kernel():
    """`torch.ops.ablations_glu` (glu: the op with its C++ autograd node; forward, backward: the two kernels), or
    None where it cannot be had (the reason warned once)."""
    return KERNEL.ops()
