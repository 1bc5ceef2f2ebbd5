"""Reproducibility: seeding, the environment record of a run, and comparing two runs' curves.

Same config + same seed + same environment (the tags below) => the same loss curve, bit for bit, on CPU at
trainer.precision=32-true. `train()` seeds torch/numpy/random with `seed` right before model init and again with
:func:`derived_seed` (seed, "fit") right before `trainer.fit`, so nothing that runs in between (the peak-FLOP/s probe,
MLflow, Lightning set-up, an earlier run in the same process) can move the dropout stream; training batches come
from a counter-based generator keyed by (seed, batch index) (see ablations.data.train_starts).
"""
from __future__ import annotations

import hashlib
import math
import os
import platform
import socket
from pathlib import Path

import torch

from .malloc import describe as malloc_mode

# tags that can explain why the same config and seed gave a different curve (compared by `ablations.rerun`)
ENV_TAGS = ("git_commit", "git_dirty", "git_diff_hash", "data_fingerprint", "tokenizer_hash", "precision", "device",
            "device_name", "cpu_model", "cpu_capability", "cuda_version", "cudnn_version", "num_threads",
            "num_interop_threads", "omp_num_threads", "float32_matmul_precision", "deterministic", "world_size",
            "python_version", "torch_version", "lightning_version", "numpy_version", "platform", "hostname")
CURVE_METRICS = ("train/loss", "val/loss")


def derived_seed(seed: int, purpose: str) -> int:
    """A 32-bit seed for one purpose ("fit", ...) that depends only on `seed`: independent streams per purpose."""
    return int.from_bytes(hashlib.sha256(f"{int(seed)}:{purpose}".encode()).digest()[:4], "little")


def seed_all(seed: int) -> None:
    """Seed python `random`, numpy and torch (all devices) via Lightning (also sets PL_GLOBAL_SEED for workers)."""
    from lightning.fabric.utilities.seed import seed_everything

    seed_everything(int(seed), workers=True, verbose=False)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _version(mod: str) -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version(mod)
    except PackageNotFoundError:
        return "unknown"


def environment_tags(accelerator: str) -> dict[str, str]:
    """What, besides config and seed, decides the numbers: software, hardware, threads, numeric modes."""
    cuda = accelerator == "cuda" and torch.cuda.is_available()
    tags = {
        "python_version": platform.python_version(),
        "numpy_version": _version("numpy"),
        "mlflow_version": _version("mlflow"),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_capability": _cpu_capability(),
        "num_threads": str(torch.get_num_threads()),
        "num_interop_threads": str(torch.get_num_interop_threads()),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
        "malloc": malloc_mode(),  # speed, not numbers: freed memory kept or returned (ablations.malloc)
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic": str(torch.are_deterministic_algorithms_enabled()).lower(),
        "cuda_version": str(torch.version.cuda) if cuda else "none",
    }
    if cuda:
        tags["cudnn_version"] = str(torch.backends.cudnn.version())
        tags["cudnn_benchmark"] = str(torch.backends.cudnn.benchmark).lower()
        tags["cuda_device_count"] = str(torch.cuda.device_count())
    return tags


def _cpu_capability() -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):  # an older torch, or a build without the query
        return "unknown"


# ------------------------------------------------------------------------------------------ comparing runs
def metric_curve(cl, run_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of a metric, one value per step (the last logged, as a resumed run may log a step twice)."""
    by_step: dict[int, tuple[int, float]] = {}
    for m in cl.get_metric_history(run_id, key):
        if m.step not in by_step or m.timestamp >= by_step[m.step][0]:
            by_step[m.step] = (m.timestamp, m.value)
    return [(s, by_step[s][1]) for s in sorted(by_step)]


def compare_curves(cl, run_a: str, run_b: str, keys=CURVE_METRICS) -> dict:
    """-> {"identical": bool, "metrics": {key: {"points", "identical", "first_diff_step", "max_abs_diff"}}}."""
    out, same = {}, True
    for k in keys:
        a, b = dict(metric_curve(cl, run_a, k)), dict(metric_curve(cl, run_b, k))
        steps = sorted(set(a) | set(b))
        diffs = [(s, abs(a[s] - b[s]) if s in a and s in b else math.inf) for s in steps
                 if s not in a or s not in b or a[s] != b[s]]
        ok = bool(steps) and not diffs
        same &= ok
        out[k] = {"points": len(steps), "identical": ok, "first_diff_step": diffs[0][0] if diffs else None,
                  "max_abs_diff": max((d for _, d in diffs), default=0.0)}
    return {"identical": same, "metrics": out}


def environment_diff(tags_a: dict, tags_b: dict, keys=ENV_TAGS) -> dict[str, tuple[str | None, str | None]]:
    """Environment tags that differ between two runs: {tag: (a, b)} (a tag missing on an older run is None)."""
    return {k: (tags_a.get(k), tags_b.get(k)) for k in keys if tags_a.get(k) != tags_b.get(k)}
