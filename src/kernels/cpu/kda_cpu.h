// CPU reference of Kimi delta attention (flashinfer.kda.recurrent_kda).
#pragma once

#include "kernels/kda_params.h"

namespace flashinfer::kernels::cpu {

/// The recurrence of kernels/kda_params.h token by token in fp32 (sums over k sequential); value
/// heads in parallel, the sequences of a head in order. The API layer has checked every index.
void recurrent_kda(const KdaParams& p);

/// fused_kda_decode (kernels/kda_params.h, FusedKdaParams) in fp32 with its bf16 rounding
/// points; heads in parallel, rows in order.
void fused_kda_decode(const FusedKdaParams& p);

}  // namespace flashinfer::kernels::cpu
