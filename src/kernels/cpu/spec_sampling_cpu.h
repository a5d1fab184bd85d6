// CPU reference of chain_speculative_sampling (see flashinfer/ops/sampling.h for the algorithm).
#pragma once

#include "kernels/spec_sampling_params.h"

namespace flashinfer::kernels::cpu {

void chain_speculative_sampling(const ChainSpecParams& p);

}  // namespace flashinfer::kernels::cpu
