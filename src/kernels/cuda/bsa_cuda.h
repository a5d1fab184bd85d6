// CUDA launcher of the SM120 block-sparse attention forward (upstream runs it on compute
// capability 12.x only, and the API layer refuses other GPUs by its rule). Plain C++ header.
#pragma once

#include "kernels/bsa_params.h"

namespace flashinfer::kernels::cuda {

/// kernels::cpu::bsa_attn_blk64_fwd on the GPU: a warp per query row (4 head-dim values a lane),
/// the listed blocks' keys in the kernel's slot order with an online softmax, the dot products
/// as warp butterflies. Block ids outside [0, NK) and counts outside [0, W] (checked on the host
/// for CPU tensors) are skipped.
void bsa_attn_blk64_fwd(const BsaParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
