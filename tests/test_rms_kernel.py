"""RMSNorm's fused CPU kernel (modules/kernels/rms_norm.py) against PyTorch's own F.rms_norm computed in float64 (an
outside reference for the forward, its autograd for both gradients), at shapes that meet the kernel's edges: a width
that is no multiple of any vector length, fewer rows than one parallel chunk, a batch of sequences, two threads
(the weight gradient summed over per-thread partials). And which path RMSNorm takes: the kernel for fp32 on CPU
(under bf16 autocast too: the residual stream is fp32), the op-by-op path otherwise, and when the kernel is off.
"""
import pytest
import torch
import torch.nn.functional as F

from modules.kernels import build
from modules.kernels import rms_norm as rms_kernel
from modules.norms.rmsnorm import rms_norm


def test_the_kernels_cpp_is_package_data():
    """The kernel is compiled from the .cpp beside its loader at run time, so an installed wheel must carry it."""
    import fnmatch
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert rms_kernel.KERNEL.source.is_file() and rms_kernel.KERNEL.source.parent == Path(rms_kernel.__file__).parent
    sources = [f.name for f in rms_kernel.KERNEL.source.parent.iterdir() if f.suffix in (".cpp", ".h", ".cu")]
    assert sources and all(any(fnmatch.fnmatch(f, pat) for pat in patterns["modules.kernels"]) for f in sources)


def test_the_kernel_is_built_here():
    # CI has a compiler and ninja (pyproject): a missing kernel there is a failure, not a fallback to accept
    assert rms_kernel.kernel() is not None, rms_kernel.KERNEL.built.get("why")


def test_the_build_uses_the_interpreters_ninja_whatever_path_says(tmp_path, monkeypatch):
    """Two ninja versions hash a build's command differently, so each rebuilds what the other built (~20 s of CPU):
    the build runs the ninja beside this interpreter (pyproject's) even when PATH names another first (a system
    ninja, an environment not activated), and PATH is as it was afterwards."""
    import os
    import sys
    from pathlib import Path

    import torch.utils.cpp_extension as cpp

    own = Path(sys.executable).parent / "ninja"
    assert own.exists()  # the [test] install has pyproject's ninja in this environment
    other = tmp_path / "bin"
    other.mkdir()
    (other / "ninja").write_text("#!/bin/sh\nexit 1\n")
    (other / "ninja").chmod(0o755)
    path = f"{other}{os.pathsep}{os.environ['PATH']}"
    monkeypatch.setenv("PATH", path)
    seen = []

    def fake_load(name, **kwargs):  # where torch's build would look for ninja (it runs `ninja` from os.environ)
        import shutil

        seen.append(shutil.which("ninja"))
        raise RuntimeError("not built in this test")

    monkeypatch.setattr(cpp, "load", fake_load)
    monkeypatch.setattr(rms_kernel.KERNEL, "built", {})
    monkeypatch.setattr(build, "_library", {})  # the library not loaded yet in this process
    with pytest.warns(RuntimeWarning, match="not built in this test"):
        assert rms_kernel.kernel() is None
    assert seen == [str(own)] and os.environ["PATH"] == path


