// rmsnorm throughput on the CPU backend, and the cost of the API gate with no observer
// (rmsnorm vs. a direct call of the same CPU path through a one-row tensor is not separable
// here, so the gate is measured on its own in BM_CallApiGate).
#include <benchmark/benchmark.h>

#include "flashinfer/flashinfer.h"

namespace {

using namespace flashinfer;

void BM_RmsNormCpu(benchmark::State& state, DType dtype) {
  const int64_t batch = state.range(0), hidden = state.range(1);
  Tensor x = Tensor::empty({batch, hidden}, dtype);
  x.uniform_(1);
  Tensor w = Tensor::empty({hidden}, dtype);
  w.uniform_(2);
  Tensor out = Tensor::empty({batch, hidden}, dtype);
  for (auto _ : state) {
    rmsnorm(x, w, 1e-6, out);
    benchmark::DoNotOptimize(out.data_ptr());
  }
  const double bytes = 2.0 * batch * hidden * static_cast<double>(dtype_size(dtype));
  state.SetBytesProcessed(static_cast<int64_t>(bytes * state.iterations()));
}
BENCHMARK_CAPTURE(BM_RmsNormCpu, fp16, DType::kFloat16)
    ->Args({1, 4096})
    ->Args({32, 4096})
    ->Args({256, 4096})
    ->Args({256, 8192});
BENCHMARK_CAPTURE(BM_RmsNormCpu, bf16, DType::kBFloat16)->Args({256, 4096});
BENCHMARK_CAPTURE(BM_RmsNormCpu, fp32, DType::kFloat32)->Args({256, 4096});

const OpDecl& dummy_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "bench_gate_probe";
    decl.module = "bench";
    decl.params = {ParamDecl("x", ParamKind::kInt)};
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

// The disabled gate: one relaxed load and a branch around an empty body.
void BM_CallApiGate(benchmark::State& state) {
  dummy_decl();
  int64_t x = 0;
  for (auto _ : state) {
    x = call_api(
        &dummy_decl, [&] { return x + 1; }, x);
    benchmark::DoNotOptimize(x);
  }
}
BENCHMARK(BM_CallApiGate);

void BM_DirectBaseline(benchmark::State& state) {
  int64_t x = 0;
  for (auto _ : state) {
    x = [&] { return x + 1; }();
    benchmark::DoNotOptimize(x);
  }
}
BENCHMARK(BM_DirectBaseline);

}  // namespace
