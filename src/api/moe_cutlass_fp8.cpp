// cutlass_fused_moe's FP8 paths: FP8 per tensor (e4m3 input and weights, four scales) and
// DeepSeek FP8 block scale (bf16 input, 128x128-scaled e4m3 weights). Argument checks as
// upstream's binding makes them, then the CPU reference or the CUDA kernels (the CPU's rounding
// points; block scale on sm90 only, as upstream). Semantics and sources:
// docs/MOE.md, "cutlass_fused_moe: FP8 paths".
#include "api/moe_cutlass_fp8.h"

#include <string>
#include <tuple>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "kernels/cpu/moe_cutlass_fp8_cpu.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/moe_cuda.h"
#endif

namespace flashinfer::api {
namespace {

constexpr const char* kMoeCutlassFp8Op = "cutlass_fused_moe";
constexpr int64_t kBlock = 128;

constexpr KernelEntry<kernels::CutlassMoeFp8Params> kCutlassMoeFp8Kernels[] = {
    {DeviceType::kCPU,
     "CPU reference: FP8 per-tensor / DeepSeek block-scale grouped GEMMs (routed rows only)",
     nullptr,
     [](const kernels::CutlassMoeFp8Params& p, const LaunchContext&) {
       kernels::cpu::cutlass_moe_fp8(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA: batches of >= 2 pairs per local expert on the tensor-core grouped GEMM (e4m3 "
     "operands; per tensor: per-expert alpha; block scale, sm90 only: each 128-wide K block "
     "promoted with its scales); otherwise one block per (token, expert) pair, warp dot products "
     "on the e4m3 codes",
     nullptr,
     [](const kernels::CutlassMoeFp8Params& p, const LaunchContext& c) {
       kernels::cuda::cutlass_moe_fp8(p, c.stream, c.enable_pdl);
     }},
#endif
};

void refuse(bool flag, const char* arg, const char* why) {
  if (flag) FLASHINFER_FAIL(ErrorCode::kUnsupported, kMoeCutlassFp8Op, arg, why);
}

void moe_cutlass_fp8_check_unit_last_stride(const Tensor& t, const char* arg) {
  FLASHINFER_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, kMoeCutlassFp8Op, arg,
                   "the last dimension must be contiguous (stride 1), got stride ", t.stride(-1));
}

const float* moe_cutlass_fp8_expert_vector(const std::optional<Tensor>& t, int64_t experts,
                                           const Tensor& input, const char* arg) {
  if (!t) return nullptr;
  check_defined(*t, kMoeCutlassFp8Op, arg);
  check_dtype_in(*t, {DType::kFloat32}, kMoeCutlassFp8Op, arg);
  check_shape_eq(*t, {experts}, kMoeCutlassFp8Op, arg);
  check_same_device(*t, input, kMoeCutlassFp8Op, arg, "input");
  FLASHINFER_CHECK(t->stride(0) == 1 || experts <= 1, kMoeCutlassFp8Op, arg, "must be contiguous");
  return t->data<float>();
}

// quant_scales[i]: defined, fp32, contiguous, on input's device, of rank `rank` (-1: 0 or 1).
const Tensor& scale_at(const std::vector<Tensor>& qs, std::size_t i, const char* what, int rank,
                       const Tensor& input) {
  const Tensor& t = qs[i];
  FLASHINFER_CHECK(t.defined(), kMoeCutlassFp8Op, "quant_scales", "quant_scales[", i, "] (", what,
                   ") is undefined");
  FLASHINFER_CHECK(t.dtype() == DType::kFloat32, kMoeCutlassFp8Op, "quant_scales", "quant_scales[",
                   i, "] (", what, ") must be torch.float32, got ", dtype_torch_name(t.dtype()));
  FLASHINFER_CHECK(rank < 0 ? t.dim() <= 1 : t.dim() == rank, kMoeCutlassFp8Op, "quant_scales",
                   "quant_scales[", i, "] (", what, ") must have ",
                   rank < 0 ? std::string("0 or 1") : std::to_string(rank),
                   " dimensions, got shape ", shape_to_string(t.shape()));
  FLASHINFER_CHECK(t.is_contiguous(), kMoeCutlassFp8Op, "quant_scales", "quant_scales[", i, "] (",
                   what, ") must be contiguous");
  FLASHINFER_CHECK(t.device() == input.device(), kMoeCutlassFp8Op, "quant_scales", "quant_scales[",
                   i, "] (", what, ") must be on input's device");
  return t;
}

}  // namespace

bool cutlass_fused_moe_is_fp8(const Tensor& input, const Tensor& fc1_expert_weights,
                              bool use_deepseek_fp8_block_scale, bool use_mxfp8_act_scaling) {
  if (use_deepseek_fp8_block_scale) return true;
  return !use_mxfp8_act_scaling && input.defined() && fc1_expert_weights.defined() &&
         input.dtype() == DType::kFloat8E4M3FN &&
         fc1_expert_weights.dtype() == DType::kFloat8E4M3FN;
}

std::vector<Tensor> cutlass_fused_moe_fp8(const CutlassMoeCall& c) {
  const Tensor &input = c.input, &ids = c.ids, &scales = c.scales, &w1 = c.w1, &w2 = c.w2;
  const std::optional<Tensor>&b1 = c.b1, &b2 = c.b2, &output = c.output;
  const std::vector<Tensor>& quant_scales = c.quant_scales;
  const DType output_dtype = c.output_dtype;
  const ActivationType activation_type = c.activation_type;
  const bool block = c.use_deepseek_fp8_block_scale;
  // Upstream's runner picks one quantization; these flags select other (non-FP8) paths.
  refuse(c.use_mxfp8_act_scaling, "use_mxfp8_act_scaling",
         "use_mxfp8_act_scaling with use_deepseek_fp8_block_scale is not an FP8 block-scale call");
  // Upstream's runner is chosen from the dtypes; with e4m3 weights these two flags select
  // nothing (isInt4Quant / isWFP4A16Quant need uint8 weights) and are ignored.
  refuse(c.use_wfp4afp8_humming, "use_wfp4afp8_humming",
         "the MXFP4 x FP8 path needs MXFP4 weights, not FP8");
  if (block && (!w1.defined() || w1.dtype() != DType::kFloat8E4M3FN)) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, kMoeCutlassFp8Op, "use_deepseek_fp8_block_scale",
                    "the FP8 block-scale path takes e4m3 fc1/fc2 weights (with 128x128 block "
                    "scales), got ",
                    w1.defined() ? dtype_torch_name(w1.dtype()) : "an undefined tensor");
  }
  refuse(c.input_sf.has_value(), "input_sf",
         "input_sf carries block scales of MXFP8 / NVFP4 inputs; the FP8 paths take none");

