// CuteDslMoEWrapper quant_mode "w4a16": argument checks and the CPU reference
// (kernels::cpu::cute_w4a16_moe). Upstream: CuteDslFusedMoEW4A16Runner.forward and
// launch_w4a16_moe (flashinfer/fused_moe/cute_dsl/tuner.py, blackwell/moe_w4a16.py); facts and
// citations in docs/MOE.md ("CuteDslMoEWrapper: w4a16").
#include "api/moe_cute_w4a16.h"

#include <vector>

#include "api/checks.h"
#include "api/kernel_table.h"
#include "api/moe_cute_dsl.h"
#include "api/moe_routing_checks.h"
#include "kernels/cpu/moe_cute_w4a16_cpu.h"

namespace flashinfer::moe_cute {
namespace {

constexpr api::KernelEntry<kernels::CuteW4a16MoeParams> kCuteW4a16Kernels[] = {
    {DeviceType::kCPU,
     "CPU reference: bf16 x, NVFP4 weights decoded exactly, fp32 GEMMs of the routed rows, the "
     "activation rounded to bf16, bf16 finalize",
     nullptr,
     [](const kernels::CuteW4a16MoeParams& p, const api::LaunchContext&) {
       kernels::cpu::cute_w4a16_moe(p);
     }},
};

// DEFAULT_SWIGLU_ALPHA / _BETA / _LIMIT (flashinfer.tllm_enums): 1, 0, float32 max.
constexpr double kDefaultSwigluLimit = 3.4028234663852886e38;

}  // namespace

Tensor cute_w4a16_impl(const char* op, const Tensor& x, const std::optional<Tensor>& x_sf,
                       const Tensor& ids, const Tensor& scales, const Tensor& w1,
                       const Tensor& w1_sf, const Tensor& w1_alpha,
                       const std::optional<Tensor>& fc2_input_scale, const Tensor& w2,
                       const Tensor& w2_sf, const Tensor& w2_alpha, int64_t num_experts,
                       int64_t top_k, int64_t num_local_experts, int64_t offset,
                       int64_t activation_type, double swiglu_alpha, double swiglu_beta,
                       double swiglu_limit, const std::optional<double>& situ_beta,
                       const std::optional<double>& situ_linear_beta, bool use_fused_finalize,
                       const std::optional<Tensor>& per_token_scale) {
  // Upstream's run raises ValueError unless all three are None (GEMM1's output stays bf16).
  FLASHINFER_CHECK(!x_sf.has_value(), op, "x_sf", "must be None when quant_mode='w4a16'");
  FLASHINFER_CHECK(!fc2_input_scale.has_value(), op, "fc2_input_scale",
                   "must be None when quant_mode='w4a16'");
  FLASHINFER_CHECK(!per_token_scale.has_value(), op, "per_token_scale",
                   "must be None when quant_mode='w4a16'");
  // The W4A16 epilogue's activations (Sm100W4A16GroupedGemmKernel): Swiglu (or SiTU through
  // situ_beta), GegluTanh, Relu2.
  FLASHINFER_CHECK(activation_type == 3 || activation_type == 6 || activation_type == 8, op,
                   "activation_type", "unsupported W4A16 epilogue activation: ", activation_type);
  check_situ_config(op, activation_type, situ_beta, situ_linear_beta);
  const bool gated = activation_type != 6;
  api::check_defined(x, op, "x");
  FLASHINFER_CHECK_CODE(x.device().is_cpu(), ErrorCode::kUnsupported, op, "x",
                        "quant_mode 'w4a16' has a CPU reference only (no CUDA kernel here)");
  api::check_dtype_in(x, {DType::kBFloat16}, op, "x");
  api::check_dim(x, {2}, op, "x");
  api::check_last_stride_one(x, op, "x");
  api::check_defined(ids, op, "token_selected_experts");
  api::check_dtype_in(ids, {DType::kInt32}, op, "token_selected_experts");
  api::check_dim(ids, {2}, op, "token_selected_experts");
  const int64_t T = ids.size(0), K = top_k, E = num_experts, El = num_local_experts;
  check_cute_pairs(op, x, ids, scales, T, K, {DType::kFloat32});
  FLASHINFER_CHECK(El >= 1 && offset >= 0 && offset + El <= E, op, "num_local_experts",
                   "local experts [", offset, ", ", offset + El,
                   ") must lie in [0, num_experts=", E, ")");
  api::check_defined(w2, op, "w2_weight");
  api::check_dtype_in(w2, {DType::kUInt8}, op, "w2_weight");
  api::check_dim(w2, {3}, op, "w2_weight");
  api::check_same_device(w2, x, op, "w2_weight", "x");
  // Upstream sizes the problem from w2: hidden = w2.size(1), intermediate = 2 * w2.size(2).
  const int64_t H = w2.size(1), I = 2 * w2.size(2);
  FLASHINFER_CHECK(w2.is_contiguous() && w2.size(0) == El, op, "w2_weight", "expected contiguous [",
                   El, ", hidden_size, intermediate_size / 2], got ", shape_to_string(w2.shape()));
  FLASHINFER_CHECK(H % 16 == 0 && H >= 16, op, "w2_weight",
                   "hidden_size must be a positive multiple of 16 (NVFP4 scale blocks), got ", H);
  FLASHINFER_CHECK(I >= 16 && I % (gated ? 64 : 16) == 0, op, "w2_weight",
                   "intermediate_size must be a multiple of ", gated ? 64 : 16,
                   gated ? " (gated rows interleave in groups of 64)" : " (NVFP4 scale blocks)",
                   ", got ", I);
  FLASHINFER_CHECK(x.shape() == Shape({T, H}), op, "x", "must have shape [", T, ", ", H,
                   "] for W4A16, got ", shape_to_string(x.shape()));
  const int64_t N1 = gated ? 2 * I : I;
  api::check_defined(w1, op, "w1_weight");
  api::check_dtype_in(w1, {DType::kUInt8}, op, "w1_weight");
  api::check_same_device(w1, x, op, "w1_weight", "x");
  FLASHINFER_CHECK(w1.is_contiguous() && w1.shape() == Shape({El, N1, H / 2}), op, "w1_weight",
                   "expected contiguous [", El, ", ", N1, ", ", H / 2, "] (dim 1 is ",
                   gated ? "2 * " : "", "intermediate_size), got ", shape_to_string(w1.shape()));
  const float* a1 = api::per_expert_floats(w1_alpha, El, x, op, "w1_alpha");
  const float* a2 = api::per_expert_floats(w2_alpha, El, x, op, "w2_alpha");
  // The same prepared layout as w4a4: gated rows interleaved [linear; gate] in groups of 64.
  const std::vector<int64_t> src1 = cute_row_source(N1, gated);
  const Tensor w1p = plain_rows(w1, El, N1, H / 2, src1);
  const auto [s1p, s2p] = cute_plain_weight_scales(w1_sf, w2_sf, El, N1, H, I, 16, src1, op);
  Tensor out = Tensor::empty({T, H}, DType::kBFloat16, x.device());
  kernels::CuteW4a16MoeParams p;
  p.x = static_cast<const uint16_t*>(x.data_ptr());
  p.x_stride = x.stride(0);
  p.ids = ids.data<int32_t>();
  p.scales = scales.data<float>();
  p.routed_stride = ids.stride(0);
  p.w1 = static_cast<const uint8_t*>(w1p.data_ptr());
  p.s1 = static_cast<const uint8_t*>(s1p.data_ptr());
  p.w2 = static_cast<const uint8_t*>(w2.data_ptr());
  p.s2 = static_cast<const uint8_t*>(s2p.data_ptr());
  p.alpha1 = a1;
  p.alpha2 = a2;
  p.num_tokens = T;
  p.top_k = K;
  p.hidden = H;
  p.inter = I;
  p.num_local_experts = El;
  p.expert_offset = offset;
  p.gated = gated;
  // Sm100W4A16GroupedGemmKernel: any non-default value switches on the clamp and beta.
  p.parameterized_swiglu =
      swiglu_alpha != 1.0 || swiglu_beta != 0.0 || swiglu_limit != kDefaultSwigluLimit;
  p.swiglu_alpha = static_cast<float>(swiglu_alpha);
  p.swiglu_beta = static_cast<float>(swiglu_beta);
  p.swiglu_limit = static_cast<float>(swiglu_limit);
  p.geglu_tanh = activation_type == 8;
  p.situ = situ_beta.has_value();
  p.situ_linear = situ_linear_beta.has_value();
  p.situ_beta = static_cast<float>(situ_beta.value_or(0.0));
  p.situ_linear_beta = static_cast<float>(situ_linear_beta.value_or(0.0));
  p.fused_finalize = use_fused_finalize;
  p.out = static_cast<uint16_t*>(out.data_ptr());
  p.out_stride = out.stride(0);
  api::launch(kCuteW4a16Kernels, p, x.device(), op, "x", false);
  return out;
}

}  // namespace flashinfer::moe_cute
