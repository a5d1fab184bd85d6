// Test oracle (plain C++ header): fused_topk_deepseek's first CUDA kernel (a thread a token, the
// CPU reference's loops), which ran correctly on an H200 (session 31), for comparison with the
// library's warp-per-token kernel on the same parameters (device buffers, as
// kernels::cuda::deepseek_routing takes them). Built only when CUDA is compiled. Asynchronous on
// `stream`.
#pragma once

#include "kernels/moe_params.h"

namespace flashinfer::testing {

void oracle_deepseek_routing(const kernels::DeepSeekRoutingParams& p, void* stream);

/// The trtllm MoE ops' routing kernel to session 62 (a thread a token), against the library's
/// warp-per-token kernels::cuda::trtllm_route on the same parameters.
void oracle_trtllm_route(const kernels::TrtllmMoeParams& b, int32_t* ids, float* w, void* stream);

}  // namespace flashinfer::testing
