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
// weight row, 8/16 values), reduced once at the end of the row. On AVX-512 two more paths
// cut the instructions per block where the decode shape spends them: Q4_1 on activations split
// into bf16 parts (vdpbf16ps on the raw codes, the min term from per-block activation sums)
// and Q8_0 with d applied to each block's sum; both read d/m of 16 blocks with one gather and
// prefetch their rows ahead. With AVX-512 VNNI the decode shape (m = 1, fp32/fp16
// activations) goes first to a third: each activation block as two int8 parts, vpdpbusd on the
// raw codes (about half the bf16 path's instructions; ~2^-16 of the block maximum).
#include "kernels/cpu/gguf_mm_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/cpu_intrinsics.h"
#include "kernels/cpu/elem_io.h"

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

// a and out are fp32, fp16 or bf16 (checked by the API layer).
inline float load_a(const void* a, DType dt, int64_t off) {
  return elem_io::load_or_fp32(a, dt, off);
}
inline void store_out(void* out, DType dt, int64_t off, float v) {
  elem_io::store_or_fp32(out, dt, off, v);
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
// Software prefetch distance of the decode tiles, in weight rows: each row stream is read
// kPrefetchRows rows (two 4-row tiles) ahead of its use, which keeps more misses in flight
// than the hardware prefetcher alone (the 30 MB Q8_0 head and the 66 MB of Q4_1 layers come
// from L3/DRAM every token).
constexpr int64_t kPrefetchRows = 8;

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
// ---- AVX-512 BF16 + VBMI: Q4_1 on split activations, Q8_0 with the scale applied per block ----
// Q4_1: sum_j (d q_j + m) x_j = d * sum_j q_j x_j + m * sum_j x_j. The codes 0..15 are exact
// bf16 values; each activation is split into S bf16 parts, x ~= x_1 + ... + x_S (x_1 the bf16
// rounding of x, x_2 that of the remainder, ...), so vdpbf16ps forms every product q_j x_s,j
// exactly and sums in fp32. S = 1 is exact for bf16 activations; for fp32 ones each split
// leaves at most 2^-8 of the remainder, so |x - sum_s x_s| <= 2^(-8 S) |x|: S = 2 (2^-16, 256
// times below bf16 activations; measured 3-10x the scalar fp32 path's own rounding error,
// tests/ops/test_gguf_mm.cpp) is what m = 1 uses, S = 3 would be exact up to flushed
// denormals at 10-20% more time. sum_j x_j per block (fp32, from x itself) is computed once
// per activation row and shared by every weight row.
// Per weight row and block: one 16-byte load, vpmultishiftqb (each 16-bit lane takes one
// nibble), vpermw (nibble -> bf16 code), S vdpbf16ps and one FMA by d; d and m of 16 blocks
// come from one gather and are converted together, and the m term is a 16-lane FMA with the
// block sums. The fp32 dequantizing path needs about twice the vector instructions.
#define FI_GGUF_AVX512BF16                                                        \
  __attribute__((                                                                 \
      target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,avx2,fma," \
             "f16c")))

// AVX-512 BF16 (CPUID leaf 7 subleaf 1 EAX bit 5) and VBMI (leaf 7 ECX bit 1), on top of the
// AVX-512 tier.
bool has_avx512_bf16_vbmi() {
  static const bool v = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((c >> 1) & 1)) return false;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);
  }();
  return v;
}

// Lane p (0..31) of a block's bf16 vector holds value kLaneValue[p]: 16-bit lane w of qword L
// takes, from byte 8 (L & 1) + 2 (L >> 1) + (w >> 1) of the block's 16 code bytes, the low
// nibble (w even: value = byte index) or the high one (w odd: byte index + 16). Qword L of the
// broadcast 16 bytes holds bytes 8 (L & 1) .. + 7, so one vpmultishiftqb with bit offsets
// 16 (L >> 1) + 8 (w >> 1) + 4 (w & 1) puts every nibble in the low bits of its lane.
constexpr int lane_value(int p) {
  const int L = p >> 2, w = p & 3;
  return 8 * (L & 1) + 2 * (L >> 1) + (w >> 1) + 16 * (w & 1);
}

// The activation rows of one call, split: x[i][blk][s][32] (bf16 bits in lane order, part s)
// and the per-block sums sx[i][blk] (fp32, rows padded with zeros to a multiple of 16 blocks).
struct SplitActs {
  std::vector<uint16_t> x;
  std::vector<float> sx;
  int64_t blocks = 0, sx_row = 0, x_row = 0;
};

