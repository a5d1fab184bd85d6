// CPU GEMM and quantization throughput. Every large GEMM reports FLOP/s and `vs_sgemm`: its
// FLOP/s divided by plain OpenBLAS sgemm's on fp32 operands of the same shape, measured
// interleaved with it in the same run (the op's extra work is converting its low-precision inputs
// to fp32 tiles and rounding the output). The small-m (decode) GEMMs report FLOP/s and the bytes
// of their B operand per second against a memcpy bandwidth baseline measured right after each
// case (bench_bandwidth.h), for the op, for the former path (B converted to fp32, then sgemm),
// for each instruction set of the small-m kernel, and for OpenBLAS sgemm on pre-converted fp32
// operands. Quantizers report bytes/s (input read + quantized data + scales written).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <tuple>
#include <vector>

#include "api/gemm_params.h"
#include "bench_bandwidth.h"
#include "flashinfer/flashinfer.h"
#include "kernels/cpu/gemm_cpu.h"

namespace {

using namespace flashinfer;

// Plain OpenBLAS sgemm (row-major A [m, k] x B^T with B [n, k]) on fp32 operands of one shape.
class Sgemm {
 public:
  Sgemm(int64_t m, int64_t n, int64_t k)
      : m_(m), n_(n), k_(k), a_(m * k, 0.5f), b_(n * k, 0.25f), c_(m * n) {}
  void run() {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m_, n_, k_, 1.0f, a_.data(), k_, b_.data(),
                k_, 0.0f, c_.data(), n_);
  }

 private:
  int64_t m_, n_, k_;
  std::vector<float> a_, b_, c_;
};

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// Times the op and, right after it in every iteration (outside the benchmark's timing), plain
// sgemm doing the same FLOPs, so each pair sees the same machine load. vs_sgemm is the median of
// the per-iteration ratios sgemm_time / op_time; FLOP/s counters are medians too.
void run_with_baseline(benchmark::State& state, int64_t batch, int64_t m, int64_t n, int64_t k,
                       const std::function<void()>& op) {
  Sgemm base(m, n, k);
  auto base_all = [&] {
    for (int64_t b = 0; b < batch; ++b) base.run();
  };
  base_all();  // warm OpenBLAS's thread pool and the caches
  op();
  std::vector<double> t_op, t_base, ratio;
  for (auto _ : state) {
    t_op.push_back(seconds_of(op));
    state.PauseTiming();
    t_base.push_back(seconds_of(base_all));
    ratio.push_back(t_base.back() / t_op.back());
    state.ResumeTiming();
  }
  const double flop = 2.0 * batch * m * n * k;
  state.counters["FLOP/s"] = flop / median(t_op);
  state.counters["sgemm_FLOP/s"] = flop / median(t_base);
  state.counters["vs_sgemm"] = median(ratio);
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
  run_with_baseline(state, 1, n, n, n, [&] { mm_bf16(a, b, std::nullopt, false, out); });
}
BENCHMARK(BM_MmBf16)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_BmmFp8(benchmark::State& state) {
  const int64_t batch = state.range(0), n = state.range(1);
  Tensor A = Tensor::empty({batch, n, n}, DType::kFloat8E4M3FN).uniform_(3, -4, 4);
  Tensor B = Tensor::empty({batch, n, n}, DType::kFloat8E4M3FN).uniform_(4, -4, 4).transpose(1, 2);
  Tensor s1 = Tensor::full({1}, 0.5, DType::kFloat32);
  Tensor out = Tensor::empty({batch, n, n}, DType::kBFloat16);
  run_with_baseline(state, batch, n, n, n, [&] { bmm_fp8(A, B, s1, s1, DType::kBFloat16, out); });
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
  // Named tensors, not structured bindings: clang 14 cannot capture those in the lambda below.
  Tensor qa, sfa, qb, sfb;
  std::tie(qa, sfa) = nvfp4_quantize(a, gs);
  std::tie(qb, sfb) = nvfp4_quantize(w, gs);
  Tensor alpha = Tensor::full({1}, 1.0 / (448.0 * 6.0 * 448.0 * 6.0), DType::kFloat32);
  Tensor out = Tensor::empty({n, n}, DType::kBFloat16);
  Tensor bt = qb.transpose(0, 1), sbt = sfb.transpose(0, 1);
  run_with_baseline(state, 1, n, n, n,
                    [&] { mm_fp4(qa, bt, sfa, sbt, alpha, DType::kBFloat16, out); });
}
BENCHMARK(BM_MmFp4)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- small m (decode) ---------------------------------------------------------------------

// How the GEMM is computed: the public op (path by m), or the CPU kernel with a forced path and
// instruction set.
// The small-m cases' timing: one warm-up call, then `run` per iteration; reports FLOP/s and
// b_bytes (the B operand's bytes per call) per second against the memcpy baseline.
void time_small_m(benchmark::State& state, int64_t m, int64_t n, int64_t k, double b_bytes,
                  const std::function<void()>& run) {
  run();
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k),
                                                benchmark::Counter::kIsIterationInvariantRate);
  bench::report_traffic(state, b_bytes);
}

enum SmallMVariant : int64_t { kOp, kOldSgemmPath, kSmallAvx512, kSmallAvx2, kSmallScalar };

