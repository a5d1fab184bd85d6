// Private: the parameters of append_paged_kv_cache's kernels, and where an appended row goes in a
// paged KV cache: append_slot, shared by the CPU references and the CUDA kernels of
// append_paged_kv_cache and append_paged_mla_kv_cache (plain C++ with FLASHINFER_HD, so both
// compile the same expressions and the CPU tests check the device's rule).
//
// Upstream's append kernels read the index arrays on the device and trust them. On the CPU this
// library checks them on the host and refuses a bad call by name (api::load_append_targets). On
// CUDA the arrays stay on the device, as upstream's do (no copy to the host, no synchronization,
// nothing allocated: a CUDA graph can capture the call), and append_slot refuses, row by row, what
// the host checks would refuse for that row: such a row is not written.
#pragma once

#include <cstdint>

#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels {

/// The page table of an append and the rows' targets, as the op receives them (int32, dense).
/// kv_indptr may start above 0 (vLLM passes a slice of the whole batch's); kv_indices is the
/// whole tensor, so request b's pages are kv_indices[kv_indptr[b] .. kv_indptr[b + 1]).
struct AppendTable {
  const int32_t* kv_indptr = nullptr;         // [batch + 1]
  const int32_t* kv_indices = nullptr;        // [num_indices]
  const int32_t* kv_last_page_len = nullptr;  // [batch]
  const int32_t* batch_indices = nullptr;     // [nnz]
  const int32_t* positions = nullptr;         // [nnz]
  int64_t batch = 0, num_indices = 0;
  int64_t num_pages = 0;  // pages the cache holds
  int32_t page_size = 1;
};

/// Row i's target: entry `entry` of physical page `page`; page < 0 when the row is refused.
struct AppendSlot {
  int64_t page = -1;
  int32_t entry = 0;
};

/// Upstream's addressing: request b = batch_indices[i], position t = positions[i], page
/// kv_indices[kv_indptr[b] + t / page_size], entry t % page_size. Refused (page -1) where the
/// host checks refuse this row: b outside [0, batch); request b's indptr pair decreasing, below 0
/// or past kv_indices; t outside [0, length of request b), the length being (pages - 1) *
/// page_size + kv_last_page_len[b] with kv_last_page_len[b] in [1, page_size] (a request with no
/// pages has none); the page id outside [0, num_pages).
FLASHINFER_HD AppendSlot append_slot(const AppendTable& t, int64_t i) {
  AppendSlot s;
  const int32_t b = t.batch_indices[i];
  if (b < 0 || b >= t.batch) return s;
  const int64_t lo = t.kv_indptr[b], hi = t.kv_indptr[b + 1];
  if (lo < 0 || hi <= lo || hi > t.num_indices) return s;
  const int32_t last = t.kv_last_page_len[b];
  if (last < 1 || last > t.page_size) return s;
  const int64_t len = (hi - lo - 1) * t.page_size + last;
  const int64_t pos = t.positions[i];
  if (pos < 0 || pos >= len) return s;
  const int64_t page = t.kv_indices[lo + pos / t.page_size];
  if (page < 0 || page >= t.num_pages) return s;
  s.page = page;
  s.entry = static_cast<int32_t>(pos % t.page_size);
  return s;
}

/// append_paged_kv_cache: row i of append_key / append_value (every head) goes to the K / V
/// cache token append_slot(table, i).
struct AppendParams {
  const void* append_key = nullptr;
  const void* append_value = nullptr;
  int64_t ak_stride_n = 0, ak_stride_h = 0, av_stride_n = 0, av_stride_h = 0;
  void* k_out = nullptr;  // the cache's K and V storage (written)
  void* v_out = nullptr;
  int64_t k_stride_page = 0, k_stride_token = 0, k_stride_head = 0;
  int64_t v_stride_page = 0, v_stride_token = 0, v_stride_head = 0;
  AppendTable table;
  int64_t elem_size = 2;  // bytes per element (append rows and cache share the dtype)
  int64_t nnz = 0, num_heads = 0, head_dim = 0;
};

/// get_batch_indices_positions, upstream's Triton kernel as a rule per output element: element j
/// of [0, nnz) belongs to the request b with indptr[b] <= j < indptr[b + 1] (a binary search of
/// the non-decreasing indptr, which may start above 0) and gets batch b, position
/// j + seq_lens[b] - indptr[b + 1] (negative when seq_lens[b] is short, as upstream's). An element
/// of no request (past indptr[batch], nnz larger) gets batch -1 and, when the op allocated
/// positions, position 0 (upstream's torch.full(-1) / torch.zeros; a positions buffer the caller
/// passes keeps its value there). Index arrays int32 or int64 (the *_i64 flags).
struct BatchIndicesPositionsParams {
  const void* indptr = nullptr;    // [batch + 1]
  const void* seq_lens = nullptr;  // [batch]
  bool indptr_i64 = false, seq_lens_i64 = false;
  int64_t batch = 0, nnz = 0;
  int32_t* batch_indices = nullptr;  // [nnz], stride bi_stride
  int32_t* positions = nullptr;      // [nnz], stride pos_stride
  int64_t bi_stride = 1, pos_stride = 1;
  bool zero_positions = true;  // positions was allocated by the op
};

FLASHINFER_HD int64_t bip_load(const void* a, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(a)[i] : static_cast<const int32_t*>(a)[i];
}

/// Writes element j of both outputs.
FLASHINFER_HD void batch_indices_positions_at(const BatchIndicesPositionsParams& p, int64_t j) {
  // The last b in [0, batch] with indptr[b] <= j (or -1).
  int64_t lo = 0, hi = p.batch + 1;  // search [lo, hi)
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (bip_load(p.indptr, p.indptr_i64, mid) <= j) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  const int64_t b = lo - 1;
  if (b >= 0 && b < p.batch) {
    const int64_t end = bip_load(p.indptr, p.indptr_i64, b + 1);
    if (j < end) {
      p.batch_indices[j * p.bi_stride] = static_cast<int32_t>(b);
      p.positions[j * p.pos_stride] =
          static_cast<int32_t>(j + bip_load(p.seq_lens, p.seq_lens_i64, b) - end);
      return;
    }
  }
  p.batch_indices[j * p.bi_stride] = -1;
  if (p.zero_positions) p.positions[j * p.pos_stride] = 0;
}

/// get_seq_lens, request b: max(indptr[b + 1] - indptr[b] - 1, 0) * page_size + last[b], stored
/// as int32. Computed modulo 2^64 and truncated: the int32 wrap of upstream's torch arithmetic
/// (the CPU path refuses lengths outside int32 first).
struct SeqLensParams {
  const int32_t* indptr = nullptr;  // [batch + 1], contiguous
  const int32_t* last = nullptr;    // [batch], contiguous
  int64_t batch = 0, page_size = 1;
  int32_t* out = nullptr;  // [batch]
};

FLASHINFER_HD int32_t seq_len_at(const SeqLensParams& p, int64_t b) {
  const int64_t pages = static_cast<int64_t>(p.indptr[b + 1]) - p.indptr[b];
  const uint64_t full = pages > 1 ? static_cast<uint64_t>(pages - 1) : 0u;
  const uint64_t len = full * static_cast<uint64_t>(p.page_size) +
                       static_cast<uint64_t>(static_cast<int64_t>(p.last[b]));
  return static_cast<int32_t>(static_cast<uint32_t>(len));
}

}  // namespace flashinfer::kernels
