// CUDA launcher of the Ulysses all-to-all (flashinfer.comm.ulysses). Plain C++ header: callable
// from the API layer. Throws flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/ulysses_params.h"

namespace flashinfer::kernels::cuda {

/// One rank's call on `stream`: ulysses_a2a_kernel (p.blocks() blocks of 512 threads, the same
/// grid on every rank; each block passes a barrier with the same block of every peer, pushes its
/// rows into the peers' staging buffers with 16-byte stores where the rows allow, and passes a
/// second barrier), then this rank's staging buffer copied into p.out.
void ulysses_a2a(const UlyssesA2aParams& p, void* stream);

/// Loads ulysses_a2a's kernels into the current context (comm_sync.cuh, preload_kernels).
void preload_ulysses_a2a();

}  // namespace flashinfer::kernels::cuda
