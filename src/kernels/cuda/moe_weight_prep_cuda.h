// CUDA launchers for the SM90 mixed-input MoE weight interleaves (upstream's Hopper weight
// preparation, called by serving engines on the GPU). Plain C++ header: callable from the API
// layer. Throws flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/cpu/moe_weight_prep_cpu.h"  // the parameter structs

namespace flashinfer::kernels::cuda {

/// kernels::cpu::sm90_interleave_weights with one thread per (expert, row pair, K partition,
/// lane): the same index maps and bit moves, so bit-exact.
void sm90_interleave_weights(const Sm90WeightInterleaveParams& p, void* stream);
/// kernels::cpu::sm90_interleave_scales with one thread per output element.
void sm90_interleave_scales(const Sm90ScaleInterleaveParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
