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
