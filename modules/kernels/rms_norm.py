"""RMSNorm's fused CPU kernel: one pass over a row for its statistics and output forward, one for its gradients
backward, the way LayerNorm's own kernels work. Written as PyTorch ops, RMSNorm makes several passes over its
activations each way and trains slower than LayerNorm on CPU, although it does less arithmetic (docs/bench.md,
`ablations.bench --only norms`).

The kernel is rms_norm.cpp beside this file, built on first use with the others (modules/kernels/build.py).
Where it cannot be built, or with ABLATIONS_RMSNORM_KERNEL=off, `kernel()` returns None and RMSNorm keeps its
op-by-op path; the reason is given once as a warning.

    y    = x * r * w,  r = 1 / sqrt(mean(x^2) + eps)                          (rows, d) fp32
    dx   = r * g - (r^3 / d) * x * sum(g * x),  g = dy * w
    dw   = sum over rows of dy * x * r
"""
from __future__ import annotations

from pathlib import Path

from modules.kernels.build import Kernel

KERNEL = Kernel(Path(__file__).with_name("rms_norm.cpp"), "ablations_rms", "rms_norm", "ABLATIONS_RMSNORM_KERNEL",
                "RMSNorm: the fused CPU kernel is not used ({why}); RMSNorm runs op by op, slower than LayerNorm "
                "on CPU")


def kernel():
    """The compiled kernel's ops, `torch.ops.ablations_rms` (rms_norm: the op with its C++ autograd node; forward,
    backward: the two kernels on (rows, d)), or None where it cannot be had (the reason warned once)."""
    return KERNEL.ops()
