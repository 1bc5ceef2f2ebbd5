"""QK-norm's CPU kernel (modules/kernels/head_norm.py) against PyTorch's own F.layer_norm computed in float64 on the
same heads, output and the gradients of the input, weight and bias (by autograd): on head views of a fused q/k/v
projection (strided), a contiguous input, MLA's one shared key head, with and without a bias, a width no multiple of
a vector, the widths with code of their own (32 both ways, 64 backward; rows left over from their blocks of rows) and a
wide one (128), two threads (the weight gradients summed over per-thread partials); bf16 rounded to nearest, ties to
even; and which calls take it.
"""
import pytest
import torch
import torch.nn.functional as F

from kernels_testing import traced
from modules.kernels import head_norm as head_kernel


def reference(x, w, b, dy, eps):
    """F.layer_norm over each head's last dim in float64, and the gradients of x, w and b."""
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    b64 = None if b is None else b.detach().double().requires_grad_()
    y = F.layer_norm(x64, (x.size(-1),), w64, b64, eps)
    y.backward(dy.double())
    return y.detach(), x64.grad, w64.grad, None if b is None else b64.grad


def forward_backward(x, w, b, dy, threads):
    """The kernel's output for x, after its backward from dy has filled the gradients, on `threads` threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = head_kernel.kernel().head_norm(x, w, b, 1e-5)
        y.backward(dy)
    finally:
        torch.set_num_threads(before)
    return y


def test_the_kernel_is_built_here():
    # CI has a compiler and ninja (pyproject): a missing kernel there is a failure, not a fallback to accept
    assert head_kernel.kernel() is not None, head_kernel.KERNEL.built.get("why")


@pytest.mark.parametrize("layout", ["q view", "contiguous", "one key head"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_fp32_matches_pytorch_in_float64(layout, bias, threads):
    g = torch.Generator().manual_seed(3)
    B, H, T, d = 3, 4, 10, 24
    if layout == "q view":  # q's heads inside the fused projection's output (B, T, 3 H d)
        x = (torch.randn(B, T, 3 * H * d, generator=g) * 3 + 1)[..., H * d:2 * H * d].view(B, T, H, d).transpose(1, 2)
    elif layout == "contiguous":
        x = torch.randn(B, H, T, d, generator=g) * 3 + 1
    else:  # MLA's rotary key: one head shared by all, (B, 1, T, dr)
        x = (torch.randn(B, T, 40, generator=g) * 3)[..., 30:].unsqueeze(1)
        H, d = 1, 10
    x = x.requires_grad_()
    w = (1 + 0.2 * torch.randn(d, generator=g)).requires_grad_()
    b = (0.1 * torch.randn(d, generator=g)).requires_grad_() if bias else None
    dy = torch.randn(B, H, T, d, generator=g)
    y = forward_backward(x, w, b, dy, threads)
    ref_y, ref_dx, ref_dw, ref_db = reference(x, w, b, dy, 1e-5)
    assert y.is_contiguous() and x.grad.shape == x.shape
    torch.testing.assert_close(y.detach().double(), ref_y, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(x.grad.double(), ref_dx, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(w.grad.double(), ref_dw, rtol=2e-5, atol=2e-5)
    if bias:
        torch.testing.assert_close(b.grad.double(), ref_db, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_widths_match_pytorch_in_float64(d, dtype):
    # 32 (both ways) and 64 (backward) have code of their own, rows in registers, in blocks of 4 rows forward and 2
    # backward at 32: T = 11 leaves rows over from both; 128 takes the loops at their widest. q's heads strided in the
    # projection's output; two threads
    g = torch.Generator().manual_seed(d)
    B, H, T = 2, 3, 11
    x = (torch.randn(B, T, 3 * H * d, generator=g) * 3 + 1)[..., :H * d].view(B, T, H, d).transpose(1, 2)
    x = x.to(dtype).requires_grad_()
    w = (1 + 0.2 * torch.randn(d, generator=g)).requires_grad_()
    b = (0.1 * torch.randn(d, generator=g)).requires_grad_()
    dy = torch.randn(B, H, T, d, generator=g).to(dtype)
    y = forward_backward(x, w, b, dy, threads=2)
    ref_y, ref_dx, ref_dw, ref_db = reference(x, w, b, dy, 1e-5)
    assert y.dtype == x.grad.dtype == dtype and y.is_contiguous()
    if dtype == torch.float32:
        torch.testing.assert_close(y.detach().double(), ref_y, rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(x.grad.double(), ref_dx, rtol=2e-5, atol=2e-5)
    else:  # the float64 value rounded to nearest, but where fp32 sums land on the other side of a rounding boundary
        assert (y == ref_y.to(dtype)).float().mean() > 0.99
        assert (x.grad == ref_dx.to(dtype)).float().mean() > 0.98
    torch.testing.assert_close(w.grad.double(), ref_dw, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(b.grad.double(), ref_db, rtol=2e-5, atol=2e-5)


def test_bf16_is_the_float64_value_rounded_to_nearest():
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(4, 4, 32, 32, generator=g) * 2).bfloat16().requires_grad_()
    w = (1 + 0.2 * torch.randn(32, generator=g)).requires_grad_()
    b = (0.1 * torch.randn(32, generator=g)).requires_grad_()
    dy = torch.randn(4, 4, 32, 32, generator=g).bfloat16()
    y = head_kernel.kernel().head_norm(x, w, b, 1e-5)
    y.backward(dy)
    ref_y, ref_dx, ref_dw, _ = reference(x, w, b, dy, 1e-5)
    assert y.dtype == x.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.float32
    assert (y == ref_y.bfloat16()).float().mean() > 0.99
    assert (x.grad == ref_dx.bfloat16()).float().mean() > 0.98  # sums of 32 terms: a little more error
    torch.testing.assert_close(w.grad.double(), ref_dw, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("d", [24, 32])
def test_bf16_ties_round_to_even(d):
    # w = 0 makes y = b exactly in fp32, and b's values lie halfway between two bf16 numbers (1 + 2^-8 between 1 and
    # 1 + 2^-7, ...): y must be them as PyTorch rounds them (to even), for the loops' width and a compiled one's
    ties = 1 + torch.arange(1, 2 * d, 2, dtype=torch.float64) * 2.0 ** -8  # odd multiples of half a bf16 step
    b = (ties * torch.where(torch.arange(d) % 3 == 0, -1.0, 1.0)).float()
    x = torch.randn(2, 2, 5, d).bfloat16()
    y = head_kernel.kernel().head_norm(x, torch.zeros(d), b, 1e-5)
    assert torch.equal(y, b.bfloat16().expand_as(y)) and not torch.equal(b.bfloat16(), (b + 2.0 ** -9).bfloat16())


def test_which_calls_take_the_kernel(monkeypatch):
    from modules.config import GPTConfig
    from modules.gpt import GPT

    calls = []
    ops = head_kernel.kernel()

    class Counting:
        def head_norm(self, x, *a):
            calls.append(x.dtype)
            return ops.head_norm(x, *a)

    monkeypatch.setitem(head_kernel.KERNEL.built, "module", Counting())
    base = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    idx = torch.randint(0, 64, (2, 8))
    GPT(GPTConfig.from_dict({**base, "norm": {"name": "layernorm", "qk_norm": True}}))(idx)
    assert calls == [torch.float32] * 4  # q and k of each layer; the residual stream's norms (3-d) are ATen's
    calls.clear()
    model = GPT(GPTConfig.from_dict({**base, "norm": {"name": "layernorm", "qk_norm": True}}))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(idx)
    assert calls == [torch.bfloat16] * 4
    calls.clear()
    model.double()(idx)  # float64: F.layer_norm
    GPT(GPTConfig.from_dict(base))(idx)  # no QK-norm: no heads to normalise
    assert calls == []
    _, graphs = traced(model.float(), idx)  # compiled: F.layer_norm, which inductor fuses
    assert graphs and calls == []


def test_kernel_off_is_one_warning_and_layer_norm(monkeypatch):
    from modules.config import GPTConfig
    from modules.norms.layernorm import LayerNorm

    monkeypatch.setattr(head_kernel.KERNEL, "built", {})
    monkeypatch.setenv("ABLATIONS_HEAD_NORM_KERNEL", "off")
    with pytest.warns(RuntimeWarning, match=r"not used \(ABLATIONS_HEAD_NORM_KERNEL=off\)"):
        assert head_kernel.kernel() is None
    cfg = GPTConfig.from_dict(dict(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32))
    norm, x = LayerNorm(16, cfg), torch.randn(2, 2, 8, 16)
    assert torch.equal(norm(x), F.layer_norm(x, (16,), norm.weight, norm.bias, norm.eps))
