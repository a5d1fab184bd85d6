// Private: where a trtllm MoE weight stores each element of its plain [E, mn, k] matrix
// (upstream's use_shuffled_weight row shuffle, the gated-activation row interleave, and
// WeightLayout.BlockMajorK [E, k / block_k, mn, block_k]), host and device. The CPU reference
// turns the stored layout back into plain rows with it (api/moe_layout.cpp: moe_plain_weights);
// the CUDA kernels read the stored weights in place with it, so no weight copy is made on the
// device. Facts and sources: docs/MOE.md ("Weight layouts").
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHINFER_MOE_HD __host__ __device__ __forceinline__
#else
#define FLASHINFER_MOE_HD inline
#endif

namespace flashinfer::kernels {

/// How one trtllm weight tensor [E, mn, k] (plain row j, column c) is stored.
struct MoeWeightIndex {
  bool shuffled = false;          // upstream's shuffle_matrix_a row permutation
  bool gated_interleave = false;  // rows interleaved (up i, gate i) before the shuffle
  int64_t shuffle_block = 32;     // rows per shuffle block: 32 (epilogue_tile_m 128) or 16
  int64_t block_k = 0;            // BlockMajorK [E, k / block_k, mn, block_k]; 0: MajorK
};

/// The stored row holding plain row j of an [.., mn, ..] matrix: the gated interleave puts up
/// row i at 2i and gate row i at 2i + 1, then row r of each shuffle block b goes to
/// (r % (b / 8)) * 8 + r / (b / 8) (upstream's srcToDstBlk{16,32}RowMap).
FLASHINFER_MOE_HD int64_t moe_stored_row(const MoeWeightIndex& w, int64_t mn, int64_t j) {
  if (!w.shuffled) return j;
  const int64_t half = mn / 2;
  const int64_t old = w.gated_interleave ? (j < half ? 2 * j : 2 * (j - half) + 1) : j;
  const int64_t b = w.shuffle_block, lanes = b / 8, r = old % b;
  return old - r + (r % lanes) * 8 + r / lanes;
}

/// Element offset of plain element (e, j, c) of an [E, mn, k] weight stored as `w`; `row` is
/// moe_stored_row(w, mn, j) (hoisted out of the dot-product loops).
FLASHINFER_MOE_HD int64_t moe_weight_offset(const MoeWeightIndex& w, int64_t mn, int64_t k,
                                            int64_t e, int64_t row, int64_t c) {
  if (w.block_k == 0) return (e * mn + row) * k + c;
  const int64_t bk = w.block_k, nb = k / bk;
  return ((e * nb + c / bk) * mn + row) * bk + c % bk;
}

}  // namespace flashinfer::kernels
