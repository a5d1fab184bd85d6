// The ring's fast path for calls that repeat a recent call's arguments (recorder/ring.cpp,
// InputShape / OutputShape): such a call takes its record template and archive layouts from the
// op's recent calls by a key of the arguments' raw values. Whatever path a call takes, its
// dump must be what record-everything mode writes for it: the same record (but for the
// per-call fields) and the same tensors, for calls that differ from a recent one only in a
// float's sign, a tensor's strides or storage offset, a dtype, a string, a keyword left at its
// default, an optional written argument or the result's values.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "flashinfer/tensor_io.h"
#include "recorder/recorder_internal.h"
#include "recorder/ring.h"

namespace flashinfer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// shape_probe(x, n, eps, mode, out=None, *, scale=1.0) -> (x * scale, n + 1, eps); writes
// x * scale into `out` (float32, x's shape) when given.
std::tuple<Tensor, int64_t, double> shape_probe(const Tensor& x, int64_t n, double eps,
                                                const std::string& mode,
                                                const std::optional<Tensor>& out, double scale);

const OpDecl& shape_probe_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "shape_probe";
    decl.module = "tests.ring_shapes";
    decl.params = {ParamDecl("x", ParamKind::kTensor),
                   ParamDecl("n", ParamKind::kInt),
                   ParamDecl("eps", ParamKind::kFloat),
                   ParamDecl("mode", ParamKind::kString),
                   ParamDecl("out", ParamKind::kTensor).opt(),
                   ParamDecl("scale", ParamKind::kFloat).def(1.0).kw()};
    decl.params[4].mutated = true;
    decl.returns = "tuple[Tensor, int, float]";
    decl.invoke = [](const CallArgs& a) -> Value {
      return to_value(
          shape_probe(a.tensor(0), a.i64(1), a.f64(2), a.str(3), a.optional_tensor(4), a.f64(5)));
    };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

std::tuple<Tensor, int64_t, double> shape_probe(const Tensor& x, int64_t n, double eps,
                                                const std::string& mode,
                                                const std::optional<Tensor>& out, double scale) {
  return call_api(
      &shape_probe_decl,
      [&] {
        std::vector<double> v = x.contiguous().to_double_vector();
        for (double& e : v) e *= scale;
        if (out) {
          auto* p = static_cast<float*>(out->data_ptr());
          for (std::size_t k = 0; k < v.size(); ++k) p[k] = static_cast<float>(v[k]);
        }
        return std::make_tuple(Tensor::from_vector(v, x.shape(), x.dtype()), n + 1, eps);
      },
      x, n, eps, mode, out, scale);
}

Tensor iota(std::vector<int64_t> shape, double start, DType dtype = DType::kFloat32) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<double>(i);
  return Tensor::from_vector(v, shape, dtype);
}

// The calls, `round` changing the tensors' values only. Seven distinct argument keys (the op
// keeps its last eight), each differing from the first in one respect.
void run_calls(int round) {
  const double b = 10.0 * round;
  const Tensor big = iota({3, 4}, b);
  const Tensor out = Tensor::zeros({2, 4}, DType::kFloat32);
  shape_probe(iota({2, 4}, b), 1, 0.0, "a", std::nullopt, 1.0);
  shape_probe(iota({2, 4}, b + 1), 1, 0.0, "a", std::nullopt, 1.0);              // the same key
  shape_probe(iota({2, 4}, b), 1, -0.0, "a", std::nullopt, 1.0);                 // a float's sign
  shape_probe(iota({4, 2}, b).transpose(0, 1), 1, 0.0, "a", std::nullopt, 1.0);  // strides
  shape_probe(big.slice(0, 1, 3), 1, 0.0, "a", std::nullopt, 1.0);               // storage offset 4
  shape_probe(iota({2, 4}, b, DType::kBFloat16), 1, 0.0, "b", std::nullopt, 1.0);
  shape_probe(iota({2, 4}, b), 1, 0.0, "a", out, 2.0);           // written argument, keyword given
  shape_probe(iota({2, 4}, b), 2, 0.0, "a", std::nullopt, 1.0);  // the result's int
}

