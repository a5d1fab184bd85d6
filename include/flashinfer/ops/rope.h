// Rotary position embeddings (FlashInfer module flashinfer.rope).
//
// Shared conventions:
//   q  [nnz, num_q_heads, head_dim], k [nnz, num_k_heads, head_dim]: fp16, bf16 or fp32, same
//      dtype and device, any strides.
//   rotary_dim  the leading dims of each head that are rotated (default: head_dim); must be
//      even and <= head_dim; the remaining dims pass through unchanged.
//   interleave  false (default): NeoX / half-split layout, pair (x[i], x[i + rotary_dim/2]);
//      true: GPT-J layout, pair (x[2i], x[2i+1]). Each pair rotates by angle pos * f_i:
//        x'_a = x_a cos - x_b sin,   x'_b = x_b cos + x_a sin
//      with f_i = rope_theta^(-2i / rotary_dim) / rope_scale for plain RoPE.
//   Angles are computed in fp64 and rounded to fp32; the rotation is fp32 math.
//   Index tensors (indptr, offsets, pos_ids, positions) are int32 or int64 on q's device.
//   The non-inplace ops return (q_rope, k_rope), new contiguous tensors shaped like q and k; the
//   _inplace ops write the rotated values into q and k themselves (which must not overlap) and
//   return nothing. Calls on CUDA tensors run on the current stream.
//   Index values are validated for CPU tensors only (reading device memory would synchronize
//   the stream); on CUDA a malformed indptr gives wrong positions but never an out-of-bounds
//   access, and a position outside the cos/sin cache turns that token's rotated dims into NaN.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "flashinfer/tensor.h"

namespace flashinfer {

/// RoPE on a ragged batch: segment i holds tokens indptr[i] .. indptr[i+1] - 1 and token j of it
/// sits at position offsets[i] + (j - indptr[i]).
///   indptr [batch + 1] (indptr[0] == 0, non-decreasing, indptr[batch] == nnz); offsets [batch].
std::pair<Tensor, Tensor> apply_rope(const Tensor& q, const Tensor& k, const Tensor& indptr,
                                     const Tensor& offsets,
                                     std::optional<int64_t> rotary_dim = std::nullopt,
                                     bool interleave = false, double rope_scale = 1,
                                     double rope_theta = 1e4);

/// apply_rope in place: writes q and k.
void apply_rope_inplace(const Tensor& q, const Tensor& k, const Tensor& indptr,
                        const Tensor& offsets, std::optional<int64_t> rotary_dim = std::nullopt,
                        bool interleave = false, double rope_scale = 1, double rope_theta = 1e4);

/// RoPE with an explicit position per token: pos_ids [nnz].
std::pair<Tensor, Tensor> apply_rope_pos_ids(const Tensor& q, const Tensor& k,
                                             const Tensor& pos_ids,
                                             std::optional<int64_t> rotary_dim = std::nullopt,
                                             bool interleave = false, double rope_scale = 1,
                                             double rope_theta = 1e4);

/// apply_rope_pos_ids in place: writes q and k.
void apply_rope_pos_ids_inplace(const Tensor& q, const Tensor& k, const Tensor& pos_ids,
                                std::optional<int64_t> rotary_dim = std::nullopt,
                                bool interleave = false, double rope_scale = 1,
                                double rope_theta = 1e4);

/// Llama 3.1 RoPE on a ragged batch (indptr/offsets as apply_rope). Each frequency f is
/// blended between f / rope_scale (long wavelengths) and f (short ones):
///   s = clamp(f * old_context_len / (2 pi (high_freq_factor - low_freq_factor))
///             - low_freq_factor / (high_freq_factor - low_freq_factor), 0, 1)
///   f' = (1 - s) * f / rope_scale + s * f
/// Requires 0 < low_freq_factor < high_freq_factor and old_context_len > 0.
std::pair<Tensor, Tensor> apply_llama31_rope(const Tensor& q, const Tensor& k, const Tensor& indptr,
                                             const Tensor& offsets,
                                             std::optional<int64_t> rotary_dim = std::nullopt,
                                             bool interleave = false, double rope_scale = 8,
                                             double rope_theta = 5e5, double low_freq_factor = 1,
                                             double high_freq_factor = 4,
                                             int64_t old_context_len = 8192);

/// apply_llama31_rope in place: writes q and k.
void apply_llama31_rope_inplace(const Tensor& q, const Tensor& k, const Tensor& indptr,
                                const Tensor& offsets,
                                std::optional<int64_t> rotary_dim = std::nullopt,
                                bool interleave = false, double rope_scale = 8,
                                double rope_theta = 5e5, double low_freq_factor = 1,
                                double high_freq_factor = 4, int64_t old_context_len = 8192);

/// Llama 3.1 RoPE with an explicit position per token: pos_ids [nnz].
std::pair<Tensor, Tensor> apply_llama31_rope_pos_ids(
    const Tensor& q, const Tensor& k, const Tensor& pos_ids,
    std::optional<int64_t> rotary_dim = std::nullopt, bool interleave = false,
    double rope_scale = 8, double rope_theta = 5e5, double low_freq_factor = 1,
    double high_freq_factor = 4, int64_t old_context_len = 8192);

/// apply_llama31_rope_pos_ids in place: writes q and k.
void apply_llama31_rope_pos_ids_inplace(const Tensor& q, const Tensor& k, const Tensor& pos_ids,
                                        std::optional<int64_t> rotary_dim = std::nullopt,
                                        bool interleave = false, double rope_scale = 8,
                                        double rope_theta = 5e5, double low_freq_factor = 1,
                                        double high_freq_factor = 4,
                                        int64_t old_context_len = 8192);

/// RoPE from a precomputed table (the SGLang / vLLM convention).
///   positions     [nnz], each in [0, max_pos).
///   query         [nnz, num_q_heads * head_size] (or [nnz, num_q_heads, head_size]).
///   key           [nnz, num_k_heads * head_size] (or 3-D likewise).
///   cos_sin_cache fp32 [max_pos, rotary_dim]: row p is [cos(p f_0..) | sin(p f_0..)];
///                 rotary_dim (its width) must be even and <= head_size.
///   is_neox       true (default): half-split pairs; false: interleaved pairs.
/// Returns (query_out, key_out) shaped like query and key.
std::pair<Tensor, Tensor> apply_rope_with_cos_sin_cache(const Tensor& positions,
                                                        const Tensor& query, const Tensor& key,
                                                        int64_t head_size,
                                                        const Tensor& cos_sin_cache,
                                                        bool is_neox = true);

/// apply_rope_with_cos_sin_cache in place: writes query and key.
void apply_rope_with_cos_sin_cache_inplace(const Tensor& positions, const Tensor& query,
                                           const Tensor& key, int64_t head_size,
                                           const Tensor& cos_sin_cache, bool is_neox = true);

}  // namespace flashinfer
