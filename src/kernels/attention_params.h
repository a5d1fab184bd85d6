// Private: what the attention, page and cascade kernels of every backend receive. Strides are in
// elements; the head_dim axis of q, k, v and o is contiguous (stride 1, checked by the API).
// Index pointers live on the kernel's device (host memory for the CPU backend).
//
// The CUDA attention kernels are also compiled at run time by NVRTC (src/jit), which has no host
// headers: under __CUDACC_RTC__ only the structs the kernels read are declared, with DType of the
// same underlying type and only the enumerators the default member initializers name (the kernels
// never look at its values; the static_assert below keeps them equal to flashinfer/dtype.h's).
#pragma once

#ifdef __CUDACC_RTC__
#include <cuda/std/cstdint>
namespace flashinfer {
enum class DType : uint8_t { kFloat32, kFloat16 };
}
#else
#include <cstdint>
#include <vector>

#include "flashinfer/dtype.h"
static_assert(static_cast<int>(flashinfer::DType::kFloat16) == 1,
              "the NVRTC declaration of DType above names kFloat16 = 1");
#endif

namespace flashinfer::kernels {

/// Where key/value token t of request b lives. Paged: page kv_indices[kv_indptr[b] + t /
/// page_size], slot t % page_size. Ragged (kv_indices == nullptr): token kv_indptr[b] + t.
struct KvAddressing {
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype = DType::kFloat16;
  int64_t k_stride_page = 0, k_stride_token = 0, k_stride_head = 0;
  int64_t v_stride_page = 0, v_stride_token = 0, v_stride_head = 0;
  const int32_t* kv_indptr = nullptr;   // [batch + 1]: pages (paged) or tokens (ragged)
  const int32_t* kv_indices = nullptr;  // paged only: physical page ids
  int32_t page_size = 1;
};

/// One unit of work: rows [qo_begin, qo_end) (relative to the request) of request `request`
/// against keys [kv_begin, kv_end). partial_base < 0: the result is final and goes to o/lse;
/// otherwise row i goes to partial row partial_base + (i - qo_begin) of tmp_v/tmp_s and a merge
/// pass combines the chunks.
struct WorkItem {
  int32_t request, qo_begin, qo_end, kv_begin, kv_end, partial_base;
};
static_assert(sizeof(WorkItem) == 6 * sizeof(int32_t));

#ifndef __CUDACC_RTC__
/// The host-side work partition plan() builds once and run() reuses for every layer.
struct AttentionPlan {
  std::vector<WorkItem> work;
  // Merge pass: merged row m writes q row merge_out_row[m] (global) from the partial rows
  // merge_rows[merge_indptr[m] .. merge_indptr[m + 1]].
  std::vector<int32_t> merge_indptr{0};
  std::vector<int32_t> merge_rows;
  std::vector<int32_t> merge_out_row;
  int64_t num_partial_rows = 0;
  // Rows of tmp_v / tmp_s the workspace is laid out for (>= num_partial_rows): a CUDA-graph plan
  // keeps its first plan's layout, so a captured run's pointers stay valid after a re-plan.
  int64_t partial_rows_capacity = 0;
  int32_t cta_tile_q = 1;     // rows per work item (prefill); decode: q_len_per_req
  int32_t kv_chunk_size = 0;  // tokens per chunk; 0 when KV is not split
  // Tokens of the smallest chunk the planner would cut (its floor, in whole pages and, for the
  // tensor-core kernels, whole K/V tiles): the device-side plan splits a request no finer
  // (kernels/block_table_plan.h).
  int32_t min_kv_chunk = 0;
  bool split_kv = false;
};
#endif

struct AttentionParams {
  // q [rows, Hq, Dqk]: row qo_indptr[b] + i is query i of request b.
  const void* q = nullptr;
  DType q_dtype = DType::kFloat16;
  int64_t q_stride_n = 0, q_stride_h = 0;
  KvAddressing kv;
  // o [rows, Hq, Dvo]; lse [rows, Hq] fp32, base 2 (nullptr: not requested).
  void* o = nullptr;
  DType o_dtype = DType::kFloat16;
  int64_t o_stride_n = 0, o_stride_h = 0;
  float* lse = nullptr;
  int64_t lse_stride_n = 0, lse_stride_h = 0;
  // Natural-log LSE (the prefill wrappers' run(lse_base="ln"), upstream 0.7.4): each base-2 value
  // times fp32 ln 2 as its own rounding, as upstream's lse.mul_(ln2) after the kernel.
  bool lse_base_e = false;

  int32_t batch = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim_qk = 0, head_dim_vo = 0;
  const int32_t* qo_indptr = nullptr;  // [batch + 1]
  const int32_t* kv_lens = nullptr;    // [batch]: keys per request

