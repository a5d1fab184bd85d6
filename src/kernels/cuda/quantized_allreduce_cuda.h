// CUDA launcher of quantized_all_reduce (flashinfer.comm.quantized_allreduce). Plain C++
// header: callable from the API layer. Throws flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/quantized_allreduce_params.h"

namespace flashinfer::kernels::cuda {

/// One rank's call, upstream's two-shot design in one kernel: each block quantizes its strides'
/// groups into this rank's buffer, meets the same block of every peer (flags at system scope),
/// reduces this rank's stripe of each stride from every peer's FP8 and requantizes it, meets
/// them again, fills the other stripes from their owners' requantized FP8, and meets them a
/// third time (so no peer still reads this rank's buffer when the next call writes it).
void quantized_all_reduce(const QuantizedAllReduceParams& p, void* stream);

/// Loads quantized_all_reduce's kernels into the current context (comm_sync.cuh,
/// preload_kernels).
void preload_quantized_all_reduce();

/// The grid: one block per stride of block_size * world_size elements, at most p.max_blocks
/// (max_num_blocks capped by the limit the group agreed on: every rank's blocks resident at once,
/// also where ranks share a GPU, since each block waits for its peers') and
/// ArBufferLayout::kMaxBlocks. The same on every rank: each block meets the same block of every
/// peer.
int quantized_all_reduce_blocks(int64_t numel, int64_t block_size, int world_size, int max_blocks);

}  // namespace flashinfer::kernels::cuda
