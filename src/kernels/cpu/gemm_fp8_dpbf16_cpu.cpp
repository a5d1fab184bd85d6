#include "kernels/cpu/gemm_fp8_dpbf16_cpu.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/env_switch.h"
#include "flashinfer/dtype.h"
#include "kernels/cpu/cpu_intrinsics.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm_bf16_cpu.h"
#include "kernels/cpu/gemm_dpbf16_driver.h"
#include "kernels/cpu/gemm_dpbf16_tile.h"
#include "kernels/gemm_fp8_params.h"

#if FLASHINFER_CPU_X86_INTRINSICS
#include <cpuid.h>
#endif

namespace flashinfer::kernels::cpu {

#if FLASHINFER_CPU_X86_INTRINSICS && defined(__GNUC__)

namespace {

#define FI_DPBF16                                                                 \
  __attribute__((                                                                 \
      target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,avx2,fma," \
             "f16c")))

using dpbf16::kKc;
using dpbf16::kMr;

// The bf16 bits of e4m3 codes, split by byte for a vpermi2b lookup on the low 7 bits: the sign
// bit of the code is the sign bit of the bf16 (checked against fp8_bf16_table at first use).
struct Luts {
  alignas(64) std::array<uint8_t, 128> lo{}, hi{};
  bool ok = true;
};

const Luts& e4m3_luts() {
  static const Luts l = [] {
    Luts t;
    const uint16_t* bf = fp8_bf16_table(DType::kFloat8E4M3FN);
    for (int c = 0; c < 128; ++c) {
      t.lo[static_cast<std::size_t>(c)] = static_cast<uint8_t>(bf[c] & 0xFF);
      t.hi[static_cast<std::size_t>(c)] = static_cast<uint8_t>(bf[c] >> 8);
      t.ok = t.ok && bf[c | 0x80] == (bf[c] | 0x8000);
    }
    return t;
  }();
  return l;
}

bool has_bf16_vbmi() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((c >> 1) & 1)) return false;  // VBMI
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);               // AVX512_BF16
}

struct Tables {
  __m512i lo0, lo1, hi0, hi1;
};

FI_DPBF16 inline Tables load_tables() {
  const Luts& l = e4m3_luts();
  return {_mm512_loadu_si512(l.lo.data()), _mm512_loadu_si512(l.lo.data() + 64),
          _mm512_loadu_si512(l.hi.data()), _mm512_loadu_si512(l.hi.data() + 64)};
}

// 64 codes -> the low and the high bytes of their bf16 bits (byte j of each for code j).
FI_DPBF16 inline void lookup(const Tables& t, __m512i codes, __m512i& lo, __m512i& hi) {
  lo = _mm512_permutex2var_epi8(t.lo0, codes, t.lo1);  // index bits 0-6; bit 7 is ignored
  // hi | (codes & 0x80): ternary logic A | (B & C) = 0xF8.
  hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t.hi0, codes, t.hi1), codes,
                                 _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);
}

// Byte indices into (lo, hi) of _mm512_permutex2var_epi8 for a gathered vector whose dword c holds
// codes k = 4t .. 4t + 3 of column c: the bf16 pair (k = 4t + 2e, 4t + 2e + 1) of every column (e =
// 0, 1), low element in the low half.
FI_DPBF16 inline __m512i pair_index(int e) {
  alignas(64) uint8_t ix[64];
  for (int c = 0; c < 16; ++c) {
    ix[4 * c + 0] = static_cast<uint8_t>(4 * c + 2 * e);
    ix[4 * c + 1] = static_cast<uint8_t>(64 + 4 * c + 2 * e);
    ix[4 * c + 2] = static_cast<uint8_t>(4 * c + 2 * e + 1);
    ix[4 * c + 3] = static_cast<uint8_t>(64 + 4 * c + 2 * e + 1);
  }
  return _mm512_load_si512(ix);
}

