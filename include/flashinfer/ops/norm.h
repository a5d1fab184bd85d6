// Normalization ops (FlashInfer module flashinfer.norm).
#pragma once

#include <optional>

#include "flashinfer/tensor.h"

namespace flashinfer {

/// Root mean square normalization: out = input * rsqrt(mean(input^2) + eps) * weight, in fp32
/// math, with eps inside the square root.
///   input  [batch, hidden] or [batch, heads, hidden] (QK-norm); fp16, bf16 or fp32; any strides.
///   weight [hidden], same dtype and device as input.
///   out    optional, same shape, dtype and device as input; written and returned. When absent a
///          new contiguous tensor is returned.
///   enable_pdl  programmatic dependent launch on sm90+ (default: on where supported); no
///          effect on the numbers, ignored on the CPU.
/// Runs on input's device, on the current CUDA stream for CUDA tensors.
Tensor rmsnorm(const Tensor& input, const Tensor& weight, double eps = 1e-6,
               std::optional<Tensor> out = std::nullopt,
               std::optional<bool> enable_pdl = std::nullopt);

}  // namespace flashinfer
