// Private: CuteDslMoEWrapper / cute_dsl_fused_moe_nvfp4 with quant_mode "w4a8" (MXFP8 x, MXFP4
// weights). Semantics and sources: docs/MOE.md ("CuTe-DSL w4a8").
#pragma once

#include <cstdint>
#include <optional>

#include "flashinfer/tensor.h"

namespace flashinfer::moe_cute {

Tensor cute_w4a8_impl(const char* op, const Tensor& x, const std::optional<Tensor>& x_sf,
                      const Tensor& ids, const Tensor& scales, const Tensor& w1,
                      const Tensor& w1_sf, const Tensor& w1_alpha,
                      const std::optional<Tensor>& fc2_input_scale, const Tensor& w2,
                      const Tensor& w2_sf, const Tensor& w2_alpha, int64_t num_experts,
                      int64_t top_k, std::optional<int64_t> num_local_experts, int64_t offset,
                      DType output_dtype, const std::optional<Tensor>& moe_output,
                      bool use_fused_finalize, int64_t activation_type, double swiglu_alpha,
                      double swiglu_beta, double swiglu_limit,
                      const std::optional<double>& situ_beta,
                      const std::optional<double>& situ_linear_beta,
                      const std::optional<Tensor>& per_token_scale);

}  // namespace flashinfer::moe_cute