SplitActs split_acts(const GgufMmParams& p, int parts) {
  SplitActs s;
  s.blocks = p.k / kGgmlBlockValues;
  s.sx_row = (s.blocks + 15) / 16 * 16;
  s.x_row = s.blocks * parts * kGgmlBlockValues;
  s.x.resize(static_cast<size_t>(p.m * s.x_row));
  s.sx.assign(static_cast<size_t>(p.m * s.sx_row), 0.0f);
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t blk = 0; blk < s.blocks; ++blk) {
      float v[kGgmlBlockValues];
      float sum = 0.0f;
      for (int t = 0; t < kGgmlBlockValues; ++t) {
        v[t] =
            load_a(p.a, p.a_dtype, i * p.a_stride_m + (blk * kGgmlBlockValues + t) * p.a_stride_k);
        sum += v[t];
      }
      s.sx[static_cast<size_t>(i * s.sx_row + blk)] = sum;
      uint16_t* dst = s.x.data() + i * s.x_row + blk * parts * kGgmlBlockValues;
      for (int lane = 0; lane < kGgmlBlockValues; ++lane) {
        float r = v[lane_value(lane)];
        for (int part = 0; part < parts; ++part) {
          const BFloat16 h = BFloat16::from_float(r);
          dst[part * kGgmlBlockValues + lane] = h.bits;
          r -= h.to_float();  // exact: h is r rounded to 8 significant bits
        }
      }
    }
  }
  return s;
}

// R activation rows x NR weight rows of Q4_1, S parts; writes the R x NR sums to out[r * NR + c].
template <int S, int R, int NR>
FI_GGUF_AVX512BF16 void tile512_q4_1_split(const SplitActs& xa, int64_t i0, const uint8_t* b,
                                           int64_t brow, float* out) {
  alignas(64) static constexpr uint16_t kCodes[32] = {
      0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120,
      0x4130, 0x4140, 0x4150, 0x4160, 0x4170, 0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0,
      0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170};
  alignas(64) static constexpr uint8_t kShift[64] = {
#define FI_Q(g) \
  16 * g, 16 * g, 16 * g + 4, 16 * g + 4, 16 * g + 8, 16 * g + 8, 16 * g + 12, 16 * g + 12
      FI_Q(0), FI_Q(0), FI_Q(1), FI_Q(1), FI_Q(2),
      FI_Q(2), FI_Q(3), FI_Q(3)
#undef FI_Q
  };
  const __m512i table = _mm512_load_si512(kCodes);
  const __m512i shift = _mm512_load_si512(kShift);
  const __m512i dm_index =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(20));
  const int64_t blocks = xa.blocks;
  const uint16_t* xs = xa.x.data() + i0 * xa.x_row;
  const float* sx = xa.sx.data() + i0 * xa.sx_row;
  __m512 acc[R][NR];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  alignas(64) float dbuf[NR][16];
  for (int64_t b0 = 0; b0 < blocks; b0 += 16) {
    const int nb = static_cast<int>(std::min<int64_t>(16, blocks - b0));
    const __mmask16 live = static_cast<__mmask16>((1u << nb) - 1u);
    for (int c = 0; c < NR; ++c) {
      // d (low half) and m (high half) of 16 blocks at once.
      const __m512i dm = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, dm_index,
                                                     b + c * brow + b0 * 20, 1);
      _mm512_store_ps(dbuf[c], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)));
      const __m512 mv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
      for (int r = 0; r < R; ++r)
        acc[r][c] = _mm512_fmadd_ps(mv, _mm512_loadu_ps(sx + r * xa.sx_row + b0), acc[r][c]);
    }
    for (int j = 0; j < nb; ++j) {
      const int64_t blk = b0 + j;
      __m512bh xv[R][S];
      for (int r = 0; r < R; ++r)
        for (int s = 0; s < S; ++s)
          xv[r][s] =
              (__m512bh)_mm512_loadu_si512(xs + r * xa.x_row + (blk * S + s) * kGgmlBlockValues);
      for (int c = 0; c < NR; ++c) {
        _mm_prefetch(reinterpret_cast<const char*>(b + (c + kPrefetchRows) * brow + blk * 20),
                     _MM_HINT_T0);
        const __m512i bytes = _mm512_broadcast_i32x4(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + c * brow + blk * 20 + 4)));
        const __m512bh q =
            (__m512bh)_mm512_permutexvar_epi16(_mm512_multishift_epi64_epi8(shift, bytes), table);
        const __m512 d = _mm512_set1_ps(dbuf[c][j]);
        for (int r = 0; r < R; ++r) {
          // The smallest part first.
          __m512 t = _mm512_dpbf16_ps(_mm512_setzero_ps(), q, xv[r][S - 1]);
          for (int s = S - 2; s >= 0; --s) t = _mm512_dpbf16_ps(t, q, xv[r][s]);
          acc[r][c] = _mm512_fmadd_ps(t, d, acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c) out[r * NR + c] = _mm512_reduce_add_ps(acc[r][c]);
}

