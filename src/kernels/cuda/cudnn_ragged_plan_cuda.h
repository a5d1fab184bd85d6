// CUDA launcher of cudnn_batch_prefill_with_kv_cache's ragged-call prepass
// (kernels/cudnn_ragged_plan.h; plain C++ header). Throws flashinfer::Error(kCuda) when the launch
// fails.
#pragma once

#include "kernels/cudnn_ragged_plan.h"

namespace flashinfer::kernels::cuda {

/// Fills p's cu_q, kv_start, kv_len and refuse from the call's lengths and batch offsets on
/// `stream`: one block, no host read, no allocation (a CUDA graph captures it). The block-table
/// plan kernel launched after it on the stream reads them.
void cudnn_ragged_plan(const CudnnRaggedPlan& p, void* stream);

}  // namespace flashinfer::kernels::cuda
