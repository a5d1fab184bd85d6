// The Flight Recorder: layout, records key by key, tensor files, crash safety, concurrency,
// limits, filters, failure handling, and upstream's own session scanner on our files.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "flashinfer/tensor_io.h"
#include "recorder/recorder_internal.h"
#include "util/crash_handler.h"
#if FLASHINFER_TEST_HAVE_CUDART
#include "util/cuda_graph_util.h"
#endif
#include "util/run_command.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- a user op that can crash or throw on request, and a user wrapper ----
enum class Mode { kOk, kThrow, kKill };
Tensor probe(const Tensor& x, int64_t mode, std::optional<Tensor> out);

const OpDecl& probe_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "probe_op";
    decl.module = "tests.recorder";
    decl.params = {ParamDecl("x", ParamKind::kTensor), ParamDecl("mode", ParamKind::kInt).def(0),
                   ParamDecl("out", ParamKind::kTensor).opt().mut(),
                   ParamDecl("scale", ParamKind::kFloat).def(1.0).kw(),
                   ParamDecl("dtype", ParamKind::kDType).opt().kw()};
    decl.returns = "Tensor";
    decl.invoke = [](const CallArgs& a) -> Value {
      return probe(a.tensor(0), a.i64(1), a.optional_tensor(2));
    };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

Tensor probe(const Tensor& x, int64_t mode, std::optional<Tensor> out) {
  return call_api(
      &probe_decl,
      [&] {
        if (mode == 1)
          throw Error(ErrorCode::kInvalidArgument, "probe_op", "mode", "asked to throw");
        if (mode == 2) ::raise(SIGKILL);
        Tensor y = x.clone();
        std::vector<double> v = y.to_double_vector();
        for (double& e : v) e *= 2;
        y = Tensor::from_vector(v, x.shape(), x.dtype());
        if (out) out->copy_(y);
        return y;
      },
      x, mode, out, 1.0, std::optional<DType>());
}

class DumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fi_rec_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    recorder::set_log_sink([this](const std::string& l) {
      std::lock_guard<std::mutex> g(mu_);
      log_.push_back(l);
    });
  }
  void TearDown() override {
    recorder::stop();
    recorder::set_log_sink({});
    fs::remove_all(dir_);
  }
  void start(recorder::Config c = {}) {
    c.dump_dir = dir_.string();
    recorder::start(c);
  }
  std::vector<fs::path> call_dirs() const {
    std::vector<fs::path> out;
    if (!fs::exists(dir_)) return out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      // Hidden: the pool of prepared directories a killed process leaves behind.
      if (e.is_directory() && !e.path().filename().string().starts_with(".")) {
        out.push_back(e.path());
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  static std::vector<json> lines(const fs::path& p) {
    std::ifstream f(p);
    std::vector<json> out;
    std::string l;
    while (std::getline(f, l)) {
      if (!l.empty()) out.push_back(json::parse(l));
    }
    return out;
  }
  static std::vector<std::string> raw_lines(const fs::path& p) {
    std::ifstream f(p);
    std::vector<std::string> out;
    std::string l;
    while (std::getline(f, l)) out.push_back(l);
    return out;
  }
  fs::path dir_;
  std::mutex mu_;
  std::vector<std::string> log_;
};

TEST_F(DumpTest, RmsnormRecordMatchesUpstreamLayout) {
  start();
  Tensor x = Tensor::from_vector({3, 4, 1, 1}, {2, 2}, DType::kFloat16);
  Tensor w = Tensor::from_vector({1, 2}, {2}, DType::kFloat16);
  Tensor y = rmsnorm(x, w, 1e-5);
  recorder::stop();
  auto dirs = call_dirs();
  ASSERT_EQ(dirs.size(), 1u);
  const std::string name = dirs[0].filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(\d{8}_\d{6}_\d{3}_pid\d+_rmsnorm_call0001)")))
      << name;
  EXPECT_TRUE(fs::exists(dirs[0] / "inputs.pt"));
  EXPECT_TRUE(fs::exists(dirs[0] / "outputs.pt"));
  EXPECT_FALSE(fs::exists(dirs[0] / "mutated.pt"));  // out was not given
  const auto raw = raw_lines(dirs[0] / "metadata.jsonl");
  ASSERT_EQ(raw.size(), 2u);
  // Python json.dumps spelling: ", " and ": " separators, keys in upstream's order.
  EXPECT_TRUE(
      raw[0].starts_with("{\"function_name\": \"rmsnorm\", \"module\": \"flashinfer.norm\", "
                         "\"call_sequence\": 1, \"timestamp\": \""))
      << raw[0];
  const json l1 = json::parse(raw[0]), l2 = json::parse(raw[1]);
  std::vector<std::string> keys;
  const auto ordered = nlohmann::ordered_json::parse(raw[0]);
  for (auto it = ordered.begin(); it != ordered.end(); ++it) keys.push_back(it.key());
  const std::vector<std::string> upstream = {"function_name",
                                             "module",
                                             "call_sequence",
                                             "timestamp",
                                             "process_id",
                                             "input_metadata",
                                             "output_metadata",
                                             "tensor_info",
                                             "tensor_details",
                                             "tensor_format",
                                             "function_signature",
                                             "versions",
                                             "execution_status",
                                             "graph_capture",
                                             "dump_dir"};
  ASSERT_GE(keys.size(), upstream.size());
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + upstream.size()), upstream);
  EXPECT_EQ(l1["execution_status"], "inputs_saved");
  EXPECT_EQ(l2["execution_status"], "completed");
  EXPECT_EQ(l1["process_id"], ::getpid());
  EXPECT_EQ(l1["timestamp"], name.substr(0, 19));
  EXPECT_EQ(l1["function_signature"], "(input, weight, eps=1e-06, out=None, enable_pdl=None)");
  EXPECT_EQ(l1["tensor_format"], "torch");
  EXPECT_EQ(l1["graph_capture"], false);
  EXPECT_FALSE(l1.contains("self_id"));
  EXPECT_EQ(l1["dump_dir"], (dir_ / name).string());
  // Tensors are in the files only; scalars and None in input_metadata.
  EXPECT_EQ(l1["input_metadata"], json({{"arg_2", 1e-5}, {"arg_3", nullptr}, {"arg_4", nullptr}}));
  EXPECT_EQ(l1["tensor_info"]["input_tensor_keys"], json({"arg_0", "arg_1"}));
  EXPECT_EQ(l1["tensor_info"]["input_size_bytes"], 12);
  EXPECT_EQ(l1["output_metadata"], json::object());
  EXPECT_EQ(l2["tensor_info"]["output_tensor_keys"], json({"result"}));
  EXPECT_EQ(l2["tensor_info"]["total_size_bytes"], 20);
  EXPECT_EQ(l1["tensor_details"]["arg_0"], json({{"shape", {2, 2}},
                                                 {"dtype", "torch.float16"},
                                                 {"stride", {2, 1}},
                                                 {"device", "cpu"},
                                                 {"original_device", "cpu"}}));
  EXPECT_EQ(l2["tensor_details"]["result"]["dtype"], "torch.float16");
  EXPECT_EQ(l1["backend"], "cpu");
  EXPECT_EQ(l1["versions"]["flashinfer"], std::string(version()));
  // The tensor files hold the values.
  NamedTensors in = load_torch((dirs[0] / "inputs.pt").string());
  ASSERT_EQ(in.size(), 2u);
  EXPECT_EQ(in[0].first, "arg_0");
  EXPECT_EQ(in[0].second.to_double_vector(), x.to_double_vector());
  NamedTensors out = load_torch((dirs[0] / "outputs.pt").string());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].second.to_double_vector(), y.to_double_vector());
  // session.jsonl has the same two records.
  const auto session = raw_lines(dir_ / "session.jsonl");
  EXPECT_EQ(session, raw);
  // The per-call log lines, in upstream's words.
  ASSERT_EQ(log_.size(), 4u);
  EXPECT_EQ(log_[0], "Dumped inputs to: " + (dir_ / name).string() +
                         " (size: 0.00 MB, total: 1/1000 dumps)");
  EXPECT_EQ(log_[1], "Inputs dumped to: " + (dir_ / name).string());
  EXPECT_EQ(log_[2], "Dumped outputs to: " + (dir_ / name).string() +
                         " (output size: 0.00 MB, total dump size: 0.00 MB)");
  EXPECT_EQ(log_[3], "Outputs dumped to: " + (dir_ / name).string());
}

