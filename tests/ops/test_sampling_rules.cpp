// The plain arithmetic the CPU and CUDA sampling kernels share (src/kernels/sampling_rules.h),
// checked on the CPU: the value of each per-row argument (every dtype, scalar or tensor, strides,
// clamping), chunk partitioning (every element owned exactly once, 128-bit loads only
// where they are legal), the Philox draw at a position (the stream's, word for word), the
// dual-pivot rule (hand-checked rounds), and the 16-way threshold search (the k-th largest key
// and the top-p boundary, against sorting, within its pass bound).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "flashinfer/float_formats.h"
#include "flashinfer/tensor.h"
#include "kernels/philox.h"
#include "kernels/sampling_params.h"
#include "kernels/sampling_rules.h"

namespace flashinfer::kernels {
namespace {

TEST(SamplingRules, VecWidthNeedsContiguousAlignedRows) {
  EXPECT_EQ(sampling_vec_width(4, 0x1000, 128256, 1), 4);  // fp32: float4
  EXPECT_EQ(sampling_vec_width(2, 0x1000, 151936, 1), 8);  // bf16 / fp16: 8 per 16 bytes
  EXPECT_EQ(sampling_vec_width(4, 0x1000, 8, 2), 1);       // strided columns
  EXPECT_EQ(sampling_vec_width(4, 0x1008, 128, 1), 1);     // base not 16-byte aligned
  EXPECT_EQ(sampling_vec_width(4, 0x1000, 102, 1), 1);     // row 1 would start misaligned
  EXPECT_EQ(sampling_vec_width(2, 0x1000, 100, 1), 1);     // 200 bytes per row
  EXPECT_EQ(sampling_vec_width(2, 0x1000, 104, 1), 8);     // 208 bytes per row
  EXPECT_EQ(sampling_vec_width(3, 0x1000, 96, 1), 1);      // 16 is no multiple of 3
}

TEST(SamplingRules, ChunkCountsAndFirstElements) {
  EXPECT_EQ(sampling_num_chunks(0, 1024, 4), 0);
  EXPECT_EQ(sampling_num_chunks(1, 1024, 4), 1);
  EXPECT_EQ(sampling_num_chunks(4096, 1024, 4), 1);
  EXPECT_EQ(sampling_num_chunks(4097, 1024, 4), 2);
  EXPECT_EQ(sampling_num_chunks(128256, 1024, 4), 32);  // 31.3 chunks of 4096
  EXPECT_EQ(sampling_num_chunks(151936, 1024, 8), 19);  // 18.5 chunks of 8192
  EXPECT_EQ(sampling_num_chunks(100, 512, 1), 1);
  EXPECT_EQ(sampling_thread_first(0, 0, 1024, 4), 0);
  EXPECT_EQ(sampling_thread_first(0, 1, 1024, 4), 4);
  EXPECT_EQ(sampling_thread_first(2, 5, 1024, 4), (2 * 1024 + 5) * 4);
  EXPECT_TRUE(sampling_full_vector(4, 8, 4));
  EXPECT_FALSE(sampling_full_vector(8, 10, 4));  // the row's last, partial vector
  EXPECT_FALSE(sampling_full_vector(12, 10, 4));
}

// Chunks x threads x lanes cover [0, n) exactly once, in index order within a chunk (what the
// block scan's thread-order prefix sums rely on).
TEST(SamplingRules, ChunksPartitionTheRowInOrder) {
  for (int threads : {32, 64}) {
    for (int vec : {1, 4, 8}) {
      for (int64_t n : {1, 7, 255, 256, 257, 1000, 2053}) {
        std::vector<int> seen(static_cast<std::size_t>(n), 0);
        int64_t expect_next = 0;
        for (int64_t c = 0; c < sampling_num_chunks(n, threads, vec); ++c) {
          for (int t = 0; t < threads; ++t) {
            const int64_t first = sampling_thread_first(c, t, threads, vec);
            EXPECT_EQ(first % vec, 0);
            for (int j = 0; j < vec; ++j) {
              if (first + j >= n) continue;
              EXPECT_EQ(first + j, expect_next) << "order, n " << n << " vec " << vec;
              ++expect_next;
              ++seen[static_cast<std::size_t>(first + j)];
            }
          }
        }
        EXPECT_EQ(expect_next, n);
        EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }))
            << "n " << n << " threads " << threads << " vec " << vec;
      }
    }
  }
}

