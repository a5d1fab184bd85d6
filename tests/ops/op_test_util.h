// Helpers shared by the norm, activation and RoPE op tests: a call observer that snapshots
// arguments the way a recorder does (tensors copied before the op runs), replay through an op's
// declared invoker, and small tensor builders.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "util/test_util.h"

namespace flashinfer::testing {

/// Deep copy of a Value: tensors (also inside tuples/lists) are cloned.
inline Value snapshot(const Value& v) {
  if (v.is_tensor()) return Value(v.as_tensor().clone());
  if (v.is_sequence()) {
    Value::Items items;
    for (const auto& x : v.items()) items.push_back(snapshot(x));
    return v.kind() == Value::Kind::kTuple ? Value::tuple(std::move(items))
                                           : Value::list(std::move(items));
  }
  return v;
}

/// One recorded call on a wrapper object, kept for rebuilding the object in replay().
struct ObjectStep {
  std::string name;
  std::vector<Value> inputs;  // snapshots; inputs[0] is `self`
  bool failed = false;
};
/// The calls made on one object from its `__init__` on, shared by the Calls that need them.
using ObjectHistory = std::vector<ObjectStep>;

/// Records every outermost call: inputs snapshotted before the op runs, the result and the
/// (possibly mutated) arguments after it. A wrapper's calls also go to its object's history, so
/// that replay() rebuilds the object instead of using the recorded `self` (a raw pointer to the
/// live wrapper, which may be destroyed by then).
class RecordingObserver : public CallObserver {
 public:
  struct Call {
    std::string name;
    std::vector<Value> inputs;  // before the call
    std::vector<Value> after;   // arguments after the call (in-place ops mutate them)
    Value result;
    std::string error;
    // Methods: the object's calls (shared, by value) and this call's index in them; null when
    // the object's __init__ was not recorded.
    std::shared_ptr<ObjectHistory> history;
    std::size_t step = 0;
  };
  void on_call_begin(const OpDecl& decl, std::span<const Value> args) override {
    Call c;
    c.name = decl.name;
    for (const auto& a : args) c.inputs.push_back(snapshot(a));
    if (decl.is_method() && !args.empty() && args[0].kind() == Value::Kind::kObject) {
      // An id may come back for a new object after the old one is destroyed: __init__ starts
      // a fresh history.
      auto& h = histories_[args[0].as_object().id];
      if (decl.is_constructor()) h = std::make_shared<ObjectHistory>();
      if (h) {
        c.history = h;
        c.step = h->size();
        h->push_back({decl.name, c.inputs, false});
      }
    }
    calls.push_back(std::move(c));
  }
  void on_call_end(const OpDecl&, std::span<const Value> args, const Value& result) override {
    for (const auto& a : args) calls.back().after.push_back(snapshot(a));
    calls.back().result = snapshot(result);
  }
  void on_call_error(const OpDecl&, std::span<const Value>, std::string_view what) override {
    calls.back().error = std::string(what);
    if (calls.back().history) (*calls.back().history)[calls.back().step].failed = true;
  }
  std::vector<Call> calls;

 private:
  std::map<uint64_t, std::shared_ptr<ObjectHistory>> histories_;
};

/// Installs a RecordingObserver for the lifetime of the guard.
class RecordingScope {
 public:
  RecordingScope() : obs_(std::make_shared<RecordingObserver>()) { add_call_observer(obs_); }
  ~RecordingScope() { remove_call_observer(obs_); }
  RecordingObserver& observer() { return *obs_; }

 private:
  std::shared_ptr<RecordingObserver> obs_;
};

/// Invokes `name` through its declaration on fresh copies of `inputs` (inputs[0] replaced by
/// `self` when given). Returns (result, the bound arguments after the call).
inline std::pair<Value, std::vector<Value>> invoke_recorded(const std::string& name,
                                                            const std::vector<Value>& inputs,
                                                            const Value* self = nullptr) {
  const OpDecl* decl = OpRegistry::global().find(name);
  if (decl == nullptr) throw std::runtime_error("op not registered: " + name);
  // Keyword-only parameters are passed by keyword, as a recorded kwarg_<name> is.
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Value v = (i == 0 && self != nullptr) ? *self : snapshot(inputs[i]);
    if (i < decl->params.size() && decl->params[i].keyword_only) {
      kwargs.emplace_back(decl->params[i].name, std::move(v));
    } else {
      args.push_back(std::move(v));
    }
  }
  CallArgs bound(*decl, bind_arguments(*decl, args, kwargs));
  Value result = decl->invoke(bound);
  return {result, bound.values()};
}

