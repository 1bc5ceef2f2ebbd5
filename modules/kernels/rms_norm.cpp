// RMSNorm's fused CPU kernel: forward and backward in one pass over a row each, and the op with its autograd
// node. Built on first use by modules/kernels/rms_norm.py (torch.utils.cpp_extension.load), which says how and
// falls back to PyTorch ops where it cannot be built; the math is in that file's docstring.
// Only the headers it uses, and the ops registered with the dispatcher (TORCH_LIBRARY) instead of a pybind11
// module: with <torch/extension.h> (all of libtorch's C++ API and pybind11) the first-use build took 44 s of CPU
// here, with these 21 s (once per machine).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
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
std::vector<at::Tensor> rms_forward(const at::Tensor& x, const at::Tensor& w, double eps) {
  const int64_t rows = x.size(0), d = x.size(1);
  auto y = at::empty_like(x);
  auto rstd = at::empty({rows}, x.options());
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
std::vector<at::Tensor> rms_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& rstd,
                                     const at::Tensor& w, bool need_dw) {
  const int64_t rows = x.size(0), d = x.size(1);
  auto dx = at::empty_like(x);
  auto partial = at::zeros({need_dw ? at::get_num_threads() : 0, d}, x.options());
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
  return {dx, need_dw ? partial.sum(0) : at::Tensor()};
}

// The autograd node in C++ (as LayerNorm's is): no Python runs per call, forward or backward.
struct RMSNormFn : public torch::autograd::Function<RMSNormFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
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
    const auto dy = grads[0].reshape(saved[0].sizes()).to(at::kFloat).contiguous();
    auto out = rms_backward(dy, saved[0], saved[1], saved[2].contiguous(), need_dw);
    return {out[0].view(grads[0].sizes()), need_dw ? out[1] : at::Tensor(), at::Tensor()};
  }
};

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
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

// torch.ops.ablations_rms.<name> once the library is loaded (modules/kernels/rms_norm.py)
TORCH_LIBRARY(ablations_rms, m) {
  m.def("forward", &rms_forward);
  m.def("backward", &rms_backward);
  m.def("rms_norm", &rms_norm);
  m.def("threads_used", &threads_used);
}
