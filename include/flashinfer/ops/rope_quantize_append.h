// flashinfer.rope.rope_quantize_fp8_append_paged_kv_cache: rope_quantize_fp8 plus the append of
// the quantized K (and V) to a paged FP8 cache. CPU only in this library.
#pragma once

#include <optional>
#include <string_view>
#include <tuple>

#include "flashinfer/ops/page.h"
#include "flashinfer/tensor.h"

namespace flashinfer {

/// Queries: q_rope_out = fp8(rope(q_rope) * quant_scale_q), q_nope_out = fp8(q_nope *
/// quant_scale_q), exactly rope_quantize_fp8's. Keys (and values) go to the cache instead of
/// being returned. Token i lands in page kv_indices[kv_indptr[batch_indices[i]] + positions[i] /
/// page_size], slot positions[i] % page_size:
///   GQA/MHA (k_rope [nnz, Hkv, rope_dim]): paged_kv_cache = (k_cache, v_cache), each
///     [pages, page_size, Hkv, head_dim] (HND: [pages, Hkv, page_size, head_dim]) in the fp8
///     dtype, head_dim = rope_dim + no_rope_dim; k_cache gets (fp8(rope(k_rope) * s_kv),
///     fp8(k_nope * s_kv)) (rotary part first), v_cache gets fp8(v * s_kv), v [nnz, Hkv, head_dim];
///   MLA (k_rope [nnz, rope_dim]): paged_kv_cache = (ckv_cache [pages, page_size, no_rope_dim],
///     kpe_cache [pages, page_size, rope_dim]); ckv gets fp8(k_nope * s_kv), kpe fp8(rope(k_rope)
///     * s_kv); v must be None.
/// fp8 conversion rounds to nearest even and saturates (rope_quantize_fp8's rule). Returns
/// (q_rope_out, q_nope_out). Slots other than the appended ones are not touched.
std::tuple<Tensor, Tensor> rope_quantize_fp8_append_paged_kv_cache(
    const Tensor& q_rope, const Tensor& k_rope, std::optional<Tensor> q_nope,
    std::optional<Tensor> k_nope, std::optional<Tensor> v, const Tensor& cos_sin_cache,
    const Tensor& pos_ids, const PagedKVCache& paged_kv_cache, const Tensor& kv_indices,
    const Tensor& kv_indptr, const Tensor& batch_indices, const Tensor& positions,
    bool is_neox = true, std::optional<DType> quantize_dtype = std::nullopt,
    double quant_scale_q = 1.0, double quant_scale_kv = 1.0, int64_t page_size = 16,
    std::string_view kv_layout = "NHD", std::optional<Tensor> q_rope_out = std::nullopt,
    std::optional<Tensor> q_nope_out = std::nullopt, bool enable_pdl = false);

}  // namespace flashinfer