TEST_F(DumpTest, KeywordsMutatedArgumentsAndCounters) {
  start();
  Tensor x = Tensor::from_vector({1, 2}, {2}, DType::kFloat32);
  Tensor out = Tensor::zeros({2}, DType::kFloat32);
  probe(x, 0, out);
  probe(x, 0, std::nullopt);
  recorder::stop();
  auto dirs = call_dirs();
  ASSERT_EQ(dirs.size(), 2u);
  EXPECT_TRUE(dirs[0].string().ends_with("_probe_op_call0001"));
  EXPECT_TRUE(dirs[1].string().ends_with("_probe_op_call0002"));
  const auto l = lines(dirs[0] / "metadata.jsonl");
  EXPECT_EQ(l[1]["call_sequence"], 1);
  // Keyword-only parameters at their default are not recorded (a Python caller omits them).
  EXPECT_FALSE(l[0]["input_metadata"].contains("kwarg_scale"));
  EXPECT_EQ(l[0]["function_signature"], "(x, mode=0, out=None, *, scale=1.0, dtype=None)");
  EXPECT_EQ(l[0]["tensor_info"]["input_tensor_keys"], json({"arg_0", "arg_2"}));
  EXPECT_EQ(l[1]["tensor_info"]["mutated_tensor_keys"], json({"arg_2"}));
  NamedTensors m = load_torch((dirs[0] / "mutated.pt").string());
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].first, "arg_2");
  EXPECT_EQ(m[0].second.to_double_vector(), (std::vector<double>{2, 4}));
  // The input file holds `out` as it was before the call.
  NamedTensors in = load_torch((dirs[0] / "inputs.pt").string());
  EXPECT_EQ(in[1].second.to_double_vector(), (std::vector<double>{0, 0}));
}

TEST_F(DumpTest, ThrowingCallLeavesOnlyLineOne) {
  start();
  Tensor x = Tensor::from_vector({1}, {1}, DType::kFloat32);
  EXPECT_THROW(probe(x, 1, std::nullopt), Error);
  probe(x, 0, std::nullopt);  // the recorder goes on
  recorder::stop();
  auto dirs = call_dirs();
  ASSERT_EQ(dirs.size(), 2u);
  const auto l = lines(dirs[0] / "metadata.jsonl");
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0]["execution_status"], "inputs_saved");
  EXPECT_TRUE(fs::exists(dirs[0] / "inputs.pt"));
  EXPECT_FALSE(fs::exists(dirs[0] / "outputs.pt"));
  EXPECT_EQ(lines(dir_ / "session.jsonl").size(), 3u);
}

