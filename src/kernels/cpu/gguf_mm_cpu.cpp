// CPU kernels of mm_gguf: a [m, k] times GGUF-quantized weight rows [n, k], dequantized on the
// fly block by block (never expanded to a full fp32 matrix), fp32 accumulation, OpenMP over
// output rows. Batch-1 decode is bound by the bytes of the weights, so reading the 4.5- or
// 8.5-bit blocks directly is the point; the dequantization is a few vector instructions per
// 32 values and stays under the memory time.
//
// Tiers: the scalar reference (dequantize a row, then sequential fp32 dot products), AVX2+FMA
// and AVX-512, chosen at run time (cpu_isa.h). The vector tiers dequantize one block of NR
// weight rows into registers and use it for R activation rows (R = 1 for decode, a few rows
// for prefill so each dequantized block is reused), with one accumulator vector per (row,
// weight row, 8/16 values), reduced once at the end of the row.
#include "kernels/cpu/gguf_mm_cpu.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/cpu_intrinsics.h"

#if FLASHINFER_CPU_X86_INTRINSICS
#include <cpuid.h>
#endif

namespace flashinfer::kernels::cpu {
namespace {

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline float load_a(const void* a, DType dt, int64_t off) {
  switch (dt) {
    case DType::kBFloat16:
      return static_cast<const BFloat16*>(a)[off].to_float();
    case DType::kFloat16:
      return static_cast<const Half*>(a)[off].to_float();
    default:
      return static_cast<const float*>(a)[off];
  }
}

inline void store_out(void* out, DType dt, int64_t off, float v) {
  switch (dt) {
    case DType::kBFloat16:
      static_cast<BFloat16*>(out)[off] = BFloat16::from_float(v);
      break;
    case DType::kFloat16:
      static_cast<Half*>(out)[off] = Half::from_float(v);
      break;
    default:
      static_cast<float*>(out)[off] = v;
  }
}

// Below this many multiply-adds a call runs on one thread (the fork costs more than it saves).
constexpr int64_t kParallelMinMacs = int64_t{1} << 15;

// The scalar reference: each weight row dequantized once (per thread), then one sequential fp32
// dot product per activation row.
void gguf_mm_scalar(const GgufMmParams& p, const float* a, int64_t lda) {
  const int64_t blocks = p.k / kGgmlBlockValues;
#pragma omp parallel if (p.m * p.n * p.k >= kParallelMinMacs)
  {
    std::vector<float> w(static_cast<size_t>(p.k));
#pragma omp for schedule(static)
    for (int64_t j = 0; j < p.n; ++j) {
      gguf_dequantize_row(p.type, p.b + j * p.b_row_bytes, blocks, w.data());
      for (int64_t i = 0; i < p.m; ++i) {
        const float* x = a + i * lda;
        float acc = 0.0f;
        for (int64_t t = 0; t < p.k; ++t) acc += w[static_cast<size_t>(t)] * x[t];
        store_out(p.out, p.out_dtype, i * p.out_stride_m + j * p.out_stride_n, acc);
      }
    }
  }
}

// A tile kernel: R activation rows (a, row pitch lda) times NR weight rows (b, row pitch brow),
// k = 32 * blocks; writes the R x NR fp32 sums to out[r * NR + c].
using TileFn = void (*)(const float* a, int64_t lda, const uint8_t* b, int64_t brow, int64_t blocks,
                        float* out);

#if FLASHINFER_CPU_X86_INTRINSICS
#define FI_GGUF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define FI_GGUF_AVX2 __attribute__((target("avx2,fma,f16c")))

// ---- AVX-512: a block is two 16-lane vectors ----
template <GgmlQuantType T>
FI_GGUF_AVX512 inline void dequant512(const uint8_t* blk, __m512& w0, __m512& w1) {
  const __m512 d = _mm512_set1_ps(_cvtsh_ss(load_u16(blk)));
  if constexpr (T == GgmlQuantType::kQ4_1) {
    const __m512 mn = _mm512_set1_ps(_cvtsh_ss(load_u16(blk + 2)));
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(qs, mask)));
    const __m512 hi =
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(qs, 4), mask)));
    w0 = _mm512_fmadd_ps(lo, d, mn);
    w1 = _mm512_fmadd_ps(hi, d, mn);
  } else {
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
    w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
    w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
  }
}

