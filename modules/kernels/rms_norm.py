"""RMSNorm's fused CPU kernel: one pass over a row for its statistics and output forward, one for its gradients
backward, the way LayerNorm's own kernels work. Written as PyTorch ops, RMSNorm makes several passes over its
activations each way and trains slower than LayerNorm on CPU, although it does less arithmetic (docs/bench.md,
`ablations.bench --only norms`).

Built with PyTorch's C++ extension machinery on first use (a C++ compiler and ninja; ~30 s once, then cached in
torch's extension directory). Where it cannot be built, or with ABLATIONS_RMSNORM_KERNEL=off, `kernel()` returns None
and RMSNorm keeps its op-by-op path; the reason is given once as a warning.

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

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

// One row each way. The row loops live in functions of their own, with restrict pointers, and not in the
// parallel_for lambdas: compiled with OpenMP the lambda is called through the parallel region's outlined function,
// and loops written inside it over captured pointers vectorised worse (the backward ran 2.5x slower).
static inline float forward_row(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                                int64_t d, float eps) {
  float ss = 0.f;
  #pragma omp simd reduction(+:ss)
  for (int64_t j = 0; j < d; j++) ss += x[j] * x[j];
  const float r = 1.f / std::sqrt(ss / d + eps);
  #pragma omp simd
  for (int64_t j = 0; j < d; j++) y[j] = x[j] * r * w[j];
  return r;
}

// dx = r * g - (r^3 / d) * x * sum(g * x) with g = dy * w; acc (nullable) += dy * x * r, this row's part of dw
static inline void backward_row(const float* __restrict__ dy, const float* __restrict__ x,
                                const float* __restrict__ w, float r, int64_t d, float* __restrict__ dx,
                                float* __restrict__ acc) {
  float s = 0.f;
  #pragma omp simd reduction(+:s)
  for (int64_t j = 0; j < d; j++) s += dy[j] * w[j] * x[j];
  const float c = s * r * r * r / d;
  if (acc) {
    #pragma omp simd
    for (int64_t j = 0; j < d; j++) {
      dx[j] = r * dy[j] * w[j] - c * x[j];
      acc[j] += dy[j] * x[j] * r;
    }
  } else {
    #pragma omp simd
    for (int64_t j = 0; j < d; j++) dx[j] = r * dy[j] * w[j] - c * x[j];
  }
}

// x (rows, d), w (d,): fp32, contiguous -> y (rows, d), rstd (rows,)
std::vector<torch::Tensor> rms_forward(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  const int64_t rows = x.size(0), d = x.size(1);
  auto y = torch::empty_like(x);
  auto rstd = torch::empty({rows}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  float* rp = rstd.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i++) rp[i] = forward_row(xp + i * d, wp, yp + i * d, d, e);
  });
  return {y, rstd};
}

// dy, x (rows, d), rstd (rows,), w (d,) -> dx (rows, d), dw (d,) (undefined unless need_dw). dw is summed per thread
// into its own row of `partial`, then over the threads: no two threads write one address.
std::vector<torch::Tensor> rms_backward(const torch::Tensor& dy, const torch::Tensor& x, const torch::Tensor& rstd,
                                        const torch::Tensor& w, bool need_dw) {
  const int64_t rows = x.size(0), d = x.size(1);
  auto dx = torch::empty_like(x);
  auto partial = torch::zeros({need_dw ? at::get_num_threads() : 0, d}, x.options());
  const float* dyp = dy.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  const float* rp = rstd.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* dxp = dx.data_ptr<float>();
  float* pp = need_dw ? partial.data_ptr<float>() : nullptr;
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    float* acc = need_dw ? pp + at::get_thread_num() * d : nullptr;
    for (int64_t i = begin; i < end; i++) backward_row(dyp + i * d, xp + i * d, wp, rp[i], d, dxp + i * d, acc);
  });
  return {dx, need_dw ? partial.sum(0) : torch::Tensor()};
}

// The autograd node in C++ (as LayerNorm's is): no Python runs per call, forward or backward.
struct RMSNormFn : public torch::autograd::Function<RMSNormFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               double eps) {
    const auto x2 = x.reshape({-1, x.size(-1)}).contiguous();  // (rows, d)
    auto out = rms_forward(x2, w.contiguous(), eps);
    ctx->save_for_backward({x2, out[1], w});
    return out[0].view(x.sizes());
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();  // x (rows, d), rstd (rows,), w (d,)
    const bool need_dw = ctx->needs_input_grad(1);
    const auto dy = grads[0].reshape(saved[0].sizes()).to(torch::kFloat).contiguous();
    auto out = rms_backward(dy, saved[0], saved[1], saved[2].contiguous(), need_dw);
    return {out[0].view(grads[0].sizes()), need_dw ? out[1] : torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return RMSNormFn::apply(x, w, eps);
}

// How many of torch's intra-op threads a parallel_for over `rows` runs on here: without OpenMP at compile time
// at::parallel_for runs serially in this file (its parallel branch is compiled in the caller), so this is 1.
int64_t threads_used(int64_t rows) {
  std::vector<char> seen(at::get_num_threads(), 0);
  at::parallel_for(0, rows, 16, [&](int64_t, int64_t) { seen[at::get_thread_num()] = 1; });
  int64_t n = 0;
  for (char c : seen) n += c;
  return n;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &rms_forward);
  m.def("backward", &rms_backward);
  m.def("rms_norm", &rms_norm);
  m.def("threads_used", &threads_used);
}
"""

