// Shared by the op benchmarks: the machine's memory bandwidth, measured in the same run by a
// large multithreaded memcpy (one thread per hardware thread, like the OpenMP kernels), and a
// counter that reports each benchmark's traffic as a fraction of it. The baseline is measured
// again right after every benchmark, so a shared machine's changing load hits both alike.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_isa.h"

namespace flashinfer::bench {

/// Threads for the baseline: OMP_NUM_THREADS when set (the kernels' team size), else all
/// hardware threads.
inline unsigned baseline_threads() {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return static_cast<unsigned>(n);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

/// Multiplier on the op benchmarks' row counts: FLASHINFER_BENCH_SCALE, default 4, which puts
/// every tensor at 86-172 MiB, so an op's working set, like the baseline's 2 x 128 MiB, exceeds
/// the last-level cache (105 MiB on the development VM) and both compare DRAM with DRAM. Scale 1
/// gives the earlier 22-43 MiB tensors, which partly stay in that cache between iterations.
inline int64_t bench_scale() {
  if (const char* env = std::getenv("FLASHINFER_BENCH_SCALE")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return 4;
}

/// Copies src to dst with baseline_threads() threads, each a contiguous chunk.
inline void parallel_memcpy(char* dst, const char* src, std::size_t n) {
  const unsigned nt = baseline_threads();
  std::vector<std::thread> threads;
  const std::size_t chunk = (n + nt - 1) / nt;
  for (unsigned t = 0; t < nt; ++t) {
    const std::size_t lo = std::min(n, t * chunk), hi = std::min(n, lo + chunk);
    threads.emplace_back([=] { std::memcpy(dst + lo, src + lo, hi - lo); });
  }
  for (auto& th : threads) th.join();
}

/// Caps the CPU kernels' vector tier from FLASHINFER_BENCH_CPU_ISA (scalar, avx2 or avx512;
/// unset: all tiers), so one binary measures the code before and after a vector path.
inline void apply_isa_cap_from_env() {
  using kernels::cpu::CpuIsa;
  const char* env = std::getenv("FLASHINFER_BENCH_CPU_ISA");
  const std::string_view v = env ? env : "avx512";
  kernels::cpu::set_cpu_isa_cap(v == "scalar" ? CpuIsa::kScalar
                                : v == "avx2" ? CpuIsa::kAvx2
                                              : CpuIsa::kAvx512);
}

/// Bytes per second (read + write) of a 128 MiB copy, best of 5 (buffers touched first).
inline double memcpy_bandwidth() {
  const std::size_t n = std::size_t{128} << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    parallel_memcpy(b.data(), a.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(n) / s);
    benchmark::DoNotOptimize(b.data());
  }
  return best;
}

/// The fastest of the iterations timed with it, in seconds. On a machine shared with other
/// jobs the mean includes time the threads spent descheduled; the best iteration, like the
/// best-of-5 memcpy baseline, mostly does not, so best against best compares like with like.
struct BestIteration {
  double best_s = 1e30;
  std::chrono::steady_clock::time_point t0;
  void start() { t0 = std::chrono::steady_clock::now(); }
  void stop() {
    best_s = std::min(best_s,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
};

/// Sets bytes/s, `memcpy_GBps` (the baseline, measured now) and `of_memcpy_bw`: the achieved
/// traffic as a fraction of it (shown with a "/s" suffix by Google Benchmark: it is a ratio).
/// With best_iteration_s > 0 also `best_of_memcpy_bw`: the fastest iteration's traffic over the
/// same baseline (a plain ratio).
inline void report_traffic(benchmark::State& state, double bytes_per_iter,
                           double best_iteration_s = 0.0) {
  const double bw = memcpy_bandwidth();
  state.SetBytesProcessed(
      static_cast<int64_t>(bytes_per_iter * static_cast<double>(state.iterations())));
  state.counters["of_memcpy_bw"] =
      benchmark::Counter(bytes_per_iter / bw, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["memcpy_GBps"] = bw / 1e9;
  if (best_iteration_s > 0.0) {
    state.counters["best_of_memcpy_bw"] = bytes_per_iter / best_iteration_s / bw;
  }
}

/// The baseline itself, reported like the ops.
inline void BM_MemcpyBaseline(benchmark::State& state) {
  const std::size_t n = static_cast<std::size_t>(state.range(0)) << 20;
  std::vector<char> a(n, 1), b(n, 2);
  BestIteration best;
  for (auto _ : state) {
    best.start();
    parallel_memcpy(b.data(), a.data(), n);
    best.stop();
    benchmark::DoNotOptimize(b.data());
  }
  report_traffic(state, 2.0 * static_cast<double>(n), best.best_s);
}

}  // namespace flashinfer::bench
