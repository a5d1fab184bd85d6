// flashinfer.prefill's TRT-LLM FMHAv2 prefill names for dense (padded-batch) inputs:
// fmha_v2_prefill_deepseek (DeepSeek head dims, always causal) and fmha_v2_prefill_sm120.
// Upstream runs them on SM12x GPUs only; here they run wherever the ragged-attention kernels do
// (CPU reference, CUDA kernel).
#pragma once

#include <optional>

#include "flashinfer/ops/attention.h"
#include "flashinfer/tensor.h"

namespace flashinfer {

/// query, key [batch, seq_len, H, 192], value [batch, seq_len, H, 128] (one dtype: fp16, bf16 or
/// fp8 e4m3; key/value may have fewer heads, a divisor of H), out [batch, seq_len, H, 128] fp16 or
/// bf16 (written and returned). num_heads, head_dim (192) and seq_len must match the tensors.
/// Causal (query i sees keys 0..i):
///   s = scale_bmm1 * q . k  (scale_bmm1 fuses 1/sqrt(192) and the fp8 q/k scales; default 1);
///   out = scale_bmm2 * softmax(s) v  (default 1).
/// With return_lse, returns (out, lse) where lse [batch, seq_len, H, 2] fp32 holds FMHAv2's
/// softmax statistics (max_j s_j, sum_j exp(s_j - max)), the sum times 256 for fp8 e4m3 inputs
/// (upstream's test: lse = stats[..., 0] + log(stats[..., 1] / 256)); a given lse is filled
/// (allocated when None). scale_softmax is FMHAv2's internal softmax-quantization scale: accepted,
/// it changes no value. scale_bmm1_d / scale_bmm2_d (device scales) are not supported
/// (kUnsupported when given).
AttentionOutput fmha_v2_prefill_deepseek(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& out,
    int64_t num_heads, int64_t head_dim, int64_t seq_len, std::optional<double> scale_softmax,
    std::optional<double> scale_bmm1 = std::nullopt,
    std::optional<double> scale_bmm2 = std::nullopt, bool return_lse = false,
    std::optional<Tensor> lse = std::nullopt, std::optional<Tensor> scale_bmm1_d = std::nullopt,
    std::optional<Tensor> scale_bmm2_d = std::nullopt);

/// fmha_v2_prefill_deepseek's math with any head dims (query/key head_dim, value its own, both
/// <= 256) and a causal flag (false: every query sees every key).
AttentionOutput fmha_v2_prefill_sm120(const Tensor& query, const Tensor& key, const Tensor& value,
                                      const Tensor& out, int64_t num_heads, int64_t head_dim,
                                      int64_t seq_len, std::optional<double> scale_softmax,
                                      std::optional<double> scale_bmm1 = std::nullopt,
                                      std::optional<double> scale_bmm2 = std::nullopt,
                                      bool causal = true, bool return_lse = false,
                                      std::optional<Tensor> lse = std::nullopt,
                                      std::optional<Tensor> scale_bmm1_d = std::nullopt,
                                      std::optional<Tensor> scale_bmm2_d = std::nullopt);

}  // namespace flashinfer
