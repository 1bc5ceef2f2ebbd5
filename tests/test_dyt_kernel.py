"""DyT's CPU kernel (modules/kernels/dyt.py) against DyT written with torch.tanh in float64 (Zhu et al. 2025, eq. 1;
its gradients by PyTorch's autograd): output and the gradients of x, alpha, weight and bias, from the saturated
tails through 0 (where tanh's relative precision is what the kernel's expm1 keeps), at widths no multiple of a vector,
more rows than one parallel chunk on two threads (the sums taken over per-thread partials), a strided input; and
which calls take it: eager fp32 on CPU, not float64, not under torch.compile, and none when it is off.
"""
import pytest
import torch

from kernels_testing import traced
from modules.config import GPTConfig
from modules.gpt import GPT
from modules.kernels import dyt as dyt_kernel


def reference(x, alpha, w, b, dy):
    """w * tanh(alpha * x) + b and its gradients (x, alpha, w, b), in float64 by PyTorch."""
    p = [t.detach().double().requires_grad_() for t in (x, alpha, w, b)]
    y = torch.tanh(p[1] * p[0]) * p[2] + p[3]
    return (y.detach(), *torch.autograd.grad(y, p, dy.double()))


def inputs(shape, seed, alpha=0.8):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 4
    x.view(-1)[::5] *= 1e-4  # near 0, where 1 - exp(-2|z|) would cancel
    x.view(-1)[1::7] *= 10  # saturated: tanh = +-1 to fp32
    d = shape[-1]
    return (x, torch.tensor([alpha]), torch.randn(d, generator=g), torch.randn(d, generator=g),
            torch.randn(*shape, generator=g))


def test_the_kernel_is_built_here():
    # CI has a compiler and ninja (pyproject): a missing kernel there is a failure, not a fallback to accept
    assert dyt_kernel.kernel() is not None, dyt_kernel.KERNEL.built.get("why")


def test_tanh_keeps_its_relative_precision_from_zero_to_the_tails():
    """The kernel's tanh alone (w = 1, b = 0, alpha = 1) against float64 tanh, relative: a few fp32 units in the last
    place everywhere, also at 1e-30 and 1e-6 (a form 1 - e with e = exp(-2|z|) rounded loses all of them there)."""
    k = dyt_kernel.kernel()
    z = torch.cat([torch.linspace(-30, 30, 60_001), torch.tensor([1e-30, -1e-20, 1e-6, -3e-4, 0.1733, 0.3466, 0.35])])
    t = k.forward(z.view(-1, 1), torch.ones(1), torch.ones(1), torch.zeros(1)).view(-1).double()
    ref = torch.tanh(z.double())
    nonzero = ref != 0
    assert ((t - ref)[nonzero] / ref[nonzero]).abs().max().item() < 4e-7
    assert torch.equal(t[z.abs() > 9.1].abs(), torch.ones_like(t[z.abs() > 9.1]))  # saturated exactly, as fp32's
    assert t[z == 0].eq(0).all()


def test_the_gradient_keeps_its_relative_precision_near_saturation():
    """dx / (alpha dy w) is 1 - tanh(z)^2, which 1 - t*t computes with an absolute error of fp32's spacing at 1 (~1e-7):
    at z = 8 the derivative is 4.5e-7, so that form is off by its own size. The kernel's 4e / (1 + e)^2 is not."""
    k = dyt_kernel.kernel()
    z = torch.linspace(-9.5, 9.5, 20_001).view(-1, 1)
    one = torch.ones(1)
    dx = k.backward(torch.ones_like(z), z, one, one)[0].view(-1).double()
    ref = 1 - torch.tanh(z.view(-1).double()) ** 2
    assert ((dx - ref) / ref).abs().max().item() < 2e-6


@pytest.mark.parametrize("shape", [(1, 1), (7, 37), (3, 50, 128), (2, 300, 20)])
@pytest.mark.parametrize("threads", [1, 2])
def test_forward_and_gradients_match_pytorch_in_float64(shape, threads):
    k = dyt_kernel.kernel()
    x, alpha, w, b, dy = inputs(shape, sum(shape))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        p = [t.clone().requires_grad_() for t in (x, alpha, w, b)]
        y = k.dyt(*p)
        grads = torch.autograd.grad(y, p, dy)
    finally:
        torch.set_num_threads(before)
    ref = reference(x, alpha, w, b, dy)
    torch.testing.assert_close(y.double(), ref[0], rtol=1e-6, atol=1e-6)
    assert grads[1].shape == alpha.shape
    n = x.numel()  # alpha's gradient and the columns' are sums of up to n terms: tolerance grows with their count
    for got, want, tol in zip(grads, ref[1:], (1e-6, 1e-6 * n ** 0.5, 1e-6 * n ** 0.5, 1e-6 * n ** 0.5)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=tol)


def test_a_strided_input_and_an_alpha_without_gradient():
    k = dyt_kernel.kernel()
    x, alpha, w, b, dy = inputs((3, 24, 40), 5)
    xs = x.transpose(1, 2).requires_grad_()  # (3, 40, 24): not contiguous
    w24, b24, dy24 = w[:24].clone(), b[:24].clone(), dy.transpose(1, 2).contiguous()
    y = k.dyt(xs, alpha, w24, b24)  # alpha, w, b without requires_grad: only x's gradient
    y.backward(dy24)
    ref = reference(xs, alpha, w24, b24, dy24)
    assert y.shape == xs.shape and xs.grad.shape == xs.shape
    torch.testing.assert_close(y.detach().double(), ref[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(xs.grad.double(), ref[1], rtol=1e-5, atol=1e-6)


class _Counting:
    """The built kernel, the calls of its op counted."""

    def __init__(self, k):
        self.k, self.calls = k, 0

    def dyt(self, *a):
        self.calls += 1
        return self.k.dyt(*a)


def dyt_norm():
    return GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32, norm="dyt")).blocks[0].ln_1


def test_which_calls_take_the_kernel(monkeypatch):
    counting = _Counting(dyt_kernel.kernel())
    monkeypatch.setitem(dyt_kernel.KERNEL.built, "module", counting)
    norm = dyt_norm()
    x = torch.randn(4, 5, 32)
    want = torch.tanh(norm.alpha * x) * norm.weight + norm.bias
    torch.testing.assert_close(norm(x), want, rtol=1e-6, atol=1e-6)
    assert counting.calls == 1
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16-mixed: the residual stream is fp32, the kernel runs
        norm(x)
    assert counting.calls == 2
    norm.double()(x.double())  # float64: PyTorch's ops
    norm(x.double()[:0])  # empty: nothing to launch
    assert counting.calls == 2
    out, graphs = traced(norm.float(), x)  # compiled: the sigmoid form, not the kernel
    assert counting.calls == 2 and graphs and any("sigmoid" in t for t in graphs[0])
    torch.testing.assert_close(out, want, rtol=1e-6, atol=3e-7)


def test_kernel_off_is_one_warning_and_pytorchs_ops(monkeypatch):
    monkeypatch.setattr(dyt_kernel.KERNEL, "built", {})
    monkeypatch.setenv("ABLATIONS_DYT_KERNEL", "off")
    with pytest.warns(RuntimeWarning, match=r"DyT: the CPU kernel is not used \(ABLATIONS_DYT_KERNEL=off\)"):
        assert dyt_kernel.kernel() is None
    norm = dyt_norm()
    x = torch.randn(3, 32)
    assert torch.equal(norm(x), torch.tanh(norm.alpha * x) * norm.weight + norm.bias)
