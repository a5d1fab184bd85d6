// CUDA launchers of the MoE all-to-all (MoeAlltoAll). Plain C++ header: callable from the API
// layer. Throws flashinfer::Error(kCuda) when a launch fails. docs/COMM.md, "MoE all-to-all".
#pragma once

#include "kernels/moe_a2a_params.h"

namespace flashinfer::kernels::cuda {

/// Four launches on the stream: the call numbered and every active peer's done value from the
/// previous combine awaited (one block), routing (one block: each token's target ranks, duplicates
/// and inactive ranks dropped, its row on each target numbered in token order by warp ballots and a
/// block-wide carry), the rows copied into the targets' receive regions (a block a token), the
/// counts and EPLB statistics written to every active peer, the call published (release, system
/// scope) and every active peer's awaited (one block; a trap after 100 s).
void moe_a2a_dispatch(const MoeA2aDispatchParams& p, void* stream);

/// Four launches: the payload's valid rows into this rank's combine region (cast to fp8 e4m3
/// for low precision), the call published and awaited (one block), a block a token summing its
/// slots' rows from the peers' regions (16-byte loads around the L1) in moe_a2a_tree_sum's
/// order, then this rank's done value published (one block).
void moe_a2a_combine(const MoeA2aCombineParams& p, void* stream);

/// Load the kernels moe_a2a_dispatch / moe_a2a_combine(p) may launch into the current context
/// (comm_sync.cuh, preload_kernels): a rank without tokens skips the copy / sum kernels its peers
/// launch, so they may be first launched while a peer's kernel waits.
void preload_moe_a2a_dispatch();
void preload_moe_a2a_combine(const MoeA2aCombineParams& p);

/// Rows past each source's count: every slot invalid_id (a thread a slot).
void moe_a2a_sanitize_expert_ids(const MoeA2aSanitizeParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
