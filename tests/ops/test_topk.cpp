// top_k, top_k_page_table_transform, top_k_ragged_transform, top_k_varlen: hand-checked golden
// values (NaN, -0.0, ties each way), an independent reference (a full sort of each window) over
// dtypes, widths, k, strides and tie-heavy inputs, every bad input, and record/replay. CUDA is
// compared with the CPU in test_backend_ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

Tensor f32(const std::vector<double>& v, Shape s) {
  return Tensor::from_vector(v, std::move(s), DType::kFloat32);
}
Tensor i32(const std::vector<int64_t>& v) {
  std::vector<double> d(v.begin(), v.end());
  return Tensor::from_vector(d, {static_cast<int64_t>(v.size())}, DType::kInt32);
}
std::vector<int64_t> ints(const Tensor& t) {
  Tensor c = t.to(DType::kInt64).contiguous();
  const int64_t* p = c.data<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}
std::vector<double> doubles(const Tensor& t) {
  Tensor c = t.to(DType::kFloat64).contiguous();
  const double* p = c.data<double>();
  return std::vector<double>(p, p + c.numel());
}

// ---- the reference: a full sort of the window -------------------------------------------------

// Upstream's rank of a value, written here from its definition: the fp32 bits ordered as
// integers after flipping every bit of a negative value and the sign bit of a positive one, so
// -0.0 ranks below +0.0, a positive NaN above +inf and a negative NaN below -inf. (Every value
// of the tests is exact in fp32, and fp16 / bf16 order the same way.)
uint32_t upstream_rank(double v) {
  const float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (u >> 31) ? ~u : (u | 0x80000000u);
}

// Order of two elements of a window: rank descending, then index ascending (or descending when
// prefer_large).
struct Ranked {
  double v;
  int64_t i;
};
bool ranks_before(const Ranked& a, const Ranked& b, bool prefer_large) {
  const uint32_t ra = upstream_rank(a.v), rb = upstream_rank(b.v);
  if (ra != rb) return ra > rb;
  return prefer_large ? a.i > b.i : a.i < b.i;
}
// The selected window-local indices of one window, in ascending index order (sorted=false) or
// descending value, ascending index (sorted=true).
std::vector<int64_t> reference_select(const std::vector<double>& w, int64_t k, bool prefer_large,
                                      bool sorted) {
  std::vector<Ranked> r;
  for (int64_t i = 0; i < static_cast<int64_t>(w.size()); ++i) r.push_back({w[i], i});
  std::stable_sort(r.begin(), r.end(), [&](const Ranked& a, const Ranked& b) {
    return ranks_before(a, b, prefer_large);
  });
  r.resize(std::min<std::size_t>(r.size(), static_cast<std::size_t>(k)));
  if (sorted) {
    std::stable_sort(r.begin(), r.end(),
                     [](const Ranked& a, const Ranked& b) { return ranks_before(a, b, false); });
  } else {
    std::sort(r.begin(), r.end(), [](const Ranked& a, const Ranked& b) { return a.i < b.i; });
  }
  std::vector<int64_t> out;
  for (const Ranked& x : r) out.push_back(x.i);
  return out;
}

std::vector<double> row_of(const std::vector<double>& all, int64_t cols, int64_t r) {
  return std::vector<double>(all.begin() + r * cols, all.begin() + (r + 1) * cols);
}

// Values with many exact ties: a few levels (including +-0 and, optionally, +-inf and NaN).
Tensor tie_heavy(int64_t rows, int64_t cols, DType d, uint64_t seed, bool specials) {
  std::vector<double> v(static_cast<std::size_t>(rows * cols));
  uint64_t x = seed * 2654435761u + 1;
  for (auto& e : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const int lvl = static_cast<int>((x >> 33) % 9);
    const double levels[9] = {
        -1.5, -0.0, 0.0, 0.25, 0.25, 2.0, 3.0, specials ? kInf : 1.0, specials ? kNaN : -3.0};
    e = levels[lvl];
  }
  return Tensor::from_vector(v, {rows, cols}, d);
}

// ---- golden values ------------------------------------------------------------------------------

