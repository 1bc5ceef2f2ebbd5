"""Keep freed C-heap memory in the process between training steps (glibc's malloc).

A CPU training step frees megabytes of activations and allocates them again in the next step. With glibc's dynamic
thresholds, memory freed at the top of the heap beyond M_TRIM_THRESHOLD goes back to the kernel, and the next step
faults it back in page by page (a minor fault and a zeroed 4 KiB page each), as many as each process's heap layout
happens to give; what that costs and what keeping it saves: `python -m ablations.bench --only malloc` (docs/bench.md,
"Freed memory"). The usual cure on CPU, jemalloc or tcmalloc through LD_PRELOAD, needs a library installed; fixed
glibc thresholds keep freed memory for the next step without one:

    M_MMAP_THRESHOLD = 32 MiB   allocations below it come from the heap, not a fresh mapping (glibc's largest)
    M_TRIM_THRESHOLD = 2 GiB    free memory at the heap's top is returned only past this

The cost: up to 2 GiB of freed memory stays counted in the process's RSS. Left as it is where the user chose
(ABLATIONS_MALLOC=default, a MALLOC_*_ setting of glibc's own, an allocator preloaded) or where the C library is
not glibc. `describe()` says which, for the run's tags.
"""
from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20                    # HEAP_MAX_SIZE / 2 on 64-bit: the largest value glibc accepts
TRIM_THRESHOLD = 2**31 - 1                   # mallopt takes an int
GLIBC_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")

_state: dict[str, str] = {}  # {"malloc": what this process's allocator does}, once set


def _libc():
    """glibc, or None (musl, macOS, Windows: no mallopt with these meanings)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        return libc
    except (OSError, AttributeError):
        return None


def _users_choice() -> str | None:
    """Why the allocator is left as it is, if the user set it up; else None."""
    if os.environ.get("ABLATIONS_MALLOC", "keep").lower() in ("default", "off", "0", "false"):
        return "default (ABLATIONS_MALLOC)"
    preload = os.environ.get("LD_PRELOAD", "").replace(":", " ").split()
    allocator = [p for p in preload if "malloc" in os.path.basename(p)]  # jemalloc, tcmalloc, mimalloc
    if allocator:
        return f"preloaded {os.path.basename(allocator[0])}"
    set_here = [k for k in GLIBC_ENV if k in os.environ]
    if set_here:
        return f"glibc, the user's {set_here[0]}"
    return None


def keep_freed_memory() -> str:
    """Fix glibc's thresholds so freed memory stays for the next step (once per process); returns `describe()`."""
    if _state:
        return _state["malloc"]
    why = _users_choice()
    libc = None if why else _libc()
    if why:
        _state["malloc"] = why
    elif libc is None:
        _state["malloc"] = "default (not glibc)"
    elif libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1:
        _state["malloc"] = "glibc, freed memory kept (mmap threshold 32 MiB, trim threshold 2 GiB)"
    else:  # mallopt returns 1 on success
        _state["malloc"] = "default (glibc refused the thresholds)"
    return _state["malloc"]


def describe() -> str:
    """What this process's allocator does with freed memory (a run's `malloc` tag)."""
    return _state.get("malloc", "default")
