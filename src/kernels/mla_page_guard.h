// Private: the page guard of BatchMLAPagedAttentionWrapper's run-time page ids, as plain C++ with
// FLASHINFER_HD: the CUDA kernel (mla_cuda.cu, mla_page_guard_kernel) and the CPU tests
// (tests/ops/test_mla.cpp, MlaPageGuard.*) run the same expressions.
//
// Upstream's MLA kernels read the page ids when they run, from the caller's kv_indices tensor
// (plan keeps a reference to it, or, under use_cuda_graph, copies into the constructor's buffer),
// and engines write new ids there after plan: vLLM's SM90 sparse MLA backend fills the buffer with
// each step's top-k token slots inside the captured forward. The host cannot check ids it never
// reads, so on CUDA a small kernel runs before the MLA kernels (inside a capture too): a block per
// request checks the ids the kernels will read (the first ceil(kv_len / page_size) of the
// request's, tokens past its length are never read) against the cache's pages. A request with a
// bad id gets NaN output and LSE rows and row_req -1, so the MLA kernels skip its rows (they read
// row_req after pdl_wait); every other request's rows get row_req back (a graph replays the guard
// against each replay's ids, and a request refused once is taken again when its ids are good).
#pragma once

#include <cstdint>

#include "kernels/block_table_plan.h"  // block_plan_store_nan
#include "kernels/cuda/device/host_device.h"
#include "kernels/mla_params.h"

namespace flashinfer::kernels {

/// The page ids request b's keys occupy: the first ceil(kv_lens[b] / page_size) entries from
/// kv_indptr[b] (what the MLA kernels read, causal or not: a query never sees past kv_len).
FLASHINFER_HD int64_t mla_guard_pages(const MlaAttentionParams& p, int32_t b) {
  const int64_t len = p.kv_lens[b];
  return len <= 0 ? 0 : (len + p.page_size - 1) / p.page_size;
}

/// Whether the ids thread `tid` of `nthreads` checks for request b fall outside [0, num_pages):
/// entries tid, tid + nthreads, ... A request without query rows is never read: never bad.
FLASHINFER_HD bool mla_guard_pages_bad(const MlaAttentionParams& p, int64_t num_pages, int32_t b,
                                       int tid, int nthreads) {
  if (p.qo_indptr[b + 1] <= p.qo_indptr[b]) return false;
  const int32_t* ids = p.kv_indices + p.kv_indptr[b];
  const int64_t n = mla_guard_pages(p, b);
  bool bad = false;
  for (int64_t i = tid; i < n; i += nthreads) bad |= ids[i] < 0 || ids[i] >= num_pages;
  return bad;
}

/// Request b's verdict `ok` written by thread `tid` of `nthreads`: its rows' row_req (b, or -1),
/// and for a refused request NaN in its output rows and LSE rows below p.rows (the rows of the
/// call's out: a CUDA graph replayed after a re-plan with more rows than it was captured with
/// has no others).
FLASHINFER_HD void mla_guard_write_request(const MlaAttentionParams& p, int32_t* row_req, int32_t b,
                                           bool ok, int tid, int nthreads) {
  const int64_t r0 = p.qo_indptr[b];
  int64_t rows = p.qo_indptr[b + 1] - r0;
  for (int64_t i = tid; i < rows; i += nthreads) row_req[r0 + i] = ok ? b : -1;
  if (ok) return;
  rows = r0 >= p.rows ? 0 : (rows < p.rows - r0 ? rows : p.rows - r0);
  block_plan_store_nan_rows(p, r0, rows, p.num_heads, p.dim_ckv, tid, nthreads);
}

}  // namespace flashinfer::kernels
