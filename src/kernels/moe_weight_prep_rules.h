// Private: the per-element steps of the Humming MXFP4 preparation
// (preprocess_moe_weights_for_sm90_mixed_gemm_humming) that the CPU reference
// (src/kernels/cpu/moe_weight_prep_cpu.cpp) and the CUDA kernels
// (src/kernels/cuda/moe_weight_prep_cuda.cu) share, so both write the same bytes: the per-expert
// E8M0 range clamp, the offset byte, how far a block's scale is raised, the residual, and the
// payload byte rewrite through the rewrite table. Integer and bit arithmetic only (the table
// itself is built once on the host by kernels::cpu::humming_rewrite_code and handed to both
// backends). Unit-tested on the CPU: tests/ops/test_moe_weight_prep.cpp.
#pragma once

#include <cstdint>

#include "kernels/quantization_params.h"  // FLASHINFER_HD, f32_from_bits

namespace flashinfer::kernels {

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
