// Fused DiT (WAN 2.2) gate + residual + LayerNorm ops of flashinfer.norm. CPU reference with
// bf16 output; upstream's NVFP4 / MXFP8 norm outputs (use_nvfp4 / use_mxfp8) raise
// Error(kUnsupported). docs/NORM_ACTIVATION_ROPE.md gives the kernel steps followed.
//
// Shapes (upstream's contract): input / residual bf16 [batch, rows, 3072] contiguous (hidden 3072
// only, as upstream's kernel); gate / scale / shift bf16 [batch, rows, 3072] views with row stride
// 6 * 3072 (WAN's temb.chunk(6, dim=2)[i].squeeze(2)) or 2-D [batch * rows, 3072] with that row
// stride (read through their strides here; upstream requires that stride); biases fp32 [3072] or
// [1, 3072]; global scales fp32 [1]. residual_out / norm_out: optional bf16 [batch, rows, 3072]
// contiguous outputs, written and returned.
#pragma once

#include <optional>
#include <tuple>

#include "flashinfer/tensor.h"

namespace flashinfer {

/// residual_out = bf16(residual + input * (gate + gate_bias)) (times input_global_scaling_factor
/// on the gate when given); norm_out = bf16(LayerNorm(residual_out_fp32) * gamma + beta).
/// Returns (residual_out, norm_out).
std::tuple<Tensor, Tensor> fused_dit_gate_residual_layernorm_gamma_beta(
    const Tensor& input, const Tensor& residual, const Tensor& gate, const Tensor& gamma,
    const Tensor& beta, std::optional<Tensor> gate_bias = std::nullopt, double epsilon = 1e-6,
    bool use_nvfp4 = false, bool use_mxfp8 = false,
    std::optional<Tensor> global_scaling_factor = std::nullopt,
    std::optional<Tensor> input_global_scaling_factor = std::nullopt,
    std::optional<Tensor> residual_out = std::nullopt,
    std::optional<Tensor> norm_out = std::nullopt, std::optional<Tensor> sf_out = std::nullopt);

/// As above, then norm_out = bf16(LayerNorm(r) * (1 + scale + scale_bias) + (shift + shift_bias))
/// (no gamma/beta).
std::tuple<Tensor, Tensor> fused_dit_gate_residual_layernorm_scale_shift(
    const Tensor& input, const Tensor& residual, const Tensor& gate, const Tensor& scale,
    const Tensor& shift, std::optional<Tensor> gate_bias = std::nullopt,
    std::optional<Tensor> scale_bias = std::nullopt,
    std::optional<Tensor> shift_bias = std::nullopt, double epsilon = 1e-6, bool use_nvfp4 = false,
    bool use_mxfp8 = false, std::optional<Tensor> global_scaling_factor = std::nullopt,
    std::optional<Tensor> input_global_scaling_factor = std::nullopt,
    std::optional<Tensor> residual_out = std::nullopt,
    std::optional<Tensor> norm_out = std::nullopt, std::optional<Tensor> sf_out = std::nullopt);

/// Without a gate: residual_out = bf16(input (* input_global_scaling_factor) + residual) (residual
/// optional: zeros), norm_out as the scale/shift op.
std::tuple<Tensor, Tensor> fused_dit_residual_layernorm_scale_shift(
    const Tensor& input, const Tensor& scale, const Tensor& shift,
    std::optional<Tensor> residual = std::nullopt, std::optional<Tensor> scale_bias = std::nullopt,
    std::optional<Tensor> shift_bias = std::nullopt, double epsilon = 1e-6, bool use_nvfp4 = false,
    bool use_mxfp8 = false, std::optional<Tensor> global_scaling_factor = std::nullopt,
    std::optional<Tensor> input_global_scaling_factor = std::nullopt,
    std::optional<Tensor> residual_out = std::nullopt,
    std::optional<Tensor> norm_out = std::nullopt, std::optional<Tensor> sf_out = std::nullopt);

}  // namespace flashinfer
