// CuTe-DSL MoE quant_mode "w4a8": MXFP8 activations (e4m3 with ue8m0 scales of 32) against MXFP4
// weights (e2m1 with ue8m0 scales of 32), GEMM1's output requantized to MXFP8 in its epilogue.
// Argument checks and the CPU reference (kernels::cpu::trtllm_fp4_moe with MXFP8 input, MXFP4
// weights and the kMxfp8Fp32 activation). Upstream: _moe_core_impl / validate_w4a8_inputs in
// flashinfer/fused_moe/cute_dsl/fused_moe.py of the 0.7.2.post1 wheel; facts and citations in
// docs/MOE.md ("CuTe-DSL w4a8").
#include "api/moe_cute_w4a8.h"

#include <vector>

#include "api/checks.h"
#include "api/kernel_table.h"
#include "api/moe_cute_dsl.h"
#include "api/moe_routing_checks.h"
#include "kernels/cpu/moe_fp4_cpu.h"
#include "kernels/moe_fp4_params.h"

namespace flashinfer::moe_cute {
namespace {

constexpr api::KernelEntry<kernels::TrtllmFp4MoeParams> kCuteW4a8Kernels[] = {
    {DeviceType::kCPU,
     "CPU reference: MXFP8 x and MXFP4 weights decoded exactly, per-expert fp32 GEMMs of the "
     "routed rows, the fp32 activation requantized to MXFP8, fp32 finalize rounded once to bf16",
     nullptr,
     [](const kernels::TrtllmFp4MoeParams& p, const api::LaunchContext&) {
       kernels::cpu::trtllm_fp4_moe(p);
     }},
};

// validate_w4a8_inputs: the weight scales are convert_sf_to_mma_layout's 6-D view of the
// 128x4-swizzled ue8m0 bytes (32, 4, m_tiles, 4, k_tiles, E). Upstream also demands the view's
// strides; we read through any strides, so a recorded (contiguous) copy of the view replays.
void check_w4a8_weight_scales(const Tensor& s, int64_t E, int64_t rows, int64_t cols,
                              const char* op, const char* arg) {
  api::check_defined(s, op, arg);
  api::check_dtype_in(s, {DType::kUInt8}, op, arg);
  const int64_t mt = (rows + 127) / 128, kt = (cols + 127) / 128;
  const Shape shape{32, 4, mt, 4, kt, E};
  FLASHINFER_CHECK(s.shape() == shape, op, arg, "must be the MMA scale view of shape ",
                   shape_to_string(shape), ", got ", shape_to_string(s.shape()));
}

}  // namespace

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
                      const std::optional<Tensor>& per_token_scale) {
  api::check_defined(x, op, "x");
  FLASHINFER_CHECK_CODE(x.device().is_cpu(), ErrorCode::kUnsupported, op, "x",
                        "quant_mode 'w4a8' has a CPU reference only (no CUDA kernel here)");
  // _moe_core_impl's checks, in its order.
  api::check_dtype_in(x, {DType::kFloat8E4M3FN}, op, "x");
  FLASHINFER_CHECK(x_sf.has_value(), op, "x_sf", "is required for block-scaled MoE");
  FLASHINFER_CHECK(!fc2_input_scale.has_value(), op, "fc2_input_scale",
                   "must be None when quant_mode='w4a8'");
  FLASHINFER_CHECK(!per_token_scale.has_value(), op, "per_token_scale",
                   "is not supported when quant_mode='w4a8'");
  FLASHINFER_CHECK(output_dtype == DType::kBFloat16, op, "output_dtype",
                   "quant_mode='w4a8' supports only torch.bfloat16 output, got ",
                   dtype_torch_name(output_dtype));
  FLASHINFER_CHECK(use_fused_finalize, op, "use_fused_finalize",
                   "quant_mode='w4a8' requires use_fused_finalize=True");
  FLASHINFER_CHECK(!situ_beta.has_value(), op, "situ_beta",
                   "SiTU is not supported when quant_mode='w4a8'");
  FLASHINFER_CHECK(!situ_linear_beta.has_value(), op, "situ_linear_beta",
                   "SiTU is not supported when quant_mode='w4a8'");
  FLASHINFER_CHECK_CODE(activation_type == 3 || activation_type == 6 || activation_type == 8,
                        ErrorCode::kUnsupported, op, "activation_type",
                        "Swiglu (3), Relu2 (6) and GegluTanh (8) are implemented for w4a8, got ",
                        activation_type);
  const bool gated = activation_type != 6;  // Swiglu, GegluTanh
  api::check_dim(x, {2}, op, "x");
  api::check_last_stride_one(x, op, "x");
  const int64_t T = x.size(0), H = x.size(1), K = top_k, E = num_experts;
  const int64_t El = num_local_experts.value_or(E);
  FLASHINFER_CHECK(H >= 128 && H % 128 == 0, op, "x",
                   "hidden_size must be a positive multiple of 128 (MXFP4 scale tiles), got ", H);
  FLASHINFER_CHECK(K >= 1 && K <= E, op, "top_k", "must be in [1, num_experts=", E, "], got ", K);
  FLASHINFER_CHECK(El >= 1 && offset >= 0 && offset + El <= E, op, "num_local_experts",
                   "local experts [", offset, ", ", offset + El,
                   ") must lie in [0, num_experts=", E, ")");
  // validate_w4a8_inputs: x_sf [T, H / 32] ue8m0 codes viewed as uint8 (TypeError otherwise).
  api::check_dtype_in(*x_sf, {DType::kUInt8}, op, "x_sf");
  api::check_same_device(*x_sf, x, op, "x_sf", "x");
  FLASHINFER_CHECK(x_sf->shape() == Shape({T, H / 32}) && x_sf->is_contiguous(), op, "x_sf",
                   "must have shape [", T, ", ", H / 32, "] (contiguous), got ",
                   shape_to_string(x_sf->shape()));
  check_cute_pairs(op, x, ids, scales, T, K, {DType::kFloat32});
  api::check_defined(w1, op, "w1_weight");
  api::check_dtype_in(w1, {DType::kUInt8}, op, "w1_weight");
  api::check_dim(w1, {3}, op, "w1_weight");
  api::check_same_device(w1, x, op, "w1_weight", "x");
  FLASHINFER_CHECK(w1.is_contiguous() && w1.size(0) == El && w1.size(2) == H / 2, op, "w1_weight",
                   "expected contiguous [", El, ", ", gated ? "2 * " : "", "intermediate_size, ",
                   H / 2, "], got ", shape_to_string(w1.shape()));
  const int64_t N1 = w1.size(1), I = gated ? N1 / 2 : N1;
  FLASHINFER_CHECK(I >= 128 && I % 128 == 0 && (!gated || N1 % 2 == 0), op, "w1_weight",
                   "intermediate_size must be a positive multiple of 128 (MXFP8 / MXFP4 scale "
                   "tiles), got rows ",
                   N1);
  api::check_defined(w2, op, "w2_weight");
  api::check_dtype_in(w2, {DType::kUInt8}, op, "w2_weight");
  api::check_same_device(w2, x, op, "w2_weight", "x");
  FLASHINFER_CHECK(w2.is_contiguous() && w2.shape() == Shape({El, H, I / 2}), op, "w2_weight",
                   "expected contiguous [", El, ", ", H, ", ", I / 2, "], got ",
                   shape_to_string(w2.shape()));
  check_w4a8_weight_scales(w1_sf, El, N1, H, op, "w1_weight_sf");
  check_w4a8_weight_scales(w2_sf, El, H, I, op, "w2_weight_sf");
  const float* a1 = api::per_expert_floats(w1_alpha, El, x, op, "w1_alpha");
  FLASHINFER_CHECK(a1 != nullptr, op, "w1_alpha", "required");
  const float* a2 = api::per_expert_floats(w2_alpha, El, x, op, "w2_alpha");
  const Tensor out = cute_output(op, "moe_output", moe_output, T, H, DType::kBFloat16, x);
  // The w4a4 prepared layout: gated rows [linear; gate] interleaved in groups of 64.
  const std::vector<int64_t> src1 = cute_row_source(N1, gated);
  const Tensor w1p = plain_rows(w1, El, N1, H / 2, src1);
  const auto [s1p, s2p] = cute_plain_weight_scales(w1_sf, w2_sf, El, N1, H, I, 32, src1, op);
  std::vector<float> sa(static_cast<size_t>(El), static_cast<float>(swiglu_alpha)),
      sb(static_cast<size_t>(El), static_cast<float>(swiglu_beta)),
      sl(static_cast<size_t>(El), static_cast<float>(swiglu_limit));
  kernels::TrtllmFp4MoeParams p;
  p.weights = kernels::Moe4Weights::kMxfp4;
  p.input = kernels::Moe4Input::kMxfp8;
  p.act_quant = kernels::Moe4ActQuant::kMxfp8Fp32;
  set_cute_scales(p, *x_sf, H / 32, s1p, s2p, a1, a2, gated);
  set_moe_problem(p, x, ids, ids.stride(0), scales, out, E, K, I, El, offset, w1p.data_ptr(),
                  w2.data_ptr());
  kernels::CutlassMoeParams& m = p.base.moe;
  m.act = activation_type == 8   ? kernels::MoeAct::kGegluTanh
          : activation_type == 3 ? kernels::MoeAct::kSwigluBias
                                 : kernels::MoeAct::kRelu2;
  if (m.act == kernels::MoeAct::kSwigluBias) {
    m.swiglu_alpha = sa.data();
    m.swiglu_beta = sb.data();
    m.swiglu_limit = sl.data();
  }
  api::launch(kCuteW4a8Kernels, p, x.device(), op, "x", false);
  return out;
}

}  // namespace flashinfer::moe_cute
