#include "kernels/cpu/gemm_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/cpu_row_io.h"
#include "kernels/cpu/elem_io.h"
#include "kernels/cpu/gemm_bf16_cpu.h"
#include "kernels/cpu/gemm_bf16_dpbf16_cpu.h"
#include "kernels/dtype_dispatch.h"

// Threading: on the sgemm path OpenBLAS parallelizes the O(m n k) multiply with its own thread
// pool and the O(m k + n k) conversions stay serial on purpose: an OpenMP team there keeps
// spinning after its region and competes with OpenBLAS's threads (measured: 0.12x of plain
// sgemm at 512^3 with OpenMP loops, ~1x without). The small-m path does not call OpenBLAS and
// runs its own OpenMP loop over blocks of n, like the other CPU kernels.
namespace flashinfer::kernels::cpu {
namespace {

// Element converters over the bits of a storage type, exact to fp32; one instantiation per
// dtype so the row loops vectorize.
template <class E>
struct ElemIn {
  using T = decltype(E::bits);
  static float cvt(T v) { return E::from_bits(v).to_float(); }
};
using Bf16In = ElemIn<BFloat16>;
using F16In = ElemIn<Half>;
using E4m3In = ElemIn<Float8E4M3FN>;
using E5m2In = ElemIn<Float8E5M2>;

template <class In>
void to_fp32_rows(const void* src, int64_t rows, int64_t cols, int64_t stride_r, int64_t stride_c,
                  float* dst) {
  const auto* s = static_cast<const typename In::T*>(src);
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * cols;
    const auto* row = s + r * stride_r;
    if (stride_c == 1) {
      for (int64_t c = 0; c < cols; ++c) d[c] = In::cvt(row[c]);
    } else {
      for (int64_t c = 0; c < cols; ++c) d[c] = In::cvt(row[c * stride_c]);
    }
  }
}

// Copies a strided [rows, cols] matrix into a dense fp32 [rows, cols] tile.
void to_fp32(const void* src, DType dt, int64_t rows, int64_t cols, int64_t stride_r,
             int64_t stride_c, float* dst) {
  visit_dtype<CpuElements, kBFloat16, kFloat16, kFloat8E4M3FN, kFloat8E5M2>(
      dt, [&]<class E>() { to_fp32_rows<ElemIn<E>>(src, rows, cols, stride_r, stride_c, dst); },
      [&]() {
        FLASHINFER_FAIL(ErrorCode::kInternal, "gemm", "", "unexpected input dtype ",
                        dtype_torch_name(dt));
      });
}

// C (dense fp32 [m, n]) -> out with optional bias, rounding once.
template <uint16_t (*kRound)(float)>
void store_rows(const float* c, const GemmParams& p, void* out) {
  auto* o = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < p.m; ++i) {
    const float* ci = c + i * p.n;
    uint16_t* oi = o + i * p.out_stride_m;
    if (p.bias) {
      for (int64_t j = 0; j < p.n; ++j) {
        oi[j * p.out_stride_n] =
            kRound(ci[j] + elem_io::load_or_fp32(p.bias, p.bias_dtype, j * p.bias_stride));
      }
    } else if (p.out_stride_n == 1) {
      for (int64_t j = 0; j < p.n; ++j) oi[j] = kRound(ci[j]);
    } else {
      for (int64_t j = 0; j < p.n; ++j) oi[j * p.out_stride_n] = kRound(ci[j]);
    }
  }
}

uint16_t round_bf16(float v) { return float_to_bfloat16_bits(v); }
uint16_t round_f16(float v) { return float_to_half_bits(v); }

