"""How the harness's C++ CPU kernels are built: on first use of any, all at once as one library (kernels.cpp includes
each kernel's .cpp), with PyTorch's C++ extension machinery (a C++ compiler and ninja; ~17 s of one core, then
cached in torch's extension directory), from the sources beside their loaders (installed with the package:
pyproject's package data). A kernel that cannot be had, or that its environment variable turns off (`=off`), is
None: its caller keeps its PyTorch path, and the reason is warned once.

Each kernel registers its ops with the dispatcher (TORCH_LIBRARY), so a build is a shared library that adds
`torch.ops.<namespace>` as it loads, with no pybind11 module (half the build time).
"""
from __future__ import annotations

import os
import platform
import shutil
import sys
import warnings
from pathlib import Path


def ninja_path() -> str | None:
    """The PATH to build with: the ninja installed beside this interpreter (the project's own, pyproject) first,
    whether or not the environment is activated, else PATH's ninja; None when there is none. Two ninja versions
    record a command under different hashes, so a build made by one is rebuilt by the other (~20 s of CPU each
    time): with the choice left to PATH, an activated and a plain `.venv/bin/python` alternately rebuilt it."""
    path = os.environ.get("PATH", "")
    here = Path(sys.executable).parent
    if (here / "ninja").exists():
        return f"{here}{os.pathsep}{path}"
    return path if shutil.which("ninja") else None


def x86_wide_vectors() -> tuple[str, ...]:
    """gcc's flag for 512-bit vectors where -march=native has them (AVX-512; elsewhere the widest there is):
    by default gcc vectorises with 256 bits on such CPUs. The flag is x86's alone."""
    return ("-mprefer-vector-width=512",) if platform.machine().lower() in ("x86_64", "amd64") else ()


# -fopenmp: at::parallel_for is a template whose parallel branch exists only where _OPENMP is defined; the library
# linked is libgomp.so.1, the one torch has already loaded (one thread pool).
# -fno-trapping-math: the kernels' branch-free exp (sigmoid.h) clamps its argument, and gcc (12) threads the clamp into
# jumps around the arithmetic it makes constant; assuming that arithmetic may trap, it will not turn them back into
# selects, and the loop stays scalar ("control flow in loop", -fopt-info-vec-missed): on an AVX2-only EPYC the GELU
# kernel ran 2.8x slower than ATen's GELU (docs/bench.md, "Eager GELU"). Without traps it vectorises (GELU's, the
# GLUs' and DyT's loops). Values are unchanged: the flag concerns floating-point exceptions, which nothing here
# reads; no reassociation, no change of rounding (GELU's and the GLUs' outputs were the same bit for bit).
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-trapping-math", *x86_wide_vectors())
LIBRARY = Path(__file__).with_name("kernels.cpp")  # includes every kernel's .cpp: one compile of torch's headers
_library: dict = {}  # {"ok": whether the library loaded, "why": the reason it did not}


def build_tag(directory: Path = LIBRARY.parent) -> str:
    """A short hash of this CPU's model and instruction-set flags and of the kernels' code (every .cpp and .h in
    `directory`): the build is -march=native, so a home directory shared by machines of other CPUs (a cluster's)
    must not hand one machine's build to another (illegal instructions); and two versions of the code on one machine
    (two checkouts, an upgrade) each get their own build, where under one name they rebuilt over each other and one
    could load the other's library."""
    import hashlib

    try:
        info = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith(("model name", "flags", "Features"))][:3]
    except OSError:
        info = []
    text = "\n".join(info) or f"{platform.machine()} {platform.processor()}"
    code = b"".join(f.name.encode() + b"\0" + f.read_bytes() for f in sorted(directory.glob("*.[ch]*"))
                    if f.suffix in (".cpp", ".h"))
    flags = " ".join(CFLAGS).encode()  # a change of flags is a new build too
    return hashlib.sha1(text.encode() + b"\0" + code + b"\0" + flags).hexdigest()[:10]


def load_library() -> str | None:
    """Build (first use on this machine and code) and load the kernels' library; None, or why it could not."""
    if "ok" not in _library:
        path = ninja_path()
        why = "ninja not found (pip install ninja)" if path is None else _load(path)
        _library.update(ok=why is None, why=why)
    return _library["why"]


def _load(path: str) -> str | None:
    before = os.environ.get("PATH")
    os.environ["PATH"] = path  # for torch's ninja call only (it reads os.environ), restored below
    try:
        from torch.utils.cpp_extension import load

        # -march=native: one build per CPU kind and code (build_tag), each cached by torch under its own name.
        # the flags: CFLAGS
        load(f"ablations_kernels_{build_tag()}", sources=[str(LIBRARY)], extra_cflags=list(CFLAGS),
             extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
        return None
    except Exception as e:  # noqa: BLE001 - any build failure leaves the PyTorch paths, which are correct
        return " ".join(str(e).split())[:300] or type(e).__name__
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


class Kernel:
    """One kernel's ops in the library (its .cpp `source`, included by kernels.cpp). `ops()` is
    `torch.ops.<namespace>` (checked by its op `probe`) or None (why: `built["why"]`); `warning` is the line warned
    when it is None, with {why} in it."""

    def __init__(self, source: Path, namespace: str, probe: str, env_var: str, warning: str):
        self.source, self.namespace, self.probe, self.env_var, self.warning = source, namespace, probe, env_var, warning
        self.built: dict = {}  # {"module": the ops or None, "why": the reason they are None}

    def ops(self):
        """The library's ops of this kernel, or None where they cannot be had (the reason warned once)."""
        if "module" in self.built:
            return self.built["module"]
        module, why = None, None
        if os.environ.get(self.env_var, "auto").lower() in ("off", "0", "false"):
            why = f"{self.env_var}=off"
        elif (why := load_library()) is None:
            try:
                import torch

                module = getattr(torch.ops, self.namespace)  # registered as the library loaded (TORCH_LIBRARY)
                getattr(module, self.probe)  # a library without these ops is refused here, not at the first call
            except (AttributeError, RuntimeError) as e:
                module, why = None, " ".join(str(e).split())[:300] or type(e).__name__
        if module is None:
            warnings.warn(self.warning.format(why=why), RuntimeWarning, stacklevel=3)
        self.built.update(module=module, why=why)
        return module
