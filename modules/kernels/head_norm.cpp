// QK-norm's LayerNorm on CPU, eager: each head's d numbers normalised where they lie in the fused q/k/v
// projection's output (a strided head view), written as contiguous heads, one pass per row each way; fp32 or bf16
// in and out, fp32 statistics and weights. Built on first use by modules/kernels/head_norm.py, which says when.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "bf16.h"

namespace {

constexpr int64_t kMaxWidth = 1024;  // the widest head it takes (layernorm.py sends wider ones to F.layer_norm)
constexpr int kRows = 4;             // rows in flight at once (below)

using namespace ablations_kernels;  // bf16.h's conversions

// Why rows in flight: a head's row is short (d = 32 in small-cpu), so a row's statistics are one chain of dependent
// adds, its horizontal sum, then a division and a square root; one row at a time, every step waited for the one
// before (0.5 ms forward and 1.0 ms backward per (32, 4, 64, 32) fp32 tensor on an AVX2 EPYC, ~10x a copy of it).
// kRows rows advance together, each in its own 8-lane accumulator, so the CPU overlaps their chains.
typedef float f32x8 __attribute__((vector_size(32)));  // gcc/clang vectors: one AVX register, two NEON ones
inline f32x8 load8(const float* p) { f32x8 v; std::memcpy(&v, p, sizeof v); return v; }
typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

// The sum of v's eight lanes, ((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7)): its two 128-bit halves added, then
// neighbours within the half, then the pairs (Zen 1 splits a shuffle across halves into 8 micro-ops)
inline float lanes_total(f32x8 v) {
  f32x4 lo, hi;
  std::memcpy(&lo, &v, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
  f32x4 s = lo + hi;
#if defined(__clang__)
  s += __builtin_shufflevector(s, s, 1, 0, 3, 2);
  s += __builtin_shufflevector(s, s, 2, 3, 0, 1);
#else
  s += __builtin_shuffle(s, i32x4{1, 0, 3, 2});
  s += __builtin_shuffle(s, i32x4{2, 3, 0, 1});
#endif
  return s[0];
}

// A row as fp32: fp32 rows are read where they lie, bf16 rows widened into `buf`
template <typename T>
inline const float* as_f32(const T* __restrict__ row, float* __restrict__ buf, int64_t d) {
  if constexpr (std::is_same_v<T, float>) {
    return row;
  } else {
    #pragma omp simd
    for (int64_t j = 0; j < d; j++) buf[j] = to_f32(row[j]);
    return buf;
  }
}

// Per row of x[0..N): sum over j of f(x[k][j]), the first d8 (a multiple of 8) eight lanes at a time
template <int N, typename F>
inline void row_sums(const float* const* x, int64_t d, F f, float* out) {
  const int64_t d8 = d & ~int64_t(7);
  f32x8 acc[N];
  for (int k = 0; k < N; k++) acc[k] = f32x8{};
  for (int64_t j = 0; j < d8; j += 8)
    for (int k = 0; k < N; k++) acc[k] += f(k, load8(x[k] + j));
  for (int k = 0; k < N; k++) {
    float s = lanes_total(acc[k]);
    for (int64_t j = d8; j < d; j++) s += f(k, x[k][j]);
    out[k] = s;
  }
}

// N rows (sx apart; y's d apart): per row mean and 1/sqrt(var + eps), y = (x - mean) rstd w + b
template <int N, typename T>
inline void forward_rows(const T* __restrict__ x, int64_t sx, const float* __restrict__ w, const float* __restrict__ b,
                         T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t d, float eps,
                         float (*buf)[kMaxWidth]) {
  const float* xf[N];
  float m[N], v[N];
  for (int k = 0; k < N; k++) xf[k] = as_f32(x + k * sx, buf[k], d);
  row_sums<N>(xf, d, [](int, auto e) { return e; }, m);
  for (int k = 0; k < N; k++) m[k] /= d;
  row_sums<N>(xf, d, [&](int k, auto e) { const auto c = e - m[k]; return c * c; }, v);
  for (int k = 0; k < N; k++) {
    const float r = 1.f / std::sqrt(v[k] / d + eps), mk = m[k];
    const float* __restrict__ xk = xf[k];
    T* __restrict__ yk = y + k * d;
    #pragma omp simd
    for (int64_t j = 0; j < d; j++) yk[j] = from_f32<T>((xk[j] - mk) * r * w[j] + b[j]);
    mean[k] = mk;
    rstd[k] = r;
  }
}

// One head (T rows of d numbers, rows sx apart), kRows rows at a time, any width. A function of its own per head,
// never inlined into the parallel_for lambda (gelu_tanh.cpp: restrict pointers lost there, 9x slower).
template <typename T>
__attribute__((noinline)) void forward_head_any(const T* __restrict__ x, int64_t sx, const float* __restrict__ w,
                                            const float* __restrict__ b, T* __restrict__ y, float* __restrict__ mean,
                                            float* __restrict__ rstd, int64_t rows, int64_t d, float eps) {
  float buf[kRows][kMaxWidth];  // bf16 rows widened
  int64_t t = 0;
  for (; t + kRows <= rows; t += kRows)
    forward_rows<kRows>(x + t * sx, sx, w, b, y + t * d, mean + t, rstd + t, d, eps, buf);
  for (; t < rows; t++) forward_rows<1>(x + t * sx, sx, w, b, y + t * d, mean + t, rstd + t, d, eps, buf);
}

// One row's dx = r (dy w - a - xhat c) and its part of dw (aw) and db (ab), given a = mean(dy w) and
// c = mean(dy w xhat). Not inlined: inlined, its pointers came from backward_rows' arrays of them and gcc left the
// loop scalar ("evolution of base is not affine"), 3x slower.
template <typename T>
__attribute__((noinline)) void backward_row(const float* __restrict__ dy, const float* __restrict__ x,
                                            const float* __restrict__ w, float m, float r, float a, float c,
                                            T* __restrict__ dx, float* __restrict__ aw, float* __restrict__ ab,
                                            int64_t d) {
  #pragma omp simd
  for (int64_t j = 0; j < d; j++) {
    const float xh = (x[j] - m) * r;
    dx[j] = from_f32<T>(r * (dy[j] * w[j] - a - xh * c));
    aw[j] += dy[j] * xh;
    ab[j] += dy[j];
  }
}

// N rows: dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, xhat = (x - mean) rstd; aw += dy xhat, ab += dy
// (this thread's part of dw and db). dy rows sdy apart, x rows sx apart, dx rows sdx apart.
template <int N, typename T>
inline void backward_rows(const T* __restrict__ dy, int64_t sdy, const T* __restrict__ x, int64_t sx,
                          const float* __restrict__ w, const float* __restrict__ mean, const float* __restrict__ rstd,
                          T* __restrict__ dx, int64_t sdx, float* __restrict__ aw, float* __restrict__ ab, int64_t d,
                          float (*buf)[kMaxWidth]) {
  const float* gf[N];
  const float* xf[N];
  float s1[N], s2[N];
  for (int k = 0; k < N; k++) {
    gf[k] = as_f32(dy + k * sdy, buf[2 * k], d);
    xf[k] = as_f32(x + k * sx, buf[2 * k + 1], d);
  }
  // per row the sums of g and of g xhat, two accumulators each (w's lanes loaded once for the N rows)
  const int64_t d8 = d & ~int64_t(7);
  f32x8 a1[N], a2[N];
  for (int k = 0; k < N; k++) a1[k] = a2[k] = f32x8{};
  for (int64_t j = 0; j < d8; j += 8) {
    const f32x8 wj = load8(w + j);
    for (int k = 0; k < N; k++) {
      const f32x8 g = load8(gf[k] + j) * wj, xh = (load8(xf[k] + j) - mean[k]) * rstd[k];
      a1[k] += g;
      a2[k] += g * xh;
    }
  }
  for (int k = 0; k < N; k++) {
    s1[k] = lanes_total(a1[k]);
    s2[k] = lanes_total(a2[k]);
    for (int64_t j = d8; j < d; j++) {
      const float g = gf[k][j] * w[j];
      s1[k] += g;
      s2[k] += g * (xf[k][j] - mean[k]) * rstd[k];
    }
  }
  for (int k = 0; k < N; k++)
    backward_row(gf[k], xf[k], w, mean[k], rstd[k], s1[k] / d, s2[k] / d, dx + k * sdx, aw, ab, d);
}

template <typename T>
__attribute__((noinline)) void backward_head_any(const T* __restrict__ dy, int64_t sdy, const T* __restrict__ x,
                                             int64_t sx, const float* __restrict__ w, const float* __restrict__ mean,
                                             const float* __restrict__ rstd, T* __restrict__ dx, int64_t sdx,
                                             float* __restrict__ aw, float* __restrict__ ab, int64_t rows, int64_t d) {
  float buf[2 * kRows][kMaxWidth];  // bf16 rows of dy and x widened
  int64_t t = 0;
  for (; t + kRows <= rows; t += kRows)
    backward_rows<kRows>(dy + t * sdy, sdy, x + t * sx, sx, w, mean + t, rstd + t, dx + t * sdx, sdx, aw, ab, d, buf);
  for (; t < rows; t++)
    backward_rows<1>(dy + t * sdy, sdy, x + t * sx, sx, w, mean + t, rstd + t, dx + t * sdx, sdx, aw, ab, d, buf);
}

// ---- Widths known when compiled: 32 both ways (small-cpu's heads), 64 backward (GPT-2's) ----
// The loops above run over a width known only at run time: for d = 32 each is four trips with its own set-up and
// tail, the vectors of a row spilled and summed lane by lane in scalars. With D a template parameter a row is D / 8
// vectors held in registers, read once, summed across lanes by lanes_total (no scalar per lane), and the code of
// N rows interleaved, so the core overlaps one row's chain (sums, division, square root) with the others'. Measured
// on an AVX2-only EPYC (Zen 1) between a step's other work, fp32, per call (docs/bench.md, "QK-norm's eager kernel:
// widths known when compiled"): D = 32 forward x0.70-0.77 and backward x0.48-0.54 of the loops' time, D = 64 backward
// x0.74-0.80; D = 64 forward (x1.05-1.13) and D = 128 (forward x1.2-1.5, backward x0.95-1.17) were no faster, so they
// keep the loops.
constexpr int kForwardRows = 4;   // rows in flight at D = 32: the best of 2, 4 and 8
template <int D> constexpr int kBackwardRows = 64 / D;  // 2 at D = 32 (of 2 and 4), 1 at 64: a backward row holds
                                                        // four vectors per 8 numbers, and more spill from 16 registers

typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef uint16_t u16x8 __attribute__((vector_size(16)));

// v[0] + ... + v[V-1], pairwise
template <int V>
inline f32x8 vectors_sum(const f32x8* v) {
  if constexpr (V == 1) return v[0];
  else return vectors_sum<V / 2>(v) + vectors_sum<V - V / 2>(v + V / 2);
}

// Eight numbers of a row as fp32 lanes, and back in the row's dtype (bf16: bf16.h's rounding, eight lanes at once)
inline f32x8 load_row8(const float* p) { return load8(p); }
inline f32x8 load_row8(const c10::BFloat16* p) {
  u16x8 h;
  std::memcpy(&h, p, sizeof h);
  const u32x8 u = __builtin_convertvector(h, u32x8) << 16;
  f32x8 f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline void store_row8(float* p, f32x8 v) { std::memcpy(p, &v, sizeof v); }
inline void store_row8(c10::BFloat16* p, f32x8 v) {
  u32x8 u;
  std::memcpy(&u, &v, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  const u16x8 h = __builtin_convertvector(u >> 16, u16x8);
  std::memcpy(p, &h, sizeof h);
}

// N rows of D numbers (sx apart; y's D apart): mean, 1/sqrt(var + eps), y = (x - mean) rstd w + b; wv, bv: w, b
template <int N, int D, typename T>
inline void forward_rows_fixed(const T* __restrict__ x, int64_t sx, const f32x8* wv, const f32x8* bv,
                               T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, float eps) {
  constexpr int V = D / 8;
  f32x8 c[N][V], sq[N][V];  // c: the row, then the row less its mean
  float m[N], r[N];
  for (int k = 0; k < N; k++)
    for (int v = 0; v < V; v++) c[k][v] = load_row8(x + k * sx + 8 * v);
  for (int k = 0; k < N; k++) m[k] = lanes_total(vectors_sum<V>(c[k])) / D;
  for (int k = 0; k < N; k++)
    for (int v = 0; v < V; v++) c[k][v] -= m[k], sq[k][v] = c[k][v] * c[k][v];
  for (int k = 0; k < N; k++) r[k] = 1.f / std::sqrt(lanes_total(vectors_sum<V>(sq[k])) / D + eps);
  for (int k = 0; k < N; k++)
    for (int v = 0; v < V; v++) store_row8(y + k * D + 8 * v, c[k][v] * r[k] * wv[v] + bv[v]);
  for (int k = 0; k < N; k++) mean[k] = m[k], rstd[k] = r[k];
}

template <int D, typename T>
__attribute__((noinline)) void forward_head_fixed(const T* __restrict__ x, int64_t sx, const float* __restrict__ w,
                                                  const float* __restrict__ b, T* __restrict__ y,
                                                  float* __restrict__ mean, float* __restrict__ rstd, int64_t rows,
                                                  float eps) {
  constexpr int V = D / 8;
  f32x8 wv[V], bv[V];
  for (int v = 0; v < V; v++) wv[v] = load8(w + 8 * v), bv[v] = load8(b + 8 * v);
  int64_t t = 0;
  for (; t + kForwardRows <= rows; t += kForwardRows)
    forward_rows_fixed<kForwardRows, D>(x + t * sx, sx, wv, bv, y + t * D, mean + t, rstd + t, eps);
  for (; t < rows; t++) forward_rows_fixed<1, D>(x + t * sx, sx, wv, bv, y + t * D, mean + t, rstd + t, eps);
}

// N rows: dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, xhat = (x - mean) rstd; sw += dy xhat, sb += dy
// (the head's part of dw and db, in registers until its last row)
template <int N, int D, typename T>
inline void backward_rows_fixed(const T* __restrict__ dy, int64_t sdy, const T* __restrict__ x, int64_t sx,
                                const f32x8* wv, const float* __restrict__ mean, const float* __restrict__ rstd,
                                T* __restrict__ dx, int64_t sdx, f32x8* sw, f32x8* sb) {
  constexpr int V = D / 8;
  f32x8 e[N][V], xh[N][V], g[N][V], gx[N][V];  // e: dy
  float a[N], c[N];
  for (int k = 0; k < N; k++)
    for (int v = 0; v < V; v++) {
      e[k][v] = load_row8(dy + k * sdy + 8 * v);
      xh[k][v] = (load_row8(x + k * sx + 8 * v) - mean[k]) * rstd[k];
      g[k][v] = e[k][v] * wv[v];
      gx[k][v] = g[k][v] * xh[k][v];
    }
  for (int k = 0; k < N; k++)
    a[k] = lanes_total(vectors_sum<V>(g[k])) / D, c[k] = lanes_total(vectors_sum<V>(gx[k])) / D;
  for (int k = 0; k < N; k++)
    for (int v = 0; v < V; v++) {
      store_row8(dx + k * sdx + 8 * v, rstd[k] * (g[k][v] - a[k] - xh[k][v] * c[k]));
      sw[v] += e[k][v] * xh[k][v];
      sb[v] += e[k][v];
    }
}

template <int D, typename T>
__attribute__((noinline)) void backward_head_fixed(const T* __restrict__ dy, int64_t sdy, const T* __restrict__ x,
                                                   int64_t sx, const float* __restrict__ w,
                                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                                   T* __restrict__ dx, int64_t sdx, float* __restrict__ aw,
                                                   float* __restrict__ ab, int64_t rows) {
  constexpr int V = D / 8;
  f32x8 wv[V], sw[V], sb[V];
  for (int v = 0; v < V; v++) wv[v] = load8(w + 8 * v), sw[v] = sb[v] = f32x8{};
  int64_t t = 0;
  for (; t + kBackwardRows<D> <= rows; t += kBackwardRows<D>)
    backward_rows_fixed<kBackwardRows<D>, D>(dy + t * sdy, sdy, x + t * sx, sx, wv, mean + t, rstd + t, dx + t * sdx,
                                          sdx, sw, sb);
  for (; t < rows; t++)
    backward_rows_fixed<1, D>(dy + t * sdy, sdy, x + t * sx, sx, wv, mean + t, rstd + t, dx + t * sdx, sdx, sw, sb);
  for (int v = 0; v < V; v++) {
    store_row8(aw + 8 * v, load8(aw + 8 * v) + sw[v]);
    store_row8(ab + 8 * v, load8(ab + 8 * v) + sb[v]);
  }
}

// One head, by width: a compiled width's code, else the loops
template <typename T>
void forward_head(const T* x, int64_t sx, const float* w, const float* b, T* y, float* mean, float* rstd,
                  int64_t rows, int64_t d, float eps) {
  switch (d) {
    case 32: return forward_head_fixed<32>(x, sx, w, b, y, mean, rstd, rows, eps);
    default: return forward_head_any(x, sx, w, b, y, mean, rstd, rows, d, eps);
  }
}

template <typename T>
void backward_head(const T* dy, int64_t sdy, const T* x, int64_t sx, const float* w, const float* mean,
                   const float* rstd, T* dx, int64_t sdx, float* aw, float* ab, int64_t rows, int64_t d) {
  switch (d) {
    case 32: return backward_head_fixed<32>(dy, sdy, x, sx, w, mean, rstd, dx, sdx, aw, ab, rows);
    case 64: return backward_head_fixed<64>(dy, sdy, x, sx, w, mean, rstd, dx, sdx, aw, ab, rows);
    default: return backward_head_any(dy, sdy, x, sx, w, mean, rstd, dx, sdx, aw, ab, rows, d);
  }
}

void check(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.device().is_cpu() && fp32_or_bf16(x.scalar_type()) &&
              x.dim() == 4 && x.stride(3) == 1 && x.size(3) <= kMaxWidth, "head_norm: x must be a CPU (B, H, T, d) "
              "fp32 or bf16 tensor with unit stride in d, d <= 1024");
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.numel() == x.size(3), "head_norm: w must be fp32 of x's last size");
}

// A dense tensor of x's sizes whose dims lie in memory in the order of x's strides: dx of a head view of the fused
// projection's output is laid out as that output is (rows of T), so the copy into the projection's gradient reads
// it in order
at::Tensor dense_like(const at::Tensor& x) {
  std::vector<int64_t> order = {0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) { return x.stride(p) > x.stride(q); });
  std::vector<int64_t> sizes, inverse(4);
  for (int64_t k = 0; k < 4; k++) {
    sizes.push_back(x.size(order[k]));
    inverse[order[k]] = k;
  }
  return at::empty(sizes, x.options()).permute(inverse);
}

}  // namespace

