// CPU references of the MiniMax sparse attention selection ops (flashinfer.msa_ops).
#pragma once

#include "kernels/msa_params.h"

namespace flashinfer::kernels::cpu {

/// Upstream's count-rank rule per (query, head): forced tiles, then the middle tiles by their
/// score key (higher first; ties to the lower tile), the union sorted ascending, -1 padded.
void msa_topk_select(const MsaTopkParams& p);

/// Per-tile maxima of the unscaled q . k logits (fp32 sums over the head dim in order), -inf
/// where a tile has no visible key; with reduce_heads the max over the heads.
void msa_proxy_score(const MsaProxyParams& p);

/// Sparse attention over the listed tiles: the softmax in fp64 (scores scale * q . k in fp32
/// sums), out = sum p_j v_j times v_global_scale, rounded once; an empty set gives 0 and -inf.
void msa_sparse_attention(const MsaAttnParams& p);

}  // namespace flashinfer::kernels::cpu
