// Replay: record -> replay passes; tampered outputs are caught with details; wrappers replay in
// order through the object registry; tensor-less and failing calls; upstream-written dumps;
// safetensors strides; the CLI's lines and exit status.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "flashinfer/tensor_io.h"
#include "formats/pickle_writer.h"
#include "formats/reader_limits.h"
#include "formats/zip_writer.h"
#include "recorder/recorder_internal.h"
#include "util/run_command.h"
#include "util/torch_archive.h"

namespace flashinfer {
namespace {

namespace fs = std::filesystem;

// ---- user ops and a wrapper, declared like built-ins ----
Tensor twice(const Tensor& x, bool fail);
const OpDecl& twice_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "replay_twice";
    decl.module = "tests.replay";
    decl.params = {ParamDecl("x", ParamKind::kTensor),
                   ParamDecl("fail", ParamKind::kBool).def(false)};
    decl.returns = "Tensor";
    decl.invoke = [](const CallArgs& a) -> Value { return twice(a.tensor(0), a.boolean(1)); };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}
Tensor twice(const Tensor& x, bool fail) {
  return call_api(
      &twice_decl,
      [&] {
        if (fail) throw Error(ErrorCode::kInvalidArgument, "replay_twice", "fail", "asked to fail");
        std::vector<double> v = x.to_double_vector();
        for (double& e : v) e *= 2;
        return Tensor::from_vector(v, x.shape(), x.dtype());
      },
      x, fail);
}

class Counter : public ApiObject {
 public:
  Counter(int64_t start, DType dtype);
  void plan(int64_t step);  // scalars only: a tensor-less call
  Tensor run(const Tensor& x);
  std::string_view class_name() const override { return "CounterWrapper"; }
  std::string_view module_name() const override { return "tests.replay"; }

 private:
  int64_t value_, step_ = 0;
  DType dtype_;
};

void register_counter() {
  static const bool once = [] {
    OpDecl init;
    init.name = "CounterWrapper.__init__";
    init.module = "tests.replay";
    init.class_name = "CounterWrapper";
    init.params = {ParamDecl("self", ParamKind::kObject), ParamDecl("start", ParamKind::kInt),
                   ParamDecl("dtype", ParamKind::kDType).def(DType::kFloat32)};
    init.invoke = [](const CallArgs& a) -> Value {
      auto obj = std::make_shared<Counter>(a.i64(1), a.dtype(2));
      return Value(ObjectRef{"CounterWrapper", obj->repr(), obj->object_id(), obj, nullptr});
    };
    register_op(std::move(init));
    OpDecl plan;
    plan.name = "CounterWrapper.plan";
    plan.module = "tests.replay";
    plan.class_name = "CounterWrapper";
    plan.params = {ParamDecl("self", ParamKind::kObject), ParamDecl("step", ParamKind::kInt)};
    plan.invoke = [](const CallArgs& a) -> Value {
      a.object_as<Counter>(0).plan(a.i64(1));
      return Value();
    };
    register_op(std::move(plan));
    OpDecl run;
    run.name = "CounterWrapper.run";
    run.module = "tests.replay";
    run.class_name = "CounterWrapper";
    run.params = {ParamDecl("self", ParamKind::kObject), ParamDecl("x", ParamKind::kTensor)};
    run.invoke = [](const CallArgs& a) -> Value {
      return a.object_as<Counter>(0).run(a.tensor(1));
    };
    register_op(std::move(run));
    return true;
  }();
  (void)once;
}
const OpDecl& counter_init() {
  register_counter();
  return *OpRegistry::global().find("CounterWrapper.__init__");
}
const OpDecl& counter_plan() {
  register_counter();
  return *OpRegistry::global().find("CounterWrapper.plan");
}
const OpDecl& counter_run() {
  register_counter();
  return *OpRegistry::global().find("CounterWrapper.run");
}

Counter::Counter(int64_t start, DType dtype) : value_(start), dtype_(dtype) {
  call_api(
      &counter_init, [] {}, *this, start, dtype);
}
void Counter::plan(int64_t step) {
  call_api(
      &counter_plan, [&] { step_ = step; }, *this, step);
}
Tensor Counter::run(const Tensor& x) {
  return call_api(
      &counter_run,
      [&] {
        value_ += step_;
        std::vector<double> v = x.to_double_vector();
        for (double& e : v) e += static_cast<double>(value_);
        return Tensor::from_vector(v, x.shape(), dtype_);
      },
      *this, x);
}

class ReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fi_replay_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    recorder::set_log_sink([](const std::string&) {});
  }
  void TearDown() override {
    recorder::stop();
    recorder::set_log_sink({});
    fs::remove_all(dir_);
  }
  void record(bool safetensors = false) {
    recorder::Config c;
    c.dump_dir = dir_.string();
    c.safetensors = safetensors;
    recorder::start(c);
  }
  std::vector<fs::path> call_dirs() const {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.is_directory()) out.push_back(e.path());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir_;
};