TEST_F(DumpTest, KilledProcessLeavesReadableInputs) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    start();
    Tensor x = Tensor::from_vector({5, 6, 7}, {3}, DType::kFloat32);
    probe(x, 2, std::nullopt);  // SIGKILL inside the op
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  auto dirs = call_dirs();
  ASSERT_EQ(dirs.size(), 1u);
  const auto l = lines(dirs[0] / "metadata.jsonl");
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0]["execution_status"], "inputs_saved");
  NamedTensors in = load_torch((dirs[0] / "inputs.pt").string());
  EXPECT_EQ(in[0].second.to_double_vector(), (std::vector<double>{5, 6, 7}));
}

TEST_F(DumpTest, ConcurrentThreadsAndProcessesNeverTearLines) {
  constexpr int kThreads = 4, kCalls = 25, kProcs = 2;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      start();
      std::vector<std::thread> ts;
      for (int t = 0; t < kThreads; ++t) {
        ts.emplace_back([] {
          Tensor x = Tensor::from_vector({1, 2, 3, 4}, {4}, DType::kFloat32);
          for (int i = 0; i < kCalls; ++i) probe(x, 0, std::nullopt);
        });
      }
      for (auto& th : ts) th.join();
      recorder::stop();
      _exit(0);
    }
    kids.push_back(child);
  }
  for (pid_t k : kids) {
    int st = 0;
    waitpid(k, &st, 0);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  const auto session = raw_lines(dir_ / "session.jsonl");
  EXPECT_EQ(session.size(), static_cast<size_t>(2 * kProcs * kThreads * kCalls));
  std::map<std::string, int> per_dir;
  for (const auto& s : session) {
    json j = json::parse(s);  // throws on a torn line
    per_dir[j["dump_dir"]]++;
  }
  EXPECT_EQ(per_dir.size(), static_cast<size_t>(kProcs * kThreads * kCalls));
  for (const auto& [d, n] : per_dir) EXPECT_EQ(n, 2) << d;
  EXPECT_EQ(call_dirs().size(), static_cast<size_t>(kProcs * kThreads * kCalls));
}

TEST_F(DumpTest, CountAndSizeLimits) {
  recorder::Config c;
  c.max_count = 2;
  start(c);
  Tensor x = Tensor::from_vector({1}, {1}, DType::kFloat32);
  EXPECT_TRUE(recorder::active());
  for (int i = 0; i < 4; ++i) probe(x, 0, std::nullopt);
  EXPECT_FALSE(recorder::active());  // the count limit ends the recording
  recorder::stop();
  EXPECT_EQ(call_dirs().size(), 2u);
  int limit_lines = 0;
  for (const auto& l : log_) {
    if (l ==
        "Dump limit reached (2 dumps). Skipping dump for probe_op. Increase "
        "FLASHINFER_DUMP_MAX_COUNT if needed.") {
      ++limit_lines;
    }
  }
  EXPECT_EQ(limit_lines, 2);

  fs::remove_all(dir_);
  log_.clear();
  recorder::Config s;
  s.max_size_gb = 100.0 / (1024.0 * 1024.0 * 1024.0);  // 100 bytes
  start(s);
  Tensor big = Tensor::zeros({30}, DType::kFloat32);  // 120 bytes: rejected
  probe(big, 0, std::nullopt);
  probe(x, 0, std::nullopt);        // 4 bytes in: fits
  EXPECT_TRUE(recorder::active());  // the size limit only skips calls too large
  recorder::stop();
  EXPECT_FALSE(recorder::active());
  auto dirs = call_dirs();
  ASSERT_EQ(dirs.size(), 1u);
  // The counter moved for the rejected call, so the kept one is call 2 (upstream leaves a gap).
  EXPECT_TRUE(dirs[0].string().ends_with("_probe_op_call0002")) << dirs[0];
  ASSERT_FALSE(log_.empty());
  EXPECT_EQ(log_[0],
            "Dump size limit reached (9.313225746154785e-08 GB). Skipping dump for probe_op. "
            "Increase FLASHINFER_DUMP_MAX_SIZE_GB if needed.");
}

TEST_F(DumpTest, IncludeExcludeFilters) {
  EXPECT_EQ(recorder::split_patterns(" *decode*, *prefill*,,"),
            (std::vector<std::string>{"*decode*", "*prefill*"}));
  recorder::Config c;
  c.include = {"single_*", "probe*"};
  c.exclude = {"*prefill*"};
  EXPECT_TRUE(recorder::should_dump(c, "single_decode_with_kv_cache"));
  EXPECT_FALSE(recorder::should_dump(c, "single_prefill_with_kv_cache"));
  EXPECT_FALSE(recorder::should_dump(c, "rmsnorm"));
  recorder::Config w;
  w.include = {"*Wrapper.run"};
  EXPECT_TRUE(recorder::should_dump(w, "BatchDecodeWithPagedKVCacheWrapper.run"));
  EXPECT_FALSE(recorder::should_dump(w, "BatchDecodeWithPagedKVCacheWrapper.plan"));
  recorder::Config e;
  e.exclude = {"*.__init__", "*.plan"};
  EXPECT_FALSE(recorder::should_dump(e, "X.__init__"));
  EXPECT_TRUE(recorder::should_dump(e, "rmsnorm"));
  start(c);
  Tensor x = Tensor::from_vector({1, 1}, {1, 2}, DType::kFloat32);
  rmsnorm(x, Tensor::from_vector({1, 1}, {2}, DType::kFloat32));  // filtered: silent
  probe(x, 0, std::nullopt);
  recorder::stop();
  auto dirs = call_dirs();
  ASSERT_EQ(dirs.size(), 1u);
  EXPECT_NE(dirs[0].string().find("probe_op"), std::string::npos);
  for (const auto& l : log_) EXPECT_EQ(l.find("rmsnorm"), std::string::npos) << l;
}