// Q8_0 on fp32 activations: d * sum_j q_j x_j per block (the codes converted to fp32, exact),
// d of 16 blocks from one gather: three vector FMAs per block and activation row after the
// shared conversion, instead of scaling every code by d first.
template <int R, int NR>
FI_GGUF_AVX512 void tile512_q8_0_sum(const float* a, int64_t lda, const uint8_t* b, int64_t brow,
                                     int64_t blocks, float* out) {
  const __m512i d_index =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(34));
  __m512 acc[R][NR];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  alignas(64) float dbuf[NR][16];
  for (int64_t b0 = 0; b0 < blocks; b0 += 16) {
    const int nb = static_cast<int>(std::min<int64_t>(16, blocks - b0));
    const __mmask16 live = static_cast<__mmask16>((1u << nb) - 1u);
    for (int c = 0; c < NR; ++c) {
      const __m512i dd = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, d_index,
                                                     b + c * brow + b0 * 34, 1);
      _mm512_store_ps(dbuf[c], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
    }
    for (int j = 0; j < nb; ++j) {
      const int64_t blk = b0 + j;
      for (int c = 0; c < NR; ++c) {
        const uint8_t* p = b + c * brow + blk * 34 + 2;
        _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchRows * brow), _MM_HINT_T0);
        const __m512 q0 = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
        const __m512 q1 = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
        const __m512 d = _mm512_set1_ps(dbuf[c][j]);
        for (int r = 0; r < R; ++r) {
          const float* x = a + r * lda + blk * kGgmlBlockValues;
          const __m512 t =
              _mm512_fmadd_ps(q1, _mm512_loadu_ps(x + 16), _mm512_mul_ps(q0, _mm512_loadu_ps(x)));
          acc[r][c] = _mm512_fmadd_ps(t, d, acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c) out[r * NR + c] = _mm512_reduce_add_ps(acc[r][c]);
}

// The prefill shape (R = 2..12 activation rows): as tile512, each block of NR weight rows
// dequantized once to fp32 and used by every activation row, but d and m of 16 blocks come
// from one gather and are broadcast from memory, instead of four scalar conversions and
// broadcasts per block and weight row.
template <GgmlQuantType T, int R, int NR>
FI_GGUF_AVX512 void tile512_dm(const float* a, int64_t lda, const uint8_t* b, int64_t brow,
                               int64_t blocks, float* out) {
  constexpr int64_t bytes = ggml_block_bytes(T);
  constexpr bool kQ4 = T == GgmlQuantType::kQ4_1;
  const __m512i dm_index =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(bytes)));
  // One accumulator per (row, weight row), both halves of a block into it: R = 12 with NR = 2
  // fits the 32 vector registers and amortizes each dequantized block over twice the rows.
  __m512 acc[R][NR];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  alignas(64) float dbuf[NR][16];
  alignas(64) float mbuf[NR][16];
  for (int64_t b0 = 0; b0 < blocks; b0 += 16) {
    const int nb = static_cast<int>(std::min<int64_t>(16, blocks - b0));
    const __mmask16 live = static_cast<__mmask16>((1u << nb) - 1u);
    for (int c = 0; c < NR; ++c) {
      const __m512i dm = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, dm_index,
                                                     b + c * brow + b0 * bytes, 1);
      _mm512_store_ps(dbuf[c], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)));
      if constexpr (kQ4)
        _mm512_store_ps(mbuf[c], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16))));
    }
    for (int j = 0; j < nb; ++j) {
      const int64_t blk = b0 + j;
      for (int c = 0; c < NR; ++c) {
        const uint8_t* p = b + c * brow + blk * bytes;
        const __m512 d = _mm512_set1_ps(dbuf[c][j]);
        __m512 w0, w1;
        if constexpr (kQ4) {
          const __m512 mn = _mm512_set1_ps(mbuf[c][j]);
          const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
          const __m128i mask = _mm_set1_epi8(0x0F);
          w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(qs, mask))), d,
                               mn);
          w1 = _mm512_fmadd_ps(
              _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(qs, 4), mask))),
              d, mn);
        } else {
          w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2)))),
                             d);
          w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 18)))),
                             d);
        }
        for (int r = 0; r < R; ++r) {
          const float* x = a + r * lda + blk * kGgmlBlockValues;
          acc[r][c] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x), acc[r][c]);
          acc[r][c] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16), acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c) out[r * NR + c] = _mm512_reduce_add_ps(acc[r][c]);
}

using SplitTileFn = void (*)(const SplitActs& xa, int64_t i0, const uint8_t* b, int64_t brow,
                             float* out);

