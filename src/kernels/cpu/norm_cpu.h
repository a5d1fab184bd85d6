// CPU reference kernels for the norm ops: fp32 math, multithreaded over rows.
#pragma once

#include "kernels/norm_params.h"

namespace flashinfer::kernels::cpu {

void rmsnorm(const RmsNormParams& p);
void fused_add_rmsnorm(const FusedAddRmsNormParams& p);
void layernorm(const LayerNormParams& p);

}  // namespace flashinfer::kernels::cpu
