"""Local worker processes: `sweep.workers=N|auto` (and `verdict.workers`) as N copies of a command on this
machine, each placed on its own CPU cores or GPU (`worker_plan`), started pinned there and waited for.

The copies share one study: the storage's budget lock keeps sweep.n_trials exact, as for workers on several
machines. They share the SQLite default: docs/sweeps.md has the measurement that chose it over Optuna's journal
file.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from sweeps.errors import SweepError
from sweeps.storage import mask_url

if TYPE_CHECKING:
    from sweeps.settings import SweepSettings


def parse_workers(value: Any) -> int | str:
    """sweep.workers: a positive integer or "auto" (one per visible GPU; on CPU one per core)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit() \
            or int(value) < 1:
        raise SweepError(f"sweep.workers={value!r} must be a positive integer or auto (one process per visible GPU, "
                         f"on CPU one per core)")
    return int(value)


def visible_devices(environ: Mapping[str, str] | None = None, device_count: Callable[[], int] | None = None) -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries: that variable's list when set (empty: none),
    else 0 .. torch.cuda.device_count()-1."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [d.strip() for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip() and d.strip() != "-1"]
    if device_count is not None:
        count = device_count()
    else:
        import torch  # here, not at the top: reading a protocol's or a sweep's settings needs no torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [str(i) for i in range(count)]


@dataclass
class WorkerSlot:
    """Where one local worker runs: its environment (CUDA_VISIBLE_DEVICES or OMP_NUM_THREADS), its CPU cores and
    the overrides added to its command line."""
    env: dict[str, str]
    cores: list[int]
    overrides: list[str]


def worker_plan(workers: int | str, devices: list[str], cores: list[int]) -> list[WorkerSlot]:
    """One slot per worker. With GPUs: worker i sees only devices[i % len(devices)] (auto: one per GPU), and the
    cores are split between them. On CPU (no devices): the cores are split into disjoint sets (auto: one worker
    per core), each worker pinned to its set and training with that many threads; more workers than cores share
    cores one each."""
    n = (len(devices) or len(cores)) if workers == "auto" else int(workers)
    n = max(1, n)
    per = max(1, len(cores) // n)
    slots = []
    for i in range(n):
        mine = cores[i * per:(i + 1) * per] if (i + 1) * per <= len(cores) else [cores[i % len(cores)]]
        env = {"OMP_NUM_THREADS": str(len(mine))}
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = devices[i % len(devices)]
        slots.append(WorkerSlot(env=env, cores=mine, overrides=[f"threads={len(mine)}"]))
    return slots


def local_cores() -> list[int]:
    """The CPU cores this process may run on."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def start_worker(module: str, argv: list[str], slot: WorkerSlot):
    """`python -m <module> <argv>` in the slot's environment, pinned to its cores -> the subprocess.Popen."""
    def pin(cores=slot.cores):
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)

    return subprocess.Popen([sys.executable, "-m", module, *argv], env={**os.environ, **slot.env}, preexec_fn=pin)


def wait_workers(procs: list) -> list[int]:
    """The exit codes of every worker. Ctrl-C reaches the workers too (one process group): they are left to end
    their trials before the interrupt goes on."""
    try:
        return [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:
            p.wait()
        raise


def launch_workers(user_overrides: list[str], settings: SweepSettings, out=None) -> int:
    """Start settings.workers copies of `python -m sweeps.run` (each with sweep.workers=1) placed by worker_plan,
    wait for all, return the first non-zero exit code (0 when all succeeded)."""
    out = out or sys.stdout
    cores = local_cores()
    devices = visible_devices()
    slots = worker_plan(settings.workers, devices, cores)
    base = [o for o in user_overrides if not o.lstrip("+~").startswith("sweep.workers=")]
    user_threads = any(o.lstrip("+~").startswith("threads=") for o in base)
    seed = settings.sampler.get("seed")
    where = f"GPUs {','.join(devices)}" if devices else f"{len(cores)} CPU cores"
    print(f"[sweep {settings.study_name}] {len(slots)} local workers on {where}, one study in "
          f"{mask_url(settings.storage)}", file=out, flush=True)
    procs = []
    for i, slot in enumerate(slots):
        extra = ["sweep.workers=1"] + ([] if user_threads else slot.overrides)
        if seed is not None:  # equal seeds would sample equal start-up points in every worker
            extra.append(f"sweep.sampler.seed={int(seed) + i}")
        procs.append(start_worker("sweeps.run", [*base, *extra], slot))
        print(f"[sweep {settings.study_name}] worker {i}: pid {procs[-1].pid}, "
              + ", ".join(f"{k}={v}" for k, v in slot.env.items()) + f", cores {slot.cores}", file=out, flush=True)
    codes = wait_workers(procs)
    print(f"[sweep {settings.study_name}] workers done, exit codes {codes}", file=out, flush=True)
    return next((c for c in codes if c), 0)