// Q4_1 on split activations: OpenMP over units of weight rows as gguf_mm_vector, R = 1 (decode:
// 4 weight rows a tile) up to 4 activation rows (2 weight rows a tile).
template <int S>
void gguf_mm_q4_1_split(const GgufMmParams& p) {
  const SplitActs xa = split_acts(p, S);
  constexpr int kR = 4;
  static constexpr SplitTileFn narrow[kR] = {
      &tile512_q4_1_split<S, 1, 1>, &tile512_q4_1_split<S, 2, 1>, &tile512_q4_1_split<S, 3, 1>,
      &tile512_q4_1_split<S, 4, 1>};
  static constexpr SplitTileFn wide[kR] = {
      &tile512_q4_1_split<S, 1, 4>, &tile512_q4_1_split<S, 2, 2>, &tile512_q4_1_split<S, 3, 2>,
      &tile512_q4_1_split<S, 4, 2>};
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
      const SplitTileFn fn = is_wide ? wide[rows - 1] : narrow[rows - 1];
      const int64_t c_eff = is_wide ? cols : 1;
      for (int64_t jc = 0; jc < cols; jc += c_eff) {
        fn(xa, i0, p.b + (j0 + jc) * p.b_row_bytes, p.b_row_bytes, sums);
        for (int r = 0; r < rows; ++r)
          for (int64_t c = 0; c < c_eff; ++c)
            store_out(p.out, p.out_dtype,
                      (i0 + r) * p.out_stride_m + (j0 + jc + c) * p.out_stride_n,
                      sums[r * c_eff + c]);
      }
    }
  }
}
// ---- AVX-512 VNNI: m = 1 on activations as two int8 parts (the decode shape) ----
// Each block of 32 activations is quantized twice: hi = round(x / s1) with s1 = max|x| / 127,
// then lo = round((x - s1 hi) / s2) with s2 = s1 / 256, saturated to int8, so
// x ~= s2 (256 hi + lo) with |x - s2 (256 hi + lo)| <= s2 (half of it unless lo saturates):
// about 2^-16 of the block's largest |x| (max|x| / 32512 at worst), where llama.cpp's single
// int8 part (Q8_1, 2^-8) changes this model's greedy answer. vpdpbusd multiplies the unsigned
// codes by both parts exactly in int32 (256 sum(q hi) + sum(q lo) stays below 2^24 for Q4_1),
// and one fp32 multiply by d s2 per block follows. Two blocks share a 512-bit vector (their
// codes in natural order, so the activations need no permutation); per two blocks and weight
// row that is an insert, a masked shift and an AND (Q4_1 nibbles) or an XOR (Q8_0: q + 128,
// corrected per block with 128 (256 sum hi + sum lo)), two vpdpbusd, a shift, a conversion and
// an FMA: about half the instructions of the bf16 split path, measured 1.8-2x its speed.
// Q4_1's m * sum(x) term uses the fp32 block sums of x itself, as the bf16 path does.
#define FI_GGUF_AVX512VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

// AVX-512 VNNI: CPUID leaf 7 subleaf 0, ECX bit 11.
bool has_avx512_vnni() {
  static const bool v = [] {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((c >> 11) & 1);
  }();
  return v;
}

// Tests turn the int8 path off to reach the bf16 split path on the same machine.
std::atomic<bool> g_int8_path_enabled{true};

// One activation row as two int8 parts: hi/lo [blocks + 1 padding block][32] (natural order),
// per block s2 (fp32), sum(x) (fp32) and, for Q8_0, the per-lane corrections
// 128 (256 sum hi + sum lo) over each group of 4 values ([blocks + 1][8] int32).
struct Int8Acts {
  std::vector<int8_t> hi, lo;
  std::vector<float> s2, sx;
  std::vector<int32_t> corr;
  int64_t blocks = 0;
};

// Quantizes x[k] (fp32, contiguous); false when a value is not finite (the caller then takes
// another path, which propagates it as fp32 arithmetic would).
FI_GGUF_AVX512VNNI bool quantize_int8_pair(const float* x, int64_t k, bool want_corr, Int8Acts& s) {
  const int64_t blocks = k / kGgmlBlockValues;
  const int64_t padded = (blocks + 15) / 16 * 16 + 1;
  s.blocks = blocks;
  s.hi.assign(static_cast<size_t>(padded * kGgmlBlockValues), 0);
  s.lo.assign(static_cast<size_t>(padded * kGgmlBlockValues), 0);
  s.s2.assign(static_cast<size_t>(padded), 0.0f);
  s.sx.assign(static_cast<size_t>(padded), 0.0f);
  if (want_corr) s.corr.assign(static_cast<size_t>(padded * 8), 0);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const __m512 x0 = _mm512_loadu_ps(x + blk * kGgmlBlockValues);
    const __m512 x1 = _mm512_loadu_ps(x + blk * kGgmlBlockValues + 16);
    const float sum = _mm512_reduce_add_ps(_mm512_add_ps(x0, x1));
    if (!std::isfinite(sum)) return false;  // an inf or NaN in the block (or an overflow)
    s.sx[static_cast<size_t>(blk)] = sum;
    const float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, x0), _mm512_andnot_ps(sign, x1)));
    if (amax == 0.0f) continue;  // hi = lo = 0
    // Tiny scales would overflow 127 / amax or flush s2 to zero: another path handles those.
    if (amax < 0x1p-90f) return false;
    const float s1 = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(127.0f / amax), s1v = _mm512_set1_ps(s1);
    const __m512 inv2 = _mm512_set1_ps(256.0f * 127.0f / amax);
    s.s2[static_cast<size_t>(blk)] = s1 / 256.0f;
    int8_t* hp = s.hi.data() + blk * kGgmlBlockValues;
    int8_t* lp = s.lo.data() + blk * kGgmlBlockValues;
    const __m512 xs[2] = {x0, x1};
    __m512i h32[2], l32[2];
    for (int v = 0; v < 2; ++v) {
      // Round to nearest even (the MXCSR default) and saturate to int8.
      h32[v] = _mm512_cvtps_epi32(_mm512_mul_ps(xs[v], inv));
      const __m512 r = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(h32[v]), s1v, xs[v]);
      l32[v] = _mm512_cvtps_epi32(_mm512_mul_ps(r, inv2));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hp + 16 * v), _mm512_cvtsepi32_epi8(h32[v]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lp + 16 * v), _mm512_cvtsepi32_epi8(l32[v]));
    }
    if (want_corr) {
      // Per group of 4 values (one vpdpbusd lane): 128 (256 sum hi + sum lo), from the stored
      // (saturated) int8 values.
      for (int g = 0; g < 8; ++g) {
        int32_t c = 0;
        for (int t = 0; t < 4; ++t) c += 256 * hp[4 * g + t] + lp[4 * g + t];
        s.corr[static_cast<size_t>(blk * 8 + g)] = 128 * c;
      }
    }
  }
  return true;
}

