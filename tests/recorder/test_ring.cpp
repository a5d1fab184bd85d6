// The flight recorder's ring mode (FLASHINFER_DUMP_RING), its triggers (crash, SIGUSR1, NaN,
// flashinfer::Error, dump_ring), dedup mode (FLASHINFER_DUMP_DEDUP) and `flashinfer export`.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/settings.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "flashinfer/tensor_io.h"
#include "recorder/python_json.h"
#include "recorder/record_json.h"
#include "recorder/recorder_internal.h"
#include "recorder/ring.h"
#include "util/crash_handler.h"
#include "util/run_command.h"

namespace flashinfer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- user ops: one that doubles its input (or throws / aborts on request) ----
Tensor ring_probe(const Tensor& x, int64_t mode);

// Memory a test makes unreadable before a call; ring_probe makes it readable again before it
// reads its input, so a ring hook reading it before the op runs would crash the test.
struct RingGuard {
  void* at = nullptr;
  std::size_t bytes = 0;
};
RingGuard ring_guard;

const OpDecl& ring_probe_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "ring_probe";
    decl.module = "tests.ring";
    decl.params = {ParamDecl("x", ParamKind::kTensor), ParamDecl("mode", ParamKind::kInt).def(0)};
    decl.returns = "Tensor";
    decl.invoke = [](const CallArgs& a) -> Value { return ring_probe(a.tensor(0), a.i64(1)); };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

Tensor ring_probe(const Tensor& x, int64_t mode) {
  return call_api(
      &ring_probe_decl,
      [&] {
        if (ring_guard.at) ::mprotect(ring_guard.at, ring_guard.bytes, PROT_READ | PROT_WRITE);
        if (mode == 1) throw Error(ErrorCode::kInvalidArgument, "ring_probe", "mode", "asked to");
        if (mode == 2) std::abort();
        std::vector<double> v = x.to_double_vector();
        for (double& e : v) e *= 2;
        return Tensor::from_vector(v, x.shape(), x.dtype());
      },
      x, mode);
}

// A user op that sets element i of a float32 x to v in place (x is declared written).
void ring_poke_(const Tensor& x, int64_t i, double v);

const OpDecl& ring_poke_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "ring_poke_";
    decl.module = "tests.ring";
    decl.params = {ParamDecl("x", ParamKind::kTensor), ParamDecl("i", ParamKind::kInt),
                   ParamDecl("v", ParamKind::kFloat)};
    decl.params[0].mutated = true;
    decl.returns = "None";
    decl.invoke = [](const CallArgs& a) -> Value {
      ring_poke_(a.tensor(0), a.i64(1), a.f64(2));
      return Value();
    };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

void ring_poke_(const Tensor& x, int64_t i, double v) {
  call_api(
      &ring_poke_decl, [&] { static_cast<float*>(x.data_ptr())[i] = static_cast<float>(v); }, x, i,
      v);
}

// A user op that writes v into every element of a float32 `out` and returns it (upstream's
// out= pattern: the result is the written argument).
Tensor ring_fill_out(const Tensor& out, double v);

const OpDecl& ring_fill_out_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "ring_fill_out";
    decl.module = "tests.ring";
    decl.params = {ParamDecl("out", ParamKind::kTensor), ParamDecl("v", ParamKind::kFloat)};
    decl.params[0].mutated = true;
    decl.returns = "Tensor";
    decl.invoke = [](const CallArgs& a) -> Value { return ring_fill_out(a.tensor(0), a.f64(1)); };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

Tensor ring_fill_out(const Tensor& out, double v) {
  return call_api(
      &ring_fill_out_decl,
      [&] {
        auto* p = static_cast<float*>(out.data_ptr());
        for (int64_t k = 0; k < out.numel(); ++k) p[k] = static_cast<float>(v);
        return out;
      },
      out, v);
}

Tensor filled(int64_t n, double v) {
  return Tensor::from_vector(std::vector<double>(static_cast<std::size_t>(n), v), {n},
                             DType::kFloat32);
}

// One row of n values: an rmsnorm input.
Tensor row(int64_t n, double v) { return filled(n, v).view({1, n}); }

class RingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fi_ring_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    recorder::set_log_sink([](const std::string&) {});
  }
  void TearDown() override {
    recorder::stop();
    recorder::set_log_sink({});
    fs::remove_all(dir_);
  }
  recorder::Config config(int64_t ring) const {
    recorder::Config c;
    c.dump_dir = dir_.string();
    c.ring = ring;
    return c;
  }
  // The ring dumps under dir_, oldest first.
  std::vector<fs::path> dumps() const {
    std::vector<fs::path> out;
    if (!fs::exists(dir_)) return out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().filename().string().starts_with("ring_")) out.push_back(e.path());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  // A dump's call directories in call order (process_sequence: names sort by timestamp, then
  // by function name within one millisecond).
  static std::vector<fs::path> calls(const fs::path& root) {
    std::vector<std::pair<int64_t, fs::path>> seq;
    for (const auto& e : fs::directory_iterator(root)) {
      if (!e.is_directory()) continue;
      std::ifstream f(e.path() / "metadata.jsonl");
      std::string l;
      std::getline(f, l);
      seq.emplace_back(json::parse(l)["process_sequence"].get<int64_t>(), e.path());
    }
    std::sort(seq.begin(), seq.end());
    std::vector<fs::path> out;
    for (auto& [k, p] : seq) out.push_back(p);
    return out;
  }
  // The values of the first tensor in archive `file` (inputs.pt, outputs.pt, ...) of a dumped
  // call's directory.
  static std::vector<double> values(const fs::path& call, const std::string& file) {
    return load_torch((call / file).string())[0].second.to_double_vector();
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
  static json trigger(const fs::path& root) {
    std::ifstream f(root / "trigger.json");
    return json::parse(f);
  }
  fs::path dir_;
};

