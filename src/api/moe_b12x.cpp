// The Blackwell CuTe-DSL MoE wrappers: b12x_fused_moe / B12xMoEWrapper
// (flashinfer.fused_moe.cute_dsl.b12x_moe) and CuteDslMoEWrapper
// (flashinfer.fused_moe.cute_dsl.fused_moe). CPU reference only, on the FP4 MoE kernel of
// cute_dsl_fused_moe_nvfp4 (CuteDslMoEWrapper's w4a16: src/api/moe_cute_w4a16.cpp); b12x's
// w4a16 on the CuTe-DSL w4a16 reference with its b12x option. Semantics and sources: docs/MOE.md
// ("Blackwell wrappers", "b12x w4a16").
#include "flashinfer/ops/moe_b12x.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "api/moe_cute_dsl.h"
#include "api/moe_cute_w4a16.h"
#include "api/moe_cute_w4a8.h"
#include "api/moe_routing_checks.h"
#include "api/nvfp4_4over6.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/moe_cute_w4a16_cpu.h"
#include "kernels/cpu/moe_fp4_cpu.h"
#include "kernels/moe_cute_w4a16_params.h"
#include "kernels/moe_fp4_params.h"
#include "kernels/quantization_params.h"

namespace flashinfer {

void moe_cute::check_clamped_relu2(const char* op, int64_t activation_type,
                                   const std::optional<Tensor>& limit, std::optional<Device> device,
                                   std::string_view quant_mode) {
  const bool clamped = activation_type == static_cast<int64_t>(ActivationType::ClampedRelu2);
  api::check_clamped_relu2_limit(op, clamped, limit, device);
  if (!clamped) return;
  FLASHINFER_CHECK(quant_mode != "w4a16", op, "activation_type",
                   "ActivationType.ClampedRelu2 is not supported when quant_mode='w4a16'");
  api::refuse_if(true, op, "activation_type",
                 "ClampedRelu2 on the CuTe-DSL path (the limit applied after w1_alpha) is not "
                 "implemented");
}

void moe_cute::check_situ_config(const char* op, int64_t activation_type,
                                 const std::optional<double>& situ_beta,
                                 const std::optional<double>& situ_linear_beta) {
  auto finite_positive = [](double v) {
    const float f = static_cast<float>(v);
    return std::isfinite(f) && f > 0.0f;
  };
  if (!situ_beta) {
    FLASHINFER_CHECK(!situ_linear_beta, op, "situ_linear_beta", "requires situ_beta");
    return;
  }
  FLASHINFER_CHECK(activation_type == 3, op, "situ_beta",
                   "SiTU parameters require ActivationType.Swiglu (3), got ", activation_type);
  FLASHINFER_CHECK(finite_positive(*situ_beta), op, "situ_beta",
                   "must be positive and finite in fp32, got ", *situ_beta);
  FLASHINFER_CHECK(!situ_linear_beta || finite_positive(*situ_linear_beta), op, "situ_linear_beta",
                   "must be positive and finite in fp32 when set, got ",
                   situ_linear_beta.value_or(0.0));
}

namespace {

constexpr const char* kB12xModule = "flashinfer.fused_moe.cute_dsl.b12x_moe";
constexpr const char* kCuteModule = "flashinfer.fused_moe.cute_dsl.fused_moe";

constexpr api::KernelEntry<kernels::TrtllmFp4MoeParams> kB12xKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: bf16 input quantized to NVFP4 per (token, expert), exact block "
     "dequantization, per-expert fp32 GEMMs of the routed rows only, NVFP4 activation",
     nullptr,
     [](const kernels::TrtllmFp4MoeParams& p, const api::LaunchContext&) {
       kernels::cpu::trtllm_fp4_moe(p);
     }},
};

// _normalize_quant_mode upstream: quant_mode wins; None takes activation_precision ("fp4" ->
// "nvfp4", "bf16" -> "w4a16"); "w4a4" is an alias of "nvfp4".
std::string b12x_quant_mode(const std::optional<std::string>& quant_mode,
                            const std::string& activation_precision, const char* op) {
  if (!quant_mode) {
    FLASHINFER_CHECK(activation_precision == "fp4" || activation_precision == "bf16", op,
                     "activation_precision", "must be \"fp4\" or \"bf16\", got \"",
                     activation_precision, "\"");
    return activation_precision == "fp4" ? "nvfp4" : "w4a16";
  }
  const std::string& q = *quant_mode;
  if (q == "nvfp4" || q == "w4a4") return "nvfp4";
  FLASHINFER_CHECK(q == "w4a16" || q == "w4a8_mx" || q == "w4a8_nvfp4", op, "quant_mode",
                   "must be \"nvfp4\", \"w4a4\", \"w4a16\", \"w4a8_mx\" or \"w4a8_nvfp4\", got \"",
                   q, "\"");
  return q;
}

// The settings b12x checks when they are given (constructor or call).
void b12x_check_settings(const char* op, DType output_dtype, const std::string& activation,
                         const std::string& source_format) {
  FLASHINFER_CHECK(output_dtype == DType::kBFloat16, op, "output_dtype",
                   "b12x only supports torch.bfloat16 output, got ",
                   dtype_torch_name(output_dtype));
  // The SM12x kernels' set (SUPPORTED_MOE_ACTIVATIONS, moe_activation.py); a ValueError there.
  FLASHINFER_CHECK(activation == "silu" || activation == "gelu_tanh" ||
                       activation == "swigluoai_uninterleave" || activation == "relu2",
                   op, "activation",
                   "must be \"silu\", \"gelu_tanh\", \"swigluoai_uninterleave\" or \"relu2\", "
                   "got \"",
                   activation, "\"");
  // swiglu_alpha/beta/limit reach only "swigluoai_uninterleave" (gated_activation_f32); with
  // the other activations, relu2 included, the launcher drops them without an error.
  FLASHINFER_CHECK(source_format == "modelopt" || source_format == "compressed_tensors", op,
                   "source_format", "must be \"modelopt\" or \"compressed_tensors\", got \"",
                   source_format, "\"");
}

// _normalize_source_format_for_quant_mode (launch_sm120_moe): the compressed-tensors weight
// format exists only for w4a16.
void b12x_check_source_format(const char* op, const std::string& source_format,
                              const std::string& quant_mode) {
  FLASHINFER_CHECK(source_format != "compressed_tensors" || quant_mode == "w4a16", op,
                   "source_format", "'compressed_tensors' requires quant_mode='w4a16', got '",
                   quant_mode, "'");
}

struct B12xCall {
  const Tensor* x;
  const Tensor* w1;
  const Tensor* w1_sf;
  const Tensor* w2;
  const Tensor* w2_sf;
  const Tensor* ids;
  const Tensor* scales;
  const Tensor* w1_alpha;
  const Tensor* w2_alpha;
  const std::optional<Tensor>* fc2_input_scale;
  const std::optional<Tensor>* input_global_scale;
  const std::optional<Tensor>* output;
  int64_t num_experts;
  int64_t top_k;
  std::string activation;
  std::string quant_mode;  // normalized
  double swiglu_alpha = 1.702;
  double swiglu_beta = 1.0;
  std::optional<double> swiglu_limit;
  std::string source_format = "modelopt";  // w4a16 only
  bool mapped = false;  // ids already mapped to local experts by expert_map (top_k may exceed E)
};