// fp32 out (mm_bf16 / bmm_bf16's float32 output): the sums (with bias) as they are.
void store_rows_f32(const float* c, const GemmParams& p, void* out) {
  auto* o = static_cast<float*>(out);
  for (int64_t i = 0; i < p.m; ++i) {
    const float* ci = c + i * p.n;
    float* oi = o + i * p.out_stride_m;
    for (int64_t j = 0; j < p.n; ++j) {
      const float b =
          p.bias ? elem_io::load_or_fp32(p.bias, p.bias_dtype, j * p.bias_stride) : 0.0f;
      oi[j * p.out_stride_n] = p.bias ? ci[j] + b : ci[j];
    }
  }
}

void store_out(const float* c, const GemmParams& p, void* out) {
  if (p.out_dtype == DType::kFloat32) {
    store_rows_f32(c, p, out);
  } else if (p.out_dtype == DType::kBFloat16) {
    store_rows<round_bf16>(c, p, out);
  } else {
    store_rows<round_f16>(c, p, out);
  }
}

void sgemm_nt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
              float* c) {
  // Row-major C[m, n] = alpha * A[m, k] * B[n, k]^T.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(k),
              b, static_cast<blasint>(k), 0.0f, c, static_cast<blasint>(n));
}

// Large m: every operand converted to dense fp32, one OpenBLAS sgemm per batch (from batch
// item `first` on).
void sgemm_path(const GemmParams& p, float alpha, int64_t first = 0) {
  // Uninitialized scratch: every element is written before it is read.
  std::unique_ptr<float[]> a(new float[static_cast<size_t>(p.m * p.k)]);
  std::unique_ptr<float[]> b(new float[static_cast<size_t>(p.n * p.k)]);
  std::unique_ptr<float[]> c(new float[static_cast<size_t>(p.m * p.n)]);
  const size_t a_es = dtype_size(p.a_dtype), b_es = dtype_size(p.b_dtype),
               o_es = dtype_size(p.out_dtype);
  for (int64_t bi = first; bi < p.batch; ++bi) {
    const auto* ab = static_cast<const uint8_t*>(p.a) + bi * p.a_stride_b * a_es;
    const auto* bb = static_cast<const uint8_t*>(p.b) + bi * p.b_stride_b * b_es;
    auto* ob = static_cast<uint8_t*>(p.out) + bi * p.out_stride_b * o_es;
    to_fp32(ab, p.a_dtype, p.m, p.k, p.a_stride_m, p.a_stride_k, a.get());
    // B[k, j] lives at j * stride_n + k * stride_k: row j of the [n, k] tile.
    to_fp32(bb, p.b_dtype, p.n, p.k, p.b_stride_n, p.b_stride_k, b.get());
    if (p.k == 0) {
      std::fill(c.get(), c.get() + p.m * p.n, 0.0f);
    } else {
      sgemm_nt(p.m, p.n, p.k, alpha, a.get(), b.get(), c.get());
    }
    store_out(c.get(), p, ob);
  }
}

// C [m, w] (fp32, row stride ldc) -> the columns [j0, j0 + w) of out: alpha (one fp32 multiply
// when != 1, as sgemm applies it), bias, one rounding; the arithmetic of store_rows.
void store_cols(const float* c, int64_t ldc, float alpha, const GemmParams& p, void* out,
                int64_t j0, int64_t w) {
  auto* o = static_cast<uint16_t*>(out);
  const bool bf16 = p.out_dtype == DType::kBFloat16;
  for (int64_t i = 0; i < p.m; ++i) {
    const float* ci = c + i * ldc;
    uint16_t* oi = o + i * p.out_stride_m + j0 * p.out_stride_n;
    if (!p.bias && bf16 && p.out_stride_n == 1) {
      scale_to_bf16_row(ci, alpha, /*add_zero=*/false, oi, w);
      continue;
    }
    for (int64_t j = 0; j < w; ++j) {
      float v = alpha != 1.0f ? ci[j] * alpha : ci[j];
      if (p.bias) v += elem_io::load_or_fp32(p.bias, p.bias_dtype, (j0 + j) * p.bias_stride);
      oi[j * p.out_stride_n] = bf16 ? round_bf16(v) : round_f16(v);
    }
  }
}

