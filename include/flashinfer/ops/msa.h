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

/// msa_proxy_score on NVFP4 q and k: q_fp4 uint8 [total_q, Hq, 64] and k_fp4 [total_k, Hkv, 64]
/// (or pages [pages, Hkv, 128, 64]) of packed e2m1 (element 2i in the low nibble), q_scale /
/// k_scale uint8 e4m3 block scales (16 elements each) in the 128x4 layout of 8 columns (rows: q
/// token * Hq + head; flat k token * Hkv + kv head; paged k (page * Hkv + kv head) * 128 + row),
/// q_global_scale / k_global_scale the dequantization multipliers (1 / the quantizer's global
/// scales), applied to each tile's maximum as upstream's kernel does.
Tensor msa_proxy_score_fp4(const Tensor& q_fp4, const Tensor& k_fp4, const Tensor& q_scale,
                           const Tensor& k_scale, double q_global_scale, double k_global_scale,
                           const Tensor& cu_seqlens_q,
                           std::optional<Tensor> cu_seqlens_k = std::nullopt,
                           std::optional<Tensor> page_table = std::nullopt,
                           std::optional<Tensor> seqused_k = std::nullopt, bool causal = true,
                           std::optional<int64_t> max_seqlen_q = std::nullopt,
                           std::optional<int64_t> max_k_tiles = std::nullopt,
                           std::optional<Tensor> output = std::nullopt, bool reduce_heads = false,
                           std::optional<Value> q_offset = std::nullopt);

/// The sparse attention ops' result, recorded as upstream returns it: `out` alone, (out, lse) with
/// return_softmax_lse, or (out, lse, lse_t) with return_temperature_lse.
struct MsaAttentionOutput {
  Tensor out, lse, lse_t;
  operator Tensor() const { return out; }  // NOLINT: implicit like upstream's return value
};
Value to_value(const MsaAttentionOutput& r);

/// Sparse prefill attention over the KV tiles each query selected: row qi (of request b, local
/// i) and head h attend the keys of tiles q2k_indices[h / G, qi, :] (int32 [Hkv, total_q,
/// topk], topk in {4, 8, 16, 32}; the list ends at its first negative entry; a repeated tile
/// counts again), keys j < seqlen_k and, when causal, j <= off + i (off = q_offset[b] or
/// seqlen_k - seqlen_q). Scores softmax_scale (default 128^-0.5) * q . k; out = softmax . v (times
/// v_global_scale), q's dtype [total_q, Hq, 128]; no visible key: 0 and lse -inf. lse natural
/// log, fp32 [total_q, Hq]; lse_t = ln sum exp(lse_temperature_scale * score). q bf16 / fp16;
/// k, v of q's dtype or float8_e4m3fn (NVFP4 K/V: refused, not implemented), flat with
/// cu_seqlens_k or pages of 128 with page_table and seqused_k (cu_seqlens_k wins when both).
MsaAttentionOutput msa_sparse_attention(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q2k_indices,
    const Tensor& cu_seqlens_q, std::optional<Tensor> cu_seqlens_k = std::nullopt,
    bool causal = false, std::optional<double> softmax_scale = std::nullopt,
    std::optional<Tensor> page_table = std::nullopt, std::optional<Tensor> seqused_k = std::nullopt,
    bool return_softmax_lse = false, std::optional<Tensor> k_scale = std::nullopt,
    std::optional<Tensor> v_scale = std::nullopt,
    std::optional<double> k_global_scale = std::nullopt,
    std::optional<double> v_global_scale = std::nullopt,
    std::optional<Value> q_offset = std::nullopt, bool return_temperature_lse = false,
    double lse_temperature_scale = 1.0);

/// Sparse decode attention: B requests of seqlen_q query rows each (q [B * seqlen_q, Hq, 128] bf16
/// / fp16 / float8_e4m3fn, fp8 computing and returning bf16), the same rule as msa_sparse_attention
/// with causal on by default and the rows right-aligned to each request's keys; flat keys need
/// cu_seqlens_k, paged ones page_table and seqused_k. Returns out, or (out, lse) with
/// return_softmax_lse. partial_dtype and force_fused choose upstream's split schedule (validated;
/// the result here is the unsplit one).
MsaAttentionOutput msa_sparse_decode_attention(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q2k_indices,
    std::optional<Tensor> page_table = std::nullopt, std::optional<Tensor> seqused_k = std::nullopt,
    std::optional<Tensor> cu_seqlens_k = std::nullopt, int64_t seqlen_q = 1, bool causal = true,
    std::optional<double> softmax_scale = std::nullopt, bool return_softmax_lse = false,
    std::optional<Tensor> k_scale = std::nullopt, std::optional<Tensor> v_scale = std::nullopt,
    std::optional<double> k_global_scale = std::nullopt,
    std::optional<double> v_global_scale = std::nullopt,
    std::optional<Value> q_offset = std::nullopt, std::optional<DType> partial_dtype = std::nullopt,
    std::optional<bool> force_fused = std::nullopt);

}  // namespace flashinfer
