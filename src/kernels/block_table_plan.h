// Private: the work partition of a block-table decode call (trtllm_batch_decode_with_kv_cache,
// xqa_batch_decode_with_kv_cache) built on the device from the caller's seq_lens and block_tables,
// as plain C++ with FLASHINFER_HD: the CUDA kernel (block_table_plan_cuda.cu) and the CPU tests
// (tests/api/test_block_table_plan.cpp) run the same expressions.
//
// Upstream's kernels read seq_lens and block_tables on the device; its one host-side input is
// max_seq_len, which sizes the split of the KV over blocks. A host plan here read both tensors back
// (two synchronizations a layer, and a CUDA graph could not capture the call). Instead the host
// plans the grid for the worst case, every request max_seq_len long (api::build_plan with those
// lengths), and a small kernel fills that plan's arrays from the real lengths before the attention
// kernel runs:
// - work item (b, tile t, chunk c) sits where build_plan's worst-case partition puts it, with the
//   request's real key range: its keys spread over the grid's chunks (block_plan_chunk), the
//   chunks past its last one idle (request -1, as the padding items of a CUDA-graph grid);
// - a split plan merges every query row over the grid's num_chunks partial rows: the idle chunks'
//   entries name one extra partial row holding an empty state (score -inf, value 0), which adds
//   nothing to the merge;
// - the block table is read in place: request b's pages start at kv_indptr[b] = b * table_stride.
// A request the host checks would refuse (length outside [0, max_seq_len], more blocks than the
// table has columns, fewer keys than queries when causal, a page id outside the cache) gets no
// work item: its output rows and LSE are NaN, written by the plan kernel, and no page of it is
// read.
//
// trtllm_batch_decode_with_kv_cache_mla (and xqa's MLA form) run the MLA kernels, a block per
// query row: the same kernel writes their arrays instead (row_req, max_kv), with length 0 and
// row_req -1 for a refused request, whose rows the MLA kernels then skip.
//
// The one-shot prefill calls (trtllm_ragged_attention_deepseek; trtllm_fmha_v2_prefill, paged or
// ragged) plan the same way, with their host checks' rules for the index arrays (cu_q_exact;
// cu_kv: ragged K/V, a request's keys rows of the key tensor), in a compact layout sized from the
// query's rows rather than the worst case (`compact`: block_plan_write_compact); the deepseek
// call's warp-per-row kernel (non-16-bit dtypes) reads row_req, a row's request or -1.
// cudnn_batch_prefill_with_kv_cache's ragged call plans so too, its rows, key starts and verdict
// first found from its lengths and batch offsets by kernels/cudnn_ragged_plan.h (kv_start,
// refuse).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels {

