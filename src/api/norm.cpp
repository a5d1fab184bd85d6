// Public norm ops (flashinfer.norm): declarations, argument checks, dispatch.
#include "flashinfer/ops/norm.h"

#include <cmath>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/device_props.h"
#include "core/cuda_runtime.h"
#include "flashinfer/api_call.h"
#include "flashinfer/stream.h"
#include "kernels/cpu/norm_cpu.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/norm_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kModule = "flashinfer.norm";

OpDecl make_rmsnorm_decl() {
  OpDecl d;
  d.name = "rmsnorm";
  d.module = kModule;
  d.params = {
      ParamDecl("input", ParamKind::kTensor),
      ParamDecl("weight", ParamKind::kTensor),
      ParamDecl("eps", ParamKind::kFloat).def(1e-6),
      ParamDecl("out", ParamKind::kTensor).opt().mut(),
      ParamDecl("enable_pdl", ParamKind::kBool).opt(),
  };
  d.returns = "Tensor";
  d.summary = "Root mean square normalization: input * rsqrt(mean(input^2) + eps) * weight";
  d.invoke = [](const CallArgs& a) -> Value {
    return rmsnorm(a.tensor(0), a.tensor(1), a.f64(2), a.optional_tensor(3), a.optional_bool(4));
  };
  return d;
}

const OpDecl& rmsnorm_decl() {
  static const OpDecl& d = *OpRegistry::global().find("rmsnorm");
  return d;
}

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
  if (input.device().is_cpu()) {
    kernels::cpu::rmsnorm(p);
  } else {
#if FLASHINFER_WITH_CUDA
    const bool* req = enable_pdl ? &*enable_pdl : nullptr;
    detail::CudaDeviceScope device_scope(input.device());
    kernels::cuda::rmsnorm(p, current_cuda_stream(), api::resolve_enable_pdl(req, input.device()));
#else
    (void)enable_pdl;
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "input",
                    "CUDA tensor given to a build without the CUDA backend");
#endif
  }
  return result;
}

}  // namespace

Tensor rmsnorm(const Tensor& input, const Tensor& weight, double eps, std::optional<Tensor> out,
               std::optional<bool> enable_pdl) {
  return call_api(
      &rmsnorm_decl,
      [&] { return rmsnorm_impl("rmsnorm", 0.0f, input, weight, eps, out, enable_pdl); }, input,
      weight, eps, out, enable_pdl);
}

namespace {

// fused_add_rmsnorm / gemma_fused_add_rmsnorm share one declaration shape.
OpDecl make_fused_add_decl(const char* name, const char* summary,
                           void (*fn)(const Tensor&, const Tensor&, const Tensor&, double,
                                      std::optional<bool>)) {
  OpDecl d;
  d.name = name;
  d.module = kModule;
  d.params = {
      ParamDecl("input", ParamKind::kTensor).mut(),
      ParamDecl("residual", ParamKind::kTensor).mut(),
      ParamDecl("weight", ParamKind::kTensor),
      ParamDecl("eps", ParamKind::kFloat).def(1e-6),
      ParamDecl("enable_pdl", ParamKind::kBool).opt(),
  };
  d.returns = "None";
  d.summary = summary;
  d.invoke = [fn](const CallArgs& a) -> Value {
    fn(a.tensor(0), a.tensor(1), a.tensor(2), a.f64(3), a.optional_bool(4));
    return Value();
  };
  return d;
}

OpDecl make_fused_add_rmsnorm_decl() {
  return make_fused_add_decl(
      "fused_add_rmsnorm",
      "In place: residual += input; input = rmsnorm(residual) * weight (fp32 sum normalized)",
      [](const Tensor& i, const Tensor& r, const Tensor& w, double e, std::optional<bool> pdl) {
        fused_add_rmsnorm(i, r, w, e, pdl);
      });
}

OpDecl make_gemma_fused_add_rmsnorm_decl() {
  return make_fused_add_decl(
      "gemma_fused_add_rmsnorm",
      "In place: residual += input; input = rmsnorm(residual) * (1 + weight)",
      [](const Tensor& i, const Tensor& r, const Tensor& w, double e, std::optional<bool> pdl) {
        gemma_fused_add_rmsnorm(i, r, w, e, pdl);
      });
}

OpDecl make_gemma_rmsnorm_decl() {
  OpDecl d = make_rmsnorm_decl();
  d.name = "gemma_rmsnorm";
  d.summary = "Gemma RMS normalization: input * rsqrt(mean(input^2) + eps) * (1 + weight)";
  d.invoke = [](const CallArgs& a) -> Value {
    return gemma_rmsnorm(a.tensor(0), a.tensor(1), a.f64(2), a.optional_tensor(3),
                         a.optional_bool(4));
  };
  return d;
}

OpDecl make_layernorm_decl() {
  OpDecl d;
  d.name = "layernorm";
  d.module = kModule;
  // "gemma" (not "gamma") is upstream's parameter name.
  d.params = {
      ParamDecl("input", ParamKind::kTensor),
      ParamDecl("gemma", ParamKind::kTensor),
      ParamDecl("beta", ParamKind::kTensor),
      ParamDecl("eps", ParamKind::kFloat).def(1e-6),
  };
  d.returns = "Tensor";
  d.summary = "Layer normalization: (input - mean) * rsqrt(var + eps) * gemma + beta";
  d.invoke = [](const CallArgs& a) -> Value {
    return layernorm(a.tensor(0), a.tensor(1), a.tensor(2), a.f64(3));
  };
  return d;
}

const OpDecl& gemma_rmsnorm_decl() {
  static const OpDecl& d = *OpRegistry::global().find("gemma_rmsnorm");
  return d;
}
const OpDecl& fused_add_rmsnorm_decl() {
  static const OpDecl& d = *OpRegistry::global().find("fused_add_rmsnorm");
  return d;
}
const OpDecl& gemma_fused_add_rmsnorm_decl() {
  static const OpDecl& d = *OpRegistry::global().find("gemma_fused_add_rmsnorm");
  return d;
}
const OpDecl& layernorm_decl() {
  static const OpDecl& d = *OpRegistry::global().find("layernorm");
  return d;
}

void check_eps(double eps, const char* op) {
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
  check_eps(eps, op);
  // Both tensors are written: an overlap would make the result depend on the schedule.
  api::check_writable(input, op, "input");
  api::check_writable(residual, op, "residual");
  api::check_no_overlap(residual, input, op, "residual", "input");
  api::check_no_overlap(weight, input, op, "weight", "input");
  api::check_no_overlap(weight, residual, op, "weight", "residual");

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
  if (input.device().is_cpu()) {
    kernels::cpu::fused_add_rmsnorm(p);
  } else {
#if FLASHINFER_WITH_CUDA
    const bool* req = enable_pdl ? &*enable_pdl : nullptr;
    detail::CudaDeviceScope device_scope(input.device());
    kernels::cuda::fused_add_rmsnorm(p, current_cuda_stream(),
                                     api::resolve_enable_pdl(req, input.device()));
#else
    (void)enable_pdl;
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "input",
                    "CUDA tensor given to a build without the CUDA backend");
#endif
  }
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
  api::check_dtype_in(gemma, {DType::kFloat32}, op, "gemma");
  api::check_same_device(gemma, input, op, "gemma", "input");
  api::check_dim(beta, {1}, op, "beta");
  api::check_shape_eq(beta, {input.size(-1)}, op, "beta");
  api::check_dtype_in(beta, {DType::kFloat32}, op, "beta");
  api::check_same_device(beta, input, op, "beta", "input");
  check_eps(eps, op);
  Tensor out = Tensor::empty(input.shape(), input.dtype(), input.device());
  kernels::LayerNormParams p;
  p.input = input.data_ptr();
  p.gamma = gemma.data<float>();
  p.beta = beta.data<float>();
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
  if (input.device().is_cpu()) {
    kernels::cpu::layernorm(p);
  } else {
#if FLASHINFER_WITH_CUDA
    detail::CudaDeviceScope device_scope(input.device());
    kernels::cuda::layernorm(p, current_cuda_stream());
#else
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "input",
                    "CUDA tensor given to a build without the CUDA backend");
#endif
  }
  return out;
}

}  // namespace

