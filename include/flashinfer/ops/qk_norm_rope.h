// Fused QK RMSNorm + 3D RoPE + V copy for video DiT self-attention (flashinfer.norm
// fused_qk_rmsnorm_rope). CPU reference only (the kernel table lists the CPU alone: CUDA tensors
// get kUnsupported). docs/NORM_ACTIVATION_ROPE.md gives the upstream facts it follows.
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>

#include "flashinfer/tensor.h"

namespace flashinfer {

/// qkv bf16 contiguous, [T, (Hq+Hk+Hv)*D] (T % (ppf*pph*ppw) == 0) or [B, ppf*pph*ppw, ...].
/// Q and K: RMSNorm across all their heads (sum of squares over H*D, then x * rsqrt(ms + eps)
/// * weight, rounded to bf16 unless output_fp8), skipped when !is_qk_norm; then RoPE with the
/// head's channels split into frame | height | width sections (num_*_channels, even, summing to
/// head_dim): pair i uses freq = base^(-2j/C) of its section (j = i - section start / 2; YaRN
/// ramp when factor != 1) and the token's (t, h, w) position within its sequence; interleave:
/// pairs (2i, 2i+1), else NeoX pairs (i, i + D/2). With YaRN the rotated values are multiplied
/// by attention_factor (which must be 1 when factor == 1). V is copied.
/// Outputs bf16, or float8_e4m3fn = satfinite(x * output_quant_scale) for Q/K and
/// satfinite(v * v_quant_scale) for V when output_fp8. Shapes [T, H, D] or [B, S, H, D];
/// q_out/k_out/v_out, when given, must have exactly that shape and dtype and be contiguous.
/// head_dim in {64, 128, 256}; max(Hq, Hk, Hv) <= 32; q_weight [Hq*D], k_weight [Hk*D] bf16.
std::tuple<Tensor, Tensor, Tensor> fused_qk_rmsnorm_rope(
    const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight, int64_t ppf, int64_t pph,
    int64_t ppw, int64_t num_frame_channels, int64_t num_height_channels,
    int64_t num_width_channels, int64_t num_heads_q, int64_t num_heads_k, int64_t num_heads_v,
    int64_t head_dim, double eps = 1e-6, double base = 10000.0, bool interleave = true,
    double factor = 1.0, double low = 0.0, double high = 0.0, double attention_factor = 1.0,
    bool is_qk_norm = true, bool output_fp8 = false, double output_quant_scale = 1.0,
    double v_quant_scale = 1.0, std::optional<Tensor> q_out = std::nullopt,
    std::optional<Tensor> k_out = std::nullopt, std::optional<Tensor> v_out = std::nullopt);

}  // namespace flashinfer
