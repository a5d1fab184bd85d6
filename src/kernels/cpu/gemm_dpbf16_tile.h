// Private: the register tiles shared by the CPU GEMM kernels that reproduce oneDNN's
// avx512_core_bf16 matmul sums (gemm_fp8_dpbf16_cpu.cpp, gemm_bf16_dpbf16_cpu.cpp). A tile is
// R <= kMr rows by 32 columns over one k block of kKc; operands come packed: fp32 with each k pair
// swapped (element 2p at position 2p + 1), or bf16 pairs in vdpbf16ps's layout. Both give the
// same fp32 sums where every product and partial sum is a normal number (the callers check).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/cpu_intrinsics.h"

#if FLASHINFER_CPU_X86_INTRINSICS && defined(__GNUC__)

#include <cpuid.h>

#define FI_DPBF16_TILE \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

namespace flashinfer::kernels::cpu::dpbf16 {

// Blocking: kMr rows by 32 columns (28 fp32 accumulators, two weight vectors: 30 of the 32
// registers), k in blocks of 128: a weight panel of one block is 8 KiB as bf16 pairs, 16 KiB as
// fp32 (stays in L1 over all row tiles), an activation tile 3.5 / 7 KiB.
inline constexpr int kMr = 14;
inline constexpr int64_t kKc = 128;

/// CPUID: AVX-512 F and AVX512_BF16 (leaf 7 subleaf 1, EAX bit 5).
inline bool cpu_has_avx512_bf16() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((b >> 16) & 1)) return false;  // AVX512F
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);
}

// The accumulators of a tile of R rows by 32 columns (row stride ldc): src's values, or +0 when
// src is null. Inlined, so that acc stays in registers.
template <int R>
FI_DPBF16_TILE __attribute__((always_inline)) inline void load_acc(__m512 (&acc)[R][2],
                                                                   const float* src, int64_t ldc) {
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r) {
    acc[r][0] = src ? _mm512_loadu_ps(src + r * ldc) : _mm512_setzero_ps();
    acc[r][1] = src ? _mm512_loadu_ps(src + r * ldc + 16) : _mm512_setzero_ps();
  }
}

// dst = acc, or dst + acc (one fp32 add) when add.
template <int R>
FI_DPBF16_TILE __attribute__((always_inline)) inline void store_acc(__m512 (&acc)[R][2], float* dst,
                                                                    int64_t ldc, bool add) {
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r) {
    float* d = dst + r * ldc;
    if (add) {
      acc[r][0] = _mm512_add_ps(_mm512_loadu_ps(d), acc[r][0]);
      acc[r][1] = _mm512_add_ps(_mm512_loadu_ps(d + 16), acc[r][1]);
    }
    _mm512_storeu_ps(d, acc[r][0]);
    _mm512_storeu_ps(d + 16, acc[r][1]);
  }
}

// One k block of a tile of R rows by 32 columns (row stride ldc) with vdpbf16ps: ap bf16
// [kMr][kKc] (pairs in order), bp [kKc / 2][32] dwords (dword (p, c): elements 2p (low half) and
// 2p + 1 of column c). acc = src (or +0 when src is null) plus the block's products; dst = acc, or
// dst + acc when add.
template <int R>
FI_DPBF16_TILE void micro(const uint16_t* ap, const uint32_t* bp, const float* src, float* dst,
                          int64_t ldc, bool add) {
  __m512 acc[R][2];
  load_acc<R>(acc, src, ldc);
  for (int64_t p = 0; p < kKc / 2; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * 32);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * 32 + 16);
#pragma GCC unroll 14
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, ap + r * kKc + 2 * p, 4);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  store_acc<R>(acc, dst, ldc, add);
}

// micro with fp32 operands, packed with swapped pairs (ap [kMr][kKc], bp [kKc][32]): the same sums
// with fp32 FMAs, whose rate is twice vdpbf16ps's multiply-adds on this CPU family.
template <int R>
FI_DPBF16_TILE void micro_f32(const float* ap, const float* bp, const float* src, float* dst,
                              int64_t ldc, bool add) {
  __m512 acc[R][2];
  load_acc<R>(acc, src, ldc);
  for (int64_t kk = 0; kk < kKc; ++kk) {
    const __m512 b0 = _mm512_loadu_ps(bp + kk * 32), b1 = _mm512_loadu_ps(bp + kk * 32 + 16);
#pragma GCC unroll 14
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(ap[r * kKc + kk]);
      acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  store_acc<R>(acc, dst, ldc, add);
}

using MicroFn = void (*)(const uint16_t*, const uint32_t*, const float*, float*, int64_t, bool);
using MicroF32Fn = void (*)(const float*, const float*, const float*, float*, int64_t, bool);

template <std::size_t... I>
constexpr std::array<MicroFn, sizeof...(I)> micro_table(std::index_sequence<I...>) {
  return {&micro<static_cast<int>(I) + 1>...};
}
template <std::size_t... I>
constexpr std::array<MicroF32Fn, sizeof...(I)> micro_f32_table(std::index_sequence<I...>) {
  return {&micro_f32<static_cast<int>(I) + 1>...};
}
/// kMicro[R - 1], kMicroF32[R - 1]: the tiles of R rows.
inline constexpr std::array<MicroFn, kMr> kMicro = micro_table(std::make_index_sequence<kMr>{});
inline constexpr std::array<MicroF32Fn, kMr> kMicroF32 =
    micro_f32_table(std::make_index_sequence<kMr>{});

/// An fp32 activation tile [kMr][kKc] (swapped pairs, values exact in bf16) as micro's bf16 tile
/// (the high halves, pairs in order).
inline void f32_tile_to_bf16(const float* src, uint16_t* dst) {
  for (int64_t x = 0; x < kMr * kKc; ++x) {
    uint32_t u;
    std::memcpy(&u, src + (x ^ 1), 4);
    dst[x] = static_cast<uint16_t>(u >> 16);
  }
}

}  // namespace flashinfer::kernels::cpu::dpbf16

#endif
