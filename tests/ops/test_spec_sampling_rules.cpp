// kernels/spec_sampling_rules.h, the arithmetic chain_speculative_sampling's CPU reference and
// CUDA kernel share: the chunk scan against an independent (recursive) statement of the
// Kogge-Stone order, exact on integer-valued data, and the residual and acceptance rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/spec_sampling_rules.h"

namespace flashinfer::kernels {
namespace {

// Kogge-Stone's inclusive scan of x over `n` lanes after `steps` steps, stated recursively:
// after step k (offset 2^(k-1)), lane l holds value(l - off, k - 1) + value(l, k - 1) when
// l >= off, else value(l, k - 1).
float ks(const std::vector<float>& x, int l, int steps) {
  if (steps == 0) return x[l];
  const int off = 1 << (steps - 1);
  if (l < off) return ks(x, l, steps - 1);
  return ks(x, l - off, steps - 1) + ks(x, l, steps - 1);
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

TEST(SpecSamplingRules, ChunkScanIsWarpThenWarpTotalsKoggeStone) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<float> x(kSpecThreads);
    for (float& v : x) v = dist(gen) * (trial == 3 ? 1e-3f : 1.0f);
    std::vector<float> warp_total(kSpecWarps), want(kSpecThreads);
    for (int w = 0; w < kSpecWarps; ++w) {
      std::vector<float> lanes(x.begin() + w * 32, x.begin() + w * 32 + 32);
      for (int l = 0; l < 32; ++l) want[w * 32 + l] = ks(lanes, l, 5);
      warp_total[w] = want[w * 32 + 31];
    }
    std::vector<float> scanned(kSpecWarps);
    for (int w = 0; w < kSpecWarps; ++w) scanned[w] = ks(warp_total, w, 3);
    for (int w = 1; w < kSpecWarps; ++w) {
      for (int l = 0; l < 32; ++l) want[w * 32 + l] = scanned[w - 1] + want[w * 32 + l];
    }
    std::vector<float> got = x;
    const float total = spec_chunk_scan(got.data());
    for (int t = 0; t < kSpecThreads; ++t) ASSERT_EQ(bits(got[t]), bits(want[t])) << t;
    EXPECT_EQ(bits(total), bits(scanned[kSpecWarps - 1]));
  }
}

TEST(SpecSamplingRules, ChunkScanIsExactOnIntegers) {
  std::vector<float> x(kSpecThreads);
  for (int t = 0; t < kSpecThreads; ++t) x[t] = static_cast<float>(t % 7);
  const float total = spec_chunk_scan(x.data());
  double run = 0;
  for (int t = 0; t < kSpecThreads; ++t) {
    run += t % 7;
    EXPECT_EQ(x[t], run) << t;
  }
  EXPECT_EQ(total, run);
}

TEST(SpecSamplingRules, ResidualAndAcceptance) {
  EXPECT_EQ(spec_residual_mass(0.5f, 0.25f), 0.25f);
  EXPECT_EQ(spec_residual_mass(0.25f, 0.5f), 0.0f);
  EXPECT_EQ(spec_residual_mass(0.25f, 0.25f), 0.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(spec_residual_mass(nan, 0.1f), 0.0f);  // a NaN adds nothing, on both backends
  EXPECT_EQ(spec_residual_mass(0.1f, nan), 0.0f);
  EXPECT_TRUE(spec_accept(0.5f, 0.4f, 0.3f));   // 0.2 < 0.3
  EXPECT_FALSE(spec_accept(1.0f, 0.4f, 0.3f));  // 0.4 >= 0.3
  EXPECT_FALSE(spec_accept(0.5f, 0.4f, 0.0f));  // a target probability of 0 never accepts
}

// A draft id reads its probabilities at a column inside the row, whatever its value.
TEST(SpecSamplingRules, DraftColumnIsClampedIntoTheRow) {
  EXPECT_EQ(spec_draft_column(0, 4), 0);
  EXPECT_EQ(spec_draft_column(3, 4), 3);
  EXPECT_EQ(spec_draft_column(4, 4), 3);
  EXPECT_EQ(spec_draft_column(9, 4), 3);
  EXPECT_EQ(spec_draft_column(-1, 4), 0);
  EXPECT_EQ(spec_draft_column(std::numeric_limits<int64_t>::min(), 32000), 0);
  EXPECT_EQ(spec_draft_column(std::numeric_limits<int64_t>::max(), 32000), 31999);
}

}  // namespace
}  // namespace flashinfer::kernels
