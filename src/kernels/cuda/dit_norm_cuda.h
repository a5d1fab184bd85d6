// CUDA launcher for the fused DiT LayerNorm ops (upstream runs them on any GPU it supports).
// Plain C++ header: callable from the API layer. Throws flashinfer::Error(kCuda) when a launch
// fails.
#pragma once

#include "kernels/dit_norm_params.h"

namespace flashinfer::kernels::cuda {

/// Bit-exact with kernels::cpu::dit_layernorm: one thread per row running the CPU's sequential
/// fp32 steps with IEEE-rounded intrinsics (fma where the CPU has std::fma, nothing fused
/// elsewhere). Correctness first: a row's statistics are not split across threads.
void dit_layernorm(const DitNormParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
