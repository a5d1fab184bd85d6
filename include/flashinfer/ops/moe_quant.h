// FP8 trtllm-gen MoE ops (flashinfer.fused_moe.core): DeepSeek FP8 block scales and per-tensor
// scales, with routing from logits or precomputed. Semantics and sources: docs/MOE.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "flashinfer/ops/moe.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// Upstream's Fp8QuantizationType (flashinfer.tllm_enums): NoneFp8 0, DeepSeekFp8 1, MxFp8 2,
/// PerTensorFp8 3 (newer versions).
enum class Fp8QuantizationType : int { NoneFp8 = 0, DeepSeekFp8 = 1, MxFp8 = 2, PerTensorFp8 = 3 };
std::string_view fp8_quantization_type_name(Fp8QuantizationType q);
Value to_value(Fp8QuantizationType q);
Fp8QuantizationType fp8_quantization_type_from_value(const Value& v,
                                                     std::string_view op = "Fp8QuantizationType",
                                                     std::string_view arg = "value");

/// trtllm-gen FP8 MoE with DeepSeek 128x128 block scales, routing from logits:
///   hidden_states [T, H] fp8 e4m3fn with hidden_states_scale fp32 [H / 128, T] (transposed);
///   gemm1_weights fp8 [E_l, 2I, H] (MajorK) or [E_l, H / bk, 2I, bk] (BlockMajorK), up rows
///   first, with gemm1_weights_scale fp32 [E_l, 2I / 128, H / 128]; gemm2_weights fp8
///   [E_l, H, I] (or block layout) with gemm2_weights_scale fp32 [E_l, H / 128, I / 128].
///   use_shuffled_weight: rows shuffled as upstream's preparation does (epilogue_tile_m 64).
/// Returns bf16 [T, H], or with do_finalize=False the unfinalized list (see TrtllmMoeResult).
/// fp8_quantization_type DeepSeekFp8 and MxFp8 run. valid_hidden_size / valid_intermediate_size:
/// upstream 0.7.4's padded dimensions (see trtllm_fp4_block_scale_moe; DeepSeekFp8 honours a
/// valid_intermediate_size only when roundUp(vi, 128) is intermediate_size); gemm1_bias fp32
/// [E_l, 2I or I] / gemm2_bias fp32 [E_l, H] (keyword-only; rows stored as the weights'): added
/// to GEMM1's dequantized output before the activation and to GEMM2's before the routing
/// weights; workspace_buffer: caller scratch, checked, never changes a value.
TrtllmMoeResult trtllm_fp8_block_scale_moe(
    const Tensor& routing_logits, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    const Tensor& hidden_states_scale, const Tensor& gemm1_weights,
    const Tensor& gemm1_weights_scale, const Tensor& gemm2_weights,
    const Tensor& gemm2_weights_scale, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, int64_t routing_method_type = 0,
    bool use_shuffled_weight = false, WeightLayout weight_layout = WeightLayout::MajorK,
    bool do_finalize = true, std::optional<bool> enable_pdl = std::nullopt,
    int64_t tune_max_num_tokens = 8192,
    Fp8QuantizationType fp8_quantization_type = Fp8QuantizationType::DeepSeekFp8,
    std::optional<int64_t> num_fused_shared_experts = std::nullopt, int64_t activation_type = 3,
    bool norm_topk_prob = true, std::optional<Tensor> routing_replay_out = std::nullopt,
    std::optional<Tensor> gemm1_alpha = std::nullopt,
    std::optional<Tensor> gemm1_beta = std::nullopt,
    std::optional<Tensor> gemm1_clamp_limit = std::nullopt,
    std::optional<Tensor> output = std::nullopt,
    std::optional<int64_t> valid_hidden_size = std::nullopt,
    std::optional<int64_t> valid_intermediate_size = std::nullopt,
    std::optional<Tensor> gemm1_bias = std::nullopt,
    std::optional<Tensor> gemm2_bias = std::nullopt,
    std::optional<Tensor> workspace_buffer = std::nullopt);

