// Private: the arithmetic of the chunked (WY) form of chunk_gated_delta_rule, shared by the CUDA
// chunked kernel (kernels/cuda/gdn_chunk_cuda.cu) and the CPU tests that check its algebra, masks
// and rounding points without a GPU (tests/util/gdn_chunk_emulation.h). The equations and their
// derivation from the token recurrence: docs/upstream-facts/gdn_chunked_prefill.md, section 4.
//
// A chunk holds up to 64 tokens. With G_t the chunk-local inclusive sum of log|alpha_r|,
// Gamma_{s,t} = prod_{r=t+1..s} alpha_r (s >= t) is exp(G_s - G_t), never a quotient of running
// products (64 gates of 0.25 underflow fp32); a zero gate is counted instead of taking log 0, and
// negative gates by parity, so the chunked form multiplies by exactly the factors the recurrence
// does: 0 where a zero gate lies in (t, s], the sign of the negative ones.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels::gdn_chunk {

inline constexpr int kChunk = 64;  // tokens a chunk (upstream's chunk size)
inline constexpr int kSub = 16;    // the inverse's diagonal blocks
inline constexpr int kSubs = kChunk / kSub;

template <class T>
FLASHINFER_HD T fma_t(T a, T b, T c) {
  if constexpr (sizeof(T) == 4) {
    return fmaf(a, b, c);
  } else {
    return fma(a, b, c);
  }
}

/// A gate's share of the running sums: log|alpha| (0 for a zero gate), and the zero and
/// negative counts packed as zeros | negatives << 8 (at most 64 of each in a chunk).
template <class T>
struct GateTerm {
  T log_abs;
  int counts;
};
template <class T>
FLASHINFER_HD GateTerm<T> gate_term(T alpha) {
  if (alpha == T(0)) return {T(0), 1};
  const T a = alpha < T(0) ? -alpha : alpha;
  if constexpr (sizeof(T) == 4) {
    return {logf(a), alpha < T(0) ? 1 << 8 : 0};
  } else {
    return {log(a), alpha < T(0) ? 1 << 8 : 0};
  }
}

/// Gamma_{s,t} (s >= t) from the inclusive sums at s and t (G and the packed counts): 0 when a
/// zero gate lies in (t, s], else exp(G_s - G_t) with the sign of the negative gates there. With
/// G_t = 0 and counts 0 (the chunk's start) it is gamma_s, the decay from the chunk's entry.
template <class T>
FLASHINFER_HD T decay_ratio(T Gs, int cs, T Gt, int ct) {
  if ((cs & 0xff) != (ct & 0xff)) return T(0);
  T r;
  if constexpr (sizeof(T) == 4) {
    r = expf(Gs - Gt);
  } else {
    r = exp(Gs - Gt);
  }
  return (((cs >> 8) - (ct >> 8)) & 1) != 0 ? -r : r;
}

/// L_{s,t} = beta_s Gamma_{s,t} (k_s . k_t) for s > t inside the chunk (both < C), else 0.
template <class T>
FLASHINFER_HD T kkt_entry(int s, int t, int C, T beta_s, T ratio, T dot) {
  return (s > t && s < C && t < C) ? beta_s * (ratio * dot) : T(0);
}

/// M'_{s,t} = scale Gamma_{s,t} (q_s . k_t) for s >= t inside the chunk (the causal mask with
/// its diagonal), else 0.
template <class T>
FLASHINFER_HD T qkt_entry(int s, int t, int C, T scale, T ratio, T dot) {
  return (s >= t && s < C && t < C) ? scale * (ratio * dot) : T(0);
}

/// Column c of the inverse of diagonal block b (16 x 16) of the unit lower-triangular I + L, by
/// forward substitution: x[i] = X[16b + i][16b + c]. L row-major with leading dimension ld; only
/// the block's strictly lower entries are read. Rows above c come out 0, row c 1.
template <class T>
FLASHINFER_HD void inverse_block_column(const T* L, int ld, int b, int c, T (&x)[kSub]) {
  const T* Lb = L + (kSub * b) * ld + kSub * b;
  FLASHINFER_UNROLL
  for (int i = 0; i < kSub; ++i) {
    T acc = i == c ? T(1) : T(0);
    FLASHINFER_UNROLL
    for (int m = 0; m < i; ++m) acc = fma_t(-Lb[i * ld + m], x[m], acc);
    x[i] = acc;
  }
}

/// Four consecutive values at p (16-byte aligned on the device, where they are one load).
template <class T>
FLASHINFER_HD void load4(const T* p, T (&v)[4]) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same_v<T, float>) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    for (int q = 0; q < 4; ++q) v[q] = p[q];
  }
#else
  for (int q = 0; q < 4; ++q) v[q] = p[q];
#endif
}

/// The block merge, first half: W = sum_{m=j}^{i-1} L_{i,m} X_{m,j} (16 x 16 blocks, i > j),
/// row r, columns c0..c0 + 3 (c0 a multiple of 4): each entry's sum in m, p order, the four
/// sharing each L load. X's blocks X_{m,j} with m - j < i - j must be final.
template <class T>
FLASHINFER_HD void merge_sum4(const T* L, const T* X, int ld, int i, int j, int r, int c0,
                              T (&out)[4]) {
  T acc[4] = {T(0), T(0), T(0), T(0)};
  for (int m = j; m < i; ++m) {
    const T* l = L + (kSub * i + r) * ld + kSub * m;
    const T* x = X + (kSub * m) * ld + kSub * j + c0;
    // Not unrolled in full: 16 loads of 16 bytes in flight would cost registers the state holds.
    for (int p = 0; p < kSub; ++p) {
      T xv[4];
      load4(x + p * ld, xv);
      const T a = l[p];
      FLASHINFER_UNROLL
      for (int q = 0; q < 4; ++q) acc[q] = fma_t(a, xv[q], acc[q]);
    }
  }
  for (int q = 0; q < 4; ++q) out[q] = acc[q];
}

/// Second half: X_{i,j} = -X_{i,i} W, row r, columns c0..c0 + 3 (W row-major 16 x 16; X_{i,i}
/// lower triangular, so p runs to r).
template <class T>
FLASHINFER_HD void merge_block4(const T* X, int ld, const T* W, int i, int r, int c0, T (&out)[4]) {
  const T* x = X + (kSub * i + r) * ld + kSub * i;
  T acc[4] = {T(0), T(0), T(0), T(0)};
  for (int p = 0; p <= r; ++p) {
    T w[4];
    load4(W + p * kSub + c0, w);
    const T a = x[p];
    FLASHINFER_UNROLL
    for (int q = 0; q < 4; ++q) acc[q] = fma_t(a, w[q], acc[q]);
  }
  for (int q = 0; q < 4; ++q) out[q] = -acc[q];
}

/// The merges' schedule: level d (1..3) has 4 - d blocks (i, j = i - d); a level needs the ones
/// before it. Block e of a level: j = e, i = e + d; a block is 64 quads (16 rows x 4 groups of
/// 4 columns).
FLASHINFER_HD constexpr int merge_blocks(int d) { return kSubs - d; }

}  // namespace flashinfer::kernels::gdn_chunk
