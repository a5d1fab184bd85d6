// CUDA launchers for the state merges, the paged-cache append and get_batch_indices_positions
// (plain C++ header).
#pragma once

#include "kernels/attention_params.h"
#include "kernels/page_append_params.h"

namespace flashinfer::kernels::cuda {

void merge_states(const MergeParams& p, void* stream);
void append_paged_kv_cache(const AppendParams& p, void* stream);
void batch_indices_positions(const BatchIndicesPositionsParams& p, void* stream);
void seq_lens(const SeqLensParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
