// CUDA launchers of the mHC ops (flashinfer.mhc). Plain C++ header: callable from the API layer.
// Throws flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/mhc_params.h"

namespace flashinfer::kernels::cuda {

/// kernels::cpu::mhc_post on the GPU: a thread per 8 hidden elements of a token (128-bit loads
/// and stores where H % 8 == 0), the same fused multiply-adds: bit-identical with the CPU.
void mhc_post(const MhcPostParams& p, void* stream, bool enable_pdl);

/// kernels::cpu::mhc_pre_big_fuse on the GPU: a block per token; the prenorm form's sum of
/// squares as a block reduction (another order than the CPU's: fp32 rounding), one thread's
/// mixes and Sinkhorn (the CPU's expressions), then layer_input over 8-element vectors.
void mhc_pre_big_fuse(const MhcPreParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
