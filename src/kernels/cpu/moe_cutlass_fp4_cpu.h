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

/// Undoes TensorRT-LLM's preprocess_weights_for_mixed_gemm(W4_A16) as run for the MoE kernel
/// (the arch-80 layout, the one the SM80 fpA_intB grouped GEMM reads on every GPU) for one
/// expert: `in` holds the k * n / 2 preprocessed bytes of the logical [k, n] int4 matrix, `out`
/// receives its signed values (biased code - 8) transposed, [n, k] (k % 64 == 0, n % 64 == 0).
void woq_int4_unpermute(const uint8_t* in, int8_t* out, int64_t n, int64_t k);

}  // namespace flashinfer::kernels::cpu
