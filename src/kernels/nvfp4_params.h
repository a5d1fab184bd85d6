// Private: what the CPU kernels of the grouped / fused NVFP4 and MXFP8 quantizers, the weight
// shuffles and the NVFP4 KV-cache quantizers receive (pointers, sizes, strides in elements).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

/// Grouped block quantization of L groups of [M, K] rows (batch/group-major input, strides in
/// elements). fp4: NVFP4 (blocks of 16, e4m3 scales, global scale per group or shared);
/// otherwise MXFP8 with K zero-padded to padded_k. Rows >= rows[g] are written as zero.
struct GroupedQuantizeParams {
  const void* input = nullptr;
  DType in_dtype = DType::kBFloat16;
  int64_t groups = 1, m = 0, k = 0;
  int64_t in_stride_g = 0, in_stride_m = 0;  // the K stride is 1
  bool silu_and_mul = false;                 // input rows hold [gate K | up K]
  const int32_t* rows = nullptr;             // [groups] valid rows, null: all m
  const float* global_scale = nullptr;       // fp4: [groups] or [1]
  bool per_group_scale = false;
  bool fp4 = true;
  int64_t padded_k = 0;      // mxfp8: K rounded up to 128 (fp4: k)
  uint8_t* out = nullptr;    // [groups, m, k/2] (fp4) or [groups, m, padded_k] (mxfp8)
  uint8_t* sf = nullptr;     // [groups, sf_per_group]
  int64_t sf_per_group = 0;  // bytes of one group's 128x4 scale block
};

/// silu(gate) * up per row, rounded to the element type: out [m, k] contiguous.
struct SiluMulParams {
  const void* input = nullptr;
  DType dtype = DType::kBFloat16;
  int64_t m = 0, k = 0, in_stride_m = 0;
  void* out = nullptr;
};

/// out[i] = input[src_row[i]] for rows of row_bytes bytes.
struct RowGatherParams {
  const uint8_t* input = nullptr;
  int64_t rows = 0, row_bytes = 0, in_stride_bytes = 0;
  const int64_t* src_row = nullptr;
  uint8_t* out = nullptr;
};

/// NVFP4 KV-cache quantization / dequantization, linear scales, dense [m, k] rows.
struct Nvfp4KvParams {
  const void* values = nullptr;  // quantize: input [m, k]; dequantize: output [m, k]
  DType dtype = DType::kBFloat16;
  int64_t m = 0, k = 0, value_stride_m = 0;
  uint8_t* fp4 = nullptr;  // [m, k/2]
  int64_t fp4_stride_m = 0;
  uint8_t* sf = nullptr;  // [m, k/16]
  int64_t sf_stride_m = 0;
  float global_scale = 1.0f;
};

}  // namespace flashinfer::kernels
