// CUDA launcher of trtllm_ragged_attention_deepseek (plain C++ header). Throws
// flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/ragged_attention_params.h"

namespace flashinfer::kernels::cuda {

/// Why the CUDA kernel cannot take `p` (nullptr: it can). Host-side.
const char* ragged_attention_unsupported(const RaggedAttentionParams& p);

/// Whether the FA2 prefill kernel can take `p` (q, K, V and output of one 16-bit dtype, a head-dim
/// pair it is built for, 16-byte aligned rows, no softmax statistics, sm80+). Host-side; reads
/// only p's dtypes, dims, strides and data pointers.
bool ragged_fa2_eligible(const RaggedAttentionParams& p);

/// prefill_sm90_tall_blocks_per_sm for the FA2 path's call of `p` on `device`: blocks an SM of the
/// Hopper kernel's tall blocks where they would run its items of more than 64 packed rows, else 0.
int ragged_hopper_blocks_per_sm(const RaggedAttentionParams& p, int device);

/// Every pointer of `p` (index arrays and row_req included) is device memory. With fa2_work set,
/// the FA2 prefill kernel runs the work items; otherwise the warp-per-row kernel.
void ragged_attention(const RaggedAttentionParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
