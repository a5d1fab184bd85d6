// Private: 16-lane AVX-512 building blocks for the streaming CPU kernels (norms, activations):
// fp32/fp16/bf16 loads and stores with masked tails (no scalar tail loops), non-temporal
// stores, and a vectorized exp. Every function carries its own target attribute; callers check
// use_avx512() (cpu_isa.h) first. Conversions give the same bits as Half/BFloat16::from_float.
#pragma once

#include <cstdint>
#include <type_traits>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/cpu_intrinsics.h"
#include "kernels/cpu/cpu_isa.h"

#if FLASHINFER_CPU_X86_INTRINSICS
#define FLASHINFER_CPU_AVX512 1
#else
#define FLASHINFER_CPU_AVX512 0
#endif

#if FLASHINFER_CPU_AVX512
// avx512f implies avx2/fma/f16c on both compilers, but spelling them out keeps g++ 12 and
// clang 14 in agreement about what may be inlined into what.
#define FI_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

namespace flashinfer::kernels::cpu::simd512 {

/// Lanes [0, n) set, n in [0, 16].
inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

/// 16 fp16 or bf16 encodings already in a register -> fp32, exact (the type is only a tag).
FI_AVX512 inline __m512 widen(Half, __m256i bits) { return _mm512_cvtph_ps(bits); }
FI_AVX512 inline __m512 widen(BFloat16, __m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

FI_AVX512 inline __m512 load(const float* p) { return _mm512_loadu_ps(p); }
FI_AVX512 inline __m512 load(const Half* p) {
  return widen(Half{}, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
FI_AVX512 inline __m512 load(const BFloat16* p) {
  return widen(BFloat16{}, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Masked loads read nothing outside the mask (faults are suppressed), so a row's tail needs no
// scalar loop and never touches the next row or unmapped memory. Unset lanes are 0.
FI_AVX512 inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
FI_AVX512 inline __m512 load(const Half* p, __mmask16 m) {
  return widen(Half{}, _mm256_maskz_loadu_epi16(m, p));
}
FI_AVX512 inline __m512 load(const BFloat16* p, __mmask16 m) {
  return widen(BFloat16{}, _mm256_maskz_loadu_epi16(m, p));
}

/// fp32 -> bf16 bits in the upper half of each 32-bit lane (the lower half is garbage): round to
/// nearest even; NaN -> sign | 0x7FC0 (float_to_bfloat16_bits).
FI_AVX512 inline __m512i to_bf16_hi(__m512 v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb);
  // (b & sign) | 0x7FC00000 in one ternary-logic op: (A & B) | C is truth table 0xEA.
  const __m512i nan = _mm512_ternarylogic_epi32(b, _mm512_set1_epi32(static_cast<int>(0x80000000u)),
                                                _mm512_set1_epi32(0x7FC00000), 0xEA);
  return _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), nan);
}
/// fp32 -> 16 bf16 bits, as to_bf16_hi.
FI_AVX512 inline __m256i to_bf16(__m512 v) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(to_bf16_hi(v), 16));
}

/// bf16 in pairs: 32 bf16 values as 16 32-bit lanes, split into the even and the odd elements
/// as fp32 (shift and mask, no cross-lane shuffles: those would compete with the gathers for
/// port 5), and packed back the same way.
FI_AVX512 inline __m512 bf16_even(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
}
FI_AVX512 inline __m512 bf16_odd(__m512i pairs) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
/// The 32 bf16 of to_bf16(even) and to_bf16(odd), interleaved back into element order.
FI_AVX512 inline __m512i to_bf16_pairs(__m512 even, __m512 odd) {
  return _mm512_mask_blend_epi16(0xAAAAAAAAu, _mm512_srli_epi32(to_bf16_hi(even), 16),
                                 to_bf16_hi(odd));
}
/// Stores to_bf16_pairs(even, odd) at p, non-temporally when kStream (p then 64-byte aligned;
/// callers end with sfence()).
template <bool kStream>
FI_AVX512 inline void store_pairs(BFloat16* p, __m512 even, __m512 odd) {
  const __m512i v = to_bf16_pairs(even, odd);
  if constexpr (kStream) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v);
  } else {
    _mm512_storeu_si512(p, v);
  }
}
/// 32 consecutive elements at p as two fp32 vectors: elements 0-15 and 16-31, or for bf16 the
/// even and the odd ones (the pairs order, which costs no port-5 widening).
template <class T>
FI_AVX512 inline void load32(const T* p, __m512& a, __m512& b) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    const __m512i u = _mm512_loadu_si512(p);
    a = bf16_even(u);
    b = bf16_odd(u);
  } else {
    a = load(p);
    b = load(p + 16);
  }
}
// fp32 -> fp16 bits, round to nearest even (vcvtps2ph: the same bits as Half::from_float).
FI_AVX512 inline __m256i to_half(__m512 v) {
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

FI_AVX512 inline void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
FI_AVX512 inline void store(Half* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_half(v));
}
FI_AVX512 inline void store(BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(v));
}

