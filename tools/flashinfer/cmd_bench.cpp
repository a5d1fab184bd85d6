// `flashinfer bench`: times one op on each backend asked for, modelled on upstream's
// benchmarks/flashinfer_benchmark.py (flags, [PERF] line, CSV). The routines are the declared
// ops that carry a bench hook (OpDecl::bench), plus one built-in baseline, stream_copy.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "api/bench_backend.h"
#include "api/bench_support.h"
#include "commands.h"
#include "core/cuda_runtime.h"
#include "flashinfer/bench.h"
#include "flashinfer/error.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/ops/backends.h"
#include "flashinfer/replay.h"
#include "kernel_switches.h"

namespace flashinfer::cli {

namespace {

constexpr const char* kCopyRoutine = "stream_copy";

struct BenchOptions {
  std::string routine;
  bool list = false;
  std::vector<std::string> backends{"cpu"};
  int num_iters = 30;
  int dry_run_iters = 5;
  bool refcheck = false;
  bool allow_output_mismatch = false;
  bool verbose = false;
  bool no_cold_l2 = false;
  bool no_cuda_graph = false;  // CUDA: time each call eagerly, not a CUDA graph's replays
  bool use_cupti = false;      // upstream's CUPTI timing: not built here (a warning, then events)
  bool generate_repro_command = false;
  std::string case_tag;
  std::string output_path;
  std::string testlist;
  std::string q_dtype = "bfloat16", kv_dtype = "bfloat16", input_dtype = "bfloat16", out_dtype;
  BenchShape shape;
};

DType parse_dtype(const std::string& text, const char* flag) {
  std::string name = text;
  if (name.starts_with("torch.")) name = name.substr(6);
  const std::optional<DType> d = dtype_from_name(name);
  if (!d) FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "bench", flag, "unknown dtype '", text, "'");
  return *d;
}

// Bits of a floating-point operand dtype that has tensor cores (16 or 8), else 0.
int operand_bits(DType d) {
  switch (d) {
    case DType::kBFloat16:
    case DType::kFloat16:
      return 16;
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
      return 8;
    default:
      return 0;
  }
}

void check_positive(int64_t v, const char* flag) {
  FLASHINFER_CHECK(v > 0, "bench", flag, "must be positive, got ", v);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Sample standard deviation (n - 1), as torch.std / numpy with ddof=1.
double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  double mean = 0.0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  double ss = 0.0;
  for (double x : v) ss += (x - mean) * (x - mean);
  return std::sqrt(ss / static_cast<double>(v.size() - 1));
}

// STREAM-style copy baseline: m x n fp32 copied to a second buffer (2 * 4 * m * n bytes moved),
// split over the hardware threads on the CPU. Not an op: a memory-bandwidth yardstick measured
// with the same timing loop.
BenchCase copy_case(const BenchShape& s, Device dev) {
  const int64_t n = s.m * s.n;
  auto src = std::make_shared<Tensor>(Tensor::empty({n}, DType::kFloat32, dev));
  auto dst = std::make_shared<Tensor>(Tensor::empty({n}, DType::kFloat32, dev));
  src->uniform_(s.random_seed);
  dst->fill_(0.0);
  BenchCase c;
  if (dev.is_cpu()) {
    const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    c.run = [src, dst, n, threads] {
      const auto* from = static_cast<const char*>(src->data_ptr());
      auto* to = static_cast<char*>(dst->data_ptr());
      const std::size_t bytes = static_cast<std::size_t>(n) * 4;
      const std::size_t chunk = (bytes / threads + 63) / 64 * 64;
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < threads; ++t) {
        const std::size_t lo = std::min(bytes, t * chunk), hi = std::min(bytes, lo + chunk);
        if (hi > lo) pool.emplace_back([=] { std::memcpy(to + lo, from + lo, hi - lo); });
      }
      for (auto& th : pool) th.join();
    };
  } else {
    c.run = [src, dst] { dst->copy_(*src); };
  }
  c.outputs = [dst] {
    NamedTensors out;
    out.emplace_back("dst", dst->to(Device::cpu()));
    return out;
  };
  c.bytes = 2.0 * 4.0 * static_cast<double>(n);
  return c;
}

