// SVDQuant NVFP4 linear (flashinfer.gemm.gemm_svdquant): declarations, argument checks,
// dispatch. CPU reference only: the kernel tables list the CPU alone, so CUDA tensors get
// kUnsupported naming the op and argument.
#include "flashinfer/ops/svdquant.h"

#include <string>
#include <tuple>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/quantization.h"
#include "kernels/cpu/svdquant_cpu.h"

namespace flashinfer {
namespace {

constexpr const char* kSvdquantModule = "flashinfer.gemm.gemm_svdquant";

using api::KernelEntry;
using api::LaunchContext;

constexpr KernelEntry<kernels::SvdquantGemmParams> kSvdquantGemmKernels[] = {
    {DeviceType::kCPU, "CPU reference (host only)", nullptr,
     [](const kernels::SvdquantGemmParams& p, const LaunchContext&) {
       kernels::cpu::mm_nvfp4_svdquant(p);
     }},
};
constexpr KernelEntry<kernels::SmoothParams> kSmoothKernels[] = {
    {DeviceType::kCPU, "CPU reference (host only)", nullptr,
     [](const kernels::SmoothParams& p, const LaunchContext&) { kernels::cpu::smooth_mul(p); }},
};
constexpr KernelEntry<kernels::Bf16MmParams> kMmKernels[] = {
    {DeviceType::kCPU, "CPU reference (host only)", nullptr,
     [](const kernels::Bf16MmParams& p, const LaunchContext&) { kernels::cpu::bf16_mm(p); }},
};

int64_t swizzled_size(int64_t rows, int64_t sf_cols) {
  return (rows + 127) / 128 * 128 * ((sf_cols + 3) / 4 * 4);
}

void check_sf(const Tensor& sf, int64_t rows, int64_t k, const Tensor& a, const char* op,
              const char* arg) {
  api::check_defined(sf, op, arg);
  api::check_dtype_in(sf, {DType::kUInt8, DType::kFloat8E4M3FN}, op, arg);
  api::check_same_device(sf, a, op, arg, "a");
  const int64_t need = swizzled_size(rows, k / 16);
  FLASHINFER_CHECK(sf.numel() >= need, op, arg, "has ", sf.numel(),
                   " scales, the 128x4 layout needs at least ", need);
}

float first_fp32(const Tensor& t, const Tensor& a, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  FLASHINFER_CHECK(t.numel() >= 1, op, arg, "must have at least one element");
  api::check_dtype_in(t, {DType::kFloat32}, op, arg);
  api::check_same_device(t, a, op, arg, "a");
  return static_cast<float>(t.reshape({-1}).slice(0, 0, 1).to(Device::cpu()).item());
}

void check_bf16_2d(const Tensor& t, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dim(t, {2}, op, arg);
  api::check_dtype_in(t, {DType::kBFloat16}, op, arg);
}

// svdquant_linear's argument behind a nested call's: what only the nested nvfp4_quantize_smooth
// and mm_nvfp4_svdquant check is svdquant_linear's caller's error, named as its own argument.
const char* linear_arg(const std::string& nested) {
  static const std::pair<const char*, const char*> kMap[] = {{"a", "x"},
                                                             {"a_sf", "x"},
                                                             {"b", "weight_fp4"},
                                                             {"b_sf", "weight_sf"},
                                                             {"d", "l2t_smoothed"},
                                                             {"l1", "l1_scaled"}};
  for (const auto& [from, to] : kMap) {
    if (nested == from) return to;
  }
  return nullptr;  // the same name in both (x, alpha, bias, pre_quant_scale, global_scale)
}

template <class F>
auto as_linear(F&& nested) -> decltype(nested()) {
  try {
    return nested();
  } catch (const Error& e) {
    if (e.op() != "nvfp4_quantize_smooth" && e.op() != "mm_nvfp4_svdquant") throw;
    const char* arg = linear_arg(e.arg());
    throw Error(e.code(), "svdquant_linear", arg ? std::string(arg) : e.arg(), e.detail(), e.file(),
                e.line());
  }
}

}  // namespace

Tensor mm_nvfp4_svdquant(const Tensor& a, const Tensor& b, const Tensor& a_sf, const Tensor& b_sf,
                         const Tensor& alpha, const Tensor& d, const Tensor& l1,
                         std::optional<Tensor> bias, std::optional<Tensor> out,
                         std::string_view backend, std::optional<bool> enable_pdl) {
  return call_op<&mm_nvfp4_svdquant>(
      [&] {
        const char* op = "mm_nvfp4_svdquant";
        api::check_defined(a, op, "a");
        api::check_dim(a, {2}, op, "a");
        api::check_dtype_in(a, {DType::kUInt8}, op, "a");
        api::check_defined(b, op, "b");
        api::check_dim(b, {2}, op, "b");
        api::check_dtype_in(b, {DType::kUInt8}, op, "b");
        api::check_same_device(b, a, op, "b", "a");
        api::check_backend(op, backend, a.device());
        const int64_t m = a.size(0), n = b.size(0), k = a.size(1) * 2;
        FLASHINFER_CHECK(b.size(1) == a.size(1), op, "b", "inner dimensions mismatch: a ",
                         shape_to_string(a.shape()), " vs b ", shape_to_string(b.shape()));
        FLASHINFER_CHECK(n % 32 == 0, op, "b", "n must be divisible by 32, got ", n);
        FLASHINFER_CHECK(k % 32 == 0, op, "a", "k must be divisible by 32, got ", k);
        FLASHINFER_CHECK(a.stride(1) == 1, op, "a", "the last dimension must be contiguous");
        FLASHINFER_CHECK(b.stride(1) == 1, op, "b", "the last dimension must be contiguous");
        check_sf(a_sf, m, k, a, op, "a_sf");
        check_sf(b_sf, n, k, a, op, "b_sf");
        const float al = first_fp32(alpha, a, op, "alpha");
        check_bf16_2d(d, op, "d");
        FLASHINFER_CHECK(d.size(0) == m, op, "d", "must have shape [m, r], got ",
                         shape_to_string(d.shape()));
        const int64_t r = d.size(1);
        FLASHINFER_CHECK(r >= 32 && r % 32 == 0, op, "d",
                         "the LoRA rank (d.shape[1]) must be a positive multiple of 32, got ", r);
        check_bf16_2d(l1, op, "l1");
        api::check_shape_eq(l1, {n, r}, op, "l1");
        api::check_same_device(d, a, op, "d", "a");
        api::check_same_device(l1, a, op, "l1", "a");
        Tensor bs;
        if (bias && bias->defined()) {
          api::check_shape_eq(*bias, {n}, op, "bias");
          api::check_dtype_in(*bias, {DType::kBFloat16}, op, "bias");
          api::check_same_device(*bias, a, op, "bias", "a");
          bs = bias->contiguous();
        }
        Tensor result;
        if (out && out->defined()) {
          api::check_shape_eq(*out, {m, n}, op, "out");
          api::check_dtype_in(*out, {DType::kBFloat16}, op, "out");
          FLASHINFER_CHECK(out->is_contiguous(), op, "out", "must be contiguous");
          api::check_same_device(*out, a, op, "out", "a");
          result = *out;
        } else {
          result = Tensor::empty({m, n}, DType::kBFloat16, a.device());
        }
        const Tensor as = a_sf.contiguous(), bsf = b_sf.contiguous(), dc = d.contiguous(),
                     lc = l1.contiguous();
        kernels::SvdquantGemmParams p;
        p.m = m;
        p.n = n;
        p.k = k;
        p.r = r;
        p.a = static_cast<const uint8_t*>(a.data_ptr());
        p.a_stride = a.stride(0);
        p.b = static_cast<const uint8_t*>(b.data_ptr());
        p.b_stride = b.stride(0);
        p.a_sf = static_cast<const uint8_t*>(as.data_ptr());
        p.b_sf = static_cast<const uint8_t*>(bsf.data_ptr());
        p.d = static_cast<const uint16_t*>(dc.data_ptr());
        p.l1 = static_cast<const uint16_t*>(lc.data_ptr());
        p.bias = bs.defined() ? static_cast<const uint16_t*>(bs.data_ptr()) : nullptr;
        p.alpha = al;
        p.out = static_cast<uint16_t*>(result.data_ptr());
        api::launch(kSvdquantGemmKernels, p, a.device(), op, "a", enable_pdl.value_or(false));
        return result;
      },
      a, b, a_sf, b_sf, alpha, d, l1, bias, out, backend, enable_pdl);
}

std::tuple<Tensor, Tensor> nvfp4_quantize_smooth(const Tensor& x, const Tensor& pre_quant_scale,
                                                 const Tensor& global_scale,
                                                 std::optional<bool> enable_pdl,
                                                 std::string_view backend) {
  return call_op<&nvfp4_quantize_smooth>(
      [&]() -> std::tuple<Tensor, Tensor> {
        const char* op = "nvfp4_quantize_smooth";
        check_bf16_2d(x, op, "x");
        api::check_non_empty(x, op, "x");
        api::check_backend(op, backend, x.device());
        const int64_t m = x.size(0), n = x.size(1);
        FLASHINFER_CHECK(n % 16 == 0, op, "x",
                         "n must be divisible by 16 (NVFP4 SF vector size), got ", n);
        api::check_defined(pre_quant_scale, op, "pre_quant_scale");
        api::check_dtype_in(pre_quant_scale, {DType::kBFloat16}, op, "pre_quant_scale");
        FLASHINFER_CHECK(pre_quant_scale.numel() == n, op, "pre_quant_scale", "must have n = ", n,
                         " elements, got ", pre_quant_scale.numel());
        api::check_same_device(pre_quant_scale, x, op, "pre_quant_scale", "x");
        api::check_defined(global_scale, op, "global_scale");
        FLASHINFER_CHECK(global_scale.numel() == 1, op, "global_scale",
                         "expected one fp32 element, got shape ",
                         shape_to_string(global_scale.shape()));
        api::check_dtype_in(global_scale, {DType::kFloat32}, op, "global_scale");
        api::check_same_device(global_scale, x, op, "global_scale", "x");
        // The bf16 product x * s the docstring names, then the stock quantizer (a nested
        // call, unobserved): byte-identical by construction.
        FLASHINFER_CHECK(x.stride(1) == 1, op, "x", "the last dimension must be contiguous");
        const Tensor sc = pre_quant_scale.reshape({n}).contiguous();
        Tensor y = Tensor::empty({m, n}, DType::kBFloat16, x.device());
        kernels::SmoothParams p;
        p.m = m;
        p.n = n;
        p.x = static_cast<const uint16_t*>(x.data_ptr());
        p.x_stride = x.stride(0);
        p.s = static_cast<const uint16_t*>(sc.data_ptr());
        p.y = static_cast<uint16_t*>(y.data_ptr());
        api::launch(kSmoothKernels, p, x.device(), op, "x", enable_pdl.value_or(false));
        // Upstream's smooth kernel has the standard recipe only: the environment's 4over6 does
        // not reach it (None).
        auto [q, sf] =
            nvfp4_quantize(y, global_scale, SfLayout::layout_128x4, false, 16, std::nullopt, "auto",
                           false, std::nullopt, std::nullopt, Value());
        return {q, sf.contiguous().reshape({-1})};
      },
      x, pre_quant_scale, global_scale, enable_pdl, backend);
}

Tensor svdquant_linear(const Tensor& x, const Tensor& weight_fp4, const Tensor& weight_sf,
                       const Tensor& alpha, const Tensor& pre_quant_scale,
                       const Tensor& l2t_smoothed, const Tensor& l1_scaled,
                       const Tensor& global_scale, std::optional<Tensor> bias,
                       std::optional<bool> enable_pdl) {
  return call_op<&svdquant_linear>(
      [&] {
        const char* op = "svdquant_linear";
        api::check_defined(x, op, "x");
        // Upstream's first step, nvfp4_quantize_smooth, refuses the device before any check.
        api::check_upstream_arch(op, "x", x.device());
        check_bf16_2d(x, op, "x");
        check_bf16_2d(l2t_smoothed, op, "l2t_smoothed");
        FLASHINFER_CHECK(l2t_smoothed.size(0) == x.size(1), op, "l2t_smoothed",
                         "must have shape [k, r] with k = x.shape[1] = ", x.size(1), ", got ",
                         shape_to_string(l2t_smoothed.shape()));
        api::check_same_device(l2t_smoothed, x, op, "l2t_smoothed", "x");
        FLASHINFER_CHECK(x.stride(1) == 1, op, "x", "the last dimension must be contiguous");
        const Tensor l2 = l2t_smoothed.contiguous();
        const int64_t m = x.size(0), k = x.size(1), r = l2.size(1);
        Tensor xq, x_sf;  // not a structured binding: the lambda below captures them
        std::tie(xq, x_sf) = as_linear(
            [&] { return nvfp4_quantize_smooth(x, pre_quant_scale, global_scale, enable_pdl); });
        Tensor down = Tensor::empty({m, r}, DType::kBFloat16, x.device());
        kernels::Bf16MmParams p;
        p.m = m;
        p.k = k;
        p.r = r;
        p.x = static_cast<const uint16_t*>(x.data_ptr());
        p.x_stride = x.stride(0);
        p.y = static_cast<const uint16_t*>(l2.data_ptr());
        p.y_stride = r;
        p.out = static_cast<uint16_t*>(down.data_ptr());
        api::launch(kMmKernels, p, x.device(), op, "x", enable_pdl.value_or(false));
        return as_linear([&] {
          return mm_nvfp4_svdquant(xq, weight_fp4, x_sf, weight_sf, alpha, down, l1_scaled, bias,
                                   std::nullopt, "cutlass", enable_pdl);
        });
      },
      x, weight_fp4, weight_sf, alpha, pre_quant_scale, l2t_smoothed, l1_scaled, global_scale, bias,
      enable_pdl);
}

namespace {

// Bench inputs: an NVFP4 weight [n, k] and activations quantized on the host, rank 32.
struct SvdShape {
  int64_t m, n, k, r;
};
SvdShape svd_shape(const BenchShape& s) {
  return {s.m, (s.n + 31) / 32 * 32, (s.k + 31) / 32 * 32, 32};
}

BenchCase svdquant_bench_mm(const BenchShape& s, Device dev) {
  const SvdShape z = svd_shape(s);
  Tensor gs = Tensor::full({1}, 448.0 * 6.0 / 2.0, DType::kFloat32);
  auto [qa, sa] = nvfp4_quantize(
      api::bench::random_tensor({z.m, z.k}, DType::kBFloat16, Device::cpu(), s.random_seed), gs);
  auto [qb, sb] = nvfp4_quantize(
      api::bench::random_tensor({z.n, z.k}, DType::kBFloat16, Device::cpu(), s.random_seed + 1),
      gs);
  BenchCase c = api::bench::invoke_case(
      "mm_nvfp4_svdquant",
      {Value(qa.to(dev)), Value(qb.to(dev)), Value(sa.to(dev)), Value(sb.to(dev)),
       Value(Tensor::full({1}, 1.0 / (gs.item() * gs.item()), DType::kFloat32).to(dev)),
       Value(api::bench::random_tensor({z.m, z.r}, DType::kBFloat16, dev, s.random_seed + 2)),
       Value(api::bench::random_tensor({z.n, z.r}, DType::kBFloat16, dev, s.random_seed + 3))});
  c.flops = 2.0 * static_cast<double>(z.m * z.n * (z.k + z.r));
  c.bytes = static_cast<double>((z.m + z.n) * z.k) * (0.5 + 1.0 / 16.0) +
            api::bench::nbytes({z.m + z.n, z.r}, DType::kBFloat16) +
            api::bench::nbytes({z.m, z.n}, DType::kBFloat16);
  return c;
}

BenchCase bench_smooth(const BenchShape& s, Device dev) {
  const SvdShape z = svd_shape(s);
  BenchCase c = api::bench::invoke_case(
      "nvfp4_quantize_smooth",
      {Value(api::bench::random_tensor({z.m, z.k}, DType::kBFloat16, dev, s.random_seed)),
       Value(api::bench::random_tensor({z.k}, DType::kBFloat16, dev, s.random_seed + 1, 0.5, 1.5)),
       Value(Tensor::full({1}, 448.0 * 6.0 / 3.0, DType::kFloat32).to(dev))});
  const double e = static_cast<double>(z.m * z.k);
  c.bytes = 2.0 * e + e / 2.0 + e / 16.0;
  return c;
}

BenchCase bench_linear(const BenchShape& s, Device dev) {
  const SvdShape z = svd_shape(s);
  Tensor gs = Tensor::full({1}, 448.0 * 6.0 / 2.0, DType::kFloat32);
  auto [qb, sb] = nvfp4_quantize(
      api::bench::random_tensor({z.n, z.k}, DType::kBFloat16, Device::cpu(), s.random_seed + 1),
      gs);
  BenchCase c = api::bench::invoke_case(
      "svdquant_linear",
      {Value(api::bench::random_tensor({z.m, z.k}, DType::kBFloat16, dev, s.random_seed)),
       Value(qb.to(dev)), Value(sb.to(dev)),
       Value(Tensor::full({1}, 1.0 / (gs.item() * gs.item()), DType::kFloat32).to(dev)),
       Value(api::bench::random_tensor({z.k}, DType::kBFloat16, dev, s.random_seed + 2, 0.5, 1.5)),
       Value(api::bench::random_tensor({z.k, z.r}, DType::kBFloat16, dev, s.random_seed + 3, -0.1,
                                       0.1)),
       Value(api::bench::random_tensor({z.n, z.r}, DType::kBFloat16, dev, s.random_seed + 4)),
       Value(gs.to(dev))});
  c.flops = 2.0 * static_cast<double>(z.m * (z.n * (z.k + z.r) + z.k * z.r));
  c.bytes = api::bench::nbytes({z.m, z.k}, DType::kBFloat16) +
            static_cast<double>(z.n * z.k) * (0.5 + 1.0 / 16.0) +
            api::bench::nbytes({z.m, z.n}, DType::kBFloat16);
  return c;
}

}  // namespace

namespace detail {
void register_svdquant_ops(OpRegistry& r) {
  declare<&mm_nvfp4_svdquant>(
      r,
      {.name = "mm_nvfp4_svdquant",
       .module = kSvdquantModule,
       .summary = "SVDQuant GEMM: alpha * (nvfp4 a @ b^T + d @ l1^T) + bias, bf16 out"},
      "a", "b", "a_sf", "b_sf", "alpha", "d", "l1", "bias", arg("out").mut(),
      arg("backend", "cutlass"), "enable_pdl");
  declare<&nvfp4_quantize_smooth>(
      r,
      {.name = "nvfp4_quantize_smooth",
       .module = kSvdquantModule,
       .summary = "NVFP4 quantization of bf16(x * pre_quant_scale), 128x4 scales"},
      "x", "pre_quant_scale", "global_scale", "enable_pdl", arg("backend", "cutlass"));
  declare<&svdquant_linear>(
      r,
      {.name = "svdquant_linear",
       .module = kSvdquantModule,
       .summary = "SVDQuant linear: smooth-quantize x, LoRA-down, then mm_nvfp4_svdquant"},
      "x", "weight_fp4", "weight_sf", "alpha", "pre_quant_scale", "l2t_smoothed", "l1_scaled",
      "global_scale", "bias", "enable_pdl");
  api::register_backends("mm_nvfp4_svdquant", kSvdquantGemmKernels);
  api::register_backends("nvfp4_quantize_smooth", kSmoothKernels);
  api::register_backends("svdquant_linear", kMmKernels);
  register_bench_hook("mm_nvfp4_svdquant", svdquant_bench_mm);
  register_bench_hook("nvfp4_quantize_smooth", bench_smooth);
  register_bench_hook("svdquant_linear", bench_linear);
}
}  // namespace detail

}  // namespace flashinfer