FI_AVX512 inline void store(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
FI_AVX512 inline void store(Half* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, to_half(v));
}
FI_AVX512 inline void store(BFloat16* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, to_bf16(v));
}

// Non-temporal stores: the line goes to memory without being read first (a normal store to a
// line not in cache reads it: 3 bytes of traffic per byte written instead of 2). p must be
// 64-byte (fp32) or 32-byte (16-bit types) aligned; callers end with sfence().
FI_AVX512 inline void stream(float* p, __m512 v) { _mm512_stream_ps(p, v); }
FI_AVX512 inline void stream(Half* p, __m512 v) {
  _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_half(v));
}
FI_AVX512 inline void stream(BFloat16* p, __m512 v) {
  _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_bf16(v));
}
/// Orders this thread's non-temporal stores before anything it does next (e.g. the barrier
/// after which other threads and the caller read the output).
inline void sfence() { _mm_sfence(); }

/// Prefetches row[i] into L2 (no-op for a null row). The norms read a row once from memory
/// and then work on it in cache; prefetching the next row meanwhile keeps memory busy.
template <class T>
inline void prefetch(const T* row, int64_t i) {
  if (row != nullptr) _mm_prefetch(reinterpret_cast<const char*>(row + i), _MM_HINT_T1);
}

FI_AVX512 inline __m512 set1(float v) { return _mm512_set1_ps(v); }

/// e^r 2^n for |r| <= ln2/2 and integral n: the second half of exp, for callers that reduce their
/// argument themselves (gelu). A degree-6 polynomial by FMA Horner (relative error 6.6e-8;
/// coefficients from scripts/gen/exp_coeffs.py), then scalef(p, n) = p 2^n, which rounds
/// underflow and overflow correctly.
FI_AVX512 inline __m512 exp_reduced(__m512 r, __m512 n) {
  __m512 p = set1(0.00138293614f);
  p = _mm512_fmadd_ps(p, r, set1(0.00837481301f));
  p = _mm512_fmadd_ps(p, r, set1(0.0416683629f));
  p = _mm512_fmadd_ps(p, r, set1(0.166664198f));
  p = _mm512_fmadd_ps(p, r, set1(0.499999911f));
  p = _mm512_fmadd_ps(p, r, set1(1.0f));
  p = _mm512_fmadd_ps(p, r, set1(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln2 = hi + lo

/// e^x to about 1 ulp: x = n ln2 + r (Cody-Waite, ln2 in two parts, n * kLn2Hi exact), then
/// exp_reduced (so no special cases: e^x is +inf above ~88.72 and reaches denormals and 0 below
/// ~-87.3). The clamp keeps n finite for +-inf; max/min return x itself when x is NaN.
FI_AVX512 inline __m512 exp(__m512 x) {
  const __m512 xc = _mm512_min_ps(set1(89.0f), _mm512_max_ps(set1(-104.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, set1(kLog2e)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, set1(kLn2Hi), xc);
  r = _mm512_fnmadd_ps(n, set1(kLn2Lo), r);
  return exp_reduced(r, n);
}

}  // namespace flashinfer::kernels::cpu::simd512
#endif
