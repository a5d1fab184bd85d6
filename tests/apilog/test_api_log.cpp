// API logging levels 1/3/5 in process, through the public runtime API (the environment is read
// once at load; test_api_log_env.cpp covers that path in child processes). Ports the behaviours
// of upstream's tests/utils/test_logging.py (reference §5, items 1-15) against exact text.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "apilog_test_ops.h"
#include "apilog_test_util.h"
#include "calls/name_filter.h"
#include "flashinfer/api_log.h"
#include "flashinfer/recorder.h"
#include "util/test_util.h"

namespace {

namespace fs = std::filesystem;
using namespace apilog_test;
using namespace flashinfer;

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

fs::path temp_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("fi_apilog_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

class ApiLog : public ::testing::Test {
 protected:
  void SetUp() override {
    api_log::set_level(0);
    api_log::set_filters({}, {});
    capture_ = std::make_unique<RecordCapture>();
  }
  void TearDown() override {
    api_log::set_level(0);
    capture_.reset();
    api_log::set_filters({}, {});
    api_log::set_destination("stdout");
  }
  std::string text() { return capture_->text(); }
  std::unique_ptr<RecordCapture> capture_;
};

// The Tensor( block of a contiguous 1-D fp32 tensor of 3 elements at `indent`.
std::string tensor3(int indent, const std::string& stats = "") {
  const std::string p(static_cast<std::size_t>(2 * indent), ' ');
  return p + "Tensor(\n" + p + "  shape=(3,)\n" + p + "  stride=(1,)\n" + p +
         "  dtype=torch.float32\n" + p + "  device=cpu\n" + p + "  requires_grad=False\n" + p +
         "  is_contiguous=True\n" + stats + p + ")";
}

std::string stat_lines(int indent, const std::vector<std::string>& lines) {
  const std::string p(static_cast<std::size_t>(2 * indent + 2), ' ');
  std::string s;
  for (const auto& l : lines) s += p + l + "\n";
  return s;
}

Tensor vec3() { return Tensor::from_vector({1.0, 2.0, 3.0}, {3}, DType::kFloat32); }

// 1. Level 0: no observer is installed, so calls take the gate's fast path; nothing is logged.
TEST_F(ApiLog, Level0ZeroOverhead) {
  api_log::set_level(3);
  EXPECT_TRUE(detail::g_call_hooks_active.load());
  api_log::set_level(0);
  EXPECT_FALSE(detail::g_call_hooks_active.load());
  EXPECT_EQ(api_log::level(), 0);
  Tensor y = test_function(vec3());
  EXPECT_EQ(y.to_double_vector(), (std::vector<double>{2.0, 4.0, 6.0}));
  EXPECT_TRUE(capture_->records().empty());
}

// 2. Level 1: one line with the name, before the call; no argument or output blocks.
TEST_F(ApiLog, Level1FunctionName) {
  api_log::set_level(1);
  test_function(vec3());
  EXPECT_EQ(text(), "[TS] FlashInfer API Call: test_function\n");
  EXPECT_EQ(text().find("Positional input arguments"), std::string::npos);
  EXPECT_EQ(text().find("Output value"), std::string::npos);
}

// 3. Level 3: the input block before the call and the output block after it.
TEST_F(ApiLog, Level3InputsOutputs) {
  api_log::set_level(3);
  test_function(vec3());
  const auto recs = capture_->records();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(normalize(recs[0]), header("test_function") + "Positional input arguments:\n" +
                                    "  arg[0]:\n" + tensor3(2) + "\n");
  EXPECT_EQ(normalize(recs[1]), output(tensor3(1)));
  EXPECT_EQ(text().find("min="), std::string::npos);
}

// 4. Level 5: statistics inside each Tensor( block.
TEST_F(ApiLog, Level5Statistics) {
  api_log::set_level(5);
  test_function(vec3());
  const std::string in_stats = stat_lines(
      2, {"min=1.000000", "max=3.000000", "mean=2.000000", "nan_count=0", "inf_count=0"});
  const std::string out_stats = stat_lines(
      1, {"min=2.000000", "max=6.000000", "mean=4.000000", "nan_count=0", "inf_count=0"});
  EXPECT_EQ(text(), header("test_function") + "Positional input arguments:\n  arg[0]:\n" +
                        tensor3(2, in_stats) + "\n" + output(tensor3(1, out_stats)));
}

// 5. Enums print as Class.NAME (value=...), for int- and string-valued enums.
TEST_F(ApiLog, EnumLogging) {
  api_log::set_level(3);
  EXPECT_EQ(enum_fn(7, TestEnum::OPTION_B, StringEnum::MODE_OPTIMIZED), 7);
  EXPECT_EQ(text(), header("enum_fn") +
                        "Positional input arguments:\n"
                        "  arg[0]:\n"
                        "    7\n"
                        "Keyword input arguments:\n"
                        "  mode=\n"
                        "    TestEnum.OPTION_B (value=1)\n"
                        "  smode=\n"
                        "    StringEnum.MODE_OPTIMIZED (value=optimized)\n" +
                        output("  7"));
}

// 6. Optional parameters left at their defaults are listed as [DEFAULT].
TEST_F(ApiLog, DefaultParameters) {
  api_log::set_level(3);
  EXPECT_EQ(defaults_fn(5), 35);
  EXPECT_EQ(text(), header("defaults_fn") +
                        "Positional input arguments:\n"
                        "  arg[0]:\n"
                        "    5\n"
                        "Default parameters (not explicitly provided):\n"
                        "  y= [DEFAULT]\n"
                        "    10\n"
                        "  z= [DEFAULT]\n"
                        "    20\n"
                        "  mode= [DEFAULT]\n"
                        "    TestEnum.OPTION_A (value=0)\n" +
                        output("  35"));
}

// 7. A value that differs from the default is a keyword argument; the rest stay [DEFAULT].
TEST_F(ApiLog, ExplicitVsDefault) {
  api_log::set_level(3);
  EXPECT_EQ(explicit_fn(5, 100), 125);
  const std::string t = text();
  EXPECT_EQ(t, header("explicit_fn") +
                   "Positional input arguments:\n"
                   "  arg[0]:\n"
                   "    5\n"
                   "Keyword input arguments:\n"
                   "  y=\n"
                   "    100\n"
                   "Default parameters (not explicitly provided):\n"
                   "  z= [DEFAULT]\n"
                   "    20\n" +
                   output("  125"));
  EXPECT_EQ(count_of(t, "[DEFAULT]"), 1u);
}

// 8. Wrapper methods are logged as Class.method; self is arg[0], printed as its repr.
TEST_F(ApiLog, ClassMethodLogging) {
  api_log::set_level(1);
  Tensor ws = Tensor::zeros({8}, DType::kUInt8);
  TestWrapper w(ws);
  w.run(vec3());
  EXPECT_EQ(text(),
            "[TS] FlashInfer API Call: TestWrapper.__init__\n"
            "[TS] FlashInfer API Call: TestWrapper.run\n");

  capture_->clear();
  api_log::set_level(3);
  Tensor out = w.run(vec3(), 0.5);
  EXPECT_EQ(out.to_double_vector(), (std::vector<double>{2.0, 4.0, 6.0}));
  EXPECT_EQ(text(), header("TestWrapper.run") +
                        "Positional input arguments:\n"
                        "  arg[0]:\n"
                        "    <apilog_test.TestWrapper object at 0xADDR>\n"
                        "  arg[1]:\n" +
                        tensor3(2) +
                        "\n"
                        "Keyword input arguments:\n"
                        "  scale=\n"
                        "    0.5\n"
                        "Default parameters (not explicitly provided):\n"
                        "  return_lse= [DEFAULT]\n"
                        "    False\n" +
                        output(tensor3(1)));
  // The repr names this very object.
  char addr[32];
  std::snprintf(addr, sizeof(addr), "%p", static_cast<const void*>(&w));
  EXPECT_NE(capture_->records()[0].find(std::string("object at ") + addr), std::string::npos);
}

// 9. Crash safety: the input record exists before the body runs, the exception propagates
// unchanged, and no output block is written.
TEST_F(ApiLog, CrashSafety) {
  api_log::set_level(3);
  std::string seen_during_call;
  try {
    crash_fn(42, 99, [&] { seen_during_call = text(); });
    FAIL() << "crash_fn did not throw";
  } catch (const TestCrash& e) {
    EXPECT_STREQ(e.what(), "Simulated crash");
  }
  const std::string expected_input = header("crash_fn") +
                                     "Positional input arguments:\n"
                                     "  arg[0]:\n"
                                     "    42\n"
                                     "  arg[1]:\n"
                                     "    99\n";
  EXPECT_EQ(seen_during_call, expected_input);
  EXPECT_EQ(text(), expected_input);
  EXPECT_EQ(text().find("Output value:"), std::string::npos);
}

// 9b. The same with a file destination: the record is on disk while the op runs.
TEST_F(ApiLog, CrashSafetyFileOnDiskBeforeTheBody) {
  capture_.reset();  // back to the destination
  const fs::path dir = temp_dir("crash");
  const fs::path log = dir / "crash.log";
  ASSERT_TRUE(api_log::set_destination(log.string()));
  api_log::set_level(3);
  std::string on_disk;
  EXPECT_THROW(crash_fn(1, 2, [&] { on_disk = normalize(read_file(log)); }), TestCrash);
  api_log::set_level(0);
  EXPECT_NE(on_disk.find(header("crash_fn") + "Positional input arguments:\n  arg[0]:\n    1\n"),
            std::string::npos)
      << on_disk;
  EXPECT_EQ(normalize(read_file(log)).find("Output value:"), std::string::npos);
  fs::remove_all(dir);
}

// 9c. A library error (bad input) propagates unchanged, after the inputs were logged.
TEST_F(ApiLog, LibraryErrorPropagatesUnchanged) {
  api_log::set_level(3);
  Tensor x = Tensor::zeros({2, 4}, DType::kFloat32);
  Tensor w = Tensor::zeros({5}, DType::kFloat32);
  EXPECT_FI_ERROR(rmsnorm(x, w), "rmsnorm", "weight");
  EXPECT_NE(text().find(header("rmsnorm")), std::string::npos);
  EXPECT_EQ(text().find("Output value:"), std::string::npos);
}

// 10. Scalars, strings, dtypes and None.
TEST_F(ApiLog, DifferentDataTypes) {
  api_log::set_level(3);
  types_fn(42, 3.14, true, "hello", DType::kFloat16);
  EXPECT_EQ(text(), header("types_fn") +
                        "Positional input arguments:\n"
                        "  arg[0]:\n"
                        "    42\n"
                        "  arg[1]:\n"
                        "    3.14\n"
                        "  arg[2]:\n"
                        "    True\n"
                        "  arg[3]:\n"
                        "    'hello'\n"
                        "  arg[4]:\n"
                        "    torch.float16\n"
                        "Default parameters (not explicitly provided):\n"
                        "  n= [DEFAULT]\n"
                        "    None\n" +
                        output("  None"));
  capture_->clear();
  types_fn(-1, 2.0, false, "it's", DType::kBFloat16, 1e-6 > 0 ? 3 : 0);
  EXPECT_NE(text().find("    -1\n  arg[1]:\n    2.0\n  arg[2]:\n    False\n  arg[3]:\n"
                        "    \"it's\"\n  arg[4]:\n    torch.bfloat16\nKeyword input arguments:\n"
                        "  n=\n    3\n"),
            std::string::npos)
      << text();
}

// 11. Tensor metadata: shape, stride, dtype, device, requires_grad, is_contiguous.
TEST_F(ApiLog, TensorMetadata) {
  api_log::set_level(3);
  Tensor t = Tensor::zeros({2, 3, 4}, DType::kFloat32);
  stats_probe(t);
  EXPECT_EQ(text(), header("stats_probe") +
                        "Positional input arguments:\n"
                        "  arg[0]:\n"
                        "    Tensor(\n"
                        "      shape=(2, 3, 4)\n"
                        "      stride=(12, 4, 1)\n"
                        "      dtype=torch.float32\n"
                        "      device=cpu\n"
                        "      requires_grad=False\n"
                        "      is_contiguous=True\n"
                        "    )\n" +
                        output("  None"));
  capture_->clear();
  stats_probe(Tensor::zeros({2, 3}, DType::kBFloat16).transpose(0, 1));
  EXPECT_NE(text().find("      shape=(3, 2)\n      stride=(1, 3)\n      dtype=torch.bfloat16\n"
                        "      device=cpu\n      requires_grad=False\n      is_contiguous=False\n"),
            std::string::npos)
      << text();
  capture_->clear();
  stats_probe(Tensor::zeros({}, DType::kInt64));
  EXPECT_NE(text().find("      shape=()\n      stride=()\n      dtype=torch.int64\n"),
            std::string::npos)
      << text();
}

// 12. Nested containers: upstream's "[i]: " lines with the child's own indentation.
TEST_F(ApiLog, NestedStructures) {
  api_log::set_level(3);
  Value data = Value::dict({
      {Value("list"), Value::list({Value(1), Value(2.5), Value(vec3())})},
      {Value("dict"), Value::dict({{Value("a"), Value(1)}})},
      {Value("tuple"), Value::tuple({Value(1), Value("x")})},
      {Value("empty"), Value::list({})},
      {Value(3), Value::tuple({})},
  });
  nested_fn(data);
  const std::string in =
      "    {\n"
      "      'list':       [\n"
      "        [0]:         1\n"
      "        [1]:         2.5\n"
      "        [2]:         Tensor(\n"
      "          shape=(3,)\n"
      "          stride=(1,)\n"
      "          dtype=torch.float32\n"
      "          device=cpu\n"
      "          requires_grad=False\n"
      "          is_contiguous=True\n"
      "        )\n"
      "      ]\n"
      "      'dict':       {\n"
      "        'a':         1\n"
      "      }\n"
      "      'tuple':       (\n"
      "        [0]:         1\n"
      "        [1]:         'x'\n"
      "      )\n"
      "      'empty':       []\n"
      "      3:       ()\n"
      "    }";
  const std::string recs = text();
  EXPECT_EQ(recs.substr(0, recs.find("Output value:")),
            header("nested_fn") + "Positional input arguments:\n  arg[0]:\n" + in + "\n");
  for (const char* word : {"list", "dict", "tuple"}) {
    EXPECT_NE(recs.find(word), std::string::npos) << word;
  }
  // The same value one level shallower in the output block.
  EXPECT_NE(recs.find("Output value:\n  {\n    'list':     [\n      [0]:       1\n"),
            std::string::npos)
      << recs;
}

// 13. (Upstream: the decorator with and without parentheses.) Here: a built-in op and an op
// declared outside the library both log, through the same gate.
TEST_F(ApiLog, BuiltinOpLogsExactly) {
  api_log::set_level(3);
  Tensor x = Tensor::from_vector({1, 2, 3, 4, -1, -2, -3, -4}, {2, 4}, DType::kFloat16);
  Tensor w = Tensor::from_vector({1, 1, 1, 1}, {4}, DType::kFloat16);
  rmsnorm(x, w, 1e-5);
  const std::string t = text();
  EXPECT_EQ(t.substr(0, t.find("Output value:")),
            header("rmsnorm") +
                "Positional input arguments:\n"
                "  arg[0]:\n"
                "    Tensor(\n"
                "      shape=(2, 4)\n"
                "      stride=(4, 1)\n"
                "      dtype=torch.float16\n"
                "      device=cpu\n"
                "      requires_grad=False\n"
                "      is_contiguous=True\n"
                "    )\n"
                "  arg[1]:\n"
                "    Tensor(\n"
                "      shape=(4,)\n"
                "      stride=(1,)\n"
                "      dtype=torch.float16\n"
                "      device=cpu\n"
                "      requires_grad=False\n"
                "      is_contiguous=True\n"
                "    )\n"
                "Keyword input arguments:\n"
                "  eps=\n"
                "    1e-05\n"
                "Default parameters (not explicitly provided):\n"
                "  out= [DEFAULT]\n"
                "    None\n"
                "  enable_pdl= [DEFAULT]\n"
                "    None\n");
  EXPECT_EQ(t.substr(t.find("Output value:")),
            output("  Tensor(\n    shape=(2, 4)\n    stride=(4, 1)\n    dtype=torch.float16\n"
                   "    device=cpu\n    requires_grad=False\n    is_contiguous=True\n  )"));
  capture_->clear();
  test_function(vec3());
  EXPECT_NE(text().find(header("test_function")), std::string::npos);
}

// 14. Repeated calls: one header each.
TEST_F(ApiLog, MultipleCallsSameFunction) {
  api_log::set_level(3);
  for (int i = 0; i < 3; ++i) test_function(vec3());
  EXPECT_EQ(count_of(text(), "FlashInfer API Call: test_function"), 3u);
  EXPECT_EQ(count_of(text(), "Output value:"), 3u);
  api_log::set_level(1);
  capture_->clear();
  for (int i = 0; i < 3; ++i) test_function(vec3());
  EXPECT_EQ(capture_->records().size(), 3u);
}

// 15. Keyword arguments (optional parameters given non-default values), and a call where
// nothing is explicit.
TEST_F(ApiLog, KwargsLogging) {
  api_log::set_level(3);
  kwargs_fn(1, 2.5, "c");
  EXPECT_EQ(text(), header("kwargs_fn") +
                        "Keyword input arguments:\n"
                        "  a=\n"
                        "    1\n"
                        "  b=\n"
                        "    2.5\n"
                        "  c=\n"
                        "    'c'\n" +
                        output("  None"));
  capture_->clear();
  kwargs_fn();
  EXPECT_EQ(text(), header("kwargs_fn") +
                        "(No explicit arguments)\n"
                        "Default parameters (not explicitly provided):\n"
                        "  a= [DEFAULT]\n"
                        "    0\n"
                        "  b= [DEFAULT]\n"
                        "    0.0\n"
                        "  c= [DEFAULT]\n"
                        "    ''\n" +
                        output("  None"));
}

// Levels between and beyond the documented ones behave as upstream's comparisons make them.
TEST_F(ApiLog, LevelSemantics) {
  auto run_at = [&](int level) {
    capture_->clear();
    api_log::set_level(level);
    test_function(vec3());
    api_log::set_level(0);
    return text();
  };
  EXPECT_EQ(run_at(2), "");
  EXPECT_EQ(run_at(-1), "");
  const std::string l3 = run_at(3), l5 = run_at(5);
  EXPECT_EQ(run_at(4), l3);
  for (int lvl : {6, 9, 10, 11, 1000}) EXPECT_EQ(run_at(lvl), l5) << lvl;
  EXPECT_NE(l3, l5);
  EXPECT_EQ(run_at(1), "[TS] FlashInfer API Call: test_function\n");
  api_log::set_level(7);
  EXPECT_EQ(api_log::level(), 7);
}

// Logging never changes a result.
TEST_F(ApiLog, ResultsIdenticalAtEveryLevel) {
  Tensor x = Tensor::empty({4, 256}, DType::kFloat16);
  x.uniform_(11);
  Tensor w = Tensor::empty({256}, DType::kFloat16);
  w.uniform_(12);
  const auto ref = rmsnorm(x, w).to_double_vector();
  for (int lvl : {1, 3, 5, 10}) {
    api_log::set_level(lvl);
    EXPECT_EQ(rmsnorm(x, w).to_double_vector(), ref) << lvl;
  }
}

// ---- level-5 statistics, dtype by dtype, against hand-computed values ----

std::string stats_of(RecordCapture& cap, const Tensor& t) {
  cap.clear();
  stats_probe(t);
  const std::string s = cap.text();
  const auto b = s.find("      is_contiguous=");
  const auto e = s.find("\n    )\n", b);
  std::string tail = s.substr(b, e - b);
  return tail.substr(tail.find('\n') + 1 == 0 ? tail.size() : tail.find('\n') + 1);
}

std::string lines(std::initializer_list<const char*> ls) {
  std::string s;
  for (const char* l : ls) s += std::string(s.empty() ? "" : "\n") + "      " + l;
  return s;
}

TEST_F(ApiLog, StatisticsFloatDtypes) {
  api_log::set_level(5);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto f32 = [](std::vector<double> v) {
    const auto n = static_cast<int64_t>(v.size());
    return Tensor::from_vector(v, {n}, DType::kFloat32);
  };
  EXPECT_EQ(
      stats_of(*capture_, f32({1, -2, 4})),
      lines({"min=-2.000000", "max=4.000000", "mean=1.000000", "nan_count=0", "inf_count=0"}));
  // NaN propagates into min, max and mean (torch semantics); Inf is counted.
  EXPECT_EQ(stats_of(*capture_, f32({1, -2, nan, inf})),
            lines({"min=nan", "max=nan", "mean=nan", "nan_count=1", "inf_count=1"}));
  EXPECT_EQ(stats_of(*capture_, f32({1, -2, inf})),
            lines({"min=-2.000000", "max=inf", "mean=inf", "nan_count=0", "inf_count=1"}));
  EXPECT_EQ(stats_of(*capture_, f32({inf, -inf})),
            lines({"min=-inf", "max=inf", "mean=nan", "nan_count=0", "inf_count=2"}));
  // fp16 0.1, 0.2, 0.3 are 0.0999755859375, 0.199951171875, 0.300048828125; the mean is
  // 0.19999186197916667, printed from its fp32 value.
  EXPECT_EQ(stats_of(*capture_, Tensor::from_vector({0.1, 0.2, 0.3}, {3}, DType::kFloat16)),
            lines({"min=0.099976", "max=0.300049", "mean=0.199992", "nan_count=0", "inf_count=0"}));
  EXPECT_EQ(
      stats_of(*capture_, Tensor::from_vector({1.5, -3.25}, {2}, DType::kBFloat16)),
      lines({"min=-3.250000", "max=1.500000", "mean=-0.875000", "nan_count=0", "inf_count=0"}));
  EXPECT_EQ(
      stats_of(*capture_, Tensor::from_vector({448, -0.5}, {2}, DType::kFloat8E4M3FN)),
      lines({"min=-0.500000", "max=448.000000", "mean=223.750000", "nan_count=0", "inf_count=0"}));
  EXPECT_EQ(stats_of(*capture_, Tensor::from_vector({57344, -1, inf}, {3}, DType::kFloat8E5M2)),
            lines({"min=-1.000000", "max=inf", "mean=inf", "nan_count=0", "inf_count=1"}));
  // Large magnitudes print every integer digit, as Python's "%.6f" does (fp32 1e20 is
  // 100000002004087734272); signed zero keeps its sign.
  EXPECT_EQ(stats_of(*capture_, f32({1e20, -0.0})),
            lines({"min=-0.000000", "max=100000002004087734272.000000",
                   "mean=50000001002043867136.000000", "nan_count=0", "inf_count=0"}));
  // fp64 goes through .float() first, as upstream: 1e300 becomes inf.
  EXPECT_EQ(stats_of(*capture_, Tensor::from_vector({1e300, 0.25}, {2}, DType::kFloat64)),
            lines({"min=0.250000", "max=inf", "mean=inf", "nan_count=0", "inf_count=1"}));
}

TEST_F(ApiLog, StatisticsIntegerAndOtherDtypes) {
  api_log::set_level(5);
  EXPECT_EQ(stats_of(*capture_, Tensor::from_vector({-7, 3, 10}, {3}, DType::kInt32)),
            lines({"min=-7", "max=10", "mean=2.000000"}));
  // 256 / 3 as fp32 is 85.33333587646484.
  EXPECT_EQ(stats_of(*capture_, Tensor::from_vector({0, 255, 1}, {3}, DType::kUInt8)),
            lines({"min=0", "max=255", "mean=85.333336"}));
  EXPECT_EQ(stats_of(*capture_, Tensor::from_vector({-128, 127}, {2}, DType::kInt8)),
            lines({"min=-128", "max=127", "mean=-0.500000"}));
  EXPECT_EQ(stats_of(*capture_, Tensor::from_vector({-300, 300, 3}, {3}, DType::kInt16)),
            lines({"min=-300", "max=300", "mean=1.000000"}));
  EXPECT_EQ(stats_of(*capture_, Tensor::from_vector({-5, 5}, {2}, DType::kInt64)),
            lines({"min=-5", "max=5", "mean=0.000000"}));
  // No statistics: bool, fp4, empty tensors.
  EXPECT_EQ(stats_of(*capture_, Tensor::from_vector({1, 0}, {2}, DType::kBool)), "");
  EXPECT_EQ(stats_of(*capture_, Tensor::from_vector({1, 2}, {1}, DType::kFloat4E2M1FNx2)), "");
  EXPECT_EQ(stats_of(*capture_, Tensor::zeros({0, 3}, DType::kFloat32)), "");
}

TEST_F(ApiLog, StatisticsReadStridedViewsInPlace) {
  api_log::set_level(5);
  // [[1, 2, 3], [4, 5, 6]] transposed, and every other column of a wider tensor.
  Tensor base = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::kFloat32);
  EXPECT_EQ(stats_of(*capture_, base.transpose(0, 1)),
            lines({"min=1.000000", "max=6.000000", "mean=3.500000", "nan_count=0", "inf_count=0"}));
  Tensor wide = Tensor::from_vector({1, 100, 2, 100, 3, 100}, {6}, DType::kFloat32);
  EXPECT_EQ(stats_of(*capture_, wide.slice(0, 0, 6, 2)),
            lines({"min=1.000000", "max=3.000000", "mean=2.000000", "nan_count=0", "inf_count=0"}));
  // A 0-d tensor has one element.
  EXPECT_EQ(
      stats_of(*capture_, Tensor::full({}, -2.5, DType::kFloat32)),
      lines({"min=-2.500000", "max=-2.500000", "mean=-2.500000", "nan_count=0", "inf_count=0"}));
}

// A broadcast view costs its storage, not its logical size: {1, 2^34} over one element would take
// minutes element by element. Counts scale with the repetition; min, max and mean do not change.
TEST_F(ApiLog, StatisticsOfBroadcastViewsCostTheirStorage) {
  api_log::set_level(5);
  const int64_t big = int64_t{1} << 34;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  Tensor one = Tensor::from_vector({-1.5}, {1}, DType::kFloat32);
  EXPECT_EQ(
      stats_of(*capture_, one.as_strided({1, big}, {1, 0}, 0)),
      lines({"min=-1.500000", "max=-1.500000", "mean=-1.500000", "nan_count=0", "inf_count=0"}));
  // Three values, each repeated 2^33 times (stride 0 in the middle): NaN and Inf counted per copy.
  Tensor three = Tensor::from_vector({nan, inf, 2.0}, {3}, DType::kBFloat16);
  EXPECT_EQ(
      stats_of(*capture_, three.as_strided({3, big / 2}, {1, 0}, 0)),
      lines({"min=nan", "max=nan", "mean=nan", "nan_count=8589934592", "inf_count=8589934592"}));
  Tensor finite = Tensor::from_vector({1.0, 4.0}, {2}, DType::kFloat16);
  EXPECT_EQ(stats_of(*capture_, finite.as_strided({big / 4, 2, 2}, {0, 1, 0}, 0)),
            lines({"min=1.000000", "max=4.000000", "mean=2.500000", "nan_count=0", "inf_count=0"}));
  Tensor ints = Tensor::from_vector({-3, 9}, {2}, DType::kInt32);
  EXPECT_EQ(stats_of(*capture_, ints.as_strided({2, big}, {1, 0}, 0)),
            lines({"min=-3", "max=9", "mean=3.000000"}));
}

// Long contiguous tensors take the lane-split loop; the text must not depend on the layout.
TEST_F(ApiLog, StatisticsLongTensorsAnyLayout) {
  api_log::set_level(5);
  std::vector<double> v(1001);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i) - 500.0;
  Tensor t = Tensor::from_vector(v, {1001}, DType::kFloat32);
  const std::string expected =
      lines({"min=-500.000000", "max=500.000000", "mean=0.000000", "nan_count=0", "inf_count=0"});
  EXPECT_EQ(stats_of(*capture_, t), expected);
  // The same values through a transposed view (7x143 over a 143x7 tensor).
  Tensor m = Tensor::from_vector(v, {143, 7}, DType::kFloat32);
  EXPECT_EQ(stats_of(*capture_, m.transpose(0, 1)), expected);
  v[13] = std::numeric_limits<double>::infinity();
  v[1000] = -std::numeric_limits<double>::infinity();
  EXPECT_EQ(stats_of(*capture_, Tensor::from_vector(v, {1001}, DType::kFloat32)),
            lines({"min=-inf", "max=inf", "mean=nan", "nan_count=0", "inf_count=2"}));
  v[1000] = 0.0;
  v[999] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(stats_of(*capture_, Tensor::from_vector(v, {1001}, DType::kFloat16)),
            lines({"min=nan", "max=nan", "mean=nan", "nan_count=1", "inf_count=1"}));
  // Integers: 0..1000, mean 500.
  std::vector<double> n(1001);
  for (std::size_t i = 0; i < n.size(); ++i) n[i] = static_cast<double>(i);
  EXPECT_EQ(stats_of(*capture_, Tensor::from_vector(n, {1001}, DType::kInt32)),
            lines({"min=0", "max=1000", "mean=500.000000"}));
}

