// CPU throughput of silu_and_mul, gelu_and_mul and gelu_tanh_and_mul ([rows, 2d] -> [rows, d])
// as bytes moved per second and as a fraction of the memcpy bandwidth measured in the same run.
#include <benchmark/benchmark.h>

#include "bench_bandwidth.h"
#include "flashinfer/flashinfer.h"

namespace {

using namespace flashinfer;
using flashinfer::bench::report_traffic;

using ActFn = Tensor (*)(const Tensor&, std::optional<Tensor>, std::optional<bool>);

void BM_ActAndMul(benchmark::State& state, ActFn fn, DType dtype) {
  const int64_t rows = state.range(0), d = state.range(1);
  Tensor x = Tensor::empty({rows, 2 * d}, dtype);
  Tensor out = Tensor::empty({rows, d}, dtype);
  x.uniform_(1, -4, 4);
  for (auto _ : state) {
    fn(x, out, std::nullopt);
    benchmark::DoNotOptimize(out.data_ptr());
  }
  report_traffic(state, 3.0 * rows * d * static_cast<double>(dtype_size(dtype)));
}
Tensor silu(const Tensor& x, std::optional<Tensor> o, std::optional<bool> p) {
  return silu_and_mul(x, std::move(o), p);
}
Tensor gelu(const Tensor& x, std::optional<Tensor> o, std::optional<bool> p) {
  return gelu_and_mul(x, std::move(o), p);
}
Tensor gelu_tanh(const Tensor& x, std::optional<Tensor> o, std::optional<bool> p) {
  return gelu_tanh_and_mul(x, std::move(o), p);
}
// Llama-7B MLP width (11008), 1024 tokens: 43 MiB in, 22 MiB out in fp16.
BENCHMARK_CAPTURE(BM_ActAndMul, silu_fp16, silu, DType::kFloat16)
    ->Args({1024, 11008})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ActAndMul, silu_bf16, silu, DType::kBFloat16)
    ->Args({1024, 11008})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ActAndMul, silu_fp32, silu, DType::kFloat32)
    ->Args({512, 11008})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ActAndMul, gelu_fp16, gelu, DType::kFloat16)
    ->Args({1024, 11008})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ActAndMul, gelu_tanh_fp16, gelu_tanh, DType::kFloat16)
    ->Args({1024, 11008})
    ->UseRealTime();

BENCHMARK(flashinfer::bench::BM_MemcpyBaseline)->Arg(64)->UseRealTime();

}  // namespace
