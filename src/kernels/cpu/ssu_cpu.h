// CPU reference of the Mamba selective state update (flashinfer.mamba.selective_state_update).
#pragma once

#include "kernels/ssu_params.h"

namespace flashinfer::kernels::cpu {

/// The update of kernels/ssu_params.h in fp32, token by token, sums over dstate sequential;
/// heads in parallel, the sequences of a head in order (requests that share a slot then meet in
/// one order every call). The API layer has checked every index and range.
void selective_state_update(const SsuParams& p);

/// checkpointing_ssu (kernels/ssu_params.h, CkptSsuParams) in fp32: the history replayed and the
/// new tokens run token by token, heads in parallel, the rows of a head in order.
void checkpointing_ssu(const CkptSsuParams& c);

}  // namespace flashinfer::kernels::cpu
