// CPU reference of the FP4 / MxInt4 trtllm MoE ops: exact dequantization, fp32 GEMMs of each
// local expert's routed rows only, the activation quantized as upstream's reference does.
#pragma once

#include "kernels/moe_fp4_params.h"

namespace flashinfer::kernels::cpu {

void trtllm_fp4_moe(const TrtllmFp4MoeParams& p);

}  // namespace flashinfer::kernels::cpu
