// CPU GEMM backend: inputs converted exactly to fp32 tiles, multiplied by OpenBLAS sgemm
// (fp32 accumulation), rounded once to the output dtype.
#pragma once

#include "kernels/gemm_params.h"

namespace flashinfer::kernels::cpu {

void gemm(const GemmParams& p);
void mm_fp4(const Fp4GemmParams& p);

}  // namespace flashinfer::kernels::cpu
