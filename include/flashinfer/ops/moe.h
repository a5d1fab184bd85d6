// Mixture-of-experts ops (FlashInfer modules flashinfer.fused_moe.*, flashinfer.tllm_enums).
// Semantics, layouts and the source of every fact: docs/MOE.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "flashinfer/dtype.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/quantization.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// Upstream's ActivationType (flashinfer.tllm_enums), same member names and values.
enum class ActivationType : int {
  Gelu = 0,
  Relu = 1,
  Silu = 2,
  Swiglu = 3,
  Geglu = 4,
  SwigluBias = 5,
  Relu2 = 6,
  SwigluStep = 7,
  GegluTanh = 8,
  Identity = 9,
  Situ = 10,
  InvalidType = 11,
  ClampedRelu2 = 12,  // cutlass_fused_moe only: (L * tanh(relu(x) / L))^2, L = clamped_relu2_limit
  PowLU = 13,         // cutlass_fused_moe only (gated; not implemented here)
};

/// "Swiglu", ...
std::string_view activation_type_name(ActivationType a);
/// Recorded as upstream's enum member: EnumValue{"ActivationType", "Swiglu", "3"}.
Value to_value(ActivationType a);
/// Accepts an EnumValue (by member name, else value) or an int; throws flashinfer::Error naming
/// `op` and `arg` otherwise.
ActivationType activation_type_from_value(const Value& v, std::string_view op = "ActivationType",
                                          std::string_view arg = "value");

/// Whether `activation_type` consumes a gate half of GEMM1 (Swiglu, Geglu, SwigluBias,
/// SwigluStep), as flashinfer.tllm_enums.is_gated_activation.
bool is_gated_activation(ActivationType activation_type);

/// cutlass_fused_moe's keyword-only parameters, in upstream 0.7.4's order: clamped_relu2_limit
/// (fp32 [1], the L of ActivationType.ClampedRelu2, required with it and refused without it),
/// the SiTU activation scales, backend ("cutlass"; "cake", upstream's fixed Kimi-K3 SM100 path,
/// is refused as on a GPU that is not SM100) and nvfp4_4over6 (resolved as upstream; a config
/// that is on is refused: no path here has a 4over6 recipe).
struct CutlassFusedMoeOptions {
  std::optional<Tensor> clamped_relu2_limit;
  std::optional<Tensor> situ_beta;
  std::optional<Tensor> situ_linear_beta;
  std::string backend = "cutlass";
  Value nvfp4_4over6 = nvfp4_4over6_unset();
};
FLASHINFER_OPTION_FIELDS(CutlassFusedMoeOptions, clamped_relu2_limit, situ_beta, situ_linear_beta,
                         backend, nvfp4_4over6);

/// Fused MoE layer (upstream's CUTLASS backend), unquantized fp32 / fp16 / bf16:
///   out[t] = sum_k token_final_scales[t, k] * FFN_e(input[t]),  e = token_selected_experts[t, k]
///   FFN_e(x) = act(x @ w1[e].T + b1[e]) @ w2[e].T + b2[e]; for gated activations the first
///   half of w1[e]'s rows is the up projection, the second half the gate (docs/MOE.md).
///   input                 [T, H] fp32, fp16 or bf16.
///   token_selected_experts [T, k] int32 or int64 global expert ids.
///   token_final_scales    [T, k] fp32, fp16 or bf16.
///   fc1_expert_weights    [E_l, 2I or I, H], input's dtype; fc2_expert_weights [E_l, H, I].
///   Experts [ep_rank * E_l, (ep_rank + 1) * E_l) are local; other ids contribute nothing.
///   quant_scales          None (upstream's call for bf16 / fp16 experts) or the empty list for
///                         the unquantized path; the quantized paths take upstream's list.
/// Returns [output [T, H] in output_dtype, and upstream's three scratch tensors
/// (num_active_experts_per_node int32 [1], experts_to_token_score fp32 [E_l, T],
/// active_expert_global_ids int32 [E_l]), zero-filled here, never written upstream].
/// Quantized paths and min_latency_mode raise flashinfer::Error(kUnsupported).
std::vector<Tensor> cutlass_fused_moe(
    const Tensor& input, const Tensor& token_selected_experts, const Tensor& token_final_scales,
    const Tensor& fc1_expert_weights, const Tensor& fc2_expert_weights, DType output_dtype,
    std::optional<std::vector<Tensor>> quant_scales,
    std::optional<Tensor> fc1_expert_biases = std::nullopt,
    std::optional<Tensor> fc2_expert_biases = std::nullopt,
    std::optional<Tensor> input_sf = std::nullopt,
    std::optional<Tensor> swiglu_alpha = std::nullopt,
    std::optional<Tensor> swiglu_beta = std::nullopt,
    std::optional<Tensor> swiglu_limit = std::nullopt, int64_t tp_size = 1, int64_t tp_rank = 0,
    int64_t ep_size = 1, int64_t ep_rank = 0, int64_t cluster_size = 1, int64_t cluster_rank = 0,
    std::optional<Tensor> output = std::nullopt, bool enable_alltoall = false,
    bool use_deepseek_fp8_block_scale = false, bool use_w4_group_scaling = false,
    bool use_mxfp8_act_scaling = false, bool min_latency_mode = false,
    bool use_packed_weights = false, bool use_wfp4afp8_humming = false,
    int64_t tune_max_num_tokens = 8192, std::optional<bool> enable_pdl = std::nullopt,
    ActivationType activation_type = ActivationType::Swiglu, bool swizzled_input_sf = true,
    std::optional<bool> use_fused_finalize = std::nullopt,
    std::optional<std::vector<int64_t>> profile_ids = std::nullopt,
    std::optional<Tensor> workspace_buffer = std::nullopt, CutlassFusedMoeOptions options = {});

