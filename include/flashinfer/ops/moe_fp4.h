// FP4 / MxInt4 trtllm-gen MoE ops (flashinfer.fused_moe.core): NVFP4 and MXFP4 weights
// (trtllm_fp4_block_scale_moe and _routed_) and MxInt4 weights (trtllm_mxint4_block_scale_moe
// and _routed_), with routing from logits or precomputed. CPU reference only. Semantics and
// sources: docs/MOE.md.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "flashinfer/ops/moe.h"
#include "flashinfer/tensor.h"

namespace flashinfer {

/// trtllm-gen FP4 block-scale MoE, routing from logits (upstream's weight preparation assumed:
/// rows shuffled with epilogue_tile_m 128, GEMM1's up/gate rows interleaved for a gated
/// activation, scales shuffled the same way and then 128x4-interleaved):
///   hidden_states  uint8 [T, H/2] packed NVFP4 with hidden_states_scale e4m3 [T, H/16]
///                  (linear), float8_e4m3fn [T, H] (MXFP8) with ue8m0 scales [T, H/32], or
///                  bf16 [T, H] with no scale.
///   gemm1_weights  uint8 [E_l, 2I or I, H/2]; gemm1_weights_scale [E_l, 2I or I, H/16] e4m3
///                  (NVFP4) or [E_l, 2I or I, H/32] ue8m0 (MXFP4), float8_e4m3fn or uint8.
///   gemm2_weights  uint8 [E_l, H, I/2]; gemm2_weights_scale [E_l, H, I/16 or I/32].
///   gemm1_bias fp32 [E_l, 2I] / gemm2_bias fp32 [E_l, H] (rows stored as the weights'),
///   gemm1_alpha / beta / clamp_limit fp32 [E_l] (SwiGLU parameters), output*_scale_scalar
///   fp32 [E_l] (None means 1).
/// Returns [output] (bf16 [T, H]), as upstream returns a list. do_finalize=False,
/// per_token_scale and fused shared experts are refused (kUnsupported).
std::vector<Tensor> trtllm_fp4_block_scale_moe(
    const Tensor& routing_logits, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    std::optional<Tensor> hidden_states_scale, const Tensor& gemm1_weights,
    const Tensor& gemm1_weights_scale, std::optional<Tensor> gemm1_bias,
    std::optional<Tensor> gemm1_alpha, std::optional<Tensor> gemm1_beta,
    std::optional<Tensor> gemm1_clamp_limit, const Tensor& gemm2_weights,
    const Tensor& gemm2_weights_scale, std::optional<Tensor> gemm2_bias,
    std::optional<Tensor> output1_scale_scalar, std::optional<Tensor> output1_scale_gate_scalar,
    std::optional<Tensor> output2_scale_scalar, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, int64_t routing_method_type = 0,
    bool do_finalize = true, std::optional<bool> enable_pdl = std::nullopt,
    int64_t activation_type = 3, std::optional<Tensor> per_token_scale = std::nullopt,
    std::optional<Tensor> output = std::nullopt, int64_t tune_max_num_tokens = 8192,
    bool norm_topk_prob = true, std::optional<Tensor> routing_replay_out = std::nullopt,
    std::optional<int64_t> num_fused_shared_experts = std::nullopt);

/// trtllm_fp4_block_scale_moe with precomputed routing (`topk_ids`, see MoeTopkIds).
std::vector<Tensor> trtllm_fp4_block_scale_routed_moe(
    const MoeTopkIds& topk_ids, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    std::optional<Tensor> hidden_states_scale, const Tensor& gemm1_weights,
    const Tensor& gemm1_weights_scale, std::optional<Tensor> gemm1_bias,
    std::optional<Tensor> gemm1_alpha, std::optional<Tensor> gemm1_beta,
    std::optional<Tensor> gemm1_clamp_limit, const Tensor& gemm2_weights,
    const Tensor& gemm2_weights_scale, std::optional<Tensor> gemm2_bias,
    std::optional<Tensor> output1_scale_scalar, std::optional<Tensor> output1_scale_gate_scalar,
    std::optional<Tensor> output2_scale_scalar, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, int64_t routing_method_type = 0,
    bool do_finalize = true, std::optional<bool> enable_pdl = std::nullopt,
    int64_t activation_type = 3, std::optional<Tensor> per_token_scale = std::nullopt,
    std::optional<Tensor> output = std::nullopt, int64_t tune_max_num_tokens = 8192,
    std::optional<Tensor> gemm1_lora_delta = std::nullopt);

/// trtllm-gen MxInt4 block-scale MoE (Swiglu), routing from logits:
///   hidden_states bf16 [T, H]; gemm1_weights uint8 [E_l, 2I, H/2] (MajorK) or
///   [E_l, H/2/bk, 2I, bk] (BlockMajorK over bytes), signed int4 nibbles (element 2j in the low
///   nibble), rows shuffled as upstream prepares them (epilogue_tile_m 128, up/gate
///   interleaved); gemm1_weights_scale bf16 scales of blocks of 32, shuffled like the rows and
///   128x4-interleaved (E_l * round_up(2I, 128) * round_up(H/32, 4) elements); gemm2 likewise
///   [E_l, H, I/2]. Returns [output] (bf16 [T, H]).
std::vector<Tensor> trtllm_mxint4_block_scale_moe(
    const Tensor& routing_logits, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    const Tensor& gemm1_weights, const Tensor& gemm1_weights_scale,
    std::optional<Tensor> gemm1_alpha, std::optional<Tensor> gemm1_beta,
    std::optional<Tensor> gemm1_clamp_limit, const Tensor& gemm2_weights,
    const Tensor& gemm2_weights_scale, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, int64_t routing_method_type = 0,
    bool do_finalize = true, std::optional<bool> enable_pdl = std::nullopt,
    std::optional<Tensor> output = std::nullopt, int64_t tune_max_num_tokens = 8192,
    bool norm_topk_prob = true, std::optional<Tensor> routing_replay_out = std::nullopt);

/// trtllm_mxint4_block_scale_moe with precomputed routing (`topk_ids`, see MoeTopkIds).
std::vector<Tensor> trtllm_mxint4_block_scale_routed_moe(
    const MoeTopkIds& topk_ids, const Tensor& hidden_states, const Tensor& gemm1_weights,
    const Tensor& gemm1_weights_scale, std::optional<Tensor> gemm1_alpha,
    std::optional<Tensor> gemm1_beta, std::optional<Tensor> gemm1_clamp_limit,
    const Tensor& gemm2_weights, const Tensor& gemm2_weights_scale, int64_t num_experts,
    int64_t top_k, std::optional<int64_t> n_group, std::optional<int64_t> topk_group,
    int64_t intermediate_size, int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, int64_t routing_method_type = 0,
    bool do_finalize = true, std::optional<bool> enable_pdl = std::nullopt,
    std::optional<Tensor> gemm1_lora_delta = std::nullopt,
    std::optional<Tensor> output = std::nullopt, int64_t tune_max_num_tokens = 8192);

}  // namespace flashinfer