template <GgmlQuantType T, int R, int NR>
FI_GGUF_AVX512 void tile512(const float* a, int64_t lda, const uint8_t* b, int64_t brow,
                            int64_t blocks, float* out) {
  constexpr int64_t bytes = ggml_block_bytes(T);
  __m512 acc[R][NR][2];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c][0] = acc[r][c][1] = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int c = 0; c < NR; ++c) {
      __m512 w0, w1;
      dequant512<T>(b + c * brow + blk * bytes, w0, w1);
      for (int r = 0; r < R; ++r) {
        const float* x = a + r * lda + blk * kGgmlBlockValues;
        acc[r][c][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x), acc[r][c][0]);
        acc[r][c][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16), acc[r][c][1]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c)
      out[r * NR + c] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][c][0], acc[r][c][1]));
}

// ---- AVX2: a block is four 8-lane vectors ----
template <GgmlQuantType T>
FI_GGUF_AVX2 inline void dequant256(const uint8_t* blk, __m256 w[4]) {
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(load_u16(blk)));
  if constexpr (T == GgmlQuantType::kQ4_1) {
    const __m256 mn = _mm256_set1_ps(_cvtsh_ss(load_u16(blk + 2)));
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(qs, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int v = 0; v < 4; ++v)
      w[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[v])), d, mn);
  } else {
    for (int v = 0; v < 4; ++v) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * v));
      w[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
  }
}

FI_GGUF_AVX2 inline float hsum256(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

template <GgmlQuantType T, int R, int NR>
FI_GGUF_AVX2 void tile256(const float* a, int64_t lda, const uint8_t* b, int64_t brow,
                          int64_t blocks, float* out) {
  constexpr int64_t bytes = ggml_block_bytes(T);
  __m256 acc[R][NR][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c)
      for (int v = 0; v < 4; ++v) acc[r][c][v] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int c = 0; c < NR; ++c) {
      __m256 w[4];
      dequant256<T>(b + c * brow + blk * bytes, w);
      for (int r = 0; r < R; ++r) {
        const float* x = a + r * lda + blk * kGgmlBlockValues;
        for (int v = 0; v < 4; ++v)
          acc[r][c][v] = _mm256_fmadd_ps(w[v], _mm256_loadu_ps(x + 8 * v), acc[r][c][v]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c)
      out[r * NR + c] = hsum256(_mm256_add_ps(_mm256_add_ps(acc[r][c][0], acc[r][c][1]),
                                              _mm256_add_ps(acc[r][c][2], acc[r][c][3])));
}
// ---- AVX-512 BF16, Q4_1 with bf16 activations (the model's case) ----
// sum_j (d q_j + m) x_j = d * sum_j q_j x_j + m * sum_j x_j. The codes 0..15 and the bf16
// activations are exact bf16 values, so vdpbf16ps forms the products q_j x_j exactly and sums
// pairs in fp32; sum_j x_j per block is computed once per activation row (sx) and shared by
// every weight row. Per block this is half the vector instructions of dequantizing to fp32.
#define FI_GGUF_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

template <int R, int NR>
FI_GGUF_AVX512BF16 void tile512_q4_1_bf16(const uint16_t* a, int64_t lda, const float* sx,
                                          const uint8_t* b, int64_t brow, int64_t blocks,
                                          float* out) {
  // Word j < 16 of a block takes byte j's low nibble, word j >= 16 byte j - 16's high nibble:
  // the bytes twice, shifted right by 0 or 4, then the code's bf16 bits from a table (vpermw
  // reads the low 5 bits of each index, so entry i holds bf16(i & 15)).
  const __m512i shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  alignas(64) static constexpr uint16_t kCodes[32] = {
      0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120,
      0x4130, 0x4140, 0x4150, 0x4160, 0x4170, 0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0,
      0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170};
  const __m512i table = _mm512_load_si512(kCodes);
  __m512 acc[R][NR];
  float macc[R][NR];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps(), macc[r][c] = 0.0f;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int c = 0; c < NR; ++c) {
      const uint8_t* p = b + c * brow + blk * 20;
      const __m256i bytes =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4)));
      const __m512i codes = _mm512_srlv_epi16(_mm512_cvtepu8_epi16(bytes), shifts);
      const __m512bh q = (__m512bh)_mm512_permutexvar_epi16(codes, table);
      const __m512 d = _mm512_set1_ps(_cvtsh_ss(load_u16(p)));
      const float m = _cvtsh_ss(load_u16(p + 2));
      for (int r = 0; r < R; ++r) {
        const __m512bh x = (__m512bh)_mm512_loadu_si512(a + r * lda + blk * kGgmlBlockValues);
        const __m512 t = _mm512_dpbf16_ps(_mm512_setzero_ps(), q, x);
        acc[r][c] = _mm512_fmadd_ps(t, d, acc[r][c]);
        macc[r][c] += m * sx[r * blocks + blk];
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c) out[r * NR + c] = _mm512_reduce_add_ps(acc[r][c]) + macc[r][c];
}

