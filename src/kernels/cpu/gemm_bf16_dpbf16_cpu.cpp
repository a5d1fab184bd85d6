#include "kernels/cpu/gemm_bf16_dpbf16_cpu.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "core/env_switch.h"
#include "kernels/cpu/cpu_intrinsics.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm_bf16_cpu.h"
#include "kernels/cpu/gemm_dpbf16_driver.h"
#include "kernels/cpu/gemm_dpbf16_tile.h"

namespace flashinfer::kernels::cpu {

#if FLASHINFER_CPU_X86_INTRINSICS && defined(__GNUC__)

namespace {

using dpbf16::kKc;
using dpbf16::kMr;

#define FI_BF16K __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))

// ---- exactness: the fp32-FMA path gives vdpbf16ps's bits when no input, product or partial sum
// is subnormal (vdpbf16ps: DAZ on its inputs, FTZ on its result; FMAs: neither) and nothing
// overflows. With every nonzero input x in [2^-56, 2^48) in magnitude, a product of two is a
// multiple of 2^(-56-7) * 2^(-56-7) = 2^-126 (8 significant bits each) and below 2^96, so every
// partial sum of them, rounded or not, is 0 or a multiple of 2^-126 (a normal number) and below
// k * 2^96 (finite). Each product of two bf16 values is exact in fp32 (16 significant bits), so
// one FMA per element equals vdpbf16ps's product-then-add. A sum is never -0 (it starts at +0,
// and an exact cancellation rounds to +0), so the zero pairs padding k are harmless.

// Bits (sign cleared) of |x| = 2^-56 and 2^48: biased exponents 71 and 175.
constexpr uint16_t kLowBits = 71 << 7, kHighBits = 175 << 7;

inline bool out_of_range(uint16_t h) {
  const uint16_t x = h & 0x7FFF;
  return x != 0 && (x < kLowBits || x >= kHighBits);
}

FI_BF16K inline __mmask32 out_of_range(__m512i v) {
  const __m512i x = _mm512_and_si512(v, _mm512_set1_epi16(0x7FFF));
  // x - 1 < kLowBits - 1 (unsigned): 0 < x < kLowBits.
  const __mmask32 low = _mm512_cmplt_epu16_mask(_mm512_sub_epi16(x, _mm512_set1_epi16(1)),
                                                _mm512_set1_epi16(kLowBits - 1));
  return low | _mm512_cmpge_epu16_mask(x, _mm512_set1_epi16(static_cast<short>(kHighBits)));
}

// True when rows [0, m) of a hold a value outside the range.
FI_BF16K bool a_out_of_range(const uint16_t* a, int64_t lda, int64_t m, int64_t k) {
  __mmask32 bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    const uint16_t* row = a + i * lda;
    for (int64_t x = 0; x < k; x += 32) {
      const int64_t left = k - x;
      const __mmask32 lanes = left >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu)
                                         : static_cast<__mmask32>((1u << left) - 1u);
      bad |= out_of_range(_mm512_maskz_loadu_epi16(lanes, row + x));
    }
  }
  return bad != 0;
}

// Dword indices into (hi, lo) that put pair p's high element (as fp32) at position 2p and its low
// element at 2p + 1, for pairs [8 h, 8 h + 8).
FI_BF16K inline __m512i swap_index(int h) {
  alignas(64) int32_t ix[16];
  for (int d = 0; d < 16; ++d) ix[d] = 8 * h + (d >> 1) + ((d & 1) ? 16 : 0);
  return _mm512_load_si512(ix);
}

// Activation rows [i0, i0 + kMr) (rows past m and k past k are zeros), k block kb, as fp32
// [kMr][kKc] with swapped pairs.
FI_BF16K void pack_a_tile(const uint16_t* a, int64_t lda, int64_t m, int64_t k, int64_t i0,
                          int64_t kb, float* dst) {
  const __m512i ix0 = swap_index(0), ix1 = swap_index(1);
  const __m512i himask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int r = 0; r < kMr; ++r) {
    float* d = dst + r * kKc;
    if (i0 + r >= m) {
      std::memset(d, 0, kKc * sizeof(float));
      continue;
    }
    const uint16_t* s = a + (i0 + r) * lda + kb * kKc;
    const int64_t len = std::min(kKc, k - kb * kKc);
    for (int64_t j = 0; j < kKc; j += 32) {
      const int64_t left = len - j;
      const __mmask32 lanes = left >= 32  ? static_cast<__mmask32>(0xFFFFFFFFu)
                              : left <= 0 ? static_cast<__mmask32>(0)
                                          : static_cast<__mmask32>((1u << left) - 1u);
      const __m512i v = _mm512_maskz_loadu_epi16(lanes, s + j);
      const __m512i hi = _mm512_and_si512(v, himask), lo = _mm512_slli_epi32(v, 16);
      _mm512_storeu_si512(d + j, _mm512_permutex2var_epi32(hi, ix0, lo));
      _mm512_storeu_si512(d + j + 16, _mm512_permutex2var_epi32(hi, ix1, lo));
    }
  }
}