struct BlockTablePlan {
  // Inputs (the call's tensors, on the device).
  const int32_t* seq_lens = nullptr;  // [>= batch], element b at b * seq_lens_stride
  int64_t seq_lens_stride = 1;
  const int32_t* block_tables = nullptr;  // request b's blocks at b * table_stride, dense
  int64_t table_stride = 0;
  int32_t max_blocks = 0;  // columns of the table
  int64_t num_pages = 0;   // pages of the cache
  int32_t page_size = 1;
  int32_t batch = 0;
  int32_t q_len = 1;  // queries a request (rows qo_indptr[b] = b * q_len); with cu_q, the most
  // Variable query counts (trtllm_batch_context_with_kv_cache's cum_seq_lens_q, on the device):
  // request b's queries are rows cu_q[b] .. cu_q[b + 1] of the query tensor's total_rows, at most
  // q_len of them (max_q_len: the grid is planned for every request that many). Null: q_len
  // queries each. (The MLA form, a row each through row_req, takes uniform counts only.)
  const int32_t* cu_q = nullptr;
  int64_t total_rows = 0;
  // The host rule of the one-shot prefill calls (trtllm_ragged_attention_deepseek,
  // trtllm_fmha_v2_prefill): cum_seq_lens_q ends at total_rows, so the requests' rows cover the
  // query exactly; a break refuses the call (every output row NaN: block_plan_refuse_all_rows).
  bool cu_q_exact = false;
  // Ragged K/V (cum_seq_lens_kv, on the device; needs cu_q): request b's keys are rows
  // cu_kv[b] .. cu_kv[b + 1] of the key tensor's kv_rows, and seq_lens[b] must be their count.
  // No block table (block_tables null; page_size 1, max_blocks = max_seq_len). The host's rules
  // for the array then hold: it starts at 0, never decreases and ends inside the key tensor; a
  // break refuses the call.
  const int32_t* cu_kv = nullptr;
  int64_t kv_rows = 0;
  // Ragged K/V at given first rows (cudnn_batch_prefill_with_kv_cache: kernels/cudnn_ragged_plan.h
  // wrote them, and seq_lens, from the call's batch offsets; needs cu_q): request b's keys are rows
  // kv_start[b] .. kv_start[b] + seq_lens[b] of the key tensor. That prepass checked the host's
  // rules and sets *refuse where they refuse the call, which then refuses it here too (every row
  // NaN: block_plan_refuse_all_rows).
  const int32_t* kv_start = nullptr;
  const int32_t* refuse = nullptr;
  // The one-shot calls' compact layout (needs cu_q_exact, which makes the requests' rows cover
  // the query's exactly): the grid has tile_cap tiles of num_chunks items, request b's tiles
  // after those of the requests before it (block_plan_compact_offset_part: a prefix over
  // cum_seq_lens_q), so loose max_q_len bounds cost no idle blocks. A tile's partial rows and
  // merge entries sit at its query rows' own place: merge entry m is query row m (total_rows of
  // them), partial row (row * num_chunks + chunk c's offset), the empty state after them.
  bool compact = false;
  int32_t tile_cap = 0;
  int32_t tile_rows = 1;  // queries a work item (the plan's cta_tile_q)
  int32_t max_seq_len = 0;
  bool causal = false;
  int32_t chunk_tokens = 0;      // keys a chunk of the worst case; 0: unsplit
  int32_t num_chunks = 1;        // chunks a (request, tile) in the grid
  int32_t min_chunk_tokens = 1;  // split plans: a request's chunk at least (block_plan_chunk)

  // Outputs: the AttentionParams arrays (work and merge ones: none for MLA, whose kernels take a
  // row each; merge ones only when num_chunks > 1).
  int32_t* qo_indptr = nullptr;  // [batch + 1]
  int32_t* kv_indptr = nullptr;  // [batch + 1]
  int32_t* kv_lens = nullptr;    // [batch]
  // Sizes of the worst-case layout; compact: work [tile_cap * num_chunks], merge_indptr
  // [total_rows + 1], merge_rows [total_rows * num_chunks], merge_out_row [total_rows].
  WorkItem* work = nullptr;          // [batch * tiles * num_chunks]
  int32_t* merge_indptr = nullptr;   // [batch * q_len + 1]
  int32_t* merge_rows = nullptr;     // [batch * q_len * num_chunks]
  int32_t* merge_out_row = nullptr;  // [batch * q_len]
  // MLA (MlaAttentionParams): each query row's request, -1 for a refused request's rows (the MLA
  // kernels skip those), and the longest accepted length, which sizes the kernels' KV chunks
  // (max_kv_dev; zeroed by the launcher, then raised by each request's block). With cu_q (the
  // ragged call's warp-per-row kernel) the map covers the query tensor's total_rows: the launcher
  // sets it to -1 first, each request's block writes its rows.
  int32_t* row_req = nullptr;  // [batch * q_len], or [total_rows] with cu_q
  int32_t* max_kv = nullptr;   // [1]
  // Split plans: the partials and the empty state's row.
  float* tmp_v = nullptr;  // [rows, Hq, Dvo]
  float* tmp_s = nullptr;  // [rows, Hq]
  int32_t empty_row = -1;
  // A refused request's rows: NaN.
  void* o = nullptr;
  DType o_dtype = DType::kFloat16;
  int64_t o_stride_n = 0, o_stride_h = 0;
  float* lse = nullptr;
  int64_t lse_stride_n = 0, lse_stride_h = 0;
  int32_t num_qo_heads = 0, head_dim_vo = 0;
};