// One entry of --backends: a device ("cpu", "cuda"), or for a routine whose op takes a
// `backend` argument (the GEMMs) one of the op's backends in upstream's spelling ("cudnn",
// "cublas", "auto", ...: on CUDA, as upstream's flashinfer_benchmark.py --backends names them),
// or DEVICE:NAME ("cpu:cudnn": the CPU reference called with that name, which it accepts, for
// scripts' dry runs).
struct RunBackend {
  std::string label;       // as given: the CSV's backend column and the [PERF] line's name
  Device dev;              // where the case runs
  std::string op_backend;  // the op's `backend` argument ("": the hook's default)
};

RunBackend parse_backend(const std::string& text) {
  const std::size_t colon = text.find(':');
  const std::string device = colon == std::string::npos ? "" : text.substr(0, colon);
  const std::string name = colon == std::string::npos ? text : text.substr(colon + 1);
  if (colon == std::string::npos && (text == "cpu" || text == "cuda")) {
    return {text, text == "cpu" ? Device::cpu() : Device::cuda(), ""};
  }
  if (colon != std::string::npos && device != "cpu" && device != "cuda") {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "bench", "backends", "unknown device '", device,
                    "' in '", text, "' (cpu or cuda before the colon)");
  }
  FLASHINFER_CHECK(!name.empty(), "bench", "backends", "empty backend name in '", text, "'");
  return {text, device == "cpu" ? Device::cpu() : Device::cuda(), name};
}

// An op backend name must be one the routine's op knows (upstream's names); a routine whose op
// takes no `backend` argument takes none.
void check_op_backend(const std::string& routine, const RunBackend& b) {
  if (b.op_backend.empty()) return;
  // A wrapper option under upstream's benchmark name (the decode wrapper's fa2 / fa2_tc), else
  // one of the op's backends.
  std::vector<std::string> known = api::bench::wrapper_backends(routine);
  if (!known.empty()) {
    if (std::find(known.begin(), known.end(), b.op_backend) != known.end()) return;
  } else {
    const std::vector<std::string> ops = ops_with_backend_requirement();
    if (std::find(ops.begin(), ops.end(), routine) == ops.end()) {
      FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "bench", "backends", "unknown backend '",
                      b.label, "' (", routine,
                      " takes cpu or cuda; op backend names are for the routines of ops with a "
                      "`backend` argument, e.g. mm_bf16, bmm_fp8, grouped_mm_bf16)");
    }
    const BackendRequirement& req = backend_requirement(routine);
    if (req.is_known_backend(b.op_backend)) return;
    known = req.upstream_backends;
  }
  std::string names;
  for (const std::string& n : known) names += (names.empty() ? "" : ", ") + n;
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "bench", "backends", "unknown backend '",
                  b.op_backend, "' for ", routine, " (cpu, cuda, or one of upstream's: ", names,
                  ")");
}

// A fresh case for `routine` on `dev` (same seed, so the same inputs on every backend), built
// with the op backend `op_backend` when one is given.
BenchCase make_case(const BenchOptions& o, Device dev, const std::string& op_backend = "") {
  if (o.routine == kCopyRoutine) return copy_case(o.shape, dev);
  if (op_backend.empty()) return (*find_bench_hook(o.routine))(o.shape, dev);
  api::bench::ScopedOpBackend scope(op_backend);
  BenchCase c = (*find_bench_hook(o.routine))(o.shape, dev);
  FLASHINFER_CHECK(scope.used(), "bench", "backends", "routine ", o.routine,
                   "'s bench case takes no op backend; pass cpu or cuda");
  return c;
}

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string r = "\"";
  for (char ch : s) {
    if (ch == '"') r += '"';
    r += ch;
  }
  return r + "\"";
}

constexpr const char* kCsvHeader =
    "routine,median_time,std_time,tflops,tb_per_sec,backend,resolved_backend,batch_size,s_qo,"
    "s_kv,num_qo_heads,num_kv_heads,head_dim_qk,head_dim_vo,page_size,q_dtype,kv_dtype,causal,"
    "prefix_len,item_len,m,"
    "n,k,input_dtype,out_dtype,hidden_size,vocab_size,top_k,top_p,num_iters,dry_run_iters,"
    "random_seed,flops,bytes,refcheck,no_cuda_graph,use_cupti,case_tag,timing,repro_command";

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof(b), f, v);
  return b;
}

