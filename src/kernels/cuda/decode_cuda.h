// CUDA launchers for attention (plain C++ header). batch_attention runs the work items of a
// plan with the CUDA-core decode kernel (any query tile shape) or the tensor-core prefill
// kernel, then the merge pass of split-KV. Launchers throw flashinfer::Error(kCuda) when a
// launch fails.
#pragma once

#include <cstdint>

#include "core/env_switch.h"
#include "kernels/attention_params.h"

namespace flashinfer::kernels::cuda {

void batch_attention(const AttentionParams& p, void* stream, bool enable_pdl);

/// Whether every row of q, o, K and V starts on a 16-byte boundary, as the kernels' 16-byte
/// copies need (batch_attention refuses the call otherwise). Host-side; for callers that pick
/// another kernel when it does not hold.
bool attention_rows_aligned(const AttentionParams& p);

/// Streaming multiprocessors of `device` (for the plan's grid size).
int sm_count(int device);

/// The decode kernel's variant bits for p (kDecodeSoftCap, kDecodeMask of
/// attention_decode_kernel.cuh).
int decode_variant(const AttentionParams& p);

/// Blocks of the decode kernel that `device` runs at once per SM for the configuration of p
/// (dtypes, head dims, heads, max_work_rows, variant): from the instance's registers and the
/// block shape's threads and shared memory (kernels/occupancy.h). The planner's max_grid is this
/// times the SM count.
int decode_blocks_per_sm(const AttentionParams& p, int device);

/// FLASHINFER_DECODE_TENSOR_CORES=0: decode calls planned with use_tensor_cores=False stay on the
/// CUDA-core kernel whatever their group (api::decode_tensor_cores_auto). Read at each plan, so
/// that one GPU can time or check one kernel against the other.
inline bool decode_tensor_cores_off_by_env() {
  return detail::env_switch_is("FLASHINFER_DECODE_TENSOR_CORES", "0");
}

/// Launches of the CUDA-core kernel (batch_decode_kernel, AOT or JIT) by batch_attention since
/// the process started: tests tell with it which kernel a call ran on.
uint64_t batch_decode_launches();

/// Test seam: while set, batch_attention runs `f` in place of its kernels (the merge pass still
/// follows). The tests install the first-draft kernels, kept as oracles, this way.
using AttentionKernelOverride = void (*)(const AttentionParams& p, void* stream, bool enable_pdl);
void set_attention_kernel_override(AttentionKernelOverride f);

}  // namespace flashinfer::kernels::cuda
