"""Section `ceilings`: dense GEMM throughput at fp32 and bf16 and memory bandwidth (read, copy, STREAM's triad),
measured here.

They are the denominators of the other sections' fractions: MFU (train, harness) is tokens/sec x FLOPs per token
over the GEMM peak of the precision the matmuls run in, or `peak_flops=` (a datasheet bf16 figure) when given.

Which precisions the bench trains in (`plan_precisions`, before anything is built): the composed
`trainer.precision` when it names one, else every precision of the bare step; of those, one whose GEMM peak
(`gemm_probe`: a quick GEMM of each dtype) is below fp32's is skipped, with one line saying so, unless
`--force-emulated`. On a CPU without native bf16 (AVX2 only) PyTorch emulates bf16 matmuls at ~1% of fp32: one
bf16-mixed harness run took over 25 minutes there. `ablations.paired` says the same of an arm (`emulated`)."""
from __future__ import annotations

from collections.abc import Callable

import torch

from .core import Bench, Figures, PrecisionPlan, Section, fmt, section
from .timing import best_rate


def gemm_item(dtype: torch.dtype, device: str, n: int) -> Callable[[], float]:
    """One n x n x n matmul per call; returns its FLOPs. Large enough to be compute-bound (the practical peak)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return lambda: (torch.mm(a, b), 2.0 * n**3)[1]


def gemm_size(bench: Bench) -> int:
    return 8192 if bench.cuda else (1024 if bench.opts.quick else 2048)


PRECISION_DTYPES = {"32-true": torch.float32, "bf16-mixed": torch.bfloat16}  # the dtype each one's matmuls run in


def gemm_probe(device: str) -> dict[str, float]:
    """precision -> FLOP/s of its GEMM: the fastest of 3 calls after one untimed. n = 512 on a CPU: native bf16
    already beats fp32 there (~2-5x on an AVX512-BF16 EPYC), and an emulated one (~1% of fp32) takes ~1 s."""
    n = 4096 if device.startswith("cuda") else 512
    peaks = {}
    for precision, dtype in PRECISION_DTYPES.items():
        fn = gemm_item(dtype, device, n)
        fn()
        peaks[precision] = best_rate(fn, device)
    return peaks


def emulated(peaks: dict[str, float], device: str = "cpu") -> dict[str, str]:
    """precision -> why it is slow here, for each one whose GEMM peak is below fp32's: no native unit for its
    dtype, so PyTorch emulates it."""
    fp32, where = peaks["32-true"], "GPU" if device.startswith("cuda") else "CPU"
    return {p: (f"{p}: its GEMM peak measured {fmt(v, 'FLOP/s')} = {v / fp32:.2g}x fp32's {fmt(fp32, 'FLOP/s')} "
                f"(emulated on this {where})") for p, v in peaks.items() if v < fp32}


def plan_precisions(bench: Bench) -> PrecisionPlan:
    """The composed trainer.precision when it names one (the command line's `trainer.precision=32-true` is
    honoured), else every precision of the bare step; minus those below fp32's GEMM peak, unless --force-emulated."""
    from .train import BareTrainer

    configured = bench.cfg.trainer.get("precision", "auto")
    wanted = list(BareTrainer.PRECISIONS) if configured in (None, "auto") else [str(configured)]
    if wanted[0] not in BareTrainer.PRECISIONS:
        raise SystemExit(f"ablations.bench: trainer.precision={configured}: the bench trains "
                         f"{' or '.join(BareTrainer.PRECISIONS)} (or auto: both)")
    peaks = gemm_probe(bench.device)
    slow = {} if bench.opts.force_emulated else emulated(peaks, bench.device)
    return PrecisionPlan([p for p in wanted if p not in slow], {p: slow[p] for p in wanted if p in slow}, peaks)


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
    name, order, uses_precisions = "ceilings", 10, True

    def work(self, bench: Bench) -> dict[str, Callable[[], float]]:
        n = gemm_size(bench)
        items = {"gemm fp32": gemm_item(torch.float32, bench.device, n)}
        if "bf16-mixed" not in emulated(bench.precisions.peaks, bench.device) or bench.opts.force_emulated:
            items["gemm bf16"] = gemm_item(torch.bfloat16, bench.device, n)  # emulated: a call here takes ~20 s
        return {**items, **bandwidth_items(bench.device, bandwidth_bytes(bench)),
                "triad bandwidth": triad_item(bench.device, bandwidth_bytes(bench))}

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        peak = {"32-true": rates["gemm fp32"]["best"],
                "bf16-mixed": rates["gemm bf16"]["best"] if "gemm bf16" in rates else bench.precisions.peaks[
                    "bf16-mixed"]}  # emulated: the probe's figure (n = 512)
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
