// Private: the FP8 paths of cutlass_fused_moe on the CPU (FP8 per tensor, DeepSeek FP8 block
// scale). Semantics and sources: docs/MOE.md, section "cutlass_fused_moe: FP8 paths".
#pragma once

#include "kernels/moe_cutlass_fp8_params.h"

namespace flashinfer::kernels::cpu {

void cutlass_moe_fp8(const CutlassMoeFp8Params& p);

/// The 1x128 activation quantizer of the block-scale path (exposed for tests): row `x` of `n`
/// values into e4m3 values `q` (decoded) and ceil(n / 128) dequantization scales `ds`.
void quantize_1x128(const float* x, int64_t n, float* q, float* ds);

}  // namespace flashinfer::kernels::cpu