// x (B, H, T, d) any strides, unit in d; w, b (d,) fp32 -> y (B, H, T, d) contiguous, mean, rstd (B * H * T,) fp32
std::vector<at::Tensor> head_norm_forward(const at::Tensor& x, const at::Tensor& w_in,
                                          const std::optional<at::Tensor>& b_in, double eps) {
  check(x, w_in);
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), d = x.size(3);
  auto y = at::empty({B, H, T, d}, x.options());
  auto mean = at::empty({B * H * T}, x.options().dtype(at::kFloat));
  auto rstd = at::empty({B * H * T}, x.options().dtype(at::kFloat));
  const auto w = w_in.contiguous();
  const auto b = b_in.has_value() && b_in->defined() ? b_in->to(at::kFloat).contiguous() : at::zeros({d}, w.options());
  const float* wp = w.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  float* mp = mean.data_ptr<float>();
  float* rp = rstd.data_ptr<float>();
  auto run = [&](auto tag) {
    using T_ = decltype(tag);
    const T_* xp = x.data_ptr<T_>();
    T_* yp = y.data_ptr<T_>();
    at::parallel_for(0, B * H, 4, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; i++) {  // head hh of sequence bb: its T rows
        const int64_t hh = i % H, bb = i / H;
        forward_head(xp + bb * x.stride(0) + hh * x.stride(1), x.stride(2), wp, bp, yp + i * T * d, mp + i * T,
                     rp + i * T, T, d, static_cast<float>(eps));
      }
    });
  };
  by_dtype(x.scalar_type(), run);
  return {y, mean, rstd};
}