// Upstream 0.7.4's expert_map checks (b12x_fused_moe and the wrapper; `who` names the caller in
// the first text), then its launcher's.
void check_expert_map(const char* op, const char* who, const std::string& q,
                      const std::optional<Tensor>& map, int64_t num_local, int64_t num_experts,
                      const Device& dev) {
  if (num_local == num_experts && !map) return;
  FLASHINFER_CHECK_CODE(q == "w4a16", ErrorCode::kUnsupported, op, "quant_mode", who,
                        " supports Expert Parallelism only for quant_mode='w4a16' "
                        "(num_local_experts=",
                        num_local, ", num_experts=", num_experts,
                        "). Use a different MoE backend for EP configurations.");
  FLASHINFER_CHECK(map.has_value(), op, "expert_map",
                   "Expert Parallelism (num_local_experts=", num_local,
                   " != num_experts=", num_experts,
                   ") requires expert_map. A default map would silently assume this rank holds "
                   "global experts [0, ",
                   num_local, ").");
  const Tensor& m = *map;
  FLASHINFER_CHECK(m.dtype() == DType::kInt32, op, "expert_map",
                   "expert_map must have dtype torch.int32, got ", dtype_torch_name(m.dtype()));
  FLASHINFER_CHECK(m.dim() == 1 && m.is_contiguous(), op, "expert_map",
                   "expert_map must be a contiguous rank-1 tensor");
  FLASHINFER_CHECK(m.numel() == num_experts, op, "expert_map",
                   "expert_map must have num_experts=", num_experts, " entries, got ", m.numel());
  FLASHINFER_CHECK(m.device() == dev, op, "expert_map", "expert_map must be on ", dev.str(),
                   ", got ", m.device().str());
  FLASHINFER_CHECK(m.numel() >= num_local, op, "expert_map",
                   "expert_map cannot be shorter than the local expert count");
}

// token_selected_experts through expert_map: global id g in [0, num_experts) with map[g] >= 0
// runs local weights map[g]; every other route is dropped (-1, an unrouted slot). An entry past
// the local experts would read outside upstream's weights (it does not check): an error here.
Tensor local_expert_ids(const char* op, const Tensor& ids, const Tensor& map, int64_t num_experts,
                        int64_t num_local) {
  const std::vector<int64_t> mv = api::host_ints(map), iv = api::host_ints(ids);
  std::vector<double> out(iv.size());
  for (std::size_t i = 0; i < iv.size(); ++i) {
    const int64_t g = iv[i];
    const int64_t l = g >= 0 && g < num_experts ? mv[static_cast<std::size_t>(g)] : -1;
    FLASHINFER_CHECK(l < num_local, op, "expert_map", "entry ", g, " maps to ", l,
                     ", not a local expert id (num_local_experts=", num_local, ")");
    out[i] = static_cast<double>(l < 0 ? -1 : l);
  }
  return Tensor::from_vector(out, ids.shape(), DType::kInt32).to(ids.device());
}

// A global scale: one fp32 value or [E] (b12x's _expand_to_experts); null when absent.
const float* global_scale(const std::optional<Tensor>& t, int64_t E, const Tensor& like,
                          const char* op, const char* arg, int64_t& count) {
  count = 0;
  if (!t) return nullptr;
  api::check_dtype_in(*t, {DType::kFloat32}, op, arg);
  api::check_same_device(*t, like, op, arg, "x");
  FLASHINFER_CHECK(t->is_contiguous() && (t->numel() == 1 || t->numel() == E), op, arg,
                   "expected one value or [", E, "], got ", shape_to_string(t->shape()));
  count = t->numel();
  return t->data<float>();
}

// The linear scale codes of w1 [E, N1, H/16] and w2 [E, H, I/16]: b12x takes plain rows (w1
// un-interleaved: create_b12x_moe_tensors), scales 128x4-swizzled or the 6-D view.
std::pair<Tensor, Tensor> b12x_plain_scales(const B12xCall& c, int64_t E, int64_t N1, int64_t H,
                                            int64_t I, const char* op) {
  return moe_cute::cute_plain_weight_scales(*c.w1_sf, *c.w2_sf, E, N1, H, I, 16,
                                            moe_cute::cute_row_source(N1, false), op);
}

constexpr api::KernelEntry<kernels::CuteW4a16MoeParams> kB12xW4a16Kernels[] = {
    {DeviceType::kCPU,
     "CPU reference: bf16 x, NVFP4 weights decoded exactly (b12x's scale flush), bf16 GEMM1 "
     "store, activation and per-route GEMM2 products, fp32 top-k sum",
     nullptr,
     [](const kernels::CuteW4a16MoeParams& p, const api::LaunchContext&) {
       kernels::cpu::cute_w4a16_moe(p);
     }},
};

// quant_mode "w4a16" after b12x_impl's common checks (docs/MOE.md "b12x w4a16"): bf16 x, NVFP4
// weights with per-expert fp32 global scales w1_alpha / w2_alpha (compressed_tensors stores
// their inverses); fc2_input_scale, input_global_scale and swiglu_* are ignored.
Tensor b12x_w4a16(const char* op, const B12xCall& c, int64_t E, int64_t I, bool gated) {
  const Tensor& x = *c.x;
  const int64_t T = x.size(0), H = x.size(1), N1 = gated ? 2 * I : I;
  // _repack_weight: K a multiple of 16 and N of 64 for both GEMMs (H % 64 is checked already).
  FLASHINFER_CHECK(N1 % 64 == 0, op, "w1_weight",
                   "quant_mode='w4a16' needs w1 rows a multiple of 64, got ", N1);
  for (const Tensor* a : {c.w1_alpha, c.w2_alpha}) {
    FLASHINFER_CHECK(a->numel() == E, op, a == c.w1_alpha ? "w1_alpha" : "w2_alpha",
                     "quant_mode='w4a16' needs one fp32 global scale per expert [", E, "], got ",
                     shape_to_string(a->shape()));
  }
  const float* a1 = c.w1_alpha->data<float>();
  const float* a2 = c.w2_alpha->data<float>();
  std::vector<float> inv1, inv2;
  if (c.source_format == "compressed_tensors") {  // _source_global_scale: 1 / alpha in fp32
    for (int64_t e = 0; e < E; ++e) {
      inv1.push_back(1.0f / a1[e]);
      inv2.push_back(1.0f / a2[e]);
    }
    a1 = inv1.data();
    a2 = inv2.data();
  }
  const Tensor out = moe_cute::cute_output(op, "output", *c.output, T, H, DType::kBFloat16, x);
  const auto [s1p, s2p] = b12x_plain_scales(c, E, N1, H, I, op);
  kernels::CuteW4a16MoeParams p;
  p.x = static_cast<const uint16_t*>(x.data_ptr());
  p.x_stride = x.stride(0);
  p.ids = c.ids->data<int32_t>();
  p.scales = c.scales->data<float>();
  p.routed_stride = c.top_k;
  p.w1 = static_cast<const uint8_t*>(c.w1->data_ptr());
  p.s1 = static_cast<const uint8_t*>(s1p.data_ptr());
  p.w2 = static_cast<const uint8_t*>(c.w2->data_ptr());
  p.s2 = static_cast<const uint8_t*>(s2p.data_ptr());
  p.alpha1 = a1;
  p.alpha2 = a2;
  p.num_tokens = T;
  p.top_k = c.top_k;
  p.hidden = H;
  p.inter = I;
  p.num_local_experts = E;
  p.gated = gated;
  p.b12x = true;
  // run_w4a16_moe's TC-decode path (at most 4 tokens, gated, no expert_map) adds the routes into
  // the bf16 output with bf16 atomics; otherwise the top-k sum kernel adds them in fp32.
  p.fused_finalize = gated && T <= 4;
  p.out = static_cast<uint16_t*>(out.data_ptr());
  p.out_stride = out.stride(0);
  api::launch(kB12xW4a16Kernels, p, x.device(), op, "x", false);
  return out;
}

