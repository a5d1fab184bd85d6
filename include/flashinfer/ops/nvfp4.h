// NVFP4 / MXFP8 grouped and fused quantizers, weight shuffles and the NVFP4 KV-cache quantizers
// (flashinfer.quantization.fp4_quantization, flashinfer.quantization.fp8_quantization and
// flashinfer.activation). CPU reference only (host tensors); docs/GEMM_AND_QUANTIZATION.md
// gives the upstream facts each follows.
//
// The NVFP4 block math is fp4_quantize's (flashinfer/ops/quantization.h): blocks of 16 along K,
//   sf = e4m3_satfinite(gs * amax / 6),  q = e2m1((x * gs) / float(sf))  (q = 0 when sf == 0).
// The grouped outputs are upstream's permuted views: the bytes are laid out group-major
// ([L, M, K/2] data, [L, round_up(M, 128), round_up(K/16, 4)] 128x4-swizzled scales) and the
// returned tensors are views with the group as the last dimension.
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>

#include "flashinfer/dtype.h"
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
    std::optional<bool> enable_pdl = std::nullopt);

/// Masked grouped silu-and-mul + NVFP4 quantization (flashinfer.activation).
///   a            [L, M, 2K] fp16/bf16 (gate half first, as silu_and_mul_nvfp4_quantize).
///   mask         int32 [L]: rows [0, mask[l]) of group l are quantized (0 <= mask[l] <= M).
///   a_global_sf  fp32 [L]: group l's global scale.
/// Returns (x_q uint8 [M, K/2, L] view of [L, M, K/2] bytes, sf float8_e4m3fn
/// [32, 4, rm, 4, rk, L] view of [L, rm, rk, 32, 4, 4] bytes, rm = ceil(M/128),
/// rk = ceil(K/64)). Upstream leaves rows >= mask[l] and the scale padding unwritten (torch.empty);
/// here they are zero.
std::tuple<Tensor, Tensor> silu_and_mul_scaled_nvfp4_experts_quantize(const Tensor& a,
                                                                      const Tensor& mask,
                                                                      const Tensor& a_global_sf);

/// Masked grouped NVFP4 quantization for the masked grouped GEMM (fp4_quantization): as
/// silu_and_mul_scaled_nvfp4_experts_quantize without the activation; a [L, M, K] fp16/bf16.
std::tuple<Tensor, Tensor> scaled_fp4_grouped_quantize(const Tensor& a, const Tensor& mask,
                                                       const Tensor& a_global_sf);

/// Batched NVFP4 quantization: a [B, M, K] fp16/bf16, a_global_sf fp32 [1] shared by all
/// batches, sf_vec_size 16 (upstream: "32 not supported yet"). Returns (uint8 [B, M, K/2],
/// uint8 [B, round_up(M, 128) * round_up(K/16, 4)]: each batch's scales in the 128x4 layout).
std::tuple<Tensor, Tensor> nvfp4_batched_quantize(const Tensor& a, const Tensor& a_global_sf,
                                                  int64_t sf_vec_size = 16);

/// Masked grouped MXFP8 quantization (fp8_quantization): a [B, M, K] fp16/bf16, K % 32 == 0,
/// mask int32 [B]. K is zero-padded to padded_K = round_up(K, 128); blocks of 32 with ue8m0
/// scales as mxfp8_quantize. Returns (x_q float8_e4m3fn [M, padded_K, B] view of [B, M, padded_K]
/// bytes, sf uint8 [32, 4, rm, 4, padded_K/128, B] view of [B, rm, padded_K/128, 32, 4, 4]
/// bytes). Rows >= mask[b] (unspecified upstream) are zero here.
std::tuple<Tensor, Tensor> mxfp8_grouped_quantize(const Tensor& a, const Tensor& mask);

/// trtllm-gen's shuffleMatrixA row permutation: rows in blocks of 32 (epilogue_tile_m % 128 ==
/// 0) or 16 (otherwise); output row blk*B + map[i] takes input row blk*B + i, map = the
/// 8-row interleave {0, 8, 1, 9, ...} (B = 16) or {0, 8, 16, 24, 1, 9, ...} (B = 32).
///   input_tensor  2-D [M, K] of any dtype, M % B == 0. Returns a new [M, K] tensor.
Tensor shuffle_matrix_a(const Tensor& input_tensor, int64_t epilogue_tile_m);

/// shuffle_matrix_a's row permutation of a linear uint8 scale matrix [M, K] (M % 128 == 0,
/// K % 4 == 0, num_elts_per_sf 16), then block_scale_interleave: uint8 1-D [M * K] in the 128x4
/// layout.
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

}  // namespace flashinfer
