// Public MoE ops (flashinfer.fused_moe.*, flashinfer.tllm_enums): declarations, argument checks,
// dispatch. Semantics and sources: docs/MOE.md.
#include "flashinfer/ops/moe.h"

#include <cmath>
#include <string>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/device_props.h"
#include "api/enum_table.h"
#include "api/kernel_table.h"
#include "api/moe_cutlass_call.h"
#include "api/moe_cutlass_fp4.h"
#include "api/moe_cutlass_fp8.h"
#include "api/moe_layout.h"
#include "api/moe_routing_checks.h"
#include "api/moe_traits.h"
#include "api/nvfp4_4over6.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/moe_cpu.h"
#include "kernels/moe_bf16_params.h"
#include "replay/result_comparators.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/hash_topk_cuda.h"
#include "kernels/cuda/moe_cuda.h"
#endif

namespace flashinfer {

template <>
struct ArgTraits<ActivationType> {
  static constexpr ParamKind kind = ParamKind::kEnum;
  static constexpr const char* type_name = "ActivationType";
  static ActivationType get(const CallArgs& a, std::size_t i) {
    return activation_type_from_value(a[i], a.decl().name,
                                      i < a.decl().params.size() ? a.decl().params[i].name : "");
  }
};
template <>
struct ReturnName<std::vector<Tensor>> {
  static constexpr const char* value = "list[Tensor]";
};

namespace {

// InvalidType (11), upstream's sentinel, is left out: a record holding it does not bind.
constexpr api::EnumTable<ActivationType, 13> kActivationTypes{
    "ActivationType",
    {{{ActivationType::Gelu, "Gelu"},
      {ActivationType::Relu, "Relu"},
      {ActivationType::Silu, "Silu"},
      {ActivationType::Swiglu, "Swiglu"},
      {ActivationType::Geglu, "Geglu"},
      {ActivationType::SwigluBias, "SwigluBias"},
      {ActivationType::Relu2, "Relu2"},
      {ActivationType::SwigluStep, "SwigluStep"},
      {ActivationType::GegluTanh, "GegluTanh"},
      {ActivationType::Identity, "Identity"},
      {ActivationType::Situ, "Situ"},
      {ActivationType::ClampedRelu2, "ClampedRelu2"},
      {ActivationType::PowLU, "PowLU"}}}};

constexpr api::EnumTable<WeightLayout, 3> kWeightLayouts{
    "WeightLayout",
    {{{WeightLayout::MajorK, "MajorK"},
      {WeightLayout::MajorMn, "MajorMn"},
      {WeightLayout::BlockMajorK, "BlockMajorK"}}}};

}  // namespace

std::string_view activation_type_name(ActivationType a) { return kActivationTypes.name_of(a); }

Value to_value(ActivationType a) { return kActivationTypes.to_value(a); }

// Upstream has members we may not implement: an unknown name is kUnsupported, not a bad value.
ActivationType activation_type_from_value(const Value& v, std::string_view op,
                                          std::string_view arg) {
  return kActivationTypes.from_value(v, op, arg, ErrorCode::kUnsupported);
}

std::string_view weight_layout_name(WeightLayout w) { return kWeightLayouts.name_of(w); }

Value to_value(WeightLayout w) { return kWeightLayouts.to_value(w); }

WeightLayout weight_layout_from_value(const Value& v, std::string_view op, std::string_view arg) {
  return kWeightLayouts.from_value(v, op, arg);
}

bool is_gated_activation(ActivationType activation_type) {
  return call_op<&is_gated_activation>(
      [&] {
        // PowLU (13, cutlass_fused_moe only) is gated upstream; no kernel here takes it.
        return activation_type == ActivationType::PowLU ||
               kernels::moe_act_is_gated(static_cast<kernels::MoeAct>(activation_type));
      },
      activation_type);
}

namespace {

constexpr const char* kMoeCoreModule = "flashinfer.fused_moe.core";

constexpr api::KernelEntry<kernels::CutlassMoeParams> kCutlassMoeKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: per-expert grouped GEMMs (routed rows only), fp32 accumulation", nullptr,
     [](const kernels::CutlassMoeParams& p, const api::LaunchContext&) {
       kernels::cpu::cutlass_moe(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA: bf16/fp16 batches of >= 2 pairs per local expert on the tensor-core grouped GEMM "
     "(pairs permuted by expert on the device); otherwise one block per (token, expert) pair, "
     "warp dot products",
     nullptr,
     [](const kernels::CutlassMoeParams& p, const api::LaunchContext& c) {
       kernels::cuda::cutlass_moe(p, c.stream, c.enable_pdl);
     }},
#endif
};

constexpr api::KernelEntry<kernels::DeepSeekRoutingParams> kDeepSeekRoutingKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 sigmoid, grouped selection, OpenMP over tokens",
     nullptr,
     [](const kernels::DeepSeekRoutingParams& p, const api::LaunchContext&) {
       kernels::cpu::deepseek_routing(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one thread per token", nullptr,
     [](const kernels::DeepSeekRoutingParams& p, const api::LaunchContext& c) {
       kernels::cuda::deepseek_routing(p, c.stream, c.enable_pdl);
     }},
#endif
};

void moe_check_unit_last_stride(const Tensor& t, const char* op, const char* arg) {
  FLASHINFER_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, op, arg,
                   "the last dimension must be contiguous (stride 1), got stride ", t.stride(-1));
}

void check_flag_off(bool flag, const char* op, const char* arg, const char* why) {
  if (flag) FLASHINFER_FAIL(ErrorCode::kUnsupported, op, arg, why);
}

// Per-expert fp32 [E_l] activation parameter, or null.
const float* moe_expert_vector(const std::optional<Tensor>& t, int64_t experts, const Tensor& input,
                               const char* op, const char* arg) {
  if (!t) return nullptr;
  api::check_defined(*t, op, arg);
  api::check_dtype_in(*t, {DType::kFloat32}, op, arg);
  api::check_shape_eq(*t, {experts}, op, arg);
  api::check_same_device(*t, input, op, arg, "input");
  FLASHINFER_CHECK(t->stride(0) == 1 || experts <= 1, op, arg, "must be contiguous");
  return t->data<float>();
}

std::vector<Tensor> cutlass_fused_moe_impl(const api::CutlassMoeCall& c) {
  const Tensor &input = c.input, &ids = c.ids, &scales = c.scales, &w1 = c.w1, &w2 = c.w2;
  const std::optional<Tensor>&b1 = c.b1, &b2 = c.b2, &output = c.output;
  const DType output_dtype = c.output_dtype;
  const ActivationType activation_type = c.activation_type;
  const char* op = "cutlass_fused_moe";
  api::check_defined(input, op, "input");
  api::check_defined(ids, op, "token_selected_experts");
  api::check_defined(scales, op, "token_final_scales");
  api::check_defined(w1, op, "fc1_expert_weights");
  api::check_defined(w2, op, "fc2_expert_weights");
  // FP8 per tensor and DeepSeek FP8 block scale: src/api/moe_cutlass_fp8.cpp.
  if (api::cutlass_fused_moe_is_fp8(input, w1, c.use_deepseek_fp8_block_scale,
                                    c.use_mxfp8_act_scaling)) {
    return api::cutlass_fused_moe_fp8(c);
  }
  // Quantized paths: refused by name (docs/MOE.md). Humming runs (moe_cutlass_fp4.cpp) but for
  // these variants.
  if (c.use_wfp4afp8_humming) {
    check_flag_off(c.use_packed_weights, op, "use_packed_weights",
                   "the Humming path takes uint8 MXFP4 weights, not packed int4");
    check_flag_off(c.use_mxfp8_act_scaling, op, "use_mxfp8_act_scaling",
                   "Humming with per-block activation scales is not implemented");
  }
  check_flag_off(c.use_deepseek_fp8_block_scale, op, "use_deepseek_fp8_block_scale",
                 "the FP8 block-scale path is not implemented");
  check_flag_off(c.use_w4_group_scaling, op, "use_w4_group_scaling",
                 "the W4 group-scaling path is not implemented");
  check_flag_off(c.use_mxfp8_act_scaling, op, "use_mxfp8_act_scaling",
                 "the MXFP8 activation path is not implemented");
  check_flag_off(c.use_packed_weights, op, "use_packed_weights",
                 "packed int4 weights (weight-only INT4, W4A8) must be uint8 fc1_expert_weights "
                 "without use_mxfp8_act_scaling");
  check_flag_off(c.use_wfp4afp8_humming, op, "use_wfp4afp8_humming",
                 "the MXFP4 x FP8 path is not implemented");
  check_flag_off(!c.quant_scales.empty(), op, "quant_scales",
                 "quantized MoE is not implemented: quant_scales must be None or empty");
  check_flag_off(c.input_sf.has_value(), op, "input_sf",
                 "quantized input is not implemented: input_sf must be None");
  if (input.dtype() == DType::kFloat8E4M3FN || input.dtype() == DType::kUInt8) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "input", "quantized input (",
                    dtype_torch_name(input.dtype()), ") is not implemented");
  }

  api::check_dim(input, {2}, op, "input");
  api::check_dtype_in(input, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op, "input");
  moe_check_unit_last_stride(input, op, "input");
  const int64_t T = input.size(0), H = input.size(1);
  FLASHINFER_CHECK(H > 0, op, "input", "hidden size must be positive");
  const int64_t K = api::check_cutlass_moe_routing(c, T);

  api::check_dim(w2, {3}, op, "fc2_expert_weights");
  api::check_same_dtype(w2, input, op, "fc2_expert_weights", "input");
  api::check_same_device(w2, input, op, "fc2_expert_weights", "input");
  FLASHINFER_CHECK(w2.is_contiguous(), op, "fc2_expert_weights", "must be contiguous");
  const int64_t E = w2.size(0), I = w2.size(2);
  FLASHINFER_CHECK(E >= 1 && I >= 1, op, "fc2_expert_weights", "empty expert weights, shape ",
                   shape_to_string(w2.shape()));
  FLASHINFER_CHECK(w2.size(1) == H, op, "fc2_expert_weights", "expected [num_experts, ", H,
                   ", inter], got ", shape_to_string(w2.shape()));
  const bool gated = kernels::moe_act_is_gated(static_cast<kernels::MoeAct>(activation_type));
  const int64_t N1 = gated ? 2 * I : I;
  api::check_same_dtype(w1, input, op, "fc1_expert_weights", "input");
  api::check_same_device(w1, input, op, "fc1_expert_weights", "input");
  FLASHINFER_CHECK(w1.is_contiguous(), op, "fc1_expert_weights", "must be contiguous");
  FLASHINFER_CHECK(w1.shape() == Shape({E, N1, H}), op, "fc1_expert_weights", "expected [", E, ", ",
                   N1, ", ", H, "] (", gated ? "gated: 2 * " : "", "inter from fc2 = ", I,
                   "), got ", shape_to_string(w1.shape()));
  if (b1) {
    api::check_same_dtype(*b1, input, op, "fc1_expert_biases", "input");
    api::check_same_device(*b1, input, op, "fc1_expert_biases", "input");
    api::check_shape_eq(*b1, {E, N1}, op, "fc1_expert_biases");
    FLASHINFER_CHECK(b1->is_contiguous(), op, "fc1_expert_biases", "must be contiguous");
  }
  if (b2) {
    api::check_same_dtype(*b2, input, op, "fc2_expert_biases", "input");
    api::check_same_device(*b2, input, op, "fc2_expert_biases", "input");
    api::check_shape_eq(*b2, {E, H}, op, "fc2_expert_biases");
    FLASHINFER_CHECK(b2->is_contiguous(), op, "fc2_expert_biases", "must be contiguous");
  }
  api::check_cutlass_moe_swiglu_args(c);
  FLASHINFER_CHECK(output_dtype == DType::kFloat32 || output_dtype == DType::kFloat16 ||
                       output_dtype == DType::kBFloat16,
                   op, "output_dtype", "dtype ", dtype_torch_name(output_dtype),
                   " is not supported (expected torch.float32, torch.float16 or torch.bfloat16)");

  Tensor out;
  if (output) {
    api::check_defined(*output, op, "output");
    api::check_shape_eq(*output, {T, H}, op, "output");
    FLASHINFER_CHECK(output->dtype() == output_dtype, op, "output", "dtype ",
                     dtype_torch_name(output->dtype()), " is not output_dtype ",
                     dtype_torch_name(output_dtype));
    api::check_same_device(*output, input, op, "output", "input");
    moe_check_unit_last_stride(*output, op, "output");
    api::check_writable(*output, op, "output");
    api::check_no_overlap(*output, input, op, "output", "input");
    out = *output;
  } else {
    out = Tensor::empty({T, H}, output_dtype, input.device());
  }

  kernels::CutlassMoeParams p;
  p.input = input.data_ptr();
  p.in_stride = input.stride(0);
  p.experts = ids.data_ptr();
  p.experts_dtype = ids.dtype();
  p.experts_stride = ids.stride(0);
  p.scales = scales.data_ptr();
  p.scales_dtype = scales.dtype();
  p.scales_stride = scales.stride(0);
  p.w1 = w1.data_ptr();
  p.w2 = w2.data_ptr();
  p.b1 = b1 ? b1->data_ptr() : nullptr;
  // The fc2 bias only on tensor-parallel rank 0, as upstream's finalize launcher.
  p.b2 = b2 && c.tp_rank == 0 ? b2->data_ptr() : nullptr;
  p.swiglu_alpha = moe_expert_vector(c.swiglu_alpha, E, input, op, "swiglu_alpha");
  p.swiglu_beta = moe_expert_vector(c.swiglu_beta, E, input, op, "swiglu_beta");
  p.swiglu_limit = moe_expert_vector(c.swiglu_limit, E, input, op, "swiglu_limit");
  p.situ_beta = moe_expert_vector(c.options.situ_beta, E, input, op, "situ_beta");
  p.situ_linear_beta =
      moe_expert_vector(c.options.situ_linear_beta, E, input, op, "situ_linear_beta");
  if (activation_type == ActivationType::ClampedRelu2) {
    // Checked by check_cutlass_moe_common; fused into GEMM1's epilogue upstream, so GEMM1's fp32
    // result is not rounded first.
    p.clamped_relu2_limit = c.options.clamped_relu2_limit->data<float>();
    p.round_gemm1 = false;
  }
  p.out = out.data_ptr();
  p.out_stride = out.stride(0);
  p.dtype = input.dtype();
  p.out_dtype = output_dtype;
  p.num_tokens = T;
  p.top_k = K;
  p.hidden = H;
  p.inter = I;
  p.num_local_experts = E;
  p.expert_offset = c.ep_rank * E;
  p.ep_size = c.ep_size;
  p.act = static_cast<kernels::MoeAct>(activation_type);
  // CUDA: the kernels take their scratch from a buffer per stream (kernels/cuda/moe_cuda.h).
  api::launch(kCutlassMoeKernels, p, input.device(), op, "input", c.enable_pdl);
  // Upstream's three scratch outputs (written only in min-latency mode): zero here.
  return {out, Tensor::zeros({1}, DType::kInt32, input.device()),
          Tensor::zeros({E, T}, DType::kFloat32, input.device()),
          Tensor::zeros({E}, DType::kInt32, input.device())};
}

}  // namespace