TEST_F(ReplayTest, RecordedSessionReplaysAndPasses) {
  record();
  Tensor x = Tensor::empty({3, 64}, DType::kBFloat16);
  x.normal_(1);
  Tensor w = Tensor::empty({64}, DType::kBFloat16);
  w.uniform_(2);
  Tensor out = Tensor::empty({3, 64}, DType::kBFloat16);
  rmsnorm(x, w, 1e-5, out);
  twice(Tensor::from_vector({1, 2}, {2}, DType::kFloat32), false);
  recorder::stop();
  const auto results = replay::replay_sequence(dir_.string());
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
  }
  EXPECT_EQ(results[0].function_name, "rmsnorm");
  // The output and the `out` buffer (mutated) were both compared.
  ASSERT_EQ(results[0].comparisons.size(), 2u);
  EXPECT_EQ(results[0].comparisons[0].key, "result");
  EXPECT_EQ(results[0].comparisons[1].key, "mutated arg_3");
  EXPECT_EQ(results[0].args[2].as_float(), 1e-5);
}

// --device cuda on an op whose backend table has no CUDA kernel in this build: the call runs on
// the CPU reference and the result says so. In a build without CUDA that is every op; in a
// CUDA build the op runs on the GPU (when one is present) and there is no note.
TEST_F(ReplayTest, CudaReplayFallsBackToTheCpuWhereAnOpHasNoCudaKernel) {
  record();
  Tensor x = Tensor::empty({3, 64}, DType::kFloat32);
  x.normal_(1);
  Tensor w = Tensor::empty({64}, DType::kFloat32);
  w.uniform_(2);
  rmsnorm(x, w);
  recorder::stop();
  const bool cuda_kernel = op_has_backend("rmsnorm", DeviceType::kCUDA);
  EXPECT_EQ(cuda_kernel, cuda_compiled());
  EXPECT_TRUE(op_has_backend("rmsnorm", DeviceType::kCPU));
  if (cuda_kernel && cuda_device_count() == 0) GTEST_SKIP() << "CUDA build without a GPU";
  replay::Options o;
  o.device = Device::cuda();
  const auto r = replay::replay_from_dump(call_dirs().at(0).string(), o);
  EXPECT_EQ(r.status, replay::Status::kPassed) << r.error;
  if (cuda_kernel) {
    EXPECT_TRUE(r.ran_on.is_cuda());
    EXPECT_TRUE(r.note.empty()) << r.note;
  } else {
    EXPECT_TRUE(r.ran_on.is_cpu());
    EXPECT_EQ(r.note,
              "no CUDA kernel for rmsnorm in this build: replayed on the CPU reference "
              "instead");
  }
}

// --device cuda on a call whose op has CUDA kernels that do not take one of its arguments: RoPE
// inside attention (pos_encoding_mode "ROPE_LLAMA") runs on the CPU only (plan_pos_encoding
// refuses it on a CUDA device with kUnsupported; the CUDA decode kernel has ALiBi, not RoPE). The
// CUDA attempt raises kUnsupported, and the call is replayed on the CPU reference with a note
// saying why. The record and its CPU replay run anywhere; the CUDA half needs a GPU (gpu-check).
TEST_F(ReplayTest, CudaReplayFallsBackToTheCpuWhereTheKernelsRefuseAnArgument) {
  record();
  Tensor q = Tensor::empty({4, 64}, DType::kFloat16);
  q.normal_(1);
  Tensor k = Tensor::empty({19, 2, 64}, DType::kFloat16);
  k.normal_(2);
  Tensor v = Tensor::empty({19, 2, 64}, DType::kFloat16);
  v.normal_(3);
  single_decode_with_kv_cache(q, k, v, "NHD", "ROPE_LLAMA");
  recorder::stop();
  const auto on_cpu = replay::replay_from_dump(call_dirs().at(0).string());
  EXPECT_EQ(on_cpu.status, replay::Status::kPassed) << on_cpu.error;
  EXPECT_TRUE(on_cpu.note.empty()) << on_cpu.note;
  if (!cuda_compiled() || cuda_device_count() == 0) GTEST_SKIP() << "needs a CUDA device";
  replay::Options o;
  o.device = Device::cuda();
  const auto r = replay::replay_from_dump(call_dirs().at(0).string(), o);
  EXPECT_EQ(r.status, replay::Status::kPassed) << r.error;
  EXPECT_TRUE(r.ran_on.is_cpu());
  EXPECT_TRUE(r.note.starts_with("the CUDA kernels refused this call")) << r.note;
  EXPECT_NE(r.note.find("pos_encoding_mode"), std::string::npos) << r.note;
  EXPECT_NE(r.note.find("ROPE_LLAMA"), std::string::npos) << r.note;
}