// The command that reproduces this row: the kernel switches this process ran with
// (kernel_switches.h), then every shape flag spelled out.
std::string repro_command(const BenchOptions& o, const std::string& backend) {
  const BenchShape& s = o.shape;
  std::string r = kernel_switch_env_prefix() + "flashinfer bench --routine " + o.routine +
                  " --backends " + backend;
  auto add = [&r](const char* flag, const std::string& v) {
    r += std::string(" --") + flag + " " + v;
  };
  auto i = [](int64_t v) { return std::to_string(v); };
  add("batch_size", i(s.batch_size));
  add("s_qo", i(s.s_qo));
  add("s_kv", i(s.s_kv));
  add("num_qo_heads", i(s.num_qo_heads));
  add("num_kv_heads", i(s.num_kv_heads));
  add("head_dim_qk", i(s.head_dim_qk));
  add("head_dim_vo", i(s.head_dim_vo));
  add("page_size", i(s.page_size));
  // The MLA widths only where they differ from DeepSeek's (the other routines ignore them).
  if (s.head_dim_ckv != 512 || s.head_dim_kpe != 64) {
    add("head_dim_ckv", i(s.head_dim_ckv));
    add("head_dim_kpe", i(s.head_dim_kpe));
  }
  add("q_dtype", o.q_dtype);
  add("kv_dtype", o.kv_dtype);
  if (s.causal) r += " --causal";
  if (s.prefix_len >= 0) {  // multi-item scoring
    add("prefix_len", i(s.prefix_len));
    add("item_len", i(s.item_len));
  }
  add("m", i(s.m));
  add("n", i(s.n));
  add("k", i(s.k));
  add("input_dtype", o.input_dtype);
  if (!o.out_dtype.empty()) add("out_dtype", o.out_dtype);
  if (s.use_deepseek_fp8_block_scale) r += " --use_deepseek_fp8_block_scale";
  if (s.use_w4_group_scaling) r += " --use_w4_group_scaling";
  add("hidden_size", i(s.hidden_size));
  add("vocab_size", i(s.vocab_size));
  add("top_k", i(s.top_k));
  add("top_p", fmt("%g", s.top_p));
  add("num_iters", i(o.num_iters));
  add("dry_run_iters", i(o.dry_run_iters));
  add("random_seed", std::to_string(s.random_seed));
  if (o.refcheck) r += " --refcheck";
  if (o.no_cold_l2) r += " --no_cold_l2";
  if (o.no_cuda_graph) r += " --no_cuda_graph";
  if (o.use_cupti) r += " --use_cupti";
  if (!o.case_tag.empty()) add("case_tag", shell_quote(o.case_tag));
  return r;
}

std::string csv_row(const BenchOptions& o, const std::string& backend, double med, double sd,
                    double tflops, double tbps, const BenchCase& c, const std::string& refcheck,
                    const std::string& timing) {
  const BenchShape& s = o.shape;
  auto i = [](int64_t v) { return std::to_string(v); };
  std::vector<std::string> cols = {o.routine,
                                   fmt("%.6f", med),
                                   fmt("%.6f", sd),
                                   fmt("%.6f", tflops),
                                   fmt("%.6f", tbps),
                                   backend,
                                   backend,
                                   i(s.batch_size),
                                   i(s.s_qo),
                                   i(s.s_kv),
                                   i(s.num_qo_heads),
                                   i(s.num_kv_heads),
                                   i(s.head_dim_qk),
                                   i(s.head_dim_vo),
                                   i(s.page_size),
                                   o.q_dtype,
                                   o.kv_dtype,
                                   s.causal ? "True" : "False",
                                   i(s.prefix_len),
                                   i(s.item_len),
                                   i(s.m),
                                   i(s.n),
                                   i(s.k),
                                   o.input_dtype,
                                   o.out_dtype,
                                   i(s.hidden_size),
                                   i(s.vocab_size),
                                   i(s.top_k),
                                   fmt("%g", s.top_p),
                                   i(o.num_iters),
                                   i(o.dry_run_iters),
                                   std::to_string(s.random_seed),
                                   fmt("%.0f", c.flops),
                                   fmt("%.0f", c.bytes),
                                   refcheck,
                                   o.no_cuda_graph ? "True" : "False",
                                   o.use_cupti ? "True" : "False",
                                   o.case_tag,
                                   timing,
                                   repro_command(o, backend)};
  std::string line;
  for (std::size_t k = 0; k < cols.size(); ++k) {
    if (k) line += ',';
    line += csv_escape(cols[k]);
  }
  return line;
}

