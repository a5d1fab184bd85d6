// Normalization ops (FlashInfer module flashinfer.norm).
#pragma once

#include <optional>

#include "flashinfer/tensor.h"

namespace flashinfer {

/// Root mean square normalization: out = input * rsqrt(mean(input^2) + eps) * weight, in fp32
/// math, with eps inside the square root.
///   input  [batch, hidden] or [batch, heads, hidden] (QK-norm); fp16, bf16 or fp32; any strides.
///   weight [hidden], same dtype and device as input.
///   out    optional, same shape, dtype and device as input; written and returned. When absent a
///          new contiguous tensor is returned.
///   enable_pdl  programmatic dependent launch on sm90+ (default: on where supported); no
///          effect on the numbers, ignored on the CPU.
/// Runs on input's device, on the current CUDA stream for CUDA tensors.
Tensor rmsnorm(const Tensor& input, const Tensor& weight, double eps = 1e-6,
               std::optional<Tensor> out = std::nullopt,
               std::optional<bool> enable_pdl = std::nullopt);

/// Fused residual add + RMS normalization, in place. Writes both `input` and `residual`:
///   residual <- residual + input           (sum in fp32, stored rounded to the dtype)
///   input    <- sum * rsqrt(mean(sum^2) + eps) * weight
/// where `sum` is the unrounded fp32 sum (not the rounded residual).
///   input, residual  [batch, hidden] or [batch, heads, hidden]; same shape, fp16, bf16 or fp32;
///                    any strides; must not overlap each other or weight.
///   weight  [hidden], same dtype and device.
/// Returns nothing (upstream returns None).
void fused_add_rmsnorm(const Tensor& input, const Tensor& residual, const Tensor& weight,
                       double eps = 1e-6, std::optional<bool> enable_pdl = std::nullopt);

/// Gemma RMS normalization: out = input * rsqrt(mean(input^2) + eps) * (1 + weight), fp32 math.
/// Arguments, shapes and `out` as rmsnorm.
Tensor gemma_rmsnorm(const Tensor& input, const Tensor& weight, double eps = 1e-6,
                     std::optional<Tensor> out = std::nullopt,
                     std::optional<bool> enable_pdl = std::nullopt);

/// Gemma variant of fused_add_rmsnorm (scale by 1 + weight). Writes `input` and `residual`.
void gemma_fused_add_rmsnorm(const Tensor& input, const Tensor& residual, const Tensor& weight,
                             double eps = 1e-6, std::optional<bool> enable_pdl = std::nullopt);

/// Layer normalization over the last dimension, population variance, fp32 math:
///   out = (input - mean) * rsqrt(var + eps) * gemma + beta
///   input  [batch, hidden]; bf16 (upstream's only dtype), fp16 or fp32; any strides.
///   gemma  [hidden] (upstream's name for gamma) and beta [hidden], both fp32, fp16 or bf16 (one
///          dtype, widened exactly), as upstream's CuTe kernel takes them.
/// Returns a new contiguous tensor of input's shape and dtype.
Tensor layernorm(const Tensor& input, const Tensor& gemma, const Tensor& beta, double eps = 1e-6);

}  // namespace flashinfer

#include "flashinfer/ops/sampling.h"  // ScalarOrTensor

namespace flashinfer {

/// RMS normalization + fp8 quantization, written into `out` (upstream returns None):
///   out = fp8(clamp(input * rsqrt(mean(input^2) + eps) * weight / scale, -max, max))
/// with max = 448 (float8_e4m3fn out) or 57344 (float8_e5m2), round to nearest even, fp32 math.
/// A NaN becomes the fp8 NaN 0x7F (upstream's CuTe kernels convert without a clamp).
///   out    [batch, hidden] fp8 (e4m3fn or e5m2); the output dtype is out's.
///   input  [batch, hidden] fp16, bf16 or fp32; any strides. weight [hidden], input's dtype.
///   scale  a float or a one-element fp32/fp16/bf16 tensor (moved to input's device).
void rmsnorm_quant(const Tensor& out, const Tensor& input, const Tensor& weight,
                   ScalarOrTensor<double> scale, double eps = 1e-6,
                   std::optional<bool> enable_pdl = std::nullopt);

/// residual <- residual + input (fp32 sum rounded to the dtype); out = fp8 quantization (as
/// rmsnorm_quant) of rmsnorm(unrounded sum) * weight / scale. Writes `out` and `residual`;
/// `input` is unchanged.
void fused_add_rmsnorm_quant(const Tensor& out, const Tensor& input, const Tensor& residual,
                             const Tensor& weight, ScalarOrTensor<double> scale, double eps = 1e-6,
                             std::optional<bool> enable_pdl = std::nullopt);

/// Layer normalization + fp8 quantization into `out`:
///   y = dtype((input - mean) * rsqrt(var + eps) * gemma + beta)   (rounded to input's dtype)
///   out = fp8(clamp(y / scale, -max, max))   (a NaN y becomes -max, as upstream's bf16 clamp)
/// gemma and beta fp32 [hidden]; population variance. enable_pdl (upstream 0.7.4): a launch
/// option, no effect on the numbers.
void layernorm_quant(const Tensor& out, const Tensor& input, const Tensor& gemma,
                     const Tensor& beta, ScalarOrTensor<double> scale, double eps = 1e-6,
                     std::optional<bool> enable_pdl = std::nullopt);

}  // namespace flashinfer

namespace flashinfer {

/// What fused_rmsnorm_silu returns: `out`, plus `block_scale` for an NVFP4 `out` (undefined
/// otherwise). Converts to `out`; recorded as upstream returns it (the tensor, or the
/// (out, block_scale) tuple).
struct RmsNormSiluOutput {
  Tensor out;
  Tensor block_scale;
  operator Tensor() const { return out; }  // NOLINT: implicit like upstream's return value
};
Value to_value(const RmsNormSiluOutput& r);

/// Fused RMSNorm + SiLU: y = silu(input * rsqrt(mean(input^2) + eps) * weight), silu(y) =
/// y / (1 + exp(-y)), fp32 math.
///   input [num_tokens, hidden] bf16 (upstream's only dtype), any strides; weight [hidden] bf16.
///   out   optional (bf16 when absent), written and returned; its dtype picks the format:
///         bfloat16 [num_tokens, hidden]: bf16(y), one rounding;
///         float8_e4m3fn [num_tokens, hidden]: e4m3 of y, saturating at +-448 (scale 1);
///         float4_e2m1fn_x2 [num_tokens, hidden / 2] (hidden % 16 == 0): NVFP4, per 16 values
///         s = max(amax / 6, FLT_MIN) in fp32, block_scale = e4m3_satfinite(s),
///         codes = e2m1(y / s) (the unrounded s), element 2t in the low nibble; then returns
///         (out, block_scale).
///   block_scale  NVFP4 only: float8_e4m3fn [num_tokens, hidden / 16], one scale per 16
///         values in row order (linear, not swizzled); allocated when absent. Ignored for the
///         bf16 / fp8 outputs (as upstream).
/// Upstream runs on CUDA only; here the CPU reference runs too (the CUDA kernel writes bf16 and
/// fp8, and refuses NVFP4).
RmsNormSiluOutput fused_rmsnorm_silu(const Tensor& input, const Tensor& weight, double eps = 1e-6,
                                     std::optional<Tensor> out = std::nullopt,
                                     std::optional<Tensor> block_scale = std::nullopt);

}  // namespace flashinfer
