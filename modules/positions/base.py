"""How a position scheme plugs into the GPT: three hooks, each a no-op unless the scheme needs it, plus the facts
the rest of the library asks it (no code outside this folder compares position names); its parameters are
counted from the module itself (modules/accounting.py).

- `add_to_embedding(x, pos)`: absolute schemes (learned, sinusoidal) add a vector to the token embedding.
- `rotary(pos)`: rotary schemes return (cos, sin) tables that attention applies to q and k (`apply_rotary`).
- `attn_bias(pos_q, pos_k)`: relative-bias schemes (alibi, t5bias) return a float bias added to the scores;
  such a scheme sets `adds_attn_bias = True` so the GPT builds a float mask for every call.

`pos` are per-sample position ids (B, T) int64, so left-padded batches and KV-cache decoding see exactly the
positions a prompt would see alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from modules.kernels import rotary as rotary_kernel
from modules.options import VariantOptions


@dataclass(frozen=True)
class PositionOptions(VariantOptions):
    family = "position"


class Position(nn.Module):
    Options = PositionOptions
    adds_attn_bias = False  # True: attn_bias returns a tensor, so the mask must be a float bias

    def __init__(self, cfg):
        super().__init__()

    # ---- facts, asked by config validation and generation (cfg is a GPTConfig) ----
    @classmethod
    def validate(cls, cfg) -> None:
        """Checks that involve the rest of the model (e.g. rope needs an even rotary width)."""

    @classmethod
    def max_positions(cls, cfg) -> int | None:
        """The largest number of positions the scheme can represent (None: unbounded)."""
        return None

    def embedding_params(self) -> int:
        """Parameters excluded from `params_non_embedding`: the nn.Embedding tables of a scheme that adds to the
        token embedding (learned's wpe); a table read elsewhere (t5bias's score bias) is not an embedding."""
        if type(self).add_to_embedding is Position.add_to_embedding:
            return 0
        return sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Embedding))

    # ---- hooks ----
    def add_to_embedding(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return x

    def rotary(self, pos: torch.Tensor, from_zero: bool = False):
        """(cos, sin) for rotary schemes, else None. from_zero: pos is 0..T-1 in every row (the GPT's own positions
        with no cache and no padding), so a scheme may hand back rows of a table it computed once."""
        return None

    def attn_bias(self, pos_q: torch.Tensor, pos_k: torch.Tensor):
        return None


def apply_rotary(x: torch.Tensor, rot, fused: bool = True) -> torch.Tensor:
    """Rotate pairs (x[i], x[i + d/2]) of the last dim by the angles in rot = (cos, sin), each (B, 1, T, d/2), in
    (at least) fp32: angles of late positions need the mantissa. Output in x's dtype.

    Eager on CPU, one C++ pass each way (`_cpu_kernel`, modules/kernels/rotary.py); elsewhere eager, `_Rotate` does
    it in four kernels into one buffer each way, its backward the inverse rotation (autograd through the formula
    below keeps both halves and runs about twice the kernels: 3-4x the time of `_Rotate` at small-cpu's shapes,
    `python -m ablations.bench --only roofline`). Under torch.compile, or fused=False (the tests compare the two),
    the formula itself: inductor fuses it into one kernel."""
    if rot is None:
        return x
    cos, sin = rot
    if fused and not torch.compiler.is_compiling():
        k = _cpu_kernel(x, cos)
        return k.rotary(x, cos, sin) if k is not None else _Rotate.apply(x, cos, sin)
    x1, x2 = x.to(torch.promote_types(x.dtype, torch.float32)).chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


def _cpu_kernel(x: torch.Tensor, cos: torch.Tensor):
    """The C++ rotation (modules/kernels/rotary.py: one pass each way, its autograd node in C++) where it applies:
    eager on CPU, x (B, H, T, d) in fp32 or bf16 with unit stride in d, fp32 angles; else None (`_Rotate`)."""
    if (x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and x.dim() == 4 and x.numel()
            and x.stride(-1) == 1 and cos.dtype == torch.float32 and cos.dim() == 4):
        return rotary_kernel.kernel()
    return None


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> torch.Tensor:
    """(x1 cos - sign x2 sin, x2 cos + sign x1 sin) into one buffer; sign -1 rotates back (the backward)."""
    # bf16 under autocast: one conversion pass here, not a mixed-dtype read in each kernel below
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    x1, x2 = xf.chunk(2, dim=-1)
    out = torch.empty(xf.shape, dtype=xf.dtype, device=xf.device)  # (..., d) contiguous, whatever x's strides
    o1, o2 = out.chunk(2, dim=-1)
    torch.mul(x1, cos, out=o1).addcmul_(x2, sin, value=-sign)
    torch.mul(x2, cos, out=o2).addcmul_(x1, sin, value=sign)
    return out.to(x.dtype)


class _Rotate(torch.autograd.Function):
    # saves only the tables: the gradient of a rotation is the rotation back, whatever x was
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin, 1.0)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return _rotate(dy, cos, sin, -1.0), None, None