/// DeepSeek-V3 grouped top-k routing (no auxiliary loss), in place:
///   s = sigmoid(scores), b = s + bias; groups of num_experts / n_group experts scored by the
///   sum of their two largest b; the topk_group best groups kept; the topk largest b among them
///   selected (descending, lower index first on ties); weights s / (sum of selected s + 1e-20) *
///   routed_scaling_factor.
///   scores [T, E] fp32 / fp16 / bf16; bias [E] (any of those dtypes).
///   topk_values [T, topk] (scores' dtype or fp32) and topk_indices [T, topk] int32 are written;
///   routing_replay_out, when given, int16 [>= T, topk], rows [0, T) get the indices.
/// `backend` "default" (upstream's "cake" backend is Blackwell-only: refused here).
void fused_topk_deepseek(const Tensor& scores, const Tensor& bias, int64_t n_group,
                         int64_t topk_group, int64_t topk, double routed_scaling_factor,
                         const Tensor& topk_values, const Tensor& topk_indices,
                         bool launch_with_pdl = true,
                         std::optional<Tensor> routing_replay_out = std::nullopt,
                         std::string_view backend = "default");

/// Upstream's WeightLayout (flashinfer.tllm_enums): MajorK [Mn, K]; MajorMn [K, Mn];
/// BlockMajorK [K / blockK, Mn, blockK] with blockK = 128 bytes.
enum class WeightLayout : int { MajorK = 0, MajorMn = 1, BlockMajorK = 2 };
std::string_view weight_layout_name(WeightLayout w);
Value to_value(WeightLayout w);
WeightLayout weight_layout_from_value(const Value& v, std::string_view op = "WeightLayout",
                                      std::string_view arg = "value");

/// What the trtllm-gen BF16 and FP8 MoE ops return, as upstream does: with do_finalize the bf16
/// [T, H] output (recorded as `result`); with do_finalize=False the list [gemm2_output (bf16
/// [T * top_k, H], one unweighted row per local (token, k) pair, permuted), expert_weights
/// ([T, top_k]), expanded_idx_to_permuted_idx (int32 [T * top_k], -1 for a pair with no local
/// expert)] (recorded as result__0..2; docs/MOE.md, "do_finalize=False"). With a
/// gemm1_lora_delta (trtllm_bf16_routed_moe) the lists grow as upstream's: [output,
/// expanded_idx_to_permuted_idx, activation] finalized, the unfinalized list plus the activation
/// otherwise (the post-activation GEMM1 rows, bf16 [T * top_k, I], permuted as gemm2_output).
/// Converts to the output tensor when finalized without a delta.
struct TrtllmMoeResult {
  std::vector<Tensor> tensors;
  bool finalized = true;
  operator Tensor() const;  // NOLINT(google-explicit-constructor): the finalized output
};
Value to_value(const TrtllmMoeResult& r);

