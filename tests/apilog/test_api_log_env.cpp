// The environment path: FLASHINFER_LOGLEVEL, FLASHINFER_LOGDEST and FLASHINFER_DUMP_INCLUDE /
// EXCLUDE are read once, when the library loads. Each case re-executes this test binary with the
// variables set; in the child a static initializer (which runs after the library's own, since
// the library is a dependency of the executable) performs a few calls and exits before gtest
// starts, and the parent checks the child's log, stdout and stderr against exact text.
#include <gtest/gtest.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "apilog_test_ops.h"
#include "apilog_test_util.h"
#include "core/cuda_runtime.h"
#include "core/settings.h"
#include "flashinfer/api_log.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "recorder/recorder_internal.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace apilog_test;
using namespace flashinfer;

constexpr const char* kChildVar = "FI_APILOG_TEST_CHILD";

Tensor vec3() { return Tensor::from_vector({1.0, 2.0, 3.0}, {3}, DType::kFloat32); }

// ---- the child side ----

int child_main(const std::string& mode) {
  if (mode == "calls") {
    Tensor x = Tensor::from_vector({1, 2, 3, 4}, {1, 4}, DType::kFloat32);
    Tensor w = Tensor::from_vector({1, 1, 1, 1}, {4}, DType::kFloat32);
    rmsnorm(x, w);
    rmsnorm(x, w);
    test_function(vec3());
    return 0;
  }
  if (mode == "one_call") {
    test_function(vec3());
    return 0;
  }
  if (mode == "report_level") {
    std::printf("level=%d\n", api_log::level());
    std::fflush(stdout);
    test_function(vec3());
    return 0;
  }
  if (mode == "report_recorder") {
    // Both halves of the level: what the logger runs at and whether the recorder is on.
    std::fprintf(stderr, "level=%d recorder=%d\n", api_log::level(), recorder::active() ? 1 : 0);
    return 0;
  }
  if (mode == "filters") {
    test_function(vec3());
    kwargs_fn(1);
    explicit_fn(1);
    return 0;
  }
  if (mode == "unwritable") {
    // The op must still compute: rmsnorm of [3, 4] with unit weight is [3, 4] / sqrt(12.5).
    Tensor x = Tensor::from_vector({3, 4}, {1, 2}, DType::kFloat32);
    Tensor w = Tensor::from_vector({1, 1}, {2}, DType::kFloat32);
    const auto y = rmsnorm(x, w, 0.0).to_double_vector();
    const double r = 1.0 / std::sqrt(12.5);
    const bool ok = std::fabs(y[0] - 3 * r) < 1e-6 && std::fabs(y[1] - 4 * r) < 1e-6;
    test_function(vec3());
    return ok ? 0 : 3;
  }
  if (mode == "nothing") return 0;
  std::fprintf(stderr, "unknown child mode %s\n", mode.c_str());
  return 2;
}

struct ChildHook {
  ChildHook() {
    if (const char* mode = std::getenv(kChildVar)) {
      int rc = 1;
      try {
        rc = child_main(mode);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child failed: %s\n", e.what());
      }
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(rc);
    }
  }
} const g_child_hook;

// ---- the parent side ----

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Child {
  int exit_code = -1;
  pid_t pid = 0;
  std::string out, err;
};

class ApiLogEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fi_apilog_env_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs this binary in `mode` with the given FLASHINFER_* variables (all others removed).
  Child run(const std::string& mode, const std::vector<std::pair<std::string, std::string>>& vars) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      if (std::strncmp(*e, "FLASHINFER_", 11) == 0 || std::strncmp(*e, kChildVar, 20) == 0) {
        continue;
      }
      env.emplace_back(*e);
    }
    env.push_back(std::string(kChildVar) + "=" + mode);
    for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);

    const std::string out_path = (dir_ / "child.out").string();
    const std::string err_path = (dir_ / "child.err").string();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::string exe = fs::read_symlink("/proc/self/exe").string();
    char* argv[] = {exe.data(), nullptr};
    Child c;
    const int rc = posix_spawn(&c.pid, exe.c_str(), &fa, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&fa);
    EXPECT_EQ(rc, 0) << std::strerror(rc);
    if (rc != 0) return c;
    int status = 0;
    EXPECT_EQ(waitpid(c.pid, &status, 0), c.pid);
    c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    c.out = read_file(out_path);
    c.err = read_file(err_path);
    return c;
  }

  // The banner this machine produces (GPU lines from the same runtime queries).
  static std::string banner() {
    const std::string cuda(build_info().cuda_version);
    const int n = cuda_device_count();
    if (n == 0) return expected_banner_no_gpu(std::string(version()), cuda);
    std::string s = kEq + "\n[TS] FlashInfer API Logging - System Information\n" + kEq +
                    "\nFlashInfer version: " + std::string(version()) +
                    "\nCUDA toolkit version: " + cuda + "\ncuDNN version: <not available>\n" +
                    "Number of GPUs: " + std::to_string(n) + "\n";
    for (int i = 0; i < n; ++i) {
      const int cc = detail::cuda_compute_capability(i);
      s += "  GPU " + std::to_string(i) + ": " + detail::cuda_device_name(i) + "\n";
      s += "    Compute capability: " + std::to_string(cc / 10) + "." + std::to_string(cc % 10) +
           " (SM" + std::to_string(cc) + ")\n";
    }
    return s + kEq + "\n\n";
  }

  static std::string test_function_l3() {
    auto t = [](int indent) {
      const std::string p(static_cast<std::size_t>(2 * indent), ' ');
      return p + "Tensor(\n" + p + "  shape=(3,)\n" + p + "  stride=(1,)\n" + p +
             "  dtype=torch.float32\n" + p + "  device=cpu\n" + p + "  requires_grad=False\n" + p +
             "  is_contiguous=True\n" + p + ")";
    };
    return header("test_function") + "Positional input arguments:\n  arg[0]:\n" + t(2) + "\n" +
           output(t(1));
  }

  fs::path dir_;
};

// Level 1 to a file: the banner once, then one line per call, in the file named with the pid.
TEST_F(ApiLogEnv, Level1ToFileWithPidAndBanner) {
  Child c = run("calls", {{"FLASHINFER_LOGLEVEL", "1"},
                          {"FLASHINFER_LOGDEST", (dir_ / "env_%i.log").string()}});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(c.out, "");
  EXPECT_EQ(c.err, "");
  const fs::path log = dir_ / ("env_" + std::to_string(c.pid) + ".log");
  ASSERT_TRUE(fs::exists(log));
  EXPECT_EQ(normalize(read_file(log)), banner() +
                                           "[TS] FlashInfer API Call: rmsnorm\n"
                                           "[TS] FlashInfer API Call: rmsnorm\n"
                                           "[TS] FlashInfer API Call: test_function\n");
}

// The default destination is stdout.
TEST_F(ApiLogEnv, Level3DefaultsToStdout) {
  Child c = run("one_call", {{"FLASHINFER_LOGLEVEL", "3"}});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(normalize(c.out), banner() + test_function_l3());
  EXPECT_EQ(c.err, "");
}

TEST_F(ApiLogEnv, StderrDestination) {
  Child c = run("one_call", {{"FLASHINFER_LOGLEVEL", "1"}, {"FLASHINFER_LOGDEST", "stderr"}});
  ASSERT_EQ(c.exit_code, 0);
  EXPECT_EQ(c.out, "");
  EXPECT_EQ(normalize(c.err), banner() + "[TS] FlashInfer API Call: test_function\n");
}

// Levels parse like Python's int(); anything else is one warning and level 0.
TEST_F(ApiLogEnv, LevelParsing) {
  const std::vector<std::pair<std::string, int>> cases = {
      {"0", 0},   {"1", 1},   {" 3 ", 3},  {"+5", 5},      {"1_0", 10},
      {"-1", -1}, {"007", 7}, {"10 ", 10}, {"\t12\n", 12}, {"99999999999999999999", INT32_MAX}};
  const std::string dumps = (dir_ / "dumps").string();
  recorder::Config cfg;
  cfg.dump_dir = dumps;
  for (const auto& [text, want] : cases) {
    Child c = run("report_level", {{"FLASHINFER_LOGLEVEL", text},
                                   {"FLASHINFER_LOGDEST", "stderr"},
                                   {"FLASHINFER_DUMP_DIR", dumps}});
    ASSERT_EQ(c.exit_code, 0) << text;
    // From 10 up the recorder's warning block comes first, on stdout, at load.
    const std::string block = want >= 10 ? recorder::startup_banner(cfg) : "";
    EXPECT_EQ(c.out, block + "level=" + std::to_string(want) + "\n") << text;
  }
  for (const std::string bad : {"abc", "3.0", "", "1__0", "_1", "five", "1_", "+", "- 1"}) {
    Child c = run("report_level", {{"FLASHINFER_LOGLEVEL", bad}});
    ASSERT_EQ(c.exit_code, 0) << bad;
    EXPECT_EQ(c.out, "level=0\n") << bad;  // nothing logged at level 0
    EXPECT_EQ(c.err, "[flashinfer] warning: FLASHINFER_LOGLEVEL='" + bad +
                         "' is not an integer; API logging is off (level 0)\n")
        << bad;
  }
}