TEST_F(RingTest, SettingsParseRingTriggerAndDedup) {
  std::map<std::string, std::string> env = {{"FLASHINFER_DUMP_RING", "64"},
                                            {"FLASHINFER_DUMP_RING_MB", "2_048"},
                                            {"FLASHINFER_DUMP_TRIGGER", "nan, signal,bogus,exit"},
                                            {"FLASHINFER_DUMP_DEDUP", "1"}};
  auto lookup = [&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  detail::Settings s = detail::parse_settings(lookup);
  EXPECT_EQ(s.dump_ring, 64);
  EXPECT_EQ(s.dump_ring_mb, 2048);
  EXPECT_EQ(s.dump_trigger, (std::vector<std::string>{"nan", "signal", "exit"}));
  EXPECT_TRUE(s.dump_dedup);
  ASSERT_NE(s.problem("FLASHINFER_DUMP_TRIGGER"), nullptr);
  EXPECT_NE(s.problem("FLASHINFER_DUMP_TRIGGER")->message.find("'bogus'"), std::string::npos);
  env = {{"FLASHINFER_DUMP_RING", "-3"}};
  s = detail::parse_settings(lookup);
  EXPECT_EQ(s.dump_ring, 0);
  EXPECT_NE(s.problem("FLASHINFER_DUMP_RING"), nullptr);
  EXPECT_EQ(s.dump_trigger, (std::vector<std::string>{"crash", "signal", "nan", "error"}));
  EXPECT_EQ(s.dump_ring_mb, 1024);
  EXPECT_FALSE(s.dump_dedup);
  EXPECT_FALSE(s.dump_ring_verify_full);
  env = {{"FLASHINFER_DUMP_RING_VERIFY", "full"}};
  EXPECT_TRUE(detail::parse_settings(lookup).dump_ring_verify_full);
  EXPECT_TRUE(recorder::config_from(detail::parse_settings(lookup)).ring_verify_full);
  env = {{"FLASHINFER_DUMP_RING_VERIFY", "always"}};
  s = detail::parse_settings(lookup);
  EXPECT_FALSE(s.dump_ring_verify_full);
  EXPECT_NE(s.problem("FLASHINFER_DUMP_RING_VERIFY"), nullptr);
  const recorder::Config c = recorder::config_from(s);
  EXPECT_EQ(c.ring, 0);
  EXPECT_EQ(c.ring_mb, 1024);
}

TEST_F(RingTest, KeepsTheLastNCallsAndWritesNothingUntilDumped) {
  recorder::start(config(3));
  Tensor w = filled(8, 1.0);
  for (int i = 1; i <= 5; ++i) {
    rmsnorm(row(8, i), w);
  }
  EXPECT_FALSE(fs::exists(dir_)) << "ring mode wrote before a trigger";
  EXPECT_EQ(recorder::stats().ring_calls, 3);
  const std::string root = recorder::dump_ring("manual check");
  ASSERT_FALSE(root.empty());
  EXPECT_EQ(fs::path(root).filename().string(),
            "ring_pid" + std::to_string(::getpid()) + "_dump0001_manual_check");
  const auto c = calls(root);
  ASSERT_EQ(c.size(), 3u);
  const auto session = lines(fs::path(root) / "session.jsonl");
  ASSERT_EQ(session.size(), 6u);
  for (std::size_t k = 0; k < 3; ++k) {
    const auto meta = lines(c[k] / "metadata.jsonl");
    ASSERT_EQ(meta.size(), 2u);
    EXPECT_EQ(meta[0]["execution_status"], "inputs_saved");
    EXPECT_EQ(meta[1]["execution_status"], "completed");
    EXPECT_EQ(meta[1]["call_sequence"], static_cast<int>(k) + 3);
    EXPECT_EQ(meta[1]["dump_dir"], c[k].string());
    EXPECT_EQ(meta[1]["tensor_format"], "torch");
    // Upstream's keys, in upstream's order, then this library's two.
    std::vector<std::string> keys;
    for (auto it = meta[1].begin(); it != meta[1].end(); ++it) keys.push_back(it.key());
    const std::vector<std::string> want = {
        "backend",        "call_sequence",      "dump_dir",      "execution_status",
        "function_name",  "function_signature", "graph_capture", "input_metadata",
        "module",         "output_metadata",    "process_id",    "process_sequence",
        "tensor_details", "tensor_format",      "tensor_info",   "timestamp",
        "versions"};
    EXPECT_EQ(keys, want);  // nlohmann::json sorts keys
    const NamedTensors in = load_torch((c[k] / "inputs.pt").string());
    ASSERT_EQ(in.size(), 2u);
    EXPECT_EQ(in[0].second.to_double_vector(), std::vector<double>(8, k + 3.0));
    // Byte for byte what save_torch (checked with torch.load(weights_only=True) in
    // test_tensor_io) writes for the same tensors.
    const fs::path again = dir_ / "cmp" / "inputs.pt";
    fs::create_directories(again.parent_path());
    save_torch(again.string(), {{"arg_0", row(8, k + 3.0)}, {"arg_1", w}});
    std::ifstream a(c[k] / "inputs.pt", std::ios::binary), b(again, std::ios::binary);
    const std::string ab((std::istreambuf_iterator<char>(a)), {});
    const std::string bb((std::istreambuf_iterator<char>(b)), {});
    EXPECT_EQ(ab.size(), bb.size());
    EXPECT_TRUE(ab == bb) << "ring archive differs from save_torch's";
  }
  const json t = trigger(root);
  EXPECT_EQ(t["reason"], "manual_check");
  EXPECT_TRUE(t["triggering_call"].is_null());
  EXPECT_EQ(t["calls"], 3);
  for (const auto& r : replay::replay_sequence(root)) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.dump_dir << " " << r.error;
  }
  // A second dump is a new directory.
  EXPECT_NE(recorder::dump_ring("again"), root);
}

// A call kept at its begin (no capture asked about: no CUDA argument) whose result turns out to
// be device memory written under a capture (MoeAlltoAll's workspace views): its outputs are not
// copied (that would break the capture; the values exist once the graph runs), so the call stays
// with its inputs only. Driven through the capture probe: no capture at the begin, one at the end.
TEST_F(RingTest, ACallWhoseResultIsWrittenUnderACaptureKeepsItsInputsOnly) {
  recorder::start(config(4));
  int asked = 0;
  recorder::set_capture_probe([&asked] { return asked++ > 0; });
  ring_probe(filled(4, 3.0), 0);
  recorder::set_capture_probe({});
  EXPECT_EQ(asked, 2);  // begin and end
  ring_probe(filled(4, 5.0), 0);
  const std::string root = recorder::dump_ring("manual");
  const auto c = calls(root);
  ASSERT_EQ(c.size(), 2u);
  const auto first = lines(c[0] / "metadata.jsonl");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0]["execution_status"], "inputs_saved");
  EXPECT_EQ(load_torch((c[0] / "inputs.pt").string())[0].second.to_double_vector(),
            std::vector<double>(4, 3.0));
  EXPECT_FALSE(fs::exists(c[0] / "outputs.pt"));
  const auto second = lines(c[1] / "metadata.jsonl");
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[1]["execution_status"], "completed");
}

// Such a call's writes are still seen: a CPU tensor it wrote in place (between the sampled words,
// so the fingerprint alone would miss it) is kept anew by the next call, not shared stale.
TEST_F(RingTest, ACallWhoseResultIsWrittenUnderACaptureHasItsWritesSeen) {
  recorder::start(config(8));
  Tensor w = filled(16384, 0.5);
  ring_probe(w, 0);
  int asked = 0;
  recorder::set_capture_probe([&asked] { return asked++ > 0; });
  ring_poke_(w, 1001, 1.5);
  recorder::set_capture_probe({});
  ring_probe(w, 0);
  const auto c = calls(recorder::dump_ring("manual"));
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(values(c[0], "inputs.pt")[1001], 0.5);
  EXPECT_EQ(lines(c[1] / "metadata.jsonl").size(), 1u);  // inputs only
  EXPECT_EQ(values(c[2], "inputs.pt")[1001], 1.5);
}

TEST_F(RingTest, UnchangedTensorsAreHeldOnceAndChangesAreSeen) {
  for (const bool full : {false, true}) {
    SCOPED_TRACE(full ? "verify=full" : "verify=sampled");
    recorder::Config cfg = config(8);
    cfg.ring_verify_full = full;
    recorder::start(cfg);
    Tensor w = filled(16384, 0.5);  // 64 KiB, passed on every call
    std::vector<Tensor> outs;       // kept alive: freed memory may come back at one address
    for (int i = 0; i < 6; ++i) outs.push_back(ring_probe(w, 0));
    // The weight is held once. Six outputs of equal content are one blob when contents are
    // hashed (full), six when spans are tracked (sampled: six allocations).
    EXPECT_EQ(recorder::stats().ring_bytes, (full ? 2u : 7u) * 65536u);
    // Written in place between calls (outside the library): the next call keeps the new
    // content, found by the sampled fingerprint (every sampled word changed).
    w.fill_(3.0);
    ring_probe(w, 0);
    EXPECT_EQ(recorder::stats().ring_bytes, (full ? 4u : 9u) * 65536u);
    const std::string root = recorder::dump_ring(full ? "full" : "sampled");
    const auto c = calls(root);
    ASSERT_EQ(c.size(), 7u);
    EXPECT_EQ(values(c[5], "inputs.pt")[0], 0.5);
    EXPECT_EQ(values(c[6], "inputs.pt")[0], 3.0);
    EXPECT_EQ(values(c[6], "outputs.pt")[0], 6.0);
    recorder::stop();
  }
}

