// CPU reference of upstream's task-scheduled attention (flashinfer.attention.prims_ts).
#pragma once

#include "kernels/prims_ts_params.h"

namespace flashinfer::kernels::cpu {

/// For each request, query and qo head: the softmax of q.k * bmm1_scale over the visible keys
/// (prims_ts_params.h), times V, times bmm2_scale, rounded once to o_dtype (fp8 saturating). A
/// query that sees no key gets exact zeros (upstream's block-sparse rule). fp32 throughout: the
/// maximum first, then the exponentials and sums in key order. (request, head) pairs in parallel.
void prims_ts_attention(const TsAttentionParams& p);

}  // namespace flashinfer::kernels::cpu