// FLASHINFER_LOGLEVEL is parsed once, by one parser, for the logger and the recorder alike:
// "10 " (Python's int() strips whitespace) is level 10 for both. It used to turn on level-10
// logging but not the recorder, whose own parser rejected the trailing space.
TEST_F(ApiLogEnv, OneLevelForLoggerAndRecorder) {
  const std::string dumps = (dir_ / "dumps").string();
  const std::vector<std::tuple<std::string, int, int>> cases = {
      {"10 ", 10, 1}, {" 10", 10, 1}, {"1_0", 10, 1}, {"+11\t", 11, 1},
      {"9 ", 9, 0},   {"5", 5, 0},    {"x10", 0, 0}};
  for (const auto& [text, level, rec] : cases) {
    Child c = run("report_recorder", {{"FLASHINFER_LOGLEVEL", text},
                                      {"FLASHINFER_LOGDEST", (dir_ / "log.txt").string()},
                                      {"FLASHINFER_DUMP_DIR", dumps}});
    ASSERT_EQ(c.exit_code, 0) << text;
    EXPECT_NE(
        c.err.find("level=" + std::to_string(level) + " recorder=" + std::to_string(rec) + "\n"),
        std::string::npos)
        << "'" << text << "': " << c.err;
    // The level-10 warning block goes with the recorder, never without it.
    EXPECT_EQ(c.out.find("Level 10 (Tensor Dumping)") != std::string::npos, rec == 1)
        << "'" << text << "': " << c.out;
  }
}

// The parser itself, on upstream's rules: LOGLEVEL and DUMP_MAX_COUNT are Python int(),
// DUMP_MAX_SIZE_GB Python float(), the pattern lists split on ',' and stripped, SAFETENSORS
// exactly "1", LOGDEST and DUMP_DIR raw. A bad number keeps its default with one message.
TEST(Settings, ParsesEveryVariableWithUpstreamsRules) {
  const std::map<std::string, std::string> env = {
      {"FLASHINFER_LOGLEVEL", " 10 "},
      {"FLASHINFER_LOGDEST", "log_%i.txt"},
      {"FLASHINFER_DUMP_DIR", "./d_%i"},
      {"FLASHINFER_DUMP_MAX_SIZE_GB", " 1_0.5e-1 "},
      {"FLASHINFER_DUMP_MAX_COUNT", "\t2_000\n"},
      {"FLASHINFER_DUMP_INCLUDE", " *decode*, ,*prefill* ,"},
      {"FLASHINFER_DUMP_EXCLUDE", "x"},
      {"FLASHINFER_DUMP_SAFETENSORS", "1"}};
  auto lookup = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  const flashinfer::detail::Settings s = flashinfer::detail::parse_settings(lookup);
  EXPECT_EQ(s.log_level, 10);
  EXPECT_EQ(s.log_dest, "log_%i.txt");
  EXPECT_EQ(s.dump_dir, "./d_%i");
  EXPECT_DOUBLE_EQ(s.dump_max_size_gb, 1.05);
  EXPECT_EQ(s.dump_max_count, 2000);
  EXPECT_EQ(s.dump_include, (std::vector<std::string>{"*decode*", "*prefill*"}));
  EXPECT_EQ(s.dump_exclude, (std::vector<std::string>{"x"}));
  EXPECT_TRUE(s.dump_safetensors);
  EXPECT_TRUE(s.problems.empty());

  // Unset: upstream's defaults.
  const flashinfer::detail::Settings d =
      flashinfer::detail::parse_settings([](const char*) -> const char* { return nullptr; });
  EXPECT_EQ(d.log_level, 0);
  EXPECT_EQ(d.log_dest, "stdout");
  EXPECT_EQ(d.dump_dir, "flashinfer_dumps");
  EXPECT_EQ(d.dump_max_size_gb, 20.0);
  EXPECT_EQ(d.dump_max_count, 1000);
  EXPECT_FALSE(d.dump_safetensors);

  const std::map<std::string, std::string> bad = {{"FLASHINFER_LOGLEVEL", "3.0"},
                                                  {"FLASHINFER_DUMP_MAX_SIZE_GB", "0x10"},
                                                  {"FLASHINFER_DUMP_MAX_COUNT", "1e3"},
                                                  {"FLASHINFER_DUMP_SAFETENSORS", " 1"}};
  const flashinfer::detail::Settings b =
      flashinfer::detail::parse_settings([&](const char* name) -> const char* {
        auto it = bad.find(name);
        return it == bad.end() ? nullptr : it->second.c_str();
      });
  EXPECT_EQ(b.log_level, 0);
  EXPECT_EQ(b.dump_max_size_gb, 20.0);
  EXPECT_EQ(b.dump_max_count, 1000);
  EXPECT_FALSE(b.dump_safetensors);
  ASSERT_EQ(b.problems.size(), 3u);
  EXPECT_EQ(b.problem("FLASHINFER_LOGLEVEL")->message,
            "FLASHINFER_LOGLEVEL='3.0' is not an integer; API logging is off (level 0)");
  EXPECT_EQ(b.problem("FLASHINFER_DUMP_MAX_SIZE_GB")->message,
            "FLASHINFER_DUMP_MAX_SIZE_GB='0x10' is not a number; using 20");
  EXPECT_EQ(b.problem("FLASHINFER_DUMP_MAX_COUNT")->message,
            "FLASHINFER_DUMP_MAX_COUNT='1e3' is not an integer; using 1000");
}

