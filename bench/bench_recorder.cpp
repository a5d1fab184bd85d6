// Flight recorder cost: (a) a small call (rmsnorm 4x256 fp16) at level 10 against the same call
// unrecorded, (b) dump throughput of one large tensor (64 MiB) through save_torch against a raw
// sequential write of the same bytes, measured in the same run, (c) ring mode
// (FLASHINFER_DUMP_RING) on a small call and on a decode step of examples/llama against level 0.
// Scratch directories are under $TMPDIR (/dev/shm for tmpfs).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <functional>
#include <thread>
#include <utility>

#include "chat/smollm.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/tensor_io.h"
#include "llama/llama_model.h"
#include "recorder/recorder_internal.h"
#include "recorder/ring.h"

namespace {

using namespace flashinfer;
namespace fs = std::filesystem;

// Scratch directories are removed only when the process exits: on ext4 without a journal, the
// inode allocator skips inodes freed in the last minutes one by one, so deleting thousands of
// dump files between two benchmarks would make the second one pay for the first one's cleanup.
std::vector<fs::path>& scratch_dirs() {
  static std::vector<fs::path> dirs;
  return dirs;
}

fs::path scratch_dir(const char* name) {
  fs::path d = fs::temp_directory_path() / ("fi_bench_rec_" + std::to_string(::getpid()) + name);
  fs::remove_all(d);
  fs::create_directories(d);
  if (scratch_dirs().empty()) {
    std::atexit([] {
      for (const fs::path& p : scratch_dirs()) fs::remove_all(p);
    });
  }
  scratch_dirs().push_back(d);
  return d;
}

void BM_RmsNormUnrecorded(benchmark::State& state) {
  Tensor x = Tensor::empty({4, 256}, DType::kFloat16);
  x.normal_(1);
  Tensor w = Tensor::full({256}, 1.0, DType::kFloat16);
  for (auto _ : state) benchmark::DoNotOptimize(rmsnorm(x, w).data_ptr());
}
BENCHMARK(BM_RmsNormUnrecorded)->UseRealTime();

// The small call at level 10 into a fresh dump directory, optionally with an exclude filter.
void rmsnorm_recorded(benchmark::State& state, const char* tag, std::vector<std::string> exclude) {
  const fs::path d = scratch_dir(tag);
  recorder::set_log_sink([](const std::string&) {});
  recorder::Config c;
  c.dump_dir = d.string();
  c.max_count = 1 << 30;
  c.exclude = std::move(exclude);
  recorder::start(c);
  Tensor x = Tensor::empty({4, 256}, DType::kFloat16);
  x.normal_(1);
  Tensor w = Tensor::full({256}, 1.0, DType::kFloat16);
  for (auto _ : state) benchmark::DoNotOptimize(rmsnorm(x, w).data_ptr());
  recorder::stop();
  recorder::set_log_sink({});
}

void BM_RmsNormLevel10(benchmark::State& state) { rmsnorm_recorded(state, "_small", {}); }
BENCHMARK(BM_RmsNormLevel10)->UseRealTime()->Iterations(2000);

// The same with 300 us between calls (not timed), as when the recorded calls are kernels of a
// serving loop: the recorder's background thread has time to prepare the next directories, so
// the calls find their inodes allocated. Back to back (above), calls outrun it.
void BM_RmsNormLevel10Spaced(benchmark::State& state) {
  const fs::path d = scratch_dir("_spaced");
  recorder::set_log_sink([](const std::string&) {});
  recorder::Config c;
  c.dump_dir = d.string();
  c.max_count = 1 << 30;
  recorder::start(c);
  Tensor x = Tensor::empty({4, 256}, DType::kFloat16);
  x.normal_(1);
  Tensor w = Tensor::full({256}, 1.0, DType::kFloat16);
  for (int i = 0; i < 8; ++i) rmsnorm(x, w);  // the 8th call directory starts the pool
  for (auto _ : state) {
    state.PauseTiming();
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    state.ResumeTiming();
    benchmark::DoNotOptimize(rmsnorm(x, w).data_ptr());
  }
  recorder::stop();
  recorder::set_log_sink({});
}
BENCHMARK(BM_RmsNormLevel10Spaced)->UseRealTime()->Iterations(2000);

// Level 10 with the call filtered out by FLASHINFER_DUMP_EXCLUDE: should cost what an
// unrecorded call costs.
void BM_RmsNormLevel10Excluded(benchmark::State& state) {
  rmsnorm_recorded(state, "_excluded", {"rms*"});
}
BENCHMARK(BM_RmsNormLevel10Excluded)->UseRealTime();

// The file-system floor of upstream's layout for the same call, with plain syscalls and no
// serialization: one mkdir, inputs.pt and outputs.pt created and written once each,
// metadata.jsonl created and appended twice, two appends to an open session.jsonl. Byte counts
// are those of the recorded rmsnorm call above. The recorder cannot be cheaper than this.
void BM_FileSystemFloor(benchmark::State& state) {
  const fs::path d = scratch_dir("_floor");
  const std::string inputs(3525, 'i'), outputs(2766, 'o'), line1(1015, 'a'), line2(1283, 'b');
  const int session = ::open((d / "session.jsonl").c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
  auto put = [&](const std::string& path, int flags, const std::string& bytes) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | flags, 0644);
    if (::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) {
      state.SkipWithError("short write");
    }
    return fd;
  };
  int64_t i = 0;
  for (auto _ : state) {
    const std::string dir = (d / ("call" + std::to_string(i++))).string();
    ::mkdir(dir.c_str(), 0777);
    ::close(put(dir + "/inputs.pt", O_TRUNC, inputs));
    const int meta = put(dir + "/metadata.jsonl", O_APPEND, line1);
    benchmark::DoNotOptimize(::write(session, line1.data(), line1.size()));
    ::close(put(dir + "/outputs.pt", O_TRUNC, outputs));
    benchmark::DoNotOptimize(::write(meta, line2.data(), line2.size()));
    ::close(meta);
    benchmark::DoNotOptimize(::write(session, line2.data(), line2.size()));
  }
  ::close(session);
}
BENCHMARK(BM_FileSystemFloor)->UseRealTime()->Iterations(2000);

