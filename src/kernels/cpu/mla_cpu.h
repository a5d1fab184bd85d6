// CPU reference kernels for DeepSeek MLA: attention over the paged latent cache (fp32
// accumulation, OpenMP over query rows; each cache row is converted once for all heads), the
// latent-cache append and concat_mla_k (bit-exact copies).
#pragma once

#include "kernels/mla_params.h"

namespace flashinfer::kernels::cpu {

void mla_attention(const MlaAttentionParams& p);
void append_paged_mla_kv_cache(const MlaAppendParams& p);
void concat_mla_k(const ConcatMlaKParams& p);

}  // namespace flashinfer::kernels::cpu
