// Private: cutlass_fused_moe's SM90 mixed-input weights and scales read in place, as the CUDA
// GEMV kernels (src/kernels/cuda/moe_cuda.cu) read them: no de-interleaved copy is made.
//   - W4A16 MXFP4: weights from interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4"), ue8m0
//     scales from interleave_moe_scales_for_sm90_mixed_gemm(s, group_size=32);
//   - Humming MXFP4 x FP8: weights from the "fp4_fp8" interleave (16-bit units, signs moved), the
//     per-block exponent offsets in the same scale fold, each code turned into the fp8 MMA operand
//     (humming_operand, which the CPU reference uses too);
//   - W4A8 INT4: weights from the "int4" interleave (16-bit units), 16-bit group scales (128
//     columns) folded by interleave_moe_scales_for_sm90_mixed_gemm(s, group_size=128);
//   - weight-only INT4 (not an SM90 layout: TensorRT-LLM's SM80 fpA_intB order, which upstream
//     runs on sm80+): [k / 128, n] 16-bit scales and zero points, the dequantization in the 16-bit
//     type (woq_int4_operand, shared with the CPU reference), read by woq_lane_rows.
// The CPU reference undoes the weight interleaves independently (a bit permutation found by
// running the forward transform, kernels::cpu::sm90_deinterleave_fp4_weights); the unit tests
// (tests/ops/test_moe_cutlass_fp4.cpp, test_moe_cutlass_humming.cpp) check these rules against
// it over whole tiles. Integer and bit arithmetic only, but for the fp32 sums of the lane loop.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cuda/device/host_device.h"  // FLASHINFER_UNROLL (plain C++)
#include "kernels/fp32_rules.h"               // fp32_mul, fp32_div
#include "kernels/moe_weight_prep_rules.h"    // sm90_fp4_bit_dst
#include "kernels/nvfp4_rules.h"              // e2m1_code_to_float, e4m3_code_to_float
#include "kernels/quantization_params.h"      // FLASHINFER_HD, f32_from_bits

