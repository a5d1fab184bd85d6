// Private: per_token_group_quant_8bit's kernel parameters (both backends) and the scale rule.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

struct GroupQuant8Params {
  const void* x = nullptr;  // [rows, k] contiguous
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
};

}  // namespace flashinfer::kernels