/// The output fields the plan kernel writes a refused request's NaN rows through, from the
/// attention kernels' parameters (AttentionParams, MlaAttentionParams: the same field names for
/// o and lse); `heads` and `dim` are the output's heads and head dim.
template <class P>
inline void block_plan_set_output(BlockTablePlan& bp, const P& p, int32_t heads, int32_t dim) {
  bp.o = p.o;
  bp.o_dtype = p.o_dtype;
  bp.o_stride_n = p.o_stride_n;
  bp.o_stride_h = p.o_stride_h;
  bp.lse = p.lse;
  bp.lse_stride_n = p.lse_stride_n;
  bp.lse_stride_h = p.lse_stride_h;
  bp.num_qo_heads = heads;
  bp.head_dim_vo = dim;
}

FLASHINFER_HD int32_t block_plan_tiles(const BlockTablePlan& p) {
  return (p.q_len + p.tile_rows - 1) / p.tile_rows;
}

/// Request b's query rows: the first and how many, and whether its cum_seq_lens_q entries pass
/// the host checks (non-decreasing from 0 or more, at most q_len queries, inside the query
/// tensor). The rows a refused request has inside the query tensor are known (more than q_len of
/// them, or a request running past the tensor's last row: its rows up to that row), and get NaN;
/// a request whose entries run backwards or start past the tensor has no rows (count 0).
struct BlockPlanRows {
  int64_t begin = 0, count = 0;
  bool ok = true;
};
FLASHINFER_HD BlockPlanRows block_plan_rows(const BlockTablePlan& p, int32_t b) {
  if (p.cu_q == nullptr) return BlockPlanRows{static_cast<int64_t>(b) * p.q_len, p.q_len, true};
  const int64_t first = p.cu_q[b], end = p.cu_q[b + 1];
  const bool ordered = first >= 0 && end >= first && first <= p.total_rows;
  const int64_t last = end < p.total_rows ? end : p.total_rows;
  return BlockPlanRows{first, ordered ? last - first : 0,
                       ordered && end <= p.total_rows && end - first <= p.q_len};
}

/// Whether request length `len` passes the host checks that need no page id: within
/// [0, max_seq_len], its blocks within the table's columns, and (causal) at least as many keys as
/// the request's `queries`.
FLASHINFER_HD bool block_plan_len_ok(const BlockTablePlan& p, int64_t len, int64_t queries) {
  if (len < 0 || len > p.max_seq_len) return false;
  if ((len + p.page_size - 1) / p.page_size > p.max_blocks) return false;
  return !p.causal || queries <= len;
}

/// The length the host sizes the grid for: max_seq_len, or the table row's room when shorter (a
/// longer request is refused anyway).
FLASHINFER_HD int64_t block_plan_worst_len(const BlockTablePlan& p) {
  const int64_t room = static_cast<int64_t>(p.max_blocks) * p.page_size;
  return p.max_seq_len < room ? p.max_seq_len : room;
}

FLASHINFER_HD bool block_plan_page_ok(const BlockTablePlan& p, int64_t page) {
  return page >= 0 && page < p.num_pages;
}

