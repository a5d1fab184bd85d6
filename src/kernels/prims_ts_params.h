// Private: what the CPU reference of upstream's task-scheduled attention
// (flashinfer.attention.prims_ts: decode, MLA decode, context, block-sparse) receives. Every
// layout those entry points take is described as pages: a request's key t lives in page
// pages[page_indptr[b] + t / page_size], slot t % page_size (a contiguous [B, S, H, D] tensor is
// one page of S tokens a request; a packed [total, H, D] one is pages of one token). Strides in
// elements; the head_dim axis has unit stride.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

struct TsAttentionParams {
  int64_t batch = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim_qk = 0, head_dim_vo = 0;
  DType q_dtype = DType::kFloat16, kv_dtype = DType::kFloat16, o_dtype = DType::kFloat16;
  // Query i of request b is row q_row0[b] + i of q / o; q_len[b] queries.
  const void* q = nullptr;
  int64_t q_row_stride = 0, q_head_stride = 0;
  void* o = nullptr;
  int64_t o_row_stride = 0, o_head_stride = 0;
  const int64_t* q_row0 = nullptr;  // [batch]
  const int64_t* q_len = nullptr;   // [batch]
  // K and V (MLA: V is the first head_dim_vo features of K's rows: v == k, same strides).
  const void *k = nullptr, *v = nullptr;
  int64_t k_page_stride = 0, k_slot_stride = 0, k_head_stride = 0;
  int64_t v_page_stride = 0, v_slot_stride = 0, v_head_stride = 0;
  int64_t page_size = 1;
  const int64_t* page_indptr = nullptr;  // [batch + 1] into pages
  const int64_t* pages = nullptr;
  const int64_t* kv_len = nullptr;  // [batch]
  // Visible keys of query i, with cur = kv_len - q_len + i (its bottom-right position):
  // [begin, end), end = cur + 1 when causal, else cur + window_right + 1 when window_right >= 0,
  // else kv_len (never past kv_len); begin = max(0, cur - window_left) when window_left >= 0.
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  // Block-sparse (q_block_size > 0): key t is visible to query i of kv head g only when block
  // t / kv_block_size is in row (b, g, i / q_block_size): block_indices[block_begin[row] ..
  // block_end[row]), rows numbered (b * num_kv_heads + g) * num_q_blocks + q block.
  int64_t q_block_size = 0, kv_block_size = 0, num_q_blocks = 0;
  const int64_t* block_begin = nullptr;
  const int64_t* block_end = nullptr;
  const int64_t* block_indices = nullptr;
  // kv_valid_bits (optional): [batch, words] uint32, bit t % 32 of word t / 32 marks key t valid.
  const uint32_t* kv_valid_bits = nullptr;
  int64_t kv_valid_words = 0;
  // logits = q.k * bmm1_scale; out = softmax(logits) @ v * bmm2_scale.
  float bmm1_scale = 1.0f, bmm2_scale = 1.0f;
  // Optional: sinks [num_qo_heads] fp32, a logit per head added to the softmax's denominator
  // only; lse [row, head] fp32 (of the whole denominator, sink included): natural log, or
  // base 2 with lse_log2. A query that sees no key (and has no sink) gets -inf.
  const float* sinks = nullptr;
  float* lse = nullptr;
  int64_t lse_row_stride = 0, lse_head_stride = 0;
  bool lse_log2 = false;
};

}  // namespace flashinfer::kernels