  // Dtypes: per tensor e4m3 x e4m3 -> fp16 / bf16; block scale bf16 x e4m3 -> bf16 (upstream's
  // FusedMoeRunner constructor and getDeepSeekBlockScaleGemmRunner).
  check_dim(input, {2}, kMoeCutlassFp8Op, "input");
  if (block) {
    FLASHINFER_CHECK(input.dtype() == DType::kBFloat16, kMoeCutlassFp8Op, "input",
                     "the FP8 block-scale path takes bf16 input (quantized 1x128 inside), got ",
                     dtype_torch_name(input.dtype()));
    FLASHINFER_CHECK(output_dtype == DType::kBFloat16, kMoeCutlassFp8Op, "output_dtype",
                     "the FP8 block-scale path writes bf16, got ", dtype_torch_name(output_dtype));
  } else {
    FLASHINFER_CHECK(output_dtype == DType::kFloat16 || output_dtype == DType::kBFloat16,
                     kMoeCutlassFp8Op, "output_dtype",
                     "FP8 per-tensor MoE writes torch.float16 or torch.bfloat16, got ",
                     dtype_torch_name(output_dtype));
  }
  moe_cutlass_fp8_check_unit_last_stride(input, "input");
  const int64_t T = input.size(0), H = input.size(1);
  FLASHINFER_CHECK(H > 0, kMoeCutlassFp8Op, "input", "hidden size must be positive");
  const int64_t K = check_cutlass_moe_routing(c, T);