TEST(TopK, GoldenNaNInfAndTies) {
  Tensor x = f32({1, 5, 3, 5, -kInf, kNaN, 5}, {1, 7});
  auto [v, i] = top_k(x, 3, /*sorted=*/true);
  EXPECT_EQ(i.dtype(), DType::kInt64);
  EXPECT_EQ(v.dtype(), DType::kFloat32);
  EXPECT_EQ(ints(i), (std::vector<int64_t>{5, 1, 3}));  // NaN first, then the 5s by index
  EXPECT_TRUE(std::isnan(doubles(v)[0]));
  EXPECT_EQ(doubles(v)[1], 5.0);
  auto [vu, iu] = top_k(x, 3);
  EXPECT_EQ(ints(iu), (std::vector<int64_t>{1, 3, 5}));  // unsorted: ascending index
  auto [vl, il] = top_k(x, 3, false, false, TopKTieBreak::LARGE);
  EXPECT_EQ(ints(il), (std::vector<int64_t>{3, 5, 6}));  // the last two 5s
  auto [vs, is] = top_k(x, 3, true, false, TopKTieBreak::LARGE);
  EXPECT_EQ(ints(is), (std::vector<int64_t>{5, 3, 6}));
  // k = d: every element.
  auto [va, ia] = top_k(x, 7, true);
  EXPECT_EQ(ints(ia), (std::vector<int64_t>{5, 1, 3, 6, 2, 0, 4}));
}

// Upstream ranks the raw sign-flipped bits (topk_common.cuh), not torch.topk's order: -0.0
// below +0.0 (not a tie), a negative NaN below -inf.
TEST(TopK, NegativeZeroRanksBelowZeroAndNegativeNaNLast) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_label(d));
    Tensor x = Tensor::from_vector({-0.0, 0.0, -1.0}, {1, 3}, d);
    for (TopKTieBreak tb : {TopKTieBreak::NONE, TopKTieBreak::SMALL, TopKTieBreak::LARGE}) {
      auto [v, i] = top_k(x, 1, false, false, tb);
      EXPECT_EQ(ints(i), (std::vector<int64_t>{1}));
      EXPECT_FALSE(std::signbit(doubles(v)[0]));
    }
    auto [vs, is] = top_k(x, 3, true);
    EXPECT_EQ(ints(is), (std::vector<int64_t>{1, 0, 2}));
    // A negative NaN (sign bit set) ranks below -inf; a positive one above +inf.
    Tensor n = Tensor::from_vector({-kNaN, -kInf, 2.0, kNaN}, {1, 4}, d);
    ASSERT_TRUE(std::signbit(doubles(n)[0]));
    auto [vn, in] = top_k(n, 3, true);
    EXPECT_EQ(ints(in), (std::vector<int64_t>{3, 2, 1}));
  }
}

// k above the row (accepted upstream, not checked there): the row's elements, then index -1 and
// value 0 in the surplus slots (upstream's filtered kernel; its radix kernel leaves them
// unwritten). Sorted, upstream sorts that padding with the row by value: it ranks as +0.0, after
// the row's elements of that key. k = 0: empty outputs.
TEST(TopK, KAboveTheRowPadsAndZeroKIsEmpty) {
  Tensor x = f32({3, -1, 7}, {1, 3});
  auto [v, i] = top_k(x, 5);
  EXPECT_EQ(ints(i), (std::vector<int64_t>{0, 1, 2, -1, -1}));
  EXPECT_EQ(doubles(v), (std::vector<double>{3, -1, 7, 0, 0}));
  for (TopKTieBreak tb : {TopKTieBreak::NONE, TopKTieBreak::SMALL}) {
    auto [vs, is] = top_k(x, 5, true, false, tb);
    EXPECT_EQ(ints(is), (std::vector<int64_t>{2, 0, -1, -1, 1}));
    EXPECT_EQ(doubles(vs), (std::vector<double>{7, 3, 0, 0, -1}));
  }
  // A +0.0 of the row ranks before the padding; a -0.0 after it.
  auto [vz, iz] = top_k(f32({-0.0, 0.0, 1}, {1, 3}), 4, true);
  EXPECT_EQ(ints(iz), (std::vector<int64_t>{2, 1, -1, 0}));
  auto [v0, i0] = top_k(x, 0, true);
  EXPECT_EQ(i0.shape(), (Shape{1, 0}));
  EXPECT_EQ(v0.shape(), (Shape{1, 0}));
}

// ---- the reference over dtypes, shapes and strides ----------------------------------------------