Tensor b12x_impl(const char* op, const B12xCall& c) {
  const bool w4a16 = c.quant_mode == "w4a16";
  FLASHINFER_CHECK_CODE(c.quant_mode == "nvfp4" || w4a16, ErrorCode::kUnsupported, op, "quant_mode",
                        "only \"nvfp4\" (w4a4) and \"w4a16\" are implemented, got \"", c.quant_mode,
                        "\"");
  // The w4a16 path's own activation set (moe_w4a16_activations.py), a ValueError there.
  FLASHINFER_CHECK(!w4a16 || c.activation == "silu" || c.activation == "relu2", op, "activation",
                   "quant_mode='w4a16' supports only \"silu\" and \"relu2\", got \"", c.activation,
                   "\"");
  const Tensor& x = *c.x;
  api::check_defined(x, op, "x");
  api::check_upstream_arch(op, "x", x.device());  // upstream's refusal first
  FLASHINFER_CHECK_CODE(x.device().is_cpu(), ErrorCode::kUnsupported, op, "x",
                        "this op has a CPU reference only (no CUDA kernel here)");
  api::check_dtype_in(x, {DType::kBFloat16}, op, "x");
  api::check_dim(x, {2}, op, "x");
  api::check_last_stride_one(x, op, "x");
  const bool gated = c.activation != "relu2";
  const int64_t T = x.size(0), H = x.size(1), K = c.top_k, E = c.num_experts;
  FLASHINFER_CHECK(E >= 1, op, "num_experts", "must be >= 1, got ", E);
  FLASHINFER_CHECK(K >= 1 && (c.mapped || K <= E), op, "top_k", "must be in [1, num_experts=", E,
                   "], got ", K);
  FLASHINFER_CHECK(H % 64 == 0, op, "x", "hidden_size must be a multiple of 64, got ", H);
  const Tensor& ids = *c.ids;
  api::check_defined(ids, op, "token_selected_experts");
  api::check_dtype_in(ids, {DType::kInt32}, op, "token_selected_experts");
  api::check_shape_eq(ids, {T, K}, op, "token_selected_experts");
  api::check_same_device(ids, x, op, "token_selected_experts", "x");
  FLASHINFER_CHECK(ids.is_contiguous(), op, "token_selected_experts", "must be contiguous");
  const Tensor& sc = *c.scales;
  api::check_defined(sc, op, "token_final_scales");
  api::check_dtype_in(sc, {DType::kFloat32}, op, "token_final_scales");
  api::check_shape_eq(sc, {T, K}, op, "token_final_scales");
  api::check_same_device(sc, x, op, "token_final_scales", "x");
  FLASHINFER_CHECK(sc.is_contiguous(), op, "token_final_scales", "must be contiguous");
  // A negative id is an unrouted slot (CUDA-graph padding): it contributes nothing, and a token
  // whose slots are all negative gets a zero row (upstream 0.7.4's docstring and kernels; the
  // kernels here skip any id outside the local experts). An id at or above E would index past
  // upstream's per-expert buffers; here it is an error.
  const int32_t* idp = ids.data<int32_t>();
  for (int64_t i = 0; i < T * K; ++i) {
    FLASHINFER_CHECK(idp[i] < E, op, "token_selected_experts", "entry ", i, " is ", idp[i],
                     ", at or above num_experts=", E, " (negative ids are unrouted slots)");
  }
  const Tensor& w1 = *c.w1;
  api::check_defined(w1, op, "w1_weight");
  api::check_dtype_in(w1, {DType::kUInt8}, op, "w1_weight");
  api::check_dim(w1, {3}, op, "w1_weight");
  api::check_same_device(w1, x, op, "w1_weight", "x");
  FLASHINFER_CHECK(w1.is_contiguous() && w1.size(0) == E && w1.size(2) == H / 2, op, "w1_weight",
                   "expected contiguous [", E, ", ", gated ? "2 * " : "", "intermediate_size, ",
                   H / 2, "], got ", shape_to_string(w1.shape()));
  const int64_t N1 = w1.size(1), I = gated ? N1 / 2 : N1;
  FLASHINFER_CHECK(I >= 16 && I % 16 == 0 && (!gated || N1 % 2 == 0), op, "w1_weight",
                   "intermediate_size must be a positive multiple of 16, got rows ", N1);
  const Tensor& w2 = *c.w2;
  api::check_defined(w2, op, "w2_weight");
  api::check_dtype_in(w2, {DType::kUInt8}, op, "w2_weight");
  api::check_same_device(w2, x, op, "w2_weight", "x");
  FLASHINFER_CHECK(w2.is_contiguous() && w2.shape() == Shape({E, H, I / 2}), op, "w2_weight",
                   "expected contiguous [", E, ", ", H, ", ", I / 2, "], got ",
                   shape_to_string(w2.shape()));
  const float* a1 = api::per_expert_floats(*c.w1_alpha, E, x, op, "w1_alpha");
  const float* a2 = api::per_expert_floats(*c.w2_alpha, E, x, op, "w2_alpha");
  FLASHINFER_CHECK(a1 != nullptr, op, "w1_alpha", "required");
  FLASHINFER_CHECK(a2 != nullptr, op, "w2_alpha", "required");
  if (w4a16) return b12x_w4a16(op, c, E, I, gated);
  FLASHINFER_CHECK(c.fc2_input_scale->has_value(), op, "fc2_input_scale",
                   "is required when quant_mode='nvfp4'");
  int64_t gs2_n = 0, gs1_n = 0;
  const float* gs2 = global_scale(*c.fc2_input_scale, E, x, op, "fc2_input_scale", gs2_n);
  const float* gs1 = global_scale(*c.input_global_scale, E, x, op, "input_global_scale", gs1_n);
  // launch_sm120_moe: a given input_global_scale quantizes x and is folded into GEMM1's alpha
  // (w1_alpha * input_global_scale, fp32); absent, w1_alpha itself is x's quantization scale.
  std::vector<float> a1_folded;
  const bool fold = gs1 != nullptr;
  if (fold) {
    a1_folded.resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      a1_folded[static_cast<size_t>(e)] = a1[e] * gs1[gs1_n == 1 ? 0 : e];
    }
  } else {
    gs1 = a1;
    gs1_n = E;
  }
  const float* alpha1 = fold ? a1_folded.data() : a1;
  const Tensor out = moe_cute::cute_output(op, "output", *c.output, T, H, DType::kBFloat16, x);
  const auto [s1p, s2p] = b12x_plain_scales(c, E, N1, H, I, op);
  // Gated: up rows [0, I), gate rows [I, 2I) for every gated activation (the kernels split w13
  // by tile: up tiles first). silu is gate * sigmoid(gate) * up; swigluoai_uninterleave clamps
  // (gate <= limit, |up| <= limit; no limit: no clamp) and computes gate * sigmoid(alpha * gate)
  // * (up + beta); gelu_tanh is gate * sigmoid(2z) * up, the tanh GELU.
  const bool oai = c.activation == "swigluoai_uninterleave";
  std::vector<float> sa(static_cast<size_t>(E), oai ? static_cast<float>(c.swiglu_alpha) : 1.0f),
      sb(static_cast<size_t>(E), oai ? static_cast<float>(c.swiglu_beta) : 0.0f),
      sl(static_cast<size_t>(E),
         oai && c.swiglu_limit ? static_cast<float>(*c.swiglu_limit) : 3.4028234663852886e38f);
  kernels::TrtllmFp4MoeParams p;
  p.weights = kernels::Moe4Weights::kNvfp4;
  p.input = kernels::Moe4Input::kBf16;
  p.quantize_input = true;
  p.in_global_scale = gs1;
  p.in_gs_count = gs1_n;
  p.act_quant = kernels::Moe4ActQuant::kNvfp4KeepScaleBf16;
  p.act_global_scale = gs2;
  p.act_gs_count = gs2_n;
  p.round_routing_weights = false;
  p.round_expert_out = false;
  p.w1_scale = s1p.data_ptr();
  p.w2_scale = s2p.data_ptr();
  p.out1_scale = gated ? alpha1 : nullptr;
  p.out1_gate_scale = alpha1;
  p.out2_scale = a2;
  moe_cute::set_moe_problem(p, x, ids, K, sc, out, E, K, I, E, 0, w1.data_ptr(), w2.data_ptr());
  kernels::CutlassMoeParams& m = p.base.moe;
  m.act = !gated                        ? kernels::MoeAct::kRelu2
          : c.activation == "gelu_tanh" ? kernels::MoeAct::kGegluTanh
                                        : kernels::MoeAct::kSwigluBias;
  if (m.act == kernels::MoeAct::kSwigluBias) {
    m.swiglu_alpha = sa.data();
    m.swiglu_beta = sb.data();
    m.swiglu_limit = sl.data();
  }
  api::launch(kB12xKernels, p, x.device(), op, "x", false);
  return out;
}

