// Public norm ops (flashinfer.norm): declarations, argument checks, dispatch.
#include "flashinfer/ops/norm.h"

#include <cmath>

#include "api/checks.h"
#include "api/device_props.h"
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

Tensor rmsnorm_impl(const Tensor& input, const Tensor& weight, double eps,
                    const std::optional<Tensor>& out, std::optional<bool> enable_pdl) {
  const char* op = "rmsnorm";
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
  const kernels::RmsNormParams p = norm_params(input, weight, result, eps);
  if (input.device().is_cpu()) {
    kernels::cpu::rmsnorm(p);
  } else {
#if FLASHINFER_WITH_CUDA
    const bool* req = enable_pdl ? &*enable_pdl : nullptr;
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
      &rmsnorm_decl, [&] { return rmsnorm_impl(input, weight, eps, out, enable_pdl); }, input,
      weight, eps, out, enable_pdl);
}

namespace detail {
void register_norm_ops(OpRegistry& registry) { registry.add(make_rmsnorm_decl()); }
}  // namespace detail

}  // namespace flashinfer
