"""DyT's CPU kernel in eager mode (Zhu et al. 2025, "Transformers without Normalization"): one pass over the
numbers forward, one backward, fp32.

    y  = w * t + b,  t = tanh(a x)                                 x (rows, d), a a scalar, w and b (d,)
    dx = a * g * (1 - t^2),  g = dy * w
    da = sum over all of g * (1 - t^2) * x,  dw = sum over rows of dy * t,  db = sum over rows of dy

Written as PyTorch ops DyT is four kernels forward and several backward, and trained slower than LayerNorm's fused
kernel on CPU (one DyT at (2048, 128) fp32, forward and backward, one thread, an AVX2 EPYC: 3.0 ms against 0.7 ms;
the kernel 1.25 ms). tanh is computed as sign(z) (1 - e) / (1 + e), e = exp(-2|z|), with 1 - e from an expm1 that
does not cancel near 0, and 1 - t^2 as 4 e / (1 + e)^2, which does not cancel near saturation: both keep fp32's
relative precision (a few units in the last place), as torch.tanh does; t is computed again backward instead of
saved. The kernel is dyt.cpp beside this file, built on first use with the others (modules/kernels/build.py); with
ABLATIONS_DYT_KERNEL=off, or where it cannot be built, `kernel()` is None and DyT keeps its PyTorch ops (the reason
warned once). Under torch.compile the model uses its own form (modules/norms/dyt.py).
"""
from __future__ import annotations

from pathlib import Path

from modules.kernels.build import Kernel

KERNEL = Kernel(Path(__file__).with_name("dyt.cpp"), "ablations_dyt", "dyt", "ABLATIONS_DYT_KERNEL",
                "DyT: the CPU kernel is not used ({why}); DyT runs op by op, slower eager")


def kernel():
    """`torch.ops.ablations_dyt` (dyt: the op with its C++ autograd node; forward, backward: the two kernels on
    (rows, d)), or None where it cannot be had (the reason warned once)."""
    return KERNEL.ops()