// Columns [j0, j0 + w) (w % 32 == 0) of the prepared weight, k block kb -> w / 32 panels of
// [kKc / 2][32] bf16 pairs (dword (p, c): elements 2p and 2p + 1 of column c, vdpbf16ps's
// layout). The 32 columns of a panel are one 32-row block of the prepared layout (4 KiB): a
// gather takes 4 codes of each of 16 columns.
FI_DPBF16 void pack_b(const uint8_t* b, int64_t n, int64_t kb, int64_t j0, int64_t w,
                      uint32_t* dst) {
  const Tables t = load_tables();
  const __m512i e0 = pair_index(0), e1 = pair_index(1);
  alignas(64) int32_t off[32];
  for (int c = 0; c < 32; ++c) off[c] = static_cast<int32_t>(low_latency_row(c) * 128);
  const __m512i idx[2] = {_mm512_load_si512(off), _mm512_load_si512(off + 16)};
  for (int64_t g = 0; g < w; g += 32) {
    const uint8_t* base = b + (kb * n + j0 + g) * 128;
    uint32_t* pd = dst + g * kKc / 2;
    for (int h = 0; h < 2; ++h) {
      for (int64_t q = 0; q < kKc / 4; ++q) {
        const __m512i codes = _mm512_i32gather_epi32(idx[h], base + 4 * q, 1);
        __m512i lo, hi;
        lookup(t, codes, lo, hi);
        _mm512_storeu_si512(pd + (2 * q) * 32 + 16 * h, _mm512_permutex2var_epi8(lo, e0, hi));
        _mm512_storeu_si512(pd + (2 * q + 1) * 32 + 16 * h, _mm512_permutex2var_epi8(lo, e1, hi));
      }
    }
  }
}

// ---- fp32 path: on this CPU family vdpbf16ps retires one per two cycles, vfmadd231ps two per
// cycle, so 16-lane fp32 FMAs do twice the multiply-adds per cycle. vdpbf16ps is, per the SDM,
// srcdest += a[2p+1] * b[2p+1], then srcdest += a[2p] * b[2p], each an FMA rounded to nearest even
// with DAZ/FTZ: every e4m3 value is a normal bf16, each product is exact in fp32, and every sum
// of them is a multiple of 2^-18, so no denormal ever occurs and two fp32 FMAs in that order give
// the same bits. The packed operands store each k pair swapped (element 2p holds k = 2p + 1).
// NaN codes are the exception (which NaN's sign survives may differ): a chunk that meets one
// takes the vdpbf16ps path above.

// Byte indices (into lo, hi) that put the fp32 of code src(d) in dword d (bytes 2, 3; bytes 0,
// 1 are zeroed by kF32Bytes).
constexpr __mmask64 kF32Bytes = 0xCCCCCCCCCCCCCCCCull;
template <class F>
FI_DPBF16 inline __m512i f32_index(F src) {
  alignas(64) uint8_t ix[64];
  for (int d = 0; d < 16; ++d) {
    ix[4 * d] = ix[4 * d + 1] = 0;
    ix[4 * d + 2] = static_cast<uint8_t>(src(d));
    ix[4 * d + 3] = static_cast<uint8_t>(64 + src(d));
  }
  return _mm512_load_si512(ix);
}

FI_DPBF16 inline __mmask64 nan_codes(__m512i codes) {
  const __m512i x7f = _mm512_set1_epi8(0x7F);
  return _mm512_cmpeq_epi8_mask(_mm512_and_si512(codes, x7f), x7f);
}

// True when rows [0, m) of a (k % 64 == 0) hold a NaN code (0x7F or 0xFF).
FI_DPBF16 bool has_nan_codes(const uint8_t* a, int64_t lda, int64_t m, int64_t k) {
  __mmask64 nan = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t x = 0; x < k; x += 64) nan |= nan_codes(_mm512_loadu_si512(a + i * lda + x));
  }
  return nan != 0;
}

// Activation rows [i0, i0 + kMr) (rows past m are zeros), k block kb, as fp32 [kMr][kKc] with
// swapped pairs. True when a NaN code was seen.
FI_DPBF16 bool pack_a_tile_f32(const uint8_t* a, int64_t lda, int64_t m, int64_t i0, int64_t kb,
                               float* dst) {
  const Tables t = load_tables();
  __m512i ix[4];
  for (int v = 0; v < 4; ++v) ix[v] = f32_index([v](int d) { return (16 * v + d) ^ 1; });
  __mmask64 nan = 0;
  for (int r = 0; r < kMr; ++r) {
    float* d = dst + r * kKc;
    if (i0 + r >= m) {
      std::memset(d, 0, kKc * sizeof(float));
      continue;
    }
    const uint8_t* s = a + (i0 + r) * lda + kb * kKc;
    for (int64_t j = 0; j < kKc; j += 64) {
      const __m512i codes = _mm512_loadu_si512(s + j);
      nan |= nan_codes(codes);
      __m512i lo, hi;
      lookup(t, codes, lo, hi);
      for (int v = 0; v < 4; ++v) {
        _mm512_storeu_si512(d + j + 16 * v,
                            _mm512_maskz_permutex2var_epi8(kF32Bytes, lo, ix[v], hi));
      }
    }
  }
  return nan != 0;
}

