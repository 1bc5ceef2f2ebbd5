"""RMSNorm's fused CPU kernel: one pass over a row for its statistics and output forward, one for its gradients
backward, the way LayerNorm's own kernels work. Written as PyTorch ops, RMSNorm makes several passes over its
activations each way and trains slower than LayerNorm on CPU, although it does less arithmetic (docs/bench.md,
`ablations.bench --only norms`).

The kernel is rms_norm.cpp beside this file (installed with the package: pyproject's package data), built with
PyTorch's C++ extension machinery on first use (a C++ compiler and ninja; ~20 s of CPU once, then cached in
torch's extension directory). Where it cannot be built, or with ABLATIONS_RMSNORM_KERNEL=off, `kernel()` returns
None and RMSNorm keeps its op-by-op path; the reason is given once as a warning.

    y    = x * r * w,  r = 1 / sqrt(mean(x^2) + eps)                          (rows, d) fp32
    dx   = r * g - (r^3 / d) * x * sum(g * x),  g = dy * w
    dw   = sum over rows of dy * x * r
"""
from __future__ import annotations

import os
import shutil
import sys
import warnings
from pathlib import Path

_SOURCE = Path(__file__).with_name("rms_norm.cpp")  # the kernel, beside this loader (package data)

_built: dict = {}  # {"module": the extension or None, "why": the reason it is None}


def _ninja_path() -> str | None:
    """The PATH to build with: the ninja installed beside this interpreter (the project's own, pyproject) first,
    whether or not the environment is activated, else PATH's ninja; None when there is none. Two ninja versions
    record a command under different hashes, so a build made by one is rebuilt by the other (~20 s of CPU each
    time): with the choice left to PATH, an activated and a plain `.venv/bin/python` alternately rebuilt it."""
    path = os.environ.get("PATH", "")
    here = Path(sys.executable).parent
    if (here / "ninja").exists():
        return f"{here}{os.pathsep}{path}"
    return path if shutil.which("ninja") else None


def _build_tag() -> str:
    """A short hash of this CPU's model and instruction-set flags and of the kernel's source: the build is
    -march=native, so a home directory shared by machines of other CPUs (a cluster's) must not hand one machine's
    build to another (illegal instructions); and two versions of the source on one machine (two checkouts, an
    upgrade) each get their own build, where under one name they rebuilt over each other and one could load the
    other's library."""
    import hashlib
    import platform

    try:
        info = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith(("model name", "flags", "Features"))][:3]
    except OSError:
        info = []
    text = "\n".join(info) or f"{platform.machine()} {platform.processor()}"
    return hashlib.sha1(text.encode() + b"\0" + _SOURCE.read_bytes()).hexdigest()[:10]


def kernel():
    """The compiled kernel's ops, `torch.ops.ablations_rms` (rms_norm: the op with its C++ autograd node; forward,
    backward: the two kernels on (rows, d)), or None where it cannot be had (the reason warned once)."""
    if "module" in _built:
        return _built["module"]
    module, why = None, None
    if os.environ.get("ABLATIONS_RMSNORM_KERNEL", "auto").lower() in ("off", "0", "false"):
        why = "ABLATIONS_RMSNORM_KERNEL=off"
    elif (path := _ninja_path()) is None:
        why = "ninja not found (pip install ninja)"
    else:
        before = os.environ.get("PATH")
        os.environ["PATH"] = path  # for torch's ninja call only (it reads os.environ), restored below
        try:
            import torch
            from torch.utils.cpp_extension import load

            # -march=native: one build per CPU kind and source (_build_tag), each cached by torch under its own name.
            # -fopenmp: at::parallel_for is a template whose parallel branch exists only where _OPENMP is defined;
            # the library linked is libgomp.so.1, the one torch has already loaded (one thread pool)
            load(f"ablations_rms_norm_{_build_tag()}", sources=[str(_SOURCE)], extra_cflags=[
                "-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"], is_python_module=False,
                verbose=False)
            module = torch.ops.ablations_rms  # the ops the library registered as it loaded (TORCH_LIBRARY)
            module.rms_norm  # noqa: B018 - a library that registered nothing is refused here, not at the first call
        except Exception as e:  # noqa: BLE001 - any build failure leaves the op-by-op path, which is correct
            why = " ".join(str(e).split())[:300] or type(e).__name__
        finally:
            if before is None:
                os.environ.pop("PATH", None)
            else:
                os.environ["PATH"] = before
    if module is None:
        warnings.warn(f"RMSNorm: the fused CPU kernel is not used ({why}); RMSNorm runs op by op, slower than "
                      "LayerNorm on CPU", RuntimeWarning, stacklevel=2)
    _built.update(module=module, why=why)
    return module
