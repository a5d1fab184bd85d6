// Ring dumps in the dedup layout (FLASHINFER_DUMP_RING with FLASHINFER_DUMP_DEDUP=1,
// docs/LOGGING.md "Ring mode" / "Dedup"): each distinct tensor is written once per dump, the
// refs files are record-everything mode's, the dump replays, `flashinfer export` gives upstream's
// layout that torch.load(weights_only=True) reads, and the crash handler writes the same layout.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "flashinfer/tensor_io.h"
#include "recorder/recorder_internal.h"
#include "util/run_command.h"

namespace flashinfer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kPythonModuleMissing = 77;  // tests/formats/load_with_torch.py without torch

// A user op that reads a weight next to a new activation: y = 2 x + w[0] (w is 64 KiB, x small),
// the shape of a GEMM call in a decode step. mode 2 aborts inside the op.
Tensor ring_dedup_probe(const Tensor& x, const Tensor& w, int64_t mode);

const OpDecl& ring_dedup_probe_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "ring_dedup_probe";
    decl.module = "tests.ring_dedup";
    decl.params = {ParamDecl("x", ParamKind::kTensor), ParamDecl("w", ParamKind::kTensor),
                   ParamDecl("mode", ParamKind::kInt).def(0)};
    decl.returns = "Tensor";
    decl.invoke = [](const CallArgs& a) -> Value {
      return ring_dedup_probe(a.tensor(0), a.tensor(1), a.i64(2));
    };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

Tensor ring_dedup_probe(const Tensor& x, const Tensor& w, int64_t mode) {
  return call_api(
      &ring_dedup_probe_decl,
      [&] {
        if (mode == 2) std::abort();
        const double w0 = w.to_double_vector()[0];
        std::vector<double> v = x.to_double_vector();
        for (double& e : v) e = 2 * e + w0;
        return Tensor::from_vector(v, x.shape(), x.dtype());
      },
      x, w, mode);
}

Tensor filled(int64_t n, double v) {
  return Tensor::from_vector(std::vector<double>(static_cast<std::size_t>(n), v), {n},
                             DType::kFloat32);
}

constexpr int64_t kWeight = 16384;  // float32: 64 KiB
constexpr int64_t kAct = 256;       // float32: 1 KiB

// The i-th activation: x_i = i + 0.25, y_i = 2 i + 1, never equal to another x_j or y_j.
Tensor act(int i) { return filled(kAct, i + 0.25); }

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

class RingDedupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fi_ring_dedup_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    recorder::set_log_sink([](const std::string&) {});
  }
  void TearDown() override {
    recorder::stop();
    recorder::set_log_sink({});
    fs::remove_all(dir_);
  }
  recorder::Config config(int64_t ring, bool dedup, const fs::path& where) const {
    recorder::Config c;
    c.dump_dir = where.string();
    c.ring = ring;
    c.dedup = dedup;
    return c;
  }
  // A dump's (or a session's) call directories in call order.
  static std::vector<fs::path> calls(const fs::path& root) {
    std::vector<fs::path> out;
    for (const std::string& d : replay::list_calls(root.string())) out.emplace_back(d);
    return out;
  }
  // A call directory's metadata.jsonl, one JSON object per line, keys in the text's order.
  static std::vector<nlohmann::ordered_json> metadata_lines(const fs::path& call) {
    std::vector<nlohmann::ordered_json> out;
    std::ifstream in(call / "metadata.jsonl");
    for (std::string line; std::getline(in, line);) {
      out.push_back(nlohmann::ordered_json::parse(line));
    }
    return out;
  }
  static std::vector<std::string> keys_of(const nlohmann::ordered_json& line) {
    std::vector<std::string> out;
    for (const auto& [k, v] : line.items()) out.push_back(k);
    return out;
  }
  // {file name: size} of <root>/tensors/.
  static std::map<std::string, uint64_t> blobs(const fs::path& root) {
    std::map<std::string, uint64_t> out;
    if (!fs::exists(root / "tensors")) return out;
    for (const auto& e : fs::directory_iterator(root / "tensors")) {
      out[e.path().filename().string()] = e.file_size();
    }
    return out;
  }
  fs::path dir_;
};