int list_routines() {
  int n = 0;
  for (const std::string& name : bench_routines()) {
    const OpDecl* d = OpRegistry::global().find(name);
    ++n;
    std::printf("%-48s %s\n", name.c_str(), d ? d->module.c_str() : "");
  }
  std::printf("%-48s %s\n", kCopyRoutine, "(built-in baseline: fp32 copy of --m x --n elements)");
  std::printf("%d op routines, 1 baseline\n", n);
  return 0;
}

// Why the last run_bench skipped an op backend this build or device does not run ("" when none
// was): a --testlist line whose every backend is such a skip is reported as skipped, not failed
// (a build without cuDNN has no bmm_fp8 "cudnn"; gpu-check's GEMM grid still asks for it).
std::string g_op_backend_skip;

// Whether `backend` can run here; otherwise prints why and returns false.
bool backend_available(const std::string& routine, const RunBackend& rb) {
  const std::string& backend = rb.label;
  if (rb.dev.is_cpu()) return true;
  // The op's backend table says whether this build has a CUDA kernel for it at all.
  if (routine != kCopyRoutine && cuda_compiled() && !op_has_backend(routine, DeviceType::kCUDA)) {
    std::printf("[SKIP] %s :: %s has no CUDA kernel in this build (CPU reference only)\n",
                backend.c_str(), routine.c_str());
    return false;
  }
  if (!cuda_compiled()) {
    std::printf("[SKIP] %s :: this build has no CUDA backend\n", backend.c_str());
    return false;
  }
  if (cuda_device_count() == 0) {
    std::printf("[SKIP] %s :: no CUDA device is present\n", backend.c_str());
    return false;
  }
  if (!rb.op_backend.empty() && api::bench::wrapper_backends(routine).empty()) {
    const int cc = detail::cuda_compute_capability(0);
    const BackendRequirement& req = backend_requirement(routine);
    if (!req.is_backend_supported(rb.op_backend, cc)) {
      std::string names;
      for (const std::string& n : req.supported_backends(cc)) names += " " + n;
      g_op_backend_skip = routine + "'s backend '" + rb.op_backend +
                          "' does not run on this build and device (compute capability " +
                          std::to_string(cc) + "; it runs:" + (names.empty() ? " none" : names) +
                          ")";
      std::printf("[SKIP] %s :: %s\n", backend.c_str(), g_op_backend_skip.c_str());
      return false;
    }
  }
  return true;
}

