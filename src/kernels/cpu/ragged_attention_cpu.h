// CPU reference of trtllm_ragged_attention_deepseek (fp32 accumulation, OpenMP over query rows).
#pragma once

#include "kernels/ragged_attention_params.h"

namespace flashinfer::kernels::cpu {

void ragged_attention(const RaggedAttentionParams& p);

}  // namespace flashinfer::kernels::cpu
