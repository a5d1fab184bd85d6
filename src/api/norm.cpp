// Public norm ops (flashinfer.norm): declarations, argument checks, dispatch.
#include "flashinfer/ops/norm.h"

#include <cmath>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/norm_cpu.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/norm_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kNormModule = "flashinfer.norm";

// The backends of each norm kernel (src/api/kernel_table.h).
constexpr api::KernelEntry<kernels::RmsNormParams> kRmsNormKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 sums, OpenMP rows, AVX2/AVX-512 tiers", nullptr,
     [](const kernels::RmsNormParams& p, const api::LaunchContext&) { kernels::cpu::rmsnorm(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one block per row", nullptr,
     [](const kernels::RmsNormParams& p, const api::LaunchContext& c) {
       kernels::cuda::rmsnorm(p, c.stream, c.enable_pdl);
     }},
#endif
};
constexpr api::KernelEntry<kernels::FusedAddRmsNormParams> kFusedAddRmsNormKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 sums, OpenMP rows, AVX2/AVX-512 tiers", nullptr,
     [](const kernels::FusedAddRmsNormParams& p, const api::LaunchContext&) {
       kernels::cpu::fused_add_rmsnorm(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one block per row", nullptr,
     [](const kernels::FusedAddRmsNormParams& p, const api::LaunchContext& c) {
       kernels::cuda::fused_add_rmsnorm(p, c.stream, c.enable_pdl);
     }},
#endif
};
constexpr api::KernelEntry<kernels::LayerNormParams> kLayerNormKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 two-pass mean/variance, OpenMP rows", nullptr,
     [](const kernels::LayerNormParams& p, const api::LaunchContext&) {
       kernels::cpu::layernorm(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one block per row", nullptr,
     [](const kernels::LayerNormParams& p, const api::LaunchContext& c) {
       kernels::cuda::layernorm(p, c.stream);
     }},
#endif
};

// Fills the kernel parameters shared by every backend: input [B, H] or [B, heads, H].
kernels::RmsNormParams norm_params(const Tensor& input, const Tensor& weight, const Tensor& out,
                                   double eps) {
  kernels::RmsNormParams p;
  p.input = input.data_ptr();
  p.weight = weight.data_ptr();
  p.out = out.data_ptr();
  p.dtype = input.dtype();
  p.eps = static_cast<float>(eps);
  p.batch = input.size(0);
  p.hidden = input.size(-1);
  p.in_stride_b = input.stride(0);
  p.in_stride_d = input.stride(-1);
  p.out_stride_b = out.stride(0);
  p.out_stride_d = out.stride(-1);
  if (input.dim() == 3) {
    p.heads = input.size(1);
    p.in_stride_h = input.stride(1);
    p.out_stride_h = out.stride(1);
  }
  p.weight_stride = weight.stride(0);
  return p;
}

// Shared by rmsnorm (weight_bias 0) and gemma_rmsnorm (weight_bias 1).
Tensor rmsnorm_impl(const char* op, float weight_bias, const Tensor& input, const Tensor& weight,
                    double eps, const std::optional<Tensor>& out, std::optional<bool> enable_pdl) {
  api::check_defined(input, op, "input");
  api::check_defined(weight, op, "weight");
  api::check_dim(input, {2, 3}, op, "input");
  api::check_dtype_in(input, {DType::kFloat16, DType::kBFloat16, DType::kFloat32}, op, "input");
  api::check_non_empty(input, op, "input");
  api::check_dim(weight, {1}, op, "weight");
  api::check_shape_eq(weight, {input.size(-1)}, op, "weight");
  api::check_same_dtype(weight, input, op, "weight", "input");
  api::check_same_device(weight, input, op, "weight", "input");
  FLASHINFER_CHECK(eps >= 0.0 && std::isfinite(eps), op, "eps",
                   "must be finite and non-negative, got ", eps);
  Tensor result;
  if (out) {
    api::check_defined(*out, op, "out");
    api::check_shape_eq(*out, input.shape(), op, "out");
    api::check_same_dtype(*out, input, op, "out", "input");
    api::check_same_device(*out, input, op, "out", "input");
    result = *out;
  } else {
    result = Tensor::empty(input.shape(), input.dtype(), input.device());
  }
  kernels::RmsNormParams p = norm_params(input, weight, result, eps);
  p.weight_bias = weight_bias;
  api::launch(kRmsNormKernels, p, input.device(), op, "input", enable_pdl);
  return result;
}

}  // namespace

