// Private: the CPU reference of mono_moe (flashinfer.fused_moe.monomoe), kernels/monomoe_params.h.
#pragma once

#include "kernels/monomoe_params.h"

namespace flashinfer::kernels::cpu {

void mono_moe(const MonoMoeParams& p);

}  // namespace flashinfer::kernels::cpu