/// The chunk of a request of `len` keys in a split plan: its keys spread over the grid's
/// num_chunks chunks, in whole multiples of min_chunk_tokens (the planner's floor: whole pages,
/// whole tiles of the tensor-core kernels, never finer than the planner would cut). The grid was
/// sized for max_seq_len (engines pass the model's context length there), so a request much
/// shorter still fills the chunks the grid has rather than one chunk of the worst case's size;
/// num_chunks chunks of it cover len. 0 when unsplit.
FLASHINFER_HD int64_t block_plan_chunk(const BlockTablePlan& p, int64_t len) {
  if (p.chunk_tokens <= 0) return 0;
  const int64_t g = p.min_chunk_tokens > 0 ? p.min_chunk_tokens : 1;
  const int64_t even = (len + p.num_chunks - 1) / p.num_chunks;
  const int64_t c = (even + g - 1) / g * g;
  return c > g ? c : g;
}

/// Chunks a request of `len` keys uses: partition()'s max(1, ceil(len / chunk)).
FLASHINFER_HD int32_t block_plan_chunks_used(const BlockTablePlan& p, int64_t len) {
  const int64_t chunk = block_plan_chunk(p, len);
  if (chunk <= 0 || len <= 0) return 1;
  return static_cast<int32_t>((len + chunk - 1) / chunk);
}

/// Work item k (tile k / num_chunks, chunk k % num_chunks) of request b, whose length is `len`
/// and query count `queries` (`ok`: accepted). Its index in the plan: b * tiles * num_chunks + k.
/// Tiles past the request's queries are idle; the partial rows keep the worst case's layout (a
/// tile q_len queries high at most).
FLASHINFER_HD WorkItem block_plan_item(const BlockTablePlan& p, int32_t b, int32_t k, int64_t len,
                                       bool ok, int64_t queries) {
  const int32_t t = k / p.num_chunks, c = k % p.num_chunks;
  const int32_t q0 = t * p.tile_rows;
  const int32_t q1 = q0 + p.tile_rows < p.q_len ? q0 + p.tile_rows : p.q_len;
  const int32_t used = block_plan_chunks_used(p, len);
  if (!ok || c >= used || q0 >= queries) return WorkItem{-1, 0, 0, 0, 0, -1};
  const int32_t q_end = q1 < queries ? q1 : static_cast<int32_t>(queries);
  if (p.num_chunks == 1) return WorkItem{b, q0, q_end, 0, static_cast<int32_t>(len), -1};
  const int64_t chunk = block_plan_chunk(p, len);
  const int64_t k0 = static_cast<int64_t>(c) * chunk;
  const int64_t k1 = k0 + chunk < len ? k0 + chunk : len;
  if (used == 1) return WorkItem{b, q0, q_end, 0, static_cast<int32_t>(len), -1};
  // partition()'s partial rows: request b's tiles in order, each tile's chunks in order.
  const int64_t base =
      (static_cast<int64_t>(b) * p.q_len + q0) * p.num_chunks + static_cast<int64_t>(c) * (q1 - q0);
  return WorkItem{
      b, q0, q_end, static_cast<int32_t>(k0), static_cast<int32_t>(k1), static_cast<int32_t>(base)};
}

/// Split plans: the output row merged by merge entry m = b * q_len + i (query i of request b,
/// whose rows are `rows`), or -1 when the row needs no merge (one chunk: its item wrote it;
/// refused: NaN; past the request's queries: no row).
FLASHINFER_HD int32_t block_plan_merge_out_row(const BlockTablePlan& p, const BlockPlanRows& rows,
                                               int32_t i, int64_t len, bool ok) {
  return ok && i < rows.count && block_plan_chunks_used(p, len) > 1
             ? static_cast<int32_t>(rows.begin + i)
             : -1;
}

/// Split plans: entry c of merge entry b * q_len + i, the partial row of chunk c of the query's
/// tile, or the empty state's row for a chunk the request does not use.
FLASHINFER_HD int32_t block_plan_merge_row(const BlockTablePlan& p, int32_t b, int32_t i, int32_t c,
                                           int64_t len, bool ok) {
  if (!ok || c >= block_plan_chunks_used(p, len)) return p.empty_row;
  const int32_t q0 = i / p.tile_rows * p.tile_rows;
  const int32_t q1 = q0 + p.tile_rows < p.q_len ? q0 + p.tile_rows : p.q_len;
  const int64_t base =
      (static_cast<int64_t>(b) * p.q_len + q0) * p.num_chunks + static_cast<int64_t>(c) * (q1 - q0);
  return static_cast<int32_t>(base + (i - q0));
}

