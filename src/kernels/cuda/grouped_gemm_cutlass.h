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

/// grouped_mm_fp8_block_scaled's `p` (cutlass_fused_moe's DeepSeek FP8 block-scale GEMMs) through
/// CUTLASS's sm90 grouped GEMM with blockwise scaling (grouped_gemm_cutlass_fp8_block.cu), when
/// FLASHINFER_MOE_FP8_BLOCK_CUTLASS=1 (opt-in until a GPU has run it against the mma.sync kernel;
/// read at each call) and cutlass_grouped_block_misfit takes it. False, having run nothing,
/// otherwise (or as cutlass_grouped_mm declines); the caller then runs the mma.sync kernel.
bool cutlass_grouped_mm_fp8_block_scaled(const GroupedMmCudaParams& p, void* stream,
                                         const char* op);

}  // namespace flashinfer::kernels::cuda