// Large m, inputs exact in bf16 (bf16, e4m3, e5m2): oneDNN's bf16 matmul with fp32 accumulation
// (gemm_bf16_cpu.h), then the sgemm path's alpha (one fp32 multiply, as sgemm applies it), bias
// and single rounding. bf16 operands with unit k stride are read in place, and without bias into
// a dense bf16 / fp16 out oneDNN writes out itself (alpha as its output scale: the same multiply
// and rounding), as torch's bf16 matmul runs it. Otherwise (fp8, strided operands, bias) B is
// widened chunk by chunk next to the matmul that reads it and each chunk's products are stored
// at once (bf16_gemm_nt_chunked). Returns false, nothing written, when oneDNN is not available.
bool bf16_path(const GemmParams& p, float alpha) {
  if (!onednn_gemm_available() || p.k == 0 || !exact_in_bf16(p.a_dtype) ||
      !exact_in_bf16(p.b_dtype)) {
    return false;
  }
  const bool a_direct = p.a_dtype == DType::kBFloat16 && p.a_stride_k == 1 && p.a_stride_m >= p.k;
  const bool b_direct = p.b_dtype == DType::kBFloat16 && p.b_stride_k == 1 && p.b_stride_n >= p.k;
  const bool out_direct = !p.bias && p.out_stride_n == 1 && p.out_stride_m == p.n;
  HostBuffer<uint16_t> a(a_direct ? 0 : static_cast<size_t>(p.m * p.k));
  const size_t a_es = dtype_size(p.a_dtype), b_es = dtype_size(p.b_dtype),
               o_es = dtype_size(p.out_dtype);
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    const auto* ab = static_cast<const uint8_t*>(p.a) + bi * p.a_stride_b * a_es;
    const auto* bb = static_cast<const uint8_t*>(p.b) + bi * p.b_stride_b * b_es;
    auto* ob = static_cast<uint8_t*>(p.out) + bi * p.out_stride_b * o_es;
    if (!a_direct) {
      to_bf16_rows(ab, p.a_dtype, p.m, p.k, p.a_stride_m, p.a_stride_k, a.get(),
                   /*parallel=*/false);
    }
    const auto* ap = a_direct ? reinterpret_cast<const uint16_t*>(ab) : a.get();
    const int64_t lda = a_direct ? p.a_stride_m : p.k;
    bool done = false;
    if (b_direct && out_direct) {
      done = bf16_gemm_nt_out(p.m, p.n, p.k, ap, lda, reinterpret_cast<const uint16_t*>(bb),
                              p.b_stride_n, alpha, p.out_dtype, ob);
    }
    if (!done) {
      const auto fill_b = [&](int64_t j0, int64_t w, uint16_t* dst) {
        to_bf16_rows(bb + j0 * p.b_stride_n * b_es, p.b_dtype, w, p.k, p.b_stride_n, p.b_stride_k,
                     dst, /*parallel=*/false);
      };
      const auto epilogue = [&](int64_t j0, int64_t w, const float* c) {
        store_cols(c, w, alpha, p, ob, j0, w);
      };
      done = bf16_gemm_nt_chunked(p.m, p.n, p.k, ap, lda, fill_b, epilogue);
    }
    if (!done) {
      if (bi == 0) return false;
      sgemm_path(p, alpha, bi);  // oneDNN refused midway: the rest the former way
      return true;
    }
  }
  return true;
}

