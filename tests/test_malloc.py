"""ablations.malloc: with glibc's thresholds fixed, a loop that frees and re-allocates a step's worth of tensors
stops faulting pages in; with glibc's defaults (the control, in another fresh process) it keeps faulting."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from ablations import malloc

# A "step": forty 1 MiB blocks from the C heap (what torch's CPU tensors are), each page written, then all freed;
# eight steps. With glibc's defaults the first step's frees raise the mmap threshold to 1 MiB, later blocks come from
# the heap, and the heap's free top (40 MiB, above the 2 MiB trim threshold that follows) goes back to the kernel at
# each step's end: every step faults its pages in again.
_LOOP = textwrap.dedent("""
    import ctypes, json, resource, sys
    from ablations import malloc
    mode = malloc.keep_freed_memory() if sys.argv[1] == "keep" else malloc.describe()
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    faults = []
    for _ in range(8):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [libc.malloc(1 << 20) for _ in range(40)]
        for b in blocks:
            libc.memset(b, 1, 1 << 20)
        for b in blocks:
            libc.free(b)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    print(json.dumps({"mode": mode, "faults": faults}))
""")
PAGES = 40 * (1 << 20) // 4096


def _run(arg: str, **env) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in (*malloc.GLIBC_ENV, "ABLATIONS_MALLOC")}
    out = subprocess.run([sys.executable, "-c", _LOOP, arg], capture_output=True, text=True, check=True,
                         env={**clean, **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(malloc._libc() is None, reason="needs glibc (Linux): CI's Debian has it")
def test_kept_memory_is_not_faulted_in_again_each_step():
    default, kept = _run("default"), _run("keep")
    assert default["mode"] == "default"
    assert kept["mode"].startswith("glibc, freed memory kept")
    # the control shows the problem: every step faults in most of its 10,240 pages again
    assert min(default["faults"][1:]) > PAGES // 2, default
    # kept: after the first step, which grows the heap, (almost) nothing
    assert max(kept["faults"][1:]) < PAGES // 20, kept


def test_users_choice_is_left_alone():
    env_default = _run("keep", ABLATIONS_MALLOC="default")
    assert env_default["mode"] == "default (ABLATIONS_MALLOC)"
    glibc_own = _run("keep", MALLOC_TRIM_THRESHOLD_="131072")
    assert glibc_own["mode"] == "glibc, the user's MALLOC_TRIM_THRESHOLD_"
    assert min(glibc_own["faults"][1:]) > PAGES // 2, glibc_own  # the user's trim threshold, not ours, decides


def test_a_preloaded_allocator_is_named(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    monkeypatch.delenv("ABLATIONS_MALLOC", raising=False)
    assert malloc._users_choice() == "preloaded libjemalloc.so.2"
