// CPU reference of the fused DiT gate/residual LayerNorm ops (bf16 output).
#pragma once

#include "kernels/dit_norm_params.h"

namespace flashinfer::kernels::cpu {

void dit_layernorm(const DitNormParams& p);

}  // namespace flashinfer::kernels::cpu
