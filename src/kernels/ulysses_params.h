// Private: the Ulysses all-to-all (flashinfer.comm.ulysses) as both backends run it: the signal
// block upstream shares with vLLM's custom all-reduce, and where each row of a call goes.
// docs/COMM.md, "Ulysses all-to-all".
//
// A call moves rows of H_local * D contiguous elements. Row (b, peer, s) of this rank is pushed
// into peer `peer`'s staging buffer:
//   mode 0 (scatter_heads, inp [B, S_local, H, D] -> out [B, S_global, H_local, D]):
//     source inp[b, s, peer * H_local : +H_local, :], destination out_peer[b, rank * S_local + s];
//   mode 1 (gather_heads, inp [B, S_global, H_local, D] -> out [B, S_local, H, D]):
//     source inp[b, peer * S_local + s], destination out_peer[b, s, rank * H_local : +H_local, :].
// Between two barriers over the ranks (the first: every peer has copied its previous call out of
// its staging buffer; the second: every push into this rank's buffer has landed), then each rank
// copies its staging buffer into out.
#pragma once

#include <cstdint>

#include "kernels/quantization_params.h"  // FLASHINFER_HD

namespace flashinfer::kernels {

/// Upstream's Signal (vLLM's custom all-reduce): uint32 self_counter[36][8] then
/// peer_counter[2][36][8], each 128-byte aligned: 3456 bytes. Block b of rank r counts its
/// barriers in self_counter[b][peer] and publishes barrier k to peer p at
/// p.peer_counter[k % 2][b][r]; it waits for peer p at its own peer_counter[k % 2][b][p].
struct UlyssesSignal {
  static constexpr int kMaxBlocks = 36;
  static constexpr int kMaxRanks = 8;
  static constexpr int64_t kSelfOffset = 0;
  static constexpr int64_t kPeerOffset = int64_t{kMaxBlocks} * kMaxRanks * 4;  // 1152
  static constexpr int64_t kBytes = kPeerOffset + 2 * kPeerOffset;             // 3456
  static FLASHINFER_HD int64_t self_word(int block, int peer) {
    return (kSelfOffset / 4) + int64_t{block} * kMaxRanks + peer;
  }
  static FLASHINFER_HD int64_t peer_word(uint32_t parity, int block, int rank) {
    return (kPeerOffset / 4) + (int64_t{parity & 1u} * kMaxBlocks + block) * kMaxRanks + rank;
  }
};

struct UlyssesA2aParams {
  int world_size = 0, rank = 0;
  int mode = 0;  // 0 scatter_heads, 1 gather_heads
  int64_t B = 0, S_local = 0, H = 0, D = 0;
  int elem_bytes = 2;
  const void* inp = nullptr;
  void* out = nullptr;
  void* peer_out[UlyssesSignal::kMaxRanks] = {};     // every rank's staging buffer
  void* peer_signal[UlyssesSignal::kMaxRanks] = {};  // every rank's UlyssesSignal
  const uint32_t* abort = nullptr;  // CUDA: the group's abort word (core/comm_abort.h), or null
  const char* op = "ulysses_a2a";   // the caller, named in the CPU reference's wait errors
  // The group's agreed grid cap: every rank's blocks wait on the peers' same blocks, so all of
  // them must be resident at once, also where ranks share a GPU (core/device_location.h).
  int max_blocks = UlyssesSignal::kMaxBlocks;

  FLASHINFER_HD int64_t h_local() const { return H / world_size; }
  /// Elements of one pushed row.
  FLASHINFER_HD int64_t row_elems() const { return h_local() * D; }
  /// Rows this rank pushes: B * W * S_local, row index ((b * W + peer) * S_local + s).
  FLASHINFER_HD int64_t rows() const { return B * world_size * S_local; }
  /// Elements of inp and of out (the same count).
  FLASHINFER_HD int64_t numel() const { return B * S_local * H * D; }
  /// The destination peer of row `row`.
  FLASHINFER_HD int row_peer(int64_t row) const {
    return static_cast<int>((row / S_local) % world_size);
  }
  /// Where row `row` starts in inp (elements).
  FLASHINFER_HD int64_t src_offset(int64_t row) const {
    const int64_t s = row % S_local, peer = (row / S_local) % world_size,
                  b = row / (S_local * world_size);
    if (mode == 0) return ((b * S_local + s) * H + peer * h_local()) * D;
    return ((b * S_local * world_size + peer * S_local + s) * h_local()) * D;
  }
  /// Where row `row` lands in its peer's staging buffer (elements).
  FLASHINFER_HD int64_t dst_offset(int64_t row) const {
    const int64_t s = row % S_local, b = row / (S_local * world_size);
    if (mode == 0) return (b * S_local * world_size + int64_t{rank} * S_local + s) * row_elems();
    return ((b * S_local + s) * H + int64_t{rank} * h_local()) * D;
  }
  /// The CUDA kernel's grid (upstream's): one block per row up to 36, and up to max_blocks.
  FLASHINFER_HD int blocks() const {
    const int cap = max_blocks < 1                           ? 1
                    : max_blocks > UlyssesSignal::kMaxBlocks ? UlyssesSignal::kMaxBlocks
                                                             : max_blocks;
    const int64_t r = rows();
    return r < 1 ? 1 : r > cap ? cap : static_cast<int>(r);
  }
};

}  // namespace flashinfer::kernels
