"""The gated MLPs' CPU kernel (modules/kernels/glu.py) against PyTorch's own F.silu(g) * u and F.gelu(g, "tanh") * u
computed in float64, output and the gradients of both halves (by autograd), at widths no multiple of a vector and
more rows than one parallel chunk on two threads; bf16 rounded to nearest; and which calls take it: SwiGLU and
GEGLU (tanh form) eager on CPU in fp32 and bf16, not GEGLU's erf form, not float64, not under torch.compile, and
none when it is off.
"""
import pytest
import torch
import torch.nn.functional as F

from kernels_testing import traced
from modules.kernels import glu as glu_kernel
from modules.mlps.base import gated

REFERENCE = {"silu": F.silu, "gelu_tanh": lambda g: F.gelu(g, approximate="tanh")}


def reference(h: torch.Tensor, da: torch.Tensor, gate: str):
    """act(g) * u and its gradient with respect to h = [g, u], in float64 by PyTorch's autograd."""
    h64 = h.detach().double().requires_grad_()
    g, u = h64.chunk(2, dim=-1)
    a = REFERENCE[gate](g) * u
    a.backward(da.double())
    return a.detach(), h64.grad


def test_the_kernel_is_built_here():
    # CI has a compiler and ninja (pyproject): a missing kernel there is a failure, not a fallback to accept
    assert glu_kernel.kernel() is not None, glu_kernel.KERNEL.built.get("why")


@pytest.mark.parametrize("gate", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("shape", [(1, 2), (7, 74), (3, 50, 344)])
@pytest.mark.parametrize("threads", [1, 2])
def test_fp32_matches_pytorch_in_float64(gate, shape, threads):
    g = torch.Generator().manual_seed(sum(shape))
    # gates from the flat tails to the steep middle (the float64 tanh form cancels below -5: absolute tolerance)
    h = torch.randn(*shape, generator=g) * 4
    h.view(-1)[:: 7] *= 5
    h.requires_grad_()
    da = torch.randn(*shape[:-1], shape[-1] // 2, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = glu_kernel.kernel().glu(h, glu_kernel.GATES[gate])
        a.backward(da)
    finally:
        torch.set_num_threads(before)
    ref, ref_dh = reference(h, da, gate)
    assert a.shape == ref.shape and h.grad.shape == h.shape
    torch.testing.assert_close(a.detach().double(), ref, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(h.grad.double(), ref_dh, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("gate", ["silu", "gelu_tanh"])
def test_bf16_is_the_float64_value_rounded_to_nearest(gate):
    g = torch.Generator().manual_seed(9)
    h = (torch.randn(400, 128, generator=g) * 2).bfloat16().requires_grad_()  # gates within [-8, 8]: no cancelling
    da = torch.randn(400, 64, generator=g).bfloat16()
    a = glu_kernel.kernel().glu(h, glu_kernel.GATES[gate])
    a.backward(da)
    ref, ref_dh = reference(h, da, gate)
    assert a.dtype == h.grad.dtype == torch.bfloat16
    assert (a == ref.bfloat16()).float().mean() > 0.995
    assert (h.grad == ref_dh.bfloat16()).float().mean() > 0.99  # more terms in the gradient: a little more error


def test_which_calls_take_the_kernel(monkeypatch):
    from modules.config import GPTConfig
    from modules.gpt import GPT

    calls = []
    ops = glu_kernel.kernel()

    class Counting:
        def glu(self, h, code):
            calls.append((h.dtype, code))
            return ops.glu(h, code)

    monkeypatch.setitem(glu_kernel.KERNEL.built, "module", Counting())
    h = torch.randn(3, 5, 16)
    torch.testing.assert_close(gated(h, F.silu, "silu"), reference(h, torch.zeros(3, 5, 8), "silu")[0].float())
    gated(h.bfloat16(), F.silu, "silu")
    gated(h.double(), F.silu, "silu")  # float64: PyTorch ops
    gated(h, F.gelu, None)  # a gate the kernel does not have (GEGLU's erf form): PyTorch ops
    assert calls == [(torch.float32, 0), (torch.bfloat16, 0)]
    idx = torch.randint(0, 64, (2, 8))
    base = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    for mlp, code in (("swiglu", 0), ("geglu", 1)):
        calls.clear()
        GPT(GPTConfig.from_dict({**base, "mlp": {"name": mlp}}))(idx)
        assert calls == [(torch.float32, code)] * 2  # one per layer
    calls.clear()
    GPT(GPTConfig.from_dict({**base, "mlp": {"name": "geglu", "approximate": "none"}}))(idx)
    assert calls == []
    _, graphs = traced(lambda t: gated(t, F.silu, "silu"), h)  # compiled: PyTorch ops, which inductor fuses
    assert graphs and calls == []


def test_kernel_off_is_one_warning_and_pytorch_ops(monkeypatch):
    monkeypatch.setattr(glu_kernel.KERNEL, "built", {})
    monkeypatch.setenv("ABLATIONS_GLU_KERNEL", "off")
    with pytest.warns(RuntimeWarning, match=r"not used \(ABLATIONS_GLU_KERNEL=off\)"):
        assert glu_kernel.kernel() is None
    h = torch.randn(4, 12)
    g, u = h.chunk(2, dim=-1)
    assert torch.equal(gated(h, F.silu, "silu"), F.silu(g) * u)
