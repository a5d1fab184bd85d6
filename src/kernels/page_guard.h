// Private: the paged wrappers' page ids read when the call runs, as plain C++ with FLASHINFER_HD:
// the CUDA kernels (page_guard_cuda.cu) and the CPU tests (tests/api/test_block_table_plan.cpp,
// PageGuard.*) run the same expressions.
//
// Upstream's plan reads the page table's indptr and last_page_len on the host and leaves the page
// ids on the device: its kernels read the caller's indices tensor when they run (plan keeps a
// reference to it, or under use_cuda_graph copies it into the constructor's buffer). A plan here
// that copied the ids to the host to check them waited for the GPU (a synchronization in every
// decode step's plan, which serving engines run while the previous step computes). So on CUDA
// the BatchDecodeWithPagedKVCacheWrapper and BatchPrefillWithPagedKVCacheWrapper plans leave the
// ids where they are, and run() launches, around the unchanged attention kernels:
// - before them, a copy of the plan's ids from the caller's tensor into the plan's page area
//   (dev_ints), a block per request: an id outside the cache is written as page 0 (so no kernel
//   reads outside the cache) and marks its request bad;
// - after them, a block per request writes NaN into a bad request's output and LSE rows.
// Every id of a request is checked, as the host check did (a request's keys fill its pages).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/block_table_plan.h"  // block_plan_store_nan_rows
#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels {

struct PageGuardParams {
  // The caller's ids: the plan's first (indptr[0]) at src + *base. The base is read on the device
  // (a slot of the plan's arrays), so a captured copy follows a re-plan's indptr[0].
  const int32_t* src = nullptr;
  const int32_t* base = nullptr;
  int32_t* dst = nullptr;              // the kernels' page area: [kv_indptr[batch]] ids
  const int32_t* kv_indptr = nullptr;  // [batch + 1], from 0
  const int32_t* qo_indptr = nullptr;  // [batch + 1]: request b's query rows
  int32_t* bad = nullptr;              // [batch]: 1 where a request has an id outside the cache
  int64_t num_pages = 0;               // pages of the cache (the smaller of K's and V's)
  int32_t batch = 0;
  // The output rows a bad request gets NaN in: o [rows, heads, head_dim] (fp32, fp16 or bf16),
  // lse [rows, heads] fp32 (nullptr: none).
  void* o = nullptr;
  DType o_dtype = DType::kFloat16;
  int64_t o_stride_n = 0, o_stride_h = 0;
  float* lse = nullptr;
  int64_t lse_stride_n = 0, lse_stride_h = 0;
  int32_t num_heads = 0, head_dim = 0;
};

/// Thread `tid` of `nthreads` copies request b's ids i = tid, tid + nthreads, ... (an id outside
/// [0, num_pages) as 0) and returns whether one of its ids was outside.
FLASHINFER_HD bool page_guard_copy(const PageGuardParams& p, int32_t b, int tid, int nthreads) {
  bool bad = false;
  const int32_t* src = p.src + *p.base;
  for (int64_t i = int64_t{p.kv_indptr[b]} + tid; i < p.kv_indptr[b + 1]; i += nthreads) {
    const int32_t id = src[i];
    const bool ok = id >= 0 && id < p.num_pages;
    p.dst[i] = ok ? id : 0;
    bad |= !ok;
  }
  return bad;
}

/// Thread `tid` of `nthreads`: request b's NaN rows when p.bad[b] says so.
FLASHINFER_HD void page_guard_nan_rows(const PageGuardParams& p, int32_t b, int tid, int nthreads) {
  if (p.bad[b] == 0) return;
  const int64_t r0 = p.qo_indptr[b];
  block_plan_store_nan_rows(p, r0, p.qo_indptr[b + 1] - r0, p.num_heads, p.head_dim, tid, nthreads);
}

/// The output dtypes page_guard_nan_rows writes (the wrappers read ids in place only for these).
FLASHINFER_HD bool page_guard_output_ok(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
}

}  // namespace flashinfer::kernels
