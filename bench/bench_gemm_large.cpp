// Large-m CPU GEMMs (prefill-sized, m > 128) through the public ops, the cases
// bench/compare_torch.py times beside torch's bf16 matmul of the same shape (docs/PERFORMANCE.md,
// "Versus PyTorch"). Args: m, n, k. mm_bf16 multiplies a bf16 [m, k] by the transpose of a bf16
// [n, k] weight; mm_fp8 an e4m3 [m, k] by a prepared e4m3 [n, k] weight with an fp32 alpha.
#include <benchmark/benchmark.h>

#include "flashinfer/flashinfer.h"

namespace {

using namespace flashinfer;

void set_flops(benchmark::State& state, int64_t m, int64_t n, int64_t k) {
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void BM_MmBf16Large(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Tensor a = Tensor::empty({m, k}, DType::kFloat32).normal_(1, 0, 1).to(DType::kBFloat16);
  Tensor w = Tensor::empty({n, k}, DType::kFloat32).normal_(2, 0, 1).to(DType::kBFloat16);
  Tensor b = w.transpose(0, 1);
  Tensor out = Tensor::empty({m, n}, DType::kBFloat16);
  mm_bf16(a, b, std::nullopt, false, out);  // warm-up: oneDNN's JIT, scratch allocation
  for (auto _ : state) benchmark::DoNotOptimize(mm_bf16(a, b, std::nullopt, false, out).data_ptr());
  set_flops(state, m, n, k);
}

void BM_MmFp8Large(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Tensor a = Tensor::empty({m, k}, DType::kFloat32).normal_(3, 0, 64).to(DType::kFloat8E4M3FN);
  Tensor w = Tensor::empty({n, k}, DType::kFloat32).normal_(4, 0, 64).to(DType::kFloat8E4M3FN);
  Tensor prepared = prepare_low_latency_gemm_weights(w, Value());
  Tensor alpha = Tensor::full({1}, 1.0 / 4096.0, DType::kFloat32);
  Tensor out = Tensor::empty({m, n}, DType::kBFloat16);
  mm_fp8(a, prepared, alpha, DType::kBFloat16, out);  // warm-up, as above
  for (auto _ : state) {
    benchmark::DoNotOptimize(mm_fp8(a, prepared, alpha, DType::kBFloat16, out).data_ptr());
  }
  set_flops(state, m, n, k);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"m", "n", "k"});
  b->Args({256, 4096, 4096});
  b->Args({1024, 1024, 1024});
  b->Args({512, 2048, 2048});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_MmBf16Large)->Apply(shapes);
BENCHMARK(BM_MmFp8Large)->Apply(shapes);

}  // namespace
