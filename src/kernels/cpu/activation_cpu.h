// CPU reference kernels for the gated activations: fp32 math, multithreaded over rows.
#pragma once

#include "kernels/activation_params.h"

namespace flashinfer::kernels::cpu {

void act_and_mul(const ActAndMulParams& p);

}  // namespace flashinfer::kernels::cpu
