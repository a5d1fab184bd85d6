// The ring's per-call arena (recorder/ring.cpp, docs/PERFORMANCE.md session 17): CPU tensors
// whose covered span is at most 4 KiB are copied into one buffer per kept call instead of a
// shared blob each. Their bytes round-trip exactly through every dump (upstream's layout, the
// dedup layout, the crash handler), they count toward FLASHINFER_DUMP_RING_MB and leave it when
// their call is evicted, the NaN trigger sees them, and written arguments are kept as written.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "flashinfer/tensor_io.h"
#include "recorder/recorder_internal.h"

namespace flashinfer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- user ops ----
// arena_scale(x, w, mode): x times w's first element (x's dtype); mode 1 aborts inside the op.
Tensor arena_scale(const Tensor& x, const Tensor& w, int64_t mode);

const OpDecl& arena_scale_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "arena_scale";
    decl.module = "tests.ring_arena";
    decl.params = {ParamDecl("x", ParamKind::kTensor), ParamDecl("w", ParamKind::kTensor),
                   ParamDecl("mode", ParamKind::kInt).def(0)};
    decl.returns = "Tensor";
    decl.invoke = [](const CallArgs& a) -> Value {
      return arena_scale(a.tensor(0), a.tensor(1), a.i64(2));
    };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

Tensor arena_scale(const Tensor& x, const Tensor& w, int64_t mode) {
  return call_api(
      &arena_scale_decl,
      [&] {
        if (mode == 1) std::abort();
        const double s = w.to_double_vector()[0];
        std::vector<double> v = x.contiguous().to_double_vector();
        for (double& e : v) e *= s;
        return Tensor::from_vector(v, x.shape(), x.dtype());
      },
      x, w, mode);
}

// arena_fill_out(out, v): writes v into every element of float32 `out` and returns it (the
// result is the written argument).
Tensor arena_fill_out(const Tensor& out, double v);

const OpDecl& arena_fill_out_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "arena_fill_out";
    decl.module = "tests.ring_arena";
    decl.params = {ParamDecl("out", ParamKind::kTensor), ParamDecl("v", ParamKind::kFloat)};
    decl.params[0].mutated = true;
    decl.returns = "Tensor";
    decl.invoke = [](const CallArgs& a) -> Value { return arena_fill_out(a.tensor(0), a.f64(1)); };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

Tensor arena_fill_out(const Tensor& out, double v) {
  return call_api(
      &arena_fill_out_decl,
      [&] {
        auto* p = static_cast<float*>(out.data_ptr());
        for (int64_t k = 0; k < out.numel(); ++k) p[k] = static_cast<float>(v);
        return out;
      },
      out, v);
}

// arena_poke_(x, i, v): element i of float32 x set to v in place (x declared written).
void arena_poke_(const Tensor& x, int64_t i, double v);

const OpDecl& arena_poke_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "arena_poke_";
    decl.module = "tests.ring_arena";
    decl.params = {ParamDecl("x", ParamKind::kTensor), ParamDecl("i", ParamKind::kInt),
                   ParamDecl("v", ParamKind::kFloat)};
    decl.params[0].mutated = true;
    decl.returns = "None";
    decl.invoke = [](const CallArgs& a) -> Value {
      arena_poke_(a.tensor(0), a.i64(1), a.f64(2));
      return Value();
    };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

void arena_poke_(const Tensor& x, int64_t i, double v) {
  call_api(
      &arena_poke_decl, [&] { static_cast<float*>(x.data_ptr())[i] = static_cast<float>(v); }, x, i,
      v);
}

Tensor ramp(int64_t n, double start, DType dt) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<double>(i) * 0.25;
  return Tensor::from_vector(v, {n}, dt);
}

// A tensor's bytes, element by element in logical order (exact for every dtype used here).
std::vector<double> values(const Tensor& t) { return t.contiguous().to_double_vector(); }

class RingArenaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fi_ring_arena_" + std::to_string(::getpid()) + "_" +
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
  // A dump's call directories in call order.
  static std::vector<fs::path> calls(const fs::path& root) {
    std::vector<std::pair<int64_t, fs::path>> seq;
    for (const auto& e : fs::directory_iterator(root)) {
      if (!e.is_directory() || e.path().filename() == "tensors") continue;
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
  std::vector<fs::path> dumps() const {
    std::vector<fs::path> out;
    if (!fs::exists(dir_)) return out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().filename().string().starts_with("ring_")) out.push_back(e.path());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  // Tensor `k` of a call's side (inputs, outputs, mutated) in upstream's layout.
  static Tensor side(const fs::path& call, const char* stem, std::size_t k) {
    return load_torch((call / (std::string(stem) + ".pt")).string()).at(k).second;
  }
  fs::path dir_;
};

// What each kept call passed and got, small tensors of several dtypes and layouts (a strided
// view, a 4 KiB span exactly, an empty one), next to a 64 KiB weight kept as a shared blob: the
// dump holds every call's own bytes, in both layouts, and replays.
TEST_F(RingArenaTest, SmallTensorsRoundTripExactlyThroughADump) {
  for (const bool dedup : {false, true}) {
    SCOPED_TRACE(dedup ? "dedup layout" : "upstream's layout");
    fs::remove_all(dir_);
    recorder::Config cfg = config(16);
    cfg.dedup = dedup;
    recorder::start(cfg);
    const Tensor big = Tensor::full({16384}, 0.5, DType::kFloat32);  // 64 KiB: a blob
    const Tensor norm = ramp(256, 1.0, DType::kBFloat16);            // 512 B, the same each call
    std::vector<std::pair<Tensor, Tensor>> passed;                   // (x, w) of each call
    std::vector<Tensor> results;
    const auto call = [&](const Tensor& x, const Tensor& w) {
      passed.emplace_back(x, w);
      results.push_back(arena_scale(x, w, 0));
    };
    for (int i = 0; i < 3; ++i) {
      call(ramp(17, i, DType::kFloat32), norm);                               // 68 B
      call(ramp(2048, i, DType::kBFloat16), big);                             // 4096 B exactly
      call(ramp(64, i, DType::kFloat32).view({8, 8}).transpose(0, 1), norm);  // a transposed view
      call(ramp(512, i, DType::kFloat32).slice(0, 0, 512, 2), norm);          // a strided view
      call(Tensor::empty({0, 4}, DType::kFloat32), norm);                     // no bytes
      call(Tensor::from_vector({3, 1, 4, 1, 5}, {5}, DType::kInt64), norm);
    }
    const fs::path root = recorder::dump_ring("arena");
    recorder::stop();
    ASSERT_FALSE(root.empty());
    const auto c = calls(root);
    ASSERT_EQ(c.size(), 16u);
    if (dedup) {
      // Blobs are named by content: every file is one a refs.json names and every content
      // named is one file, however many arenas hold it (norm, copied by each call).
      std::set<std::string> blobs;
      for (const auto& e : fs::directory_iterator(root / "tensors")) {
        blobs.insert(e.path().filename().string());
      }
      std::set<std::string> refs;
      for (const fs::path& d : c) {
        for (const char* stem : {"inputs", "outputs"}) {
          std::ifstream f(d / (std::string(stem) + ".refs.json"));
          const json j = json::parse(f);
          for (const auto& t : j["tensors"]) refs.insert(t["blob"].get<std::string>());
        }
      }
      EXPECT_EQ(blobs, refs);
      for (const auto& r : replay::replay_sequence(root.string())) {
        EXPECT_EQ(r.status, replay::Status::kPassed) << r.dump_dir << " " << r.error;
      }
      continue;
    }
    for (std::size_t k = 0; k < c.size(); ++k) {
      const std::size_t i = passed.size() - c.size() + k;
      const auto& [x, w] = passed[i];
      const Tensor in = side(c[k], "inputs", 0);
      EXPECT_EQ(in.dtype(), x.dtype()) << "call " << i;
      EXPECT_EQ(in.shape(), x.shape()) << "call " << i;
      EXPECT_EQ(in.strides(), x.strides()) << "call " << i;
      EXPECT_EQ(values(in), values(x)) << "call " << i;
      EXPECT_EQ(values(side(c[k], "inputs", 1)), values(w)) << "call " << i;
      EXPECT_EQ(values(side(c[k], "outputs", 0)), values(results[i])) << "call " << i;
    }
    for (const auto& r : replay::replay_sequence(root.string())) {
      EXPECT_EQ(r.status, replay::Status::kPassed) << r.dump_dir << " " << r.error;
    }
  }
}

// The crash handler writes the arena's bytes too (no allocation: they are laid out ahead).
TEST_F(RingArenaTest, TheCrashHandlerWritesSmallTensors) {
  for (const bool dedup : {false, true}) {
    SCOPED_TRACE(dedup ? "dedup layout" : "upstream's layout");
    fs::remove_all(dir_);
    arena_scale_decl();  // registered here too: the replay below runs the op
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      recorder::Config cfg = config(3);
      cfg.dedup = dedup;
      recorder::start(cfg);
      const Tensor w = ramp(4, 2.0, DType::kFloat32);
      for (int i = 1; i <= 4; ++i) arena_scale(ramp(100, i, DType::kFloat32), w, 0);
      arena_scale(ramp(7, 9.0, DType::kFloat32), w, 1);  // abort() inside the op
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));
    const auto d = dumps();
    ASSERT_EQ(d.size(), 1u);
    const auto c = calls(d[0]);
    ASSERT_EQ(c.size(), 3u);
    // Read through the replay loader (either layout); the crashed call is not replayed here:
    // it aborts.
    const auto load = [&](std::size_t k) { return replay::load_recorded_call(c[k].string()); };
    const std::vector<double> w = values(ramp(4, 2.0, DType::kFloat32));
    std::vector<double> doubled = values(ramp(100, 4, DType::kFloat32));
    for (double& v : doubled) v *= 2;
    const replay::RecordedCall c0 = load(0), c1 = load(1), c2 = load(2);
    ASSERT_EQ(c0.inputs.size(), 2u);  // x, w
    EXPECT_EQ(c0.inputs[0].second.to_double_vector(), values(ramp(100, 3, DType::kFloat32)));
    EXPECT_EQ(c0.inputs[1].second.to_double_vector(), w);
    ASSERT_EQ(c1.outputs.size(), 1u);
    EXPECT_EQ(c1.outputs[0].second.to_double_vector(), doubled);
    EXPECT_FALSE(c2.completed);
    ASSERT_EQ(c2.inputs.size(), 2u);
    EXPECT_EQ(c2.inputs[0].second.to_double_vector(), values(ramp(7, 9.0, DType::kFloat32)));
    EXPECT_EQ(c2.inputs[1].second.to_double_vector(), w);
  }
}

