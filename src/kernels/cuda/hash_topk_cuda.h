// CUDA launcher for hash_topk (DeepSeek-V4 hash routing; upstream runs it on sm80+). Plain C++
// header: callable from the API layer. Throws flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/moe_params.h"

namespace flashinfer::kernels::cuda {

/// kernels::cpu::hash_topk without its id validation (the caller checks the ids on the host
/// first): one thread per token, the same fp32 operations in the same order (sqrt and the
/// division IEEE-rounded; exp/log1p within CUDA's documented ulp bounds).
void hash_topk(const HashTopkParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
