// CPU throughput of the norm ops (rmsnorm, fused_add_rmsnorm, gemma_rmsnorm,
// gemma_fused_add_rmsnorm, layernorm) in fp16, bf16 and fp32, as bytes moved per second and as a
// fraction of the memcpy bandwidth measured in the same run (bench_bandwidth.h). Tensors are
// 128 MiB at the default scale (bench_scale): larger than every cache, so the figures are
// memory-bound.
// FLASHINFER_BENCH_CPU_ISA=scalar|avx2|avx512 caps the kernels' vector tier (before/after).
#include <benchmark/benchmark.h>

#include "bench_bandwidth.h"
#include "flashinfer/flashinfer.h"
#include "kernels/cpu/norm_cpu.h"

namespace {

using namespace flashinfer;
using flashinfer::bench::report_traffic;

// 32 MiB per tensor times bench_scale(): 4096 x 4096 in 16-bit types, 2048 x 4096 in fp32.
int64_t rows_for(DType dtype) {
  return (dtype == DType::kFloat32 ? 2048 : 4096) * flashinfer::bench::bench_scale();
}
constexpr int64_t kHidden = 4096;

void BM_RmsNorm(benchmark::State& state, DType dtype, bool gemma) {
  flashinfer::bench::apply_isa_cap_from_env();
  const int64_t batch = rows_for(dtype), hidden = kHidden;
  Tensor x = Tensor::empty({batch, hidden}, dtype);
  Tensor w = Tensor::empty({hidden}, dtype);
  Tensor out = Tensor::empty({batch, hidden}, dtype);
  x.uniform_(1);
  w.uniform_(2);
  flashinfer::bench::BestIteration best;
  for (auto _ : state) {
    best.start();
    if (gemma) {
      gemma_rmsnorm(x, w, 1e-6, out);
    } else {
      rmsnorm(x, w, 1e-6, out);
    }
    best.stop();
    benchmark::DoNotOptimize(out.data_ptr());
  }
  // Reads input, writes out (weight stays in cache).
  report_traffic(state, 2.0 * batch * hidden * static_cast<double>(dtype_size(dtype)), best.best_s);
}

void BM_FusedAddRmsNorm(benchmark::State& state, DType dtype, bool gemma) {
  flashinfer::bench::apply_isa_cap_from_env();
  const int64_t batch = rows_for(dtype), hidden = kHidden;
  Tensor x = Tensor::empty({batch, hidden}, dtype);
  Tensor r = Tensor::empty({batch, hidden}, dtype);
  Tensor w = Tensor::empty({hidden}, dtype);
  x.uniform_(1);
  r.uniform_(2);
  w.uniform_(3);
  flashinfer::bench::BestIteration best;
  for (auto _ : state) {
    best.start();
    if (gemma) {
      gemma_fused_add_rmsnorm(x, r, w);
    } else {
      fused_add_rmsnorm(x, r, w);
    }
    best.stop();
    benchmark::DoNotOptimize(x.data_ptr());
  }
  // Reads input and residual, writes both.
  report_traffic(state, 4.0 * batch * hidden * static_cast<double>(dtype_size(dtype)), best.best_s);
}

// The op: upstream's layernorm has no `out`, so every call allocates its output (first-touch
// page faults included, as with torch.empty_like without a caching allocator).
void BM_LayerNorm(benchmark::State& state, DType dtype) {
  flashinfer::bench::apply_isa_cap_from_env();
  const int64_t batch = rows_for(dtype), hidden = kHidden;
  Tensor x = Tensor::empty({batch, hidden}, dtype);
  Tensor g = Tensor::empty({hidden}, DType::kFloat32);
  Tensor b = Tensor::empty({hidden}, DType::kFloat32);
  x.uniform_(1);
  g.uniform_(2);
  b.uniform_(3);
  flashinfer::bench::BestIteration best;
  for (auto _ : state) {
    best.start();
    Tensor y = layernorm(x, g, b);
    best.stop();
    benchmark::DoNotOptimize(y.data_ptr());
  }
  report_traffic(state, 2.0 * batch * hidden * static_cast<double>(dtype_size(dtype)), best.best_s);
}

// The same kernel into a preallocated output: what layernorm costs without the allocation.
void BM_LayerNormKernel(benchmark::State& state, DType dtype) {
  flashinfer::bench::apply_isa_cap_from_env();
  const int64_t batch = rows_for(dtype), hidden = kHidden;
  Tensor x = Tensor::empty({batch, hidden}, dtype);
  Tensor g = Tensor::empty({hidden}, DType::kFloat32);
  Tensor b = Tensor::empty({hidden}, DType::kFloat32);
  Tensor out = Tensor::empty({batch, hidden}, dtype);
  x.uniform_(1);
  g.uniform_(2);
  b.uniform_(3);
  kernels::LayerNormParams p;
  p.input = x.data_ptr();
  p.gamma = static_cast<const float*>(g.data_ptr());
  p.beta = static_cast<const float*>(b.data_ptr());
  p.out = out.data_ptr();
  p.batch = batch;
  p.hidden = hidden;
  p.in_stride_b = p.out_stride_b = hidden;
  p.dtype = dtype;
  flashinfer::bench::BestIteration best;
  for (auto _ : state) {
    best.start();
    kernels::cpu::layernorm(p);
    best.stop();
    benchmark::DoNotOptimize(out.data_ptr());
  }
  report_traffic(state, 2.0 * batch * hidden * static_cast<double>(dtype_size(dtype)), best.best_s);
}

#define FI_NORM_BENCH(dt, DT)                                                                     \
  BENCHMARK_CAPTURE(BM_RmsNorm, rmsnorm_##dt, DType::DT, false)->UseRealTime();                   \
  BENCHMARK_CAPTURE(BM_RmsNorm, gemma_rmsnorm_##dt, DType::DT, true)->UseRealTime();              \
  BENCHMARK_CAPTURE(BM_FusedAddRmsNorm, fused_add_rmsnorm_##dt, DType::DT, false)->UseRealTime(); \
  BENCHMARK_CAPTURE(BM_FusedAddRmsNorm, gemma_fused_add_rmsnorm_##dt, DType::DT, true)            \
      ->UseRealTime();                                                                            \
  BENCHMARK_CAPTURE(BM_LayerNorm, layernorm_##dt, DType::DT)->UseRealTime();                      \
  BENCHMARK_CAPTURE(BM_LayerNormKernel, layernorm_kernel_##dt, DType::DT)->UseRealTime();

FI_NORM_BENCH(fp16, kFloat16)
FI_NORM_BENCH(bf16, kBFloat16)
FI_NORM_BENCH(fp32, kFloat32)

BENCHMARK(flashinfer::bench::BM_MemcpyBaseline)->Arg(128)->UseRealTime();

}  // namespace