TEST(TopK, MatchesReference) {
  struct Case {
    int64_t rows, cols, k;
  };
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const Case& c :
         {Case{3, 1, 1}, Case{2, 17, 5}, Case{4, 300, 1}, Case{3, 300, 64}, Case{2, 300, 300},
          Case{2, 5000, 100}, Case{1, 4097, 4000}, Case{2, 20000, 50}, Case{1, 9000, 200}}) {
      for (int variant = 0; variant < 3; ++variant) {
        SCOPED_TRACE(::testing::Message() << dtype_label(d) << " " << c.rows << "x" << c.cols
                                          << " k=" << c.k << " variant " << variant);
        Tensor x = variant == 0   ? rand_tensor({c.rows, c.cols}, d, 7 + c.cols)
                   : variant == 1 ? tie_heavy(c.rows, c.cols, d, c.k, true)
                                  : strided_rand({c.rows, c.cols}, d, 3 + c.k);
        const std::vector<double> xv = doubles(x);
        for (bool sorted : {false, true}) {
          for (TopKTieBreak tb : {TopKTieBreak::NONE, TopKTieBreak::SMALL, TopKTieBreak::LARGE}) {
            if (tb != TopKTieBreak::NONE && c.k > 2048) {  // upstream's filtered kernel's limit
              EXPECT_FI_ERROR(top_k(x, c.k, sorted, false, tb), "top_k", "k");
              continue;
            }
            auto [v, i] = top_k(x, c.k, sorted, false, tb);
            ASSERT_EQ(i.shape(), (Shape{c.rows, c.k}));
            ASSERT_EQ(v.dtype(), d);
            const std::vector<int64_t> iv = ints(i);
            const std::vector<double> vv = doubles(v);
            for (int64_t r = 0; r < c.rows; ++r) {
              const auto w = row_of(xv, c.cols, r);
              const auto want = reference_select(w, c.k, tb == TopKTieBreak::LARGE, sorted);
              for (int64_t j = 0; j < c.k; ++j) {
                ASSERT_EQ(iv[r * c.k + j], want[j]) << "row " << r << " slot " << j;
                const double got = vv[r * c.k + j], exp = w[want[j]];
                ASSERT_TRUE((std::isnan(got) && std::isnan(exp)) ||
                            (got == exp && std::signbit(got) == std::signbit(exp)));
              }
            }
          }
        }
      }
    }
  }
}

// Rows of 8192 or more with a small k take a one-pass candidate filter whose threshold comes
// from evenly spaced samples. Here the samples (every 32nd element) are the row's largest values,
// so fewer than k elements pass it and the histogram select must take over.
TEST(TopK, SampledThresholdFallsBackWhenTooFewPass) {
  const int64_t cols = 65536, k = 4000;
  std::vector<double> v(static_cast<std::size_t>(cols));
  for (int64_t i = 0; i < cols; ++i) {
    v[static_cast<std::size_t>(i)] = i % 32 == 0
                                         ? 2.0 + static_cast<double>(i % 7)
                                         : static_cast<double>((i * 7919) % 65521) / 65521.0;
  }
  for (DType d : {DType::kFloat32, DType::kBFloat16}) {
    Tensor x = Tensor::from_vector(v, {1, cols}, d);
    const std::vector<double> xv = doubles(x);
    for (bool sorted : {false, true}) {
      auto [val, idx] = top_k(x, k, sorted);
      EXPECT_EQ(ints(idx), reference_select(xv, k, false, sorted)) << dtype_label(d);
    }
  }
}

// ---- the transforms -----------------------------------------------------------------------------

TEST(TopKPageTable, GoldenPageSizeOne) {
  // Row 0 selects local indices {1, 3}; row 1 (length 2 <= k) takes 0, 1 and pads.
  Tensor x = f32({0, 9, 1, 8, 2, 0, 7, 6, 0, 0}, {2, 5});
  Tensor table =
      Tensor::from_vector({10, 11, 12, 13, 14, 20, 21, 22, 23, 24}, {2, 5}, DType::kInt32);
  Tensor out = top_k_page_table_transform(x, table, i32({5, 2}), 2);
  EXPECT_EQ(ints(out), (std::vector<int64_t>{11, 13, 20, 21}));
  Tensor padded = top_k_page_table_transform(x, table, i32({5, 2}), 3);
  EXPECT_EQ(ints(padded), (std::vector<int64_t>{11, 13, 14, 20, 21, -1}));
}