// The CUDA passes load the whole chunks several at a time without bounds checks and read the
// rest with each thread's check: every vector of a whole chunk lies inside the row, and what
// follows them is at most one chunk, the row's last, in which some thread's vector does not.
TEST(SamplingRules, WholeChunksHoldOnlyWholeVectors) {
  EXPECT_EQ(sampling_whole_chunks(128256, 512, 4), 62);  // 62 x 2048, then 1280 elements
  EXPECT_EQ(sampling_whole_chunks(4096, 1024, 4), 1);
  EXPECT_EQ(sampling_whole_chunks(4095, 1024, 4), 0);
  EXPECT_EQ(sampling_whole_chunks(0, 512, 8), 0);
  for (int threads : {32, 64}) {
    for (int vec : {1, 4, 8}) {
      for (int64_t n : {0, 1, 7, 255, 256, 257, 511, 512, 1000, 2053, 4096}) {
        const int64_t whole = sampling_whole_chunks(n, threads, vec);
        const int64_t chunks = sampling_num_chunks(n, threads, vec);
        ASSERT_LE(whole, chunks);
        EXPECT_LE(chunks - whole, 1) << "n " << n << " threads " << threads << " vec " << vec;
        for (int64_t c = 0; c < chunks; ++c) {
          bool all_whole = true;
          for (int t = 0; t < threads; ++t) {
            all_whole = all_whole &&
                        sampling_full_vector(sampling_thread_first(c, t, threads, vec), n, vec);
          }
          EXPECT_EQ(all_whole, c < whole) << "n " << n << " chunk " << c << " vec " << vec;
        }
      }
    }
  }
}

TEST(SamplingRules, UniformAtIsTheStreamsDraw) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{67280421310721}, ~uint64_t{0}}) {
    for (uint64_t sub : {uint64_t{0}, uint64_t{5}, uint64_t{1} << 40}) {
      for (uint64_t off : {uint64_t{0}, uint64_t{3}, uint64_t{16}, uint64_t{1001}}) {
        PhiloxStream s(seed, sub, off);
        for (uint64_t i = 0; i < 13; ++i) {
          EXPECT_EQ(philox_uniform_at(seed, sub, off + i), s.next_uniform())
              << "seed " << seed << " sub " << sub << " position " << off + i;
        }
      }
    }
  }
  const Philox4x32 w = {{10, 11, 12, 13}};
  for (uint64_t lane = 0; lane < 4; ++lane) EXPECT_EQ(philox_lane(w, lane), 10 + lane);
}

TEST(SamplingRules, SecondPivotIsTheMidpoint) {
  EXPECT_EQ(second_pivot(0.25f, 1.0f), 0.625f);
  EXPECT_EQ(second_pivot(0.5f, 0.5f), 0.5f);
}

PivotCounts counts(int64_t c0, float m0, int64_t c1, float m1) {
  PivotCounts c;
  c.count0 = c0;
  c.mass0 = m0;
  c.count1 = c1;
  c.mass1 = m1;
  return c;
}