// A dump's call directories in call order.
std::vector<fs::path> calls(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> seq;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!e.is_directory() || !fs::exists(e.path() / "metadata.jsonl")) continue;
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

// A call's record lines without the fields each call has of its own.
std::vector<json> records(const fs::path& call) {
  std::ifstream f(call / "metadata.jsonl");
  std::vector<json> out;
  std::string l;
  while (std::getline(f, l)) {
    if (l.empty()) continue;
    json j = json::parse(l);
    for (const char* k :
         {"dump_dir", "timestamp", "call_sequence", "process_sequence", "process_id"}) {
      j.erase(k);
    }
    out.push_back(std::move(j));
  }
  return out;
}

void expect_same_tensors(const fs::path& a, const fs::path& b) {
  ASSERT_EQ(fs::exists(a), fs::exists(b)) << a << " / " << b;
  if (!fs::exists(a)) return;
  const NamedTensors x = load_torch(a.string()), y = load_torch(b.string());
  ASSERT_EQ(x.size(), y.size()) << a;
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].first, y[i].first) << a;
    EXPECT_EQ(x[i].second.dtype(), y[i].second.dtype()) << a << " " << x[i].first;
    EXPECT_EQ(x[i].second.shape(), y[i].second.shape()) << a << " " << x[i].first;
    EXPECT_EQ(x[i].second.to_double_vector(), y[i].second.to_double_vector())
        << a << " " << x[i].first;
  }
}

class RingShapes : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fi_ring_shapes_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    recorder::set_log_sink([](const std::string&) {});
  }
  void TearDown() override {
    recorder::stop();
    recorder::set_log_sink({});
    fs::remove_all(dir_);
  }
  // Runs `run(0)` then `run(1)` in record-everything mode (every call by the general writer),
  // then in ring mode, where the second round's calls repeat the first round's keys; expects
  // the ring's dump to hold what record-everything mode wrote, call by call: the same records
  // (but for the per-call fields) and the same tensors. Returns the ring's call directories and
  // sets `second_round_hits_` to the hooks of the second round that took the fast path.
  std::vector<fs::path> compare_with_disk(const std::function<void(int)>& run,
                                          std::size_t n_calls) {
    recorder::Config disk;
    disk.dump_dir = (dir_ / "disk").string();
    recorder::start(disk);
    run(0);
    run(1);
    recorder::stop();
    recorder::Config ring;
    ring.dump_dir = (dir_ / "ring").string();
    ring.ring = 64;
    recorder::start(ring);
    run(0);
    const uint64_t before = recorder::internal::ring_shape_hits();
    run(1);
    second_round_hits_ = recorder::internal::ring_shape_hits() - before;
    root_ = recorder::dump_ring("shapes");
    recorder::stop();
    EXPECT_FALSE(root_.empty());
    const std::vector<fs::path> d = calls(dir_ / "disk"), r = calls(root_);
    EXPECT_EQ(d.size(), n_calls);
    EXPECT_EQ(r.size(), n_calls);
    for (std::size_t i = 0; i < d.size() && i < r.size(); ++i) {
      SCOPED_TRACE("call " + std::to_string(i + 1));
      const std::vector<json> want = records(d[i]), got = records(r[i]);
      EXPECT_EQ(got.size(), 2u);
      EXPECT_EQ(got, want);
      for (const char* f : {"inputs.pt", "outputs.pt", "mutated.pt"}) {
        expect_same_tensors(r[i] / f, d[i] / f);
      }
    }
    // And the ring's dump replays.
    for (const auto& res : replay::replay_sequence(root_)) {
      EXPECT_EQ(res.status, replay::Status::kPassed) << res.dump_dir << " " << res.error;
    }
    return r;
  }
  fs::path dir_;
  std::string root_;
  uint64_t second_round_hits_ = 0;
};

