// Host-side rule of grouped_mm_bf16's CUTLASS route (kernels/cuda/grouped_gemm_cutlass.cu): which
// calls it takes. Plain C++, unit-tested on the CPU (tests/ops/test_grouped_gemm_shape.cpp). The
// groups' rows are gmm_group_rows' (kernels/cuda/grouped_gemm_shape.h), as for the other kernels.
#pragma once

#include <cstdint>

#include "kernels/grouped_gemm_params.h"

namespace flashinfer::kernels {

/// Why the CUTLASS sm90 grouped GEMM does not take `p` on a device of compute capability `cc`
/// (major * 10 + minor, as detail::cuda_compute_capability gives it; nullptr: it does). Its kernel
/// is sm_90a code (TMA and wgmma), which runs on 9.0 only; TMA needs 16-byte aligned bases and row
/// strides; the instance built is bf16 x bf16 -> bf16 with a k-major weight, one weight per group
/// and no alpha (grouped_mm_bf16's call).
inline const char* cutlass_grouped_misfit(const GroupedMmCudaParams& p, int cc) {
  if (cc != 90) return "not an sm_90 device (the kernel is sm_90a code)";
  if (p.in_dtype != DType::kBFloat16 || p.b_dtype != DType::kBFloat16) return "not bf16 operands";
  if (p.out_dtype != DType::kBFloat16) return "not a bf16 output";
  if (p.b_index != nullptr || p.alpha != nullptr) return "a weight map or alpha";
  if (p.num_groups <= 0 || p.num_groups > 0x7fffffff || p.n <= 0 || p.k <= 0 || p.n > 0x7fffffff ||
      p.k > 0x7fffffff || p.cum_m > 0x7fffffff) {
    return "a dimension outside int32";
  }
  // 16-byte rows that do not overlap: TMA's global strides (multiples of 16 bytes; a zero or
  // negative row stride, a broadcast or flipped view, is left to the mma.sync kernel) and the
  // 8-element operand alignment of the instance. A weight stride of 0 (one weight for every
  // group) is only pointer arithmetic: each group's B is its own descriptor.
  auto aligned = [](const void* base, int64_t stride_row, int64_t stride_inner, int64_t row) {
    return stride_inner == 1 && stride_row >= row && reinterpret_cast<uintptr_t>(base) % 16 == 0 &&
           (stride_row * 2) % 16 == 0;
  };
  if (p.k % 8 != 0 || p.n % 8 != 0) return "n or k not a multiple of 8";
  if (!aligned(p.a, p.a_stride_m, p.a_stride_k, p.k)) return "a not k-contiguous 16-byte rows";
  if (!aligned(p.b, p.b_stride_n, p.b_stride_k, p.k) || p.b_stride_e < 0 ||
      (p.b_stride_e * 2) % 16 != 0) {
    return "b not k-contiguous 16-byte rows";
  }
  if (!aligned(p.out, p.out_stride_m, p.out_stride_n, p.n)) {
    return "out not n-contiguous 16-byte rows";
  }
  return nullptr;
}

}  // namespace flashinfer::kernels
