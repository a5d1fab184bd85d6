// Device helpers the MLA decode kernels share (mla_cuda.cu's and the Hopper kernel's,
// mla_sm90_kernel.cuh): which tokens of a query row a KV split takes, the empty state of a split
// that takes none, and the scales with their device factors.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/mla_params.h"

namespace flashinfer::kernels::cuda {

inline constexpr float kMlaLog2e = 1.4426950408889634f;
inline constexpr float kMlaLn2 = 0.6931471805599453f;

// The request's causal end (tokens [0, end) are visible to `row`), as in the CPU reference.
struct RowSpan {
  int32_t b;
  int64_t end;
};
__device__ __forceinline__ RowSpan row_span(const MlaAttentionParams& p, int64_t row) {
  const int32_t b = p.row_req[row];
  const int64_t qo_len = p.qo_indptr[b + 1] - p.qo_indptr[b];
  const int64_t kv_len = p.kv_lens[b];
  const int64_t pos = kv_len - qo_len + (row - p.qo_indptr[b]);
  int64_t end = kv_len;
  if (p.causal) end = pos + 1 < 0 ? 0 : (pos + 1 > kv_len ? kv_len : pos + 1);
  return {b, end};
}

// The tokens of `row` that KV split blockIdx.z takes: [begin, stop) of the row's visible range,
// split z covering [z * chunk, (z + 1) * chunk). In 32 bits: with the longest length on the host,
// begin < max_kv_len < 2^31 (the launcher leaves no split past the longest request); with it on
// the device (max_kv_dev: a CUDA graph, or the block-table calls' device plan) splits past the
// longest are normal, and (splits - 1) * chunk stays below 2^31 (mla_device_chunk of a length
// below 2^31, or 64 splits of at most 256). stop <= kv_len; stop <= begin: nothing to do (the
// kernels write the empty state the merge ignores, write_empty_state).
// b: the row's request.
struct SplitSpan {
  int32_t b, begin, stop;
};
__device__ __forceinline__ SplitSpan split_span(const MlaAttentionParams& p, int64_t row,
                                                int32_t chunk) {
  const RowSpan span = row_span(p, row);
  const int64_t begin = static_cast<int64_t>(blockIdx.z) * chunk;
  return {span.b, static_cast<int32_t>(begin), static_cast<int32_t>(min(span.end, begin + chunk))};
}

// Split blockIdx.z's state of (row, head h) when the split holds none of the row's keys: m -inf
// and l 0, which the merge weighs 0 without reading the split's output partial.
__device__ __forceinline__ void write_empty_state(const MlaAttentionParams& p, int64_t row, int h,
                                                  float* part_ml) {
  const int64_t state = (static_cast<int64_t>(blockIdx.z) * p.rows + row) * p.num_heads + h;
  part_ml[2 * state] = -INFINITY;
  part_ml[2 * state + 1] = 0.0f;
}

// sm_scale and out_scale with their device factors (MlaAttentionParams::*_dev), once a block,
// after pdl_wait (a kernel before this one may have written them).
__device__ __forceinline__ float mla_sm_scale(const MlaAttentionParams& p) {
  return p.sm_scale_dev != nullptr ? p.sm_scale * *p.sm_scale_dev : p.sm_scale;
}
__device__ __forceinline__ float mla_out_scale(const MlaAttentionParams& p) {
  return p.out_scale_dev != nullptr ? p.out_scale * *p.out_scale_dev : p.out_scale;
}

}  // namespace flashinfer::kernels::cuda