TEST(TopKPageTable, GoldenPagesStartsAndRawIndices) {
  // One row of 8 scores, window [2, 7) (row_starts 2, length 5): local scores {5, 1, 9, 0, 7};
  // top 2: local 2 (9) and 4 (7). Pages of 4 positions: page-table row 1 (row_to_batch), start
  // entry 1 (page_table_row_starts): local 2 -> entry 1 + 0 -> page 30 -> 30*4 + 2 = 122; local
  // 4 -> entry 1 + 1 -> page 31 -> 31*4 + 0 = 124.
  Tensor x = f32({100, 100, 5, 1, 9, 0, 7, 100}, {1, 8});
  Tensor table = Tensor::from_vector({0, 1, 2, 3, 29, 30, 31, 32}, {2, 4}, DType::kInt32);
  Tensor out = Tensor::full({1, 2}, 99, DType::kInt32);
  Tensor raw = Tensor::full({1, 2}, 99, DType::kInt32);
  TopKPageTableOptions o;
  o.page_size = 4;
  o.out = out;
  o.out_raw_indices = raw;
  Tensor res = top_k_page_table_transform(x, table, i32({5}), 2, i32({1}), false,
                                          TopKTieBreak::NONE, false, i32({2}), i32({1}), o);
  EXPECT_EQ(res.data_ptr(), out.data_ptr());
  EXPECT_EQ(ints(out), (std::vector<int64_t>{122, 124}));
  EXPECT_EQ(ints(raw), (std::vector<int64_t>{2, 4}));
}

TEST(TopKPageTable, MatchesReference) {
  const int64_t rows = 5, cols = 70, k = 8, batches = 3, page = 4, width = 30;
  for (DType d : {DType::kFloat32, DType::kBFloat16}) {
    Tensor x = tie_heavy(rows, cols, d, 5, false);
    std::vector<int64_t> lens = {70, 3, 8, 40, 0}, starts = {0, 5, 60, 10, 70},
                         r2b = {2, 0, 1, 1, 0}, pts = {0, 2, 1, 3, 0};
    std::vector<double> tab;
    for (int64_t i = 0; i < batches * width; ++i)
      tab.push_back(static_cast<double>((i * 37) % 101));
    Tensor table = Tensor::from_vector(tab, {batches, width}, DType::kInt32);
    TopKPageTableOptions o;
    o.page_size = page;
    o.out_raw_indices = Tensor::empty({rows, k}, DType::kInt32);
    Tensor out = top_k_page_table_transform(x, table, i32(lens), k, i32(r2b), true,
                                            TopKTieBreak::LARGE, true, i32(starts), i32(pts), o);
    const auto xv = doubles(x);
    const auto ov = ints(out), rv = ints(*o.out_raw_indices);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> w(xv.begin() + r * cols + starts[r],
                            xv.begin() + r * cols + starts[r] + lens[r]);
      const auto want = reference_select(w, k, true, false);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t idx = j < static_cast<int64_t>(want.size()) ? want[j] : -1;
        const int64_t phys =
            idx < 0 ? -1
                    : static_cast<int64_t>(tab[r2b[r] * width + pts[r] + idx / page]) * page +
                          idx % page;
        EXPECT_EQ(rv[r * k + j], idx) << r << "," << j;
        EXPECT_EQ(ov[r * k + j], phys) << r << "," << j;
      }
    }
  }
}

TEST(TopKRagged, GoldenAndReference) {
  Tensor x = f32({3, 1, 4, 1, 5, 9, 2, 6}, {2, 4});
  // Row 0: window all 4, top 2 = local {0, 2} + 100; row 1: window [1, 3) = {9, 2}, length 2.
  Tensor out = top_k_ragged_transform(x, i32({100, 200}), i32({4, 2}), 2, false, TopKTieBreak::NONE,
                                      false, i32({0, 1}));
  EXPECT_EQ(ints(out), (std::vector<int64_t>{100, 102, 200, 201}));
  Tensor pad = top_k_ragged_transform(x, i32({100, 200}), i32({1, 0}), 2);
  EXPECT_EQ(ints(pad), (std::vector<int64_t>{100, -1, -1, -1}));

  Tensor y = tie_heavy(4, 50, DType::kFloat16, 9, true);
  std::vector<int64_t> lens = {50, 20, 7, 33}, offs = {0, 1000, -5, 7};
  for (TopKTieBreak tb : {TopKTieBreak::SMALL, TopKTieBreak::LARGE}) {
    const auto ov = ints(top_k_ragged_transform(y, i32(offs), i32(lens), 10, false, tb));
    const auto yv = doubles(y);
    for (int64_t r = 0; r < 4; ++r) {
      std::vector<double> w(yv.begin() + r * 50, yv.begin() + r * 50 + lens[r]);
      const auto want = reference_select(w, 10, tb == TopKTieBreak::LARGE, false);
      for (int64_t j = 0; j < 10; ++j) {
        EXPECT_EQ(ov[r * 10 + j], j < static_cast<int64_t>(want.size()) ? want[j] + offs[r] : -1);
      }
    }
  }
}

