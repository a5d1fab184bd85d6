// CPU throughput of the block-scaled, MX and low-latency FP8 GEMMs at a decode size (m = 16) and
// a prefill size (m = 512), n = k = 2048 (DeepSeek-style 1x128 / 128x128 scales). Reports FLOP/s
// (2 m n k per call, over wall time: OpenBLAS runs its own threads). The CPU path decodes both
// operands to fp32 and multiplies with OpenBLAS sgemm (per 128-wide K block where there are block
// scales).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "flashinfer/flashinfer.h"

namespace {

using namespace flashinfer;

Tensor fp8_rand(Shape s, uint64_t seed) {
  return Tensor::empty(std::move(s), DType::kFloat32)
      .uniform_(seed, -2.0, 2.0)
      .to(DType::kFloat8E4M3FN);
}
Tensor scales(Shape s, uint64_t seed) {
  return Tensor::empty(std::move(s), DType::kFloat32).uniform_(seed, 0.01, 0.02);
}
Tensor ue8m0(int64_t n) {
  Tensor t = Tensor::empty({n}, DType::kUInt8);
  for (int64_t i = 0; i < n; ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(120 + i % 7);
  return t;
}

void report(benchmark::State& state, int64_t m, int64_t n, int64_t k) {
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

constexpr int64_t kN = 2048, kK = 2048;

void BM_GemmFp8NtGroupwise(benchmark::State& state) {
  const int64_t m = state.range(0);
  Tensor a = fp8_rand({m, kK}, 1), b = fp8_rand({kN, kK}, 2);
  Tensor sa = scales({m, kK / 128}, 3), sb = scales({kN / 128, kK / 128}, 4);
  Tensor out = Tensor::empty({m, kN}, DType::kBFloat16);
  for (auto _ : state) {
    gemm_fp8_nt_groupwise(a, b, sa, sb, "K", 1, {1, 128, 128}, out);
  }
  report(state, m, kN, kK);
}
BENCHMARK(BM_GemmFp8NtGroupwise)->Arg(16)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MmFp8(benchmark::State& state) {
  const int64_t m = state.range(0);
  Tensor a = fp8_rand({m, kK}, 1);
  Tensor w = prepare_low_latency_gemm_weights(fp8_rand({kN, kK}, 2), Value());
  Tensor alpha = Tensor::full({1}, 0.5, DType::kFloat32);
  Tensor out = Tensor::empty({m, kN}, DType::kBFloat16);
  for (auto _ : state) mm_fp8(a, w, alpha, DType::kBFloat16, out);
  report(state, m, kN, kK);
}
BENCHMARK(BM_MmFp8)->Arg(16)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MmMxfp8(benchmark::State& state) {
  const int64_t m = state.range(0);
  Tensor a = fp8_rand({m, kK}, 1), w = fp8_rand({kN, kK}, 2);
  Tensor sa = ue8m0((m + 127) / 128 * 128 * (kK / 32)), sb = ue8m0(kN * (kK / 32));
  Tensor out = Tensor::empty({m, kN}, DType::kBFloat16);
  for (auto _ : state) mm_mxfp8(a, w.transpose(0, 1), sa, sb, out);
  report(state, m, kN, kK);
}
BENCHMARK(BM_MmMxfp8)->Arg(16)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Fp8BlockscaleGemmSm90Bf16Input(benchmark::State& state) {
  const int64_t m = state.range(0);
  Tensor x = Tensor::empty({m, kK}, DType::kFloat32).uniform_(1, -2.0, 2.0).to(DType::kBFloat16);
  Tensor w = fp8_rand({kN, kK}, 2), sw = scales({kN / 128, kK / 128}, 3);
  Tensor out = Tensor::empty({m, kN}, DType::kBFloat16);
  for (auto _ : state) fp8_blockscale_gemm_sm90(x, w, std::nullopt, sw, out);
  report(state, m, kN, kK);
}
BENCHMARK(BM_Fp8BlockscaleGemmSm90Bf16Input)
    ->Arg(16)
    ->Arg(512)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