// The four outcomes of a round, by hand (top-k 3; top-p 0.5; joint).
TEST(SamplingRules, PivotRoundOutcomes) {
  SamplingRow row;
  row.top_k = 3;
  row.top_p = 0.5f;
  // Accepted: two tokens above pivot0 (< 3); the window is untouched.
  PivotWindow w;
  EXPECT_TRUE(pivot_round(SamplingKind::kTopK, row, 0.1f, 0.55f, counts(2, 0.7f, 1, 0.6f), w));
  EXPECT_EQ(w.low, 0.0f);
  EXPECT_EQ(w.high, 1.0f);
  EXPECT_EQ(w.q, 1.0f);
  // pivot0 fails (5 above), pivot1 passes (1 above): candidates above pivot0, high = pivot1.
  EXPECT_FALSE(pivot_round(SamplingKind::kTopK, row, 0.1f, 0.55f, counts(5, 0.8f, 1, 0.6f), w));
  EXPECT_EQ(w.low, 0.1f);
  EXPECT_EQ(w.high, 0.55f);
  EXPECT_EQ(w.q, 0.8f);
  // Both fail: candidates above pivot1, high unchanged.
  EXPECT_FALSE(pivot_round(SamplingKind::kTopK, row, 0.12f, 0.335f, counts(6, 0.7f, 4, 0.5f), w));
  EXPECT_EQ(w.low, 0.335f);
  EXPECT_EQ(w.high, 0.55f);
  EXPECT_EQ(w.q, 0.5f);
  // Unnormalized input, pivot1 not above pivot0: the sampled token still leaves (low = pivot0).
  PivotWindow u;
  EXPECT_FALSE(pivot_round(SamplingKind::kTopK, row, 3.0f, 2.0f, counts(4, 9.0f, 5, 12.0f), u));
  EXPECT_EQ(u.low, 3.0f);
  EXPECT_EQ(u.q, 9.0f);
  // Top-p tests the mass strictly above: 0.49 passes, 0.5 does not.
  PivotWindow p;
  EXPECT_TRUE(pivot_round(SamplingKind::kTopP, row, 0.2f, 0.6f, counts(9, 0.49f, 0, 0.0f), p));
  EXPECT_FALSE(pivot_round(SamplingKind::kTopP, row, 0.2f, 0.6f, counts(9, 0.5f, 0, 0.0f), p));
  EXPECT_EQ(p.low, 0.2f);
  EXPECT_EQ(p.high, 0.6f);
  // Joint: both tests must pass.
  PivotWindow j;
  EXPECT_FALSE(pivot_round(SamplingKind::kTopKTopP, row, 0.2f, 0.6f, counts(1, 0.6f, 0, 0.0f), j));
  EXPECT_FALSE(pivot_round(SamplingKind::kTopKTopP, row, 0.2f, 0.6f, counts(3, 0.3f, 0, 0.0f), j));
  EXPECT_TRUE(pivot_round(SamplingKind::kTopKTopP, row, 0.2f, 0.6f, counts(2, 0.3f, 0, 0.0f), j));
}

// The threshold search as the CUDA filter kernel runs it (one pass = one test of every pivot).
uint32_t search(const std::function<bool(uint32_t)>& below, int* passes) {
  uint32_t lo = 0, hi = 0xFFFFFFFFu;
  *passes = 0;
  while (lo < hi) {
    int first_below = kThresholdPivots;
    for (int j = kThresholdPivots - 1; j >= 0; --j) {
      const uint32_t m = threshold_pivot(lo, hi, j, kThresholdPivots);
      EXPECT_GE(m, lo);
      EXPECT_LT(m, hi);
      if (j + 1 < kThresholdPivots) {
        EXPECT_LE(m, threshold_pivot(lo, hi, j + 1, kThresholdPivots));
      }
      if (below(m)) first_below = j;
    }
    threshold_narrow(lo, hi, first_below, kThresholdPivots);
    ++*passes;
  }
  return lo;
}

TEST(SamplingRules, ThresholdSearchFindsTheSmallestPassingKeyInEightPasses) {
  std::mt19937 gen(3);
  std::vector<uint32_t> targets = {0u,  1u,          2u,          15u,         16u,
                                   17u, 0x7fffffffu, 0x80000000u, 0xfffffffeu, 0xffffffffu};
  for (int i = 0; i < 2000; ++i) targets.push_back(static_cast<uint32_t>(gen()));
  for (uint32_t t : targets) {
    int passes = 0;
    EXPECT_EQ(search([t](uint32_t m) { return m >= t; }, &passes), t);
    EXPECT_LE(passes, 8) << t;
  }
}