// A call the filter rejects is still the outermost call: a public op it calls inside is not
// recorded in its place, although the filter would accept that op.
TEST_F(DumpTest, ExcludedCallHidesTheCallsInsideIt) {
  recorder::Config c;
  c.exclude = {"probe_op"};
  start(c);
  Tensor x = Tensor::from_vector({1, 1}, {1, 2}, DType::kFloat32);
  const Tensor w = Tensor::from_vector({1, 1}, {2}, DType::kFloat32);
  call_api(
      &probe_decl, [&] { return rmsnorm(x, w); }, x, int64_t{0}, std::optional<Tensor>(), 1.0,
      std::optional<DType>());
  EXPECT_TRUE(call_dirs().empty());
  rmsnorm(x, w);  // on its own it is recorded
  recorder::stop();
  ASSERT_EQ(call_dirs().size(), 1u);
  EXPECT_NE(call_dirs()[0].string().find("_rmsnorm_call0001"), std::string::npos);
}

TEST_F(DumpTest, SafetensorsMode) {
  recorder::Config c;
  c.safetensors = true;
  start(c);
  Tensor x = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::kFloat32);
  probe(x.transpose(0, 1), 0, std::nullopt);
  recorder::stop();
  auto dirs = call_dirs();
  ASSERT_EQ(dirs.size(), 1u);
  EXPECT_TRUE(fs::exists(dirs[0] / "inputs.safetensors"));
  EXPECT_FALSE(fs::exists(dirs[0] / "inputs.pt"));
  const auto l = lines(dirs[0] / "metadata.jsonl");
  EXPECT_EQ(l[1]["tensor_format"], "safetensors");
  EXPECT_EQ(l[0]["tensor_details"]["arg_0"]["stride"], json({1, 3}));  // original strides kept
  NamedTensors in = load_safetensors((dirs[0] / "inputs.safetensors").string());
  EXPECT_EQ(in[0].second.to_double_vector(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
}

// A dump directory whose name is not UTF-8: the records hold it as upstream's json.dumps would
// (surrogate escapes, pure ASCII), and the dump still replays.
TEST_F(DumpTest, DumpDirectoryThatIsNotUtf8RecordsAndReplays) {
  const fs::path base = dir_;
  dir_ = base /
         "nu\xff"
         "dir";
  start();
  Tensor x = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::kFloat32);
  rmsnorm(x, Tensor::from_vector({1, 0.5, 2}, {3}, DType::kFloat32));
  recorder::stop();
  auto dirs = call_dirs();
  ASSERT_EQ(dirs.size(), 1u);
  for (const std::string& l : raw_lines(dirs[0] / "metadata.jsonl")) {
    for (const char c : l) EXPECT_LT(static_cast<unsigned char>(c), 0x80) << l;
    EXPECT_NE(l.find("nu\\udcffdir"), std::string::npos) << l;
  }
  const std::vector<replay::Result> rs = replay::replay_sequence(dir_.string());
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, replay::Status::kPassed) << rs[0].error;
  dir_ = base;
}

TEST_F(DumpTest, UnwritableDirectoryWarnsOnceAndTheCallGoesOn) {
  recorder::Config c;
  c.dump_dir = "/proc/fi_cannot_write_here";
  recorder::start(c);
  Tensor x = Tensor::from_vector({3, 4}, {1, 2}, DType::kFloat32);
  Tensor w = Tensor::from_vector({1, 1}, {2}, DType::kFloat32);
  ::testing::internal::CaptureStderr();
  Tensor y1 = rmsnorm(x, w, 0.0);
  Tensor y2 = rmsnorm(x, w, 0.0);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NEAR(y1.to_double_vector()[1], 4.0 / std::sqrt(12.5), 1e-6);
  EXPECT_EQ(y1.to_double_vector(), y2.to_double_vector());
  EXPECT_TRUE(recorder::stats().failed);
  size_t n = 0;
  for (size_t p = err.find("flight recorder stopped"); p != std::string::npos;
       p = err.find("flight recorder stopped", p + 1)) {
    ++n;
  }
  EXPECT_EQ(n, 1u) << err;
}

// A full disk while the outputs are written (here a file-size limit that the outputs exceed and
// the inputs do not): the call is recorded as a write failure, which show and replay tell apart
// from a crash, the call itself goes on, and active() says the recording has stopped.
TEST_F(DumpTest, FailedOutputWriteIsRecordedAsSuch) {
  start();
  // One stored element seen 64K times: 4 bytes of inputs, 256 KB of result.
  const Tensor wide = Tensor::from_vector({2}, {1}, DType::kFloat32).as_strided({65536}, {0}, 0);
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit small = old;
  small.rlim_cur = 64 * 1024;
  const auto prev = ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  ::testing::internal::CaptureStderr();
  const Tensor y = probe(wide, 0, std::nullopt);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, prev);
  EXPECT_EQ(y.numel(), 65536);
  EXPECT_NE(err.find("flight recorder stopped"), std::string::npos) << err;
  EXPECT_TRUE(recorder::stats().failed);
  EXPECT_FALSE(recorder::active());
  const auto dirs = call_dirs();
  ASSERT_EQ(dirs.size(), 1u);
  const auto l = lines(dirs[0] / "metadata.jsonl");
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0]["execution_status"], "inputs_saved");
  EXPECT_EQ(l[1]["execution_status"], "outputs_write_failed");
  ASSERT_TRUE(l[1]["write_error"].is_string());
  EXPECT_NE(l[1]["write_error"].get<std::string>().find("outputs"), std::string::npos)
      << l[1]["write_error"];
  const auto meta = replay::read_metadata((dirs[0] / "metadata.jsonl").string());
  EXPECT_FALSE(meta.completed);
  EXPECT_TRUE(meta.write_failed);
  recorder::stop();
  auto shown = testing::run_flashinfer("show --dir " + dir_.string());
  EXPECT_NE(shown.out.find("Found 1 calls whose outputs could not be written"), std::string::npos)
      << shown.out;
  EXPECT_EQ(shown.out.find("potential crashes"), std::string::npos) << shown.out;
  shown = testing::run_flashinfer("show -v --dir " + dir_.string());
  EXPECT_NE(shown.out.find("OUTPUTS NOT WRITTEN (write failed)"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("write error: "), std::string::npos) << shown.out;
}

