// CPU reference of the gated delta rule (flashinfer.gdn_decode, flashinfer.gdn_prefill).
#pragma once

#include "kernels/gdn_fused_params.h"
#include "kernels/gdn_params.h"

namespace flashinfer::kernels::cpu {

/// The recurrence of kernels/gdn_params.h, token by token in fp32 (sums over k sequential), per
/// (sequence, state head) in parallel. The API layer has checked every index and range.
void gated_delta_rule(const GdnParams& p);

/// chunk_gated_delta_rule's operand preparation (kernels/gdn_params.h, GdnPrefillPrepParams):
/// the q / k L2 norms (sums over i in order) and the gate transforms.
void gdn_prefill_prepare(const GdnPrefillPrepParams& p);

/// The fused decode step's prologue (kernels/gdn_fused_params.h): the b/a GEMV with sums over i
/// in order, then every request's conv row from the pool as it was before the call (requests
/// sharing a slot read the same row; the last one's window is written back, as index_copy_).
void gdn_fused_decode_prologue(const GdnFusedPrologueParams& p);

}  // namespace flashinfer::kernels::cpu