  // Score of query i (absolute position kv_len - qo_len + i) and key j:
  //   s = sm_scale * scale_q[h] * scale_k[g] * (q . k), soft-capped when logits_soft_cap > 0;
  // kept if causal ⇒ j <= pos, window_left >= 0 ⇒ j >= pos - window_left, custom mask bit set.
  float sm_scale = 1.0f;  // includes the scalar q_scale and k_scale
  float logits_soft_cap = 0.0f;
  // Set by the FA2 prefill launcher, read from the kernel's parameters where a register for them
  // spilled or rebuilding them cost a loop's worth of work: sm_scale * log2(e), which its plain
  // blocks take inside each exponent's FFMA; and the token -> page split of kv.page_size (1 when
  // ragged) as dev::FastDivmod's multiplier and shift, which the offset fill would otherwise
  // derive (a division and a loop) every K/V tile.
  float sm_scale_log2 = 0.0f;
  uint32_t kv_page_div_mul = 0, kv_page_div_shift = 0;
  float v_scale = 1.0f;            // output multiplier (fp8 KV)
  const float* scale_q = nullptr;  // optional per-head factors [Hq], [Hkv], [Hkv]
  const float* scale_k = nullptr;
  const float* scale_v = nullptr;
  // Attention sinks [Hq] fp32 (natural-log logits, not scaled): exp(sinks[h]) joins the softmax
  // denominator of head h as a key with a zero value, and the LSE includes it.
  const float* sinks = nullptr;
  // ALiBi inside attention (pos_encoding_mode="ALIBI", CUDA decode kernel): [Hq] slopes; the
  // scaled logit gets slopes[h] * (j - i), i the query's index in its request, before the soft
  // cap (upstream's DefaultAttention). The CPU backend takes them through its PosEncoding.
  const float* alibi_slopes = nullptr;
  bool causal = false;
  int32_t window_left = -1;
  const uint8_t* custom_mask = nullptr;  // packed little-endian bits, request b starts at bit
  const int64_t* mask_indptr = nullptr;  // mask_indptr[b]; bit (i * kv_len + j) within it
  // Multi-item scoring (the prefill wrappers' prefix_len_ptr etc.; custom_mask then nullptr): the
  // query of row r (qo_indptr numbering) at position q sees keys [0, a) and [lo, q], with a =
  // multi_item_rows[2r] and lo = multi_item_rows[2r + 1] (as a custom mask: the kernels' mask
  // path; a window applies too). Request b's prefix_len and max_item_len are
  // multi_item_bounds[2b] and [2b + 1] (clamped to int32): no row of a block sees a key past its
  // last position or between the prefix and its first position less max_item_len, which the
  // kernels skip (prefill_shape.h, prefill_multi_item_tiles). nullptr: not that mode.
  const int32_t* multi_item_rows = nullptr;
  const int32_t* multi_item_bounds = nullptr;

  // Work partition (AttentionPlan::work etc., on the kernel's device).
  const WorkItem* work = nullptr;
  int32_t num_work = 0;
  int32_t max_work_rows = 0;  // largest qo_end - qo_begin over the work items
  // CUDA: prefer the tensor-core (mma.sync) kernel when the dtypes allow it (prefill, or
  // decode with use_tensor_cores).
  bool use_tensor_cores = false;
  // CUDA: backend "fa2": the FA2 kernel even where the Hopper kernel (prefill_sm90.h) fits.
  bool prefill_fa2_only = false;
  const int32_t* merge_indptr = nullptr;
  const int32_t* merge_rows = nullptr;
  const int32_t* merge_out_row = nullptr;
  int32_t num_merge = 0;
  float* tmp_v = nullptr;  // [num_partial_rows, Hq, Dvo]
  float* tmp_s = nullptr;  // [num_partial_rows, Hq]
};

/// merge_state / merge_state_in_place / merge_states: `num_states` states per (row, head).
/// v [seq, num_states, H, D] addressed by strides; s [seq, num_states, H] fp32.
struct MergeParams {
  const void* v = nullptr;
  const float* s = nullptr;
  DType v_dtype = DType::kFloat16;
  int64_t v_stride_n = 0, v_stride_k = 0, v_stride_h = 0;
  int64_t s_stride_n = 0, s_stride_k = 0, s_stride_h = 0;
  // Second input for the binary forms (num_states == 2 reads state 1 from here when set).
  const void* v_b = nullptr;
  const float* s_b = nullptr;
  int64_t vb_stride_n = 0, vb_stride_h = 0, sb_stride_n = 0, sb_stride_h = 0;
  void* v_out = nullptr;
  float* s_out = nullptr;
  int64_t vo_stride_n = 0, vo_stride_h = 0, so_stride_n = 0, so_stride_h = 0;
  const uint8_t* mask = nullptr;  // [seq] bool: rows with 0 are left untouched
  int64_t seq = 0, num_states = 0, num_heads = 0, head_dim = 0;
};

}  // namespace flashinfer::kernels
