// Private: element and row conversions shared by the CPU kernels of the norm, activation and
// RoPE ops. Rows are converted to fp32 scratch buffers and back; the unit-stride case is a
// separate loop so the compiler can vectorize the (branch-free) format conversions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "flashinfer/dtype.h"
#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/cpu_intrinsics.h"
#include "kernels/cpu/cpu_isa.h"

#if FLASHINFER_CPU_X86_INTRINSICS
#include <cpuid.h>
#define FLASHINFER_CPU_F16C 1
#else
#define FLASHINFER_CPU_F16C 0
#endif

namespace flashinfer::kernels::cpu::rowio {

inline float load(const float* p) { return *p; }
inline float load(const Half* p) { return p->to_float(); }
inline float load(const BFloat16* p) { return p->to_float(); }
inline void store(float* p, float v) { *p = v; }
inline void store(Half* p, float v) { *p = Half::from_float(v); }
inline void store(BFloat16* p, float v) { *p = BFloat16::from_float(v); }

#if FLASHINFER_CPU_F16C
// fp16 rows through the F16C conversion instructions (chosen at run time; the library is built
// for baseline x86-64). vcvtps2ph with round-to-nearest-even gives the same bits as
// Half::from_float for every non-NaN input; NaNs stay NaN (payload bits may differ).
// CPUID-based checks: clang 14's __builtin_cpu_supports does not know "f16c". AVX state must
// also be enabled by the OS (OSXSAVE + XCR0 bits 1 and 2).
inline bool os_has_avx_state() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX)) return false;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0x6) == 0x6;
}
inline bool has_f16c() {
  static const bool v = [] {
    unsigned a, b, c, d;
    return os_has_avx_state() && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  }();
  return v && cpu_isa_cap() >= CpuIsa::kAvx2;  // tests may lower the cap to the scalar tier
}

__attribute__((target("avx,f16c"))) inline void load_half_f16c(const Half* x, int64_t n,
                                                               float* __restrict dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = load(x + i);
}

__attribute__((target("avx,f16c"))) inline void store_half_f16c(Half* y, int64_t n,
                                                                const float* __restrict src) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), h);
  }
  for (; i < n; ++i) store(y + i, src[i]);
}

inline bool has_avx2() {
  static const bool v = [] {
    unsigned a, b, c, d;
    return os_has_avx_state() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_AVX2);
  }();
  return v && cpu_isa_cap() >= CpuIsa::kAvx2;
}

// bf16 rows with AVX2: widening is a 16-bit shift; narrowing is the same round-to-nearest-even
// bit arithmetic as BFloat16::from_float (NaN -> sign | 0x7FC0), eight lanes at a time.
__attribute__((target("avx2"))) inline void load_bf16_avx2(const BFloat16* x, int64_t n,
                                                           float* __restrict dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
  }
  for (; i < n; ++i) dst[i] = load(x + i);
}

__attribute__((target("avx2"))) inline __m256i round_bf16_avx2(__m256i v) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(v, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(v, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i nan =
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(v, 16), _mm256_set1_epi32(0x8000)),
                      _mm256_set1_epi32(0x7FC0));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7FFFFFFF)),
                                            _mm256_set1_epi32(0x7F800000));
  return _mm256_blendv_epi8(rounded, nan, is_nan);
}

__attribute__((target("avx2"))) inline void store_bf16_avx2(BFloat16* y, int64_t n,
                                                            const float* __restrict src) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = round_bf16_avx2(_mm256_castps_si256(_mm256_loadu_ps(src + i)));
    const __m256i b = round_bf16_avx2(_mm256_castps_si256(_mm256_loadu_ps(src + i + 8)));
    // packus interleaves 64-bit groups across the two lanes; the permute restores order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), packed);
  }
  for (; i < n; ++i) store(y + i, src[i]);
}
#endif

/// dst[i] = float(x[i * stride]) for i < n.
template <class T>
inline void load_row(const T* x, int64_t stride, int64_t n, float* __restrict dst) {
#if FLASHINFER_CPU_F16C
  if constexpr (std::is_same_v<T, Half>) {
    if (stride == 1 && has_f16c()) return load_half_f16c(x, n, dst);
  }
  if constexpr (std::is_same_v<T, BFloat16>) {
    if (stride == 1 && has_avx2()) return load_bf16_avx2(x, n, dst);
  }
#endif
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) dst[i] = load(x + i);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = load(x + i * stride);
  }
}

