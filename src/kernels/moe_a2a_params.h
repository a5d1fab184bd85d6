// Private: the MoE all-to-all of flashinfer.comm.trtllm_moe_alltoall (MoeAlltoAll): one rank's
// workspace row (upstream's byte layout), what the dispatch / combine / sanitize kernels receive,
// and the rules both backends share (which rank owns an expert, the fixed order of the combine's
// sum). docs/COMM.md, "MoE all-to-all".
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

#if defined(__CUDACC__)
#define FLASHINFER_A2A_HD __host__ __device__
#else
#define FLASHINFER_A2A_HD
#endif
#if defined(__CUDA_ARCH__)
#define FLASHINFER_A2A_UNROLL _Pragma("unroll")
#else
#define FLASHINFER_A2A_UNROLL
#endif

namespace flashinfer::kernels {

/// One rank's row of the workspace (byte offsets from the row's start; upstream's metainfo, in
/// its field order). flag_val counts this rank's dispatches and combines; the counters and flags
/// are uint32 / int32; the top_k tables hold 22 slots a token whatever the call's top_k.
struct MoeA2aLayout {
  static constexpr int kMaxTopK = 22;
  static constexpr int kMaxPayloads = 6;
  static constexpr int kMaxRanks = 64;
  static constexpr int kFields = 10;
  int64_t flag_val = 0, local_token_counter = 4, send_counters = 8, recv_counters = 0,
          dispatch_flags = 0, combine_flags = 0, topk_target_ranks = 0, topk_send_indices = 0,
          eplb_stats = 0, payload_data = 0;

  static constexpr int64_t align128(int64_t v) { return (v + 127) / 128 * 128; }
  static constexpr MoeA2aLayout make(int64_t ep, int64_t max_tokens, int64_t eplb_experts) {
    MoeA2aLayout l;
    l.recv_counters = l.send_counters + 4 * ep;
    l.dispatch_flags = align128(l.recv_counters + 4 * ep);
    l.combine_flags = align128(l.dispatch_flags + 4 * ep);
    l.topk_target_ranks = align128(l.combine_flags + 4 * ep);
    l.topk_send_indices = align128(l.topk_target_ranks + max_tokens * kMaxTopK * 4);
    l.eplb_stats = align128(l.topk_send_indices + max_tokens * kMaxTopK * 4);
    l.payload_data = align128(l.eplb_stats + ep * eplb_experts * 4);
    return l;
  }
  /// The fields in upstream's metainfo order (FLAG_VAL ... PAYLOAD_DATA).
  constexpr int64_t field(int i) const {
    const int64_t f[kFields] = {
        flag_val,      local_token_counter, send_counters,     recv_counters, dispatch_flags,
        combine_flags, topk_target_ranks,   topk_send_indices, eplb_stats,    payload_data};
    return f[i];
  }
};

/// The rank that owns expert e of E split over ep ranks: the first E % ep ranks own
/// E / ep + 1 experts each, the others E / ep (upstream's contiguous split). e is not checked.
FLASHINFER_A2A_HD constexpr int moe_a2a_target_rank(int e, int E, int ep) {
  const int base = E / ep, rem = E % ep;
  if (rem == 0) return e / base;
  if (e < rem * (base + 1)) return e / (base + 1);
  return rem + (e - rem * (base + 1)) / base;
}

/// The rank a slot with expert id e goes to, as upstream's kernel computes it (C division:
/// ids in (-E / ep, 0) land on rank 0, as upstream's do), or -1 where that rank is outside
/// [0, ep) (upstream writes out of bounds there).
FLASHINFER_A2A_HD constexpr int moe_a2a_slot_rank(int e, int E, int ep) {
  const int r = moe_a2a_target_rank(e, E, ep);
  return r >= 0 && r < ep ? r : -1;
}

/// Whether the combine supports top_k (its sum has a fixed order for these only).
FLASHINFER_A2A_HD constexpr bool moe_a2a_top_k_supported(int k) {
  return k == 1 || k == 2 || k == 4 || k == 6 || k == 8 || k == 10 || k == 12 || k == 14 ||
         k == 16 || k == 18 || k == 22;
}

/// One level at a time: adjacent pairs summed, an odd last value carried to the next level.
template <int N>
FLASHINFER_A2A_HD inline float moe_a2a_pairwise(const float (&a)[N]) {
  if constexpr (N == 1) {
    return a[0];
  } else {
    constexpr int M = N / 2 + N % 2;
    float b[M];
    FLASHINFER_A2A_UNROLL
    for (int i = 0; i < N / 2; ++i) b[i] = a[2 * i] + a[2 * i + 1];
    if constexpr (N % 2 == 1) b[M - 1] = a[N - 1];
    return moe_a2a_pairwise<M>(b);
  }
}

/// The call number after `f` in flag_val's count (a dispatch's or combine's, and the done value a
/// combine publishes for the next dispatch): f + 1, but 0xFFFFFFFF is followed by 2. 0 (nothing
/// yet) and 1 (the first dispatch, which waits for no combine) then never come back: after 2^32
/// calls a dispatch numbered 1 would skip its wait for the peers' previous combine. The jump is
/// the same on every rank, and the waits compare wrap-safely.
FLASHINFER_A2A_HD inline uint32_t moe_a2a_next_flag(uint32_t f) {
  return f == 0xFFFFFFFFu ? 2u : f + 1u;
}

/// The combine's sum over K slots of a token, in fp32, in upstream's fixed order: pairwise for
/// top_k 2, 4, 6, 8, 10, 16 and 22 ((a0 + a1) + (a2 + a3), then those pairs pairwise, an odd
/// value carried up: 10 is ((P01 + P23) + (P45 + P67)) + P89), left to right from a0 for 1, 12,
/// 14 and 18. v(k) is slot k's value (+0 for a slot that sent nothing). K is a compile-time
/// constant, so the CUDA kernel keeps the slots in registers; plain float adds, so both backends
/// round alike.
template <int K, class V>
FLASHINFER_A2A_HD inline float moe_a2a_tree_sum_fixed(const V& v) {
  if constexpr (K == 1 || K == 12 || K == 14 || K == 18) {
    float s = v(0);
    FLASHINFER_A2A_UNROLL
    for (int k = 1; k < K; ++k) s = s + v(k);
    return s;
  } else {
    float a[K];
    FLASHINFER_A2A_UNROLL
    for (int k = 0; k < K; ++k) a[k] = v(k);
    return moe_a2a_pairwise<K>(a);
  }
}

/// moe_a2a_tree_sum_fixed for a top_k known at run time (moe_a2a_top_k_supported; another
/// top_k sums left to right, which the API never asks for).
template <class V>
FLASHINFER_A2A_HD inline float moe_a2a_tree_sum(int top_k, const V& v) {
  switch (top_k) {
    case 2:
      return moe_a2a_tree_sum_fixed<2>(v);
    case 4:
      return moe_a2a_tree_sum_fixed<4>(v);
    case 6:
      return moe_a2a_tree_sum_fixed<6>(v);
    case 8:
      return moe_a2a_tree_sum_fixed<8>(v);
    case 10:
      return moe_a2a_tree_sum_fixed<10>(v);
    case 16:
      return moe_a2a_tree_sum_fixed<16>(v);
    case 22:
      return moe_a2a_tree_sum_fixed<22>(v);
    default: {
      float s = v(0);
      for (int k = 1; k < top_k; ++k) s = s + v(k);
      return s;
    }
  }
}

/// One rank's dispatch. Pointers are this rank's (CPU: host; CUDA: device); workspace + r *
/// rank_stride is rank r's row (layout above).
struct MoeA2aDispatchParams {
  int ep_rank = 0, ep_size = 0, top_k = 0, num_experts = 0;
  int64_t tokens = 0;                // this rank's tokens (rows of every payload)
  int64_t runtime_max = 0;           // rows a source has in a receive region
  const int32_t* experts = nullptr;  // [tokens, top_k]
  int num_payloads = 0;
  const void* payload[MoeA2aLayout::kMaxPayloads] = {};
  int64_t row_bytes[MoeA2aLayout::kMaxPayloads] = {};
  /// Where payload i's receive region [ep_size, runtime_max, row_bytes] starts in a row.
  int64_t region[MoeA2aLayout::kMaxPayloads] = {};
  char* workspace = nullptr;
  int64_t rank_stride = 0;
  MoeA2aLayout layout;
  const int32_t* eplb_local = nullptr;  // [eplb_count], or null
  int64_t eplb_count = 0, eplb_experts = 0;
  uint64_t active = ~uint64_t{0};           // bit r: rank r takes part
  const uint32_t* abort = nullptr;          // CUDA: the group's abort word (core/comm_abort.h)
  const char* op = "MoeAlltoAll.dispatch";  // the API call (host: a wait's timeout names it)

