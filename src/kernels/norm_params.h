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
