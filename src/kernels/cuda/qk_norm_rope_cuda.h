// CUDA launcher for fused_qk_rmsnorm_rope (upstream runs it on sm80+). Plain C++ header:
// callable from the API layer. Throws flashinfer::Error(kCuda) when a launch or copy fails.
#pragma once

#include "kernels/cpu/qk_norm_rope_cpu.h"  // QkNormRopeParams, qk_rope_freq

namespace flashinfer::kernels::cuda {

/// kernels::cpu::fused_qk_rmsnorm_rope with one thread per (token, q | k | v part): the CPU's
/// sequential fp32 steps with IEEE-rounded intrinsics, the rotation frequencies from the CPU's
/// own host table (cpu::qk_rope_freq); sin/cos are CUDA's sinf/cosf (within their documented
/// ulp bounds of the C library's), the one place the results may differ in the last bit.
void fused_qk_rmsnorm_rope(const QkNormRopeParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