// CUDA tensors are reduced on the device; the text equals the CPU text of the same values.
TEST_F(ApiLog, StatisticsCudaMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  api_log::set_level(5);
  for (DType dt :
       {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3FN,
        DType::kFloat8E5M2, DType::kFloat64, DType::kInt32, DType::kUInt8, DType::kInt64}) {
    Tensor cpu = Tensor::empty({37, 129}, dt);
    cpu.uniform_(5, -100.0, 100.0);
    Tensor gpu = cpu.to(Device::cuda(0));
    EXPECT_EQ(stats_of(*capture_, gpu.transpose(0, 1)), stats_of(*capture_, cpu.transpose(0, 1)))
        << dtype_torch_name(dt);
  }
}

// ---- filters ----

TEST(ApiLogFilter, FnmatchLikePython) {
  using detail::fnmatch_case;
  EXPECT_TRUE(fnmatch_case("*decode*", "BatchDecodeWithPagedKVCacheWrapper.run") == false);
  EXPECT_TRUE(fnmatch_case("*Decode*", "BatchDecodeWithPagedKVCacheWrapper.run"));
  EXPECT_TRUE(fnmatch_case("single_*", "single_decode_with_kv_cache"));
  EXPECT_TRUE(fnmatch_case("*.__init__", "BatchDecodeWithPagedKVCacheWrapper.__init__"));
  EXPECT_FALSE(fnmatch_case("*.__init__", "rmsnorm"));
  EXPECT_TRUE(fnmatch_case("*Wrapper.run", "BatchPrefillWithPagedKVCacheWrapper.run"));
  EXPECT_TRUE(fnmatch_case("rms?orm", "rmsnorm"));
  EXPECT_FALSE(fnmatch_case("rms?orm", "rmsnrm"));
  EXPECT_TRUE(fnmatch_case("mm_fp[48]", "mm_fp4"));
  EXPECT_FALSE(fnmatch_case("mm_fp[!48]", "mm_fp4"));
  EXPECT_TRUE(fnmatch_case("mm_fp[0-9]", "mm_fp8"));
  EXPECT_TRUE(fnmatch_case("a[b", "a[b"));  // an unclosed '[' is literal
  EXPECT_TRUE(fnmatch_case("a[]]b", "a]b"));
  EXPECT_TRUE(fnmatch_case("a\\b", "a\\b"));  // no escape character
  EXPECT_TRUE(fnmatch_case("*", ""));
  EXPECT_FALSE(fnmatch_case("?", ""));
  EXPECT_TRUE(fnmatch_case("*a*b*c", "xxaxxbxxbc"));
  EXPECT_FALSE(fnmatch_case("*a*b*c", "xxaxxbxxb"));
}

