// `flashinfer diff` and `flashinfer repro`: recordings made here (in process) are compared
// call by call, with one op's output perturbed in one of them; ulp distances per dtype; wrapper
// calls aligned by object; --json; exit statuses. `repro` writes a program for a call (built
// and run against the installed package by the repro_find_package test).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay_diff.h"
#include "flashinfer/tensor_io.h"
#include "util/run_command.h"

namespace flashinfer {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::run_flashinfer;

// ---- a user wrapper, so that alignment by object can be checked (diff reads records only) ----
class Scaler : public ApiObject {
 public:
  explicit Scaler(double factor);
  Tensor run(const Tensor& x);
  std::string_view class_name() const override { return "ScalerWrapper"; }
  std::string_view module_name() const override { return "tests.diff"; }

 private:
  double factor_;
};

const OpDecl& scaler_decl(bool init) {
  static const bool once = [] {
    OpDecl i;
    i.name = "ScalerWrapper.__init__";
    i.module = "tests.diff";
    i.class_name = "ScalerWrapper";
    i.params = {ParamDecl("self", ParamKind::kObject), ParamDecl("factor", ParamKind::kFloat)};
    register_op(std::move(i));
    OpDecl r;
    r.name = "ScalerWrapper.run";
    r.module = "tests.diff";
    r.class_name = "ScalerWrapper";
    r.params = {ParamDecl("self", ParamKind::kObject), ParamDecl("x", ParamKind::kTensor)};
    register_op(std::move(r));
    return true;
  }();
  (void)once;
  return *OpRegistry::global().find(init ? "ScalerWrapper.__init__" : "ScalerWrapper.run");
}
const OpDecl& scaler_init() { return scaler_decl(true); }
const OpDecl& scaler_run() { return scaler_decl(false); }

Scaler::Scaler(double factor) : factor_(factor) {
  call_api(
      &scaler_init, [] {}, *this, factor);
}
Tensor Scaler::run(const Tensor& x) {
  return call_api(
      &scaler_run,
      [&] {
        std::vector<double> v = x.to_double_vector();
        for (double& e : v) e *= factor_;
        return Tensor::from_vector(v, x.shape(), x.dtype());
      },
      *this, x);
}

fs::path scratch(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("fi_diff_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p;
}

void start_recording(const fs::path& dir, bool dedup = false) {
  recorder::Config c;
  c.dump_dir = dir.string();
  c.dedup = dedup;  // FLASHINFER_DUMP_DEDUP=1: tensors content-addressed under <dir>/tensors/
  recorder::start(c, [](const std::string&) {});
}

// The call directories of a recording whose name holds `what`, in name order. `what` starting
// with '_' must follow the pid: "_rmsnorm_call" does not match a gemma_rmsnorm call.
std::vector<fs::path> calls_named(const fs::path& root, const std::string& what) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    const auto at = name.find(what);
    if (!e.is_directory() || at == std::string::npos) continue;
    if (what[0] == '_' && (at == 0 || name[at - 1] < '0' || name[at - 1] > '9')) continue;
    out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

constexpr float kPerturbation = 0.25f;

// rmsnorm -> gemma_rmsnorm of its output -> an independent rmsnorm (and `extra` more). With
// `perturb`, the first call's output is changed by kPerturbation at element 3 both in what the
// next call receives and in the recorded outputs.pt: a kernel that went wrong in call 1.
void record_sequence(const fs::path& dir, bool perturb, bool extra = false, bool dedup = false) {
  start_recording(dir, dedup);
  std::vector<double> xv(16), wv(8);
  for (int i = 0; i < 16; ++i) xv[i] = 0.1 * (i + 1) - 0.7;
  for (int i = 0; i < 8; ++i) wv[i] = 1.0 + 0.05 * i;
  const Tensor x = Tensor::from_vector(xv, {2, 8}, DType::kFloat32);
  const Tensor w = Tensor::from_vector(wv, {8}, DType::kFloat32);
  Tensor h = rmsnorm(x, w, 1e-6);
  if (perturb) {
    std::vector<double> v = h.to_double_vector();
    v[3] = static_cast<float>(v[3]) + kPerturbation;
    h.copy_(Tensor::from_vector(v, h.shape(), h.dtype()));
  }
  (void)gemma_rmsnorm(h, w, 1e-6);
  (void)rmsnorm(w.reshape({1, 8}), w, 1e-6);
  if (extra) (void)rmsnorm(x, w, 1e-5);
  recorder::stop();
  if (perturb) {
    const fs::path first = calls_named(dir, "_rmsnorm_call").front() / "outputs.pt";
    NamedTensors out = load_torch(first.string());
    ASSERT_EQ(out.size(), 1u);
    out[0].second = h;
    save_torch(first.string(), out);
  }
}

uint32_t f32_bits(double v) { return std::bit_cast<uint32_t>(static_cast<float>(v)); }

class Diff : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    a_ = new fs::path(scratch("a"));
    a2_ = new fs::path(scratch("a2"));
    b_ = new fs::path(scratch("b"));
    record_sequence(*a_, false);
    record_sequence(*a2_, false);
    record_sequence(*b_, true);
  }
  static void TearDownTestSuite() {
    for (fs::path* p : {a_, a2_, b_}) {
      fs::remove_all(*p);
      delete p;
    }
  }
  static fs::path *a_, *a2_, *b_;
};
fs::path *Diff::a_, *Diff::a2_, *Diff::b_;

