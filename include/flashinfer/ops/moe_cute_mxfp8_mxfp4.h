// flashinfer.fused_moe.cute_dsl.fused_moe_mxfp8_mxfp4: the MXFP8 x MXFP4 CuTe-DSL fused MoE of
// SM100 (cute_dsl_fused_moe_mxfp8_mxfp4, CuteDslMxfp8Mxfp4MoEWrapper), with upstream's checks and
// messages; the math is CuteDslMoEWrapper's quant_mode "w4a8" (upstream later made both names
// shims over it). CPU reference; refused off SM100 / SM103 as upstream's kernels are.
// docs/MOE.md ("CuTe-DSL MXFP8 x MXFP4"), docs/upstream-facts/cute_dsl_moe_mxfp8_mxfp4.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "flashinfer/op_decl.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// x e4m3 [T, H] with x_sf uint8 ue8m0 codes [T, H/32] (linear); token_selected_experts int32 /
/// token_final_scales fp32 [T, top_k]; w1_weight uint8 [E_l, 2I (Swiglu) or I (Relu2), H/2]
/// MXFP4 (gated rows [up; gate] interleaved in groups of 64); w2_weight uint8 [E_l, H, I/2];
/// their ue8m0 scales as convert_sf_to_mma_layout's 6-D view (32, 4, rows/128, 4, cols/128, E_l)
/// with its strides; w1_alpha / w2_alpha fp32 [E_l]. H and I multiples of 128. Returns bf16
/// [T, H] (moe_output when given, zeroed first); pairs routed outside the local experts add
/// nothing. tactic, aux_stream and enable_pdl do not change the result.
Tensor cute_dsl_fused_moe_mxfp8_mxfp4(
    const Tensor& x, const Tensor& x_sf, const Tensor& token_selected_experts,
    const Tensor& token_final_scales, const Tensor& w1_weight, const Tensor& w1_weight_sf,
    const Tensor& w1_alpha, const Tensor& w2_weight, const Tensor& w2_weight_sf,
    const Tensor& w2_alpha, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> num_local_experts = std::nullopt, int64_t local_expert_offset = 0,
    std::optional<Tensor> moe_output = std::nullopt, std::optional<Value> aux_stream = std::nullopt,
    std::optional<Value> tactic = std::nullopt, bool enable_pdl = true, int64_t activation_type = 3,
    double swiglu_alpha = 1.0, double swiglu_beta = 0.0,
    double swiglu_limit = 3.4028234663852886e38);

/// The same MoE with the experts, sizes and activation fixed at construction; run returns a
/// fresh bf16 [T, hidden_size].
class CuteDslMxfp8Mxfp4MoEWrapper : public ApiObject {
 public:
  CuteDslMxfp8Mxfp4MoEWrapper(int64_t num_experts, int64_t top_k, int64_t hidden_size,
                              int64_t intermediate_size,
                              std::optional<int64_t> max_num_tokens = std::nullopt,
                              std::optional<int64_t> num_local_experts = std::nullopt,
                              int64_t local_expert_offset = 0, bool use_cuda_graph = false,
                              std::string device = "cuda", bool enable_pdl = true,
                              int64_t activation_type = 3, double swiglu_alpha = 1.0,
                              double swiglu_beta = 0.0,
                              double swiglu_limit = 3.4028234663852886e38);
  CuteDslMxfp8Mxfp4MoEWrapper(const CuteDslMxfp8Mxfp4MoEWrapper&) = delete;
  CuteDslMxfp8Mxfp4MoEWrapper& operator=(const CuteDslMxfp8Mxfp4MoEWrapper&) = delete;

  Tensor run(const Tensor& x, const Tensor& x_sf, const Tensor& token_selected_experts,
             const Tensor& token_final_scales, const Tensor& w1_weight, const Tensor& w1_weight_sf,
             const Tensor& w1_alpha, const Tensor& w2_weight, const Tensor& w2_weight_sf,
             const Tensor& w2_alpha, std::optional<Value> tactic = std::nullopt);

  std::string_view class_name() const override { return "CuteDslMxfp8Mxfp4MoEWrapper"; }
  std::string_view module_name() const override {
    return "flashinfer.fused_moe.cute_dsl.fused_moe_mxfp8_mxfp4";
  }

 private:
  int64_t num_experts_ = 0, top_k_ = 0, hidden_size_ = 0, intermediate_size_ = 0;
  int64_t num_local_experts_ = 0, local_expert_offset_ = 0, activation_type_ = 3;
  double swiglu_alpha_ = 1.0, swiglu_beta_ = 0.0, swiglu_limit_ = 3.4028234663852886e38;
};

}  // namespace flashinfer