TEST_F(RingShapes, RepeatedCallsDumpWhatRecordEverythingModeWrites) {
  const std::vector<fs::path> r = compare_with_disk(run_calls, 16);
  ASSERT_EQ(r.size(), 16u);
  // Both hooks of each of the second round's 8 calls took the fast path.
  EXPECT_EQ(second_round_hits_, 16u);
  // The records say what differed.
  EXPECT_EQ(records(r[2])[0]["input_metadata"]["arg_2"], -0.0);
  EXPECT_TRUE(std::signbit(records(r[2])[0]["input_metadata"]["arg_2"].get<double>()));
  EXPECT_EQ(records(r[3])[0]["tensor_details"]["arg_0"]["stride"], json::array({1, 2}));
  EXPECT_EQ(records(r[6])[0]["input_metadata"]["kwarg_scale"], 2.0);
  EXPECT_FALSE(records(r[0])[0]["input_metadata"].contains("kwarg_scale"));
  EXPECT_EQ(records(r[6])[1]["tensor_info"]["mutated_tensor_keys"], json::array({"arg_4"}));
  EXPECT_EQ(records(r[7])[1]["output_metadata"]["result_1"], 3);
}

// shape_varargs(x, *args, scale=1.0) -> x * scale plus every tensor among args (upstream's
// *args holder: its items are recorded as arguments of their own).
Tensor shape_varargs(const Tensor& x, const std::vector<Value>& rest, double scale);

const OpDecl& shape_varargs_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "shape_varargs";
    decl.module = "tests.ring_shapes";
    decl.params = {ParamDecl("x", ParamKind::kTensor), ParamDecl("args", ParamKind::kList),
                   ParamDecl("scale", ParamKind::kFloat).def(1.0).kw()};
    decl.var_positional = "args";
    decl.returns = "Tensor";
    decl.invoke = [](const CallArgs& a) -> Value {
      return shape_varargs(a.tensor(0), a[1].items(), a.f64(2));
    };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

Tensor shape_varargs(const Tensor& x, const std::vector<Value>& rest, double scale) {
  return call_api(
      &shape_varargs_decl,
      [&] {
        std::vector<double> v = x.contiguous().to_double_vector();
        for (double& e : v) e *= scale;
        for (const Value& r : rest) {
          if (!r.is_tensor()) continue;
          const std::vector<double> e = r.as_tensor().contiguous().to_double_vector();
          for (std::size_t k = 0; k < v.size(); ++k) v[k] += e[k];
        }
        return Tensor::from_vector(v, x.shape(), DType::kFloat32);
      },
      x, rest, scale);
}

TEST_F(RingShapes, VarPositionalItemsAreArgumentsOfTheirOwn) {
  const auto run = [](int round) {
    const double b = 100.0 * round;
    const Tensor x = iota({4}, b), y = iota({4}, b + 1), z = iota({4}, b + 2);
    shape_varargs(x, {Value(y), Value(int64_t{3}), Value(z)}, 1.0);
    shape_varargs(x, {Value(z), Value(int64_t{3}), Value(y)}, 1.0);  // the same key
    shape_varargs(x, {Value(int64_t{3}), Value(y), Value(z)}, 1.0);  // tensors elsewhere
    shape_varargs(x, {Value(y)}, 0.5);
  };
  const std::vector<fs::path> r = compare_with_disk(run, 8);
  ASSERT_EQ(r.size(), 8u);
  EXPECT_EQ(second_round_hits_, 8u);
  // The items of *args are numbered after the named positional parameters (x and the holder
  // itself, as upstream's recorder numbers them): items 0 and 2 are arg_2 and arg_4.
  const NamedTensors in = load_torch((r[5] / "inputs.pt").string());
  ASSERT_EQ(in.size(), 3u);
  EXPECT_EQ(in[1].first, "arg_2");
  EXPECT_EQ(in[1].second.to_double_vector(), iota({4}, 102.0).to_double_vector());
  EXPECT_EQ(in[2].first, "arg_4");
  EXPECT_EQ(records(r[5])[0]["input_metadata"]["arg_3"], 3);
}