TEST(DiffUlp, DistancesInTheTensorsDType) {
  using replay::ulp_distance;
  EXPECT_EQ(ulp_distance(1.0, std::nextafter(1.0f, 2.0f), DType::kFloat32), 1u);
  EXPECT_EQ(ulp_distance(1.0, 1.0 + 3 * std::ldexp(1.0, -23), DType::kFloat32), 3u);
  EXPECT_EQ(ulp_distance(-0.0, 0.0, DType::kFloat32), 0u);
  // Across zero: the values between, on both sides (smallest subnormal: 1 ulp from 0).
  EXPECT_EQ(ulp_distance(-std::ldexp(1.0, -149), std::ldexp(1.0, -149), DType::kFloat32), 2u);
  EXPECT_EQ(ulp_distance(1.0, 1.0 + std::ldexp(1.0, -10), DType::kFloat16), 1u);
  EXPECT_EQ(ulp_distance(1.0, -1.0, DType::kFloat16), 2u * 0x3C00u);
  EXPECT_EQ(ulp_distance(1.0, 1.0 + std::ldexp(1.0, -7), DType::kBFloat16), 1u);
  EXPECT_EQ(ulp_distance(1.0, 2.0, DType::kBFloat16), 128u);
  EXPECT_EQ(ulp_distance(1.0, 1.125, DType::kFloat8E4M3FN), 1u);
  EXPECT_EQ(ulp_distance(1.0, 1.25, DType::kFloat8E5M2), 1u);
  EXPECT_EQ(ulp_distance(1.0, 1.5, DType::kFloat4E2M1FNx2), 1u);
  EXPECT_EQ(ulp_distance(1.0, std::nextafter(1.0, 2.0), DType::kFloat64), 1u);
  EXPECT_EQ(ulp_distance(5.0, 9.0, DType::kInt32), 4u);
  EXPECT_EQ(ulp_distance(1.0, NAN, DType::kFloat32), 0u);
}

