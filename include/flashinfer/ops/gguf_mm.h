// GEMM on GGUF-quantized weights (module flashinfer_cpp.gguf). An op of ours: upstream FlashInfer
// has no GGML block formats. It is declared, logged, recorded and replayed like every other op.
#pragma once

#include <optional>
#include <string_view>

#include "flashinfer/tensor.h"

namespace flashinfer {

/// out = a @ dequant(b)^T, reading GGML's quantized blocks directly (no dequantized copy of the
/// weight), with fp32 accumulation, rounded once to out_dtype.
///   a           [m, k] bf16, fp16 or fp32; any strides. k must be a multiple of 32.
///   b           [n, k / 32 * block_bytes] uint8: n weight rows (output features) of GGML blocks,
///               exactly as a .gguf file stores a [n, k] tensor; unit stride along a row.
///   quant_type  "Q4_1" (20-byte blocks: fp16 d, fp16 m, 32 nibbles; w = d * q + m) or
///               "Q8_0" (34-byte blocks: fp16 d, 32 int8; w = d * q), GGML's type names.
///   out         optional [m, n] of out_dtype; written and returned.
///   out_dtype   bf16 (default), fp16 or fp32.
/// CPU only (scalar reference, AVX2 and AVX-512 tiers chosen at run time); other devices raise
/// flashinfer::Error(kUnsupported).
Tensor mm_gguf(const Tensor& a, const Tensor& b, std::string_view quant_type,
               std::optional<Tensor> out = std::nullopt, DType out_dtype = DType::kBFloat16);

}  // namespace flashinfer
