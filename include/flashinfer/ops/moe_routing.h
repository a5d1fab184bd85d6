// Standalone trtllm-gen MoE routing (flashinfer.fused_moe.trtllm_gen_routing): expert selection
// plus the permutation the fused MoE GEMMs consume. Semantics and sources: docs/MOE.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// Upstream's RoutingMethodType (flashinfer.tllm_enums); the formulas are in docs/MOE.md.
enum class RoutingMethodType : int {
  Default = 0,
  Renormalize = 1,
  DeepSeekV3 = 2,
  Llama4 = 3,
  RenormalizeNaive = 4,
  TopK = 5,
  SigmoidRenorm = 6,
  MiniMax2 = 7,
  Sigmoid = 8,
  TopKSigmoid = 9,  // 0.6.18: top-k of the raw logits, each weight its sigmoid
};
std::string_view routing_method_type_name(RoutingMethodType m);
Value to_value(RoutingMethodType m);
RoutingMethodType routing_method_type_from_value(const Value& v,
                                                 std::string_view op = "RoutingMethodType",
                                                 std::string_view arg = "value");

/// Upstream's TrtllmGenRoutingResult, in its field order: topk_ids int32 [T, top_k + S] (-1 for
/// a non-local expert), topk_weights bf16 [T, top_k + S], total_num_padded_tokens int32 [1],
/// expanded_idx_to_permuted_idx int32 [T, top_k + S] (-1 when not local),
/// permuted_idx_to_token_idx int32 [max_padded], cta_idx_xy_to_batch_idx int32 [max_ctas],
/// cta_idx_xy_to_mn_limit int32 [max_ctas], num_non_exiting_ctas int32 [1].
using TrtllmGenRoutingResult =
    std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

/// routing_logits [T, E] fp32 or bf16 (rows contiguous); routing_bias [E] or None.
/// num_fused_shared_experts S > 0 (grouped DeepSeekV3, no expert parallelism) appends S slots
/// per token: experts E .. E + S - 1 at weight 1.0 (docs/MOE.md, "Fused shared experts").
TrtllmGenRoutingResult trtllm_gen_routing(const Tensor& routing_logits,
                                          std::optional<Tensor> routing_bias,
                                          RoutingMethodType routing_method, int64_t top_k,
                                          int64_t num_fused_shared_experts = 0, int64_t n_group = 0,
                                          int64_t topk_group = 0, int64_t local_expert_offset = 0,
                                          std::optional<int64_t> local_num_experts = std::nullopt,
                                          double routed_scaling_factor = 1.0,
                                          int64_t tile_tokens_dim = 8, bool norm_topk_prob = true,
                                          std::optional<bool> enable_pdl = std::nullopt);

}  // namespace flashinfer
