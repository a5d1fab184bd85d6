// cutlass_fused_moe's FP4 and mixed-input paths: argument checks as upstream's runner makes them
// (errors name the argument), dispatch to the CPU reference or, for W4A16 MXFP4, Humming, W4A8
// INT4 and weight-only INT4, the CUDA kernels. Semantics and sources: docs/MOE.md.
#include "api/moe_cutlass_fp4.h"

#include <array>
#include <string>
#include <tuple>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/ops/moe_weight_prep.h"
#include "kernels/cpu/moe_cutlass_fp4_cpu.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/moe_cuda.h"
#endif

namespace flashinfer::api {
namespace {

constexpr const char* kMoeCutlassFp4Op = "cutlass_fused_moe";

constexpr KernelEntry<kernels::CutlassMoeFp4Params> kCutlassFp4Kernels[] = {
    {DeviceType::kCPU,
     "CPU reference: exact block dequantization, per-expert fp32 GEMMs of the routed rows only, "
     "the activation re-quantized as upstream's kernels do",
     nullptr,
     [](const kernels::CutlassMoeFp4Params& p, const LaunchContext&) {
       kernels::cpu::cutlass_moe_fp4(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA (W4A16 MXFP4, Humming, W4A8 INT4 on sm90+; weight-only INT4 on sm80+): a block per "
     "(token, expert) pair or per tile of up to 8 pairs of one expert, a warp per 16 output rows "
     "(weight-only INT4: 4) reading the weights and scales in place in upstream's layouts, fp32 "
     "sums",
     nullptr,
     [](const kernels::CutlassMoeFp4Params& p, const LaunchContext& c) {
       kernels::cuda::cutlass_moe_sm90_mixed(p, c.stream, c.enable_pdl);
     }},
#endif
};

int64_t moe_cutlass_fp4_round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

const char* mode_name(kernels::CutlassFp4Mode m) {
  switch (m) {
    case kernels::CutlassFp4Mode::kNvfp4:
      return "NVFP4";
    case kernels::CutlassFp4Mode::kMxfp8Mxfp4:
      return "MXFP8 x MXFP4";
    case kernels::CutlassFp4Mode::kHummingFp8Mxfp4:
      return "Humming MXFP4 x FP8";
    case kernels::CutlassFp4Mode::kMxfp8Mxfp8:
      return "MXFP8 x MXFP8";
    case kernels::CutlassFp4Mode::kW4A8Int4:
      return "W4A8 INT4";
    case kernels::CutlassFp4Mode::kWoqInt4:
      return "weight-only INT4";
    default:
      return "W4A16 MXFP4";
  }
}

// One entry of quant_scales: dtype, shape, on input's device and contiguous; `what` is upstream's
// name for it.
const Tensor& quant_scale(const std::vector<Tensor>& qs, size_t i, const char* what, DType dtype,
                          const Shape& shape, const Device& dev) {
  const Tensor& t = qs[i];
  FLASHINFER_CHECK(t.defined(), kMoeCutlassFp4Op, "quant_scales", "quant_scales[", i, "] (", what,
                   ") is undefined");
  FLASHINFER_CHECK(t.dtype() == dtype, kMoeCutlassFp4Op, "quant_scales", "quant_scales[", i, "] (",
                   what, ") must be ", dtype_torch_name(dtype), ", got ",
                   dtype_torch_name(t.dtype()));
  FLASHINFER_CHECK(t.shape() == shape, kMoeCutlassFp4Op, "quant_scales", "quant_scales[", i, "] (",
                   what, ") must have shape ", shape_to_string(shape), ", got ",
                   shape_to_string(t.shape()));
  FLASHINFER_CHECK(t.device() == dev && t.is_contiguous(), kMoeCutlassFp4Op, "quant_scales",
                   "quant_scales[", i, "] (", what,
                   ") must be a contiguous tensor on input's device (", dev.str(), ")");
  return t;
}

// An fp32 act global scale: a scalar ([] or [1]) or one per local expert ([E]).
const float* act_global(const std::vector<Tensor>& qs, size_t i, const char* what, int64_t E,
                        const Device& dev, bool* per_expert) {
  const Tensor& t = qs[i];
  FLASHINFER_CHECK(t.defined() && t.dtype() == DType::kFloat32 && t.dim() <= 1 &&
                       (t.dim() == 0 || t.size(0) == E || t.size(0) == 1),
                   kMoeCutlassFp4Op, "quant_scales", "quant_scales[", i, "] (", what,
                   ") must be an fp32 scalar or [", E, "] tensor, got ",
                   t.defined() ? dtype_torch_name(t.dtype()) : "undefined", " ",
                   t.defined() ? shape_to_string(t.shape()) : "");
  FLASHINFER_CHECK(t.device() == dev && t.is_contiguous(), kMoeCutlassFp4Op, "quant_scales",
                   "quant_scales[", i, "] (", what,
                   ") must be a contiguous tensor on input's device (", dev.str(), ")");
  *per_expert = t.dim() == 1 && t.size(0) == E && E > 1;
  return t.data<float>();
}

// The packed-int4 paths' 8 quant_scales in upstream's order: entry i a contiguous tensor on
// input's device of want[i] values of want_dt[i], or empty where optional[i]; errors name
// quant_scales.
void check_int4_quant_scales(const std::vector<Tensor>& qs, const char* path,
                             const std::array<int64_t, 8>& want,
                             const std::array<DType, 8>& want_dt,
                             const std::array<bool, 8>& optional, const Device& dev) {
  FLASHINFER_CHECK(qs.size() == 8, kMoeCutlassFp4Op, "quant_scales", path,
                   " takes 8 tensors (fc1_weight_scales, fc2_weight_scales, fc1_act_scales, "
                   "fc2_act_scales, fc1_weight_zeros, fc2_weight_zeros, fc1_alpha, fc2_alpha), "
                   "got ",
                   qs.size());
  const char* what[8] = {"fc1_weight_scales", "fc2_weight_scales", "fc1_act_scales",
                         "fc2_act_scales",    "fc1_weight_zeros",  "fc2_weight_zeros",
                         "fc1_alpha",         "fc2_alpha"};
  for (size_t i = 0; i < 8; ++i) {
    const Tensor& t = qs[i];
    const int64_t got = t.defined() ? t.numel() : 0;
    if (optional[i] && got == 0) continue;
    FLASHINFER_CHECK(got == want[i] && t.dtype() == want_dt[i], kMoeCutlassFp4Op, "quant_scales",
                     "quant_scales[", i, "] (", what[i], ") must hold ", want[i], " ",
                     dtype_torch_name(want_dt[i]), " values", optional[i] ? " or none" : "",
                     ", got ", got, " ", t.defined() ? dtype_torch_name(t.dtype()) : "undefined");
    FLASHINFER_CHECK(t.device() == dev && t.is_contiguous(), kMoeCutlassFp4Op, "quant_scales",
                     "quant_scales[", i, "] (", what[i],
                     ") must be a contiguous tensor on input's device (", dev.str(), ")");
  }
}

const float* moe_cutlass_fp4_expert_vector(const std::optional<Tensor>& t, int64_t E,
                                           const Device& dev, const char* arg) {
  if (!t) return nullptr;
  check_defined(*t, kMoeCutlassFp4Op, arg);
  check_dtype_in(*t, {DType::kFloat32}, kMoeCutlassFp4Op, arg);
  check_shape_eq(*t, {E}, kMoeCutlassFp4Op, arg);
  FLASHINFER_CHECK(t->device() == dev && t->is_contiguous(), kMoeCutlassFp4Op, arg,
                   "must be a contiguous tensor on input's device (", dev.str(), ")");
  return t->data<float>();
}

}  // namespace

bool is_cutlass_moe_fp4_call(const Tensor& input, const Tensor& fc1_expert_weights,
                             bool use_deepseek_fp8_block_scale, bool use_w4_group_scaling,
                             bool use_mxfp8_act_scaling, bool use_packed_weights,
                             bool use_wfp4afp8_humming) {
  if (!input.defined() || !fc1_expert_weights.defined()) return false;
  if (use_deepseek_fp8_block_scale) return false;
  if (use_packed_weights) {
    // Upstream's isInt4Quant: packed int4 uint8 weights, W4A8 with use_w4_group_scaling, else
    // weight-only INT4; the input's dtype is checked on the path.
    return fc1_expert_weights.dtype() == DType::kUInt8 && !use_mxfp8_act_scaling &&
           !use_wfp4afp8_humming;
  }
  if (use_wfp4afp8_humming) {
    // Humming (upstream's isWMxfp4AFp8HummingQuant): uint8 MXFP4 weights with W4 group scaling;
    // the input's dtype is checked on the path (upstream's runner: fp16 / bf16 only). The
    // per-block activation variant (with use_mxfp8_act_scaling) is not taken.
    return fc1_expert_weights.dtype() == DType::kUInt8 && use_w4_group_scaling &&
           !use_mxfp8_act_scaling;
  }
  const bool fp8_in = input.dtype() == DType::kFloat8E4M3FN;
  if (fc1_expert_weights.dtype() == DType::kFloat8E4M3FN) {
    // MXFP8 x MXFP8 (upstream's isWMxfp8AMxfp8Quant): e4m3 input and weights with MXFP8 scales.
    return fp8_in && use_mxfp8_act_scaling && !use_w4_group_scaling;
  }
  if (fc1_expert_weights.dtype() == DType::kInt64) {
    if (use_w4_group_scaling) return false;
    return fp8_in == use_mxfp8_act_scaling;  // MXFP8 x MXFP4, or NVFP4
  }
  return fc1_expert_weights.dtype() == DType::kUInt8 && use_w4_group_scaling &&
         !use_mxfp8_act_scaling &&
         (input.dtype() == DType::kBFloat16 || input.dtype() == DType::kFloat16);
}

std::vector<Tensor> cutlass_fused_moe_fp4(const CutlassMoeCall& c) {
  using kernels::CutlassFp4Mode;
  const Tensor &input = c.input, &w1 = c.w1, &w2 = c.w2;
  check_defined(c.ids, kMoeCutlassFp4Op, "token_selected_experts");
  check_defined(c.scales, kMoeCutlassFp4Op, "token_final_scales");
  check_defined(w2, kMoeCutlassFp4Op, "fc2_expert_weights");
  const CutlassFp4Mode mode =
      c.use_packed_weights
          ? (c.use_w4_group_scaling ? CutlassFp4Mode::kW4A8Int4 : CutlassFp4Mode::kWoqInt4)
      : c.use_wfp4afp8_humming                ? CutlassFp4Mode::kHummingFp8Mxfp4
      : w1.dtype() == DType::kFloat8E4M3FN    ? CutlassFp4Mode::kMxfp8Mxfp8
      : w1.dtype() == DType::kUInt8           ? CutlassFp4Mode::kW4A16Mxfp4
      : input.dtype() == DType::kFloat8E4M3FN ? CutlassFp4Mode::kMxfp8Mxfp4
                                              : CutlassFp4Mode::kNvfp4;
  const bool hum = mode == CutlassFp4Mode::kHummingFp8Mxfp4;
  const bool nv = mode == CutlassFp4Mode::kNvfp4;
  const bool w4a8 = mode == CutlassFp4Mode::kW4A8Int4;
  const bool woq = mode == CutlassFp4Mode::kWoqInt4;
  // W4A16 MXFP4, Humming, W4A8 INT4 (upstream's SM90 mixed-input paths) and weight-only INT4 have
  // a GPU kernel; another mode's CUDA call is refused here (kUnsupported), so replay falls back to
  // the CPU. Past this point every tensor is on input's device.
  const Device dev = input.device();
  FLASHINFER_CHECK_CODE(
      dev.is_cpu() || mode == CutlassFp4Mode::kW4A16Mxfp4 || hum || w4a8 || woq,
      ErrorCode::kUnsupported, kMoeCutlassFp4Op, "input", "the ", mode_name(mode),
      " path of cutlass_fused_moe has a CPU reference only (no CUDA kernel here)");

  // Weights: int64 holds 16 e2m1 values, uint8 two (upstream's mInnerDimMultiplier).
  const bool w8 = mode == CutlassFp4Mode::kMxfp8Mxfp8;
  const int64_t mult = w8 ? 1 : mode == CutlassFp4Mode::kW4A16Mxfp4 || hum || w4a8 || woq ? 2 : 16;
  api::check_dim(w2, {3}, kMoeCutlassFp4Op, "fc2_expert_weights");
  api::check_same_dtype(w2, w1, kMoeCutlassFp4Op, "fc2_expert_weights", "fc1_expert_weights");
  FLASHINFER_CHECK(w2.device() == dev && w2.is_contiguous(), kMoeCutlassFp4Op, "fc2_expert_weights",
                   "must be a contiguous tensor on input's device (", dev.str(), ")");
  const int64_t E = w2.size(0), H = w2.size(1), I = w2.size(2) * mult;
  FLASHINFER_CHECK(E >= 1 && H >= 1 && I >= 1, kMoeCutlassFp4Op, "fc2_expert_weights",
                   "empty expert weights, shape ", shape_to_string(w2.shape()));
  const bool gated = kernels::moe_act_is_gated(static_cast<kernels::MoeAct>(c.activation_type));
  const int64_t N1 = gated ? 2 * I : I;
  FLASHINFER_CHECK(w1.shape() == Shape({E, N1, H / mult}) && H % mult == 0, kMoeCutlassFp4Op,
                   "fc1_expert_weights", "expected [", E, ", ", N1, ", ", H / mult, "] (",
                   gated ? "gated: 2 * " : "", "inter = ", I, " from fc2, ", mult,
                   " fp4 values per element), got ", shape_to_string(w1.shape()));
  FLASHINFER_CHECK(w1.device() == dev && w1.is_contiguous(), kMoeCutlassFp4Op, "fc1_expert_weights",
                   "must be a contiguous tensor on input's device (", dev.str(), ")");
  if (mode == CutlassFp4Mode::kNvfp4) {
    FLASHINFER_CHECK(H % 16 == 0 && I % 16 == 0, kMoeCutlassFp4Op, "fc2_expert_weights",
                     "hidden and inter sizes must be multiples of 16, got ", H, " and ", I);
  } else {
    // MXFP4 weights: upstream's runner requires 128 (MXFP8 x MXFP4); the SM90 layouts fold
    // scales per 64 rows and 128 columns (W4A16). MXFP8 x MXFP8: upstream requires 64 and pads
    // the scale rows / columns (alignToSfDim); here 128, where no padding arises.
    FLASHINFER_CHECK(H % 128 == 0 && I % 128 == 0, kMoeCutlassFp4Op, "fc2_expert_weights",
                     "hidden_size and inter_size must be divisible by 128 for ", mode_name(mode),
                     " weights, got ", H, " and ", I);
  }

  // Input: fp16/bf16 (NVFP4: quantized here; W4A16: as is), packed NVFP4 uint8 [T, H/2] with
  // input_sf, or MXFP8 float8_e4m3fn [T, H] with input_sf.
  api::check_dim(input, {2}, kMoeCutlassFp4Op, "input");
  const int64_t T = input.size(0);
  const bool packed = input.dtype() == DType::kUInt8;
  if (mode == CutlassFp4Mode::kNvfp4) {
    api::check_dtype_in(input, {DType::kFloat16, DType::kBFloat16, DType::kUInt8}, kMoeCutlassFp4Op,
                        "input");
  } else if (hum || w4a8 || woq) {
    // Upstream: "Humming-style MXFP4 x FP8 requires FP16/BF16 inputs and online FP8 activation
    // quantization"; W4A8's and weight-only INT4's runners exist for fp16 / bf16 inputs only.
    api::check_dtype_in(input, {DType::kFloat16, DType::kBFloat16}, kMoeCutlassFp4Op, "input");
  }
  const int64_t in_cols = packed ? H / 2 : H;
  FLASHINFER_CHECK(input.size(1) == in_cols, kMoeCutlassFp4Op, "input", "expected [", T, ", ",
                   in_cols, "] (hidden_size ", H, " from fc2_expert_weights",
                   packed ? ", packed fp4" : "", "), got ", shape_to_string(input.shape()));
  FLASHINFER_CHECK(input.stride(1) == 1 || in_cols <= 1, kMoeCutlassFp4Op, "input",
                   "the last dimension must be contiguous");
  const bool pre_quantized = packed || mode == CutlassFp4Mode::kMxfp8Mxfp4 || w8;
  const int vec = nv ? 16 : 32;
  kernels::SfLayoutCode sf_layout =
      c.swizzled_input_sf ? kernels::SfLayoutCode::k128x4 : kernels::SfLayoutCode::kLinear;
  const uint8_t* input_sf = nullptr;
  if (pre_quantized) {
    FLASHINFER_CHECK(c.input_sf.has_value() && c.input_sf->defined(), kMoeCutlassFp4Op, "input_sf",
                     "a pre-quantized input (", dtype_torch_name(input.dtype()),
                     ") needs its block scales");
    const Tensor& sf = *c.input_sf;
    api::check_dtype_in(sf, {DType::kUInt8, DType::kFloat8E4M3FN}, kMoeCutlassFp4Op, "input_sf");
    const int64_t want = kernels::sf_buffer_size(sf_layout, T, H / vec);
    // Upstream reads what it needs and checks no size: a larger buffer is accepted.
    FLASHINFER_CHECK(sf.numel() >= want && sf.device().is_cpu() && sf.is_contiguous(),
                     kMoeCutlassFp4Op, "input_sf", "expected at least ", want,
                     " contiguous CPU bytes (the ",
                     c.swizzled_input_sf ? "128x4-swizzled" : "linear", " scales of [", T, ", ",
                     H / vec, "]), got shape ", shape_to_string(sf.shape()));
    input_sf = static_cast<const uint8_t*>(sf.data_ptr());
  }

  const int64_t K = check_cutlass_moe_routing(c, T);

  // Output and bias dtype: fp16/bf16 (upstream's runner has no fp32 output for these paths);
  // W4A16 writes the input's dtype.
  if (mode == CutlassFp4Mode::kW4A16Mxfp4 || hum || w4a8 || woq) {
    FLASHINFER_CHECK(c.output_dtype == input.dtype(), kMoeCutlassFp4Op, "output_dtype", "the ",
                     mode_name(mode), " path writes the input's dtype ",
                     dtype_torch_name(input.dtype()), ", got ", dtype_torch_name(c.output_dtype));
  } else {
    FLASHINFER_CHECK(c.output_dtype == DType::kFloat16 || c.output_dtype == DType::kBFloat16,
                     kMoeCutlassFp4Op, "output_dtype", "the ", mode_name(mode),
                     " path writes torch.float16 or torch.bfloat16, got ",
                     dtype_torch_name(c.output_dtype));
  }
  const DType gemm_dt = c.output_dtype;
  FLASHINFER_CHECK(c.b1.has_value() == c.b2.has_value(), kMoeCutlassFp4Op,
                   c.b1 ? "fc2_expert_biases" : "fc1_expert_biases",
                   "upstream takes both expert biases or neither");
  if (c.b1) {
    for (const auto& [b, name, shape] : {std::tuple{&*c.b1, "fc1_expert_biases", Shape{E, N1}},
                                         std::tuple{&*c.b2, "fc2_expert_biases", Shape{E, H}}}) {
      check_defined(*b, kMoeCutlassFp4Op, name);
      FLASHINFER_CHECK(b->dtype() == gemm_dt, kMoeCutlassFp4Op, name, "dtype ",
                       dtype_torch_name(b->dtype()), " must be the output dtype ",
                       dtype_torch_name(gemm_dt));
      check_shape_eq(*b, shape, kMoeCutlassFp4Op, name);
      FLASHINFER_CHECK(b->device() == dev && b->is_contiguous(), kMoeCutlassFp4Op, name,
                       "must be a contiguous tensor on input's device (", dev.str(), ")");
    }
  }
  check_cutlass_moe_swiglu_args(c);
  // Weight-only INT4 runs a non-gated activation in the SM80 GEMM's epilogue, whose Gelu is the
  // tanh form (EpilogueOpDefaultFtGelu), not the erf GELU of the other paths: not implemented.
  FLASHINFER_CHECK_CODE(!woq || c.activation_type != ActivationType::Gelu, ErrorCode::kUnsupported,
                        kMoeCutlassFp4Op, "activation_type",
                        "Gelu (the GEMM epilogue's tanh GELU) is not implemented for weight-only "
                        "INT4");

  kernels::CutlassMoeFp4Params p;
  p.mode = mode;
  p.in_dtype = input.dtype();
  p.input_sf = input_sf;
  p.input_sf_layout = sf_layout;

  // quant_scales, in upstream's order per path.
  const std::vector<Tensor>& qs = c.quant_scales;
  if (mode == CutlassFp4Mode::kNvfp4) {
    FLASHINFER_CHECK(qs.size() == 6, kMoeCutlassFp4Op, "quant_scales",
                     "NVFP4 takes 6 tensors (fc1_act_global, fc1_weight_block, fc1_global, "
                     "fc2_act_global, fc2_weight_block, fc2_global), got ",
                     qs.size());
    if (packed) {
      // A pre-quantized input is never re-quantized, so its global scale is not read (upstream's
      // pre-quantized branch skips it): any fp32 scalar or 1-D tensor passes, as vLLM's
      // per-expert a1_gscale ([num_experts], global under expert parallelism) does.
      const Tensor& t = qs[0];
      FLASHINFER_CHECK(
          t.defined() && t.dtype() == DType::kFloat32 && t.dim() <= 1, kMoeCutlassFp4Op,
          "quant_scales",
          "quant_scales[0] (fc1_act_global) must be an fp32 scalar or 1-D tensor, got ",
          t.defined() ? dtype_torch_name(t.dtype()) : "undefined", " ",
          t.defined() ? shape_to_string(t.shape()) : "");
      p.fc1_act_global = nullptr;
    } else {
      p.fc1_act_global = act_global(qs, 0, "fc1_act_global", E, dev, &p.fc1_act_per_expert);
    }
    const Shape s1{E, moe_cutlass_fp4_round_up(N1, 128), moe_cutlass_fp4_round_up(H / 16, 4) / 4};
    const Shape s2{E, moe_cutlass_fp4_round_up(H, 128), moe_cutlass_fp4_round_up(I / 16, 4) / 4};
    p.w1_sf = static_cast<const uint8_t*>(
        quant_scale(qs, 1, "fc1_weight_block", DType::kInt32, s1, dev).data_ptr());
    p.fc1_global = quant_scale(qs, 2, "fc1_global", DType::kFloat32, {E}, dev).data<float>();
    p.fc2_act_global = act_global(qs, 3, "fc2_act_global", E, dev, &p.fc2_act_per_expert);
    p.w2_sf = static_cast<const uint8_t*>(
        quant_scale(qs, 4, "fc2_weight_block", DType::kInt32, s2, dev).data_ptr());
    p.fc2_global = quant_scale(qs, 5, "fc2_global", DType::kFloat32, {E}, dev).data<float>();
    p.w1_sf_stride = s1[1] * s1[2] * 4;
    p.w2_sf_stride = s2[1] * s2[2] * 4;
  } else if (mode == CutlassFp4Mode::kMxfp8Mxfp4 || w8) {
    FLASHINFER_CHECK(qs.size() == 4, kMoeCutlassFp4Op, "quant_scales", mode_name(mode),
                     " takes 4 tensors (fc1_weight_block, fc1_global, fc2_weight_block, "
                     "fc2_global), got ",
                     qs.size());
    const Shape s1{E, N1, H / 128}, s2{E, H, I / 128};
    p.w1_sf = static_cast<const uint8_t*>(
        quant_scale(qs, 0, "fc1_weight_block", DType::kInt32, s1, dev).data_ptr());
    p.fc1_global = quant_scale(qs, 1, "fc1_global", DType::kFloat32, {E}, dev).data<float>();
    p.w2_sf = static_cast<const uint8_t*>(
        quant_scale(qs, 2, "fc2_weight_block", DType::kInt32, s2, dev).data_ptr());
    p.fc2_global = quant_scale(qs, 3, "fc2_global", DType::kFloat32, {E}, dev).data<float>();
    p.w1_sf_stride = N1 * (H / 32);
    p.w2_sf_stride = H * (I / 32);
  } else if (hum) {
    FLASHINFER_CHECK(qs.size() == 5, kMoeCutlassFp4Op, "quant_scales",
                     "Humming takes 5 tensors (fc1_weight_block, fc1_residual, fc2_act_global, "
                     "fc2_weight_block, fc2_residual), got ",
                     qs.size());
    // The folded exponent offsets (interleave_moe_scales_for_sm90_mixed_gemm of [E, rows, k / 32]
    // bytes) viewed as int32; the residuals per local expert, times 64; fc2_act_global is checked
    // and not read (the runner passes no GEMM2 activation scale in this mode).
    const Shape s1{E, N1 / 64, H / 128, 16, 4}, s2{E, H / 64, I / 128, 16, 4};
    p.w1_sf = static_cast<const uint8_t*>(
        quant_scale(qs, 0, "fc1_weight_block", DType::kInt32, s1, dev).data_ptr());
    p.fc1_global = quant_scale(qs, 1, "fc1_residual", DType::kFloat32, {E}, dev).data<float>();
    bool unused_per_expert = false;
    act_global(qs, 2, "fc2_act_global", E, dev, &unused_per_expert);
    p.w2_sf = static_cast<const uint8_t*>(
        quant_scale(qs, 3, "fc2_weight_block", DType::kInt32, s2, dev).data_ptr());
    p.fc2_global = quant_scale(qs, 4, "fc2_residual", DType::kFloat32, {E}, dev).data<float>();
    p.w1_sf_stride = N1 * (H / 32);
    p.w2_sf_stride = H * (I / 32);
  } else if (w4a8 || woq) {
    // The packed-int4 paths' 8 tensors; the weight scales of the input dtype, read by upstream as
    // raw pointers (element count and dtype checked): W4A8's in the SM90 fold of [E, rows,
    // cols / 128] (interleave_moe_scales_for_sm90_mixed_gemm(group_size=128)), weight-only
    // INT4's [E, K / 128, N] for the SM80 fpA_intB GEMM (group size 128, the binding's
    // int4_group_size; the kernel takes 128 or K, and H, I are multiples of 128).
    const DType sdt = input.dtype();
    const int64_t n1 = E * N1 * (H / 128), n2 = E * H * (I / 128);
    if (w4a8) {
      // The zeros: the folded-scale mainloop has no zero point ("does not support zero-point").
      for (size_t i : {size_t{4}, size_t{5}}) {
        FLASHINFER_CHECK_CODE(qs.size() != 8 || !qs[i].defined() || qs[i].numel() == 0,
                              ErrorCode::kUnsupported, kMoeCutlassFp4Op, "quant_scales",
                              "quant_scales[", i,
                              "] must be empty: W4A8's folded-scale GEMM has no zero point");
      }
    }
    // W4A8: without act scales upstream's GEMM1 reads an unwritten fp8 buffer (use_awq off),
    // without alphas its alpha pointers are null, so both are required. Weight-only INT4: act
    // scales (AWQ, applied only when both are given, as use_awq), zeros and alphas (not read)
    // are optional.
    const std::array<bool, 8> optional = {false, false, woq, woq, true, true, woq, woq};
    check_int4_quant_scales(qs, mode_name(mode), {n1, n2, H, I, n1, n2, E, E},
                            {sdt, sdt, sdt, sdt, sdt, sdt, DType::kFloat32, DType::kFloat32},
                            optional, dev);
    auto ptr16 = [&](size_t i) {
      return qs[i].defined() && qs[i].numel() > 0 ? static_cast<const uint16_t*>(qs[i].data_ptr())
                                                  : nullptr;
    };
    p.w1_sf = static_cast<const uint8_t*>(qs[0].data_ptr());
    p.w2_sf = static_cast<const uint8_t*>(qs[1].data_ptr());
    if (ptr16(2) != nullptr && ptr16(3) != nullptr) {
      p.fc1_prequant = ptr16(2);
      p.fc2_prequant = ptr16(3);
    }
    if (w4a8) {
      p.fc1_global = qs[6].data<float>();
      p.fc2_global = qs[7].data<float>();
    } else {
      p.w1_zeros = ptr16(4);
      p.w2_zeros = ptr16(5);
    }
    p.w1_sf_stride = n1 / E * 2;
    p.w2_sf_stride = n2 / E * 2;
  } else {
    FLASHINFER_CHECK(qs.size() == 2, kMoeCutlassFp4Op, "quant_scales",
                     "W4A16 takes 2 tensors (fc1_weight_scales, fc2_weight_scales), got ",
                     qs.size());
    // Upstream reads them as raw bytes (the SM90 fold of ue8m0 [E, rows, k / 32] scales,
    // usually viewed as int32): any dtype with exactly that many bytes.
    const int64_t bytes[2] = {E * N1 * (H / 32), E * H * (I / 32)};
    const uint8_t* ptr[2] = {nullptr, nullptr};
    for (size_t i = 0; i < 2; ++i) {
      const Tensor& t = qs[i];
      const int64_t nb = t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : -1;
      FLASHINFER_CHECK(nb == bytes[i] && t.device() == dev && t.is_contiguous(), kMoeCutlassFp4Op,
                       "quant_scales", "quant_scales[", i, "] (fc", i + 1,
                       "_weight_scales) must be ", bytes[i],
                       " contiguous bytes on input's device (", dev.str(),
                       "): interleave_moe_scales_for_sm90_mixed_gemm of the ue8m0 scales; got ", nb,
                       " bytes on ", t.defined() ? t.device().str() : "no device");
      ptr[i] = static_cast<const uint8_t*>(t.data_ptr());
    }
    FLASHINFER_CHECK(N1 % 64 == 0, kMoeCutlassFp4Op, "fc1_expert_weights",
                     "the SM90 scale fold needs the fc1 rows (", N1, ") to be a multiple of 64");
    p.w1_sf = ptr[0];
    p.w2_sf = ptr[1];
    p.w1_sf_stride = N1 * (H / 32);
    p.w2_sf_stride = H * (I / 32);
  }

  Tensor out;
  if (c.output) {
    check_defined(*c.output, kMoeCutlassFp4Op, "output");
    check_shape_eq(*c.output, {T, H}, kMoeCutlassFp4Op, "output");
    FLASHINFER_CHECK(c.output->dtype() == c.output_dtype, kMoeCutlassFp4Op, "output", "dtype ",
                     dtype_torch_name(c.output->dtype()), " is not output_dtype ",
                     dtype_torch_name(c.output_dtype));
    check_same_device(*c.output, input, kMoeCutlassFp4Op, "output", "input");
    FLASHINFER_CHECK(c.output->stride(1) == 1 || H <= 1, kMoeCutlassFp4Op, "output",
                     "the last dimension must be contiguous");
    check_writable(*c.output, kMoeCutlassFp4Op, "output");
    check_no_overlap(*c.output, input, kMoeCutlassFp4Op, "output", "input");
    out = *c.output;
  } else {
    out = Tensor::empty({T, H}, c.output_dtype, input.device());
  }

  kernels::CutlassMoeParams& m = p.moe;
  m.input = input.data_ptr();
  m.in_stride = input.stride(0);
  m.experts = c.ids.data_ptr();
  m.experts_dtype = c.ids.dtype();
  m.experts_stride = c.ids.stride(0);
  m.scales = c.scales.data_ptr();
  m.scales_dtype = c.scales.dtype();
  m.scales_stride = c.scales.stride(0);
  m.w1 = w1.data_ptr();
  m.w2 = w2.data_ptr();
  m.b1 = c.b1 ? c.b1->data_ptr() : nullptr;
  // The finalize adds fc2's bias on tensor-parallel rank 0 only (finalizeMoeRoutingKernelLauncher).
  m.b2 = c.b2 && c.tp_rank == 0 ? c.b2->data_ptr() : nullptr;
  m.swiglu_alpha = moe_cutlass_fp4_expert_vector(c.swiglu_alpha, E, dev, "swiglu_alpha");
  m.swiglu_beta = moe_cutlass_fp4_expert_vector(c.swiglu_beta, E, dev, "swiglu_beta");
  m.swiglu_limit = moe_cutlass_fp4_expert_vector(c.swiglu_limit, E, dev, "swiglu_limit");
  m.situ_beta = moe_cutlass_fp4_expert_vector(c.options.situ_beta, E, dev, "situ_beta");
  m.situ_linear_beta =
      moe_cutlass_fp4_expert_vector(c.options.situ_linear_beta, E, dev, "situ_linear_beta");
  m.out = out.data_ptr();
  m.out_stride = out.stride(0);
  m.dtype = gemm_dt;
  m.out_dtype = c.output_dtype;
  m.num_tokens = T;
  m.top_k = K;
  m.hidden = H;
  m.inter = I;
  m.num_local_experts = E;
  m.expert_offset = c.ep_rank * E;
  m.ep_size = c.ep_size;
  m.act = static_cast<kernels::MoeAct>(c.activation_type);
  launch(kCutlassFp4Kernels, p, input.device(), kMoeCutlassFp4Op, "input", c.enable_pdl);
  return {out, Tensor::zeros({1}, DType::kInt32, input.device()),
          Tensor::zeros({E, T}, DType::kFloat32, input.device()),
          Tensor::zeros({E}, DType::kInt32, input.device())};
}

BenchCase bench_cutlass_fused_moe_fp4(const BenchShape& s, Device dev) {
  const int64_t T = s.m, H = s.hidden_size, I = s.n, E = 8, K = 2;
  FLASHINFER_CHECK(H % 16 == 0 && I % 16 == 0, "bench", "hidden_size",
                   "the NVFP4 case needs hidden_size and n to be multiples of 16, got ", H, " and ",
                   I);
  uint64_t state = s.random_seed * 2654435761u + 1;
  auto bytes = [&](const Shape& shape, DType dt, uint8_t lo, uint8_t span) {
    Tensor t = Tensor::empty(shape, dt);
    auto* b = static_cast<uint8_t*>(t.data_ptr());
    for (int64_t i = 0; i < t.numel() * static_cast<int64_t>(t.element_size()); ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      b[i] = static_cast<uint8_t>(lo + (state >> 33) % span);
    }
    return t.to(dev);
  };
  // e4m3 scale codes: 0x30.. (0.5 to 0.94) for the input, 0x20.. (0.125 to 0.23) for weights.
  const Shape s1{E, moe_cutlass_fp4_round_up(2 * I, 128), moe_cutlass_fp4_round_up(H / 16, 4) / 4};
  const Shape s2{E, moe_cutlass_fp4_round_up(H, 128), moe_cutlass_fp4_round_up(I / 16, 4) / 4};
  auto f32 = [&](const Shape& shape, double v) {
    return Value(Tensor::full(shape, v, DType::kFloat32).to(dev));
  };
  const DType out_dt = s.out_dtype.value_or(DType::kBFloat16);
  BenchCase c = bench::invoke_case(
      "cutlass_fused_moe",
      {Value(bytes({T, H / 2}, DType::kUInt8, 0, 255)), Value(bench::moe_top2_ids(T, E, dev)),
       Value(bench::random_tensor({T, K}, DType::kFloat32, dev, s.random_seed + 1, 0.0, 1.0)),
       Value(bytes({E, 2 * I, H / 16}, DType::kInt64, 0, 255)),
       Value(bytes({E, H, I / 16}, DType::kInt64, 0, 255)), Value(out_dt),
       Value::list({f32({}, 1.0), Value(bytes(s1, DType::kInt32, 0x20, 8)), f32({E}, 1.0 / 16),
                    f32({}, 1.0), Value(bytes(s2, DType::kInt32, 0x20, 8)), f32({E}, 1.0 / 16)})},
      {{"input_sf",
        Value(bytes({moe_cutlass_fp4_round_up(T, 128) * moe_cutlass_fp4_round_up(H / 16, 4)},
                    DType::kUInt8, 0x30, 8))}});
  const double rows = static_cast<double>(T * K);
  c.flops = 2.0 * rows * H * (2 * I) + 2.0 * rows * I * H;
  c.bytes = bench::nbytes({T, H / 2}, DType::kUInt8) + bench::nbytes({T, H}, out_dt) +
            bench::nbytes({E, 2 * I, H / 2}, DType::kUInt8) +
            bench::nbytes({E, H, I / 2}, DType::kUInt8);
  return c;
}

BenchCase bench_cutlass_fused_moe_w4a16(const BenchShape& s, Device dev) {
  const int64_t T = s.m, H = s.hidden_size, I = s.n, E = 8, K = 2;
  const DType dt = s.input_dtype;
  FLASHINFER_CHECK(dt == DType::kBFloat16 || dt == DType::kFloat16, "bench", "input_dtype",
                   "the W4A16 case takes bfloat16 or float16 activations, got ",
                   dtype_torch_name(dt));
  FLASHINFER_CHECK(H % 128 == 0 && I % 128 == 0, "bench", "hidden_size",
                   "the W4A16 case needs hidden_size and n in multiples of 128, got ", H, " and ",
                   I);
  uint64_t state = s.random_seed * 2654435761u + 7;
  auto bytes = [&](const Shape& shape, uint8_t lo, uint8_t span) {
    Tensor t = Tensor::empty(shape, DType::kUInt8);
    auto* b = static_cast<uint8_t*>(t.data_ptr());
    for (int64_t i = 0; i < t.numel(); ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      b[i] = static_cast<uint8_t>(lo + (state >> 33) % span);
    }
    return t;
  };
  // Weights prepared on the CPU as an engine does once at load; ue8m0 scales 2^-7 .. 2^-4.
  const Tensor w1 =
      interleave_moe_weights_for_sm90_mixed_gemm(bytes({E, 2 * I, H / 2}, 0, 255), "fp4");
  const Tensor w2 = interleave_moe_weights_for_sm90_mixed_gemm(bytes({E, H, I / 2}, 0, 255), "fp4");
  const Tensor s1 = interleave_moe_scales_for_sm90_mixed_gemm(bytes({E, 2 * I, H / 32}, 120, 4));
  const Tensor s2 = interleave_moe_scales_for_sm90_mixed_gemm(bytes({E, H, I / 32}, 120, 4));
  auto per_expert = [&](double v) { return Value(Tensor::full({E}, v, DType::kFloat32).to(dev)); };
  BenchCase c = bench::invoke_case(
      "cutlass_fused_moe",
      {Value(bench::random_tensor({T, H}, dt, dev, s.random_seed, -1.0, 1.0)),
       Value(bench::moe_top2_ids(T, E, dev)),
       Value(bench::random_tensor({T, K}, DType::kFloat32, dev, s.random_seed + 1, 0.0, 1.0)),
       Value(w1.to(dev)), Value(w2.to(dev)), Value(dt),
       Value::list({Value(s1.to(dev)), Value(s2.to(dev))})},
      {{"swiglu_alpha", per_expert(1.702)},
       {"swiglu_beta", per_expert(1.0)},
       {"swiglu_limit", per_expert(7.0)},
       {"use_w4_group_scaling", Value(true)}});
  const double rows = static_cast<double>(T * K);
  c.flops = 2.0 * rows * H * (2 * I) + 2.0 * rows * I * H;
  c.bytes = bench::nbytes({T, H}, dt) * 2 + bench::nbytes({E, 2 * I, H / 2}, DType::kUInt8) +
            bench::nbytes({E, H, I / 2}, DType::kUInt8) +
            static_cast<double>(E * 3 * I * (H / 32));  // the ue8m0 scales
  return c;
}

}  // namespace flashinfer::api