// dy (B, H, T, d) any strides, unit in d -> dx (x's sizes, dense, x's dim order), dw, db (d,) fp32: summed per
// thread into its own rows of `partial`, then over the threads
std::vector<at::Tensor> head_norm_backward(const at::Tensor& dy_in, const at::Tensor& x, const at::Tensor& mean,
                                           const at::Tensor& rstd, const at::Tensor& w_in) {
  check(x, w_in);
  auto dy = dy_in.to(x.scalar_type());
  if (dy.stride(3) != 1) dy = dy.contiguous();
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), d = x.size(3);
  auto dx = dense_like(x);
  auto partial = at::zeros({at::get_num_threads(), 2, d}, w_in.options());
  const auto w = w_in.contiguous();
  const float* wp = w.data_ptr<float>();
  const float* mp = mean.data_ptr<float>();
  const float* rp = rstd.data_ptr<float>();
  float* pp = partial.data_ptr<float>();
  auto run = [&](auto tag) {
    using T_ = decltype(tag);
    const T_* xp = x.data_ptr<T_>();
    const T_* gp = dy.data_ptr<T_>();
    T_* dp = dx.data_ptr<T_>();
    at::parallel_for(0, B * H, 4, [&](int64_t begin, int64_t end) {
      float* aw = pp + at::get_thread_num() * 2 * d;
      for (int64_t i = begin; i < end; i++) {
        const int64_t hh = i % H, bb = i / H;
        backward_head(gp + bb * dy.stride(0) + hh * dy.stride(1), dy.stride(2),
                      xp + bb * x.stride(0) + hh * x.stride(1), x.stride(2), wp, mp + i * T, rp + i * T,
                      dp + bb * dx.stride(0) + hh * dx.stride(1), dx.stride(2), aw, aw + d, T, d);
      }
    });
  };
  by_dtype(x.scalar_type(), run);
  return {dx, partial.select(1, 0).sum(0), partial.select(1, 1).sum(0)};
}