// The arena's bytes count toward the ring's bytes (each tensor's span, a line each from 64
// bytes on) and leave them when the call is evicted; a result that is also the written argument
// is copied once. Blobs (a 64 KiB tensor) are counted as before, beside them.
TEST_F(RingArenaTest, ArenaBytesAreCountedAndGivenBack) {
  recorder::start(config(2));
  std::vector<Tensor> keep;  // alive: no address comes back
  // Input 256 bytes, the result and the written argument 256 more, once.
  constexpr uint64_t kCall = 512;
  for (int i = 0; i < 5; ++i) {
    keep.push_back(ramp(64, i, DType::kFloat32));
    arena_fill_out(keep.back(), i);
    EXPECT_EQ(recorder::stats().ring_bytes, (i == 0 ? 1u : 2u) * kCall) << "call " << i;
  }
  keep.push_back(Tensor::full({16384}, 0.5, DType::kFloat32));  // 64 KiB: a blob in and out
  arena_fill_out(keep.back(), 2.0);
  EXPECT_EQ(recorder::stats().ring_bytes, kCall + 2u * 65536u);
  arena_poke_(keep[0], 3, 9.0);  // 256 bytes in, 256 written
  EXPECT_EQ(recorder::stats().ring_bytes, kCall + 2u * 65536u);
  arena_poke_(keep[1], 3, 9.0);
  // The 64 KiB call has left; the copy of what it wrote (alive and unwritten since, and kept
  // twice: as its input and as what it wrote) is retained for a later call passing it.
  EXPECT_EQ(recorder::stats().ring_retained_bytes, 65536u);
  EXPECT_EQ(recorder::stats().ring_bytes, 2u * kCall + 65536u);
  recorder::stop();
  // A recorder started again counts from zero, and reuses nothing of the last one's.
  recorder::start(config(2));
  EXPECT_EQ(recorder::stats().ring_bytes, 0u);
  arena_fill_out(keep[2], 1.0);
  EXPECT_EQ(recorder::stats().ring_bytes, kCall);
  recorder::stop();
  // Packed: x (68 bytes) at 0, w (4 bytes) at 80 (16-byte aligned below a line), the result (68
  // bytes) on the next line, at 128: 196 bytes, where a blob each took 3 x 256.
  recorder::start(config(2));
  arena_scale(ramp(17, 1.0, DType::kFloat32), Tensor::full({1}, 2.0, DType::kFloat32), 0);
  EXPECT_EQ(recorder::stats().ring_bytes, 196u);
}