std::string canonical_cute_quant_mode(const std::string& q, const char* op) {
  if (q == "nvfp4") return "w4a4";  // upstream's deprecated alias
  FLASHINFER_CHECK(q == "w4a4" || q == "w4a8" || q == "w4a16", op, "quant_mode",
                   "must be 'w4a4', 'w4a8' or 'w4a16', got '", q, "'");
  return q;
}

void check_device_name(const std::string& device, const char* op) {
  try {
    (void)Device::parse(device);
  } catch (const Error&) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, "device",
                    "expected \"cpu\", \"cuda\" or \"cuda:N\", got \"", device, "\"");
  }
}

using B12xInit =
    Init<B12xMoEWrapper, int64_t, int64_t, int64_t, int64_t, bool, int64_t, std::optional<int64_t>,
         std::optional<Tensor>, DType, std::string, std::string, double, double,
         std::optional<double>, std::string, std::optional<std::string>, std::string,
         std::optional<Value>, std::optional<Value>, std::optional<Tensor>>;
using CuteInit =
    Init<CuteDslMoEWrapper, int64_t, int64_t, int64_t, int64_t, bool, std::optional<int64_t>,
         std::optional<int64_t>, int64_t, int64_t, int64_t, DType, std::string, bool, int64_t,
         double, double, double, std::optional<double>, std::optional<double>, bool, std::string,
         std::optional<Tensor>, bool>;

}  // namespace

Tensor b12x_fused_moe(const Tensor& x, const Tensor& w1_weight, const Tensor& w1_weight_sf,
                      const Tensor& w2_weight, const Tensor& w2_weight_sf,
                      const Tensor& token_selected_experts, const Tensor& token_final_scales,
                      int64_t num_experts, int64_t top_k, const Tensor& w1_alpha,
                      const Tensor& w2_alpha, std::optional<Tensor> fc2_input_scale,
                      std::optional<Tensor> input_global_scale,
                      std::optional<int64_t> num_local_experts, std::optional<Tensor> expert_map,
                      std::optional<Tensor> output, DType output_dtype, std::string activation,
                      double swiglu_alpha, double swiglu_beta, std::optional<double> swiglu_limit,
                      std::string activation_precision, std::optional<std::string> quant_mode,
                      std::string source_format) {
  return call_op<&b12x_fused_moe>(
      [&] {
        const char* op = "b12x_fused_moe";
        b12x_check_settings(op, output_dtype, activation, source_format);
        const std::string q = b12x_quant_mode(quant_mode, activation_precision, op);
        b12x_check_source_format(op, source_format, q);
        // Expert parallelism (upstream 0.7.4): w4a16 with expert_map only.
        const int64_t local = num_local_experts.value_or(num_experts);
        check_expert_map(op, "b12x_fused_moe", q, expert_map, local, num_experts, x.device());
        const Tensor ids = expert_map ? local_expert_ids(op, token_selected_experts, *expert_map,
                                                         num_experts, local)
                                      : token_selected_experts;
        B12xCall c{&x,
                   &w1_weight,
                   &w1_weight_sf,
                   &w2_weight,
                   &w2_weight_sf,
                   &ids,
                   &token_final_scales,
                   &w1_alpha,
                   &w2_alpha,
                   &fc2_input_scale,
                   &input_global_scale,
                   &output,
                   local,
                   top_k,
                   activation,
                   q,
                   swiglu_alpha,
                   swiglu_beta,
                   swiglu_limit,
                   source_format};
        c.mapped = expert_map.has_value();
        return b12x_impl(op, c);
      },
      x, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf, token_selected_experts,
      token_final_scales, num_experts, top_k, w1_alpha, w2_alpha, fc2_input_scale,
      input_global_scale, num_local_experts, expert_map, output, output_dtype, activation,
      swiglu_alpha, swiglu_beta, swiglu_limit, activation_precision, quant_mode, source_format);
}