// The filters' thresholds (the CPU reference's definitions): top-k's is the k-th largest key
// (0 when fewer than k numbers); top-p's the smallest key whose strictly-larger mass is below p.
TEST(SamplingRules, ThresholdSearchGivesTheFiltersThresholds) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 1 + trial * 37;
    std::vector<float> x(static_cast<std::size_t>(n));
    float sum = 0.0f;
    for (float& v : x) {
      v = uni(gen);
      v = v * v * v;
      if (trial % 4 == 1) v = std::round(v * 8.0f) / 8.0f;  // ties
      sum += v;
    }
    if (trial % 5 == 2) x[0] = std::numeric_limits<float>::quiet_NaN();
    for (float& v : x) v /= sum;
    std::vector<uint32_t> keys;
    for (float v : x) keys.push_back(ordered_key(v));
    std::vector<uint32_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end(), std::greater<uint32_t>());
    const int64_t numbers = std::count_if(keys.begin(), keys.end(), [](uint32_t k) { return k; });
    for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{n}, int64_t{n + 3}}) {
      int passes = 0;
      const uint32_t t = search(
          [&](uint32_t m) {
            return std::count_if(keys.begin(), keys.end(), [m](uint32_t q) { return q > m; }) < k;
          },
          &passes);
      EXPECT_EQ(t, k <= numbers ? sorted[static_cast<std::size_t>(k - 1)] : 0u)
          << "n " << n << " k " << k;
    }
    for (float top_p : {0.1f, 0.5f, 0.9f, 1.0f}) {
      auto mass_above = [&](uint32_t m) {
        double s = 0.0;
        for (std::size_t i = 0; i < keys.size(); ++i) s += keys[i] > m && x[i] > 0.0f ? x[i] : 0.0;
        return s;
      };
      int passes = 0;
      const uint32_t t = search([&](uint32_t m) { return mass_above(m) < top_p; }, &passes);
      // t passes and is the smallest key that does: every key below t fails, in particular the
      // largest key of the row below t (if any).
      EXPECT_LT(mass_above(t), top_p);
      if (t > 0) {
        EXPECT_GE(mass_above(t - 1), top_p) << "n " << n << " p " << top_p;
      }
    }
  }
}

// The radix select as the CUDA filter kernel runs it: `threads` threads, thread t summing the
// kRadixBins / threads bins below the top t * (kRadixBins / threads), an exclusive scan of those
// sums over the threads, radix_find in each (at most one finds the bin).
uint32_t radix_model(const std::vector<uint32_t>& keys, int64_t k, int threads) {
  if (k <= 0) return 0xFFFFFFFFu;
  uint32_t prefix = 0, mask = 0;
  int64_t want = k;
  const int per = kRadixBins / threads;
  for (int pass = 0; pass < kRadixPasses; ++pass) {
    std::vector<uint32_t> hist(kRadixBins, 0);
    for (uint32_t key : keys) {
      const int b = radix_bin(key, pass, prefix, mask);
      if (b >= 0) ++hist[static_cast<std::size_t>(b)];
    }
    int found = -1, finders = 0;
    int64_t rest = 0, above = 0;
    for (int t = 0; t < threads; ++t) {
      const int top = kRadixBins - per * t - 1;
      int64_t r = 0;
      const int b = radix_find(hist.data(), top, per, above, want, &r);
      if (b >= 0) {
        found = b;
        rest = r;
        ++finders;
      }
      for (int j = 0; j < per; ++j) above += hist[static_cast<std::size_t>(top - j)];
    }
    EXPECT_LE(finders, 1);
    if (found < 0) return 0u;
    radix_fix(prefix, mask, pass, found);
    want = rest;
  }
  return prefix;
}