TEST(TopKVarlen, NextNCompressRatioAndValues) {
  // 2 requests x next_n 2 = 4 rows of 6. seq_lens {8, 3}, compress_ratio 2:
  // L = floor((seq - 2 + r%2 + 1) / 2) -> request 0: 3, 4; request 1: 1, 1.
  Tensor x = f32({1,  6, 2, 5, 3, 4,  //
                  1,  6, 2, 5, 3, 4,  //
                  8,  1, 1, 1, 1, 1,  //
                  -1, 9, 9, 9, 9, 9},
                 {4, 6});
  auto [idx, vals] = top_k_varlen(x, i32({8, 3}), 2, std::nullopt, 2, 2, true);
  ASSERT_TRUE(vals.has_value());
  EXPECT_EQ(ints(idx), (std::vector<int64_t>{1, 2, 1, 3, 0, -1, 0, -1}));
  EXPECT_EQ(doubles(*vals), (std::vector<double>{6, 2, 6, 5, 8, 0, -1, 0}));
  auto [idx2, none] = top_k_varlen(x, i32({7, 3, 0, 100}), 1);
  EXPECT_FALSE(none.has_value());
  EXPECT_EQ(ints(idx2), (std::vector<int64_t>{1, 1, -1, 1}));  // seq 0: empty; 100: clamped
  // Caller buffers are written and returned.
  Tensor oi = Tensor::empty({4, 2}, DType::kInt32), ov = Tensor::empty({4, 2}, DType::kFloat32);
  auto [ri, rv] = top_k_varlen(x, i32({8, 3}), 2, std::nullopt, 2, 2, true, oi, ov, "radix");
  EXPECT_EQ(ri.data_ptr(), oi.data_ptr());
  EXPECT_EQ(rv->data_ptr(), ov.data_ptr());
  EXPECT_EQ(ints(oi), ints(idx));
}

// ---- bad input ----------------------------------------------------------------------------------