// shape_sum(xs) -> the element-wise sum of a list of float32 tensors of one shape.
Tensor shape_sum(const std::vector<Tensor>& xs);

const OpDecl& shape_sum_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "shape_sum";
    decl.module = "tests.ring_shapes";
    decl.params = {ParamDecl("xs", ParamKind::kList)};
    decl.returns = "Tensor";
    decl.invoke = [](const CallArgs& a) -> Value {
      std::vector<Tensor> xs;
      for (const Value& v : a[0].items()) xs.push_back(v.as_tensor());
      return shape_sum(xs);
    };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

Tensor shape_sum(const std::vector<Tensor>& xs) {
  return call_api(
      &shape_sum_decl,
      [&] {
        std::vector<double> v(static_cast<std::size_t>(xs.at(0).numel()), 0.0);
        for (const Tensor& x : xs) {
          const std::vector<double> e = x.contiguous().to_double_vector();
          for (std::size_t k = 0; k < v.size(); ++k) v[k] += e[k];
        }
        return Tensor::from_vector(v, xs[0].shape(), DType::kFloat32);
      },
      xs);
}

// shape_pair_write(cache, x) -> None; writes x into both tensors of the (K, V) pair `cache`
// (float32, x's shape), the way append_paged_kv_cache writes its cache pair.
void shape_pair_write(const std::pair<Tensor, Tensor>& cache, const Tensor& x);

const OpDecl& shape_pair_write_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "shape_pair_write";
    decl.module = "tests.ring_shapes";
    decl.params = {ParamDecl("cache", ParamKind::kAny), ParamDecl("x", ParamKind::kTensor)};
    decl.params[0].mutated = true;
    decl.returns = "None";
    decl.invoke = [](const CallArgs& a) -> Value {
      const auto& kv = a[0].items();
      shape_pair_write({kv.at(0).as_tensor(), kv.at(1).as_tensor()}, a.tensor(1));
      return Value();
    };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

void shape_pair_write(const std::pair<Tensor, Tensor>& cache, const Tensor& x) {
  call_api(
      &shape_pair_write_decl,
      [&] {
        const std::vector<double> v = x.contiguous().to_double_vector();
        for (const Tensor* t : {&cache.first, &cache.second}) {
          auto* p = static_cast<float*>(t->data_ptr());
          for (std::size_t k = 0; k < v.size(); ++k) p[k] = static_cast<float>(v[k]);
        }
      },
      cache, x);
}

// The tensors of a list argument and of a written (K, V) pair take the fast path too, under the
// keys the general path gives them (key__0, key__1), inputs and mutated both.
TEST_F(RingShapes, ListAndCachePairItemsTakeTheFastPath) {
  const auto run = [](int round) {
    const double b = 100.0 * round;
    const Tensor k = Tensor::zeros({2, 4}, DType::kFloat32);
    const Tensor v = Tensor::zeros({2, 4}, DType::kFloat32);
    shape_sum({iota({2, 4}, b), iota({2, 4}, b + 1)});
    shape_sum({iota({2, 4}, b + 2), iota({4, 2}, b).transpose(0, 1)});  // strides
    shape_pair_write({k, v}, iota({2, 4}, b + 3));
    shape_pair_write({k.slice(0, 1, 2), v.slice(0, 0, 1)}, iota({1, 4}, b + 4));
  };
  const std::vector<fs::path> r = compare_with_disk(run, 8);
  ASSERT_EQ(r.size(), 8u);
  EXPECT_EQ(second_round_hits_, 8u);
  const NamedTensors in = load_torch((r[5] / "inputs.pt").string());
  ASSERT_EQ(in.size(), 2u);
  EXPECT_EQ(in[1].first, "arg_0__1");
  const NamedTensors mut = load_torch((r[7] / "mutated.pt").string());
  ASSERT_EQ(mut.size(), 2u);
  EXPECT_EQ(mut[0].first, "arg_0__0");
  EXPECT_EQ(mut[1].first, "arg_0__1");
  EXPECT_EQ(mut[1].second.to_double_vector(), iota({1, 4}, 104.0).to_double_vector());
}

