// Private: argument checks shared by the public ops. Each throws flashinfer::Error naming the
// op and the argument.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "flashinfer/error.h"
#include "flashinfer/tensor.h"

namespace flashinfer::api {

inline void check_defined(const Tensor& t, const char* op, const char* arg) {
  FLASHINFER_CHECK(t.defined(), op, arg, "undefined tensor");
}

inline void check_dim(const Tensor& t, std::initializer_list<int64_t> dims, const char* op,
                      const char* arg) {
  for (int64_t d : dims) {
    if (t.dim() == d) return;
  }
  std::string want;
  for (int64_t d : dims) want += (want.empty() ? "" : " or ") + std::to_string(d) + "-D";
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, arg, "expected a ", want, " tensor, got ",
                  t.dim(), "-D with shape ", shape_to_string(t.shape()));
}

inline void check_dtype_in(const Tensor& t, std::initializer_list<DType> dtypes, const char* op,
                           const char* arg) {
  for (DType d : dtypes) {
    if (t.dtype() == d) return;
  }
  std::string want;
  for (DType d : dtypes) want += (want.empty() ? "" : ", ") + std::string(dtype_torch_name(d));
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, arg, "dtype ", dtype_torch_name(t.dtype()),
                  " is not supported (expected one of ", want, ")");
}

inline void check_same_dtype(const Tensor& t, const Tensor& ref, const char* op, const char* arg,
                             const char* ref_arg) {
  FLASHINFER_CHECK(t.dtype() == ref.dtype(), op, arg, "dtype ", dtype_torch_name(t.dtype()),
                   " does not match ", ref_arg, "'s ", dtype_torch_name(ref.dtype()));
}

inline void check_same_device(const Tensor& t, const Tensor& ref, const char* op, const char* arg,
                              const char* ref_arg) {
  FLASHINFER_CHECK(t.device() == ref.device(), op, arg, "is on ", t.device().str(), " but ",
                   ref_arg, " is on ", ref.device().str());
}

inline void check_shape_eq(const Tensor& t, const Shape& shape, const char* op, const char* arg) {
  FLASHINFER_CHECK(t.shape() == shape, op, arg, "expected shape ", shape_to_string(shape), ", got ",
                   shape_to_string(t.shape()));
}

inline void check_non_empty(const Tensor& t, const char* op, const char* arg) {
  FLASHINFER_CHECK(t.numel() > 0, op, arg, "empty tensor (shape ", shape_to_string(t.shape()), ")");
}

/// True when two views may share memory (compared by address, so views of the same memory
/// through different storages count too). Views with the same leading stride whose rows each
/// fit inside that stride (q and k sliced from one packed qkv buffer) are compared row by row;
/// other views by their overall spans, which is conservative.
inline bool views_overlap(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) return false;
  // Byte span [lo, hi) of dims [first_dim, dim) relative to the view's data pointer.
  auto span = [](const Tensor& t, int64_t first_dim, int64_t& lo, int64_t& hi) {
    int64_t first = 0, last = 0;
    for (int64_t d = first_dim; d < t.dim(); ++d) {
      const int64_t reach = (t.size(d) - 1) * t.stride(d);
      (reach < 0 ? first : last) += reach;
    }
    const auto es = static_cast<int64_t>(t.element_size());
    lo = first * es;
    hi = (last + 1) * es;
  };
  const int64_t delta = static_cast<int64_t>(reinterpret_cast<intptr_t>(b.data_ptr()) -
                                             reinterpret_cast<intptr_t>(a.data_ptr()));
  int64_t alo, ahi, blo, bhi;
  if (a.dim() >= 2 && b.dim() >= 2 && a.size(0) == b.size(0) && a.stride(0) == b.stride(0) &&
      a.stride(0) > 0 && a.element_size() == b.element_size()) {
    const int64_t s = a.stride(0) * static_cast<int64_t>(a.element_size());
    span(a, 1, alo, ahi);
    span(b, 1, blo, bhi);
    if (ahi - alo <= s && bhi - blo <= s) {
      // Row i of a meets row j of b iff (i - j) * s lies in (delta + blo - ahi, delta + bhi - alo).
      auto floor_div = [](int64_t x, int64_t y) { return x / y - ((x % y != 0) && (x < 0)); };
      const int64_t k_min = floor_div(delta + blo - ahi, s) + 1;
      const int64_t k_max = -floor_div(-(delta + bhi - alo), s) - 1;
      const int64_t n = a.size(0);
      return std::max(k_min, -(n - 1)) <= std::min(k_max, n - 1);
    }
  }
  span(a, 0, alo, ahi);
  span(b, 0, blo, bhi);
  return alo < delta + bhi && delta + blo < ahi;
}

/// For tensors an op writes: a zero stride on a dimension of size > 1 (a broadcast view) would
/// make several elements one memory location, and the result would depend on the schedule.
inline void check_writable(const Tensor& t, const char* op, const char* arg) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    FLASHINFER_CHECK(t.stride(d) != 0 || t.size(d) <= 1, op, arg,
                     "is written but has stride 0 in dimension ", d, " (a broadcast view)");
  }
}

inline void check_no_overlap(const Tensor& t, const Tensor& other, const char* op, const char* arg,
                             const char* other_arg) {
  FLASHINFER_CHECK(!views_overlap(t, other), op, arg, "must not overlap ", other_arg, " in memory");
}

}  // namespace flashinfer::api
