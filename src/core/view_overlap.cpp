#include "core/view_overlap.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

namespace flashinfer::detail {

namespace {

// A view's set of byte addresses: base + sum_i k_i * stride[i] + [0, run), 0 <= k_i < size[i],
// strides in bytes, descending, every size > 1. Strides are non-negative (the library refuses
// negative ones) and a valid view's span fits its storage, so int64 cannot overflow here.
struct Layout {
  static constexpr int kMaxDims = 16;
  int64_t base = 0;
  int nd = 0;
  std::array<int64_t, kMaxDims> size{};
  std::array<int64_t, kMaxDims> stride{};
  int64_t run = 0;
  bool exact = true;  // false: too many dimensions, only the span is known

  // Bytes from the first to past the last byte of dimensions [from, nd) and the run.
  int64_t extent(int from) const {
    int64_t e = run;
    for (int i = from; i < nd; ++i) e += (size[i] - 1) * stride[i];
    return e;
  }
};

Layout layout_of(const Tensor& t) {
  Layout l;
  const auto es = static_cast<int64_t>(t.element_size());
  l.base = static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()));
  l.run = es;
  std::array<std::pair<int64_t, int64_t>, Layout::kMaxDims> dims{};  // (stride bytes, size)
  int nd = 0;
  int64_t span = es;
  for (int64_t d = 0; d < t.dim(); ++d) {
    // A dimension of size 1 adds no address; one of stride 0 repeats addresses already there.
    if (t.size(d) <= 1 || t.stride(d) == 0) continue;
    span += (t.size(d) - 1) * t.stride(d) * es;
    if (nd == Layout::kMaxDims) {
      l.exact = false;
      continue;
    }
    dims[static_cast<std::size_t>(nd++)] = {t.stride(d) * es, t.size(d)};
  }
  if (!l.exact) {
    l.nd = 0;
    l.run = span;
    return l;
  }
  // Insertion sort, strides descending: a handful of dimensions, and no allocation (this runs
  // on every call of an op that writes).
  for (int i = 1; i < nd; ++i) {
    const auto d = dims[static_cast<std::size_t>(i)];
    int j = i;
    for (; j > 0 && dims[static_cast<std::size_t>(j - 1)].first < d.first; --j) {
      dims[static_cast<std::size_t>(j)] = dims[static_cast<std::size_t>(j - 1)];
    }
    dims[static_cast<std::size_t>(j)] = d;
  }
  // Innermost dimensions that continue the contiguous run join it.
  while (nd > 0 && dims[static_cast<std::size_t>(nd - 1)].first == l.run) {
    l.run *= dims[static_cast<std::size_t>(nd - 1)].second;
    --nd;
  }
  // Adjacent dimensions that tile each other exactly become one.
  int out = 0;
  for (int i = 0; i < nd; ++i) {
    const auto [s, n] = dims[static_cast<std::size_t>(i)];
    if (out > 0 && l.stride[static_cast<std::size_t>(out - 1)] == n * s) {
      l.size[static_cast<std::size_t>(out - 1)] *= n;
      l.stride[static_cast<std::size_t>(out - 1)] = s;
      continue;
    }
    l.size[static_cast<std::size_t>(out)] = n;
    l.stride[static_cast<std::size_t>(out)] = s;
    ++out;
  }
  l.nd = out;
  return l;
}

int64_t floor_div(int64_t x, int64_t y) { return x / y - ((x % y != 0) && ((x < 0) != (y < 0))); }

struct Walk {
  const Layout& a;
  const Layout& b;
  int budget = 256;

  // Whether dimensions [ia, ..) of a at base xa share a byte with dimensions [ib, ..) of b at xb.
  bool overlap(int ia, int64_t xa, int ib, int64_t xb) {
    const int64_t ea = a.extent(ia), eb = b.extent(ib);
    if (xa + ea <= xb || xb + eb <= xa) return false;
    if (ia == a.nd && ib == b.nd) return true;  // two intersecting intervals
    if (--budget < 0) return true;              // too costly to decide: assume the worst
    const bool outer_a = ia < a.nd && (ib == b.nd || a.stride[static_cast<std::size_t>(ia)] >=
                                                         b.stride[static_cast<std::size_t>(ib)]);
    // X is the view whose next dimension has the larger stride S; Y the other.
    const Layout& X = outer_a ? a : b;
    const Layout& Y = outer_a ? b : a;
    const int ix = outer_a ? ia : ib, iy = outer_a ? ib : ia;
    const int64_t x = outer_a ? xa : xb, y = outer_a ? xb : xa;
    const auto sx = static_cast<std::size_t>(ix);
    const int64_t S = X.stride[sx], n = X.size[sx];
    const int64_t ex = X.extent(ix + 1), ey_all = Y.extent(iy);
    auto recurse = [&](int64_t x_at, int jy, int64_t y_at) {
      return outer_a ? overlap(ix + 1, x_at, jy, y_at) : overlap(jy, y_at, ix + 1, x_at);
    };
    if (iy < Y.nd && Y.stride[static_cast<std::size_t>(iy)] == S) {
      // Both step by S: rows k of X and j of Y meet only through d = j - k, and every pair with
      // the same d is one problem shifted (X' at x against Y' at y + d*S). Only the d whose
      // spans intersect are tried: at most two when each row fits in S (packed qkv, K and V).
      const int64_t ey = Y.extent(iy + 1), ny = Y.size[static_cast<std::size_t>(iy)];
      const int64_t diff = x - y;
      const int64_t lo = std::max(floor_div(diff - ey, S) + 1, -(n - 1));
      const int64_t hi = std::min(-floor_div(-(diff + ex), S) - 1, ny - 1);
      for (int64_t d = lo; d <= hi; ++d) {
        if (recurse(x, iy + 1, y + d * S)) return true;
        if (budget < 0) return true;
      }
      return false;
    }
    // Otherwise each row of X whose span meets Y's is compared with all of Y.
    const int64_t k_lo = std::max<int64_t>(floor_div(y - x - ex, S) + 1, 0);
    const int64_t k_hi = std::min<int64_t>(-floor_div(-(y + ey_all - x), S) - 1, n - 1);
    for (int64_t k = k_lo; k <= k_hi; ++k) {
      if (recurse(x + k * S, iy, y)) return true;
      if (budget < 0) return true;
    }
    return false;
  }
};

// [first, last] byte addresses of a non-empty view (strides are non-negative); false if empty.
bool byte_span(const Tensor& t, int64_t& first, int64_t& last) {
  int64_t reach = 0;
  const Shape& shape = t.shape();
  const Shape& strides = t.strides();
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return false;
    reach += (shape[d] - 1) * strides[d];
  }
  const auto es = static_cast<int64_t>(t.element_size());
  first = static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()));
  last = first + reach * es + es - 1;
  return true;
}

}  // namespace

bool views_overlap(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return false;
  int64_t a0 = 0, a1 = 0, b0 = 0, b1 = 0;
  if (!byte_span(a, a0, a1) || !byte_span(b, b0, b1)) return false;
  // Disjoint spans (the common case) need nothing more.
  if (a1 < b0 || b1 < a0) return false;
  if (a.device() != b.device()) return false;
  const Layout la = layout_of(a), lb = layout_of(b);
  Walk w{la, lb};
  return w.overlap(0, la.base, 0, lb.base);
}

int64_t broadcast_dim(const Tensor& t) {
  const Shape& shape = t.shape();
  const Shape& strides = t.strides();
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] > 1 && strides[d] == 0) return static_cast<int64_t>(d);
  }
  return -1;
}

}  // namespace flashinfer::detail