// A call whose tensors sit deeper (a list inside the *args holder) takes the general path, and
// a key found for one op is not taken by another.
TEST_F(RingShapes, DeeperTensorsTakeTheGeneralPath) {
  recorder::Config ring;
  ring.dump_dir = (dir_ / "ring").string();
  ring.ring = 16;
  recorder::start(ring);
  const Tensor x = iota({2, 4}, 1.0);
  const Tensor w = Tensor::full({4}, 1.0, DType::kFloat32);
  rmsnorm(x, w);
  const uint64_t before = recorder::internal::ring_shape_hits();
  rmsnorm(x, w);  // repeats: both hooks hit
  EXPECT_EQ(recorder::internal::ring_shape_hits() - before, 2u);
  shape_probe(x, 1, 0.0, "a", std::nullopt, 1.0);  // another op, the same tensor first
  EXPECT_EQ(recorder::internal::ring_shape_hits() - before, 2u);
  const Tensor y = iota({2, 4}, 5.0), z = iota({2, 4}, 7.0);
  shape_varargs(x, {Value::list({Value(y)})}, 1.0);
  shape_varargs(x, {Value::list({Value(z)})}, 1.0);  // repeats, but its tensor is deeper
  EXPECT_EQ(recorder::internal::ring_shape_hits() - before, 2u);
  const std::string root = recorder::dump_ring("nested");
  ASSERT_FALSE(root.empty());
  const std::vector<fs::path> c = calls(root);
  ASSERT_EQ(c.size(), 5u);
  const NamedTensors in = load_torch((c[4] / "inputs.pt").string());
  ASSERT_EQ(in.size(), 2u);
  EXPECT_EQ(in[1].first, "arg_2__0");
  EXPECT_EQ(in[1].second.to_double_vector(), z.to_double_vector());
}

// The paged decode wrapper's run has a record extension (the page ids a run read when it read
// them at run: api/attention_ids_at_run.cpp) that adds nothing for a CPU wrapper, which copied
// its ids at plan: a repeated run keeps the fast path (both hooks), where any extension had
// switched it off for every call of its op, and the ring's dump replays.
TEST_F(RingShapes, AnExtensionThatAddsNothingKeepsTheFastPath) {
  recorder::Config ring;
  ring.dump_dir = (dir_ / "ring").string();
  ring.ring = 16;
  recorder::start(ring);
  const int64_t page = 4, hq = 4, hkv = 2, d = 64, pages = 6;
  const Tensor k =
      Tensor::empty({pages, page, hkv, d}, DType::kFloat32).uniform_(41).to(DType::kFloat16);
  const Tensor v =
      Tensor::empty({pages, page, hkv, d}, DType::kFloat32).uniform_(42).to(DType::kFloat16);
  const PagedKVCache cache(k, v);
  const Tensor q = Tensor::empty({2, hq, d}, DType::kFloat32).uniform_(43).to(DType::kFloat16);
  BatchDecodeWithPagedKVCacheWrapper w(Tensor::zeros({1 << 18}, DType::kUInt8));
  w.plan(Tensor::from_vector({0, 3, 5}, {3}, DType::kInt32),
         Tensor::from_vector({5, 0, 2, 1, 4}, {5}, DType::kInt32),
         Tensor::from_vector({2, 4}, {2}, DType::kInt32), hq, hkv, d, page);
  w.run(q, cache);
  const uint64_t before = recorder::internal::ring_shape_hits();
  w.run(q, cache);
  EXPECT_EQ(recorder::internal::ring_shape_hits() - before, 2u);
  const std::string root = recorder::dump_ring("paged");
  ASSERT_FALSE(root.empty());
  const std::vector<replay::Result> r = replay::replay_sequence(root);
  ASSERT_EQ(r.size(), 4u);  // __init__, plan, run, run
  for (const auto& res : r) {
    EXPECT_EQ(res.status, replay::Status::kPassed) << res.dump_dir << " " << res.error;
  }
}

}  // namespace
}  // namespace flashinfer