uint32_t count_threshold(const std::vector<uint32_t>& keys, int64_t k) {
  int passes = 0;
  return search(
      [&](uint32_t m) {
        return std::count_if(keys.begin(), keys.end(), [m](uint32_t q) { return q > m; }) < k;
      },
      &passes);
}

// The kernel's radix select and the k-ary search give the same threshold on every row: random
// keys, heavy ties, keys differing in the lowest digit only, NaN (key 0), the padding the kernel
// loads past a row's end (key 0), k = 0, 1, n and beyond n.
TEST(SamplingRules, RadixSelectGivesTheCountThresholdExactly) {
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  for (int trial = 0; trial < 60; ++trial) {
    const int n = 1 + trial * 53;
    std::vector<uint32_t> keys(static_cast<std::size_t>(n));
    for (uint32_t& key : keys) {
      switch (trial % 5) {
        case 0:
          key = static_cast<uint32_t>(gen());
          break;
        case 1:
          key = ordered_key(std::round(uni(gen) * 8.0f) / 8.0f);
          break;  // ties
        case 2:
          key = 0xBF000000u + static_cast<uint32_t>(gen() % 700u);
          break;  // low digit
        case 3:
          key = ordered_key(uni(gen) * uni(gen) * uni(gen) * 1e-3f);
          break;
        default:
          key = gen() % 7 == 0 ? 0u : ordered_key(-uni(gen));
          break;  // NaN, negatives
      }
    }
    std::vector<uint32_t> padded = keys;
    padded.resize(padded.size() + static_cast<std::size_t>(trial % 9), 0u);
    for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{50}, int64_t{n - 1}, int64_t{n},
                      int64_t{n + 3}}) {
      const uint32_t want = count_threshold(keys, k);
      EXPECT_EQ(radix_model(keys, k, 512), want) << "trial " << trial << " k " << k;
      EXPECT_EQ(radix_model(padded, k, 512), count_threshold(padded, k)) << trial << " " << k;
      EXPECT_EQ(radix_model(keys, k, 256), want) << "trial " << trial << " k " << k;
    }
  }
  // Hand-checked: the 2nd largest of {5, 9, 9, 1} is 9, the 3rd 5, the 5th 0 (fewer keys).
  EXPECT_EQ(radix_model({5, 9, 9, 1}, 2, 512), 9u);
  EXPECT_EQ(radix_model({5, 9, 9, 1}, 3, 512), 5u);
  EXPECT_EQ(radix_model({5, 9, 9, 1}, 5, 512), 0u);
  EXPECT_EQ(radix_model({5, 9, 9, 1}, 0, 512), 0xFFFFFFFFu);
}

// ---- per-row values ----------------------------------------------------------------------------

uint32_t f32_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

TEST(SamplingRowValues, HalfDecodeIsExactForEveryCode) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float want = half_bits_to_float(static_cast<uint16_t>(h));
    const float got = sampling_half_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << h;
    } else {
      EXPECT_EQ(f32_bits(got), f32_bits(want)) << h;  // -0 stays -0
    }
  }
}

RowArg array_arg(const Tensor& t) {
  RowArg a;
  a.data = t.data_ptr();
  a.dtype = t.dtype();
  a.stride = t.stride(0);
  return a;
}