namespace api {

void check_cutlass_moe_common(const CutlassMoeCall& c) {
  const char* op = "cutlass_fused_moe";
  // Upstream 0.7.4's order: nvfp4_4over6, backend, then ClampedRelu2's arguments.
  const CutlassFusedMoeOptions& o = c.options;
  if (!is_nvfp4_4over6_unset(o.nvfp4_4over6)) {
    FLASHINFER_CHECK(o.backend != "cake", op, "nvfp4_4over6",
                     "backend='cake' does not take nvfp4_4over6");
  }
  const bool is_nvfp4 = c.w1.dtype() == DType::kInt64 && c.input.dtype() != DType::kFloat8E4M3FN &&
                        !c.use_w4_group_scaling;
  check_moe_nvfp4_4over6(o.nvfp4_4over6, is_nvfp4, op,
                         "nvfp4_4over6 requires NVFP4×NVFP4 (int64-packed NVFP4 weights with BF16 "
                         "or NVFP4 input); no other CUTLASS path quantizes activations to NVFP4. "
                         "Pass None to turn 4over6 off, or omit it to read the environment.");
  // "cake" is upstream's fixed Kimi-K3 SiTU path (SM100, one shape, TP8).
  check_flag_off(o.backend == "cake", op, "backend",
                 "backend='cake' (upstream's fixed Kimi-K3 SiTU kernels for SM100) is not "
                 "implemented");
  FLASHINFER_CHECK(o.backend == "cutlass", op, "backend", "unsupported fused MoE backend: '",
                   o.backend, "'");
  const bool clamped = c.activation_type == ActivationType::ClampedRelu2;
  check_clamped_relu2_limit(op, clamped, o.clamped_relu2_limit, c.input.device());
  if (clamped) {
    FLASHINFER_CHECK(!c.swiglu_alpha && !c.swiglu_beta && !c.swiglu_limit, op, "swiglu_alpha",
                     "ActivationType.ClampedRelu2 does not accept SwiGLU activation parameters");
    FLASHINFER_CHECK(!o.situ_beta && !o.situ_linear_beta, op, "situ_beta",
                     "ActivationType.ClampedRelu2 does not accept SiTU activation parameters");
    // Upstream fuses it on SM10x only; the CPU reference computes what SM10x does.
    FLASHINFER_CHECK_CODE(
        !c.input.device().is_cuda() || compute_capability(c.input.device()) / 10 == 10,
        ErrorCode::kUnsupported, op, "activation_type", "ClampedRelu2 requires an SM10x GPU");
    const bool bf16 = c.input.dtype() == DType::kBFloat16 && c.w1.dtype() == DType::kBFloat16;
    FLASHINFER_CHECK_CODE(c.use_mxfp8_act_scaling || bf16, ErrorCode::kUnsupported, op,
                          "activation_type",
                          "ClampedRelu2 supports only BF16xBF16 or MXFP8xMXFP8 MoE");
    FLASHINFER_CHECK_CODE(!c.b1 && !c.min_latency_mode, ErrorCode::kUnsupported, op,
                          "fc1_expert_biases",
                          "ClampedRelu2 does not support FC1 bias or min-latency mode");
    check_flag_off(c.use_mxfp8_act_scaling, op, "use_mxfp8_act_scaling",
                   "ClampedRelu2 on the MXFP8 x MXFP8 path is not implemented (BF16 x BF16 is)");
    // Upstream fuses it into GEMM1's epilogue (the fp32 accumulator into the activation); the
    // CUDA routes here round GEMM1's output to the dtype first.
    check_flag_off(c.input.device().is_cuda(), op, "activation_type",
                   "ClampedRelu2 has no CUDA kernel here (its fused fp32 GEMM1 epilogue); the CPU "
                   "reference computes it");
  }
  check_flag_off(c.activation_type == ActivationType::PowLU, op, "activation_type",
                 "the PowLU activation is not implemented");
  check_flag_off(c.activation_type == ActivationType::InvalidType, op, "activation_type",
                 "ActivationType.InvalidType is not an activation");
  check_flag_off(c.min_latency_mode, op, "min_latency_mode",
                 "min latency mode is not implemented (upstream raises NotImplementedError too)");
  // What upstream does with situ_* under another activation is not established: refused.
  check_flag_off(c.options.situ_beta.has_value() && c.activation_type != ActivationType::Situ, op,
                 "situ_beta", "only the Situ activation takes situ_beta");
  check_flag_off(
      c.options.situ_linear_beta.has_value() && c.activation_type != ActivationType::Situ, op,
      "situ_linear_beta", "only the Situ activation takes situ_linear_beta");
  FLASHINFER_CHECK(c.tp_size >= 1 && c.tp_rank >= 0 && c.tp_rank < c.tp_size, op, "tp_rank",
                   "must be in [0, tp_size=", c.tp_size, "), got ", c.tp_rank);
  FLASHINFER_CHECK(c.ep_size >= 1 && c.ep_rank >= 0 && c.ep_rank < c.ep_size, op, "ep_rank",
                   "must be in [0, ep_size=", c.ep_size, "), got ", c.ep_rank);
  FLASHINFER_CHECK(c.cluster_size >= 1 && c.cluster_rank >= 0 && c.cluster_rank < c.cluster_size,
                   op, "cluster_rank", "must be in [0, cluster_size=", c.cluster_size, "), got ",
                   c.cluster_rank);
}

int64_t check_cutlass_moe_routing(const CutlassMoeCall& c, int64_t T) {
  const char* op = "cutlass_fused_moe";
  const Tensor &ids = c.ids, &scales = c.scales;
  check_defined(ids, op, "token_selected_experts");
  check_defined(scales, op, "token_final_scales");
  check_dim(ids, {2}, op, "token_selected_experts");
  check_dtype_in(ids, {DType::kInt32, DType::kInt64}, op, "token_selected_experts");
  FLASHINFER_CHECK(ids.size(0) == T && ids.size(1) >= 1, op, "token_selected_experts",
                   "expected shape [", T, ", top_k], got ", shape_to_string(ids.shape()));
  moe_check_unit_last_stride(ids, op, "token_selected_experts");
  check_same_device(ids, c.input, op, "token_selected_experts", "input");
  const int64_t K = ids.size(1);
  check_dtype_in(scales, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op,
                 "token_final_scales");
  check_shape_eq(scales, {T, K}, op, "token_final_scales");
  moe_check_unit_last_stride(scales, op, "token_final_scales");
  check_same_device(scales, c.input, op, "token_final_scales", "input");
  return K;
}

void check_cutlass_moe_swiglu_args(const CutlassMoeCall& c) {
  const char* op = "cutlass_fused_moe";
  const ActivationType a = c.activation_type;
  if (a == ActivationType::Swiglu || a == ActivationType::SwigluBias) return;
  check_flag_off(c.swiglu_alpha.has_value(), op, "swiglu_alpha",
                 "only the Swiglu / SwigluBias activations take swiglu_alpha");
  check_flag_off(c.swiglu_beta.has_value(), op, "swiglu_beta",
                 "only the Swiglu / SwigluBias activations take swiglu_beta");
  check_flag_off(c.swiglu_limit.has_value() && a != ActivationType::SwigluStep, op, "swiglu_limit",
                 "only the Swiglu / SwigluBias / SwigluStep activations take swiglu_limit");
}

}  // namespace api

