"""QK-norm's LayerNorm on CPU in eager mode: each head's numbers normalised where they lie in the fused q/k/v
projection's output, one C++ pass per row each way, fp32 or bf16 in and out.

    y = (x - mean) / sqrt(var + eps) * w + b    over each head's d numbers, statistics and w, b in fp32

F.layer_norm on a head view (B, H, T, d) of the projection's output first copies it to contiguous memory, and its
gradient is scattered back through the view: an eager known-results QK-norm step was ×0.865 of the baseline on an
AMX Xeon (bf16-mixed), at the same FLOPs. The kernel reads the view in place and writes contiguous heads (what
attention reads), and its input gradient in the projection's own layout. It is head_norm.cpp beside this file, built
on first use (modules/kernels/build.py); with ABLATIONS_HEAD_NORM_KERNEL=off, or where it cannot be built, `kernel()`
is None and F.layer_norm runs (the reason warned once). Under torch.compile inductor fuses F.layer_norm itself.
"""
from __future__ import annotations

from pathlib import Path

from modules.kernels.build import Kernel

KERNEL = Kernel(Path(__file__).with_name("head_norm.cpp"), "ablations_head_norm", "head_norm",
                "ABLATIONS_HEAD_NORM_KERNEL", "QK-norm: the CPU kernel for LayerNorm over heads is not used ({why}); "
                "F.layer_norm runs, slower eager")


def kernel():
    """`torch.ops.ablations_head_norm` (head_norm: the op with its C++ autograd node; forward, backward: the two
    kernels), or None where it cannot be had (the reason warned once)."""
    return KERNEL.ops()
