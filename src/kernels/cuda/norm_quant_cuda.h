// CUDA launcher for the fused norm + fp8 quantization ops (plain C++ header).
#pragma once

#include "kernels/norm_params.h"

namespace flashinfer::kernels::cuda {

/// One block per row; throws flashinfer::Error(kCuda) when the launch fails. p.scale points to
/// device memory.
void norm_quant(const NormQuantParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