// FLASHINFER_DUMP_RING_MB bounds calls whose tensors are all in arenas: 8 KiB a call (4 KiB in,
// 4 KiB out), so 1 MiB holds the last 128, and the dump holds their own bytes.
TEST_F(RingArenaTest, TheMemoryBoundEvictsCallsHeldInArenas) {
  recorder::Config cfg = config(1000);
  cfg.ring_mb = 1;
  recorder::start(cfg);
  std::vector<Tensor> keep;
  for (int i = 1; i <= 200; ++i) {
    keep.push_back(Tensor::full({1024}, 0.0, DType::kFloat32));
    arena_fill_out(keep.back(), i);
  }
  const recorder::Stats s = recorder::stats();
  EXPECT_EQ(s.ring_calls, 128);
  EXPECT_EQ(s.ring_bytes, 128u * 8192u);
  const auto c = calls(recorder::dump_ring("bound"));
  ASSERT_EQ(c.size(), 128u);
  for (std::size_t k = 0; k < c.size(); k += 31) {
    const double v = static_cast<double>(73 + k);  // the calls of i = 73 .. 200
    EXPECT_EQ(values(side(c[k], "inputs", 0)), std::vector<double>(1024, 0.0)) << k;
    EXPECT_EQ(values(side(c[k], "outputs", 0)), std::vector<double>(1024, v)) << k;
    EXPECT_EQ(values(side(c[k], "mutated", 0)), std::vector<double>(1024, v)) << k;
  }
}

// The NaN trigger sees a NaN or an Inf in a small output or written argument: contiguous (the
// check fused into the arena copy: fp32, bf16 at 4 KiB exactly) or strided (checked on the
// tensor), and no finite one fires it.
TEST_F(RingArenaTest, ANanInASmallOutputFiresTheTrigger) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const Tensor one = Tensor::full({1}, 1.0, DType::kFloat32);
  struct Case {
    const char* name;
    std::function<void(bool bad)> call;
  };
  const Case cases[] = {
      {"arena_scale",
       [&](bool bad) {
         Tensor x = ramp(17, 1.0, DType::kFloat32);
         if (bad) static_cast<float*>(x.data_ptr())[16] = static_cast<float>(nan);
         arena_scale(x, one, 0);
       }},
      {"arena_scale",
       [&](bool bad) {
         std::vector<double> v(2048, 1.5);
         if (bad) v.back() = inf;
         arena_scale(Tensor::from_vector(v, {2048}, DType::kBFloat16), one, 0);
       }},
      {"arena_fill_out",
       [&](bool bad) {
         const Tensor x = Tensor::full({128}, 0.0, DType::kFloat32).slice(0, 0, 128, 2);
         arena_fill_out(x, bad ? nan : 2.0);
       }},
      {"arena_poke_",
       [&](bool bad) { arena_poke_(ramp(64, 1.0, DType::kFloat32), 63, bad ? inf : 3.0); }},
  };
  for (std::size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    fs::remove_all(dir_);
    recorder::start(config(4));
    cases[i].call(false);
    cases[i].call(false);
    EXPECT_TRUE(dumps().empty()) << "a finite output fired the trigger";
    cases[i].call(true);
    const auto d = dumps();
    ASSERT_EQ(d.size(), 1u);
    std::ifstream f(d[0] / "trigger.json");
    const json t = json::parse(f);
    EXPECT_EQ(t["reason"], "nan");
    EXPECT_EQ(t["triggering_call"]["function_name"], cases[i].name);
    EXPECT_EQ(t["triggering_call"]["call_sequence"], 3);
    recorder::stop();
  }
}

