// Fused norm + fp8 quantization ops of flashinfer.norm (rmsnorm_quant, fused_add_rmsnorm_quant,
// layernorm_quant): declarations, argument checks, dispatch.
#include <cmath>

#include "api/arg_traits.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/norm.h"
#include "kernels/cpu/norm_quant_cpu.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/norm_quant_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kNormQuantModule = "flashinfer.norm";

constexpr api::KernelEntry<kernels::NormQuantParams> kNormQuantKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 sums, OpenMP rows", nullptr,
     [](const kernels::NormQuantParams& p, const api::LaunchContext&) {
       kernels::cpu::norm_quant(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one block per row",
     [](const kernels::NormQuantParams& p) {
       return p.out_dtype == DType::kFloat4E2M1FNx2
                  ? api::Refusal{"out", "fused_rmsnorm_silu's NVFP4 output is CPU-only here"}
                  : api::Refusal{};
     },
     [](const kernels::NormQuantParams& p, const api::LaunchContext& c) {
       kernels::cuda::norm_quant(p, c.stream, c.enable_pdl);
     }},
#endif
};

// The scale as one fp32 on `device` (upstream's _normalize_scale_tensor: a tensor is taken as
// fp32); an undefined tensor for a number, which base() passes by value (upstream makes a device
// tensor of it, which copies to the device and synchronizes on every call).
Tensor norm_quant_scale_tensor(const ScalarOrTensor<double>& scale, Device device, const char* op) {
  if (!scale.is_tensor()) {
    FLASHINFER_CHECK(std::isfinite(scale.scalar()) && scale.scalar() != 0.0, op, "scale",
                     "must be finite and non-zero, got ", scale.scalar());
    return Tensor();
  }
  const Tensor& t = scale.tensor();
  FLASHINFER_CHECK(t.numel() == 1, op, "scale", "expected a one-element tensor, got shape ",
                   shape_to_string(t.shape()));
  api::check_dtype_in(t, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op, "scale");
  const Tensor f = t.dtype() == DType::kFloat32 ? t : t.to(DType::kFloat32);
  return f.to(device).contiguous();
}

void norm_quant_check_rows(const Tensor& input, const char* op) {
  api::check_defined(input, op, "input");
  api::check_dim(input, {2}, op, "input");
  api::check_dtype_in(input, {DType::kFloat16, DType::kBFloat16, DType::kFloat32}, op, "input");
  api::check_non_empty(input, op, "input");
}

void check_out(const Tensor& out, const Tensor& input, const char* op) {
  api::check_defined(out, op, "out");
  api::check_dtype_in(out, {DType::kFloat8E4M3FN, DType::kFloat8E5M2}, op, "out");
  api::check_shape_eq(out, input.shape(), op, "out");
  api::check_same_device(out, input, op, "out", "input");
  api::check_writable(out, op, "out");
  api::check_no_overlap(out, input, op, "out", "input");
}

void norm_quant_check_eps(double eps, const char* op) {
  FLASHINFER_CHECK(eps >= 0.0 && std::isfinite(eps), op, "eps",
                   "must be finite and non-negative, got ", eps);
}

kernels::NormQuantParams base(const Tensor& out, const Tensor& input, const Tensor& scale,
                              const ScalarOrTensor<double>& scale_arg, double eps) {
  kernels::NormQuantParams p;
  p.input = input.data_ptr();
  p.out = out.data_ptr();
  p.dtype = input.dtype();
  p.out_dtype = out.dtype();
  p.batch = input.size(0);
  p.hidden = input.size(1);
  p.in_stride_b = input.stride(0);
  p.in_stride_d = input.stride(1);
  p.out_stride_b = out.stride(0);
  p.out_stride_d = out.stride(1);
  p.eps = static_cast<float>(eps);
  p.scale = scale.defined() ? scale.data<float>() : nullptr;
  if (!scale_arg.is_tensor()) p.scale_value = static_cast<float>(scale_arg.scalar());
  return p;
}

void rms_weight(const Tensor& weight, const Tensor& input, const char* op) {
  api::check_defined(weight, op, "weight");
  api::check_dim(weight, {1}, op, "weight");
  api::check_shape_eq(weight, {input.size(1)}, op, "weight");
  api::check_same_dtype(weight, input, op, "weight", "input");
  api::check_same_device(weight, input, op, "weight", "input");
}

