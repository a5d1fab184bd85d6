// Shared helpers for the GoogleTest suites: comparisons with per-dtype tolerances that report
// every mismatching element, CUDA availability, and naive reference helpers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/tensor_span.h"
#include "flashinfer/flashinfer.h"

namespace flashinfer::testing {

/// A tensor's bytes in row-major order (for bit-for-bit comparisons).
inline std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  std::vector<uint8_t> b(static_cast<std::size_t>(c.numel()) * c.element_size());
  if (!b.empty()) std::memcpy(b.data(), c.data_ptr(), b.size());
  return b;
}

struct Tolerance {
  double atol;
  double rtol;
};

/// Default tolerances for comparing an output of `dtype` with an fp64 reference: about two
/// units in the last place of the output format.
inline Tolerance default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return {1e-12, 1e-12};
    case DType::kFloat32:
      return {1e-5, 1e-5};
    case DType::kFloat16:
      return {1e-3, 2e-3};
    case DType::kBFloat16:
      return {8e-3, 1.6e-2};
    case DType::kFloat8E4M3FN:
      return {2e-2, 1.25e-1};
    case DType::kFloat8E5M2:
      return {4e-2, 2.5e-1};
    default:
      return {0.0, 0.0};
  }
}

/// Compares element by element: |a - e| <= atol + rtol * |e|, NaN only where NaN is expected,
/// infinities must match exactly. Returns a failure listing the count and the first offenders.
inline ::testing::AssertionResult all_close(const std::vector<double>& actual,
                                            const std::vector<double>& expected, Tolerance tol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected " << expected.size();
  }
  std::size_t bad = 0;
  std::ostringstream first;
  double max_abs = 0.0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    bool ok;
    if (std::isnan(e) || std::isnan(a)) {
      ok = std::isnan(e) && std::isnan(a);
    } else if (std::isinf(e) || std::isinf(a)) {
      ok = a == e;
    } else {
      const double d = std::fabs(a - e);
      max_abs = std::fmax(max_abs, d);
      ok = d <= tol.atol + tol.rtol * std::fabs(e);
    }
    if (!ok) {
      if (bad < 8) first << "\n  [" << i << "] actual " << a << " expected " << e;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << actual.size() << " elements mismatch (atol " << tol.atol << ", rtol "
         << tol.rtol << ", max abs diff " << max_abs << ")" << first.str();
}

inline ::testing::AssertionResult all_close(const Tensor& actual,
                                            const std::vector<double>& expected, Tolerance tol) {
  return all_close(actual.to_double_vector(), expected, tol);
}

inline ::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected,
                                            Tolerance tol) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << "shape " << shape_to_string(actual.shape())
                                         << " != " << shape_to_string(expected.shape());
  }
  return all_close(actual.to_double_vector(), expected.to_double_vector(), tol);
}

inline bool cuda_available() { return cuda_device_count() > 0; }

/// `t` copied to `device` with its shape, strides and offset kept. Tensor::to makes a contiguous
/// copy, so a CUDA-vs-CPU case that moves a strided view with it would run the CUDA kernel on
/// dense data only; this keeps the device run on the same layout as the CPU one.
inline Tensor to_keep_layout(const Tensor& t, Device device) {
  return detail::to_device_keep_layout(t, device);
}

#define FLASHINFER_SKIP_WITHOUT_CUDA()                                              \
  do {                                                                              \
    if (!::flashinfer::testing::cuda_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

/// Runs `stmt`, expects a flashinfer::Error whose op and argument are the given ones (and, for
/// the _CODE form, its code: kUnsupported for a refusal).
#define FLASHINFER_EXPECT_ERROR_IMPL(stmt, op_name, arg_name, more) \
  do {                                                              \
    try {                                                           \
      stmt;                                                         \
      ADD_FAILURE() << "expected flashinfer::Error from: " #stmt;   \
    } catch (const ::flashinfer::Error& e) {                        \
      EXPECT_EQ(e.op(), op_name) << e.what();                       \
      EXPECT_EQ(e.arg(), arg_name) << e.what();                     \
      more;                                                         \
    }                                                               \
  } while (0)
/// f throws a flashinfer::Error of op `op` naming `arg` (any argument when null) whose message
/// holds `text` (upstream's wording).
inline void expect_error_text(const std::function<void()>& f, const char* op, const char* arg,
                              const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "expected a flashinfer::Error holding: " << text;
  } catch (const ::flashinfer::Error& e) {
    EXPECT_EQ(e.op(), op) << e.what();
    if (arg != nullptr) {
      EXPECT_EQ(e.arg(), arg) << e.what();
    }
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

#define EXPECT_FI_ERROR(stmt, op_name, arg_name) \
  FLASHINFER_EXPECT_ERROR_IMPL(stmt, op_name, arg_name, (void)0)
#define EXPECT_FI_ERROR_CODE(stmt, op_name, arg_name, err_code) \
  FLASHINFER_EXPECT_ERROR_IMPL(stmt, op_name, arg_name, EXPECT_EQ(e.code(), err_code) << e.what())

/// Sets (or, with nullptr, unsets) an environment variable for a scope and puts back what was
/// there before, so that a test's switch neither leaks into later tests nor overrides what the
/// run exported (e.g. gpu-run-packed's variant runs).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const char* value) {
    if (value) {
      ::setenv(name_.c_str(), value, 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace flashinfer::testing