B12xMoEWrapper::B12xMoEWrapper(int64_t num_experts, int64_t top_k, int64_t hidden_size,
                               int64_t intermediate_size, bool use_cuda_graph,
                               int64_t max_num_tokens, std::optional<int64_t> num_local_experts,
                               std::optional<Tensor> expert_map, DType output_dtype,
                               std::string device, std::string activation, double swiglu_alpha,
                               double swiglu_beta, std::optional<double> swiglu_limit,
                               std::string activation_precision,
                               std::optional<std::string> quant_mode, std::string source_format,
                               std::optional<Value> shared_static_workspace,
                               std::optional<Value> shared_dynamic_workspace,
                               std::optional<Tensor> shared_output) {
  call_init<B12xInit>(
      [&] {
        const char* op = "B12xMoEWrapper.__init__";
        b12x_check_settings(op, output_dtype, activation, source_format);
        check_device_name(device, op);
        FLASHINFER_CHECK(num_experts >= 1, op, "num_experts", "must be >= 1, got ", num_experts);
        FLASHINFER_CHECK(top_k >= 1 && top_k <= num_experts, op, "top_k",
                         "must be in [1, num_experts=", num_experts, "], got ", top_k);
        FLASHINFER_CHECK(hidden_size >= 64 && hidden_size % 64 == 0, op, "hidden_size",
                         "must be a positive multiple of 64, got ", hidden_size);
        FLASHINFER_CHECK(intermediate_size >= 16 && intermediate_size % 16 == 0, op,
                         "intermediate_size", "must be a positive multiple of 16, got ",
                         intermediate_size);
        FLASHINFER_CHECK(max_num_tokens >= 1, op, "max_num_tokens", "must be >= 1, got ",
                         max_num_tokens);
        // Upstream 0.7.4 resolves num_local_experts with `is not None` (0 is expert parallelism).
        const int64_t local = num_local_experts.value_or(num_experts);
        quant_mode_ = b12x_quant_mode(quant_mode, activation_precision, op);
        b12x_check_source_format(op, source_format, quant_mode_);
        // Expert parallelism: w4a16 with a map validated on the host and cloned, as upstream's
        // _prepare_ep_expert_map does (the device is the weights', checked by run).
        check_expert_map(op, "B12xMoEWrapper", quant_mode_, expert_map, local, num_experts,
                         expert_map ? expert_map->device() : Device::cpu());
        if (expert_map) {
          std::vector<int64_t> mapped;
          for (int64_t l : api::host_ints(*expert_map)) {
            FLASHINFER_CHECK(l == -1 || (l >= 0 && l < local), op, "expert_map",
                             "expert_map values must be -1 or valid local expert ids, found ", l,
                             " for num_local_experts=", local);
            if (l >= 0) mapped.push_back(l);
          }
          std::sort(mapped.begin(), mapped.end());
          std::string want = "[", got = "[";
          for (int64_t i = 0; i < local; ++i) want += (i ? ", " : "") + std::to_string(i);
          for (std::size_t i = 0; i < mapped.size(); ++i) {
            got += (i ? ", " : "") + std::to_string(mapped[i]);
          }
          bool once = static_cast<int64_t>(mapped.size()) == local;
          for (std::size_t i = 0; once && i < mapped.size(); ++i) once = mapped[i] == int64_t(i);
          FLASHINFER_CHECK(once, op, "expert_map",
                           "expert_map must map every local expert id exactly once: expected ",
                           want + "]", ", got ", got + "]");
          expert_map_ = expert_map->clone();
        }
        // The shared buffers only matter to CUDA-graph wrappers upstream.
        const bool shared = (shared_static_workspace && !shared_static_workspace->is_none()) ||
                            (shared_dynamic_workspace && !shared_dynamic_workspace->is_none()) ||
                            shared_output;
        FLASHINFER_CHECK(!shared || use_cuda_graph, op, "use_cuda_graph",
                         "shared_static_workspace / shared_dynamic_workspace / shared_output "
                         "require use_cuda_graph=True; without pre-allocated buffers, run() "
                         "ignores shared resources.");
        if (shared_output) {
          const Tensor& so = *shared_output;
          FLASHINFER_CHECK(
              so.dim() == 2 && so.size(0) >= max_num_tokens && so.size(1) == hidden_size &&
                  so.dtype() == output_dtype && so.stride(1) == 1,
              op, "shared_output", "shared_output must be [>= max_num_tokens=", max_num_tokens,
              ", hidden_size=", hidden_size, "] of ", dtype_torch_name(output_dtype), ", got ",
              shape_to_string(so.shape()), " ", dtype_torch_name(so.dtype()));
          shared_output_ = so;
        }
        num_local_experts_ = local;
        num_experts_ = num_experts;
        top_k_ = top_k;
        hidden_size_ = hidden_size;
        intermediate_size_ = intermediate_size;
        use_cuda_graph_ = use_cuda_graph;
        max_num_tokens_ = max_num_tokens;
        activation_ = activation;
        source_format_ = source_format;
        swiglu_alpha_ = swiglu_alpha;
        swiglu_beta_ = swiglu_beta;
        swiglu_limit_ = swiglu_limit;
      },
      *this, num_experts, top_k, hidden_size, intermediate_size, use_cuda_graph, max_num_tokens,
      num_local_experts, expert_map, output_dtype, device, activation, swiglu_alpha, swiglu_beta,
      swiglu_limit, activation_precision, quant_mode, source_format, shared_static_workspace,
      shared_dynamic_workspace, shared_output);
}

Tensor B12xMoEWrapper::run(const Tensor& x, const Tensor& w1_weight, const Tensor& w1_weight_sf,
                           const Tensor& w2_weight, const Tensor& w2_weight_sf,
                           const Tensor& token_selected_experts, const Tensor& token_final_scales,
                           const Tensor& w1_alpha, const Tensor& w2_alpha,
                           std::optional<Tensor> fc2_input_scale,
                           std::optional<Tensor> input_global_scale) {
  return call_op<&B12xMoEWrapper::run>(
      [&] {
        const char* op = "B12xMoEWrapper.run";
        api::check_defined(token_selected_experts, op, "token_selected_experts");
        api::check_dim(token_selected_experts, {2}, op, "token_selected_experts");
        const int64_t T = token_selected_experts.size(0);
        FLASHINFER_CHECK(!use_cuda_graph_ || T <= max_num_tokens_, op, "token_selected_experts",
                         "num_tokens (", T, ") exceeds max_num_tokens (", max_num_tokens_, ")");
        api::check_defined(x, op, "x");
        api::check_dim(x, {2}, op, "x");
        FLASHINFER_CHECK(x.size(1) == hidden_size_, op, "x", "expected hidden_size ", hidden_size_,
                         " columns, got ", shape_to_string(x.shape()));
        api::check_defined(w1_weight, op, "w1_weight");
        api::check_dim(w1_weight, {3}, op, "w1_weight");
        const int64_t rows = (activation_ == "relu2" ? 1 : 2) * intermediate_size_;
        FLASHINFER_CHECK(w1_weight.size(1) == rows, op, "w1_weight", "expected ", rows,
                         " rows for intermediate_size ", intermediate_size_, ", got ",
                         shape_to_string(w1_weight.shape()));
        // With a shared_output (use_cuda_graph), the result is its first T rows, as upstream's
        // run returns a view of it.
        const std::optional<Tensor> into =
            shared_output_ ? std::optional<Tensor>(shared_output_->slice(0, 0, T)) : std::nullopt;
        if (expert_map_) {
          FLASHINFER_CHECK(expert_map_->device() == x.device(), op, "expert_map",
                           "expert_map must be on ", x.device().str(), ", got ",
                           expert_map_->device().str());
        }
        const Tensor ids = expert_map_ ? local_expert_ids(op, token_selected_experts, *expert_map_,
                                                          num_experts_, num_local_experts_)
                                       : token_selected_experts;
        B12xCall c{&x,
                   &w1_weight,
                   &w1_weight_sf,
                   &w2_weight,
                   &w2_weight_sf,
                   &ids,
                   &token_final_scales,
                   &w1_alpha,
                   &w2_alpha,
                   &fc2_input_scale,
                   &input_global_scale,
                   &into,
                   num_local_experts_,
                   top_k_,
                   activation_,
                   quant_mode_,
                   swiglu_alpha_,
                   swiglu_beta_,
                   swiglu_limit_,
                   source_format_};
        c.mapped = expert_map_.has_value();
        return b12x_impl(op, c);
      },
      *this, x, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf, token_selected_experts,
      token_final_scales, w1_alpha, w2_alpha, fc2_input_scale, input_global_scale);
}