// Upstream's _warn_dump() block where its words are true here: in record-everything mode its
// fixed lines, the directory, the optional safetensors and filter lines (Python's list repr);
// then one CUDA-graph line saying what this library does (no torch.cuda.CUDAGraph.replay() to
// hook in a C++ process). Ring mode says how many calls are kept and when they are written.
TEST_F(DumpTest, StartupBannerSaysWhatThisModeDoes) {
  const std::string sep(80, '=');
  const std::string warning =
      sep + "\nWARNING: FlashInfer API Logging is set to Level 10 (Tensor Dumping).\n";
  const std::string secure =
      "or that the dump directory is secure. To disable dumping, unset FLASHINFER_LOGLEVEL or\n"
      "set it to below 10. For more information, see https://docs.flashinfer.ai/logging.html\n";
  const std::string head =
      warning +
      "This will dump ALL input and outputs including tensors for FlashInfer APIs to disk in\n"
      "the configured dump directory. Ensure that you are NOT processing sensitive data\n" +
      secure;
  const std::string graph_lines =
      "CUDA graph capture stores tensor references; they are written when the program calls "
      "flashinfer::recorder::flush_graph_dumps() after launching the graph, and at a normal "
      "exit.\n" +
      sep + "\n";
  recorder::Config plain;
  EXPECT_EQ(recorder::startup_banner(plain),
            head + "Current dump directory is: flashinfer_dumps\n" + graph_lines);

  recorder::Config c;
  c.dump_dir = "./my_dumps";
  c.include = {"*decode*", "*prefill*"};
  c.exclude = {"it's"};
  c.safetensors = true;
  EXPECT_EQ(recorder::startup_banner(c),
            head + "Current dump directory is: ./my_dumps\n" +
                "\u26a0\ufe0f  SAFETENSORS mode enabled: tensor stride/non-contiguity will NOT be "
                "preserved.\n"
                "    Tensors will be saved as contiguous. Use torch.save (default) to preserve "
                "strides.\n"
                "Include filter: ['*decode*', '*prefill*']\n"
                "Exclude filter: [\"it's\"]\n" +
                graph_lines);

  // The demo's settings (scripts/demo): FLASHINFER_DUMP_RING=600, triggers crash,nan,error,exit.
  recorder::Config ring;
  ring.ring = 600;
  ring.triggers = {"crash", "nan", "error", "exit"};
  const std::string pid = std::to_string(::getpid());
  EXPECT_EQ(recorder::startup_banner(ring),
            warning +
                "Ring mode (FLASHINFER_DUMP_RING=600): the inputs and outputs, tensors included, "
                "of\nthe last 600 FlashInfer API calls (at most 1024 MB) are kept in memory, and "
                "written to disk in\nthe configured dump directory, as ring_pid" +
                pid +
                "_dump<NNNN>_<trigger>/, only when a trigger fires:\n"
                "crash (a fatal signal), nan (a NaN/Inf output), error (an op's Error), exit (a "
                "normal exit). Ensure that you are NOT processing sensitive data\n" +
                secure + "Current dump directory is: flashinfer_dumps\n" +
                "CUDA graphs: a call made while a graph is being captured is not kept (copying "
                "its tensors would break the capture).\n" +
                sep + "\n");
  for (const recorder::Config& k : {plain, c, ring}) {
    const std::string b = recorder::startup_banner(k);
    EXPECT_EQ(b.find("torch.cuda"), std::string::npos) << b;
    EXPECT_EQ(b.find("dump ALL") == std::string::npos, k.ring > 0) << b;
  }
  ring.triggers = {};
  EXPECT_NE(recorder::startup_banner(ring).find(
                "fires:\nnone (only recorder::dump_ring() writes them). Ensure"),
            std::string::npos)
      << recorder::startup_banner(ring);
}

// A user op taking any value and returning a tuple, to exercise every serialized value form.
const OpDecl& echo_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "echo_op";
    decl.module = "tests.recorder";
    decl.params = {ParamDecl("a", ParamKind::kAny), ParamDecl("b", ParamKind::kAny),
                   ParamDecl("c", ParamKind::kAny).opt().kw()};
    decl.returns = "tuple";
    decl.invoke = [](const CallArgs& a) -> Value { return a[0]; };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

Value echo(const Value& a, const Value& b, const Value& c) {
  return call_api(
      &echo_decl,
      [&] {
        return Value::tuple({a.is_tensor() ? Value(a.as_tensor().clone()) : a, Value(int64_t{7}),
                             Value("done \u00e9"), Value(0.1)});
      },
      a, b, c);
}