// Row b of a float argument is the tensor element rounded to fp32, what the host table held
// before (static_cast<float> of Tensor::to_double_vector()), for every float dtype, contiguous
// and strided; and the scalar for every row.
TEST(SamplingRowValues, FloatArgumentsEveryDtypeAndStride) {
  const std::vector<double> v = {0.1, 1.0, 0.3333333333333333, 1e-9, 0.95, -0.0, 65504.0, 0.7};
  const int64_t n = static_cast<int64_t>(v.size());
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    const Tensor dense = Tensor::from_vector(v, {n}, dt);
    Tensor wide = Tensor::zeros({3 * n}, dt);
    wide.slice(0, 0, 3 * n, 3).copy_(dense);
    ASSERT_EQ(wide.slice(0, 0, 3 * n, 3).to_double_vector(), dense.to_double_vector());
    for (const Tensor& t : {dense, wide.slice(0, 0, 3 * n, 3)}) {
      const std::vector<double> host = t.to_double_vector();
      const RowArg a = array_arg(t);
      for (int64_t b = 0; b < n; ++b) {
        EXPECT_EQ(f32_bits(row_arg_float(a, b)),
                  f32_bits(static_cast<float>(host[static_cast<std::size_t>(b)])))
            << dtype_torch_name(dt) << " stride " << t.stride(0) << " row " << b;
      }
    }
  }
  // fp64 rounds to nearest fp32.
  const Tensor d = Tensor::from_vector({0.1}, {1}, DType::kFloat64);
  EXPECT_EQ(row_arg_float(array_arg(d), 0), 0.1f);
  RowArg s;
  s.float_value = 0.25f;
  for (int64_t b : {0, 1, 1000}) EXPECT_EQ(row_arg_float(s, b), 0.25f);
  // Stride 0: every row reads element 0 (a one-entry seed or offset tensor).
  RowArg z = array_arg(d);
  z.stride = 0;
  EXPECT_EQ(row_arg_float(z, 7), 0.1f);
}

TEST(SamplingRowValues, IntegerArgumentsEveryDtypeAndStride) {
  const std::vector<int64_t> v = {0, 1, -1, 5, 2147483647, -2147483647 - 1, 123456789};
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<int32_t> i32(v.begin(), v.end());
  std::vector<int64_t> i64 = v;
  i64.push_back(int64_t{1} << 40);  // only int64 holds it
  std::vector<int32_t> i32_wide(static_cast<std::size_t>(2 * n), 99);
  for (int64_t b = 0; b < n; ++b) i32_wide[static_cast<std::size_t>(2 * b)] = i32[b];
  RowArg a32{i32.data(), DType::kInt32, 1, 0, 0.0f};
  RowArg a32s{i32_wide.data(), DType::kInt32, 2, 0, 0.0f};
  RowArg a64{i64.data(), DType::kInt64, 1, 0, 0.0f};
  for (int64_t b = 0; b < n; ++b) {
    EXPECT_EQ(row_arg_int(a32, b), v[b]) << b;
    EXPECT_EQ(row_arg_int(a32s, b), v[b]) << b;
    EXPECT_EQ(row_arg_int(a64, b), v[b]) << b;
  }
  EXPECT_EQ(row_arg_int(a64, n), int64_t{1} << 40);
  RowArg s;
  s.int_value = -42;
  EXPECT_EQ(row_arg_int(s, 0), -42);
  EXPECT_EQ(row_arg_int(s, 9), -42);
}

TEST(SamplingRowValues, TopKAsUpstreamReadsIt) {
  EXPECT_EQ(sampling_top_k(1), 1);
  EXPECT_EQ(sampling_top_k(128256), 128256);
  EXPECT_EQ(sampling_top_k(0), 0);  // keeps no token
  constexpr int32_t kNoLimit = 2147483647;
  EXPECT_EQ(sampling_top_k(-1), kNoLimit);  // upstream's uint32 read: above any vocabulary
  EXPECT_EQ(sampling_top_k(std::numeric_limits<int64_t>::min()), kNoLimit);
  EXPECT_EQ(sampling_top_k(int64_t{1} << 40), kNoLimit);
  // k = 0 passes no candidate, k = kNoLimit every one.
  SamplingRow r;
  r.top_k = sampling_top_k(0);
  EXPECT_FALSE(filter_accepts(SamplingKind::kTopK, r, 0, 0.0f));
  r.top_k = sampling_top_k(-3);
  EXPECT_TRUE(filter_accepts(SamplingKind::kTopK, r, 1 << 30, 1.0f));
}