CuteDslMoEWrapper::CuteDslMoEWrapper(
    int64_t num_experts, int64_t top_k, int64_t hidden_size, int64_t intermediate_size,
    bool use_cuda_graph, std::optional<int64_t> max_num_tokens,
    std::optional<int64_t> num_local_experts, int64_t local_expert_offset, int64_t tile_size,
    int64_t sf_vec_size, DType output_dtype, std::string device, bool enable_pdl,
    int64_t activation_type, double swiglu_alpha, double swiglu_beta, double swiglu_limit,
    std::optional<double> situ_beta, std::optional<double> situ_linear_beta,
    bool use_fused_finalize, std::string quant_mode, std::optional<Tensor> clamped_relu2_limit,
    bool swap_ab) {
  call_init<CuteInit>(
      [&] {
        const char* op = "CuteDslMoEWrapper.__init__";
        check_device_name(device, op);
        // Upstream 0.7.4: ClampedRelu2's limit (validated without a device here, as upstream's
        // constructor does), then swap_ab (up16 / gate16 FC1 rows; SM100 / SM103 only).
        moe_cute::check_clamped_relu2(op, activation_type, clamped_relu2_limit, std::nullopt,
                                      quant_mode);
        if (swap_ab) {
          if (device.rfind("cuda", 0) == 0 && cuda_device_count() > 0) {
            const int cc = api::compute_capability(Device::cuda(0));
            FLASHINFER_CHECK(cc == 100 || cc == 103, op, "swap_ab",
                             "CuTe DSL MoE swap_ab=True requires SM100 or SM103");
          }
          api::refuse_if(true, op, "swap_ab",
                         "swap_ab=True (FC1 rows interleaved in groups of 16) is not implemented");
        }
        clamped_relu2_limit_ = clamped_relu2_limit;
        FLASHINFER_CHECK(num_experts >= 1, op, "num_experts", "must be >= 1, got ", num_experts);
        FLASHINFER_CHECK(top_k >= 1 && top_k <= num_experts, op, "top_k",
                         "must be in [1, num_experts=", num_experts, "], got ", top_k);
        FLASHINFER_CHECK(hidden_size >= 1 && intermediate_size >= 1, op,
                         hidden_size >= 1 ? "intermediate_size" : "hidden_size",
                         "must be positive");
        // Upstream's normalize_cute_dsl_moe_activation_type: Swiglu, GegluTanh, Relu2.
        FLASHINFER_CHECK(activation_type == 3 || activation_type == 6 || activation_type == 8, op,
                         "activation_type",
                         "must be ActivationType.Swiglu (3), Relu2 (6) or GegluTanh (8), got ",
                         activation_type);
        FLASHINFER_CHECK(tile_size >= 1, op, "tile_size", "must be positive, got ", tile_size);
        FLASHINFER_CHECK(local_expert_offset >= 0, op, "local_expert_offset", "must be >= 0, got ",
                         local_expert_offset);
        api::check_dtype_in(Tensor::empty({0}, output_dtype),
                            {DType::kBFloat16, DType::kFloat16, DType::kFloat32}, op,
                            "output_dtype");
        quant_mode_ = canonical_cute_quant_mode(quant_mode, op);
        moe_cute::check_situ_config(op, activation_type, situ_beta, situ_linear_beta);
        // CuteDslFusedMoEW4A16Runner, built by upstream's __init__: "W4A16 only supports BF16
        // output".
        FLASHINFER_CHECK(quant_mode_ != "w4a16" || output_dtype == DType::kBFloat16, op,
                         "output_dtype", "W4A16 only supports bfloat16 output, got ",
                         dtype_name(output_dtype));
        // The w4a8 constructor checks (ValueError upstream).
        if (quant_mode_ == "w4a8") {
          FLASHINFER_CHECK(output_dtype == DType::kBFloat16, op, "output_dtype",
                           "quant_mode='w4a8' supports only bfloat16 output, got ",
                           dtype_name(output_dtype));
          FLASHINFER_CHECK(use_fused_finalize, op, "use_fused_finalize",
                           "quant_mode='w4a8' requires fused finalize");
          FLASHINFER_CHECK(!situ_beta && !situ_linear_beta, op,
                           situ_beta ? "situ_beta" : "situ_linear_beta",
                           "SiTU is not supported when quant_mode='w4a8'");
        }
        use_fused_finalize_ = use_fused_finalize;
        num_experts_ = num_experts;
        top_k_ = top_k;
        hidden_size_ = hidden_size;
        intermediate_size_ = intermediate_size;
        // num_local_experts or num_experts (Python's `or`).
        num_local_experts_ = num_local_experts && *num_local_experts != 0
                                 ? num_local_experts
                                 : std::optional<int64_t>(num_experts);
        local_expert_offset_ = local_expert_offset;
        sf_vec_size_ = sf_vec_size;
        output_dtype_ = output_dtype;
        activation_type_ = activation_type;
        swiglu_alpha_ = swiglu_alpha;
        swiglu_beta_ = swiglu_beta;
        swiglu_limit_ = swiglu_limit;
        situ_beta_ = situ_beta;
        situ_linear_beta_ = situ_linear_beta;
      },
      *this, num_experts, top_k, hidden_size, intermediate_size, use_cuda_graph, max_num_tokens,
      num_local_experts, local_expert_offset, tile_size, sf_vec_size, output_dtype, device,
      enable_pdl, activation_type, swiglu_alpha, swiglu_beta, swiglu_limit, situ_beta,
      situ_linear_beta, use_fused_finalize, quant_mode, clamped_relu2_limit, swap_ab);
}