Tensor gemma_rmsnorm(const Tensor& input, const Tensor& weight, double eps,
                     std::optional<Tensor> out, std::optional<bool> enable_pdl) {
  return call_api(
      &gemma_rmsnorm_decl,
      [&] { return rmsnorm_impl("gemma_rmsnorm", 1.0f, input, weight, eps, out, enable_pdl); },
      input, weight, eps, out, enable_pdl);
}

void fused_add_rmsnorm(const Tensor& input, const Tensor& residual, const Tensor& weight,
                       double eps, std::optional<bool> enable_pdl) {
  call_api(
      &fused_add_rmsnorm_decl,
      [&] {
        fused_add_rmsnorm_impl("fused_add_rmsnorm", 0.0f, input, residual, weight, eps, enable_pdl);
      },
      input, residual, weight, eps, enable_pdl);
}

void gemma_fused_add_rmsnorm(const Tensor& input, const Tensor& residual, const Tensor& weight,
                             double eps, std::optional<bool> enable_pdl) {
  call_api(
      &gemma_fused_add_rmsnorm_decl,
      [&] {
        fused_add_rmsnorm_impl("gemma_fused_add_rmsnorm", 1.0f, input, residual, weight, eps,
                               enable_pdl);
      },
      input, residual, weight, eps, enable_pdl);
}

Tensor layernorm(const Tensor& input, const Tensor& gemma, const Tensor& beta, double eps) {
  return call_api(
      &layernorm_decl, [&] { return layernorm_impl(input, gemma, beta, eps); }, input, gemma, beta,
      eps);
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
void register_norm_ops(OpRegistry& registry) {
  using api::bench::with_bench;
  registry.add(with_bench(make_rmsnorm_decl(), [](const BenchShape& s, Device d) {
    return bench_rmsnorm(s, d, "rmsnorm");
  }));
  registry.add(with_bench(make_fused_add_rmsnorm_decl(), [](const BenchShape& s, Device d) {
    return bench_fused_add_rmsnorm(s, d, "fused_add_rmsnorm");
  }));
  registry.add(with_bench(make_gemma_rmsnorm_decl(), [](const BenchShape& s, Device d) {
    return bench_rmsnorm(s, d, "gemma_rmsnorm");
  }));
  registry.add(with_bench(make_gemma_fused_add_rmsnorm_decl(), [](const BenchShape& s, Device d) {
    return bench_fused_add_rmsnorm(s, d, "gemma_fused_add_rmsnorm");
  }));
  registry.add(with_bench(make_layernorm_decl(), bench_layernorm));
}
}  // namespace detail

}  // namespace flashinfer
