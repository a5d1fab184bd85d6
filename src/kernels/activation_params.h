// Private: what the gated-activation kernels (silu_and_mul, gelu_and_mul, gelu_tanh_and_mul) of
// every backend receive. The leading dimensions are flattened into rows; strides in elements.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

enum class Activation : uint8_t { kSilu, kGelu, kGeluTanh };

/// out[r, i] = act(in[r, i]) * in[r, d + i] for i < d.
struct ActAndMulParams {
  const void* input = nullptr;
  void* out = nullptr;
  int64_t rows = 0;
  int64_t d = 0;  // output width; the input row is 2 * d wide
  int64_t in_stride_row = 0, in_stride_d = 1;
  int64_t out_stride_row = 0, out_stride_d = 1;
  Activation act = Activation::kSilu;
  DType dtype = DType::kFloat16;
};

}  // namespace flashinfer::kernels
