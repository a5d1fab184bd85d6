// mm_gguf on the CPU at SmolLM2-135M's shapes: decode (m = 1: the figure is weight bytes per
// second) and prefill (m = 64), per tier, with bf16 and fp32 activations, against mm_bf16 on
// the same shapes with bf16 weights (three times the bytes) as the same-run baseline.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gguf_mm_cpu.h"

namespace {

using namespace flashinfer;
using kernels::cpu::CpuIsa;

Tensor random_blocks(int64_t n, int64_t k, bool q4) {
  const int64_t bb = q4 ? 20 : 34, blocks = k / 32;
  Tensor b = Tensor::empty({n, blocks * bb}, DType::kUInt8);
  auto* p = static_cast<uint8_t*>(b.data_ptr());
  std::mt19937_64 rng(1);
  for (int64_t i = 0; i < b.numel(); ++i) p[i] = static_cast<uint8_t>(rng());
  const uint16_t d = float_to_half_bits(0.01f), m = float_to_half_bits(-0.08f);
  for (int64_t i = 0; i < n * blocks; ++i) {
    std::memcpy(p + i * bb, &d, 2);
    if (q4) std::memcpy(p + i * bb + 2, &m, 2);
  }
  return b;
}

// Args: m, n, k, q4 (1) or Q8_0 (0), tier; activation dtype bf16 (BM_MmGguf) or fp32
// (BM_MmGgufFp32, the chat's case: m = 1 on AVX-512 VNNI takes the two-int8-part path, else
// Q4_1 on AVX-512 BF16 + VBMI the two-bf16-part split path). The fp32 runs also report
// err_vs_scalar: max |out - scalar tier's out| over max |scalar tier's out| (about 2e-5 for the
// int8 path, 3e-6 for the bf16 split path, docs/CHAT.md).
void run_mm_gguf(benchmark::State& state, DType a_dtype) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool q4 = state.range(3) != 0;
  const auto isa = static_cast<CpuIsa>(state.range(4));
  if (isa > kernels::cpu::detected_cpu_isa()) {
    state.SkipWithError("tier not available on this CPU");
    return;
  }
  const CpuIsa old = kernels::cpu::cpu_isa_cap();
  kernels::cpu::set_cpu_isa_cap(isa);
  Tensor a = Tensor::empty({m, k}, a_dtype);
  a.uniform_(3, -1.0, 1.0);
  Tensor b = random_blocks(n, k, q4);
  const DType out_dtype = a_dtype == DType::kFloat32 ? DType::kFloat32 : DType::kBFloat16;
  Tensor out = Tensor::empty({m, n}, out_dtype);
  for (auto _ : state) {
    mm_gguf(a, b, q4 ? "Q4_1" : "Q8_0", out, out_dtype);
    benchmark::DoNotOptimize(out.data_ptr());
  }
  if (a_dtype == DType::kFloat32) {
    kernels::cpu::set_cpu_isa_cap(CpuIsa::kScalar);
    const std::vector<double> ref =
        mm_gguf(a, b, q4 ? "Q4_1" : "Q8_0", std::nullopt, out_dtype).to_double_vector();
    const std::vector<double> got = out.to_double_vector();
    double err = 0, mag = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      err = std::max(err, std::abs(got[i] - ref[i]));
      mag = std::max(mag, std::abs(ref[i]));
    }
    state.counters["err_vs_scalar"] = mag > 0 ? err / mag : err;
  }
  kernels::cpu::set_cpu_isa_cap(old);
  state.SetBytesProcessed(static_cast<int64_t>(b.numel()) * state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k),
                                                 benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

void BM_MmGguf(benchmark::State& state) { run_mm_gguf(state, DType::kBFloat16); }
void BM_MmGgufFp32(benchmark::State& state) { run_mm_gguf(state, DType::kFloat32); }
// The same with the int8 activation path turned off: on an AVX-512 VNNI + BF16 CPU, m = 1 Q4_1
// then takes the two-bf16-part path and Q8_0 the fp32 one (the same-run before/after).
void BM_MmGgufFp32NoInt8(benchmark::State& state) {
  kernels::cpu::set_gguf_mm_int8_path_enabled(false);
  run_mm_gguf(state, DType::kFloat32);
  kernels::cpu::set_gguf_mm_int8_path_enabled(true);
}

// The bf16 baseline: mm_bf16 with the same shapes (weights as bf16, [k, n] column-major).
void BM_MmBf16Baseline(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Tensor a = Tensor::empty({m, k}, DType::kBFloat16);
  a.uniform_(3, -1.0, 1.0);
  Tensor w = Tensor::empty({n, k}, DType::kBFloat16);
  w.uniform_(4, -0.1, 0.1);
  Tensor out = Tensor::empty({m, n}, DType::kBFloat16);
  for (auto _ : state) {
    mm_bf16(a, w.transpose(0, 1), std::nullopt, false, out, DType::kBFloat16, "auto");
    benchmark::DoNotOptimize(out.data_ptr());
  }
  state.SetBytesProcessed(static_cast<int64_t>(w.numel() * 2) * state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k),
                                                 benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

// SmolLM2-135M: gate+up [3072, 576], down [576, 1536], lm head Q8_0 [49152, 576].
void Shapes(benchmark::internal::Benchmark* b) {
  for (int tier : {0, 1, 2}) {
    b->Args({1, 3072, 576, 1, tier});
    b->Args({1, 576, 1536, 1, tier});
    b->Args({1, 49152, 576, 0, tier});
    b->Args({64, 3072, 576, 1, tier});
  }
}
BENCHMARK(BM_MmGguf)->Apply(Shapes)->UseRealTime();
BENCHMARK(BM_MmGgufFp32)->Apply(Shapes)->UseRealTime();
BENCHMARK(BM_MmGgufFp32NoInt8)
    ->Args({1, 3072, 576, 1, 2})
    ->Args({1, 576, 1536, 1, 2})
    ->Args({1, 49152, 576, 0, 2})
    ->UseRealTime();
BENCHMARK(BM_MmBf16Baseline)
    ->Args({1, 3072, 576})
    ->Args({1, 576, 1536})
    ->Args({64, 3072, 576})
    ->UseRealTime();

}  // namespace
