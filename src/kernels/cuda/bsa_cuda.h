// CUDA launcher of the block-sparse attention forwards (SM120 blk64, SM100 blk128 and blk64:
// upstream runs each on its own compute capabilities, and the API layer refuses other GPUs by
// their rules). Plain C++ header.
#pragma once

#include "kernels/bsa_params.h"

namespace flashinfer::kernels::cuda {

/// kernels::cpu::bsa_attn_fwd on the GPU: a warp per query row (dim / 32 head-dim values a lane),
/// the listed blocks' keys in the kernel's slot order with an online softmax, the dot products
/// as warp butterflies. Block ids outside [0, NK) and counts outside [0, W] (checked on the host
/// for CPU tensors) are skipped.
void bsa_attn_fwd(const BsaParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
