// Private: walking the elements of a strided view in row-major order.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "flashinfer/error.h"

namespace flashinfer::detail {

/// Overflow-checked arithmetic on element counts, strides and offsets: every view constructor
/// and every reader that builds a view goes through these, so a hostile shape or stride (say
/// 2^62) is a named error ("size arithmetic overflows int64") instead of a wrapped span that
/// passes the bounds check and is later read or written out of bounds.
[[noreturn]] inline void size_overflow(const char* op, const char* arg, int64_t a, char how,
                                       int64_t b) {
  FLASHINFER_FAIL(::flashinfer::ErrorCode::kInvalidArgument, op, arg,
                  "size arithmetic overflows int64: ", a, ' ', how, ' ', b);
}

inline int64_t checked_mul(int64_t a, int64_t b, const char* op, const char* arg) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) size_overflow(op, arg, a, '*', b);
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, const char* op, const char* arg) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) size_overflow(op, arg, a, '+', b);
  return r;
}

/// The number of elements of `shape`, checked (dimensions are non-negative).
inline int64_t checked_numel(const std::vector<int64_t>& shape, const char* op = "Tensor",
                             const char* arg = "shape") {
  int64_t n = 1;
  for (int64_t d : shape) n = checked_mul(n, d, op, arg);
  return n;
}

/// The part of its storage a view touches, [begin, end) in elements; begin == end (the offset)
/// when the view is empty. Strides are non-negative (the library rejects negative ones). The
/// arithmetic is checked: a span that does not fit in int64 throws (named `op`, "strides").
inline std::pair<int64_t, int64_t> covered_span(const std::vector<int64_t>& shape,
                                                const std::vector<int64_t>& strides, int64_t offset,
                                                const char* op = "Tensor") {
  for (int64_t s : shape) {
    if (s == 0) return {offset, offset};
  }
  int64_t end = offset;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    end = checked_add(end, checked_mul(shape[i] - 1, strides[i], op, "strides"), op, "strides");
  }
  return {offset, checked_add(end, 1, op, "strides")};
}

/// Calls fn(offset) for every element of the view, offsets in elements from the storage start,
/// in row-major logical order. Incremental: no division per element.
template <class Fn>
void for_each_offset(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                     int64_t offset, Fn&& fn) {
  const std::size_t nd = shape.size();
  for (int64_t s : shape) {
    if (s == 0) return;
  }
  if (nd == 0) {
    fn(offset);
    return;
  }
  std::vector<int64_t> idx(nd, 0);
  const int64_t inner = shape[nd - 1], inner_stride = strides[nd - 1];
  int64_t base = offset;
  while (true) {
    for (int64_t i = 0; i < inner; ++i) fn(base + i * inner_stride);
    // Advance the outer index like an odometer.
    std::size_t d = nd - 1;
    while (true) {
      if (d == 0) return;
      --d;
      ++idx[d];
      base += strides[d];
      if (idx[d] < shape[d]) break;
      base -= idx[d] * strides[d];
      idx[d] = 0;
    }
  }
}

/// Copies a strided view into another of the same shape (element size `es` bytes); storages may
/// be the same only if the views do not overlap.
inline void strided_copy(void* dst_base, const std::vector<int64_t>& shape,
                         const std::vector<int64_t>& dst_strides, int64_t dst_offset,
                         const void* src_base, const std::vector<int64_t>& src_strides,
                         int64_t src_offset, std::size_t es) {
  std::vector<int64_t> src_offsets;
  for_each_offset(shape, src_strides, src_offset, [&](int64_t off) { src_offsets.push_back(off); });
  auto* d = static_cast<uint8_t*>(dst_base);
  const auto* s = static_cast<const uint8_t*>(src_base);
  std::size_t i = 0;
  for_each_offset(shape, dst_strides, dst_offset,
                  [&](int64_t off) { std::memcpy(d + off * es, s + src_offsets[i++] * es, es); });
}

}  // namespace flashinfer::detail