TEST_F(RingDedupTest, EachDistinctTensorIsWrittenOncePerDump) {
  Tensor w = filled(kWeight, 0.5);
  std::vector<Tensor> xs;
  for (int i = 1; i <= 6; ++i) xs.push_back(act(i));
  // The same six calls, recorded by the ring in the dedup layout and by record-everything
  // mode's dedup store: the refs files must be the same text.
  recorder::start(config(8, true, dir_ / "ring"));
  for (const Tensor& x : xs) ring_dedup_probe(x, w, 0);
  const fs::path root = recorder::dump_ring("dedup");
  recorder::stop();
  recorder::start(config(0, true, dir_ / "all"));
  for (const Tensor& x : xs) ring_dedup_probe(x, w, 0);
  recorder::stop();

  ASSERT_FALSE(root.empty());
  const auto c = calls(root);
  ASSERT_EQ(c.size(), 6u);
  // The weight held by six kept calls is one blob; six activations and six outputs are twelve.
  const auto b = blobs(root);
  EXPECT_EQ(b.size(), 13u);
  uint64_t bytes = 0, weights = 0;
  for (const auto& [name, size] : b) {
    EXPECT_EQ(name.size(), 36u) << name;  // <32 hex>.bin
    bytes += size;
    weights += size == kWeight * 4 ? 1 : 0;
  }
  EXPECT_EQ(weights, 1u);
  EXPECT_EQ(bytes, kWeight * 4 + 12u * kAct * 4);
  // Everything the dump holds: the distinct tensor bytes plus records, refs and trigger.json.
  uint64_t on_disk = 0;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) on_disk += e.file_size();
    EXPECT_NE(e.path().extension(), ".pt") << e.path();
  }
  EXPECT_LT(on_disk, bytes + 6 * 8192u);
  EXPECT_TRUE(fs::exists(root / "trigger.json"));

  const auto all = calls(dir_ / "all");
  ASSERT_EQ(all.size(), 6u);
  for (std::size_t k = 0; k < 6; ++k) {
    // Both lines say where the tensors are, as record-everything mode's dedup records do: the
    // same keys in the same order, "tensor_store" last.
    const auto ring_lines = metadata_lines(c[k]), all_lines = metadata_lines(all[k]);
    ASSERT_EQ(ring_lines.size(), 2u);
    ASSERT_EQ(all_lines.size(), 2u);
    for (std::size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(ring_lines[i]["tensor_store"], "dedup") << c[k] << " line " << i + 1;
      EXPECT_EQ(keys_of(ring_lines[i]), keys_of(all_lines[i])) << c[k] << " line " << i + 1;
      EXPECT_EQ(keys_of(ring_lines[i]).back(), "tensor_store");
    }
    for (const char* f : {"inputs.refs.json", "outputs.refs.json"}) {
      ASSERT_TRUE(fs::exists(c[k] / f)) << c[k] / f;
      EXPECT_EQ(read_file(c[k] / f), read_file(all[k] / f)) << f;
    }
    const NamedTensors in = replay::load_recorded_call(c[k].string()).inputs;
    ASSERT_EQ(in.size(), 2u);
    EXPECT_EQ(in[0].second.to_double_vector(), xs[k].to_double_vector());
    EXPECT_EQ(in[1].second.to_double_vector()[kWeight - 1], 0.5);
  }
  // The blobs are record-everything mode's too (the same names for the same contents).
  EXPECT_EQ(blobs(root), blobs(dir_ / "all"));
  for (const auto& r : replay::replay_sequence(root.string())) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.dump_dir << " " << r.error;
  }

  const auto show = testing::run_flashinfer("show " + root.string());
  EXPECT_NE(show.out.find("Tensor store (FLASHINFER_DUMP_DEDUP): 13 distinct tensors"),
            std::string::npos)
      << show.out;
  // flashinfer diff of the ring dump against record-everything mode's: the same calls.
  const auto diff =
      testing::run_flashinfer("diff " + root.string() + " " + (dir_ / "all").string());
  EXPECT_EQ(diff.status, 0) << diff.out;

  // flashinfer export: upstream's layout, read by torch.load(weights_only=True).
  const fs::path out = dir_ / "export";
  const auto r =
      testing::run_flashinfer("export --dir " + root.string() + " --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Exported 6 calls"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("12 tensor files expanded"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out / "tensors"));
  EXPECT_TRUE(fs::exists(out / "trigger.json"));
  std::string files;
  std::vector<fs::path> pts;
  for (const fs::path& d : calls(out)) {
    for (const char* f : {"inputs.pt", "outputs.pt"}) {
      ASSERT_TRUE(fs::exists(d / f)) << d / f;
      EXPECT_FALSE(fs::exists(d / (std::string(f, std::strlen(f) - 3) + ".refs.json")));
      pts.push_back(d / f);
      files += " " + (d / f).string();
    }
  }
  ASSERT_EQ(pts.size(), 12u);
  for (const auto& rr : replay::replay_sequence(out.string())) {
    EXPECT_EQ(rr.status, replay::Status::kPassed) << rr.dump_dir << " " << rr.error;
  }
  const auto py = testing::run_command("/usr/bin/python3 " + FLASHINFER_TEST_SOURCE_DIR +
                                       "/tests/formats/load_with_torch.py" + files);
  if (py.status == kPythonModuleMissing) {
    GTEST_SKIP() << "python3-torch not installed (scripts/bootstrap installs it)";
  }
  ASSERT_EQ(py.status, 0) << py.out;
  const json j = json::parse(py.out);
  for (std::size_t k = 0; k < 6; ++k) {
    const json& in = j.at(pts[2 * k].string());
    EXPECT_EQ(in["arg_0"]["values"], json(xs[k].to_double_vector()));
    EXPECT_EQ(in["arg_1"]["shape"], json({kWeight}));
    EXPECT_EQ(in["arg_1"]["values"][0], 0.5);
    EXPECT_EQ(j.at(pts[2 * k + 1].string())["result"]["values"][0], 2 * (k + 1.25) + 0.5);
  }
}