@pytest.mark.parametrize("shape", [(2048, 128), (7, 37), (3, 5, 64), (1, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_matches_pytorch_in_float64(shape, threads):
    k = rms_kernel.kernel()
    g = torch.Generator().manual_seed(sum(shape) + threads)
    d, eps = shape[-1], 1e-5
    x = 3 * torch.randn(shape, generator=g, dtype=torch.float64)
    w = 1 + 0.5 * torch.randn(d, generator=g, dtype=torch.float64)
    dy = torch.randn(shape, generator=g, dtype=torch.float64)
    x64, w64 = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = F.rms_norm(x64, (d,), w64, eps)
    ref.backward(dy)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y, rstd = k.forward(x.float().reshape(-1, d), w.float(), eps)
        dx, dw = k.backward(dy.float().reshape(-1, d), x.float().reshape(-1, d), rstd, w.float(), True)
    finally:
        torch.set_num_threads(before)
    assert y.shape == (x.numel() // d, d) and rstd.shape == (x.numel() // d,)
    torch.testing.assert_close(y.double().view(shape), ref.detach(), rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(rstd.double(), torch.rsqrt(x.pow(2).mean(-1) + eps).reshape(-1), rtol=2e-6, atol=0)
    torch.testing.assert_close(dx.double().view(shape), x64.grad, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(dw.double(), w64.grad, rtol=2e-5, atol=2e-4)


def test_the_kernel_runs_on_torchs_threads():
    # the parallel branch of at::parallel_for is compiled into the kernel only with OpenMP: without it the kernel
    # runs serially whatever torch.set_num_threads says (it did, before -fopenmp)
    k = rms_kernel.kernel()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert k.threads_used(2048) == 2
        assert k.threads_used(16) == 1  # one grain: no second thread
    finally:
        torch.set_num_threads(before)


class _Counting:
    """The built kernel, the calls of its op (with its C++ autograd node) counted."""

    def __init__(self, k):
        self.k, self.calls = k, 0

    def rms_norm(self, *a):
        self.calls += 1
        return self.k.rms_norm(*a)


def test_the_op_and_its_autograd_node_match_pytorch(tmp_path):
    """The op RMSNorm calls (kernel().rms_norm, its autograd node in C++) on a 3-d input, the weight gradient asked
    for or not, against F.rms_norm in float64."""
    k = rms_kernel.kernel()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 9, 48, generator=g, dtype=torch.float64)
    w = 1 + 0.3 * torch.randn(48, generator=g, dtype=torch.float64)
    dy = torch.randn(2, 9, 48, generator=g, dtype=torch.float64)
    x64, w64 = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.rms_norm(x64, (48,), w64, 1e-6).backward(dy)
    for w_grad in (True, False):
        xf, wf = x.float().requires_grad_(), w.float().requires_grad_(w_grad)
        y = k.rms_norm(xf, wf, 1e-6)
        assert y.shape == x.shape and y.grad_fn is not None
        y.backward(dy.float())
        torch.testing.assert_close(y.detach().double(), F.rms_norm(x, (48,), w, 1e-6), rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(xf.grad.double(), x64.grad, rtol=2e-5, atol=2e-5)
        if w_grad:
            torch.testing.assert_close(wf.grad.double(), w64.grad, rtol=2e-5, atol=2e-4)
        else:
            assert wf.grad is None


def test_which_path_rmsnorm_takes(monkeypatch):
    counting = _Counting(rms_kernel.kernel())
    monkeypatch.setitem(rms_kernel.KERNEL.built, "module", counting)
    x = torch.randn(4, 8, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    fused = rms_norm(x, w, 1e-5)
    assert counting.calls == 1
    fused.square().sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    composite = rms_norm(x, w, 1e-5, fused=False)  # the op-by-op path, asked for
    composite.square().sum().backward()
    assert counting.calls == 1
    torch.testing.assert_close(fused, composite, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx, x.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gw, w.grad, rtol=1e-4, atol=1e-4)
    rms_norm(x.double(), w.double(), 1e-5)  # not fp32: op by op
    rms_norm(x.bfloat16(), w, 1e-5)
    assert counting.calls == 1
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the fp32 residual stream under bf16-mixed: the kernel
        assert rms_norm(x, w, 1e-5).dtype == torch.float32
    assert counting.calls == 2


def test_off_the_cpu_rmsnorm_is_pytorchs_own(monkeypatch):
    """On an accelerator RMSNorm is F.rms_norm (a fused CUDA kernel; inductor fuses its decomposition), in x's dtype
    with an fp32 weight; the CPU keeps its own paths. The meta device stands in for CUDA (no GPU in the suite); the
    H200 measurement is in docs/bench.md."""
    import modules.norms.rmsnorm as rmsnorm_module

    calls = []
    real = F.rms_norm
    monkeypatch.setattr(rmsnorm_module.F, "rms_norm", lambda *a, **k: calls.append(a[0].device.type) or real(*a, **k))
    w = torch.randn(32)
    rms_norm(torch.randn(4, 8, 32), w, 1e-5)
    assert calls == []
    y = rms_norm(torch.randn(4, 8, 32, device="meta", dtype=torch.bfloat16), w.to("meta"), 1e-5)
    assert calls == ["meta"] and y.dtype == torch.bfloat16 and y.shape == (4, 8, 32)


def test_fp32_activations_with_a_bf16_weight_take_the_op_by_op_path(monkeypatch):
    """The kernel is fp32 only: an fp32 residual stream normalised by a bf16 weight (a model cast to bf16 whose
    activations are fp32) goes op by op, in fp32, against F.rms_norm in float64 of the same (bf16-rounded) weight;
    the weight's gradient comes back in its own dtype. Given to the kernel it raised "expected scalar type Float but
    found BFloat16"."""
    counting = _Counting(rms_kernel.kernel())
    monkeypatch.setitem(rms_kernel.KERNEL.built, "module", counting)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 24, generator=g, requires_grad=True)
    w = (1 + 0.3 * torch.randn(24, generator=g)).bfloat16().requires_grad_()
    dy = torch.randn(3, 5, 24, generator=g)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = F.rms_norm(x64, (24,), w64, 1e-5)
    ref.backward(dy.double())
    y = rms_norm(x, w, 1e-5)
    y.backward(dy)
    assert counting.calls == 0 and y.dtype == x.grad.dtype == torch.float32 and w.grad.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), ref.detach(), rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=8e-3, atol=8e-3)  # bf16: 8 bits of mantissa


def test_kernel_off_is_one_warning_and_the_op_by_op_path(monkeypatch):
    monkeypatch.setattr(rms_kernel.KERNEL, "built", {})
    monkeypatch.setenv("ABLATIONS_RMSNORM_KERNEL", "off")
    with pytest.warns(RuntimeWarning, match=r"fused CPU kernel is not used \(ABLATIONS_RMSNORM_KERNEL=off\)"):
        assert rms_kernel.kernel() is None
    x, w = torch.randn(5, 16), torch.ones(16)
    torch.testing.assert_close(rms_norm(x, w, 1e-6), F.rms_norm(x, (16,), w, 1e-6), rtol=1e-6, atol=1e-6)


def test_one_build_per_cpu_kind_and_source(monkeypatch, tmp_path):
    """The build is -march=native: its cached name carries a hash of the CPU's model and flags, so a home directory
    shared with a machine of another CPU never loads this one's build; and of the kernels' code (every .cpp and .h
    of the library), so another version of any kernel (another checkout on this machine) builds beside this one
    instead of over it."""
    import shutil

    kernels = tmp_path / "kernels"
    shutil.copytree(build.LIBRARY.parent, kernels, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    real_path = build.Path

    class FakeCpuinfo:
        text = ""

        def __init__(self, *_):
            pass

        def read_text(self):
            return FakeCpuinfo.text

    monkeypatch.setattr(build, "Path", lambda p: FakeCpuinfo() if p == "/proc/cpuinfo" else real_path(p))
    tags = {}
    for name, flags in (("avx512", "fpu sse2 avx2 avx512f"), ("avx2", "fpu sse2 avx2"), ("again", "fpu sse2 avx2")):
        FakeCpuinfo.text = f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {flags}\n"
        tags[name] = build.build_tag(kernels)
    assert tags["avx2"] == build.build_tag(build.LIBRARY.parent)  # the copy is the library's code
    for f in ("rms_norm.cpp", "bf16.h"):  # a kernel's source, a shared header
        (kernels / f).write_bytes((kernels / f).read_bytes() + b"// another version\n")
        tags[f] = build.build_tag(kernels)
    assert tags["avx512"] != tags["avx2"] == tags["again"] != tags["rms_norm.cpp"] != tags["bf16.h"]
