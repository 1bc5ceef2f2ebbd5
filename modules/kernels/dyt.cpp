// DyT's CPU kernel (Zhu et al. 2025): y = w * tanh(a x) + b in one pass forward, and one pass backward for dx with
// the sums of da, dw and db; the op with its autograd node. Built on first use by modules/kernels/dyt.py, whose
// docstring has the maths.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
#include <cmath>
#include <cstdint>
#include <vector>

#include "sigmoid.h"

namespace ablations_dyt {

// e = exp(v) and m = e - 1 for v <= 0: v = n ln2 + r (sigmoid.h), q = exp(r) - 1 = r (1 + r/2 + r^2/6 + ...) to
// r^7 (relative error < 2e-7), e = 2^n (1 + q). m is q itself for n = 0 (|v| < ln2/2), never a difference of nearly
// equal numbers, so tanh keeps its relative precision near 0; for n < 0, e <= 0.71 and e - 1 loses nothing.
// Branch-free (both computed, one selected), so the loops calling it vectorise (modules/kernels/build.py: with the
// flags there).
inline void exp_expm1_neg(float v, float& e, float& m) {
  float r;
  const float n = ablations_kernels::reduce_ln2(v, r);
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  const float q = p * r;  // exp(r) - 1
  e = ablations_kernels::times_pow2(1.f + q, n);
  m = n == 0.f ? q : e - 1.f;
}

// t = tanh(z) = sign(z) (1 - e) / (1 + e) and s = 1 - t^2 = 4 e / (1 + e)^2, e = exp(-2|z|): both to fp32's relative
// precision (1 - t^2 written out cancels where |t| is near 1, which is where the gradient is small)
inline void tanh_sech2(float z, float& t, float& s) {
  float e, m;
  exp_expm1_neg(-2.f * std::fabs(z), e, m);
  const float r = 1.f / (1.f + e);
  t = std::copysign(-m * r, z);
  s = 4.f * e * r * r;
}

// The loops over a row live in functions of their own with restrict pointers (not in the parallel_for lambdas):
// rms_norm.cpp says why.
static inline void forward_row(const float* __restrict__ x, float a, const float* __restrict__ w,
                               const float* __restrict__ b, float* __restrict__ y, int64_t d) {
  #pragma omp simd
  for (int64_t j = 0; j < d; j++) {
    float t, s;
    tanh_sech2(a * x[j], t, s);
    y[j] = w[j] * t + b[j];
  }
}

// dx = a g (1 - t^2), g = dy w; returns this row's part of da = sum g (1 - t^2) x; dw += dy t; db += dy
static inline float backward_row(const float* __restrict__ dy, const float* __restrict__ x, float a,
                                 const float* __restrict__ w, float* __restrict__ dx, float* __restrict__ dw,
                                 float* __restrict__ db, int64_t d) {
  float da = 0.f;
  #pragma omp simd reduction(+:da)
  for (int64_t j = 0; j < d; j++) {
    float t, s;
    tanh_sech2(a * x[j], t, s);
    const float q = dy[j] * w[j] * s;
    dx[j] = a * q;
    da += q * x[j];
    dw[j] += dy[j] * t;
    db[j] += dy[j];
  }
  return da;
}

// x (rows, d), alpha (1,), w, b (d,): fp32, contiguous -> y (rows, d)
at::Tensor dyt_forward(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& w, const at::Tensor& b) {
  const int64_t rows = x.size(0), d = x.size(1);
  auto y = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float a = alpha.item<float>();
  const float* wp = w.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i++) forward_row(xp + i * d, a, wp, bp, yp + i * d, d);
  });
  return y;
}

// dy, x (rows, d), alpha (1,), w (d,) -> dx (rows, d), dalpha (1,), dw (d,), db (d,). The sums are per thread, each
// into its own row of `partial` (dw, db, da), then over the threads: no two threads write one address.
std::vector<at::Tensor> dyt_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& alpha,
                                     const at::Tensor& w) {
  const int64_t rows = x.size(0), d = x.size(1);
  auto dx = at::empty_like(x);
  auto partial = at::zeros({at::get_num_threads(), 2 * d + 1}, x.options());
  const float* dyp = dy.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  const float a = alpha.item<float>();
  const float* wp = w.data_ptr<float>();
  float* dxp = dx.data_ptr<float>();
  float* pp = partial.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    float* acc = pp + at::get_thread_num() * (2 * d + 1);  // dw (d), db (d), da (1)
    for (int64_t i = begin; i < end; i++)
      acc[2 * d] += backward_row(dyp + i * d, xp + i * d, a, wp, dxp + i * d, acc, acc + d, d);
  });
  const auto sums = partial.sum(0);  // (2d + 1,)
  return {dx, sums.slice(0, 2 * d).clone(), sums.slice(0, 0, d).clone(), sums.slice(0, d, 2 * d).clone()};
}

// The autograd node in C++: no Python runs per call, forward or backward. Only x is saved: t is computed again
// backward (cheaper here than writing and reading it back).
struct DyTFn : public torch::autograd::Function<DyTFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& alpha,
                            const at::Tensor& w, const at::Tensor& b) {
    const auto x2 = x.reshape({-1, x.size(-1)}).contiguous();  // (rows, d)
    auto y = dyt_forward(x2, alpha, w.contiguous(), b.contiguous());
    ctx->save_for_backward({x2, alpha, w});
    return y.view(x.sizes());
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();  // x (rows, d), alpha (1,), w (d,)
    const auto dy = grads[0].reshape(saved[0].sizes()).to(at::kFloat).contiguous();
    auto out = dyt_backward(dy, saved[0], saved[1], saved[2].contiguous());
    return {out[0].view(grads[0].sizes()), out[1].view(saved[1].sizes()), out[2], out[3]};
  }
};

at::Tensor dyt(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& w, const at::Tensor& b) {
  return DyTFn::apply(x, alpha, w, b);
}

}  // namespace ablations_dyt

// torch.ops.ablations_dyt.<name> once the library is loaded (modules/kernels/dyt.py)
TORCH_LIBRARY(ablations_dyt, m) {
  m.def("forward", &ablations_dyt::dyt_forward);
  m.def("backward", &ablations_dyt::dyt_backward);
  m.def("dyt", &ablations_dyt::dyt);
}
