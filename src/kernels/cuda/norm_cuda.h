// CUDA launchers for the norm ops. Plain C++ header: callable from the API layer, which never
// sees CUDA headers. Launchers throw flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/norm_params.h"

namespace flashinfer::kernels::cuda {

/// Launches on `stream` (a cudaStream_t). `enable_pdl` requests programmatic dependent launch
/// (honoured on sm90+ only).
void rmsnorm(const RmsNormParams& p, void* stream, bool enable_pdl);
void fused_add_rmsnorm(const FusedAddRmsNormParams& p, void* stream, bool enable_pdl);
void layernorm(const LayerNormParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
