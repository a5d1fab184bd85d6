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
/// chunk_gated_delta_rule's calls go to the chunked tensor-core kernel first
/// (gated_delta_rule_chunked), the rest to the recurrent one.
void gated_delta_rule(const GdnParams& p, void* stream, bool enable_pdl);

/// The prefill in upstream's chunked (WY) form on tensor cores (gdn_chunk_cuda.cu): runs the call
/// and returns true when gdn_chunk_shape.h's chunked_refusal takes it (K = V = 64 or 128, fp16 /
/// bf16, aligned rows, sm_80+; FLASHINFER_GDN_CHUNKED=0 refuses every call), else false having
/// run nothing. Results agree with the CPU's recurrence to upstream's tolerances (operands are
/// rounded to the io dtype where they enter an MMA), not to fp32 rounding.
bool gated_delta_rule_chunked(const GdnParams& p, void* stream, bool enable_pdl);

/// Calls gated_delta_rule_chunked took since the process started (tests tell with it which
/// kernel ran).
uint64_t gdn_chunked_launches();

/// kernels::cpu::gdn_prefill_prepare on the GPU: a warp per q / k head row for the L2 norm (sums
/// by shuffles: agreement with the CPU to fp32 rounding before the io rounding), a thread per
/// (token, head) for the gates.
void gdn_prefill_prepare(const GdnPrefillPrepParams& p, void* stream, bool enable_pdl);

/// kernels::cpu::gdn_fused_decode_prologue on the GPU, three kernels: the b/a GEMV (a block per
/// request and 32 columns, 8 slices of the hidden dim a column summed in a fixed order, so
/// results agree with the CPU's to fp32 rounding), the conv outputs (a thread per request and
/// channel, the pool only read) and the window write-back (the same threads; a request whose
/// slot a later request shares writes nothing, so the last one's window wins as on the CPU). A
/// request whose slot is outside the pool gets a NaN conv row and leaves the pool alone.
void gdn_fused_decode_prologue(const GdnFusedPrologueParams& p, void* stream, bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