Tensor CuteDslMoEWrapper::run(const Tensor& x, std::optional<Tensor> x_sf,
                              const Tensor& token_selected_experts,
                              const Tensor& token_final_scales, const Tensor& w1_weight,
                              const Tensor& w1_weight_sf, const Tensor& w1_alpha,
                              std::optional<Tensor> fc2_input_scale, const Tensor& w2_weight,
                              const Tensor& w2_weight_sf, const Tensor& w2_alpha,
                              std::optional<Value> tactic, std::optional<Tensor> per_token_scale,
                              const Value& nvfp4_4over6) {
  return call_op<&CuteDslMoEWrapper::run>(
      [&] {
        const char* op = "CuteDslMoEWrapper.run";
        // The GEMM2-input requantization's recipe (upstream's _cute_dsl_recipe_kwargs): omitted
        // reads nothing here; a recipe outside the w4a4 per-token path is upstream's error; on
        // that path it is not implemented here.
        if (!is_nvfp4_4over6_unset(nvfp4_4over6) && !nvfp4_4over6.is_none()) {
          const bool has_pts = per_token_scale && per_token_scale->defined();
          FLASHINFER_CHECK(quant_mode_ == "w4a4" && has_pts, op, "nvfp4_4over6",
                           "nvfp4_4over6 requires quant_mode='w4a4' with per_token_scale; no other "
                           "CuTe-DSL path has a 4over6 requantization. Pass None to turn 4over6 "
                           "off, or omit it to read the environment.");
          api::refuse_nvfp4_4over6(nvfp4_4over6, DType::kBFloat16, op);
        }
        // sf_vec_size is only stored upstream: _moe_core_impl takes the block size from x's dtype
        // (16 for NVFP4 x, 32 for MXFP8 x).
        api::check_defined(x, op, "x");
        api::check_upstream_arch(op, "x", x.device());  // upstream's refusal first
        api::check_dim(x, {2}, op, "x");
        if (quant_mode_ == "w4a16") {  // bf16 x [T, hidden_size]
          FLASHINFER_CHECK(x.size(1) == hidden_size_, op, "x", "expected bf16 [T, ", hidden_size_,
                           "] for hidden_size ", hidden_size_, ", got ",
                           shape_to_string(x.shape()));
          return moe_cute::cute_w4a16_impl(
              op, x, x_sf, token_selected_experts, token_final_scales, w1_weight, w1_weight_sf,
              w1_alpha, fc2_input_scale, w2_weight, w2_weight_sf, w2_alpha, num_experts_, top_k_,
              num_local_experts_.value_or(num_experts_), local_expert_offset_, activation_type_,
              swiglu_alpha_, swiglu_beta_, swiglu_limit_, situ_beta_, situ_linear_beta_,
              use_fused_finalize_, per_token_scale);
        }
        if (quant_mode_ == "w4a8") {  // e4m3 x [T, hidden_size]
          FLASHINFER_CHECK(x.size(1) == hidden_size_, op, "x", "expected e4m3 [T, ", hidden_size_,
                           "] for hidden_size ", hidden_size_, ", got ",
                           shape_to_string(x.shape()));
          return moe_cute::cute_w4a8_impl(
              op, x, x_sf, token_selected_experts, token_final_scales, w1_weight, w1_weight_sf,
              w1_alpha, fc2_input_scale, w2_weight, w2_weight_sf, w2_alpha, num_experts_, top_k_,
              num_local_experts_, local_expert_offset_, output_dtype_, std::nullopt,
              use_fused_finalize_, activation_type_, swiglu_alpha_, swiglu_beta_, swiglu_limit_,
              situ_beta_, situ_linear_beta_, per_token_scale);
        }
        FLASHINFER_CHECK(2 * x.size(1) == hidden_size_, op, "x", "expected packed [T, ",
                         hidden_size_ / 2, "] for hidden_size ", hidden_size_, ", got ",
                         shape_to_string(x.shape()));
        return moe_cute::cute_dsl_impl(
            op, x, x_sf, token_selected_experts, token_final_scales, w1_weight, w1_weight_sf,
            w1_alpha, fc2_input_scale, w2_weight, w2_weight_sf, w2_alpha, num_experts_, top_k_,
            num_local_experts_, local_expert_offset_, output_dtype_, std::nullopt, activation_type_,
            swiglu_alpha_, swiglu_beta_, swiglu_limit_, situ_beta_, situ_linear_beta_, quant_mode_,
            per_token_scale);
      },
      *this, x, x_sf, token_selected_experts, token_final_scales, w1_weight, w1_weight_sf, w1_alpha,
      fc2_input_scale, w2_weight, w2_weight_sf, w2_alpha, tactic, per_token_scale, nvfp4_4over6);
}

namespace {

using moe_cute::e4m3_scales;
using moe_cute::rand_bytes;

// The b12x / CuTe-DSL inputs both benches share: 8 experts, top-2 with weights 0.75 / 0.25,
// random packed weights (every byte is a valid NVFP4 pair) and swizzled e4m3 scales.
struct MoeBenchInputs {
  int64_t T = 0, H = 0, I = 0, E = 8;
  Tensor ids, w, w1, s1, w2, s2, ones;
};

MoeBenchInputs bench_inputs(const BenchShape& s, Device dev) {
  MoeBenchInputs b;
  b.T = s.m;
  b.H = (s.hidden_size + 63) / 64 * 64;  // the ops' granularity: H % 64, I % 64 (CuTe-DSL gated)
  b.I = (s.n + 63) / 64 * 64;
  std::vector<double> ids, w;
  for (int64_t t = 0; t < b.T; ++t) {
    const int64_t e0 = (t * 5) % b.E, e1 = (e0 + 1 + t % (b.E - 1)) % b.E;
    ids.insert(ids.end(), {static_cast<double>(e0), static_cast<double>(e1)});
    w.insert(w.end(), {0.75, 0.25});
  }
  const uint64_t sd = s.random_seed;
  auto sf = [&](int64_t rows, int64_t cols, uint64_t seed) {
    const int64_t per = kernels::sf_buffer_size(kernels::SfLayoutCode::k128x4, rows, cols);
    return e4m3_scales({b.E * per}, dev, seed, 0.01, 0.02);
  };
  b.ids = Tensor::from_vector(ids, {b.T, 2}, DType::kInt32).to(dev);
  b.w = Tensor::from_vector(w, {b.T, 2}, DType::kFloat32).to(dev);
  b.w1 = rand_bytes({b.E, 2 * b.I, b.H / 2}, dev, sd + 3);
  b.s1 = sf(2 * b.I, b.H / 16, sd + 4);
  b.w2 = rand_bytes({b.E, b.H, b.I / 2}, dev, sd + 5);
  b.s2 = sf(b.H, b.I / 16, sd + 6);
  b.ones = Tensor::full({b.E}, 1.0, DType::kFloat32).to(dev);
  return b;
}

BenchCase moe_b12x_finish(BenchCase c, const MoeBenchInputs& b) {
  const double rows = static_cast<double>(b.T * 2);
  c.flops = 2.0 * rows * b.H * (2 * b.I) + 2.0 * rows * b.I * b.H;
  c.bytes = static_cast<double>(b.T * b.H) * 4.0 + static_cast<double>(b.E * 3 * b.I * b.H) / 2;
  return c;
}

// b12x_fused_moe: bf16 x, 8 experts, top-2, alphas and global scales 1 (vLLM's call).
BenchCase bench_b12x(const BenchShape& s, Device dev) {
  const MoeBenchInputs b = bench_inputs(s, dev);
  Tensor x = api::bench::random_tensor({b.T, b.H}, DType::kBFloat16, dev, s.random_seed + 1);
  return moe_b12x_finish(api::bench::invoke_case(
                             "b12x_fused_moe",
                             {Value(x), Value(b.w1), Value(b.s1), Value(b.w2), Value(b.s2),
                              Value(b.ids), Value(b.w), Value(b.E), Value(int64_t{2})},
                             {{"w1_alpha", Value(b.ones)},
                              {"w2_alpha", Value(b.ones)},
                              {"fc2_input_scale", Value(b.ones)},
                              {"output", Value(Tensor::empty({b.T, b.H}, DType::kBFloat16, dev))}}),
                         b);
}

BenchCase bench_b12x_wrapper(const BenchShape& s, Device dev) {
  const MoeBenchInputs b = bench_inputs(s, dev);
  Tensor x = api::bench::random_tensor({b.T, b.H}, DType::kBFloat16, dev, s.random_seed + 1);
  auto obj = std::make_shared<B12xMoEWrapper>(b.E, 2, b.H, b.I);
  return moe_b12x_finish(
      api::bench::invoke_case("B12xMoEWrapper.run",
                              {api::bench::bench_object(obj), Value(x), Value(b.w1), Value(b.s1),
                               Value(b.w2), Value(b.s2), Value(b.ids), Value(b.w)},
                              {{"w1_alpha", Value(b.ones)},
                               {"w2_alpha", Value(b.ones)},
                               {"fc2_input_scale", Value(b.ones)}}),
      b);
}

// CuteDslMoEWrapper.run: NVFP4 x with linear scales, the CuTe-DSL weight layout (random bytes
// are a valid prepared layout), fc2_input_scale 1.
BenchCase bench_cute_wrapper(const BenchShape& s, Device dev) {
  const MoeBenchInputs b = bench_inputs(s, dev);
  auto obj = std::make_shared<CuteDslMoEWrapper>(b.E, 2, b.H, b.I);
  return moe_b12x_finish(
      api::bench::invoke_case(
          "CuteDslMoEWrapper.run",
          {api::bench::bench_object(obj), Value(rand_bytes({b.T, b.H / 2}, dev, s.random_seed + 1)),
           Value(e4m3_scales({b.T, b.H / 16}, dev, s.random_seed + 2, 0.25, 0.5)), Value(b.ids),
           Value(b.w), Value(b.w1), Value(b.s1), Value(b.ones),
           Value(Tensor::full({1}, 1.0, DType::kFloat32).to(dev)), Value(b.w2), Value(b.s2),
           Value(b.ones)}),
      b);
}

}  // namespace

