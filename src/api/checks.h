// Private: argument checks shared by the public ops. Each throws flashinfer::Error naming the
// op and the argument.
#pragma once

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
  FLASHINFER_CHECK(t.shape() == shape, op, arg, "expected shape ", shape_to_string(shape),
                   ", got ", shape_to_string(t.shape()));
}

inline void check_non_empty(const Tensor& t, const char* op, const char* arg) {
  FLASHINFER_CHECK(t.numel() > 0, op, arg, "empty tensor (shape ", shape_to_string(t.shape()),
                   ")");
}

/// True when the memory spans of two views intersect (compared by address, so views of the same
/// memory through different storages count too). Spans are conservative for strided views.
inline bool views_overlap(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) return false;
  auto span = [](const Tensor& t, uintptr_t& lo, uintptr_t& hi) {
    int64_t first = 0, last = 0;
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t reach = (t.size(d) - 1) * t.stride(d);
      (reach < 0 ? first : last) += reach;
    }
    const auto base = reinterpret_cast<intptr_t>(t.data_ptr());
    const auto es = static_cast<intptr_t>(t.element_size());
    lo = static_cast<uintptr_t>(base + first * es);
    hi = static_cast<uintptr_t>(base + (last + 1) * es);
  };
  uintptr_t alo, ahi, blo, bhi;
  span(a, alo, ahi);
  span(b, blo, bhi);
  return alo < bhi && blo < ahi;
}

inline void check_no_overlap(const Tensor& t, const Tensor& other, const char* op, const char* arg,
                             const char* other_arg) {
  FLASHINFER_CHECK(!views_overlap(t, other), op, arg, "must not overlap ", other_arg, " in memory");
}

}  // namespace flashinfer::api