TEST(ApiLogFilter, PatternLists) {
  using detail::split_pattern_list;
  EXPECT_EQ(split_pattern_list("*decode*, *prefill*"),
            (std::vector<std::string>{"*decode*", "*prefill*"}));
  EXPECT_EQ(split_pattern_list(" ,a,, b ,"), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(split_pattern_list("").empty());
  detail::NameFilter f;
  f.include = {"single_*"};
  f.exclude = {"*prefill*"};
  EXPECT_TRUE(f.passes("single_decode_with_kv_cache"));
  EXPECT_FALSE(f.passes("single_prefill_with_kv_cache"));
  EXPECT_FALSE(f.passes("rmsnorm"));
  f.include.clear();
  EXPECT_TRUE(f.passes("rmsnorm"));
  EXPECT_FALSE(f.passes("batch_prefill"));
}

TEST_F(ApiLog, FiltersGateLevel3AndAbove) {
  api_log::set_filters({"test_*"}, {});
  api_log::set_level(3);
  test_function(vec3());
  kwargs_fn(1);
  EXPECT_EQ(count_of(text(), "FlashInfer API Call: "), 1u);
  EXPECT_NE(text().find("FlashInfer API Call: test_function"), std::string::npos);
  // Include first, then exclude.
  capture_->clear();
  api_log::set_filters({"*_fn", "test_*"}, {"kwargs_*"});
  test_function(vec3());
  kwargs_fn(1);
  explicit_fn(1);
  EXPECT_EQ(count_of(text(), "FlashInfer API Call: "), 2u);
  EXPECT_EQ(text().find("kwargs_fn"), std::string::npos);
  EXPECT_TRUE(api_log::passes_filters("explicit_fn"));
  EXPECT_FALSE(api_log::passes_filters("kwargs_fn"));
  // Filtered calls at level 5 log nothing at all; level 1 is never filtered.
  capture_->clear();
  api_log::set_level(5);
  kwargs_fn(2);
  EXPECT_EQ(text(), "");
  api_log::set_level(1);
  kwargs_fn(3);
  EXPECT_EQ(text(), "[TS] FlashInfer API Call: kwargs_fn\n");
  // Wrapper methods are matched as Class.method.
  capture_->clear();
  api_log::set_filters({"*Wrapper.run"}, {});
  api_log::set_level(3);
  TestWrapper w(Tensor::zeros({4}, DType::kUInt8));
  w.run(vec3());
  EXPECT_EQ(count_of(text(), "FlashInfer API Call: "), 1u);
  EXPECT_NE(text().find("FlashInfer API Call: TestWrapper.run"), std::string::npos);
}

// ---- destinations ----

// Records from concurrent threads never interleave: the file parses back into exactly the
// records the calls produce.
TEST_F(ApiLog, ConcurrentRecordsNeverInterleave) {
  capture_.reset();
  const fs::path dir = temp_dir("concurrent");
  const fs::path log = dir / "concurrent.log";
  ASSERT_TRUE(api_log::set_destination(log.string()));
  api_log::set_level(3);
  constexpr int kThreads = 8, kCalls = 40;
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &wrong] {
      for (int i = 0; i < kCalls; ++i) {
        if (concurrent_op(t, i) != t * 1000 + i) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  api_log::set_level(0);
  EXPECT_EQ(wrong.load(), 0);

  std::string s = normalize(read_file(log));
  // Drop the banner if this test happened to be the first to log.
  if (s.find("System Information") != std::string::npos) {
    const auto end = s.find(kEq + "\n\n");
    ASSERT_NE(end, std::string::npos);
    s = s.substr(end + kEq.size() + 2);
  }
  std::vector<int> inputs(kThreads * kCalls, 0);
  std::map<std::string, int> outputs;
  std::size_t pos = 0, nrec = 0;
  const std::string in_head =
      header("concurrent_op") + "Positional input arguments:\n  arg[0]:\n    ";
  while (pos < s.size()) {
    ++nrec;
    if (s.compare(pos, in_head.size(), in_head) == 0) {
      int t = -1, i = -1;
      const std::string rest = s.substr(pos + in_head.size(), 64);
      ASSERT_EQ(std::sscanf(rest.c_str(), "%d\n  arg[1]:\n    %d\n", &t, &i), 2) << rest;
      const std::string rec =
          in_head + std::to_string(t) + "\n  arg[1]:\n    " + std::to_string(i) + "\n";
      ASSERT_EQ(s.compare(pos, rec.size(), rec), 0) << s.substr(pos, 300);
      ASSERT_TRUE(t >= 0 && t < kThreads && i >= 0 && i < kCalls);
      ++inputs[t * kCalls + i];
      pos += rec.size();
    } else {
      ASSERT_EQ(s.compare(pos, 16, "Output value:\n  "), 0) << s.substr(pos, 300);
      const auto nl = s.find('\n', pos + 16);
      const std::string val = s.substr(pos + 16, nl - pos - 16);
      const std::string rec = output("  " + val);
      ASSERT_EQ(s.compare(pos, rec.size(), rec), 0) << s.substr(pos, 300);
      ++outputs[val];
      pos += rec.size();
    }
  }
  EXPECT_EQ(nrec, 2u * kThreads * kCalls);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kCalls; ++i) {
      EXPECT_EQ(inputs[t * kCalls + i], 1);
      EXPECT_EQ(outputs[std::to_string(t * 1000 + i)], 1);
    }
  }
  fs::remove_all(dir);
}

