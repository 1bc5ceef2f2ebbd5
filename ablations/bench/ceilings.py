"""Section `ceilings`: dense GEMM throughput at fp32 and bf16 and memory bandwidth (read, copy, STREAM's triad),
measured here.

They are the denominators of the other sections' fractions: MFU (train, harness) is tokens/sec x FLOPs per token
over the GEMM peak of the precision the matmuls run in, or `--peak-flops` (a datasheet bf16 figure) when given."""
from __future__ import annotations

from collections.abc import Callable

import torch

from .core import Bench, Figures, Section, fmt, section


def gemm_item(dtype: torch.dtype, device: str, n: int) -> Callable[[], float]:
    """One n x n x n matmul per call; returns its FLOPs. Large enough to be compute-bound (the practical peak)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return lambda: (torch.mm(a, b), 2.0 * n**3)[1]


def gemm_size(bench: Bench) -> int:
    return 8192 if bench.cuda else (1024 if bench.opts.quick else 2048)


def bandwidth_items(device: str, nbytes: int) -> dict[str, Callable[[], float]]:
    """Read (a sum: reads nbytes, writes nothing) and copy (reads and writes nbytes) over buffers far larger than
    any cache. Decoding one token mostly reads weights, so the read figure is its ceiling."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return {"read bandwidth": lambda: (src.sum(), float(nbytes))[1],
            "copy bandwidth": lambda: (dst.copy_(src), 2.0 * nbytes)[1]}


def triad_item(device: str, nbytes: int) -> Callable[[], float]:
    """STREAM's triad a = b + s * c, one kernel (torch.add with alpha), over three fp32 arrays of nbytes each: two
    read, one written. A model's element-wise passes (read operands, write a result) move memory this way, so it
    is the denominator of the roofline section's bound."""
    b = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    c, a = torch.full_like(b, 0.5), torch.empty_like(b)
    return lambda: (torch.add(b, c, alpha=3.0, out=a), 3.0 * nbytes)[1]


def bandwidth_bytes(bench: Bench) -> int:
    return (1024 if bench.cuda else 256) * 2**20


@section
class Ceilings(Section):
    name, order = "ceilings", 10

    def work(self, bench: Bench) -> dict[str, Callable[[], float]]:
        n = gemm_size(bench)
        return {"gemm fp32": gemm_item(torch.float32, bench.device, n),
                "gemm bf16": gemm_item(torch.bfloat16, bench.device, n),
                **bandwidth_items(bench.device, bandwidth_bytes(bench)),
                "triad bandwidth": triad_item(bench.device, bandwidth_bytes(bench))}

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        peak = {"32-true": rates["gemm fp32"]["best"], "bf16-mixed": rates["gemm bf16"]["best"]}
        read, copy, triad = (rates[f"{k} bandwidth"]["best"] for k in ("read", "copy", "triad"))
        mfu_peak = dict(peak)
        if bench.opts.peak_flops:  # a configured (datasheet) bf16 peak, e.g. a GPU's dense bf16 TFLOP/s
            mfu_peak["bf16-mixed"] = float(bench.opts.peak_flops)
        values = {"gemm_flops": {"fp32": peak["32-true"], "bf16": peak["bf16-mixed"]},
                  "bandwidth_bytes_per_sec": {"read": read, "copy": copy, "triad": triad}, "mfu_peak_flops": mfu_peak}
        # shown whenever measured: the MFU and decode-ceiling rows below are relative to them
        rows = [("GEMM fp32 (measured peak)", fmt(peak["32-true"], "FLOP/s")),
                ("GEMM bf16 (measured peak)", f"{fmt(peak['bf16-mixed'], 'FLOP/s')}  "
                                              f"({peak['bf16-mixed'] / peak['32-true']:.2f}x fp32)"),
                ("memory bandwidth read / copy / triad",
                 f"{fmt(read, 'B/s')} / {fmt(copy, 'B/s')} / {fmt(triad, 'B/s')}")]
        return Figures(values, rows)