  check_dim(w2, {3}, kMoeCutlassFp8Op, "fc2_expert_weights");
  check_dtype_in(w2, {DType::kFloat8E4M3FN}, kMoeCutlassFp8Op, "fc2_expert_weights");
  check_same_device(w2, input, kMoeCutlassFp8Op, "fc2_expert_weights", "input");
  FLASHINFER_CHECK(w2.is_contiguous(), kMoeCutlassFp8Op, "fc2_expert_weights",
                   "must be contiguous");
  const int64_t E = w2.size(0), I = w2.size(2);
  FLASHINFER_CHECK(E >= 1 && I >= 1, kMoeCutlassFp8Op, "fc2_expert_weights",
                   "empty expert weights, shape ", shape_to_string(w2.shape()));
  FLASHINFER_CHECK(w2.size(1) == H, kMoeCutlassFp8Op, "fc2_expert_weights",
                   "expected [num_experts, ", H, ", inter], got ", shape_to_string(w2.shape()));
  const bool gated = kernels::moe_act_is_gated(static_cast<kernels::MoeAct>(activation_type));
  const int64_t N1 = gated ? 2 * I : I;
  check_dtype_in(w1, {DType::kFloat8E4M3FN}, kMoeCutlassFp8Op, "fc1_expert_weights");
  check_same_device(w1, input, kMoeCutlassFp8Op, "fc1_expert_weights", "input");
  FLASHINFER_CHECK(w1.is_contiguous(), kMoeCutlassFp8Op, "fc1_expert_weights",
                   "must be contiguous");
  FLASHINFER_CHECK(w1.shape() == Shape({E, N1, H}), kMoeCutlassFp8Op, "fc1_expert_weights",
                   "expected [", E, ", ", N1, ", ", H, "] (", gated ? "gated: 2 * " : "",
                   "inter from fc2 = ", I, "), got ", shape_to_string(w1.shape()));
  // Biases are of the output dtype (upstream: CHECK_INPUT_TYPE(..., mOutputDtype)).
  for (const auto& [bias, arg, n] :
       {std::tuple{&b1, "fc1_expert_biases", N1}, std::tuple{&b2, "fc2_expert_biases", H}}) {
    if (!*bias) continue;
    check_defined(**bias, kMoeCutlassFp8Op, arg);
    FLASHINFER_CHECK((*bias)->dtype() == output_dtype, kMoeCutlassFp8Op, arg, "dtype ",
                     dtype_torch_name((*bias)->dtype()), " must be output_dtype ",
                     dtype_torch_name(output_dtype));
    check_same_device(**bias, input, kMoeCutlassFp8Op, arg, "input");
    check_shape_eq(**bias, {E, n}, kMoeCutlassFp8Op, arg);
    FLASHINFER_CHECK((*bias)->is_contiguous(), kMoeCutlassFp8Op, arg, "must be contiguous");
  }
  check_cutlass_moe_swiglu_args(c);

