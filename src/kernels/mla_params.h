// Private: what the MLA kernels of every backend receive. Strides are in elements; the last
// (feature) axis of every tensor is contiguous (checked by the API). Index pointers live on the
// kernel's device (host memory for the CPU backend).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/page_append_params.h"

namespace flashinfer::kernels {

/// MLA attention over a paged latent cache. Token t of request b lives in page
/// kv_indices[kv_indptr[b] + t / page_size], slot t % page_size, of both ckv and kpe.
struct MlaAttentionParams {
  // q_nope [rows, H, dim_ckv], q_pe [rows, H, dim_kpe]: row qo_indptr[b] + i is query i of
  // request b.
  const void* q_nope = nullptr;
  const void* q_pe = nullptr;
  DType q_dtype = DType::kBFloat16;
  int64_t qn_stride_n = 0, qn_stride_h = 0, qp_stride_n = 0, qp_stride_h = 0;
  // ckv [pages, page_size, dim_ckv], kpe [pages, page_size, dim_kpe].
  const void* ckv = nullptr;
  const void* kpe = nullptr;
  DType kv_dtype = DType::kBFloat16;
  int64_t ckv_stride_page = 0, ckv_stride_token = 0, kpe_stride_page = 0, kpe_stride_token = 0;
  const int32_t* kv_indptr = nullptr;   // [batch + 1] into kv_indices
  const int32_t* kv_indices = nullptr;  // page ids
  int32_t page_size = 1;
  const int32_t* qo_indptr = nullptr;  // [batch + 1]
  const int32_t* kv_lens = nullptr;    // [batch]
  // o [rows, H, dim_ckv]; lse [rows, H] fp32 (nullptr: not requested).
  void* o = nullptr;
  DType o_dtype = DType::kBFloat16;
  int64_t o_stride_n = 0, o_stride_h = 0;
  float* lse = nullptr;
  int64_t lse_stride_n = 0, lse_stride_h = 0;
  bool lse_base_e = false;  // natural log instead of base 2
  int32_t batch = 0, num_heads = 0, dim_ckv = 0, dim_kpe = 0;
  // s = sm_scale * (q_nope . ckv * ckv_scale + q_pe . kpe * kpe_scale);
  // o = out_scale * ckv_scale * sum_j softmax(s)_j ckv_j.
  float sm_scale = 1.0f;
  float ckv_scale = 1.0f, kpe_scale = 1.0f;
  float out_scale = 1.0f;
  // Per-token, per-128-channel ckv scales of an fp8 e4m3 cache (BatchMLAPagedAttentionWrapper.run's
  // ckv_scale_arr; nullptr: none): fp32 [pages * page_size, dim_ckv / 128], row page * page_size
  // + slot. Element d of a latent row is then fp8(x) * ckv_scale_arr[row][d / 128] rounded to q's
  // dtype (upstream's fa kernels dequantize so, into their 16-bit tiles), for the score and the
  // output alike, and ckv_scale is 1.
  const float* ckv_scale_arr = nullptr;
  // Factors of sm_scale and out_scale that live on the device (CUDA only; nullptr: none): the
  // block-table decode calls' bmm1_scale / bmm2_scale given as tensors there, read by the kernels
  // after pdl_wait so that nothing is read back and a captured call sees each replay's values.
  const float* sm_scale_dev = nullptr;
  const float* out_scale_dev = nullptr;
  // Query i of a request of qo_len queries and kv_len tokens is at kv_len - qo_len + i and,
  // when causal, sees tokens 0..that position.
  bool causal = false;
  // Host-side summaries (read by the CUDA launcher for its grid): query rows (qo_indptr[batch])
  // and the largest kv_lens entry (with max_kv_dev: the most tokens a request can have, which
  // sizes the splits).
  int32_t rows = 0, max_kv_len = 0;
  // The largest kv_lens entry on the device, where the host does not know it: under a CUDA graph
  // (the wrappers' use_cuda_graph, rewritten by every plan) and in the block-table decode calls'
  // device plan (kernels/block_table_plan.h). The CUDA kernels derive their KV chunk from it and
  // the grid's splits (mla_device_chunk), so a grid sized for the bound covers any length.
  const int32_t* max_kv_dev = nullptr;
  // [rows] request of each query row (device memory; the CUDA backend only); -1: a row of a
  // request the device-side plan refused (kernels/block_table_plan.h), which the kernels skip.
  const int32_t* row_req = nullptr;
  // Page ids read when the call runs from the caller's tensor (BatchMLAPagedAttentionWrapper:
  // kernels/mla_page_guard.h; CUDA only): before the MLA kernels a guard kernel checks each
  // request's ids against guard_pages, the cache's pages, and rewrites row_req through this
  // pointer (the same array), -1 and NaN rows for a request with a bad id. Null: no guard (the
  // host checked the ids at plan).
  int32_t* guard_row_req = nullptr;
  int64_t guard_pages = 0;
};

/// append_paged_mla_kv_cache: row i goes to request batch_indices[i], position positions[i]
/// (kernels/page_append_params.h).
struct MlaAppendParams {
  const void* append_ckv = nullptr;
  const void* append_kpe = nullptr;
  int64_t ackv_stride_n = 0, akpe_stride_n = 0;
  void* ckv = nullptr;
  void* kpe = nullptr;
  int64_t ckv_stride_page = 0, ckv_stride_token = 0, kpe_stride_page = 0, kpe_stride_token = 0;
  AppendTable table;  // row i goes to token append_slot(table, i) of both caches
  int64_t nnz = 0, dim_ckv = 0, dim_kpe = 0;
  int64_t elem_size = 2;  // bytes per element (rows and caches share the dtype)
};

/// concat_mla_k: k[t, h] = (k_nope[t, h], k_rope[t, 0]).
struct ConcatMlaKParams {
  void* k = nullptr;
  const void* k_nope = nullptr;
  const void* k_rope = nullptr;
  int64_t k_stride_t = 0, k_stride_h = 0, kn_stride_t = 0, kn_stride_h = 0, kr_stride_t = 0;
  int64_t tokens = 0, num_heads = 0, nope_dim = 0, rope_dim = 0;
  int64_t elem_size = 2;
};

}  // namespace flashinfer::kernels