/// Whether any page id of request b (length `len`, accepted by block_plan_len_ok) that thread
/// `tid` of `nthreads` checks is outside the cache: thread t takes blocks t, t + nthreads, ...
FLASHINFER_HD bool block_plan_pages_bad(const BlockTablePlan& p, int32_t b, int64_t len, int tid,
                                        int nthreads) {
  if (p.block_tables == nullptr) return false;  // ragged K/V (or a table of no columns)
  const int64_t blocks = (len + p.page_size - 1) / p.page_size;
  const int32_t* row = p.block_tables + b * p.table_stride;
  bool bad = false;
  for (int64_t i = tid; i < blocks; i += nthreads) bad |= !block_plan_page_ok(p, row[i]);
  return bad;
}

/// A NaN of the output's dtype at element i, as its bits (fp32, fp16 or bf16: the outputs the
/// calls allow).
FLASHINFER_HD void block_plan_store_nan(void* o, int64_t i, DType d) {
  if (d == DType::kFloat32) {
    static_cast<uint32_t*>(o)[i] = 0x7fc00000u;
  } else {
    static_cast<uint16_t*>(o)[i] = d == DType::kBFloat16 ? uint16_t{0x7fc0} : uint16_t{0x7e00};
  }
}

/// Thread `tid` of `nthreads`: NaN in output rows r0 .. r0 + rows (`heads` x `dim` each) and in
/// their LSE rows when the call has them. P: a parameter struct with the output fields o,
/// o_dtype, o_stride_n, o_stride_h, lse, lse_stride_n, lse_stride_h (BlockTablePlan, and the run-
/// time page guards' MlaAttentionParams and PageGuardParams).
template <class P>
FLASHINFER_HD void block_plan_store_nan_rows(const P& p, int64_t r0, int64_t rows, int64_t heads,
                                             int64_t dim, int tid, int nthreads) {
  const int64_t per_row = heads * dim;
  for (int64_t x = tid; x < rows * per_row; x += nthreads) {
    const int64_t r = r0 + x / per_row, h = x % per_row / dim, d = x % dim;
    block_plan_store_nan(p.o, r * p.o_stride_n + h * p.o_stride_h + d, p.o_dtype);
  }
  if (p.lse != nullptr) {
    for (int64_t x = tid; x < rows * heads; x += nthreads) {
      p.lse[(r0 + x / heads) * p.lse_stride_n + x % heads * p.lse_stride_h] = NAN;
    }
  }
}

/// Whether the entries of cum_seq_lens_q that thread `tid` of `nthreads` checks break the host's
/// rule for the whole array (it starts at 0 and never decreases): entries i = tid, tid + nthreads,
/// ... against the next. A break refuses every request (the host refuses the call), as requests'
/// rows could otherwise overlap. Uniform counts: never. cu_q_exact adds cum_seq_lens_q ending at
/// total_rows, ragged K/V cum_seq_lens_kv's rules (starts at 0, never decreases, ends inside the
/// key tensor).
FLASHINFER_HD bool block_plan_cu_bad(const BlockTablePlan& p, int tid, int nthreads) {
  if (p.cu_q == nullptr) return false;
  bool bad = tid == 0 && p.cu_q[0] != 0;
  for (int32_t i = tid; i < p.batch; i += nthreads) bad |= p.cu_q[i + 1] < p.cu_q[i];
  bad |= tid == 0 && p.cu_q_exact && p.cu_q[p.batch] != p.total_rows;
  bad |= tid == 0 && p.refuse != nullptr && *p.refuse != 0;
  if (p.cu_kv != nullptr) {
    bad |= tid == 0 && (p.cu_kv[0] != 0 || p.cu_kv[p.batch] > p.kv_rows);
    for (int32_t i = tid; i < p.batch; i += nthreads) bad |= p.cu_kv[i + 1] < p.cu_kv[i];
  }
  return bad;
}

