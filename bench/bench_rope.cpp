// CPU throughput of the RoPE ops (q and k read and written once) as bytes per second and as a
// fraction of the memcpy bandwidth measured in the same run.
#include <benchmark/benchmark.h>

#include <vector>

#include "bench_bandwidth.h"
#include "flashinfer/flashinfer.h"

namespace {

using namespace flashinfer;
using flashinfer::bench::report_traffic;

struct RopeInputs {
  Tensor q, k, pos, cache;
};

// Llama-3-8B-like heads: 32 q heads, 8 k heads, head_dim 128.
RopeInputs make_inputs(int64_t nnz, DType dtype) {
  RopeInputs in;
  in.q = Tensor::empty({nnz, 32, 128}, dtype);
  in.k = Tensor::empty({nnz, 8, 128}, dtype);
  in.q.uniform_(1);
  in.k.uniform_(2);
  std::vector<double> p(static_cast<std::size_t>(nnz));
  for (int64_t t = 0; t < nnz; ++t) p[static_cast<std::size_t>(t)] = static_cast<double>(t % 8192);
  in.pos = Tensor::from_vector(p, {nnz}, DType::kInt32);
  in.cache = Tensor::empty({8192, 128}, DType::kFloat32);
  in.cache.uniform_(3);
  return in;
}

double traffic(const RopeInputs& in) {
  return 2.0 * static_cast<double>(in.q.nbytes() + in.k.nbytes());
}

void BM_RopePosIdsInplace(benchmark::State& state, DType dtype, bool interleave) {
  RopeInputs in = make_inputs(state.range(0), dtype);
  for (auto _ : state) {
    apply_rope_pos_ids_inplace(in.q, in.k, in.pos, std::nullopt, interleave);
    benchmark::DoNotOptimize(in.q.data_ptr());
  }
  report_traffic(state, traffic(in));
}
BENCHMARK_CAPTURE(BM_RopePosIdsInplace, fp16_neox, DType::kFloat16, false)
    ->Arg(4096)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_RopePosIdsInplace, fp16_interleave, DType::kFloat16, true)
    ->Arg(4096)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_RopePosIdsInplace, bf16_neox, DType::kBFloat16, false)
    ->Arg(4096)
    ->UseRealTime();

void BM_Llama31Rope(benchmark::State& state, DType dtype) {
  RopeInputs in = make_inputs(state.range(0), dtype);
  for (auto _ : state) {
    auto [q, k] = apply_llama31_rope_pos_ids(in.q, in.k, in.pos);
    benchmark::DoNotOptimize(q.data_ptr());
  }
  report_traffic(state, traffic(in));
}
BENCHMARK_CAPTURE(BM_Llama31Rope, fp16, DType::kFloat16)->Arg(4096)->UseRealTime();

void BM_RopeCosSinCacheInplace(benchmark::State& state, DType dtype) {
  RopeInputs in = make_inputs(state.range(0), dtype);
  const int64_t nnz = state.range(0);
  Tensor query = in.q.view({nnz, 32 * 128}), key = in.k.view({nnz, 8 * 128});
  Tensor pos64 = in.pos.to(DType::kInt64);
  for (auto _ : state) {
    apply_rope_with_cos_sin_cache_inplace(pos64, query, key, 128, in.cache);
    benchmark::DoNotOptimize(query.data_ptr());
  }
  report_traffic(state, traffic(in));
}
BENCHMARK_CAPTURE(BM_RopeCosSinCacheInplace, fp16, DType::kFloat16)->Arg(4096)->UseRealTime();

BENCHMARK(flashinfer::bench::BM_MemcpyBaseline)->Arg(64)->UseRealTime();

}  // namespace
