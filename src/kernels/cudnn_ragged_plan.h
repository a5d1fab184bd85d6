// Private: the rows of cudnn_batch_prefill_with_kv_cache's ragged call (no block table) found on
// the device from its lengths and batch offsets, as plain C++ with FLASHINFER_HD: the CUDA kernel
// (cuda/cudnn_ragged_plan_cuda.cu) and the CPU tests (tests/api/test_block_table_plan.cpp) run
// the same expressions.
//
// The vision encoders of vLLM and SGLang call the op once a layer with actual_seq_lens_q / _kv
// and batch_offsets_q / _o / _k / _v on the GPU (upstream hands them to cuDNN, which reads them
// on the device). The host plan read all six back, one synchronization each, and a CUDA graph
// (SGLang captures its vision encoder) could not capture the call. Instead one block turns them
// into what the block-table plan kernel (kernels/block_table_plan.h) reads: cum_seq_lens_q (the
// running sums of the query lengths), each request's first key row and key count, and a flag
// that refuses the whole call where the host's checks would refuse it (every output row NaN):
// - a length below 0, above 2^31 - 1, or above max_token_per_sequence / max_sequence_kv;
// - an offset below 0 or not a whole number of its tensor's rows (the unit: "elements" or
//   "bytes" of the tensor's own rows, or "tokens"), q's and o's not the running sum of the
//   query lengths, V's not K's row (K's rows are free: the running sum of the key lengths
//   without batch_offsets_k), a key row past 2^31 - 1;
// - causal with more queries than keys;
// - query lengths that do not add up to q's rows, keys past the end of K or V.
// With "tokens" offsets and a length tensor omitted, a request's count is its offsets'
// difference, and a decrease refuses the call.
//
// Work is split over the block's threads in contiguous chunks of requests: each thread sums its
// chunk (cudnn_plan_chunk_sums), the block scans the sums, and each thread then walks its chunk
// from its prefix (cudnn_plan_write_chunk).
#pragma once

#include <cstdint>

#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels {

struct CudnnRaggedPlan {
  // Inputs (the call's tensors, on the device). Lengths: int32, dense (the launcher makes them
  // so); null: the offsets' differences (offsets in tokens).
  const int32_t* lens_q = nullptr;
  const int32_t* lens_kv = nullptr;
  // Batch offsets of q, o, k, v (kOffQ ..): int32 or int64 (off64), `batch` entries at least
  // (batch + 1 where a length comes from them), dense; null: not given. unit: an offset's units
  // a row of that tensor.
  static constexpr int kOffQ = 0, kOffO = 1, kOffK = 2, kOffV = 3;
  const void* off[4] = {nullptr, nullptr, nullptr, nullptr};
  bool off64[4] = {false, false, false, false};
  int64_t unit[4] = {1, 1, 1, 1};
  int32_t batch = 0;
  int64_t q_rows = 0;   // q's rows: the query lengths' sum
  int64_t kv_rows = 0;  // the fewer of K's and V's rows
  int64_t max_q = 0, max_kv = 0;
  bool causal = false;

  // Outputs.
  int32_t* cu_q = nullptr;      // [batch + 1]
  int32_t* kv_start = nullptr;  // [batch]: request b's first key row
  int32_t* kv_len = nullptr;    // [batch]
  int32_t* refuse = nullptr;    // [1]: nonzero when the host would refuse the call
};

FLASHINFER_HD int64_t cudnn_plan_offset(const CudnnRaggedPlan& p, int which, int64_t i) {
  return p.off64[which] ? static_cast<const int64_t*>(p.off[which])[i]
                        : static_cast<const int32_t*>(p.off[which])[i];
}

/// Request b's query / key count (may be negative: refused).
FLASHINFER_HD int64_t cudnn_plan_len_q(const CudnnRaggedPlan& p, int32_t b) {
  if (p.lens_q != nullptr) return p.lens_q[b];
  return cudnn_plan_offset(p, CudnnRaggedPlan::kOffQ, b + 1) -
         cudnn_plan_offset(p, CudnnRaggedPlan::kOffQ, b);
}
FLASHINFER_HD int64_t cudnn_plan_len_kv(const CudnnRaggedPlan& p, int32_t b) {
  if (p.lens_kv != nullptr) return p.lens_kv[b];
  return cudnn_plan_offset(p, CudnnRaggedPlan::kOffK, b + 1) -
         cudnn_plan_offset(p, CudnnRaggedPlan::kOffK, b);
}

/// Thread t of n's requests: [first, end).
struct CudnnPlanChunk {
  int32_t first = 0, end = 0;
};
FLASHINFER_HD CudnnPlanChunk cudnn_plan_chunk(const CudnnRaggedPlan& p, int t, int n) {
  const int64_t per = (static_cast<int64_t>(p.batch) + n - 1) / n;
  const int64_t a = per * t, e = a + per;
  const int64_t first = a < p.batch ? a : p.batch;
  return CudnnPlanChunk{static_cast<int32_t>(first),
                        static_cast<int32_t>(e < p.batch ? e : p.batch)};
}