// Every %i in the destination becomes the process id; files are appended to.
TEST_F(ApiLog, PidSubstitutionAndAppend) {
  capture_.reset();
  const fs::path dir = temp_dir("pid");
  const std::string pid = std::to_string(::getpid());
  {
    std::ofstream pre(dir / ("log_" + pid + "_" + pid + ".txt"));
    pre << "existing line\n";
  }
  ASSERT_TRUE(api_log::set_destination((dir / "log_%i_%i.txt").string()));
  EXPECT_EQ(api_log::destination(), (dir / "log_%i_%i.txt").string());
  api_log::set_level(1);
  test_function(vec3());
  api_log::set_level(0);
  const std::string got = normalize(read_file(dir / ("log_" + pid + "_" + pid + ".txt")));
  ASSERT_EQ(got.rfind("existing line\n", 0), 0u) << got;
  EXPECT_EQ(got.substr(got.size() - 40), "[TS] FlashInfer API Call: test_function\n");
  fs::remove_all(dir);
}

// A forked child with %i in the destination writes to its own file, not the parent's.
TEST_F(ApiLog, ForkedChildGetsItsOwnPidFile) {
  capture_.reset();
  const fs::path dir = temp_dir("fork");
  ASSERT_TRUE(api_log::set_destination((dir / "f_%i.log").string()));
  api_log::set_level(1);
  test_function(vec3());  // the parent's file is open now
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    kwargs_fn();
    std::_Exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  api_log::set_level(0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string mine = normalize(read_file(dir / ("f_" + std::to_string(::getpid()) + ".log")));
  const std::string theirs = normalize(read_file(dir / ("f_" + std::to_string(child) + ".log")));
  EXPECT_EQ(mine.find("kwargs_fn"), std::string::npos) << mine;
  EXPECT_EQ(theirs, "[TS] FlashInfer API Call: kwargs_fn\n");
  fs::remove_all(dir);
}

// An unwritable destination: one warning on stderr, calls keep working, nothing else printed.
TEST_F(ApiLog, UnwritableDestinationWarnsOnce) {
  capture_.reset();
  const std::string bad = "/nonexistent_fi_dir/sub/log.txt";
  ::testing::internal::CaptureStderr();
  const bool ok = api_log::set_destination(bad);
  api_log::set_level(5);
  Tensor y1 = test_function(vec3());
  Tensor y2 = test_function(vec3());
  api_log::set_level(0);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(ok);
  EXPECT_EQ(y1.to_double_vector(), (std::vector<double>{2.0, 4.0, 6.0}));
  EXPECT_EQ(y2.to_double_vector(), (std::vector<double>{2.0, 4.0, 6.0}));
  EXPECT_EQ(err,
            "[flashinfer] warning: cannot open the API log destination "
            "'/nonexistent_fi_dir/sub/log.txt' (FLASHINFER_LOGDEST): No such file or directory; "
            "API log records are dropped, API calls are unaffected\n");
}

// A destination whose writes fail (a full disk): one warning, later records dropped silently.
TEST_F(ApiLog, FailingWritesWarnOnce) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  capture_.reset();
  ::testing::internal::CaptureStderr();
  const bool ok = api_log::set_destination("/dev/full");
  api_log::set_level(3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(explicit_fn(i), i + 30);
  }
  api_log::set_level(0);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(ok);
  EXPECT_EQ(err,
            "[flashinfer] warning: writing the API log to '/dev/full' failed: No space left on "
            "device; records may be lost, API calls are unaffected\n");
}