void rmsnorm_quant_impl(const Tensor& out, const Tensor& input, const Tensor& weight,
                        const ScalarOrTensor<double>& scale, double eps,
                        std::optional<bool> enable_pdl) {
  const char* op = "rmsnorm_quant";
  norm_quant_check_rows(input, op);
  check_out(out, input, op);
  rms_weight(weight, input, op);
  norm_quant_check_eps(eps, op);
  const Tensor s = norm_quant_scale_tensor(scale, input.device(), op);
  kernels::NormQuantParams p = base(out, input, s, scale, eps);
  p.kind = kernels::NormQuantKind::kRms;
  p.weight = weight.data_ptr();
  p.weight_stride = weight.stride(0);
  api::launch(kNormQuantKernels, p, input.device(), op, "input", enable_pdl);
}

void fused_add_rmsnorm_quant_impl(const Tensor& out, const Tensor& input, const Tensor& residual,
                                  const Tensor& weight, const ScalarOrTensor<double>& scale,
                                  double eps, std::optional<bool> enable_pdl) {
  const char* op = "fused_add_rmsnorm_quant";
  norm_quant_check_rows(input, op);
  check_out(out, input, op);
  api::check_defined(residual, op, "residual");
  api::check_shape_eq(residual, input.shape(), op, "residual");
  api::check_same_dtype(residual, input, op, "residual", "input");
  api::check_same_device(residual, input, op, "residual", "input");
  api::check_writable(residual, op, "residual");
  api::check_no_overlap(residual, input, op, "residual", "input");
  api::check_no_overlap(out, residual, op, "out", "residual");
  rms_weight(weight, input, op);
  api::check_no_overlap(weight, residual, op, "weight", "residual");
  norm_quant_check_eps(eps, op);
  const Tensor s = norm_quant_scale_tensor(scale, input.device(), op);
  kernels::NormQuantParams p = base(out, input, s, scale, eps);
  p.kind = kernels::NormQuantKind::kFusedAddRms;
  p.residual = residual.data_ptr();
  p.res_stride_b = residual.stride(0);
  p.res_stride_d = residual.stride(1);
  p.weight = weight.data_ptr();
  p.weight_stride = weight.stride(0);
  api::launch(kNormQuantKernels, p, input.device(), op, "input", enable_pdl);
}

void layernorm_quant_impl(const Tensor& out, const Tensor& input, const Tensor& gemma,
                          const Tensor& beta, const ScalarOrTensor<double>& scale, double eps) {
  const char* op = "layernorm_quant";
  norm_quant_check_rows(input, op);
  check_out(out, input, op);
  for (auto [t, name] : {std::pair<const Tensor*, const char*>{&gemma, "gemma"}, {&beta, "beta"}}) {
    api::check_defined(*t, op, name);
    api::check_dim(*t, {1}, op, name);
    api::check_shape_eq(*t, {input.size(1)}, op, name);
    api::check_dtype_in(*t, {DType::kFloat32}, op, name);
    api::check_same_device(*t, input, op, name, "input");
  }
  norm_quant_check_eps(eps, op);
  const Tensor s = norm_quant_scale_tensor(scale, input.device(), op);
  kernels::NormQuantParams p = base(out, input, s, scale, eps);
  p.kind = kernels::NormQuantKind::kLayer;
  p.weight = gemma.data_ptr();
  p.weight_stride = gemma.stride(0);
  p.beta = beta.data<float>();
  p.beta_stride = beta.stride(0);
  api::launch(kNormQuantKernels, p, input.device(), op, "input");
}

// NVFP4 `out` [num_tokens, hidden / 2] and `block_scale` [num_tokens, hidden / 16] e4m3
// (upstream's checks in flashinfer/norm/__init__.py: hidden % 16, both shapes, the scale dtype).
Tensor nvfp4_block_scale(const Tensor& input, const Tensor& out,
                         const std::optional<Tensor>& block_scale, const char* op) {
  const int64_t rows = input.size(0), hidden = input.size(1);
  FLASHINFER_CHECK(hidden % 16 == 0, op, "out", "NVFP4 output needs hidden % 16 == 0, got hidden ",
                   hidden);
  api::check_shape_eq(out, {rows, hidden / 2}, op, "out");
  if (!block_scale) {
    return Tensor::empty({rows, hidden / 16}, DType::kFloat8E4M3FN, input.device());
  }
  const Tensor& bs = *block_scale;
  api::check_dtype_in(bs, {DType::kFloat8E4M3FN}, op, "block_scale");
  api::check_shape_eq(bs, {rows, hidden / 16}, op, "block_scale");
  api::check_same_device(bs, input, op, "block_scale", "input");
  api::check_writable(bs, op, "block_scale");
  api::check_no_overlap(bs, input, op, "block_scale", "input");
  api::check_no_overlap(bs, out, op, "block_scale", "out");
  return bs;
}