// Ring mode on the same small call: records and tensors kept in memory, nothing written.
void BM_RmsNormRing(benchmark::State& state) {
  const fs::path d = scratch_dir("_ring");
  recorder::set_log_sink([](const std::string&) {});
  recorder::Config c;
  c.dump_dir = d.string();
  c.ring = 64;
  recorder::start(c);
  Tensor x = Tensor::empty({4, 256}, DType::kFloat16);
  x.normal_(1);
  Tensor w = Tensor::full({256}, 1.0, DType::kFloat16);
  for (auto _ : state) benchmark::DoNotOptimize(rmsnorm(x, w).data_ptr());
  recorder::stop();
  recorder::set_log_sink({});
}
BENCHMARK(BM_RmsNormRing)->UseRealTime();

// One decode step of the toy Llama model (examples/llama: 4 layers, hidden 512, batch 4) on
// the CPU: arg 0 is level 0, arg 1 ring mode with 256 calls kept, arg 2 ring mode and NaN
// checks off, arg 3 ring mode with FLASHINFER_DUMP_RING_VERIFY=full (every input hashed). The
// time is the generation loop's decode time per step.
void BM_LlamaDecodeStep(benchmark::State& state) {
  const int mode = static_cast<int>(state.range(0));
  const fs::path d = scratch_dir("_llama");
  recorder::set_log_sink([](const std::string&) {});
  llama::Config config;
  const llama::Weights weights = llama::make_weights(config, Device::cpu());
  const auto prompts = llama::make_prompts({5, 9, 13, 17}, config.vocab, 1);
  llama::GenerateOptions options;
  options.steps = 8;
  if (mode > 0) {
    recorder::Config c;
    c.dump_dir = d.string();
    c.ring = 256;
    if (mode == 2) c.triggers = {"crash", "signal", "error"};
    c.ring_verify_full = mode == 3;
    recorder::start(c);
  }
  for (auto _ : state) {
    const llama::GenerateResult r =
        llama::generate(config, weights, prompts, options, Device::cpu());
    state.SetIterationTime(r.decode_seconds / static_cast<double>(options.steps));
  }
  if (mode > 0) {
    state.counters["ring_MiB"] = static_cast<double>(recorder::stats().ring_bytes) / 1048576.0;
    recorder::stop();
  }
  recorder::set_log_sink({});
}
BENCHMARK(BM_LlamaDecodeStep)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Arg(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);

double minor_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_minflt);
}

double process_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// One generate() of a model: with its decode steps, or without (prefill and first token
// only). Returns the decode steps' wall seconds and their number.
using GenerateRun = std::function<std::pair<double, int64_t>(bool with_steps)>;