// Args: variant, m, n, k, out dtype (0 bf16, 1 fp16). B is the transpose of a bf16 [n, k] weight,
// as llama_decode passes it; bytes are B's (n * k * 2) per call.
void BM_SmallMBf16(benchmark::State& state) {
  using kernels::cpu::CpuIsa;
  using kernels::cpu::GemmPath;
  const auto variant = static_cast<SmallMVariant>(state.range(0));
  const int64_t m = state.range(1), n = state.range(2), k = state.range(3);
  const DType out_dt = state.range(4) ? DType::kFloat16 : DType::kBFloat16;
  Tensor a = Tensor::empty({m, k}, DType::kBFloat16).uniform_(11);
  Tensor b = Tensor::empty({n, k}, DType::kBFloat16).uniform_(12).transpose(0, 1);
  Tensor out = Tensor::empty({m, n}, out_dt);
  const kernels::GemmParams p = api::gemm_params(a, b, out);
  std::function<void()> run;
  switch (variant) {
    case kOp:
      run = [&] { mm_bf16(a, b, std::nullopt, false, out, out_dt); };
      break;
    case kOldSgemmPath:
      run = [&] { kernels::cpu::gemm_with(p, GemmPath::kSgemm, CpuIsa::kScalar); };
      break;
    default: {
      const CpuIsa isa = variant == kSmallAvx512 ? CpuIsa::kAvx512
                         : variant == kSmallAvx2 ? CpuIsa::kAvx2
                                                 : CpuIsa::kScalar;
      if (isa > kernels::cpu::detected_cpu_isa()) {
        state.SkipWithError("instruction set not available on this CPU");
        return;
      }
      run = [&, isa] { kernels::cpu::gemm_with(p, GemmPath::kSmallM, isa); };
    }
  }
  time_small_m(state, m, n, k, 2.0 * static_cast<double>(n * k), run);
}

// OpenBLAS sgemm on operands already in fp32 (what the op would cost if the weights were kept in
// fp32 at twice the bytes). Bytes: its fp32 B, n * k * 4.
void BM_SmallMSgemmFp32(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Sgemm base(m, n, k);
  time_small_m(state, m, n, k, 4.0 * static_cast<double>(n * k), [&] { base.run(); });
}

// (m, n, k, out fp16): m = 1, 4, 16, 32 at 4096^2; 48 to 128 to place the threshold; and
// llama_decode's default model at batch 4 (qkv, o, gate_up, down, lm_head with fp16 out).
const std::vector<std::vector<int64_t>> kSmallMShapes = {
    {1, 4096, 4096, 0},  {4, 4096, 4096, 0},  {16, 4096, 4096, 0}, {32, 4096, 4096, 0},
    {48, 4096, 4096, 0}, {64, 4096, 4096, 0}, {96, 4096, 4096, 0}, {128, 4096, 4096, 0},
    {4, 768, 512, 0},    {4, 512, 512, 0},    {4, 2816, 512, 0},   {4, 512, 1408, 0},
    {4, 4096, 512, 1}};

void small_m_args(benchmark::internal::Benchmark* b) {
  for (const auto& s : kSmallMShapes) {
    for (int64_t v : {kOp, kOldSgemmPath, kSmallAvx512, kSmallAvx2, kSmallScalar}) {
      // The instruction-set variants only at the 4096^2 decode sizes.
      if (v >= kSmallAvx2 && (s[1] != 4096 || s[0] > 32)) continue;
      b->Args({v, s[0], s[1], s[2], s[3]});
    }
  }
}
BENCHMARK(BM_SmallMBf16)
    ->ArgNames({"variant", "m", "n", "k", "fp16out"})
    ->Apply(small_m_args)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void small_m_sgemm_args(benchmark::internal::Benchmark* b) {
  for (const auto& s : kSmallMShapes) b->Args({s[0], s[1], s[2]});
}
BENCHMARK(BM_SmallMSgemmFp32)
    ->ArgNames({"m", "n", "k"})
    ->Apply(small_m_sgemm_args)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// bmm_fp8 (e4m3 x e4m3, bf16 out) at decode sizes: the op against the former path. Bytes: B's
// (n * k, one byte each).
void BM_SmallMFp8(benchmark::State& state) {
  const bool old_path = state.range(0) == kOldSgemmPath;
  const int64_t m = state.range(1), n = state.range(2), k = state.range(3);
  Tensor A = Tensor::empty({1, m, k}, DType::kFloat8E4M3FN).uniform_(13, -4, 4);
  Tensor B = Tensor::empty({1, n, k}, DType::kFloat8E4M3FN).uniform_(14, -4, 4).transpose(1, 2);
  Tensor s1 = Tensor::full({1}, 0.5, DType::kFloat32);
  Tensor out = Tensor::empty({1, m, n}, DType::kBFloat16);
  const float scale = 0.5f;
  kernels::GemmParams p = api::gemm_params(A, B, out);
  p.a_scale = &scale;
  p.b_scale = &scale;
  auto run = [&] {
    if (old_path) {
      kernels::cpu::gemm_with(p, kernels::cpu::GemmPath::kSgemm, kernels::cpu::CpuIsa::kScalar);
    } else {
      bmm_fp8(A, B, s1, s1, DType::kBFloat16, out);
    }
  };
  time_small_m(state, m, n, k, static_cast<double>(n * k), run);
}
BENCHMARK(BM_SmallMFp8)
    ->ArgNames({"variant", "m", "n", "k"})
    ->Args({kOp, 1, 4096, 4096})
    ->Args({kOldSgemmPath, 1, 4096, 4096})
    ->Args({kOp, 16, 4096, 4096})
    ->Args({kOldSgemmPath, 16, 4096, 4096})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(bench::BM_MemcpyBaseline)->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime();

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
