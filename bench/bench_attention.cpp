// Batch decode and batch prefill attention on the CPU backend (the wrappers' run(), plan done
// once outside the timed loop, as an engine does per step). Reports time, achieved bytes/s with
// upstream's byte count (q + k + v + o, each once; no page-table bytes) and FLOP/s with
// upstream's formulas (non-causal 2*qo*kv*Hq*(Dqk+Dvo); causal (2*kv - qo)*qo*Hq*(Dqk+Dvo)).
// BM_MemoryCopy measures the machine's copy bandwidth in the same run, as the baseline.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "flashinfer/flashinfer.h"

namespace {

using namespace flashinfer;

Tensor int_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kInt32);
  std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

struct PagedBatch {
  Tensor cache, indptr, indices, last;
};

// `batch` requests of `kv_len` tokens in pages of `page_size`, pages in request order.
PagedBatch make_batch(int64_t batch, int64_t kv_len, int64_t hkv, int64_t d, int64_t page_size,
                      DType dtype) {
  const int64_t pages_per = (kv_len + page_size - 1) / page_size;
  std::vector<int32_t> indptr{0}, indices, last;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < pages_per; ++i)
      indices.push_back(static_cast<int32_t>(b * pages_per + i));
    indptr.push_back(static_cast<int32_t>((b + 1) * pages_per));
    last.push_back(static_cast<int32_t>(kv_len - (pages_per - 1) * page_size));
  }
  PagedBatch pb;
  pb.cache = Tensor::empty({batch * pages_per, 2, page_size, hkv, d}, dtype);
  pb.cache.uniform_(1);
  pb.indptr = int_tensor(indptr);
  pb.indices = int_tensor(indices);
  pb.last = int_tensor(last);
  return pb;
}

void set_counters(benchmark::State& state, double bytes, double flops) {
  state.SetBytesProcessed(static_cast<int64_t>(bytes * static_cast<double>(state.iterations())));
  state.counters["FLOP/s"] = benchmark::Counter(flops * static_cast<double>(state.iterations()),
                                                benchmark::Counter::kIsRate);
}

// Args: batch, kv_len, num_qo_heads, num_kv_heads (head_dim 128, page 16, fp16).
void BM_BatchDecodeCpu(benchmark::State& state) {
  const int64_t batch = state.range(0), kv_len = state.range(1), hq = state.range(2),
                hkv = state.range(3), d = 128, ps = 16;
  const DType dt = DType::kFloat16;
  PagedBatch pb = make_batch(batch, kv_len, hkv, d, ps, dt);
  BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({128 << 20}, DType::kUInt8));
  w.plan(pb.indptr, pb.indices, pb.last, hq, hkv, d, ps);
  Tensor q = Tensor::empty({batch, hq, d}, dt);
  q.uniform_(2);
  AttentionRunOptions ro;
  ro.out = Tensor::empty({batch, hq, d}, dt);
  for (auto _ : state) {
    w.run(q, pb.cache, ro);
    benchmark::DoNotOptimize(ro.out->data_ptr());
  }
  const double es = 2.0;
  const double bytes = es * (2.0 * batch * hq * d + 2.0 * batch * kv_len * hkv * d);
  const double flops = 2.0 * batch * kv_len * hq * (d + d);
  set_counters(state, bytes, flops);
}
BENCHMARK(BM_BatchDecodeCpu)
    ->Args({16, 1024, 32, 8})
    ->Args({64, 2048, 32, 8})
    ->Args({16, 1024, 32, 32})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Args: batch, qo_len == kv_len, causal (heads 32:8, head_dim 128, page 16, fp16).
void BM_BatchPrefillCpu(benchmark::State& state) {
  const int64_t batch = state.range(0), len = state.range(1), hq = 32, hkv = 8, d = 128, ps = 16;
  const bool causal = state.range(2) != 0;
  const DType dt = DType::kFloat16;
  PagedBatch pb = make_batch(batch, len, hkv, d, ps, dt);
  std::vector<int32_t> qo{0};
  for (int64_t b = 0; b < batch; ++b) qo.push_back(static_cast<int32_t>((b + 1) * len));
  BatchPrefillWithPagedKVCacheWrapper w(Tensor::zeros({128 << 20}, DType::kUInt8));
  PrefillPlanOptions po;
  po.causal = causal;
  w.plan(int_tensor(qo), pb.indptr, pb.indices, pb.last, hq, hkv, d, ps, po);
  Tensor q = Tensor::empty({batch * len, hq, d}, dt);
  q.uniform_(2);
  AttentionRunOptions ro;
  ro.out = Tensor::empty({batch * len, hq, d}, dt);
  for (auto _ : state) {
    w.run(q, pb.cache, ro);
    benchmark::DoNotOptimize(ro.out->data_ptr());
  }
  const double es = 2.0;
  const double bytes = es * (2.0 * batch * len * hq * d + 2.0 * batch * len * hkv * d);
  const double per_req =
      causal ? (2.0 * len - len) * len * hq * (d + d) : 2.0 * len * len * hq * (d + d);
  set_counters(state, bytes, per_req * batch);
}
BENCHMARK(BM_BatchPrefillCpu)
    ->Args({2, 512, 1})
    ->Args({2, 512, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Baseline: the machine's copy bandwidth (read + write counted), 256 MiB buffers.
void BM_MemoryCopy(benchmark::State& state) {
  const std::size_t n = 256u << 20;
  std::vector<char> a(n, 1), b(n, 0);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), n);
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(2.0 * n * static_cast<double>(state.iterations())));
}
BENCHMARK(BM_MemoryCopy)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
