// flashinfer.cute_dsl.rmsnorm_fp4quant / add_rmsnorm_fp4quant: upstream's checks, allocation
// rules and returns, dispatch, bench hooks. The arithmetic is kernels/norm_fp4quant_params.h's
// (docs/GEMM_AND_QUANTIZATION.md, "Fused RMSNorm + FP4 quantization").
#include "flashinfer/ops/norm_fp4quant.h"

#include <string>
#include <vector>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/norm_fp4quant_cpu.h"
#include "kernels/norm_fp4quant_params.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/norm_fp4quant_cuda.h"
#endif

namespace flashinfer {

template <>
struct ReturnName<NormFp4QuantOutput> {
  static constexpr const char* value = "tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]";
};

Value to_value(const NormFp4QuantOutput& r) {
  if (r.both_layouts) {
    return Value::tuple({Value(r.y_fp4), Value(r.block_scale), Value(r.block_scale_unswizzled)});
  }
  return Value::tuple({Value(r.y_fp4), Value(r.block_scale)});
}

namespace {

using kernels::NormFp4Params;

constexpr api::KernelEntry<NormFp4Params> kNormFp4Kernels[] = {
    {DeviceType::kCPU, "CPU reference: per row, fp32 sum of squares, block codes", nullptr,
     [](const NormFp4Params& p, const api::LaunchContext&) { kernels::cpu::rmsnorm_fp4quant(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: a block per row, a thread per scale block", nullptr,
     [](const NormFp4Params& p, const api::LaunchContext& c) {
       kernels::cuda::rmsnorm_fp4quant(p, c.stream, c.enable_pdl);
     }},
#endif
};

// The unit-stride rows of an [M, H] or [B, S, H] tensor: the row stride, or -1 when the rows
// are not evenly spaced (a 3-D view whose batch stride is not S row strides).
int64_t row_stride(const Tensor& t) {
  if (t.stride(-1) != 1 && t.size(-1) > 1) return -1;
  if (t.dim() == 2) return t.stride(0);
  if (t.size(0) > 1 && t.stride(0) != t.size(1) * t.stride(1)) return -1;
  return t.stride(1);
}

NormFp4QuantOutput norm_fp4_impl(const char* op, const Tensor& input, const Tensor* residual,
                                 const Tensor& weight, std::optional<Tensor> y_fp4,
                                 std::optional<Tensor> block_scale,
                                 const std::optional<Tensor>& global_scale, double eps, int64_t bs,
                                 const std::optional<std::string>& scale_format, bool swizzled,
                                 bool both, std::optional<Tensor> unswizzled,
                                 const std::optional<Tensor>& y_out,
                                 std::optional<bool> enable_pdl) {
  api::check_defined(input, op, "input");
  api::check_dim(input, {2, 3}, op, "input");
  api::check_dtype_in(input, {DType::kFloat16, DType::kBFloat16}, op, "input");
  const int64_t H = input.size(-1), M = input.numel() / std::max<int64_t>(H, 1);
  FLASHINFER_CHECK(bs == 16 || bs == 32, op, "block_size", "block_size must be 16 or 32, got ", bs);
  FLASHINFER_CHECK(H % bs == 0, op, "input", "hidden_size must be divisible by block_size (", H,
                   " % ", bs, ")");
  FLASHINFER_CHECK(H >= 64, op, "input", "hidden_size must be >= 64, got ", H);
  FLASHINFER_CHECK(!scale_format || *scale_format == "e4m3" || *scale_format == "ue8m0", op,
                   "scale_format", "scale_format must be 'e4m3' or 'ue8m0', got '",
                   scale_format.value_or(""), "'");
  const std::string fmt = scale_format.value_or(bs == 32 ? "ue8m0" : "e4m3");
  // Upstream's kernel writes e4m3 codes at block size 16 whatever scale_format says; the
  // allocated scale dtype follows scale_format.
  const bool ue8m0 = bs == 32 && fmt == "ue8m0";
  const DType sf_dtype = fmt == "ue8m0" ? DType::kUInt8 : DType::kFloat8E4M3FN;
  const int64_t in_stride = row_stride(input);
  const Tensor in = in_stride < 0 ? input.contiguous() : input;
  api::check_defined(weight, op, "weight");
  api::check_same_dtype(weight, input, op, "weight", "input");
  api::check_shape_eq(weight, {H}, op, "weight");
  api::check_same_device(weight, input, op, "weight", "input");
  const Tensor w = weight.contiguous();
  Shape lead(input.shape().begin(), input.shape().end() - 1);
  auto with_last = [&](int64_t n) {
    Shape s = lead;
    s.push_back(n);
    return s;
  };
  const Device dev = input.device();

  Tensor res_work;  // the residual rows the kernel writes (a contiguous copy when not strided)
  if (residual) {
    api::check_defined(*residual, op, "residual");
    api::check_same_dtype(*residual, input, op, "residual", "input");
    api::check_shape_eq(*residual, input.shape(), op, "residual");
    api::check_same_device(*residual, input, op, "residual", "input");
    api::check_writable(*residual, op, "residual");
    res_work = row_stride(*residual) < 0 ? residual->contiguous() : *residual;
  }
  if (global_scale) {
    api::check_dtype_in(*global_scale, {DType::kFloat32}, op, "global_scale");
    FLASHINFER_CHECK(global_scale->numel() == 1, op, "global_scale",
                     "global_scale must hold one value (shape (1,)), got ",
                     shape_to_string(global_scale->shape()));
    api::check_same_device(*global_scale, input, op, "global_scale", "input");
  }
  if (y_fp4 && y_fp4->defined()) {
    api::check_dtype_in(*y_fp4, {DType::kFloat4E2M1FNx2, DType::kUInt8}, op, "y_fp4");
    api::check_shape_eq(*y_fp4, with_last(H / 2), op, "y_fp4");
    api::check_same_device(*y_fp4, input, op, "y_fp4", "input");
    FLASHINFER_CHECK(y_fp4->is_contiguous(), op, "y_fp4", "y_fp4 must be contiguous");
  } else {
    y_fp4 = Tensor::empty(with_last(H / 2), DType::kFloat4E2M1FNx2, dev);
  }
  const int64_t nb = H / bs;
  const bool swz = swizzled || both;
  const int64_t swz_bytes = (M + 127) / 128 * ((nb + 3) / 4) * 512;
  if (block_scale && block_scale->defined()) {
    api::check_dtype_in(*block_scale, {DType::kFloat8E4M3FN, DType::kUInt8}, op, "block_scale");
    api::check_same_device(*block_scale, input, op, "block_scale", "input");
    FLASHINFER_CHECK(block_scale->is_contiguous(), op, "block_scale",
                     "block_scale must be contiguous");
    if (swz) {
      FLASHINFER_CHECK(block_scale->numel() >= swz_bytes, op, "block_scale",
                       "the 128x4-swizzled scales of ", M, " rows x ", nb, " blocks need ",
                       swz_bytes, " bytes, got ", block_scale->numel());
    } else {
      api::check_shape_eq(*block_scale, with_last(nb), op, "block_scale");
    }
  } else {
    block_scale = swz ? Tensor::zeros({swz_bytes}, sf_dtype, dev)
                      : Tensor::zeros(with_last(nb), sf_dtype, dev);
  }
  if (residual) {  // upstream allocates the row-major copy whether or not it is written
    if (unswizzled && unswizzled->defined()) {
      api::check_dtype_in(*unswizzled, {DType::kFloat8E4M3FN, DType::kUInt8}, op,
                          "block_scale_unswizzled");
      api::check_shape_eq(*unswizzled, with_last(nb), op, "block_scale_unswizzled");
      api::check_same_device(*unswizzled, input, op, "block_scale_unswizzled", "input");
      FLASHINFER_CHECK(unswizzled->is_contiguous(), op, "block_scale_unswizzled",
                       "block_scale_unswizzled must be contiguous");
    } else {
      unswizzled = Tensor::zeros(with_last(nb), sf_dtype, dev);
    }
  }
  if (y_out && y_out->defined()) {
    api::check_same_dtype(*y_out, input, op, "y_out", "input");
    api::check_shape_eq(*y_out, input.shape(), op, "y_out");
    api::check_same_device(*y_out, input, op, "y_out", "input");
    FLASHINFER_CHECK(y_out->is_contiguous(), op, "y_out", "y_out must be contiguous");
  }

  NormFp4Params p;
  p.M = M, p.H = H, p.block_size = static_cast<int>(bs);
  p.dtype = input.dtype();
  p.input = in.data_ptr();
  p.in_stride = in_stride < 0 ? H : in_stride;
  if (residual) {
    p.residual = res_work.data_ptr();
    p.res_stride = row_stride(res_work);
  }
  p.weight = w.data_ptr();
  if (global_scale) p.global_scale = global_scale->data<float>();
  p.eps = static_cast<float>(eps);
  p.ue8m0 = ue8m0;
  p.y_fp4 = static_cast<uint8_t*>(y_fp4->data_ptr());
  p.sf = static_cast<uint8_t*>(block_scale->data_ptr());
  p.sf_layout = swz ? kernels::SfLayoutCode::k128x4 : kernels::SfLayoutCode::kLinear;
  if (both) p.sf_linear = static_cast<uint8_t*>(unswizzled->data_ptr());
  if (y_out && y_out->defined()) p.y_out = y_out->data_ptr();
  api::check_upstream_arch(op, "input", dev);
  if (swz && (M % 128 != 0 || nb % 4 != 0)) {
    // The swizzled tiles' padding, which upstream leaves as it was (vLLM zeroes it itself), is
    // zeroed: every byte of the result is then defined, call after call.
    block_scale->view({block_scale->numel()}).slice(0, 0, swz_bytes).fill_(0.0);
  }
  api::launch(kNormFp4Kernels, p, dev, op, "input", enable_pdl);
  if (residual && res_work.data_ptr() != residual->data_ptr()) {
    Tensor dst = *residual;
    dst.copy_(res_work);  // the in-place update upstream loses on a non-contiguous residual
  }
  NormFp4QuantOutput r;
  r.y_fp4 = *y_fp4;
  r.block_scale = *block_scale;
  if (both) {
    r.block_scale_unswizzled = *unswizzled;
    r.both_layouts = true;
  }
  return r;
}

}  // namespace

NormFp4QuantOutput rmsnorm_fp4quant(const Tensor& input, const Tensor& weight,
                                    std::optional<Tensor> y_fp4, std::optional<Tensor> block_scale,
                                    std::optional<Tensor> global_scale, double eps,
                                    int64_t block_size, std::optional<std::string> scale_format,
                                    bool is_sf_swizzled_layout, std::optional<bool> enable_pdl) {
  return call_op<&rmsnorm_fp4quant>(
      [&] {
        return norm_fp4_impl("rmsnorm_fp4quant", input, nullptr, weight, y_fp4, block_scale,
                             global_scale, eps, block_size, scale_format, is_sf_swizzled_layout,
                             false, std::nullopt, std::nullopt, enable_pdl);
      },
      input, weight, y_fp4, block_scale, global_scale, eps, block_size, scale_format,
      is_sf_swizzled_layout, enable_pdl);
}

NormFp4QuantOutput add_rmsnorm_fp4quant(
    const Tensor& input, const Tensor& residual, const Tensor& weight, std::optional<Tensor> y_fp4,
    std::optional<Tensor> block_scale, std::optional<Tensor> global_scale, double eps,
    int64_t block_size, std::optional<std::string> scale_format, bool is_sf_swizzled_layout,
    bool output_both_sf_layouts, std::optional<Tensor> block_scale_unswizzled,
    std::optional<bool> enable_pdl, std::optional<Tensor> y_out) {
  return call_op<&add_rmsnorm_fp4quant>(
      [&] {
        return norm_fp4_impl("add_rmsnorm_fp4quant", input, &residual, weight, y_fp4, block_scale,
                             global_scale, eps, block_size, scale_format, is_sf_swizzled_layout,
                             output_both_sf_layouts, block_scale_unswizzled, y_out, enable_pdl);
      },
      input, residual, weight, y_fp4, block_scale, global_scale, eps, block_size, scale_format,
      is_sf_swizzled_layout, output_both_sf_layouts, block_scale_unswizzled, enable_pdl, y_out);
}

namespace {

// Bench: m rows of hidden_size (a multiple of 64), bf16 / fp16, NVFP4 (block 16, e4m3 scales,
// swizzled as vLLM passes them) with a global scale.
BenchCase bench_norm_fp4(const char* op, const BenchShape& s, Device dev) {
  const int64_t M = std::max<int64_t>(1, s.m), H = std::max<int64_t>(64, s.hidden_size / 64 * 64);
  const DType dt = s.input_dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  using api::bench::random_tensor;
  std::vector<Value> args = {Value(random_tensor({M, H}, dt, dev, s.random_seed))};
  if (std::string(op) == "add_rmsnorm_fp4quant") {
    args.push_back(Value(random_tensor({M, H}, dt, dev, s.random_seed + 1)));
  }
  args.push_back(Value(random_tensor({H}, dt, dev, s.random_seed + 2, 0.5, 1.5)));
  BenchCase c = api::bench::invoke_case(
      op, args,
      {{"global_scale", Value(Tensor::full({1}, 100.0, DType::kFloat32, dev))},
       {"is_sf_swizzled_layout", Value(true)}});
  const double io = static_cast<double>(M * H) * 2.0;
  c.bytes = io * (args.size() == 3 ? 3.0 : 1.0) + static_cast<double>(M * H) * (0.5 + 1.0 / 16);
  c.flops = static_cast<double>(M * H) * 6.0;
  return c;
}

}  // namespace

namespace detail {

void register_norm_fp4quant_ops(OpRegistry& r) {
  declare<&rmsnorm_fp4quant>(
      r,
      {.name = "rmsnorm_fp4quant",
       .module = "flashinfer.cute_dsl.rmsnorm_fp4quant",
       .summary = "RMSNorm fused with NVFP4 / MXFP4 quantization (Blackwell)"},
      "input", "weight", arg("y_fp4").mut(), arg("block_scale").mut(), "global_scale",
      arg("eps", 1e-6), arg("block_size", int64_t{16}), "scale_format",
      arg("is_sf_swizzled_layout", false), "enable_pdl");
  declare<&add_rmsnorm_fp4quant>(
      r,
      {.name = "add_rmsnorm_fp4quant",
       .module = "flashinfer.cute_dsl.add_rmsnorm_fp4quant",
       .summary = "Residual add + RMSNorm fused with NVFP4 / MXFP4 quantization (Blackwell)"},
      "input", arg("residual").mut(), "weight", arg("y_fp4").mut(), arg("block_scale").mut(),
      "global_scale", arg("eps", 1e-6), arg("block_size", int64_t{16}), "scale_format",
      arg("is_sf_swizzled_layout", false), arg("output_both_sf_layouts", false),
      arg("block_scale_unswizzled").mut(), "enable_pdl", arg("y_out").mut());
  api::register_backends("rmsnorm_fp4quant", kNormFp4Kernels);
  api::register_backends("add_rmsnorm_fp4quant", kNormFp4Kernels);
  register_bench_hook("rmsnorm_fp4quant", [](const BenchShape& s, Device d) {
    return bench_norm_fp4("rmsnorm_fp4quant", s, d);
  });
  register_bench_hook("add_rmsnorm_fp4quant", [](const BenchShape& s, Device d) {
    return bench_norm_fp4("add_rmsnorm_fp4quant", s, d);
  });
}

}  // namespace detail

}  // namespace flashinfer
