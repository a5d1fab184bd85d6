// CPU reference of trtllm_fmha_v2_prefill (fp32 accumulation, OpenMP over (query row, KV head)).
#pragma once

#include "kernels/fmha_v2_prefill_params.h"

namespace flashinfer::kernels::cpu {

void fmha_v2_prefill(const FmhaV2PrefillParams& p);

}  // namespace flashinfer::kernels::cpu
