// The gated MLPs' gate on CPU, eager: a = act(g) * u from the fused projection's output h = [g, u] in one pass, and
// its gradient [dg, du] in one pass, fp32 or bf16 in and out, fp32 maths. act: SiLU (SwiGLU) or GELU's tanh form
// (GEGLU). Built on first use by modules/kernels/glu.py, which gives the maths and says when it is used.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
#include <algorithm>
#include <cstdint>

#include "bf16.h"
#include "sigmoid.h"

namespace {

using namespace ablations_kernels;  // bf16.h's conversions, sigmoid.h's sigmoid

enum Gate : int64_t { kSilu = 0, kGeluTanh = 1 };

// act(g) = g s and act'(g) = s + g s t z' with s = sigmoid(z), t = 1 - s: z = g (SiLU, z' = 1) or
// z = g (kS1 + kS3 g^2) (GELU's tanh form, z' = kS1 + 3 kS3 g^2)
template <int64_t G>
inline void gate(float g, float& act, float& dact) {
  const float z = G == kSilu ? g : g * (kS1 + kS3 * g * g);
  const float dz = G == kSilu ? 1.f : kS1 + 3.f * kS3 * g * g;
  float s, t;
  sigmoid_pair(z, s, t);
  act = g * s;
  dact = s + g * s * t * dz;
}

// `rows` rows of h (2H each: g then u) -> a (H each). Functions of their own, never inlined into the parallel_for
// lambda, where the loops would lose their restrict pointers (gelu_tanh.cpp's backward ran 9x slower).
template <typename T, int64_t G>
__attribute__((noinline)) void forward_rows(const T* __restrict__ h, T* __restrict__ a, int64_t rows, int64_t H) {
  for (int64_t r = 0; r < rows; r++, h += 2 * H, a += H) {
    #pragma omp simd
    for (int64_t j = 0; j < H; j++) {
      float act, dact;
      gate<G>(to_f32(h[j]), act, dact);
      a[j] = from_f32<T>(act * to_f32(h[j + H]));
    }
  }
}

// da (H each), h (2H each) -> dh = [da u act'(g), da act(g)] (2H each)
template <typename T, int64_t G>
__attribute__((noinline)) void backward_rows(const T* __restrict__ da, const T* __restrict__ h, T* __restrict__ dh,
                                             int64_t rows, int64_t H) {
  for (int64_t r = 0; r < rows; r++, da += H, h += 2 * H, dh += 2 * H) {
    #pragma omp simd
    for (int64_t j = 0; j < H; j++) {
      float act, dact;
      gate<G>(to_f32(h[j]), act, dact);
      const float d = to_f32(da[j]);
      dh[j] = from_f32<T>(d * to_f32(h[j + H]) * dact);
      dh[j + H] = from_f32<T>(d * act);
    }
  }
}

template <typename T>
void run_rows(bool backward, int64_t g, const T* da, const T* h, T* out, int64_t rows, int64_t H) {
  const int64_t grain = std::max<int64_t>(1, 16384 / (2 * H));  // rows per task: ~16k numbers
  at::parallel_for(0, rows, grain, [&](int64_t b, int64_t e) {
    if (backward) {
      if (g == kSilu) backward_rows<T, kSilu>(da + b * H, h + b * 2 * H, out + b * 2 * H, e - b, H);
      else backward_rows<T, kGeluTanh>(da + b * H, h + b * 2 * H, out + b * 2 * H, e - b, H);
    } else {
      if (g == kSilu) forward_rows<T, kSilu>(h + b * 2 * H, out + b * H, e - b, H);
      else forward_rows<T, kGeluTanh>(h + b * 2 * H, out + b * H, e - b, H);
    }
  });
}

void check(const at::Tensor& h, int64_t g) {
  TORCH_CHECK(h.device().is_cpu() && fp32_or_bf16(h.scalar_type()) &&
              h.dim() >= 1 && h.size(-1) % 2 == 0 && (g == kSilu || g == kGeluTanh),
              "glu: h must be a CPU fp32 or bf16 tensor of even last size, gate 0 (silu) or 1 (gelu tanh)");
}

}  // namespace

// h (..., 2H) -> a (..., H) = act(g) * u, contiguous, in h's dtype
at::Tensor gated_forward(const at::Tensor& h_in, int64_t g) {
  check(h_in, g);
  const auto h = h_in.contiguous();
  const int64_t H = h.size(-1) / 2, rows = H ? h.numel() / (2 * H) : 0;
  auto sizes = h.sizes().vec();
  sizes.back() = H;
  auto a = at::empty(sizes, h.options());
  by_dtype(h.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    run_rows<T>(false, g, nullptr, h.data_ptr<T>(), a.data_ptr<T>(), rows, H);
  });
  return a;
}

// da (..., H), h (..., 2H) -> dh (..., 2H) = [dg, du], contiguous, in h's dtype
at::Tensor gated_backward(const at::Tensor& da_in, const at::Tensor& h_in, int64_t g) {
  check(h_in, g);
  const auto h = h_in.contiguous();
  const auto da = da_in.to(h.scalar_type()).contiguous();
  const int64_t H = h.size(-1) / 2, rows = H ? h.numel() / (2 * H) : 0;
  TORCH_CHECK(da.numel() == rows * H, "glu: da must have h's rows and half its width");
  auto dh = at::empty(h.sizes(), h.options());
  by_dtype(h.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    run_rows<T>(true, g, da.data_ptr<T>(), h.data_ptr<T>(), dh.data_ptr<T>(), rows, H);
  });
  return dh;
}

// The autograd node in C++: no Python per call. Saves h alone (the backward recomputes the gate).
struct GluFn : public torch::autograd::Function<GluFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h, int64_t g) {
    ctx->save_for_backward({h});
    ctx->saved_data["gate"] = g;
    return gated_forward(h, g);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto h = ctx->get_saved_variables()[0];
    return {gated_backward(grads[0], h, ctx->saved_data["gate"].toInt()).view(h.sizes()), at::Tensor()};
  }
};

at::Tensor glu(const at::Tensor& h, int64_t g) { return GluFn::apply(h, g); }

// torch.ops.ablations_glu.<name> once the library is loaded (modules/kernels/glu.py)
TORCH_LIBRARY(ablations_glu, m) {
  m.def("forward", &gated_forward);
  m.def("backward", &gated_backward);
  m.def("glu", &glu);
}
