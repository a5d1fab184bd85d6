// mm_gguf (module flashinfer_cpp.gguf): GEMM on GGUF-quantized weight rows. An op of ours, not
// upstream's (FlashInfer has no GGML block formats), declared like the others so it is logged,
// recorded and replayed; tests/api/data/conformance-allowlist.tsv says why it is not upstream.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/gguf_mm.h"
#include "kernels/cpu/gguf_mm_cpu.h"
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
}
}  // namespace detail

}  // namespace flashinfer