/// Whether request b of length `len` passes the host checks that need no page id (its rows, its
/// length against them), the array-wide cum_seq_lens_q rule (block_plan_cu_bad) aside.
FLASHINFER_HD bool block_plan_request_ok(const BlockTablePlan& p, int32_t b, int64_t len) {
  const BlockPlanRows rows = block_plan_rows(p, b);
  if (p.cu_kv != nullptr && len != int64_t{p.cu_kv[b + 1]} - p.cu_kv[b]) return false;
  return rows.ok && block_plan_len_ok(p, len, rows.count);
}

/// Request b's part of the plan (its length `len`, `ok` its verdict: block_plan_request_ok and no
/// bad page), the part thread `tid` of the request's `nthreads` writes: the kernel's block runs it
/// on every thread, the CPU tests for every tid in turn. Besides the request's own entries,
/// request 0 writes the empty state's partial row and the last request the arrays' closing
/// entries. The MLA form's longest length (max_kv) is the kernel's, an atomic maximum. The compact
/// layout's items and merge entries are block_plan_write_compact's.
FLASHINFER_HD void block_plan_write_request(const BlockTablePlan& p, int32_t b, int64_t len,
                                            bool ok, int tid, int nthreads) {
  const BlockPlanRows rows = block_plan_rows(p, b);
  if (tid == 0) {
    // The kernels find a request's rows and query count here: cum_seq_lens_q as given (a refused
    // request's entries are read by nothing).
    p.qo_indptr[b] = p.cu_q != nullptr ? p.cu_q[b] : b * p.q_len;
    p.kv_indptr[b] = p.cu_kv != nullptr      ? p.cu_kv[b]
                     : p.kv_start != nullptr ? p.kv_start[b]
                                             : static_cast<int32_t>(b * p.table_stride);
    p.kv_lens[b] = ok ? static_cast<int32_t>(len) : 0;
    if (b == p.batch - 1) {
      p.qo_indptr[p.batch] = p.cu_q != nullptr ? p.cu_q[p.batch] : p.batch * p.q_len;
      // Given first rows: the kernels read a request's start and count only; its closing entry
      // is the key tensor's end.
      p.kv_indptr[p.batch] =
          p.cu_kv != nullptr ? p.cu_kv[p.batch]
          : p.kv_start != nullptr
              ? static_cast<int32_t>(p.kv_rows < 2147483647 ? p.kv_rows : 2147483647)
              : static_cast<int32_t>(p.batch * p.table_stride);
    }
  }
  if (p.row_req != nullptr && p.cu_q != nullptr) {  // the ragged call's row map: its known rows
    for (int64_t i = tid; i < rows.count; i += nthreads) p.row_req[rows.begin + i] = ok ? b : -1;
  } else if (p.row_req != nullptr) {  // MLA: a row each
    for (int32_t i = tid; i < p.q_len; i += nthreads) p.row_req[b * p.q_len + i] = ok ? b : -1;
  }
  // The compact layout's items and merge entries: block_plan_write_compact.
  const int32_t items = p.work != nullptr && !p.compact ? block_plan_tiles(p) * p.num_chunks : 0;
  for (int32_t k = tid; k < items; k += nthreads) {
    p.work[static_cast<int64_t>(b) * items + k] = block_plan_item(p, b, k, len, ok, rows.count);
  }
  if (p.work != nullptr && p.num_chunks > 1 && !p.compact) {
    for (int32_t k = tid; k < p.q_len * p.num_chunks; k += nthreads) {
      const int32_t i = k / p.num_chunks, c = k % p.num_chunks;
      p.merge_rows[(static_cast<int64_t>(b) * p.q_len + i) * p.num_chunks + c] =
          block_plan_merge_row(p, b, i, c, len, ok);
    }
    for (int32_t i = tid; i < p.q_len; i += nthreads) {
      const int32_t m = b * p.q_len + i;
      p.merge_indptr[m] = m * p.num_chunks;
      p.merge_out_row[m] = block_plan_merge_out_row(p, rows, i, len, ok);
    }
    if (b == p.batch - 1 && tid == 0) {
      p.merge_indptr[p.batch * p.q_len] = p.batch * p.q_len * p.num_chunks;
    }
  }
  if (p.work != nullptr && p.num_chunks > 1) {
    if (b == 0) {  // the idle chunks' empty state: score -inf, value 0
      const int64_t hd = static_cast<int64_t>(p.num_qo_heads) * p.head_dim_vo;
      float* v = p.tmp_v + static_cast<int64_t>(p.empty_row) * hd;
      for (int64_t x = tid; x < hd; x += nthreads) v[x] = 0.0f;
      for (int32_t h = tid; h < p.num_qo_heads; h += nthreads) {
        p.tmp_s[static_cast<int64_t>(p.empty_row) * p.num_qo_heads + h] = -INFINITY;
      }
    }
  }
  if (!ok) {  // a refused request: NaN rows (where its rows are known), its pages never read
    block_plan_store_nan_rows(p, rows.begin, rows.count, p.num_qo_heads, p.head_dim_vo, tid,
                              nthreads);
  }
}