// One activation row x NR weight rows; writes the NR sums to out[c].
template <GgmlQuantType T, int NR>
FI_GGUF_AVX512VNNI void tile512_int8(const Int8Acts& xa, const uint8_t* b, int64_t brow,
                                     float* out) {
  constexpr bool kQ4 = T == GgmlQuantType::kQ4_1;
  constexpr int64_t bytes = ggml_block_bytes(T);
  const __m512i dm_index =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(bytes)));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  const int64_t blocks = xa.blocks;
  __m512 acc[NR];
  for (int c = 0; c < NR; ++c) acc[c] = _mm512_setzero_ps();
  // d s2 of 16 blocks per weight row, one spare zero so a lone last block reads a zero scale.
  alignas(64) float dbuf[NR][17];
  for (int c = 0; c < NR; ++c) dbuf[c][16] = 0.0f;
  for (int64_t b0 = 0; b0 < blocks; b0 += 16) {
    const int nb = static_cast<int>(std::min<int64_t>(16, blocks - b0));
    const __mmask16 live = static_cast<__mmask16>((1u << nb) - 1u);
    const __m512 s2 = _mm512_loadu_ps(xa.s2.data() + b0);
    for (int c = 0; c < NR; ++c) {
      const __m512i dm = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, dm_index,
                                                     b + c * brow + b0 * bytes, 1);
      _mm512_storeu_ps(dbuf[c], _mm512_mul_ps(s2, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm))));
      if constexpr (kQ4) {
        const __m512 mv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
        acc[c] = _mm512_fmadd_ps(mv, _mm512_loadu_ps(xa.sx.data() + b0), acc[c]);
      }
    }
    for (int j = 0; j < nb; j += 2) {
      const int64_t blk = b0 + j;
      const bool pair = j + 1 < nb;  // else the second half reads zeros (padding block)
      const __m512i hi = _mm512_loadu_si512(xa.hi.data() + blk * kGgmlBlockValues);
      const __m512i lo = _mm512_loadu_si512(xa.lo.data() + blk * kGgmlBlockValues);
      for (int c = 0; c < NR; ++c) {
        const uint8_t* p = b + c * brow + blk * bytes;
        _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchRows * brow), _MM_HINT_T0);
        __m512i z;
        if constexpr (kQ4) {
          // 128-bit lanes: codes 0..15 of block A (low nibbles), 16..31 (high nibbles), then B.
          const __m256i qa =
              _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4)));
          const __m256i qb = pair ? _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                        reinterpret_cast<const __m128i*>(p + bytes + 4)))
                                  : _mm256_setzero_si256();
          z = _mm512_inserti64x4(_mm512_castsi256_si512(qa), qb, 1);
          z = _mm512_and_si512(_mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4), low4);
        } else {
          const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
          const __m256i qb =
              pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + bytes + 2))
                   : _mm256_setzero_si256();
          z = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(qa), qb, 1), bias);
        }
        __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z, hi);
        t = _mm512_slli_epi32(t, 8);
        t = _mm512_dpbusd_epi32(t, z, lo);
        if constexpr (!kQ4) t = _mm512_sub_epi32(t, _mm512_loadu_si512(xa.corr.data() + blk * 8));
        const __m512 sc = _mm512_mask_broadcastss_ps(_mm512_set1_ps(dbuf[c][j]), 0xFF00,
                                                     _mm_load_ss(&dbuf[c][j + 1]));
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), sc, acc[c]);
      }
    }
  }
  for (int c = 0; c < NR; ++c) out[c] = _mm512_reduce_add_ps(acc[c]);
}

using Int8TileFn = void (*)(const Int8Acts& xa, const uint8_t* b, int64_t brow, float* out);

// m = 1 on int8 activation parts; false (nothing written) when an activation is not finite.
template <GgmlQuantType T>
bool gguf_mm_int8(const GgufMmParams& p) {
  std::vector<float> row;
  const float* x = static_cast<const float*>(p.a);
  if (p.a_dtype != DType::kFloat32 || p.a_stride_k != 1) {
    row.resize(static_cast<size_t>(p.k));
    for (int64_t t = 0; t < p.k; ++t)
      row[static_cast<size_t>(t)] = load_a(p.a, p.a_dtype, t * p.a_stride_k);
    x = row.data();
  }
  Int8Acts xa;
  if (!quantize_int8_pair(x, p.k, T == GgmlQuantType::kQ8_0, xa)) return false;
  constexpr int64_t nr = 4;
  const int64_t full = p.n / nr, units = full + p.n % nr;
#pragma omp parallel for schedule(static) if (p.n * p.k >= kParallelMinMacs)
  for (int64_t u = 0; u < units; ++u) {
    const bool wide = u < full;
    const int64_t j0 = wide ? u * nr : full * nr + (u - full);
    float sums[nr];
    if (wide)
      tile512_int8<T, 4>(xa, p.b + j0 * p.b_row_bytes, p.b_row_bytes, sums);
    else
      tile512_int8<T, 1>(xa, p.b + j0 * p.b_row_bytes, p.b_row_bytes, sums);
    for (int64_t c = 0; c < (wide ? nr : 1); ++c)
      store_out(p.out, p.out_dtype, (j0 + c) * p.out_stride_n, sums[c]);
  }
  return true;
}