TEST_F(RingTest, ATensorWrittenByALibraryOpIsKeptAnew) {
  for (const bool excluded : {false, true}) {
    SCOPED_TRACE(excluded ? "ring_poke_ excluded" : "ring_poke_ kept");
    recorder::Config cfg = config(8);
    if (excluded) cfg.exclude = {"ring_poke_"};  // a call not kept still has its writes seen
    recorder::start(cfg);
    Tensor w = filled(16384, 0.5);
    const Tensor y1 = ring_probe(w, 0);
    // The output of a kept call passed on as the next input is the same span: shared.
    const Tensor y2 = ring_probe(y1, 0);
    EXPECT_EQ(recorder::stats().ring_bytes, 3u * 65536u);
    // A library op writes one element of w in place, between the sampled words (byte 4004),
    // so the fingerprint alone would not see it: the op's declared write does. Kept, its
    // input is the kept w (shared) and its mutated side new bytes.
    ring_poke_(w, 1001, 1.5);
    EXPECT_EQ(recorder::stats().ring_bytes, (excluded ? 3u : 4u) * 65536u);
    // w as poke_ left it: shared with poke_'s mutated side, or new when poke_ was not kept.
    ring_probe(w, 0);
    EXPECT_EQ(recorder::stats().ring_bytes, 5u * 65536u);
    const auto c = calls(recorder::dump_ring(excluded ? "excluded" : "kept"));
    ASSERT_EQ(c.size(), excluded ? 3u : 4u);
    auto at = [&](std::size_t call, const char* file) { return values(c[call], file)[1001]; };
    EXPECT_EQ(at(0, "inputs.pt"), 0.5);
    if (!excluded) {
      EXPECT_EQ(at(2, "inputs.pt"), 0.5);
      EXPECT_EQ(at(2, "mutated.pt"), 1.5);
    }
    EXPECT_EQ(at(c.size() - 1, "inputs.pt"), 1.5);
    recorder::stop();
  }
}

// A library write to a small view far inside a large kept span (spans are indexed by size
// class; the write must still reach the large span's class): the next call keeps new bytes.
TEST_F(RingTest, ALibraryWriteToASmallViewInsideALargeKeptSpanIsSeen) {
  recorder::start(config(8));
  Tensor w = filled(262144, 0.5);  // 1 MiB
  ring_probe(w, 0);
  const uint64_t before = recorder::stats().ring_bytes;
  // Element 200000 + 17 of w, written through a 64-element view (256 bytes, 800 KB in).
  ring_poke_(w.slice(0, 200000, 200064), 17, 2.5);
  ring_probe(w, 0);
  EXPECT_GT(recorder::stats().ring_bytes, before + 1048576u);  // w kept again
  const auto c = calls(recorder::dump_ring("view"));
  ASSERT_EQ(c.size(), 3u);
  auto at = [&](std::size_t call) { return values(c[call], "inputs.pt")[200017]; };
  EXPECT_EQ(at(0), 0.5);
  EXPECT_EQ(at(2), 2.5);
  recorder::stop();
}

// A library write is counted in the storage written through (Storage::write_count), and the
// kept spans it overlaps are looked for only when a storage that does not own its memory
// (from_blob) is involved: memory wrapped twice must still see writes through either wrapper.
// Element 1001 (byte 4004) lies between the sampled words, so only the write's notice can
// make the next call keep the new bytes.
TEST_F(RingTest, AWriteThroughAnotherStorageOfTheSameMemoryIsSeen) {
  for (const bool through_wrapper : {true, false}) {
    SCOPED_TRACE(through_wrapper ? "kept owner, written through a wrapper"
                                 : "kept wrapper, written through the owner");
    recorder::start(config(8));
    // 128 KiB allocated by the library, and its first half wrapped: two spans, two storages.
    Tensor owner = filled(32768, 0.5);
    Tensor wrapper =
        Tensor::from_blob(owner.data_ptr(), {16384}, {}, DType::kFloat32, Device::cpu());
    ASSERT_TRUE(owner.storage()->owns_memory());
    ASSERT_FALSE(wrapper.storage()->owns_memory());
    const Tensor& kept = through_wrapper ? owner : wrapper;
    const Tensor& written = through_wrapper ? wrapper : owner;
    ring_probe(kept, 0);
    ring_probe(kept, 0);  // shared: the span is kept once
    ring_poke_(written, 1001, 1.5);
    ring_probe(kept, 0);
    const auto c = calls(recorder::dump_ring(through_wrapper ? "wrapper" : "owner"));
    ASSERT_EQ(c.size(), 4u);
    auto at = [&](std::size_t call) { return values(c[call], "inputs.pt")[1001]; };
    EXPECT_EQ(at(1), 0.5);
    EXPECT_EQ(at(3), 1.5);
    recorder::stop();
  }
}

// A strided view whose span lies inside a kept span of its storage (the q and k of a fused qkv
// output) shares the kept copy instead of being copied again; a library write to the storage
// still makes the next call keep new bytes.
TEST_F(RingTest, AViewInsideAKeptTensorSharesItsCopy) {
  recorder::start(config(8));
  std::vector<double> v(8192);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  const Tensor x = Tensor::from_vector(v, {8192}, DType::kFloat32);
  const Tensor y = ring_probe(x, 0);  // 2 * x, 32 KiB, kept as the call's output
  // Rows of 128, the first 96 columns: a span of 32640 bytes inside y's.
  const Tensor q = y.view({64, 128}).slice(1, 0, 96);
  const uint64_t before = recorder::stats().ring_bytes;
  const Tensor q2 = ring_probe(q, 0);
  // Only the new output (64 x 96 floats) was added: the input is y's kept copy.
  EXPECT_EQ(recorder::stats().ring_bytes, before + 64u * 96u * 4u);
  ring_poke_(y, 5, -1.0);
  const Tensor q3 = ring_probe(q, 0);
  const auto c = calls(recorder::dump_ring("view"));
  ASSERT_EQ(c.size(), 4u);
  const auto input = [&](std::size_t call) { return values(c[call], "inputs.pt"); };
  const std::vector<double> first = input(1), after = input(3);
  ASSERT_EQ(first.size(), 64u * 96u);
  for (const auto& [i, j] : {std::pair{0, 0}, {0, 5}, {1, 0}, {63, 95}}) {
    EXPECT_EQ(first[static_cast<std::size_t>(i * 96 + j)], 2.0 * (i * 128 + j)) << i << "," << j;
  }
  EXPECT_EQ(after[5], -1.0);
  EXPECT_EQ(after[96], 256.0);  // q[1][0] = y[128]
}

// Writes are counted per storage, not per span: a library write to one view of a storage
// makes the next call keep its other, untouched views anew too (a copy more, never a stale
// one), and a storage nobody writes keeps being shared.
TEST_F(RingTest, AWriteToOneViewOfAStorageRenewsItsOtherViews) {
  recorder::start(config(8));
  Tensor both = filled(32768, 0.5);  // two 64 KiB halves of one storage
  const Tensor a = both.slice(0, 0, 16384), b = both.slice(0, 16384, 32768);
  const Tensor other = filled(16384, 0.25);
  std::vector<Tensor> outs;  // kept alive: no output address comes back
  for (const Tensor* t : {&a, &b, &other}) outs.push_back(ring_probe(*t, 0));
  EXPECT_EQ(recorder::stats().ring_bytes, 6u * 65536u);
  ring_poke_(a, 3, 2.0);  // a shared as its input, kept anew as written
  EXPECT_EQ(recorder::stats().ring_bytes, 7u * 65536u);
  outs.push_back(ring_probe(b, 0));      // b kept anew
  outs.push_back(ring_probe(other, 0));  // shared
  EXPECT_EQ(recorder::stats().ring_bytes, 10u * 65536u);
  const auto c = calls(recorder::dump_ring("views"));
  ASSERT_EQ(c.size(), 6u);
  EXPECT_EQ(values(c[4], "inputs.pt")[3], 0.5);
  EXPECT_EQ(values(c[4], "outputs.pt")[3], 1.0);
}

