// Private: argument checks shared by the public ops. Each throws flashinfer::Error naming the
// op and the argument.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/view_overlap.h"
#include "flashinfer/error.h"
#include "flashinfer/tensor.h"

namespace flashinfer::api {

/// A shape as torch prints it in upstream's messages: torch.Size([8, 8]).
inline std::string torch_size_string(const Shape& s) {
  std::string out = "torch.Size([";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "])";
}

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

/// Pairwise checks for an op's own argument relations the gate's written-argument check does not
/// see (it covers every argument declared `.mut()`, see src/calls/written_args.cpp); both use the
/// same exact overlap test.
inline void check_writable(const Tensor& t, const char* op, const char* arg) {
  const int64_t d = detail::broadcast_dim(t);
  FLASHINFER_CHECK(d < 0, op, arg, "is written but has stride 0 in dimension ", d,
                   " (a broadcast view)");
}

inline void check_no_overlap(const Tensor& t, const Tensor& other, const char* op, const char* arg,
                             const char* other_arg) {
  FLASHINFER_CHECK(!detail::views_overlap(t, other), op, arg, "must not overlap ", other_arg,
                   " in memory");
}

/// Exact integer values of an int32 / int64 tensor of any rank on any device, in logical order
/// (a device tensor is copied to the host: for values the host must check or use).
inline std::vector<int64_t> host_ints(const Tensor& t) {
  const Tensor h = (t.device().is_cpu() ? t : t.to(Device::cpu())).contiguous();
  std::vector<int64_t> v(static_cast<std::size_t>(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) {
    v[i] = h.dtype() == DType::kInt64 ? h.data<int64_t>()[i] : h.data<int32_t>()[i];
  }
  return v;
}

}  // namespace flashinfer::api