  kernels::CutlassMoeFp8Params fp;
  fp.block_scale = block;
  // quant_scales, in upstream's order (getQuantParams of the binding).
  if (block) {
    FLASHINFER_CHECK(quant_scales.size() == 2, kMoeCutlassFp8Op, "quant_scales",
                     "the FP8 block-scale path takes 2 scales [fc1 block scales, fc2 block "
                     "scales], got ",
                     quant_scales.size());
    const auto cdiv = [](int64_t a) { return (a + kBlock - 1) / kBlock; };
    const Tensor& s1 = scale_at(quant_scales, 0, "fc1 128x128 block scales", 3, input);
    FLASHINFER_CHECK(s1.shape() == Shape({E, cdiv(N1), cdiv(H)}), kMoeCutlassFp8Op, "quant_scales",
                     "quant_scales[0] (fc1 block scales) must be [", E, ", ", cdiv(N1), ", ",
                     cdiv(H), "], got ", shape_to_string(s1.shape()));
    const Tensor& s2 = scale_at(quant_scales, 1, "fc2 128x128 block scales", 3, input);
    FLASHINFER_CHECK(s2.shape() == Shape({E, cdiv(H), cdiv(I)}), kMoeCutlassFp8Op, "quant_scales",
                     "quant_scales[1] (fc2 block scales) must be [", E, ", ", cdiv(H), ", ",
                     cdiv(I), "], got ", shape_to_string(s2.shape()));
    fp.w1_block_scale = s1.data<float>();
    fp.w2_block_scale = s2.data<float>();
  } else {
    FLASHINFER_CHECK(quant_scales.size() == 4, kMoeCutlassFp8Op, "quant_scales",
                     "FP8 per-tensor MoE takes 4 scales [fc1_dequant, fc2_quant, fc2_dequant, "
                     "fc1_input_dequant], got ",
                     quant_scales.size());
    const Tensor& d1 = scale_at(quant_scales, 0, "fc1_dequant", 1, input);
    FLASHINFER_CHECK(d1.size(0) == E, kMoeCutlassFp8Op, "quant_scales",
                     "quant_scales[0] (fc1_dequant) must be [num_experts_on_rank = ", E, "], got ",
                     shape_to_string(d1.shape()));
    const Tensor& q2 = scale_at(quant_scales, 1, "fc2_quant", -1, input);
    FLASHINFER_CHECK(q2.dim() == 0 || q2.size(0) == E, kMoeCutlassFp8Op, "quant_scales",
                     "quant_scales[1] (fc2_quant) must be a scalar or [num_experts_on_rank = ", E,
                     "], got ", shape_to_string(q2.shape()));
    const Tensor& d2 = scale_at(quant_scales, 2, "fc2_dequant", 1, input);
    FLASHINFER_CHECK(d2.size(0) == E, kMoeCutlassFp8Op, "quant_scales",
                     "quant_scales[2] (fc2_dequant) must be [num_experts_on_rank = ", E, "], got ",
                     shape_to_string(d2.shape()));
    (void)scale_at(quant_scales, 3, "fc1_input_dequant", 0, input);
    fp.fc1_dequant = d1.data<float>();
    fp.fc2_quant = q2.data<float>();
    fp.fc2_quant_per_expert = q2.dim() == 1;
    fp.fc2_dequant = d2.data<float>();
  }

  Tensor out;
  if (output) {
    check_defined(*output, kMoeCutlassFp8Op, "output");
    check_shape_eq(*output, {T, H}, kMoeCutlassFp8Op, "output");
    FLASHINFER_CHECK(output->dtype() == output_dtype, kMoeCutlassFp8Op, "output", "dtype ",
                     dtype_torch_name(output->dtype()), " is not output_dtype ",
                     dtype_torch_name(output_dtype));
    check_same_device(*output, input, kMoeCutlassFp8Op, "output", "input");
    moe_cutlass_fp8_check_unit_last_stride(*output, "output");
    check_writable(*output, kMoeCutlassFp8Op, "output");
    check_no_overlap(*output, input, kMoeCutlassFp8Op, "output", "input");
    out = *output;
  } else {
    out = Tensor::empty({T, H}, output_dtype, input.device());
  }

