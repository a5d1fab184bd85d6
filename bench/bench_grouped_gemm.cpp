// CPU throughput of the grouped GEMMs at an MoE shape: 8 experts, top-2 routing of T tokens
// (2T rows split unevenly over the experts, one expert empty), n = 1024, k = 512. Reports FLOP/s
// (2 * rows * n * k per call, over wall time: OpenBLAS runs its own threads). The same-run
// baseline BM_DenseSgemmSameRows is OpenBLAS sgemm of each group's rows against its expert on
// fp32 copies made outside the timing. grouped_mm_bf16 runs the dense bf16 kernel per group
// (weights read in place); the others dequantize both operands to fp32 on every call.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdint>
#include <vector>

#include "flashinfer/flashinfer.h"

namespace {

using namespace flashinfer;

constexpr int64_t kE = 8, kN = 1024, kK = 512;

// Row counts per expert for 2T rows: uneven, expert 5 empty.
std::vector<int64_t> indptr_for(int64_t tokens) {
  const int64_t weights[kE] = {4, 1, 3, 2, 2, 0, 3, 1};
  std::vector<int64_t> p(1, 0);
  int64_t rows = 2 * tokens, left = rows;
  for (int64_t e = 0; e < kE; ++e) {
    const int64_t r = e + 1 == kE ? left : rows * weights[e] / 16;
    p.push_back(p.back() + r);
    left -= r;
  }
  return p;
}
Tensor int32_of(const std::vector<int64_t>& v) {
  return Tensor::from_vector(std::vector<double>(v.begin(), v.end()),
                             {static_cast<int64_t>(v.size())}, DType::kInt32);
}
void report(benchmark::State& state, int64_t rows) {
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(rows * kN * kK),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GroupedMmBf16(benchmark::State& state) {
  const auto p = indptr_for(state.range(0));
  Tensor a = Tensor::empty({p.back(), kK}, DType::kBFloat16).uniform_(1);
  Tensor b = Tensor::empty({kE, kN, kK}, DType::kBFloat16).uniform_(2);
  Tensor ip = int32_of(p), out = Tensor::empty({p.back(), kN}, DType::kBFloat16);
  for (auto _ : state) grouped_mm_bf16(a, b, ip, out);
  report(state, p.back());
}
BENCHMARK(BM_GroupedMmBf16)->Arg(16)->Arg(256)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_GroupedMmFp8(benchmark::State& state) {
  const auto p = indptr_for(state.range(0));
  Tensor a = Tensor::empty({p.back(), kK}, DType::kFloat32).uniform_(1).to(DType::kFloat8E4M3FN);
  Tensor b = Tensor::empty({kE, kN, kK}, DType::kFloat32).uniform_(2).to(DType::kFloat8E4M3FN);
  Tensor ip = int32_of(p), out = Tensor::empty({p.back(), kN}, DType::kBFloat16);
  Tensor alpha = Tensor::full({1}, 0.5, DType::kFloat32);
  for (auto _ : state) grouped_mm_fp8(a, b, ip, alpha, out);
  report(state, p.back());
}
BENCHMARK(BM_GroupedMmFp8)->Arg(16)->Arg(256)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_SegmentGemm(benchmark::State& state) {
  const auto p = indptr_for(state.range(0));
  Tensor x = Tensor::empty({p.back(), kK}, DType::kBFloat16).uniform_(1);
  Tensor w = Tensor::empty({kE, kN, kK}, DType::kBFloat16).uniform_(2);
  Tensor ip = Tensor::from_vector(std::vector<double>(p.begin(), p.end()), {kE + 1}, DType::kInt64);
  SegmentGEMMWrapper seg(Tensor::empty({1024}, DType::kUInt8));
  Tensor out = Tensor::empty({p.back(), kN}, DType::kBFloat16);
  for (auto _ : state) seg.run(x, w, kE, true, out, std::nullopt, ip);
  report(state, p.back());
}
BENCHMARK(BM_SegmentGemm)->Arg(16)->Arg(256)->Unit(benchmark::kMillisecond)->UseRealTime();

// Baseline: fp32 sgemm of the same rows per expert, operands already in fp32.
void BM_DenseSgemmSameRows(benchmark::State& state) {
  const auto p = indptr_for(state.range(0));
  std::vector<float> a(static_cast<std::size_t>(p.back() * kK), 0.5f);
  std::vector<float> b(static_cast<std::size_t>(kE * kN * kK), 0.25f);
  std::vector<float> c(static_cast<std::size_t>(p.back() * kN));
  for (auto _ : state) {
    for (int64_t e = 0; e < kE; ++e) {
      const int64_t m = p[static_cast<std::size_t>(e) + 1] - p[static_cast<std::size_t>(e)];
      if (m == 0) continue;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
                  static_cast<blasint>(kN), static_cast<blasint>(kK), 1.0f,
                  a.data() + p[static_cast<std::size_t>(e)] * kK, static_cast<blasint>(kK),
                  b.data() + e * kN * kK, static_cast<blasint>(kK), 0.0f,
                  c.data() + p[static_cast<std::size_t>(e)] * kN, static_cast<blasint>(kN));
    }
    benchmark::DoNotOptimize(c.data());
  }
  report(state, p.back());
}
BENCHMARK(BM_DenseSgemmSameRows)->Arg(16)->Arg(256)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
