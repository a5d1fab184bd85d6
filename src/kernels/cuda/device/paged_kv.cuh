// Device library: where a request's key/value tokens live in a paged (or ragged) cache, looked
// up once per block for a run of tokens and kept in shared memory. The page table is read with
// coalesced loads, the token -> (page, slot) split is a multiply-shift (FastDivmod), and the copy
// loop then only adds a cached offset: no division and no dependent global load per copy.
// Device code only; NVRTC compiles it too.
#pragma once

#include "kernels/attention_params.h"
#include "kernels/cuda/device/fastdiv.cuh"
#include "kernels/cuda/device_utils.cuh"

namespace flashinfer::kernels::cuda::dev {

/// Element offsets (head and dim excluded) of key and value token t of request b.
__device__ __forceinline__ void kv_token_offsets(const KvAddressing& a, int32_t b, uint32_t t,
                                                 const FastDivmod& page_size, int64_t* k_off,
                                                 int64_t* v_off) {
  if (a.kv_indices == nullptr) {  // ragged: token kv_indptr[b] + t
    const int64_t row = static_cast<int64_t>(a.kv_indptr[b]) + t;
    *k_off = row * a.k_stride_token;
    *v_off = row * a.v_stride_token;
    return;
  }
  uint32_t page = 0, slot = 0;
  page_size.divmod(t, page, slot);
  const int64_t id = a.kv_indices[a.kv_indptr[b] + static_cast<int64_t>(page)];
  *k_off = id * a.k_stride_page + static_cast<int64_t>(slot) * a.k_stride_token;
  *v_off = id * a.v_stride_page + static_cast<int64_t>(slot) * a.v_stride_token;
}

/// One request's K/V token addressing with its per-request lookups done once, for a kernel that
/// addresses tokens in a loop: the loop then loads only the page id. Ragged storage is taken as
/// pages of one token whose id is the token's row (stride_page = the token stride, slot 0), so
/// both layouts share id * stride_page + slot * stride_token, the offsets kv_token_offsets()
/// gives (the same exact 64-bit products).
struct KvRequestMap {
  const int32_t* page_ids;  // paged: the request's page ids; nullptr: ragged
  int32_t first;            // ragged: the request's first token row
  FastDivmod page_size;     // paged: the page size; ragged: 1
  int64_t k_stride_page, v_stride_page;
  int64_t k_stride_token, v_stride_token;
  bool same_strides;  // K and V strides equal (the usual case): v_offset() == k_offset()

  // Builds the split itself. No kernel of the library calls it any more; the older FA2 kernels
  // that scripts/prefill-bitcmp compiles against this library do.
  __device__ __forceinline__ KvRequestMap(const KvAddressing& a, int32_t b)
      : KvRequestMap(
            a, b, FastDivmod(a.kv_indices != nullptr ? static_cast<uint32_t>(a.page_size) : 1u)) {}
  /// With the split prebuilt: `split` must be FastDivmod(page_size), or of 1 when ragged.
  __device__ __forceinline__ KvRequestMap(const KvAddressing& a, int32_t b, const FastDivmod& split)
      : page_ids(a.kv_indices != nullptr ? a.kv_indices + a.kv_indptr[b] : nullptr),
        first(a.kv_indptr[b]),
        page_size(split),
        k_stride_page(a.kv_indices != nullptr ? a.k_stride_page : a.k_stride_token),
        v_stride_page(a.kv_indices != nullptr ? a.v_stride_page : a.v_stride_token),
        k_stride_token(a.k_stride_token),
        v_stride_token(a.v_stride_token),
        same_strides(k_stride_page == v_stride_page && k_stride_token == v_stride_token) {}

  /// Page id (ragged: token row) of token t; paged, this is the page-table load.
  __device__ __forceinline__ int32_t page_id(uint32_t t) const {
    const uint32_t page = page_size.div(t);
    return page_ids != nullptr ? __ldg(page_ids + page) : first + static_cast<int32_t>(page);
  }
  /// Token t's slot in its page (ragged: 0).
  __device__ __forceinline__ uint32_t slot(uint32_t t) const { return page_size.mod(t); }
  __device__ __forceinline__ int64_t k_offset(int32_t id, uint32_t slot) const {
    return id * k_stride_page + static_cast<int64_t>(slot) * k_stride_token;
  }
  __device__ __forceinline__ int64_t v_offset(int32_t id, uint32_t slot) const {
    return id * v_stride_page + static_cast<int64_t>(slot) * v_stride_token;
  }
};

/// Offsets of `capacity` consecutive tokens of one request, in shared memory. fill() is called
/// by every thread of the block (each takes tokens tid, tid + nthreads, ...); tokens at or past
/// `t_end` get offset 0 (their copies are predicated off, so the value is never used to read).
struct KvOffsetCache {
  int64_t* k;
  int64_t* v;
  int capacity;

  __device__ __forceinline__ void fill(const KvAddressing& a, int32_t b, int32_t t0, int32_t t_end,
                                       const FastDivmod& page_size, int tid, int nthreads) const {
#pragma unroll 1
    for (int i = tid; i < capacity; i += nthreads) {
      const int32_t t = t0 + i;
      int64_t ko = 0, vo = 0;
      if (t < t_end) kv_token_offsets(a, b, static_cast<uint32_t>(t), page_size, &ko, &vo);
      k[i] = ko;
      v[i] = vo;
    }
  }
};

}  // namespace flashinfer::kernels::cuda::dev
