// CUDA launchers for DeepSeek MLA attention over the paged latent cache (plain C++ header).
// Launchers throw flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/mla_params.h"

namespace flashinfer::kernels::cuda {

/// Why the CUDA MLA kernel cannot take `p` (nullptr: it can). Host-side, no device access.
const char* mla_attention_unsupported(const MlaAttentionParams& p);

/// MLA attention (split along the KV axis with a merge pass when the grid is small). Every
/// pointer of `p`, the index arrays and row_req included, is device memory.
void mla_attention(const MlaAttentionParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