Tensor rmsnorm(const Tensor& input, const Tensor& weight, double eps, std::optional<Tensor> out,
               std::optional<bool> enable_pdl) {
  return call_op<&rmsnorm>(
      [&] { return rmsnorm_impl("rmsnorm", 0.0f, input, weight, eps, out, enable_pdl); }, input,
      weight, eps, out, enable_pdl);
}

namespace {

void norm_check_eps(double eps, const char* op) {
  FLASHINFER_CHECK(eps >= 0.0 && std::isfinite(eps), op, "eps",
                   "must be finite and non-negative, got ", eps);
}

void fused_add_rmsnorm_impl(const char* op, float weight_bias, const Tensor& input,
                            const Tensor& residual, const Tensor& weight, double eps,
                            std::optional<bool> enable_pdl) {
  api::check_defined(input, op, "input");
  api::check_defined(residual, op, "residual");
  api::check_defined(weight, op, "weight");
  api::check_dim(input, {2, 3}, op, "input");
  api::check_dtype_in(input, {DType::kFloat16, DType::kBFloat16, DType::kFloat32}, op, "input");
  api::check_non_empty(input, op, "input");
  api::check_shape_eq(residual, input.shape(), op, "residual");
  api::check_same_dtype(residual, input, op, "residual", "input");
  api::check_same_device(residual, input, op, "residual", "input");
  api::check_dim(weight, {1}, op, "weight");
  api::check_shape_eq(weight, {input.size(-1)}, op, "weight");
  api::check_same_dtype(weight, input, op, "weight", "input");
  api::check_same_device(weight, input, op, "weight", "input");
  norm_check_eps(eps, op);

  kernels::FusedAddRmsNormParams p;
  p.input = input.data_ptr();
  p.residual = residual.data_ptr();
  p.weight = weight.data_ptr();
  p.dtype = input.dtype();
  p.eps = static_cast<float>(eps);
  p.weight_bias = weight_bias;
  p.batch = input.size(0);
  p.hidden = input.size(-1);
  p.in_stride_b = input.stride(0);
  p.in_stride_d = input.stride(-1);
  p.res_stride_b = residual.stride(0);
  p.res_stride_d = residual.stride(-1);
  if (input.dim() == 3) {
    p.heads = input.size(1);
    p.in_stride_h = input.stride(1);
    p.res_stride_h = residual.stride(1);
  }
  p.weight_stride = weight.stride(0);
  api::launch(kFusedAddRmsNormKernels, p, input.device(), op, "input", enable_pdl);
}

Tensor layernorm_impl(const Tensor& input, const Tensor& gemma, const Tensor& beta, double eps) {
  const char* op = "layernorm";
  api::check_defined(input, op, "input");
  api::check_defined(gemma, op, "gemma");
  api::check_defined(beta, op, "beta");
  api::check_dim(input, {2}, op, "input");
  api::check_dtype_in(input, {DType::kBFloat16, DType::kFloat16, DType::kFloat32}, op, "input");
  api::check_non_empty(input, op, "input");
  api::check_dim(gemma, {1}, op, "gemma");
  api::check_shape_eq(gemma, {input.size(-1)}, op, "gemma");
  // Upstream's CuTe kernel takes fp32 / fp16 / bf16 gamma with beta of the same dtype.
  api::check_dtype_in(gemma, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op, "gemma");
  api::check_same_device(gemma, input, op, "gemma", "input");
  api::check_dim(beta, {1}, op, "beta");
  api::check_shape_eq(beta, {input.size(-1)}, op, "beta");
  api::check_same_dtype(beta, gemma, op, "beta", "gemma");
  api::check_same_device(beta, input, op, "beta", "input");
  norm_check_eps(eps, op);
  Tensor out = Tensor::empty(input.shape(), input.dtype(), input.device());
  kernels::LayerNormParams p;
  p.input = input.data_ptr();
  p.gamma = gemma.data_ptr();
  p.beta = beta.data_ptr();
  p.param_dtype = gemma.dtype();
  p.out = out.data_ptr();
  p.batch = input.size(0);
  p.hidden = input.size(1);
  p.in_stride_b = input.stride(0);
  p.in_stride_d = input.stride(1);
  p.out_stride_b = out.stride(0);
  p.out_stride_d = out.stride(1);
  p.gamma_stride = gemma.stride(0);
  p.beta_stride = beta.stride(0);
  p.eps = static_cast<float>(eps);
  p.dtype = input.dtype();
  api::launch(kLayerNormKernels, p, input.device(), op, "input");
  return out;
}

}  // namespace