  kernels::CutlassMoeParams& p = fp.base;
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
  fp.bias_dtype = output_dtype;
  p.swiglu_alpha = moe_cutlass_fp8_expert_vector(c.swiglu_alpha, E, input, "swiglu_alpha");
  p.swiglu_beta = moe_cutlass_fp8_expert_vector(c.swiglu_beta, E, input, "swiglu_beta");
  p.swiglu_limit = moe_cutlass_fp8_expert_vector(c.swiglu_limit, E, input, "swiglu_limit");
  p.situ_beta = moe_cutlass_fp8_expert_vector(c.options.situ_beta, E, input, "situ_beta");
  p.situ_linear_beta =
      moe_cutlass_fp8_expert_vector(c.options.situ_linear_beta, E, input, "situ_linear_beta");
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
  p.ep_size = c.ep_size;  // the CUDA route choice
  p.act = static_cast<kernels::MoeAct>(activation_type);
  launch(kCutlassMoeFp8Kernels, fp, input.device(), kMoeCutlassFp8Op, "input", c.enable_pdl);
  // Upstream's three scratch outputs (written only in min-latency mode): zero here.
  return {out, Tensor::zeros({1}, DType::kInt32, input.device()),
          Tensor::zeros({E, T}, DType::kFloat32, input.device()),
          Tensor::zeros({E}, DType::kInt32, input.device())};
}

BenchCase bench_cutlass_fused_moe_fp8(const BenchShape& s, Device dev) {
  const int64_t T = s.m, H = s.hidden_size, I = s.n, E = 8, K = 2;
  const DType f8 = DType::kFloat8E4M3FN, out = s.out_dtype.value_or(DType::kBFloat16);
  using bench::random_tensor;
  const uint64_t seed = s.random_seed;
  // Scales of an fp8 checkpoint's order of magnitude; the values only need to stay finite.
  std::vector<Value> qs = {Value(random_tensor({E}, DType::kFloat32, dev, seed + 4, 0.01, 0.02)),
                           Value(random_tensor({}, DType::kFloat32, dev, seed + 5, 8.0, 16.0)),
                           Value(random_tensor({E}, DType::kFloat32, dev, seed + 6, 0.001, 0.002)),
                           Value(random_tensor({}, DType::kFloat32, dev, seed + 7, 0.01, 0.02))};
  BenchCase c = bench::invoke_case(
      "cutlass_fused_moe", {Value(random_tensor({T, H}, f8, dev, seed, -4.0, 4.0)),
                            Value(bench::moe_top2_ids(T, E, dev)),
                            Value(random_tensor({T, K}, DType::kFloat32, dev, seed + 1, 0.0, 1.0)),
                            Value(random_tensor({E, 2 * I, H}, f8, dev, seed + 2, -2.0, 2.0)),
                            Value(random_tensor({E, H, I}, f8, dev, seed + 3, -2.0, 2.0)),
                            Value(out), Value::list(std::move(qs))});
  const double rows = static_cast<double>(T * K);
  c.flops = 2.0 * rows * H * (2 * I) + 2.0 * rows * I * H;
  c.bytes = bench::nbytes({T, H}, f8) + bench::nbytes({T, H}, out) +
            bench::nbytes({E, 2 * I, H}, f8) + bench::nbytes({E, H, I}, f8);
  return c;
}

BenchCase bench_cutlass_fused_moe_fp8_block(const BenchShape& s, Device dev) {
  const int64_t T = s.m, H = s.hidden_size, I = s.n, E = 8, K = 2;
  const DType f8 = DType::kFloat8E4M3FN;
  const auto cdiv = [](int64_t a) { return (a + kBlock - 1) / kBlock; };
  using bench::random_tensor;
  const uint64_t seed = s.random_seed;
  // Block scales of a checkpoint's order of magnitude; the values only need to stay finite.
  std::vector<Value> qs = {
      Value(random_tensor({E, cdiv(2 * I), cdiv(H)}, DType::kFloat32, dev, seed + 4, 0.001, 0.002)),
      Value(random_tensor({E, cdiv(H), cdiv(I)}, DType::kFloat32, dev, seed + 5, 0.001, 0.002))};
  BenchCase c =
      bench::invoke_case("cutlass_fused_moe",
                         {Value(random_tensor({T, H}, DType::kBFloat16, dev, seed, -4.0, 4.0)),
                          Value(bench::moe_top2_ids(T, E, dev)),
                          Value(random_tensor({T, K}, DType::kFloat32, dev, seed + 1, 0.0, 1.0)),
                          Value(random_tensor({E, 2 * I, H}, f8, dev, seed + 2, -2.0, 2.0)),
                          Value(random_tensor({E, H, I}, f8, dev, seed + 3, -2.0, 2.0)),
                          Value(DType::kBFloat16), Value::list(std::move(qs))},
                         {{"use_deepseek_fp8_block_scale", Value(true)}});
  const double rows = static_cast<double>(T * K);
  c.flops = 2.0 * rows * H * (2 * I) + 2.0 * rows * I * H;
  c.bytes = bench::nbytes({T, H}, DType::kBFloat16) * 2 + bench::nbytes({E, 2 * I, H}, f8) +
            bench::nbytes({E, H, I}, f8);
  return c;
}

}  // namespace flashinfer::api