TEST(TopK, BadInput) {
  Tensor x = rand_tensor({2, 8}, DType::kFloat32, 1);
  EXPECT_FI_ERROR(top_k(Tensor(), 2), "top_k", "input");
  EXPECT_FI_ERROR(top_k(rand_tensor({8}, DType::kFloat32, 1), 2), "top_k", "input");
  EXPECT_FI_ERROR(top_k(rand_tensor({2, 8}, DType::kFloat64, 1), 2), "top_k", "input");
  EXPECT_FI_ERROR(top_k(x, -1), "top_k", "k");
  // tie_break / dsa_graph_safe run on upstream's filtered kernel: at most 2048 per row.
  Tensor wide = rand_tensor({1, 4096}, DType::kFloat32, 2);
  EXPECT_FI_ERROR(top_k(wide, 2049, false, false, TopKTieBreak::SMALL), "top_k", "k");
  EXPECT_FI_ERROR(top_k(wide, 2049, false, false, TopKTieBreak::NONE, true), "top_k", "k");
  EXPECT_EQ(std::get<1>(top_k(wide, 2049)).size(1), 2049);
  EXPECT_EQ(std::get<1>(top_k(wide, 2048, false, false, TopKTieBreak::LARGE)).size(1), 2048);
  EXPECT_FI_ERROR(top_k(Tensor::empty({0, 8}, DType::kFloat32), 2), "top_k", "input");

  const char* pt = "top_k_page_table_transform";
  Tensor table = Tensor::zeros({2, 8}, DType::kInt32);
  Tensor lens = i32({8, 8});
  EXPECT_FI_ERROR(top_k_page_table_transform(x, table.to(DType::kInt64), lens, 2), pt,
                  "src_page_table");
  EXPECT_FI_ERROR(top_k_page_table_transform(x, table, i32({8}), 2), pt, "lengths");
  EXPECT_FI_ERROR(top_k_page_table_transform(x, table, i32({8, 9}), 2), pt, "lengths");
  EXPECT_FI_ERROR(top_k_page_table_transform(x, table, i32({8, -1}), 2), pt, "lengths");
  EXPECT_FI_ERROR(top_k_page_table_transform(x, table, lens, -1), pt, "k");
  EXPECT_FI_ERROR(top_k_page_table_transform(x, table, lens, 2, i32({0, 2})), pt, "row_to_batch");
  EXPECT_FI_ERROR(top_k_page_table_transform(x, table, i32({4, 4}), 2, std::nullopt, false,
                                             TopKTieBreak::NONE, false, i32({5, 0})),
                  pt, "lengths");
  EXPECT_FI_ERROR(top_k_page_table_transform(x, table, lens, 2, std::nullopt, false,
                                             TopKTieBreak::NONE, false, i32({9, 0})),
                  pt, "row_starts");
  TopKPageTableOptions o;
  o.page_size = 3;
  EXPECT_FI_ERROR(
      top_k_page_table_transform(x, table, lens, 2, std::nullopt, false, TopKTieBreak::NONE, false,
                                 std::nullopt, std::nullopt, o),
      pt, "page_size");
  o.page_size = 2;
  EXPECT_FI_ERROR(
      top_k_page_table_transform(x, table, lens, 2, std::nullopt, false, TopKTieBreak::NONE, false,
                                 i32({0, 0}), std::nullopt, o),
      pt, "page_table_row_starts");
  // Lookups past the table's width (every lookup starts at entry 8 of 8).
  EXPECT_FI_ERROR(
      top_k_page_table_transform(x, table, lens, 2, std::nullopt, false, TopKTieBreak::NONE, false,
                                 i32({0, 0}), i32({8, 8}), o),
      pt, "src_page_table");
  TopKPageTableOptions bad_out;
  bad_out.out = Tensor::empty({2, 3}, DType::kInt32);
  EXPECT_FI_ERROR(
      top_k_page_table_transform(x, table, lens, 2, std::nullopt, false, TopKTieBreak::NONE, false,
                                 std::nullopt, std::nullopt, bad_out),
      pt, "out");
  TopKPageTableOptions alias;
  alias.out = Tensor::empty({2, 2}, DType::kInt32);
  alias.out_raw_indices = alias.out;
  EXPECT_FI_ERROR(
      top_k_page_table_transform(x, table, lens, 2, std::nullopt, false, TopKTieBreak::NONE, false,
                                 std::nullopt, std::nullopt, alias),
      pt, "out_raw_indices");

  const char* rg = "top_k_ragged_transform";
  EXPECT_FI_ERROR(top_k_ragged_transform(x, i32({0}), lens, 2), rg, "offsets");
  EXPECT_FI_ERROR(top_k_ragged_transform(x, i32({0, 0}), lens.to(DType::kInt64), 2), rg, "lengths");
  EXPECT_FI_ERROR(top_k_ragged_transform(x, i32({0, 0}), lens, -3), rg, "k");

  const char* vl = "top_k_varlen";
  EXPECT_FI_ERROR(top_k_varlen(x, i32({8}), 2), vl, "seq_lens");
  EXPECT_FI_ERROR(top_k_varlen(x, i32({8, 8}), 2, std::nullopt, 0), vl, "compress_ratio");
  EXPECT_FI_ERROR(top_k_varlen(x, i32({8, 8}), 2, std::nullopt, 1, 0), vl, "next_n");
  EXPECT_FI_ERROR(top_k_varlen(x, i32({8, 8}), -2), vl, "top_k");
  // Upstream 0.6.18 has no "radix_filter" backend.
  EXPECT_FI_ERROR(top_k_varlen(x, i32({8, 8}), 2, std::nullopt, 1, 1, false, std::nullopt,
                               std::nullopt, "radix_filter"),
                  vl, "backend");
  EXPECT_FI_ERROR(top_k_varlen(x, i32({8, 8}), 2, i32({1, 2})), vl, "pre_idx");
  EXPECT_FI_ERROR(top_k_varlen(x, i32({8, 8}), 2, std::nullopt, 1, 1, false,
                               Tensor::empty({2, 3}, DType::kInt32)),
                  vl, "out_indices");
  EXPECT_FI_ERROR(top_k_varlen(x, i32({8, 8}), 2, std::nullopt, 1, 1, true, std::nullopt,
                               Tensor::empty({2, 2}, DType::kFloat16)),
                  vl, "out_values");
  EXPECT_FI_ERROR(top_k_varlen(x, i32({8, 8}), 2, std::nullopt, 1, 1, false, std::nullopt,
                               std::nullopt, "magic"),
                  vl, "backend");
}