TEST_F(ReplayTest, TamperedOutputIsAMismatchWithDetails) {
  record();
  twice(Tensor::from_vector({1, 2, 3, 4}, {4}, DType::kFloat32), false);
  recorder::stop();
  const fs::path call = call_dirs().at(0);
  save_torch((call / "outputs.pt").string(),
             {{"result", Tensor::from_vector({2, 4, 6.5, 9}, {4}, DType::kFloat32)}});
  const auto r = replay::replay_from_dump(call.string());
  EXPECT_EQ(r.status, replay::Status::kMismatch);
  ASSERT_EQ(r.comparisons.size(), 1u);
  const auto& c = r.comparisons[0];
  EXPECT_FALSE(c.match);
  EXPECT_EQ(c.mismatches, 2);
  EXPECT_EQ(c.numel, 4);
  EXPECT_EQ(c.first_mismatch, 2);
  EXPECT_DOUBLE_EQ(c.max_abs_error, 1.0);
  EXPECT_DOUBLE_EQ(c.max_rel_error, 1.0 / 9.0);
  // A loose enough tolerance accepts it.
  replay::Options o;
  o.rtol = 0.2;
  EXPECT_EQ(replay::replay_from_dump(call.string(), o).status, replay::Status::kPassed);
  // A wrong shape is reported as such.
  save_torch((call / "outputs.pt").string(), {{"result", Tensor::zeros({5}, DType::kFloat32)}});
  const auto s = replay::replay_from_dump(call.string());
  EXPECT_EQ(s.status, replay::Status::kMismatch);
  EXPECT_NE(s.comparisons[0].problem.find("shape (4,) vs recorded (5,)"), std::string::npos);
}

TEST_F(ReplayTest, WrapperSequenceReplaysThroughTheRegistry) {
  record();
  {
    Counter c(10, DType::kFloat64);
    c.plan(5);  // no tensor at all: replayable anyway
    c.run(Tensor::from_vector({1, 2}, {2}, DType::kFloat32));
    c.run(Tensor::from_vector({0}, {1}, DType::kFloat32));
  }
  recorder::stop();
  auto dirs = call_dirs();
  ASSERT_EQ(dirs.size(), 4u);
  EXPECT_FALSE(fs::exists(dirs[1] / "inputs.pt"));  // plan had no tensor
  const auto results = replay::replay_sequence(dir_.string());
  ASSERT_EQ(results.size(), 4u);
  for (const auto& r : results) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
  }
  EXPECT_EQ(results[0].function_name, "CounterWrapper.__init__");
  EXPECT_EQ(results[0].args[2].as_dtype(), DType::kFloat64);  // dtype rebuilt, not left as JSON
  EXPECT_EQ(results[3].result.as_tensor().to_double_vector(), (std::vector<double>{20}));
  // Calls within one millisecond still replay in call order (process_sequence), even when
  // their names would sort otherwise: rename the dirs so every one has the same timestamp.
  fs::path same = dir_ / "same";
  fs::create_directories(same);
  const char* order[] = {"d", "c", "b", "a"};  // reverse alphabetical suffixes
  for (size_t i = 0; i < dirs.size(); ++i) {
    const std::string n = dirs[i].filename().string();
    const std::string tail = n.substr(n.find("_pid"));
    fs::rename(dirs[i], same / ("20260101_000000_000" + tail.substr(0, tail.find('_', 4) + 1) +
                                order[i] + n.substr(n.find('_', n.find("_pid") + 4))));
  }
  const auto same_ms = replay::replay_sequence(same.string());
  ASSERT_EQ(same_ms.size(), 4u);
  EXPECT_EQ(same_ms[0].function_name, "CounterWrapper.__init__");
  for (const auto& r : same_ms) EXPECT_EQ(r.status, replay::Status::kPassed) << r.error;
  dirs.clear();
  for (const auto& e : fs::directory_iterator(same)) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  // A method replayed alone cannot find its object.
  const auto lone = replay::replay_from_dump(dirs[2].string());
  EXPECT_EQ(lone.status, replay::Status::kError);
  EXPECT_NE(lone.error.find("not found in registry"), std::string::npos) << lone.error;
}

