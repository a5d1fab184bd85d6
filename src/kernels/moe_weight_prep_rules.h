// Private: the per-element steps of the SM90 mixed-input MoE weight preparation that the CPU
// reference (src/kernels/cpu/moe_weight_prep_cpu.cpp) and the CUDA kernels
// (src/kernels/cuda/moe_weight_prep_cuda.cu) share, so both write the same bytes:
//   - interleave_moe_weights_for_sm90_mixed_gemm: one 16-lane unit of a row pair's 64-element
//     partition (the bit moves and index maps are upstream's: docs/MOE.md);
//   - interleave_moe_scales_for_sm90_mixed_gemm: the source element of each output element;
//   - preprocess_moe_weights_for_sm90_mixed_gemm_humming: the per-expert E8M0 range clamp, the
//     offset byte, how far a block's scale is raised, the residual, and the payload byte rewrite
//     through the rewrite table (built once on the host by kernels::cpu::humming_rewrite_code and
//     handed to both backends).
// Integer and bit arithmetic only. Unit-tested on the CPU: tests/ops/test_moe_weight_prep.cpp.
#pragma once

#include <cstdint>

#include "kernels/cpu/moe_weight_prep_cpu.h"  // the parameter structs
#include "kernels/quantization_params.h"      // FLASHINFER_HD, f32_from_bits

