// The tile shapes of the FA2 prefill kernel (prefill_kernel.cuh), as plain constexpr arithmetic
// shared by the kernel, its launcher and the CPU tests (tests/api/test_prefill_shape.cpp).
//
// A block is 4 warps stacked along the query rows; warp w owns rows [16 * kMmaQ * w,
// 16 * kMmaQ * (w + 1)) of the block's kCtaQ = 64 * kMmaQ packed rows (a packed row is one
// (query, qo head) pair of the KV head's GQA group). K/V move through shared memory in tiles of
// kv_tile keys, two stages deep. The choices follow upstream's FA2 prefill: CTA tile 128 along Q
// when the packed query length exceeds 64 and the output head dim is below 256, else 64; a
// 64-key KV tile for head dims up to 128 (32 for 256), which keeps the S and O fragments of a
// thread (o: kMmaQ * dvo / 2 floats, s: kMmaQ * kv_tile / 2 floats) within 255 registers
// (a 32-key tile for 128-row blocks: see prefill_kv_tile).
#pragma once

#include <cstdint>

#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels::cuda::prefill {

constexpr int kPrefillWarps = 4;
constexpr int kPrefillThreads = kPrefillWarps * 32;
constexpr int kPrefillStages = 2;

/// Variant bits, compile-time: without them the kernel has no tanh and reads no mask.
constexpr int kPrefillSoftCap = 1;
constexpr int kPrefillCustomMask = 2;

/// Whether the FA2 kernel is built for this head-dim pair (ahead of time): equal dims 64, 128
/// and 256, and DeepSeek's 192 / 128. Other multiples of 16 run on the first-draft tensor-core
/// kernel through NVRTC.
FLASHINFER_HD constexpr bool prefill_dims_built(int dqk, int dvo) {
  return (dqk == dvo && (dqk == 64 || dqk == 128 || dqk == 256)) || (dqk == 192 && dvo == 128);
}

/// m16 fragments per warp along Q (1: 64-row blocks, 2: 128-row blocks) for a launch whose work
/// items hold at most max_packed_rows packed rows. 128-row blocks only where their fragments fit
/// 255 registers without spilling (ptxas, sm_90): dqk, dvo <= 128 and the plain variant (the
/// soft cap's tanhf spilled 52 bytes, the mask test 72).
FLASHINFER_HD constexpr int prefill_mma_q(int max_packed_rows, int dqk, int dvo, int variant) {
  return (max_packed_rows > 64 && dqk <= 128 && dvo <= 128 && variant == 0) ? 2 : 1;
}

/// Keys per K/V tile. 128-row blocks take 32 keys: with 64, the S and O fragments (64 + 128
/// floats a thread at head dim 128) spilled 76 bytes at 255 registers (ptxas, sm_90).
FLASHINFER_HD constexpr int prefill_kv_tile(int mma_q, int dqk, int dvo) {
  if (mma_q == 2) return 32;
  return (dqk > 128 || dvo > 128) ? (dqk == 192 ? 64 : 32) : 64;
}

/// Packed rows per block.
FLASHINFER_HD constexpr int prefill_cta_q(int mma_q) { return 64 * mma_q; }

/// Dynamic shared memory of one block, in bytes, for 2-byte elements: the Q tile and
/// kPrefillStages stages of K and V tiles.
FLASHINFER_HD constexpr unsigned prefill_smem_bytes(int mma_q, int dqk, int dvo) {
  const int kv = prefill_kv_tile(mma_q, dqk, dvo);
  return 2u * static_cast<unsigned>(prefill_cta_q(mma_q) * dqk + kPrefillStages * kv * (dqk + dvo));
}

/// Whether keys [t0, t0 + n) are visible to every row of a block in full, so the tile needs no
/// per-element test: all below the block's end `kv_hi`, causal rows whose first query sits at
/// position pos_min (every key <= pos_min), and a window of window_left keys before the last
/// query's position pos_max (window_left < 0: none). A custom mask always needs the test.
FLASHINFER_HD constexpr bool prefill_tile_unmasked(long long t0, int n, long long kv_hi,
                                                   bool causal, long long pos_min,
                                                   long long pos_max, int window_left,
                                                   bool custom_mask) {
  if (custom_mask || t0 + n > kv_hi) return false;
  if (causal && t0 + n - 1 > pos_min) return false;
  if (window_left >= 0 && t0 < pos_max - window_left) return false;
  return true;
}

/// 32 custom-mask bits of one row from bit index bit0 on, low bit first: bit i of the mask is
/// bit i % 32 of 32-bit word i / 32 (upstream's little-endian packed bits). Only the first
/// `nbits` (at most 32) are keys of the row; a word holding none of them is not read, so a row's
/// last tile reads nothing past the mask. nbits <= 0: 0, nothing read.
FLASHINFER_HD constexpr uint32_t prefill_mask_window(const uint32_t* words, long long bit0,
                                                     int nbits) {
  if (nbits <= 0) return 0u;
  const long long w = bit0 >> 5;
  const unsigned sh = static_cast<unsigned>(bit0 & 31);
  const uint32_t lo = words[w];
  const uint32_t hi = ((bit0 + nbits - 1) >> 5) > w ? words[w + 1] : 0u;
  return sh == 0 ? lo : (lo >> sh) | (hi << (32 - sh));
}

/// The tile row and unit column bit (c, added to an even column) whose 16-byte unit a lane names
/// to ldmatrix_x4, for each operand of the kernel's MMAs (mma.m16n8k16 fragment layouts of the PTX
/// ISA; tests/api/test_prefill_shape.cpp emulates ldmatrix and the MMA with them):
///   Q (A operand, 16 rows x 16 columns): rows lane % 16, c = lane / 16, so the 4 matrices are
///     (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15)
///     = a0..a3;
///   K (B operands of two 8-key blocks): keys lane % 8 + 8 * (lane / 16), c = (lane / 8) % 2:
///     (keys 0-7, dims 0-7) = b0 and (keys 0-7, dims 8-15) = b1 of the first block, then the
///     same for keys 8-15;
///   V (B operands through the transposing ldmatrix, two 8-wide dim blocks): keys lane % 16,
///     c = lane / 16: (keys 0-7, dims 0-7) = b0, (keys 8-15, dims 0-7) = b1 of the first block,
///     then the same for dims 8-15.
struct FragLane {
  unsigned row, c;
};
FLASHINFER_HD constexpr FragLane prefill_q_frag_lane(int lane) {
  return {static_cast<unsigned>(lane & 15), static_cast<unsigned>(lane >> 4)};
}
FLASHINFER_HD constexpr FragLane prefill_k_frag_lane(int lane) {
  return {static_cast<unsigned>((lane & 7) + ((lane >> 4) << 3)),
          static_cast<unsigned>((lane >> 3) & 1)};
}
FLASHINFER_HD constexpr FragLane prefill_v_frag_lane(int lane) {
  return {static_cast<unsigned>(lane & 15), static_cast<unsigned>(lane >> 4)};
}

}  // namespace flashinfer::kernels::cuda::prefill
