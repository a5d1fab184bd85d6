// Private: what the rmsnorm kernels of every backend receive. Strides are in elements; a
// 2-D input has heads == 1 and stride_h unused.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

struct RmsNormParams {
  const void* input = nullptr;
  const void* weight = nullptr;
  void* out = nullptr;
  int64_t batch = 0;
  int64_t heads = 1;
  int64_t hidden = 0;
  int64_t in_stride_b = 0, in_stride_h = 0, in_stride_d = 1;
  int64_t out_stride_b = 0, out_stride_h = 0, out_stride_d = 1;
  int64_t weight_stride = 1;
  float eps = 1e-6f;
  float weight_bias = 0.0f;  // 0 for rmsnorm; 1 for the Gemma variants: y = x * r * (1 + w)
  DType dtype = DType::kFloat16;
};

}  // namespace flashinfer::kernels

namespace flashinfer::kernels {

/// fused_add_rmsnorm and its Gemma variant, in place: residual <- residual + input (rounded to
/// dtype), input <- rmsnorm(unrounded fp32 sum) * (weight + weight_bias). 2-D inputs have
/// heads == 1.
struct FusedAddRmsNormParams {
  void* input = nullptr;
  void* residual = nullptr;
  const void* weight = nullptr;
  int64_t batch = 0;
  int64_t heads = 1;
  int64_t hidden = 0;
  int64_t in_stride_b = 0, in_stride_h = 0, in_stride_d = 1;
  int64_t res_stride_b = 0, res_stride_h = 0, res_stride_d = 1;
  int64_t weight_stride = 1;
  float eps = 1e-6f;
  float weight_bias = 0.0f;  // 1 for gemma_fused_add_rmsnorm
  DType dtype = DType::kFloat16;
};

/// layernorm: out = (x - mean) * rsqrt(var + eps) * gamma + beta over the last dimension
/// (population variance). input/out have `dtype`; gamma and beta share `param_dtype` (fp32,
/// fp16 or bf16, widened to fp32 exactly, as upstream's CuTe kernel loads them).
struct LayerNormParams {
  const void* input = nullptr;
  const void* gamma = nullptr;
  const void* beta = nullptr;
  DType param_dtype = DType::kFloat32;
  void* out = nullptr;
  int64_t batch = 0;
  int64_t hidden = 0;
  int64_t in_stride_b = 0, in_stride_d = 1;
  int64_t out_stride_b = 0, out_stride_d = 1;
  int64_t gamma_stride = 1, beta_stride = 1;
  float eps = 1e-6f;
  DType dtype = DType::kBFloat16;
};

}  // namespace flashinfer::kernels

namespace flashinfer::kernels {

/// rmsnorm_quant, fused_add_rmsnorm_quant and layernorm_quant: the normalized row y (rmsnorm:
/// x * rsqrt(mean(x^2) + eps) * weight; layernorm: (x - mean) * rsqrt(var + eps) * gamma + beta;
/// fused add: x = input + residual in fp32, residual <- x rounded to dtype) is written as
/// fp8(clamp(y * (1 / scale), -max, max)) with max = 448 (e4m3fn) or 57344 (e5m2), RNE.
enum class NormQuantKind : int32_t {
  kRms,
  kFusedAddRms,
  kLayer,
  kRmsSilu,  // fused_rmsnorm_silu: out = silu(x * rsqrt(mean(x^2) + eps) * weight), bf16 out
             // (or e4m3 with scale 1, or NVFP4: out_dtype kFloat4E2M1FNx2 with block_scale)
};
struct NormQuantParams {
  NormQuantKind kind = NormQuantKind::kRms;
  const void* input = nullptr;
  void* residual = nullptr;      // kFusedAddRms: read and written
  const void* weight = nullptr;  // rms: dtype; layer: fp32 gamma
  const float* beta = nullptr;   // layer
  void* out = nullptr;           // fp8, out_dtype
  DType dtype = DType::kFloat16;
  DType out_dtype = DType::kFloat8E4M3FN;
  int64_t batch = 0, hidden = 0;
  int64_t in_stride_b = 0, in_stride_d = 1;
  int64_t res_stride_b = 0, res_stride_d = 1;
  int64_t out_stride_b = 0, out_stride_d = 1;
  int64_t weight_stride = 1, beta_stride = 1;
  float eps = 1e-6f;
  // One fp32 on the input's device (a tensor scale), else scale_value (a number: no upload, so
  // nothing synchronizes and a CUDA graph can capture the call).
  const float* scale = nullptr;
  float scale_value = 1.0f;
  // kRmsSilu NVFP4: e4m3 [batch, hidden / 16] (out is [batch, hidden / 2] packed pairs, its
  // strides in bytes-sized elements).
  uint8_t* block_scale = nullptr;
  int64_t bs_stride_b = 0, bs_stride_d = 1;
};

}  // namespace flashinfer::kernels