// Columns [j0, j0 + wp) (wp % 32 == 0; columns past n and k past k are zeros) of b, k block kb,
// as wp / 32 panels: fp32 [kKc][32] with swapped pairs (f32), or vdpbf16ps's [kKc / 2][32] bf16
// pairs (pairs); one of the two is null. True when a value outside the range was seen.
FI_BF16K bool pack_b(const uint16_t* b, int64_t ldb, int64_t n, int64_t k, int64_t kb, int64_t j0,
                     int64_t wp, float* f32, uint32_t* pairs) {
  const int64_t k0 = kb * kKc;
  const bool full_k = k0 + kKc <= k;
  alignas(64) int32_t off[16];
  for (int c = 0; c < 16; ++c) off[c] = static_cast<int32_t>(c * ldb * 2);
  const __m512i idx = _mm512_load_si512(off);
  const __m512i himask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __mmask32 bad = 0;
  bool bad_s = false;
  for (int64_t g = 0; g < wp; g += 32) {
    float* pf = f32 ? f32 + g * kKc : nullptr;
    uint32_t* pp = pairs ? pairs + g * kKc / 2 : nullptr;
    if (full_k && j0 + g + 32 <= n && ldb * 2 * 32 < INT_MAX) {
      for (int h = 0; h < 2; ++h) {
        const uint16_t* base = b + (j0 + g + 16 * h) * ldb + k0;
        for (int64_t q = 0; q < kKc / 2; ++q) {
          // dword c: elements 2q (low half) and 2q + 1 of column c.
          const __m512i v = _mm512_i32gather_epi32(idx, base + 2 * q, 1);
          bad |= out_of_range(v);
          if (pf) {
            _mm512_storeu_si512(pf + (2 * q) * 32 + 16 * h, _mm512_and_si512(v, himask));
            _mm512_storeu_si512(pf + (2 * q + 1) * 32 + 16 * h, _mm512_slli_epi32(v, 16));
          } else {
            _mm512_storeu_si512(pp + q * 32 + 16 * h, v);
          }
        }
      }
      continue;
    }
    // Edge panels: element by element, zeros outside [0, n) x [0, k).
    for (int c = 0; c < 32; ++c) {
      const int64_t j = j0 + g + c;
      for (int64_t kk = 0; kk < kKc; ++kk) {
        const uint16_t h = j < n && k0 + kk < k ? b[j * ldb + k0 + kk] : uint16_t{0};
        bad_s = bad_s || out_of_range(h);
        if (pf) {
          const uint32_t u = static_cast<uint32_t>(h) << 16;
          std::memcpy(pf + (kk ^ 1) * 32 + c, &u, 4);
        } else {
          auto* p16 = reinterpret_cast<uint16_t*>(pp + (kk >> 1) * 32 + c);
          // Low half: element 2p (little endian).
          std::memcpy(p16 + (kk & 1), &h, 2);
        }
      }
    }
  }
  return bad != 0 || bad_s;
}

FI_BF16K void store_rows_hw(const float* c, int64_t ldc, int64_t rows, int64_t w, float alpha,
                            uint16_t* out, int64_t ldo) {
  const __m512 al = _mm512_set1_ps(alpha);
  for (int64_t i = 0; i < rows; ++i) {
    const float* ci = c + i * ldc;
    uint16_t* oi = out + i * ldo;
    for (int64_t j = 0; j < w; j += 16) {
      const int64_t left = w - j;
      const __mmask16 lanes =
          left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
      __m512 v = _mm512_maskz_loadu_ps(lanes, ci + j);
      if (alpha != 1.0f) v = _mm512_mul_ps(v, al);
      const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
      _mm256_mask_storeu_epi16(oi + j, lanes, h);
    }
  }
}

// dpbf16::gemm's packing of dense bf16 operands: the range check picks the path (a value out of
// range anywhere in the activation sends every chunk to vdpbf16ps, in a weight panel its chunk).
struct Bf16Packing {
  const uint16_t* a;
  int64_t lda;
  const uint16_t* b;
  int64_t ldb, m, n, k;

  bool a_special() const { return a_out_of_range(a, lda, m, k); }
  void pack_a(int64_t i0, int64_t kb, float* dst) const { pack_a_tile(a, lda, m, k, i0, kb, dst); }
  bool pack_b_f32(int64_t kb, int64_t j0, int64_t wp, float* dst) const {
    return pack_b(b, ldb, n, k, kb, j0, wp, dst, nullptr);
  }
  void pack_b_pairs(int64_t kb, int64_t j0, int64_t wp, uint32_t* dst) const {
    pack_b(b, ldb, n, k, kb, j0, wp, nullptr, dst);
  }
};

bool has_amx_bf16() {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 22) & 1);
}

}  // namespace

bool bf16_dpbf16_gemm_available() {
  static const bool hw = [] {
    return !detail::env_switch_is("FLASHINFER_CPU_BF16_DPBF16", "0") &&
           dpbf16::cpu_has_avx512_bf16() && !has_amx_bf16();
  }();
  return hw && use_avx512();
}

void bf16_store_rows_hw(const float* c, int64_t ldc, int64_t rows, int64_t w, float alpha,
                        uint16_t* out, int64_t ldo) {
  store_rows_hw(c, ldc, rows, w, alpha, out, ldo);
}

bool bf16_gemm_dpbf16(
    int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
    const std::function<void(int64_t, int64_t, const float*, int64_t)>& epilogue) {
  if (!bf16_dpbf16_gemm_available() || m <= 0 || n <= 0 || k <= 0) return false;
  dpbf16::gemm(m, n, k, Bf16Packing{a, lda, b, ldb, m, n, k}, epilogue);
  return true;
}

#else

bool bf16_dpbf16_gemm_available() { return false; }

bool bf16_gemm_dpbf16(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t,
                      const std::function<void(int64_t, int64_t, const float*, int64_t)>&) {
  return false;
}

void bf16_store_rows_hw(const float*, int64_t, int64_t, int64_t, float, uint16_t*, int64_t) {}

#endif

}  // namespace flashinfer::kernels::cpu