// A small argument written in place: its input side is the bytes before the call, its written
// side the bytes after, in the dump; the call before and after it keep their own.
TEST_F(RingArenaTest, ASmallWrittenArgumentKeepsBothSides) {
  recorder::start(config(8));
  Tensor x = ramp(64, 1.0, DType::kFloat32);
  const std::vector<double> before = values(x);
  arena_scale(x, Tensor::full({1}, 2.0, DType::kFloat32), 0);
  arena_poke_(x, 5, -7.0);
  const std::vector<double> after = values(x);
  arena_scale(x, Tensor::full({1}, 2.0, DType::kFloat32), 0);
  ASSERT_NE(before, after);
  const auto c = calls(recorder::dump_ring("poke"));
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(values(side(c[0], "inputs", 0)), before);
  EXPECT_EQ(values(side(c[1], "inputs", 0)), before);
  EXPECT_EQ(values(side(c[1], "mutated", 0)), after);
  EXPECT_EQ(values(side(c[2], "inputs", 0)), after);
}

// A paged KV cache of 128 bytes (2 pages of 2 tokens, 1 head of 4 fp32) is copied whole into
// each append's arena, not kept as a delta: every call still holds its own cache before and
// after the append, and the dump replays.
TEST_F(RingArenaTest, ASmallKvCacheIsKeptWholeByEachAppend) {
  recorder::start(config(8));
  Tensor cache = Tensor::zeros({2, 2, 2, 1, 4}, DType::kFloat32, Device::cpu());
  const auto i32 = [](std::vector<double> v) {
    const auto n = static_cast<int64_t>(v.size());
    return Tensor::from_vector(v, {n}, DType::kInt32);
  };
  std::vector<std::vector<double>> snapshots{values(cache)};
  for (int p = 0; p < 4; ++p) {
    std::vector<double> k(4), v(4);
    for (int e = 0; e < 4; ++e) {
      k[static_cast<std::size_t>(e)] = 10 * p + e;
      v[static_cast<std::size_t>(e)] = -10 * p - e;
    }
    const int used = p / 2 + 1;
    append_paged_kv_cache(Tensor::from_vector(k, {1, 1, 4}, DType::kFloat32),
                          Tensor::from_vector(v, {1, 1, 4}, DType::kFloat32), i32({0}),
                          i32({static_cast<double>(p)}), cache, i32({0, 1}),
                          i32({0, static_cast<double>(used)}),
                          i32({static_cast<double>(p % 2 + 1)}), "NHD");
    snapshots.push_back(values(cache));
  }
  const fs::path root = recorder::dump_ring("kv");
  const auto list = replay::list_calls(root.string());
  ASSERT_EQ(list.size(), 4u);
  for (std::size_t k = 0; k < list.size(); ++k) {
    const replay::RecordedCall c = replay::load_recorded_call(list[k]);
    ASSERT_EQ(c.inputs.size(), 8u);
    EXPECT_EQ(c.inputs[4].second.to_double_vector(), snapshots[k]) << "call " << k;
    ASSERT_EQ(c.mutated.size(), 1u);
    EXPECT_EQ(c.mutated[0].second.to_double_vector(), snapshots[k + 1]) << "call " << k;
  }
  for (const auto& r : replay::replay_sequence(root.string())) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.dump_dir << " " << r.error;
  }
}

}  // namespace
}  // namespace flashinfer
