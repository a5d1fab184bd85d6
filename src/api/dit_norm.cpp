// Fused DiT gate/residual LayerNorm ops (flashinfer.norm): declarations, checks, dispatch.
// CPU reference only (bf16 output).
#include "flashinfer/ops/dit_norm.h"

#include <tuple>
#include <utility>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/dit_norm_cpu.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/dit_norm_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kDitNormModule = "flashinfer.norm";
// Upstream's kernel is instantiated for WAN 2.2 5B only.
constexpr int64_t kHidden = 3072;

constexpr api::KernelEntry<kernels::DitNormParams> kDitKernels[] = {
    {DeviceType::kCPU, "CPU reference (bf16 output)", nullptr,
     [](const kernels::DitNormParams& p, const api::LaunchContext&) {
       kernels::cpu::dit_layernorm(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one thread per row, the CPU's fp32 steps (bf16 output)",
     nullptr,
     [](const kernels::DitNormParams& p, const api::LaunchContext& c) {
       kernels::cuda::dit_layernorm(p, c.stream);
     }},
#endif
};

const uint16_t* bf16_ptr(const Tensor& t) { return static_cast<const uint16_t*>(t.data_ptr()); }

void dit_norm_check_rows(const Tensor& t, const Tensor& input, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dtype_in(t, {DType::kBFloat16}, op, arg);
  api::check_shape_eq(t, input.shape(), op, arg);
  api::check_same_device(t, input, op, arg, "input");
  FLASHINFER_CHECK(t.is_contiguous(), op, arg, "must be contiguous");
}

// gate / scale / shift: [batch, rows, hidden] or [batch * rows, hidden], unit stride along
// hidden. Upstream requires the row stride 6 * hidden (WAN's temb.chunk(6, dim=2) views; its
// kernel hardcodes that stride); here rows are read through the tensor's own strides, so a call
// whose chunks were recorded as contiguous copies replays with the same values.
void check_strided(const Tensor& t, const Tensor& input, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dim(t, {2, 3}, op, arg);
  api::check_dtype_in(t, {DType::kBFloat16}, op, arg);
  api::check_same_device(t, input, op, arg, "input");
  const int64_t b = input.size(0), r = input.size(1), h = input.size(2);
  FLASHINFER_CHECK(t.size(-1) == h, op, arg, "last dim must match hidden_dim ", h, ", got ",
                   t.size(-1));
  FLASHINFER_CHECK(t.stride(-1) == 1, op, arg, "must have stride 1 in the last dimension, got ",
                   t.stride(-1));
  if (t.dim() == 3) {
    FLASHINFER_CHECK(t.size(0) == b && t.size(1) == r, op, arg, "expected [", b, ", ", r, ", ", h,
                     "], got ", shape_to_string(t.shape()));
  } else {
    FLASHINFER_CHECK(t.size(0) == b * r, op, arg, "expected [batch * rows = ", b * r, ", ", h,
                     "], got ", shape_to_string(t.shape()));
  }
}

// Element strides of row (b, r) of a checked gate / scale / shift tensor.
std::pair<int64_t, int64_t> row_strides(const Tensor& t, int64_t rows) {
  if (t.dim() == 3) return {t.stride(0), t.stride(1)};
  return {rows * t.stride(0), t.stride(0)};
}

const float* check_bias(const std::optional<Tensor>& t, const Tensor& input, const char* op,
                        const char* arg) {
  if (!t || !t->defined()) return nullptr;
  api::check_dim(*t, {1, 2}, op, arg);
  api::check_dtype_in(*t, {DType::kFloat32}, op, arg);
  api::check_same_device(*t, input, op, arg, "input");
  FLASHINFER_CHECK(
      t->size(-1) == input.size(2) && t->numel() == input.size(2) && t->is_contiguous(), op, arg,
      "must be a contiguous [", input.size(2), "] or [1, ", input.size(2), "] tensor, got ",
      shape_to_string(t->shape()));
  return t->data<float>();
}

std::optional<float> check_scaling(const std::optional<Tensor>& t, const Tensor& input,
                                   const char* op, const char* arg) {
  if (!t || !t->defined()) return std::nullopt;
  FLASHINFER_CHECK(t->dim() == 1 && t->size(0) == 1, op, arg, "must have shape (1,), got ",
                   shape_to_string(t->shape()));
  api::check_dtype_in(*t, {DType::kFloat32}, op, arg);
  api::check_same_device(*t, input, op, arg, "input");
  return static_cast<float>(t->item());
}

struct DitArgs {
  kernels::DitNormMode mode;
  const Tensor& input;
  const Tensor* residual;
  const Tensor* gate;
  const Tensor* scale;
  const Tensor* shift;
  const Tensor* gamma;
  const Tensor* beta;
  const std::optional<Tensor>& gate_bias;
  const std::optional<Tensor>& scale_bias;
  const std::optional<Tensor>& shift_bias;
  double epsilon;
  bool use_nvfp4, use_mxfp8;
  const std::optional<Tensor>& global_scaling_factor;
  const std::optional<Tensor>& input_global_scaling_factor;
  const std::optional<Tensor>& residual_out;
  const std::optional<Tensor>& norm_out;
};

std::tuple<Tensor, Tensor> dit_impl(const char* op, const DitArgs& a) {
  const Tensor& x = a.input;
  api::check_defined(x, op, "input");
  api::check_dim(x, {3}, op, "input");
  api::check_dtype_in(x, {DType::kBFloat16}, op, "input");
  FLASHINFER_CHECK(x.is_contiguous(), op, "input", "must be contiguous");
  FLASHINFER_CHECK(x.size(2) == kHidden, op, "input", "hidden_dim must be ", kHidden,
                   " (WAN 2.2 5B target), got ", x.size(2));
  FLASHINFER_CHECK(!(a.use_nvfp4 && a.use_mxfp8), op, "use_mxfp8",
                   "use_nvfp4 and use_mxfp8 are exclusive");
  if (a.residual) dit_norm_check_rows(*a.residual, x, op, "residual");
  kernels::DitNormParams p;
  p.mode = a.mode;
  if (a.gate) check_strided(*a.gate, x, op, "gate");
  if (a.scale) check_strided(*a.scale, x, op, "scale");
  if (a.shift) check_strided(*a.shift, x, op, "shift");
  p.gate_bias = check_bias(a.gate_bias, x, op, "gate_bias");
  p.scale_bias = check_bias(a.scale_bias, x, op, "scale_bias");
  p.shift_bias = check_bias(a.shift_bias, x, op, "shift_bias");
  if (a.gamma) {
    for (const auto& [t, arg] : {std::pair{a.gamma, "gamma"}, std::pair{a.beta, "beta"}}) {
      api::check_defined(*t, op, arg);
      api::check_dtype_in(*t, {DType::kFloat32}, op, arg);
      FLASHINFER_CHECK(t->dim() == 1 && t->size(0) == x.size(2) && t->is_contiguous(), op, arg,
                       "must be a contiguous [hidden_dim] tensor, got ",
                       shape_to_string(t->shape()));
      api::check_same_device(*t, x, op, arg, "input");
    }
  }
  FLASHINFER_CHECK(!a.use_nvfp4 || (a.global_scaling_factor && a.global_scaling_factor->defined()),
                   op, "global_scaling_factor", "required for NVFP4 output");
  check_scaling(a.global_scaling_factor, x, op, "global_scaling_factor");
  const std::optional<float> in_scale =
      check_scaling(a.input_global_scaling_factor, x, op, "input_global_scaling_factor");
  FLASHINFER_CHECK_CODE(!a.use_nvfp4, ErrorCode::kUnsupported, op, "use_nvfp4",
                        "NVFP4 norm output is not implemented here (bf16 output only)");
  FLASHINFER_CHECK_CODE(!a.use_mxfp8, ErrorCode::kUnsupported, op, "use_mxfp8",
                        "MXFP8 norm output is not implemented here (bf16 output only)");
  Tensor res_out, norm;
  if (a.residual_out && a.residual_out->defined()) {
    dit_norm_check_rows(*a.residual_out, x, op, "residual_out");
    res_out = *a.residual_out;
  } else {
    res_out = Tensor::empty(x.shape(), DType::kBFloat16, x.device());
  }
  if (a.norm_out && a.norm_out->defined()) {
    dit_norm_check_rows(*a.norm_out, x, op, "norm_out");
    norm = *a.norm_out;
  } else {
    norm = Tensor::empty(x.shape(), DType::kBFloat16, x.device());
  }
  p.input = bf16_ptr(x);
  p.residual = a.residual ? bf16_ptr(*a.residual) : nullptr;
  if (a.gate) {
    p.gate = bf16_ptr(*a.gate);
    std::tie(p.gate_stride_b, p.gate_stride_r) = row_strides(*a.gate, x.size(1));
  }
  if (a.scale) {
    p.scale = bf16_ptr(*a.scale);
    std::tie(p.scale_stride_b, p.scale_stride_r) = row_strides(*a.scale, x.size(1));
    p.shift = bf16_ptr(*a.shift);
    std::tie(p.shift_stride_b, p.shift_stride_r) = row_strides(*a.shift, x.size(1));
  }
  if (a.gamma) {
    p.gamma = a.gamma->data<float>();
    p.beta = a.beta->data<float>();
  }
  p.has_input_scale = in_scale.has_value();
  p.input_scale = in_scale.value_or(1.0f);
  p.eps = static_cast<float>(a.epsilon);
  p.batch = x.size(0);
  p.rows = x.size(1);
  p.hidden = x.size(2);
  p.residual_out = static_cast<uint16_t*>(res_out.data_ptr());
  p.norm_out = static_cast<uint16_t*>(norm.data_ptr());
  if (x.numel() > 0) api::launch(kDitKernels, p, x.device(), op, "input");
  return {res_out, norm};
}

}  // namespace

std::tuple<Tensor, Tensor> fused_dit_gate_residual_layernorm_gamma_beta(
    const Tensor& input, const Tensor& residual, const Tensor& gate, const Tensor& gamma,
    const Tensor& beta, std::optional<Tensor> gate_bias, double epsilon, bool use_nvfp4,
    bool use_mxfp8, std::optional<Tensor> global_scaling_factor,
    std::optional<Tensor> input_global_scaling_factor, std::optional<Tensor> residual_out,
    std::optional<Tensor> norm_out, std::optional<Tensor> sf_out) {
  return call_op<&fused_dit_gate_residual_layernorm_gamma_beta>(
      [&] {
        const std::optional<Tensor> none;
        return dit_impl(
            "fused_dit_gate_residual_layernorm_gamma_beta",
            {kernels::DitNormMode::kGammaBeta, input, &residual, &gate, nullptr, nullptr, &gamma,
             &beta, gate_bias, none, none, epsilon, use_nvfp4, use_mxfp8, global_scaling_factor,
             input_global_scaling_factor, residual_out, norm_out});
      },
      input, residual, gate, gamma, beta, gate_bias, epsilon, use_nvfp4, use_mxfp8,
      global_scaling_factor, input_global_scaling_factor, residual_out, norm_out, sf_out);
}

std::tuple<Tensor, Tensor> fused_dit_gate_residual_layernorm_scale_shift(
    const Tensor& input, const Tensor& residual, const Tensor& gate, const Tensor& scale,
    const Tensor& shift, std::optional<Tensor> gate_bias, std::optional<Tensor> scale_bias,
    std::optional<Tensor> shift_bias, double epsilon, bool use_nvfp4, bool use_mxfp8,
    std::optional<Tensor> global_scaling_factor, std::optional<Tensor> input_global_scaling_factor,
    std::optional<Tensor> residual_out, std::optional<Tensor> norm_out,
    std::optional<Tensor> sf_out) {
  return call_op<&fused_dit_gate_residual_layernorm_scale_shift>(
      [&] {
        return dit_impl(
            "fused_dit_gate_residual_layernorm_scale_shift",
            {kernels::DitNormMode::kGateResidualScaleShift, input, &residual, &gate, &scale, &shift,
             nullptr, nullptr, gate_bias, scale_bias, shift_bias, epsilon, use_nvfp4, use_mxfp8,
             global_scaling_factor, input_global_scaling_factor, residual_out, norm_out});
      },
      input, residual, gate, scale, shift, gate_bias, scale_bias, shift_bias, epsilon, use_nvfp4,
      use_mxfp8, global_scaling_factor, input_global_scaling_factor, residual_out, norm_out,
      sf_out);
}

std::tuple<Tensor, Tensor> fused_dit_residual_layernorm_scale_shift(
    const Tensor& input, const Tensor& scale, const Tensor& shift, std::optional<Tensor> residual,
    std::optional<Tensor> scale_bias, std::optional<Tensor> shift_bias, double epsilon,
    bool use_nvfp4, bool use_mxfp8, std::optional<Tensor> global_scaling_factor,
    std::optional<Tensor> input_global_scaling_factor, std::optional<Tensor> residual_out,
    std::optional<Tensor> norm_out, std::optional<Tensor> sf_out) {
  return call_op<&fused_dit_residual_layernorm_scale_shift>(
      [&] {
        const std::optional<Tensor> none;
        const Tensor* res = residual && residual->defined() ? &*residual : nullptr;
        return dit_impl(
            "fused_dit_residual_layernorm_scale_shift",
            {kernels::DitNormMode::kResidualScaleShift, input, res, nullptr, &scale, &shift,
             nullptr, nullptr, none, scale_bias, shift_bias, epsilon, use_nvfp4, use_mxfp8,
             global_scaling_factor, input_global_scaling_factor, residual_out, norm_out});
      },
      input, scale, shift, residual, scale_bias, shift_bias, epsilon, use_nvfp4, use_mxfp8,
      global_scaling_factor, input_global_scaling_factor, residual_out, norm_out, sf_out);
}

namespace {

// Bench hooks: [batch_size, m, 3072] bf16 rows; gate/scale/shift chunks of one
// [batch, m, 6, 3072] temb as WAN passes them. Bytes: inputs read once, two outputs written.
struct DitCase {
  Tensor input, residual, temb;
  int64_t b, m;
};
DitCase dit_case(const BenchShape& s, Device dev) {
  DitCase c;
  c.b = std::max<int64_t>(1, s.batch_size);
  c.m = std::max<int64_t>(1, s.m);
  c.input = api::bench::random_tensor({c.b, c.m, kHidden}, DType::kBFloat16, dev, s.random_seed);
  c.residual =
      api::bench::random_tensor({c.b, c.m, kHidden}, DType::kBFloat16, dev, s.random_seed + 1);
  c.temb = api::bench::random_tensor({c.b, c.m, 6, kHidden}, DType::kBFloat16, dev,
                                     s.random_seed + 2, -0.5, 0.5);
  return c;
}
Value chunk(const DitCase& c, int64_t i) { return Value(c.temb.select(2, i)); }
// The outputs are given (as engines pass them), so the written-argument checks see them.
Value out(const DitCase& c, Device dev) {
  return Value(Tensor::zeros({c.b, c.m, kHidden}, DType::kBFloat16, dev));
}
double dit_bytes(const DitCase& c, int64_t reads) {
  return static_cast<double>(reads + 2) * api::bench::nbytes({c.b, c.m, kHidden}, DType::kBFloat16);
}

BenchCase bench_gamma_beta(const BenchShape& s, Device dev) {
  const DitCase d = dit_case(s, dev);
  BenchCase c = api::bench::invoke_case(
      "fused_dit_gate_residual_layernorm_gamma_beta",
      {Value(d.input), Value(d.residual), chunk(d, 2),
       Value(
           api::bench::random_tensor({kHidden}, DType::kFloat32, dev, s.random_seed + 3, 0.5, 1.5)),
       Value(api::bench::random_tensor({kHidden}, DType::kFloat32, dev, s.random_seed + 4))},
      {{"gate_bias", Value(api::bench::random_tensor({kHidden}, DType::kFloat32, dev,
                                                     s.random_seed + 5, -0.1, 0.1))},
       {"residual_out", out(d, dev)},
       {"norm_out", out(d, dev)}});
  c.bytes = dit_bytes(d, 3);
  return c;
}

BenchCase bench_gate_scale_shift(const BenchShape& s, Device dev) {
  const DitCase d = dit_case(s, dev);
  BenchCase c = api::bench::invoke_case(
      "fused_dit_gate_residual_layernorm_scale_shift",
      {Value(d.input), Value(d.residual), chunk(d, 2), chunk(d, 4), chunk(d, 3)},
      {{"scale_bias", Value(api::bench::random_tensor({1, kHidden}, DType::kFloat32, dev,
                                                      s.random_seed + 6, -0.1, 0.1))},
       {"residual_out", out(d, dev)},
       {"norm_out", out(d, dev)}});
  c.bytes = dit_bytes(d, 5);
  return c;
}

BenchCase bench_residual_scale_shift(const BenchShape& s, Device dev) {
  const DitCase d = dit_case(s, dev);
  BenchCase c = api::bench::invoke_case(
      "fused_dit_residual_layernorm_scale_shift", {Value(d.input), chunk(d, 1), chunk(d, 0)},
      {{"residual", Value(d.residual)}, {"residual_out", out(d, dev)}, {"norm_out", out(d, dev)}});
  c.bytes = dit_bytes(d, 4);
  return c;
}

}  // namespace

namespace detail {
void register_dit_norm_ops(OpRegistry& r) {
  declare<&fused_dit_gate_residual_layernorm_gamma_beta>(
      r,
      {.name = "fused_dit_gate_residual_layernorm_gamma_beta",
       .module = kDitNormModule,
       .summary = "DiT gate + residual + LayerNorm(gamma, beta), bf16 outputs"},
      "input", "residual", "gate", "gamma", "beta", arg("gate_bias").kw(),
      arg("epsilon", 1e-6).kw(), arg("use_nvfp4", false).kw(), arg("use_mxfp8", false).kw(),
      arg("global_scaling_factor").kw(), arg("input_global_scaling_factor").kw(),
      arg("residual_out").mut().kw(), arg("norm_out").mut().kw(), arg("sf_out").mut().kw());
  declare<&fused_dit_gate_residual_layernorm_scale_shift>(
      r,
      {.name = "fused_dit_gate_residual_layernorm_scale_shift",
       .module = kDitNormModule,
       .summary = "DiT gate + residual + LayerNorm * (1 + scale) + shift, bf16 outputs"},
      "input", "residual", "gate", "scale", "shift", arg("gate_bias").kw(), arg("scale_bias").kw(),
      arg("shift_bias").kw(), arg("epsilon", 1e-6).kw(), arg("use_nvfp4", false).kw(),
      arg("use_mxfp8", false).kw(), arg("global_scaling_factor").kw(),
      arg("input_global_scaling_factor").kw(), arg("residual_out").mut().kw(),
      arg("norm_out").mut().kw(), arg("sf_out").mut().kw());
  declare<&fused_dit_residual_layernorm_scale_shift>(
      r,
      {.name = "fused_dit_residual_layernorm_scale_shift",
       .module = kDitNormModule,
       .summary = "DiT residual + LayerNorm * (1 + scale) + shift, bf16 outputs"},
      "input", "scale", "shift", arg("residual").kw(), arg("scale_bias").kw(),
      arg("shift_bias").kw(), arg("epsilon", 1e-6).kw(), arg("use_nvfp4", false).kw(),
      arg("use_mxfp8", false).kw(), arg("global_scaling_factor").kw(),
      arg("input_global_scaling_factor").kw(), arg("residual_out").mut().kw(),
      arg("norm_out").mut().kw(), arg("sf_out").mut().kw());
  for (const char* op : {"fused_dit_gate_residual_layernorm_gamma_beta",
                         "fused_dit_gate_residual_layernorm_scale_shift",
                         "fused_dit_residual_layernorm_scale_shift"}) {
    api::register_backends(op, kDitKernels);
  }
  register_bench_hook("fused_dit_gate_residual_layernorm_gamma_beta", bench_gamma_beta);
  register_bench_hook("fused_dit_gate_residual_layernorm_scale_shift", bench_gate_scale_shift);
  register_bench_hook("fused_dit_residual_layernorm_scale_shift", bench_residual_scale_shift);
}
}  // namespace detail

}  // namespace flashinfer