// Level 0 and ring mode (`ring` calls, default triggers) interleaved in one run: rounds of one
// generate() at level 0 then one in ring mode, so that both see the same machine load.
// Counters: the medians over the rounds of the decode time per step (wall), of the process CPU
// time per generate() (all threads), and of the CPU time per decode step (a generate() minus
// one without decode steps), and their ratios (ring / level 0).
void ring_interleaved(benchmark::State& state, int rounds, int64_t ring, const char* tag,
                      const GenerateRun& run) {
  const fs::path d = scratch_dir(tag);
  recorder::set_log_sink([](const std::string&) {});
  // The CPU time of a generate() holds one-time costs (the wrappers' construction, the
  // prefill, and in ring mode the first copies of every weight and workspace). A generate()
  // without decode steps, run the same way, measures them: the difference divided by the steps
  // is the CPU time per decode step.
  std::vector<double> step[2], cpu[2], fixed[2], step_cpu[2], hook_step, faults[2], retained,
      copied_step;
  for (auto _ : state) {
    for (int r = 0; r < rounds; ++r) {
      for (int mode = 0; mode < 2; ++mode) {
        double c[2] = {0, 0}, h[2] = {0, 0}, f[2] = {0, 0}, b[2] = {0, 0};
        int64_t steps = 1;
        for (int k = 0; k < 2; ++k) {
          if (mode == 1) {
            recorder::Config rc;
            rc.dump_dir = d.string();
            rc.ring = ring;
            recorder::start(rc);
          }
          const double c0 = process_cpu_seconds();
          const double h0 = recorder::internal::ring_hook_seconds();
          const double f0 = minor_faults();
          const auto [decode_seconds, n] = run(k == 0);
          c[k] = process_cpu_seconds() - c0;
          f[k] = minor_faults() - f0;
          h[k] = recorder::internal::ring_hook_seconds() - h0;
          if (mode == 1) {
            const recorder::Stats rs = recorder::stats();
            b[k] = static_cast<double>(rs.ring_copied_bytes);
            if (k == 0) retained.push_back(static_cast<double>(rs.ring_retained_bytes));
          }
          if (mode == 1) recorder::stop();
          if (k == 0) {
            steps = std::max<int64_t>(n, 1);
            step[mode].push_back(decode_seconds / static_cast<double>(steps));
          }
        }
        const auto per_step = static_cast<double>(steps);
        cpu[mode].push_back(c[0]);
        fixed[mode].push_back(c[1]);
        step_cpu[mode].push_back((c[0] - c[1]) / per_step);
        faults[mode].push_back((f[0] - f[1]) / per_step);
        if (mode == 1) {
          hook_step.push_back((h[0] - h[1]) / per_step);
          copied_step.push_back((b[0] - b[1]) / per_step);
        }
      }
    }
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  state.counters["level0_step_ms"] = median(step[0]) * 1e3;
  state.counters["ring_step_ms"] = median(step[1]) * 1e3;
  state.counters["step_ratio"] = median(step[1]) / median(step[0]);
  state.counters["level0_cpu_ms"] = median(cpu[0]) * 1e3;
  state.counters["ring_cpu_ms"] = median(cpu[1]) * 1e3;
  state.counters["cpu_ratio"] = median(cpu[1]) / median(cpu[0]);
  state.counters["level0_fixed_cpu_ms"] = median(fixed[0]) * 1e3;
  state.counters["ring_fixed_cpu_ms"] = median(fixed[1]) * 1e3;
  state.counters["level0_step_cpu_ms"] = median(step_cpu[0]) * 1e3;
  state.counters["ring_step_cpu_ms"] = median(step_cpu[1]) * 1e3;
  state.counters["step_cpu_ratio"] = median(step_cpu[1]) / median(step_cpu[0]);
  // The ring's hooks timed directly (recorder/ring.h): their time per decode step, and that
  // over the level-0 step's CPU time. It leaves out the observed-call packing outside the hooks
  // and any slowdown of the ops themselves (caches), which step_cpu_ratio includes, but its run
  // to run spread is a fraction of step_cpu_ratio's (docs/PERFORMANCE.md, session 16).
  state.counters["ring_hook_ms"] = median(hook_step) * 1e3;
  state.counters["hook_share"] = median(hook_step) / median(step_cpu[0]);
  // Page faults per decode step (minor: first touches of fresh memory), each mode.
  state.counters["level0_faults"] = median(faults[0]);
  state.counters["ring_faults"] = median(faults[1]);
  // Copies no kept call held at the end of a generate(), and the bytes copied into the ring per
  // decode step (recorder::Stats).
  state.counters["ring_retained_MiB"] = median(retained) / 1048576.0;
  state.counters["ring_copied_KiB"] = median(copied_step) / 1024.0;
  recorder::set_log_sink({});
}

// The toy model of examples/llama (4 layers, hidden 512), batch 4, 32 decode steps, ring 256:
// the gauge (docs/PERFORMANCE.md).
void BM_LlamaDecodeRingInterleaved(benchmark::State& state) {
  llama::Config config;
  const llama::Weights weights = llama::make_weights(config, Device::cpu());
  const auto prompts = llama::make_prompts({5, 9, 13, 17}, config.vocab, 1);
  llama::GenerateOptions options;
  options.steps = 32;
  ring_interleaved(
      state, static_cast<int>(state.range(0)), 256, "_llama_interleaved", [&](bool with_steps) {
        llama::GenerateOptions o = options;
        if (!with_steps) o.steps = 0;
        const llama::GenerateResult r = llama::generate(config, weights, prompts, o, Device::cpu());
        return std::pair<double, int64_t>(r.decode_seconds, o.steps);
      });
}
BENCHMARK(BM_LlamaDecodeRingInterleaved)->Arg(9)->Iterations(1)->Unit(benchmark::kMillisecond);

// The real model of examples/chat (SmolLM2-135M, 30 layers, mm_gguf on Q4_1/Q8_0 blocks, about
// 300 calls a decode step), batch 4 of 32-token prompts, 32 new tokens (31 decode steps), the
// ring `N` calls (the argument: 256 holds less than a step, 1024 more than three). Skipped when
// the model file is absent (scripts/bootstrap fetches it).
void BM_ChatDecodeRingInterleaved(benchmark::State& state) {
  const std::string path = gguf::default_model_path();
  if (!fs::exists(path)) {
    state.SkipWithError(("no model at " + path).c_str());
    return;
  }
  static const smollm::Model model = smollm::load(path);
  std::vector<std::vector<int32_t>> prompts(4);
  uint64_t x = 7;
  for (auto& p : prompts) {
    for (int i = 0; i < 32; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      p.push_back(static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(model.config.vocab)));
    }
  }
  ring_interleaved(state, 5, state.range(0), "_chat_interleaved", [&](bool with_steps) {
    smollm::GenerateOptions o;
    o.max_new_tokens = with_steps ? 32 : 1;
    const smollm::GenerateResult r = smollm::generate(model, prompts, o);
    return std::pair<double, int64_t>(r.decode_seconds, r.decode_steps);
  });
}
BENCHMARK(BM_ChatDecodeRingInterleaved)
    ->Arg(256)
    ->Arg(1024)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// For profiles of the ring's hooks in decode steps (docs/PERFORMANCE.md, session 12): one
