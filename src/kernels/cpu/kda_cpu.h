// CPU reference of Kimi delta attention (flashinfer.kda.recurrent_kda).
#pragma once

#include "kernels/kda_params.h"

namespace flashinfer::kernels::cpu {

/// The recurrence of kernels/kda_params.h token by token in fp32 (sums over k sequential); value
/// heads in parallel, the sequences of a head in order. The API layer has checked every index.
void recurrent_kda(const KdaParams& p);

}  // namespace flashinfer::kernels::cpu
