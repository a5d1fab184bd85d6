// CUDA launcher of rope_quantize_fp8 (plain C++ header).
#pragma once

#include "kernels/rope_quantize_params.h"

namespace flashinfer::kernels::cuda {

/// Every pointer of `p` is device memory. Throws Error(kCuda) when the launch fails.
void rope_quantize(const RopeQuantizeParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