/// y[i * stride] = T(src[i]) (round to nearest even) for i < n.
template <class T>
inline void store_row(T* y, int64_t stride, int64_t n, const float* __restrict src) {
#if FLASHINFER_CPU_F16C
  if constexpr (std::is_same_v<T, Half>) {
    if (stride == 1 && has_f16c()) return store_half_f16c(y, n, src);
  }
  if constexpr (std::is_same_v<T, BFloat16>) {
    if (stride == 1 && has_avx2()) return store_bf16_avx2(y, n, src);
  }
#endif
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) store(y + i, src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) store(y + i * stride, src[i]);
  }
}

/// n contiguous elements at element offset `off` of `base`, of any dtype the attention kernels
/// read (fp32, fp16, bf16, fp8 e4m3/e5m2), converted to fp32 exactly; another dtype is an Error
/// naming `op` and `arg`. One switch per row keeps a kernel one instantiation for every dtype mix.
inline void load_row_dtype(const void* base, DType dtype, int64_t off, int64_t n,
                           float* __restrict dst, const char* op, const char* arg) {
  switch (dtype) {
    case DType::kFloat32:
      return load_row(static_cast<const float*>(base) + off, 1, n, dst);
    case DType::kFloat16:
      return load_row(static_cast<const Half*>(base) + off, 1, n, dst);
    case DType::kBFloat16:
      return load_row(static_cast<const BFloat16*>(base) + off, 1, n, dst);
    case DType::kFloat8E4M3FN: {
      const uint8_t* x = static_cast<const uint8_t*>(base) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = e4m3fn_bits_to_float(x[i]);
      return;
    }
    case DType::kFloat8E5M2: {
      const uint8_t* x = static_cast<const uint8_t*>(base) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = e5m2_bits_to_float(x[i]);
      return;
    }
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, op, arg,
                      "dtype not supported by the CPU kernel: ", dtype_torch_name(dtype));
  }
}

/// n fp32 values stored contiguously at element offset `off` of `base` as fp32, fp16 or bf16
/// (round to nearest even); another dtype is an Error naming `op` and `arg`.
inline void store_row_dtype(void* base, DType dtype, int64_t off, int64_t n,
                            const float* __restrict src, const char* op, const char* arg) {
  switch (dtype) {
    case DType::kFloat32:
      return store_row(static_cast<float*>(base) + off, 1, n, src);
    case DType::kFloat16:
      return store_row(static_cast<Half*>(base) + off, 1, n, src);
    case DType::kBFloat16:
      return store_row(static_cast<BFloat16*>(base) + off, 1, n, src);
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, op, arg,
                      "output dtype not supported by the CPU kernel: ", dtype_torch_name(dtype));
  }
}

/// Rows per dynamically scheduled chunk: about 16K elements, so scheduling costs nothing, while
/// a thread that loses its core (a shared machine) does not hold up the whole op the way a
/// static split would.
inline int64_t rows_per_chunk(int64_t row_elems) {
  return row_elems >= 16384 ? 1 : 16384 / (row_elems > 0 ? row_elems : 1);
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

/// Elements per block of rows in for_row_blocks: each body() call covers at most this much, so
/// per-block work (e.g. the sfence after non-temporal stores) stays negligible.
inline constexpr int64_t kRowBlockElems = int64_t{1} << 18;

/// Calls body(r0, r1) on disjoint, contiguous row ranges that together cover [0, rows), from an
/// OpenMP team when the op is large enough (min_parallel_elems in total) to be worth waking it.
/// Static schedule: each thread streams one contiguous run of blocks. Measured on the shared
/// 2-vCPU VM, this beat handing the blocks out dynamically in every A/B pair (rmsnorm bf16
/// 0.36-0.61 vs 0.28-0.32 of memcpy, fused_add_rmsnorm bf16 0.56-0.87 vs 0.52-0.57, silu fp16
/// 0.31-0.49 vs 0.25-0.32), probably because interleaved blocks break each thread's sequential
/// stream.
template <class Body>
void for_row_blocks(int64_t rows, int64_t row_elems, int64_t min_parallel_elems, Body&& body) {
  if (rows <= 0) return;
  if (rows == 1 || rows * row_elems < min_parallel_elems) return body(int64_t{0}, rows);
#ifdef _OPENMP
  const int64_t threads = omp_get_max_threads();
#else
  const int64_t threads = 1;
#endif
  // At most kRowBlockElems per block, and at least about four blocks per thread.
  const int64_t cap = std::max<int64_t>(1, kRowBlockElems / std::max<int64_t>(1, row_elems));
  const int64_t per = std::clamp<int64_t>(rows / (4 * threads), 1, cap);
  const int64_t blocks = (rows + per - 1) / per;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) body(b * per, std::min(rows, (b + 1) * per));
}

}  // namespace flashinfer::kernels::cpu::rowio
