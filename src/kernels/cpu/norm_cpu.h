// CPU reference kernels for the norm ops: fp32 math, multithreaded over rows.
#pragma once

#include "kernels/norm_params.h"

namespace flashinfer::kernels::cpu {

void rmsnorm(const RmsNormParams& p);

}  // namespace flashinfer::kernels::cpu
