// FP4 / MxInt4 trtllm-gen MoE ops (flashinfer.fused_moe.core): NVFP4 and MXFP4 weights
// (trtllm_fp4_block_scale_moe and _routed_) and MxInt4 weights (trtllm_mxint4_block_scale_moe
// and _routed_), with routing from logits or precomputed. CPU reference only. Semantics and
// sources: docs/MOE.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "flashinfer/ops/moe.h"
#include "flashinfer/ops/quantization.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

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
/// Returns [output] (bf16 [T, H]), as upstream returns a list; with do_finalize=False the
/// unfinalized list [gemm2_output, expert_weights, expanded_idx_to_permuted_idx] (see
/// TrtllmMoeResult). per_token_scale is refused (kUnsupported); num_fused_shared_experts: see
/// docs/MOE.md, "Fused shared experts". Upstream 0.7.4's padded dimensions (here and on the
/// MxInt4 and FP8 block-scale ops): with valid_hidden_size vh, GEMM1 contracts the first
/// N = roundUp(vh, 128) hidden columns, gemm2_weights (and scales) have N rows, and the output is
/// [T, vh]; with valid_intermediate_size vi, FC1 computes rows [0, roundUp(vi, 128)) of each half
/// and GEMM2 contracts that many columns (docs/MOE.md, "Padded dimensions").
/// hidden_states_scale_layout: only SfLayout.layout_linear (None means it);
/// workspace_buffer: caller scratch, checked, never changes a value; nvfp4_4over6: resolved as
/// upstream, and a config that is on is refused with upstream's text (it needs per_token_scale).
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
    std::optional<int64_t> num_fused_shared_experts = std::nullopt,
    std::optional<int64_t> valid_hidden_size = std::nullopt,
    std::optional<int64_t> valid_intermediate_size = std::nullopt,
    const Value& hidden_states_scale_layout = Value(),
    std::optional<Tensor> workspace_buffer = std::nullopt,
    const Value& nvfp4_4over6 = nvfp4_4over6_unset());

/// trtllm_fp4_block_scale_moe with precomputed routing (`topk_ids`, see MoeTopkIds).
/// routing_metadata: upstream's TrtllmMoERoutingMetadataSlot, routing maps the caller populated
/// from the same topk_ids (upstream then skips its routing kernel; the values are the same), so
/// the routing here is computed from topk_ids whatever the slot holds.
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
    std::optional<Tensor> gemm1_lora_delta = std::nullopt,
    std::optional<int64_t> valid_hidden_size = std::nullopt,
    std::optional<int64_t> valid_intermediate_size = std::nullopt,
    std::optional<int64_t> num_fused_shared_experts = std::nullopt,
    const Value& hidden_states_scale_layout = Value(),
    std::optional<Tensor> workspace_buffer = std::nullopt,
    const Value& nvfp4_4over6 = nvfp4_4over6_unset(), const Value& routing_metadata = Value());

/// trtllm-gen MxInt4 block-scale MoE (Swiglu), routing from logits:
///   hidden_states bf16 [T, H]; gemm1_weights uint8 [E_l, 2I, H/2] (MajorK) or
///   [E_l, H/2/bk, 2I, bk] (BlockMajorK over bytes), signed int4 nibbles (element 2j in the low
///   nibble), rows shuffled as upstream prepares them (epilogue_tile_m 128, up/gate
///   interleaved); gemm1_weights_scale bf16 scales of blocks of 32, shuffled like the rows and
///   128x4-interleaved (E_l * round_up(2I, 128) * round_up(H/32, 4) elements); gemm2 likewise
///   [E_l, H, I/2]. Returns [output] (bf16 [T, H]), or the unfinalized list with
///   do_finalize=False (see TrtllmMoeResult).
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
    bool norm_topk_prob = true, std::optional<Tensor> routing_replay_out = std::nullopt,
    std::optional<int64_t> valid_hidden_size = std::nullopt,
    std::optional<int64_t> valid_intermediate_size = std::nullopt,
    std::optional<Tensor> workspace_buffer = std::nullopt);

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
    std::optional<Tensor> output = std::nullopt, int64_t tune_max_num_tokens = 8192,
    std::optional<int64_t> valid_hidden_size = std::nullopt,
    std::optional<int64_t> valid_intermediate_size = std::nullopt,
    std::optional<Tensor> workspace_buffer = std::nullopt);

/// CuTe-DSL NVFP4 fused MoE (flashinfer.fused_moe.cute_dsl.fused_moe), precomputed routing:
///   x uint8 [T, H/2] packed NVFP4 with x_sf e4m3 [T, H/16] (linear; a trailing 1 allowed);
///   token_selected_experts int32 [T, top_k] (global ids), token_final_scales fp32 [T, top_k];
///   w1_weight uint8 [E_l, 2I, H/2] (gated: linear / gate rows interleaved in groups of 64, as
///   upstream's tests prepare them) or [E_l, I, H/2] (Relu2); w1_weight_sf the 128x4-swizzled
///   e4m3 scales per expert (contiguous, or the 6-D view of convert_sf_to_mma_layout);
///   w1_alpha / w2_alpha fp32 [E_l]; fc2_input_scale fp32 [1] or [E_l] (the global scale of the
///   activation's NVFP4 quantization; None: not quantized). Returns [T, H] of output_dtype.
///   CPU only. quant_mode "w4a4" (above, with per_token_scale) or "w4a8" (x e4m3 with ue8m0
///   scales per 32, MXFP4 weights); "w4a16" goes through CuteDslMoEWrapper (kUnsupported here).
///   SiTU takes situ_beta and, optionally, situ_linear_beta (docs/MOE.md "Blackwell wrappers").
Tensor cute_dsl_fused_moe_nvfp4(
    const Tensor& x, std::optional<Tensor> x_sf, const Tensor& token_selected_experts,
    const Tensor& token_final_scales, const Tensor& w1_weight, const Tensor& w1_weight_sf,
    const Tensor& w1_alpha, std::optional<Tensor> fc2_input_scale, const Tensor& w2_weight,
    const Tensor& w2_weight_sf, const Tensor& w2_alpha, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> num_local_experts = std::nullopt, int64_t local_expert_offset = 0,
    DType output_dtype = DType::kBFloat16, bool use_fused_finalize = true,
    std::optional<Tensor> moe_output = std::nullopt, std::optional<Value> aux_stream = std::nullopt,
    bool enable_pdl = true, int64_t activation_type = 3, double swiglu_alpha = 1.0,
    double swiglu_beta = 0.0, double swiglu_limit = 3.4028234663852886e38,
    std::optional<double> situ_beta = std::nullopt,
    std::optional<double> situ_linear_beta = std::nullopt, std::string_view quant_mode = "w4a4",
    std::optional<Tensor> per_token_scale = std::nullopt,
    std::optional<Value> localized_weights = std::nullopt,
    std::optional<Value> localized_streams = std::nullopt,
    std::optional<int64_t> localized_sm_count = std::nullopt,
    std::optional<Value> localized_memset_stream = std::nullopt,
    bool localized_allow_nonlocalized = false, bool autotune_use_cuda_graph = false,
    const Value& nvfp4_4over6 = nvfp4_4over6_unset(),
    std::optional<Tensor> clamped_relu2_limit = std::nullopt);

}  // namespace flashinfer
