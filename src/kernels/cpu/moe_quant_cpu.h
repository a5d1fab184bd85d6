// CPU reference of the FP8 trtllm MoE ops: fp32 dequantization and accumulation, the rounding
// points of upstream's reference (docs/MOE.md); each local expert runs only its routed rows.
#pragma once

#include "kernels/moe_quant_params.h"

namespace flashinfer::kernels::cpu {

void trtllm_fp8_moe(const TrtllmFp8MoeParams& p);
void trtllm_gen_routing(const TrtllmGenRoutingParams& p);

}  // namespace flashinfer::kernels::cpu
