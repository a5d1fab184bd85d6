// MiniMax sparse attention's selection ops (flashinfer.msa_ops): per-KV-tile proxy scores of the
// queries and the top-16 tile selection over them. Upstream runs them on SM120 / SM121 only
// (CuTe-DSL kernels) and refuses other GPUs by name; here they have exact CPU references (so
// recordings replay anywhere) and no CUDA kernel yet. docs/ATTENTION.md, "MiniMax sparse
// attention: tile scores and selection"; facts in docs/upstream-facts/msa_ops.md.
#pragma once

#include <cstdint>
#include <optional>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// Top-16 KV tiles per (query, head) from max_score fp32 [H, P, S] (msa_proxy_score's layout):
/// the forced tiles [0, fb) and [n - fe, n) (n = num_valid_pages: an int in (0, P], or an int32
/// [S] tensor clamped to [0, P]; default P) plus the best of the rest (higher scores first, ties
/// to the lower tile; -inf tiles are candidates too), sorted ascending, padded with -1. Returns
/// int32 [S, H, 16] (`output` when given). topk must be 16.
Tensor msa_topk_select(const Tensor& max_score, int64_t topk,
                       std::optional<Value> num_valid_pages = std::nullopt,
                       std::optional<Tensor> output = std::nullopt, int64_t force_begin_blocks = 0,
                       int64_t force_end_blocks = 0);

/// Per-tile proxy scores: out[h, t, cu_q[b] + i] = max over keys j of tile t (keys [128 t,
/// 128 t + 128)) visible to query i of dot(q[cu_q[b] + i, h], k_b[j, h / G]) in fp32, unscaled;
/// -inf where no key of the tile is visible. Visible: j < seqlen_k, and with `causal` j <= off +
/// i, off = q_offset[b] (an int, or an int32 [B] tensor) or seqlen_k - seqlen_q. q [total_q, Hq,
/// 128] bf16 / fp16; k flat [total_k, Hkv, 128] with cu_seqlens_k, or paged [pages, Hkv, 128,
/// 128] with page_table [B, max_pages] and seqused_k [B] (int32); k of q's dtype or
/// float8_e4m3fn. Returns fp32 [Hq, max_k_tiles, total_q], or [1, max_k_tiles, total_q] with
/// reduce_heads (the max over heads). max_seqlen_q / max_k_tiles default to the batch's.
Tensor msa_proxy_score(const Tensor& q, const Tensor& k, const Tensor& cu_seqlens_q,
                       std::optional<Tensor> cu_seqlens_k = std::nullopt,
                       std::optional<Tensor> page_table = std::nullopt,
                       std::optional<Tensor> seqused_k = std::nullopt, bool causal = true,
                       std::optional<int64_t> max_seqlen_q = std::nullopt,
                       std::optional<int64_t> max_k_tiles = std::nullopt,
                       std::optional<Tensor> output = std::nullopt, bool reduce_heads = false,
                       std::optional<Value> q_offset = std::nullopt);

}  // namespace flashinfer
