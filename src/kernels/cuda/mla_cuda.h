// CUDA launchers for DeepSeek MLA: attention over the paged latent cache, the latent-cache append
// and concat_mla_k (plain C++ header).
// Launchers throw flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/mla_params.h"

namespace flashinfer::kernels::cuda {

/// Why the CUDA MLA kernel cannot take `p` (nullptr: it can). Host-side, no device access.
const char* mla_attention_unsupported(const MlaAttentionParams& p);

/// MLA attention (split along the KV axis with a merge pass when the grid is small). Every
/// pointer of `p`, the index arrays and row_req included, is device memory.
void mla_attention(const MlaAttentionParams& p, void* stream, bool enable_pdl);

/// How many NoPE calls (head_dim_kpe 0) mla_attention ran on the tensor-core kernel in this
/// process (tests assert which kernel ran).
long long mla_mma_nope_launches();
/// Likewise for calls with ckv_scale_arr (per-token ckv scales).
long long mla_mma_scale_arr_launches();

/// Bit-exact row copies; the index arrays of `p` are device memory.
void append_paged_mla_kv_cache(const MlaAppendParams& p, void* stream);
/// Bit-exact copies (heads in grid.y: at most 65535, checked by the API).
void concat_mla_k(const ConcatMlaKParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
