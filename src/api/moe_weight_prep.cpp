// SM90 mixed-input MoE weight preparation (flashinfer.fused_moe.prepare): declarations,
// argument checks, dispatch. Each op has a CPU reference and a bit-exact CUDA kernel.
// Semantics and sources: docs/MOE.md.
#include "flashinfer/ops/moe_weight_prep.h"

#include <cstring>
#include <string>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/moe_weight_prep_cpu.h"
#include "kernels/moe_weight_prep_rules.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/moe_weight_prep_cuda.h"
#endif

namespace flashinfer {

template <>
struct ReturnName<std::tuple<Tensor, Tensor, Tensor>> {
  static constexpr const char* value = "tuple[Tensor, Tensor, Tensor]";
};

namespace {

constexpr const char* kMoeWeightPrepModule = "flashinfer.fused_moe.prepare";

constexpr api::KernelEntry<kernels::Sm90WeightInterleaveParams> kWeightKernels[] = {
    {DeviceType::kCPU, "CPU reference: upstream's byte/bit interleave, per destination group",
     nullptr,
     [](const kernels::Sm90WeightInterleaveParams& p, const api::LaunchContext&) {
       kernels::cpu::sm90_interleave_weights(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: the CPU's loop body, one thread per (row pair, lane)",
     nullptr,
     [](const kernels::Sm90WeightInterleaveParams& p, const api::LaunchContext& c) {
       kernels::cuda::sm90_interleave_weights(p, c.stream);
     }},
#endif
};
constexpr api::KernelEntry<kernels::Sm90ScaleInterleaveParams> kScaleKernels[] = {
    {DeviceType::kCPU, "CPU reference: the folded reshape/permute, element copies", nullptr,
     [](const kernels::Sm90ScaleInterleaveParams& p, const api::LaunchContext&) {
       kernels::cpu::sm90_interleave_scales(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one thread per output element", nullptr,
     [](const kernels::Sm90ScaleInterleaveParams& p, const api::LaunchContext& c) {
       kernels::cuda::sm90_interleave_scales(p, c.stream);
     }},
#endif
};
constexpr api::KernelEntry<kernels::HummingPrepParams> kHummingKernels[] = {
    {DeviceType::kCPU, "CPU reference: per-expert E8M0 range clamp and FP4 payload rewrite",
     nullptr,
     [](const kernels::HummingPrepParams& p, const api::LaunchContext&) {
       kernels::cpu::humming_prepare(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernels: per-expert scale range (one block per expert), then one thread per "
     "32-element block through the CPU's rewrite table",
     nullptr,
     [](const kernels::HummingPrepParams& p, const api::LaunchContext& c) {
       kernels::cuda::humming_prepare(p, c.stream);
     }},
#endif
};

Tensor interleave_scales_impl(const Tensor& scales, int64_t group_size, const char* op,
                              const char* arg) {
  api::check_defined(scales, op, arg);
  FLASHINFER_CHECK(scales.dim() == 3, op, arg, "must be 3D (num_experts, rows, K/group_size), got ",
                   shape_to_string(scales.shape()));
  FLASHINFER_CHECK(group_size > 0 && 128 % group_size == 0, op, "group_size",
                   "must be positive and divide 128, got ", group_size);
  const int64_t G = 128 / group_size;
  const int64_t bits = static_cast<int64_t>(scales.element_size()) * 8;
  FLASHINFER_CHECK(128 % bits == 0, op, arg, "dtype ", dtype_torch_name(scales.dtype()),
                   " has an unsupported element size of ", bits, " bits");
  const int64_t cols = 128 / bits;
  FLASHINFER_CHECK(cols % G == 0, op, "group_size", "dtype ", dtype_torch_name(scales.dtype()),
                   " and group_size=", group_size, " do not form an integer folded M slice");
  const int64_t ms = cols / G;
  FLASHINFER_CHECK(64 % ms == 0, op, "group_size", "folded M slices ", ms,
                   " must divide the logical M64 block");
  const int64_t E = scales.size(0), rows = scales.size(1), kg = scales.size(2);
  FLASHINFER_CHECK(rows % 64 == 0, op, arg, "rows=", rows, " must be divisible by 64");
  FLASHINFER_CHECK(kg % G == 0, op, arg, "K/group_size=", kg,
                   " must be divisible by the scale groups per K128 block (", G, ")");
  const Tensor in = scales.contiguous();
  Tensor out =
      Tensor::empty({E, rows / 64, kg / G, 64 / ms, cols}, scales.dtype(), scales.device());
  kernels::Sm90ScaleInterleaveParams p;
  p.in = static_cast<const uint8_t*>(in.data_ptr());
  p.out = static_cast<uint8_t*>(out.data_ptr());
  p.experts = E;
  p.rows = rows;
  p.k_groups = kg;
  p.groups_per_k128 = G;
  p.m_slices = ms;
  p.folded_m = 64 / ms;
  p.element_size = scales.element_size();
  api::launch(kScaleKernels, p, scales.device(), op, arg);
  return out;
}

Tensor interleave_weights_impl(const Tensor& weight, kernels::Sm90QuantType qt, const char* op,
                               const char* arg) {
  api::check_defined(weight, op, arg);
  FLASHINFER_CHECK(weight.dim() == 3, op, arg, "must be 3D (num_experts, n, k/2), got ",
                   shape_to_string(weight.shape()));
  FLASHINFER_CHECK(weight.dtype() == DType::kUInt8, op, arg, "must be uint8 (packed 4-bit), got ",
                   dtype_torch_name(weight.dtype()));
  const int64_t E = weight.size(0), n = weight.size(1), k = weight.size(2) * 2;
  FLASHINFER_CHECK(n % 16 == 0, op, arg, "n dimension must be divisible by 16, got ", n);
  FLASHINFER_CHECK(k % 64 == 0, op, arg,
                   "logical K dimension (2 * size(2)) must be divisible by 64, got ", k);
  const Tensor in = weight.contiguous();
  Tensor out = Tensor::empty(weight.shape(), DType::kUInt8, weight.device());
  kernels::Sm90WeightInterleaveParams p;
  p.in = static_cast<const uint8_t*>(in.data_ptr());
  p.out = static_cast<uint8_t*>(out.data_ptr());
  p.experts = E;
  p.n = n;
  p.k = k;
  p.quant_type = qt;
  api::launch(kWeightKernels, p, weight.device(), op, arg);
  return out;
}

kernels::Sm90QuantType moe_weight_prep_parse_quant_type(std::string_view q, const char* op) {
  if (q == "fp4") return kernels::Sm90QuantType::kFp4;
  if (q == "fp4_fp8") return kernels::Sm90QuantType::kFp4Fp8;
  if (q == "int4") return kernels::Sm90QuantType::kInt4;
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, "quant_type",
                  "must be one of ['fp4', 'fp4_fp8', 'int4']; got '", q, "'");
}

std::tuple<Tensor, Tensor, Tensor> humming_impl(const Tensor& weight, const Tensor& raw_scale,
                                                int64_t max_range, bool interleave) {
  const char* op = "preprocess_moe_weights_for_sm90_mixed_gemm_humming";
  api::check_defined(weight, op, "weight");
  api::check_defined(raw_scale, op, "raw_scale");
  FLASHINFER_CHECK(weight.dim() == 3, op, "weight", "must be 3D (num_experts, rows, K/2), got ",
                   shape_to_string(weight.shape()));
  const int64_t E = weight.size(0), rows = weight.size(1), k = weight.size(2) * 2;
  FLASHINFER_CHECK(k % 32 == 0, op, "weight", "K dimension must be divisible by 32; got K=", k);
  FLASHINFER_CHECK(raw_scale.shape() == Shape({E, rows, k / 32}), op, "raw_scale",
                   "must have shape [", E, ", ", rows, ", ", k / 32, "], got ",
                   shape_to_string(raw_scale.shape()));
  api::check_same_device(raw_scale, weight, op, "raw_scale", "weight");
  FLASHINFER_CHECK(raw_scale.dtype() == DType::kUInt8, op, "raw_scale",
                   "must be uint8 E8M0 bytes, got ", dtype_torch_name(raw_scale.dtype()));
  FLASHINFER_CHECK(max_range >= 0 && max_range <= 11, op, "max_range", "must be in [0, 11], got ",
                   max_range);
  FLASHINFER_CHECK(weight.dtype() == DType::kUInt8, op, "weight",
                   "must be packed uint8 FP4 payload, got ", dtype_torch_name(weight.dtype()));
  // Each expert's clamp needs its largest and smallest scale (upstream's max/min over an empty
  // expert fails too).
  FLASHINFER_CHECK(E == 0 || (rows > 0 && k > 0), op, "weight",
                   "rows and K must be positive (each expert needs a scale), got shape ",
                   shape_to_string(weight.shape()));
  const Tensor w = weight.contiguous(), s = raw_scale.contiguous();
  Tensor wout = Tensor::empty({E, rows, k / 2}, DType::kUInt8, weight.device());
  Tensor offset = Tensor::empty({E, rows, k / 32}, DType::kUInt8, weight.device());
  Tensor residual = Tensor::empty({E}, DType::kFloat32, weight.device());
  kernels::HummingPrepParams p;
  p.weight = static_cast<const uint8_t*>(w.data_ptr());
  p.raw_scale = static_cast<const uint8_t*>(s.data_ptr());
  p.experts = E;
  p.rows = rows;
  p.k = k;
  p.max_range = max_range;
  p.weight_out = static_cast<uint8_t*>(wout.data_ptr());
  p.offset_out = static_cast<uint8_t*>(offset.data_ptr());
  p.residual = residual.data<float>();
  Tensor table, low;  // CUDA: the CPU's rewrite table on the device, per-expert scratch
  if (weight.device().is_cuda()) {
    Tensor h = Tensor::empty({kernels::kHummingTableBytes}, DType::kUInt8);
    std::memcpy(h.data_ptr(), kernels::cpu::humming_rewrite_table(), kernels::kHummingTableBytes);
    table = h.to(weight.device());
    low = Tensor::empty({E}, DType::kInt32, weight.device());
    p.rewrite_table = static_cast<const uint8_t*>(table.data_ptr());
    p.low = low.data<int32_t>();
  }
  api::launch(kHummingKernels, p, weight.device(), op, "weight");
  if (!interleave) return {wout, offset, residual};
  return {interleave_weights_impl(wout, kernels::Sm90QuantType::kFp4Fp8, op, "weight"),
          interleave_scales_impl(offset, 32, op, "raw_scale"), residual};
}

Tensor moe_weight_prep_random_bytes(const Shape& shape, uint64_t seed) {
  return api::bench::random_tensor(shape, DType::kFloat32, Device::cpu(), seed, 0.0, 255.99)
      .to(DType::kUInt8);
}

// E experts of [n, k] 4-bit weights: n = m rows (at least 64), k = 256.
BenchCase bench_interleave_weights(const BenchShape& s, Device dev) {
  const int64_t E = 8, n = std::max<int64_t>(64, (s.m + 63) / 64 * 64), k = 256;
  BenchCase c = api::bench::invoke_case(
      "interleave_moe_weights_for_sm90_mixed_gemm",
      {Value(moe_weight_prep_random_bytes({E, n, k / 2}, s.random_seed).to(dev)), Value("fp4")});
  c.bytes = 2.0 * static_cast<double>(E * n * k / 2);
  return c;
}
BenchCase bench_interleave_scales(const BenchShape& s, Device dev) {
  const int64_t E = 8, n = std::max<int64_t>(64, (s.m + 63) / 64 * 64), k = 512;
  BenchCase c = api::bench::invoke_case(
      "interleave_moe_scales_for_sm90_mixed_gemm",
      {Value(moe_weight_prep_random_bytes({E, n, k / 32}, s.random_seed).to(dev)),
       Value(int64_t{32})});
  c.bytes = 2.0 * static_cast<double>(E * n * k / 32);
  return c;
}
BenchCase bench_humming(const BenchShape& s, Device dev) {
  const int64_t E = 8, n = std::max<int64_t>(64, (s.m + 63) / 64 * 64), k = 256;
  BenchCase c = api::bench::invoke_case(
      "preprocess_moe_weights_for_sm90_mixed_gemm_humming",
      {Value(moe_weight_prep_random_bytes({E, n, k / 2}, s.random_seed).to(dev)),
       Value(moe_weight_prep_random_bytes({E, n, k / 32}, s.random_seed + 1).to(dev))});
  c.bytes = 2.0 * static_cast<double>(E * n * (k / 2 + k / 32));
  return c;
}

}  // namespace

Tensor interleave_moe_scales_for_sm90_mixed_gemm(const Tensor& scales, int64_t group_size) {
  return call_op<&interleave_moe_scales_for_sm90_mixed_gemm>(
      [&] {
        return interleave_scales_impl(scales, group_size,
                                      "interleave_moe_scales_for_sm90_mixed_gemm", "scales");
      },
      scales, group_size);
}

Tensor interleave_moe_weights_for_sm90_mixed_gemm(const Tensor& weight,
                                                  std::string_view quant_type) {
  return call_op<&interleave_moe_weights_for_sm90_mixed_gemm>(
      [&] {
        const char* op = "interleave_moe_weights_for_sm90_mixed_gemm";
        return interleave_weights_impl(weight, moe_weight_prep_parse_quant_type(quant_type, op), op,
                                       "weight");
      },
      weight, quant_type);
}

std::tuple<Tensor, Tensor, Tensor> preprocess_moe_weights_for_sm90_mixed_gemm_humming(
    const Tensor& weight, const Tensor& raw_scale, int64_t max_range, bool interleave) {
  return call_op<&preprocess_moe_weights_for_sm90_mixed_gemm_humming>(
      [&] { return humming_impl(weight, raw_scale, max_range, interleave); }, weight, raw_scale,
      max_range, interleave);
}

namespace detail {
void register_moe_weight_prep_ops(OpRegistry& r) {
  declare<&interleave_moe_scales_for_sm90_mixed_gemm>(
      r,
      {.name = "interleave_moe_scales_for_sm90_mixed_gemm",
       .module = kMoeWeightPrepModule,
       .summary = "Folds MoE weight scales into the SM90 mixed-input GEMM's 64x128 blocks"},
      "scales", arg("group_size", int64_t{32}));
  declare<&interleave_moe_weights_for_sm90_mixed_gemm>(
      r,
      {.name = "interleave_moe_weights_for_sm90_mixed_gemm",
       .module = kMoeWeightPrepModule,
       .summary = "Interleaves packed 4-bit MoE weights for the SM90 mixed-input GEMM"},
      "weight", arg("quant_type", "fp4"));
  declare<&preprocess_moe_weights_for_sm90_mixed_gemm_humming>(
      r,
      {.name = "preprocess_moe_weights_for_sm90_mixed_gemm_humming",
       .module = kMoeWeightPrepModule,
       .summary = "Humming-style MXFP4 preparation: E8M0 range clamp, payload rewrite, "
                  "SM90 layouts"},
      "weight", "raw_scale", arg("max_range", int64_t{11}), arg("interleave", true).kw());
  api::register_backends("interleave_moe_scales_for_sm90_mixed_gemm", kScaleKernels);
  api::register_backends("interleave_moe_weights_for_sm90_mixed_gemm", kWeightKernels);
  api::register_backends("preprocess_moe_weights_for_sm90_mixed_gemm_humming", kHummingKernels);
  register_bench_hook("interleave_moe_scales_for_sm90_mixed_gemm", bench_interleave_scales);
  register_bench_hook("interleave_moe_weights_for_sm90_mixed_gemm", bench_interleave_weights);
  register_bench_hook("preprocess_moe_weights_for_sm90_mixed_gemm_humming", bench_humming);
}
}  // namespace detail

}  // namespace flashinfer