namespace flashinfer::kernels {

/// "fp4": where source bit i (0..31) of a row pair's 32-bit group goes (also read back in place by
/// the mixed-input MoE kernels, kernels/moe_sm90_mixed_rules.h).
FLASHINFER_HD int sm90_fp4_bit_dst(int i) {
  constexpr int kFp4BitDst[32] = {6, 7, 8, 15, 22, 23, 24, 31, 3,  4,  5,  12, 19, 20, 21, 28,
                                  0, 1, 2, 9,  16, 17, 18, 25, 13, 10, 11, 14, 29, 26, 27, 30};
  return kFp4BitDst[i];
}
/// "fp4": the 32-bit group of a row pair (bytes: row r col c, row r + 8 col c, row r col c + 4,
/// row r + 8 col c + 4, little-endian) with source bit i moved to bit sm90_fp4_bit_dst(i).
FLASHINFER_HD uint32_t sm90_permute_fp4_bits(uint32_t v) {
  uint32_t out = 0;
  for (int i = 0; i < 32; ++i) out |= ((v >> i) & 1u) << sm90_fp4_bit_dst(i);
  return out;
}

/// "fp4_fp8": magnitudes stay; the sign of nibble j moves to nibble 2j + 1 (j < 4) or 2(j - 4)
/// (j >= 4).
FLASHINFER_HD uint32_t sm90_move_fp4_signs(uint32_t v) {
  uint32_t out = v & 0x77777777u;
  for (int j = 0; j < 8; ++j) {
    const int to = j < 4 ? 2 * j + 1 : 2 * (j - 4);
    out |= ((v >> (4 * j + 3)) & 1u) << (4 * to + 3);
  }
  return out;
}

/// One unit of interleave_moe_weights_for_sm90_mixed_gemm: expert e, row pair b (rows r and
/// r + 8 of a 16-row block), 64-element K partition q, lane 0..15. Each (b, q, lane) writes
/// bytes no other one writes, so the units may run in any order.
FLASHINFER_HD void sm90_interleave_weight_unit(const Sm90WeightInterleaveParams& p, int64_t e,
                                               int64_t b, int64_t q, int64_t lane) {
  const int64_t row_bytes = p.k / 2, per_expert = p.n * row_bytes;
  const uint8_t* src = p.in + e * per_expert;
  uint8_t* dst = p.out + e * per_expert;
  const int64_t r = b / 8 * 16 + b % 8;
  if (p.quant_type == Sm90QuantType::kFp4) {
    const int64_t mma = lane / 4;
    const int64_t dst_r = r + (mma % 2) * 8;
    const int64_t col = q * 32 + mma * 8 + lane % 4;
    const int64_t dcol = q * 32 + (lane / 8) * 16 + (lane % 4) * 4;
    const uint32_t raw = static_cast<uint32_t>(src[r * row_bytes + col]) |
                         static_cast<uint32_t>(src[(r + 8) * row_bytes + col]) << 8 |
                         static_cast<uint32_t>(src[r * row_bytes + col + 4]) << 16 |
                         static_cast<uint32_t>(src[(r + 8) * row_bytes + col + 4]) << 24;
    const uint32_t v = sm90_permute_fp4_bits(raw);
    for (int i = 0; i < 4; ++i)
      dst[dst_r * row_bytes + dcol + i] = static_cast<uint8_t>(v >> (8 * i));
    return;
  }
  // 16-bit units (four 4-bit values, little-endian); a row holds k / 4 of them.
  const int64_t row_units = p.k / 4;
  const int64_t dst_r = r + ((lane % 8) / 4) * 8;
  const int64_t col = q * 16 + lane;
  const int64_t dcol = q * 16 + (lane / 8) * 8 + (lane % 4) * 2;
  const uint8_t* a8 = src + 2 * (r * row_units + col);
  const uint8_t* c8 = src + 2 * ((r + 8) * row_units + col);
  uint32_t ac = static_cast<uint32_t>(a8[0]) | static_cast<uint32_t>(a8[1]) << 8 |
                static_cast<uint32_t>(c8[0]) << 16 | static_cast<uint32_t>(c8[1]) << 24;
  if (p.quant_type == Sm90QuantType::kFp4Fp8) ac = sm90_move_fp4_signs(ac);
  uint8_t* d = dst + 2 * (dst_r * row_units + dcol);
  for (int i = 0; i < 4; ++i) d[i] = static_cast<uint8_t>(ac >> (8 * i));
}

/// interleave_moe_scales_for_sm90_mixed_gemm: the element of `in` that output element o
/// (o = (((e rb_n + rb) kb_n + kb) fm_n + fm) cols + c, the output's order) comes from.
FLASHINFER_HD int64_t sm90_interleave_scale_source(const Sm90ScaleInterleaveParams& p, int64_t o) {
  const int64_t G = p.groups_per_k128, fm_n = p.folded_m, ms_n = p.m_slices;
  const int64_t kb_n = p.k_groups / G, rb_n = p.rows / 64, cols = ms_n * G;
  const int64_t c = o % cols;
  const int64_t fm = o / cols % fm_n;
  const int64_t kb = o / cols / fm_n % kb_n;
  const int64_t rb = o / cols / fm_n / kb_n % rb_n;
  const int64_t e = o / cols / fm_n / kb_n / rb_n;
  const int64_t ms = c / G, g = c % G;
  const int64_t row = rb * 64 + ms * fm_n + fm;
  return (e * p.rows + row) * p.k_groups + kb * G + g;
}

/// Output elements of interleave_moe_scales_for_sm90_mixed_gemm (none for a degenerate shape,
/// whose divisions sm90_interleave_scale_source must then never run).
FLASHINFER_HD int64_t sm90_interleave_scale_count(const Sm90ScaleInterleaveParams& p) {
  const int64_t G = p.groups_per_k128;
  if (G <= 0 || p.folded_m <= 0 || p.m_slices <= 0) return 0;
  return p.experts * (p.rows / 64) * (p.k_groups / G) * p.folded_m * p.m_slices * G;
}

/// Rows of the payload rewrite table: one per delta (how far a block's E8M0 scale is raised,
/// 0..255), 16 codes each.
inline constexpr int kHummingTableRows = 256;
inline constexpr int kHummingTableBytes = kHummingTableRows * 16;

/// The expert's new low end from its largest and smallest E8M0 scale: the range hi - lo clamped
/// to max_range (0..11), the low end raised to hi - range (upstream's uint8 arithmetic).
FLASHINFER_HD int humming_low(int hi, int lo, int max_range) {
  const int range = hi - lo < max_range ? hi - lo : max_range;
  return hi - range;
}

/// How far scale s is raised by the clamp: max(s, lo_new) - s (0..255).
FLASHINFER_HD int humming_delta(int s, int lo_new) { return s < lo_new ? lo_new - s : 0; }

/// The offset byte of scale s: (max(s, lo_new) - lo_new + 1) & 15.
FLASHINFER_HD uint8_t humming_offset(int s, int lo_new) {
  const int clamped = s < lo_new ? lo_new : s;
  return static_cast<uint8_t>((clamped - lo_new + 1) & 0x0F);
}

/// The expert's residual 2^(lo_new - 127) / 2 = 2^(lo_new - 128) in fp32, built on the bits
/// (exact): what exp2f(lo_new - 127) * 0.5f gives, subnormal for lo_new 0 and 1, +inf for 255
/// (exp2f(128) overflows before the halving).
FLASHINFER_HD float humming_residual(int lo_new) {
  if (lo_new >= 255) return f32_from_bits(0x7F800000u);
  if (lo_new >= 2) return f32_from_bits(static_cast<uint32_t>(lo_new - 1) << 23);
  return f32_from_bits(lo_new == 1 ? 0x00400000u : 0x00200000u);  // 2^-127, 2^-128
}

/// Payload byte b (two FP4 codes, low nibble first) of a block raised by delta, rewritten
/// through `row`, the table's 16 codes for that delta.
FLASHINFER_HD uint8_t humming_rewrite_byte(const uint8_t* row, uint8_t b) {
  return static_cast<uint8_t>(row[b & 0x0F] | (row[b >> 4] << 4));
}

}  // namespace flashinfer::kernels
