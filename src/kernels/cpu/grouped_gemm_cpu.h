// CPU reference of the grouped GEMMs (one generic driver for every variant).
#pragma once

#include "kernels/grouped_gemm_params.h"

namespace flashinfer::kernels::cpu {

/// The reference of GroupedGemmParams: per problem, both operands dequantized exactly to fp32
/// (element times its block scales, as upstream's test references dequantize), fp32 products
/// summed by OpenBLAS sgemm, alpha applied in fp32, one rounding to the output dtype.
void grouped_gemm(const GroupedGemmParams& p);

}  // namespace flashinfer::kernels::cpu
