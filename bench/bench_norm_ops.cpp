// CPU throughput of fused_add_rmsnorm, gemma_rmsnorm and layernorm, as bytes moved per second
// and as a fraction of the memcpy bandwidth measured in the same run (bench_bandwidth.h).
// Working sets are far larger than the last-level cache so the figures are DRAM-bound.
#include <benchmark/benchmark.h>

#include "bench_bandwidth.h"
#include "flashinfer/flashinfer.h"

namespace {

using namespace flashinfer;
using flashinfer::bench::report_traffic;

void BM_FusedAddRmsNorm(benchmark::State& state, DType dtype) {
  const int64_t batch = state.range(0), hidden = state.range(1);
  Tensor x = Tensor::empty({batch, hidden}, dtype);
  Tensor r = Tensor::empty({batch, hidden}, dtype);
  Tensor w = Tensor::empty({hidden}, dtype);
  x.uniform_(1);
  r.uniform_(2);
  w.uniform_(3);
  for (auto _ : state) {
    fused_add_rmsnorm(x, r, w);
    benchmark::DoNotOptimize(x.data_ptr());
  }
  // Reads input and residual, writes both.
  report_traffic(state, 4.0 * batch * hidden * static_cast<double>(dtype_size(dtype)));
}
BENCHMARK_CAPTURE(BM_FusedAddRmsNorm, fp16, DType::kFloat16)->Args({4096, 4096})->UseRealTime();
BENCHMARK_CAPTURE(BM_FusedAddRmsNorm, bf16, DType::kBFloat16)->Args({4096, 4096})->UseRealTime();
BENCHMARK_CAPTURE(BM_FusedAddRmsNorm, fp32, DType::kFloat32)->Args({2048, 4096})->UseRealTime();

void BM_GemmaRmsNorm(benchmark::State& state, DType dtype) {
  const int64_t batch = state.range(0), hidden = state.range(1);
  Tensor x = Tensor::empty({batch, hidden}, dtype);
  Tensor w = Tensor::empty({hidden}, dtype);
  Tensor out = Tensor::empty({batch, hidden}, dtype);
  x.uniform_(1);
  w.uniform_(2);
  for (auto _ : state) {
    gemma_rmsnorm(x, w, 1e-6, out);
    benchmark::DoNotOptimize(out.data_ptr());
  }
  report_traffic(state, 2.0 * batch * hidden * static_cast<double>(dtype_size(dtype)));
}
BENCHMARK_CAPTURE(BM_GemmaRmsNorm, bf16, DType::kBFloat16)->Args({4096, 4096})->UseRealTime();

void BM_LayerNorm(benchmark::State& state, DType dtype) {
  const int64_t batch = state.range(0), hidden = state.range(1);
  Tensor x = Tensor::empty({batch, hidden}, dtype);
  Tensor g = Tensor::empty({hidden}, DType::kFloat32);
  Tensor b = Tensor::empty({hidden}, DType::kFloat32);
  x.uniform_(1);
  g.uniform_(2);
  b.uniform_(3);
  for (auto _ : state) {
    Tensor y = layernorm(x, g, b);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  report_traffic(state, 2.0 * batch * hidden * static_cast<double>(dtype_size(dtype)));
}
BENCHMARK_CAPTURE(BM_LayerNorm, bf16, DType::kBFloat16)->Args({4096, 4096})->UseRealTime();

BENCHMARK(flashinfer::bench::BM_MemcpyBaseline)->Arg(64)->UseRealTime();

}  // namespace