TEST_F(RingTest, AWriteOutsideTheLibraryBetweenSampledBytesNeedsVerifyFull) {
  // A large tensor changed in one element that the sampled fingerprint does not read (not in
  // the first or last 64 bytes, not one of the evenly spread words): sampled mode shares the
  // stale bytes (its documented limit); verify=full keeps the new content.
  for (const bool full : {false, true}) {
    SCOPED_TRACE(full ? "verify=full" : "verify=sampled");
    recorder::Config cfg = config(8);
    cfg.ring_verify_full = full;
    recorder::start(cfg);
    Tensor w = filled(16384, 0.5);
    ring_probe(w, 0);
    static_cast<float*>(w.data_ptr())[1001] = 7.0f;  // byte 4004: between samples
    ring_probe(w, 0);
    const auto c = calls(recorder::dump_ring(full ? "full" : "sampled"));
    ASSERT_EQ(c.size(), 2u);
    const double seen = values(c[1], "inputs.pt")[1001];
    EXPECT_EQ(seen, full ? 7.0 : 0.5);
    // A write that reaches a sampled word is seen in both modes.
    static_cast<float*>(w.data_ptr())[0] = -1.0f;
    ring_probe(w, 0);
    const auto c2 = calls(recorder::dump_ring(full ? "full2" : "sampled2"));
    ASSERT_EQ(c2.size(), 3u);
    const auto v = values(c2[2], "inputs.pt");
    EXPECT_EQ(v[0], -1.0);
    EXPECT_EQ(v[1001], 7.0);
    recorder::stop();
  }
}

TEST_F(RingTest, AWriteOutsideTheLibraryToASampledWordIsSeenAtTheEighthShare) {
  // Above 4 KiB, sampled mode compares a span's first and last 64 bytes with the kept copy on
  // every share, and its 64 sampled words on every 8th share of the kept copy only: a write
  // outside the library that reaches a sampled word but neither edge is seen by the 8th call
  // that would share the copy; the 7 before it share the earlier bytes (docs/LOGGING.md).
  recorder::start(config(16));
  Tensor w = filled(16384, 0.5);  // 65536 bytes: samples every (65536 - 8) / 63 = 1040 bytes
  ring_probe(w, 0);               // kept: the copy's share count starts at 0
  static_cast<float*>(w.data_ptr())[8320] = 7.0f;  // byte 33280 = sample 32, in no edge
  for (int i = 0; i < 8; ++i) ring_probe(w, 0);
  const auto c = calls(recorder::dump_ring("sampled_word"));
  ASSERT_EQ(c.size(), 9u);
  for (std::size_t k = 0; k < c.size(); ++k) {
    const double seen = values(c[k], "inputs.pt")[8320];
    EXPECT_EQ(seen, k == 8 ? 7.0 : 0.5) << "call " << k;
  }
  recorder::stop();
}

TEST_F(RingTest, WritesOutsideTheLibraryAreSeenAfterTheComparedBytesAreSetAside) {
  // From the first sampled comparison of a large kept copy on, the compared bytes (edges and
  // samples) are read from a small array made from the copy, not from the copy's pages: the
  // same bytes, so an edge written afterwards is seen at the next share and a sampled word at
  // the next 8th share, as before.
  recorder::start(config(32));
  Tensor w = filled(16384, 0.5);
  float* p = static_cast<float*>(w.data_ptr());
  ring_probe(w, 0);                              // call 0: kept
  for (int i = 0; i < 8; ++i) ring_probe(w, 0);  // calls 1-8: shares 1-8, the 8th sampled
  p[3] = 9.0f;                                   // in the first 64 bytes
  ring_probe(w, 0);                              // call 9: seen, kept anew
  for (int i = 0; i < 8; ++i) ring_probe(w, 0);  // calls 10-17: shares 1-8 of the new copy
  p[8320] = 7.0f;                                // sample 32
  for (int i = 0; i < 8; ++i) ring_probe(w, 0);  // calls 18-25: the 8th (share 16) sees it
  const auto c = calls(recorder::dump_ring("set_aside"));
  ASSERT_EQ(c.size(), 26u);
  for (std::size_t k = 0; k < c.size(); ++k) {
    const auto v = values(c[k], "inputs.pt");
    EXPECT_EQ(v[3], k >= 9 ? 9.0 : 0.5) << "call " << k;
    EXPECT_EQ(v[8320], k == 25 ? 7.0 : 0.5) << "call " << k;
  }
  recorder::stop();
}

TEST_F(RingTest, HookTimeIsCountedInRingModeOnly) {
  // ring_hook_seconds() (the benchmarks' gauge of the hooks' cost) grows with every call kept
  // in ring mode, and not with calls made while no ring recorder observes them.
  Tensor w = filled(4096, 0.5);
  const double before = recorder::internal::ring_hook_seconds();
  for (int i = 0; i < 50; ++i) ring_probe(w, 0);
  EXPECT_EQ(recorder::internal::ring_hook_seconds(), before);
  recorder::start(config(8));
  const double t0 = recorder::internal::ring_hook_seconds();
  for (int i = 0; i < 50; ++i) ring_probe(w, 0);
  const double t1 = recorder::internal::ring_hook_seconds();
  recorder::stop();
  EXPECT_GT(t1, t0);
  EXPECT_LT(t1 - t0, 5.0);  // seconds: a sum of hook durations, not a timestamp
}

TEST_F(RingTest, AResultThatIsAlsoAWrittenArgumentIsKeptOnce) {
  // The outputs and written arguments are kept right after the call's writes are noted: the
  // result (the written `out` itself) and the mutated `out` are one span, held once.
  recorder::start(config(8));
  Tensor out = filled(16384, 0.5);  // 64 KiB
  ring_fill_out(out, 2.0);
  // Its input (0.5) and one blob for both the result and the written argument (2.0).
  EXPECT_EQ(recorder::stats().ring_bytes, 2u * 65536u);
  const auto c = calls(recorder::dump_ring("out"));
  ASSERT_EQ(c.size(), 1u);
  auto first = [&](const char* file) { return values(c[0], file)[0]; };
  EXPECT_EQ(first("inputs.pt"), 0.5);
  EXPECT_EQ(first("outputs.pt"), 2.0);
  EXPECT_EQ(first("mutated.pt"), 2.0);
  recorder::stop();
}

TEST_F(RingTest, FreedMemoryAtTheSameAddressIsNotShared) {
  recorder::start(config(8));
  // Small tensors (fingerprinted whole) and a storage freed and allocated again: even when
  // the allocator hands back the same address, a new storage object is a new span.
  for (int i = 0; i < 4; ++i) {
    Tensor x = filled(64, 1.0);  // equal content every time, new storage every time
    ring_probe(x, 0);
  }
  // Four inputs, four outputs of 256 bytes: nothing shared across storages.
  EXPECT_EQ(recorder::stats().ring_bytes, 8u * 256u);
}

// A span shared by several kept calls stays in the span index when the oldest of them is
// evicted (the newer calls still hold its blob), so the calls after it keep sharing it; only
// the last holder's eviction forgets it.
TEST_F(RingTest, ASharedSpanOutlivesTheEvictionOfItsFirstHolder) {
  recorder::start(config(2));
  Tensor w = filled(16384, 0.5);  // 64 KiB, passed on every call
  std::vector<Tensor> outs;       // kept alive: no output address comes back
  for (int i = 0; i < 6; ++i) {
    outs.push_back(ring_probe(w, 0));
    // The two kept calls: w once and their two outputs (w copied again would be a fourth).
    EXPECT_EQ(recorder::stats().ring_bytes, (i == 0 ? 2u : 3u) * 65536u) << "call " << i;
  }
  const auto c = calls(recorder::dump_ring("shared"));
  ASSERT_EQ(c.size(), 2u);
  for (const auto& call : c) {
    EXPECT_EQ(values(call, "inputs.pt")[16383], 0.5);
  }
}

