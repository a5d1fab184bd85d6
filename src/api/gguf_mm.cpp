// mm_gguf (module flashinfer_cpp.gguf): GEMM on GGUF-quantized weight rows. An op of ours, not
// upstream's (FlashInfer has no GGML block formats), declared like the others so it is logged,
// recorded and replayed; tests/api/data/conformance-allowlist.tsv says why it is not upstream.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/gguf_mm.h"
#include "kernels/cpu/gguf_mm_cpu.h"
#include "replay/result_comparators.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/gguf_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kGgufMmModule = "flashinfer_cpp.gguf";
constexpr const char* kGgufMmOp = "mm_gguf";

constexpr api::KernelEntry<kernels::GgufMmParams> kGgufMmKernels[] = {
    {DeviceType::kCPU,
     "CPU: blocks dequantized in registers (AVX-512 BF16: Q4_1 codes x split activations), fp32 "
     "accumulation, OpenMP rows, AVX2/AVX-512 tiers",
     nullptr,
     [](const kernels::GgufMmParams& p, const api::LaunchContext&) { kernels::cpu::gguf_mm(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel: blocks read byte-wise and dequantized on the fly, fp32 accumulation; m < 16 one "
     "warp per weight row, m >= 16 32x32 tiles through shared memory",
     nullptr,
     [](const kernels::GgufMmParams& p, const api::LaunchContext& c) {
       kernels::cuda::gguf_mm(p, c.stream);
     }},
#endif
};

kernels::GgmlQuantType gguf_mm_parse_quant_type(std::string_view t) {
  if (t == "Q4_1") return kernels::GgmlQuantType::kQ4_1;
  if (t == "Q8_0") return kernels::GgmlQuantType::kQ8_0;
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, kGgufMmOp, "quant_type",
                  "must be \"Q4_1\" or \"Q8_0\", got \"", t, "\"");
}

Tensor mm_gguf_impl(const Tensor& a, const Tensor& b, std::string_view quant_type,
                    const std::optional<Tensor>& out, DType out_dtype) {
  const kernels::GgmlQuantType type = gguf_mm_parse_quant_type(quant_type);
  api::check_defined(a, kGgufMmOp, "a");
  api::check_defined(b, kGgufMmOp, "b");
  api::check_dim(a, {2}, kGgufMmOp, "a");
  api::check_dtype_in(a, {DType::kBFloat16, DType::kFloat16, DType::kFloat32}, kGgufMmOp, "a");
  api::check_non_empty(a, kGgufMmOp, "a");
  const int64_t m = a.size(0), k = a.size(1);
  FLASHINFER_CHECK(k % kernels::kGgmlBlockValues == 0, kGgufMmOp, "a",
                   "k (a.size(1)) must be a multiple of 32 (the GGML block), got ", k);
  api::check_dim(b, {2}, kGgufMmOp, "b");
  api::check_dtype_in(b, {DType::kUInt8}, kGgufMmOp, "b");
  api::check_same_device(b, a, kGgufMmOp, "b", "a");
  const int64_t row_bytes = k / kernels::kGgmlBlockValues * kernels::ggml_block_bytes(type);
  FLASHINFER_CHECK(b.size(1) == row_bytes, kGgufMmOp, "b", "a ", quant_type, " row of k = ", k,
                   " values is ", row_bytes, " bytes, but b.size(1) is ", b.size(1));
  FLASHINFER_CHECK(b.stride(1) == 1 || b.size(1) == 1, kGgufMmOp, "b",
                   "rows of blocks must be contiguous (stride(1) == 1), got stride ", b.stride(1));
  FLASHINFER_CHECK(b.size(0) <= 1 || b.stride(0) >= row_bytes, kGgufMmOp, "b",
                   "rows must not overlap: stride(0) ", b.stride(0), " < row bytes ", row_bytes);
  const int64_t n = b.size(0);
  FLASHINFER_CHECK(
      out_dtype == DType::kBFloat16 || out_dtype == DType::kFloat16 || out_dtype == DType::kFloat32,
      kGgufMmOp, "out_dtype", "must be bfloat16, float16 or float32, got ", dtype_name(out_dtype));
  Tensor result;
  if (out) {
    api::check_defined(*out, kGgufMmOp, "out");
    api::check_shape_eq(*out, {m, n}, kGgufMmOp, "out");
    FLASHINFER_CHECK(out->dtype() == out_dtype, kGgufMmOp, "out", "dtype ",
                     dtype_name(out->dtype()), " is not out_dtype ", dtype_name(out_dtype));
    api::check_same_device(*out, a, kGgufMmOp, "out", "a");
    api::check_writable(*out, kGgufMmOp, "out");
    api::check_no_overlap(*out, a, kGgufMmOp, "out", "a");
    api::check_no_overlap(*out, b, kGgufMmOp, "out", "b");
    result = *out;
  } else {
    result = Tensor::empty({m, n}, out_dtype, a.device());
  }
  if (n == 0) return result;
  kernels::GgufMmParams p;
  p.a = a.data_ptr();
  p.a_dtype = a.dtype();
  p.m = m;
  p.k = k;
  p.a_stride_m = a.stride(0);
  p.a_stride_k = a.stride(1);
  p.b = static_cast<const uint8_t*>(b.data_ptr());
  p.n = n;
  p.b_row_bytes = b.stride(0);
  p.type = type;
  p.out = result.data_ptr();
  p.out_dtype = out_dtype;
  p.out_stride_m = result.stride(0);
  p.out_stride_n = result.stride(1);
  api::launch(kGgufMmKernels, p, a.device(), kGgufMmOp, "a");
  return result;
}

// Random well-formed blocks for the bench hook (scales in a sane range, so sums stay O(1)).
Tensor random_gguf_rows(int64_t n, int64_t k, kernels::GgmlQuantType type, uint64_t seed) {
  const int64_t bytes = kernels::ggml_block_bytes(type), blocks = k / kernels::kGgmlBlockValues;
  Tensor b = Tensor::empty({n, blocks * bytes}, DType::kUInt8);
  auto* p = static_cast<uint8_t*>(b.data_ptr());
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  for (int64_t i = 0; i < n * blocks; ++i) {
    uint8_t* blk = p + i * bytes;
    for (int64_t j = 0; j < bytes; ++j) blk[j] = static_cast<uint8_t>(rng());
    const uint16_t d = float_to_half_bits(scale(rng));
    const uint16_t mn = float_to_half_bits(-8.0f * scale(rng));
    std::memcpy(blk, &d, 2);
    if (type == kernels::GgmlQuantType::kQ4_1) std::memcpy(blk + 2, &mn, 2);
  }
  return b;
}

// Bench: a [m, k] (input_dtype) times an [n, k] Q4_1 weight; bytes are what a decode reads.
BenchCase bench_mm_gguf(const BenchShape& s, Device dev) {
  const int64_t k = std::max<int64_t>(32, s.k / 32 * 32);
  const auto type = kernels::GgmlQuantType::kQ4_1;
  Tensor a = api::bench::random_tensor({s.m, k}, s.input_dtype, dev, s.random_seed);
  Tensor b = random_gguf_rows(s.n, k, type, s.random_seed + 1).to(dev);
  const DType out_dt = s.out_dtype.value_or(DType::kBFloat16);
  BenchCase c = api::bench::invoke_case(kGgufMmOp, {Value(a), Value(b), Value("Q4_1")},
                                        {{"out_dtype", Value(out_dt)}});
  c.flops = 2.0 * static_cast<double>(s.m * s.n * k);
  c.bytes = static_cast<double>(b.numel()) + api::bench::nbytes({s.m, k}, s.input_dtype) +
            api::bench::nbytes({s.m, s.n}, out_dt);
  return c;
}

// Replay's comparison of mm_gguf's result (replay/result_comparators.h): two correct kernels
// differ by how they sum each dot product (the GPU's fp32 order; the CPU's AVX-512 VNNI path
// splits the activations into two int8 parts, about 16 bits of each block's largest value), by
// more than replay's fp32 tolerance where terms cancel. An element passes within replay's own
// tolerance or within the bound of those differences, from the recorded inputs:
//   2 (k + 2) 2^-24 sum_k |a w|  (two fp32 orders of k terms)
//   + 2^-14 sum_blocks max|a_block| (|d| sum|q| + 32 |m|)  (the int8 split's residue, at most
//     2^-15 of a block's largest activation an element, with a factor 2 of margin)
//   + 2 ulp of out_dtype at the value (each side's final rounding).
// Both terms are worst cases (a few units in the 4th digit of sum |a w| at k = 576); a wrong
// kernel (a term lost, a block misread) misses by the size of a product, far outside them.
bool compare_mm_gguf(const std::vector<Value>& args, const std::map<std::string, Tensor>& actual,
                     const NamedTensors& expected, const detail::CompareFn& compare,
                     detail::ResultCheck& out) {
  const std::string key = "result";
  const Tensor* e = nullptr;
  for (const auto& [k, t] : expected) {
    if (k == key) e = &t;
  }
  const auto it = actual.find(key);
  if (e == nullptr || it == actual.end() || args.size() < 3 || !args[0].is_tensor() ||
      !args[1].is_tensor() || args[2].kind() != Value::Kind::kString) {
    return false;
  }
  replay::TensorComparison c = compare(key, it->second, *e);
  out.note =
      "mm_gguf: elements outside the replay's tolerance checked against the bound of its "
      "sums' orders (src/api/gguf_mm.cpp)";
  if (c.match || !c.problem.empty()) {
    out.comparisons.push_back(c);
    return true;
  }
  const Tensor a = args[0].as_tensor().to(Device::cpu()).to(DType::kFloat32).contiguous();
  const Tensor b = args[1].as_tensor().to(Device::cpu()).contiguous();
  const kernels::GgmlQuantType type = gguf_mm_parse_quant_type(args[2].as_string());
  const Tensor got = it->second.to(Device::cpu()).to(DType::kFloat32).contiguous();
  const Tensor want = e->to(Device::cpu()).to(DType::kFloat32).contiguous();
  const int64_t m = a.dim() == 2 ? a.size(0) : 0, k = a.dim() == 2 ? a.size(1) : 0;
  const int64_t n = b.dim() == 2 ? b.size(0) : 0, blocks = k / 32;
  if (m * n != got.numel() || m * n != want.numel() || blocks * 32 != k) {
    out.comparisons.push_back(c);
    return true;
  }
  const int64_t bb = kernels::ggml_block_bytes(type);
  const double out_ulp = std::ldexp(1.0, e->dtype() == DType::kBFloat16  ? -7
                                         : e->dtype() == DType::kFloat16 ? -10
                                                                         : -23);
  const float* av = a.data<float>();
  const float* gv = got.data<float>();
  const float* wv = want.data<float>();
  const auto* bv = static_cast<const uint8_t*>(b.data_ptr());
  std::vector<float> w(static_cast<std::size_t>(k));
  std::vector<double> split(static_cast<std::size_t>(blocks));  // |d| sum|q| + 32 |m| a block
  std::vector<double> amax(static_cast<std::size_t>(m * blocks));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t q = 0; q < blocks; ++q) {
      double mx = 0.0;
      for (int64_t t = 0; t < 32; ++t) mx = std::max(mx, std::fabs(double(av[i * k + q * 32 + t])));
      amax[static_cast<std::size_t>(i * blocks + q)] = mx;
    }
  }
  int64_t bad = 0, first = -1;
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* row = bv + j * blocks * bb;
    kernels::cpu::gguf_dequantize_row(type, row, blocks, w.data());
    for (int64_t q = 0; q < blocks; ++q) {
      const uint8_t* blk = row + q * bb;
      uint16_t dh = 0, mh = 0;
      std::memcpy(&dh, blk, 2);
      double qs = 0.0, mabs = 0.0;
      if (type == kernels::GgmlQuantType::kQ4_1) {
        std::memcpy(&mh, blk + 2, 2);
        for (int64_t t = 0; t < 16; ++t) qs += (blk[4 + t] & 0xF) + (blk[4 + t] >> 4);
        mabs = std::fabs(double(half_bits_to_float(mh)));
      } else {
        for (int64_t t = 0; t < 32; ++t) qs += std::abs(static_cast<int8_t>(blk[2 + t]));
      }
      split[static_cast<std::size_t>(q)] =
          std::fabs(double(half_bits_to_float(dh))) * qs + 32 * mabs;
    }
    for (int64_t i = 0; i < m; ++i) {
      const int64_t at = i * n + j;
      const double g = gv[at], x = wv[at];
      if (std::isnan(g) || std::isnan(x)) {
        if (std::isnan(g) != std::isnan(x)) {
          ++bad;
          if (first < 0) first = at;
        }
        continue;
      }
      const double diff = std::fabs(g - x);
      if (diff <= c.atol + c.rtol * std::fabs(x)) continue;
      double mag = 0.0, cut = 0.0;
      for (int64_t t = 0; t < k; ++t) mag += std::fabs(double(av[i * k + t]) * double(w[t]));
      for (int64_t q = 0; q < blocks; ++q) {
        cut += amax[static_cast<std::size_t>(i * blocks + q)] * split[static_cast<std::size_t>(q)];
      }
      const double bound = 2.0 * double(k + 2) * std::ldexp(mag, -24) + std::ldexp(cut, -14) +
                           2.0 * out_ulp * std::fabs(x) + c.atol;
      if (!(diff <= bound)) {
        ++bad;
        if (first < 0) first = at;
      }
    }
  }
  c.mismatches = bad;
  c.first_mismatch = first;
  c.match = bad == 0;
  out.comparisons.push_back(c);
  return true;
}

}  // namespace

Tensor mm_gguf(const Tensor& a, const Tensor& b, std::string_view quant_type,
               std::optional<Tensor> out, DType out_dtype) {
  return call_op<&mm_gguf>([&] { return mm_gguf_impl(a, b, quant_type, out, out_dtype); }, a, b,
                           quant_type, out, out_dtype);
}

namespace detail {
void register_gguf_mm_ops(OpRegistry& r) {
  declare<&mm_gguf>(r,
                    {.name = "mm_gguf",
                     .module = kGgufMmModule,
                     .summary = "GEMM on GGUF Q4_1/Q8_0 weight rows: a [m, k] @ dequant(b [n, "
                                "blocks])^T, fp32 accumulation"},
                    "a", "b", "quant_type", arg("out").mut(), arg("out_dtype", DType::kBFloat16));
  api::register_backends(kGgufMmOp, kGgufMmKernels);
  register_bench_hook(kGgufMmOp, bench_mm_gguf);
  register_result_comparator_with_args(kGgufMmOp, compare_mm_gguf);
}
}  // namespace detail

}  // namespace flashinfer
