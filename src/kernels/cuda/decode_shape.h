// The block shape of the CUDA decode kernel (attention_decode_kernel.cuh), one function the host
// launcher, the planner's occupancy estimate and the kernel itself all call, so they cannot
// disagree. Plain arithmetic: compiled by g++, nvcc and NVRTC, and unit-tested on the CPU.
//
// A block is bdx x bdy x bdz threads, flattened into threadIdx.x (x fastest):
//   - bdx lanes cover one head_dim row, each lane a slice of vq = DQK / bdx (and vv = DVO / bdx)
//     elements: at least 16 bytes of K a lane, so a lane reads a row slice in 128-bit accesses;
//   - bdy threads of packed rows (query, head of the GQA group), rows_per_thread rows each: all
//     heads of a group share one K/V tile;
//   - bdz token groups, each scoring kDecodeTileZ tokens of the tile a stage; their softmax
//     states merge at the end through shared memory.
#pragma once

#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels::cuda {

constexpr int kDecodeTileZ = 4;         // tokens per token group per stage
constexpr int kDecodeStages = 2;        // cp.async pipeline depth (K and V separately)
constexpr int kDecodeMaxThreads = 256;  // __launch_bounds__

/// Lanes per head_dim row: the largest power of two <= 32 such that a lane's K slice is at least
/// 16 bytes and divides both head dims (both multiples of 16).
FLASHINFER_HD constexpr int decode_bdx(int dqk, int dvo, int kv_bytes) {
  const int dmin = dqk < dvo ? dqk : dvo;
  int units = dmin * kv_bytes / 16;  // 16-byte units in the shorter row
  if (units < 1) units = 1;
  int bdx = 1;
  while (bdx * 2 <= units && bdx * 2 <= 32 && dqk % (bdx * 2) == 0 && dvo % (bdx * 2) == 0) {
    bdx *= 2;
  }
  return bdx;
}

struct DecodeBlockShape {
  int bdx = 1, bdy = 1, bdz = 1;
  int rows_per_thread = 1;  // packed rows a thread owns (1 or 2: decode_rows_per_thread)
  int tile_tokens = 0;      // tokens per pipeline stage: bdz * kDecodeTileZ
  int cache_tokens = 0;     // page offsets cached per fill: a multiple of tile_tokens
  int smem_bytes = 0;       // dynamic shared memory
  FLASHINFER_HD constexpr int threads() const { return bdx * bdy * bdz; }
  /// Packed rows a block covers (the grid's row chunk).
  FLASHINFER_HD constexpr int block_rows() const { return bdy * rows_per_thread; }
};

