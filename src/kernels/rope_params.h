// Private: what the RoPE kernels of every backend receive. q/k and their outputs are
// [nnz, heads, head_dim] views, strides in elements. Outputs may be the inputs themselves (the
// _inplace ops); each rotated pair is read completely before it is written.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

/// Where a token's position comes from.
enum class RopePosMode : uint8_t {
  kPositions,      // pos[t] (pos_ids / positions), int32 or int64
  kIndptrOffsets,  // offsets[b] + (t - indptr[b]) for the segment b holding token t
};

struct RopeParams {
  const void* q = nullptr;
  const void* k = nullptr;
  void* q_out = nullptr;
  void* k_out = nullptr;
  int64_t nnz = 0;
  int64_t num_q_heads = 0, num_k_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;  // even, <= head_dim; dims >= rotary_dim pass through
  int64_t q_stride_n = 0, q_stride_h = 0, q_stride_d = 1;
  int64_t k_stride_n = 0, k_stride_h = 0, k_stride_d = 1;
  int64_t q_out_stride_n = 0, q_out_stride_h = 0, q_out_stride_d = 1;
  int64_t k_out_stride_n = 0, k_out_stride_h = 0, k_out_stride_d = 1;
  bool interleave = false;  // pairs (2i, 2i+1) (GPT-J); otherwise (i, i + rotary_dim/2) (NeoX)
  bool inplace = false;     // outputs are the inputs: pass-through dims need no copy
  DType dtype = DType::kFloat16;

  RopePosMode pos_mode = RopePosMode::kPositions;
  const void* pos = nullptr;
  DType pos_dtype = DType::kInt32;
  const void* indptr = nullptr;  // [batch + 1]
  DType indptr_dtype = DType::kInt32;
  const void* offsets = nullptr;  // [batch]
  DType offsets_dtype = DType::kInt32;
  int64_t batch = 0;

  // Computed angles (cos_sin_cache == nullptr): pair i has frequency
  //   f = rope_theta^(-2i / rotary_dim);  s = clamp(f * smooth_a + smooth_b, 0, 1);
  //   f' = (1 - s) * f * rope_rcp_scale + s * f
  // smooth_a = smooth_b = 0 is plain RoPE (f / rope_scale); Llama 3.1 sets both.
  double rope_theta = 1e4;
  double rope_rcp_scale = 1.0;
  double smooth_a = 0.0, smooth_b = 0.0;

  // Precomputed angles: row pos of the fp32 cache is [cos(0..R/2) | sin(0..R/2)].
  const float* cos_sin_cache = nullptr;
  int64_t cache_rows = 0;
  int64_t cache_stride_row = 0, cache_stride_col = 1;
};

}  // namespace flashinfer::kernels
