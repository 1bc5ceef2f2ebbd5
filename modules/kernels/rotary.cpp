// Rope's rotation on CPU, eager: one pass over each row of q or k, forward and backward, fp32 or bf16 in and out,
// fp32 maths and angles. Built on first use by modules/kernels/rotary.py, which says when it is used.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
#include <cstdint>

#include "bf16.h"

namespace {

using namespace ablations_kernels;  // bf16.h's conversions

// The T rows of one head of one sequence, each of d = 2h numbers: (x1 c - sign x2 s, x2 c + sign x1 s) over its
// halves; sign -1 rotates back (the backward: a rotation's gradient is the rotation by the opposite angle). x's rows
// are sx apart (a head view of the fused projection), the angles' rows h apart, out's 2h. One call per head and
// sequence, not per row (a call per 16-pair row cost as much as the rotation), and never inlined into the
// parallel_for lambda, where the loop would lose its restrict pointers (gelu_tanh.cpp's backward ran 9x slower).
template <typename T>
__attribute__((noinline)) void rotate_head(const T* __restrict__ x, int64_t sx, const float* __restrict__ c,
                                           const float* __restrict__ s, T* __restrict__ out, int64_t rows,
                                           int64_t h, float sign) {
  for (int64_t t = 0; t < rows; t++, x += sx, c += h, s += h, out += 2 * h) {
    #pragma omp simd
    for (int64_t j = 0; j < h; j++) {
      const float a = to_f32(x[j]), b = to_f32(x[j + h]);
      out[j] = from_f32<T>(a * c[j] - sign * b * s[j]);
      out[j + h] = from_f32<T>(b * c[j] + sign * a * s[j]);
    }
  }
}

}  // namespace

// x (B, H, T, d), any strides with unit stride in d; cos, sin (Bc, 1, T, d/2) fp32, Bc 1 (every row the same
// positions) or B -> (B, H, T, d) contiguous, in x's dtype
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos_in, const at::Tensor& sin_in, double sign) {
  TORCH_CHECK(x.device().is_cpu() && fp32_or_bf16(x.scalar_type()) &&
              x.dim() == 4 && x.stride(3) == 1 && x.size(3) % 2 == 0,
              "rotary: x must be a CPU (B, H, T, d) fp32 or bf16 tensor, d even, unit stride in d");
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), h = x.size(3) / 2;
  const auto c = cos_in.contiguous(), s = sin_in.contiguous();
  TORCH_CHECK(c.scalar_type() == at::kFloat && s.scalar_type() == at::kFloat && c.dim() == 4 && c.sizes() == s.sizes()
              && (c.size(0) == 1 || c.size(0) == B) && c.size(1) == 1 && c.size(2) == T && c.size(3) == h,
              "rotary: cos and sin must be fp32 (1 or B, 1, T, d/2)");
  auto out = at::empty({B, H, T, 2 * h}, x.options());
  const int64_t sB = x.stride(0), sH = x.stride(1), sT = x.stride(2), cB = c.size(0) == 1 ? 0 : T * h;
  const float* cp = c.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const float sg = static_cast<float>(sign);
  auto run = [&](auto tag) {
    using T_ = decltype(tag);
    const T_* xp = x.data_ptr<T_>();
    T_* op = out.data_ptr<T_>();
    at::parallel_for(0, B * H, 4, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; i++) {  // head hh of sequence b: its T rows
        const int64_t hh = i % H, b = i / H;
        rotate_head(xp + b * sB + hh * sH, sT, cp + b * cB, sp + b * cB, op + i * T * 2 * h, T, h, sg);
      }
    });
  };
  by_dtype(x.scalar_type(), run);
  return out;
}

// The autograd node in C++: no Python per call. Saves the tables alone (the backward is the rotation back).
struct RotaryFn : public torch::autograd::Function<RotaryFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rotate(x, cos, sin, 1.0);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {rotate(grads[0], saved[0], saved[1], -1.0), at::Tensor(), at::Tensor()};
  }
};

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return RotaryFn::apply(x, cos, sin);
}

// torch.ops.ablations_rotary.<name> once the library is loaded (modules/kernels/rotary.py)
TORCH_LIBRARY(ablations_rotary, m) {
  m.def("rotate", &rotate);
  m.def("rotary", &rotary);
}