// self_id is the object's address, the one its repr prints, as upstream's id(self); replay
// pairs each object's calls by it, with two objects alive at once and with a later object at
// a destroyed one's address.
TEST_F(ReplayTest, SelfIdIsTheReprAddressAndPairsInterleavedObjects) {
  record();
  const Tensor x = Tensor::from_vector({1, 2}, {2}, DType::kFloat32);
  uint64_t id_a = 0, id_b = 0;
  {
    Counter a(10, DType::kFloat32);
    Counter b(100, DType::kFloat32);
    id_a = a.object_id();
    id_b = b.object_id();
    EXPECT_EQ(id_a, reinterpret_cast<uintptr_t>(static_cast<ApiObject*>(&a)));
    char hex[32];
    std::snprintf(hex, sizeof(hex), "0x%llx", static_cast<unsigned long long>(id_a));
    EXPECT_EQ(a.repr(), std::string("<tests.replay.CounterWrapper object at ") + hex + ">");
    a.plan(1);
    b.plan(2);
    b.run(x);  // 100 + 2 + x
    a.run(x);  // 10 + 1 + x
  }
  {
    Counter c(1000, DType::kFloat32);  // may well live where `a` did
    c.plan(3);
    c.run(x);  // 1000 + 3 + x
  }
  recorder::stop();
  std::set<uint64_t> ids;
  for (const auto& d : call_dirs()) {
    const auto rec =
        nlohmann::json::parse(replay::read_metadata((d / "metadata.jsonl").string()).json);
    ASSERT_TRUE(rec.contains("self_id")) << d;
    const uint64_t self_id = rec["self_id"].get<uint64_t>();
    ids.insert(self_id);
    // The repr recorded for arg_0 prints the same number in hex.
    const std::string repr = rec["input_metadata"]["arg_0"]["repr"].get<std::string>();
    const auto at = repr.find(" object at 0x");
    ASSERT_NE(at, std::string::npos) << repr;
    EXPECT_EQ(std::stoull(repr.substr(at + 11, repr.size() - at - 12), nullptr, 16), self_id)
        << repr;
  }
  EXPECT_TRUE(ids.count(id_a) && ids.count(id_b));
  const auto results = replay::replay_sequence(dir_.string());
  ASSERT_EQ(results.size(), 9u);
  std::vector<double> runs;
  for (const auto& r : results) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
    if (r.function_name == "CounterWrapper.run") {
      runs.push_back(r.result.as_tensor().to_double_vector()[0]);
    }
  }
  EXPECT_EQ(runs, (std::vector<double>{103, 12, 1004}));
}

TEST_F(ReplayTest, FailedCallIsIncompleteAndReproduced) {
  record();
  EXPECT_THROW(twice(Tensor::from_vector({1}, {1}, DType::kFloat32), true), Error);
  recorder::stop();
  const auto r = replay::replay_from_dump(call_dirs().at(0).string());
  EXPECT_TRUE(r.incomplete);
  EXPECT_EQ(r.status, replay::Status::kError);
  EXPECT_NE(r.error.find("asked to fail"), std::string::npos);
}

TEST_F(ReplayTest, SafetensorsDumpsGetTheirStridesBack) {
  record(/*safetensors=*/true);
  Tensor base = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::kFloat32);
  twice(base.transpose(0, 1), false);
  recorder::stop();
  const auto r = replay::replay_from_dump(call_dirs().at(0).string());
  EXPECT_EQ(r.status, replay::Status::kPassed) << r.error;
  EXPECT_EQ(r.args[0].as_tensor().strides(), (Shape{1, 3}));
  EXPECT_EQ(r.args[0].as_tensor().to_double_vector(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
}

TEST_F(ReplayTest, BadDumpsAreReportedNotThrown) {
  fs::create_directories(dir_ / "a");
  auto r = replay::replay_from_dump((dir_ / "a").string());
  EXPECT_EQ(r.status, replay::Status::kError);
  EXPECT_NE(r.error.find("metadata.jsonl not found"), std::string::npos);
  EXPECT_NE(
      replay::replay_from_dump((dir_ / "missing").string()).error.find("Dump directory not found"),
      std::string::npos);
  std::ofstream(dir_ / "a" / "metadata.jsonl")
      << R"({"function_name": "no_such_op", "module": "flashinfer.nowhere", "input_metadata": {}})"
      << "\n";
  r = replay::replay_from_dump((dir_ / "a").string());
  EXPECT_NE(r.error.find("flashinfer.nowhere.no_such_op is not provided by flashinfer-cpp"),
            std::string::npos)
      << r.error;
  // A torn last line: the previous complete line is used.
  std::ofstream(dir_ / "a" / "metadata.jsonl", std::ios::app) << R"({"function_name": "rmsn)";
  const auto m = replay::read_metadata((dir_ / "a" / "metadata.jsonl").string());
  EXPECT_EQ(m.lines, 1);
  EXPECT_NE(m.json.find("no_such_op"), std::string::npos);
  // A corrupt tensor file is an error for that call only.
  std::ofstream(dir_ / "a" / "inputs.pt") << "not a zip";
  r = replay::replay_from_dump((dir_ / "a").string());
  EXPECT_EQ(r.status, replay::Status::kError);
}

// ---- hostile dumps (issue 16): errors, never a crash, a hang or a stack overflow ----

// inputs.pt holding {"arg_0": _rebuild_tensor_v2(FloatStorage of 16, 0, size, stride)}.
void write_rebuild_archive(const fs::path& file, const Shape& size, const Shape& stride) {
  testing::write_storage_archive(file.string(), "inputs",
                                 testing::rebuild_tensor_pickle(size, stride));
}