/// trtllm_fp8_block_scale_moe with precomputed routing (`topk_ids`, see MoeTopkIds).
TrtllmMoeResult trtllm_fp8_block_scale_routed_moe(
    const MoeTopkIds& topk_ids, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    const Tensor& hidden_states_scale, const Tensor& gemm1_weights,
    const Tensor& gemm1_weights_scale, const Tensor& gemm2_weights,
    const Tensor& gemm2_weights_scale, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, int64_t routing_method_type = 0,
    bool use_shuffled_weight = false, WeightLayout weight_layout = WeightLayout::MajorK,
    bool do_finalize = true, std::optional<bool> enable_pdl = std::nullopt,
    std::optional<Tensor> gemm1_lora_delta = std::nullopt,
    std::optional<Tensor> output = std::nullopt, int64_t tune_max_num_tokens = 8192,
    Fp8QuantizationType fp8_quantization_type = Fp8QuantizationType::DeepSeekFp8,
    int64_t activation_type = 3, std::optional<Tensor> gemm1_alpha = std::nullopt,
    std::optional<Tensor> gemm1_beta = std::nullopt,
    std::optional<Tensor> gemm1_clamp_limit = std::nullopt,
    std::optional<int64_t> valid_hidden_size = std::nullopt,
    std::optional<int64_t> valid_intermediate_size = std::nullopt,
    std::optional<Tensor> workspace_buffer = std::nullopt);

/// trtllm-gen FP8 MoE with per-tensor scales (Llama4 style), routing from logits:
///   hidden_states fp8 [T, H]; gemm1_weights fp8 [E_l, 2I or I, H] and gemm2_weights fp8
///   [E_l, H, I], both shuffled as upstream's preparation does (epilogue_tile_m 128, GEMM1's
///   up/gate rows interleaved for a gated activation); output1_scales_scalar,
///   output1_scales_gate_scalar, output2_scales_scalar fp32 [E_l].
///   use_routing_scales_on_input (Llama4, top-1): the routing weight scales GEMM1's output.
TrtllmMoeResult trtllm_fp8_per_tensor_scale_moe(
    const Tensor& routing_logits, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    const Tensor& gemm1_weights, const Tensor& output1_scales_scalar,
    const Tensor& output1_scales_gate_scalar, const Tensor& gemm2_weights,
    const Tensor& output2_scales_scalar, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, bool use_routing_scales_on_input,
    int64_t routing_method_type = 0, bool do_finalize = true,
    std::optional<bool> enable_pdl = std::nullopt, int64_t tune_max_num_tokens = 8192,
    int64_t activation_type = 3, bool norm_topk_prob = true,
    std::optional<Tensor> routing_replay_out = std::nullopt,
    std::optional<Tensor> output = std::nullopt,
    std::optional<Tensor> gemm1_clamp_limit = std::nullopt,
    std::optional<Tensor> workspace_buffer = std::nullopt);

/// trtllm_fp8_per_tensor_scale_moe with precomputed routing (`topk_ids`, see MoeTopkIds).
TrtllmMoeResult trtllm_fp8_per_tensor_scale_routed_moe(
    const MoeTopkIds& topk_ids, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    const Tensor& gemm1_weights, const Tensor& output1_scales_scalar,
    const Tensor& output1_scales_gate_scalar, const Tensor& gemm2_weights,
    const Tensor& output2_scales_scalar, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, bool use_routing_scales_on_input,
    int64_t routing_method_type = 0, bool do_finalize = true,
    std::optional<bool> enable_pdl = std::nullopt, int64_t tune_max_num_tokens = 8192,
    int64_t activation_type = 3, std::optional<Tensor> routing_replay_out = std::nullopt,
    std::optional<Tensor> output = std::nullopt,
    std::optional<Tensor> gemm1_clamp_limit = std::nullopt,
    std::optional<Tensor> workspace_buffer = std::nullopt);

}  // namespace flashinfer
