"""Rope's CPU kernel (modules/kernels/rotary.py) against Hugging Face's rotation (transformers' Llama
`apply_rotary_pos_emb`, the rotate-half form this harness uses) in float64, output and gradient, on the inputs the
model gives it: q's head view of the fused projection (strided), MLA's one shared rotary key head, angles shared by
every row or per row (padding, caches), a rotated width no multiple of a vector, bf16 rounded to nearest, two
threads; and which calls take it.
"""
import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kernels_testing import traced
from modules.kernels import rotary as rotary_kernel
from modules.positions.base import apply_rotary


def angles(rows: int, T: int, h: int, seed: int):
    """cos, sin (rows, 1, T, h) fp32 of positions (per row, offset) and RoFormer's frequencies 10000^(-i/h)."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.arange(T, dtype=torch.float64)[None] + torch.randint(0, 50, (rows, 1), generator=g)  # (rows, T)
    inv = 10000.0 ** (-torch.arange(h, dtype=torch.float64) / h)
    a = pos[:, None, :, None] * inv  # (rows, 1, T, h)
    return a.cos().float(), a.sin().float()


def hf_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dy: torch.Tensor):
    """Hugging Face's rotation in float64 (its cos and sin are full width: each half's angles twice) and its
    gradient by autograd."""
    x64 = x.detach().double().requires_grad_()
    c = torch.cat([cos, cos], -1).double().squeeze(1)  # (B, T, d), as Llama's rotary embedding returns them
    s = torch.cat([sin, sin], -1).double().squeeze(1)
    out, _ = apply_rotary_pos_emb(x64, x64, c, s, unsqueeze_dim=1)
    out.backward(dy.double())
    return out.detach(), x64.grad


def test_the_kernel_is_built_here():
    # CI has a compiler and ninja (pyproject): a missing kernel there is a failure, not a fallback to accept
    assert rotary_kernel.kernel() is not None, rotary_kernel.KERNEL.built.get("why")


@pytest.mark.parametrize("shape", [(2, 4, 16, 32), (3, 1, 9, 6), (2, 3, 5, 48)])
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_fp32_on_a_head_view_matches_hugging_face(shape, per_row, threads):
    B, H, T, d = shape
    g = torch.Generator().manual_seed(sum(shape))
    qkv = torch.randn(B, T, 3 * H * d, generator=g) * 3  # the fused projection's output: q is a strided view of it
    x = qkv[..., :H * d].view(B, T, H, d).transpose(1, 2).requires_grad_()
    cos, sin = angles(B if per_row else 1, T, d // 2, seed=B * T)
    dy = torch.randn(B, H, T, d, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = rotary_kernel.kernel().rotary(x, cos, sin)
        out.backward(dy)
    finally:
        torch.set_num_threads(before)
    ref, ref_dx = hf_reference(x, cos.expand(B, 1, T, d // 2), sin.expand(B, 1, T, d // 2), dy)
    assert out.is_contiguous() and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(x.grad.double(), ref_dx, rtol=1e-6, atol=2e-6)


def test_bf16_is_the_float64_rotation_rounded_to_nearest():
    """bf16 in and out, fp32 inside: the output is Hugging Face's float64 rotation of the same bf16 values rounded
    to nearest, but where the float64 value lies within fp32's error of a rounding boundary (a handful)."""
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(4, 4, 32, 32, generator=g) * 3).bfloat16().requires_grad_()
    cos, sin = angles(1, 32, 16, seed=2)
    dy = torch.randn(4, 4, 32, 32, generator=g).bfloat16()
    out = rotary_kernel.kernel().rotary(x, cos, sin)
    out.backward(dy)
    ref, ref_dx = hf_reference(x, cos.expand(4, 1, 32, 16), sin.expand(4, 1, 32, 16), dy)
    assert out.dtype == x.grad.dtype == torch.bfloat16
    assert (out == ref.bfloat16()).float().mean() > 0.995
    assert (x.grad == ref_dx.bfloat16()).float().mean() > 0.995


def test_which_calls_take_the_kernel(monkeypatch):
    calls = []
    ops = rotary_kernel.kernel()

    class Counting:
        def rotary(self, *a):
            calls.append(a[0].dtype)
            return ops.rotary(*a)

    monkeypatch.setitem(rotary_kernel.KERNEL.built, "module", Counting())
    x = torch.randn(2, 4, 8, 16)
    cos, sin = angles(1, 8, 8, seed=0)
    ref = apply_rotary(x, (cos, sin), fused=False)  # the formula, in PyTorch ops
    torch.testing.assert_close(apply_rotary(x, (cos, sin)), ref, rtol=1e-6, atol=1e-6)
    apply_rotary(x.bfloat16(), (cos, sin))
    assert calls == [torch.float32, torch.bfloat16]
    apply_rotary(x.double(), (cos.double(), sin.double()))  # float64: PyTorch ops
    apply_rotary(x[:, :, :, :8], (cos[..., :4], sin[..., :4]))  # a width-strided slice: unit stride kept, kernel
    apply_rotary(x.transpose(2, 3), (angles(1, 16, 4, seed=0)))  # no unit stride in the rotated dim: PyTorch ops
    assert calls == [torch.float32, torch.bfloat16, torch.float32]
    out, graphs = traced(lambda t: apply_rotary(t, (cos, sin)), x)  # compiled: the formula, which inductor fuses
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    assert graphs and len(calls) == 3


def test_kernel_off_is_one_warning_and_pytorch_ops(monkeypatch):
    monkeypatch.setattr(rotary_kernel.KERNEL, "built", {})
    monkeypatch.setenv("ABLATIONS_ROTARY_KERNEL", "off")
    with pytest.warns(RuntimeWarning, match=r"not used \(ABLATIONS_ROTARY_KERNEL=off\)"):
        assert rotary_kernel.kernel() is None
    x = torch.randn(2, 4, 8, 16)
    cos, sin = angles(1, 8, 8, seed=0)
    torch.testing.assert_close(apply_rotary(x, (cos, sin)), apply_rotary(x, (cos, sin), fused=False))
