// Per-call cost of API logging at levels 0, 1, 3 and 5 on a small op (rmsnorm, 4x256 fp16, CPU),
// with the log going to a file. Three ways to run the same CPU kernel:
//   BM_KernelDirect        the kernel with prebuilt parameters: no gate, no checks;
//   BM_GatedKernel/<lvl>   the same kernel through call_api with rmsnorm's declaration, so the
//                          difference to BM_KernelDirect is the cost of the gate and the logger;
//   BM_RmsnormPublic/<lvl> the public rmsnorm() (argument checks + gate + kernel);
//   BM_WrittenArgumentCheck the gate's aliasing check of out= alone;
//   BM_RmsnormObserved     the public rmsnorm() with an observer that does nothing installed:
//                          the difference to BM_RmsnormPublic/0 is what any observer (the ring
//                          recorder, an engine's tracer) costs before its own hooks, the
//                          arguments packed into Values and the begin and end notifications.
// Usage: build/bin/bench_api_log [--benchmark_filter=...]; the log goes to $TMPDIR or /tmp.
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "flashinfer/api_call.h"
#include "flashinfer/api_log.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/norm_cpu.h"

namespace {

using namespace flashinfer;

struct Setup {
  Tensor x = Tensor::empty({4, 256}, DType::kFloat16);
  Tensor w = Tensor::empty({256}, DType::kFloat16);
  Tensor out = Tensor::empty({4, 256}, DType::kFloat16);
  kernels::RmsNormParams p;
  Setup() {
    x.uniform_(1);
    w.uniform_(2);
    p.input = x.data_ptr();
    p.weight = w.data_ptr();
    p.out = out.data_ptr();
    p.dtype = DType::kFloat16;
    p.batch = 4;
    p.hidden = 256;
    p.in_stride_b = 256;
    p.out_stride_b = 256;
    p.eps = 1e-6f;
  }
};

Setup& setup() {
  static Setup s;
  return s;
}

std::string log_path() {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/fi_bench_api_log_" + std::to_string(::getpid()) +
         ".log";
}

// Logging to a fresh file at `level` for one benchmark; off and removed afterwards.
struct LogScope {
  explicit LogScope(int level) {
    std::filesystem::remove(log_path());
    if (!api_log::set_destination(log_path())) std::abort();
    api_log::set_level(level);
  }
  ~LogScope() {
    api_log::set_level(0);
    api_log::set_destination("stdout");
    std::filesystem::remove(log_path());
  }
};

const OpDecl& rmsnorm_decl() {
  static const OpDecl& d = *OpRegistry::global().find("rmsnorm");
  return d;
}

// The same body as BM_GatedKernel's (kernel, then return the output tensor), without the gate.
void BM_KernelDirect(benchmark::State& state) {
  Setup& s = setup();
  for (auto _ : state) {
    Tensor r = [&] {
      kernels::cpu::rmsnorm(s.p);
      return s.out;
    }();
    benchmark::DoNotOptimize(r.data_ptr());
  }
}
BENCHMARK(BM_KernelDirect);

void BM_GatedKernel(benchmark::State& state) {
  Setup& s = setup();
  rmsnorm_decl();
  LogScope scope(static_cast<int>(state.range(0)));
  const double eps = 1e-6;
  const std::optional<Tensor> out = s.out;
  const std::optional<bool> pdl;
  for (auto _ : state) {
    Tensor r = call_api(
        &rmsnorm_decl,
        [&] {
          kernels::cpu::rmsnorm(s.p);
          return s.out;
        },
        s.x, s.w, eps, out, pdl);
    benchmark::DoNotOptimize(r.data_ptr());
  }
}
BENCHMARK(BM_GatedKernel)->Arg(0)->Arg(1)->Arg(3)->Arg(5);

void BM_RmsnormPublic(benchmark::State& state) {
  Setup& s = setup();
  LogScope scope(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    Tensor r = rmsnorm(s.x, s.w, 1e-6, s.out);
    benchmark::DoNotOptimize(r.data_ptr());
  }
}
BENCHMARK(BM_RmsnormPublic)->Arg(0)->Arg(1)->Arg(3)->Arg(5);

struct NullObserver : CallObserver {
  void on_call_begin(const OpDecl&, std::span<const Value>) override {}
  void on_call_end(const OpDecl&, std::span<const Value>, const Value&) override {}
  void on_call_error(const OpDecl&, std::span<const Value>, std::string_view) override {}
};

void BM_RmsnormObserved(benchmark::State& state) {
  Setup& s = setup();
  auto observer = std::make_shared<NullObserver>();
  add_call_observer(observer);
  for (auto _ : state) {
    Tensor r = rmsnorm(s.x, s.w, 1e-6, s.out);
    benchmark::DoNotOptimize(r.data_ptr());
  }
  remove_call_observer(observer);
}
BENCHMARK(BM_RmsnormObserved);

// The gate's written-argument check alone (op_typed.h), as every rmsnorm call with out= runs it:
// gathering the tensor arguments and comparing out with input and weight. Arg: 0 without out=
// (nothing written), 1 with.
void BM_WrittenArgumentCheck(benchmark::State& state) {
  Setup& s = setup();
  rmsnorm_decl();
  const detail::WritePlan& plan =
      *detail::DeclSlot<detail::FnKey<&flashinfer::rmsnorm>>::plan.load();
  const double eps = 1e-6;
  const std::optional<Tensor> out = state.range(0) ? std::optional<Tensor>(s.out) : std::nullopt;
  const std::optional<bool> pdl;
  for (auto _ : state) {
    detail::check_call_writes(plan, s.x, s.w, eps, out, pdl);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_WrittenArgumentCheck)->Arg(0)->Arg(1);

}  // namespace