int run_bench(BenchOptions o) {
  g_op_backend_skip.clear();
  if (o.list) return list_routines();
  if (o.routine.empty()) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "bench", "routine",
                    "is required (`flashinfer bench --list` lists the routines)");
  }
  if (o.routine != kCopyRoutine) {
    const OpDecl* d = OpRegistry::global().find(o.routine);
    if (!d) {
      FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "bench", "routine", "no op named '", o.routine,
                      "' (`flashinfer bench --list` lists the routines)");
    }
    if (!find_bench_hook(o.routine)) {
      FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "bench", "routine", "op '", o.routine,
                      "' has no bench routine (`flashinfer bench --list` lists them)");
    }
  }
  BenchShape& s = o.shape;
  s.q_dtype = parse_dtype(o.q_dtype, "q_dtype");
  s.kv_dtype = parse_dtype(o.kv_dtype, "kv_dtype");
  s.input_dtype = parse_dtype(o.input_dtype, "input_dtype");
  if (!o.out_dtype.empty()) s.out_dtype = parse_dtype(o.out_dtype, "out_dtype");
  for (auto [v, flag] : {std::pair{s.batch_size, "batch_size"},
                         {s.s_qo, "s_qo"},
                         {s.s_kv, "s_kv"},
                         {s.num_qo_heads, "num_qo_heads"},
                         {s.num_kv_heads, "num_kv_heads"},
                         {s.head_dim_qk, "head_dim_qk"},
                         {s.head_dim_vo, "head_dim_vo"},
                         {s.page_size, "page_size"},
                         {s.head_dim_ckv, "head_dim_ckv"},
                         {s.m, "m"},
                         {s.n, "n"},
                         {s.k, "k"},
                         {s.hidden_size, "hidden_size"},
                         {s.vocab_size, "vocab_size"},
                         {s.top_k, "top_k"}}) {
    check_positive(v, flag);
  }
  FLASHINFER_CHECK(s.head_dim_kpe >= 0, "bench", "head_dim_kpe", "must be >= 0, got ",
                   s.head_dim_kpe);
  // Multi-item scoring: the batch prefill wrappers' routines only (another routine would time
  // a plain call under a row that says otherwise).
  FLASHINFER_CHECK(
      s.prefix_len == -1 ||
          (s.prefix_len >= 0 && (o.routine == "BatchPrefillWithPagedKVCacheWrapper.run" ||
                                 o.routine == "BatchPrefillWithRaggedKVCacheWrapper.run")),
      "bench", "prefix_len",
      "multi-item scoring prompts are the batch prefill wrappers' (-1: off), got ", s.prefix_len,
      " for ", o.routine);
  FLASHINFER_CHECK(s.top_p > 0.0 && s.top_p <= 1.0, "bench", "top_p", "must be in (0, 1], got ",
                   s.top_p);
  check_positive(o.num_iters, "num_iters");
  FLASHINFER_CHECK(o.dry_run_iters >= 0, "bench", "dry_run_iters", "must be >= 0, got ",
                   o.dry_run_iters);
  std::vector<RunBackend> backends;
  for (const std::string& b : o.backends) {
    RunBackend rb = parse_backend(b);
    if (o.routine == kCopyRoutine && !rb.op_backend.empty()) {
      FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "bench", "backends", "unknown backend '", b,
                      "' (", kCopyRoutine, " takes cpu or cuda)");
    }
    if (o.routine != kCopyRoutine) check_op_backend(o.routine, rb);
    if (backend_available(o.routine, rb)) backends.push_back(std::move(rb));
  }
  if (backends.empty()) {
    std::printf("no requested backend is available\n");
    return 4;
  }

  // Refcheck: every backend's outputs of one run on identical inputs against the CPU reference.
  std::vector<std::string> refstatus(backends.size(), "");
  bool mismatch = false;
  if (o.refcheck) {
    BenchCase ref = make_case(o, Device::cpu());
    ref.run();
    const NamedTensors expected = ref.outputs();
    for (std::size_t bi = 0; bi < backends.size(); ++bi) {
      BenchCase c = make_case(o, backends[bi].dev, backends[bi].op_backend);
      c.run();
      const NamedTensors actual = c.outputs();
      const std::vector<replay::TensorComparison> judged =
          api::bench::judge_outputs(o.routine, c, actual, expected);
      int64_t bad = 0;
      for (std::size_t t = 0; t < expected.size(); ++t) {
        const replay::TensorComparison cmp = judged[t];
        if (cmp.match) {
          if (o.verbose) {
            std::printf("[REFCHECK] %s %s: %lld elements match (max abs error %.3g)\n",
                        backends[bi].label.c_str(), expected[t].first.c_str(),
                        static_cast<long long>(cmp.numel), cmp.max_abs_error);
          }
          continue;
        }
        ++bad;
        if (!cmp.problem.empty() || t >= actual.size()) {
          std::printf("[REFCHECK] %s %s: %s\n", backends[bi].label.c_str(),
                      expected[t].first.c_str(),
                      t < actual.size() ? cmp.problem.c_str() : "missing");
        } else {
          std::printf(
              "[REFCHECK] %s %s: %lld of %lld elements differ from the CPU reference (max abs "
              "error %.3g; rtol %g, atol %g)\n",
              backends[bi].label.c_str(), expected[t].first.c_str(),
              static_cast<long long>(cmp.mismatches), static_cast<long long>(cmp.numel),
              cmp.max_abs_error, cmp.rtol, cmp.atol);
        }
      }
      refstatus[bi] = bad ? "mismatch" : "pass";
      mismatch = mismatch || bad;
      if (!bad) {
        std::printf("[REFCHECK] %s :: %zu outputs match the CPU reference\n",
                    backends[bi].label.c_str(), expected.size());
      }
    }
    if (mismatch && !o.allow_output_mismatch) {
      std::printf("[ERROR] output mismatch (pass --allow_output_mismatch to time anyway)\n");
      return 1;
    }
  }

  std::FILE* csv = nullptr;
  if (!o.output_path.empty()) {
    const bool fresh =
        !std::filesystem::exists(o.output_path) || std::filesystem::file_size(o.output_path) == 0;
    csv = std::fopen(o.output_path.c_str(), "a");
    if (!csv) {
      FLASHINFER_FAIL(ErrorCode::kIo, "bench", "output_path", "cannot open '", o.output_path,
                      "' for writing");
    }
    if (fresh) {
      std::fprintf(csv, "%s\n", kCsvHeader);
    } else {
      // Rows appended under another column set would be read as the wrong columns.
      std::ifstream existing(o.output_path);
      std::string header;
      std::getline(existing, header);
      if (!header.empty() && header.back() == '\r') header.pop_back();
      if (header != kCsvHeader) {
        std::fclose(csv);
        FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "bench", "output_path", "'", o.output_path,
                        "' has other columns (an older flashinfer bench wrote it): write to a "
                        "new file");
      }
    }
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> csv_closer(
      csv, [](std::FILE* f) { return f ? std::fclose(f) : 0; });

  if (o.generate_repro_command) {
    std::string labels;
    for (const RunBackend& b : backends) labels += (labels.empty() ? "" : " ") + b.label;
    std::printf("[INFO] To reproduce this test case, run the following command: %s\n",
                repro_command(o, labels).c_str());
  }
  const bool any_cuda = std::any_of(backends.begin(), backends.end(),
                                    [](const RunBackend& b) { return b.dev.is_cuda(); });
  if (o.use_cupti && any_cuda) {
    // upstream's words when its CUPTI package is missing; this library has no CUPTI timing.
    std::printf(
        "[WARNING] CUPTI timing is not built into flashinfer-cpp. Falling back to CUDA events "
        "for benchmarking.\n");
  }
  BenchTiming timing;
  timing.cold_l2 = !o.no_cold_l2;
  timing.cuda_graph = !o.no_cuda_graph;
  for (std::size_t bi = 0; bi < backends.size(); ++bi) {
    const std::string& name = backends[bi].label;
    const Device dev = backends[bi].dev;
    BenchCase c = make_case(o, dev, backends[bi].op_backend);
    if (!backends[bi].op_backend.empty() && dev.is_cuda() &&
        api::bench::wrapper_backends(o.routine).empty()) {
      const BackendInfo* info = backend_requirement(o.routine).find(backends[bi].op_backend);
      if (info && !info->implementation.empty()) {
        std::printf("[INFO] %-8s:: %s backend '%s' runs: %s\n", name.c_str(), o.routine.c_str(),
                    backends[bi].op_backend.c_str(), info->implementation.c_str());
      }
    }
    if (o.verbose) {
      std::printf("[INFO] %s on %s: %.6g FLOPs, %.6g bytes per iteration\n", o.routine.c_str(),
                  name.c_str(), c.flops, c.bytes);
    }
    const std::string op_backend = backends[bi].op_backend;
    const BenchTimes bt = bench_time(
        c, [&o, dev, op_backend] { return make_case(o, dev, op_backend); }, dev, o.dry_run_iters,
        o.num_iters, timing);
    if (!bt.note.empty()) {
      std::printf("[WARNING] %-8s:: %s; timed with CUDA events instead\n", name.c_str(),
                  bt.note.c_str());
    } else if (o.verbose && bt.method == "cuda_graph") {
      std::printf("[INFO] %-8s:: timed as a CUDA graph of %d calls over %lld input copies\n",
                  name.c_str(), timing.iters_within_graph, static_cast<long long>(bt.input_copies));
    }
    const std::vector<double>& t = bt.ms;
    const double med = median(t), sd = stddev(t);
    const double secs = med * 1e-3;
    const double tflops = secs > 0 ? c.flops / secs / 1e12 : 0.0;
    const double tbps = secs > 0 ? c.bytes / secs / 1e12 : 0.0;
    std::printf(
        "[PERF] %-8s:: median time %.4f ms; std %.4f ms; achieved tflops %.6f TFLOPs/sec; "
        "achieved tb_per_sec %.6f TB/sec\n",
        name.c_str(), med, sd, tflops, tbps);
    if (dev.is_cuda() && secs > 0) {
      // The GPU yardstick is the device's own peak (the CPU's is the stream_copy routine).
      // Peak: two transfers per memory clock times the bus width (the driver's attributes).
      const double peak = detail::cuda_peak_memory_bandwidth(dev.index);
      if (peak > 0) {
        const double frac = c.bytes / secs / peak;
        std::printf(
            "[INFO] %-8s:: %.3f of the device's peak memory bandwidth (%.1f %% of %.3f TB/sec)\n",
            name.c_str(), frac, 100.0 * frac, peak / 1e12);
      } else {
        std::printf(
            "[INFO] %-8s:: the device's peak memory bandwidth is unknown (the driver reports no "
            "memory clock or bus width)\n",
            name.c_str());
      }
    }
    // Compute-bound routines (prefill, GEMM) against the dense tensor-core peak of their
    // operand width (api/bench_backend.h): 8-bit for the fp8 GEMMs, else the GEMMs' input_dtype
    // or attention's q_dtype.
    const int bits = api::bench::bench_operand_bits(o.routine, operand_bits(s.input_dtype),
                                                    operand_bits(s.q_dtype));
    if (dev.is_cuda() && secs > 0 && c.flops > 0 && bits > 0) {
      const double rate =
          api::bench::dense_tensor_rate_vs_16bit(detail::cuda_compute_capability(dev.index), bits);
      const double peak = rate * detail::cuda_peak_tensor_flops_16bit(dev.index);
      if (peak > 0) {
        const double frac = c.flops / secs / peak;
        std::printf(
            "[INFO] %-8s:: %.3f of the device's dense %d-bit tensor peak (%.1f %% of %.1f "
            "TFLOPs/sec at the driver's peak clock)\n",
            name.c_str(), frac, bits, 100.0 * frac, peak / 1e12);
      }
    }
    if (csv) {
      const std::string ref = o.refcheck ? refstatus[bi] : "";
      std::fprintf(csv, "%s\n", csv_row(o, name, med, sd, tflops, tbps, c, ref, bt.method).c_str());
    }
  }
  std::fflush(stdout);
  return 0;
}

