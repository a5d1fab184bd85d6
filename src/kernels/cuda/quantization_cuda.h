// CUDA launchers for the quantization ops. Plain C++ header: callable from the API layer, which
// never sees CUDA headers. Launchers throw flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/quantization_params.h"

namespace flashinfer::kernels::cuda {

/// Bit-exact with kernels::cpu::fp4_quantize (same fp32 operations, IEEE-rounded intrinsics).
void fp4_quantize(const Fp4QuantizeParams& p, void* stream, bool enable_pdl);
void mxfp8_quantize(const Mxfp8QuantizeParams& p, void* stream, bool enable_pdl);
void block_scale_interleave(const BlockScaleInterleaveParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