/// Runs the recorded call again through its declaration's invoker (as `flashinfer replay`
/// does), on fresh copies of the recorded inputs. Returns (result, arguments after the call).
/// A wrapper method runs on a new object built from the recorded history (its __init__ and the
/// successful calls before this one), as replay from a dump does, never on the recorded
/// wrapper: that one may be gone. Without a recorded __init__ it throws flashinfer::Error.
inline std::pair<Value, std::vector<Value>> replay(const RecordingObserver::Call& call) {
  const OpDecl* decl = OpRegistry::global().find(call.name);
  if (decl == nullptr) throw std::runtime_error("op not registered: " + call.name);
  if (!decl->is_method() || decl->is_constructor()) return invoke_recorded(call.name, call.inputs);
  if (!call.history) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, call.name, "self",
                    "in-memory replay rebuilds the object from its __init__, which was not "
                    "recorded: construct the wrapper inside the RecordingScope");
  }
  const ObjectHistory& h = *call.history;
  Value self;
  {
    ScopedUnobserved quiet;  // the rebuilding calls are not part of the recording
    self = invoke_recorded(h[0].name, h[0].inputs).first;
    for (std::size_t i = 1; i < call.step; ++i) {
      if (!h[i].failed) invoke_recorded(h[i].name, h[i].inputs, &self);
    }
  }
  auto out = invoke_recorded(call.name, call.inputs, &self);
  // The new object stands in for the recorded one: report the recorded `self`.
  if (!out.second.empty() && !call.inputs.empty()) out.second[0] = call.inputs[0];
  return out;
}

/// Bitwise-equal tensors (same shape, same values as doubles; NaN equals NaN).
inline ::testing::AssertionResult same_values(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return ::testing::AssertionFailure() << "kinds differ";
  if (a.is_tensor()) return all_close(a.as_tensor(), b.as_tensor(), {0.0, 0.0});
  if (a.is_sequence()) {
    if (a.items().size() != b.items().size()) return ::testing::AssertionFailure() << "sizes";
    for (std::size_t i = 0; i < a.items().size(); ++i) {
      auto r = same_values(a.items()[i], b.items()[i]);
      if (!r) return r << " (item " << i << ")";
    }
    return ::testing::AssertionSuccess();
  }
  return a == b ? ::testing::AssertionSuccess() : ::testing::AssertionFailure() << "values differ";
}

/// Replays a recorded call (replay() above): it succeeded, and its result and every argument
/// after the call (in-place ops included) equal the live call's exactly.
inline ::testing::AssertionResult replays_identically(const RecordingObserver::Call& c) {
  if (!c.error.empty()) return ::testing::AssertionFailure() << "the call failed: " << c.error;
  auto [result, after] = replay(c);
  if (auto r = same_values(result, c.result); !r) return r << " (result)";
  if (after.size() != c.after.size()) {
    return ::testing::AssertionFailure()
           << after.size() << " arguments after the replay, " << c.after.size() << " recorded";
  }
  for (std::size_t a = 0; a < after.size(); ++a) {
    if (auto r = same_values(after[a], c.after[a]); !r) return r << " (argument " << a << ")";
  }
  return ::testing::AssertionSuccess();
}

/// Records `run`'s calls to a fresh dump folder (upstream's layout) under the temp directory,
/// "fi_<tag>_rec_<pid>", and returns it; the caller replays and removes it.
inline std::filesystem::path record_dump(const std::string& tag, const std::function<void()>& run) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_" + tag + "_rec_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  run();
  recorder::stop();
  return dir;
}

/// Records `run`'s calls to a fresh dump folder (record_dump), replays each dump from disk and
/// expects every replay to pass; returns how many dumps there were.
inline int dump_replay_all(const std::string& tag, const std::function<void()>& run) {
  namespace fs = std::filesystem;
  const fs::path dir = record_dump(tag, run);
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_directory()) continue;
    ++n;
    const replay::Result r = replay::replay_from_dump(e.path().string());
    EXPECT_EQ(r.status, replay::Status::kPassed) << e.path() << ": " << r.error;
  }
  fs::remove_all(dir);
  return n;
}

/// A CPU tensor of `dtype` with values uniform in [lo, hi), deterministic per seed.
inline Tensor rand_tensor(Shape shape, DType dtype, uint64_t seed, double lo = -2.0,
                          double hi = 2.0) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  t.uniform_(seed, lo, hi);
  return t;
}

/// A non-contiguous view with the given logical shape: every dimension padded and the last one
/// strided by 2, filled like rand_tensor.
inline Tensor strided_rand(const Shape& shape, DType dtype, uint64_t seed, double lo = -2.0,
                           double hi = 2.0) {
  Shape big = shape;
  for (auto& s : big) s += 3;
  big.back() = 2 * shape.back() + 1;
  Tensor t = rand_tensor(big, dtype, seed, lo, hi);
  for (int64_t d = 0; d + 1 < static_cast<int64_t>(shape.size()); ++d) {
    t = t.slice(d, 1, 1 + shape[static_cast<std::size_t>(d)]);
  }
  return t.slice(static_cast<int64_t>(shape.size()) - 1, 1, 1 + 2 * shape.back(), 2);
}

inline const char* dtype_label(DType d) {
  return d == DType::kFloat32 ? "fp32" : d == DType::kFloat16 ? "fp16" : "bf16";
}

}  // namespace flashinfer::testing