TEST_F(ReplayTest, InputsWithOverflowingStridesAreAnError) {
  record();
  twice(Tensor::from_vector({1, 2, 3, 4}, {4}, DType::kFloat32), false);
  recorder::stop();
  const fs::path call = call_dirs().at(0);
  write_rebuild_archive(call / "inputs.pt", {5}, {int64_t{1} << 62});
  const auto r = replay::replay_from_dump(call.string());
  EXPECT_EQ(r.status, replay::Status::kError);
  EXPECT_NE(r.error.find("overflows int64"), std::string::npos) << r.error;
}

TEST_F(ReplayTest, SafetensorsDetailStridesThatWrapAreAnError) {
  record(/*safetensors=*/true);
  Tensor base = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::kFloat32);
  twice(base.transpose(0, 1), false);
  recorder::stop();
  const fs::path meta = call_dirs().at(0) / "metadata.jsonl";
  std::string text;
  {
    std::ifstream f(meta);
    std::string line;
    while (std::getline(f, line)) {
      auto j = nlohmann::ordered_json::parse(line);
      for (auto& [k, d] : j["tensor_details"].items()) {
        if (d.contains("stride")) d["stride"] = {int64_t{1} << 62, (int64_t{1} << 62) + 1};
      }
      text += j.dump() + "\n";
    }
  }
  std::ofstream(meta) << text;
  const auto r = replay::replay_from_dump(call_dirs().at(0).string());
  EXPECT_EQ(r.status, replay::Status::kError);
  EXPECT_NE(r.error.find("overflows int64"), std::string::npos) << r.error;
}

TEST_F(ReplayTest, MetadataReaderLimits) {
  const fs::path call = dir_ / "20260101_000000_000_pid1_x_call0001";
  fs::create_directories(call);
  const fs::path meta = call / "metadata.jsonl";
  auto error_of = [&] {
    try {
      replay::read_metadata(meta.string());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("read");
  };
  // A line nested ~150k deep: an error before the parser sees it.
  std::ofstream(meta) << "{\"a\":" << std::string(150'000, '[') << std::string(150'000, ']')
                      << "}\n";
  EXPECT_NE(error_of().find("nests more than 512 deep (kMaxJsonDepth)"), std::string::npos)
      << error_of();
  EXPECT_EQ(replay::replay_from_dump(call.string()).status, replay::Status::kError);
  // A line over kMaxMetadataLineBytes.
  std::ofstream(meta) << "{\"a\":\"" << std::string(formats::kMaxMetadataLineBytes, 'x') << "\"}\n";
  EXPECT_NE(error_of().find("(kMaxMetadataLineBytes)"), std::string::npos) << error_of();
  // A file over kMaxMetadataFileBytes, made of short lines.
  {
    std::ofstream f(meta);
    const std::string line =
        "{\"function_name\": \"x\", \"pad\": \"" + std::string(1000, 'p') + "\"}\n";
    for (std::size_t n = 0; n <= formats::kMaxMetadataFileBytes; n += line.size()) f << line;
  }
  EXPECT_NE(error_of().find("more than the limit"), std::string::npos) << error_of();
  // A FIFO: an error at once, not a hang.
  fs::remove(meta);
  ASSERT_EQ(::mkfifo(meta.c_str(), 0600), 0);
  EXPECT_NE(error_of().find("is not a regular file"), std::string::npos) << error_of();
  EXPECT_EQ(replay::replay_from_dump(call.string()).status, replay::Status::kError);
  auto r = testing::run_flashinfer("show --dir " + dir_.string());
  EXPECT_EQ(r.status, 0) << r.out;
  // A symlink to /dev/zero: an error, not an endless read.
  fs::remove(meta);
  fs::create_symlink("/dev/zero", meta);
  EXPECT_NE(error_of().find("is not a regular file"), std::string::npos) << error_of();
  r = testing::run_flashinfer("show --dir " + call.string());
  EXPECT_NE(r.out.find("malformed record"), std::string::npos) << r.out;
  r = testing::run_flashinfer("replay --dir " + dir_.string());
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("is not a regular file"), std::string::npos) << r.out;
}

TEST_F(ReplayTest, CallDirectoriesLinkedOutOfTheRootAreNotFollowed) {
  record();
  twice(Tensor::from_vector({1, 2}, {2}, DType::kFloat32), false);
  recorder::stop();
  const fs::path real = call_dirs().at(0);
  // Another dump elsewhere, linked into this one.
  const fs::path outside = dir_.string() + "_outside";
  fs::remove_all(outside);
  fs::create_directories(outside);
  fs::copy(real, outside / "20990101_000000_000_pid1_replay_twice_call0001");
  fs::create_symlink(outside / "20990101_000000_000_pid1_replay_twice_call0001",
                     dir_ / "20990101_000000_000_pid1_replay_twice_call0002");
  // A link to a call inside the root is followed.
  fs::create_directory_symlink(real, dir_ / "20990101_000000_000_pid1_replay_twice_call0003");
  const auto results = replay::replay_sequence(dir_.string());
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].dump_dir, real.string());
  EXPECT_NE(results[1].dump_dir.find("call0003"), std::string::npos);
  const auto r = testing::run_flashinfer("show --dir " + dir_.string());
  EXPECT_NE(r.out.find(": 2 recorded calls"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("call0002"), std::string::npos) << r.out;
  fs::remove_all(outside);
}

