// Private: what the grouped GEMM kernels receive (grouped_mm_*, SegmentGEMMWrapper.run,
// grouped_gemm_nt_masked). One generic description: two operands, each logically [rows, k] per
// group with its own element format and block scales, and a list of problems (row ranges).
#pragma once

#include <cstdint>
#include <vector>

#include "flashinfer/dtype.h"

namespace flashinfer::kernels {

/// One operand, logically [rows, k] in group g. Element (row, kk) of group g is at
/// data[g * stride_group + row * stride_row + kk * stride_k] (elements of dtype), except for
/// packed fp4 (fp4 = true: uint8 storage, two e2m1 codes per byte, element kk in byte kk / 2,
/// low nibble first, strides in bytes).
struct GroupedOperand {
  const void* data = nullptr;
  DType dtype = DType::kBFloat16;
  bool fp4 = false;
  int64_t stride_row = 0, stride_k = 1, stride_group = 0;
  // Byte block scales: one per sf_vec consecutive k of a row, ue8m0 (sf_e4m3 = false) or e4m3.
  // sf_mode 1: the 128x4 swizzled layout of a [rows, sf_cols] matrix, group g starting at byte
  // g * sf_stride_group. sf_mode 2: the 6-D view (32, 4, rm, 4, rk, l) of the masked GEMM with
  // element strides sf6 (row r, block b, group g -> (r % 32, (r % 128) / 32, r / 128, b % 4,
  // b / 4, g)). sf_mode 3: each group's rows padded to 128 and swizzled on their own, the
  // blocks concatenated (group g's block at byte sf_group_base[g], its first row is
  // sf_group_row0[g]). 0: none.
  const uint8_t* sf = nullptr;
  bool sf_e4m3 = false;
  int sf_mode = 0;
  int64_t sf_vec = 32, sf_cols = 0, sf_stride_group = 0;
  int64_t sf6[6] = {0, 0, 0, 0, 0, 0};
  std::vector<int64_t> sf_group_base, sf_group_row0;
  // sf_mode 4: linear rows of sf_row_bytes bytes, row r of group g at byte sf_group_base[g] +
  // (r - sf_group_row0[g]) * sf_row_bytes, block b at byte b within it (4 blocks per int32,
  // little-endian, as the int32-packed UE8M0 scales are stored).
  int64_t sf_row_bytes = 0;
  // fp32 block scales (the fp8 groupwise GEMMs): scale of (row, kk) in group g is
  // fs[g * fs_stride_group + (row / fs_gran_row) * fs_stride_row + (kk / fs_gran_k) *
  // fs_stride_k]. Null: none.
  const float* fs = nullptr;
  int64_t fs_gran_row = 1, fs_gran_k = 128, fs_stride_row = 0, fs_stride_k = 0, fs_stride_group = 0;
  // When set: group g's scales start at element fs_group_base[g] (instead of g *
  // fs_stride_group) and its rows count from fs_group_row0[g] (the zero-padded per-expert scale
  // layouts of moe_gemm_*_nt_groupwise).
  std::vector<int64_t> fs_group_base, fs_group_row0;
};

/// out rows [out_row0, out_row0 + m) of group out_group = A rows [a_row0, a_row0 + m) of group
/// a_group times B (group b_group) transposed.
struct GroupedProblem {
  int64_t a_group = 0, a_row0 = 0, m = 0, b_group = 0, out_group = 0, out_row0 = 0;
};

/// out = alpha * (A_deq @ B_deq^T) per problem, A_deq/B_deq the operands dequantized to fp32
/// (element times its scales, in fp32), products summed in fp32, one rounding to out_dtype.
/// alpha: *alpha (one fp32) times alpha_group[b_group * alpha_group_stride] when given.
struct GroupedGemmParams {
  GroupedOperand a, b;
  int64_t n = 0, k = 0;
  std::vector<GroupedProblem> problems;
  const float* alpha = nullptr;
  const float* alpha_group = nullptr;
  int64_t alpha_group_stride = 1;
  void* out = nullptr;
  DType out_dtype = DType::kBFloat16;
  int64_t out_stride_row = 0, out_stride_n = 1, out_stride_group = 0;
  // Fused SwiGLU epilogue (moe_gemm_fp8_nt_groupwise is_gated): B's rows [0, n/2) are the up
  // projection, [n/2, n) the gate; out has n/2 columns, out = SiLU(gate) * up in fp32.
  bool swiglu = false;
};

/// The grouped CUDA kernel's view (grouped_mm_bf16, SegmentGEMMWrapper.run): rows
/// [m_indptr[g], m_indptr[g + 1]) of a times group g's weight transposed, the problems read from
/// m_indptr on the device.
struct GroupedMmCudaParams {
  const void* a = nullptr;  // [cum_m, k] of in_dtype
  int64_t a_stride_m = 0, a_stride_k = 1;
  const void* b = nullptr;  // [num_weights, n, k] of in_dtype (logical; any strides)
  int64_t b_stride_e = 0, b_stride_n = 0, b_stride_k = 1;
  // a: bf16, fp16, fp8 e4m3 / e5m2 (unscaled); b: the same 16-bit dtype, or either fp8 one.
  DType in_dtype = DType::kBFloat16, b_dtype = DType::kBFloat16;
  const int32_t* m_indptr = nullptr;  // [num_groups + 1] on the device
  // [num_groups] on the device: group g multiplies weight b_index[g] (SegmentGEMMWrapper's
  // weight_indices). Null: weight g.
  const int32_t* b_index = nullptr;
  int64_t num_groups = 0, cum_m = 0, n = 0, k = 0;
  const float* alpha = nullptr;  // one fp32 on the device multiplying every output; null: 1
  // alpha[w] (device fp32, one per weight) multiplies the outputs of the rows that multiply
  // weight w instead of alpha[0] (cutlass_fused_moe's per-expert FP8 dequantization scales).
  bool alpha_per_weight = false;
  void* out = nullptr;  // [cum_m, n]
  DType out_dtype = DType::kBFloat16;
  int64_t out_stride_m = 0, out_stride_n = 1;
  // DeepSeek's 128 x 128 block scales (grouped_mm_fp8_block_scaled; null: none): a's per row and
  // 128-wide k block, a_block_scale[row * a_block_scale_stride + kb]; b's per (128-row n block, k
  // block) of each weight, b_block_scale[w * b_block_scale_stride_e + (n / 128) * k_blocks + kb]
  // with k_blocks = ceil(k / 128). Each k block's fp32 dot product joins the sum as
  // moe_fp8_block_accumulate (kernels/moe_cutlass_fp8_rules.h) says.
  const float* a_block_scale = nullptr;
  int64_t a_block_scale_stride = 0;
  const float* b_block_scale = nullptr;
  int64_t b_block_scale_stride_e = 0;
  // Set by the tensor-core launcher: tile slots along grid y and n tiles along x, so the CTAs
  // launched together share one m tile (its a rows stay in L2) instead of one n tile.
  bool slots_along_y = false;
};

}  // namespace flashinfer::kernels