// The flags of `flashinfer bench`, bound to `o` (also used for each line of a --testlist).
void add_bench_options(Args& app, BenchOptions& o) {
  BenchShape& s = o.shape;
  // A flag given twice takes its last value, as with upstream's argparse.
  app.take_last_by_default();
  app.add_option("--routine", o.routine, "Op or wrapper method to time (see --list)");
  app.add_flag("--list", o.list, "List the routines (ops whose declaration has a bench hook)");
  app.add_option("--backends", o.backends,
                 "Backends to time: cpu, cuda, cuda:fa2 / cuda:fa2_tc for "
                 "BatchDecodeWithPagedKVCacheWrapper.run (use_tensor_cores False / True, as "
                 "upstream's benchmark names them), or for the GEMM routines the op's backends in "
                 "upstream's names on CUDA (mm_bf16: cudnn auto; bmm_fp8: cublas cudnn; "
                 "grouped_mm_*: cudnn), or cpu:NAME (the CPU reference given that name)")
      .expected(1, 16)
      .take_all();
  app.add_option("--num_iters", o.num_iters, "Timed iterations (30)");
  app.add_option("--dry_run_iters", o.dry_run_iters, "Untimed warm-up iterations (5)");
  app.add_flag("--refcheck", o.refcheck, "Compare every backend with the CPU reference");
  app.add_flag("--allow_output_mismatch", o.allow_output_mismatch,
               "Time even when refcheck finds a mismatch");
  app.add_flag("-v,--verbose", o.verbose, "Print FLOP and byte counts and refcheck details");
  app.add_flag("--no_cold_l2", o.no_cold_l2,
               "CUDA: no cold L2 (no flush between eager iterations, no input copies in a graph)");
  app.add_flag("--no_cuda_graph", o.no_cuda_graph,
               "CUDA: time each call with events instead of replays of a CUDA graph of 10 calls");
  app.add_flag("--use_cupti", o.use_cupti,
               "upstream's CUPTI timing: not built here (a warning; the timing stays as above)");
  app.add_option("--case_tag", o.case_tag, "A tag for the case, in the CSV's case_tag column");
  app.add_flag("--generate_repro_command", o.generate_repro_command,
               "Print the command that reproduces the case (the CSV always holds it)");
  app.add_option("--output_path", o.output_path, "Append one CSV row per backend to this file");
  app.add_option("--testlist", o.testlist,
                 "Run each line of this file as the flags of one bench (on top of these flags), "
                 "in one process");
  app.add_option("--random_seed", s.random_seed, "Seed of the random inputs (42)");
  app.add_option("--batch_size", s.batch_size, "Requests, rows or tokens");
  app.add_option("--s_qo", s.s_qo, "Query length per request");
  app.add_option("--s_kv", s.s_kv, "KV length per request");
  app.add_option("--num_qo_heads", s.num_qo_heads, "Query heads");
  app.add_option("--num_kv_heads", s.num_kv_heads, "KV heads");
  app.add_option("--head_dim_qk", s.head_dim_qk, "Head dim of q and k");
  app.add_option("--head_dim_vo", s.head_dim_vo, "Head dim of v and o");
  app.add_option("--page_size", s.page_size, "Tokens per KV page");
  app.add_option("--head_dim_ckv", s.head_dim_ckv, "MLA latent width (512)");
  app.add_option("--head_dim_kpe", s.head_dim_kpe, "MLA rope width (64; 0: a NoPE model's MLA)");
  app.add_option("--q_dtype", o.q_dtype, "Query dtype (bfloat16)");
  app.add_option("--kv_dtype", o.kv_dtype, "KV dtype (bfloat16)");
  app.add_flag("--causal", s.causal, "Causal mask (prefill)");
  app.add_option("--prefix_len", s.prefix_len,
                 "Prefill: multi-item scoring prompts (SGLang's scoring API; with --causal and "
                 "s_qo == s_kv): this many prefix tokens, then items of --item_len tokens, each "
                 "after a delimiter (-1: off)");
  app.add_option("--item_len", s.item_len, "Tokens of each item (with --prefix_len)");
  app.add_option("--m", s.m, "GEMM rows / quantization rows / copy rows");
  app.add_option("--n", s.n, "GEMM columns / copy columns");
  app.add_option("--k", s.k, "GEMM depth / quantization columns");
  app.add_option("--input_dtype", o.input_dtype,
                 "Input dtype of norm, activation, GEMM, quantization");
  app.add_option("--out_dtype", o.out_dtype, "GEMM output dtype (bfloat16)");
  app.add_flag("--use_deepseek_fp8_block_scale", s.use_deepseek_fp8_block_scale,
               "cutlass_fused_moe: DeepSeek's FP8 block scale (bf16 input, e4m3 weights)");
  app.add_flag(
      "--use_w4_group_scaling", s.use_w4_group_scaling,
      "cutlass_fused_moe: W4A16 MXFP4 (input_dtype input, MXFP4 weights in the SM90 layouts)");
  app.add_option("--hidden_size", s.hidden_size, "Hidden size (norm, activation)");
  app.add_option("--vocab_size", s.vocab_size, "Vocabulary size (sampling)");
  app.add_option("--top_k", s.top_k, "top_k (sampling)");
  app.add_option("--top_p", s.top_p, "top_p (sampling)");
}

