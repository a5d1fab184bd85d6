// Private: what the mm_gguf kernels receive. The weight is GGUF/GGML quantized blocks exactly
// as a .gguf file stores them, one row of blocks per output feature.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

/// GGML block formats read directly by mm_gguf (32 values per block):
///   Q4_1: fp16 d, fp16 m, 16 bytes; value j (< 16) is d * (byte[j] & 15) + m, value j + 16
///         is d * (byte[j] >> 4) + m. 20 bytes.
///   Q8_0: fp16 d, 32 int8 q; value j is d * q[j]. 34 bytes.
enum class GgmlQuantType : int { kQ4_1 = 3, kQ8_0 = 8 };  // GGML's type ids

constexpr int64_t kGgmlBlockValues = 32;
constexpr int64_t ggml_block_bytes(GgmlQuantType t) { return t == GgmlQuantType::kQ4_1 ? 20 : 34; }

/// out[i, j] = sum_k a[i, k] * dequant(b)[j, k], fp32 accumulation, rounded once to out_dtype.
struct GgufMmParams {
  const void* a = nullptr;  // [m, k] of a_dtype, strides in elements
  DType a_dtype = DType::kBFloat16;
  int64_t m = 0, k = 0;
  int64_t a_stride_m = 0, a_stride_k = 1;
  const uint8_t* b = nullptr;  // [n] rows of k / 32 blocks; row stride in bytes
  int64_t n = 0;
  int64_t b_row_bytes = 0;
  GgmlQuantType type = GgmlQuantType::kQ4_1;
  void* out = nullptr;  // [m, n] of out_dtype, strides in elements
  DType out_dtype = DType::kBFloat16;
  int64_t out_stride_m = 0, out_stride_n = 1;
};

}  // namespace flashinfer::kernels