TEST(Settings, PythonIntAndFloat) {
  using flashinfer::detail::parse_python_float;
  using flashinfer::detail::parse_python_int;
  EXPECT_EQ(parse_python_int(" -0_7 "), -7);
  EXPECT_EQ(parse_python_int("\x1c"
                             "5"
                             "\x1f"),
            5);  // Python's str.isspace() separators
  for (const char* bad : {"", " ", "1 2", "0x10", "1.0", "__1", "1__2", "٣"}) {
    EXPECT_FALSE(parse_python_int(bad).has_value()) << bad;
  }
  EXPECT_EQ(parse_python_float("20"), 20.0);
  EXPECT_EQ(parse_python_float(" .5 "), 0.5);
  EXPECT_EQ(parse_python_float("5."), 5.0);
  EXPECT_EQ(parse_python_float("+1E3"), 1000.0);
  EXPECT_EQ(parse_python_float("1_0.2_5"), 10.25);
  EXPECT_TRUE(std::isinf(*parse_python_float("-Infinity")));
  EXPECT_TRUE(std::isnan(*parse_python_float("nan")));
  for (const char* bad : {"", ".", "e3", "1e", "1_.5", "1._5", "0x1p3", "inf1", "1.5 GB"}) {
    EXPECT_FALSE(parse_python_float(bad).has_value()) << bad;
  }
}

// As upstream at import, the system banner (with its "FlashInfer version:" line) is written
// when the library loads with any level but 0, even when no call follows; level 0 writes
// nothing.
TEST_F(ApiLogEnv, BannerAtLoadForEveryLevelButZero) {
  for (const char* level : {"1", "2", "3", "-1"}) {
    Child c = run("nothing", {{"FLASHINFER_LOGLEVEL", level}});
    ASSERT_EQ(c.exit_code, 0) << level;
    EXPECT_EQ(normalize(c.out), banner()) << level;
    EXPECT_NE(c.out.find("\nFlashInfer version: " + std::string(version()) + "\n"),
              std::string::npos);
  }
  Child c0 = run("nothing", {{"FLASHINFER_LOGLEVEL", "0"}});
  EXPECT_EQ(c0.out, "");
}

