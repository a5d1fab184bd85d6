// Private: CuteDslMoEWrapper's quant_mode "w4a16" (bf16 x, NVFP4 weights), called by
// CuteDslMoEWrapper::run (src/api/moe_b12x.cpp). Semantics and sources: docs/MOE.md
// ("CuteDslMoEWrapper: w4a16").
#pragma once

#include <cstdint>
#include <optional>

#include "flashinfer/tensor.h"

namespace flashinfer::moe_cute {

/// The W4A16 pipeline of upstream's launch_w4a16_moe with the wrapper's settings; errors name
/// `op` and the argument. Returns bf16 [T, H].
Tensor cute_w4a16_impl(const char* op, const Tensor& x, const std::optional<Tensor>& x_sf,
                       const Tensor& ids, const Tensor& scales, const Tensor& w1,
                       const Tensor& w1_sf, const Tensor& w1_alpha,
                       const std::optional<Tensor>& fc2_input_scale, const Tensor& w2,
                       const Tensor& w2_sf, const Tensor& w2_alpha, int64_t num_experts,
                       int64_t top_k, int64_t num_local_experts, int64_t offset,
                       int64_t activation_type, double swiglu_alpha, double swiglu_beta,
                       double swiglu_limit, const std::optional<double>& situ_beta,
                       const std::optional<double>& situ_linear_beta, bool use_fused_finalize,
                       const std::optional<Tensor>& per_token_scale);

}  // namespace flashinfer::moe_cute