// A ring shorter than the calls between two passes of a weight (a model's decode step longer
// than N calls): the weight's calls have all left the ring when it comes again. Its entry is
// left behind the first time; the copy made on the second pass is retained when its call goes,
// and every later pass shares it instead of copying the weight again. An output the caller
// holds but never passes again is not retained.
TEST_F(RingTest, ASpanPassedAgainAfterItsCallsLeftTheRingIsRetainedAndShared) {
  recorder::start(config(2));
  Tensor w = filled(16384, 0.5);  // 64 KiB
  std::vector<Tensor> outs;       // kept alive: no address comes back
  // One pass of w, then two calls on small tensors (kept in the calls' arenas) push it out.
  const auto step = [&] {
    outs.push_back(ring_probe(w, 0));
    for (int i = 0; i < 2; ++i) outs.push_back(ring_probe(filled(16, 1.0), 0));
  };
  step();
  EXPECT_EQ(recorder::stats().ring_retained_bytes, 0u);  // passed once: not retained
  const uint64_t small = recorder::stats().ring_bytes;   // the two small calls' arenas
  step();
  EXPECT_EQ(recorder::stats().ring_retained_bytes, 65536u);  // w's second copy (not its output)
  EXPECT_EQ(recorder::stats().ring_bytes, small + 65536u);
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(k);
    outs.push_back(ring_probe(w, 0));
    // Shared: the retained copy is held by the new call, which adds only its output (and
    // pushes one small call out).
    EXPECT_EQ(recorder::stats().ring_retained_bytes, 0u);
    EXPECT_EQ(recorder::stats().ring_bytes, small / 2 + 2u * 65536u);
    const auto c = calls(recorder::dump_ring("retained"));
    ASSERT_EQ(c.size(), 2u);
    EXPECT_EQ(values(c[1], "inputs.pt")[16383], 0.5);
    EXPECT_EQ(values(c[1], "outputs.pt")[0], 1.0);
    fs::remove_all(dir_);
    for (int i = 0; i < 2; ++i) outs.push_back(ring_probe(filled(16, 1.0), 0));
    EXPECT_EQ(recorder::stats().ring_retained_bytes, 65536u);
  }
}

// A retained copy is shared only while it is still the storage's content: a write by a library
// op or a change outside the library (caught by the compared bytes) makes the next pass copy.
TEST_F(RingTest, ARetainedSpanIsNotSharedOnceWritten) {
  for (const bool library : {true, false}) {
    SCOPED_TRACE(library ? "written by ring_poke_" : "written outside the library");
    recorder::start(config(2));
    Tensor w = filled(16384, 0.5);
    std::vector<Tensor> outs;
    for (int pass = 0; pass < 2; ++pass) {
      outs.push_back(ring_probe(w, 0));
      for (int i = 0; i < 2; ++i) outs.push_back(ring_probe(filled(16, 1.0), 0));
    }
    ASSERT_EQ(recorder::stats().ring_retained_bytes, 65536u);
    if (library) {
      ring_poke_(w, 16383, 4.0);  // kept; pushes one small call out
    } else {
      w.fill_(3.0);
    }
    const double last = library ? 4.0 : 3.0;
    outs.push_back(ring_probe(w, 0));
    EXPECT_EQ(recorder::stats().ring_retained_bytes, 0u);  // not kept for w's old content
    const auto c = calls(recorder::dump_ring(library ? "library" : "outside"));
    ASSERT_EQ(c.size(), 2u);
    EXPECT_EQ(values(c[1], "inputs.pt")[16383], last);
    EXPECT_EQ(values(c[1], "outputs.pt")[16383], 2 * last);
    recorder::stop();
    fs::remove_all(dir_);
  }
}

// Stats::ring_copied_bytes counts the bytes copied into the ring: a shared span adds nothing.
TEST_F(RingTest, CopiedBytesCountWhatIsCopiedNotWhatIsShared) {
  recorder::start(config(8));
  Tensor w = filled(16384, 0.5);  // 64 KiB
  std::vector<Tensor> outs;
  outs.push_back(ring_probe(w, 0));  // w and the result copied
  EXPECT_EQ(recorder::stats().ring_copied_bytes, 2u * 65536u);
  outs.push_back(ring_probe(w, 0));  // w shared, the result copied
  EXPECT_EQ(recorder::stats().ring_copied_bytes, 3u * 65536u);
  outs.push_back(ring_probe(filled(16, 1.0), 0));  // 64 bytes in, 64 out: the call's arena
  EXPECT_EQ(recorder::stats().ring_copied_bytes, 3u * 65536u + 128u);
}

// A shared input the call does not write is compared with its kept copy by the end hook, not
// the begin hook: reading any byte of a weight's first page just before the kernel that streams
// it made that kernel 25 % slower (docs/PERFORMANCE.md, session 23). The first page is made
// unreadable before each call here and readable again by the op itself, so a begin hook
// touching it would crash the test. A change made outside the library is still caught.
TEST_F(RingTest, ASharedInputIsComparedAfterTheCallNotBefore) {
  recorder::start(config(8));
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  void* mem = ::mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* f = static_cast<float*>(mem);
  const auto n = static_cast<int64_t>(4 * page / sizeof(float));
  for (int64_t i = 0; i < n; ++i) f[i] = 0.5f;
  const Tensor w = Tensor::from_blob(mem, {n}, {}, DType::kFloat32, Device::cpu());
  std::vector<Tensor> outs;
  outs.push_back(ring_probe(w, 0));  // the first call copies w (every page read)
  const auto guarded = [&] {
    ring_guard = {mem, page};
    ASSERT_EQ(::mprotect(mem, page, PROT_NONE), 0);
    outs.push_back(ring_probe(w, 0));
    ring_guard = {};
  };
  for (int k = 0; k < 9; ++k) guarded();  // shared; the 8th share compares the samples too
  EXPECT_EQ(recorder::stats().ring_copied_bytes, 11u * 4u * page);  // w once, 10 outputs
  f[0] = 3.0f;  // outside the library, in the first 64 bytes
  guarded();
  EXPECT_EQ(recorder::stats().ring_copied_bytes, 13u * 4u * page);  // w copied again
  const auto c = calls(recorder::dump_ring("guarded"));
  ASSERT_EQ(c.size(), 8u);
  EXPECT_EQ(values(c[6], "inputs.pt")[0], 0.5);
  EXPECT_EQ(values(c[7], "inputs.pt")[0], 3.0);
  EXPECT_EQ(values(c[7], "outputs.pt")[0], 6.0);
  recorder::stop();
  ::munmap(mem, 4 * page);
}

// Retained copies count in the bound and go before any kept call does.
TEST_F(RingTest, RetainedSpansGoBeforeKeptCallsWhenTheBoundIsReached) {
  recorder::Config c = config(2);
  c.ring_mb = 1;
  recorder::start(c);
  Tensor w = filled(65536, 0.5);  // 256 KiB
  std::vector<Tensor> outs;
  for (int pass = 0; pass < 2; ++pass) {
    outs.push_back(ring_probe(w, 0));
    for (int i = 0; i < 2; ++i) outs.push_back(ring_probe(filled(16, 1.0), 0));
  }
  ASSERT_EQ(recorder::stats().ring_retained_bytes, 262144u);
  // Two calls of 256 KiB in and out: with the retained copy, 1.25 MiB.
  for (int i = 0; i < 2; ++i) ring_probe(filled(65536, i), 0);
  const recorder::Stats s = recorder::stats();
  EXPECT_EQ(s.ring_calls, 2);
  EXPECT_EQ(s.ring_retained_bytes, 0u);
  EXPECT_EQ(s.ring_bytes, 4u * 262144u);
}

TEST_F(RingTest, MemoryBoundEvictsTheOldestCalls) {
  recorder::Config c = config(100);
  c.ring_mb = 1;
  recorder::start(c);
  for (int i = 0; i < 10; ++i) ring_probe(filled(65536, i), 0);  // 256 KiB in, 256 KiB out
  const recorder::Stats s = recorder::stats();
  EXPECT_EQ(s.ring_calls, 2);
  EXPECT_LE(s.ring_bytes, 1u << 20);
  const auto cs = calls(recorder::dump_ring("bound"));
  ASSERT_EQ(cs.size(), 2u);
  EXPECT_EQ(lines(cs[1] / "metadata.jsonl")[1]["call_sequence"], 10);
}

