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
/// kernels::cpu::humming_prepare in two launches (one block per expert for the scale range,
/// then one thread per 32-element block for its offset and payload), the CPU's steps
/// (kernels/moe_weight_prep_rules.h) and rewrite table, so bit-exact. Needs p.rewrite_table
/// (humming_rewrite_table()'s bytes) and p.low (one int32 per expert) in device memory.
void humming_prepare(const HummingPrepParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
