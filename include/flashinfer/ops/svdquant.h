// SVDQuant NVFP4 linear (flashinfer.gemm.gemm_svdquant): the fused residual + low-rank GEMM, the
// smoothing NVFP4 quantizer and the whole linear operator. CPU reference only (the kernel tables
// list the CPU alone: CUDA tensors get kUnsupported). docs/GEMM_AND_QUANTIZATION.md gives the
// upstream facts they follow.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>

#include "flashinfer/tensor.h"

namespace flashinfer {

/// out = alpha * (dequant(a) @ dequant(b)^T + d @ l1^T) + bias, fp32 accumulation, one rounding
/// to bf16 (upstream's epilogue `alpha * acc + bias`; l1 is the LoRA-up weight pre-divided by
/// alpha).
///   a uint8 [m, k/2], b uint8 [n, k/2] packed e2m1 (low nibble = even k); n, k % 32 == 0.
///   a_sf, b_sf uint8/e4m3 128x4-swizzled block scales (16 per block), at least
///     round_up(rows, 128) * round_up(k/16, 4) elements.
///   alpha fp32, numel >= 1 (the first element is used).
///   d bf16 [m, r], l1 bf16 [n, r], r a positive multiple of 32; bias bf16 [n] or None.
///   out bf16 [m, n] contiguous, or None. backend "cutlass".
Tensor mm_nvfp4_svdquant(const Tensor& a, const Tensor& b, const Tensor& a_sf, const Tensor& b_sf,
                         const Tensor& alpha, const Tensor& d, const Tensor& l1,
                         std::optional<Tensor> bias = std::nullopt,
                         std::optional<Tensor> out = std::nullopt,
                         std::string_view backend = "cutlass",
                         std::optional<bool> enable_pdl = std::nullopt);

/// (xq, sf) = NVFP4 quantization of bf16(x * pre_quant_scale) with global_scale, byte-identical
/// to nvfp4_quantize of that product (128x4 scales). x bf16 [m, n], n % 16 == 0;
/// pre_quant_scale bf16 with n elements; global_scale fp32 one element. Returns (uint8 [m, n/2],
/// uint8 1-D [round_up(m, 128) * round_up(n/16, 4)]).
std::tuple<Tensor, Tensor> nvfp4_quantize_smooth(const Tensor& x, const Tensor& pre_quant_scale,
                                                 const Tensor& global_scale,
                                                 std::optional<bool> enable_pdl = std::nullopt,
                                                 std::string_view backend = "cutlass");

/// The SVDQuant linear: (xq, x_sf) = nvfp4_quantize_smooth(x, pre_quant_scale, global_scale);
/// down = bf16(x @ l2t_smoothed) (fp32 accumulation); mm_nvfp4_svdquant(xq, weight_fp4, x_sf,
/// weight_sf, alpha, down, l1_scaled, bias). x bf16 [m, k]; l2t_smoothed bf16 [k, r];
/// l1_scaled bf16 [n, r]. Returns bf16 [m, n].
Tensor svdquant_linear(const Tensor& x, const Tensor& weight_fp4, const Tensor& weight_sf,
                       const Tensor& alpha, const Tensor& pre_quant_scale,
                       const Tensor& l2t_smoothed, const Tensor& l1_scaled,
                       const Tensor& global_scale, std::optional<Tensor> bias = std::nullopt,
                       std::optional<bool> enable_pdl = std::nullopt);

}  // namespace flashinfer
