// Private: what the trtllm_ragged_attention_deepseek kernels of every backend receive. Strides
// are in elements; the feature axis of every tensor is contiguous (checked by the API). Index
// pointers live on the kernel's device (host memory for the CPU backend).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/attention_params.h"

namespace flashinfer::kernels {

/// Ragged (packed, no page table) attention with GQA: request b owns query rows
/// [cu_q[b], cu_q[b + 1]) and key/value rows [cu_kv[b], cu_kv[b] + kv_lens[b]). Query i of a
/// request of qo_len queries sits at position kv_len - qo_len + i; key j is visible when
/// (!causal || j <= pos) and (window_left < 0 || j >= pos - window_left).
///   s_j = bmm1_scale * q . k_j;  o = bmm2_scale * sum_j softmax(s)_j v_j;
///   lse = log2(sum_j exp(s_j)) (base 2); a row that sees no key gives o = 0, lse = -inf.
struct RaggedAttentionParams {
  const void* q = nullptr;  // [rows, Hq, head_dim_qk]
  const void* k = nullptr;  // [kv rows, Hkv, head_dim_qk]
  const void* v = nullptr;  // [kv rows, Hkv, head_dim_vo]
  DType q_dtype = DType::kBFloat16, k_dtype = DType::kBFloat16, v_dtype = DType::kBFloat16;
  int64_t q_stride_n = 0, q_stride_h = 0, k_stride_n = 0, k_stride_h = 0, v_stride_n = 0,
          v_stride_h = 0;
  const int32_t* cu_q = nullptr;     // [batch + 1]
  const int32_t* cu_kv = nullptr;    // [batch + 1]
  const int32_t* kv_lens = nullptr;  // [batch]
  // [rows] request of each query row (CUDA backend's warp-per-row kernel only; -1: a row it skips,
  // a request the device plan refused or a row of none)
  const int32_t* row_req = nullptr;
  void* o = nullptr;  // [rows, Hq, head_dim_vo]
  DType o_dtype = DType::kBFloat16;
  int64_t o_stride_n = 0, o_stride_h = 0;
  float* lse = nullptr;  // [rows, Hq] fp32 (nullptr: not requested)
  int64_t lse_stride_n = 0, lse_stride_h = 0;
  // fmha_v2's softmax statistics (nullptr: not requested): stats[row, h] = (m, l * stats_sum_scale)
  // with m = max_j s_j (natural units) and l = sum_j exp(s_j - m); an empty row gives (-inf, 0).
  float* stats = nullptr;
  int64_t stats_stride_n = 0, stats_stride_h = 0;
  float stats_sum_scale = 1.0f;
  int32_t batch = 0, rows = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim_qk = 0, head_dim_vo = 0;
  int32_t window_left = -1;
  float bmm1_scale = 1.0f, bmm2_scale = 1.0f;
  bool causal = false;
  // CUDA backend: the work items of the FA2 prefill kernel (one per request and tile of queries,
  // every key; device memory), set by the host when ragged_fa2_eligible() holds; nullptr: the
  // warp-per-row kernel.
  const WorkItem* fa2_work = nullptr;
  int32_t fa2_num_work = 0, fa2_max_rows = 0;
  // Split-KV of those items (api::one_shot_plan; fa2_partial_rows == 0: none): the merge pass's
  // arrays (device memory, AttentionParams' merge_*), and the fp32 partials tmp_v
  // [fa2_partial_rows, Hq, head_dim_vo] and tmp_s [fa2_partial_rows, Hq], from the caller's
  // workspace; tmp_v == nullptr: the CUDA backend takes them from its per-stream scratch.
  const int32_t* fa2_merge_indptr = nullptr;
  const int32_t* fa2_merge_rows = nullptr;
  const int32_t* fa2_merge_out_row = nullptr;
  int32_t fa2_num_merge = 0;
  int64_t fa2_partial_rows = 0;
  float* tmp_v = nullptr;
  float* tmp_s = nullptr;
};

}  // namespace flashinfer::kernels