// ---- AVX-512: the prefill shape as a packed fp32 GEMM ----
// From kPackedMinM activation rows on, each thread dequantizes a panel of 32 weight rows once
// per call into fp32, transposed ([k][32]: the 32 weights of one k index in two vectors), and
// runs a register-blocked kernel over every activation row: 12 rows x 32 weight rows in 24
// accumulators, per k index two vector loads, 12 broadcasts and 24 FMAs. The tiles above
// dequantize each block again for every 12 activation rows and reduce horizontally at the end,
// which held them to ~16 GMAC/s on one core; this is bound by the FMA ports. The weights are
// the same fp32 values (d * q + m with one fused rounding), the sums fp32 in k order, so the
// numerics are the fp32 dequantizing path's. Not bf16 on purpose: the chat's answer needs
// fp32 activations (docs/CHAT.md), and vdpbf16ps on split activations costs as many
// instructions per multiply-add as fp32 FMAs.
constexpr int64_t kPanel = 32;
constexpr int kPackedMr = 12;
constexpr int64_t kPackedMinM = 16;

// r[t] = column t of the 16 x 16 matrix whose row i was r[i] (three shuffle stages).
FI_GGUF_AVX512 inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);      // per 128-bit lane: a0 b0 a1 b1
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);  // a2 b2 a3 b3
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + j], lane L: rows 4i..4i+3 of column 4L + j
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 ab_lo = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 ab_hi = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 cd_lo = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 cd_hi = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(3, 2, 3, 2));
    t[j] = _mm512_shuffle_f32x4(ab_lo, cd_lo, _MM_SHUFFLE(2, 0, 2, 0));
    t[4 + j] = _mm512_shuffle_f32x4(ab_lo, cd_lo, _MM_SHUFFLE(3, 1, 3, 1));
    t[8 + j] = _mm512_shuffle_f32x4(ab_hi, cd_hi, _MM_SHUFFLE(2, 0, 2, 0));
    t[12 + j] = _mm512_shuffle_f32x4(ab_hi, cd_hi, _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// bp[t * 32 + c] = dequant(row c)[t] for c < rows, 0 for the padding rows: per block, 16 rows
// dequantized in registers and transposed 16 x 16 at a time (scalar transposing stores cost
// about as much as the kernel itself at m = 64).
template <GgmlQuantType T>
FI_GGUF_AVX512 void pack_panel(const uint8_t* b, int64_t brow, int64_t rows, int64_t blocks,
                               float* bp) {
  constexpr int64_t bytes = ggml_block_bytes(T);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int64_t g = 0; g < kPanel; g += 16) {
      __m512 lo[16], hi[16];
      for (int i = 0; i < 16; ++i) {
        if (g + i < rows) {
          dequant512<T>(b + (g + i) * brow + blk * bytes, lo[i], hi[i]);
        } else {
          lo[i] = hi[i] = _mm512_setzero_ps();
        }
      }
      transpose16(lo);
      transpose16(hi);
      float* dst = bp + blk * kGgmlBlockValues * kPanel + g;
      for (int t = 0; t < 16; ++t) {
        _mm512_store_ps(dst + t * kPanel, lo[t]);
        _mm512_store_ps(dst + (t + 16) * kPanel, hi[t]);
      }
    }
  }
}

// MR activation rows x the 32 weight rows of a packed panel; c[r * 32 + col]. The sums run
// in two levels: 32 k indices (one GGUF block) in registers, then added to c in L1, so each
// fp32 sum has k / 32 + 32 terms in sequence rather than k (the old tiles' 16 lanes had the
// same effect; one sequence of 1536 terms moved the chat's logits visibly more).
template <int MR>
FI_GGUF_AVX512 void packed_kernel(const float* a, int64_t lda, const float* bp, int64_t k,
                                  float* c) {
  for (int r = 0; r < MR; ++r) {
    _mm512_storeu_ps(c + r * kPanel, _mm512_setzero_ps());
    _mm512_storeu_ps(c + r * kPanel + 16, _mm512_setzero_ps());
  }
  for (int64_t t0 = 0; t0 < k; t0 += kGgmlBlockValues) {
    __m512 acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t t = t0; t < t0 + kGgmlBlockValues; ++t) {
      const __m512 b0 = _mm512_load_ps(bp + t * kPanel);
      const __m512 b1 = _mm512_load_ps(bp + t * kPanel + 16);
      for (int r = 0; r < MR; ++r) {
        const __m512 x = _mm512_set1_ps(a[r * lda + t]);
        acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
      }
    }
    for (int r = 0; r < MR; ++r) {
      _mm512_storeu_ps(c + r * kPanel, _mm512_add_ps(_mm512_loadu_ps(c + r * kPanel), acc[r][0]));
      _mm512_storeu_ps(c + r * kPanel + 16,
                       _mm512_add_ps(_mm512_loadu_ps(c + r * kPanel + 16), acc[r][1]));
    }
  }
}

