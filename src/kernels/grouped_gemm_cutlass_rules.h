// Host-side rule of the grouped GEMMs' CUTLASS route (kernels/cuda/grouped_gemm_cutlass.cu): which
// calls it takes. Plain C++, unit-tested on the CPU (tests/core/test_grouped_gemm_shape.cpp). The
// groups' rows are gmm_group_rows' (kernels/cuda/grouped_gemm_shape.h), as for the other kernels.
#pragma once

#include <cstdint>

#include "kernels/grouped_gemm_params.h"

namespace flashinfer::kernels {

/// Why the CUTLASS sm90 grouped GEMM does not take `p` on a device of compute capability `cc`
/// (major * 10 + minor, as detail::cuda_compute_capability gives it; nullptr: it does). Its kernel
/// is sm_90a code (TMA and wgmma), which runs on 9.0 only; TMA needs 16-byte aligned bases and row
/// strides; the instances built are bf16 x bf16 and e4m3 x e4m3 with a k-major weight, a bf16
/// output, a weight per group or a weight map (b_index), and one alpha, one per weight or none
/// (grouped_mm_bf16's, grouped_mm_fp8's and SegmentGEMMWrapper.run's common calls, and
/// cutlass_fused_moe's grouped GEMMs with a bf16 output).
inline const char* cutlass_grouped_misfit(const GroupedMmCudaParams& p, int cc) {
  if (cc != 90) return "not an sm_90 device (the kernel is sm_90a code)";
  const bool bf16 = p.in_dtype == DType::kBFloat16 && p.b_dtype == DType::kBFloat16;
  const bool e4m3 = p.in_dtype == DType::kFloat8E4M3FN && p.b_dtype == DType::kFloat8E4M3FN;
  if (!bf16 && !e4m3) return "not bf16 x bf16 or e4m3 x e4m3 operands";
  if (p.out_dtype != DType::kBFloat16) return "not a bf16 output";
  if (p.num_groups <= 0 || p.n <= 0 || p.k <= 0 || p.n > 0x7fffffff || p.k > 0x7fffffff ||
      p.cum_m > 0x7fffffff) {
    return "a dimension outside int32";
  }
  // CUTLASS's group scheduler walks the groups a warp at a time, adding 32 to an int32 index.
  if (p.num_groups > (int64_t{1} << 30)) return "more than 2^30 groups";
  // 16-byte rows that do not overlap: TMA's global strides (multiples of 16 bytes; a zero or
  // negative row stride, a broadcast or flipped view, is left to the mma.sync kernel) and the
  // 16-byte operand alignment of the instances. A weight stride of 0 (one weight for every
  // group) is only pointer arithmetic: each group's B is its own descriptor.
  const int64_t esz = bf16 ? 2 : 1;
  auto aligned = [](const void* base, int64_t stride_row, int64_t stride_inner, int64_t row,
                    int64_t bytes) {
    return stride_inner == 1 && stride_row >= row && reinterpret_cast<uintptr_t>(base) % 16 == 0 &&
           (stride_row * bytes) % 16 == 0;
  };
  if ((p.k * esz) % 16 != 0) return "k not a multiple of 16 bytes";
  if (p.n % 8 != 0) return "n not a multiple of 8";
  if (!aligned(p.a, p.a_stride_m, p.a_stride_k, p.k, esz)) return "a not k-contiguous 16-byte rows";
  if (!aligned(p.b, p.b_stride_n, p.b_stride_k, p.k, esz) || p.b_stride_e < 0 ||
      (p.b_stride_e * esz) % 16 != 0) {
    return "b not k-contiguous 16-byte rows";
  }
  if (!aligned(p.out, p.out_stride_m, p.out_stride_n, p.n, 2)) {
    return "out not n-contiguous 16-byte rows";
  }
  return nullptr;
}

/// Why the CUTLASS sm90 block-scaled grouped GEMM (grouped_gemm_cutlass_fp8_block.cu) does not take
/// grouped_mm_fp8_block_scaled's `p` (nullptr: it does): cutlass_grouped_misfit's rules for e4m3
/// operands, both block scales and no alpha, and the scales dense in the layouts CUTLASS derives
/// from each group's shape: a's ceil(k / 128) a row, each weight's ceil(n / 128) rows of them,
/// 4-byte aligned. Partial last n or k blocks are CUTLASS's as they are the mma.sync kernel's:
/// TMA zero-fills the k tile past k, and the scale loads stop at the blocks the shape has.
inline const char* cutlass_grouped_block_misfit(const GroupedMmCudaParams& p, int cc) {
  if (const char* why = cutlass_grouped_misfit(p, cc)) return why;
  if (p.in_dtype != DType::kFloat8E4M3FN) return "not e4m3 operands";
  if (p.a_block_scale == nullptr || p.b_block_scale == nullptr) return "no block scales";
  if (p.alpha != nullptr) return "an alpha besides the block scales";
  const int64_t kb = (p.k + 127) / 128, nb = (p.n + 127) / 128;
  if (p.a_block_scale_stride != kb) return "a's scales not ceil(k / 128) a row";
  if (p.b_block_scale_stride_e < nb * kb) return "b's scales overlap between weights";
  if (reinterpret_cast<uintptr_t>(p.a_block_scale) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(p.b_block_scale) % 4 != 0) {
    return "scales not 4-byte aligned";
  }
  return nullptr;
}

}  // namespace flashinfer::kernels