/// Shape for rows = packed rows of the largest work item (query rows x GQA group). With
/// rows_per_thread 2 (only where decode_rows_per_thread says so) the block covers the same rows,
/// token groups and tiles as with 1, in bdy / 2 thread rows: the same arithmetic per row, half
/// the threads.
FLASHINFER_HD constexpr DecodeBlockShape decode_block_shape(int dqk, int dvo, int kv_bytes,
                                                            int rows, int rows_per_thread = 1) {
  DecodeBlockShape s;
  s.bdx = decode_bdx(dqk, dvo, kv_bytes);
  const int max_rows = kDecodeMaxThreads / s.bdx;
  s.bdy = rows < 1 ? 1 : (rows < max_rows ? rows : max_rows);
  const int xy = s.bdx * s.bdy;
  // At least 128 threads, and two token groups or more (a stage of >= 8 tokens) unless that
  // would pass kDecodeMaxThreads.
  int bdz = 2 * xy > kDecodeMaxThreads ? 1 : (128 / xy > 2 ? 128 / xy : 2);
  // K/V stages and the merge area stay within 32 KiB each (odd JIT pairs such as 16 / 256).
  const int kv_per_z = kDecodeStages * kDecodeTileZ * (dqk + dvo) * kv_bytes;
  const int merge_per_z = s.bdy * (dvo + 4) * 4;
  if (bdz * kv_per_z > 32768) bdz = 32768 / kv_per_z > 1 ? 32768 / kv_per_z : 1;
  if (bdz > 1 && bdz * merge_per_z > 32768) bdz = 32768 / merge_per_z > 1 ? 32768 / merge_per_z : 1;
  s.bdz = bdz;
  // Whole warps (the score reduction shuffles with a full mask): more token groups, or idle
  // rows, whichever makes the smaller block; one token group as the last resort (a multiple of
  // 32 / bdx rows always fits then).
  auto pad_rows = [&](int z) {
    int y = s.bdy;
    while ((s.bdx * y * z) % 32 != 0) ++y;
    return y;
  };
  int z_more = s.bdz;
  while ((xy * z_more) % 32 != 0 && xy * (z_more + 1) <= kDecodeMaxThreads) ++z_more;
  const int y_more = pad_rows(z_more), y_pad = pad_rows(s.bdz);
  const int t_more = s.bdx * y_more * z_more, t_pad = s.bdx * y_pad * s.bdz;
  if (t_more <= kDecodeMaxThreads && (t_more <= t_pad || t_pad > kDecodeMaxThreads)) {
    s.bdz = z_more;
    s.bdy = y_more;
  } else if (t_pad <= kDecodeMaxThreads) {
    s.bdy = y_pad;
  } else {
    s.bdz = 1;
    s.bdy = pad_rows(1);
  }
  if (rows_per_thread > 1) {
    s.rows_per_thread = rows_per_thread;
    s.bdy /= rows_per_thread;
  }
  s.tile_tokens = s.bdz * kDecodeTileZ;
  // One fill of the offset cache serves `fills` stages: >= the pipeline depth (the prologue's
  // stages come from the first fill) and about one token per thread.
  // A power of two, so the kernel finds a stage's slot with a mask.
  const int per_thread = s.threads() / s.tile_tokens;
  int fills = kDecodeStages;
  while (fills < per_thread) fills *= 2;
  s.cache_tokens = fills * s.tile_tokens;
  const int kv = kDecodeStages * s.tile_tokens * (dqk + dvo) * kv_bytes;
  // The token groups' states (o[DVO], m, d, NaN flag, pad) reuse the K/V area at the end.
  const int merge = s.bdz > 1 ? s.bdz * s.block_rows() * (dvo + 4) * 4 : 0;
  s.smem_bytes = 2 * s.cache_tokens * 8 + (kv > merge ? kv : merge);
  return s;
}

/// Packed rows a thread of the decode kernel owns: 2 where a block holds 4 rows or more (GQA
/// group >= 4, or several queries a request), so one K/V element read from shared memory and
/// widened serves two rows' FMAs (docs/ATTENTION.md, "Two rows a thread"); 1 otherwise: blocks
/// of fewer or an odd number of rows, halves that are not whole warps, and lanes past the AOT
/// head dims' 32 bytes of q and V slice (JIT dims such as 96 or 192 / 128) or rows of fewer
/// than kDecodeTileZ lanes (head dim 16), where two rows would double a large register set.
/// On an H200 (2026-11-26, `flashinfer bench`, L2 flushed, one row forced by
/// FLASHINFER_DECODE_ROWS_PER_THREAD=1 against this default) two rows ran 1.18x at batch 64 x
/// kv 2048 and 1.27x at kv 8192 for group 4, 1.19x for group 8, 1.09x at batch 1 x 32768:
/// their higher occupancy lets the planner split (kernel alone at one grid, two rows of group 4
/// were 0.89x).
FLASHINFER_HD constexpr int decode_rows_per_thread(int dqk, int dvo, int kv_bytes, int rows) {
  const DecodeBlockShape s = decode_block_shape(dqk, dvo, kv_bytes, rows);
  const int lane_bytes = (dqk / s.bdx + dvo / s.bdx) * kv_bytes;
  const bool pairs = s.bdy >= 4 && s.bdy % 2 == 0 && (s.bdx * (s.bdy / 2) * s.bdz) % 32 == 0 &&
                     s.bdx >= kDecodeTileZ && lane_bytes <= 32;
  return pairs ? 2 : 1;
}

}  // namespace flashinfer::kernels::cuda
