// Private: what the FP8 trtllm MoE kernels receive (trtllm_fp8_block_scale_moe,
// trtllm_fp8_per_tensor_scale_moe and their _routed_ forms). Semantics: docs/MOE.md.
#pragma once

#include <cstdint>

#include "kernels/moe_layout_rules.h"
#include "kernels/moe_params.h"

namespace flashinfer::kernels {

/// base.moe.input: fp8 e4m3fn hidden states [num_tokens, hidden] (row stride in_stride);
/// base.moe.w1 / w2: fp8 e4m3fn weights [num_local_experts, gemm1_n, hidden] and
/// [num_local_experts, hidden, inter]: plain on the CPU (the API layer undoes any shuffle /
/// block layout on the host), stored as w1_index / w2_index describe on CUDA (the kernels read
/// them in place); base.moe.out: bf16 [num_tokens, hidden]. Routing as in TrtllmMoeParams.
struct TrtllmFp8MoeParams {
  TrtllmMoeParams base;
  MoeWeightIndex w1_index, w2_index;  // CUDA only (the CPU gets plain weights)
  bool block_scale = true;            // DeepSeek FP8 128x128 block scales; false: per-tensor scales
  // Block scale: hs_scale [hidden / 128, num_tokens] fp32 (row stride hs_scale_stride),
  // w1_scale [num_local_experts, gemm1_n / 128, hidden / 128], w2_scale [.., hidden / 128,
  // inter / 128], contiguous fp32.
  const float* hs_scale = nullptr;
  int64_t hs_scale_stride = 0;
  const float* w1_scale = nullptr;
  const float* w2_scale = nullptr;
  // Per tensor: [num_local_experts] fp32 each.
  const float* out1_scale = nullptr;       // output1_scales_scalar
  const float* out1_gate_scale = nullptr;  // output1_scales_gate_scalar
  const float* out2_scale = nullptr;       // output2_scales_scalar
  bool routing_scales_on_input = false;    // Llama4: routing weight applied to GEMM1's output
  // CUDA only, set by the launcher from the stream's scratch: ws_ids [num_tokens * top_k]
  // int32, ws_w (the bf16-rounded routing weights) [num_tokens * top_k], ws_g1 [.., gemm1_n],
  // ws_h [.., inter], ws_y [.., hidden] fp32.
  int32_t* ws_ids = nullptr;
  float* ws_w = nullptr;
  float* ws_g1 = nullptr;
  float* ws_h = nullptr;
  float* ws_y = nullptr;
};

/// trtllm_gen_routing: routing, then the per-local-expert permutation padded to tile_tokens_dim.
struct TrtllmGenRoutingParams {
  MoeRoutingParams routing;
  int64_t local_expert_offset = 0, local_num_experts = 0, tile = 8;
  // Fused shared experts S: slots top_k .. top_k + S - 1 of every token hold expert
  // num_experts + s at weight 1.0 (local expert local_num_experts + s; no expert parallelism).
  int64_t num_shared = 0;
  int32_t* topk_ids = nullptr;              // [T, top_k + S]
  uint16_t* topk_weights = nullptr;         // bf16 bits [T, top_k + S]
  int32_t* total_padded = nullptr;          // [1]
  int32_t* expanded_to_permuted = nullptr;  // [T, top_k + S]
  int32_t* permuted_to_token = nullptr;     // [max_padded]
  int64_t max_padded = 0;
  int32_t* cta_to_batch = nullptr;     // [max_ctas]
  int32_t* cta_to_mn_limit = nullptr;  // [max_ctas]
  int64_t max_ctas = 0;
  int32_t* num_ctas = nullptr;  // [1]
};

/// The most experts the CUDA routing kernel handles (one thread per token keeps per-expert
/// scores in local memory).
constexpr int64_t kFp8MoeCudaMaxExperts = 512;

}  // namespace flashinfer::kernels
