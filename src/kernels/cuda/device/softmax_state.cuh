// The online-softmax state of attention decode, in base 2: logits arrive pre-scaled by log2(e),
// so every exponential is one exp2 (a single MUFU.EX2 on the device). States over disjoint token
// sets merge associatively, which lets a kernel fold tokens one by one, combine its warps' partial
// results, and combine the split-KV partitions in any order.
#pragma once

#include "kernels/cuda/device/host_device.h"

#ifdef __CUDACC_RTC__
#include <cuda/std/cmath>
#else
#include <cmath>
#endif

namespace flashinfer::kernels::cuda::dev {

namespace softmax_detail {

// exp2f / log2f / fmaxf on the device; the float overloads of std:: on the host, where the C
// names are not guaranteed to be in scope.
FLASHINFER_HD float exp2_(float x) {
#ifdef __CUDA_ARCH__
  return exp2f(x);
#else
  return std::exp2(x);
#endif
}
FLASHINFER_HD float log2_(float x) {
#ifdef __CUDA_ARCH__
  return log2f(x);
#else
  return std::log2(x);
#endif
}
FLASHINFER_HD float max_(float a, float b) {
#ifdef __CUDA_ARCH__
  return fmaxf(a, b);
#else
  return std::fmax(a, b);
#endif
}

}  // namespace softmax_detail

#ifdef __CUDACC__
/// 2^x as upstream's attention kernels compute it: PTX ex2.approx.ftz.f32, one MUFU.EX2. exp2f is
/// the same instruction without .ftz, for which ptxas adds a compare and two predicated multiplies
/// around each call to keep results below 2^-126 subnormal; here they are 0. Equal bits for
/// every other x (inf, -inf -> 0 and NaN included). In attention such a probability (or rescale
/// factor) weighs a V row (or an O sum) below 2^-126 of the row's largest weight, 1: it moves a
/// result only where that term is not negligible, i.e. where every other term is 0 or tiny, or
/// |V| is near 2^100 or more.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// The online softmax's step for the two rows a thread holds of an m16 MMA fragment (rows gid and
/// gid + 8; warp-collective): given the rows' maxima over a new tile, `tmax`, when a row of the
/// warp has a new maximum, each row's running max m and sum l move to it and `rescale(r, factor)`
/// scales row r's output accumulators by the same 2^(m_old - m_new) (1 for a row with nothing
/// visible yet, avoiding -inf - -inf). When no row of the warp has one, every factor would be
/// exactly 1 (2^0, or the -inf case's 1), so skipping the step changes no bit; once a row's early
/// keys set its maximum it seldom moves, and the multiplies are the largest non-MMA item of a tile.
/// tmax must not be NaN (fmaxf drops NaN scores). The factors exist only inside the branch (the
/// FA2 kernel's 128-row head-dim-128 block spilled when they were computed before the vote).
template <class Rescale>
__device__ __forceinline__ void rescale_on_new_max(float (&m)[2], float (&l)[2],
                                                   const float (&tmax)[2], Rescale rescale) {
  if (__any_sync(0xffffffffu, tmax[0] > m[0] || tmax[1] > m[1])) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], tmax[r]);
      const float factor = m_new == -INFINITY ? 1.0f : exp2_ftz(m[r] - m_new);
      m[r] = m_new;
      l[r] *= factor;
      rescale(r, factor);
    }
  }
}
#endif

/// Merges (m1, d1) and (m2, d2): m = max(m1, m2), d = d1 * scale1 + d2 * scale2 with
/// scale_i = 2^(m_i - m); the caller scales its o vectors by the same factors. A state whose max
/// is -inf carries no weight: when both are, m - m would be NaN, so the scales are 0 and the
/// result is the empty state (m = -inf, d = 0). With one of them empty, the other's scale is
/// 2^0 = 1 exactly, so merging with the empty state is the identity, bit for bit.
FLASHINFER_HD void merge_state(float m1, float d1, float m2, float d2, float* scale1, float* scale2,
                               float* m, float* d) {
  const float mm = softmax_detail::max_(m1, m2);
  if (mm == -INFINITY) {
    *scale1 = 0.0f;
    *scale2 = 0.0f;
  } else {
    *scale1 = softmax_detail::exp2_(m1 - mm);
    *scale2 = softmax_detail::exp2_(m2 - mm);
  }
  *m = mm;
  *d = d1 * *scale1 + d2 * *scale2;
}

/// m: the running max of the logits (log2 units); d: sum of 2^(s - m); o: sum of 2^(s - m) * v,
/// not yet divided by d. One token (s, v) is the state {o = v, m = s, d = 1}.
template <int N>
struct SoftmaxState {
  float o[N];
  float m;
  float d;

  /// The empty state: no tokens.
  FLASHINFER_HD void init() {
    FLASHINFER_UNROLL
    for (int i = 0; i < N; ++i) o[i] = 0.0f;
    m = -INFINITY;
    d = 0.0f;
  }

  FLASHINFER_HD void merge(const float* o_other, float m_other, float d_other) {
    float s1, s2;
    merge_state(m, d, m_other, d_other, &s1, &s2, &m, &d);
    FLASHINFER_UNROLL
    for (int i = 0; i < N; ++i) o[i] = o[i] * s1 + o_other[i] * s2;
  }

  FLASHINFER_HD void merge(const SoftmaxState& other) { merge(other.o, other.m, other.d); }

  /// o /= d: the softmax-weighted mean of v. An empty state (d == 0) gets o = 0.
  FLASHINFER_HD void normalize() {
    if (d == 0.0f) {
      FLASHINFER_UNROLL
      for (int i = 0; i < N; ++i) o[i] = 0.0f;
      return;
    }
    const float inv = 1.0f / d;
    FLASHINFER_UNROLL
    for (int i = 0; i < N; ++i) o[i] *= inv;
  }

  /// log2 of the sum of 2^s over the tokens; -inf for the empty state.
  FLASHINFER_HD float lse() const { return d == 0.0f ? -INFINITY : m + softmax_detail::log2_(d); }
};

}  // namespace flashinfer::kernels::cuda::dev
