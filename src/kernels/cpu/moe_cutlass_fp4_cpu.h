// CPU reference of cutlass_fused_moe's FP4 paths: exact block dequantization through the
// library's quantizers, fp32 GEMMs of each local expert's routed rows only, upstream's rounding
// and re-quantization points (docs/MOE.md).
#pragma once

#include <cstdint>

#include "kernels/cpu/moe_weight_prep_cpu.h"
#include "kernels/moe_cutlass_fp4_params.h"

namespace flashinfer::kernels::cpu {

void cutlass_moe_fp4(const CutlassMoeFp4Params& p);

/// Undoes interleave_moe_weights_for_sm90_mixed_gemm(..., "int4", "fp4" or "fp4_fp8") for one
/// expert:
/// `in` holds the interleaved [n, k / 2] bytes, `out` receives the plain rows (n % 16 == 0,
/// k % 64 == 0).
void sm90_deinterleave_fp4_weights(const uint8_t* in, uint8_t* out, int64_t n, int64_t k,
                                   Sm90QuantType qt = Sm90QuantType::kFp4);

}  // namespace flashinfer::kernels::cpu
