"""Rope's rotation on CPU in eager mode: one C++ pass over each row of q or k, forward and backward, fp32 or bf16.

    out = (x1 cos - x2 sin, x2 cos + x1 sin),  x = (x1, x2) the two halves of each head's rotated width

with the angles' cos and sin in fp32 (late positions need the mantissa), the output in x's dtype, and the backward
the rotation back (cos, -sin). modules/positions/base.py's `_Rotate` does the same in PyTorch ops: four kernels
and a dtype conversion each way, and a Python autograd.Function per call; an eager known-results rope step was
×0.876 of the learned-position baseline with it on an AMX Xeon (bf16-mixed), where the FLOPs are the same. The
kernel is rotary.cpp beside this file, built on first use (modules/kernels/build.py); with ABLATIONS_ROTARY_KERNEL=off,
or where it cannot be built, `kernel()` is None and `_Rotate` runs (the reason warned once). Under torch.compile
inductor fuses the formula itself.
"""
from __future__ import annotations

from pathlib import Path

from modules.kernels.build import Kernel

KERNEL = Kernel(Path(__file__).with_name("rotary.cpp"), "ablations_rotary", "rotary", "ABLATIONS_ROTARY_KERNEL",
                "rope: the CPU kernel for its rotation is not used ({why}); it runs in PyTorch ops, slower eager")


def kernel():
    """`torch.ops.ablations_rotary` (rotary: the op with its C++ autograd node; rotate: the kernel), or None where
    it cannot be had (the reason warned once)."""
    return KERNEL.ops()
