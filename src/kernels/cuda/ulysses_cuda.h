// CUDA launcher of the Ulysses all-to-all (flashinfer.comm.ulysses). Plain C++ header: callable
// from the API layer. Throws flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/ulysses_params.h"

namespace flashinfer::kernels::cuda {

/// One rank's kernel on `stream`: ulysses_a2a_kernel (p.blocks() blocks of 512 threads, the same
/// grid on every rank; each block passes a barrier with the same block of every peer, pushes its
/// rows into the peers' staging buffers with 16-byte stores where the rows allow, and passes a
/// second barrier). The caller then copies this rank's staging buffer into p.out on the same
/// stream (outside the launch gate of core/comm_abort.h, which holds the waiting kernel only).
void ulysses_a2a(const UlyssesA2aParams& p, void* stream);

/// Loads ulysses_a2a's kernels into the current context (comm_sync.cuh, preload_kernels).
void preload_ulysses_a2a();

}  // namespace flashinfer::kernels::cuda