/// Compact layout: the tiles request b takes in the grid, from its query rows alone (at most q_len
/// queries: a request with more is refused, and its tiles idle), so that every block can sum them
/// for the requests before its own.
FLASHINFER_HD int64_t block_plan_compact_tiles(const BlockTablePlan& p, const BlockPlanRows& rows) {
  const int64_t n = rows.count < p.q_len ? rows.count : p.q_len < 0 ? 0 : p.q_len;
  return (n + p.tile_rows - 1) / p.tile_rows;
}

/// Compact layout: thread `tid` of `nthreads`'s share of request b's first tile, the tiles of
/// requests tid, tid + nthreads, ... below b (the kernel sums the shares over its block).
FLASHINFER_HD int64_t block_plan_compact_offset_part(const BlockTablePlan& p, int32_t b, int tid,
                                                     int nthreads) {
  int64_t t = 0;
  for (int32_t j = tid; j < b; j += nthreads)
    t += block_plan_compact_tiles(p, block_plan_rows(p, j));
  return t;
}

/// Compact layout: the item of tile t (queries t * tile_rows ..) and chunk c of request b, whose
/// rows are `rows`, length `len`, verdict `ok`. Its partial rows start at (its first row) x
/// num_chunks + c x (its queries).
FLASHINFER_HD WorkItem block_plan_compact_item(const BlockTablePlan& p, int32_t b, int64_t t,
                                               int32_t c, int64_t len, bool ok,
                                               const BlockPlanRows& rows) {
  const int64_t q0 = t * p.tile_rows;
  const int64_t q1 = q0 + p.tile_rows < rows.count ? q0 + p.tile_rows : rows.count;
  const int32_t used = block_plan_chunks_used(p, len);
  if (!ok || c >= used || q0 >= rows.count) return WorkItem{-1, 0, 0, 0, 0, -1};
  if (p.num_chunks == 1 || used == 1) {
    return WorkItem{b, static_cast<int32_t>(q0),  static_cast<int32_t>(q1),
                    0, static_cast<int32_t>(len), -1};
  }
  const int64_t chunk = block_plan_chunk(p, len);
  const int64_t k0 = static_cast<int64_t>(c) * chunk;
  const int64_t k1 = k0 + chunk < len ? k0 + chunk : len;
  const int64_t base = (rows.begin + q0) * p.num_chunks + static_cast<int64_t>(c) * (q1 - q0);
  return WorkItem{b,
                  static_cast<int32_t>(q0),
                  static_cast<int32_t>(q1),
                  static_cast<int32_t>(k0),
                  static_cast<int32_t>(k1),
                  static_cast<int32_t>(base)};
}