RmsNormSiluOutput rmsnorm_silu_impl(const Tensor& input, const Tensor& weight, double eps,
                                    const std::optional<Tensor>& out,
                                    const std::optional<Tensor>& block_scale) {
  const char* op = "fused_rmsnorm_silu";
  api::check_defined(input, op, "input");
  api::check_dim(input, {2}, op, "input");
  api::check_dtype_in(input, {DType::kBFloat16}, op, "input");
  api::check_non_empty(input, op, "input");
  rms_weight(weight, input, op);
  norm_quant_check_eps(eps, op);
  if (block_scale) api::check_defined(*block_scale, op, "block_scale");
  RmsNormSiluOutput result;
  if (out) {
    api::check_defined(*out, op, "out");
    // Upstream's binding runs the fp8 kernel with scale 1.0 (csrc/rmsnorm_silu.cu).
    api::check_dtype_in(*out, {DType::kBFloat16, DType::kFloat8E4M3FN, DType::kFloat4E2M1FNx2}, op,
                        "out");
    api::check_same_device(*out, input, op, "out", "input");
    api::check_writable(*out, op, "out");
    api::check_no_overlap(*out, input, op, "out", "input");
    if (out->dtype() == DType::kFloat4E2M1FNx2) {
      result.block_scale = nvfp4_block_scale(input, *out, block_scale, op);
    } else {
      api::check_shape_eq(*out, input.shape(), op, "out");
    }
    result.out = *out;
  } else {
    result.out = Tensor::empty(input.shape(), DType::kBFloat16, input.device());
  }
  const Tensor& o = result.out;
  kernels::NormQuantParams p;
  p.kind = kernels::NormQuantKind::kRmsSilu;
  p.input = input.data_ptr();
  p.out = o.data_ptr();
  p.dtype = input.dtype();
  p.out_dtype = o.dtype();
  p.batch = input.size(0);
  p.hidden = input.size(1);
  p.in_stride_b = input.stride(0);
  p.in_stride_d = input.stride(1);
  p.out_stride_b = o.stride(0);
  p.out_stride_d = o.stride(1);
  p.weight = weight.data_ptr();
  p.weight_stride = weight.stride(0);
  p.eps = static_cast<float>(eps);
  if (result.block_scale.defined()) {
    p.block_scale = static_cast<uint8_t*>(result.block_scale.data_ptr());
    p.bs_stride_b = result.block_scale.stride(0);
    p.bs_stride_d = result.block_scale.stride(1);
  }
  api::launch(kNormQuantKernels, p, input.device(), op, "input");
  return result;
}

}  // namespace

Value to_value(const RmsNormSiluOutput& r) {
  if (!r.block_scale.defined()) return Value(r.out);
  return Value::tuple({Value(r.out), Value(r.block_scale)});
}

RmsNormSiluOutput fused_rmsnorm_silu(const Tensor& input, const Tensor& weight, double eps,
                                     std::optional<Tensor> out, std::optional<Tensor> block_scale) {
  return call_op<&fused_rmsnorm_silu>(
      [&] { return rmsnorm_silu_impl(input, weight, eps, out, block_scale); }, input, weight, eps,
      out, block_scale);
}

void rmsnorm_quant(const Tensor& out, const Tensor& input, const Tensor& weight,
                   ScalarOrTensor<double> scale, double eps, std::optional<bool> enable_pdl) {
  call_op<&rmsnorm_quant>([&] { rmsnorm_quant_impl(out, input, weight, scale, eps, enable_pdl); },
                          out, input, weight, scale, eps, enable_pdl);
}

void fused_add_rmsnorm_quant(const Tensor& out, const Tensor& input, const Tensor& residual,
                             const Tensor& weight, ScalarOrTensor<double> scale, double eps,
                             std::optional<bool> enable_pdl) {
  call_op<&fused_add_rmsnorm_quant>(
      [&] { fused_add_rmsnorm_quant_impl(out, input, residual, weight, scale, eps, enable_pdl); },
      out, input, residual, weight, scale, eps, enable_pdl);
}

void layernorm_quant(const Tensor& out, const Tensor& input, const Tensor& gemma,
                     const Tensor& beta, ScalarOrTensor<double> scale, double eps,
                     std::optional<bool> enable_pdl) {
  call_op<&layernorm_quant>([&] { layernorm_quant_impl(out, input, gemma, beta, scale, eps); }, out,
                            input, gemma, beta, scale, eps, enable_pdl);
}

