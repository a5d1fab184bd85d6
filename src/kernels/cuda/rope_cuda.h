// CUDA launchers for RoPE. Plain C++ header; launchers throw flashinfer::Error(kCuda) when a
// launch fails.
#pragma once

#include "kernels/rope_params.h"

namespace flashinfer::kernels::cuda {

/// Pairs whose frequencies the host passes to the kernel (rotary_dim <= 512 with computed angles;
/// the API refuses more on CUDA).
inline constexpr int kRopeMaxPairs = 256;

/// Launches on `stream` (a cudaStream_t). Positions outside the cos/sin cache are not read: the
/// rotated dims of that token become NaN (the host cannot check device-resident positions
/// without synchronizing); so do computed angles |pos * f| >= kRopeMaxAngle (rope_rules.h: 3e9
/// rad, past any int32 position at a frequency <= 1), which the CPU reference refuses.
void apply_rope(const RopeParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