TEST_F(RingTest, NanOutputDumpsTheProducingCallAndTheOnesBefore) {
  constexpr int kRing = 4, kStep = 7;
  recorder::start(config(kRing));
  Tensor w = filled(8, 1.0);
  for (int i = 1; i <= 10; ++i) {
    Tensor x = row(8, i);
    if (i == kStep)
      x = Tensor::from_vector({1, 2, std::nan(""), 4, 5, 6, 7, 8}, {1, 8}, DType::kFloat32);
    rmsnorm(x, w);
  }
  const auto d = dumps();
  ASSERT_EQ(d.size(), 1u) << "one dump, at the first NaN only";
  EXPECT_TRUE(d[0].filename().string().ends_with("_nan"));
  const auto c = calls(d[0]);
  ASSERT_EQ(c.size(), static_cast<std::size_t>(kRing));
  for (int k = 0; k < kRing; ++k) {
    EXPECT_EQ(lines(c[k] / "metadata.jsonl").back()["call_sequence"], kStep - kRing + 1 + k);
  }
  const json t = trigger(d[0]);
  EXPECT_EQ(t["reason"], "nan");
  EXPECT_EQ(t["triggering_call"]["function_name"], "rmsnorm");
  EXPECT_EQ(t["triggering_call"]["call_sequence"], kStep);
  EXPECT_EQ(t["triggering_call"]["dump_dir"], c.back().string());
  const auto r = testing::run_flashinfer("replay --dir " + d[0].string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Summary: 4 passed, 0 failed/mismatch"), std::string::npos) << r.out;
  const auto show = testing::run_flashinfer("show " + d[0].string());
  EXPECT_NE(show.out.find("Ring dump: trigger nan, triggering call rmsnorm"), std::string::npos)
      << show.out;
}

// The NaN trigger checks the ring's copy of a contiguous half-precision output in one pass
// over its exponent bits: an Inf fires it, a large finite value does not.
TEST_F(RingTest, NanTriggerSeesInfInHalfPrecisionOutputs) {
  const DType dtypes[] = {DType::kFloat16, DType::kBFloat16};
  for (std::size_t i = 0; i < 2; ++i) {
    recorder::start(config(4));
    const DType dt = dtypes[i];
    Tensor w = Tensor::full({8}, 1.0, dt);
    rmsnorm(Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 60000}, {1, 8}, dt), w);
    EXPECT_EQ(dumps().size(), i) << "a finite output fired the trigger";
    const double inf = std::numeric_limits<double>::infinity();
    rmsnorm(Tensor::from_vector({1, 2, 3, inf, 5, 6, 7, 8}, {1, 8}, dt), w);
    const auto d = dumps();
    ASSERT_EQ(d.size(), i + 1) << "an Inf input (NaN output) did not fire the trigger";
    recorder::stop();
  }
  const auto d = dumps();
  for (const auto& dir : d) {
    const json t = trigger(dir);
    EXPECT_EQ(t["reason"], "nan");
    EXPECT_EQ(t["triggering_call"]["call_sequence"], 2);
  }
}

TEST_F(RingTest, FlashinferErrorDumpsTheFailingCall) {
  recorder::start(config(3));
  Tensor w = filled(8, 1.0);
  for (int i = 1; i <= 4; ++i) rmsnorm(row(8, i), w);
  EXPECT_THROW(ring_probe(filled(2, 1), 1), Error);
  EXPECT_THROW(ring_probe(filled(2, 1), 1), Error);  // fires once
  const auto d = dumps();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].filename().string().ends_with("_error"));
  const auto c = calls(d[0]);
  ASSERT_EQ(c.size(), 3u);
  const auto last = lines(c[2] / "metadata.jsonl");
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0]["execution_status"], "inputs_saved");
  EXPECT_EQ(trigger(d[0])["triggering_call"]["function_name"], "ring_probe");
  EXPECT_EQ(trigger(d[0])["triggering_call"]["dump_dir"], c[2].string());
  // The rmsnorm calls before it replay (the user op exists only in this test binary).
  const auto r = testing::run_flashinfer("replay --dir " + d[0].string() + " --exclude ring_probe");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Summary: 2 passed, 0 failed/mismatch"), std::string::npos) << r.out;
}

// A user op whose name needs JSON escaping (a quote, a non-ASCII letter): the call directory
// carries the name as it is, the records and trigger.json its JSON text (the directory names are
// laid out only when a dump writes them).
Tensor ring_odd(const Tensor& x);

const OpDecl& ring_odd_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "ring_odd_\xc3\xa9\"q";
    decl.module = "tests.ring";
    decl.params = {ParamDecl("x", ParamKind::kTensor)};
    decl.returns = "Tensor";
    decl.invoke = [](const CallArgs& a) -> Value { return ring_odd(a.tensor(0)); };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

Tensor ring_odd(const Tensor& x) {
  return call_api(
      &ring_odd_decl,
      [&]() -> Tensor {
        if (x.to_double_vector()[0] < 0)
          throw Error(ErrorCode::kInvalidArgument, "ring_odd", "x", "negative");
        return x;
      },
      x);
}

TEST_F(RingTest, CallDirectoriesOfOpsWithNamesThatNeedEscaping) {
  recorder::start(config(4));
  ring_odd(filled(2, 1));
  EXPECT_THROW(ring_odd(filled(2, -1)), Error);
  const auto d = dumps();
  ASSERT_EQ(d.size(), 1u);
  const auto c = calls(d[0]);
  ASSERT_EQ(c.size(), 2u);
  const std::string name = "ring_odd_\xc3\xa9\"q";
  for (std::size_t k = 0; k < 2; ++k) {
    const std::string dir = c[k].filename().string();
    EXPECT_TRUE(dir.find("_pid" + std::to_string(::getpid()) + "_" + name + "_call000" +
                         std::to_string(k + 1)) != std::string::npos)
        << dir;
    const auto meta = lines(c[k] / "metadata.jsonl");
    EXPECT_EQ(meta[0]["dump_dir"], c[k].string());
    EXPECT_EQ(meta[0]["function_name"], name);
  }
  std::ifstream f(d[0] / "trigger.json");
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  EXPECT_NE(text.find("\"function_name\": \"ring_odd_\\u00e9\\\"q\""), std::string::npos) << text;
  EXPECT_EQ(trigger(d[0])["triggering_call"]["function_name"], name);
  EXPECT_EQ(trigger(d[0])["triggering_call"]["dump_dir"], c[1].string());
}

