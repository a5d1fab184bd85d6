// Private: trtllm-gen MoE weight layouts (upstream's use_shuffled_weight / WeightLayout) turned
// back into plain [E, Mn, K] matrices for the CPU reference, through the index the CUDA kernels
// read the stored layout with (kernels/moe_layout_rules.h). The transforms are pure
// permutations, so the result is bit-exact. Facts and sources: docs/MOE.md ("Weight layouts").
#pragma once

#include <cstdint>
#include <vector>

#include "flashinfer/ops/moe.h"
#include "flashinfer/tensor.h"
#include "kernels/moe_layout_rules.h"

namespace flashinfer::api {

/// Rows per shuffle block for upstream's epilogue_tile_m (get_shuffle_block_size): 32 when
/// epilogue_tile_m is a multiple of 128, else 16.
int64_t moe_shuffle_block_size(int64_t epilogue_tile_m);

/// For each row of the stored (shuffled) matrix, the plain row it holds (the inverse of
/// kernels::moe_stored_row): upstream's
/// shuffle_matrix_a row indices (blocks of 16 or 32 rows), composed after the gated-activation
/// interleave (reorder_rows_for_gated_act_gemm: row 2i = up row i, row 2i+1 = gate row i) when
/// `gated_interleave`. `m` must be a multiple of the block size (and even when interleaving).
std::vector<int64_t> moe_shuffled_row_source(int64_t m, int64_t epilogue_tile_m,
                                             bool gated_interleave);

/// How a trtllm weight tensor is stored.
struct MoeWeightFormat {
  bool shuffled = false;                       // use_shuffled_weight
  WeightLayout layout = WeightLayout::MajorK;  // MajorK [E, Mn, K] or BlockMajorK
  int64_t epilogue_tile_m = 128;               // shuffle block: 32 rows (128) or 16 (64)
  bool gated_interleave = false;               // GEMM1 of a gated activation, shuffled
};

/// The checks of moe_plain_weights without the conversion (for kernels that read the stored
/// layout in place): returns the stored block_k for BlockMajorK, 0 for MajorK.
int64_t moe_check_weights(const Tensor& w, int64_t E, int64_t mn, int64_t k,
                          const MoeWeightFormat& f, const char* op, const char* arg);

/// moe_check_weights, then the index a kernel reading the stored layout in place inverts it
/// with (kernels/moe_layout_rules.h: moe_stored_row, moe_weight_offset).
kernels::MoeWeightIndex moe_stored_weight_index(const Tensor& w, int64_t E, int64_t mn, int64_t k,
                                                const MoeWeightFormat& f, const char* op,
                                                const char* arg);

/// Checks `w` (dtype already checked by the caller) against [E, mn, k] in format `f` and returns
/// the plain contiguous [E, mn, k] weights: `w` itself when it is already plain, else a new host
/// tensor. BlockMajorK is [E, k / bk, mn, bk] with any bk dividing k (upstream reads bk from
/// shape[3]; its preparation uses 128 bytes). MajorMn and non-host shuffled weights raise
/// kUnsupported naming `arg` (ops with a CUDA kernel pass the device the stored weights and
/// moe_stored_weight_index instead).
Tensor moe_plain_weights(const Tensor& w, int64_t E, int64_t mn, int64_t k,
                         const MoeWeightFormat& f, const char* op, const char* arg);

/// A per-expert fp32 bias [E, m] whose rows are stored as the weights' (`shuffled` with
/// `epilogue_tile_m`, gated rows interleaved first when `gated_interleave`), on the host in plain
/// row order.
Tensor moe_plain_bias(const Tensor& b, int64_t E, int64_t m, bool shuffled, int64_t epilogue_tile_m,
                      bool gated_interleave);

/// The plain GEMM1 rows a valid intermediate size `iv` keeps (docs/MOE.md, "Padded
/// dimensions"): [0, iv) of the up half and, gated, [I, I + iv) of the gate half.
std::vector<int64_t> moe_valid_rows(int64_t I, int64_t iv, bool gated);

/// Rows `rows` (all when empty) and the first `cols` columns of a host tensor [E, R, C] (or of
/// each expert's row vector [E, R], `cols` ignored), as a new contiguous host tensor.
Tensor moe_keep_rows_cols(const Tensor& t, const std::vector<int64_t>& rows, int64_t cols);

}  // namespace flashinfer::api