using PackedFn = void (*)(const float* a, int64_t lda, const float* bp, int64_t k, float* c);

template <GgmlQuantType T>
void gguf_mm_packed(const GgufMmParams& p, const float* a, int64_t lda) {
  static constexpr PackedFn kernels[kPackedMr] = {
      &packed_kernel<1>, &packed_kernel<2>,  &packed_kernel<3>,  &packed_kernel<4>,
      &packed_kernel<5>, &packed_kernel<6>,  &packed_kernel<7>,  &packed_kernel<8>,
      &packed_kernel<9>, &packed_kernel<10>, &packed_kernel<11>, &packed_kernel<12>};
  const int64_t blocks = p.k / kGgmlBlockValues;
  const int64_t panels = (p.n + kPanel - 1) / kPanel;
  // Activation rows in chunks of about 1 MiB (fp32), so a chunk stays in L2 while every panel
  // of a thread runs over it; each panel is packed again per chunk (~6 rows' worth of kernel
  // time). One chunk of all m rows read the activations once per panel instead: 0.9 GB per
  // gate+up call at m = 4096 (batch 8 x 512).
  const int64_t max_rows = std::max<int64_t>(kPackedMr, (int64_t{1} << 20) / (p.k * 4));
  const int64_t n_chunks = (p.m + max_rows - 1) / max_rows;
  const int64_t chunk = ((p.m + n_chunks - 1) / n_chunks + kPackedMr - 1) / kPackedMr * kPackedMr;
#pragma omp parallel if (p.m * p.n * p.k >= kParallelMinMacs)
  {
    // One panel per thread at a time (k * 128 bytes: 72 KiB at k = 576, 192 KiB at 1536, in L2),
    // 64-byte aligned for the vector loads.
    std::vector<float> buf(static_cast<size_t>(p.k * kPanel + 16));
    float* bp = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) &
                                         ~static_cast<uintptr_t>(63));
    alignas(64) float c[kPackedMr * kPanel];
    for (int64_t m0 = 0; m0 < p.m; m0 += chunk) {
      const int64_t m1 = std::min(p.m, m0 + chunk);
      // The same panels go to the same thread in every chunk (static schedule, same count), so
      // no barrier is needed between chunks.
#pragma omp for schedule(static) nowait
      for (int64_t pn = 0; pn < panels; ++pn) {
        const int64_t j0 = pn * kPanel;
        const int64_t cols = std::min(kPanel, p.n - j0);
        pack_panel<T>(p.b + j0 * p.b_row_bytes, p.b_row_bytes, cols, blocks, bp);
        for (int64_t i0 = m0; i0 < m1; i0 += kPackedMr) {
          const int rows = static_cast<int>(std::min<int64_t>(kPackedMr, m1 - i0));
          kernels[rows - 1](a + i0 * lda, lda, bp, p.k, c);
          for (int r = 0; r < rows; ++r) {
            const int64_t o = (i0 + r) * p.out_stride_m + j0 * p.out_stride_n;
            if (p.out_dtype == DType::kFloat32 && p.out_stride_n == 1) {
              std::memcpy(static_cast<float*>(p.out) + o, c + r * kPanel,
                          static_cast<size_t>(cols) * sizeof(float));
            } else {
              for (int64_t col = 0; col < cols; ++col)
                store_out(p.out, p.out_dtype, o + col * p.out_stride_n, c[r * kPanel + col]);
            }
          }
        }
      }
    }
  }
}

#endif  // FLASHINFER_CPU_X86_INTRINSICS

