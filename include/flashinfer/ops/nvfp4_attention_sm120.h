// SM120 NVFP4 attention (flashinfer.nvfp4_attention_sm120, a SageAttention3 port):
// nvfp4_attention_sm120_quantize_qkv centres K and Q, pads to 128 tokens and quantizes Q, K and
// V^T to NVFP4 (e2m1 codes, one e4m3 scale per 16 values, swizzled scale bytes, K's rows
// permuted in groups of 32); nvfp4_attention_sm120_fwd attends over those codes with the Q-mean
// correction added to the scores and P quantized to FP4 per 16 keys. CPU reference everywhere;
// a CUDA kernel where upstream runs it (compute capability 12.0). docs/ATTENTION.md ("NVFP4
// attention on SM120") gives the layouts and the math; docs/upstream-facts/
// nvfp4_attention_sm120.md the sources.
#pragma once

#include <optional>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// The seven tensors of nvfp4_attention_sm120_quantize_qkv, upstream's tuple order.
struct Nvfp4AttentionQkv {
  Tensor q_fp4, k_fp4, v_fp4_t, q_scale, k_scale, v_scale_t, qk_correction;
};
Value to_value(const Nvfp4AttentionQkv& r);

/// q, k, v [B, H, S, D] (HND, contiguous, one fp16 / bf16 dtype, the same shape, D 64 or 128).
/// K is centred over its S tokens, the three padded with zeros to S_pad = ceil(S / 128) 128,
/// then Q centred per 128-token block (per_block_mean) or over all S_pad rows. Returns q_fp4 and
/// k_fp4 uint8 [B, H, S_pad, D/2] (k's rows permuted within each 32-token group), v_fp4_t uint8
/// [B, H, D, S_pad/2], their e4m3 scales [B, H, S_pad, D/16] / [B, H, D, S_pad/16] (swizzled in
/// 64-row chunks), and qk_correction fp32 [B, H, S_pad/128 or 1, S_pad] = Q's means times the
/// centred K.
Nvfp4AttentionQkv nvfp4_attention_sm120_quantize_qkv(const Tensor& q, const Tensor& k,
                                                     const Tensor& v, bool per_block_mean = true);

/// (out, lse), as upstream always returns them.
struct Nvfp4AttentionOutput {
  Tensor out, lse;
};
Value to_value(const Nvfp4AttentionOutput& r);

/// Attention over quantize_qkv's outputs (S = S_pad): score(i, j) = q_i . k_j + qk_correction[
/// i / 128 or 0, j], softmax at sm_scale (default D^-0.5; softmax_scale its deprecated alias),
/// causal: keys j <= i. P is quantized to e2m1 per 16 keys against the running row max, as the
/// kernel does. out [B, H, S, D] of out_dtype (or the caller's fp16 / bf16 out), lse [B, H, S]
/// fp32 natural-log over the centred-K scores.
Nvfp4AttentionOutput nvfp4_attention_sm120_fwd(
    const Tensor& q_fp4, const Tensor& k_fp4, const Tensor& v_fp4_t, const Tensor& q_scale,
    const Tensor& k_scale, const Tensor& v_scale_t, const Tensor& qk_correction,
    std::optional<double> sm_scale = std::nullopt, bool causal = false, bool per_block_mean = true,
    std::optional<Tensor> out = std::nullopt, std::optional<Tensor> lse = std::nullopt,
    DType out_dtype = DType::kBFloat16, std::optional<double> softmax_scale = std::nullopt);

}  // namespace flashinfer
