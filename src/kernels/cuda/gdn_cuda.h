// CUDA launcher of the gated delta rule (flashinfer.gdn_decode, flashinfer.gdn_prefill; upstream
// runs them on sm90+). Plain C++ header: callable from the API layer. Throws
// flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include <cstdint>

#include "kernels/gdn_fused_params.h"
#include "kernels/gdn_params.h"

namespace flashinfer::kernels::cuda {

/// The largest head dim K the kernel takes: a warp holds a state row, 8 values a lane.
inline constexpr int64_t kGdnMaxHeadDimK = 256;

/// kernels::cpu::gated_delta_rule on the GPU: a warp per state row (sequence, head, v), the row
/// in registers across the tokens, sums over k by warp shuffles (another order than the CPU's,
/// so results agree to fp32 rounding). Indices and ranges the CPU path checks on the host are
/// guarded here on the device instead: a sequence whose cu_seqlens range is invalid is skipped,
/// a read slot outside the pool writes NaN outputs and no state, and out-of-range write slots,
/// step slots and checkpoint rows are not written.
void gated_delta_rule(const GdnParams& p, void* stream, bool enable_pdl);

/// kernels::cpu::gdn_fused_decode_prologue on the GPU, three kernels: the b/a GEMV (a block per
/// request and 32 columns, 8 slices of the hidden dim a column summed in a fixed order, so
/// results agree with the CPU's to fp32 rounding), the conv outputs (a thread per request and
/// channel, the pool only read) and the window write-back (the same threads; a request whose
/// slot a later request shares writes nothing, so the last one's window wins as on the CPU). A
/// request whose slot is outside the pool gets a NaN conv row and leaves the pool alone.
void gdn_fused_decode_prologue(const GdnFusedPrologueParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
