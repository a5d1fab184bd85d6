// CUDA launcher of Kimi delta attention (flashinfer.kda.recurrent_kda). Plain C++ header.
#pragma once

#include "kernels/kda_params.h"

namespace flashinfer::kernels::cuda {

/// kernels::cpu::recurrent_kda on the GPU: a warp per state row (sequence, value head, v) with
/// the row's K values in registers (K <= 128: 4 a lane) across the tokens, the per-channel decays
/// computed by each lane for its channels, sums over k as warp butterflies (another order than
/// the CPU's). Slots outside the pool (checked on the host for CPU tensors) read zeros and are
/// not written; invalid cu_seqlens ranges are skipped.
void recurrent_kda(const KdaParams& p, void* stream, bool enable_pdl);

/// kernels::cpu::fused_kda_decode on the GPU: a block per (row, head): the conv of the head's
/// channels into shared memory, a warp per quarter of the state rows (in registers), the gated
/// RMSNorm as a block reduction. The same bf16 rounding points as the CPU; sums in another
/// order. A slot past the pool (refused on the host for CPU tensors) is a null row.
void fused_kda_decode(const FusedKdaParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