/// trtllm-gen BF16 MoE with routing from logits (routing methods: docs/MOE.md):
///   routing_logits [T, num_experts] fp32 or bf16; routing_bias [num_experts] or None;
///   hidden_states [T, H] bf16; gemm1_weights [local_num_experts, 2I or I, H] bf16 (up rows
///   first, then gate); gemm2_weights [local_num_experts, H, I] bf16. Experts
///   [local_expert_offset, local_expert_offset + local_num_experts) are local.
/// Returns the bf16 [T, H] output, or with do_finalize=False the unfinalized list (see
/// TrtllmMoeResult). Every weight layout but MajorMn (refused, as upstream).
TrtllmMoeResult trtllm_bf16_moe(
    const Tensor& routing_logits, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    const Tensor& gemm1_weights, const Tensor& gemm2_weights, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor = std::nullopt, int64_t routing_method_type = 0,
    bool use_shuffled_weight = true, WeightLayout weight_layout = WeightLayout::BlockMajorK,
    bool do_finalize = true, bool enable_pdl = true, int64_t tune_max_num_tokens = 8192,
    int64_t activation_type = 3, bool norm_topk_prob = true,
    std::optional<Tensor> routing_replay_out = std::nullopt,
    std::optional<Tensor> gemm1_alpha = std::nullopt,
    std::optional<Tensor> gemm1_beta = std::nullopt,
    std::optional<Tensor> gemm1_clamp_limit = std::nullopt,
    std::optional<Tensor> output = std::nullopt,
    std::optional<Tensor> workspace_buffer = std::nullopt);

/// Upstream's precomputed routing argument `topk_ids`: a packed int32 [T, top_k] tensor
/// ((expert_id << 16) | the bf16 weight's bits), or an (ids int32, weights bf16/fp32) pair.
struct MoeTopkIds {
  Tensor ids;
  std::optional<Tensor> weights;                         // set for the pair form
  MoeTopkIds(Tensor packed) : ids(std::move(packed)) {}  // NOLINT: upstream passes a tensor
  MoeTopkIds(Tensor i, Tensor w) : ids(std::move(i)), weights(std::move(w)) {}
  /// f(tensor, item) for the gate's written-argument check: item -1 for the packed tensor, 0 and
  /// 1 for the pair.
  template <class F>
  void for_each_tensor(F&& f) const {
    if (weights) {
      f(ids, 0);
      f(*weights, 1);
    } else {
      f(ids, -1);
    }
  }
};
/// Recorded as upstream records it: the tensor, or a (ids, weights) tuple.
Value to_value(const MoeTopkIds& t);

/// trtllm_bf16_moe with precomputed routing (`topk_ids`, see MoeTopkIds): the weights are used
/// as given. Same layouts, limits and refusals as trtllm_bf16_moe. gemm1_lora_delta (vLLM's LoRA
/// MoE; the CPU reference only): bf16 [T, top_k, 2I] in routing order (up columns, then gate),
/// added in fp32 to each pair's GEMM1 output before the activation (a gated one); the result
/// then carries the activation (TrtllmMoeResult). With do_finalize=False and the (ids, weights)
/// form, expert_weights is the caller's weights tensor itself (upstream returns the borrowed
/// buffer).
TrtllmMoeResult trtllm_bf16_routed_moe(
    const MoeTopkIds& topk_ids, const Tensor& hidden_states, const Tensor& gemm1_weights,
    const Tensor& gemm2_weights, int64_t num_experts, int64_t top_k, std::optional<int64_t> n_group,
    std::optional<int64_t> topk_group, int64_t intermediate_size, int64_t local_expert_offset,
    int64_t local_num_experts, std::optional<double> routed_scaling_factor = std::nullopt,
    int64_t routing_method_type = 0, bool use_shuffled_weight = true,
    WeightLayout weight_layout = WeightLayout::BlockMajorK, bool do_finalize = true,
    bool enable_pdl = true, std::optional<Tensor> gemm1_lora_delta = std::nullopt,
    int64_t tune_max_num_tokens = 8192, int64_t activation_type = 3,
    std::optional<Tensor> routing_replay_out = std::nullopt,
    std::optional<Tensor> gemm1_alpha = std::nullopt,
    std::optional<Tensor> gemm1_beta = std::nullopt,
    std::optional<Tensor> gemm1_clamp_limit = std::nullopt,
    std::optional<Tensor> output = std::nullopt,
    std::optional<Tensor> workspace_buffer = std::nullopt);

/// Hash-based MoE routing (DeepSeek-V4 hash layers): token t's experts are
/// tid2eid[input_ids[t], :], weights sqrt(softplus(router_logits[t, e])) / their sum over the
/// routed experts (fp32). With num_fused_shared_experts = 1 a last slot holds expert id
/// num_experts with weight 1 / routed_scaling_factor.
///   router_logits [T, E] fp32; input_ids [T] int64; tid2eid [vocab, topk] int32.
/// Returns (topk_weights fp32 [T, topk + shared], topk_ids int32 [T, topk + shared]).
std::tuple<Tensor, Tensor> hash_topk(const Tensor& router_logits, const Tensor& input_ids,
                                     const Tensor& tid2eid, int64_t num_fused_shared_experts = 0,
                                     double routed_scaling_factor = 1.0,
                                     bool launch_with_pdl = true);

}  // namespace flashinfer