using Bf16TileFn = void (*)(const uint16_t* a, int64_t lda, const float* sx, const uint8_t* b,
                            int64_t brow, int64_t blocks, float* out);

// AVX-512 BF16 (CPUID leaf 7, subleaf 1, EAX bit 5), on top of the AVX-512 tier.
bool has_avx512_bf16() {
  static const bool v = [] {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);
  }();
  return v;
}

// Q4_1 x bf16 activations on AVX-512 BF16: as gguf_mm_vector, with R = 1 (decode: 4 weight
// rows a tile) or 4 (prefill: 2 weight rows a tile) activation rows.
void gguf_mm_q4_1_bf16(const GgufMmParams& p) {
  const int64_t blocks = p.k / kGgmlBlockValues;
  const auto* a = static_cast<const uint16_t*>(p.a);
  const int64_t lda = p.a_stride_m;
  std::vector<float> sx(static_cast<size_t>(p.m * blocks));
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      float s = 0.0f;
      for (int64_t t = 0; t < kGgmlBlockValues; ++t)
        s += bfloat16_bits_to_float(a[i * lda + blk * kGgmlBlockValues + t]);
      sx[static_cast<size_t>(i * blocks + blk)] = s;
    }
  constexpr int kR = 4;
  static constexpr Bf16TileFn narrow[kR] = {&tile512_q4_1_bf16<1, 1>, &tile512_q4_1_bf16<2, 1>,
                                            &tile512_q4_1_bf16<3, 1>, &tile512_q4_1_bf16<4, 1>};
  static constexpr Bf16TileFn wide[kR] = {&tile512_q4_1_bf16<1, 4>, &tile512_q4_1_bf16<2, 2>,
                                          &tile512_q4_1_bf16<3, 2>, &tile512_q4_1_bf16<4, 2>};
  static constexpr int wide_nr[kR] = {4, 2, 2, 2};
  const int r_main = static_cast<int>(std::min<int64_t>(p.m, kR));
  const int64_t nr = wide_nr[r_main - 1];
  const int64_t full = p.n / nr, units = full + p.n % nr;
