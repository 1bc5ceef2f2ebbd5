"""RMSNorm (Zhang & Sennrich 2019): rescale by the root mean square; no centring, no bias.

    y = x / sqrt(mean(x^2) + eps) * weight

Written as the four element-wise ops above, autograd keeps four activations and runs about ten kernels forward and
backward, slower than LayerNorm's fused kernels (figures: ablations.bench --only variants; F.rms_norm is the same
composite on CPU). `_RMSNormFn` computes the same maths with one reduction and two multiplies forward, saves only
x and the per-row rstd, and runs its backward through PyTorch's fused LayerNorm backward kernel: that kernel, given
mean = 0 and our rstd, computes rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * weight, xhat = x * rstd,
and the weight gradient sum(dy * xhat); RMSNorm's input gradient lacks the mean(g) term (nothing is centred), so it
is added back: one matrix-vector product and one broadcast add.
"""
import torch
from torch import nn

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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2, -1) + eps) * weight, statistics in (at least) fp32, output in x's dtype."""
    return _RMSNormFn.apply(x, weight, eps)


@register("norm", "rmsnorm")
class RMSNorm(Norm):
    Options = EpsNormOptions

    def __init__(self, dim: int, cfg):
        super().__init__()
        self.eps = cfg.norm.eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)
