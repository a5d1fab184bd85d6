// FP8 trtllm-gen MoE ops (flashinfer.fused_moe.core): declarations, argument checks, dispatch.
// Semantics and sources: docs/MOE.md.
#include "flashinfer/ops/moe_quant.h"

#include <cmath>
#include <string>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/enum_table.h"
#include "api/kernel_table.h"
#include "api/moe_fp8_mx.h"
#include "api/moe_layout.h"
#include "api/moe_routing_checks.h"
#include "api/moe_traits.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/moe_quant_cpu.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/moe_cuda.h"
#endif

namespace flashinfer {

namespace {
constexpr api::EnumTable<Fp8QuantizationType, 4> kFp8QuantizationTypes{
    "Fp8QuantizationType",
    {{{Fp8QuantizationType::NoneFp8, "NoneFp8"},
      {Fp8QuantizationType::DeepSeekFp8, "DeepSeekFp8"},
      {Fp8QuantizationType::MxFp8, "MxFp8"},
      {Fp8QuantizationType::PerTensorFp8, "PerTensorFp8"}}}};
}  // namespace

std::string_view fp8_quantization_type_name(Fp8QuantizationType q) {
  return kFp8QuantizationTypes.name_of(q);
}

Value to_value(Fp8QuantizationType q) { return kFp8QuantizationTypes.to_value(q); }

Fp8QuantizationType fp8_quantization_type_from_value(const Value& v, std::string_view op,
                                                     std::string_view arg) {
  return kFp8QuantizationTypes.from_value(v, op, arg);
}

namespace {

constexpr const char* kMoeQuantCoreModule = "flashinfer.fused_moe.core";

// The CUDA kernel reads the weights in their stored layout (shuffled, BlockMajorK) in place.
constexpr api::KernelEntry<kernels::TrtllmFp8MoeParams> kTrtllmFp8MoeKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: routing, fp32 dequantization, per-expert GEMMs of the routed rows only, "
     "fp32 accumulation",
     nullptr,
     [](const kernels::TrtllmFp8MoeParams& p, const api::LaunchContext&) {
       kernels::cpu::trtllm_fp8_moe(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel: routing one thread per token, then one block per (token, expert) pair with "
     "warp dot products over the fp8 weights read in their stored layout (block-dequantized, "
     "or per-tensor scaled)",
     nullptr,
     [](const kernels::TrtllmFp8MoeParams& p, const api::LaunchContext& c) {
       kernels::cuda::trtllm_fp8_moe(p, c.stream, c.enable_pdl);
     }},
#endif
};

// The weights as the backend reads them: on CUDA the stored tensors and their index (the kernel
// reads them in place), on the CPU plain rows (turned back on the host; kept alive in w1p /
// w2p until the launch).
void set_fp8_weights(kernels::TrtllmFp8MoeParams& p, const Tensor& w1, const Tensor& w2, int64_t El,
                     int64_t N1, int64_t H, int64_t I, const api::MoeWeightFormat& f1,
                     const api::MoeWeightFormat& f2, const char* op, Tensor& w1p, Tensor& w2p) {
  if (w1.device().is_cuda()) {
    p.w1_index = api::moe_stored_weight_index(w1, El, N1, H, f1, op, "gemm1_weights");
    p.w2_index = api::moe_stored_weight_index(w2, El, H, I, f2, op, "gemm2_weights");
    w1p = w1;
    w2p = w2;
  } else {
    w1p = api::moe_plain_weights(w1, El, N1, H, f1, op, "gemm1_weights");
    w2p = api::moe_plain_weights(w2, El, H, I, f2, op, "gemm2_weights");
  }
  p.base.moe.w1 = w1p.data_ptr();
  p.base.moe.w2 = w2p.data_ptr();
}

// What both FP8 variants share: the routing (from logits, or precomputed `routed`), the shapes
// and the output. Fills p.base; returns the output tensor.
struct Fp8Common {
  const char* op;
  const MoeTopkIds* routed;
  const Tensor* logits;
  const std::optional<Tensor>* bias;
  const Tensor* hidden;
  int64_t num_experts, top_k;
  std::optional<int64_t> n_group, topk_group;
  int64_t inter, offset, local_num;
  std::optional<double> scale;
  int64_t method, activation_type;
  bool norm_topk_prob;
  const std::optional<Tensor>* replay_out;
  const std::optional<Tensor>* output;
};

// `out_hidden`: the columns the kernel writes (GEMM2's N; 0: the hidden size); `out_cols` the
// returned width (0: out_hidden). When they differ, `full` receives the kernel's [T, out_hidden]
// and the returned tensor is its first out_cols columns, copied by the caller after the launch.
Tensor fill_common(const Fp8Common& c, kernels::TrtllmFp8MoeParams& p, int64_t out_hidden = 0,
                   int64_t out_cols = 0, Tensor* full = nullptr) {
  const char* op = c.op;
  const Tensor& hidden = *c.hidden;
  api::check_defined(hidden, op, "hidden_states");
  api::check_dim(hidden, {2}, op, "hidden_states");
  api::check_dtype_in(hidden, {DType::kFloat8E4M3FN}, op, "hidden_states");
  api::check_last_stride_one(hidden, op, "hidden_states");
  const int64_t T = hidden.size(0), H = hidden.size(1);
  api::fill_moe_routing(
      {c.op, c.routed, c.logits, c.bias, c.num_experts, c.top_k, c.n_group, c.topk_group, c.offset,
       c.local_num, c.scale, c.method, c.norm_topk_prob, c.replay_out},
      hidden, /*groups_when_routed=*/true, p.base);
  FLASHINFER_CHECK(c.inter >= 1, op, "intermediate_size", "must be positive, got ", c.inter);
  FLASHINFER_CHECK(c.activation_type >= 0 && c.activation_type <= 10, op, "activation_type",
                   "must be an ActivationType value, got ", c.activation_type);
  api::refuse_if(c.activation_type == static_cast<int64_t>(ActivationType::GegluTanh), op,
                 "activation_type",
                 "GegluTanh has no trtllm-gen kernel (upstream's launcher raises for it)");
  api::refuse_if(
      c.activation_type == static_cast<int64_t>(ActivationType::Situ), op, "activation_type",
      "Situ runs in trtllm-gen's SiTuGlu cubin epilogue, whose math is not in readable source");
  const int64_t N = out_hidden > 0 ? out_hidden : H, W = out_cols > 0 ? out_cols : N;
  Tensor out;
  if (*c.output) {
    const Tensor& o = **c.output;
    api::check_dtype_in(o, {DType::kBFloat16}, op, "output");
    api::check_shape_eq(o, {T, W}, op, "output");
    api::check_same_device(o, hidden, op, "output", "hidden_states");
    api::check_last_stride_one(o, op, "output");
    api::check_writable(o, op, "output");
    out = o;
  } else {
    out = Tensor::empty({T, W}, DType::kBFloat16, hidden.device());
  }
  Tensor written = out;
  if (W != N) {
    written = Tensor::empty({T, N}, DType::kBFloat16, hidden.device());
    *full = written;
  }
  kernels::TrtllmMoeParams& b = p.base;
  kernels::CutlassMoeParams& m = b.moe;
  m.input = hidden.data_ptr();
  m.in_stride = hidden.stride(0);
  m.out = written.data_ptr();
  m.out_stride = written.stride(0);
  m.dtype = DType::kBFloat16;
  m.out_dtype = DType::kBFloat16;
  m.num_tokens = T;
  m.top_k = c.top_k;
  m.hidden = N;
  m.inter = c.inter;
  m.num_local_experts = c.local_num;
  m.expert_offset = c.offset;
  m.act = static_cast<kernels::MoeAct>(c.activation_type);
  return out;
}

// Checks a 3-D fp32 block-scale tensor [E_l, rows / 128, cols / 128].
const float* block_scales(const Tensor& s, int64_t E, int64_t rows, int64_t cols,
                          const Tensor& like, const char* op, const char* arg) {
  api::check_defined(s, op, arg);
  api::check_dtype_in(s, {DType::kFloat32}, op, arg);
  FLASHINFER_CHECK(s.is_contiguous() && s.shape() == Shape({E, rows / 128, cols / 128}), op, arg,
                   "expected contiguous [", E, ", ", rows / 128, ", ", cols / 128, "], got ",
                   shape_to_string(s.shape()));
  api::check_same_device(s, like, op, arg, "hidden_states");
  return s.data<float>();
}

// Upstream writes `output` only when it finalizes (docs/MOE.md, "do_finalize=False"): an
// unfinalized call neither checks nor writes it.
const std::optional<Tensor> kNoOutput;

// trtllm_fp8_block_scale_moe's upstream 0.7.4 additions (the routed op has no biases).
struct Fp8BlockExtras {
  std::optional<int64_t> valid_hidden_size, valid_intermediate_size;
  std::optional<Tensor> gemm1_bias, gemm2_bias, workspace;
};

// A DeepSeek FP8 bias (fp32 [E_l, m], rows stored as the weights': shuffled with
// epilogue_tile_m 64 under use_shuffled_weight), as upstream's launcher checks it; on the CPU
// turned into plain row order (the reference's weights are plain), on CUDA the stored tensor
// (the kernels index it by the weights' stored row).
Tensor fp8_bias(const Tensor& b, int64_t E, int64_t m, bool shuffled, const Tensor& like,
                const char* op, const char* arg, const char* shape_text) {
  api::check_defined(b, op, arg);
  FLASHINFER_CHECK(b.dtype() == DType::kFloat32, op, arg, arg, " must be float32.");
  FLASHINFER_CHECK(b.dim() == 2 && b.size(0) == E && b.size(1) == m, op, arg, shape_text);
  api::check_same_device(b, like, op, arg, "hidden_states");
  if (b.device().is_cuda()) return b.contiguous();
  return api::moe_plain_bias(b, E, m, shuffled, 64, false);
}

TrtllmMoeResult fp8_block_impl(const Fp8Common& common, const Tensor& hs_scale, const Tensor& w1,
                               const Tensor& w1_scale, const Tensor& w2, const Tensor& w2_scale,
                               bool use_shuffled_weight, WeightLayout layout, bool do_finalize,
                               Fp8QuantizationType qtype, const std::optional<Tensor>& alpha,
                               const std::optional<Tensor>& beta,
                               const std::optional<Tensor>& limit,
                               std::optional<int64_t> num_fused_shared_experts,
                               const std::optional<Tensor>& lora_delta, const Fp8BlockExtras& x) {
  // Upstream 0.7.4's launcher (validateFp8BlockScaleGemm1ActivationParams): SwigluStep takes
  // no alpha / beta and runs only in the fused MxFp8 epilogue.
  api::check_step_gemm1_params(common.activation_type, alpha, beta, common.op);
  FLASHINFER_CHECK(common.activation_type != static_cast<int64_t>(kernels::MoeAct::kSwigluStep) ||
                       qtype == Fp8QuantizationType::MxFp8,
                   common.op, "activation_type",
                   "SwigluStep requires the fused MxFp8 GEMM1 epilogue.");
  Fp8Common c = common;
  const char* op = c.op;
  // Upstream 0.7.4's padded dimensions (docs/MOE.md, "Padded dimensions"), checked first.
  const int64_t Hx = c.hidden->dim() == 2 ? c.hidden->size(1) : 0;
  const api::MoeValidDims vd = api::check_moe_valid_dims(
      op, x.valid_hidden_size, x.valid_intermediate_size, Hx, c.inter, do_finalize);
  if (do_finalize) api::check_moe_output_width(op, *c.output, x.valid_hidden_size, true);
  if (!do_finalize) c.output = &kNoOutput;
  const int64_t S = api::check_moe_fused_shared(
      {c.op, c.routed, c.logits, c.bias, c.num_experts, c.top_k, c.n_group, c.topk_group, c.offset,
       c.local_num, c.scale, c.method, c.norm_topk_prob, c.replay_out},
      num_fused_shared_experts, *c.hidden);
  // Upstream's FP8 block-scale launcher (alone among the trtllm ones) rejects groups for any
  // routing method but DeepSeekV3 (docs/MOE.md, "n_group outside DeepSeekV3").
  if (c.method != static_cast<int64_t>(kernels::MoeRouting::kDeepSeekV3)) {
    FLASHINFER_CHECK(c.n_group.value_or(0) <= 1, op, "n_group",
                     "routing without groups takes n_group <= 1, got ", c.n_group.value_or(0));
    FLASHINFER_CHECK(c.topk_group.value_or(0) <= 1, op, "topk_group",
                     "routing without groups takes topk_group <= 1, got ",
                     c.topk_group.value_or(0));
  }
  if (qtype == Fp8QuantizationType::MxFp8) {
    return api::trtllm_mxfp8_block_moe(
        {c.op, c.routed, c.logits, c.bias, c.num_experts, c.top_k, c.n_group, c.topk_group,
         c.offset, c.local_num, c.scale, c.method, c.norm_topk_prob, c.replay_out},
        {c.hidden,
         &hs_scale,
         &w1,
         &w1_scale,
         &w2,
         &w2_scale,
         c.inter,
         c.activation_type,
         use_shuffled_weight,
         layout,
         &alpha,
         &beta,
         &limit,
         c.output,
         do_finalize,
         &lora_delta,
         vd,
         &x.gemm1_bias,
         &x.gemm2_bias,
         &x.workspace},
        S);
  }
  api::refuse_if(qtype != Fp8QuantizationType::DeepSeekFp8, op, "fp8_quantization_type",
                 "only Fp8QuantizationType.DeepSeekFp8 (128x128 block scales) and MxFp8 are "
                 "implemented");
  // DeepSeek FP8's activation kernel reads the whole padded intermediate width, which GEMM1
  // writes only up to the valid rows: upstream's result is not defined there.
  api::refuse_if(vd.inter < c.inter, op, "valid_intermediate_size",
                 "DeepSeekFp8 with roundUp(valid_intermediate_size, 128) below intermediate_size "
                 "is not implemented (upstream's separate activation kernel reads the padded "
                 "width GEMM1 leaves unwritten)");
  kernels::TrtllmFp8MoeParams p;
  Tensor full;
  Tensor out = fill_common(c, p, vd.hidden_out, vd.out_cols, &full);
  const Tensor& hidden = *c.hidden;
  // Fused shared experts: their weight rows follow the routed local experts' (upstream's
  // launcher: weights dim 0 is local_num_experts + num_fused_shared_experts).
  const int64_t T = hidden.size(0), H = hidden.size(1), I = c.inter, El = c.local_num + S;
  const int64_t N2 = vd.hidden_out;  // GEMM2's N and GEMM1's contracted hidden columns
  p.base.num_shared = S;
  p.base.moe.top_k = c.top_k + S;
  p.base.moe.num_local_experts = El;
  const bool gated = kernels::moe_act_is_gated(static_cast<kernels::MoeAct>(c.activation_type));
  const int64_t N1 = gated ? 2 * I : I;
  // Upstream's launcher: hidden_size and intermediate_size multiples of 128 (the block).
  FLASHINFER_CHECK(H % 128 == 0, op, "hidden_states", "hidden size must be a multiple of 128, got ",
                   H);
  FLASHINFER_CHECK(I % 128 == 0, op, "intermediate_size", "must be a multiple of 128, got ", I);
  api::check_defined(hs_scale, op, "hidden_states_scale");
  api::check_dtype_in(hs_scale, {DType::kFloat32}, op, "hidden_states_scale");
  FLASHINFER_CHECK(hs_scale.shape() == Shape({H / 128, T}), op, "hidden_states_scale", "expected [",
                   H / 128, ", ", T, "] (hidden / 128, tokens), got ",
                   shape_to_string(hs_scale.shape()));
  api::check_last_stride_one(hs_scale, op, "hidden_states_scale");
  api::check_same_device(hs_scale, hidden, op, "hidden_states_scale", "hidden_states");
  api::check_dtype_in(w1, {DType::kFloat8E4M3FN}, op, "gemm1_weights");
  api::check_same_device(w1, hidden, op, "gemm1_weights", "hidden_states");
  api::check_dtype_in(w2, {DType::kFloat8E4M3FN}, op, "gemm2_weights");
  api::check_same_device(w2, hidden, op, "gemm2_weights", "hidden_states");
  // Upstream's preparation for DeepSeek FP8 (tests/moe: FP8BlockScaleMoe) shuffles with
  // epilogue_tile_m = 64 and does not interleave GEMM1's up/gate rows.
  api::MoeWeightFormat fmt;
  fmt.shuffled = use_shuffled_weight;
  fmt.layout = layout;
  fmt.epilogue_tile_m = 64;
  // A valid hidden size N2 < H: GEMM1 contracts the first N2 columns, cut from the stored
  // weights and scales along K (any row order survives: it is per row).
  Tensor w1k = w1, w1sk = w1_scale;
  if (N2 < H) {
    api::moe_check_weights(w1, El, N1, H, fmt, op, "gemm1_weights");
    block_scales(w1_scale, El, N1, H, hidden, op, "gemm1_weights_scale");
    w1k = (w1.dim() == 4 ? w1.slice(1, 0, N2 / w1.size(3)) : w1.slice(2, 0, N2)).contiguous();
    w1sk = w1_scale.slice(2, 0, N2 / 128).contiguous();
  }
  Tensor w1p, w2p;
  set_fp8_weights(p, w1k, w2, El, N1, N2, I, fmt, fmt, op, w1p, w2p);
  p.block_scale = true;
  p.hs_scale = hs_scale.data<float>();
  p.hs_scale_stride = hs_scale.stride(0);
  p.w1_scale = block_scales(w1sk, El, N1, N2, hidden, op, "gemm1_weights_scale");
  p.w2_scale = block_scales(w2_scale, El, N2, I, hidden, op, "gemm2_weights_scale");
  // gemm1_bias / gemm2_bias (0.7.4, keyword-only): fp32, rows stored as the weights'.
  Tensor b1k, b2k;
  if (x.gemm1_bias) {
    b1k = fp8_bias(*x.gemm1_bias, El, N1, use_shuffled_weight, hidden, op, "gemm1_bias",
                   "gemm1_bias must have shape [local_num_experts, GEMM1_M].");
  }
  if (x.gemm2_bias) {
    b2k = fp8_bias(*x.gemm2_bias, El, H, use_shuffled_weight, hidden, op, "gemm2_bias",
                   "gemm2_bias must have shape [local_num_experts, hidden_size].");
    // Upstream checks [E, hidden_size] but sizes GEMM2 by N2: which N2 of the H it reads per
    // expert is not established.
    api::refuse_if(N2 < H, op, "gemm2_bias",
                   "gemm2_bias with roundUp(valid_hidden_size, 128) below the hidden size is not "
                   "implemented");
  }
  p.base.moe.b1 = b1k.defined() ? b1k.data_ptr() : nullptr;
  p.base.moe.b2 = b2k.defined() ? b2k.data_ptr() : nullptr;
  p.base.moe.swiglu_alpha = api::per_expert_floats(alpha, El, hidden, op, "gemm1_alpha");
  p.base.moe.swiglu_beta = api::per_expert_floats(beta, El, hidden, op, "gemm1_beta");
  p.base.moe.swiglu_limit = api::per_expert_floats(limit, El, hidden, op, "gemm1_clamp_limit");
  TrtllmMoeResult res{{out}, do_finalize};
  if (!do_finalize) res.tensors = api::bind_unfinalized(p.base, c.routed, hidden, op);
  if (lora_delta) {
    // gemm1_lora_delta (vLLM's LoRA experts; upstream's trtllm-gen, Blackwell only): added to
    // GEMM1's output before the activation; the list grows by the map and the activation as
    // GEMM2 reads it, e4m3 codes (their per-128 scales are not returned, as upstream's).
    api::bind_lora_delta(p.base.moe, *lora_delta, hidden, gated, do_finalize, DType::kUInt8, op,
                         res.tensors);
  }
  api::check_moe_workspace_buffer(x.workspace, do_finalize, lora_delta, op, &hidden);
  api::launch(kTrtllmFp8MoeKernels, p, hidden.device(), op, "hidden_states", false);
  if (full.defined()) out.copy_(full.slice(1, 0, out.size(1)));
  return res;
}

TrtllmMoeResult fp8_per_tensor_impl(const Fp8Common& common, const Tensor& w1, const Tensor& s1,
                                    const Tensor& s1_gate, const Tensor& w2, const Tensor& s2,
                                    bool use_routing_scales_on_input, bool do_finalize,
                                    const std::optional<Tensor>& clamp_limit,
                                    const std::optional<Tensor>& workspace_buffer) {
  // Upstream 0.7.4's additions: gemm1_clamp_limit (SwigluStep's limit in raw accumulator units,
  // kernels/moe_params.h) and workspace_buffer (scratch).
  api::check_moe_workspace_buffer(workspace_buffer, do_finalize, std::nullopt, common.op);
  FLASHINFER_CHECK(
      !clamp_limit || common.activation_type == static_cast<int64_t>(kernels::MoeAct::kSwigluStep),
      common.op, "gemm1_clamp_limit",
      "FP8 per-tensor gemm1_clamp_limit is supported for ActivationType.SwigluStep only.");
  Fp8Common c = common;
  if (!do_finalize) c.output = &kNoOutput;
  const char* op = c.op;
  kernels::TrtllmFp8MoeParams p;
  Tensor out = fill_common(c, p);
  const Tensor& hidden = *c.hidden;
  const int64_t H = hidden.size(1), I = c.inter, El = c.local_num;
  const bool gated = kernels::moe_act_is_gated(static_cast<kernels::MoeAct>(c.activation_type));
  const int64_t N1 = gated ? 2 * I : I;
  if (use_routing_scales_on_input) {
    // Upstream's launcher hands GEMM1 the routing weights as its per-token scales for Llama4
    // only; another method leaves that pointer null while the GEMM is built to read it, and the
    // finalize drops the weights (docs/MOE.md): no defined result, so an error here.
    FLASHINFER_CHECK(c.method == static_cast<int64_t>(kernels::MoeRouting::kLlama4), op,
                     "use_routing_scales_on_input",
                     "needs RoutingMethodType.Llama4 (upstream feeds the routing weights to GEMM1 "
                     "for Llama4 only), got routing_method_type ",
                     c.method);
    FLASHINFER_CHECK(c.top_k == 1, op, "use_routing_scales_on_input",
                     "applies the routing weight on the input, which needs top_k == 1, got ",
                     c.top_k);
  }
  api::check_dtype_in(w1, {DType::kFloat8E4M3FN}, op, "gemm1_weights");
  api::check_same_device(w1, hidden, op, "gemm1_weights", "hidden_states");
  api::check_dtype_in(w2, {DType::kFloat8E4M3FN}, op, "gemm2_weights");
  api::check_same_device(w2, hidden, op, "gemm2_weights", "hidden_states");
  // Upstream's preparation for per-tensor FP8 (tests/moe: FP8PerTensorMoe) always shuffles,
  // with epilogue_tile_m = 128, after interleaving GEMM1's up/gate rows for a gated activation.
  api::MoeWeightFormat fmt;
  fmt.shuffled = true;
  fmt.layout = WeightLayout::MajorK;
  fmt.epilogue_tile_m = 128;
  fmt.gated_interleave = gated;
  api::MoeWeightFormat fmt2 = fmt;
  fmt2.gated_interleave = false;
  Tensor w1p, w2p;
  set_fp8_weights(p, w1, w2, El, N1, H, I, fmt, fmt2, op, w1p, w2p);
  p.block_scale = false;
  p.out1_scale = api::per_expert_floats(s1, El, hidden, op, "output1_scales_scalar");
  p.out1_gate_scale = api::per_expert_floats(s1_gate, El, hidden, op, "output1_scales_gate_scalar");
  p.out2_scale = api::per_expert_floats(s2, El, hidden, op, "output2_scales_scalar");
  p.base.moe.swiglu_limit =
      api::per_expert_floats(clamp_limit, El, hidden, op, "gemm1_clamp_limit");
  p.routing_scales_on_input = use_routing_scales_on_input;
  TrtllmMoeResult res{{out}, do_finalize};
  if (!do_finalize) res.tensors = api::bind_unfinalized(p.base, c.routed, hidden, op);
  api::launch(kTrtllmFp8MoeKernels, p, hidden.device(), op, "hidden_states", false);
  return res;
}

}  // namespace

TrtllmMoeResult trtllm_fp8_block_scale_moe(
    const Tensor& routing_logits, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    const Tensor& hidden_states_scale, const Tensor& gemm1_weights,
    const Tensor& gemm1_weights_scale, const Tensor& gemm2_weights,
    const Tensor& gemm2_weights_scale, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, int64_t routing_method_type,
    bool use_shuffled_weight, WeightLayout weight_layout, bool do_finalize,
    std::optional<bool> enable_pdl, int64_t tune_max_num_tokens,
    Fp8QuantizationType fp8_quantization_type, std::optional<int64_t> num_fused_shared_experts,
    int64_t activation_type, bool norm_topk_prob, std::optional<Tensor> routing_replay_out,
    std::optional<Tensor> gemm1_alpha, std::optional<Tensor> gemm1_beta,
    std::optional<Tensor> gemm1_clamp_limit, std::optional<Tensor> output,
    std::optional<int64_t> valid_hidden_size, std::optional<int64_t> valid_intermediate_size,
    std::optional<Tensor> gemm1_bias, std::optional<Tensor> gemm2_bias,
    std::optional<Tensor> workspace_buffer) {
  return call_op<&trtllm_fp8_block_scale_moe>(
      [&] {
        const char* op = "trtllm_fp8_block_scale_moe";
        const Fp8Common c{op,
                          nullptr,
                          &routing_logits,
                          &routing_bias,
                          &hidden_states,
                          num_experts,
                          top_k,
                          n_group,
                          topk_group,
                          intermediate_size,
                          local_expert_offset,
                          local_num_experts,
                          routed_scaling_factor,
                          routing_method_type,
                          activation_type,
                          norm_topk_prob,
                          &routing_replay_out,
                          &output};
        return fp8_block_impl(
            c, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm2_weights,
            gemm2_weights_scale, use_shuffled_weight, weight_layout, do_finalize,
            fp8_quantization_type, gemm1_alpha, gemm1_beta, gemm1_clamp_limit,
            num_fused_shared_experts, std::nullopt,
            {valid_hidden_size, valid_intermediate_size, gemm1_bias, gemm2_bias, workspace_buffer});
      },
      routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
      gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, num_experts, top_k, n_group,
      topk_group, intermediate_size, local_expert_offset, local_num_experts, routed_scaling_factor,
      routing_method_type, use_shuffled_weight, weight_layout, do_finalize, enable_pdl,
      tune_max_num_tokens, fp8_quantization_type, num_fused_shared_experts, activation_type,
      norm_topk_prob, routing_replay_out, gemm1_alpha, gemm1_beta, gemm1_clamp_limit, output,
      valid_hidden_size, valid_intermediate_size, gemm1_bias, gemm2_bias, workspace_buffer);
}

TrtllmMoeResult trtllm_fp8_block_scale_routed_moe(
    const MoeTopkIds& topk_ids, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    const Tensor& hidden_states_scale, const Tensor& gemm1_weights,
    const Tensor& gemm1_weights_scale, const Tensor& gemm2_weights,
    const Tensor& gemm2_weights_scale, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, int64_t routing_method_type,
    bool use_shuffled_weight, WeightLayout weight_layout, bool do_finalize,
    std::optional<bool> enable_pdl, std::optional<Tensor> gemm1_lora_delta,
    std::optional<Tensor> output, int64_t tune_max_num_tokens,
    Fp8QuantizationType fp8_quantization_type, int64_t activation_type,
    std::optional<Tensor> gemm1_alpha, std::optional<Tensor> gemm1_beta,
    std::optional<Tensor> gemm1_clamp_limit, std::optional<int64_t> valid_hidden_size,
    std::optional<int64_t> valid_intermediate_size, std::optional<Tensor> workspace_buffer) {
  return call_op<&trtllm_fp8_block_scale_routed_moe>(
      [&] {
        const char* op = "trtllm_fp8_block_scale_routed_moe";
        const std::optional<Tensor> no_replay;
        const Fp8Common c{op,
                          &topk_ids,
                          nullptr,
                          &routing_bias,
                          &hidden_states,
                          num_experts,
                          top_k,
                          n_group,
                          topk_group,
                          intermediate_size,
                          local_expert_offset,
                          local_num_experts,
                          routed_scaling_factor,
                          routing_method_type,
                          activation_type,
                          true,
                          &no_replay,
                          &output};
        return fp8_block_impl(c, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
                              gemm2_weights, gemm2_weights_scale, use_shuffled_weight,
                              weight_layout, do_finalize, fp8_quantization_type, gemm1_alpha,
                              gemm1_beta, gemm1_clamp_limit, std::nullopt, gemm1_lora_delta,
                              {valid_hidden_size, valid_intermediate_size, std::nullopt,
                               std::nullopt, workspace_buffer});
      },
      topk_ids, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
      gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, num_experts, top_k, n_group,
      topk_group, intermediate_size, local_expert_offset, local_num_experts, routed_scaling_factor,
      routing_method_type, use_shuffled_weight, weight_layout, do_finalize, enable_pdl,
      gemm1_lora_delta, output, tune_max_num_tokens, fp8_quantization_type, activation_type,
      gemm1_alpha, gemm1_beta, gemm1_clamp_limit, valid_hidden_size, valid_intermediate_size,
      workspace_buffer);
}

TrtllmMoeResult trtllm_fp8_per_tensor_scale_moe(
    const Tensor& routing_logits, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    const Tensor& gemm1_weights, const Tensor& output1_scales_scalar,
    const Tensor& output1_scales_gate_scalar, const Tensor& gemm2_weights,
    const Tensor& output2_scales_scalar, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, bool use_routing_scales_on_input,
    int64_t routing_method_type, bool do_finalize, std::optional<bool> enable_pdl,
    int64_t tune_max_num_tokens, int64_t activation_type, bool norm_topk_prob,
    std::optional<Tensor> routing_replay_out, std::optional<Tensor> output,
    std::optional<Tensor> gemm1_clamp_limit, std::optional<Tensor> workspace_buffer) {
  return call_op<&trtllm_fp8_per_tensor_scale_moe>(
      [&] {
        const Fp8Common c{"trtllm_fp8_per_tensor_scale_moe",
                          nullptr,
                          &routing_logits,
                          &routing_bias,
                          &hidden_states,
                          num_experts,
                          top_k,
                          n_group,
                          topk_group,
                          intermediate_size,
                          local_expert_offset,
                          local_num_experts,
                          routed_scaling_factor,
                          routing_method_type,
                          activation_type,
                          norm_topk_prob,
                          &routing_replay_out,
                          &output};
        return fp8_per_tensor_impl(c, gemm1_weights, output1_scales_scalar,
                                   output1_scales_gate_scalar, gemm2_weights, output2_scales_scalar,
                                   use_routing_scales_on_input, do_finalize, gemm1_clamp_limit,
                                   workspace_buffer);
      },
      routing_logits, routing_bias, hidden_states, gemm1_weights, output1_scales_scalar,
      output1_scales_gate_scalar, gemm2_weights, output2_scales_scalar, num_experts, top_k, n_group,
      topk_group, intermediate_size, local_expert_offset, local_num_experts, routed_scaling_factor,
      use_routing_scales_on_input, routing_method_type, do_finalize, enable_pdl,
      tune_max_num_tokens, activation_type, norm_topk_prob, routing_replay_out, output,
      gemm1_clamp_limit, workspace_buffer);
}

TrtllmMoeResult trtllm_fp8_per_tensor_scale_routed_moe(
    const MoeTopkIds& topk_ids, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    const Tensor& gemm1_weights, const Tensor& output1_scales_scalar,
    const Tensor& output1_scales_gate_scalar, const Tensor& gemm2_weights,
    const Tensor& output2_scales_scalar, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, bool use_routing_scales_on_input,
    int64_t routing_method_type, bool do_finalize, std::optional<bool> enable_pdl,
    int64_t tune_max_num_tokens, int64_t activation_type, std::optional<Tensor> routing_replay_out,
    std::optional<Tensor> output, std::optional<Tensor> gemm1_clamp_limit,
    std::optional<Tensor> workspace_buffer) {
  return call_op<&trtllm_fp8_per_tensor_scale_routed_moe>(
      [&] {
        const Fp8Common c{"trtllm_fp8_per_tensor_scale_routed_moe",
                          &topk_ids,
                          nullptr,
                          &routing_bias,
                          &hidden_states,
                          num_experts,
                          top_k,
                          n_group,
                          topk_group,
                          intermediate_size,
                          local_expert_offset,
                          local_num_experts,
                          routed_scaling_factor,
                          routing_method_type,
                          activation_type,
                          true,
                          &routing_replay_out,
                          &output};
        return fp8_per_tensor_impl(c, gemm1_weights, output1_scales_scalar,
                                   output1_scales_gate_scalar, gemm2_weights, output2_scales_scalar,
                                   use_routing_scales_on_input, do_finalize, gemm1_clamp_limit,
                                   workspace_buffer);
      },
      topk_ids, routing_bias, hidden_states, gemm1_weights, output1_scales_scalar,
      output1_scales_gate_scalar, gemm2_weights, output2_scales_scalar, num_experts, top_k, n_group,
      topk_group, intermediate_size, local_expert_offset, local_num_experts, routed_scaling_factor,
      use_routing_scales_on_input, routing_method_type, do_finalize, enable_pdl,
      tune_max_num_tokens, activation_type, routing_replay_out, output, gemm1_clamp_limit,
      workspace_buffer);
}

namespace {

// fp8 e4m3fn tensor of uniform values in [low, high) (drawn in fp32, then rounded).
Tensor fp8_tensor(const Shape& shape, Device dev, uint64_t seed, double low, double high) {
  return api::bench::random_tensor(shape, DType::kFloat32, Device::cpu(), seed, low, high)
      .to(DType::kFloat8E4M3FN)
      .to(dev);
}

// trtllm_fp8_block_scale_moe: m tokens, hidden_size, inter = n (both rounded up to 128), 8
// experts, top-2, DeepSeekV3 routing (4 groups of 2, 2 kept), plain MajorK weights.
BenchCase bench_trtllm_fp8_block_scale_moe(const BenchShape& s, Device dev) {
  const int64_t T = s.m, H = (s.hidden_size + 127) / 128 * 128, I = (s.n + 127) / 128 * 128;
  const int64_t E = 8, K = 2;
  const uint64_t sd = s.random_seed;
  BenchCase c = api::bench::invoke_case(
      "trtllm_fp8_block_scale_moe",
      {Value(api::bench::random_tensor({T, E}, DType::kFloat32, dev, sd, -3.0, 3.0)),
       Value(api::bench::random_tensor({E}, DType::kBFloat16, dev, sd + 1, -0.2, 0.2)),
       Value(fp8_tensor({T, H}, dev, sd + 2, -4.0, 4.0)),
       Value(api::bench::random_tensor({H / 128, T}, DType::kFloat32, dev, sd + 3, 0.01, 0.02)),
       Value(fp8_tensor({E, 2 * I, H}, dev, sd + 4, -4.0, 4.0)),
       Value(api::bench::random_tensor({E, 2 * I / 128, H / 128}, DType::kFloat32, dev, sd + 5,
                                       0.01, 0.02)),
       Value(fp8_tensor({E, H, I}, dev, sd + 6, -4.0, 4.0)),
       Value(api::bench::random_tensor({E, H / 128, I / 128}, DType::kFloat32, dev, sd + 7, 0.01,
                                       0.02)),
       Value(E), Value(K), Value(int64_t{4}), Value(int64_t{2}), Value(I), Value(int64_t{0}),
       Value(E), Value(2.5), Value(int64_t{2})});
  const double rows = static_cast<double>(T * K);
  c.flops = 2.0 * rows * H * (2 * I) + 2.0 * rows * I * H;
  c.bytes = static_cast<double>(T * H) * 3 + static_cast<double>(E * 3 * I * H);
  return c;
}

// trtllm_fp8_per_tensor_scale_moe: m tokens, hidden_size, inter = n (rounded up to 32 rows for
// the shuffle), 8 experts, top-2, Renormalize routing; the weights are random fp8 bytes, which
// is a valid shuffled layout of other random weights.
BenchCase bench_trtllm_fp8_per_tensor_scale_moe(const BenchShape& s, Device dev) {
  const int64_t T = s.m, H = (s.hidden_size + 31) / 32 * 32, I = (s.n + 31) / 32 * 32;
  const int64_t E = 8, K = 2;
  const uint64_t sd = s.random_seed;
  auto scales = [&](uint64_t seed) {
    return Value(api::bench::random_tensor({E}, DType::kFloat32, dev, seed, 0.01, 0.02));
  };
  BenchCase c = api::bench::invoke_case(
      "trtllm_fp8_per_tensor_scale_moe",
      {Value(api::bench::random_tensor({T, E}, DType::kBFloat16, dev, sd, -3.0, 3.0)), Value(),
       Value(fp8_tensor({T, H}, dev, sd + 2, -4.0, 4.0)),
       Value(fp8_tensor({E, 2 * I, H}, dev, sd + 4, -4.0, 4.0)), scales(sd + 5), scales(sd + 6),
       Value(fp8_tensor({E, H, I}, dev, sd + 7, -4.0, 4.0)), scales(sd + 8), Value(E), Value(K),
       Value(), Value(), Value(I), Value(int64_t{0}), Value(E), Value(), Value(false),
       Value(int64_t{1})});
  const double rows = static_cast<double>(T * K);
  c.flops = 2.0 * rows * H * (2 * I) + 2.0 * rows * I * H;
  c.bytes = static_cast<double>(T * H) * 3 + static_cast<double>(E * 3 * I * H);
  return c;
}

// Precomputed routing for the _routed_ benches: packed ids, two distinct experts per token with
// bf16 weights 0.75 / 0.25.
Value packed_routing(int64_t T, int64_t E, Device dev) {
  std::vector<int64_t> packed;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t e0 = (t * 5) % E, e1 = (e0 + 1 + t % (E - 1)) % E;
    packed.push_back((e0 << 16) | float_to_bfloat16_bits(0.75f));
    packed.push_back((e1 << 16) | float_to_bfloat16_bits(0.25f));
  }
  return Value(api::bench::int32_tensor(packed, dev).view({T, 2}));
}

// trtllm_fp8_block_scale_routed_moe: the FFN shapes of trtllm_fp8_block_scale_moe, packed
// precomputed routing.
BenchCase bench_trtllm_fp8_block_scale_routed_moe(const BenchShape& s, Device dev) {
  const int64_t T = s.m, H = (s.hidden_size + 127) / 128 * 128, I = (s.n + 127) / 128 * 128;
  const int64_t E = 8, K = 2;
  const uint64_t sd = s.random_seed;
  BenchCase c = api::bench::invoke_case(
      "trtllm_fp8_block_scale_routed_moe",
      {packed_routing(T, E, dev), Value(), Value(fp8_tensor({T, H}, dev, sd + 2, -4.0, 4.0)),
       Value(api::bench::random_tensor({H / 128, T}, DType::kFloat32, dev, sd + 3, 0.01, 0.02)),
       Value(fp8_tensor({E, 2 * I, H}, dev, sd + 4, -4.0, 4.0)),
       Value(api::bench::random_tensor({E, 2 * I / 128, H / 128}, DType::kFloat32, dev, sd + 5,
                                       0.01, 0.02)),
       Value(fp8_tensor({E, H, I}, dev, sd + 6, -4.0, 4.0)),
       Value(api::bench::random_tensor({E, H / 128, I / 128}, DType::kFloat32, dev, sd + 7, 0.01,
                                       0.02)),
       Value(E), Value(K), Value(), Value(), Value(I), Value(int64_t{0}), Value(E), Value()});
  const double rows = static_cast<double>(T * K);
  c.flops = 2.0 * rows * H * (2 * I) + 2.0 * rows * I * H;
  c.bytes = static_cast<double>(T * H) * 3 + static_cast<double>(E * 3 * I * H);
  return c;
}

// trtllm_fp8_per_tensor_scale_routed_moe: the FFN shapes of trtllm_fp8_per_tensor_scale_moe,
// packed precomputed routing.
BenchCase bench_trtllm_fp8_per_tensor_scale_routed_moe(const BenchShape& s, Device dev) {
  const int64_t T = s.m, H = (s.hidden_size + 31) / 32 * 32, I = (s.n + 31) / 32 * 32;
  const int64_t E = 8, K = 2;
  const uint64_t sd = s.random_seed;
  auto scales = [&](uint64_t seed) {
    return Value(api::bench::random_tensor({E}, DType::kFloat32, dev, seed, 0.01, 0.02));
  };
  BenchCase c = api::bench::invoke_case(
      "trtllm_fp8_per_tensor_scale_routed_moe",
      {packed_routing(T, E, dev), Value(), Value(fp8_tensor({T, H}, dev, sd + 2, -4.0, 4.0)),
       Value(fp8_tensor({E, 2 * I, H}, dev, sd + 4, -4.0, 4.0)), scales(sd + 5), scales(sd + 6),
       Value(fp8_tensor({E, H, I}, dev, sd + 7, -4.0, 4.0)), scales(sd + 8), Value(E), Value(K),
       Value(), Value(), Value(I), Value(int64_t{0}), Value(E), Value(), Value(false)});
  const double rows = static_cast<double>(T * K);
  c.flops = 2.0 * rows * H * (2 * I) + 2.0 * rows * I * H;
  c.bytes = static_cast<double>(T * H) * 3 + static_cast<double>(E * 3 * I * H);
  return c;
}

}  // namespace

