// CPU throughput of silu_and_mul, gelu_and_mul and gelu_tanh_and_mul ([rows, 2d] -> [rows, d])
// in fp16, bf16 and fp32, as bytes moved per second and as a fraction of the memcpy bandwidth
// measured in the same run. FLASHINFER_BENCH_CPU_ISA=scalar|avx2|avx512 caps the vector tier.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

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
// The same ops on 16 rows (8 in fp32: 1.3 MiB in, 0.7 MiB out), called over and over, so the
// rows stay in L2 (2 MiB per core on the development VM): the compute cost per element with memory
// out of the way. Run with OMP_NUM_THREADS=1 for the cost per element on one core (the op splits
// rows over the team).
void BM_ActAndMulCached(benchmark::State& state, ActFn fn, DType dtype) {
  flashinfer::bench::apply_isa_cap_from_env();
  const int64_t rows = dtype == DType::kFloat32 ? 8 : 16, d = 11008;
  Tensor x = Tensor::empty({rows, 2 * d}, dtype);
  Tensor out = Tensor::empty({rows, d}, dtype);
  x.uniform_(1, -4, 4);
  for (auto _ : state) {
    fn(x, out, std::nullopt);
    benchmark::DoNotOptimize(out.data_ptr());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * rows * d);
  state.counters["ns_per_element"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * rows * d,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// With --benchmark_repetitions: the fastest repetition, the least disturbed by other tenants.
double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

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

#define FI_ACT_CACHED_BENCH(dt, DT)                                           \
  BENCHMARK_CAPTURE(BM_ActAndMulCached, silu_##dt, silu, DType::DT)           \
      ->UseRealTime()                                                         \
      ->ComputeStatistics("min", min_of);                                     \
  BENCHMARK_CAPTURE(BM_ActAndMulCached, gelu_##dt, gelu, DType::DT)           \
      ->UseRealTime()                                                         \
      ->ComputeStatistics("min", min_of);                                     \
  BENCHMARK_CAPTURE(BM_ActAndMulCached, gelu_tanh_##dt, gelu_tanh, DType::DT) \
      ->UseRealTime()                                                         \
      ->ComputeStatistics("min", min_of);

FI_ACT_BENCH(fp16, kFloat16)
FI_ACT_BENCH(bf16, kBFloat16)
FI_ACT_BENCH(fp32, kFloat32)

FI_ACT_CACHED_BENCH(fp16, kFloat16)
FI_ACT_CACHED_BENCH(bf16, kBFloat16)
FI_ACT_CACHED_BENCH(fp32, kFloat32)

BENCHMARK(flashinfer::bench::BM_MemcpyBaseline)->Arg(128)->UseRealTime();

}  // namespace
