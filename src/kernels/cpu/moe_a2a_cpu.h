// CPU reference of the MoE all-to-all (flashinfer.comm.trtllm_moe_alltoall): each rank a thread
// of one process, every rank's workspace row in one host allocation. docs/COMM.md, "MoE
// all-to-all".
#pragma once

#include "kernels/moe_a2a_params.h"

namespace flashinfer::kernels::cpu {

/// Once every active peer is done with the previous combine: this rank's tokens into their
/// target ranks' receive regions (slots in token order: token t takes the next free row of
/// each distinct active rank its experts live on), the counts and
/// EPLB statistics into every active peer, the call published (release), every active peer's
/// awaited (acquire; an Error after two minutes: a rank that never came).
void moe_a2a_dispatch(const MoeA2aDispatchParams& p);

/// The payload's valid rows into this rank's combine region (fp8 e4m3 for low precision), the
/// call published and every active peer's awaited, then each local token's sum over its slots
/// in moe_a2a_tree_sum's order, rounded once to out_dtype; then its done value published.
void moe_a2a_combine(const MoeA2aCombineParams& p);

/// Rows past each source's count: every slot invalid_id.
void moe_a2a_sanitize_expert_ids(const MoeA2aSanitizeParams& p);

}  // namespace flashinfer::kernels::cpu
