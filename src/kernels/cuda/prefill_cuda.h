// CUDA launcher of the tensor-core (mma.sync, sm80+) prefill attention kernels (plain C++
// header). They serve fp16/bf16 q, KV and output of one dtype: the FA2 kernel
// (prefill_kernel.cuh) for head dims 64/64, 128/128, 256/256 and 192/128, the first-draft kernel
// (JIT-compiled) for other equal multiples of 16 up to 256; batch_attention falls back to the
// CUDA-core kernel otherwise.
#pragma once

#include "kernels/attention_params.h"

namespace flashinfer::kernels::cuda {

bool prefill_supported(const AttentionParams& p);
/// Whether the FA2 kernel itself (not the first-draft kernel) takes p on `device`: its built
/// head-dim pairs with blocks that fit the device's shared memory, and p's dtypes, variant,
/// sinks and scale. The planner asks it for decode calls it may put on tensor cores
/// (decode_tensor_cores_auto in api/attention_common.cpp) before any current device is set.
bool prefill_fa2_takes(const AttentionParams& p, int device);
void batch_prefill(const AttentionParams& p, void* stream, bool enable_pdl);

/// Whether this build has the Hopper prefill kernel (CUTLASS's headers found: prefill_sm90.h);
/// the planner sizes sm_90 plans for its blocks only then.
bool prefill_sm90_built();

/// Blocks an SM of the Hopper kernel's tall blocks where they would run `p`'s work items of more
/// than 64 packed rows on `device` (prefill_sm90_block_warpgroups for such items, the switches
/// included); 0 where they would not (another device, dims, dtypes or variant; a build without
/// the kernel). For the one-shot plans' grid budget (api::one_shot_plan).
int prefill_sm90_tall_blocks_per_sm(const AttentionParams& p, int device);

/// The FA2 kernel's variant bits for p (kPrefillSoftCap, kPrefillCustomMask of prefill_shape.h).
int prefill_variant(const AttentionParams& p);

}  // namespace flashinfer::kernels::cuda