// configure_from_env() applies the variables again at run time; unset variables mean defaults.
TEST_F(ApiLog, ConfigureFromEnvAtRunTime) {
  capture_.reset();
  const fs::path dir = temp_dir("reconfigure");
  const std::string pid = std::to_string(::getpid());
  ::setenv("FLASHINFER_LOGLEVEL", " 1 ", 1);
  ::setenv("FLASHINFER_LOGDEST", (dir / "re_%i.log").c_str(), 1);
  ::setenv("FLASHINFER_DUMP_INCLUDE", "nothing_matches", 1);
  api_log::configure_from_env();
  EXPECT_EQ(api_log::level(), 1);
  EXPECT_EQ(api_log::destination(), (dir / "re_%i.log").string());
  EXPECT_FALSE(api_log::passes_filters("test_function"));
  EXPECT_TRUE(fs::exists(dir / ("re_" + pid + ".log")));  // created when configured, as upstream
  test_function(vec3());                                  // level 1 ignores the filters
  ::unsetenv("FLASHINFER_LOGLEVEL");
  ::unsetenv("FLASHINFER_LOGDEST");
  ::unsetenv("FLASHINFER_DUMP_INCLUDE");
  api_log::configure_from_env();
  EXPECT_EQ(api_log::level(), 0);
  EXPECT_EQ(api_log::destination(), "stdout");
  EXPECT_TRUE(api_log::passes_filters("test_function"));
  const std::string got = normalize(read_file(dir / ("re_" + pid + ".log")));
  EXPECT_EQ(got.substr(got.size() - 40), "[TS] FlashInfer API Call: test_function\n");
  fs::remove_all(dir);
}