// Large m, bf16 by bf16 with dense rows (row stride k: with longer rows oneDNN blocks k another
// way, measured), on AVX-512 BF16 CPUs (gemm_bf16_dpbf16_cpu.h): our fp32-FMA kernel with
// oneDNN's sums bit for bit, then bf16_path's epilogue: into a dense bf16 out
// without bias, vcvtneps2bf16 after the alpha multiply (what oneDNN's store does there);
// otherwise store_cols, as bf16_path does after oneDNN's fp32 sums. Returns false, nothing
// written, when the kernel is not available or the operands do not fit it.
bool dpbf16_path(const GemmParams& p, float alpha) {
  if (!bf16_dpbf16_gemm_available() || p.m == 0 || p.n == 0 || p.k == 0 ||
      p.a_dtype != DType::kBFloat16 || p.b_dtype != DType::kBFloat16 || p.a_stride_k != 1 ||
      p.b_stride_k != 1 || p.a_stride_m != p.k || p.b_stride_n != p.k) {
    return false;
  }
  // bf16_path's out_direct case, where oneDNN's store writes out.
  const bool hw_out =
      !p.bias && p.out_dtype == DType::kBFloat16 && p.out_stride_n == 1 && p.out_stride_m == p.n;
  const size_t o_es = dtype_size(p.out_dtype);
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    const auto* ab = static_cast<const uint16_t*>(p.a) + bi * p.a_stride_b;
    const auto* bb = static_cast<const uint16_t*>(p.b) + bi * p.b_stride_b;
    auto* ob = static_cast<uint8_t*>(p.out) + bi * p.out_stride_b * o_es;
    const auto epilogue = [&](int64_t j0, int64_t w, const float* c, int64_t ldc) {
      if (hw_out) {
        bf16_store_rows_hw(c, ldc, p.m, w, alpha, reinterpret_cast<uint16_t*>(ob) + j0,
                           p.out_stride_m);
      } else {
        store_cols(c, ldc, alpha, p, ob, j0, w);
      }
    };
    if (!bf16_gemm_dpbf16(p.m, p.n, p.k, ab, p.a_stride_m, bb, p.b_stride_n, epilogue)) {
      return false;  // only before the first batch item: availability does not change
    }
  }
  return true;
}

// ---- small m: B read in place --------------------------------------------------------------
//
// out[i, j] = alpha * dot(A row i, B column j): B's column j is row j of the [n, k] weight, so
// every dot product runs along contiguous memory of both operands. A (m x k, small) is widened
// to fp32 once per call; B is widened in registers as it streams by: read from memory once, then
// from L1 once per group of MR rows of A. A register tile holds MR x NR vector accumulators (MR
// rows of A, NR columns of B), reduced horizontally at the end of a k chunk.
//
// Blocking: a task is kBlockN columns of one batch; within it, k runs in chunks whose slice of
// A (m x chunk fp32) stays in L2 while the task's columns stream past, and the fp32 partial
// sums (m x kBlockN) stay in L1.

constexpr int64_t kBlockN = 64;
constexpr int64_t kChunkABytes = 128 * 1024;
// Below this much B (elements per call, 8 MiB of bf16: about 1 ms of streaming on one core) one
// thread does it all. Measured on the shared 2-vCPU machine with one other busy process, llama
// decode with 2 threads: a threshold of 2^15 or 2^20 elements was slower than the former
// single-threaded conversion path (every OpenMP join waits for a thread that lost its core),
// 2^22 was 1.6-2x faster than it.
constexpr int64_t kParallelMinB = int64_t{1} << 22;

int64_t k_chunk(int64_t m, int64_t k) {
  const int64_t c = std::max<int64_t>(512, (kChunkABytes / 4 / m) / 64 * 64);
  return std::min(c, std::max<int64_t>(k, 1));
}

// One register tile: c[i * ldc + j] += sum_t a[i * lda + t] * B_j[t] for t < k, i < MR, j < NR,
// where B_j = b + j * ldb (B's column j, contiguous).
template <class In>
using TileFn = void (*)(const float* a, int64_t lda, const typename In::T* b, int64_t ldb,
                        int64_t k, float* c, int64_t ldc);

