// The Blackwell CuTe-DSL MoE wrappers: flashinfer.fused_moe.cute_dsl.b12x_moe (b12x_fused_moe,
// B12xMoEWrapper) and flashinfer.fused_moe.cute_dsl.fused_moe (CuteDslMoEWrapper), on the CPU
// NVFP4 math of cute_dsl_fused_moe_nvfp4. CPU reference only. Semantics and sources:
// docs/MOE.md ("Blackwell wrappers").
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "flashinfer/op_decl.h"
#include "flashinfer/ops/quantization.h"  // nvfp4_4over6_unset
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// b12x fused MoE (SM120 upstream), precomputed routing, quant_mode "nvfp4" (w4a4):
///   x bf16 [T, H], quantized per (token, expert) to NVFP4 with input_global_scale ([1] or
///   [E]; None: 1) and dequantized as e2m1 * sf (upstream's reference keeps the global scale in
///   the values; w1_alpha takes it out);
///   w1_weight uint8 [E, 2I, H/2] plain rows, up (linear) half then gate half ("silu") or
///   [E, I, H/2] ("relu2"); w2_weight uint8 [E, H, I/2]; *_sf the 128x4-swizzled e4m3 scales
///   per expert (contiguous or convert_sf_to_mma_layout's 6-D view);
///   token_selected_experts int32 [T, top_k], token_final_scales fp32 [T, top_k];
///   w1_alpha / w2_alpha fp32 [E]; fc2_input_scale fp32 [1] or [E] (required): the global scale
///   of the activation's NVFP4 quantization, kept in the values like x's.
/// Returns bf16 [T, H] (into `output` when given). expert_map (upstream 0.7.4, int32
/// [num_experts], w4a16 only; required when num_local_experts != num_experts): global expert g
/// runs local weights expert_map[g], -1 drops the route (this rank's zero-filled partial).
/// quant_mode "w4a8_*", activations other than "silu"/"relu2" and swiglu_limit are refused
/// (kUnsupported).
Tensor b12x_fused_moe(
    const Tensor& x, const Tensor& w1_weight, const Tensor& w1_weight_sf, const Tensor& w2_weight,
    const Tensor& w2_weight_sf, const Tensor& token_selected_experts,
    const Tensor& token_final_scales, int64_t num_experts, int64_t top_k, const Tensor& w1_alpha,
    const Tensor& w2_alpha, std::optional<Tensor> fc2_input_scale = std::nullopt,
    std::optional<Tensor> input_global_scale = std::nullopt,
    std::optional<int64_t> num_local_experts = std::nullopt,
    std::optional<Tensor> expert_map = std::nullopt, std::optional<Tensor> output = std::nullopt,
    DType output_dtype = DType::kBFloat16, std::string activation = "silu",
    double swiglu_alpha = 1.702, double swiglu_beta = 1.0,
    std::optional<double> swiglu_limit = std::nullopt, std::string activation_precision = "fp4",
    std::optional<std::string> quant_mode = std::nullopt, std::string source_format = "modelopt");

/// B12xMoEWrapper: b12x_fused_moe with the constructor's settings (upstream pre-allocates
/// CUDA-graph buffers of max_num_tokens rows; here the limit is checked, nothing is kept).
class B12xMoEWrapper : public ApiObject {
 public:
  B12xMoEWrapper(int64_t num_experts, int64_t top_k, int64_t hidden_size, int64_t intermediate_size,
                 bool use_cuda_graph = false, int64_t max_num_tokens = 4096,
                 std::optional<int64_t> num_local_experts = std::nullopt,
                 std::optional<Tensor> expert_map = std::nullopt,
                 DType output_dtype = DType::kBFloat16, std::string device = "cuda",
                 std::string activation = "silu", double swiglu_alpha = 1.702,
                 double swiglu_beta = 1.0, std::optional<double> swiglu_limit = std::nullopt,
                 std::string activation_precision = "fp4",
                 std::optional<std::string> quant_mode = std::nullopt,
                 std::string source_format = "modelopt",
                 std::optional<Value> shared_static_workspace = std::nullopt,
                 std::optional<Value> shared_dynamic_workspace = std::nullopt,
                 std::optional<Tensor> shared_output = std::nullopt);
  B12xMoEWrapper(const B12xMoEWrapper&) = delete;
  B12xMoEWrapper& operator=(const B12xMoEWrapper&) = delete;

  /// As b12x_fused_moe; x [T, hidden_size] with T <= max_num_tokens under use_cuda_graph.
  Tensor run(const Tensor& x, const Tensor& w1_weight, const Tensor& w1_weight_sf,
             const Tensor& w2_weight, const Tensor& w2_weight_sf,
             const Tensor& token_selected_experts, const Tensor& token_final_scales,
             const Tensor& w1_alpha, const Tensor& w2_alpha,
             std::optional<Tensor> fc2_input_scale = std::nullopt,
             std::optional<Tensor> input_global_scale = std::nullopt);