// A dump written by Python the way upstream's recorder writes it (torch.save of the tensors,
// keyword arguments as kwarg_<name>), replayed with this library's rmsnorm.
TEST_F(ReplayTest, UpstreamWrittenDumpReplaysHere) {
  int st = system("/usr/bin/python3 -c 'import torch' 2>/dev/null");
  if (st != 0) GTEST_SKIP() << "python3-torch not installed";
  const fs::path call = dir_ / "20261121_144622_459_pid12385_rmsnorm_call0001";
  fs::create_directories(call);
  const std::string py = R"PY(
import json, sys, torch
d = sys.argv[1]
torch.manual_seed(0)
x = torch.randn(4, 64).to(torch.float16)
w = (torch.rand(64) + 0.5).to(torch.float16)
torch.save({"arg_0": x, "arg_1": w}, d + "/inputs.pt")
xf = x.float()
y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()).to(torch.float16)
torch.save({"result": y}, d + "/outputs.pt")
rec = {"function_name": "rmsnorm", "module": "flashinfer.norm", "call_sequence": 1,
       "timestamp": "20261121_144622_459", "process_id": 12385,
       "input_metadata": {"kwarg_eps": 1e-05}, "output_metadata": {},
       "tensor_info": {"input_tensor_keys": ["arg_0", "arg_1"], "output_tensor_keys": ["result"]},
       "tensor_format": "torch", "execution_status": "completed"}
with open(d + "/metadata.jsonl", "w") as f:
    f.write(json.dumps(rec) + "\n")
)PY";
  std::ofstream(dir_ / "make.py") << py;
  ASSERT_EQ(
      system(("/usr/bin/python3 " + (dir_ / "make.py").string() + " " + call.string()).c_str()), 0);
  const auto results = replay::replay_sequence(dir_.string());
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].status, replay::Status::kPassed) << results[0].error;
  EXPECT_EQ(results[0].args[2].as_float(), 1e-5);
}

