// Private: what the trtllm_fmha_v2_prefill backends receive. Strides in elements; the feature
// axis of every tensor is contiguous (checked by the API); index arrays on the host, or on the
// device through device_plan (CUDA).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/attention_params.h"

namespace flashinfer::kernels {

/// Request b owns query rows [cu_q[b], cu_q[b + 1]) and kv_lens[b] keys. Key j of request b and
/// KV head g lives at element
///   ragged (page_size == 0): (cu_kv[b] + j) * k_stride_n + g * k_stride_h,
///   paged:  block_tables[b * bt_stride + j / page_size] * k_stride_page
///           + (j % page_size) * k_stride_n + g * k_stride_h
/// (V likewise with its strides). Query i of qo_len sits at pos = kv_len - qo_len + i and sees
/// key j when (!causal || j <= pos), (window_left < 0 || j >= pos - window_left) and
/// (chunk <= 0 || j >= pos / chunk * chunk).
///   s_j = bmm1_scale * q . k_j;  soft_cap > 0: s_j = soft_cap * tanh(s_j / soft_cap);
///   ALiBi (alibi_slopes != nullptr): s_j += alibi_slopes[h] * (j - pos), after the cap;
///   o = bmm2_scale * sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink_h - m)),
///   stored in o_dtype (fp32, fp16, bf16 round to nearest even; fp8 e4m3 saturates at +-448).
/// trtllm_fmha_v2_prefill on CUDA with its lengths on the device: the arrays the plan kernel of
/// kernels/block_table_plan.h fills (device memory), which the attention kernels read in place of
/// a host plan: the AttentionParams fields of the same names; `kv_indices` the block table
/// (paged; row b at kv_indptr[b]), `sinks` the caller's device tensor.
struct FmhaV2DevicePlan {
  const int32_t* qo_indptr = nullptr;
  const int32_t* kv_indptr = nullptr;
  const int32_t* kv_indices = nullptr;
  const int32_t* kv_lens = nullptr;
  const WorkItem* work = nullptr;
  int32_t num_work = 0, max_work_rows = 0;
  const int32_t* merge_indptr = nullptr;
  const int32_t* merge_rows = nullptr;
  const int32_t* merge_out_row = nullptr;
  int32_t num_merge = 0;
  float* tmp_v = nullptr;
  float* tmp_s = nullptr;
  const float* sinks = nullptr;
};

struct FmhaV2PrefillParams {
  const void* q = nullptr;  // [rows, Hq, head_dim_qk]
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype = DType::kBFloat16;  // q, k and v
  int64_t q_stride_n = 0, q_stride_h = 0;
  int64_t k_stride_page = 0, k_stride_n = 0, k_stride_h = 0;
  int64_t v_stride_page = 0, v_stride_n = 0, v_stride_h = 0;
  const int32_t* cu_q = nullptr;          // [batch + 1]
  const int32_t* cu_kv = nullptr;         // [batch + 1] (ragged only)
  const int32_t* kv_lens = nullptr;       // [batch]
  const int32_t* block_tables = nullptr;  // [batch, bt_stride] (paged only)
  int64_t bt_stride = 0;
  int32_t page_size = 0;  // 0: ragged
  void* o = nullptr;      // [rows, Hq, head_dim_vo]
  DType o_dtype = DType::kBFloat16;
  int64_t o_stride_n = 0, o_stride_h = 0;
  const float* sinks = nullptr;         // [Hq] natural-log logits, or nullptr
  const float* alibi_slopes = nullptr;  // [Hq] ALiBi slopes, or nullptr
  // Softmax statistics (nullptr: not requested): stats[row, h] = (m, l), m = max_j s_j,
  // l = sum_j exp(s_j - m); a row that sees no key gives (-inf, 0).
  float* stats = nullptr;
  int64_t stats_stride_n = 0, stats_stride_h = 0;
  int32_t batch = 0, rows = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim_qk = 0, head_dim_vo = 0;
  bool causal = true;
  int64_t window_left = -1, chunk = 0;
  float bmm1_scale = 1.0f, bmm2_scale = 1.0f, soft_cap = 0.0f;
  // The caller's workspace_buffer where it lies on the kernels' device (else nullptr): the CUDA
  // backend's split-KV partials.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  // CUDA: the device plan (host memory holding device pointers); nullptr: the host arrays above.
  const FmhaV2DevicePlan* device_plan = nullptr;
};

}  // namespace flashinfer::kernels