// Portable tile: eight independent partial sums per output, which the compiler maps to SSE2
// (baseline x86-64) or whatever the target has, without reassociation flags.
template <class In, int MR, int NR>
void tile_scalar(const float* a, int64_t lda, const typename In::T* b, int64_t ldb, int64_t k,
                 float* c, int64_t ldc) {
  constexpr int W = 8;
  float acc[MR][NR][W] = {};
  int64_t t = 0;
  for (; t + W <= k; t += W) {
    float bv[NR][W];
    for (int j = 0; j < NR; ++j) {
      for (int l = 0; l < W; ++l) bv[j][l] = In::cvt(b[j * ldb + t + l]);
    }
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < NR; ++j) {
        for (int l = 0; l < W; ++l) acc[i][j][l] += a[i * lda + t + l] * bv[j][l];
      }
    }
  }
  for (; t < k; ++t) {
    for (int j = 0; j < NR; ++j) {
      const float bj = In::cvt(b[j * ldb + t]);
      for (int i = 0; i < MR; ++i) acc[i][j][0] += a[i * lda + t] * bj;
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      const float* v = acc[i][j];
      c[i * ldc + j] += ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    }
  }
}

#if FLASHINFER_CPU_F16C
// The vector tiles. Widening is exact for every code: bf16 is the top half of an fp32; e5m2 is
// the top byte of an fp16 (F16C converts that exactly, subnormals included); e4m3fn goes through
// an fp16 bit pattern and F16C on AVX-512 (see widen16) and is rebuilt with integer arithmetic on
// AVX2 (normal: exponent rebias 7 -> 127; subnormal: mantissa * 2^-9, an exact int -> float
// conversion and power-of-two product), so no path depends on MXCSR's DAZ.
// GCC 12 reports its own AVX-512 intrinsics' deliberately undefined pass-through operands
// (`__m512i __Y = __Y;`) as (maybe-)uninitialized once they are inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define FI_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define FI_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

FI_TARGET_AVX512 inline __m512 widen16(const uint16_t* p, Bf16In) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
FI_TARGET_AVX512 inline __m512 widen16(const uint8_t* p, E5m2In) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(x), 8));
}
// e4m3fn through F16C: the code's exponent and mantissa bits placed at fp16's bits 7..13 (sign
// at 15) form an fp16 whose value is the e4m3 value times 2^-8, subnormals included (both
// formats' subnormal steps are their smallest normal / 8); the NaN codes S.1111.111 get fp16's
// all-ones exponent. Mostly 256-bit integer work, which has three ports against two for 512-bit.
FI_TARGET_AVX512 inline __m512 widen16(const uint8_t* p, E4m3In) {
  const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i y = _mm256_slli_epi16(x, 7);  // sign now at bit 14
  // Adding bit 14 to itself moves the sign to bit 15.
  __m256i h = _mm256_add_epi16(y, _mm256_and_si256(y, _mm256_set1_epi16(0x4000)));
  const __m256i nan =
      _mm256_cmpeq_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x3F80)), _mm256_set1_epi16(0x3F80));
  h = _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7C00)));
  return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
}

template <class In, int MR, int NR>
FI_TARGET_AVX512 void tile_avx512(const float* a, int64_t lda, const typename In::T* b, int64_t ldb,
                                  int64_t k, float* c, int64_t ldc) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  int64_t t = 0;
  for (; t + 16 <= k; t += 16) {
    __m512 bv[NR];
    for (int j = 0; j < NR; ++j) bv[j] = widen16(b + j * ldb + t, In{});
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_loadu_ps(a + i * lda + t);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
  if (t < k) {
    // Tail: B through a zero-padded copy (reads stay inside B), A through a masked load.
    const int r = static_cast<int>(k - t);
    const __mmask16 mask = static_cast<__mmask16>((1u << r) - 1);
    __m512 bv[NR];
    for (int j = 0; j < NR; ++j) {
      typename In::T pad[16] = {};
      std::memcpy(pad, b + j * ldb + t, sizeof(pad[0]) * r);
      bv[j] = widen16(pad, In{});
    }
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_maskz_loadu_ps(mask, a + i * lda + t);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) c[i * ldc + j] += _mm512_reduce_add_ps(acc[i][j]);
  }
}

