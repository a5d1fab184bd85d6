// The plain arithmetic the CPU and CUDA sampling kernels share (src/kernels/sampling_rules.h),
// checked on the CPU: chunk partitioning (every element owned exactly once, 128-bit loads only
// where they are legal), the Philox draw at a position (the stream's, word for word), the
// dual-pivot rule (hand-checked rounds), and the 16-way threshold search (the k-th largest key
// and the top-p boundary, against sorting, within its pass bound).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

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

}  // namespace
}  // namespace flashinfer::kernels
