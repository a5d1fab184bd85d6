// CUDA launcher of allreduce_fusion (flashinfer.comm). Plain C++ header: callable from the API
// layer. Throws flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/comm_params.h"

namespace flashinfer::kernels::cuda {

/// One rank's call: a grid of the same size on every rank (from the token count, the group size
/// and the SM count), each block copying its token rows into this rank's slot, publishing the
/// call in every peer's flag table, waiting for every peer's, then summing the peers' rows in
/// rank order and running the pattern's epilogue (kernels/comm_rules.h, the CPU reference's
/// steps; the RMSNorm's sum of squares is a block reduction, a different order than the CPU's).
void allreduce_fusion(const AllReduceFusionParams& p, void* stream, bool enable_pdl, int sm_count);

/// The grid: the same for every call (its blocks' slots follow their call counts), small enough
/// that every rank's blocks fit on the device at once even when all ranks share one GPU (each
/// block waits for the same block of every peer).
int allreduce_fusion_blocks(int64_t tokens, int world_size, int sm_count);

/// Loads every allreduce_fusion / decode_cp_a2a_alltoall kernel into the current context
/// (comm_sync.cuh, preload_kernels): run before core/comm_abort.h's gated_collective_launch.
void preload_allreduce_fusion();
void preload_decode_cp_a2a_alltoall();

/// allreduce_fusion's MoE patterns 6 / 7: this rank's local value, one element a thread.
void moe_local_value(const MoeLocalParams& p, void* stream, int sm_count);

/// decode_cp_a2a_alltoall: three launches on the stream: this rank's inputs into its slot (all
/// blocks), the call published and every peer's awaited (one thread, release / acquire at
/// system scope), the outputs gathered from the peers' rows (all blocks, loads around the L1).
void decode_cp_a2a_alltoall(const DcpA2aParams& p, void* stream, bool enable_pdl, int sm_count);

}  // namespace flashinfer::kernels::cuda
