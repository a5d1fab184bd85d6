// CUDA launcher for chain_speculative_sampling (upstream runs it on sm75+). Plain C++ header:
// callable from the API layer. Throws flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/spec_sampling_params.h"

namespace flashinfer::kernels::cuda {

/// kernels::cpu::chain_speculative_sampling without its id validation (the caller checks the
/// draft ids on the host first): one block per request, the same Philox draws and the same fp32
/// sums in the same order (kernels/spec_sampling_rules.h), so both pick the same tokens.
void chain_speculative_sampling(const ChainSpecParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
