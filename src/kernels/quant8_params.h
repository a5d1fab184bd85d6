// Private: per_token_group_quant_8bit's kernel parameters (both backends) and the scale rules,
// also TRT-LLM's 1x128 activation quantization of fp8_blockscale_gemm_sm90.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels {

struct GroupQuant8Params {
  const void* x = nullptr;   // [rows, k], unit stride along k
  int64_t x_stride_row = 0;  // elements from one row of x to the next; 0: k (dense)
  DType dtype = DType::kBFloat16;
  void* q = nullptr;  // [rows, k] contiguous, out_dtype
  DType out_dtype = DType::kFloat8E4M3FN;
  float* scales = nullptr;  // scale of (row r, group g) at r * s_stride_row + g * s_stride_group
  int64_t s_stride_row = 0, s_stride_group = 1;
  // The scale buffer's elements when it has padding (scale_tma_aligned: rows rounded up to 4 per
  // group), else 0. Both backends zero it first, so that no byte of it is left undefined (a
  // reader of the covered span, or a TMA load of the padded rows, sees zeros).
  int64_t scales_padded_total = 0;
  int64_t rows = 0, k = 0, group_size = 128;
  float eps = 1e-10f;
  float qmax = 448.0f, qmin = -448.0f;
  bool ue8m0 = false;
  // TRT-LLM's 1x128 rule instead (fp8_blockscale_gemm_sm90's activations, upstream's
  // scale_1x128_kernel): quant = 448 / amax in fp32 (1 for an all-zero group), code =
  // e4m3(x * quant) saturating, stored scale 1 / quant; eps, qmax, qmin and ue8m0 unused.
  bool trtllm_1x128 = false;

  /// The elements from one row of x to the next (x_stride_row, or k for dense rows).
  FLASHINFER_HD int64_t x_row_stride() const { return x_stride_row != 0 ? x_stride_row : k; }
};

}  // namespace flashinfer::kernels
