// BF16 x NVFP4 (W4A16) dense GEMM (flashinfer.gemm.gemm_bf16_fp4): the per-backend weight
// preparation and the GEMM on the prepared weights. CPU reference only (the kernel tables list
// the CPU alone): every upstream backend name is accepted on CPU tensors and the CPU reads that
// backend's prepared layout; CUDA tensors get kUnsupported. docs/GEMM_AND_QUANTIZATION.md gives
// the upstream facts each layout follows.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>

#include "flashinfer/dtype.h"
#include "flashinfer/tensor.h"

namespace flashinfer {

/// Prepares canonical NVFP4 weights (nvfp4_quantize with the 128x4 scale layout) for one backend.
///   b          uint8 [N, K/2]: two e2m1 codes per byte, low nibble = even k.
///   b_descale  the 128x4-swizzled e4m3 block scales (1-D bytes or 2-D, any 1-byte dtype), at
///              least ceil(N/128) * ceil(K_sf/4) * 512 bytes, K_sf = K / block_size.
///   alpha      optional fp32 [1] global scale, returned unchanged.
///   backend    "cudnn": (b unchanged, float8_e4m3fn [N, K_sf] linear scales, alpha);
///              "cute-dsl": (int32 [K/16, 2N] tile-packed weight, uint8 [K_sf, N] S0E5M3 scales,
///              alpha); N % 64 == 0. The S0E5M3 byte of an e4m3 scale is bits 7..14 of its
///              fp16 encoding (the sign is dropped).
///   block_size 16.
std::tuple<Tensor, Tensor, std::optional<Tensor>> prepare_bf16_fp4_weights(
    const Tensor& b, const Tensor& b_descale, std::optional<Tensor> alpha, std::string_view backend,
    int64_t block_size = 16);

/// out = (a @ dequant(b).T) * alpha on weights prepared by prepare_bf16_fp4_weights with the
/// same backend. dequant = e2m1 * block scale (exact in fp32), fp32 accumulation, alpha (1 when
/// None) applied once, then rounded to out_dtype.
///   a          bf16 [M, K].
///   b, b_descale  the prepared pair (layouts above); alpha fp32, one element, or None.
///   out_dtype  bf16 or fp16 (default a.dtype); "cute-dsl" requires out_dtype == a.dtype.
///   out        optional [M, N] of out_dtype.
Tensor mm_bf16_fp4(const Tensor& a, const Tensor& b, const Tensor& b_descale,
                   std::optional<Tensor> alpha, std::string_view backend,
                   std::optional<DType> out_dtype = std::nullopt,
                   std::optional<Tensor> out = std::nullopt, int64_t block_size = 16,
                   bool enable_pdl = true);

}  // namespace flashinfer