FI_TARGET_AVX2 inline __m256 widen8(const uint16_t* p, Bf16In) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
FI_TARGET_AVX2 inline __m256 widen8(const uint8_t* p, E5m2In) {
  const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(x), 8));
}
FI_TARGET_AVX2 inline __m256 widen8(const uint8_t* p, E4m3In) {
  const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7F));
  const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0x1p-9f));
  const __m256 is_sub = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag));
  __m256 v = _mm256_blendv_ps(_mm256_castsi256_ps(normal), sub, is_sub);
  const __m256 is_nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F)));
  v = _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), is_nan);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x80)), 24);
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign));
}

FI_TARGET_AVX2 inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <class In, int MR, int NR>
FI_TARGET_AVX2 void tile_avx2(const float* a, int64_t lda, const typename In::T* b, int64_t ldb,
                              int64_t k, float* c, int64_t ldc) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  int64_t t = 0;
  for (; t + 8 <= k; t += 8) {
    __m256 bv[NR];
    for (int j = 0; j < NR; ++j) bv[j] = widen8(b + j * ldb + t, In{});
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_loadu_ps(a + i * lda + t);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
  if (t < k) {
    // Tail: both operands through zero-padded copies (reads stay inside A and B).
    const int r = static_cast<int>(k - t);
    __m256 bv[NR];
    for (int j = 0; j < NR; ++j) {
      typename In::T pad[8] = {};
      std::memcpy(pad, b + j * ldb + t, sizeof(pad[0]) * r);
      bv[j] = widen8(pad, In{});
    }
    for (int i = 0; i < MR; ++i) {
      float pad[8] = {};
      std::memcpy(pad, a + i * lda + t, sizeof(float) * r);
      const __m256 av = _mm256_loadu_ps(pad);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) c[i * ldc + j] += hsum8(acc[i][j]);
  }
}
#undef FI_TARGET_AVX512
#undef FI_TARGET_AVX2
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif

// The tiles of one instruction set for one B dtype: full tiles are kMr x kNr; the last rows of
// A use MR = 1 .. kMr - 1 and the last columns of a block NR = 1.
template <class In>
struct Tiles {
  int mr = 1, nr = 1;
  TileFn<In> fn[4][2] = {};  // [MR - 1][NR == nr ? 0 : 1]
};

template <class In>
Tiles<In> tiles_for(CpuIsa isa) {
  Tiles<In> t;
#if FLASHINFER_CPU_F16C
  if (isa == CpuIsa::kAvx512) {
    // 4 x 4 zmm accumulators + 4 widened B vectors + 1 A vector: 21 of 32 registers.
    t.mr = 4;
    t.nr = 4;
    t.fn[0][0] = &tile_avx512<In, 1, 4>;
    t.fn[1][0] = &tile_avx512<In, 2, 4>;
    t.fn[2][0] = &tile_avx512<In, 3, 4>;
    t.fn[3][0] = &tile_avx512<In, 4, 4>;
    t.fn[0][1] = &tile_avx512<In, 1, 1>;
    t.fn[1][1] = &tile_avx512<In, 2, 1>;
    t.fn[2][1] = &tile_avx512<In, 3, 1>;
    t.fn[3][1] = &tile_avx512<In, 4, 1>;
    return t;
  }
  if (isa == CpuIsa::kAvx2) {
    // 2 x 4 ymm accumulators + 4 B + 1 A: 13 of 16 registers.
    t.mr = 2;
    t.nr = 4;
    t.fn[0][0] = &tile_avx2<In, 1, 4>;
    t.fn[1][0] = &tile_avx2<In, 2, 4>;
    t.fn[0][1] = &tile_avx2<In, 1, 1>;
    t.fn[1][1] = &tile_avx2<In, 2, 1>;
    return t;
  }
#else
  (void)isa;
#endif
  t.mr = 2;
  t.nr = 4;
  t.fn[0][0] = &tile_scalar<In, 1, 4>;
  t.fn[1][0] = &tile_scalar<In, 2, 4>;
  t.fn[0][1] = &tile_scalar<In, 1, 1>;
  t.fn[1][1] = &tile_scalar<In, 2, 1>;
  return t;
}

