// CUTLASS's sm90 grouped GEMM as the Hopper path of grouped_mm_bf16, grouped_mm_fp8 and
// SegmentGEMMWrapper.run (kernels/cuda/grouped_gemm_cutlass*.cu, built only when CMake finds
// CUTLASS's headers: FLASHINFER_WITH_CUTLASS=1). Plain C++ header.
#pragma once

#include "kernels/grouped_gemm_params.h"

namespace flashinfer::kernels::cuda {

/// Runs `p` on `stream` (a cudaStream_t) on the current device through CUTLASS's sm90 grouped
/// GEMM (TMA + wgmma, fp32 accumulation, alpha, one rounding to bf16), m_indptr and b_index read
/// on the device. False, having run nothing, when the call does not fit (cutlass_grouped_misfit:
/// an sm_90 device, bf16 x bf16 or e4m3 x e4m3 operands, a bf16 output, k-major 16-byte rows, one
/// alpha or none), when
/// FLASHINFER_GROUPED_MM_CUTLASS=0 is set (to compare with the mma.sync kernel), when the stream
/// is being captured and its scratch would have to grow (a call on a stream that never ran this
/// path), or when CUTLASS declines the arguments; the caller then runs the grouped kernel. kCuda
/// Error naming `op` when a CUDA or CUTLASS call fails after that.
bool cutlass_grouped_mm(const GroupedMmCudaParams& p, void* stream, const char* op);

}  // namespace flashinfer::kernels::cuda
