// Gated activations (FlashInfer module flashinfer.activation).
#pragma once

#include <optional>

#include "flashinfer/tensor.h"

namespace flashinfer {

/// out = silu(input[..., :d]) * input[..., d:], silu(x) = x / (1 + exp(-x)), fp32 math.
///   input  [..., 2 * d], fp16, bf16 or fp32, any strides; the last dimension must be even.
///   out    optional [..., d], same dtype and device, must not overlap input; written and
///          returned. When absent a new contiguous tensor is returned.
///   enable_pdl  programmatic dependent launch on sm90+ (default: on where supported); no
///          effect on the numbers, ignored on the CPU.
/// Upstream also requires the row width in bytes to be a multiple of 16; this library accepts
/// any even width (unaligned rows take a scalar path).
Tensor silu_and_mul(const Tensor& input, std::optional<Tensor> out = std::nullopt,
                    std::optional<bool> enable_pdl = std::nullopt);

/// As silu_and_mul with the exact GELU: gelu(x) = 0.5 x (1 + erf(x / sqrt(2))).
Tensor gelu_and_mul(const Tensor& input, std::optional<Tensor> out = std::nullopt,
                    std::optional<bool> enable_pdl = std::nullopt);

/// As silu_and_mul with the tanh approximation of GELU:
/// gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
Tensor gelu_tanh_and_mul(const Tensor& input, std::optional<Tensor> out = std::nullopt,
                         std::optional<bool> enable_pdl = std::nullopt);

}  // namespace flashinfer
