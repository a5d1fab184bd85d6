// CPU reference of the fused norm + fp8 quantization ops: fp32 math, OpenMP over rows.
#pragma once

#include "kernels/norm_params.h"

namespace flashinfer::kernels::cpu {

void norm_quant(const NormQuantParams& p);

}  // namespace flashinfer::kernels::cpu
