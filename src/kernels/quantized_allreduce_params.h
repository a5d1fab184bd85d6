// Private: what quantized_all_reduce's kernels receive (flashinfer.comm.quantized_allreduce), and
// the layout of a rank's peer buffer. docs/COMM.md, "Quantized all-reduce".
#pragma once

#include <cstdint>

#include "kernels/comm_params.h"

namespace flashinfer::kernels {

/// A rank's peer buffer: ArBufferLayout's flag table and per-block call counters, then one slot.
/// The CPU path puts the rank's bf16 input in the slot; the CUDA kernel its quantized input
/// (scales_in, data_in), and the requantized sums of the stripes it owns (scales_out, data_out).
struct QarBufferLayout {
  static constexpr int kMaxRanks = ArBufferLayout::kMaxRanks;
  static constexpr int kMaxBlocks = ArBufferLayout::kMaxBlocks;
  static constexpr int64_t kFlagsOffset = ArBufferLayout::kFlagsOffset;
  static constexpr int64_t kCountersOffset = ArBufferLayout::kCountersOffset;
  static constexpr int64_t kSlotOffset = ArBufferLayout::kSlotsOffset;
  static constexpr int64_t round256(int64_t b) { return (b + 255) / 256 * 256; }
  /// Offsets in the slot of a call of n elements in groups of g (G = ceil(n / g) groups).
  static constexpr int64_t groups(int64_t n, int64_t g) { return (n + g - 1) / g; }
  static constexpr int64_t scales_in(int64_t, int64_t) { return 0; }
  static constexpr int64_t scales_out(int64_t n, int64_t g) { return round256(groups(n, g) * 4); }
  static constexpr int64_t data_in(int64_t n, int64_t g) { return 2 * scales_out(n, g); }
  static constexpr int64_t data_out(int64_t n, int64_t g) { return data_in(n, g) + round256(n); }
  /// Slot bytes: the CUDA layout, which also holds the CPU path's n bf16 values.
  static constexpr int64_t slot_bytes(int64_t n, int64_t g) { return data_out(n, g) + round256(n); }
  static constexpr int64_t bytes(int64_t n, int64_t g) { return kSlotOffset + slot_bytes(n, g); }
};

/// One rank's call. Pointers are this rank's (CPU: host; CUDA: device).
struct QuantizedAllReduceParams {
  static constexpr int kMaxRanks = QarBufferLayout::kMaxRanks;
  int world_size = 0, rank = 0;
  int64_t numel = 0;
  int64_t scale_group = 256;  // elements a scale (clamped to numel)
  int64_t block_size = 4096;  // a stripe's elements; stripe k of a stride of W goes to rank k
  /// Rank r's peer buffer (QarBufferLayout) as this rank addresses it.
  void* peer_buf[kMaxRanks] = {};
  const uint16_t* input = nullptr;  // bf16 bits [numel], contiguous
  uint16_t* output = nullptr;       // bf16 bits [numel], contiguous
  int max_blocks = 132;             // the grid's cap (max_num_blocks)
  const uint32_t* abort = nullptr;  // CUDA: the group's abort word (core/comm_abort.h)
};

}  // namespace flashinfer::kernels