// Without FLASHINFER_DUMP_DEDUP the ring dump stays upstream's layout.
TEST_F(RingDedupTest, WithoutDedupTheDumpIsUpstreamsLayout) {
  recorder::start(config(4, false, dir_));
  Tensor w = filled(kWeight, 0.5);
  for (int i = 1; i <= 2; ++i) ring_dedup_probe(act(i), w, 0);
  const fs::path root = recorder::dump_ring("plain");
  const auto c = calls(root);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_FALSE(fs::exists(root / "tensors"));
  EXPECT_TRUE(fs::exists(c[0] / "inputs.pt"));
  EXPECT_FALSE(fs::exists(c[0] / "inputs.refs.json"));
  for (const auto& line : metadata_lines(c[0])) EXPECT_FALSE(line.contains("tensor_store"));
}

// The crash handler (abort in a user-declared op) writes the dedup layout too.
TEST_F(RingDedupTest, TheCrashHandlerWritesTheDedupLayout) {
  ring_dedup_probe_decl();  // registered here too: this process replays the child's calls
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    recorder::start(config(8, true, dir_));
    Tensor w = filled(kWeight, 0.5);
    for (int i = 1; i <= 3; ++i) ring_dedup_probe(act(i), w, 0);
    std::vector<double> ramp(kAct);
    for (int64_t k = 0; k < kAct; ++k) ramp[static_cast<std::size_t>(k)] = 1.0 + k;
    rmsnorm(Tensor::from_vector(ramp, {1, kAct}, DType::kFloat32), filled(kAct, 0.75));
    ring_dedup_probe(act(6), w.slice(0, 0, kAct), 0);  // a view of the weight: its own blob
    ring_dedup_probe(act(5), w, 2);                    // abort() inside the op
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGABRT);
  fs::path root;
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.path().filename().string().ends_with("_crash")) root = e.path();
  }
  ASSERT_FALSE(root.empty());
  const json t = json::parse(read_file(root / "trigger.json"));
  EXPECT_EQ(t["signal_name"], "SIGABRT");
  EXPECT_EQ(t["triggering_call"]["function_name"], "ring_dedup_probe");
  const auto c = calls(root);
  ASSERT_EQ(c.size(), 6u);
  // The crashed call: line 1 and its inputs (the weight's blob again: not written twice).
  EXPECT_TRUE(fs::exists(c[5] / "inputs.refs.json"));
  EXPECT_FALSE(fs::exists(c[5] / "outputs.refs.json"));
  // The crash handler's records carry the dedup layout's key too.
  for (const auto& line : metadata_lines(c[5])) EXPECT_EQ(line["tensor_store"], "dedup");
  EXPECT_EQ(replay::load_recorded_call(c[5].string()).inputs[0].second.to_double_vector()[0], 5.25);
  // w; x1..x3, y1..y3; rmsnorm's input, weight and output; the first 1 KiB of w (the span the
  // view covers), x6, y6; x5. Each once.
  const auto b = blobs(root);
  EXPECT_EQ(b.size(), 14u);
  uint64_t bytes = 0;
  for (const auto& [name, size] : b) bytes += size;
  EXPECT_EQ(bytes, kWeight * 4 + 13u * kAct * 4);
  const auto r =
      testing::run_flashinfer("replay --dir " + root.string() + " --exclude ring_dedup_probe");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Summary: 1 passed, 0 failed/mismatch"), std::string::npos) << r.out;
  // The completed calls, one by one (the crashed one would abort this process again).
  for (std::size_t k = 0; k < 5; ++k) {
    const replay::Result rr = replay::replay_from_dump(c[k].string());
    EXPECT_EQ(rr.status, replay::Status::kPassed) << rr.dump_dir << " " << rr.error;
  }
}

}  // namespace
}  // namespace flashinfer
