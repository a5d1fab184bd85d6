// Private: the per-element fp32 arithmetic of cutlass_fused_moe's FP8 paths that the CPU
// reference (src/kernels/cpu/moe_cutlass_fp8_cpu.cpp) and the CUDA kernels
// (src/kernels/cuda/moe_cuda.cu) must round identically: each operation rounded once
// (kernels/fp32_rules.h: no FMA contraction on the device), e4m3 conversions RNE with
// saturation (cvt.rn.satfinite). Unit-tested on the CPU (tests/ops/test_moe_cutlass_fp8.cpp).
#pragma once

#include <cstdint>

#include "kernels/fp32_rules.h"

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif
#include "flashinfer/float_formats.h"

namespace flashinfer::kernels {

/// DeepSeek's block size: 128x128 weight blocks, 1x128 activation blocks.
constexpr int64_t kMoeFp8Block = 128;

/// v rounded to e4m3 (RNE, finite overflow clamps to +-448, NaN stays NaN), as a float: CUDA's
/// __NV_SATFINITE conversion, which CUTLASS's float -> float_e4m3_t and upstream's
/// scale_1x128_kernel use.
FLASHINFER_HD float moe_e4m3_sat(float v) {
#if defined(__CUDA_ARCH__)
  return static_cast<float>(__nv_fp8_e4m3(v));
#else
  return e4m3fn_bits_to_float(float_to_e4m3fn_bits(v, /*saturate=*/true));
#endif
}

/// The 1x128 quantizer's multiplier for a block of absolute maximum amax (upstream's
/// scale_1x128_kernel): 448 / amax, 1 for an all-zero block. Values are stored as
/// moe_e4m3_sat(v * quant).
FLASHINFER_HD float moe_fp8_block_quant(float amax) {
  return amax != 0.0f ? fp32_div(448.0f, amax) : 1.0f;
}

/// The dequantization scale the quantizer stores: 1 / quant (not amax / 448: they can differ in
/// the last bit).
FLASHINFER_HD float moe_fp8_block_dequant(float quant) { return fp32_div(1.0f, quant); }

/// One K block of the block-scale GEMM (DeepGEMM's promotion): acc + (a_scale * w_scale) *
/// partial, partial the block's fp32 dot product.
FLASHINFER_HD float moe_fp8_block_accumulate(float acc, float a_scale, float w_scale,
                                             float partial) {
  return fp32_add(acc, fp32_mul(fp32_mul(a_scale, w_scale), partial));
}

/// The finalize's step for one k: acc + scale * (y + b2) (b2 only where the call has the fc2
/// bias), upstream's finalizeMoeRoutingKernel order.
FLASHINFER_HD float moe_fp8_finalize_step(float acc, float scale, float y, bool has_bias,
                                          float bias) {
  return fp32_add(acc, fp32_mul(scale, has_bias ? fp32_add(y, bias) : y));
}

}  // namespace flashinfer::kernels