template <class In, uint16_t (*kRound)(float)>
void small_m_typed(const GemmParams& p, float alpha, CpuIsa isa) {
  const Tiles<In> tiles = tiles_for<In>(isa);
  const int64_t m = p.m, n = p.n, k = p.k;
  // A of every batch as dense fp32 [batch, m, k]: small by construction (m is small).
  std::unique_ptr<float[]> a(new float[static_cast<size_t>(p.batch * m * k)]);
  const size_t a_es = dtype_size(p.a_dtype);
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    to_fp32(static_cast<const uint8_t*>(p.a) + bi * p.a_stride_b * a_es, p.a_dtype, m, k,
            p.a_stride_m, p.a_stride_k, a.get() + bi * m * k);
  }
  const auto* b = static_cast<const typename In::T*>(p.b);
  auto* out = static_cast<uint16_t*>(p.out);
  const int64_t kc = k_chunk(m, k);
  const int64_t blocks = (n + kBlockN - 1) / kBlockN;
  const int64_t tasks = p.batch * blocks;
#pragma omp parallel if (p.batch * n * k >= kParallelMinB)
  {
    // Partial sums of one task, m x kBlockN (row stride kBlockN).
    std::unique_ptr<float[]> c(new float[static_cast<size_t>(m * kBlockN)]);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t bi = task / blocks, j0 = (task % blocks) * kBlockN;
      const int64_t nb = std::min(kBlockN, n - j0);
      const float* ab = a.get() + bi * m * k;
      const auto* bb = b + bi * p.b_stride_b + j0 * p.b_stride_n;
      std::fill(c.get(), c.get() + m * kBlockN, 0.0f);
      for (int64_t k0 = 0; k0 < k; k0 += kc) {
        const int64_t kl = std::min(kc, k - k0);
        for (int64_t j = 0; j < nb;) {
          // Full groups of nr columns, then the block's last columns one at a time.
          const int64_t w = nb - j >= tiles.nr ? tiles.nr : 1;
          for (int64_t i = 0; i < m; i += tiles.mr) {
            const int mr = static_cast<int>(std::min<int64_t>(tiles.mr, m - i));
            tiles.fn[mr - 1][w == tiles.nr ? 0 : 1](ab + i * k + k0, k, bb + j * p.b_stride_n + k0,
                                                    p.b_stride_n, kl, c.get() + i * kBlockN + j,
                                                    kBlockN);
          }
          j += w;
        }
      }
      uint16_t* ob = out + bi * p.out_stride_b + j0 * p.out_stride_n;
      for (int64_t i = 0; i < m; ++i) {
        const float* ci = c.get() + i * kBlockN;
        uint16_t* oi = ob + i * p.out_stride_m;
        for (int64_t j = 0; j < nb; ++j) {
          float v = alpha * ci[j];
          if (p.bias) v += elem_io::load_or_fp32(p.bias, p.bias_dtype, (j0 + j) * p.bias_stride);
          oi[j * p.out_stride_n] = kRound(v);
        }
      }
    }
  }
}

template <uint16_t (*kRound)(float)>
bool small_m_rounded(const GemmParams& p, float alpha, CpuIsa isa) {
  return visit_dtype<CpuElements, kBFloat16, kFloat8E4M3FN, kFloat8E5M2>(
      p.b_dtype,
      [&]<class E>() {
        small_m_typed<ElemIn<E>, kRound>(p, alpha, isa);
        return true;
      },
      [] { return false; });
}

