// CUDA launcher of trtllm_ragged_attention_deepseek (plain C++ header). Throws
// flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/ragged_attention_params.h"

namespace flashinfer::kernels::cuda {

/// Why the CUDA kernel cannot take `p` (nullptr: it can). Host-side.
const char* ragged_attention_unsupported(const RaggedAttentionParams& p);

/// Every pointer of `p` (index arrays and row_req included) is device memory.
void ragged_attention(const RaggedAttentionParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
