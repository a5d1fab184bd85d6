// CPU reference of the fused RMSNorm + FP4 quantization (flashinfer.cute_dsl).
#pragma once

#include "kernels/norm_fp4quant_params.h"

namespace flashinfer::kernels::cpu {

/// Per row: h (fp32; input + residual, the residual rewritten with h rounded), the sum of
/// squares of h sequential in fp32, y = (h rounded * rstd) * weight, then norm_fp4_block per
/// block. Rows in parallel.
void rmsnorm_fp4quant(const NormFp4Params& p);

}  // namespace flashinfer::kernels::cpu