  FLASHINFER_A2A_HD constexpr bool is_active(int r) const { return ((active >> r) & 1u) != 0; }
  FLASHINFER_A2A_HD char* row(int r) const { return workspace + r * rank_stride; }
};

/// One rank's combine: row [s, i] of this rank's combine region (at combine_offset, [ep_size,
/// runtime_max, hidden] of region_dtype) holds its result for the i-th token it received from
/// rank s; each local token sums, over its top_k slots that sent, the row its target rank holds
/// for it.
struct MoeA2aCombineParams {
  int ep_rank = 0, ep_size = 0, top_k = 0;
  int64_t tokens = 0, runtime_max = 0, hidden = 0;
  DType payload_dtype = DType::kBFloat16;  // the payload's
  DType region_dtype = DType::kBFloat16;   // the combine region's (fp8 e4m3 for low precision)
  DType out_dtype = DType::kBFloat16;
  const void* payload = nullptr;  // [ep_size, runtime_max, hidden]; null: already in the region
  void* out = nullptr;            // [tokens, hidden]
  char* workspace = nullptr;
  int64_t rank_stride = 0;
  MoeA2aLayout layout;
  int64_t combine_offset = 0;
  uint64_t active = ~uint64_t{0};
  const uint32_t* abort = nullptr;         // CUDA: the group's abort word (core/comm_abort.h)
  const char* op = "MoeAlltoAll.combine";  // the API call (host: a wait's timeout names it)

  FLASHINFER_A2A_HD constexpr bool is_active(int r) const { return ((active >> r) & 1u) != 0; }
  FLASHINFER_A2A_HD char* row(int r) const { return workspace + r * rank_stride; }
  int64_t region_elem_bytes = 2;  // bytes of a region element
  FLASHINFER_A2A_HD constexpr int64_t region_row_bytes() const {
    return hidden * region_elem_bytes;
  }
};

/// moe_a2a_sanitize_expert_ids: ids [ep_size, runtime_max, top_k] (int32, this rank's received
/// copy); every row past the count source s sent gets invalid_id in all its slots.
struct MoeA2aSanitizeParams {
  int ep_rank = 0, ep_size = 0;
  int64_t runtime_max = 0, top_k = 0;
  int32_t* ids = nullptr;
  int32_t invalid_id = -1;
  const char* row = nullptr;  // this rank's workspace row
  MoeA2aLayout layout;
  const char* op = "MoeAlltoAll.dispatch";  // the API call (host: a launch error names it)
};

}  // namespace flashinfer::kernels