/// Thread t of n's sums of its chunk's query and key counts (negative counts count as 0: they
/// refuse the call anyway, and must not pull a later request's rows below 0).
struct CudnnPlanSums {
  int64_t q = 0, kv = 0;
};
FLASHINFER_HD CudnnPlanSums cudnn_plan_chunk_sums(const CudnnRaggedPlan& p, int t, int n) {
  const CudnnPlanChunk c = cudnn_plan_chunk(p, t, n);
  CudnnPlanSums s;
  for (int32_t b = c.first; b < c.end; ++b) {
    const int64_t lq = cudnn_plan_len_q(p, b), lk = cudnn_plan_len_kv(p, b);
    s.q += lq > 0 ? lq : 0;
    s.kv += lk > 0 ? lk : 0;
  }
  return s;
}

/// Whether offset x of tensor `which` is request row `row`: x >= 0, whole rows, the same row.
FLASHINFER_HD bool cudnn_plan_offset_is(const CudnnRaggedPlan& p, int which, int32_t b,
                                        int64_t row) {
  if (p.off[which] == nullptr) return true;
  const int64_t x = cudnn_plan_offset(p, which, b);
  return x >= 0 && x % p.unit[which] == 0 && x / p.unit[which] == row;
}

/// What thread t of n's chunk found: whether it breaks a rule, and the end of its furthest keys.
struct CudnnPlanVerdict {
  bool bad = false;
  int64_t max_end = 0;
};

/// Thread t of n writes its chunk's entries, its requests' query rows starting at q0 and (without
/// batch_offsets_k) key rows at k0, the sums of the chunks before it; the thread of the last
/// request also closes cum_seq_lens_q (with the query total, clamped to int32: a larger total
/// refuses the call anyway).
FLASHINFER_HD CudnnPlanVerdict cudnn_plan_write_chunk(const CudnnRaggedPlan& p, int t, int n,
                                                      int64_t q0, int64_t k0) {
  constexpr int64_t kInt32Max = 2147483647;
  const CudnnPlanChunk c = cudnn_plan_chunk(p, t, n);
  CudnnPlanVerdict v;
  int64_t q = q0, k = k0;
  for (int32_t b = c.first; b < c.end; ++b) {
    const int64_t lq = cudnn_plan_len_q(p, b), lk = cudnn_plan_len_kv(p, b);
    v.bad |= lq < 0 || lk < 0 || lq > p.max_q || lk > p.max_kv || (p.causal && lq > lk);
    v.bad |= lq > kInt32Max || lk > kInt32Max;  // counts from int64 offsets: int32, as the host's
    v.bad |= !cudnn_plan_offset_is(p, CudnnRaggedPlan::kOffQ, b, q) ||
             !cudnn_plan_offset_is(p, CudnnRaggedPlan::kOffO, b, q);
    int64_t start = k;
    if (p.off[CudnnRaggedPlan::kOffK] != nullptr) {
      const int64_t x = cudnn_plan_offset(p, CudnnRaggedPlan::kOffK, b);
      const int64_t u = p.unit[CudnnRaggedPlan::kOffK];
      v.bad |= x < 0 || x % u != 0;
      start = x >= 0 ? x / u : 0;
    }
    v.bad |= !cudnn_plan_offset_is(p, CudnnRaggedPlan::kOffV, b, start) || start > kInt32Max;
    const int64_t n_kv = lk > 0 ? lk : 0;
    if (start + n_kv > v.max_end) v.max_end = start + n_kv;
    p.cu_q[b] = static_cast<int32_t>(q < kInt32Max ? q : kInt32Max);
    p.kv_start[b] = static_cast<int32_t>(start < kInt32Max ? start : kInt32Max);
    p.kv_len[b] = static_cast<int32_t>(n_kv < kInt32Max ? n_kv : kInt32Max);
    q += lq > 0 ? lq : 0;
    k = start + n_kv;
  }
  if (c.end == p.batch && c.first < c.end) {
    p.cu_q[p.batch] = static_cast<int32_t>(q < kInt32Max ? q : kInt32Max);
    v.bad |= q != p.q_rows;
  }
  return v;
}

/// The call's verdict from every chunk's (bad: any; max_end: the largest): refused when a rule
/// broke, or keys end past K or V. With no request the query must have no row.
FLASHINFER_HD bool cudnn_plan_refused(const CudnnRaggedPlan& p, bool any_bad, int64_t max_end) {
  if (p.batch == 0) return p.q_rows != 0;
  return any_bad || max_end > p.kv_rows;
}

}  // namespace flashinfer::kernels