TEST_F(RingTest, SigusrOneDumpsAndTheProcessGoesOn) {
  recorder::Config c = config(2);
  c.triggers = {"signal"};
  recorder::start(c);
  Tensor w = filled(8, 1.0);
  for (int i = 1; i <= 3; ++i) rmsnorm(row(8, i), w);
  ASSERT_EQ(::kill(::getpid(), SIGUSR1), 0);
  for (int i = 0; i < 500 && recorder::stats().ring_dumps == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  rmsnorm(row(8, 9), w);  // the process goes on
  // The dump finishes writing trigger.json last.
  std::vector<fs::path> d;
  for (int i = 0; i < 500; ++i) {
    d = dumps();
    if (d.size() == 1 && fs::exists(d[0] / "trigger.json")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].filename().string().ends_with("_signal"));
  ASSERT_EQ(calls(d[0]).size(), 2u);
  EXPECT_EQ(trigger(d[0])["reason"], "signal");
  const auto r = testing::run_flashinfer("replay --dir " + d[0].string());
  EXPECT_EQ(r.status, 0) << r.out;
  recorder::stop();  // the handler goes with the recorder
  struct sigaction now {};
  ::sigaction(SIGUSR1, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
}

TEST_F(RingTest, AbortInAUserOpDumpsFromTheSignalHandler) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    recorder::start(config(3));
    Tensor w = filled(8, 1.0);
    for (int i = 1; i <= 4; ++i) rmsnorm(row(8, i), w);
    ring_probe(filled(3, 5.0), 2);  // abort() inside the op
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGABRT);
  const auto d = dumps();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].filename().string(), "ring_pid" + std::to_string(child) + "_dump0001_crash");
  const json t = trigger(d[0]);
  EXPECT_EQ(t["reason"], "crash");
  EXPECT_EQ(t["signal"], SIGABRT);
  EXPECT_EQ(t["signal_name"], "SIGABRT");
  EXPECT_EQ(t["triggering_call"]["function_name"], "ring_probe");
  const auto c = calls(d[0]);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(t["triggering_call"]["dump_dir"], c[2].string());
  const auto crashed = lines(c[2] / "metadata.jsonl");
  ASSERT_EQ(crashed.size(), 1u);
  EXPECT_EQ(crashed[0]["execution_status"], "inputs_saved");
  EXPECT_EQ(values(c[2], "inputs.pt"), (std::vector<double>{5, 5, 5}));
  EXPECT_EQ(lines(d[0] / "session.jsonl").size(), 5u);
  const auto r = testing::run_flashinfer("replay --dir " + d[0].string() + " --exclude ring_probe");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Summary: 2 passed, 0 failed/mismatch"), std::string::npos) << r.out;
}

// FLASHINFER_DUMP_TRIGGER=exit: a process that ends normally leaves its last N calls.
TEST_F(RingTest, ExitTriggerDumpsTheLastCallsWhenTheProcessEnds) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    test::skip_leak_check_at_exit();  // the parent's threads are not the child's leaks
    recorder::Config c = config(2);
    c.triggers = {"exit"};
    recorder::start(c);
    Tensor w = filled(8, 1.0);
    for (int i = 1; i <= 3; ++i) rmsnorm(row(8, i), w);
    std::exit(0);  // atexit handlers run: the ring is written
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const auto d = dumps();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].filename().string(), "ring_pid" + std::to_string(child) + "_dump0001_exit");
  EXPECT_EQ(trigger(d[0])["reason"], "exit");
  ASSERT_EQ(calls(d[0]).size(), 2u);
  const auto r = testing::run_flashinfer("replay --dir " + d[0].string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Summary: 2 passed, 0 failed/mismatch"), std::string::npos) << r.out;
  // Stopping the recorder writes it too; without the trigger, stopping writes nothing.
  recorder::Config c = config(2);
  c.triggers = {"exit"};
  recorder::start(c);
  rmsnorm(row(8, 1), filled(8, 1.0));
  recorder::stop();
  EXPECT_EQ(dumps().size(), 2u);
  c.triggers = {"nan"};
  recorder::start(c);
  rmsnorm(row(8, 1), filled(8, 1.0));
  recorder::stop();
  EXPECT_EQ(dumps().size(), 2u);
}

// A wrapper's __init__ and latest plan() leave the ring as anchors, not as lost calls: a dump of
// the object's last run() calls replays.
TEST_F(RingTest, WrapperSetupCallsStayForTheKeptRunCalls) {
  recorder::start(config(3));
  auto ints = [](std::vector<double> v) {
    const int64_t n = static_cast<int64_t>(v.size());
    return Tensor::from_vector(v, {n}, DType::kInt32);
  };
  auto qkv = [](double seed) {
    Tensor t = Tensor::empty({4, 2, 64}, DType::kFloat16);
    t.uniform_(static_cast<uint64_t>(seed * 10));
    return t;
  };
  BatchPrefillWithRaggedKVCacheWrapper w(Tensor::zeros({1 << 20}, DType::kUInt8));
  PrefillPlanOptions o;
  o.causal = true;
  w.plan(ints({0, 2, 4}), ints({0, 2, 4}), 2, 2, 64, o);  // superseded by the next plan
  w.run(qkv(1), qkv(2), qkv(3));
  w.plan(ints({0, 1, 4}), ints({0, 1, 4}), 2, 2, 64, o);
  for (int i = 0; i < 4; ++i) w.run(qkv(4 + i), qkv(5 + i), qkv(6 + i));
  const std::string d = recorder::dump_ring("wrapper");
  recorder::stop();
  ASSERT_FALSE(d.empty());
  std::vector<std::string> names;
  for (const fs::path& c : calls(d)) {
    const std::string f = c.filename().string();
    names.push_back(f.substr(f.find("_pid") + 1));
  }
  ASSERT_EQ(names.size(), 5u);
  const std::string pid = "pid" + std::to_string(::getpid()) + "_";
  EXPECT_EQ(names[0], pid + "BatchPrefillWithRaggedKVCacheWrapper.__init___call0001");
  EXPECT_EQ(names[1], pid + "BatchPrefillWithRaggedKVCacheWrapper.plan_call0002");
  EXPECT_EQ(names[4], pid + "BatchPrefillWithRaggedKVCacheWrapper.run_call0005");
  EXPECT_EQ(lines(fs::path(d) / "session.jsonl").size(), 10u);
  const auto r = testing::run_flashinfer("replay --dir " + d);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Summary: 5 passed, 0 failed/mismatch"), std::string::npos) << r.out;
}

TEST_F(RingTest, DedupStoresEachContentOnceAndExportExpandsIt) {
  recorder::Config c;
  c.dump_dir = dir_.string();
  c.dedup = true;
  recorder::start(c);
  Tensor w = filled(1024, 1.0);
  Tensor x = row(1024, 2.0);
  for (int i = 0; i < 5; ++i) rmsnorm(x, w);  // identical calls: 2 input and 1 output content
  rmsnorm(row(1024, 3.0), w);                 // one new input, one new output
  const recorder::Stats s = recorder::stats();
  recorder::stop();
  EXPECT_EQ(s.distinct_bytes, 5u * 4096u);
  int blobs = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "tensors")) {
    EXPECT_EQ(e.path().extension(), ".bin");
    ++blobs;
  }
  EXPECT_EQ(blobs, 5);
  std::vector<fs::path> cs;
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.is_directory() && e.path().filename() != "tensors") cs.push_back(e.path());
  }
  std::sort(cs.begin(), cs.end());
  ASSERT_EQ(cs.size(), 6u);
  EXPECT_TRUE(fs::exists(cs[0] / "inputs.refs.json"));
  EXPECT_FALSE(fs::exists(cs[0] / "inputs.pt"));
  EXPECT_EQ(lines(cs[0] / "metadata.jsonl")[1]["tensor_store"], "dedup");
  for (const auto& r : replay::replay_sequence(dir_.string())) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.dump_dir << " " << r.error;
  }
  const auto show = testing::run_flashinfer("show " + dir_.string());
  EXPECT_NE(show.out.find("Tensor store (FLASHINFER_DUMP_DEDUP): 5 distinct tensors"),
            std::string::npos)
      << show.out;

  const fs::path out = dir_.string() + "_export";
  fs::remove_all(out);
  auto r = testing::run_flashinfer("export --dir " + dir_.string() + " --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(fs::exists(out / "tensors"));
  for (const fs::path& call : cs) {
    const fs::path e = out / call.filename();
    ASSERT_TRUE(fs::exists(e / "inputs.pt")) << e;
    EXPECT_FALSE(fs::exists(e / "inputs.refs.json"));
    const auto meta = lines(e / "metadata.jsonl");
    ASSERT_EQ(meta.size(), 2u);
    EXPECT_FALSE(meta[1].contains("tensor_store"));
    EXPECT_EQ(meta[1]["dump_dir"], e.string());
  }
  EXPECT_EQ(values(out / cs[5].filename(), "inputs.pt"), std::vector<double>(1024, 3.0));
  r = testing::run_flashinfer("replay --dir " + out.string());
  EXPECT_EQ(r.status, 0) << r.out;
  // A tampered blob is an error for that call, not a crash.
  for (const auto& e : fs::directory_iterator(dir_ / "tensors")) {
    std::ofstream(e.path(), std::ios::binary | std::ios::trunc) << "garbage!";
    break;
  }
  bool saw_error = false;
  for (const auto& rr : replay::replay_sequence(dir_.string())) {
    saw_error = saw_error || (rr.status == replay::Status::kError &&
                              rr.error.find("does not match its hash") != std::string::npos);
  }
  EXPECT_TRUE(saw_error);
  fs::remove_all(out);
}