TEST_F(DumpTest, RecordsAreExactlyPythonJsonDumpsText) {
  start();
  Tensor x = Tensor::from_vector({1, 2, 3, 4}, {2, 2}, DType::kFloat32);
  const Value nested = Value::list(
      {Value(x), Value::tuple({Value(x.select(0, 1)), Value(1e-06), Value(false)}),
       Value::dict({{Value("k\"ey\\"), Value(DType::kBFloat16)},
                    {Value(int64_t{3}), Value(EnumValue{"PosEncodingMode", "NONE", "0"})}}),
       Value("tab\tnew\nline \u2603 \U0001F600")});
  echo(Value(x), nested, Value(EnumValue{"TensorLayout", "HND", "HND"}));
  // Python's json writes non-finite floats bare (nlohmann cannot parse them; Python can).
  echo(Value(int64_t{-5}), Value(-std::numeric_limits<double>::infinity()), Value());
  recorder::stop();
  // Python re-serializes each line to the very same text: same keys, order, separators,
  // escapes and float spellings as json.dumps.
  const std::string script = R"PY(
import json, sys
n = 0
for line in open(sys.argv[1], encoding="ascii"):
    line = line.rstrip("\n")
    again = json.dumps(json.loads(line))
    if again != line:
        print("DIFFERENT\n" + line + "\n" + again)
        sys.exit(1)
    n += 1
print(f"{n} lines identical")
)PY";
  const fs::path sp = dir_ / "redump.py";
  std::ofstream(sp) << script;
  const auto r = testing::run_command("/usr/bin/python3 " + sp.string() + " " +
                                      (dir_ / "session.jsonl").string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("4 lines identical"), std::string::npos) << r.out;
  EXPECT_NE(raw_lines(call_dirs()[1] / "metadata.jsonl")[0].find("\"arg_1\": -Infinity"),
            std::string::npos);
  // The nested tensors are keyed as upstream keys them, and the tuple output's scalars are
  // recorded under result_<i>.
  const auto l = lines(call_dirs()[0] / "metadata.jsonl");
  EXPECT_EQ(l[0]["tensor_info"]["input_tensor_keys"], json({"arg_0", "arg_1__0", "arg_1__1__0"}));
  EXPECT_EQ(l[0]["input_metadata"]["arg_1"]["items"][2]["items"][1]["value"]["value"], 0);
  EXPECT_EQ(l[0]["input_metadata"]["kwarg_c"]["value"], "HND");
  EXPECT_EQ(l[1]["tensor_info"]["output_tensor_keys"], json({"result_0"}));
  EXPECT_EQ(l[1]["output_metadata"]["result_1"], 7);
  EXPECT_EQ(l[1]["output_metadata"]["result_3"], 0.1);
}

// CUDA-graph capture (reference section 3.8), driven through the capture probe so that it runs
// without a GPU: tensors are held by reference and written by flush_graph_dumps().
TEST_F(DumpTest, CapturedCallsAreWrittenByFlushGraphDumps) {
  start();
  Tensor x = Tensor::from_vector({1, 2, 3}, {3}, DType::kFloat32);
  recorder::set_capture_probe([] { return true; });
  Tensor y = probe(x, 0, std::nullopt);
  recorder::set_capture_probe({});
  auto dirs = call_dirs();
  ASSERT_EQ(dirs.size(), 1u);
  const fs::path base = dirs[0];
  // Nothing copied during the capture: records only, both marked pending.
  EXPECT_FALSE(fs::exists(base / "inputs.pt"));
  EXPECT_FALSE(fs::exists(base / "outputs.pt"));
  auto l = lines(base / "metadata.jsonl");
  ASSERT_EQ(l.size(), 2u);
  for (const json& r : l) {
    EXPECT_EQ(r["execution_status"], "graph_capture_pending_flush");
    EXPECT_EQ(r["graph_capture"], true);
  }
  ASSERT_GE(log_.size(), 1u);
  EXPECT_TRUE(log_[0].ends_with(" dumps, graph-deferred)")) << log_[0];
  // Not a crash: replay and show say the values were never written.
  EXPECT_TRUE(replay::read_metadata((base / "metadata.jsonl").string()).graph_pending);
  const replay::Result pending = replay::replay_from_dump(base.string());
  EXPECT_EQ(pending.status, replay::Status::kError);
  EXPECT_NE(pending.error.find("flush_graph_dumps()"), std::string::npos) << pending.error;
  const auto shown = testing::run_flashinfer("show --dir " + dir_.string());
  EXPECT_NE(shown.out.find("Found 1 calls captured into a CUDA graph"), std::string::npos)
      << shown.out;
  EXPECT_EQ(shown.out.find("incomplete calls"), std::string::npos) << shown.out;
  // The graph "runs": the captured buffers now hold new values.
  x.copy_(Tensor::from_vector({10, 20, 30}, {3}, DType::kFloat32));
  y.copy_(Tensor::from_vector({20, 40, 60}, {3}, DType::kFloat32));
  EXPECT_EQ(recorder::flush_graph_dumps(), 2);
  EXPECT_EQ(log_.back(), "flush_graph_dumps (explicit): wrote 2 pending entries");
  const fs::path snap1 = base / "graph_flushes" / "flush_0001";
  EXPECT_EQ(load_torch((base / "inputs.pt").string())[0].second.to_double_vector(),
            (std::vector<double>{10, 20, 30}));
  EXPECT_EQ(load_torch((snap1 / "outputs.pt").string())[0].second.to_double_vector(),
            (std::vector<double>{20, 40, 60}));
  l = lines(base / "metadata.jsonl");
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[2]["execution_status"], "inputs_saved");
  EXPECT_EQ(l[3]["execution_status"], "completed");
  EXPECT_EQ(l[3]["graph_capture_flushed"], true);
  EXPECT_EQ(l[3]["graph_capture_flush_index"], 1);
  EXPECT_EQ(l[3]["graph_capture_snapshot_dir"], snap1.string());
  EXPECT_EQ(l[3]["dump_dir"], base.string());
  EXPECT_FALSE(replay::read_metadata((base / "metadata.jsonl").string()).graph_pending);
  const auto s1 = lines(snap1 / "metadata.jsonl");
  ASSERT_EQ(s1.size(), 2u);
  EXPECT_EQ(s1[1]["dump_dir"], snap1.string());
  EXPECT_EQ(s1[1]["graph_capture_base_dump_dir"], base.string());
  // A second run and flush: the directory's files follow, the first snapshot stays.
  x.copy_(Tensor::from_vector({5, 5, 5}, {3}, DType::kFloat32));
  y.copy_(Tensor::from_vector({10, 10, 10}, {3}, DType::kFloat32));
  EXPECT_EQ(recorder::flush_graph_dumps(false), 2);
  EXPECT_EQ(load_torch((base / "inputs.pt").string())[0].second.to_double_vector(),
            (std::vector<double>{5, 5, 5}));
  EXPECT_EQ(load_torch((snap1 / "inputs.pt").string())[0].second.to_double_vector(),
            (std::vector<double>{10, 20, 30}));
  EXPECT_TRUE(fs::exists(base / "graph_flushes" / "flush_0002" / "outputs.pt"));
  EXPECT_EQ(raw_lines(dir_ / "session.jsonl").size(), 2u + 4u + 4u);
  // Replay takes the directory's last record and its latest files.
  const replay::Result r = replay::replay_from_dump(base.string());
  EXPECT_EQ(r.status, replay::Status::kPassed) << r.error;
  EXPECT_EQ(recorder::clear_graph_dumps(), 2);
  EXPECT_EQ(recorder::flush_graph_dumps(), 0);
}

