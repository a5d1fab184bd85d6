// Private device helpers shared by the CUDA attention kernels: KV addressing,
//, the mask rule and the base-2 state merge. Device code only: NVRTC compiles it
// too (src/kernels/cuda/jit_sources.cmake).
#pragma once

#include "kernels/attention_params.h"
#include "kernels/cuda/device_utils.cuh"
#ifndef __CUDACC_RTC__
#include "kernels/cuda/cuda_utils.cuh"  // host side of the .cu files that include this
#endif

namespace flashinfer::kernels::cuda {

constexpr float kLog2e = 1.4426950408889634f;

// Element offset of key/value token t of request b (head and dim excluded).
__device__ __forceinline__ int64_t kv_offset(const KvAddressing& a, int32_t b, int64_t t,
                                             bool is_v) {
  const int64_t sp = is_v ? a.v_stride_page : a.k_stride_page;
  const int64_t st = is_v ? a.v_stride_token : a.k_stride_token;
  if (a.kv_indices == nullptr) return (static_cast<int64_t>(a.kv_indptr[b]) + t) * st;
  const int64_t page = a.kv_indices[a.kv_indptr[b] + t / a.page_size];
  return page * sp + (t % a.page_size) * st;
}

// Whether query qi (of qo_len, right-aligned against kv_len keys) sees key kj.
__device__ __forceinline__ bool key_visible(const AttentionParams& p, int32_t b, int64_t qo_len,
                                            int64_t kv_len, int64_t qi, int64_t kj) {
  const int64_t pos = kv_len - qo_len + qi;
  if (p.causal && kj > pos) return false;
  if (p.window_left >= 0 && kj < pos - p.window_left) return false;
  if (p.custom_mask) {
    // Read as little-endian 32-bit words (bit k of byte j is bit 8j + k either way): no byte
    // loads, and the device copy is padded to whole words (attention_common.cpp).
    const int64_t bit = p.mask_indptr[b] + qi * kv_len + kj;
    return (reinterpret_cast<const uint32_t*>(p.custom_mask)[bit >> 5] >> (bit & 31)) & 1u;
  }
  return true;
}

// Logit in log2 units from the raw dot product.
__device__ __forceinline__ float logit_log2(const AttentionParams& p, float dot, float scale) {
  float s = dot * scale;
  if (p.logits_soft_cap > 0.0f) s = p.logits_soft_cap * tanhf(s / p.logits_soft_cap);
  return s * kLog2e;
}

// Folds the sink logit sink2 (log2 units; a key with a zero value) into a finished state:
// returns the new LSE and sets *factor to what the normalized output is multiplied by. NaN
// stays NaN; a state with no key becomes (0, sink2).
__device__ __forceinline__ float apply_sink(float lse, float sink2, float* factor) {
  if (isnan(lse)) {
    *factor = 1.0f;
    return lse;
  }
  if (lse == -INFINITY) {
    *factor = 0.0f;
    return sink2;
  }
  const float m = fmaxf(lse, sink2);
  const float total = m + log2f(exp2f(lse - m) + exp2f(sink2 - m));
  *factor = exp2f(lse - total);
  return total;
}

// Merge pass of split-KV: merged row m, head blockIdx.y; threads stride over head_dim.
template <class TO>
__global__ void merge_partials_kernel(AttentionParams p) {
  const int32_t m = blockIdx.x, h = blockIdx.y;
  const int64_t row = p.merge_out_row[m];
  if (row < 0) return;  // padding entry of a CUDA-graph plan
  const int32_t begin = p.merge_indptr[m], end = p.merge_indptr[m + 1];
  float s_max = -INFINITY;
  bool nan = false;  // a chunk saw a NaN score: the row is NaN
  for (int32_t k = begin; k < end; ++k) {
    const float sk = p.tmp_s[static_cast<int64_t>(p.merge_rows[k]) * p.num_qo_heads + h];
    nan = nan || isnan(sk);
    s_max = fmaxf(s_max, sk);
  }
  TO* o = static_cast<TO*>(p.o) + row * p.o_stride_n + h * p.o_stride_h;
  if (nan || s_max == -INFINITY) {  // NaN, or no chunk saw a key
    const float lse0 = nan ? NAN : -INFINITY;
    float f = 1.0f;
    const float lse = p.sinks ? apply_sink(lse0, p.sinks[h] * kLog2e, &f) : lse0;
    for (int d = threadIdx.x; d < p.head_dim_vo; d += blockDim.x) {
      o[d] = from_f32<TO>(nan ? NAN : 0.0f);
    }
    if (p.lse && threadIdx.x == 0) p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = lse;
    return;
  }
  float wsum = 0.0f;
  for (int32_t k = begin; k < end; ++k) {
    wsum += exp2f(p.tmp_s[static_cast<int64_t>(p.merge_rows[k]) * p.num_qo_heads + h] - s_max);
  }
  float inv = 1.0f / wsum;
  float lse = s_max + log2f(wsum);
  if (p.sinks) {
    float f = 1.0f;
    lse = apply_sink(lse, p.sinks[h] * kLog2e, &f);
    inv *= f;
  }
  for (int d = threadIdx.x; d < p.head_dim_vo; d += blockDim.x) {
    float acc = 0.0f;
    for (int32_t k = begin; k < end; ++k) {
      const int64_t prow = static_cast<int64_t>(p.merge_rows[k]) * p.num_qo_heads + h;
      const float w = exp2f(p.tmp_s[prow] - s_max);  // 0 for -inf chunks
      if (w > 0.0f) acc += w * p.tmp_v[prow * p.head_dim_vo + d];
    }
    o[d] = from_f32<TO>(acc * inv);
  }
  if (p.lse && threadIdx.x == 0) p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = lse;
}

}  // namespace flashinfer::kernels::cuda
