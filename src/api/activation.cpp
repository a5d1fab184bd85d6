// Public gated activations (flashinfer.activation): declarations, argument checks, dispatch.
#include "flashinfer/ops/activation.h"

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/activation_cpu.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/activation_cuda.h"
#endif

namespace flashinfer {
namespace {

using kernels::Activation;

constexpr const char* kActivationModule = "flashinfer.activation";

// The backends of the gated-activation kernel, shared by the three ops (src/api/kernel_table.h).
constexpr api::KernelEntry<kernels::ActAndMulParams> kActAndMulKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 math, AVX2/AVX-512 tiers, OpenMP rows", nullptr,
     [](const kernels::ActAndMulParams& p, const api::LaunchContext&) {
       kernels::cpu::act_and_mul(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one block per row, 16-byte vectors when aligned", nullptr,
     [](const kernels::ActAndMulParams& p, const api::LaunchContext& c) {
       kernels::cuda::act_and_mul(p, c.stream, c.enable_pdl);
     }},
#endif
};

// A [rows, width] view of `t` when its leading dimensions collapse, else an undefined tensor.
Tensor try_rows_view(const Tensor& t, int64_t rows, int64_t width) {
  try {
    return t.view({rows, width});
  } catch (const Error&) {
    return Tensor();
  }
}

Tensor act_and_mul_impl(const char* op, Activation act, const Tensor& input,
                        const std::optional<Tensor>& out, std::optional<bool> enable_pdl) {
  api::check_defined(input, op, "input");
  FLASHINFER_CHECK(input.dim() >= 1, op, "input",
                   "expected at least 1 dimension, got a 0-D tensor");
  api::check_dtype_in(input, {DType::kFloat16, DType::kBFloat16, DType::kFloat32}, op, "input");
  const int64_t width = input.size(-1);
  FLASHINFER_CHECK(width > 0 && width % 2 == 0, op, "input",
                   "last dimension must be even and positive ([..., 2 * d]), got shape ",
                   shape_to_string(input.shape()));
  const int64_t d = width / 2;
  Shape out_shape = input.shape();
  out_shape.back() = d;
  Tensor result;
  if (out) {
    api::check_defined(*out, op, "out");
    api::check_shape_eq(*out, out_shape, op, "out");
    api::check_same_dtype(*out, input, op, "out", "input");
    api::check_same_device(*out, input, op, "out", "input");
    result = *out;
  } else {
    result = Tensor::empty(out_shape, input.dtype(), input.device());
  }
  const int64_t rows = input.numel() / width;
  if (rows == 0) return result;

  // Leading dimensions are flattened into rows. Views whose leading strides do not collapse
  // (rare) go through a contiguous copy of the input / a temporary output.
  Tensor in2 = try_rows_view(input, rows, width);
  if (!in2.defined()) in2 = input.contiguous().view({rows, width});
  Tensor out2 = try_rows_view(result, rows, d);
  const bool staged = !out2.defined();
  if (staged) out2 = Tensor::empty({rows, d}, input.dtype(), input.device());

  kernels::ActAndMulParams p;
  p.input = in2.data_ptr();
  p.out = out2.data_ptr();
  p.rows = rows;
  p.d = d;
  p.in_stride_row = in2.stride(0);
  p.in_stride_d = in2.stride(1);
  p.out_stride_row = out2.stride(0);
  p.out_stride_d = out2.stride(1);
  p.act = act;
  p.dtype = input.dtype();
  api::launch(kActAndMulKernels, p, input.device(), op, "input", enable_pdl);
  if (staged) result.copy_(out2.view(out_shape));
  return result;
}

}  // namespace

Tensor silu_and_mul(const Tensor& input, std::optional<Tensor> out,
                    std::optional<bool> enable_pdl) {
  return call_op<&silu_and_mul>(
      [&] { return act_and_mul_impl("silu_and_mul", Activation::kSilu, input, out, enable_pdl); },
      input, out, enable_pdl);
}

Tensor gelu_and_mul(const Tensor& input, std::optional<Tensor> out,
                    std::optional<bool> enable_pdl) {
  return call_op<&gelu_and_mul>(
      [&] { return act_and_mul_impl("gelu_and_mul", Activation::kGelu, input, out, enable_pdl); },
      input, out, enable_pdl);
}

Tensor gelu_tanh_and_mul(const Tensor& input, std::optional<Tensor> out,
                         std::optional<bool> enable_pdl) {
  return call_op<&gelu_tanh_and_mul>(
      [&] {
        return act_and_mul_impl("gelu_tanh_and_mul", Activation::kGeluTanh, input, out, enable_pdl);
      },
      input, out, enable_pdl);
}

namespace {

// Bench hook: input [batch_size, 2 * hidden_size] in input_dtype, output [batch_size,
// hidden_size]. Bytes: input read once, output written once. FLOPs: counted as one
// multiply per output element (the activation itself is transcendental, not counted).
BenchCase bench_act(const BenchShape& s, Device dev, const char* name) {
  const Shape x{s.batch_size, 2 * s.hidden_size};
  BenchCase c = api::bench::invoke_case(
      name, {Value(api::bench::random_tensor(x, s.input_dtype, dev, s.random_seed, -4.0, 4.0))});
  c.flops = static_cast<double>(s.batch_size * s.hidden_size);
  c.bytes = 1.5 * api::bench::nbytes(x, s.input_dtype);
  return c;
}

}  // namespace

namespace detail {
void register_activation_ops(OpRegistry& r) {
  declare<&silu_and_mul>(r,
                         {.name = "silu_and_mul",
                          .module = kActivationModule,
                          .summary = "Gated SiLU: silu(input[..., :d]) * input[..., d:]"},
                         "input", arg("out").mut(), "enable_pdl");
  declare<&gelu_and_mul>(r,
                         {.name = "gelu_and_mul",
                          .module = kActivationModule,
                          .summary = "Gated GELU: gelu(input[..., :d]) * input[..., d:]"},
                         "input", arg("out").mut(), "enable_pdl");
  declare<&gelu_tanh_and_mul>(
      r,
      {.name = "gelu_tanh_and_mul",
       .module = kActivationModule,
       .summary = "Gated tanh-GELU: gelu_tanh(input[..., :d]) * input[..., d:]"},
      "input", arg("out").mut(), "enable_pdl");
  for (const char* name : {"silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"}) {
    api::register_backends(name, kActAndMulKernels);
    register_bench_hook(name,
                        [name](const BenchShape& s, Device d) { return bench_act(s, d, name); });
  }
}
}  // namespace detail

}  // namespace flashinfer
