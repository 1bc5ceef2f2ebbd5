"""GELU-tanh's CPU kernel (modules/kernels/gelu_tanh.py) against PyTorch's own F.gelu(approximate="tanh") computed
in float64 (the forward, and its autograd for the gradient), from the flat tails to the steep middle, at sizes that
meet the kernel's edges (a length that is no multiple of any vector width, one element, more elements than one
parallel chunk on two threads, a strided input); bf16 in and out rounded to nearest even as PyTorch rounds; and
which calls take it: eager fp32 and bf16 on CPU, not float64, not the erf form, not under torch.compile, and none
when it is turned off.
"""
import pytest
import torch
import torch.nn.functional as F

from kernels_testing import traced
from modules.kernels import gelu_tanh as gelu_kernel
from modules.mlps.base import gelu


def reference(x: torch.Tensor, dy: torch.Tensor):
    """F.gelu's tanh form and its gradient in float64, at x's values (already rounded to x's dtype)."""
    x64 = x.detach().double().requires_grad_()
    y = F.gelu(x64, approximate="tanh")
    y.backward(dy.double())
    return y.detach(), x64.grad


def test_the_kernel_is_built_here():
    # CI has a compiler and ninja (pyproject): a missing kernel there is a failure, not a fallback to accept
    assert gelu_kernel.kernel() is not None, gelu_kernel.KERNEL.built.get("why")


@pytest.mark.parametrize("n", [1, 37, 4099, 100_003])
@pytest.mark.parametrize("threads", [1, 2])
def test_fp32_matches_pytorch_in_float64(n, threads):
    k = gelu_kernel.kernel()
    g = torch.Generator().manual_seed(n)
    # the tails (|x| up to 30: s underflows to 0 or saturates at 1) and the steep middle, where most activations are
    x = torch.cat([torch.linspace(-30, 30, n // 2 + 1), torch.randn(n - n // 2 - 1, generator=g) * 3])[:n]
    dy = torch.randn(n, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y, dx = k.forward(x), k.backward(dy, x)
    finally:
        torch.set_num_threads(before)
    ref_y, ref_dx = reference(x, dy)
    torch.testing.assert_close(y.double(), ref_y, rtol=2e-6, atol=2e-7)
    torch.testing.assert_close(dx.double(), ref_dx, rtol=1e-5, atol=1e-6)


def test_bf16_is_the_float64_value_rounded_to_nearest():
    """bf16 in, bf16 out: the kernel computes in fp32 (error ~1e-7) and rounds to nearest even, so its output is the
    float64 value rounded by PyTorch wherever that value is not within ~1e-7 of a rounding boundary: all but a few
    of 60,000. Truncating instead of rounding misses ~half of them. bf16 keeps 8 bits of tiny values too, so the
    tail x < -5 needs a float64 reference that keeps them: there F.gelu's 0.5 x (1 + tanh u) cancels (tanh u -> -1;
    at x = -9.3 it returns -0.0), and the reference is the same function as x sigmoid(2u), the identity
    0.5 (1 + tanh u) = sigmoid(2u), itself checked against F.gelu where both are exact."""
    k = gelu_kernel.kernel()
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(60_000, generator=g) * 4).bfloat16()
    dy = torch.randn(60_000, generator=g).bfloat16()
    y, dx = k.forward(x), k.backward(dy, x)
    assert y.dtype == dx.dtype == torch.bfloat16
    ref_y, ref_dx = reference(x, dy)
    x64 = x.double()
    u = 0.7978845608028654 * (x64 + 0.044715 * x64 ** 3)  # sqrt(2/pi) (x + 0.044715 x^3)
    identity = x64 * torch.sigmoid(2 * u)
    middle = x64 > -5
    torch.testing.assert_close(identity[middle], ref_y[middle], rtol=1e-12, atol=1e-15)
    exact = torch.where(middle, ref_y, identity)
    assert (y == exact.bfloat16()).float().mean() > 0.995
    assert (dx[middle] == ref_dx[middle].bfloat16()).float().mean() > 0.99  # sums more terms: a little more error
    # never off by more than a rounding: relative in bf16's normal range, absolute (its denormals' spacing, 9.2e-41)
    # below it (1.2e-38), where x < -9.5
    torch.testing.assert_close(y.double(), exact, rtol=8e-3, atol=1e-40)


def test_the_op_and_its_autograd_node_on_a_strided_3d_input():
    """What the MLP calls (kernel().gelu_tanh: its autograd node in C++) on a transposed (non-contiguous) input:
    output and input gradient against float64."""
    k = gelu_kernel.kernel()
    g = torch.Generator().manual_seed(5)
    base = torch.randn(3, 40, 24, generator=g) * 2
    x = base.transpose(1, 2).requires_grad_()  # (3, 24, 40), strided
    dy = torch.randn(3, 24, 40, generator=g)
    y = k.gelu_tanh(x)
    y.backward(dy)
    ref_y, ref_dx = reference(x, dy)
    assert y.shape == x.shape and x.grad.shape == x.shape
    torch.testing.assert_close(y.detach().double(), ref_y, rtol=2e-6, atol=2e-7)
    torch.testing.assert_close(x.grad.double(), ref_dx, rtol=1e-5, atol=1e-6)


class _Counting:
    """The built kernel, the calls of its op counted."""

    def __init__(self, k):
        self.k, self.calls = k, 0

    def gelu_tanh(self, x):
        self.calls += 1
        return self.k.gelu_tanh(x)


def test_which_calls_take_the_kernel(monkeypatch):
    counting = _Counting(gelu_kernel.kernel())
    monkeypatch.setitem(gelu_kernel.KERNEL.built, "module", counting)
    x = torch.randn(4, 8, 32)
    torch.testing.assert_close(gelu(x), F.gelu(x, approximate="tanh"), rtol=2e-6, atol=2e-7)
    gelu(x.bfloat16())
    assert counting.calls == 2
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the MLP under bf16-mixed: a bf16 matmul output
        assert gelu(torch.nn.functional.linear(x, torch.randn(16, 32))).dtype == torch.bfloat16
    assert counting.calls == 3
    gelu(x.double())  # float64: ATen's
    gelu(x, approximate="none")  # the erf form: ATen's
    gelu(x[:0])  # empty: nothing to launch
    assert counting.calls == 3

    out, graphs = traced(gelu, x)  # compiled: the sigmoid form, which inductor fuses; no call of the kernel
    torch.testing.assert_close(out, F.gelu(x, approximate="tanh"), rtol=2e-6, atol=2e-7)
    assert counting.calls == 3 and graphs and any("sigmoid" in t for t in graphs[0])


def test_kernel_off_is_one_warning_and_atens_gelu(monkeypatch):
    monkeypatch.setattr(gelu_kernel.KERNEL, "built", {})
    monkeypatch.setenv("ABLATIONS_GELU_KERNEL", "off")
    with pytest.warns(RuntimeWarning, match=r"not used \(ABLATIONS_GELU_KERNEL=off\); ATen's gelu runs"):
        assert gelu_kernel.kernel() is None
    x = torch.randn(5, 16)
    assert torch.equal(gelu(x), F.gelu(x, approximate="tanh"))  # the same call, not a copy of it
