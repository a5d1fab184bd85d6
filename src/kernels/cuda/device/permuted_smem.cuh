// The swizzled ("permuted") shared-memory layout of the attention kernels' Q/K/V tiles, in units
// of 16 bytes (8 halves: one ldmatrix row, one cp.async chunk). A row of the tile holds stride16
// units; unit (row, col16) is stored at col16 XOR (row % 8) within its row. ldmatrix reads the
// same column of 8 consecutive rows at once: unswizzled, with a row length a multiple of 128
// bytes, all 8 would land in the same 4 banks (an 8-way conflict); the XOR spreads them over the
// 8 distinct 16-byte bank groups of a 128-byte line. The XOR touches only the low 3 bits of
// col16, so each aligned group of 8 units stays in place, within its row.
#pragma once

#include "kernels/cuda/device/host_device.h"

#ifdef __CUDACC_RTC__
#include <cuda/std/cstdint>
#else
#include <cstdint>
#endif

namespace flashinfer::kernels::cuda::dev {

/// Whether rows of stride16 units can use the permuted layout: a nonzero multiple of 8 units
/// (128 bytes), so that the XOR never leaves the row.
FLASHINFER_HD constexpr bool permuted_layout_ok(uint32_t stride16) {
  return stride16 != 0 && stride16 % 8 == 0;
}

/// Offset, in 16-byte units, of unit (row, col16) of a tile whose rows hold stride16 units.
/// Requires permuted_layout_ok(stride16) and col16 < stride16.
FLASHINFER_HD constexpr uint32_t permuted_offset(uint32_t row, uint32_t col16, uint32_t stride16) {
  return row * stride16 + (col16 ^ (row % 8));
}

/// permuted_offset(row + rows, col16, stride16) from permuted_offset(row, col16, stride16), for
/// rows a multiple of 8 (the swizzle repeats every 8 rows): walking a tile down by row blocks.
FLASHINFER_HD constexpr uint32_t permuted_advance_rows(uint32_t offset, uint32_t rows,
                                                       uint32_t stride16) {
  return offset + rows * stride16;
}

/// permuted_offset(row, col16 + 8 * groups, stride16) from permuted_offset(row, col16, stride16):
/// moving by whole 8-unit groups leaves the low 3 bits, hence the swizzle, unchanged.
FLASHINFER_HD constexpr uint32_t permuted_advance_col_groups(uint32_t offset, uint32_t groups) {
  return offset + 8 * groups;
}

/// Fragment addressing for ldmatrix in shared-memory byte addresses. A lane reads, for every
/// fragment of a loop, unit (row + row_add, col_even + c) of a tile at byte address tile_addr,
/// where its own row and c in {0, 1} are fixed and row_add (a multiple of 8) and col_even (even)
/// are compile-time constants of the unrolled loop. With tile_addr a multiple of 128 and stride16
/// a multiple of 8, (col_even + c) ^ (row % 8) = (col_even & ~7) + ((col_even & 7) ^ y) with
/// y = c ^ (row % 8): so the lane keeps one base, permuted_lane_base(), and each fragment costs
/// one XOR with a constant plus an immediate offset (permuted_frag_addr()). Computing every
/// fragment's offset in full instead makes the compiler hoist dozens of loop-invariant offsets
/// into registers.
FLASHINFER_HD constexpr uint32_t permuted_lane_base(uint32_t tile_addr, uint32_t row, uint32_t c,
                                                    uint32_t stride16) {
  return (tile_addr + row * stride16 * 16u) | (((c ^ row) & 7u) * 16u);
}

/// The byte address of unit (row + row_add, col_even + c) from the lane's base (see above):
/// equals tile_addr + 16 * permuted_offset(row + row_add, col_even + c, stride16).
FLASHINFER_HD constexpr uint32_t permuted_frag_addr(uint32_t lane_base, uint32_t row_add,
                                                    uint32_t col_even, uint32_t stride16) {
  return (lane_base ^ ((col_even & 7u) * 16u)) + (col_even & ~7u) * 16u + row_add * stride16 * 16u;
}

}  // namespace flashinfer::kernels::cuda::dev
