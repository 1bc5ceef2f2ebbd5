// GELU's tanh form on CPU, eager: one vectorised pass forward and one backward, fp32 or bf16 in and out, fp32 maths.
// Built on first use by modules/kernels/gelu_tanh.py, whose docstring gives the maths and why (ATen's kernel for this
// form evaluates tanh at 4.8x the cost of its erf form).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "bf16.h"
#include "sigmoid.h"

namespace {

using namespace ablations_kernels;  // bf16.h's conversions, sigmoid.h's sigmoid

// The spans are functions of their own, never inlined into the parallel_for lambdas: inlined into OpenMP's outlined
// region (its pointers captured), the backward loop lost its restrict pointers and ran 9x slower.
// y = x s, s = sigmoid(z), z = x (kS1 + kS3 x^2) (= 2u: 0.5 (1 + tanh u) = sigmoid(2u))
template <typename T>
__attribute__((noinline)) void forward_span(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  #pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float v = to_f32(x[i]);
    float s, t;
    sigmoid_pair(v * (kS1 + kS3 * v * v), s, t);
    y[i] = from_f32<T>(v * s);
  }
}

// dx = dy (s + x s t dz/dx), t = 1 - s, dz/dx = kS1 + 3 kS3 x^2
template <typename T>
__attribute__((noinline)) void backward_span(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx,
                                              int64_t n) {
  #pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float v = to_f32(x[i]);
    float s, t;
    sigmoid_pair(v * (kS1 + kS3 * v * v), s, t);
    dx[i] = from_f32<T>(to_f32(dy[i]) * (s + v * s * t * (kS1 + 3.f * kS3 * v * v)));
  }
}

void check(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && fp32_or_bf16(x.scalar_type()),
              "gelu_tanh: a CPU tensor of fp32 or bf16 (modules/kernels/gelu_tanh.py decides which calls come here)");
}

}  // namespace

at::Tensor tanh_gelu_forward(const at::Tensor& x_in) {
  check(x_in);
  const auto x = x_in.contiguous();
  auto y = at::empty_like(x);
  const int64_t n = x.numel();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data_ptr<T>();
    T* yp = y.data_ptr<T>();
    at::parallel_for(0, n, 16384, [&](int64_t b, int64_t e) { forward_span(xp + b, yp + b, e - b); });
  };
  by_dtype(x.scalar_type(), run);
  return y;
}

at::Tensor tanh_gelu_backward(const at::Tensor& dy_in, const at::Tensor& x_in) {
  check(x_in);
  const auto x = x_in.contiguous();
  const auto dy = dy_in.to(x.scalar_type()).contiguous();
  auto dx = at::empty_like(x);
  const int64_t n = x.numel();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* gp = dy.data_ptr<T>();
    const T* xp = x.data_ptr<T>();
    T* dp = dx.data_ptr<T>();
    at::parallel_for(0, n, 16384, [&](int64_t b, int64_t e) { backward_span(gp + b, xp + b, dp + b, e - b); });
  };
  by_dtype(x.scalar_type(), run);
  return dx;
}

// The autograd node in C++, as ATen's gelu has: no Python runs per call. Saves x alone (the backward recomputes s).
struct GeluTanhFn : public torch::autograd::Function<GeluTanhFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return tanh_gelu_forward(x);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto x = ctx->get_saved_variables()[0];
    return {tanh_gelu_backward(grads[0], x).view(x.sizes())};
  }
};

at::Tensor gelu_tanh(const at::Tensor& x) { return GeluTanhFn::apply(x); }

// torch.ops.ablations_gelu.<name> once the library is loaded (modules/kernels/gelu_tanh.py)
TORCH_LIBRARY(ablations_gelu, m) {
  m.def("forward", &tanh_gelu_forward);
  m.def("backward", &tanh_gelu_backward);
  m.def("gelu_tanh", &gelu_tanh);
}
