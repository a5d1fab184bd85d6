// CPU reference kernels for attention over a paged or ragged KV cache, the state merges of
// cascade attention and the paged-cache append: fp32 accumulation, tiled online softmax in base
// 2, OpenMP over (work item, kv head): each K/V tile is converted once for the whole GQA group.
#pragma once

#include "kernels/attention_params.h"

namespace flashinfer::kernels::cpu {

/// Runs every work item of p.work (partials to tmp_v/tmp_s), then the merge pass.
void batch_attention(const AttentionParams& p);

/// Merges p.num_states states per (row, head) into v_out/s_out (see MergeParams).
void merge_states(const MergeParams& p);

/// Threads the CPU kernels use (OpenMP's team size).
int num_threads();

/// Copies the appended rows into their pages.
void append_paged_kv_cache(const AppendParams& p);

}  // namespace flashinfer::kernels::cpu
