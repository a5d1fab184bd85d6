// Ops declared the way code outside the library declares its own API (register_op + call_api +
// ApiObject), used by the API logging tests. They mirror the functions of upstream's
// tests/utils/test_logging.py.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"

namespace apilog_test {

using flashinfer::OpDecl;
using flashinfer::ParamDecl;
using flashinfer::ParamKind;
using flashinfer::Tensor;
using flashinfer::Value;

enum class TestEnum { OPTION_A = 0, OPTION_B = 1 };
enum class StringEnum { MODE_DEFAULT, MODE_OPTIMIZED };

// Found by ADL when call_api packs the arguments.
inline Value to_value(TestEnum e) {
  return flashinfer::EnumValue{"TestEnum", e == TestEnum::OPTION_A ? "OPTION_A" : "OPTION_B",
                               e == TestEnum::OPTION_A ? "0" : "1"};
}
inline Value to_value(StringEnum e) {
  return flashinfer::EnumValue{"StringEnum",
                               e == StringEnum::MODE_DEFAULT ? "MODE_DEFAULT" : "MODE_OPTIMIZED",
                               e == StringEnum::MODE_DEFAULT ? "default" : "optimized"};
}

/// Registers `decl` once (the first caller wins) and returns it.
inline const OpDecl& declare(const char* name, const std::function<OpDecl()>& make) {
  if (const OpDecl* d = flashinfer::OpRegistry::global().find(name)) return *d;
  return flashinfer::register_op(make());
}

inline OpDecl base_decl(const char* name) {
  OpDecl d;
  d.name = name;
  d.module = "apilog_test";
  return d;
}

inline Tensor times_two(const Tensor& x) {
  std::vector<double> v = x.to_double_vector();
  for (double& e : v) e *= 2.0;
  return Tensor::from_vector(v, x.shape(), x.dtype());
}

// ---- free functions ----

inline const OpDecl& test_function_decl() {
  static const OpDecl& d = declare("test_function", [] {
    OpDecl o = base_decl("test_function");
    o.params = {ParamDecl("x", ParamKind::kTensor)};
    o.returns = "Tensor";
    return o;
  });
  return d;
}
/// x * 2 (upstream's test_function).
inline Tensor test_function(const Tensor& x) {
  return flashinfer::call_api(
      &test_function_decl, [&] { return times_two(x); }, x);
}

inline const OpDecl& enum_fn_decl() {
  static const OpDecl& d = declare("enum_fn", [] {
    OpDecl o = base_decl("enum_fn");
    o.params = {ParamDecl("x", ParamKind::kInt),
                ParamDecl("mode", ParamKind::kEnum).def(to_value(TestEnum::OPTION_A)),
                ParamDecl("smode", ParamKind::kEnum).def(to_value(StringEnum::MODE_DEFAULT))};
    o.returns = "int";
    return o;
  });
  return d;
}
inline int64_t enum_fn(int64_t x, TestEnum mode = TestEnum::OPTION_A,
                       StringEnum smode = StringEnum::MODE_DEFAULT) {
  return flashinfer::call_api(
      &enum_fn_decl, [&] { return x; }, x, mode, smode);
}

inline const OpDecl& defaults_fn_decl() {
  static const OpDecl& d = declare("defaults_fn", [] {
    OpDecl o = base_decl("defaults_fn");
    o.params = {ParamDecl("x", ParamKind::kInt), ParamDecl("y", ParamKind::kInt).def(10),
                ParamDecl("z", ParamKind::kInt).def(20),
                ParamDecl("mode", ParamKind::kEnum).def(to_value(TestEnum::OPTION_A))};
    o.returns = "int";
    return o;
  });
  return d;
}
inline int64_t defaults_fn(int64_t x, int64_t y = 10, int64_t z = 20,
                           TestEnum mode = TestEnum::OPTION_A) {
  return flashinfer::call_api(
      &defaults_fn_decl, [&] { return x + y + z; }, x, y, z, mode);
}

inline const OpDecl& explicit_fn_decl() {
  static const OpDecl& d = declare("explicit_fn", [] {
    OpDecl o = base_decl("explicit_fn");
    o.params = {ParamDecl("x", ParamKind::kInt), ParamDecl("y", ParamKind::kInt).def(10),
                ParamDecl("z", ParamKind::kInt).def(20)};
    o.returns = "int";
    return o;
  });
  return d;
}
inline int64_t explicit_fn(int64_t x, int64_t y = 10, int64_t z = 20) {
  return flashinfer::call_api(
      &explicit_fn_decl, [&] { return x + y + z; }, x, y, z);
}

struct TestCrash : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline const OpDecl& crash_fn_decl() {
  static const OpDecl& d = declare("crash_fn", [] {
    OpDecl o = base_decl("crash_fn");
    o.params = {ParamDecl("x", ParamKind::kInt), ParamDecl("y", ParamKind::kInt)};
    o.returns = "int";
    return o;
  });
  return d;
}
/// Runs `probe` (if any) inside the body, then throws TestCrash.
inline int64_t crash_fn(int64_t x, int64_t y, const std::function<void()>& probe = {}) {
  return flashinfer::call_api(
      &crash_fn_decl,
      [&]() -> int64_t {
        if (probe) probe();
        throw TestCrash("Simulated crash");
      },
      x, y);
}

inline const OpDecl& types_fn_decl() {
  static const OpDecl& d = declare("types_fn", [] {
    OpDecl o = base_decl("types_fn");
    o.params = {ParamDecl("i", ParamKind::kInt),    ParamDecl("f", ParamKind::kFloat),
                ParamDecl("b", ParamKind::kBool),   ParamDecl("s", ParamKind::kString),
                ParamDecl("dt", ParamKind::kDType), ParamDecl("n", ParamKind::kAny).opt()};
    o.returns = "None";
    return o;
  });
  return d;
}
inline void types_fn(int64_t i, double f, bool b, const std::string& s, flashinfer::DType dt,
                     std::optional<int64_t> n = std::nullopt) {
  flashinfer::call_api(
      &types_fn_decl, [] {}, i, f, b, s, dt, n);
}

inline const OpDecl& nested_fn_decl() {
  static const OpDecl& d = declare("nested_fn", [] {
    OpDecl o = base_decl("nested_fn");
    o.params = {ParamDecl("data", ParamKind::kAny)};
    o.returns = "Any";
    return o;
  });
  return d;
}
inline Value nested_fn(const Value& data) {
  return flashinfer::call_api(
      &nested_fn_decl, [&] { return data; }, data);
}

inline const OpDecl& kwargs_fn_decl() {
  static const OpDecl& d = declare("kwargs_fn", [] {
    OpDecl o = base_decl("kwargs_fn");
    o.params = {ParamDecl("a", ParamKind::kInt).def(0), ParamDecl("b", ParamKind::kFloat).def(0.0),
                ParamDecl("c", ParamKind::kString).def("")};
    o.returns = "None";
    return o;
  });
  return d;
}
inline void kwargs_fn(int64_t a = 0, double b = 0.0, const std::string& c = "") {
  flashinfer::call_api(
      &kwargs_fn_decl, [] {}, a, b, c);
}

inline const OpDecl& stats_probe_decl() {
  static const OpDecl& d = declare("stats_probe", [] {
    OpDecl o = base_decl("stats_probe");
    o.params = {ParamDecl("t", ParamKind::kTensor)};
    o.returns = "None";
    return o;
  });
  return d;
}
inline void stats_probe(const Tensor& t) {
  flashinfer::call_api(
      &stats_probe_decl, [] {}, t);
}

inline const OpDecl& concurrent_op_decl() {
  static const OpDecl& d = declare("concurrent_op", [] {
    OpDecl o = base_decl("concurrent_op");
    o.params = {ParamDecl("tid", ParamKind::kInt), ParamDecl("i", ParamKind::kInt)};
    o.returns = "int";
    return o;
  });
  return d;
}
inline int64_t concurrent_op(int64_t tid, int64_t i) {
  return flashinfer::call_api(
      &concurrent_op_decl, [&] { return tid * 1000 + i; }, tid, i);
}

// ---- a stateful wrapper, declared like the attention wrappers ----

class TestWrapper : public flashinfer::ApiObject {
 public:
  static const OpDecl& init_decl() {
    static const OpDecl& d = declare("TestWrapper.__init__", [] {
      OpDecl o = base_decl("TestWrapper.__init__");
      o.class_name = "TestWrapper";
      o.params = {ParamDecl("self", ParamKind::kObject).type("TestWrapper"),
                  ParamDecl("workspace", ParamKind::kTensor),
                  ParamDecl("kv_layout", ParamKind::kString).def("NHD")};
      o.returns = "None";
      return o;
    });
    return d;
  }
  static const OpDecl& run_decl() {
    static const OpDecl& d = declare("TestWrapper.run", [] {
      OpDecl o = base_decl("TestWrapper.run");
      o.class_name = "TestWrapper";
      o.params = {ParamDecl("self", ParamKind::kObject).type("TestWrapper"),
                  ParamDecl("q", ParamKind::kTensor),
                  ParamDecl("scale", ParamKind::kFloat).def(1.0),
                  ParamDecl("return_lse", ParamKind::kBool).def(false)};
      o.returns = "Tensor";
      return o;
    });
    return d;
  }

  explicit TestWrapper(const Tensor& workspace, const std::string& kv_layout = "NHD")
      : kv_layout_(kv_layout) {
    flashinfer::call_api(
        &init_decl, [] {}, *this, workspace, kv_layout);
  }
  Tensor run(const Tensor& q, double scale = 1.0, bool return_lse = false) {
    return flashinfer::call_api(
        &run_decl, [&] { return times_two(q); }, *this, q, scale, return_lse);
  }

  std::string_view class_name() const override { return "TestWrapper"; }
  std::string_view module_name() const override { return "apilog_test"; }

 private:
  std::string kv_layout_;
};

}  // namespace apilog_test