namespace detail {
void register_moe_b12x_ops(OpRegistry& r) {
  declare<&b12x_fused_moe>(
      r,
      {.name = "b12x_fused_moe",
       .module = kB12xModule,
       .summary = "b12x (SM12x) NVFP4 fused MoE: bf16 input quantized in the op, precomputed "
                  "routing, GEMM1, SiLU or ReLU2, NVFP4 activation, GEMM2, weighted combine"},
      "x", "w1_weight", "w1_weight_sf", "w2_weight", "w2_weight_sf", "token_selected_experts",
      "token_final_scales", "num_experts", "top_k", arg("w1_alpha").kw(), arg("w2_alpha").kw(),
      arg("fc2_input_scale").kw(), arg("input_global_scale").kw(), arg("num_local_experts").kw(),
      arg("expert_map").kw(), arg("output").mut().kw(), arg("output_dtype", DType::kBFloat16).kw(),
      arg("activation", "silu").kw(), arg("swiglu_alpha", 1.702).kw(), arg("swiglu_beta", 1.0).kw(),
      arg("swiglu_limit").kw(), arg("activation_precision", "fp4").kw(), arg("quant_mode").kw(),
      arg("source_format", "modelopt").kw());
  declare_init<B12xInit>(
      r,
      {.name = "B12xMoEWrapper.__init__",
       .module = kB12xModule,
       .summary = "b12x fused-MoE wrapper (settings fixed at construction)"},
      "num_experts", "top_k", "hidden_size", "intermediate_size", arg("use_cuda_graph", false).kw(),
      arg("max_num_tokens", int64_t{4096}).kw(), arg("num_local_experts").kw(),
      arg("expert_map").kw(), arg("output_dtype", DType::kBFloat16).kw(),
      arg("device", "cuda").kw(), arg("activation", "silu").kw(), arg("swiglu_alpha", 1.702).kw(),
      arg("swiglu_beta", 1.0).kw(), arg("swiglu_limit").kw(),
      arg("activation_precision", "fp4").kw(), arg("quant_mode").kw(),
      arg("source_format", "modelopt").kw(), arg("shared_static_workspace").kw(),
      arg("shared_dynamic_workspace").kw(), arg("shared_output").kw());
  declare<&B12xMoEWrapper::run>(r,
                                {.name = "B12xMoEWrapper.run",
                                 .module = kB12xModule,
                                 .summary = "b12x fused MoE with the wrapper's settings"},
                                "x", "w1_weight", "w1_weight_sf", "w2_weight", "w2_weight_sf",
                                "token_selected_experts", "token_final_scales",
                                arg("w1_alpha").kw(), arg("w2_alpha").kw(),
                                arg("fc2_input_scale").kw(), arg("input_global_scale").kw());
  declare_init<CuteInit>(
      r,
      {.name = "CuteDslMoEWrapper.__init__",
       .module = kCuteModule,
       .summary = "CuTe-DSL block-scaled fused-MoE wrapper (settings fixed at construction)"},
      "num_experts", "top_k", "hidden_size", "intermediate_size", arg("use_cuda_graph", false),
      "max_num_tokens", "num_local_experts", arg("local_expert_offset", int64_t{0}),
      arg("tile_size", int64_t{128}), arg("sf_vec_size", int64_t{16}),
      arg("output_dtype", DType::kBFloat16), arg("device", "cuda"), arg("enable_pdl", true),
      arg("activation_type", int64_t{3}), arg("swiglu_alpha", 1.0), arg("swiglu_beta", 0.0),
      arg("swiglu_limit", 3.4028234663852886e38), "situ_beta", "situ_linear_beta",
      arg("use_fused_finalize", true), arg("quant_mode", "w4a4"), "clamped_relu2_limit",
      arg("swap_ab", false));
  declare<&CuteDslMoEWrapper::run>(
      r,
      {.name = "CuteDslMoEWrapper.run",
       .module = kCuteModule,
       .summary = "CuTe-DSL NVFP4 fused MoE with the wrapper's settings"},
      "x", arg("x_sf").required(), "token_selected_experts", "token_final_scales", "w1_weight",
      "w1_weight_sf", "w1_alpha", arg("fc2_input_scale").required(), "w2_weight", "w2_weight_sf",
      "w2_alpha", "tactic", arg("per_token_scale").kw(),
      arg("nvfp4_4over6", nvfp4_4over6_unset()).type("NVFP44Over6Config").kw());
  for (const char* name : {"b12x_fused_moe", "B12xMoEWrapper.__init__", "B12xMoEWrapper.run",
                           "CuteDslMoEWrapper.__init__", "CuteDslMoEWrapper.run"}) {
    api::register_backends(name, kB12xKernels);
  }
  register_bench_hook("b12x_fused_moe", bench_b12x);
  register_bench_hook("B12xMoEWrapper.run", bench_b12x_wrapper);
  register_bench_hook("CuteDslMoEWrapper.run", bench_cute_wrapper);
}
}  // namespace detail

}  // namespace flashinfer
