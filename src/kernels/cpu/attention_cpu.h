// CPU reference kernels for attention over a paged or ragged KV cache, the state merges of
// cascade attention and the paged-cache append: fp32 accumulation, tiled online softmax in base
// 2, OpenMP over (work item, kv head): each K/V tile is converted once for the whole GQA group.
#pragma once

#include "kernels/attention_params.h"
#include "kernels/page_append_params.h"

namespace flashinfer::kernels::cpu {

/// Runs every work item of p.work (partials to tmp_v/tmp_s), then the merge pass.
void batch_attention(const AttentionParams& p);

/// pos_encoding_mode inside attention, which only this CPU reference computes (the CUDA kernels
/// have no such term). mode 1, ROPE_LLAMA: q row i of a request rotated at kv_len - qo_len + i,
/// key j at j (halves rotated, frequency rope_rcp_scale * rope_rcp_theta^(2 (d mod D/2) / D));
/// with p.use_tensor_cores the rotated rows are rounded to their 16-bit dtypes, as upstream's
/// prefill kernel stores them back in shared memory. mode 2, ALIBI: the natural-log score is
/// sm_scale * q.k + alibi_slopes[h] * (j - i), i the query's index within its request; with a
/// soft cap c, c * tanh(sm_scale * (that) / c) (upstream applies sm_scale twice there).
struct PosEncoding {
  int32_t mode = 0;  // 0 none, 1 ROPE_LLAMA, 2 ALIBI
  float rope_rcp_scale = 1.0f;
  float rope_rcp_theta = 1e-4f;
  const float* alibi_slopes = nullptr;  // [Hq]
};
void batch_attention(const AttentionParams& p, const PosEncoding& pe);

/// Merges p.num_states states per (row, head) into v_out/s_out (see MergeParams).
void merge_states(const MergeParams& p);

/// Threads the CPU kernels use (OpenMP's team size).
int num_threads();

/// Copies the appended rows into their pages.
void append_paged_kv_cache(const AppendParams& p);

}  // namespace flashinfer::kernels::cpu
