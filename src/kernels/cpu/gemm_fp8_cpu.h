// CPU reference of the block-scaled FP8 GEMMs and TRT-LLM's 1x128 activation quantizer.
#pragma once

#include <cstdint>

#include "kernels/gemm_fp8_params.h"

namespace flashinfer::kernels::cpu {

/// The reference of BlockScaledGemmParams: operands decoded exactly to fp32 (MX scales included),
/// fp32 products summed by OpenBLAS sgemm per K block (its own summation order and threads),
/// each block's sums scaled and accumulated in fp32.
void block_scaled_gemm(const BlockScaledGemmParams& p);

/// prepare_low_latency_gemm_weights: w [n, k] (row stride w_stride_n, bytes) -> out
/// [k/128, n, 128] with the 32-row shuffle (low_latency_row).
void low_latency_weight_layout(const uint8_t* w, int64_t w_stride_n, int64_t n, int64_t k,
                               uint8_t* out);

}  // namespace flashinfer::kernels::cpu