_built: dict = {}  # {"module": the extension or None, "why": the reason it is None}


def _find_ninja() -> bool:
    """ninja on PATH, else beside this interpreter (pip's ninja in a virtual environment that is not activated)."""
    if shutil.which("ninja"):
        return True
    here = Path(sys.executable).parent
    if (here / "ninja").exists():
        os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"
        return True
    return False


def _cpu_tag() -> str:
    """A short hash of this CPU's model and instruction-set flags: the build is -march=native, so a home directory
    shared by machines of other CPUs (a cluster's) must not hand one machine's build to another (illegal
    instructions)."""
    import hashlib
    import platform

    try:
        info = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith(("model name", "flags", "Features"))][:3]
    except OSError:
        info = []
    text = "\n".join(info) or f"{platform.machine()} {platform.processor()}"
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def kernel():
    """The compiled extension (rms_norm: the op with its C++ autograd node; forward, backward: the two kernels on
    (rows, d)), or None where it cannot be had (the reason warned once)."""
    if "module" in _built:
        return _built["module"]
    module, why = None, None
    if os.environ.get("ABLATIONS_RMSNORM_KERNEL", "auto").lower() in ("off", "0", "false"):
        why = "ABLATIONS_RMSNORM_KERNEL=off"
    elif not _find_ninja():
        why = "ninja not found (pip install ninja)"
    else:
        try:
            from torch.utils.cpp_extension import load_inline

            # -march=native: one build per CPU kind (_cpu_tag), each cached by torch under its own name.
            # -fopenmp: at::parallel_for is a template whose parallel branch exists only where _OPENMP is defined;
            # the library linked is libgomp.so.1, the one torch has already loaded (one thread pool)
            module = load_inline(f"ablations_rms_norm_{_cpu_tag()}", cpp_sources=[_SOURCE], extra_cflags=[
                "-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)
        except Exception as e:  # noqa: BLE001 - any build failure leaves the op-by-op path, which is correct
            why = " ".join(str(e).split())[:300] or type(e).__name__
    if module is None:
        warnings.warn(f"RMSNorm: the fused CPU kernel is not used ({why}); RMSNorm runs op by op, slower than "
                      "LayerNorm on CPU", RuntimeWarning, stacklevel=2)
    _built.update(module=module, why=why)
    return module
