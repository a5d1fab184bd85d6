// per_token_group_quant_8bit (flashinfer.quantization.fp8_quantization), packbits and
// segment_packbits (flashinfer.quantization.packbits): declarations, checks, dispatch.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "api/quant8.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/quant8.h"
#include "kernels/cpu/quant8_cpu.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/quant8_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kQuant8Fp8Module = "flashinfer.quantization.fp8_quantization";
constexpr const char* kPackModule = "flashinfer.quantization.packbits";

constexpr api::KernelEntry<kernels::GroupQuant8Params> kGroupQuantKernels[] = {
    {DeviceType::kCPU, "CPU reference: one pass per group, OpenMP rows", nullptr,
     [](const kernels::GroupQuant8Params& p, const api::LaunchContext&) {
       kernels::cpu::per_token_group_quant_8bit(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one warp per group", nullptr,
     [](const kernels::GroupQuant8Params& p, const api::LaunchContext& c) {
       kernels::cuda::per_token_group_quant_8bit(p, c.stream);
     }},
#endif
};

// Bit packing is a host-side layout transform here; CUDA tensors are packed on the host and
// copied back (documented in docs/GEMM_AND_QUANTIZATION.md).
struct PackParams {
  const uint8_t* x;
  int64_t n, stride;
  bool little;
  uint8_t* out;
};
constexpr api::KernelEntry<PackParams> kPackKernels[] = {
    {DeviceType::kCPU, "CPU reference", nullptr,
     [](const PackParams& p, const api::LaunchContext&) {
       kernels::cpu::packbits(p.x, p.n, p.stride, p.little, p.out);
     }},
};

std::tuple<Tensor, Tensor> group_quant_impl(const Tensor& x, int64_t group_size, double eps,
                                            std::optional<DType> dst_dtype, bool column_major,
                                            bool tma_aligned, bool ue8m0,
                                            std::string_view backend) {
  const char* op = "per_token_group_quant_8bit";
  api::check_defined(x, op, "x");
  api::check_dtype_in(x, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op, "x");
  FLASHINFER_CHECK(x.dim() >= 1, op, "x", "must have at least one dimension");
  FLASHINFER_CHECK(x.is_contiguous(), op, "x", "must be contiguous");
  FLASHINFER_CHECK(group_size >= 1, op, "group_size", "must be >= 1, got ", group_size);
  const int64_t k = x.size(-1);
  FLASHINFER_CHECK(k % group_size == 0, op, "group_size", "the last dimension of x (", k,
                   ") must be divisible by group_size ", group_size);
  FLASHINFER_CHECK(eps >= 0.0 && std::isfinite(eps), op, "eps",
                   "must be finite and non-negative, got ", eps);
  const DType out_dtype = dst_dtype.value_or(DType::kFloat8E4M3FN);
  FLASHINFER_CHECK(out_dtype == DType::kFloat8E4M3FN || out_dtype == DType::kFloat8E5M2 ||
                       out_dtype == DType::kInt8,
                   op, "dst_dtype", "must be torch.float8_e4m3fn, torch.float8_e5m2 or torch.int8");
  FLASHINFER_CHECK(!(tma_aligned || ue8m0) || column_major, op, "column_major_scales",
                   "scale_tma_aligned or scale_ue8m0 requires column_major_scales=True");
  FLASHINFER_CHECK(!column_major || x.dim() == 2, op, "x",
                   "column_major_scales needs a 2-D x [tokens, K]");
  FLASHINFER_CHECK(backend == "cutile" || backend == "cuda" || backend == "triton", op, "backend",
                   "unknown backend '", std::string(backend), "'");
  const int64_t groups = k / group_size;
  const int64_t rows = k == 0 ? 0 : x.numel() / k;
  Tensor q = Tensor::empty(x.shape(), out_dtype, x.device());
  Tensor s;
  kernels::GroupQuant8Params p;
  if (column_major) {
    const int64_t col = tma_aligned ? (rows + 3) / 4 * 4 : rows;
    Tensor raw = Tensor::empty({groups, col}, DType::kFloat32, x.device());
    s = raw.slice(1, 0, rows).transpose(0, 1);
    p.s_stride_row = 1;
    p.s_stride_group = col;
    p.scales = raw.data<float>();
    if (col > rows) p.scales_padded_total = groups * col;
  } else {
    Shape sh = x.shape();
    sh.back() = groups;
    s = Tensor::empty(sh, DType::kFloat32, x.device());
    p.s_stride_row = groups;
    p.s_stride_group = 1;
    p.scales = s.data<float>();
  }
  p.x = x.data_ptr();
  p.dtype = x.dtype();
  p.q = q.data_ptr();
  p.out_dtype = out_dtype;
  p.rows = rows;
  p.k = k;
  p.group_size = group_size;
  p.eps = static_cast<float>(eps);
  p.qmax = out_dtype == DType::kInt8           ? 127.0f
           : out_dtype == DType::kFloat8E4M3FN ? 448.0f
                                               : 57344.0f;
  p.qmin = out_dtype == DType::kInt8 ? -128.0f : -p.qmax;
  p.ue8m0 = ue8m0;
  api::launch_group_quant_8bit(p, x.device(), op, "x");
  return {q, s};
}

bool little_endian_order(std::string_view bitorder, const char* op) {
  FLASHINFER_CHECK(bitorder == "big" || bitorder == "little", op, "bitorder",
                   "must be 'big' or 'little', got '", std::string(bitorder), "'");
  return bitorder == "little";
}

// x as a host byte array of truth values (bool and uint8 share a byte per element).
Tensor host_bits(const Tensor& x, const char* op) {
  api::check_defined(x, op, "x");
  api::check_dtype_in(x, {DType::kBool, DType::kUInt8}, op, "x");
  return x.to(Device::cpu()).contiguous();
}

Tensor packbits_impl(const Tensor& x, std::string_view bitorder) {
  const char* op = "packbits";
  const bool little = little_endian_order(bitorder, op);
  const Tensor h = host_bits(x, op);
  const int64_t n = h.numel();
  Tensor out = Tensor::empty({(n + 7) / 8}, DType::kUInt8);
  api::launch(kPackKernels, PackParams{h.data<uint8_t>(), n, 1, little, out.data<uint8_t>()},
              Device::cpu(), op, "x");
  return out.to(x.device());
}

std::tuple<Tensor, Tensor> segment_packbits_impl(const Tensor& x, const Tensor& indptr,
                                                 std::string_view bitorder) {
  const char* op = "segment_packbits";
  const bool little = little_endian_order(bitorder, op);
  const Tensor h = host_bits(x, op);
  api::check_defined(indptr, op, "indptr");
  api::check_dim(indptr, {1}, op, "indptr");
  api::check_dtype_in(indptr, {DType::kInt32, DType::kInt64}, op, "indptr");
  api::check_same_device(indptr, x, op, "indptr", "x");
  FLASHINFER_CHECK(indptr.size(0) >= 1, op, "indptr", "must hold at least one offset");
  FLASHINFER_CHECK(x.dim() == 1, op, "x", "must be 1-D, got ", x.dim(), " dimensions");
  const Tensor ip = indptr.to(Device::cpu()).to(DType::kInt64).contiguous();
  const int64_t* o = ip.data<int64_t>();
  const int64_t segs = ip.size(0) - 1;
  std::vector<int64_t> new_ip(static_cast<std::size_t>(segs + 1), 0);
  for (int64_t i = 0; i < segs; ++i) {
    FLASHINFER_CHECK(o[i] >= 0 && o[i] <= o[i + 1] && o[i + 1] <= h.numel(), op, "indptr",
                     "segment ", i, " [", o[i], ", ", o[i + 1], ") is not inside x of ", h.numel(),
                     " elements");
    new_ip[i + 1] = new_ip[i] + (o[i + 1] - o[i] + 7) / 8;
  }
  Tensor out = Tensor::empty({new_ip.back()}, DType::kUInt8);
  for (int64_t i = 0; i < segs; ++i) {
    api::launch(kPackKernels,
                PackParams{h.data<uint8_t>() + o[i], o[i + 1] - o[i], 1, little,
                           out.data<uint8_t>() + new_ip[i]},
                Device::cpu(), op, "x");
  }
  Tensor nip = api::bench::int32_tensor(new_ip, Device::cpu());
  if (indptr.dtype() != DType::kInt32) nip = nip.to(indptr.dtype());
  return {out.to(x.device()), nip.to(x.device())};
}

}  // namespace

std::tuple<Tensor, Tensor> per_token_group_quant_8bit(const Tensor& x, int64_t group_size,
                                                      double eps, std::optional<DType> dst_dtype,
                                                      bool column_major_scales,
                                                      bool scale_tma_aligned, bool scale_ue8m0,
                                                      std::string_view backend) {
  return call_op<&per_token_group_quant_8bit>(
      [&] {
        return group_quant_impl(x, group_size, eps, dst_dtype, column_major_scales,
                                scale_tma_aligned, scale_ue8m0, backend);
      },
      x, group_size, eps, dst_dtype, column_major_scales, scale_tma_aligned, scale_ue8m0, backend);
}

Tensor packbits(const Tensor& x, std::string_view bitorder) {
  return call_op<&packbits>([&] { return packbits_impl(x, bitorder); }, x, bitorder);
}

std::tuple<Tensor, Tensor> segment_packbits(const Tensor& x, const Tensor& indptr,
                                            std::string_view bitorder) {
  return call_op<&segment_packbits>([&] { return segment_packbits_impl(x, indptr, bitorder); }, x,
                                    indptr, bitorder);
}

namespace {

// [m, k] input_dtype rows in groups of 128 (k rounded up to a multiple of 128), fp8 e4m3.
BenchCase bench_group_quant(const BenchShape& s, Device dev) {
  const int64_t k = (s.k + 127) / 128 * 128;
  const Shape x{s.m, k};
  BenchCase c = api::bench::invoke_case(
      "per_token_group_quant_8bit",
      {Value(api::bench::random_tensor(x, s.input_dtype, dev, s.random_seed)), Value(int64_t{128})},
      {{"column_major_scales", Value(true)}, {"scale_ue8m0", Value(true)}});
  c.flops = 3.0 * static_cast<double>(s.m * k);
  c.bytes = api::bench::nbytes(x, s.input_dtype) + api::bench::nbytes(x, DType::kFloat8E4M3FN) +
            api::bench::nbytes({s.m, k / 128}, DType::kFloat32);
  return c;
}

Tensor bench_bits(int64_t n, Device dev, uint64_t seed) {
  Tensor r = api::bench::random_tensor({n}, DType::kFloat32, Device::cpu(), seed);
  Tensor b = Tensor::empty({n}, DType::kBool);
  for (int64_t i = 0; i < n; ++i) b.data<uint8_t>()[i] = r.data<float>()[i] > 0.0f;
  return b.to(dev);
}

BenchCase bench_packbits(const BenchShape& s, Device dev) {
  const int64_t n = s.m * s.k + 3;
  BenchCase c = api::bench::invoke_case("packbits", {Value(bench_bits(n, dev, s.random_seed))});
  c.bytes = static_cast<double>(n + (n + 7) / 8);
  return c;
}

BenchCase bench_segment_packbits(const BenchShape& s, Device dev) {
  const int64_t n = s.m * s.k + 3;
  std::vector<int64_t> ip = {0};
  for (int64_t i = 1; ip.back() < n; ++i) ip.push_back(std::min(n, ip.back() + 7 * i + 1));
  BenchCase c = api::bench::invoke_case(
      "segment_packbits",
      {Value(bench_bits(n, dev, s.random_seed)), Value(api::bench::int32_tensor(ip, dev))},
      {{"bitorder", Value("little")}});
  c.bytes = static_cast<double>(n + (n + 7) / 8);
  return c;
}

}  // namespace

namespace detail {
void register_quant8_ops(OpRegistry& r) {
  declare<&per_token_group_quant_8bit>(
      r,
      {.name = "per_token_group_quant_8bit",
       .module = kQuant8Fp8Module,
       .summary = "Per-token-group 8-bit (fp8/int8) quantization with one fp32 scale per group"},
      "x", "group_size", arg("eps", 1e-10), "dst_dtype", arg("column_major_scales", false),
      arg("scale_tma_aligned", false), arg("scale_ue8m0", false), arg("backend", "cutile"));
  declare<&packbits>(r,
                     {.name = "packbits",
                      .module = kPackModule,
                      .summary = "Pack a bool tensor into uint8 bits (numpy.packbits)"},
                     "x", arg("bitorder", "big"));
  declare<&segment_packbits>(r,
                             {.name = "segment_packbits",
                              .module = kPackModule,
                              .summary = "packbits of each indptr segment: (packed, new_indptr)"},
                             "x", "indptr", arg("bitorder", "big"));
  api::register_backends("per_token_group_quant_8bit", kGroupQuantKernels);
  api::register_backends("packbits", kPackKernels);
  api::register_backends("segment_packbits", kPackKernels);
  register_bench_hook("per_token_group_quant_8bit", bench_group_quant);
  register_bench_hook("packbits", bench_packbits);
  register_bench_hook("segment_packbits", bench_segment_packbits);
}
}  // namespace detail

namespace api {
void launch_group_quant_8bit(const kernels::GroupQuant8Params& p, Device device, const char* op,
                             const char* arg) {
  launch(kGroupQuantKernels, p, device, op, arg);
}
}  // namespace api

}  // namespace flashinfer
