// SM90 mixed-input MoE weight preparation (flashinfer.fused_moe.prepare): bit-exact layout
// transforms of packed 4-bit weights and their scales. Semantics and sources: docs/MOE.md.
#pragma once

#include <cstdint>
#include <string_view>
#include <tuple>

#include "flashinfer/tensor.h"

namespace flashinfer {

/// Folds weight scales [E, rows, K / group_size] (any dtype of 1, 2, 4 or 8 bytes; uint8 E8M0
/// with group 32 for MXFP4, bf16 bit patterns with group 128 for W4A8) into
/// [E, rows / 64, K / 128, folded_m, 16 bytes / element size]. rows % 64 == 0.
Tensor interleave_moe_scales_for_sm90_mixed_gemm(const Tensor& scales, int64_t group_size = 32);

/// Interleaves packed 4-bit weights uint8 [E, n, k / 2] (n % 16 == 0, k % 64 == 0) for the SM90
/// mixed-input GEMM. quant_type: "fp4" (MXFP4, W4A16), "fp4_fp8" (MXFP4 for the FP8 pre-MMA
/// scale path: also moves the sign bits) or "int4" (W4A8). Returns a new uint8 tensor of the
/// same shape.
Tensor interleave_moe_weights_for_sm90_mixed_gemm(const Tensor& weight,
                                                  std::string_view quant_type = "fp4");

/// Humming-style MXFP4 preparation for the FP8-activation path: per expert, clamps the E8M0
/// scale range to max_range (in [0, 11]), rewrites the FP4 payload of clamped blocks, and
/// returns (weight_out, scale_out, residual): with interleave, the "fp4_fp8" weight layout and
/// the folded offset scales; without, the logical processed weight uint8 [E, rows, K / 2] and
/// offsets uint8 [E, rows, K / 32]. residual float32 [E].
std::tuple<Tensor, Tensor, Tensor> preprocess_moe_weights_for_sm90_mixed_gemm_humming(
    const Tensor& weight, const Tensor& raw_scale, int64_t max_range = 11, bool interleave = true);

}  // namespace flashinfer
