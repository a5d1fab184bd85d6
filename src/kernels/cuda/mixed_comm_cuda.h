// CUDA launcher of run_mixed_comm (flashinfer.comm.mixed_comm). Plain C++ header: callable from
// the API layer. Throws flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/mixed_comm_params.h"

namespace flashinfer::kernels::cuda {

/// Three launches on the stream: this rank's x_in into its slot (all blocks), the call published
/// and every peer's awaited (one thread, release / acquire at system scope), every output
/// element from the peers' slots (all blocks, loads around the L1; the CPU reference's
/// arithmetic, kernels/mixed_comm_params.h, so its bits).
void mixed_comm(const MixedCommParams& p, void* stream, bool enable_pdl, int sm_count);

/// Loads mixed_comm's kernels into the current context (comm_sync.cuh, preload_kernels).
void preload_mixed_comm();

}  // namespace flashinfer::kernels::cuda
