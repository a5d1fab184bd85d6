// Private: what the GEMM kernels of every backend receive. Strides are in elements.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels {

/// out[b, i, j] = alpha * sum_k A[b, i, k] * B[b, k, j] (+ bias[j]); B is column-major
/// (b_stride_k == 1), A row-major (a_stride_k == 1).
struct GemmParams {
  const void* a = nullptr;
  DType a_dtype = DType::kBFloat16;
  int64_t a_stride_b = 0, a_stride_m = 0, a_stride_k = 1;
  const void* b = nullptr;
  DType b_dtype = DType::kBFloat16;
  int64_t b_stride_b = 0, b_stride_k = 1, b_stride_n = 0;
  void* out = nullptr;
  DType out_dtype = DType::kBFloat16;
  int64_t out_stride_b = 0, out_stride_m = 0, out_stride_n = 1;
  const void* bias = nullptr;  // [n] of bias_dtype, or null
  DType bias_dtype = DType::kBFloat16;
  int64_t bias_stride = 1;
  int64_t batch = 1, m = 0, n = 0, k = 0;
  // FP8: one-element fp32 dequantization scales on the data's device (null for bf16). The CPU
  // backend reads them; cuBLASLt takes them as scale pointers.
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
};

/// out[i, j] = alpha * sum_k deq(a)[i, k] * deq(b)[j, k] for packed e2m1 a [m, k/2] and
/// b_fp4 [n, k/2] (rows of b_fp4 are the columns of the logical b).
struct Fp4GemmParams {
  const uint8_t* a = nullptr;
  int64_t a_stride_m = 0;  // bytes
  const uint8_t* b = nullptr;
  int64_t b_stride_n = 0;  // bytes
  const uint8_t* a_sf = nullptr;
  const uint8_t* b_sf = nullptr;
  SfLayoutCode a_layout = SfLayoutCode::k128x4;
  SfLayoutCode b_layout = SfLayoutCode::k128x4;
  bool ue8m0 = false;  // MXFP4 scales; NVFP4 uses e4m3
  int block = 16;
  const float* alpha = nullptr;  // one fp32 on the data's device, or null for 1
  void* out = nullptr;
  DType out_dtype = DType::kBFloat16;
  int64_t out_stride_m = 0, out_stride_n = 1;
  int64_t m = 0, n = 0, k = 0;
};

}  // namespace flashinfer::kernels
