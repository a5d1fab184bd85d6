// Top-k ops on the CPU backend: `flashinfer.top_k` over fp32 logits drawn from N(0, 1) (the
// shape of vLLM's logits processor: batch x vocabulary), and the two fused transforms at a
// DeepSeek sparse-attention shape. bench/compare_torch.py runs the top_k cases beside
// torch.topk in the same run and thread count (docs/PERFORMANCE.md).
#include <benchmark/benchmark.h>

#include <vector>

#include "flashinfer/flashinfer.h"

namespace {

using namespace flashinfer;

Tensor normal_logits(int64_t rows, int64_t cols, DType dtype) {
  Tensor x = Tensor::empty({rows, cols}, DType::kFloat32);
  x.normal_(3, 0.0, 1.0);
  return x.to(dtype);
}

// Args: rows, cols, k, sorted, dtype (0 fp32, 1 bf16).
void BM_top_k(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1), k = state.range(2);
  const bool sorted = state.range(3) != 0;
  const DType dt = state.range(4) == 0 ? DType::kFloat32 : DType::kBFloat16;
  Tensor x = normal_logits(rows, cols, dt);
  for (auto _ : state) {
    auto [v, i] = top_k(x, k, sorted);
    benchmark::DoNotOptimize(i.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * rows * cols * static_cast<int64_t>(dtype_size(dt)));
}
BENCHMARK(BM_top_k)
    ->ArgNames({"rows", "cols", "k", "sorted", "bf16"})
    ->Args({16, 128256, 50, 0, 0})
    ->Args({16, 128256, 50, 1, 0})
    ->Args({16, 128256, 1024, 0, 0})
    ->Args({16, 128256, 1024, 1, 0})
    ->Args({1, 128256, 50, 1, 0})
    ->Args({16, 128256, 50, 1, 1})
    ->Unit(benchmark::kMillisecond);

// DeepSeek sparse attention's index top-k: rows of 16384 scores, k = 2048.
void BM_top_k_ragged_transform(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1), k = state.range(2);
  Tensor x = normal_logits(rows, cols, DType::kFloat32);
  std::vector<double> offs, lens;
  for (int64_t r = 0; r < rows; ++r) {
    offs.push_back(static_cast<double>(r * cols));
    lens.push_back(static_cast<double>(cols - r));
  }
  Tensor o = Tensor::from_vector(offs, {rows}, DType::kInt32);
  Tensor l = Tensor::from_vector(lens, {rows}, DType::kInt32);
  for (auto _ : state) benchmark::DoNotOptimize(top_k_ragged_transform(x, o, l, k).data_ptr());
}
BENCHMARK(BM_top_k_ragged_transform)
    ->ArgNames({"rows", "cols", "k"})
    ->Args({64, 16384, 2048})
    ->Unit(benchmark::kMillisecond);

// vLLM's sampler step at a Llama-3 vocabulary: top_k_top_p_sampling_from_logits (top_k 50,
// top_p 0.9, "top_k_first"), compared with torch softmax + topk + multinomial by
// bench/compare_torch.py. Explicit seed and an advancing offset, as an engine passes them.
void BM_top_k_top_p_sampling_from_logits(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  Tensor x = normal_logits(rows, cols, DType::kFloat32);
  int64_t off = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(top_k_top_p_sampling_from_logits(x, 50, 0.9, std::nullopt,
                                                              "top_k_first", true, false,
                                                              int64_t{1}, off)
                                 .data_ptr());
    off += 4096;
  }
}
BENCHMARK(BM_top_k_top_p_sampling_from_logits)
    ->ArgNames({"rows", "cols"})
    ->Args({16, 128256})
    ->Unit(benchmark::kMillisecond);

}  // namespace