TEST_F(ReplayTest, CliReportsEachCallAndFailsOnMismatch) {
  record();
  // Built-in ops only: the CLI is another process, which knows none of this test's ops.
  rmsnorm(Tensor::from_vector({3, 4}, {1, 2}, DType::kFloat32),
          Tensor::from_vector({1, 1}, {2}, DType::kFloat32));
  rmsnorm(Tensor::from_vector({1, 1}, {1, 2}, DType::kFloat32),
          Tensor::from_vector({1, 1}, {2}, DType::kFloat32), 0.0);
  recorder::stop();
  auto r = testing::run_flashinfer("replay --dir " + dir_.string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Replaying session from " + dir_.string() + "..."), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[1] rmsnorm ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("): ✅ Passed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Summary: 2 passed, 0 failed/mismatch"), std::string::npos) << r.out;
  const fs::path second = call_dirs().at(1);
  save_torch((second / "outputs.pt").string(),
             {{"result", Tensor::from_vector({1, 2}, {1, 2}, DType::kFloat32)}});
  r = testing::run_flashinfer("replay --dir " + dir_.string());
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("[2] rmsnorm (" + second.filename().string() + "): ⚠️  Mismatch"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("result: 1 of 2 elements differ (max abs error 1"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("First divergence: [2] rmsnorm"), std::string::npos) << r.out;
  r = testing::run_flashinfer("replay --dir " + second.string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("Replaying single dump from"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("⚠️  Replay finished but outputs did not match"), std::string::npos)
      << r.out;
  r = testing::run_flashinfer("replay --dir " + (dir_ / "nope").string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("❌ Directory not found"), std::string::npos);
  // Machine-readable report, and filters on what is reported.
  r = testing::run_flashinfer("replay --json --dir " + dir_.string());
  EXPECT_EQ(r.status, 1);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["passed"], 1);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["results"][1]["status"], "mismatch");
  EXPECT_EQ(j["results"][1]["comparisons"][0]["mismatches"], 1);
  EXPECT_EQ(j["results"][1]["comparisons"][0]["first_mismatch"], 1);
  r = testing::run_flashinfer("replay --exclude 'rms*' --dir " + dir_.string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Summary: 0 passed, 0 failed/mismatch"), std::string::npos) << r.out;
  r = testing::run_flashinfer("replay -v --dir " + second.string());
  EXPECT_NE(r.out.find("arg[2] = 0.0"), std::string::npos) << r.out;
  // show: the seed page's session scan, built in.
  r = testing::run_flashinfer("show --dir " + dir_.string());
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("2 recorded calls"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Total completed calls: 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  rmsnorm: 2"), std::string::npos) << r.out;
  r = testing::run_flashinfer("show -v " + dir_.string());
  EXPECT_NE(r.out.find("[1] rmsnorm  completed"), std::string::npos) << r.out;
  // A crashed call (line 1 only) is listed as incomplete.
  const fs::path first = call_dirs().at(0);
  std::string line1;
  {
    std::ifstream f(first / "metadata.jsonl");
    std::getline(f, line1);
  }
  std::ofstream(first / "metadata.jsonl", std::ios::trunc) << line1 << "\n";
  r = testing::run_flashinfer("show --dir " + dir_.string());
  EXPECT_NE(r.out.find("Found 1 incomplete calls (potential crashes):\n  - rmsnorm at " +
                       first.filename().string()),
            std::string::npos)
      << r.out;
  r = testing::run_flashinfer("replay --dir " + dir_.string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("💥 Incomplete"), std::string::npos) << r.out;
}

// Text from a dump reaches neither the terminal raw (control characters escaped) nor breaks the
// JSON report (bytes that are not UTF-8 escaped); one malformed record does not end a listing;
// a directory with no call is not a clean replay (exit 2).
TEST_F(ReplayTest, CliEscapesDumpTextAndRefusesAnEmptySession) {
  using json = nlohmann::json;
  const fs::path root = dir_ / std::string("sess\xff\xfe");
  const std::string shown_root = (dir_ / "sess").string() + "\\xff\\xfe";
  fs::create_directories(root);
  auto r = testing::run_flashinfer("replay --dir '" + root.string() + "'");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("❌ No recorded calls in " + shown_root), std::string::npos) << r.out;
  r = testing::run_flashinfer("replay --json --dir '" + root.string() + "'");
  EXPECT_EQ(r.status, 2) << r.out;
  json j = json::parse(r.out);
  EXPECT_EQ(j["error"], "no recorded calls");
  EXPECT_EQ(j["dir"], shown_root);

  // Recorded under an ASCII name, then renamed: the records keep the old dump_dir (replay reads
  // the directory it is given).
  fs::remove(root);
  recorder::Config c;
  c.dump_dir = (dir_ / "ascii").string();
  recorder::start(c);
  const Tensor x = Tensor::from_vector({3, 4}, {1, 2}, DType::kFloat32);
  const Tensor w = Tensor::from_vector({1, 1}, {2}, DType::kFloat32);
  rmsnorm(x, w);
  rmsnorm(x, w);
  recorder::stop();
  fs::rename(dir_ / "ascii", root);
  r = testing::run_flashinfer("replay --json --dir '" + root.string() + "'");
  EXPECT_EQ(r.status, 0) << r.out;
  j = json::parse(r.out);
  EXPECT_EQ(j["passed"], 2);
  EXPECT_EQ(j["dir"], shown_root);
  EXPECT_EQ(j["results"][0]["dump_dir"].get<std::string>().rfind(shown_root + "/", 0), 0u);

  // Record 1: a number where a string belongs; record 2: escape sequences in its name.
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(root)) {
    if (e.is_directory()) dirs.push_back(e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  ASSERT_EQ(dirs.size(), 2u);
  auto rewrite = [](const fs::path& meta, const json& name) {
    std::vector<std::string> out;
    std::ifstream in(meta);
    for (std::string l; std::getline(in, l);) {
      json rec = json::parse(l);
      rec["function_name"] = name;
      out.push_back(rec.dump());
    }
    std::ofstream f(meta, std::ios::trunc);
    for (const auto& l : out) f << l << "\n";
  };
  rewrite(dirs[0] / "metadata.jsonl", 42);
  rewrite(dirs[1] / "metadata.jsonl", "rms\x1b[31mnorm\x07\xc2\x9b");
  r = testing::run_flashinfer("show -v --dir '" + root.string() + "'");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Session " + shown_root + ": 2 recorded calls"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Found 1 malformed records"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[1] " + dirs[0].filename().string() +
                       ": malformed record: 'function_name' is a number, not a string"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[2] rms\\x1b[31mnorm\\x07\\xc2\\x9b  completed"), std::string::npos)
      << r.out;
  for (const char* raw : {"\x1b", "\x07", "\xff", "\xc2\x9b"}) {
    EXPECT_EQ(r.out.find(raw), std::string::npos) << r.out;
  }
  r = testing::run_flashinfer("replay --dir '" + root.string() + "'");
  EXPECT_EQ(r.status, 1) << r.out;
  for (const char* raw : {"\x1b", "\x07", "\xff", "\xc2\x9b"}) {
    EXPECT_EQ(r.out.find(raw), std::string::npos) << r.out;
  }
  r = testing::run_flashinfer("replay --json --dir '" + root.string() + "'");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NO_THROW(j = json::parse(r.out)) << r.out;
}

// A dump directory holding ring dumps and no call of its own (what scripts/demo leaves in
// ./flashinfer_dumps): show lists each recording with the command lines that open it, replay
// replays nothing and exits 2 naming them, and the printed command line works. A folder with no
// recording at any level is an error for both.
TEST_F(ReplayTest, CliListsTheRecordingsBelowAFolderAndHowToOpenEach) {
  const fs::path root = dir_ / "flashinfer_dumps";
  recorder::Config c;
  c.dump_dir = root.string();
  c.ring = 3;
  c.triggers = {"exit"};
  recorder::start(c);
  const Tensor x = Tensor::from_vector({3, 4}, {1, 2}, DType::kFloat32);
  const Tensor w = Tensor::from_vector({1, 1}, {2}, DType::kFloat32);
  for (int i = 0; i < 5; ++i) rmsnorm(x, w);
  recorder::stop();  // the exit trigger writes the ring
  std::vector<fs::path> rings;
  for (const auto& e : fs::directory_iterator(root)) rings.push_back(e.path());
  ASSERT_EQ(rings.size(), 1u);
  const fs::path ring = rings[0];
  EXPECT_TRUE(
      ring.filename().string().starts_with("ring_pid" + std::to_string(::getpid()) + "_dump"))
      << ring;
  EXPECT_TRUE(ring.filename().string().ends_with("_exit")) << ring;
  // A second recording one level deeper, and a hidden folder that is not searched.
  fs::create_directories(root / "older");
  fs::copy(ring, root / "older" / "session", fs::copy_options::recursive);
  fs::copy(ring, root / ".prealloc_pid1", fs::copy_options::recursive);

  const std::string bin = std::string(FLASHINFER_TEST_BIN_DIR) + "/flashinfer";
  const std::string show_ring = bin + " show --dir " + ring.string();
  const std::string replay_ring = bin + " replay --dir " + ring.string();
  auto r = testing::run_flashinfer("show --dir " + root.string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(root.string() + " holds no call itself; 2 recordings below it:\n  " +
                       (root / "older" / "session").string() + ": 3 recorded calls, a ring dump " +
                       "written on trigger 'exit', "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  " + ring.string() +
                       ": 3 recorded calls, a ring dump written on trigger 'exit', "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\n    show:   " + show_ring + "\n    replay: " + replay_ring + "\n"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("prealloc"), std::string::npos) << r.out;

  r = testing::run_flashinfer("replay --dir " + root.string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("❌ No recorded calls in " + root.string() +
                       " itself; nothing replayed. It holds 2 recordings: replay one with the "
                       "command under it.\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("    replay: " + replay_ring + "\n"), std::string::npos) << r.out;
  r = testing::run_flashinfer("replay --json --dir " + root.string());
  EXPECT_EQ(r.status, 2) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["error"], "no recorded calls");
  ASSERT_EQ(j["recordings_below"].size(), 2u) << r.out;
  EXPECT_EQ(j["recordings_below"][1]["dir"], ring.string());
  EXPECT_EQ(j["recordings_below"][1]["calls"], 3);
  EXPECT_EQ(j["recordings_below"][1]["trigger"], "exit");
  EXPECT_EQ(j["recordings_below"][1]["replay"], replay_ring);

  // The printed command lines open the recording.
  r = testing::run_command(replay_ring);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Summary: 3 passed, 0 failed/mismatch"), std::string::npos) << r.out;
  r = testing::run_command(show_ring);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(": 3 recorded calls"), std::string::npos) << r.out;

  // A session with recordings below it as well: its summary, then the recordings.
  fs::copy(ring, dir_ / "session", fs::copy_options::recursive);
  fs::copy(ring, dir_ / "session" / "kept", fs::copy_options::recursive);
  r = testing::run_flashinfer("show --dir " + (dir_ / "session").string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Total completed calls: 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Also 1 recording in folders below it:\n  " +
                       (dir_ / "session" / "kept").string() + ": 3 recorded calls"),
            std::string::npos)
      << r.out;

  // Nothing at any level: both fail.
  fs::create_directories(dir_ / "empty" / "sub");
  r = testing::run_flashinfer("show --dir " + (dir_ / "empty").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("❌ No recorded calls in " + (dir_ / "empty").string() +
                       ", nor in any folder below it"),
            std::string::npos)
      << r.out;
  r = testing::run_flashinfer("replay --dir " + (dir_ / "empty").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find(", nor in any folder below it"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace flashinfer