// A call asked about no capture at its begin (no CUDA argument: its inputs are copied then) whose
// result is device memory written under a capture (MoeAlltoAll's workspace views): its outputs
// are held by reference like a captured call's and written by flush_graph_dumps(). Driven
// through the capture probe: no capture at the begin, one at the end.
TEST_F(DumpTest, ACallWhoseResultIsWrittenUnderACaptureWaitsForTheFlush) {
  start();
  Tensor x = Tensor::from_vector({1, 2, 3}, {3}, DType::kFloat32);
  int asked = 0;
  recorder::set_capture_probe([&asked] { return asked++ > 0; });
  Tensor y = probe(x, 0, std::nullopt);
  recorder::set_capture_probe({});
  EXPECT_EQ(asked, 2);  // begin and end
  const auto dirs = call_dirs();
  ASSERT_EQ(dirs.size(), 1u);
  const fs::path base = dirs[0];
  EXPECT_EQ(load_torch((base / "inputs.pt").string())[0].second.to_double_vector(),
            (std::vector<double>{1, 2, 3}));
  EXPECT_FALSE(fs::exists(base / "outputs.pt"));
  std::set<std::string> names;
  for (const auto& f : fs::directory_iterator(base)) names.insert(f.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"inputs.pt", "metadata.jsonl"}));  // no pending file
  auto l = lines(base / "metadata.jsonl");
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0]["execution_status"], "inputs_saved");
  EXPECT_EQ(l[0]["graph_capture"], false);
  EXPECT_EQ(l[1]["execution_status"], "graph_capture_pending_flush");
  EXPECT_EQ(l[1]["graph_capture"], true);
  EXPECT_TRUE(replay::read_metadata((base / "metadata.jsonl").string()).graph_pending);
  // The graph "runs": the result's buffer holds what it wrote.
  y.copy_(Tensor::from_vector({7, 8, 9}, {3}, DType::kFloat32));
  EXPECT_EQ(recorder::flush_graph_dumps(), 1);
  EXPECT_EQ(load_torch((base / "outputs.pt").string())[0].second.to_double_vector(),
            (std::vector<double>{7, 8, 9}));
  l = lines(base / "metadata.jsonl");
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[2]["execution_status"], "completed");
  EXPECT_EQ(l[2]["graph_capture_flushed"], true);
  EXPECT_FALSE(replay::read_metadata((base / "metadata.jsonl").string()).graph_pending);
  EXPECT_EQ(recorder::flush_graph_dumps(), 1);  // later flushes follow the buffer
  EXPECT_TRUE(fs::exists(base / "graph_flushes" / "flush_0002" / "outputs.pt"));
  EXPECT_EQ(recorder::clear_graph_dumps(), 1);
}

