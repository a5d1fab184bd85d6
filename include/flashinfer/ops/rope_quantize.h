// flashinfer.rope's fused RoPE + FP8 quantization for MLA / GQA / MHA attention inputs:
// rope_quantize_fp8 and its MLA-layout name mla_rope_quantize_fp8.
#pragma once

#include <optional>
#include <string_view>
#include <tuple>

#include "flashinfer/dtype.h"
#include "flashinfer/tensor.h"

namespace flashinfer {

/// q_rope [nnz, Hq, rope_dim], k_rope [nnz, Hk, rope_dim] (GQA/MHA) or [nnz, rope_dim] (MLA),
/// fp16 or bf16 (one dtype); q_nope [nnz, Hq, nq], k_nope shaped like k_rope with its own width
/// (None: zero width). cos_sin_cache [max_pos, rope_dim] fp32 (cos in the first half, sin in the
/// second), pos_ids [nnz] int32/int64 (each < max_pos). RoPE (NeoX halves with is_neox, else
/// interleaved pairs) is applied to the rope parts in fp32, then every part is multiplied by
/// quant_scale_q (queries) or quant_scale_kv (keys) and rounded to quantize_dtype (fp8 e4m3fn or
/// e5m2; None: the first given output's dtype, else e4m3fn) with round-to-nearest-even and
/// saturation to the finite range (CUDA's satfinite conversion, as upstream's kernel). Returns
/// (q_rope_out, k_rope_out, q_nope_out, k_nope_out): the given outputs (same shapes, fp8) or new
/// tensors. backend "cuda" (default) or "cutile" (upstream's cuTile kernel: interleaved layout
/// and 2-D keys only, refused otherwise as upstream does); both compute the same values here.
std::tuple<Tensor, Tensor, Tensor, Tensor> rope_quantize_fp8(
    const Tensor& q_rope, const Tensor& k_rope, std::optional<Tensor> q_nope,
    std::optional<Tensor> k_nope, const Tensor& cos_sin_cache, const Tensor& pos_ids,
    bool is_neox = true, std::optional<DType> quantize_dtype = std::nullopt,
    double quant_scale_q = 1.0, double quant_scale_kv = 1.0,
    std::optional<Tensor> q_rope_out = std::nullopt,
    std::optional<Tensor> k_rope_out = std::nullopt,
    std::optional<Tensor> q_nope_out = std::nullopt,
    std::optional<Tensor> k_nope_out = std::nullopt, bool enable_pdl = false,
    std::string_view backend = "cuda");

/// rope_quantize_fp8 with the MLA layout: k_rope [nnz, rope_dim], k_nope [nnz, kv_lora_rank]
/// (2-D, one latent key head). q_nope / k_nope may be None, as upstream forwards them to
/// rope_quantize_fp8 (zero-width nope parts).
std::tuple<Tensor, Tensor, Tensor, Tensor> mla_rope_quantize_fp8(
    const Tensor& q_rope, const Tensor& k_rope, std::optional<Tensor> q_nope,
    std::optional<Tensor> k_nope, const Tensor& cos_sin_cache, const Tensor& pos_ids,
    bool is_neox = true, std::optional<DType> quantize_dtype = std::nullopt,
    double quant_scale_q = 1.0, double quant_scale_kv = 1.0,
    std::optional<Tensor> q_rope_out = std::nullopt,
    std::optional<Tensor> k_rope_out = std::nullopt,
    std::optional<Tensor> q_nope_out = std::nullopt,
    std::optional<Tensor> k_nope_out = std::nullopt, bool enable_pdl = false);

}  // namespace flashinfer