// Level 10 logs as level 5, plus the recorder: at load the banner then upstream's warning
// block (in upstream's import order: _log_system_info(), then _warn_dump()), and its dump lines
// around each call's records. Level 0 with a file creates nothing.
TEST_F(ApiLogEnv, Level10LogsLikeLevel5PlusDumpsAndLevel0WritesNothing) {
  const std::string dumps = (dir_ / "dumps").string();
  Child c10 = run("one_call", {{"FLASHINFER_LOGLEVEL", "10"}, {"FLASHINFER_DUMP_DIR", dumps}});
  Child c5 = run("one_call", {{"FLASHINFER_LOGLEVEL", "5"}});
  ASSERT_EQ(c10.exit_code, 0);
  recorder::Config cfg;
  cfg.dump_dir = dumps;
  const std::string block = recorder::startup_banner(cfg);
  const std::string out10 = normalize(c10.out);
  ASSERT_TRUE(out10.starts_with(banner() + normalize(block))) << c10.out;
  EXPECT_NE(block.find("Current dump directory is: " + dumps + "\n"), std::string::npos);
  // Without the warning block and the four dump lines, the text is level 5's.
  std::istringstream rest(out10.substr(banner().size() + normalize(block).size()));
  std::string line, kept;
  std::vector<std::string> dump_lines;
  while (std::getline(rest, line)) {
    if (line.starts_with("Dumped inputs to: ") || line.starts_with("Inputs dumped to: ") ||
        line.starts_with("Dumped outputs to: ") || line.starts_with("Outputs dumped to: ")) {
      dump_lines.push_back(line);
    } else {
      kept += line + "\n";
    }
  }
  ASSERT_EQ(dump_lines.size(), 4u) << c10.out;
  EXPECT_TRUE(dump_lines[0].starts_with("Dumped inputs to: " + dumps + "/"));
  EXPECT_EQ(banner() + kept, normalize(c5.out));
  // The inputs lines precede the input record and the outputs lines follow the output record.
  EXPECT_LT(c10.out.find("Inputs dumped to: "), c10.out.find("Positional input arguments:"));
  EXPECT_GT(c10.out.find("Dumped outputs to: "), c10.out.find("Output value:"));
  std::size_t n_dirs = 0;
  for (const auto& e : fs::directory_iterator(dumps)) n_dirs += e.is_directory();
  EXPECT_EQ(n_dirs, 1u);
  EXPECT_NE(c5.out.find("      min=1.000000\n"), std::string::npos) << c5.out;

  Child c0 = run("calls", {{"FLASHINFER_LOGDEST", (dir_ / "never.log").string()}});
  ASSERT_EQ(c0.exit_code, 0);
  EXPECT_FALSE(fs::exists(dir_ / "never.log"));
  EXPECT_EQ(c0.out, "");
}

// As upstream, a file destination is created when the library loads with logging on, and the
// banner written to it then.
TEST_F(ApiLogEnv, FileCreatedAtLoad) {
  Child c = run("nothing", {{"FLASHINFER_LOGLEVEL", "3"},
                            {"FLASHINFER_LOGDEST", (dir_ / "created.log").string()}});
  ASSERT_EQ(c.exit_code, 0);
  ASSERT_TRUE(fs::exists(dir_ / "created.log"));
  EXPECT_EQ(normalize(read_file(dir_ / "created.log")), banner());
  EXPECT_EQ(c.out, "");
}

TEST_F(ApiLogEnv, IncludeExcludeFromEnvironment) {
  Child c = run("filters", {{"FLASHINFER_LOGLEVEL", "3"},
                            {"FLASHINFER_DUMP_INCLUDE", "*_fn, test_*"},
                            {"FLASHINFER_DUMP_EXCLUDE", " kwargs_*"}});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const std::string out = normalize(c.out);
  EXPECT_EQ(count_of(out, "FlashInfer API Call: "), 2u) << out;
  EXPECT_NE(out.find("FlashInfer API Call: test_function"), std::string::npos);
  EXPECT_NE(out.find("FlashInfer API Call: explicit_fn"), std::string::npos);
  // Level 1 ignores the filters.
  Child c1 = run("filters", {{"FLASHINFER_LOGLEVEL", "1"}, {"FLASHINFER_DUMP_INCLUDE", "nomatch"}});
  EXPECT_EQ(count_of(normalize(c1.out), "FlashInfer API Call: "), 3u);
}

// An unwritable destination: exactly one warning, the calls still compute.
TEST_F(ApiLogEnv, UnwritableDestination) {
  const std::string bad = (dir_ / "missing" / "log.txt").string();
  Child c = run("unwritable", {{"FLASHINFER_LOGLEVEL", "5"}, {"FLASHINFER_LOGDEST", bad}});
  EXPECT_EQ(c.exit_code, 0);
  EXPECT_EQ(c.out, "");
  EXPECT_EQ(c.err, "[flashinfer] warning: cannot open the API log destination '" + bad +
                       "' (FLASHINFER_LOGDEST): No such file or directory; API log records are "
                       "dropped, API calls are unaffected\n");
}

}  // namespace