namespace {

constexpr api::KernelEntry<kernels::MoeKeepRowsParams> kMoeKeepRowsKernels[] = {
    {DeviceType::kCPU, "CPU reference: rows of tokens with no local expert copied back", nullptr,
     [](const kernels::MoeKeepRowsParams& p, const api::LaunchContext&) {
       kernels::cpu::moe_keep_rows(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA: a block per token, its ids read on the device (capturable)", nullptr,
     [](const kernels::MoeKeepRowsParams& p, const api::LaunchContext& c) {
       kernels::cuda::moe_keep_rows(p, c.stream);
     }},
#endif
};

// cutlass_fused_moe(enable_alltoall=True): rows of `out` whose token routes to no expert of this
// rank ([ep_rank * local, (ep_rank + 1) * local)) get `before`'s row back, the routing read where
// it is (on a GPU by the kernel: nothing read back, so the call captures into a CUDA graph).
void restore_rows_without_local_expert(Tensor& out, const Tensor& before, const Tensor& ids,
                                       int64_t local, int64_t ep_rank) {
  const char* op = "cutlass_fused_moe";
  FLASHINFER_CHECK(ids.device() == out.device(), op, "token_selected_experts",
                   "must be on the output's device (", out.device().str(), ")");
  FLASHINFER_CHECK(out.dim() == 2 && out.stride(1) == 1 && before.is_contiguous(), op, "output",
                   "expected rows of contiguous elements");
  FLASHINFER_CHECK(ids.dim() == 1 || ids.stride(1) == 1, op, "token_selected_experts",
                   "expected rows of contiguous ids");
  kernels::MoeKeepRowsParams p;
  p.out = out.data_ptr();
  p.out_stride = out.stride(0) * dtype_size(out.dtype());
  p.before = before.data_ptr();
  p.before_stride = before.size(1) * dtype_size(before.dtype());
  p.row_bytes = out.size(1) * dtype_size(out.dtype());
  p.experts = ids.data_ptr();
  p.experts_dtype = ids.dtype();
  p.experts_stride = ids.stride(0);
  p.num_tokens = std::min(ids.size(0), out.size(0));
  p.top_k = ids.dim() > 1 ? ids.size(1) : 1;
  p.lo = ep_rank * local;
  p.hi = p.lo + local;
  api::launch(kMoeKeepRowsKernels, p, out.device(), op, "output");
}

}  // namespace

std::vector<Tensor> cutlass_fused_moe(
    const Tensor& input, const Tensor& token_selected_experts, const Tensor& token_final_scales,
    const Tensor& fc1_expert_weights, const Tensor& fc2_expert_weights, DType output_dtype,
    std::optional<std::vector<Tensor>> quant_scales, std::optional<Tensor> fc1_expert_biases,
    std::optional<Tensor> fc2_expert_biases, std::optional<Tensor> input_sf,
    std::optional<Tensor> swiglu_alpha, std::optional<Tensor> swiglu_beta,
    std::optional<Tensor> swiglu_limit, int64_t tp_size, int64_t tp_rank, int64_t ep_size,
    int64_t ep_rank, int64_t cluster_size, int64_t cluster_rank, std::optional<Tensor> output,
    bool enable_alltoall, bool use_deepseek_fp8_block_scale, bool use_w4_group_scaling,
    bool use_mxfp8_act_scaling, bool min_latency_mode, bool use_packed_weights,
    bool use_wfp4afp8_humming, int64_t tune_max_num_tokens, std::optional<bool> enable_pdl,
    ActivationType activation_type, bool swizzled_input_sf, std::optional<bool> use_fused_finalize,
    std::optional<std::vector<int64_t>> profile_ids, std::optional<Tensor> workspace_buffer,
    CutlassFusedMoeOptions options) {
  return call_op<&cutlass_fused_moe>(
      [&] {
        // None (upstream's unquantized bf16 / fp16 call) is the empty list: no scales.
        const std::vector<Tensor> scales = quant_scales.value_or(std::vector<Tensor>{});
        const api::CutlassMoeCall c{input,
                                    token_selected_experts,
                                    token_final_scales,
                                    fc1_expert_weights,
                                    fc2_expert_weights,
                                    output_dtype,
                                    scales,
                                    fc1_expert_biases,
                                    fc2_expert_biases,
                                    input_sf,
                                    swiglu_alpha,
                                    swiglu_beta,
                                    swiglu_limit,
                                    tp_size,
                                    tp_rank,
                                    ep_size,
                                    ep_rank,
                                    cluster_size,
                                    cluster_rank,
                                    output,
                                    enable_alltoall,
                                    use_deepseek_fp8_block_scale,
                                    use_w4_group_scaling,
                                    use_mxfp8_act_scaling,
                                    min_latency_mode,
                                    use_packed_weights,
                                    use_wfp4afp8_humming,
                                    swizzled_input_sf,
                                    enable_pdl,
                                    activation_type,
                                    options};
        api::check_cutlass_moe_common(c);
        // enable_alltoall (SGLang's all-to-all path): upstream's finalize then skips the rows of
        // tokens with no local expert (finalizeMoeRoutingNoFillingKernel), which keep what `output`
        // held; the other finalize writes them zero. A fresh output's rows are unspecified there.
        Tensor before;
        if (enable_alltoall && output && output->defined()) before = output->clone();
        std::vector<Tensor> r =
            api::is_cutlass_moe_fp4_call(input, fc1_expert_weights, use_deepseek_fp8_block_scale,
                                         use_w4_group_scaling, use_mxfp8_act_scaling,
                                         use_packed_weights, use_wfp4afp8_humming)
                ? api::cutlass_fused_moe_fp4(c)  // src/api/moe_cutlass_fp4.cpp
                : cutlass_fused_moe_impl(c);
        if (before.defined()) {
          restore_rows_without_local_expert(r[0], before, token_selected_experts,
                                            fc1_expert_weights.size(0), ep_rank);
        }
        return r;
      },
      input, token_selected_experts, token_final_scales, fc1_expert_weights, fc2_expert_weights,
      output_dtype, quant_scales, fc1_expert_biases, fc2_expert_biases, input_sf, swiglu_alpha,
      swiglu_beta, swiglu_limit, tp_size, tp_rank, ep_size, ep_rank, cluster_size, cluster_rank,
      output, enable_alltoall, use_deepseek_fp8_block_scale, use_w4_group_scaling,
      use_mxfp8_act_scaling, min_latency_mode, use_packed_weights, use_wfp4afp8_humming,
      tune_max_num_tokens, enable_pdl, activation_type, swizzled_input_sf, use_fused_finalize,
      profile_ids, workspace_buffer, options);
}

namespace {

void fused_topk_deepseek_impl(const Tensor& scores, const Tensor& bias, int64_t n_group,
                              int64_t topk_group, int64_t topk, double routed_scaling_factor,
                              const Tensor& topk_values, const Tensor& topk_indices,
                              bool launch_with_pdl, const std::optional<Tensor>& routing_replay_out,
                              std::string_view backend) {
  const char* op = "fused_topk_deepseek";
  FLASHINFER_CHECK(backend == "default" || backend == "cake", op, "backend",
                   "expected 'default' or 'cake', got '", backend, "'");
  if (backend == "cake") {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "backend",
                    "the 'cake' backend (Blackwell only upstream) is not available here");
  }
  api::check_defined(scores, op, "scores");
  api::check_defined(bias, op, "bias");
  api::check_defined(topk_values, op, "topk_values");
  api::check_defined(topk_indices, op, "topk_indices");
  api::check_dim(scores, {2}, op, "scores");
  api::check_dtype_in(scores, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op, "scores");
  moe_check_unit_last_stride(scores, op, "scores");
  const int64_t T = scores.size(0), E = scores.size(1);
  FLASHINFER_CHECK(E >= 1, op, "scores", "no experts (shape ", shape_to_string(scores.shape()),
                   ")");
  api::check_dtype_in(bias, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op, "bias");
  api::check_shape_eq(bias, {E}, op, "bias");
  api::check_same_device(bias, scores, op, "bias", "scores");
  FLASHINFER_CHECK(n_group >= 1 && n_group <= 32, op, "n_group", "must be in [1, 32], got ",
                   n_group);
  FLASHINFER_CHECK(E % n_group == 0, op, "n_group", "num_experts (", E,
                   ") must be divisible by n_group (", n_group, ")");
  FLASHINFER_CHECK(topk >= 1 && topk <= 8 && topk <= E, op, "topk",
                   "must be in [1, min(8, num_experts=", E, ")], got ", topk);
  FLASHINFER_CHECK(topk_group >= 1 && topk_group <= n_group, op, "topk_group",
                   "must be in [1, n_group=", n_group, "], got ", topk_group);
  FLASHINFER_CHECK(topk_group * n_group >= topk, op, "topk_group", "topk_group * n_group (",
                   topk_group * n_group, ") must be >= topk (", topk, ")");
  // Not upstream's check (it has the one above): the kept groups must hold topk experts, or the
  // selection runs out of candidates (upstream's kernels then index expert -1).
  FLASHINFER_CHECK(topk_group * (E / n_group) >= topk, op, "topk_group",
                   "the kept groups hold topk_group * num_experts / n_group = ",
                   topk_group * (E / n_group), " experts, fewer than topk (", topk, ")");
  // Upstream's kernel limits, kept so a call accepted here is one upstream accepts.
  if (n_group > 1) {
    FLASHINFER_CHECK(E / n_group <= 32, op, "n_group", "num_experts / n_group (", E / n_group,
                     ") must be <= 32");
    FLASHINFER_CHECK(E / n_group * topk_group <= 128, op, "topk_group",
                     "num_experts / n_group * topk_group (", E / n_group * topk_group,
                     ") must be <= 128");
  } else {
    FLASHINFER_CHECK(E <= 384, op, "scores", "with n_group = 1 num_experts (", E,
                     ") must be <= 384");
  }
  FLASHINFER_CHECK(std::isfinite(routed_scaling_factor), op, "routed_scaling_factor",
                   "must be finite, got ", routed_scaling_factor);
  FLASHINFER_CHECK(topk_values.dtype() == scores.dtype() || topk_values.dtype() == DType::kFloat32,
                   op, "topk_values", "dtype ", dtype_torch_name(topk_values.dtype()),
                   " must be scores' ", dtype_torch_name(scores.dtype()), " or torch.float32");
  api::check_shape_eq(topk_values, {T, topk}, op, "topk_values");
  api::check_same_device(topk_values, scores, op, "topk_values", "scores");
  moe_check_unit_last_stride(topk_values, op, "topk_values");
  api::check_writable(topk_values, op, "topk_values");
  api::check_dtype_in(topk_indices, {DType::kInt32}, op, "topk_indices");
  api::check_shape_eq(topk_indices, {T, topk}, op, "topk_indices");
  api::check_same_device(topk_indices, scores, op, "topk_indices", "scores");
  moe_check_unit_last_stride(topk_indices, op, "topk_indices");
  api::check_writable(topk_indices, op, "topk_indices");
  api::check_no_overlap(topk_values, topk_indices, op, "topk_values", "topk_indices");
  if (routing_replay_out) {
    const Tensor& r = *routing_replay_out;
    api::check_defined(r, op, "routing_replay_out");
    api::check_dtype_in(r, {DType::kInt16}, op, "routing_replay_out");
    api::check_dim(r, {2}, op, "routing_replay_out");
    FLASHINFER_CHECK(r.size(0) >= T && r.size(1) == topk, op, "routing_replay_out",
                     "shape[0] must be >= ", T, " and shape[1] must be ", topk, ", got ",
                     shape_to_string(r.shape()));
    api::check_same_device(r, scores, op, "routing_replay_out", "scores");
    moe_check_unit_last_stride(r, op, "routing_replay_out");
    api::check_writable(r, op, "routing_replay_out");
  }
  kernels::DeepSeekRoutingParams p;
  p.scores = scores.data_ptr();
  p.scores_dtype = scores.dtype();
  p.scores_stride = scores.stride(0);
  p.bias = bias.data_ptr();
  p.bias_dtype = bias.dtype();
  p.bias_stride = bias.stride(0);
  p.topk_values = topk_values.data_ptr();
  p.values_dtype = topk_values.dtype();
  p.values_stride = topk_values.stride(0);
  p.topk_indices = topk_indices.data<int32_t>();
  p.indices_stride = topk_indices.stride(0);
  if (routing_replay_out) {
    p.replay_out = routing_replay_out->data<int16_t>();
    p.replay_stride = routing_replay_out->stride(0);
  }
  p.num_tokens = T;
  p.num_experts = E;
  p.n_group = n_group;
  p.topk_group = topk_group;
  p.topk = topk;
  p.routed_scaling_factor = static_cast<float>(routed_scaling_factor);
  if (T == 0) return;
  api::launch(kDeepSeekRoutingKernels, p, scores.device(), op, "scores", launch_with_pdl);
}

}  // namespace

void fused_topk_deepseek(const Tensor& scores, const Tensor& bias, int64_t n_group,
                         int64_t topk_group, int64_t topk, double routed_scaling_factor,
                         const Tensor& topk_values, const Tensor& topk_indices,
                         bool launch_with_pdl, std::optional<Tensor> routing_replay_out,
                         std::string_view backend) {
  call_op<&fused_topk_deepseek>(
      [&] {
        fused_topk_deepseek_impl(scores, bias, n_group, topk_group, topk, routed_scaling_factor,
                                 topk_values, topk_indices, launch_with_pdl, routing_replay_out,
                                 backend);
      },
      scores, bias, n_group, topk_group, topk, routed_scaling_factor, topk_values, topk_indices,
      launch_with_pdl, routing_replay_out, backend);
}

namespace {

constexpr api::KernelEntry<kernels::TrtllmBf16MoeParams> kTrtllmMoeKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: routing, then per-expert grouped GEMMs (routed rows only), fp32 "
     "accumulation",
     nullptr,
     [](const kernels::TrtllmBf16MoeParams& p, const api::LaunchContext&) {
       kernels::cpu::trtllm_moe(p.base);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel: routing one thread per token; MajorK weights with >= 2 pairs per local expert "
     "(sm80+): pairs permuted by expert on the device, both GEMMs on the tensor-core grouped "
     "GEMM; otherwise one block per (token, expert) pair with warp dot products over the weights "
     "in their stored layout",
     nullptr,
     [](const kernels::TrtllmBf16MoeParams& p, const api::LaunchContext& c) {
       kernels::cuda::trtllm_bf16_moe(p, c.stream, c.enable_pdl);
     }},
#endif
};

// The routing-from-logits op (`routed` null) and the precomputed-routing op share everything
// after the routing.
TrtllmMoeResult trtllm_bf16_moe_impl(
    const char* op, const MoeTopkIds* routed, const Tensor& logits,
    const std::optional<Tensor>& bias, const Tensor& hidden, const Tensor& w1, const Tensor& w2,
    int64_t num_experts, int64_t top_k, std::optional<int64_t> n_group,
    std::optional<int64_t> topk_group, int64_t inter, int64_t offset, int64_t local_num,
    std::optional<double> scale, int64_t method, bool use_shuffled_weight, WeightLayout layout,
    bool do_finalize, bool enable_pdl, int64_t activation_type, bool norm_topk_prob,
    const std::optional<Tensor>& replay_out, const std::optional<Tensor>& alpha,
    const std::optional<Tensor>& beta, const std::optional<Tensor>& limit,
    const std::optional<Tensor>& output, const std::optional<Tensor>& lora_delta = std::nullopt) {
  api::check_step_gemm1_params(activation_type, alpha, beta, op);
  api::check_defined(hidden, op, "hidden_states");
  api::check_dim(hidden, {2}, op, "hidden_states");
  if (routed) {
    // Precomputed routing: the ids and weights as given; the routing arguments are not used.
    const Tensor& ids = routed->ids;
    api::check_defined(ids, op, "topk_ids");
    api::check_dim(ids, {2}, op, "topk_ids");
    api::check_dtype_in(ids, {DType::kInt32}, op, "topk_ids");
    FLASHINFER_CHECK(ids.size(0) == hidden.size(0) && ids.size(1) == top_k, op, "topk_ids",
                     "expected [", hidden.size(0), ", ", top_k, "], got ",
                     shape_to_string(ids.shape()));
    moe_check_unit_last_stride(ids, op, "topk_ids");
    api::check_same_device(ids, hidden, op, "topk_ids", "hidden_states");
    if (routed->weights) {
      const Tensor& w = *routed->weights;
      api::check_dtype_in(w, {DType::kBFloat16, DType::kFloat32}, op, "topk_ids");
      FLASHINFER_CHECK(w.shape() == ids.shape() && w.stride(0) == ids.stride(0), op, "topk_ids",
                       "the weights must have the ids' shape and row stride, got ",
                       shape_to_string(w.shape()));
      moe_check_unit_last_stride(w, op, "topk_ids");
      api::check_same_device(w, hidden, op, "topk_ids", "hidden_states");
    }
  }
  const Tensor& logits_or_ids = routed ? routed->ids : logits;
  if (!routed) api::check_defined(logits, op, "routing_logits");
  api::check_defined(w1, op, "gemm1_weights");
  api::check_defined(w2, op, "gemm2_weights");
  const int64_t T = hidden.size(0);
  if (!routed) {
    api::check_dim(logits, {2}, op, "routing_logits");
    api::check_dtype_in(logits, {DType::kFloat32, DType::kBFloat16}, op, "routing_logits");
    moe_check_unit_last_stride(logits, op, "routing_logits");
    FLASHINFER_CHECK(logits.shape() == Shape({T, num_experts}), op, "routing_logits", "expected [",
                     T, ", ", num_experts, "] (tokens, num_experts), got ",
                     shape_to_string(logits.shape()));
    api::check_same_device(logits, hidden, op, "routing_logits", "hidden_states");
  }
  FLASHINFER_CHECK(top_k >= 1 && top_k <= num_experts, op, "top_k",
                   "must be in [1, num_experts=", num_experts, "], got ", top_k);
  FLASHINFER_CHECK(method >= 0 && method <= 9, op, "routing_method_type",
                   "must be a RoutingMethodType value in [0, 9], got ", method);
  const auto rm = static_cast<kernels::MoeRouting>(method);
  if (rm == kernels::MoeRouting::kLlama4) {
    FLASHINFER_CHECK(top_k == 1, op, "top_k", "Llama4 routing selects one expert, got ", top_k);
  }
  if (bias) {
    api::check_dtype_in(*bias, {DType::kFloat32, DType::kBFloat16}, op, "routing_bias");
    api::check_shape_eq(*bias, {num_experts}, op, "routing_bias");
    api::check_same_device(*bias, logits_or_ids, op, "routing_bias", "routing_logits");
    FLASHINFER_CHECK(bias->stride(0) == 1 || num_experts == 1, op, "routing_bias",
                     "must be contiguous");
  }
  const int64_t G = n_group.value_or(0) > 0 ? *n_group : 1;
  const int64_t TG = topk_group.value_or(0) > 0 ? *topk_group : G;
  if (rm == kernels::MoeRouting::kDeepSeekV3 && G > 1) {
    FLASHINFER_CHECK(num_experts % G == 0, op, "n_group", "num_experts (", num_experts,
                     ") must be divisible by n_group (", G, ")");
    FLASHINFER_CHECK(TG >= 1 && TG <= G, op, "topk_group", "must be in [1, n_group=", G, "], got ",
                     TG);
    FLASHINFER_CHECK(TG * (num_experts / G) >= top_k, op, "topk_group",
                     "the kept groups hold fewer than top_k experts");
  }
  FLASHINFER_CHECK(local_num >= 1 && offset >= 0 && offset + local_num <= num_experts, op,
                   "local_num_experts", "local experts [", offset, ", ", offset + local_num,
                   ") must lie in [0, num_experts=", num_experts, ")");
  api::check_dtype_in(hidden, {DType::kBFloat16}, op, "hidden_states");
  moe_check_unit_last_stride(hidden, op, "hidden_states");
  const int64_t H = hidden.size(1);
  FLASHINFER_CHECK(activation_type >= 0 && activation_type <= 10, op, "activation_type",
                   "must be an ActivationType value, got ", activation_type);
  const auto act = static_cast<ActivationType>(activation_type);
  check_flag_off(act == ActivationType::GegluTanh, op, "activation_type",
                 "GegluTanh has no trtllm-gen kernel (upstream's launcher raises for it)");
  check_flag_off(
      act == ActivationType::Situ, op, "activation_type",
      "Situ runs in trtllm-gen's SiTuGlu cubin epilogue, whose math is not in readable source");
  const int64_t N1 =
      kernels::moe_act_is_gated(static_cast<kernels::MoeAct>(activation_type)) ? 2 * inter : inter;
  api::check_dtype_in(w1, {DType::kBFloat16}, op, "gemm1_weights");
  api::check_same_device(w1, hidden, op, "gemm1_weights", "hidden_states");
  api::check_dtype_in(w2, {DType::kBFloat16}, op, "gemm2_weights");
  api::check_same_device(w2, hidden, op, "gemm2_weights", "hidden_states");
  // Upstream's weight preparation for BF16 (tests/moe: BF16Moe) shuffles with
  // epilogue_tile_m = 128 and interleaves GEMM1's up/gate rows for a gated activation.
  api::MoeWeightFormat fmt;
  fmt.shuffled = use_shuffled_weight;
  fmt.layout = layout;
  fmt.epilogue_tile_m = 128;
  fmt.gated_interleave = use_shuffled_weight && N1 != inter;
  kernels::TrtllmBf16MoeParams bp;
  const bool on_cuda = hidden.device().is_cuda();
  Tensor w1p = w1, w2p = w2;
  if (on_cuda) {
    bp.w1_index = api::moe_stored_weight_index(w1, local_num, N1, H, fmt, op, "gemm1_weights");
    fmt.gated_interleave = false;
    bp.w2_index = api::moe_stored_weight_index(w2, local_num, H, inter, fmt, op, "gemm2_weights");
  } else {
    w1p = api::moe_plain_weights(w1, local_num, N1, H, fmt, op, "gemm1_weights");
    fmt.gated_interleave = false;
    w2p = api::moe_plain_weights(w2, local_num, H, inter, fmt, op, "gemm2_weights");
  }
  FLASHINFER_CHECK(!scale || std::isfinite(*scale), op, "routed_scaling_factor", "must be finite");
  if (replay_out) {
    api::check_dtype_in(*replay_out, {DType::kInt16}, op, "routing_replay_out");
    api::check_dim(*replay_out, {2}, op, "routing_replay_out");
    FLASHINFER_CHECK(replay_out->size(0) >= T && replay_out->size(1) == top_k, op,
                     "routing_replay_out", "shape[0] must be >= ", T,
                     " and shape[1] must be top_k (", top_k, "), got ",
                     shape_to_string(replay_out->shape()));
    moe_check_unit_last_stride(*replay_out, op, "routing_replay_out");
    api::check_same_device(*replay_out, hidden, op, "routing_replay_out", "hidden_states");
    api::check_writable(*replay_out, op, "routing_replay_out");
  }
  Tensor out;
  if (output && do_finalize) {  // upstream writes `output` only when it finalizes
    api::check_dtype_in(*output, {DType::kBFloat16}, op, "output");
    api::check_shape_eq(*output, {T, H}, op, "output");
    api::check_same_device(*output, hidden, op, "output", "hidden_states");
    moe_check_unit_last_stride(*output, op, "output");
    api::check_writable(*output, op, "output");
    api::check_no_overlap(*output, hidden, op, "output", "hidden_states");
    out = *output;
  } else {
    out = Tensor::empty({T, H}, DType::kBFloat16, hidden.device());
  }
  kernels::TrtllmMoeParams& p = bp.base;
  if (routed) {
    p.precomputed = true;
    p.routed_stride = routed->ids.stride(0);
    if (routed->weights) {
      p.ids = routed->ids.data<int32_t>();
      p.weights = routed->weights->data_ptr();
      p.weights_dtype = routed->weights->dtype();
    } else {
      p.packed = routed->ids.data<int32_t>();
    }
  } else {
    p.routing.logits = logits.data_ptr();
    p.routing.logits_dtype = logits.dtype();
    p.routing.logits_stride = logits.stride(0);
  }
  p.routing.bias = bias ? bias->data_ptr() : nullptr;
  p.routing.bias_dtype = bias ? bias->dtype() : DType::kFloat32;
  p.routing.num_tokens = T;
  p.routing.num_experts = num_experts;
  p.routing.top_k = top_k;
  p.routing.n_group = G;
  p.routing.topk_group = TG;
  p.routing.routed_scaling_factor = static_cast<float>(scale.value_or(1.0));
  p.routing.norm_topk_prob = norm_topk_prob;
  p.routing.method = rm;
  if (replay_out) {
    p.replay_out = replay_out->data<int16_t>();
    p.replay_stride = replay_out->stride(0);
  }
  kernels::CutlassMoeParams& m = p.moe;
  m.input = hidden.data_ptr();
  m.in_stride = hidden.stride(0);
  m.w1 = w1p.data_ptr();
  m.w2 = w2p.data_ptr();
  m.swiglu_alpha = moe_expert_vector(alpha, local_num, hidden, op, "gemm1_alpha");
  m.swiglu_beta = moe_expert_vector(beta, local_num, hidden, op, "gemm1_beta");
  m.swiglu_limit = moe_expert_vector(limit, local_num, hidden, op, "gemm1_clamp_limit");
  m.out = out.data_ptr();
  m.out_stride = out.stride(0);
  m.dtype = DType::kBFloat16;
  m.out_dtype = DType::kBFloat16;
  m.num_tokens = T;
  m.top_k = top_k;
  m.hidden = H;
  m.inter = inter;
  m.num_local_experts = local_num;
  m.expert_offset = offset;
  m.act = static_cast<kernels::MoeAct>(activation_type);
  m.round_gemm1 = false;
  TrtllmMoeResult res{{out}, do_finalize};
  if (!do_finalize) res.tensors = api::bind_unfinalized(p, routed, hidden, op, on_cuda);
  if (lora_delta) {
    // gemm1_lora_delta (vLLM's LoRA MoE; upstream's trtllm-gen, Blackwell only): added to GEMM1's
    // output before the activation; the list grows by the map and the bf16 activation.
    api::bind_lora_delta(m, *lora_delta, hidden, N1 != inter, do_finalize, DType::kBFloat16, op,
                         res.tensors);
  }
  // The CUDA kernel takes its scratch from the stream's (kernels/cuda/stream_scratch.h).
  api::launch(kTrtllmMoeKernels, bp, hidden.device(), op, "hidden_states", enable_pdl);
  return res;
}

}  // namespace

