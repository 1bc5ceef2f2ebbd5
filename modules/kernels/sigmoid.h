// The sigmoid the CPU kernels share (GELU's tanh form is x sigmoid(2u); SiLU is x sigmoid(x)), written so that
// loops calling it vectorise: no branch, no libm call (with -fno-trapping-math, modules/kernels/build.py: without it
// gcc 12 kept its clamp as jumps and those loops ran scalar on an AVX2-only EPYC).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace ablations_kernels {

// GELU's tanh form as a sigmoid: 0.5 (1 + tanh u) = sigmoid(2u) = sigmoid(x (kS1 + kS3 x^2))
constexpr float kS1 = 1.5957691216057308f;   // 2 sqrt(2/pi)
constexpr float kS3 = 0.07135481627260025f;  // 0.044715 * kS1

// The two halves of an exponential for v <= 0, shared by exp_neg here and DyT's exp and expm1 (dyt.cpp).
// v = n ln2 + r with |r| <= ln2/2; returns n and sets r. v is clamped to [-104, 0]: exp(-104) is below float's
// smallest denormal. ln 2 is subtracted in two parts, so r stays exact.
inline float reduce_ln2(float v, float& r) {
  v = v < -104.f ? -104.f : (v > 0.f ? 0.f : v);
  const float n = std::nearbyint(v * 1.4426950408889634f);
  r = (v - n * 0.693145751953125f) - n * 1.4286067653e-06f;
  return n;
}

// p 2^n for n in [-150, 0], the power written into exponent bits as two halves, each a normal float, so results in
// the denormal range keep what precision they have
inline float times_pow2(float p, float n) {
  const int32_t ni = static_cast<int32_t>(n), half = ni >> 1;
  const int32_t bits_a = (half + 127) << 23, bits_b = (ni - half + 127) << 23;
  float a, b;
  std::memcpy(&a, &bits_a, 4);
  std::memcpy(&b, &bits_b, 4);
  return p * a * b;
}

// exp(v) for v <= 0: exp(r) by its Taylor series to r^6 (relative error < 2e-7, about one float ulp), times 2^n.
// Branch-free, so the loops calling it vectorise (libm's expf is a call per element).
inline float exp_neg(float v) {
  float r;
  const float n = reduce_ln2(v, r);
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  return times_pow2(p, n);
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

}  // namespace ablations_kernels