// --testlist: each line (blank lines and # comments skipped) holds the flags of one run, applied
// on top of the command line's flags; one process runs them in order, as upstream's
// flashinfer_benchmark.py --testlist does. A line that fails says so and the next one runs.
int run_testlist(const BenchOptions& base) {
  std::ifstream in(base.testlist);
  if (!in) {
    FLASHINFER_FAIL(ErrorCode::kIo, "bench", "testlist", "cannot open '", base.testlist,
                    "' for reading");
  }
  std::string line;
  int number = 0, ran = 0, failed = 0;
  while (std::getline(in, line)) {
    ++number;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
      line.pop_back();
    const std::size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    const std::string text = line.substr(first);
    ++ran;
    std::printf("[TESTLIST] line %d: %s\n", number, text.c_str());
    std::fflush(stdout);
    int status = 0;
    std::string why;
    try {
      BenchOptions o = base;
      o.testlist.clear();
      parse_line("a line of flashinfer bench --testlist", text,
                 [&o](Args& args) { add_bench_options(args, o); });
      if (!o.testlist.empty()) {
        FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "bench", "testlist",
                        "a testlist line cannot name another testlist");
      }
      status = run_bench(o);
    } catch (const std::exception& e) {  // flashinfer::Error, CLI11's parse errors, bad_alloc
      why = e.what();
      status = 1;
    }
    if (status == 4 && why.empty() && !g_op_backend_skip.empty()) {
      std::printf("[SKIP] testlist line %d: %s\n", number, g_op_backend_skip.c_str());
    } else if (status != 0) {
      ++failed;
      if (why.empty()) why = "exit status " + std::to_string(status);
      std::printf("[ERROR] testlist line %d: %s\n", number, why.c_str());
    }
    std::fflush(stdout);
  }
  std::printf("[TESTLIST] %d lines run, %d failed\n", ran, failed);
  std::fflush(stdout);
  return failed ? 1 : 0;
}

}  // namespace

Command bench_command() {
  return {
      "bench",
      "Time an op on each backend ([PERF] lines and CSV, as upstream's flashinfer_benchmark.py)",
      [](Args& sub) {
        auto o = std::make_shared<BenchOptions>();
        add_bench_options(sub, *o);
        return std::function<int()>(
            [o] { return o->testlist.empty() || o->list ? run_bench(*o) : run_testlist(*o); });
      }};
}

}  // namespace flashinfer::cli