TrtllmMoeResult::operator Tensor() const {
  FLASHINFER_CHECK(finalized && tensors.size() == 1, "TrtllmMoeResult", "do_finalize",
                   "the call returned a list (unfinalized, or with a LoRA delta's "
                   "expanded_idx_to_permuted_idx and activation), not one output tensor");
  return tensors[0];
}

Value to_value(const TrtllmMoeResult& r) {
  // Upstream returns result[0] when it finalizes without a LoRA delta, the list otherwise.
  if (r.finalized && r.tensors.size() == 1) return Value(r.tensors.at(0));
  return to_value(r.tensors);
}

TrtllmMoeResult trtllm_bf16_moe(
    const Tensor& routing_logits, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    const Tensor& gemm1_weights, const Tensor& gemm2_weights, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, int64_t routing_method_type,
    bool use_shuffled_weight, WeightLayout weight_layout, bool do_finalize, bool enable_pdl,
    int64_t tune_max_num_tokens, int64_t activation_type, bool norm_topk_prob,
    std::optional<Tensor> routing_replay_out, std::optional<Tensor> gemm1_alpha,
    std::optional<Tensor> gemm1_beta, std::optional<Tensor> gemm1_clamp_limit,
    std::optional<Tensor> output, std::optional<Tensor> workspace_buffer) {
  return call_op<&trtllm_bf16_moe>(
      [&] {
        api::check_moe_workspace_buffer(workspace_buffer, do_finalize, std::nullopt,
                                        "trtllm_bf16_moe");
        return trtllm_bf16_moe_impl(
            "trtllm_bf16_moe", nullptr, routing_logits, routing_bias, hidden_states, gemm1_weights,
            gemm2_weights, num_experts, top_k, n_group, topk_group, intermediate_size,
            local_expert_offset, local_num_experts, routed_scaling_factor, routing_method_type,
            use_shuffled_weight, weight_layout, do_finalize, enable_pdl, activation_type,
            norm_topk_prob, routing_replay_out, gemm1_alpha, gemm1_beta, gemm1_clamp_limit, output);
      },
      routing_logits, routing_bias, hidden_states, gemm1_weights, gemm2_weights, num_experts, top_k,
      n_group, topk_group, intermediate_size, local_expert_offset, local_num_experts,
      routed_scaling_factor, routing_method_type, use_shuffled_weight, weight_layout, do_finalize,
      enable_pdl, tune_max_num_tokens, activation_type, norm_topk_prob, routing_replay_out,
      gemm1_alpha, gemm1_beta, gemm1_clamp_limit, output, workspace_buffer);
}