Tensor gemma_rmsnorm(const Tensor& input, const Tensor& weight, double eps,
                     std::optional<Tensor> out, std::optional<bool> enable_pdl) {
  return call_op<&gemma_rmsnorm>(
      [&] { return rmsnorm_impl("gemma_rmsnorm", 1.0f, input, weight, eps, out, enable_pdl); },
      input, weight, eps, out, enable_pdl);
}

void fused_add_rmsnorm(const Tensor& input, const Tensor& residual, const Tensor& weight,
                       double eps, std::optional<bool> enable_pdl) {
  call_op<&fused_add_rmsnorm>(
      [&] {
        fused_add_rmsnorm_impl("fused_add_rmsnorm", 0.0f, input, residual, weight, eps, enable_pdl);
      },
      input, residual, weight, eps, enable_pdl);
}

void gemma_fused_add_rmsnorm(const Tensor& input, const Tensor& residual, const Tensor& weight,
                             double eps, std::optional<bool> enable_pdl) {
  call_op<&gemma_fused_add_rmsnorm>(
      [&] {
        fused_add_rmsnorm_impl("gemma_fused_add_rmsnorm", 1.0f, input, residual, weight, eps,
                               enable_pdl);
      },
      input, residual, weight, eps, enable_pdl);
}

Tensor layernorm(const Tensor& input, const Tensor& gemma, const Tensor& beta, double eps) {
  return call_op<&layernorm>([&] { return layernorm_impl(input, gemma, beta, eps); }, input, gemma,
                             beta, eps);
}

namespace {

// Bench hooks: input [batch_size, hidden_size] in input_dtype. Bytes: every input and output
// once. FLOPs per element: rmsnorm 4 (square, sum, scale, weight), fused add +1, layernorm 7.
BenchCase bench_rmsnorm(const BenchShape& s, Device dev, const char* name) {
  const Shape x{s.batch_size, s.hidden_size};
  const DType dt = s.input_dtype;
  BenchCase c = api::bench::invoke_case(
      name, {Value(api::bench::random_tensor(x, dt, dev, s.random_seed)),
             Value(api::bench::random_tensor({s.hidden_size}, dt, dev, s.random_seed + 1))});
  const double n = static_cast<double>(s.batch_size * s.hidden_size);
  c.flops = 4.0 * n;
  c.bytes = 2.0 * api::bench::nbytes(x, dt) + api::bench::nbytes({s.hidden_size}, dt);
  return c;
}

BenchCase bench_fused_add_rmsnorm(const BenchShape& s, Device dev, const char* name) {
  const Shape x{s.batch_size, s.hidden_size};
  const DType dt = s.input_dtype;
  BenchCase c = api::bench::invoke_case(
      name, {Value(api::bench::random_tensor(x, dt, dev, s.random_seed)),
             Value(api::bench::random_tensor(x, dt, dev, s.random_seed + 2)),
             Value(api::bench::random_tensor({s.hidden_size}, dt, dev, s.random_seed + 1))});
  const double n = static_cast<double>(s.batch_size * s.hidden_size);
  c.flops = 5.0 * n;
  // reads input, residual; writes both back; reads weight
  c.bytes = 4.0 * api::bench::nbytes(x, dt) + api::bench::nbytes({s.hidden_size}, dt);
  return c;
}

BenchCase bench_layernorm(const BenchShape& s, Device dev) {
  const Shape x{s.batch_size, s.hidden_size};
  const DType dt = s.input_dtype;
  BenchCase c = api::bench::invoke_case(
      "layernorm",
      {Value(api::bench::random_tensor(x, dt, dev, s.random_seed)),
       Value(api::bench::random_tensor({s.hidden_size}, DType::kFloat32, dev, s.random_seed + 1)),
       Value(api::bench::random_tensor({s.hidden_size}, DType::kFloat32, dev, s.random_seed + 2))});
  const double n = static_cast<double>(s.batch_size * s.hidden_size);
  c.flops = 7.0 * n;
  c.bytes =
      2.0 * api::bench::nbytes(x, dt) + 2.0 * api::bench::nbytes({s.hidden_size}, DType::kFloat32);
  return c;
}

}  // namespace

