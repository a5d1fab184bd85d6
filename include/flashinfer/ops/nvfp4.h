// NVFP4 / MXFP8 grouped and fused quantizers, weight shuffles and the NVFP4 KV-cache quantizers
// (flashinfer.quantization.fp4_quantization, flashinfer.quantization.fp8_quantization and
// flashinfer.activation). CPU reference only (host tensors); docs/GEMM_AND_QUANTIZATION.md
// gives the upstream facts each follows.
//
// The NVFP4 block math is fp4_quantize's (flashinfer/ops/quantization.h): blocks of 16 along K,
//   sf = e4m3_satfinite(gs * amax / 6),  q = e2m1((x * gs) / float(sf))  (a block whose sf is 0
//   saturates; an all-zero block gives e2m1(x * 0): kernels/nvfp4_rules.h, nvfp4_code).
// The grouped outputs are upstream's permuted views: the bytes are laid out group-major
// ([L, M, K/2] data, [L, round_up(M, 128), round_up(K/16, 4)] 128x4-swizzled scales) and the
// returned tensors are views with the group as the last dimension.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>

#include "flashinfer/dtype.h"
#include "flashinfer/ops/page.h"          // PagedKVCache
#include "flashinfer/ops/quantization.h"  // nvfp4_4over6_unset
#include "flashinfer/ops/sampling.h"      // ScalarOrTensor
#include "flashinfer/tensor.h"

