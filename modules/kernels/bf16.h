// Element conversions the CPU kernels share: fp32 and bf16 in, fp32 maths, out in the input's dtype. Written with
// bit operations and no branch, so loops that use them vectorise (c10::BFloat16's own conversions check for NaN).
#pragma once
#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <cstdint>
#include <cstring>

namespace ablations_kernels {

inline float to_f32(float v) { return v; }
inline float to_f32(c10::BFloat16 v) {  // bf16 -> fp32 is the bits shifted up
  const uint32_t u = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <typename T> inline T from_f32(float f);
template <> inline float from_f32<float>(float f) { return f; }
template <> inline c10::BFloat16 from_f32<c10::BFloat16>(float f) {  // round to nearest even (finite values)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return c10::BFloat16(static_cast<uint16_t>(u >> 16), c10::BFloat16::from_bits());
}

// The two dtypes the kernels take, and a call of f with a value of the element type as its tag: f(float()) or
// f(c10::BFloat16()), so one generic lambda serves both.
inline bool fp32_or_bf16(c10::ScalarType s) { return s == c10::kFloat || s == c10::kBFloat16; }
template <typename F> inline void by_dtype(c10::ScalarType s, F&& f) {
  if (s == c10::kFloat) f(float()); else f(c10::BFloat16());
}

}  // namespace ablations_kernels