namespace detail {
void register_norm_ops(OpRegistry& r) {
  // out may be input itself (upstream: "the kernel will update this tensor inplace"; each row is
  // read whole before any of it is written, on every backend), but not any other overlap.
  declare<&rmsnorm>(r,
                    {.name = "rmsnorm",
                     .module = kNormModule,
                     .summary = "Root mean square normalization: input * rsqrt(mean(input^2) + "
                                "eps) * weight"},
                    "input", "weight", arg("eps", 1e-6), arg("out").mut().same_view_as("input"),
                    "enable_pdl");
  declare<&fused_add_rmsnorm>(
      r,
      {.name = "fused_add_rmsnorm",
       .module = kNormModule,
       .summary = "In place: residual += input; input = rmsnorm(residual) * weight (fp32 sum "
                  "normalized)"},
      arg("input").mut(), arg("residual").mut(), "weight", arg("eps", 1e-6), "enable_pdl");
  declare<&gemma_rmsnorm>(r,
                          {.name = "gemma_rmsnorm",
                           .module = kNormModule,
                           .summary = "Gemma RMS normalization: input * rsqrt(mean(input^2) + "
                                      "eps) * (1 + weight)"},
                          "input", "weight", arg("eps", 1e-6),
                          arg("out").mut().same_view_as("input"),  // as rmsnorm's
                          "enable_pdl");
  declare<&gemma_fused_add_rmsnorm>(
      r,
      {.name = "gemma_fused_add_rmsnorm",
       .module = kNormModule,
       .summary = "In place: residual += input; input = rmsnorm(residual) * (1 + weight)"},
      arg("input").mut(), arg("residual").mut(), "weight", arg("eps", 1e-6), "enable_pdl");
  // "gemma" (not "gamma") is upstream's parameter name.
  declare<&layernorm>(
      r,
      {.name = "layernorm",
       .module = kNormModule,
       .summary = "Layer normalization: (input - mean) * rsqrt(var + eps) * gemma + beta"},
      "input", "gemma", "beta", arg("eps", 1e-6));

  api::register_backends("rmsnorm", kRmsNormKernels);
  api::register_backends("gemma_rmsnorm", kRmsNormKernels);
  api::register_backends("fused_add_rmsnorm", kFusedAddRmsNormKernels);
  api::register_backends("gemma_fused_add_rmsnorm", kFusedAddRmsNormKernels);
  api::register_backends("layernorm", kLayerNormKernels);
  register_bench_hook("rmsnorm",
                      [](const BenchShape& s, Device d) { return bench_rmsnorm(s, d, "rmsnorm"); });
  register_bench_hook("fused_add_rmsnorm", [](const BenchShape& s, Device d) {
    return bench_fused_add_rmsnorm(s, d, "fused_add_rmsnorm");
  });
  register_bench_hook("gemma_rmsnorm", [](const BenchShape& s, Device d) {
    return bench_rmsnorm(s, d, "gemma_rmsnorm");
  });
  register_bench_hook("gemma_fused_add_rmsnorm", [](const BenchShape& s, Device d) {
    return bench_fused_add_rmsnorm(s, d, "gemma_fused_add_rmsnorm");
  });
  register_bench_hook("layernorm", bench_layernorm);
}
}  // namespace detail

}  // namespace flashinfer
