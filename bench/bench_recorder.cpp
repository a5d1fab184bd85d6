// Flight recorder cost: (a) a small call (rmsnorm 4x256 fp16) at level 10 against the same call
// unrecorded, (b) dump throughput of one large tensor (64 MiB) through save_torch against a raw
// sequential write of the same bytes, measured in the same run.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/tensor_io.h"
#include "recorder/recorder_internal.h"

namespace {

using namespace flashinfer;
namespace fs = std::filesystem;

fs::path scratch_dir(const char* name) {
  fs::path d = fs::temp_directory_path() / ("fi_bench_rec_" + std::to_string(::getpid()) + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void BM_RmsNormUnrecorded(benchmark::State& state) {
  Tensor x = Tensor::empty({4, 256}, DType::kFloat16);
  x.normal_(1);
  Tensor w = Tensor::full({256}, 1.0, DType::kFloat16);
  for (auto _ : state) benchmark::DoNotOptimize(rmsnorm(x, w).data_ptr());
}
BENCHMARK(BM_RmsNormUnrecorded)->UseRealTime();

void BM_RmsNormLevel10(benchmark::State& state) {
  const fs::path d = scratch_dir("_small");
  recorder::set_log_sink([](const std::string&) {});
  recorder::Config c;
  c.dump_dir = d.string();
  c.max_count = 1 << 30;
  recorder::start(c);
  Tensor x = Tensor::empty({4, 256}, DType::kFloat16);
  x.normal_(1);
  Tensor w = Tensor::full({256}, 1.0, DType::kFloat16);
  for (auto _ : state) benchmark::DoNotOptimize(rmsnorm(x, w).data_ptr());
  recorder::stop();
  recorder::set_log_sink({});
  fs::remove_all(d);
}
BENCHMARK(BM_RmsNormLevel10)->UseRealTime()->Iterations(2000);

constexpr int64_t kBig = 64ll << 20;  // bytes

void BM_RawWrite64MiB(benchmark::State& state) {
  const fs::path d = scratch_dir("_raw");
  Tensor t = Tensor::empty({kBig / 4}, DType::kFloat32);
  t.uniform_(3);
  for (auto _ : state) {
    const std::string p = (d / "raw.bin").string();
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const ssize_t n = ::write(fd, t.data_ptr(), kBig);
    ::close(fd);
    if (n != kBig) state.SkipWithError("short write");
  }
  state.SetBytesProcessed(state.iterations() * kBig);
  fs::remove_all(d);
}
BENCHMARK(BM_RawWrite64MiB)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_SaveTorch64MiB(benchmark::State& state) {
  const fs::path d = scratch_dir("_pt");
  Tensor t = Tensor::empty({kBig / 4}, DType::kFloat32);
  t.uniform_(3);
  for (auto _ : state) save_torch((d / "inputs.pt").string(), {{"arg_0", t}});
  state.SetBytesProcessed(state.iterations() * kBig);
  fs::remove_all(d);
}
BENCHMARK(BM_SaveTorch64MiB)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_SaveSafetensors64MiB(benchmark::State& state) {
  const fs::path d = scratch_dir("_st");
  Tensor t = Tensor::empty({kBig / 4}, DType::kFloat32);
  t.uniform_(3);
  for (auto _ : state) save_safetensors((d / "inputs.safetensors").string(), {{"arg_0", t}});
  state.SetBytesProcessed(state.iterations() * kBig);
  fs::remove_all(d);
}
BENCHMARK(BM_SaveSafetensors64MiB)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
