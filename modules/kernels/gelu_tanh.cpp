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

namespace {

using ablations_kernels::from_f32;
using ablations_kernels::to_f32;

constexpr float kS1 = 1.5957691216057308f;  // 2 sqrt(2/pi)
constexpr float kS3 = 0.07135481627260025f;  // 0.044715 * kS1

// exp(v) for v <= 0: v = n ln2 + r with |r| <= ln2/2, exp(r) by its Taylor series to r^6 (relative error < 2e-7,
// about one float ulp), 2^n written into exponent bits. Branch-free, so the loops below vectorise (libm's expf is a
// call per element). v is clamped at -104, where exp is below float's smallest denormal; 2^n is applied as two
// halves, each a normal float for n down to -150, so results in the denormal range keep what precision they have.
inline float exp_neg(float v) {
  v = v < -104.f ? -104.f : (v > 0.f ? 0.f : v);
  const float n = std::nearbyint(v * 1.4426950408889634f);
  const float r = (v - n * 0.693145751953125f) - n * 1.4286067653e-06f;  // ln 2 in two parts: r stays exact
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t ni = static_cast<int32_t>(n), half = ni >> 1;
  const int32_t bits_a = (half + 127) << 23, bits_b = (ni - half + 127) << 23;
  float a, b;
  std::memcpy(&a, &bits_a, 4);
  std::memcpy(&b, &bits_b, 4);
  return p * a * b;
}

// s = sigmoid(z) and t = 1 - s = sigmoid(-z), each from e = exp(-|z|): 1 / (1 + e) and e / (1 + e), so neither is
// computed as a difference and the small one keeps its relative precision far into the tails (for x < -9.5, x s is
// below bf16's normal range: 1 / (1 + exp(-z)) there would overflow exp and give 0 where the value is 3e-38)
inline void sigmoid_pair(float z, float& s, float& t) {
  const float e = exp_neg(-std::fabs(z));
  const float d = 1.f / (1.f + e);
  s = z >= 0.f ? d : e * d;
  t = z >= 0.f ? e * d : d;
}

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
  TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
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
  if (x.scalar_type() == at::kFloat) run(float()); else run(c10::BFloat16());
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
  if (x.scalar_type() == at::kFloat) run(float()); else run(c10::BFloat16());
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
