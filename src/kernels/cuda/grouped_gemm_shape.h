// The tiling of the tensor-core grouped GEMM (grouped_gemm_cuda.cu) as plain constexpr
// arithmetic shared by the kernel, its launcher and the CPU tests (tests/core/
// test_grouped_gemm_shape.cpp).
//
// A CTA computes a 128 x 128 tile of one group's output: rows [row0, row0 + rows) of that group
// (rows <= 128) times 128 columns of its weight, over k in steps of 64 that move through shared
// memory in kGmmStages stages. All groups' tiles go in one launch, grid (tile slots, n tiles):
// the host does not know m_indptr's values (they live on the device, and a CUDA graph replays
// the launch with other ones), so it launches gmm_slot_bound() slots, an upper bound of the
// number of m tiles for any split of cum_m rows over the groups, and each CTA finds its
// (group, m tile) from m_indptr itself: warp 0 walks the groups 32 at a time, each lane counting
// its group's m tiles, a warp prefix sum placing them (gmm_slot_in_group); CTAs past the last
// tile exit.
#pragma once

#include <cstdint>

#include "kernels/cuda/device/host_device.h"
#include "kernels/cuda/device/permuted_smem.cuh"

namespace flashinfer::kernels::cuda::grouped {

constexpr int kGmmTileM = 128, kGmmTileN = 128, kGmmTileK = 64;
constexpr int kGmmStages = 3;
/// 8 warps: 2 along M x 4 along N, each owning a 64 x 32 block of the tile (4 x 4 m16n8
/// accumulators, 64 floats a thread).
constexpr int kGmmWarpsM = 2, kGmmWarpsN = 4;
constexpr int kGmmWarps = kGmmWarpsM * kGmmWarpsN;
constexpr int kGmmThreads = kGmmWarps * 32;
constexpr int kGmmWarpTileM = kGmmTileM / kGmmWarpsM, kGmmWarpTileN = kGmmTileN / kGmmWarpsN;
/// 16-byte units of a shared-memory row of the 16-bit tiles: 8, the permuted layout's minimum.
constexpr int kGmmUnits = kGmmTileK * 2 / 16;
/// Rows of both operands' tiles of one stage.
constexpr int kGmmTileRows = kGmmTileM + kGmmTileN;

/// Dynamic shared memory of one CTA. 16-bit operands: kGmmStages stages of the A and B tiles in
/// the permuted layout (96 KiB). FP8 operands: the cp.async stages hold the fp8 bytes (64 a row,
/// no swizzle: only the thread that copied a chunk reads it back), and one 16-bit A/B tile holds
/// them converted to fp16 for ldmatrix (48 + 32 KiB).
FLASHINFER_HD constexpr int gmm_smem_bytes(bool fp8) {
  return fp8 ? kGmmStages * kGmmTileRows * kGmmTileK + kGmmTileRows * kGmmTileK * 2
             : kGmmStages * kGmmTileRows * kGmmTileK * 2;
}

/// The rows [begin, end) a group covers, its m_indptr entries clamped to [0, cum_m] (end >=
/// begin): the kernel reads m_indptr on the device without the host checking it, and clamped
/// entries keep every access inside a and out whatever they hold.
struct GmmGroup {
  int64_t begin, end;
};
FLASHINFER_HD constexpr GmmGroup gmm_group_rows(int64_t first, int64_t last, int64_t cum_m) {
  const int64_t b = first < 0 ? 0 : (first > cum_m ? cum_m : first);
  const int64_t e = last < b ? b : (last > cum_m ? cum_m : last);
  return {b, e};
}

/// m tiles of a group of m rows.
FLASHINFER_HD constexpr int64_t gmm_m_tiles(int64_t m) {
  return m <= 0 ? 0 : (m + kGmmTileM - 1) / kGmmTileM;
}

/// An upper bound of the sum over groups of gmm_m_tiles(m_g) for any m_g >= 0 with sum <= cum_m
/// over `groups` groups: at most min(groups, cum_m) of them are non-empty, and each adds
/// ceil(m_g / 128) <= (m_g + 127) / 128, so the sum is at most
/// (cum_m + 127 * min(groups, cum_m)) / 128 (the bound is reached: every group holding 128 j + 1
/// rows).
FLASHINFER_HD constexpr int64_t gmm_slot_bound(int64_t cum_m, int64_t groups) {
  const int64_t nonempty = groups < cum_m ? groups : cum_m;
  return nonempty <= 0 ? 0 : (cum_m + (kGmmTileM - 1) * nonempty) / kGmmTileM;
}

/// The m tile of slot `slot` within a group, or -1 when the slot is not the group's: `before` is
/// the number of tiles of all earlier groups, `tiles` the group's own (gmm_m_tiles).
FLASHINFER_HD constexpr int64_t gmm_slot_in_group(int64_t slot, int64_t before, int64_t tiles) {
  return slot >= before && slot < before + tiles ? slot - before : -1;
}

/// Output rows of m tile `tile` of a group spanning rows [begin, end): its first row, and how
/// many (at most kGmmTileM).
struct GmmRows {
  int64_t row0, rows;
};
FLASHINFER_HD constexpr GmmRows gmm_tile_rows(int64_t begin, int64_t end, int64_t tile) {
  const int64_t r0 = begin + tile * kGmmTileM, left = end - r0;
  return {r0, left < kGmmTileM ? left : kGmmTileM};
}

/// Whether the tensor-core kernel can read an operand: unit k stride, and every row start and
/// every 16-byte chunk along k 16-byte aligned (base address, row stride and group stride in
/// bytes multiples of 16, k * element size a multiple of 16), since it copies whole 16-byte
/// chunks with cp.async and zero-fills those past k. Otherwise the CUDA-core kernel runs.
FLASHINFER_HD constexpr bool gmm_operand_aligned(uint64_t address, int64_t stride_row,
                                                 int64_t stride_k, int64_t stride_group, int64_t k,
                                                 int64_t elem_bytes) {
  return stride_k == 1 && address % 16 == 0 && (stride_row * elem_bytes) % 16 == 0 &&
         (stride_group * elem_bytes) % 16 == 0 && (k * elem_bytes) % 16 == 0;
}

/// m16 fragments of warp row block wm (64 rows) that hold some of a tile's `rows` rows: those
/// past them multiply zeros, and the kernel skips them.
FLASHINFER_HD constexpr int gmm_warp_m_frags(int rows, int wm) {
  const int left = rows - wm * kGmmWarpTileM;
  const int frags = left <= 0 ? 0 : (left + 15) / 16;
  return frags < kGmmWarpTileM / 16 ? frags : kGmmWarpTileM / 16;
}

/// 16-byte units of a shared-memory row of the n-major B tile ([k][n], 16-bit): 16.
constexpr int kGmmUnitsN = kGmmTileN * 2 / 16;

// ldmatrix lane bases (permuted_lane_base; shared-memory byte addresses) of warp (wm, wn) for
// the loop's fragments, each then read at permuted_frag_addr(base + stage offset, row_add,
// col_even, stride16). ldmatrix.x4 reads four 8x8 tiles, lane group q = lane / 8 giving the row
// addresses of tile q, which lands in fragment register q.

/// A ([m][k], 8 units a row): fragment (mi, kk) at (mi * 16, kk * 2). Tile q covers rows
/// (q % 2) * 8 + 0..7 and k unit q / 2: the m16n8k16 A registers a0..a3.
FLASHINFER_HD constexpr uint32_t gmm_a_lane_base(uint32_t tile, int wm, int lane) {
  return dev::permuted_lane_base(tile, static_cast<uint32_t>(wm * kGmmWarpTileM + (lane & 15)),
                                 static_cast<uint32_t>(lane >> 4), kGmmUnits);
}

/// k-major B ([n][k], 8 units a row): fragment (nj, kk) at (nj * 16, kk * 2). Tile q covers n rows
/// (q / 2) * 8 + 0..7 and k unit q % 2: b0, b1 of output columns nj * 16 + 0..7, then of 8..15.
FLASHINFER_HD constexpr uint32_t gmm_bk_lane_base(uint32_t tile, int wn, int lane) {
  return dev::permuted_lane_base(
      tile, static_cast<uint32_t>(wn * kGmmWarpTileN + (lane & 7) + ((lane >> 4) << 3)),
      static_cast<uint32_t>((lane >> 3) & 1), kGmmUnits);
}

/// n-major B ([k][n], 16 units a row, read with ldmatrix.trans): fragment (nj, kk) at
/// (kk * 16, nj * 2). Tile q covers k rows (q % 2) * 8 + 0..7 and n unit wn * 4 + nj * 2 + q / 2:
/// transposed, b0, b1 of columns nj * 16 + 0..7, then of 8..15, as in the k-major case. The
/// warp's column offset of wn * 4 units splits into whole 8-unit groups ((wn / 2) * 128 bytes,
/// added to the tile address) and 4 units inside a group (an XOR with 64 bytes, as
/// permuted_frag_addr applies col_even), so the loop's fragments stay constant offsets.
FLASHINFER_HD constexpr uint32_t gmm_bn_lane_base(uint32_t tile, int wn, int lane) {
  return dev::permuted_lane_base(tile + static_cast<uint32_t>(wn / 2) * 128u,
                                 static_cast<uint32_t>(lane & 15), static_cast<uint32_t>(lane >> 4),
                                 kGmmUnitsN) ^
         (static_cast<uint32_t>(wn % 2) * 64u);
}

}  // namespace flashinfer::kernels::cuda::grouped
