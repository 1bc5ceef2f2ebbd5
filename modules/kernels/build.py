"""How the harness's C++ CPU kernels are built: on first use, with PyTorch's C++ extension machinery (a C++ compiler
and ninja; seconds of CPU once, then cached in torch's extension directory), from the .cpp beside their loaders
(installed with the package: pyproject's package data). A kernel that cannot be built, or that its environment
variable turns off (`=off`), is None: its caller keeps its PyTorch path, and the reason is warned once.

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


class Kernel:
    """One C++ source's ops, built on first use. `ops()` is `torch.ops.<namespace>` (checked by its op `probe`)
    or None (why: `built["why"]`); `warning` is the line warned when it is None, with {why} in it."""

    def __init__(self, source: Path, namespace: str, probe: str, env_var: str, warning: str,
                 cflags: tuple[str, ...] = ()):
        self.source, self.namespace, self.probe, self.env_var = source, namespace, probe, env_var
        self.warning, self.cflags = warning, cflags
        self.built: dict = {}  # {"module": the ops or None, "why": the reason they are None}

    def build_tag(self) -> str:
        """A short hash of this CPU's model and instruction-set flags and of the kernel's source (with the headers
        beside it, which the kernels share): the build is -march=native, so a home directory shared by machines of
        other CPUs (a cluster's) must not hand one machine's build to another (illegal instructions); and two
        versions of the source on one machine (two checkouts, an upgrade) each get their own build, where under one
        name they rebuilt over each other and one could load the other's library."""
        import hashlib

        try:
            info = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith(("model name", "flags", "Features"))][:3]
        except OSError:
            info = []
        text = "\n".join(info) or f"{platform.machine()} {platform.processor()}"
        code = b"".join(f.read_bytes() for f in [self.source, *sorted(self.source.parent.glob("*.h"))])
        return hashlib.sha1(text.encode() + b"\0" + code).hexdigest()[:10]

    def ops(self):
        """The built library's ops, or None where they cannot be had (the reason warned once)."""
        if "module" in self.built:
            return self.built["module"]
        module, why = None, None
        if os.environ.get(self.env_var, "auto").lower() in ("off", "0", "false"):
            why = f"{self.env_var}=off"
        elif (path := ninja_path()) is None:
            why = "ninja not found (pip install ninja)"
        else:
            module, why = self._load(path)
        if module is None:
            warnings.warn(self.warning.format(why=why), RuntimeWarning, stacklevel=3)
        self.built.update(module=module, why=why)
        return module

    def _load(self, path: str):
        before = os.environ.get("PATH")
        os.environ["PATH"] = path  # for torch's ninja call only (it reads os.environ), restored below
        try:
            import torch
            from torch.utils.cpp_extension import load

            # -march=native: one build per CPU kind and source (build_tag), each cached by torch under its own name.
            # -fopenmp: at::parallel_for is a template whose parallel branch exists only where _OPENMP is defined;
            # the library linked is libgomp.so.1, the one torch has already loaded (one thread pool)
            load(f"ablations_{self.source.stem}_{self.build_tag()}", sources=[str(self.source)],
                 extra_cflags=["-O3", "-march=native", "-fopenmp", *self.cflags], extra_ldflags=["-fopenmp"],
                 is_python_module=False, verbose=False)
            module = getattr(torch.ops, self.namespace)  # the ops the library registered as it loaded
            getattr(module, self.probe)  # a library that registered nothing is refused here, not at the first call
            return module, None
        except Exception as e:  # noqa: BLE001 - any build failure leaves the PyTorch path, which is correct
            return None, " ".join(str(e).split())[:300] or type(e).__name__
        finally:
            if before is None:
                os.environ.pop("PATH", None)
            else:
                os.environ["PATH"] = before


def x86_wide_vectors() -> tuple[str, ...]:
    """gcc's flag for 512-bit vectors where -march=native has them (AVX-512; elsewhere the widest there is):
    by default gcc vectorises with 256 bits on such CPUs. The flag is x86's alone."""
    return ("-mprefer-vector-width=512",) if platform.machine().lower() in ("x86_64", "amd64") else ()