namespace detail {
void register_moe_quant_ops(OpRegistry& r) {
  declare<&trtllm_fp8_block_scale_moe>(
      r,
      {.name = "trtllm_fp8_block_scale_moe",
       .module = kMoeQuantCoreModule,
       .summary = "trtllm-gen FP8 MoE, DeepSeek 128x128 block scales: routing from logits, then "
                  "the fused expert FFNs",
       .returns = "Tensor | list[Tensor]"},
      "routing_logits", arg("routing_bias").required(), "hidden_states", "hidden_states_scale",
      "gemm1_weights", "gemm1_weights_scale", "gemm2_weights", "gemm2_weights_scale", "num_experts",
      "top_k", arg("n_group").required(), arg("topk_group").required(), "intermediate_size",
      "local_expert_offset", "local_num_experts", arg("routed_scaling_factor").required(),
      arg("routing_method_type", int64_t{0}), arg("use_shuffled_weight", false),
      arg("weight_layout", WeightLayout::MajorK), arg("do_finalize", true), "enable_pdl",
      arg("tune_max_num_tokens", int64_t{8192}),
      arg("fp8_quantization_type", Fp8QuantizationType::DeepSeekFp8), "num_fused_shared_experts",
      arg("activation_type", int64_t{3}), arg("norm_topk_prob", true),
      arg("routing_replay_out").mut(), "gemm1_alpha", "gemm1_beta", "gemm1_clamp_limit",
      arg("output").mut(), "valid_hidden_size", "valid_intermediate_size", arg("gemm1_bias").kw(),
      arg("gemm2_bias").kw(), arg("workspace_buffer").kw());
  declare<&trtllm_fp8_block_scale_routed_moe>(
      r,
      {.name = "trtllm_fp8_block_scale_routed_moe",
       .module = kMoeQuantCoreModule,
       .summary = "trtllm-gen FP8 block-scale MoE with precomputed routing (packed ids or (ids, "
                  "weights))",
       .returns = "Tensor | list[Tensor]"},
      "topk_ids", arg("routing_bias").required(), "hidden_states", "hidden_states_scale",
      "gemm1_weights", "gemm1_weights_scale", "gemm2_weights", "gemm2_weights_scale", "num_experts",
      "top_k", arg("n_group").required(), arg("topk_group").required(), "intermediate_size",
      "local_expert_offset", "local_num_experts", arg("routed_scaling_factor").required(),
      arg("routing_method_type", int64_t{0}), arg("use_shuffled_weight", false),
      arg("weight_layout", WeightLayout::MajorK), arg("do_finalize", true), "enable_pdl",
      "gemm1_lora_delta", arg("output").mut(), arg("tune_max_num_tokens", int64_t{8192}),
      arg("fp8_quantization_type", Fp8QuantizationType::DeepSeekFp8),
      arg("activation_type", int64_t{3}), "gemm1_alpha", "gemm1_beta", "gemm1_clamp_limit",
      "valid_hidden_size", "valid_intermediate_size", "workspace_buffer");
  declare<&trtllm_fp8_per_tensor_scale_moe>(
      r,
      {.name = "trtllm_fp8_per_tensor_scale_moe",
       .module = kMoeQuantCoreModule,
       .summary = "trtllm-gen FP8 MoE with per-tensor scales: routing from logits, then the "
                  "fused expert FFNs",
       .returns = "Tensor | list[Tensor]"},
      "routing_logits", arg("routing_bias").required(), "hidden_states", "gemm1_weights",
      "output1_scales_scalar", "output1_scales_gate_scalar", "gemm2_weights",
      "output2_scales_scalar", "num_experts", "top_k", arg("n_group").required(),
      arg("topk_group").required(), "intermediate_size", "local_expert_offset", "local_num_experts",
      arg("routed_scaling_factor").required(), "use_routing_scales_on_input",
      arg("routing_method_type", int64_t{0}), arg("do_finalize", true), "enable_pdl",
      arg("tune_max_num_tokens", int64_t{8192}), arg("activation_type", int64_t{3}),
      arg("norm_topk_prob", true), arg("routing_replay_out").mut(), arg("output").mut(),
      "gemm1_clamp_limit", "workspace_buffer");
  declare<&trtllm_fp8_per_tensor_scale_routed_moe>(
      r,
      {.name = "trtllm_fp8_per_tensor_scale_routed_moe",
       .module = kMoeQuantCoreModule,
       .summary = "trtllm-gen FP8 per-tensor-scale MoE with precomputed routing",
       .returns = "Tensor | list[Tensor]"},
      "topk_ids", arg("routing_bias").required(), "hidden_states", "gemm1_weights",
      "output1_scales_scalar", "output1_scales_gate_scalar", "gemm2_weights",
      "output2_scales_scalar", "num_experts", "top_k", arg("n_group").required(),
      arg("topk_group").required(), "intermediate_size", "local_expert_offset", "local_num_experts",
      arg("routed_scaling_factor").required(), "use_routing_scales_on_input",
      arg("routing_method_type", int64_t{0}), arg("do_finalize", true), "enable_pdl",
      arg("tune_max_num_tokens", int64_t{8192}), arg("activation_type", int64_t{3}),
      arg("routing_replay_out").mut(), arg("output").mut(), "gemm1_clamp_limit",
      "workspace_buffer");
  api::register_backends("trtllm_fp8_block_scale_moe", kTrtllmFp8MoeKernels);
  api::register_backends("trtllm_fp8_block_scale_routed_moe", kTrtllmFp8MoeKernels);
  api::register_backends("trtllm_fp8_per_tensor_scale_moe", kTrtllmFp8MoeKernels);
  api::register_backends("trtllm_fp8_per_tensor_scale_routed_moe", kTrtllmFp8MoeKernels);
  register_bench_hook("trtllm_fp8_block_scale_moe", bench_trtllm_fp8_block_scale_moe);
  register_bench_hook("trtllm_fp8_per_tensor_scale_moe", bench_trtllm_fp8_per_tensor_scale_moe);
  register_bench_hook("trtllm_fp8_block_scale_routed_moe", bench_trtllm_fp8_block_scale_routed_moe);
  register_bench_hook("trtllm_fp8_per_tensor_scale_routed_moe",
                      bench_trtllm_fp8_per_tensor_scale_routed_moe);
}
}  // namespace detail

}  // namespace flashinfer
