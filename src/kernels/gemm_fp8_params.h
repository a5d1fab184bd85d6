// Private: what the block-scaled FP8 GEMM kernels of every backend receive. Strides are in
// elements.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels {

/// out[i, j] = alpha * sum over K blocks kb of
///             a_scale[i / gm, kb] * b_scale[j / gn, kb] * sum_{k in kb} a[i, k] * b[j, k]
/// where a K block is gk consecutive k (the last one may be shorter). The block's partial sum is
/// accumulated in fp32, then multiplied by (a_scale * b_scale) and added to the fp32
/// accumulator; alpha multiplies the total. A null scale pointer means 1.
struct BlockScaledGemmParams {
  const void* a = nullptr;
  DType a_dtype = DType::kFloat8E4M3FN;
  int64_t a_stride_m = 0, a_stride_k = 1;
  const void* b = nullptr;  // logically [n, k]
  DType b_dtype = DType::kFloat8E4M3FN;
  int64_t b_stride_n = 0, b_stride_k = 1;
  // mm_fp8's prepared weight: b is a contiguous [k/128, n, 128] whose rows are shuffled in
  // blocks of 32 (see low_latency_row); the strides above are then unused.
  bool b_low_latency = false;
  const float* a_scale = nullptr;
  int64_t sa_stride_m = 0, sa_stride_k = 0, gm = 1;
  const float* b_scale = nullptr;
  int64_t sb_stride_n = 0, sb_stride_k = 0, gn = 1;
  int64_t gk = 1;
  const float* alpha = nullptr;  // one fp32 on the data's device, or null for 1
  void* out = nullptr;
  DType out_dtype = DType::kBFloat16;
  int64_t out_stride_m = 0, out_stride_n = 1;
  int64_t m = 0, n = 0, k = 0;
  // MX block scales (mm_mxfp8, bmm_mxfp8): one UE8M0 byte per 32 consecutive k of each row of a
  // (and of b's [n, k]), multiplied into the element when it is decoded (x * 2^(e - 127), exact
  // in fp32), as cuDNN's graph dequantizes both operands before its fp32 matmul. Swizzled
  // layouts address sf_offset(layout, row, k / 32, k / 32); linear ones use the strides. Null:
  // no MX scales.
  const uint8_t* a_mx = nullptr;
  SfLayoutCode a_mx_layout = SfLayoutCode::k128x4;
  int64_t a_mx_stride_row = 0, a_mx_stride_k = 0;
  const uint8_t* b_mx = nullptr;
  SfLayoutCode b_mx_layout = SfLayoutCode::k128x4;
  int64_t b_mx_stride_row = 0, b_mx_stride_k = 0;
  // tinygemm_bf16 / tgv_gemm_sm100: a [n] bias (bf16 or fp16) added in fp32 to alpha * sum
  // before the one rounding; null: none.
  const void* bias = nullptr;
  DType bias_dtype = DType::kBFloat16;
  // Batched (bmm_mxfp8): element offsets of one batch item in each buffer.
  int64_t batch = 1;
  int64_t a_stride_b = 0, b_stride_b = 0, out_stride_b = 0, a_mx_stride_b = 0, b_mx_stride_b = 0;
};

/// The MX scale of element (row, kk) of an operand (see BlockScaledGemmParams).
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline float
    mx_scale(const uint8_t* sf, SfLayoutCode layout, int64_t stride_row, int64_t stride_k,
             int64_t row, int64_t kk, int64_t k) {
  const int64_t kb = kk / 32;
  const int64_t off = layout == SfLayoutCode::kLinear ? row * stride_row + kb * stride_k
                                                      : sf_offset(layout, row, kb, k / 32);
  return ue8m0_to_float(sf[off]);
}

/// The stored row of logical weight row j in prepare_low_latency_gemm_weights' layout: within
/// each block of 32 rows, row r is stored at (r % 4) * 8 + r / 4.
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline int64_t
    low_latency_row(int64_t j) {
  const int64_t r = j % 32;
  return j - r + (r % 4) * 8 + r / 4;
}

}  // namespace flashinfer::kernels
