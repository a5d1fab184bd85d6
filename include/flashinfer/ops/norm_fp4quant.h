// Fused RMSNorm + FP4 quantization of flashinfer.cute_dsl (upstream's CuTe-DSL kernels, Blackwell
// only): rmsnorm_fp4quant and add_rmsnorm_fp4quant, which vLLM's RMSNorm + NVFP4 fusion calls.
// CPU reference everywhere; a CUDA kernel on the GPUs upstream runs them on (sm100+).
// docs/GEMM_AND_QUANTIZATION.md ("Fused RMSNorm + FP4 quantization") gives the math and layouts.
#pragma once

#include <optional>
#include <string>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// The fused ops' result: (y_fp4, block_scale), or with output_both_sf_layouts (y_fp4, the
/// swizzled block_scale, block_scale_unswizzled).
struct NormFp4QuantOutput {
  Tensor y_fp4, block_scale, block_scale_unswizzled;
  bool both_layouts = false;
};
Value to_value(const NormFp4QuantOutput& r);

/// y = rmsnorm(h) * weight per row of h = input (fp16 / bf16, [M, H] or [B, S, H]; rstd = 1 /
/// sqrt(mean(h^2) + eps)), quantized to packed e2m1 (y_fp4 [.., H / 2], float4_e2m1fn_x2 or
/// uint8) in blocks of block_size (16: NVFP4, e4m3 scales; 32: MXFP4, ue8m0 scales, or e4m3 with
/// scale_format "e4m3"). global_scale [1] fp32 multiplies y before quantization (e4m3 scales
/// only). Scales row-major [.., H / block_size], or 128x4-swizzled (a 1-D buffer) with
/// is_sf_swizzled_layout.
NormFp4QuantOutput rmsnorm_fp4quant(const Tensor& input, const Tensor& weight,
                                    std::optional<Tensor> y_fp4 = std::nullopt,
                                    std::optional<Tensor> block_scale = std::nullopt,
                                    std::optional<Tensor> global_scale = std::nullopt,
                                    double eps = 1e-6, int64_t block_size = 16,
                                    std::optional<std::string> scale_format = std::nullopt,
                                    bool is_sf_swizzled_layout = false,
                                    std::optional<bool> enable_pdl = std::nullopt);

/// rmsnorm_fp4quant of h = input + residual, which is written back to residual (rounded to its
/// dtype; the sum of squares takes the unrounded fp32 h, the normalized value the rounded one).
/// output_both_sf_layouts also writes the row-major scales to block_scale_unswizzled; y_out (the
/// input's dtype and shape) receives y before quantization.
NormFp4QuantOutput add_rmsnorm_fp4quant(
    const Tensor& input, const Tensor& residual, const Tensor& weight,
    std::optional<Tensor> y_fp4 = std::nullopt, std::optional<Tensor> block_scale = std::nullopt,
    std::optional<Tensor> global_scale = std::nullopt, double eps = 1e-6, int64_t block_size = 16,
    std::optional<std::string> scale_format = std::nullopt, bool is_sf_swizzled_layout = false,
    bool output_both_sf_layouts = false,
    std::optional<Tensor> block_scale_unswizzled = std::nullopt,
    std::optional<bool> enable_pdl = std::nullopt, std::optional<Tensor> y_out = std::nullopt);

}  // namespace flashinfer
