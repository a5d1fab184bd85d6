// CUDA launchers of the grouped GEMM (grouped_mm_bf16, grouped_mm_fp8, SegmentGEMMWrapper.run;
// plain C++ header).
#pragma once

#include <cstdint>

#include "kernels/grouped_gemm_params.h"

namespace flashinfer::kernels::cuda {

/// Rows [m_indptr[g], m_indptr[g + 1]) of a times the weight b_index[g] (or weight g)
/// transposed, times *alpha when given (alpha[weight] with alpha_per_weight); rows outside every
/// group are not written. fp32
/// accumulation, one rounding to out_dtype (bf16, fp16 or fp32).
///
/// Operands of one 16-bit dtype (bf16, fp16) or fp8 ones (e4m3 / e5m2, either on each side)
/// whose rows are 16-byte aligned with unit k stride (grouped::gmm_operand_aligned; 16-bit b may
/// instead have unit n stride and 16-byte aligned k rows) run on the tensor-core kernel: 128 x 128
/// output tiles of every group in one launch, each CTA finding its group from m_indptr on the
/// device (grouped_gemm_shape.h), mma.sync m16n8k16 with fp32 accumulators (fp8 converted exactly
/// to fp16 in shared memory), so sums over k are in blocks of 16 and tiles of 64. Other layouts run
/// on the CUDA-core kernel (one output per thread, sums in k order). Throws
/// flashinfer::Error(kUnsupported) past the CUDA-core grid's row limit, Error(kCuda) when a launch
/// fails.
void grouped_mm_bf16(const GroupedMmCudaParams& p, void* stream);
/// The same kernels for grouped_mm_fp8 (errors name "grouped_mm_fp8").
void grouped_mm_fp8(const GroupedMmCudaParams& p, void* stream);
/// The same kernels for SegmentGEMMWrapper.run: segments as the groups (m_indptr = seg_indptr),
/// weight_indices as b_index; errors name "SegmentGEMMWrapper.run" and "x".
void segment_gemm(const GroupedMmCudaParams& p, void* stream);

/// grouped_mm_fp8's kernel with DeepSeek's 128 x 128 block scales (p.a_block_scale,
/// p.b_block_scale: cutlass_fused_moe's use_deepseek_fp8_block_scale on its grouped route): e4m3
/// operands on the mma.sync kernel (k-major b), each 128-wide k block's fp32 dot product (two
/// 64-wide k tiles; e4m3 widened exactly to fp16, mma.sync's fp32 accumulation) promoted into the
/// sum as moe_fp8_block_accumulate(acc, a_scale, b_scale, part), one rounding to bf16 (the only
/// out_dtype); no alpha. Only where grouped_mm_fp8_block_scaled_takes(p), which cutlass_fused_moe's
/// route rule (moe::moe_grouped_eligible with e4m3 operands) implies; kInternal otherwise. The
/// CUTLASS path has no such promotion and is not tried.
void grouped_mm_fp8_block_scaled(const GroupedMmCudaParams& p, void* stream);
/// Whether grouped_mm_fp8_block_scaled can run p on the current device: e4m3 a and b, bf16 out,
/// the mma.sync kernel's layout (16-byte aligned rows, unit k stride, k-major b), an sm80+ device.
bool grouped_mm_fp8_block_scaled_takes(const GroupedMmCudaParams& p);

/// How many calls each path of these three ran since the process started: CUTLASS's sm90
/// grouped GEMM (on Hopper, grouped_gemm_cutlass.h), the mma.sync tensor-core
/// kernel, the CUDA-core kernel. For the tests, which check that a path they mean to test ran.
struct GroupedMmRoutes {
  uint64_t cutlass = 0, mma = 0, simple = 0;
};
GroupedMmRoutes grouped_mm_routes();

}  // namespace flashinfer::kernels::cuda