#pragma omp parallel for schedule(static) if (p.m * p.n * p.k >= kParallelMinMacs)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t j0 = u < full ? u * nr : full * nr + (u - full);
    const int64_t cols = u < full ? nr : 1;
    float sums[kR * 4];
    for (int64_t i0 = 0; i0 < p.m; i0 += r_main) {
      const int rows = static_cast<int>(std::min<int64_t>(r_main, p.m - i0));
      const bool is_wide = cols == wide_nr[rows - 1];
      const Bf16TileFn fn = is_wide ? wide[rows - 1] : narrow[rows - 1];
      const int64_t c_eff = is_wide ? cols : 1;
      for (int64_t jc = 0; jc < cols; jc += c_eff) {
        fn(a + i0 * lda, lda, sx.data() + i0 * blocks, p.b + (j0 + jc) * p.b_row_bytes,
           p.b_row_bytes, blocks, sums);
        for (int r = 0; r < rows; ++r)
          for (int64_t c = 0; c < c_eff; ++c)
            store_out(p.out, p.out_dtype,
                      (i0 + r) * p.out_stride_m + (j0 + jc + c) * p.out_stride_n,
                      sums[r * c_eff + c]);
      }
    }
  }
}
#endif  // FLASHINFER_CPU_X86_INTRINSICS

// The tiles of one tier: fn[r - 1][0] is R = r with NR = 1, fn[r - 1][1] is R = r with the
// tier's wide NR (4 weight rows for the decode shape R = 1, 2 for larger R).
constexpr int kMaxR = 6;
struct Tiles {
  TileFn fn[kMaxR][2] = {};
  int max_r = 0;
  int wide_nr[kMaxR] = {};
};

template <GgmlQuantType T>
Tiles tiles_for(CpuIsa isa) {
  Tiles t;
#if FLASHINFER_CPU_X86_INTRINSICS
  if (isa == CpuIsa::kAvx512) {
    t.max_r = 6;
    t.fn[0][0] = &tile512<T, 1, 1>, t.fn[0][1] = &tile512<T, 1, 4>, t.wide_nr[0] = 4;
    t.fn[1][0] = &tile512<T, 2, 1>, t.fn[1][1] = &tile512<T, 2, 2>, t.wide_nr[1] = 2;
    t.fn[2][0] = &tile512<T, 3, 1>, t.fn[2][1] = &tile512<T, 3, 2>, t.wide_nr[2] = 2;
    t.fn[3][0] = &tile512<T, 4, 1>, t.fn[3][1] = &tile512<T, 4, 2>, t.wide_nr[3] = 2;
    t.fn[4][0] = &tile512<T, 5, 1>, t.fn[4][1] = &tile512<T, 5, 2>, t.wide_nr[4] = 2;
    t.fn[5][0] = &tile512<T, 6, 1>, t.fn[5][1] = &tile512<T, 6, 2>, t.wide_nr[5] = 2;
  } else if (isa == CpuIsa::kAvx2) {
    t.max_r = 3;
    t.fn[0][0] = &tile256<T, 1, 1>, t.fn[0][1] = &tile256<T, 1, 2>, t.wide_nr[0] = 2;
    t.fn[1][0] = &tile256<T, 2, 1>, t.fn[1][1] = &tile256<T, 2, 1>, t.wide_nr[1] = 1;
    t.fn[2][0] = &tile256<T, 3, 1>, t.fn[2][1] = &tile256<T, 3, 1>, t.wide_nr[2] = 1;
  }
#else
  (void)isa;
#endif
  return t;
}