  std::string_view class_name() const override { return "B12xMoEWrapper"; }
  std::string_view module_name() const override { return "flashinfer.fused_moe.cute_dsl.b12x_moe"; }
  int64_t num_experts() const { return num_experts_; }
  int64_t top_k() const { return top_k_; }
  int64_t hidden_size() const { return hidden_size_; }
  int64_t intermediate_size() const { return intermediate_size_; }
  /// The normalized mode ("nvfp4" or "w4a16", from quant_mode or activation_precision).
  const std::string& quant_mode() const { return quant_mode_; }

 private:
  int64_t num_experts_ = 0, top_k_ = 0, hidden_size_ = 0, intermediate_size_ = 0;
  bool use_cuda_graph_ = false;
  int64_t max_num_tokens_ = 0, num_local_experts_ = 0;
  std::string activation_, quant_mode_, source_format_;
  double swiglu_alpha_ = 1.702, swiglu_beta_ = 1.0;
  std::optional<double> swiglu_limit_;
  std::optional<Tensor> expert_map_;     // the constructor's map, cloned (upstream clones it)
  std::optional<Tensor> shared_output_;  // run() returns its first T rows (use_cuda_graph)
};

/// CuteDslMoEWrapper: cute_dsl_fused_moe (the math of cute_dsl_fused_moe_nvfp4) with the
/// constructor's settings. quant_mode "w4a4" (or its alias "nvfp4") and "w4a16" (bf16 x, bf16
/// output) run; "w4a8" is accepted by the constructor and refused by run (kUnsupported).
class CuteDslMoEWrapper : public ApiObject {
 public:
  CuteDslMoEWrapper(int64_t num_experts, int64_t top_k, int64_t hidden_size,
                    int64_t intermediate_size, bool use_cuda_graph = false,
                    std::optional<int64_t> max_num_tokens = std::nullopt,
                    std::optional<int64_t> num_local_experts = std::nullopt,
                    int64_t local_expert_offset = 0, int64_t tile_size = 128,
                    int64_t sf_vec_size = 16, DType output_dtype = DType::kBFloat16,
                    std::string device = "cuda", bool enable_pdl = true,
                    int64_t activation_type = 3, double swiglu_alpha = 1.0,
                    double swiglu_beta = 0.0, double swiglu_limit = 3.4028234663852886e38,
                    std::optional<double> situ_beta = std::nullopt,
                    std::optional<double> situ_linear_beta = std::nullopt,
                    bool use_fused_finalize = true, std::string quant_mode = "w4a4",
                    std::optional<Tensor> clamped_relu2_limit = std::nullopt, bool swap_ab = false);
  CuteDslMoEWrapper(const CuteDslMoEWrapper&) = delete;
  CuteDslMoEWrapper& operator=(const CuteDslMoEWrapper&) = delete;

  /// As cute_dsl_fused_moe_nvfp4 with the wrapper's experts, activation and output dtype;
  /// tactic (an autotuner choice) has no numeric effect. Returns [T, H] of output_dtype.
  /// nvfp4_4over6 (upstream 0.7.4, keyword-only): the activation's NVFP4 recipe, resolved as
  /// fp4_quantize's (ops/quantization.h) and refused when on (not implemented here).
  Tensor run(const Tensor& x, std::optional<Tensor> x_sf, const Tensor& token_selected_experts,
             const Tensor& token_final_scales, const Tensor& w1_weight, const Tensor& w1_weight_sf,
             const Tensor& w1_alpha, std::optional<Tensor> fc2_input_scale, const Tensor& w2_weight,
             const Tensor& w2_weight_sf, const Tensor& w2_alpha,
             std::optional<Value> tactic = std::nullopt,
             std::optional<Tensor> per_token_scale = std::nullopt,
             const Value& nvfp4_4over6 = nvfp4_4over6_unset());

  std::string_view class_name() const override { return "CuteDslMoEWrapper"; }
  std::string_view module_name() const override {
    return "flashinfer.fused_moe.cute_dsl.fused_moe";
  }
  /// The canonical mode ("w4a4", "w4a8" or "w4a16").
  const std::string& quant_mode() const { return quant_mode_; }

 private:
  int64_t num_experts_ = 0, top_k_ = 0, hidden_size_ = 0, intermediate_size_ = 0;
  std::optional<int64_t> num_local_experts_;
  int64_t local_expert_offset_ = 0, sf_vec_size_ = 16, activation_type_ = 3;
  DType output_dtype_ = DType::kBFloat16;
  double swiglu_alpha_ = 1.0, swiglu_beta_ = 0.0, swiglu_limit_ = 3.4028234663852886e38;
  std::optional<double> situ_beta_, situ_linear_beta_;
  bool use_fused_finalize_ = true;  // w4a16: the two finalize paths round differently
  std::string quant_mode_;
  std::optional<Tensor> clamped_relu2_limit_;
};

}  // namespace flashinfer
