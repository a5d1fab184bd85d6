// Private: element and row conversions shared by the CPU kernels of the norm, activation and
// RoPE ops. Rows are converted to fp32 scratch buffers and back; the unit-stride case is a
// separate loop so the compiler can vectorize the (branch-free) format conversions.
#pragma once

#include <cstdint>

#include "flashinfer/float_formats.h"

namespace flashinfer::kernels::cpu::rowio {

inline float load(const float* p) { return *p; }
inline float load(const Half* p) { return p->to_float(); }
inline float load(const BFloat16* p) { return p->to_float(); }
inline void store(float* p, float v) { *p = v; }
inline void store(Half* p, float v) { *p = Half::from_float(v); }
inline void store(BFloat16* p, float v) { *p = BFloat16::from_float(v); }

/// dst[i] = float(x[i * stride]) for i < n.
template <class T>
inline void load_row(const T* x, int64_t stride, int64_t n, float* __restrict dst) {
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) dst[i] = load(x + i);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = load(x + i * stride);
  }
}

/// y[i * stride] = T(src[i]) (round to nearest even) for i < n.
template <class T>
inline void store_row(T* y, int64_t stride, int64_t n, const float* __restrict src) {
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) store(y + i, src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) store(y + i * stride, src[i]);
  }
}

/// Sum of squares with eight independent partial sums: vectorizable without reassociation
/// flags, and more accurate than one running sum for long rows.
inline float sum_squares(const float* __restrict v, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += v[i + j] * v[i + j];
  }
  for (; i < n; ++i) acc[0] += v[i] * v[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/// Plain sum, same scheme as sum_squares.
inline float sum(const float* __restrict v, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += v[i + j];
  }
  for (; i < n; ++i) acc[0] += v[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace flashinfer::kernels::cpu::rowio