// The vector tiers: OpenMP over units of weight rows (wide tiles, then the leftover rows one
// by one); each unit runs every activation-row tile, so its blocks are read from memory once
// and reused from L1.
void gguf_mm_vector(const GgufMmParams& p, const float* a, int64_t lda, const Tiles& t) {
  const int64_t blocks = p.k / kGgmlBlockValues;
  // Activation rows of one tile: the largest R, or m itself when smaller.
  const int r_main = static_cast<int>(std::min<int64_t>(p.m, t.max_r));
  const int64_t nr = t.wide_nr[r_main - 1];
  const int64_t full = p.n / nr, units = full + p.n % nr;
#pragma omp parallel for schedule(static) if (p.m * p.n * p.k >= kParallelMinMacs)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t j0 = u < full ? u * nr : full * nr + (u - full);
    const int64_t cols = u < full ? nr : 1;
    float sums[kMaxR * 4];
    for (int64_t i0 = 0; i0 < p.m; i0 += r_main) {
      const int rows = static_cast<int>(std::min<int64_t>(r_main, p.m - i0));
      // The wide tile when its NR is this unit's width (a short last row tile may have
      // another), else the unit's rows one by one.
      const bool wide = cols == t.wide_nr[rows - 1];
      const TileFn fn = t.fn[rows - 1][wide ? 1 : 0];
      const int64_t c_eff = wide ? cols : 1;
      for (int64_t jc = 0; jc < cols; jc += c_eff) {
        fn(a + i0 * lda, lda, p.b + (j0 + jc) * p.b_row_bytes, p.b_row_bytes, blocks, sums);
        for (int r = 0; r < rows; ++r)
          for (int64_t c = 0; c < c_eff; ++c)
            store_out(p.out, p.out_dtype,
                      (i0 + r) * p.out_stride_m + (j0 + jc + c) * p.out_stride_n,
                      sums[r * c_eff + c]);
      }
    }
  }
}

}  // namespace

void gguf_dequantize_row(GgmlQuantType type, const uint8_t* row, int64_t blocks, float* out) {
  const int64_t bytes = ggml_block_bytes(type);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + b * bytes;
    float* o = out + b * kGgmlBlockValues;
    const float d = half_bits_to_float(load_u16(blk));
    if (type == GgmlQuantType::kQ4_1) {
      const float m = half_bits_to_float(load_u16(blk + 2));
      for (int j = 0; j < 16; ++j) {
        o[j] = d * static_cast<float>(blk[4 + j] & 0x0F) + m;
        o[j + 16] = d * static_cast<float>(blk[4 + j] >> 4) + m;
      }
    } else {
      for (int j = 0; j < 32; ++j) o[j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
    }
  }
}

void gguf_mm_with(const GgufMmParams& p, CpuIsa isa) {
  if (p.m == 0 || p.n == 0) return;
  isa = std::min(isa, detected_cpu_isa());
#if FLASHINFER_CPU_X86_INTRINSICS
  if (isa == CpuIsa::kAvx512 && p.type == GgmlQuantType::kQ4_1 && p.a_dtype == DType::kBFloat16 &&
      p.a_stride_k == 1 && has_avx512_bf16()) {
    gguf_mm_q4_1_bf16(p);
    return;
  }
#endif
  // The activations as contiguous fp32 rows, converted once per call (m * k values, small next
  // to the n * k weight); an fp32 input with unit column stride is used in place.
  const float* a = nullptr;
  int64_t lda = p.k;
  std::vector<float> a32;
  if (p.a_dtype == DType::kFloat32 && p.a_stride_k == 1) {
    a = static_cast<const float*>(p.a);
    lda = p.a_stride_m;
  } else {
    a32.resize(static_cast<size_t>(p.m * p.k));
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t t = 0; t < p.k; ++t)
        a32[static_cast<size_t>(i * p.k + t)] =
            load_a(p.a, p.a_dtype, i * p.a_stride_m + t * p.a_stride_k);
    a = a32.data();
  }
  if (isa != CpuIsa::kScalar) {
    const Tiles t = p.type == GgmlQuantType::kQ4_1 ? tiles_for<GgmlQuantType::kQ4_1>(isa)
                                                   : tiles_for<GgmlQuantType::kQ8_0>(isa);
    if (t.max_r > 0) {
      gguf_mm_vector(p, a, lda, t);
      return;
    }
  }
  gguf_mm_scalar(p, a, lda);
}

void gguf_mm(const GgufMmParams& p) { gguf_mm_with(p, cpu_isa()); }

}  // namespace flashinfer::kernels::cpu