// The ring keeps record lines as pieces (recorder/record_json.h) and writes them only in a
// dump: their concatenation is record_line's text, byte for byte, for both lines of a call.
TEST(RingRecordPieces, ConcatenatedPiecesAreRecordLinesText) {
  using namespace recorder::internal;
  const OpDecl& decl = ring_probe_decl();
  const Tensor x = filled(6, 1.5).view({2, 3});
  const std::vector<Value> args = {Value(x), Value(int64_t{7})};
  Extracted ex;
  ex.by_reference = true;
  RecordParts rec;
  rec.head = record_head(decl, args, 3, "20260101_000000_000", 42, ex);
  finish_inputs(rec, ex, false, decl.signature(), false, std::nullopt, 11);
  std::string meta;
  const Extracted out = extract_result(Value(filled(6, 3.0)), true, meta);
  const Extracted mutated = extract_mutated(decl, args, true);
  const std::string dir = "/tmp/d \"x\"/call\x01";  // escaping is the line's, not the pieces'
  const Outcome line1 = inputs_outcome(rec);
  const Outcome line2 = outputs_outcome(rec, meta, out, mutated);
  for (const auto& [o, status] :
       {std::pair{&line1, std::string_view("inputs_saved")}, {&line2, "completed"}}) {
    std::vector<std::string_view> pieces;
    record_line_pieces(rec, *o, status, pieces);
    std::string text;
    int dirs = 0;
    for (std::string_view p : pieces) {
      if (p.data()) {
        text += p;
      } else {
        recorder::append_json_string(text, dir);
        ++dirs;
      }
    }
    EXPECT_EQ(dirs, 1);
    EXPECT_EQ(text, record_line(rec, *o, status, dir));
  }
}

// The archive files of a dump, by inode: {inode: (size, paths)}.
std::map<ino_t, std::pair<uint64_t, std::vector<fs::path>>> archives_by_inode(
    const fs::path& root) {
  std::map<ino_t, std::pair<uint64_t, std::vector<fs::path>>> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.path().extension() != ".pt") continue;
    struct stat st {};
    EXPECT_EQ(::stat(e.path().c_str(), &st), 0);
    auto& [size, paths] = out[st.st_ino];
    size = static_cast<uint64_t>(st.st_size);
    paths.push_back(e.path());
  }
  return out;
}

// A tensor held once in the ring is written once per dump: an archive equal to one already
// written (the same blobs in the same layout) is a hard link to it, in dump_ring() and in the
// crash handler alike; each call's own file path still loads and replays.
TEST_F(RingTest, ADumpWritesEachDistinctArchiveOnce) {
  for (const bool full : {false, true}) {
    SCOPED_TRACE(full ? "verify=full" : "verify=sampled");
    recorder::Config cfg = config(8);
    cfg.ring_verify_full = full;
    recorder::start(cfg);
    Tensor w = filled(16384, 0.5);  // 64 KiB, held once
    std::vector<Tensor> outs;       // kept alive: six allocations, six output blobs when sampled
    for (int i = 0; i < 6; ++i) outs.push_back(ring_probe(w, 0));
    const std::string root = recorder::dump_ring("links");
    recorder::stop();
    const auto c = calls(root);
    ASSERT_EQ(c.size(), 6u);
    const auto by_inode = archives_by_inode(root);
    // Inputs: one file, six names. Outputs: one file when contents are shared (full), six when
    // each output is its own blob (sampled).
    ASSERT_EQ(by_inode.size(), full ? 2u : 7u);
    uint64_t disk = 0, tensor_bytes = 0;
    for (const auto& [ino, entry] : by_inode) disk += entry.first;
    tensor_bytes = (full ? 2u : 7u) * 65536u;  // the distinct blobs
    // The distinct tensor bytes plus each distinct archive's zip and pickle headers.
    EXPECT_GE(disk, tensor_bytes);
    EXPECT_LT(disk, tensor_bytes + by_inode.size() * 4096u);
    struct stat st {};
    ASSERT_EQ(::stat((c[0] / "inputs.pt").c_str(), &st), 0);
    EXPECT_EQ(st.st_nlink, 6u);
    for (const auto& d : c) {
      EXPECT_EQ(values(d, "inputs.pt")[7], 0.5);
      EXPECT_EQ(values(d, "outputs.pt")[7], 1.0);
    }
    for (const auto& r : replay::replay_sequence(root)) {
      EXPECT_EQ(r.status, replay::Status::kPassed) << r.dump_dir << " " << r.error;
    }
  }
  // The crash handler links the same way.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    recorder::start(config(8));
    Tensor w = filled(16384, 0.5);
    std::vector<Tensor> outs;
    for (int i = 0; i < 3; ++i) outs.push_back(ring_probe(w, 0));
    ring_probe(w, 2);  // abort() inside the op: its inputs are the same archive again
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  fs::path crash;
  for (const fs::path& d : dumps()) {
    if (d.filename().string().ends_with("_crash")) crash = d;
  }
  ASSERT_FALSE(crash.empty());
  const auto c = calls(crash);
  ASSERT_EQ(c.size(), 4u);
  std::size_t inputs_files = 0;
  for (const auto& [ino, entry] : archives_by_inode(crash)) {
    if (entry.second[0].filename() == "inputs.pt") {
      ++inputs_files;
      EXPECT_EQ(entry.second.size(), 4u);
    }
  }
  EXPECT_EQ(inputs_files, 1u);
  const auto r =
      testing::run_flashinfer("replay --dir " + crash.string() + " --exclude ring_probe");
  EXPECT_EQ(r.status, 0) << r.out;
}

TEST_F(RingTest, PreparedDirectoriesLeaveUpstreamsLayoutOnly) {
  recorder::Config c;
  c.dump_dir = dir_.string();
  recorder::start(c);  // record-everything mode: call directories come from the pool
  for (int i = 0; i < 8; ++i) ring_probe(filled(4, 1.0), 0);  // the 8th starts the pool
  const fs::path pool = dir_ / (".prealloc_pid" + std::to_string(::getpid()));
  for (int i = 0; i < 500 && !fs::exists(pool / "p3"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(fs::exists(pool / "p3")) << "the pool thread prepared nothing";
  ring_probe(filled(4, 2.0), 0);                       // a prepared directory, completed
  EXPECT_THROW(ring_probe(filled(4, 3.0), 1), Error);  // a prepared directory, raised
  recorder::stop();
  EXPECT_FALSE(fs::exists(pool)) << "unused prepared directories were left behind";
  std::vector<std::set<std::string>> files;
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (!e.is_directory()) continue;
    std::set<std::string> names;
    for (const auto& f : fs::directory_iterator(e.path())) names.insert(f.path().filename());
    files.push_back(names);
  }
  const std::set<std::string> done = {"metadata.jsonl", "inputs.pt", "outputs.pt"};
  const std::set<std::string> raised = {"metadata.jsonl", "inputs.pt"};
  EXPECT_EQ(std::count(files.begin(), files.end(), done), 9);
  EXPECT_EQ(std::count(files.begin(), files.end(), raised), 1);
  EXPECT_EQ(files.size(), 10u);
  for (const auto& r : replay::replay_sequence(dir_.string())) {
    if (r.incomplete) continue;
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.dump_dir << " " << r.error;
  }
}

}  // namespace
}  // namespace flashinfer