#if FLASHINFER_TEST_HAVE_CUDART
// The same through a real capture on a GPU (the recorder asks cudaStreamIsCapturing): rmsnorm on
// CUDA tensors captured into a graph writes only its two records, pending; after the graph runs
// on new inputs, flush_graph_dumps() writes those inputs and the output the graph computed (the
// eager kernel's bits on the same inputs), and the call replays.
TEST_F(DumpTest, CudaCapturedCallsAreWrittenByFlushGraphDumps) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const Tensor x1 = Tensor::empty({4, 256}, DType::kBFloat16).uniform_(4);
  const Tensor w = Tensor::empty({256}, DType::kBFloat16).uniform_(5).to(gpu);
  Tensor x = Tensor::empty({4, 256}, DType::kBFloat16).uniform_(3).to(gpu);
  Tensor out = Tensor::zeros({4, 256}, DType::kBFloat16, gpu);
  const std::vector<double> want = rmsnorm(x1.to(gpu), w).to_double_vector();
  rmsnorm(x, w, 1e-6, out);  // the engine's warm-up, before the recorder starts
  start();
  testing::ReplayableGraph g;
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(g, [&] { rmsnorm(x, w, 1e-6, out); }));
  const auto dirs = call_dirs();
  ASSERT_EQ(dirs.size(), 1u);
  const fs::path base = dirs[0];
  EXPECT_FALSE(fs::exists(base / "inputs.pt"));
  auto l = lines(base / "metadata.jsonl");
  ASSERT_EQ(l.size(), 2u);
  for (const json& r : l) EXPECT_EQ(r["execution_status"], "graph_capture_pending_flush");
  x.copy_(x1);
  ASSERT_EQ(cudaGraphLaunch(g.exec, g.stream), cudaSuccess);
  EXPECT_EQ(recorder::flush_graph_dumps(), 2);  // synchronizes first
  EXPECT_EQ(out.to_double_vector(), want);
  const auto holds = [](const NamedTensors& file, const std::vector<double>& v) {
    return std::any_of(file.begin(), file.end(),
                       [&](const auto& e) { return e.second.to_double_vector() == v; });
  };
  const auto inputs = load_torch((base / "inputs.pt").string());
  EXPECT_TRUE(holds(inputs, x1.to_double_vector()));
  EXPECT_TRUE(holds(inputs, w.to_double_vector()));
  const auto outputs = load_torch((base / "outputs.pt").string());
  ASSERT_FALSE(outputs.empty());
  for (const auto& e : outputs) EXPECT_EQ(e.second.to_double_vector(), want) << e.first;
  l = lines(base / "metadata.jsonl");
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[3]["execution_status"], "completed");
  EXPECT_EQ(l[3]["graph_capture_flushed"], true);
  const replay::Result r = replay::replay_from_dump(base.string());
  EXPECT_EQ(r.status, replay::Status::kPassed) << r.error;
  recorder::stop();
  EXPECT_EQ(cudaGraphExecDestroy(g.exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(g.graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(g.stream), cudaSuccess);
}
#endif

TEST_F(DumpTest, CapturedCallsPendingAtExitAreFlushed) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    test::skip_leak_check_at_exit();  // the parent's threads are not the child's leaks
    start();
    recorder::set_capture_probe([] { return true; });
    Tensor x = Tensor::from_vector({5, 6, 7}, {3}, DType::kFloat32);
    probe(x, 0, std::nullopt);
    std::exit(0);  // a normal exit runs the flush
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  auto dirs = call_dirs();
  ASSERT_EQ(dirs.size(), 1u);
  EXPECT_EQ(load_torch((dirs[0] / "outputs.pt").string())[0].second.to_double_vector(),
            (std::vector<double>{10, 12, 14}));
  EXPECT_TRUE(fs::exists(dirs[0] / "graph_flushes" / "flush_0001" / "inputs.pt"));
  EXPECT_EQ(lines(dirs[0] / "metadata.jsonl").back()["execution_status"], "completed");
}

// The seed page's "Scanning Session History" script, run by Python on our session.jsonl.
TEST_F(DumpTest, UpstreamSessionScannerReadsOurSession) {
  start();
  Tensor x = Tensor::from_vector({1}, {1}, DType::kFloat32);
  probe(x, 0, std::nullopt);
  probe(x, 0, std::nullopt);
  rmsnorm(Tensor::from_vector({1, 1}, {1, 2}, DType::kFloat32),
          Tensor::from_vector({1, 1}, {2}, DType::kFloat32));
  EXPECT_THROW(probe(x, 1, std::nullopt), Error);
  recorder::stop();
  const std::string script = R"PY(
import json
from pathlib import Path
from collections import Counter
import sys
dump_root = Path(sys.argv[1])
session_file = dump_root / "session.jsonl"
records = []
with open(session_file) as f:
    for line in f:
        if line.strip():
            records.append(json.loads(line))
completed = [r for r in records if r["execution_status"] == "completed"]
print(f"Total completed calls: {len(completed)}")
func_counts = Counter(r["function_name"] for r in completed)
print("\nCalls by function:")
for func, count in func_counts.most_common():
    print(f"  {func}: {count}")
inputs_only = [r for r in records if r["execution_status"] == "inputs_saved"]
completed_dirs = {r["dump_dir"] for r in completed}
incomplete = [r for r in inputs_only if r["dump_dir"] not in completed_dirs]
if incomplete:
    print(f"\nFound {len(incomplete)} incomplete calls (potential crashes):")
    for r in incomplete:
        print(f"  - {r['function_name']} at {r['dump_dir']}")
)PY";
  const fs::path sp = dir_ / "scan.py";
  std::ofstream(sp) << script;
  const auto [status, out] =
      testing::run_command("/usr/bin/python3 " + sp.string() + " " + dir_.string());
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("Total completed calls: 3"), std::string::npos) << out;
  EXPECT_NE(out.find("  probe_op: 2"), std::string::npos) << out;
  EXPECT_NE(out.find("  rmsnorm: 1"), std::string::npos) << out;
  EXPECT_NE(out.find("Found 1 incomplete calls"), std::string::npos) << out;
  EXPECT_NE(out.find("_probe_op_call0003"), std::string::npos) << out;
}

}  // namespace
}  // namespace flashinfer