TEST_F(Diff, IdenticalRecordingsAgree) {
  const auto r = run_flashinfer("diff " + a_->string() + " " + a2_->string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("3 calls matched, 0 differ; 0 only in A, 0 only in B"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("The recordings agree"), std::string::npos) << r.out;
  // One call directory against the same call of the other recording.
  const auto one = run_flashinfer("diff " + calls_named(*a_, "gemma")[0].string() + " " +
                                  calls_named(*a2_, "gemma")[0].string());
  EXPECT_EQ(one.status, 0) << one.out;
}

TEST_F(Diff, NamesTheDivergingCallAndWhereItSpread) {
  const auto r = run_flashinfer("diff " + a_->string() + " " + b_->string());
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("3 calls matched, 2 differ"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("First diverging call (inputs agree, outputs differ): rmsnorm (A #1, B #1)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("First call whose inputs differ: gemma_rmsnorm (A #2, B #2)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("output result: 1 of 16 elements differ (max abs error 0.25"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("input arg_0: 1 of 16 elements differ (max abs error 0.25"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("The recordings diverge"), std::string::npos);
  // -v lists every differing call; the third call agrees, so it is not listed.
  const auto v = run_flashinfer("diff -v " + a_->string() + " " + b_->string());
  EXPECT_NE(v.out.find("gemma_rmsnorm (A #2, B #2): inputs differ"), std::string::npos) << v.out;
  EXPECT_EQ(v.out.find("(A #3, B #3)"), std::string::npos) << v.out;
  // Loose enough tolerances hide the perturbation.
  EXPECT_EQ(run_flashinfer("diff --atol 2 " + a_->string() + " " + b_->string()).status, 0);
}

// A recording in the dedup layout (FLASHINFER_DUMP_DEDUP=1) compares with one in upstream's
// layout tensor by tensor, and repro reads its call.
TEST_F(Diff, DedupRecordingsAreRead) {
  const fs::path d = scratch("dedup");
  record_sequence(d, false, false, /*dedup=*/true);
  ASSERT_TRUE(fs::exists(d / "tensors"));
  const auto same = run_flashinfer("diff " + d.string() + " " + a_->string());
  EXPECT_EQ(same.status, 0) << same.out;
  const auto r = run_flashinfer("diff " + d.string() + " " + b_->string());
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("First call whose inputs differ: gemma_rmsnorm (A #2, B #2)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("input arg_0: 1 of 16 elements differ (max abs error 0.25"),
            std::string::npos)
      << r.out;
  const fs::path out = scratch("dedup_repro");
  const auto rp =
      run_flashinfer("repro --dir " + calls_named(d, "gemma")[0].string() + " -o " + out.string());
  EXPECT_EQ(rp.status, 0) << rp.out;
  EXPECT_TRUE(fs::exists(out / "main.cpp"));
  EXPECT_FALSE(fs::is_empty(out / "data"));
  fs::remove_all(d);
  fs::remove_all(out);
}

TEST_F(Diff, JsonReportParsesWithPerTensorErrors) {
  const auto r = run_flashinfer("diff --json " + a_->string() + " " + b_->string());
  EXPECT_EQ(r.status, 1);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["equal"].get<bool>());
  EXPECT_EQ(j["calls_a"], 3);
  EXPECT_EQ(j["matched"], 3);
  EXPECT_EQ(j["differing"], 2);
  const auto& d = j["first_diverging_call"];
  EXPECT_EQ(d["function_name"], "rmsnorm");
  EXPECT_EQ(d["index_a"], 1);
  EXPECT_TRUE(d["inputs_equal"].get<bool>());
  EXPECT_FALSE(d["outputs_equal"].get<bool>());
  ASSERT_EQ(d["tensors"].size(), 1u);  // only the tensors that are not bit-identical
  const auto& t = d["tensors"][0];
  EXPECT_EQ(t["side"], "output");
  EXPECT_EQ(t["key"], "result");
  EXPECT_EQ(t["mismatches"], 1);
  EXPECT_EQ(t["numel"], 16);
  EXPECT_EQ(t["first_mismatch"], 3);
  // The expected ulp distance, from the recorded value itself.
  const NamedTensors rec =
      load_torch((calls_named(*a_, "_rmsnorm_call")[0] / "outputs.pt").string());
  const double v3 = rec[0].second.to_double_vector()[3];
  const double p3 = static_cast<float>(v3) + kPerturbation;
  const uint32_t ua = f32_bits(v3), ub = f32_bits(p3);
  ASSERT_EQ(ua >> 31, ub >> 31) << "the perturbation crosses zero; pick another element";
  EXPECT_EQ(t["max_ulp_error"].get<uint64_t>(), ua > ub ? ua - ub : ub - ua);
  EXPECT_NEAR(t["max_abs_error"].get<double>(), kPerturbation, 1e-7);
  const auto& s = j["first_input_difference"];
  EXPECT_EQ(s["function_name"], "gemma_rmsnorm");
  EXPECT_FALSE(s["inputs_equal"].get<bool>());
  EXPECT_EQ(j["only_in_a"].size(), 0u);
  // Equal recordings: "equal" true and no first call named.
  const auto e = nlohmann::json::parse(
      run_flashinfer("diff --json " + a_->string() + " " + a2_->string()).out);
  EXPECT_TRUE(e["equal"].get<bool>());
  EXPECT_TRUE(e["first_diverging_call"].is_null());
}

TEST_F(Diff, CallsOnlyOneRecordingHasAreReported) {
  const fs::path c = scratch("extra");
  record_sequence(c, false, /*extra=*/true);
  const auto r = run_flashinfer("diff " + a_->string() + " " + c.string());
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("0 only in A, 1 only in B"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("only in B: #4 rmsnorm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("No call with equal inputs has different outputs"), std::string::npos);
  const auto j =
      nlohmann::json::parse(run_flashinfer("diff --json " + c.string() + " " + a_->string()).out);
  ASSERT_EQ(j["only_in_a"].size(), 1u);
  EXPECT_EQ(j["only_in_a"][0]["index_a"], 4);
  EXPECT_TRUE(j["only_in_a"][0]["index_b"].is_null());
  fs::remove_all(c);
}

TEST(DiffAlign, WrapperCallsAlignByObjectNotByOrder) {
  // Two objects of one class; B calls them in the other order. Aligned by sequence alone, each
  // run would meet the other object's run and differ.
  const Tensor x = Tensor::from_vector({1, 2, 3}, {3}, DType::kFloat32);
  auto record = [&](const fs::path& dir, bool swap, double second_factor) {
    start_recording(dir);
    Scaler s1(2.0), s2(second_factor);
    if (swap) {
      (void)s2.run(x);
      (void)s1.run(x);
    } else {
      (void)s1.run(x);
      (void)s2.run(x);
    }
    recorder::stop();
  };
  const fs::path a = scratch("wa"), b = scratch("wb"), c = scratch("wc");
  record(a, false, 3.0);
  record(b, true, 3.0);
  record(c, true, 3.5);  // the second object's factor differs
  const auto same = run_flashinfer("diff " + a.string() + " " + b.string());
  EXPECT_EQ(same.status, 0) << same.out;
  const auto j =
      nlohmann::json::parse(run_flashinfer("diff --json " + a.string() + " " + c.string()).out);
  EXPECT_FALSE(j["equal"].get<bool>());
  // __init__ of the second object: its factor (a scalar input) differs.
  const auto& s = j["first_input_difference"];
  EXPECT_EQ(s["function_name"], "ScalerWrapper.__init__");
  EXPECT_EQ(s["index_a"], 2);
  ASSERT_EQ(s["values"].size(), 1u);
  EXPECT_EQ(s["values"][0]["key"], "arg_1");
  EXPECT_EQ(s["values"][0]["a"], "3.0");
  EXPECT_EQ(s["values"][0]["b"], "3.5");
  // The second object's run: same input, other output (its state came from the __init__).
  const auto& d = j["first_diverging_call"];
  EXPECT_EQ(d["function_name"], "ScalerWrapper.run");
  EXPECT_EQ(d["index_a"], 4);  // s2.run is A's 4th call and B's 3rd
  EXPECT_EQ(d["index_b"], 3);
  for (const auto& p : {a, b, c}) fs::remove_all(p);
}

// A Python caller passes eps by keyword and leaves out `out` and enable_pdl: upstream records
// kwarg_eps and no arg_3/arg_4. The C++ call records them positionally. Matched by parameter,
// with left-out parameters at their defaults, the two calls agree.
TEST(DiffKeys, PositionalAndKeywordArgumentsMeetByParameter) {
  const fs::path a = scratch("pos"), b = scratch("kw");
  start_recording(a);
  (void)rmsnorm(Tensor::from_vector({1, 2, 3, 4}, {2, 2}, DType::kFloat32),
                Tensor::from_vector({1, 0.5}, {2}, DType::kFloat32), 1e-5);
  recorder::stop();
  const fs::path call = calls_named(a, "_rmsnorm_call")[0];
  auto keyword_copy = [&](double eps) {
    fs::remove_all(b);
    const fs::path up = b / call.filename();
    fs::create_directories(up);
    fs::copy_file(call / "inputs.pt", up / "inputs.pt");
    fs::copy_file(call / "outputs.pt", up / "outputs.pt");
    std::ifstream in(call / "metadata.jsonl");
    std::string line, last;
    while (std::getline(in, line)) {
      if (!line.empty()) last = line;
    }
    auto rec = nlohmann::ordered_json::parse(last);
    auto& im = rec["input_metadata"];
    ASSERT_EQ(im["arg_2"], 1e-5) << last;
    ASSERT_TRUE(im["arg_3"].is_null()) << last;
    im.erase("arg_2");
    im.erase("arg_3");
    im.erase("arg_4");
    im["kwarg_eps"] = eps;
    std::ofstream(up / "metadata.jsonl") << rec.dump() << "\n";
  };
  keyword_copy(1e-5);
  const auto same = run_flashinfer("diff " + a.string() + " " + b.string());
  EXPECT_EQ(same.status, 0) << same.out;
  keyword_copy(1e-4);
  const auto j =
      nlohmann::json::parse(run_flashinfer("diff --json " + a.string() + " " + b.string()).out);
  const auto& s = j["first_input_difference"];
  ASSERT_EQ(s["values"].size(), 1u) << j.dump(2);
  EXPECT_EQ(s["values"][0]["key"], "arg_2");
  EXPECT_EQ(s["values"][0]["a"], "1e-05");
  EXPECT_EQ(s["values"][0]["b"], "0.0001");
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST_F(Diff, UsageAndUnreadableInputExit2) {
  for (const char* cmd : {"diff --help", "repro --help"}) {
    const auto h = run_flashinfer(cmd);
    EXPECT_EQ(h.status, 0) << cmd;
    EXPECT_NE(h.out.find("Exit status"), std::string::npos) << h.out;
  }
  EXPECT_EQ(run_flashinfer("diff " + a_->string()).status, 2);
  EXPECT_EQ(run_flashinfer("diff").status, 2);
  EXPECT_EQ(run_flashinfer("diff --bogus " + a_->string() + " " + b_->string()).status, 2);
  const auto r = run_flashinfer("diff " + a_->string() + " /nonexistent/recording");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("recording not found: /nonexistent/recording"), std::string::npos);
  // --json error objects parse, whatever bytes the path holds.
  const auto j =
      run_flashinfer("diff --json " + a_->string() + " \"$(printf '/nonexistent/\\377\\001')\"");
  EXPECT_EQ(j.status, 2);
  const auto e = nlohmann::json::parse(j.out);
  EXPECT_EQ(e["dir"], "/nonexistent/\\xFF\x01");
}

TEST_F(Diff, ABrokenCallIsReportedNotFatal) {
  const fs::path c = scratch("broken");
  fs::copy(*a_, c, fs::copy_options::recursive);
  const fs::path gemma = calls_named(c, "gemma")[0];
  std::ofstream(gemma / "inputs.pt", std::ios::trunc) << "not a zip";
  const auto r = run_flashinfer("diff -v " + a_->string() + " " + c.string());
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("gemma_rmsnorm (A #2, B #2): unreadable"), std::string::npos) << r.out;
  fs::remove_all(c);
}

// ---- repro: what is generated (the repro_find_package test builds and runs it) ----

class Repro : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dump_ = new fs::path(scratch("repro_dump"));
    const auto r =
        run_command(std::string(FLASHINFER_TEST_BIN_DIR) + "/repro_recorder " + dump_->string());
    ASSERT_EQ(r.status, 0) << r.out;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dump_);
    delete dump_;
  }
  static std::string read(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static fs::path* dump_;
};
fs::path* Repro::dump_;

TEST_F(Repro, WritesAProgramSpellingOutTheCall) {
  const fs::path out = scratch("repro_rms");
  const auto r = run_flashinfer("repro --dir " + calls_named(*dump_, "_rmsnorm_call")[0].string() +
                                " -o " + out.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string cpp = read(out / "main.cpp");
  EXPECT_NE(cpp.find("// signature: (input, weight, eps=1e-06, out=None, enable_pdl=None)"),
            std::string::npos)
      << cpp;
  EXPECT_NE(cpp.find("fi::Tensor input = repro_tensor(step_inputs, \"arg_0\");  // torch.float16 "
                     "(3, 16)"),
            std::string::npos)
      << cpp;
  EXPECT_NE(cpp.find("const double eps = 1.0000000000000001e-05;"), std::string::npos) << cpp;
  EXPECT_NE(cpp.find("repro_run(\"rmsnorm\",\n          {fi::Value(input), fi::Value(weight), "
                     "fi::Value(eps), fi::Value(out), enable_pdl}"),
            std::string::npos)
      << cpp;
  // What the call returned and what it wrote into `out` are both compared.
  EXPECT_NE(cpp.find("repro_check(\"result\", step_actual, step_expected)"), std::string::npos);
  EXPECT_NE(cpp.find("{{\"mutated arg_3\", out}}"), std::string::npos) << cpp;
  const std::string cmake = read(out / "CMakeLists.txt");
  EXPECT_NE(cmake.find("find_package(flashinfer_cpp REQUIRED)"), std::string::npos);
  EXPECT_NE(cmake.find("target_link_libraries(repro PRIVATE flashinfer::flashinfer)"),
            std::string::npos);
  // The data is re-saved in torch format and loads back equal.
  const NamedTensors saved = load_torch((out / "data/step1/inputs.pt").string());
  const NamedTensors orig =
      load_torch((calls_named(*dump_, "_rmsnorm_call")[0] / "inputs.pt").string());
  ASSERT_EQ(saved.size(), orig.size());
  for (std::size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(saved[i].first, orig[i].first);
    EXPECT_EQ(saved[i].second.to_double_vector(), orig[i].second.to_double_vector());
  }
  fs::remove_all(out);
}

TEST_F(Repro, AWrapperMethodBringsItsObjectsEarlierCalls) {
  const fs::path out = scratch("repro_run");
  const fs::path run = calls_named(*dump_, "Wrapper.run_call")[0];
  const auto r = run_flashinfer("repro --dir " + run.string() + " -o " + out.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string cpp = read(out / "main.cpp");
  const auto init = cpp.find("// ---- step 1 of 3: BatchDecodeWithPagedKVCacheWrapper.__init__");
  const auto plan = cpp.find("// ---- step 2 of 3: BatchDecodeWithPagedKVCacheWrapper.plan");
  const auto step3 = cpp.find("// ---- step 3 of 3: BatchDecodeWithPagedKVCacheWrapper.run");
  ASSERT_NE(init, std::string::npos) << cpp;
  ASSERT_NE(plan, std::string::npos) << cpp;
  ASSERT_NE(step3, std::string::npos) << cpp;
  EXPECT_LT(init, plan);
  EXPECT_LT(plan, step3);
  EXPECT_NE(cpp.find("repro_self = step_result;"), std::string::npos);
  EXPECT_NE(cpp.find("{\"q_data_type\", fi::Value(q_data_type)}"), std::string::npos) << cpp;
  EXPECT_NE(cpp.find("const fi::DType q_data_type = fi::DType::kFloat16;"), std::string::npos);
  EXPECT_TRUE(fs::exists(out / "data/step3/outputs.pt"));

  // The same call directory without its session: the object cannot be rebuilt.
  const fs::path alone = scratch("repro_alone");
  fs::create_directories(alone);
  fs::copy(run, alone / run.filename(), fs::copy_options::recursive);
  const auto refused = run_flashinfer("repro --dir " + (alone / run.filename()).string() + " -o " +
                                      (alone / "out").string());
  EXPECT_EQ(refused.status, 4) << refused.out;
  EXPECT_NE(refused.out.find("whose __init__ is not recorded"), std::string::npos) << refused.out;
  EXPECT_FALSE(fs::exists(alone / "out" / "main.cpp"));
  fs::remove_all(alone);
  fs::remove_all(out);
}

TEST_F(Repro, RefusesWhatIsNotACallOrNotAnOp) {
  EXPECT_EQ(run_flashinfer("repro --dir " + dump_->string() + " -o /tmp/unused_repro").status, 2);
  EXPECT_EQ(run_flashinfer("repro --dir " + dump_->string()).status, 2);  // no -o
  // A call of an op this library does not have (declared in this test process only).
  const fs::path rec = scratch("repro_user");
  start_recording(rec);
  { Scaler s(2.0); }
  recorder::stop();
  const auto r = run_flashinfer("repro --dir " + calls_named(rec, "Wrapper.__init__")[0].string() +
                                " -o " + (rec / "out").string());
  EXPECT_EQ(r.status, 4) << r.out;
  EXPECT_NE(r.out.find("ScalerWrapper.__init__ is not provided by flashinfer-cpp"),
            std::string::npos)
      << r.out;
  fs::remove_all(rec);
}

}  // namespace
}  // namespace flashinfer
