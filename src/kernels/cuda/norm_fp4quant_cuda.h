// CUDA launcher of the fused RMSNorm + FP4 quantization (flashinfer.cute_dsl; upstream runs it on
// sm100+ only, and the API layer refuses older GPUs by upstream's rule). Plain C++ header.
#pragma once

#include "kernels/norm_fp4quant_params.h"

namespace flashinfer::kernels::cuda {

/// kernels::cpu::rmsnorm_fp4quant on the GPU: a block per row; the sum of squares as a block
/// reduction (another order than the CPU's), the residual written back, then a thread per scale
/// block (the CPU's norm_fp4_block: the same codes for the same fp32 values).
void rmsnorm_fp4quant(const NormFp4Params& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
