// Private: cutlass_fused_moe's arguments, bound once in src/api/moe.cpp and handed to the path
// the dtypes and flags select (unquantized there, FP8 in moe_cutlass_fp8.cpp, FP4 in
// moe_cutlass_fp4.cpp), and the checks every path shares.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "flashinfer/ops/moe.h"
#include "flashinfer/tensor.h"

namespace flashinfer::api {

/// Every argument of cutlass_fused_moe a path reads (the performance-only ones left out), named
/// as upstream names them or shortened: ids = token_selected_experts, scales =
/// token_final_scales, w1 / w2 = fc1 / fc2_expert_weights, b1 / b2 = their biases.
struct CutlassMoeCall {
  const Tensor& input;
  const Tensor& ids;
  const Tensor& scales;
  const Tensor& w1;
  const Tensor& w2;
  DType output_dtype;
  const std::vector<Tensor>& quant_scales;
  const std::optional<Tensor>& b1;
  const std::optional<Tensor>& b2;
  const std::optional<Tensor>& input_sf;
  const std::optional<Tensor>& swiglu_alpha;
  const std::optional<Tensor>& swiglu_beta;
  const std::optional<Tensor>& swiglu_limit;
  int64_t tp_size, tp_rank, ep_size, ep_rank, cluster_size, cluster_rank;
  const std::optional<Tensor>& output;
  bool enable_alltoall, use_deepseek_fp8_block_scale, use_w4_group_scaling, use_mxfp8_act_scaling,
      min_latency_mode, use_packed_weights, use_wfp4afp8_humming, swizzled_input_sf;
  std::optional<bool> enable_pdl;
  ActivationType activation_type;
  const CutlassFusedMoeOptions& options;
};

/// Checked once, before a path is chosen: min_latency_mode and enable_alltoall refused
/// (kUnsupported), situ_beta / situ_linear_beta only with Situ, the tp / ep / cluster ranks.
void check_cutlass_moe_common(const CutlassMoeCall& c);

/// token_selected_experts (int32 / int64 [T, top_k], rows contiguous) and token_final_scales
/// (fp32 / fp16 / bf16 [T, top_k]) on the input's device; returns top_k.
int64_t check_cutlass_moe_routing(const CutlassMoeCall& c, int64_t T);

/// swiglu_alpha / beta only with Swiglu / SwigluBias, swiglu_limit also with SwigluStep
/// (kUnsupported naming the argument otherwise).
void check_cutlass_moe_swiglu_args(const CutlassMoeCall& c);

}  // namespace flashinfer::api
