// CPU reference of the block-scaled FP8 GEMMs and TRT-LLM's 1x128 activation quantizer.
#pragma once

#include <cstdint>

#include "kernels/gemm_fp8_params.h"

namespace flashinfer::kernels::cpu {

/// The reference of BlockScaledGemmParams: operands decoded exactly to fp32 (MX scales included),
/// fp32 products summed by OpenBLAS sgemm per K block (its own summation order and threads),
/// each block's sums scaled and accumulated in fp32.
void block_scaled_gemm(const BlockScaledGemmParams& p);

/// TRT-LLM's 1x128 quantization of a bf16 [m, k] (row stride x_stride_m, unit k stride): per
/// block of 128 k, amax = max |x| (exact in bf16), quant scale 448 / amax in fp32 (1 when
/// amax == 0), q = e4m3(x * quant scale) with saturation, dequant scale 1 / quant scale written
/// to scales[i * k_blocks + kb]. q is dense [m, k].
void quantize_1x128_e4m3(const uint16_t* x, int64_t x_stride_m, int64_t m, int64_t k, uint8_t* q,
                         float* scales);

/// prepare_low_latency_gemm_weights: w [n, k] (row stride w_stride_n, bytes) -> out
/// [k/128, n, 128] with the 32-row shuffle (low_latency_row).
void low_latency_weight_layout(const uint8_t* w, int64_t w_stride_n, int64_t n, int64_t k,
                               uint8_t* out);

}  // namespace flashinfer::kernels::cpu