// The autograd node in C++ (as LayerNorm's is): no Python per call
struct HeadNormFn : public torch::autograd::Function<HeadNormFn> {
  // b: the bias, or an empty tensor (autograd's apply takes no undefined tensor)
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& b, bool has_bias, double eps) {
    auto out = head_norm_forward(x, w, has_bias ? std::optional<at::Tensor>(b) : std::nullopt, eps);
    ctx->save_for_backward({x, out[1], out[2], w});
    ctx->saved_data["bias"] = has_bias;
    return out[0];
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto s = ctx->get_saved_variables();  // x, mean, rstd, w
    auto out = head_norm_backward(grads[0], s[0], s[1], s[2], s[3]);
    return {out[0], out[1], ctx->saved_data["bias"].toBool() ? out[2] : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor head_norm(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, double eps) {
  const bool has_bias = b.has_value() && b->defined();
  return HeadNormFn::apply(x, w, has_bias ? *b : at::empty({0}, w.options()), has_bias, eps);
}

// torch.ops.ablations_head_norm.<name> once the library is loaded (modules/kernels/head_norm.py)
TORCH_LIBRARY(ablations_head_norm, m) {
  m.def("forward", &head_norm_forward);
  m.def("backward", &head_norm_backward);
  m.def("head_norm", &head_norm);
}