TEST(TopK, TieBreakFromRecordedValues) {
  EXPECT_EQ(topk_tie_break_from_value(Value(int64_t{2})), TopKTieBreak::LARGE);
  EXPECT_EQ(topk_tie_break_from_value(to_value(TopKTieBreak::SMALL)), TopKTieBreak::SMALL);
  EXPECT_EQ(to_value(TopKTieBreak::LARGE).as_enum(), (EnumValue{"TopKTieBreak", "LARGE", "2"}));
  EXPECT_THROW(topk_tie_break_from_value(Value(int64_t{3})), Error);
  EXPECT_THROW(topk_tie_break_from_value(Value("LARGE")), Error);
}

// ---- record and replay --------------------------------------------------------------------------

TEST(TopK, RecordAndReplay) {
  Tensor x = tie_heavy(3, 40, DType::kBFloat16, 4, true);
  Tensor table = Tensor::full({3, 40}, 5, DType::kInt32);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    top_k(x, 7, true, true, TopKTieBreak::LARGE);
    TopKPageTableOptions o;
    o.out = Tensor::empty({3, 7}, DType::kInt32);
    o.out_raw_indices = Tensor::empty({3, 7}, DType::kInt32);
    top_k_page_table_transform(x, table, i32({40, 3, 20}), 7, std::nullopt, false,
                               TopKTieBreak::SMALL, false, std::nullopt, std::nullopt, o);
    top_k_ragged_transform(x, i32({1, 2, 3}), i32({40, 5, 0}), 7);
    top_k_varlen(x, i32({40, 12, 9}), 7, std::nullopt, 1, 1, true);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 4u);
  for (const auto& c : calls) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(replays_identically(c));
  }
  // A recorded int tie_break (as engines pass it) replays as the enum.
  const OpDecl* d = OpRegistry::global().find("top_k");
  ASSERT_NE(d, nullptr);
  std::vector<Value> args = {Value(x), Value(int64_t{7}), Value(true), Value(false),
                             Value(int64_t{2})};
  CallArgs bound(*d, bind_arguments(*d, args));
  EXPECT_TRUE(same_values(d->invoke(bound), calls[0].result));
}

}  // namespace
// top_k(sorted=True) on CUDA: the sort kernel ranks the selected (score, index) keys in the
// stream's scratch, from shared memory up to 6144 keys a row and from global memory past that
// (one loop a memory space since session 61); values and indices must be the CPU's, in order,
// ties included (16-bit scores collide). test_backend_ops' top_k case runs sorted=False only.
TEST(TopKCuda, SortedMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda(0);
  struct Case {
    int64_t rows, cols, k;
    DType dt;
  };
  for (const Case& c : {Case{3, 1000, 1, DType::kFloat32}, Case{5, 4096, 64, DType::kBFloat16},
                        Case{2, 9000, 6144, DType::kFloat16}, Case{2, 9000, 7000, DType::kFloat32},
                        Case{1, 20000, 8192, DType::kBFloat16},
                        // k above the row: the padding ranked as +0.0 (session 83).
                        Case{3, 100, 130, DType::kFloat32}, Case{2, 40, 64, DType::kBFloat16}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << " x " << c.cols << ", k " << c.k);
    const Tensor x = testing::rand_tensor({c.rows, c.cols}, c.dt, 17 + c.k, -4.0, 4.0);
    const auto [vc, ic] = top_k(x, c.k, true);
    for (int rep = 0; rep < 2; ++rep) {  // the second call reuses the stream's scratch
      const auto [vg, ig] = top_k(x.to(g), c.k, true);
      EXPECT_EQ(ig.to(Device::cpu()).to_double_vector(), ic.to_double_vector());
      EXPECT_EQ(vg.to(Device::cpu()).to_double_vector(), vc.to_double_vector());
    }
  }
}

}  // namespace flashinfer::testing
