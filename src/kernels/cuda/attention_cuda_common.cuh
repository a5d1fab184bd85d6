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

/// The LSE a kernel writes: its base-2 value, or that times fp32 ln 2 in one rounding (never
/// fused into the value's own arithmetic) for lse_base "ln" (AttentionParams::lse_base_e).
__device__ __forceinline__ float lse_out(const AttentionParams& p, float lse2) {
  return p.lse_base_e ? __fmul_rn(lse2, 0.693147182464599609375f) : lse2;
}

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

// Whether query qi (of qo_len, right-aligned against kv_len keys) sees key kj. kMultiItem: the
// kernel may run multi-item scoring's rows (AttentionParams::multi_item_rows); the AOT decode
// instances leave the test out (ptxas spilled the two-row ones with it: such calls take a JIT
// instance, kDecodeMultiItem).
template <bool kMultiItem = true>
__device__ __forceinline__ bool key_visible(const AttentionParams& p, int32_t b, int64_t qo_len,
                                            int64_t kv_len, int64_t qi, int64_t kj) {
  const int64_t pos = kv_len - qo_len + qi;
  if (p.causal && kj > pos) return false;
  if (p.window_left >= 0 && kj < pos - p.window_left) return false;
  if constexpr (kMultiItem) {
    if (p.multi_item_rows) {  // keys [0, a) and [lo, pos] of the row
      const int32_t* r = p.multi_item_rows + 2 * (p.qo_indptr[b] + qi);
      return kj <= pos && (kj < r[0] || kj >= r[1]);
    }
  }
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

// Merge pass of split-KV: one block of kMergeThreads per (merged row m, head blockIdx.y).
// Every thread takes part in each pass, and a thread's chunk loads do not depend on each other:
// the first form (one thread per output dim walking every chunk in turn) was latency-bound,
// 110 us for 158 chunks of batch 1 x 32768 keys on an H200 where the attention took 66 us.
constexpr int kMergeThreads = 256;

// Partial state k of a merged row, head h: its index into tmp_s (times head_dim_vo: into tmp_v).
__device__ __forceinline__ int64_t merge_partial(const AttentionParams& p, int32_t k, int32_t h) {
  return static_cast<int64_t>(p.merge_rows[k]) * p.num_qo_heads + h;
}

// Block-wide max (kMax) or sum of one float per thread, in a fixed order (lanes by xor tree,
// then the warps in order): the same inputs give the same bits. `red` holds a float per warp.
template <bool kMax>
__device__ __forceinline__ float merge_block_reduce(float v, float* red) {
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  __syncthreads();  // `red` may still be read from the previous reduction
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kMergeThreads / 32; ++w) r = kMax ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

// The weighted value sum of one thread group: chunks begin + g, begin + g + groups, ... of
// slot `slot` (kW consecutive dims), loads issued unconditionally (a -inf chunk's weight is 0
// and its value is selected away, not multiplied: 0 * inf would be NaN).
// With `staged` (a row of at most kMergeThreads chunks), chunk k's partial row and weight come
// from shared memory (prow_s / w_s at k - begin, the same values), so the value loads depend on
// nothing else and are all in flight together; otherwise each is looked up and weighed here.
template <int kW>
__device__ __forceinline__ void merge_weighted_sum(const AttentionParams& p, int32_t h,
                                                   int32_t begin, int32_t end, int g, int groups,
                                                   int slot, float s_max, float (&acc)[4],
                                                   const int64_t* prow_s, const float* w_s) {
  const int64_t dv = p.head_dim_vo;
#pragma unroll 4
  for (int32_t k = begin + g; k < end; k += groups) {
    const int64_t prow = prow_s ? prow_s[k - begin] : merge_partial(p, k, h);
    const float w = w_s ? w_s[k - begin] : exp2f(p.tmp_s[prow] - s_max);
    const float* src = p.tmp_v + prow * dv + static_cast<int64_t>(slot) * kW;
    if constexpr (kW == 4) {
      const float4 v = *reinterpret_cast<const float4*>(src);
      acc[0] += w > 0.0f ? w * v.x : 0.0f;
      acc[1] += w > 0.0f ? w * v.y : 0.0f;
      acc[2] += w > 0.0f ? w * v.z : 0.0f;
      acc[3] += w > 0.0f ? w * v.w : 0.0f;
    } else {
      const float v = *src;
      acc[0] += w > 0.0f ? w * v : 0.0f;
    }
  }
}

// Rows of at most this many chunks take the serial form below: with few chunks the block form's
// reductions and barriers cost more than they save (H200, 2 chunks a row: batch 64 x kv 512
// 0.0614 ms of decode with the serial form, 0.069-0.070 with the block form; the headline batch
// 64 x kv 2048 0.1963 against 0.2043-0.2046).
constexpr int32_t kMergeSerialChunks = 8;

// A merged row that is NaN (a chunk saw a NaN score) or saw no key: o NaN or 0, lse NaN or -inf
// (the sink folded in); threads stride over the dims by blockDim.x, thread 0 writes lse.
template <class TO>
__device__ __forceinline__ void merge_write_empty(const AttentionParams& p, int32_t h, int64_t row,
                                                  bool nan) {
  TO* o = static_cast<TO*>(p.o) + row * p.o_stride_n + h * p.o_stride_h;
  const float lse0 = nan ? NAN : -INFINITY;
  float f = 1.0f;
  const float lse = p.sinks ? apply_sink(lse0, p.sinks[h] * kLog2e, &f) : lse0;
  for (int d = threadIdx.x; d < p.head_dim_vo; d += blockDim.x) {
    o[d] = from_f32<TO>(nan ? NAN : 0.0f);
  }
  if (p.lse && threadIdx.x == 0) p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = lse_out(p, lse);
}

// The merged row's LSE from the chunks' maximum and weight sum (the sink folded in), and in *inv
// what the weighted value sums are multiplied by.
__device__ __forceinline__ float merge_lse(const AttentionParams& p, int32_t h, float s_max,
                                           float wsum, float* inv) {
  *inv = 1.0f / wsum;
  float lse = s_max + log2f(wsum);
  if (p.sinks) {
    float f = 1.0f;
    lse = apply_sink(lse, p.sinks[h] * kLog2e, &f);
    *inv *= f;
  }
  return lse;
}

// The serial form of the merge (the first form, which ran on the H100 and H200): each thread
// takes output dims tid, tid + blockDim.x, ... and walks the row's chunks in turn for the
// maximum, the weight sum and its dims' weighted sums.
template <class TO>
__device__ __forceinline__ void merge_row_serial(const AttentionParams& p, int32_t h, int64_t row,
                                                 int32_t begin, int32_t end) {
  float s_max = -INFINITY;
  bool nan = false;  // a chunk saw a NaN score: the row is NaN
  for (int32_t k = begin; k < end; ++k) {
    const float sk = p.tmp_s[merge_partial(p, k, h)];
    nan = nan || isnan(sk);
    s_max = fmaxf(s_max, sk);
  }
  if (nan || s_max == -INFINITY) {  // NaN, or no chunk saw a key
    merge_write_empty<TO>(p, h, row, nan);
    return;
  }
  float wsum = 0.0f;
  for (int32_t k = begin; k < end; ++k) wsum += exp2f(p.tmp_s[merge_partial(p, k, h)] - s_max);
  float inv;
  const float lse = merge_lse(p, h, s_max, wsum, &inv);
  TO* o = static_cast<TO*>(p.o) + row * p.o_stride_n + h * p.o_stride_h;
  for (int d = threadIdx.x; d < p.head_dim_vo; d += blockDim.x) {
    float acc = 0.0f;
    for (int32_t k = begin; k < end; ++k) {
      const int64_t prow = merge_partial(p, k, h);
      const float w = exp2f(p.tmp_s[prow] - s_max);  // 0 for -inf chunks
      if (w > 0.0f) acc += w * p.tmp_v[prow * p.head_dim_vo + d];
    }
    o[d] = from_f32<TO>(acc * inv);
  }
  if (p.lse && threadIdx.x == 0) p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = lse_out(p, lse);
}

template <class TO>
__global__ void __launch_bounds__(kMergeThreads) merge_partials_kernel(AttentionParams p) {
  // groups x head_dim_vo partial sums: groups * slots <= kMergeThreads and a slot is at most 4
  // dims, so at most 4 * kMergeThreads floats.
  __shared__ float part[4 * kMergeThreads];
  __shared__ float red[kMergeThreads / 32];
  // Rows of at most kMergeThreads chunks: thread t looks chunk begin + t up once (its partial row,
  // then its score, then its weight) for every pass. Otherwise each pass looks the chunks up
  // again: three dependent loads (merge_rows, tmp_s, tmp_v) a chunk in the weighted sums, the
  // latency-bound part of the merge (11 us for 114 chunks of batch 1 x 32768 keys on an H200).
  __shared__ int64_t prow_s[kMergeThreads];
  __shared__ float w_s[kMergeThreads];
  pdl_wait();  // launched with PDL: the partials of the kernel before are complete past here
  const int32_t m = blockIdx.x, h = blockIdx.y;
  const int64_t row = p.merge_out_row[m];
  if (row < 0) return;  // padding entry of a CUDA-graph plan (the whole block returns)
  const int32_t begin = p.merge_indptr[m], end = p.merge_indptr[m + 1];
  if (end - begin <= kMergeSerialChunks) {  // the same for the whole block
    merge_row_serial<TO>(p, h, row, begin, end);
    return;
  }
  const int tid = static_cast<int>(threadIdx.x);
  const bool staged = end - begin <= kMergeThreads;  // the same for the whole block
  float s_max = -INFINITY;
  float s_own = -INFINITY;  // staged: this thread's chunk's score
  bool nan = false;         // a chunk saw a NaN score: the row is NaN
  for (int32_t k = begin + tid; k < end; k += kMergeThreads) {
    const int64_t prow = merge_partial(p, k, h);
    const float sk = p.tmp_s[prow];
    if (staged) prow_s[tid] = prow, s_own = sk;
    nan = nan || isnan(sk);
    s_max = fmaxf(s_max, sk);
  }
  nan = __syncthreads_or(nan) != 0;
  s_max = merge_block_reduce<true>(s_max, red);
  if (nan || s_max == -INFINITY) {  // NaN, or no chunk saw a key (the same for the whole block)
    merge_write_empty<TO>(p, h, row, nan);
    return;
  }
  float wpart = 0.0f;
  if (staged) {
    // The weight the unstaged loop computes (one chunk a thread: 0 + w is w); the weighted sums
    // read w_s after the reduction's barriers.
    if (begin + tid < end) w_s[tid] = wpart = exp2f(s_own - s_max);
  } else {
    for (int32_t k = begin + tid; k < end; k += kMergeThreads) {
      wpart += exp2f(p.tmp_s[merge_partial(p, k, h)] - s_max);
    }
  }
  const float wsum = merge_block_reduce<false>(wpart, red);
  float inv;
  const float lse = merge_lse(p, h, s_max, wsum, &inv);
  const int dv = p.head_dim_vo;
  TO* o = static_cast<TO*>(p.o) + row * p.o_stride_n + h * p.o_stride_h;
  // Thread groups of `lanes` threads, one slot (4 dims where rows are 16-byte aligned, else 1)
  // a lane; the groups split the chunks and add up in group order.
  const bool vec = dv % 4 == 0 && reinterpret_cast<size_t>(p.tmp_v) % 16 == 0;
  const int width = vec ? 4 : 1, slots = dv / width;
  const int lanes = slots < kMergeThreads ? slots : kMergeThreads;
  const int groups = kMergeThreads / lanes;
  const int g = tid / lanes, lane = tid % lanes;
  if (g < groups) {
    for (int slot = lane; slot < slots; slot += lanes) {
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const int64_t* ps = staged ? prow_s : nullptr;
      const float* ws = staged ? w_s : nullptr;
      if (vec) {
        merge_weighted_sum<4>(p, h, begin, end, g, groups, slot, s_max, acc, ps, ws);
      } else {
        merge_weighted_sum<1>(p, h, begin, end, g, groups, slot, s_max, acc, ps, ws);
      }
      for (int i = 0; i < width; ++i) {
        const int d = slot * width + i;
        if (groups == 1) {
          o[d] = from_f32<TO>(acc[i] * inv);
        } else {
          part[g * dv + d] = acc[i];
        }
      }
    }
  }
  if (groups > 1) {
    __syncthreads();
    for (int d = tid; d < dv; d += kMergeThreads) {
      float acc = part[d];
      for (int gg = 1; gg < groups; ++gg) acc += part[gg * dv + d];
      o[d] = from_f32<TO>(acc * inv);
    }
  }
  if (p.lse && tid == 0) p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = lse_out(p, lse);
}

}  // namespace flashinfer::kernels::cuda