// pack_b as fp32 panels [kKc][32] with swapped pairs. True when a NaN code was seen (the panel
// is then incomplete).
FI_DPBF16 bool fp8_pack_b_f32(const uint8_t* b, int64_t n, int64_t kb, int64_t j0, int64_t w,
                              float* dst) {
  const Tables t = load_tables();
  __m512i ix[4];
  for (int e = 0; e < 4; ++e) ix[e] = f32_index([e](int c) { return 4 * c + e; });
  alignas(64) int32_t off[32];
  for (int c = 0; c < 32; ++c) off[c] = static_cast<int32_t>(low_latency_row(c) * 128);
  const __m512i idx[2] = {_mm512_load_si512(off), _mm512_load_si512(off + 16)};
  __mmask64 nan = 0;
  for (int64_t g = 0; g < w; g += 32) {
    const uint8_t* base = b + (kb * n + j0 + g) * 128;
    float* pd = dst + g * kKc;
    for (int h = 0; h < 2; ++h) {
      for (int64_t q = 0; q < kKc / 4; ++q) {
        const __m512i codes = _mm512_i32gather_epi32(idx[h], base + 4 * q, 1);
        nan |= nan_codes(codes);
        __m512i lo, hi;
        lookup(t, codes, lo, hi);
        for (int e = 0; e < 4; ++e) {
          _mm512_storeu_si512(pd + (4 * q + (e ^ 1)) * 32 + 16 * h,
                              _mm512_maskz_permutex2var_epi8(kF32Bytes, lo, ix[e], hi));
        }
      }
    }
  }
  return nan != 0;
}

// dpbf16::gemm's packing of e4m3 operands (k % 128 == 0, n % 32 == 0), widened by lookup: a NaN
// code anywhere in the activation sends every chunk to the vdpbf16ps path (a byte scan, small next
// to the weight), in a weight panel its chunk.
struct Fp8Packing {
  const uint8_t* a;
  int64_t lda;
  const uint8_t* b;
  int64_t m, n, k;

  bool a_special() const { return has_nan_codes(a, lda, m, k); }
  void pack_a(int64_t i0, int64_t kb, float* dst) const { pack_a_tile_f32(a, lda, m, i0, kb, dst); }
  bool pack_b_f32(int64_t kb, int64_t j0, int64_t wp, float* dst) const {
    return fp8_pack_b_f32(b, n, kb, j0, wp, dst);
  }
  void pack_b_pairs(int64_t kb, int64_t j0, int64_t wp, uint32_t* dst) const {
    pack_b(b, n, kb, j0, wp, dst);
  }
};

}  // namespace

bool fp8_dpbf16_gemm_available() {
  static const bool hw = [] {
    return !detail::env_switch_is("FLASHINFER_CPU_FP8_DPBF16", "0") && has_bf16_vbmi() &&
           e4m3_luts().ok;
  }();
  return hw && use_avx512();
}

bool fp8_ll_gemm_dpbf16(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                        const uint8_t* b,
                        const std::function<void(int64_t, int64_t, const float*)>& epilogue) {
  if (!fp8_dpbf16_gemm_available() || m <= 0 || n <= 0 || k <= 0 || k % kKc != 0 || n % 32 != 0) {
    return false;
  }
  // n % 32 == 0: every chunk's width is a multiple of 32, its row stride.
  dpbf16::gemm(m, n, k, Fp8Packing{a, lda, b, m, n, k},
               [&](int64_t j0, int64_t w, const float* c, int64_t) { epilogue(j0, w, c); });
  return true;
}

#else

bool fp8_dpbf16_gemm_available() { return false; }

bool fp8_ll_gemm_dpbf16(int64_t, int64_t, int64_t, const uint8_t*, int64_t, const uint8_t*,
                        const std::function<void(int64_t, int64_t, const float*)>&) {
  return false;
}

#endif

}  // namespace flashinfer::kernels::cpu