namespace flashinfer::kernels {

/// Where a 32-bit word of the "fp4" layout lies. A 16-row block's 64-element K partition is
/// 16 rows x 32 bytes; word w (0..7: bytes 4w..4w+3) of physical row pr (0..15) holds, for the
/// logical rows pr % 8 and pr % 8 + 8 of the block, the 4 elements col0 + {0, 1, 8, 9} of the
/// partition each (sm90_interleave_weight_unit's lane 4 * mma + w % 4 wrote it, mma = 2 (w / 4)
/// + pr / 8, from bytes mma * 8 + w % 4 and + 4 of the two rows).
FLASHINFER_HD int sm90_fp4_word_col0(int pr, int w) {
  return 16 * (2 * (w / 4) + pr / 8) + 2 * (w % 4);
}

/// Nibble n (0..7) of the word before the interleave's bit permutation (sm90_permute_fp4_bits):
/// the e2m1 code of logical row pr % 8 + 8 * ((n >> 1) & 1), element col0 + (n & 1) + 8 * (n >> 2).
/// Each code bit is read where the permutation put it (sm90_fp4_bit_dst).
FLASHINFER_HD uint32_t sm90_fp4_word_code(uint32_t v, int n) {
  uint32_t code = 0;
  FLASHINFER_UNROLL
  for (int b = 0; b < 4; ++b) code |= ((v >> sm90_fp4_bit_dst(4 * n + b)) & 1u) << b;
  return code;
}

/// The "fp4_fp8" layout (Humming): word w (0..7) of physical row pr of a 16-row block's 64-element
/// partition holds one 16-bit unit (4 consecutive codes) of logical row pr % 8 in its low half and
/// the same unit of row pr % 8 + 8 in its high half, at elements 32 (w / 4) + 16 (pr / 8) +
/// 4 (w % 4) + {0..3} (sm90_interleave_weight_unit's lane 8 (w / 4) + 4 (pr / 8) + w % 4 wrote
/// it): with sm90_fp4_lane's lanes, element i of a lane's 16 columns is nibble i % 4 (+ 4 for row
/// row_lo + 8) of its word i / 4. Nibble n's code: its magnitude stays in place, its sign was
/// moved to bit 3 of nibble 2n + 1 (n < 4) or 2 (n - 4) (sm90_move_fp4_signs).
FLASHINFER_HD uint32_t sm90_fp4_fp8_word_code(uint32_t v, int n) {
  const int to = n < 4 ? 2 * n + 1 : 2 * (n - 4);
  return ((v >> (4 * n)) & 7u) | ((v >> (4 * to + 3)) & 1u) << 3;
}

/// The fp8 MMA operand the kPreMmaE8M0 mainloop makes of one Humming weight code: a per-code
/// byte table (code 0 gets no offset) plus 8 * offset, computed in one uint32 lane per four codes,
/// with the code's sign ORed in [wheel 0.7.2.post1 mixed_input_utils.hpp:603]. For the
/// preparation's offsets (1..12) this is exactly code * 2^(offset - 6); outside that range the
/// byte arithmetic is kept as is (code 1 at offset 0 gives 0, offsets > 12 wrap into the sign bit
/// or, from 32 on, carry into the next code's byte).
FLASHINFER_HD float humming_operand(uint32_t code, uint32_t offset) {
  const uint32_t lo = offset * 0x08080800u + 0x0c080000u;  // codes 0..3
  const uint32_t hi = offset * 0x08080808u + 0x1c181410u;  // codes 4..7
  const uint32_t em = code & 7u;
  const uint32_t byte = (em < 4 ? lo >> (8 * em) : hi >> (8 * (em - 4))) & 0xffu;
  return e4m3_code_to_float(static_cast<uint8_t>(byte | ((code & 8u) << 4)));
}

/// Humming's per-row fp8 quantization of GEMM inputs (expandInputRowsKernel for GEMM1's,
/// doActivationKernel for GEMM2's): quant = 448 / amax over the row (1 for a zero row; amax floored
/// at 448 / FLT_MAX so the quotient stays finite), each value e4m3_satfinite(v * quant) read back
/// as its fp32 value; the GEMM's alpha then carries the dequantization scale 1 / quant.
FLASHINFER_HD float humming_quant(float amax) {
  constexpr float kMinAmax = 448.0f / 3.40282347e+38f;
  return amax > 0.0f ? fp32_div(448.0f, amax > kMinAmax ? amax : kMinAmax) : 1.0f;
}
FLASHINFER_HD float humming_fp8(float v, float quant) {
  return e4m3_code_to_float(float_to_e4m3fn_bits(fp32_mul(v, quant), true));
}

/// W4A8's signed int4 code (two's complement: the mainloop's int4 -> e4m3 table maps codes 8..15
/// to -8..-1).
FLASHINFER_HD float sm90_int4_value(uint32_t code) {
  return static_cast<float>(static_cast<int>(code & 15u) - (code & 8u ? 16 : 0));
}

/// A value's fp8 GEMM input: e4m3_satfinite (RNE) read back as fp32 (W4A8's activations, after
/// the pre-quant scale).
FLASHINFER_HD float e4m3_satfinite_value(float v) {
  return e4m3_code_to_float(float_to_e4m3fn_bits(v, true));
}

/// The element of scale (row r, group grp = column / 128) of one expert's [rows, k / 128] 16-bit
/// scales folded by interleave_moe_scales_for_sm90_mixed_gemm(group_size=128): 64 x 128 logical
/// blocks, out[rb, kb, f, m] = in[64 rb + 8 m + f, kb].
FLASHINFER_HD int64_t sm90_fold128_scale_index(int64_t k, int64_t r, int64_t grp) {
  return (((r / 64) * (k / 128) + grp) * 8 + r % 8) * 8 + (r % 64) / 8;
}

/// The byte of scale (row r, group grp = column / 32) of one expert's [rows, k / 32] ue8m0 scales
/// folded by interleave_moe_scales_for_sm90_mixed_gemm(group_size=32): [rows / 64, k / 128, 16,
/// 16] with out[rb, kb, fm, m * 4 + g] = in[rb * 64 + m * 16 + fm, kb * 4 + g].
FLASHINFER_HD int64_t sm90_fold32_scale_index(int64_t k, int64_t r, int64_t grp) {
  const int64_t rb = r / 64, m = (r % 64) / 16, fm = r % 16, kb = grp / 4, g4 = grp % 4;
  return ((rb * (k / 128) + kb) * 16 + fm) * 16 + m * 4 + g4;
}

/// A lane's share of a warp's 16-row block in the GEMV kernels: in each 64-column K partition,
/// lane L (0..31) reads the 16 bytes (words 4 (L % 2) .. + 3) of physical row L / 2, which hold
/// logical rows row_lo = L / 2 % 8 and row_lo + 8 of the block over the 16 columns col .. col + 15
/// of the partition (col = 16 mma, mma = 2 (L % 2) + L / 16: the same for its four words). The
/// four lanes of one row_lo are L, L ^ 1, L ^ 16 and L ^ 17.
struct Sm90Fp4Lane {
  int row_lo;    // logical rows row_lo and row_lo + 8 of the 16-row block
  int col;       // first of the 16 columns within the 64-column partition
  int byte_off;  // first byte within the block's partition: physical row pr, 32 bytes a row
  int pr;        // physical row within the block (its bytes are at pr * row_bytes)
};
FLASHINFER_HD Sm90Fp4Lane sm90_fp4_lane(int lane) {
  Sm90Fp4Lane l;
  l.pr = lane / 2;
  l.row_lo = l.pr % 8;
  l.col = 16 * (2 * (lane % 2) + lane / 16);
  l.byte_off = 16 * (lane % 2);
  return l;
}

/// Which SM90 mixed-input operand a GEMV kernel reads.
enum class Sm90Mixed : int {
  kW4A16 = 0,    // "fp4" layout, e2m1 codes, times a ue8m0 scale per group of 32
  kHumming = 1,  // "fp4_fp8" layout, humming_operand(code, the group's exponent offset)
  kW4A8 = 2,     // "int4" layout, signed int4 codes, times a 16-bit scale per group of 128
  kWoqInt4 = 3   // weight-only INT4 (SM80 fpA_intB layout, woq_lane_rows; the same kernels)
};

/// Column (0..15 within the lane's 16) of element i of the lane's decoded values: the "fp4"
/// layout's word i / 4 holds elements 2 (i / 4) + {0, 1, 8, 9} of a row (nibbles (i % 2) +
/// 4 ((i / 2) % 2) for row_lo, + 2 for row_lo + 8); the "fp4_fp8" layout keeps them in order.
template <Sm90Mixed K>
FLASHINFER_HD int sm90_mixed_lane_col(int i) {
  if constexpr (K == Sm90Mixed::kW4A16) return 2 * (i / 4) + (i & 1) + 8 * ((i >> 1) & 1);
  return i;
}

/// The lane's 32 weight values of one partition, in the lane's order (element i of lo / hi is
/// row_lo's / row_lo + 8's value at column sm90_mixed_lane_col<K>(i)): W4A16 the e2m1 values
/// (unscaled), Humming the fp8 operands with the rows' exponent offsets off_lo / off_hi, W4A8 the
/// signed int4 values (unscaled). The "int4" layout is "fp4_fp8"'s without the sign moves.
template <Sm90Mixed K>
FLASHINFER_HD void sm90_mixed_lane_decode(const uint32_t (&words)[4], uint32_t off_lo,
                                          uint32_t off_hi, float (&lo)[16], float (&hi)[16]) {
  FLASHINFER_UNROLL
  for (int i = 0; i < 16; ++i) {
    if constexpr (K == Sm90Mixed::kW4A16) {
      const int n = (i & 1) + 4 * ((i >> 1) & 1);  // row_lo's nibble; row_lo + 8's is n + 2
      lo[i] = e2m1_code_to_float(static_cast<uint8_t>(sm90_fp4_word_code(words[i / 4], n)));
      hi[i] = e2m1_code_to_float(static_cast<uint8_t>(sm90_fp4_word_code(words[i / 4], n + 2)));
    } else if constexpr (K == Sm90Mixed::kHumming) {
      lo[i] = humming_operand(sm90_fp4_fp8_word_code(words[i / 4], i % 4), off_lo);
      hi[i] = humming_operand(sm90_fp4_fp8_word_code(words[i / 4], 4 + i % 4), off_hi);
    } else {
      lo[i] = sm90_int4_value(words[i / 4] >> (4 * (i % 4)));
      hi[i] = sm90_int4_value(words[i / 4] >> (4 * (4 + i % 4)));
    }
  }
}

/// 16 bytes at a 16-byte aligned address as four little-endian words: one 128-bit load on the
/// device.
FLASHINFER_HD void sm90_fp4_load16(const uint8_t* at, uint32_t (&words)[4]) {
#ifdef __CUDA_ARCH__
  const uint4 raw = *reinterpret_cast<const uint4*>(at);
  words[0] = raw.x;
  words[1] = raw.y;
  words[2] = raw.z;
  words[3] = raw.w;
#else
  std::memcpy(words, at, sizeof(words));
#endif
}

/// One lane's sums over every 64-column partition of 16-row block `blk` of one expert's [rows, k]
/// weights `w` (layout of K; rows of k / 2 bytes, 16-byte aligned) with their folded scale bytes
/// `sf` (W4A16: ue8m0 scales; Humming: exponent offsets; W4A8: 16-bit scales, fp16 when
/// `half_scales`, else bf16), for `n` (<= P) input rows at once: lo[p]
/// for logical row blk * 16 + row_lo, hi[p] for row_lo + 8 of input row p; x(p, c, xs) fills
/// xs[0, 16) with columns c .. c + 15 of input row p (c a multiple of 16) as floats. Each
/// partition's words are loaded and decoded once for all n
/// rows; each row's 16-column sum is taken in the lane's order, and for W4A16 / W4A8 multiplied by
/// its group's scale (one group covers the 16 columns; W4A16's is a power of two, so only the order
/// of the fp32 sums differs from summing the scaled products). The kernels run this on each lane
/// and add the four lanes of a row (sm90_fp4_lane); the CPU tests run it lane by lane.
template <Sm90Mixed K, int P, class XAt>
FLASHINFER_HD void sm90_mixed_lane_rows(const uint8_t* w, const uint8_t* sf, int64_t k, int64_t blk,
                                        int lane, int n, const XAt& x, float (&lo)[P],
                                        float (&hi)[P], bool half_scales = false) {
  const Sm90Fp4Lane l = sm90_fp4_lane(lane);
  const uint8_t* src = w + (blk * 16 + l.pr) * (k / 2) + l.byte_off;
  const int64_t r_lo = blk * 16 + l.row_lo, parts = k / 64;
  FLASHINFER_UNROLL
  for (int p = 0; p < P; ++p) lo[p] = hi[p] = 0.0f;
  // The next partition's 16 bytes are loaded before this one's are used: two loads in flight.
  uint32_t next[4];
  sm90_fp4_load16(src, next);
  for (int64_t q = 0; q < parts; ++q) {
    uint32_t words[4] = {next[0], next[1], next[2], next[3]};
    if (q + 1 < parts) sm90_fp4_load16(src + 32 * (q + 1), next);
    const int64_t c = 64 * q + l.col;
    uint8_t b_lo = 0, b_hi = 0;  // W4A16's scale / Humming's offset bytes
    float sc_lo = 1.0f, sc_hi = 1.0f;
    if constexpr (K == Sm90Mixed::kW4A8) {
      const auto* s16 = reinterpret_cast<const uint16_t*>(sf);
      const uint16_t u_lo = s16[sm90_fold128_scale_index(k, r_lo, c / 128)];
      const uint16_t u_hi = s16[sm90_fold128_scale_index(k, r_lo + 8, c / 128)];
      sc_lo = half_scales ? half_bits_to_float(u_lo) : bfloat16_bits_to_float(u_lo);
      sc_hi = half_scales ? half_bits_to_float(u_hi) : bfloat16_bits_to_float(u_hi);
    } else {
      b_lo = sf[sm90_fold32_scale_index(k, r_lo, c / 32)];
      b_hi = sf[sm90_fold32_scale_index(k, r_lo + 8, c / 32)];
      if constexpr (K == Sm90Mixed::kW4A16) {
        sc_lo = ue8m0_to_float(b_lo);
        sc_hi = ue8m0_to_float(b_hi);
      }
    }
    float w_lo[16], w_hi[16];
    sm90_mixed_lane_decode<K>(words, b_lo, b_hi, w_lo, w_hi);
    FLASHINFER_UNROLL
    for (int p = 0; p < P; ++p) {
      if (p < n) {
        float xs[16];
        x(p, c, xs);
        float s_lo = 0.0f, s_hi = 0.0f;
        FLASHINFER_UNROLL
        for (int i = 0; i < 16; ++i) {
          const float xv = xs[sm90_mixed_lane_col<K>(i)];
          s_lo += w_lo[i] * xv;
          s_hi += w_hi[i] * xv;
        }
        if constexpr (K == Sm90Mixed::kHumming) {
          lo[p] += s_lo;
          hi[p] += s_hi;
        } else {
          lo[p] += s_lo * sc_lo;
          hi[p] += s_hi * sc_hi;
        }
      }
    }
  }
}

// ---- weight-only INT4 (TensorRT-LLM's SM80 fpA_intB layout) ------------------------------------

/// a + b rounded to fp32 "to odd" (the float nearest toward zero, its last bit set when the sum is
/// inexact; a TwoSum gives the exact error): rounding that to fp16 / bf16 gives a + b rounded once,
/// as one hardware fma / add does (24 bits keep what a second rounding to 8 or 11 bits needs).
FLASHINFER_HD float fp32_sum_round_to_odd(float a, float b) {
  const float s = fp32_add(a, b);
  const float bb = fp32_sub(s, a);
  const float e = fp32_add(fp32_sub(a, fp32_sub(s, bb)), fp32_sub(b, bb));  // a + b == s + e
  if (e == 0.0f) return s;
  uint32_t bits = f32_to_bits(s);
  if (s == 0.0f) {
    bits = e > 0.0f ? 0u : 0x80000000u;
  } else if ((e > 0.0f) != (s > 0.0f)) {
    bits -= 1u;  // one step toward zero
  }
  return f32_from_bits(bits | 1u);
}

/// v rounded to fp16 (`half`) or bf16, as a float.
FLASHINFER_HD float round_to_16(float v, bool half) {
  return half ? half_bits_to_float(float_to_half_bits(v))
              : bfloat16_bits_to_float(float_to_bfloat16_bits(v));
}

/// Weight-only INT4's MMA operand (mma_tensorop_dequantizer): the signed value q (code - 8) times
/// the group scale s, plus the zero point z when `has_z`, in the 16-bit type: bf16 one fused
/// multiply-add (one rounding), fp16 a multiply rounded, then an add rounded. q * s is exact in
/// fp32 but for a bf16 scale above 2^125 or so, whose product overflows to inf here where a
/// hardware fma could still round q * s + z to a finite bf16 (no real scale is near).
FLASHINFER_HD float woq_int4_operand(float q, float s, bool has_z, float z, bool half) {
  const float prod = fp32_mul(q, s);
  if (!has_z) return round_to_16(prod, half);
  return round_to_16(fp32_sum_round_to_odd(half ? round_to_16(prod, true) : prod, z), half);
}

/// Position j (0..31) of a 32-row group after the layout's LDSM permutation holds logical k offset
/// woq_ldsm_k(j) (preprocess_weights_for_mixed_gemm's first step).
FLASHINFER_HD int woq_ldsm_k(int j) {
  constexpr int kLdsm[32] = {0, 1, 8,  9,  16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27,
                             4, 5, 12, 13, 20, 21, 28, 29, 6, 7, 14, 15, 22, 23, 30, 31};
  return kLdsm[j];
}

/// One lane's sums for the weight-only INT4 GEMV kernels, which give a warp the 4 output rows
/// 4 g .. 4 g + 3 of one expert's [rows, k] weights `w` (k = the GEMM's reduction): those rows'
/// 32-bit words are one run of k / 2 of them (ColumnMajorTileInterleave<64, 4>), word 32 b + 8
/// (n % 4) + v % 8 holding row n's 8 elements 8 v .. 8 v + 7 (v = kp / 8, kp the permuted k; v / 8
/// = b), element i at nibble 4 (i % 2) + i / 2, biased by 8. Lane L reads the 16 bytes (words 4 L
/// .. 4 L + 3) of each 512-byte chunk B: row 4 g + (L % 8) / 2, the 32 positions kp = 64 (4 B + L /
/// 8) + 32 (L % 2) + 0..31, one whole 32-group of k (k0 = that first kp, logical k = k0 +
/// woq_ldsm_k(j)) and one [k / 128, n] scale and zero point. acc[p] sums input row p's products
/// (x(p, k0, xs) fills xs[0, 32) with columns k0 .. k0 + 31 as floats; n (<= P) rows). The kernels
/// add the 8 lanes of a row (L ^ 1, L ^ 8, L ^ 16 and their combinations).
template <int P, class XAt>
FLASHINFER_HD void woq_lane_rows(const uint8_t* w, const uint16_t* s, const uint16_t* z, bool half,
                                 int64_t rows, int64_t k, int64_t g, int lane, int n, const XAt& x,
                                 float (&acc)[P]) {
  const int64_t r = 4 * g + (lane % 8) / 2;
  const uint8_t* base = w + g * 4 * (k / 2);
  FLASHINFER_UNROLL
  for (int p = 0; p < P; ++p) acc[p] = 0.0f;
  for (int64_t chunk = 0; chunk * 256 < k; ++chunk) {
    const int64_t b = 4 * chunk + lane / 8;
    if (b >= k / 64) break;  // the last chunk of a k that is not a multiple of 256
    uint32_t words[4];
    sm90_fp4_load16(base + 512 * chunk + 16 * lane, words);
    const int64_t k0 = 64 * b + 32 * (lane % 2);
    const int64_t si = k0 / 128 * rows + r;
    const float sv = half ? half_bits_to_float(s[si]) : bfloat16_bits_to_float(s[si]);
    const float zv = z == nullptr ? 0.0f
                     : half       ? half_bits_to_float(z[si])
                                  : bfloat16_bits_to_float(z[si]);
    float wv[32];  // by permuted position j = 8 (word) + element
    FLASHINFER_UNROLL
    for (int j = 0; j < 32; ++j) {
      const int e = j % 8;
      const uint32_t code = (words[j / 8] >> (4 * (4 * (e % 2) + e / 2))) & 15u;
      wv[j] = woq_int4_operand(static_cast<float>(static_cast<int>(code) - 8), sv, z != nullptr, zv,
                               half);
    }
    FLASHINFER_UNROLL
    for (int p = 0; p < P; ++p) {
      if (p < n) {
        float xs[32];
        x(p, k0, xs);
        float sum = 0.0f;
        FLASHINFER_UNROLL
        for (int j = 0; j < 32; ++j) sum += wv[j] * xs[woq_ldsm_k(j)];
        acc[p] += sum;
      }
    }
  }
}

}  // namespace flashinfer::kernels