// Returns false (nothing written) when B's dtype or layout has no small-m kernel.
bool small_m_path(const GemmParams& p, float alpha, CpuIsa isa) {
  if (p.b_stride_k != 1 && p.k > 1) return false;
  return p.out_dtype == DType::kBFloat16 ? small_m_rounded<round_bf16>(p, alpha, isa)
                                         : small_m_rounded<round_f16>(p, alpha, isa);
}

}  // namespace

void gemm_with(const GemmParams& p, GemmPath path, CpuIsa isa) {
  const float alpha = (p.a_scale ? *p.a_scale : 1.0f) * (p.b_scale ? *p.b_scale : 1.0f);
  isa = std::min(isa, detected_cpu_isa());
  // fp32 out: the paths below round to 16 bits in their epilogues; the sgemm one stores floats.
  if (p.out_dtype == DType::kFloat32) return sgemm_path(p, alpha);
  const bool small =
      path == GemmPath::kSmallM || (path == GemmPath::kAuto && p.m <= kGemmSmallMMax);
  if (small && small_m_path(p, alpha, isa)) return;
  if ((path == GemmPath::kAuto || path == GemmPath::kDpbf16) && dpbf16_path(p, alpha)) return;
  if ((path == GemmPath::kAuto || path == GemmPath::kBf16) && bf16_path(p, alpha)) return;
  sgemm_path(p, alpha);
}

void gemm(const GemmParams& p) { gemm_with(p, GemmPath::kAuto, cpu_isa()); }

namespace {

// Dequantizes packed e2m1 rows [rows, k/2] with block scales into dense fp32 [rows, k]. Every
// product q * sf is exact in fp32 (at most 2 + 4 significant bits).
void dequant_fp4(const uint8_t* data, int64_t stride, const uint8_t* sf, SfLayoutCode layout,
                 bool ue8m0, int block, int64_t rows, int64_t k, float* dst) {
  const int64_t sf_cols = k / block;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = data + r * stride;
    float* d = dst + r * k;
    for (int64_t b = 0; b < sf_cols; ++b) {
      const uint8_t s = sf[sf_offset(layout, r, b, sf_cols)];
      const float scale = ue8m0 ? ue8m0_to_float(s) : e4m3fn_bits_to_float(s);
      for (int64_t c = b * block; c < (b + 1) * block; c += 2) {
        const uint8_t byte = row[c / 2];
        d[c] = e2m1_bits_to_float(e2m1x2_low(byte)) * scale;
        d[c + 1] = e2m1_bits_to_float(e2m1x2_high(byte)) * scale;
      }
    }
  }
}

}  // namespace

void mm_fp4(const Fp4GemmParams& p) {
  // Uninitialized scratch: every element is written before it is read.
  std::unique_ptr<float[]> a(new float[static_cast<size_t>(p.m * p.k)]);
  std::unique_ptr<float[]> b(new float[static_cast<size_t>(p.n * p.k)]);
  std::unique_ptr<float[]> c(new float[static_cast<size_t>(p.m * p.n)]);
  dequant_fp4(p.a, p.a_stride_m, p.a_sf, p.a_layout, p.ue8m0, p.block, p.m, p.k, a.get());
  dequant_fp4(p.b, p.b_stride_n, p.b_sf, p.b_layout, p.ue8m0, p.block, p.n, p.k, b.get());
  sgemm_nt(p.m, p.n, p.k, p.alpha ? *p.alpha : 1.0f, a.get(), b.get(), c.get());
  GemmParams g;
  g.m = p.m;
  g.n = p.n;
  g.out_dtype = p.out_dtype;
  g.out_stride_m = p.out_stride_m;
  g.out_stride_n = p.out_stride_n;
  store_out(c.get(), g, p.out);
}

}  // namespace flashinfer::kernels::cpu
