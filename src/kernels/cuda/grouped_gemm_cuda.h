// CUDA launcher of grouped_mm_bf16 (plain C++ header).
#pragma once

#include "kernels/grouped_gemm_params.h"

namespace flashinfer::kernels::cuda {

/// One output per thread (16x16 blocks over [cum_m, n]); each row finds its group by a binary
/// search of m_indptr on the device (rows outside every group are not written); fp32 sums over k
/// in order. bf16 operands; bf16, fp16 or fp32 output. Throws flashinfer::Error(kCuda) when the
/// launch fails.
void grouped_mm_bf16(const GroupedMmBf16CudaParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
