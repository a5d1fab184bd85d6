// CUDA launchers of the grouped GEMM (grouped_mm_bf16, SegmentGEMMWrapper.run; plain C++ header).
#pragma once

#include "kernels/grouped_gemm_params.h"

namespace flashinfer::kernels::cuda {

/// One output per thread (16x16 blocks over [cum_m, n]); each row finds its group by a binary
/// search of m_indptr on the device (rows outside every group are not written) and multiplies
/// the weight b_index[group] (or weight group); fp32 sums over k in order, one rounding.
/// bf16/fp16/fp8 operands (p.in_dtype); bf16, fp16 or fp32 output. Throws
/// flashinfer::Error(kUnsupported) past the grid's row limit, Error(kCuda) when the launch fails.
void grouped_mm_bf16(const GroupedMmCudaParams& p, void* stream);
/// The same kernel for SegmentGEMMWrapper.run: segments as the groups (m_indptr = seg_indptr),
/// weight_indices as b_index; errors name "SegmentGEMMWrapper.run" and "x".
void segment_gemm(const GroupedMmCudaParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
