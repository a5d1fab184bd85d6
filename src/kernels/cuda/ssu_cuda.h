// CUDA launcher of the Mamba selective state update (flashinfer.mamba.selective_state_update).
// Plain C++ header: callable from the API layer. Throws flashinfer::Error(kCuda) when a launch
// fails.
#pragma once

#include <cstdint>

#include "kernels/ssu_params.h"

namespace flashinfer::kernels::cuda {

/// The largest dstate the kernel takes: a warp holds a state row, 8 values a lane.
inline constexpr int64_t kSsuMaxDstate = 256;

/// kernels::cpu::selective_state_update on the GPU: a warp per state row (sequence, head, d), the
/// row in registers across the tokens, each token's B and C rows in shared memory for the
/// block's 8 rows, the dot with C as a warp butterfly (another order than the CPU's sequential
/// sum, so outputs agree to fp32 rounding; stored states round the same fp32 values the same
/// way, stochastic fp16 rounding included). Slots the CPU path checks on the host are guarded
/// here: a read slot outside the cache (and not padding) writes NaN outputs and no state; write
/// slots, intermediate entries and cu_seqlens ranges out of bounds are skipped.
void selective_state_update(const SsuParams& p, void* stream, bool enable_pdl);

/// kernels::cpu::checkpointing_ssu on the GPU: ssu_kernel's layout (a warp per state row), the
/// ring history replayed through the row in registers (each history row's B in shared memory)
/// before the new tokens; the ring appends and the flush store as the CPU's (same rounding of
/// the same fp32 values). A slot outside the cache, a ring_start outside the ring or more
/// history than the window (refused on the host for CPU tensors) writes NaN outputs and nothing
/// else.
void checkpointing_ssu(const CkptSsuParams& c, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
