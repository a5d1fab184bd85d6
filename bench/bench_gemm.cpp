// CPU GEMM and quantization throughput. Every GEMM reports FLOP/s and `vs_sgemm`: its FLOP/s
// divided by plain OpenBLAS sgemm's on fp32 operands of the same shape, measured in the same run
// (the op's extra work is converting its low-precision inputs to fp32 tiles and rounding the
// output). Quantizers report bytes/s (input read + quantized data + scales written).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>
#include <vector>

#include "flashinfer/flashinfer.h"

namespace {

using namespace flashinfer;

// Best-of-5 FLOP/s of cblas_sgemm (row-major, A [m, k] x B^T with B [n, k]) for one shape,
// cached so every op at that shape compares with the same baseline.
double sgemm_flops(int64_t m, int64_t n, int64_t k) {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, double> cache;
  auto key = std::make_tuple(m, n, k);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  std::vector<float> a(m * k, 0.5f), b(n * k, 0.25f), c(m * n);
  double best = 1e30;
  for (int rep = 0; rep < 8; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k,
                0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, s);  // the first call warms the thread pool
  }
  return cache[key] = 2.0 * m * n * k / best;
}

void report(benchmark::State& state, int64_t batch, int64_t m, int64_t n, int64_t k) {
  const double flop = 2.0 * batch * m * n * k;
  state.counters["FLOP/s"] =
      benchmark::Counter(flop * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["sgemm_FLOP/s"] = sgemm_flops(m, n, k);
}

// Adds vs_sgemm once the timing is known (Google Benchmark computes rates after the loop, so the
// ratio is derived from the measured real time per iteration).
void ratio(benchmark::State& state, int64_t batch, int64_t m, int64_t n, int64_t k,
           double seconds) {
  const double flops = 2.0 * batch * m * n * k / seconds;
  state.counters["vs_sgemm"] = flops / sgemm_flops(m, n, k);
}

// Runs the timed loop and returns the best iteration's seconds: on a shared machine the minimum
// is the robust estimate, and the sgemm baseline is a best-of too.
template <class Fn>
double time_loop(benchmark::State& state, Fn&& fn) {
  double best = 1e30;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void BM_SgemmOpenBlas(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * n * n * n * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SgemmOpenBlas)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MmBf16(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor a = Tensor::empty({n, n}, DType::kBFloat16).uniform_(1);
  Tensor b = Tensor::empty({n, n}, DType::kBFloat16).uniform_(2).transpose(0, 1);
  Tensor out = Tensor::empty({n, n}, DType::kBFloat16);
  const double s = time_loop(state, [&] {
    mm_bf16(a, b, std::nullopt, false, out);
    benchmark::DoNotOptimize(out.data_ptr());
  });
  report(state, 1, n, n, n);
  ratio(state, 1, n, n, n, s);
}
BENCHMARK(BM_MmBf16)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_BmmFp8(benchmark::State& state) {
  const int64_t batch = state.range(0), n = state.range(1);
  Tensor A = Tensor::empty({batch, n, n}, DType::kFloat8E4M3FN).uniform_(3, -4, 4);
  Tensor B = Tensor::empty({batch, n, n}, DType::kFloat8E4M3FN).uniform_(4, -4, 4).transpose(1, 2);
  Tensor s1 = Tensor::full({1}, 0.5, DType::kFloat32);
  Tensor out = Tensor::empty({batch, n, n}, DType::kBFloat16);
  const double s = time_loop(state, [&] {
    bmm_fp8(A, B, s1, s1, DType::kBFloat16, out);
    benchmark::DoNotOptimize(out.data_ptr());
  });
  report(state, batch, n, n, n);
  ratio(state, batch, n, n, n, s);
}
BENCHMARK(BM_BmmFp8)
    ->Args({1, 512})
    ->Args({1, 1024})
    ->Args({4, 512})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_MmFp4(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor a = Tensor::empty({n, n}, DType::kBFloat16).uniform_(5);
  Tensor w = Tensor::empty({n, n}, DType::kBFloat16).uniform_(6);
  Tensor gs = Tensor::full({1}, 448.0 * 6.0, DType::kFloat32);
  auto [qa, sfa] = nvfp4_quantize(a, gs);
  auto [qb, sfb] = nvfp4_quantize(w, gs);
  Tensor alpha = Tensor::full({1}, 1.0 / (448.0 * 6.0 * 448.0 * 6.0), DType::kFloat32);
  Tensor out = Tensor::empty({n, n}, DType::kBFloat16);
  Tensor bt = qb.transpose(0, 1), sbt = sfb.transpose(0, 1);
  const double s = time_loop(state, [&] {
    mm_fp4(qa, bt, sfa, sbt, alpha, DType::kBFloat16, out);
    benchmark::DoNotOptimize(out.data_ptr());
  });
  report(state, 1, n, n, n);
  ratio(state, 1, n, n, n, s);
}
BENCHMARK(BM_MmFp4)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- quantizers -----------------------------------------------------------------------------

void BM_Nvfp4Quantize(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1);
  Tensor x = Tensor::empty({m, k}, DType::kBFloat16).uniform_(7);
  Tensor gs = Tensor::full({1}, 448.0 * 6.0, DType::kFloat32);
  for (auto _ : state) {
    auto r = nvfp4_quantize(x, gs);
    benchmark::DoNotOptimize(std::get<0>(r).data_ptr());
  }
  const double bytes = m * k * 2.0 + m * k / 2.0 + m * k / 16.0;
  state.SetBytesProcessed(static_cast<int64_t>(bytes * state.iterations()));
}
BENCHMARK(BM_Nvfp4Quantize)->Args({1024, 4096})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Mxfp4Quantize(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1);
  Tensor x = Tensor::empty({m, k}, DType::kBFloat16).uniform_(8);
  for (auto _ : state) {
    auto r = mxfp4_quantize(x);
    benchmark::DoNotOptimize(std::get<0>(r).data_ptr());
  }
  const double bytes = m * k * 2.0 + m * k / 2.0 + m * k / 32.0;
  state.SetBytesProcessed(static_cast<int64_t>(bytes * state.iterations()));
}
BENCHMARK(BM_Mxfp4Quantize)->Args({1024, 4096})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Mxfp8Quantize(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1);
  Tensor x = Tensor::empty({m, k}, DType::kBFloat16).uniform_(9);
  for (auto _ : state) {
    auto r = mxfp8_quantize(x);
    benchmark::DoNotOptimize(std::get<0>(r).data_ptr());
  }
  const double bytes = m * k * 2.0 + m * k + m * k / 32.0;
  state.SetBytesProcessed(static_cast<int64_t>(bytes * state.iterations()));
}
BENCHMARK(BM_Mxfp8Quantize)->Args({1024, 4096})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