// The tiles of one tier: fn[r - 1][0] is R = r with NR = 1, fn[r - 1][1] is R = r with the
// tier's wide NR (4 weight rows for the decode shape R = 1, 2 for larger R).
constexpr int kMaxR = 12;
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
    t.max_r = 12;
    t.fn[0][0] = &tile512<T, 1, 1>, t.fn[0][1] = &tile512<T, 1, 4>, t.wide_nr[0] = 4;
    // From two activation rows on, d and m come from the per-16-block gather (tile512_dm).
    t.fn[1][0] = &tile512_dm<T, 2, 1>, t.fn[1][1] = &tile512_dm<T, 2, 2>, t.wide_nr[1] = 2;
    t.fn[2][0] = &tile512_dm<T, 3, 1>, t.fn[2][1] = &tile512_dm<T, 3, 2>, t.wide_nr[2] = 2;
    t.fn[3][0] = &tile512_dm<T, 4, 1>, t.fn[3][1] = &tile512_dm<T, 4, 2>, t.wide_nr[3] = 2;
    t.fn[4][0] = &tile512_dm<T, 5, 1>, t.fn[4][1] = &tile512_dm<T, 5, 2>, t.wide_nr[4] = 2;
    t.fn[5][0] = &tile512_dm<T, 6, 1>, t.fn[5][1] = &tile512_dm<T, 6, 2>, t.wide_nr[5] = 2;
    t.fn[6][0] = &tile512_dm<T, 7, 1>, t.fn[6][1] = &tile512_dm<T, 7, 2>, t.wide_nr[6] = 2;
    t.fn[7][0] = &tile512_dm<T, 8, 1>, t.fn[7][1] = &tile512_dm<T, 8, 2>, t.wide_nr[7] = 2;
    t.fn[8][0] = &tile512_dm<T, 9, 1>, t.fn[8][1] = &tile512_dm<T, 9, 2>, t.wide_nr[8] = 2;
    t.fn[9][0] = &tile512_dm<T, 10, 1>, t.fn[9][1] = &tile512_dm<T, 10, 2>, t.wide_nr[9] = 2;
    t.fn[10][0] = &tile512_dm<T, 11, 1>, t.fn[10][1] = &tile512_dm<T, 11, 2>, t.wide_nr[10] = 2;
    t.fn[11][0] = &tile512_dm<T, 12, 1>, t.fn[11][1] = &tile512_dm<T, 12, 2>, t.wide_nr[11] = 2;
    if constexpr (T == GgmlQuantType::kQ8_0) {
      // One activation row: scaling each block's sum by d (tile512_q8_0_sum: 4 + 3 R vector
      // instructions per block and weight row) beats scaling every code (6 + 2 R).
      t.fn[0][0] = &tile512_q8_0_sum<1, 1>, t.fn[0][1] = &tile512_q8_0_sum<1, 4>;
    }
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
  // With several activation-row tiles (prefill), units are grouped into chunks of about 16 KiB
  // of weight rows and each chunk runs every activation tile over all its units: the chunk
  // stays in L1 and the activation tile is reused across the chunk, so the activations are
  // read once per chunk rather than once per unit (at m = 128 the per-unit order streamed
  // about 400 MB of activations from L2 per call).
  const int64_t per_chunk =
      r_main == p.m ? 1 : std::max<int64_t>(1, (int64_t{16} << 10) / (nr * p.b_row_bytes));
  const int64_t chunks = (units + per_chunk - 1) / per_chunk;
#pragma omp parallel for schedule(static) if (p.m * p.n * p.k >= kParallelMinMacs)
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int64_t u_end = std::min(units, (ch + 1) * per_chunk);
    float sums[kMaxR * 4];
    for (int64_t i0 = 0; i0 < p.m; i0 += r_main) {
      const int rows = static_cast<int>(std::min<int64_t>(r_main, p.m - i0));
      for (int64_t u = ch * per_chunk; u < u_end; ++u) {
        const int64_t j0 = u < full ? u * nr : full * nr + (u - full);
        const int64_t cols = u < full ? nr : 1;
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
  // The int8 path returns false for non-finite activations; those then take the fp32
  // dequantizing path, which propagates inf and NaN as the scalar reference does (the bf16
  // split of an inf is inf + NaN).
  bool fp32_only = false;
  if (isa == CpuIsa::kAvx512 && p.m == 1 && p.a_dtype != DType::kBFloat16 && has_avx512_vnni() &&
      g_int8_path_enabled.load(std::memory_order_relaxed)) {
    // The decode shape on two int8 parts of each activation (about 2^-16 of the block's
    // largest |x|); bf16 activations keep the exact paths below.
    if (p.type == GgmlQuantType::kQ4_1 ? gguf_mm_int8<GgmlQuantType::kQ4_1>(p)
                                       : gguf_mm_int8<GgmlQuantType::kQ8_0>(p))
      return;
    fp32_only = true;
  }
  if (!fp32_only && isa == CpuIsa::kAvx512 && p.type == GgmlQuantType::kQ4_1 &&
      has_avx512_bf16_vbmi()) {
    // bf16 activations are exact in one part, at any m. Other dtypes take two parts for the
    // decode shape (m = 1), where unpacking the codes dominates; from m = 2 on the fp32
    // dequantization shared by the activation rows is cheaper than two vdpbf16ps per row.
    if (p.a_dtype == DType::kBFloat16) {
      gguf_mm_q4_1_split<1>(p);
      return;
    }
    if (p.m == 1) {
      gguf_mm_q4_1_split<2>(p);
      return;
    }
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
#if FLASHINFER_CPU_X86_INTRINSICS
  if (isa == CpuIsa::kAvx512 && p.m >= kPackedMinM) {
    if (p.type == GgmlQuantType::kQ4_1)
      gguf_mm_packed<GgmlQuantType::kQ4_1>(p, a, lda);
    else
      gguf_mm_packed<GgmlQuantType::kQ8_0>(p, a, lda);
    return;
  }
#endif
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

bool gguf_mm_has_int8_path() {
#if FLASHINFER_CPU_X86_INTRINSICS
  return detected_cpu_isa() >= CpuIsa::kAvx512 && has_avx512_vnni() &&
         g_int8_path_enabled.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void set_gguf_mm_int8_path_enabled(bool enabled) {
#if FLASHINFER_CPU_X86_INTRINSICS
  g_int8_path_enabled.store(enabled, std::memory_order_relaxed);
#else
  (void)enabled;
#endif
}

bool gguf_mm_has_split_path() {
#if FLASHINFER_CPU_X86_INTRINSICS
  return detected_cpu_isa() >= CpuIsa::kAvx512 && has_avx512_bf16_vbmi();
#else
  return false;
#endif
}

}  // namespace flashinfer::kernels::cpu
