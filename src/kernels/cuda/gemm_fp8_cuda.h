// CUDA launcher of the block-scaled FP8 GEMMs (plain C++ header).
#pragma once

#include "kernels/gemm_fp8_params.h"

namespace flashinfer::kernels::cuda {

/// A tiled fp32-accumulating kernel (16x16 outputs per block, 32-wide K steps), scaling each K
/// block's partial sums as the CPU reference does. fp8 x fp8, bf16 x bf16 or fp16 x fp16 operands;
/// bf16, fp16 or fp32 output. Throws flashinfer::Error(kCuda) naming `op` when the launch fails.
void block_scaled_gemm(const BlockScaledGemmParams& p, void* stream, const char* op, bool pdl);

}  // namespace flashinfer::kernels::cuda