namespace {

// Bench hooks: [batch_size, hidden_size] input_dtype rows into e4m3fn; scale 0.5 as a
// one-element fp32 tensor. Bytes: input (and residual twice) read/written, fp8 out written.
BenchCase bench_norm_quant(const BenchShape& s, Device dev, const char* name) {
  const Shape x{s.batch_size, s.hidden_size};
  const DType dt = s.input_dtype;
  // Zeros, not empty: a tool that copies the call's arguments before it runs (the recorder,
  // test_backend_ops' capture) reads `out` too, and compute-sanitizer initcheck reports a read of
  // device memory nothing wrote.
  Tensor out = Tensor::zeros(x, DType::kFloat8E4M3FN, dev);
  Tensor scale = Tensor::full({1}, 0.5, DType::kFloat32, Device::cpu()).to(dev);
  std::vector<Value> args = {Value(out),
                             Value(api::bench::random_tensor(x, dt, dev, s.random_seed))};
  double bytes = api::bench::nbytes(x, dt) + api::bench::nbytes(x, DType::kFloat8E4M3FN);
  const std::string op = name;
  if (op == "fused_add_rmsnorm_quant") {
    args.push_back(Value(api::bench::random_tensor(x, dt, dev, s.random_seed + 2)));
    bytes += 2 * api::bench::nbytes(x, dt);
  }
  if (op == "layernorm_quant") {
    args.push_back(
        Value(api::bench::random_tensor({s.hidden_size}, DType::kFloat32, dev, s.random_seed + 1)));
    args.push_back(
        Value(api::bench::random_tensor({s.hidden_size}, DType::kFloat32, dev, s.random_seed + 3)));
  } else {
    args.push_back(Value(api::bench::random_tensor({s.hidden_size}, dt, dev, s.random_seed + 1)));
  }
  args.push_back(Value(scale));
  BenchCase c = api::bench::invoke_case(name, std::move(args));
  c.flops = 6.0 * static_cast<double>(s.batch_size * s.hidden_size);
  c.bytes = bytes;
  return c;
}

}  // namespace

namespace detail {
void register_norm_quant_ops(OpRegistry& r) {
  declare<&rmsnorm_quant>(
      r,
      {.name = "rmsnorm_quant",
       .module = kNormQuantModule,
       .summary = "RMS normalization + fp8 quantization into out: fp8(rmsnorm(input) * weight / "
                  "scale)"},
      arg("out").mut(), "input", "weight", "scale", arg("eps", 1e-6), "enable_pdl");
  declare<&fused_add_rmsnorm_quant>(
      r,
      {.name = "fused_add_rmsnorm_quant",
       .module = kNormQuantModule,
       .summary = "residual += input; out = fp8(rmsnorm(residual) * weight / scale)"},
      arg("out").mut(), "input", arg("residual").mut(), "weight", "scale", arg("eps", 1e-6),
      "enable_pdl");
  declare<&layernorm_quant>(r,
                            {.name = "layernorm_quant",
                             .module = kNormQuantModule,
                             .summary = "Layer normalization + fp8 quantization into out"},
                            arg("out").mut(), "input", "gemma", "beta", "scale", arg("eps", 1e-6),
                            "enable_pdl");
  declare<&fused_rmsnorm_silu>(
      r,
      {.name = "fused_rmsnorm_silu",
       .module = kNormQuantModule,
       .summary = "silu(rmsnorm(input) * weight): bf16, fp8 or NVFP4 (with block scales)",
       .returns = "Tensor | tuple"},
      "input", "weight", arg("eps", 1e-6), arg("out").mut(), "block_scale");
  api::register_backends("fused_rmsnorm_silu", kNormQuantKernels);
  register_bench_hook("fused_rmsnorm_silu", [](const BenchShape& s, Device d) {
    const Shape x{s.batch_size, s.hidden_size};
    BenchCase c = api::bench::invoke_case(
        "fused_rmsnorm_silu",
        {Value(api::bench::random_tensor(x, DType::kBFloat16, d, s.random_seed)),
         Value(
             api::bench::random_tensor({s.hidden_size}, DType::kBFloat16, d, s.random_seed + 1))});
    c.flops = 8.0 * static_cast<double>(s.batch_size * s.hidden_size);
    c.bytes = 2.0 * api::bench::nbytes(x, DType::kBFloat16);
    return c;
  });
  for (const char* name : {"rmsnorm_quant", "fused_add_rmsnorm_quant", "layernorm_quant"}) {
    api::register_backends(name, kNormQuantKernels);
    register_bench_hook(
        name, [name](const BenchShape& s, Device d) { return bench_norm_quant(s, d, name); });
  }
}
}  // namespace detail

}  // namespace flashinfer
