// CUDA launcher of the block-table decode calls' device-side plan (kernels/block_table_plan.h;
// plain C++ header). Throws flashinfer::Error(kCuda) when the launch fails.
#pragma once

#include "kernels/block_table_plan.h"

namespace flashinfer::kernels::cuda {

/// Fills p's output arrays from seq_lens and block_tables on `stream`: a block per request, no
/// host read, no allocation (a CUDA graph captures it). Launched without PDL, so the attention
/// kernel after it (whose blocks read the plan after pdl_wait()) sees the whole plan.
void block_table_plan(const BlockTablePlan& p, void* stream);

}  // namespace flashinfer::kernels::cuda
