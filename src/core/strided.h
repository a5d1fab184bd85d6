// Private: walking the elements of a strided view in row-major order.
#pragma once

#include <algorithm>
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

/// A view as `rows` runs of `cols` contiguous elements, run i starting `i * pitch` elements after
/// the view's first element (pitch >= cols): what a 2-D copy (cudaMemcpy2D) moves without touching
/// the elements between runs. Dimensions of size 1 are ignored and the others taken in stride
/// order: a copy keeps every element at its offset, so a transposed view of a row-padded buffer
/// qualifies too. False for a view that is not of this form (broadcast or overlapping strides,
/// more than one pitch) or is empty.
struct RowSpan {
  int64_t rows = 0, cols = 0, pitch = 0;
};
inline bool as_row_span(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                        RowSpan* out) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dimensions above 1
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return false;
    if (shape[i] > 1) dims.emplace_back(strides[i], shape[i]);
  }
  std::stable_sort(dims.begin(), dims.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  int64_t cols = 1;
  std::size_t j = dims.size();
  while (j > 0 && dims[j - 1].first == cols) cols *= dims[--j].second;
  if (j == 0) {
    *out = RowSpan{1, cols, cols};
    return true;
  }
  const int64_t pitch = dims[j - 1].first;
  if (pitch < cols) return false;
  int64_t rows = dims[j - 1].second, next = pitch * dims[j - 1].second;
  for (std::size_t k = j - 1; k-- > 0;) {
    if (dims[k].first != next) return false;
    rows *= dims[k].second;
    next = dims[k].first * dims[k].second;
  }
  *out = RowSpan{rows, cols, pitch};
  return true;
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

namespace strided_copy_impl {

template <class T>
inline void copy_run(uint8_t* d, int64_t ds, const uint8_t* s, int64_t ss, int64_t n) {
  T* dt = reinterpret_cast<T*>(d);
  const T* st = reinterpret_cast<const T*>(s);
  for (int64_t i = 0; i < n; ++i) std::memcpy(dt + i * ds, st + i * ss, sizeof(T));
}

/// n elements of `es` bytes from s (stride ss elements) to d (stride ds elements).
inline void copy_run(uint8_t* d, int64_t ds, const uint8_t* s, int64_t ss, int64_t n,
                     std::size_t es) {
  if (ds == 1 && ss == 1) {
    std::memcpy(d, s, static_cast<std::size_t>(n) * es);
    return;
  }
  switch (es) {
    case 1:
      return copy_run<uint8_t>(d, ds, s, ss, n);
    case 2:
      return copy_run<uint16_t>(d, ds, s, ss, n);
    case 4:
      return copy_run<uint32_t>(d, ds, s, ss, n);
    case 8:
      return copy_run<uint64_t>(d, ds, s, ss, n);
    default:
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(d + static_cast<std::size_t>(i * ds) * es,
                    s + static_cast<std::size_t>(i * ss) * es, es);
      }
  }
}

}  // namespace strided_copy_impl

/// Copies a strided view into another of the same shape (element size `es` bytes); storages may
/// be the same only if the views do not overlap. Both views are walked together, row by row; a
/// view whose last two dimensions are transposed relative to the other (the common
/// `w.transpose(0, 1).contiguous()`) is copied in square tiles so that neither side strides
/// through memory one element per cache line.
inline void strided_copy(void* dst_base, const std::vector<int64_t>& shape,
                         const std::vector<int64_t>& dst_strides, int64_t dst_offset,
                         const void* src_base, const std::vector<int64_t>& src_strides,
                         int64_t src_offset, std::size_t es) {
  using strided_copy_impl::copy_run;
  const std::size_t nd = shape.size();
  for (int64_t n : shape) {
    if (n == 0) return;
  }
  auto* d = static_cast<uint8_t*>(dst_base);
  const auto* s = static_cast<const uint8_t*>(src_base);
  auto at = [es](int64_t off) { return static_cast<std::size_t>(off) * es; };
  if (nd == 0) {
    std::memcpy(d + at(dst_offset), s + at(src_offset), es);
    return;
  }
  // Tile the last two dimensions when one side is contiguous along the last and the other
  // along the second to last.
  const bool tiled = nd >= 2 && shape[nd - 1] > 1 && shape[nd - 2] > 1 &&
                     ((dst_strides[nd - 1] == 1 && src_strides[nd - 2] == 1) ||
                      (src_strides[nd - 1] == 1 && dst_strides[nd - 2] == 1));
  const std::size_t walk = tiled ? nd - 2 : nd - 1;  // dimensions walked by the odometer
  const int64_t rows = tiled ? shape[nd - 2] : 1, cols = shape[nd - 1];
  const int64_t dr = tiled ? dst_strides[nd - 2] : 0, sr = tiled ? src_strides[nd - 2] : 0;
  const int64_t dc = dst_strides[nd - 1], sc = src_strides[nd - 1];
  std::vector<int64_t> idx(walk, 0);
  int64_t db = dst_offset, sb = src_offset;
  constexpr int64_t kTile = 32;
  while (true) {
    if (!tiled) {
      copy_run(d + at(db), dc, s + at(sb), sc, cols, es);
    } else {
      for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
        const int64_t r1 = std::min(rows, r0 + kTile);
        for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
          const int64_t c1 = std::min(cols, c0 + kTile);
          for (int64_t r = r0; r < r1; ++r) {
            copy_run(d + at(db + r * dr + c0 * dc), dc, s + at(sb + r * sr + c0 * sc), sc, c1 - c0,
                     es);
          }
        }
      }
    }
    // Advance the outer index like an odometer, both bases together.
    std::size_t k = walk;
    while (true) {
      if (k == 0) return;
      --k;
      ++idx[k];
      db += dst_strides[k];
      sb += src_strides[k];
      if (idx[k] < shape[k]) break;
      db -= idx[k] * dst_strides[k];
      sb -= idx[k] * src_strides[k];
      idx[k] = 0;
    }
  }
}

}  // namespace flashinfer::detail