Value to_value(const MoeTopkIds& t) {
  if (!t.weights) return Value(t.ids);
  return Value::tuple({Value(t.ids), Value(*t.weights)});
}

TrtllmMoeResult trtllm_bf16_routed_moe(
    const MoeTopkIds& topk_ids, const Tensor& hidden_states, const Tensor& gemm1_weights,
    const Tensor& gemm2_weights, int64_t num_experts, int64_t top_k, std::optional<int64_t> n_group,
    std::optional<int64_t> topk_group, int64_t intermediate_size, int64_t local_expert_offset,
    int64_t local_num_experts, std::optional<double> routed_scaling_factor,
    int64_t routing_method_type, bool use_shuffled_weight, WeightLayout weight_layout,
    bool do_finalize, bool enable_pdl, std::optional<Tensor> gemm1_lora_delta,
    int64_t tune_max_num_tokens, int64_t activation_type, std::optional<Tensor> routing_replay_out,
    std::optional<Tensor> gemm1_alpha, std::optional<Tensor> gemm1_beta,
    std::optional<Tensor> gemm1_clamp_limit, std::optional<Tensor> output,
    std::optional<Tensor> workspace_buffer) {
  return call_op<&trtllm_bf16_routed_moe>(
      [&] {
        const char* op = "trtllm_bf16_routed_moe";
        api::check_moe_workspace_buffer(workspace_buffer, do_finalize, gemm1_lora_delta, op);
        return trtllm_bf16_moe_impl(
            op, &topk_ids, Tensor(), std::nullopt, hidden_states, gemm1_weights, gemm2_weights,
            num_experts, top_k, n_group, topk_group, intermediate_size, local_expert_offset,
            local_num_experts, routed_scaling_factor, routing_method_type, use_shuffled_weight,
            weight_layout, do_finalize, enable_pdl, activation_type, true, routing_replay_out,
            gemm1_alpha, gemm1_beta, gemm1_clamp_limit, output, gemm1_lora_delta);
      },
      topk_ids, hidden_states, gemm1_weights, gemm2_weights, num_experts, top_k, n_group,
      topk_group, intermediate_size, local_expert_offset, local_num_experts, routed_scaling_factor,
      routing_method_type, use_shuffled_weight, weight_layout, do_finalize, enable_pdl,
      gemm1_lora_delta, tune_max_num_tokens, activation_type, routing_replay_out, gemm1_alpha,
      gemm1_beta, gemm1_clamp_limit, output, workspace_buffer);
}