TEST(SamplingRowValues, SourceRowsAreClamped) {
  SamplingRowArgs a;
  a.src_rows = 4;
  for (int64_t b : {0, 3, 7}) EXPECT_EQ(sampling_src_row(a, b), b);  // no indices: row b
  const std::vector<int64_t> idx = {2, -1, 4, 1000, 0, 3};
  a.indices = {idx.data(), DType::kInt64, 1, 0, 0.0f};
  const std::vector<int64_t> want = {2, 0, 3, 3, 0, 3};
  for (int64_t b = 0; b < 6; ++b) EXPECT_EQ(sampling_src_row(a, b), want[b]) << b;
}

// sampling_row reads every field from where it is: scalars, per-row arrays of mixed dtypes and
// strides, element 0 of seed/offset arrays; seeds and offsets as the uint64 of the int64.
TEST(SamplingRowValues, RowReadsEveryArgumentWhereItIs) {
  const std::vector<int32_t> idx = {1, 0, 1};
  const std::vector<int64_t> k = {3, 0, 7, 0, -1, 0};           // stride 2
  const std::vector<uint16_t> p = {0x3C00u, 0x3800u, 0x3400u};  // fp16 1, 0.5, 0.25
  const std::vector<double> m = {0.1, 0.2, 0.3};
  const std::vector<int64_t> seed = {-1};  // one entry: stride 0
  const std::vector<int64_t> off = {4, 8, 12};
  SamplingRowArgs a;
  a.src_rows = 2;
  a.indices = {idx.data(), DType::kInt32, 1, 0, 0.0f};
  a.top_k = {k.data(), DType::kInt64, 2, 0, 0.0f};
  a.top_p = {p.data(), DType::kFloat16, 1, 0, 0.0f};
  a.min_p = {m.data(), DType::kFloat64, 1, 0, 0.0f};
  a.seed = {seed.data(), DType::kInt64, 0, 0, 0.0f};
  a.offset = {off.data(), DType::kInt64, 1, 0, 0.0f};
  for (int64_t b = 0; b < 3; ++b) {
    const SamplingRow r = sampling_row(a, b);
    EXPECT_EQ(r.src_row, idx[b]);
    EXPECT_EQ(r.top_k, sampling_top_k(k[2 * b]));
    EXPECT_EQ(r.top_p, 1.0f / static_cast<float>(1 << b));
    EXPECT_EQ(r.min_p, static_cast<float>(m[b]));
    EXPECT_EQ(r.temperature, 1.0f);   // the default scalar
    EXPECT_EQ(r.seed, ~uint64_t{0});  // one entry (stride 0): every row
    // An offset (and seed) array of one entry a row is read at the output row (upstream 0.7.4).
    EXPECT_EQ(r.offset, static_cast<uint64_t>(off[b]));
  }
  // top_k / top_p read at the source row where upstream's kernels read them there.
  a.top_k_by_src_row = a.top_p_by_src_row = true;
  for (int64_t b = 0; b < 3; ++b) {
    const SamplingRow r = sampling_row(a, b);
    EXPECT_EQ(r.top_k, sampling_top_k(k[2 * idx[b]])) << b;
    EXPECT_EQ(r.top_p, 1.0f / static_cast<float>(1 << idx[b])) << b;
    EXPECT_EQ(r.min_p, static_cast<float>(m[b])) << b;  // min_p_by_src_row not set here
  }
  // All scalars: the defaults of an op without the argument.
  SamplingRowArgs s;
  s.src_rows = 5;
  s.seed.int_value = 67280421310721;
  s.offset.int_value = 16;
  s.top_k.int_value = 50;
  const SamplingRow r = sampling_row(s, 4);
  EXPECT_EQ(r.src_row, 4);
  EXPECT_EQ(r.top_k, 50);
  EXPECT_EQ(r.top_p, 1.0f);
  EXPECT_EQ(r.min_p, 0.0f);
  EXPECT_EQ(r.seed, uint64_t{67280421310721});
  EXPECT_EQ(r.offset, uint64_t{16});
}

}  // namespace
}  // namespace flashinfer::kernels
