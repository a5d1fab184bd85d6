// CPU reference of the gated delta rule (flashinfer.gdn_decode, flashinfer.gdn_prefill).
#pragma once

#include "kernels/gdn_params.h"

namespace flashinfer::kernels::cpu {

/// The recurrence of kernels/gdn_params.h, token by token in fp32 (sums over k sequential), per
/// (sequence, state head) in parallel. The API layer has checked every index and range.
void gated_delta_rule(const GdnParams& p);

}  // namespace flashinfer::kernels::cpu