// generate() of 128 decode steps in ring mode, so that the one-time costs (wrapper setup,
// prefill, first copies of the weights) are a small part of the samples:
//   OMP_NUM_THREADS=1 perf record -F 499 --call-graph dwarf build/bin/bench_recorder
//     --benchmark_filter=LlamaRingLongDecode
void BM_LlamaRingLongDecode(benchmark::State& state) {
  const fs::path d = scratch_dir("_llama_long");
  recorder::set_log_sink([](const std::string&) {});
  llama::Config config;
  const llama::Weights weights = llama::make_weights(config, Device::cpu());
  const auto prompts = llama::make_prompts({5, 9, 13, 17}, config.vocab, 1);
  llama::GenerateOptions options;
  options.steps = 128;
  for (auto _ : state) {
    recorder::Config rc;
    rc.dump_dir = d.string();
    rc.ring = 256;
    recorder::start(rc);
    const double h0 = recorder::internal::ring_hook_seconds();
    const llama::GenerateResult r =
        llama::generate(config, weights, prompts, options, Device::cpu());
    const double hooks = recorder::internal::ring_hook_seconds() - h0;
    recorder::stop();
    state.counters["ring_step_ms"] = r.decode_seconds / static_cast<double>(options.steps) * 1e3;
    // The hooks' time over the whole generate() (prefill and first copies included) per step.
    state.counters["ring_hook_ms"] = hooks / static_cast<double>(options.steps) * 1e3;
  }
  recorder::set_log_sink({});
}
BENCHMARK(BM_LlamaRingLongDecode)->Iterations(1)->Unit(benchmark::kMillisecond);

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
}
BENCHMARK(BM_RawWrite64MiB)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_SaveTorch64MiB(benchmark::State& state) {
  const fs::path d = scratch_dir("_pt");
  Tensor t = Tensor::empty({kBig / 4}, DType::kFloat32);
  t.uniform_(3);
  for (auto _ : state) save_torch((d / "inputs.pt").string(), {{"arg_0", t}});
  state.SetBytesProcessed(state.iterations() * kBig);
}
BENCHMARK(BM_SaveTorch64MiB)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_SaveSafetensors64MiB(benchmark::State& state) {
  const fs::path d = scratch_dir("_st");
  Tensor t = Tensor::empty({kBig / 4}, DType::kFloat32);
  t.uniform_(3);
  for (auto _ : state) save_safetensors((d / "inputs.safetensors").string(), {{"arg_0", t}});
  state.SetBytesProcessed(state.iterations() * kBig);
}
BENCHMARK(BM_SaveSafetensors64MiB)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