/// Compact layout: request b's items and merge entries (its first tile `offset`, the sum of
/// block_plan_compact_offset_part over the block), the part thread `tid` of `nthreads` writes;
/// the last request also idles the grid's tiles past the last request's and closes
/// merge_indptr. A refused call (`call_ok` false: the arrays give no layout) idles every item
/// and merge entry instead, block b taking those whose index is b modulo the batch.
FLASHINFER_HD void block_plan_write_compact(const BlockTablePlan& p, int32_t b, int64_t len,
                                            bool ok, bool call_ok, int64_t offset, int tid,
                                            int nthreads) {
  const int64_t nc = p.num_chunks;
  const int64_t cap_items = static_cast<int64_t>(p.tile_cap) * nc;
  const bool merged = nc > 1;
  if (b == p.batch - 1 && tid == 0 && merged) p.merge_indptr[p.total_rows] = p.total_rows * nc;
  if (!call_ok) {
    const int64_t step = static_cast<int64_t>(nthreads) * p.batch;
    for (int64_t k = b + static_cast<int64_t>(tid) * p.batch; k < cap_items; k += step) {
      p.work[k] = WorkItem{-1, 0, 0, 0, 0, -1};
    }
    for (int64_t m = b + static_cast<int64_t>(tid) * p.batch; merged && m < p.total_rows;
         m += step) {
      p.merge_indptr[m] = static_cast<int32_t>(m * nc);
      p.merge_out_row[m] = -1;
    }
    return;
  }
  const BlockPlanRows rows = block_plan_rows(p, b);
  const int64_t tiles = block_plan_compact_tiles(p, rows);
  for (int64_t k = tid; k < tiles * nc; k += nthreads) {
    const int64_t idx = offset * nc + k;  // tile offset + k / nc, chunk k % nc
    if (idx < cap_items) {
      p.work[idx] =
          block_plan_compact_item(p, b, k / nc, static_cast<int32_t>(k % nc), len, ok, rows);
    }
  }
  if (b == p.batch - 1) {
    for (int64_t k = (offset + tiles) * nc + tid; k < cap_items; k += nthreads) {
      p.work[k] = WorkItem{-1, 0, 0, 0, 0, -1};
    }
  }
  if (!merged) return;
  const int32_t used = block_plan_chunks_used(p, len);
  for (int64_t i = tid; i < rows.count; i += nthreads) {
    const int64_t m = rows.begin + i;
    const bool split = ok && used > 1;
    p.merge_indptr[m] = static_cast<int32_t>(m * nc);
    p.merge_out_row[m] = split ? static_cast<int32_t>(m) : -1;
    const int64_t q0 = i / p.tile_rows * p.tile_rows;
    const int64_t q1 = q0 + p.tile_rows < rows.count ? q0 + p.tile_rows : rows.count;
    for (int64_t c = 0; c < nc; ++c) {
      p.merge_rows[m * nc + c] =
          split && c < used ? static_cast<int32_t>((rows.begin + q0) * nc + c * (q1 - q0) + i - q0)
                            : p.empty_row;
    }
  }
}

/// A refused call (block_plan_cu_bad: the index arrays break the host's rules, so the host would
/// refuse it whole): block b's share of every output row, NaN (rows b, b + batch, ... of the query
/// tensor's total_rows), and of their LSE. Only with cu_q, where total_rows is known.
FLASHINFER_HD void block_plan_refuse_all_rows(const BlockTablePlan& p, int32_t b, int tid,
                                              int nthreads) {
  if (p.cu_q == nullptr) return;
  for (int64_t r = b; r < p.total_rows; r += p.batch) {
    block_plan_store_nan_rows(p, r, 1, p.num_qo_heads, p.head_dim_vo, tid, nthreads);
  }
}

}  // namespace flashinfer::kernels
