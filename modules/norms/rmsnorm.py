"""RMSNorm (Zhang & Sennrich 2019): rescale by the root mean square; no centring, no bias.

    y = x / sqrt(mean(x^2) + eps) * weight

On CPU in fp32 (the residual stream, under bf16-mixed too) it runs a fused kernel (`modules/kernels/rms_norm.py`:
one pass per row each way, as LayerNorm's kernels do). On an accelerator it is PyTorch's F.rms_norm (a fused CUDA
kernel eager; compiled, inductor fuses its decomposition): through `_RMSNormFn`, compiled gpt2-124m trained ×0.945
[0.928, 0.963] of LayerNorm on an H200, through F.rms_norm ×1.051 [0.975, 1.134] (docs/bench.md, GPU). Elsewhere on
CPU, or where that kernel cannot be built, `_RMSNormFn` computes the same maths op by op: one reduction and two
multiplies forward, saving only x and the per-row rstd, and a backward through PyTorch's fused LayerNorm backward
kernel: that kernel, given mean = 0 and our rstd, computes rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy
* weight, xhat = x * rstd, and the weight gradient sum(dy * xhat); RMSNorm's input gradient lacks the mean(g) term
(nothing is centred), so it is added back: one matrix-vector product and one broadcast add. Written as the four
element-wise ops of the formula instead, autograd keeps four activations and runs about ten kernels (F.rms_norm is
that composite on CPU); figures: ablations.bench --only norms.
"""
import torch
import torch.nn.functional as F
from torch import nn

from modules.kernels import rms_norm as rms_kernel
from modules.norms.base import EpsNormOptions, Norm
from modules.registry import register


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    # statistics in fp32 at least: under bf16 autocast the mean of squares of large activations loses precision
    return torch.promote_types(x.dtype, torch.float32)


class _RMSNormFn(torch.autograd.Function):
    # Every call below is a kernel launch (~µs each on CPU at these sizes, as much as the arithmetic): the fp32
    # path makes no dtype conversions and no autocast switch, and the centring term is one addcmul_.
    @staticmethod
    def forward(ctx, x, weight, eps: float):  # x (..., d), weight (d,)
        ct = _compute_dtype(x)
        xf = x if x.dtype == ct else x.to(ct)
        d = xf.size(-1)
        # mean(x^2) as ||x||^2 / d: one reduction kernel instead of pow + mean
        rstd = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_().div_(d).add_(eps).rsqrt_()  # (..., 1)
        ctx.save_for_backward(x, rstd, weight)
        y = torch.mul(xf, rstd).mul_(weight if weight.dtype == ct else weight.to(ct))
        return y if y.dtype == x.dtype else y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, rstd, weight = ctx.saved_tensors
        ct = _compute_dtype(x)
        if x.dtype != ct or weight.dtype != ct or dy.dtype != ct or torch.is_autocast_enabled(dy.device.type):
            with torch.autocast(dy.device.type, enabled=False):  # dy @ w below must stay in fp32, not go to bf16
                dx, dw = rms_norm_backward(dy.to(ct), x.to(ct), rstd, weight.to(ct), ctx.needs_input_grad[1])
            return dx.to(x.dtype), (None if dw is None else dw.to(weight.dtype)), None
        return (*rms_norm_backward(dy, x, rstd, weight, ctx.needs_input_grad[1]), None)


def rms_norm_backward(dy, x, rstd, weight, need_dw: bool):
    """(dx, dw) of y = x * rstd * w, in one dtype. LayerNorm's fused backward with mean 0 and our rstd gives
    rstd * (g - mean(g) - xhat * mean(g * xhat)) (g = dy * w, xhat = x * rstd) and dw = sum(dy * xhat); RMSNorm
    has no centring, so rstd * mean(g) = rstd * (dy @ w) / d is added back."""
    d = x.size(-1)
    dx, dw, _ = torch.ops.aten.native_layer_norm_backward(
        dy, x, [d], torch.zeros_like(rstd), rstd, weight, None, [True, need_dw, False])
    # the (rows, 1) column first, then one broadcast add: addcmul_ with two broadcast (rows, 1) operands takes
    # a slow strided path on CPU (the bench's `norms` section shows the parts)
    dx.add_(torch.mv(dy.reshape(-1, d), weight).view_as(rstd).mul_(rstd).div_(d))
    return dx, dw


def _fused_kernel(x: torch.Tensor, weight: torch.Tensor):
    """The fused kernel where it applies (fp32 on CPU, eager: torch.compile fuses the op-by-op path itself)."""
    if (x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.numel() == 0
            or torch.compiler.is_compiling()):
        return None
    return rms_kernel.kernel()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, fused: bool = True) -> torch.Tensor:
    """x / sqrt(mean(x^2, -1) + eps) * weight, statistics in (at least) fp32, output in x's dtype. fused=False: the
    op-by-op path even where the fused kernel applies (the bench and the tests compare the two)."""
    if x.device.type != "cpu":  # PyTorch's own (fp32 statistics for bf16 x): fused eager, and by inductor compiled
        y = F.rms_norm(x, (x.size(-1),), weight if weight.dtype == x.dtype else weight.to(x.dtype), eps)
        return y if y.dtype == x.dtype else y.to(x.dtype)
    k = _fused_kernel(x, weight) if fused else None
    return k.rms_norm(x, weight, eps) if k is not None else _RMSNormFn.apply(x, weight, eps)


@register("norm", "rmsnorm")
class RMSNorm(Norm):
    Options = EpsNormOptions

    def __init__(self, dim: int, cfg):
        super().__init__()
        self.eps = cfg.norm.eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)