namespace flashinfer {

/// silu(gate) * up then NVFP4 quantization, in one op (fp4_quantization).
///   input  [M, 2K] fp16/bf16, gate half first: y = silu(input[:, :K]) * input[:, K:] computed
///          in fp32 and rounded to the input dtype, then quantized as fp4_quantize(y,
///          global_scale, sf_vec_size, sf_use_ue8m0=False, is_sf_swizzled_layout,
///          is_sf_8x4_layout) does. K % sf_vec_size == 0; sf_vec_size 16.
///   global_scale  fp32 [1].
/// Returns (x_q uint8 [M, K/2], sf uint8 2-D as fp4_quantize returns it).
std::tuple<Tensor, Tensor> silu_and_mul_nvfp4_quantize(
    const Tensor& input, const Tensor& global_scale, int64_t sf_vec_size = 16,
    bool is_sf_swizzled_layout = true, bool is_sf_8x4_layout = false,
    std::optional<bool> enable_pdl = std::nullopt,
    const Value& nvfp4_4over6 = nvfp4_4over6_unset());

/// Masked grouped silu-and-mul + NVFP4 quantization (flashinfer.activation).
///   a            [L, M, 2K] fp16/bf16 (gate half first, as silu_and_mul_nvfp4_quantize).
///   mask         int32 [L]: rows [0, mask[l]) of group l are quantized (0 <= mask[l] <= M,
///                checked for a host mask; a device mask is read on the device only, as upstream
///                reads it, and each entry clamped to [0, M] there).
///   a_global_sf  fp32 [L]: group l's global scale.
/// Every tensor on a's device (the CPU reference, or the CUDA kernel).
/// Returns (x_q uint8 [M, K/2, L] view of [L, M, K/2] bytes, sf float8_e4m3fn
/// [32, 4, rm, 4, rk, L] view of [L, rm, rk, 32, 4, 4] bytes, rm = ceil(M/128),
/// rk = ceil(K/64)). Upstream leaves rows >= mask[l] and the scale padding unwritten (torch.empty);
/// here they are zero.
/// nvfp4_4over6 (upstream 0.7.4): resolved and run as fp4_quantize's (ops/quantization.h: the
/// CPU reference takes the recipe, CUDA refuses it), as on the next two ops; the KV-cache append
/// below refuses it (its recipe differs).
std::tuple<Tensor, Tensor> silu_and_mul_scaled_nvfp4_experts_quantize(
    const Tensor& a, const Tensor& mask, const Tensor& a_global_sf,
    const Value& nvfp4_4over6 = nvfp4_4over6_unset());

/// Masked grouped NVFP4 quantization for the masked grouped GEMM (fp4_quantization): as
/// silu_and_mul_scaled_nvfp4_experts_quantize without the activation; a [L, M, K] fp16/bf16.
std::tuple<Tensor, Tensor> scaled_fp4_grouped_quantize(
    const Tensor& a, const Tensor& mask, const Tensor& a_global_sf,
    const Value& nvfp4_4over6 = nvfp4_4over6_unset());

/// Batched NVFP4 quantization: a [B, M, K] fp16, bf16 or e4m3 (fp4_quantize's fp8 path),
/// a_global_sf fp32 [1] shared by all batches or [M] (row r's for every batch item, upstream's
/// SFScale[rowIdx]), sf_vec_size 16 (upstream: "32 not supported yet"). Returns (uint8 [B, M, K/2],
/// uint8 [B, round_up(M, 128) * round_up(K/16, 4)]: each batch's scales in the 128x4 layout).
std::tuple<Tensor, Tensor> nvfp4_batched_quantize(const Tensor& a, const Tensor& a_global_sf,
                                                  int64_t sf_vec_size = 16,
                                                  const Value& nvfp4_4over6 = nvfp4_4over6_unset());

/// Masked grouped MXFP8 quantization (fp8_quantization): a [B, M, K] fp16/bf16, K % 32 == 0,
/// mask int32 [B] (as silu_and_mul_scaled_nvfp4_experts_quantize's). K is zero-padded to padded_K =
/// round_up(K, 128); blocks of 32 with ue8m0 scales as mxfp8_quantize. Returns (x_q float8_e4m3fn
/// [M, padded_K, B] view of [B, M, padded_K] bytes, sf uint8 [32, 4, rm, 4, padded_K/128, B] view
/// of [B, rm, padded_K/128, 32, 4, 4] bytes). Rows >= mask[b] (unspecified upstream) are zero here.
std::tuple<Tensor, Tensor> mxfp8_grouped_quantize(const Tensor& a, const Tensor& mask);

/// trtllm-gen's shuffleMatrixA row permutation: rows in blocks of 32 (epilogue_tile_m % 128 ==
/// 0) or 16 (otherwise); output row blk*B + map[i] takes input row blk*B + i, map = the
/// 8-row interleave {0, 8, 1, 9, ...} (B = 16) or {0, 8, 16, 24, 1, 9, ...} (B = 32).
///   input_tensor  2-D [M, K] of any dtype, M % B == 0. Returns a new [M, K] tensor.
Tensor shuffle_matrix_a(const Tensor& input_tensor, int64_t epilogue_tile_m);

/// shuffle_matrix_a's row permutation of a linear uint8 scale matrix [M, K] (M % 128 == 0,
/// K % 4 == 0), then block_scale_interleave: uint8 1-D [M * K] in the 128x4 layout. The same for
/// NVFP4 and MXFP8 scales: num_elts_per_sf is accepted and unused, as upstream's (vLLM and SGLang
/// pass 32 for MXFP8 weights).
Tensor shuffle_matrix_sf_a(const Tensor& input_tensor, int64_t epilogue_tile_m,
                           int64_t num_elts_per_sf = 16);

/// MXFP4 dequantization on the host: weight uint8 [N, K/2] (packed e2m1), scale uint8
/// [N, K/group_size] ue8m0 (linear), both CPU and contiguous. Returns fp32 [N, K]:
/// e2m1 * 2^(scale - 127).
Tensor mxfp4_dequantize_host(const Tensor& weight, const Tensor& scale, int64_t group_size = 32);

/// NVFP4 KV-cache quantization with linear block scales. global_scale fp32 [1] is the
/// dequantization scale (amax / (448 * 6) style): per block of 16,
///   sf = e4m3_satfinite((1/gs) * (amax * (1/6))),  q = e2m1(x * (amax != 0 ? 1/(sf*gs) : 0)).
///   input [M, K] fp16/bf16, K % 16 == 0.
/// Returns (uint8 [M, K/2], uint8 [M, K/16]).
std::tuple<Tensor, Tensor> nvfp4_kv_quantize(const Tensor& input, const Tensor& global_scale);

/// NVFP4 KV-cache dequantization: out = (e2m1 * e4m3(sf)) * gs in fp32, rounded to output_dtype
/// (bfloat16 or float16). fp4_data uint8 [M, K/2], block_scales uint8 [M, K/16], global_scale
/// fp32 [1]. Returns [M, K].
Tensor nvfp4_kv_dequantize(const Tensor& fp4_data, const Tensor& block_scales,
                           const Tensor& global_scale, DType output_dtype = DType::kBFloat16);

// ---- NVFP4 paged KV caches -------------------------------------------------------------------
// A packed cache holds uint8 [pages, page_size, H, D/2] (NHD) or [pages, H, page_size, D/2] (HND),
// as a (k, v) pair or stacked [pages, 2, ...]; its scale cache the same with D/16 float8_e4m3fn.

/// Quantizes whole bf16/fp16 K/V caches to NVFP4 (fp4_quantization). A global scale not given is
/// 448 / max(amax, 1e-12) (amax over the whole cache). Each cache is quantized as
/// fp4_quantize(cache.reshape(-1, D), global_sf, 16, is_sf_swizzled_layout=False); K scales keep
/// the linear layout, V scales are interleaved by groups of 4 tokens:
/// out[..., (t/4)*4*S + s*4 + t%4] = in[..., t*S + s] within each [page_size, D/16] tile
/// (page_size % 4 == 0 and D % 64 == 0 required).
/// Returns ((k_fp4, v_fp4), (k_sf, v_sf), 1 / k_global_sf, 1 / v_global_sf) (fp32 quotients).
std::tuple<std::tuple<Tensor, Tensor>, std::tuple<Tensor, Tensor>, double, double>
nvfp4_quantize_paged_kv_cache(const Tensor& k_cache, const Tensor& v_cache,
                              std::string_view kv_layout = "HND",
                              std::optional<Tensor> k_global_sf = std::nullopt,
                              std::optional<Tensor> v_global_sf = std::nullopt);

/// Dequantizes a paged NVFP4 cache into dense output_k / output_v [batch, max_seq_len, H, D]
/// (bf16/fp16): token t < seq_lens[b] comes from page block_tables[b, t / page_size]; other
/// output rows are left as they are. out = (e2m1 * e4m3(sf)) * scale in fp32.
///   block_tables [batch, cols] int32/int64 (cols * page_size >= max_seq_len), seq_lens [batch]
///   int32, k_scale / v_scale fp32 one-element tensors or numbers.
void nvfp4_kv_dequantize_paged(const PagedKVCache& paged_kv_cache, const PagedKVCache& kv_cache_sf,
                               const Tensor& block_tables, const Tensor& seq_lens,
                               ScalarOrTensor<double> k_scale, ScalarOrTensor<double> v_scale,
                               const Tensor& output_k, const Tensor& output_v,
                               std::string_view kv_layout = "NHD");

/// Quantizes append_key / append_value ([nnz, H, D] bf16/fp16) to NVFP4 and writes them into
/// the paged caches at (batch_indices[i], positions[i]) through the page table, as
/// append_paged_kv_cache places rows (flashinfer.page). k_scale / v_scale are the positive
/// global decode scales: per block of 16, sf = e4m3_satfinite(amax / (6 * scale)),
/// q = e2m1(x / (sf * scale)).
void nvfp4_quantize_append_paged_kv_cache(const Tensor& append_key, const Tensor& append_value,
                                          const Tensor& batch_indices, const Tensor& positions,
                                          const PagedKVCache& paged_kv_cache,
                                          const PagedKVCache& kv_cache_sf, const Tensor& kv_indices,
                                          const Tensor& kv_indptr, const Tensor& kv_last_page_len,
                                          double k_scale, double v_scale,
                                          std::string_view kv_layout = "NHD");

/// As nvfp4_quantize_append_paged_kv_cache, each of the first slot_mapping.shape[0] rows to the
/// flat slot page * page_size + entry (int32/int64; negative slots, and slots past the cache, are
/// skipped).
void nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
    const Tensor& append_key, const Tensor& append_value, const Tensor& slot_mapping,
    const PagedKVCache& paged_kv_cache, const PagedKVCache& kv_cache_sf,
    ScalarOrTensor<double> k_scale, ScalarOrTensor<double> v_scale,
    std::string_view kv_layout = "NHD", const Value& nvfp4_4over6 = Value());

}  // namespace flashinfer