// Ring mode (level 10 with FLASHINFER_DUMP_RING) writes nothing until a trigger: the recorder
// keeps the calls, and the logger writes no per-call records (its level-5 statistics cost more
// than the ring). Level 10 alone would log at level 5 as upstream does.
TEST_F(ApiLog, RingModeWritesNoPerCallRecords) {
  capture_.reset();
  const fs::path dir = temp_dir("ring_quiet");
  ::setenv("FLASHINFER_LOGLEVEL", "10", 1);
  ::setenv("FLASHINFER_DUMP_RING", "8", 1);
  ::setenv("FLASHINFER_DUMP_TRIGGER", "error", 1);
  ::setenv("FLASHINFER_DUMP_DIR", (dir / "dumps").c_str(), 1);
  ::setenv("FLASHINFER_LOGDEST", (dir / "api.log").c_str(), 1);
  api_log::configure_from_env();
  EXPECT_EQ(api_log::level(), 0);
  EXPECT_TRUE(recorder::active());
  test_function(vec3());
  recorder::stop();
  for (const char* v : {"FLASHINFER_LOGLEVEL", "FLASHINFER_DUMP_RING", "FLASHINFER_DUMP_TRIGGER",
                        "FLASHINFER_DUMP_DIR", "FLASHINFER_LOGDEST"}) {
    ::unsetenv(v);
  }
  api_log::configure_from_env();
  // The file exists (opened when configured); the banner is written once per process.
  ASSERT_TRUE(fs::exists(dir / "api.log"));
  const std::string log = read_file(dir / "api.log");
  EXPECT_EQ(log.find("FlashInfer API Call"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(dir / "dumps") && !fs::is_empty(dir / "dumps"));  // nothing triggered
  fs::remove_all(dir);
}

// The sink receives whole records, and removing it goes back to the destination.
TEST_F(ApiLog, SinkAndDestinationSwitch) {
  capture_.reset();
  const fs::path dir = temp_dir("switch");
  ASSERT_TRUE(api_log::set_destination((dir / "a.log").string()));
  api_log::set_level(1);
  {
    RecordCapture cap;
    test_function(vec3());
    EXPECT_EQ(cap.text(), "[TS] FlashInfer API Call: test_function\n");
  }
  kwargs_fn();
  api_log::flush();
  api_log::set_level(0);
  const std::string a = normalize(read_file(dir / "a.log"));
  EXPECT_EQ(a.substr(a.size() - 36), "[TS] FlashInfer API Call: kwargs_fn\n");
  EXPECT_EQ(a.find("test_function"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
