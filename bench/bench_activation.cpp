// CPU throughput of silu_and_mul, gelu_and_mul and gelu_tanh_and_mul ([rows, 2d] -> [rows, d])
// in fp16, bf16 and fp32, as bytes moved per second and as a fraction of the memcpy bandwidth
// measured in the same run. FLASHINFER_BENCH_CPU_ISA=scalar|avx2|avx512 caps the vector tier.
#include <benchmark/benchmark.h>

#include "bench_bandwidth.h"
#include "flashinfer/flashinfer.h"

namespace {

using namespace flashinfer;
using flashinfer::bench::report_traffic;

using ActFn = Tensor (*)(const Tensor&, std::optional<Tensor>, std::optional<bool>);

// Llama-7B MLP width (11008): at the default scale 4 (bench_scale), 4096 tokens in 16-bit types
// (172 MiB in, 86 MiB out), 2048 in fp32.
void BM_ActAndMul(benchmark::State& state, ActFn fn, DType dtype) {
  flashinfer::bench::apply_isa_cap_from_env();
  const int64_t rows = (dtype == DType::kFloat32 ? 512 : 1024) * flashinfer::bench::bench_scale();
  const int64_t d = 11008;
  Tensor x = Tensor::empty({rows, 2 * d}, dtype);
  Tensor out = Tensor::empty({rows, d}, dtype);
  x.uniform_(1, -4, 4);
  flashinfer::bench::BestIteration best;
  for (auto _ : state) {
    best.start();
    fn(x, out, std::nullopt);
    best.stop();
    benchmark::DoNotOptimize(out.data_ptr());
  }
  report_traffic(state, 3.0 * rows * d * static_cast<double>(dtype_size(dtype)), best.best_s);
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

#define FI_ACT_BENCH(dt, DT)                                                  \
  BENCHMARK_CAPTURE(BM_ActAndMul, silu_##dt, silu, DType::DT)->UseRealTime(); \
  BENCHMARK_CAPTURE(BM_ActAndMul, gelu_##dt, gelu, DType::DT)->UseRealTime(); \
  BENCHMARK_CAPTURE(BM_ActAndMul, gelu_tanh_##dt, gelu_tanh, DType::DT)->UseRealTime();

FI_ACT_BENCH(fp16, kFloat16)
FI_ACT_BENCH(bf16, kBFloat16)
FI_ACT_BENCH(fp32, kFloat32)

BENCHMARK(flashinfer::bench::BM_MemcpyBaseline)->Arg(128)->UseRealTime();

}  // namespace