namespace {

constexpr api::KernelEntry<kernels::HashTopkParams> kHashTopkKernels[] = {
    {DeviceType::kCPU, "CPU reference: table lookup, fp32 sqrt(softplus), OpenMP over tokens",
     nullptr,
     [](const kernels::HashTopkParams& p, const api::LaunchContext&) {
       kernels::cpu::hash_topk(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel: one thread per token (a token whose id or table row is out of range gets "
     "ids -1 and NaN weights)",
     nullptr,
     [](const kernels::HashTopkParams& p, const api::LaunchContext& c) {
       kernels::cuda::hash_topk(p, c.stream, c.enable_pdl);
     }},
#endif
};

std::tuple<Tensor, Tensor> hash_topk_impl(const Tensor& logits, const Tensor& input_ids,
                                          const Tensor& tid2eid, int64_t num_shared,
                                          double routed_scaling_factor, bool launch_with_pdl) {
  const char* op = "hash_topk";
  api::check_defined(logits, op, "router_logits");
  api::check_defined(input_ids, op, "input_ids");
  api::check_defined(tid2eid, op, "tid2eid");
  api::check_dim(logits, {2}, op, "router_logits");
  api::check_dtype_in(logits, {DType::kFloat32}, op, "router_logits");
  moe_check_unit_last_stride(logits, op, "router_logits");
  api::check_dim(input_ids, {1}, op, "input_ids");
  api::check_dtype_in(input_ids, {DType::kInt64}, op, "input_ids");
  api::check_same_device(input_ids, logits, op, "input_ids", "router_logits");
  api::check_dim(tid2eid, {2}, op, "tid2eid");
  api::check_dtype_in(tid2eid, {DType::kInt32}, op, "tid2eid");
  api::check_same_device(tid2eid, logits, op, "tid2eid", "router_logits");
  moe_check_unit_last_stride(tid2eid, op, "tid2eid");
  const int64_t T = logits.size(0), E = logits.size(1), K = tid2eid.size(1);
  FLASHINFER_CHECK(input_ids.size(0) == T, op, "input_ids", "length (", input_ids.size(0),
                   ") must equal num_tokens (", T, ")");
  FLASHINFER_CHECK(K >= 1, op, "tid2eid", "needs at least one expert per row");
  // Upstream documents 0 or 1 shared slots (its check allows more, with no stated meaning).
  FLASHINFER_CHECK(num_shared == 0 || num_shared == 1, op, "num_fused_shared_experts",
                   "must be 0 or 1, got ", num_shared);
  FLASHINFER_CHECK(K + num_shared <= 32, op, "tid2eid",
                   "topk + num_fused_shared_experts must be <= 32, got ", K + num_shared);
  FLASHINFER_CHECK(std::isfinite(routed_scaling_factor) && routed_scaling_factor != 0.0, op,
                   "routed_scaling_factor", "must be finite and non-zero, got ",
                   routed_scaling_factor);
  Tensor weights = Tensor::empty({T, K + num_shared}, DType::kFloat32, logits.device());
  Tensor ids = Tensor::empty({T, K + num_shared}, DType::kInt32, logits.device());
  kernels::HashTopkParams p;
  p.logits = logits.data<float>();
  p.logits_stride = logits.stride(0);
  p.input_ids = input_ids.data<int64_t>();
  p.ids_stride = input_ids.stride(0);
  p.tid2eid = tid2eid.data<int32_t>();
  p.table_stride = tid2eid.stride(0);
  p.weights = weights.data<float>();
  p.topk_ids = ids.data<int32_t>();
  p.num_tokens = T;
  p.num_experts = E;
  p.vocab = tid2eid.size(0);
  p.topk = K;
  p.num_shared = num_shared;
  p.routed_scaling_factor = static_cast<float>(routed_scaling_factor);
  api::launch(kHashTopkKernels, p, logits.device(), op, "router_logits", launch_with_pdl);
  return {weights, ids};
}

}  // namespace

std::tuple<Tensor, Tensor> hash_topk(const Tensor& router_logits, const Tensor& input_ids,
                                     const Tensor& tid2eid, int64_t num_fused_shared_experts,
                                     double routed_scaling_factor, bool launch_with_pdl) {
  return call_op<&hash_topk>(
      [&] {
        return hash_topk_impl(router_logits, input_ids, tid2eid, num_fused_shared_experts,
                              routed_scaling_factor, launch_with_pdl);
      },
      router_logits, input_ids, tid2eid, num_fused_shared_experts, routed_scaling_factor,
      launch_with_pdl);
}

namespace {

// hash_topk: m tokens, 64 experts, a 1000-row table of top-6 plus the shared slot.
BenchCase bench_hash_topk(const BenchShape& s, Device dev) {
  const int64_t T = s.m, E = 64, V = 1000, K = 6;
  std::vector<int64_t> table, toks;
  for (int64_t v = 0; v < V; ++v) {
    for (int64_t k = 0; k < K; ++k) table.push_back((v * 7 + k * 11) % E);
  }
  for (int64_t t = 0; t < T; ++t) toks.push_back((t * 37 + 5) % V);
  Tensor tab = api::bench::int32_tensor(table, dev).view({V, K});
  Tensor tok = api::bench::int32_tensor(toks, dev).to(DType::kInt64);
  BenchCase c = api::bench::invoke_case(
      "hash_topk",
      {Value(api::bench::random_tensor({T, E}, DType::kFloat32, dev, s.random_seed, -4.0, 4.0)),
       Value(tok), Value(tab), Value(int64_t{1}), Value(2.5)});
  c.flops = static_cast<double>(T * K) * 4.0;
  c.bytes = static_cast<double>(T * K) * 4.0 * 3 + static_cast<double>(T) * 8.0;
  return c;
}

// trtllm_bf16_moe: m tokens, hidden_size, inter = n, 8 experts, top-2, DeepSeekV3 routing (4
// groups of 2, 2 kept), plain MajorK weights.
BenchCase bench_trtllm_bf16_moe(const BenchShape& s, Device dev) {
  const int64_t T = s.m, H = s.hidden_size, I = s.n, E = 8, K = 2;
  const DType dt = DType::kBFloat16;
  BenchCase c = api::bench::invoke_case(
      "trtllm_bf16_moe",
      {Value(api::bench::random_tensor({T, E}, DType::kFloat32, dev, s.random_seed, -3.0, 3.0)),
       Value(api::bench::random_tensor({E}, dt, dev, s.random_seed + 1, -0.2, 0.2)),
       Value(api::bench::random_tensor({T, H}, dt, dev, s.random_seed + 2)),
       Value(api::bench::random_tensor({E, 2 * I, H}, dt, dev, s.random_seed + 3, -0.1, 0.1)),
       Value(api::bench::random_tensor({E, H, I}, dt, dev, s.random_seed + 4, -0.1, 0.1)), Value(E),
       Value(K), Value(int64_t{4}), Value(int64_t{2}), Value(I), Value(int64_t{0}), Value(E),
       Value(2.5), Value(int64_t{2}), Value(false), Value(int64_t{0})});
  const double rows = static_cast<double>(T * K);
  c.flops = 2.0 * rows * H * (2 * I) + 2.0 * rows * I * H;
  c.bytes = api::bench::nbytes({T, H}, dt) * 2 + api::bench::nbytes({E, 2 * I, H}, dt) +
            api::bench::nbytes({E, H, I}, dt);
  return c;
}

// trtllm_bf16_routed_moe: the same FFN shapes, packed precomputed routing (two distinct
// experts per token, bf16 weights 0.75 / 0.25).
BenchCase bench_trtllm_bf16_routed_moe(const BenchShape& s, Device dev) {
  const int64_t T = s.m, H = s.hidden_size, I = s.n, E = 8, K = 2;
  const DType dt = DType::kBFloat16;
  std::vector<int64_t> packed;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t e0 = (t * 5) % E, e1 = (e0 + 1 + t % (E - 1)) % E;
    packed.push_back((e0 << 16) | float_to_bfloat16_bits(0.75f));
    packed.push_back((e1 << 16) | float_to_bfloat16_bits(0.25f));
  }
  BenchCase c = api::bench::invoke_case(
      "trtllm_bf16_routed_moe",
      {Value(api::bench::int32_tensor(packed, dev).view({T, K})),
       Value(api::bench::random_tensor({T, H}, dt, dev, s.random_seed + 2)),
       Value(api::bench::random_tensor({E, 2 * I, H}, dt, dev, s.random_seed + 3, -0.1, 0.1)),
       Value(api::bench::random_tensor({E, H, I}, dt, dev, s.random_seed + 4, -0.1, 0.1)), Value(E),
       Value(K), Value(), Value(), Value(I), Value(int64_t{0}), Value(E), Value(),
       Value(int64_t{0}), Value(false), Value(int64_t{0})});
  const double rows = static_cast<double>(T * K);
  c.flops = 2.0 * rows * H * (2 * I) + 2.0 * rows * I * H;
  c.bytes = api::bench::nbytes({T, H}, dt) * 2 + api::bench::nbytes({E, 2 * I, H}, dt) +
            api::bench::nbytes({E, H, I}, dt);
  return c;
}

// Bench hooks. cutlass_fused_moe: m tokens, hidden_size, inter = n, 8 experts, top-2 (two
// distinct experts per token spread over all eight), Swiglu. FLOPs: the routed rows' two GEMMs.
BenchCase bench_cutlass_fused_moe(const BenchShape& s, Device dev) {
  if (s.use_deepseek_fp8_block_scale) return api::bench_cutlass_fused_moe_fp8_block(s, dev);
  if (s.use_w4_group_scaling) return api::bench_cutlass_fused_moe_w4a16(s, dev);
  if (s.input_dtype == DType::kFloat8E4M3FN) return api::bench_cutlass_fused_moe_fp8(s, dev);
  if (s.input_dtype == DType::kUInt8) return api::bench_cutlass_fused_moe_fp4(s, dev);  // NVFP4
  const int64_t T = s.m, H = s.hidden_size, I = s.n, E = 8, K = 2;
  const DType dt = s.input_dtype;
  Tensor id_t = api::bench::moe_top2_ids(T, E, dev);
  BenchCase c = api::bench::invoke_case(
      "cutlass_fused_moe",
      {Value(api::bench::random_tensor({T, H}, dt, dev, s.random_seed)), Value(id_t),
       Value(api::bench::random_tensor({T, K}, DType::kFloat32, dev, s.random_seed + 1, 0.0, 1.0)),
       Value(api::bench::random_tensor({E, 2 * I, H}, dt, dev, s.random_seed + 2, -0.1, 0.1)),
       Value(api::bench::random_tensor({E, H, I}, dt, dev, s.random_seed + 3, -0.1, 0.1)),
       Value(dt), Value::list({})});
  const double rows = static_cast<double>(T * K);
  c.flops = 2.0 * rows * H * (2 * I) + 2.0 * rows * I * H;
  c.bytes = api::bench::nbytes({T, H}, dt) * 2 + api::bench::nbytes({E, 2 * I, H}, dt) +
            api::bench::nbytes({E, H, I}, dt);
  return c;
}

// fused_topk_deepseek: m tokens, 64 experts in 8 groups, 4 groups kept, top-8.
BenchCase bench_fused_topk_deepseek(const BenchShape& s, Device dev) {
  const int64_t T = s.m, E = 64, K = 8;
  const DType dt = s.input_dtype;
  BenchCase c = api::bench::invoke_case(
      "fused_topk_deepseek",
      {Value(api::bench::random_tensor({T, E}, dt, dev, s.random_seed, -4.0, 4.0)),
       Value(api::bench::random_tensor({E}, dt, dev, s.random_seed + 1, -0.5, 0.5)),
       Value(int64_t{8}), Value(int64_t{4}), Value(K), Value(2.5),
       Value(Tensor::zeros({T, K}, dt, dev)), Value(Tensor::zeros({T, K}, DType::kInt32, dev))});
  c.flops = static_cast<double>(T * E) * 4.0;
  c.bytes = api::bench::nbytes({T, E}, dt) + api::bench::nbytes({T, K}, dt) +
            api::bench::nbytes({T, K}, DType::kInt32);
  return c;
}

}  // namespace

namespace detail {
void register_moe_ops(OpRegistry& r) {
  declare<&is_gated_activation>(
      r,
      {.name = "is_gated_activation",
       .module = "flashinfer.tllm_enums",
       .summary = "Whether an ActivationType consumes a gate half of GEMM1 (Swiglu, Geglu, "
                  "SwigluBias, SwigluStep)"},
      "activation_type");
  {
    // A host-side predicate on an enum: it runs wherever it is called, with no kernel.
    static constexpr api::BackendSummary kHost[] = {{DeviceType::kCPU, "host-side predicate"}};
    api::register_backends("is_gated_activation", kHost);
  }
  declare<&cutlass_fused_moe>(
      r,
      {.name = "cutlass_fused_moe",
       .module = kMoeCoreModule,
       .summary = "Fused MoE: sum_k scale[t,k] * act(x @ w1[e].T) @ w2[e].T over routed experts",
       .returns = "list[Tensor]",
       .unwritten_results = {"result__1", "result__2", "result__3"},
       .unwritten_reason = "upstream's cutlass_fused_moe returns these scratch tensors "
                           "(num_active_experts_per_node, experts_to_token_score, "
                           "active_expert_global_ids) without writing them outside "
                           "min_latency_mode"},
      "input", "token_selected_experts", "token_final_scales", "fc1_expert_weights",
      "fc2_expert_weights", "output_dtype", arg("quant_scales").required(), "fc1_expert_biases",
      "fc2_expert_biases", "input_sf", "swiglu_alpha", "swiglu_beta", "swiglu_limit",
      arg("tp_size", int64_t{1}), arg("tp_rank", int64_t{0}), arg("ep_size", int64_t{1}),
      arg("ep_rank", int64_t{0}), arg("cluster_size", int64_t{1}), arg("cluster_rank", int64_t{0}),
      arg("output").mut(), arg("enable_alltoall", false),
      arg("use_deepseek_fp8_block_scale", false), arg("use_w4_group_scaling", false),
      arg("use_mxfp8_act_scaling", false), arg("min_latency_mode", false),
      arg("use_packed_weights", false), arg("use_wfp4afp8_humming", false),
      arg("tune_max_num_tokens", int64_t{8192}), "enable_pdl",
      arg("activation_type", ActivationType::Swiglu), arg("swizzled_input_sf", true),
      "use_fused_finalize", "profile_ids", "workspace_buffer");
  declare<&fused_topk_deepseek>(
      r,
      {.name = "fused_topk_deepseek",
       .module = "flashinfer.fused_moe.fused_routing_dsv3",
       .summary = "DeepSeek-V3 grouped top-k routing: sigmoid + bias, top groups, top-k, "
                  "normalized weights"},
      "scores", "bias", "n_group", "topk_group", "topk", "routed_scaling_factor",
      arg("topk_values").mut(), arg("topk_indices").mut(), arg("launch_with_pdl", true),
      arg("routing_replay_out").mut(), arg("backend", std::string_view("default")).kw());

  declare<&hash_topk>(r,
                      {.name = "hash_topk",
                       .module = "flashinfer.fused_moe.hash_topk",
                       .summary = "Hash MoE routing: experts from a token table, weights "
                                  "sqrt(softplus(logit)) normalized"},
                      "router_logits", "input_ids", "tid2eid",
                      arg("num_fused_shared_experts", int64_t{0}),
                      arg("routed_scaling_factor", 1.0), arg("launch_with_pdl", true));

  declare<&trtllm_bf16_moe>(
      r,
      {.name = "trtllm_bf16_moe",
       .module = kMoeCoreModule,
       .summary = "trtllm-gen BF16 MoE: routing from logits, then the fused expert FFNs",
       .returns = "Tensor | list[Tensor]"},
      "routing_logits", arg("routing_bias").required(), "hidden_states", "gemm1_weights",
      "gemm2_weights", "num_experts", "top_k", arg("n_group").required(),
      arg("topk_group").required(), "intermediate_size", "local_expert_offset", "local_num_experts",
      "routed_scaling_factor", arg("routing_method_type", int64_t{0}),
      arg("use_shuffled_weight", true), arg("weight_layout", WeightLayout::BlockMajorK),
      arg("do_finalize", true), arg("enable_pdl", true), arg("tune_max_num_tokens", int64_t{8192}),
      arg("activation_type", int64_t{3}), arg("norm_topk_prob", true),
      arg("routing_replay_out").mut(), "gemm1_alpha", "gemm1_beta", "gemm1_clamp_limit",
      arg("output").mut(), "workspace_buffer");
  declare<&trtllm_bf16_routed_moe>(
      r,
      {.name = "trtllm_bf16_routed_moe",
       .module = kMoeCoreModule,
       .summary = "trtllm-gen BF16 MoE with precomputed routing (packed ids or (ids, weights))",
       .returns = "Tensor | list[Tensor]"},
      "topk_ids", "hidden_states", "gemm1_weights", "gemm2_weights", "num_experts", "top_k",
      arg("n_group").required(), arg("topk_group").required(), "intermediate_size",
      "local_expert_offset", "local_num_experts", "routed_scaling_factor",
      arg("routing_method_type", int64_t{0}), arg("use_shuffled_weight", true),
      arg("weight_layout", WeightLayout::BlockMajorK), arg("do_finalize", true),
      arg("enable_pdl", true), "gemm1_lora_delta", arg("tune_max_num_tokens", int64_t{8192}),
      arg("activation_type", int64_t{3}), arg("routing_replay_out").mut(), "gemm1_alpha",
      "gemm1_beta", "gemm1_clamp_limit", arg("output").mut(), "workspace_buffer");
  // do_finalize=False rows come in an order the GPU's routing chooses: replay compares them
  // through each side's expanded_idx_to_permuted_idx (docs/MOE.md, "do_finalize=False").
  for (const char* name :
       {"trtllm_bf16_moe", "trtllm_bf16_routed_moe", "trtllm_fp8_block_scale_moe",
        "trtllm_fp8_block_scale_routed_moe", "trtllm_fp8_per_tensor_scale_moe",
        "trtllm_fp8_per_tensor_scale_routed_moe", "trtllm_fp4_block_scale_moe",
        "trtllm_fp4_block_scale_routed_moe", "trtllm_mxint4_block_scale_moe",
        "trtllm_mxint4_block_scale_routed_moe"}) {
    detail::register_result_comparator(name, detail::compare_trtllm_moe_unfinalized);
  }
  api::register_backends("trtllm_bf16_moe", kTrtllmMoeKernels);
  api::register_backends("trtllm_bf16_routed_moe", kTrtllmMoeKernels);
  register_bench_hook("trtllm_bf16_routed_moe", bench_trtllm_bf16_routed_moe);
  register_bench_hook("trtllm_bf16_moe", bench_trtllm_bf16_moe);

  api::register_backends("hash_topk", kHashTopkKernels);
  register_bench_hook("hash_topk", bench_hash_topk);
  api::register_backends("cutlass_fused_moe", kCutlassMoeKernels);
  api::register_backends("fused_topk_deepseek", kDeepSeekRoutingKernels);
  register_bench_hook("cutlass_fused_moe", bench_cutlass_fused_moe);
  register_bench_hook("fused_topk_deepseek", bench_fused_topk_deepseek);
}
}  // namespace detail

}  // namespace flashinfer
