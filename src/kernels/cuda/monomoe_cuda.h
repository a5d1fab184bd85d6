// Private: mono_moe's CUDA kernels (src/kernels/cuda/monomoe_cuda.cu), kernels/monomoe_params.h.
#pragma once

#include "kernels/monomoe_params.h"

namespace flashinfer::kernels::cuda {

void mono_moe(const MonoMoeParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
