// CUDA launchers for the gated activations. Plain C++ header; launchers throw
// flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/activation_params.h"

namespace flashinfer::kernels::cuda {

/// Launches on `stream` (a cudaStream_t); `enable_pdl` requests programmatic dependent launch.
void act_and_mul(const ActAndMulParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
