// Private: what the all-reduce fusion kernels receive (flashinfer.comm.allreduce_fusion), and
// the layout of a workspace's peer buffer. docs/COMM.md.
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

/// A peer buffer: a flag table every other rank writes into, this rank's per-block call
/// counters, then two data slots of max_token_num x hidden_dim elements (calls alternate
/// between them, so a rank may start call k + 1 while a slower peer still reads call k).
struct ArBufferLayout {
  static constexpr int kMaxRanks = 16;
  static constexpr int kMaxBlocks = 256;
  /// flags[r * kMaxBlocks + b]: the last call whose block b rank r has published here (uint32).
  static constexpr int64_t kFlagsOffset = 0;
  /// counters[b]: the calls block b of this rank has made (uint32).
  static constexpr int64_t kCountersOffset = int64_t{kMaxRanks} * kMaxBlocks * 4;
  static constexpr int64_t kSlotsOffset = 32768;
  static_assert(kCountersOffset + kMaxBlocks * 4 <= kSlotsOffset);
  /// Bytes of a buffer for `elems` elements of `elem_bytes` a slot.
  static constexpr int64_t bytes(int64_t elems, int64_t elem_bytes) {
    return kSlotsOffset + 2 * ((elems * elem_bytes + 255) / 256 * 256);
  }
  static constexpr int64_t slot_stride(int64_t elems, int64_t elem_bytes) {
    return (elems * elem_bytes + 255) / 256 * 256;
  }
};

/// One rank's call. Pointers are this rank's (CPU: host; CUDA: device). Outputs not written by
/// the pattern are null.
struct AllReduceFusionParams {
  static constexpr int kMaxRanks = ArBufferLayout::kMaxRanks;
  int world_size = 0, rank = 0;
  int64_t tokens = 0, hidden = 0;
  DType dtype = DType::kBFloat16;
  int pattern = 0;
  bool fp32_acc = false;
  bool oneshot = true;   // the one-shot path: an input -0 is summed as +0
  bool island8 = false;  // 8 ranks summed as two islands of 4 (kernels/comm_rules.h)
  bool mnnvl = false;    // the MNNVL kernels' arithmetic (kernels/comm_rules.h, mnnvl_*)
  /// CPU: rank r's input rows [tokens, hidden], contiguous (its copy in the peer buffers).
  const void* peer_in[kMaxRanks] = {};
  /// CUDA: rank r's peer buffer (ArBufferLayout) as this rank addresses it; slot_stride bytes a
  /// slot. The kernel copies `input` into its own slot.
  void* peer_buf[kMaxRanks] = {};
  int64_t slot_stride = 0;
  const void* input = nullptr;

  void* output = nullptr;        // pattern 0: s
  void* sum_out = nullptr;       // the MoE reduction pattern's moe_allreduce_out: s as well
  void* residual_out = nullptr;  // dtype(s + residual_in)
  void* norm_out = nullptr;      // y
  void* quant_out = nullptr;     // fp8 [T, H] or packed e2m1 [T, H / 2]
  void* scale_out = nullptr;     // NVFP4 bytes, group exponents (int32) or per-token fp32
  const void* residual_in = nullptr;
  const void* gamma = nullptr;  // [H], the input's dtype
  float eps = 1e-6f;
  float weight_bias = 0.0f;
  // Patterns 2-5: a tensor scale as fp32 [1] on the call's device, else (a number, None) the
  // value itself: passed by value, no device copy (a synchronizing copy per call, which a CUDA
  // graph capture refuses).
  const float* scale_factor = nullptr;
  float scale_value = 1.0f;
  int layout_code = 0;              // NVFP4 scale layout (SfLayoutCode)
  int64_t group_size = 0;           // patterns 8 / 9
  int64_t scale_t_stride = 0;       // patterns 8 / 9: round_up(T, 4)
  const uint32_t* abort = nullptr;  // CUDA: the group's abort word (core/comm_abort.h)
  /// CUDA: the grid every rank of the workspace's group launches, agreed when the workspace was
  /// made (core/device_location.h, agreed_grid_cap); 0: the SM count over the world size.
  int blocks = 0;
};

/// allreduce_fusion's MoE patterns: this rank's local value [Tk, H] (the dtype) before the rank
/// sum (kernels/comm_rules.h, ar_moe_*_value).
struct MoeLocalParams {
  int pattern = 6;  // 6: the expert reduction, 7: the finalize gather
  DType dtype = DType::kBFloat16;
  int64_t tokens = 0, hidden = 0;
  void* out = nullptr;
  // Pattern 6: active [E, Tk, H], scale fp32 [E, Tk], token [Tk, H].
  int64_t experts = 0;
  const void* active = nullptr;
  const float* scale = nullptr;
  const void* token = nullptr;
  // Pattern 7: input [rows, H], index int32 [Tk, K], scale [Tk, K] (the dtype) or null, shared
  // [Tk, H] or null.
  int64_t top_k = 0, rows = 0;
  const void* input = nullptr;
  const int32_t* index = nullptr;
  const void* expert_scale = nullptr;
  const void* shared = nullptr;
};

/// decode_cp_a2a_alltoall: the workspace [cp_size, row] (bytes from row r * row_stride are rank
/// r's) holds at its start this rank's call counter and the last call it published, then two
/// data slots of slot_bytes (calls alternate between them, as the all-reduce's).
struct DcpA2aParams {
  static constexpr int64_t kSeqOffset = 0;     // uint32: this rank's calls
  static constexpr int64_t kFlagOffset = 128;  // uint32: the last call whose data is in place
  static constexpr int64_t kSlotsOffset = 256;
  int cp_rank = 0, cp_size = 0;
  int64_t entries = 0, D = 0, S = 0;
  DType dtype = DType::kBFloat16;  // partial_o's
  const void* o_in = nullptr;
  const float* stats_in = nullptr;
  void* o_out = nullptr;
  float* stats_out = nullptr;
  char* workspace = nullptr;
  int64_t row_stride = 0;  // bytes between ranks' rows
  int64_t slot_bytes = 0;
  const uint32_t* abort = nullptr;  // CUDA: the group's abort word (core/comm_abort.h)
  /// Bytes of one rank's partial_o in a slot (the stats follow, 16-byte aligned).
  constexpr int64_t o_bytes() const { return entries * cp_size * D * 2; }
  constexpr int64_t stats_offset() const { return (o_bytes() + 15) / 16 * 16; }
  constexpr int64_t bytes_needed() const { return stats_offset() + entries * cp_size * S * 4; }
};

}  // namespace flashinfer::kernels
