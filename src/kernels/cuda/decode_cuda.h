// CUDA launchers for attention (plain C++ header). batch_attention runs the work items of a
// plan with the CUDA-core kernel (decode, and any query tile shape), then the merge pass of
// split-KV. Launchers throw flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/attention_params.h"

namespace flashinfer::kernels::cuda {

void batch_attention(const AttentionParams& p, void* stream, bool enable_pdl);

/// Streaming multiprocessors of `device` (for the plan's grid size).
int sm_count(int device);

}  // namespace flashinfer::kernels::cuda
