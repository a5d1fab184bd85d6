// Host checks of the CUDA device library's arithmetic (src/kernels/cuda/device/) and of the
// host-side occupancy calculator: all of it is plain integer / float code shared with the kernels,
// so it is verified here, without a GPU, against independent oracles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cuda/device/fastdiv.cuh"
#include "kernels/cuda/device/permuted_smem.cuh"
#include "kernels/cuda/device/softmax_state.cuh"
#include "kernels/cuda/smem_limits.h"
#include "kernels/occupancy.h"

#ifdef FLASHINFER_TEST_HAVE_CUDA_HEADERS
// fp8_widen.cuh runs cuda_fp8.h's conversions, host and device code (their host path is the
// integer code sm_80 runs on the device): checkable here with the CUDA headers alone.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-function"
#include "kernels/cuda/device/fp8_widen.cuh"
#pragma GCC diagnostic pop
#endif

namespace {

using flashinfer::kernels::device_limits;
using flashinfer::kernels::DeviceLimits;
using flashinfer::kernels::occupancy_blocks_per_sm;
using flashinfer::kernels::cuda::dev::FastDivmod;
using flashinfer::kernels::cuda::dev::merge_state;
using flashinfer::kernels::cuda::dev::permuted_advance_col_groups;
using flashinfer::kernels::cuda::dev::permuted_advance_rows;
using flashinfer::kernels::cuda::dev::permuted_layout_ok;
using flashinfer::kernels::cuda::dev::permuted_offset;
using flashinfer::kernels::cuda::dev::SoftmaxState;

// ---- FastDivmod ---------------------------------------------------------------------------------

constexpr uint32_t kMaxN = 0x7fffffffu;  // 2^31 - 1, the largest index the kernels divide

// Checks div, mod and divmod at n against the hardware division; returns false (after one
// gtest failure) on a mismatch so that a broken divisor reports once, not millions of times.
bool check_divmod(const FastDivmod& f, uint32_t n) {
  const uint32_t q = n / f.d, r = n % f.d;
  uint32_t q2 = ~0u, r2 = ~0u;
  f.divmod(n, q2, r2);
  if (f.div(n) != q || f.mod(n) != r || q2 != q || r2 != r) {
    ADD_FAILURE() << "d=" << f.d << " n=" << n << ": div " << f.div(n) << " mod " << f.mod(n)
                  << " divmod (" << q2 << ", " << r2 << "), expected (" << q << ", " << r << ")";
    return false;
  }
  return true;
}

// Dense n near 0, n around multiples of d (first ones and the last ones below 2^31), random n,
// and the largest n.
bool check_divisor(uint32_t d, std::mt19937& rng) {
  const FastDivmod f(d);
  if (f.d != d) {
    ADD_FAILURE() << "d=" << d << " stored as " << f.d;
    return false;
  }
  for (uint32_t n = 0; n <= 1024; ++n) {
    if (!check_divmod(f, n)) return false;
  }
  auto around = [&](uint64_t m) {
    for (int64_t delta = -2; delta <= 2; ++delta) {
      const int64_t n = int64_t(m) + delta;
      if (n >= 0 && n <= int64_t(kMaxN) && !check_divmod(f, uint32_t(n))) return false;
    }
    return true;
  };
  for (uint64_t k = 1; k <= 64; ++k) {
    if (!around(k * d)) return false;
  }
  const uint64_t last = kMaxN / d;
  for (uint64_t k = last > 8 ? last - 8 : 0; k <= last + 1; ++k) {
    if (!around(k * d) || !around(k * d + d - 1)) return false;
  }
  std::uniform_int_distribution<uint32_t> any_n(0, kMaxN);
  for (int i = 0; i < 1024; ++i) {
    if (!check_divmod(f, any_n(rng))) return false;
  }
  return check_divmod(f, kMaxN);
}

TEST(FastDivmod, DefaultIsDivisionByOne) {
  const FastDivmod f;
  EXPECT_EQ(f.d, 1u);
  for (uint32_t n : {0u, 1u, 2u, 12345u, kMaxN - 1, kMaxN}) {
    EXPECT_EQ(f.div(n), n);
    EXPECT_EQ(f.mod(n), 0u);
  }
}

TEST(FastDivmod, SmallDivisors) {
  std::mt19937 rng(20240611);
  for (uint32_t d = 1; d <= 4096; ++d) {
    if (!check_divisor(d, rng)) return;
  }
}

TEST(FastDivmod, LargeDivisors) {
  std::vector<uint32_t> divisors = {
      65521u,      65537u,         1000003u,    16777213u,   16777259u, 1000000000u,
      1000000007u, 1073741789u,    1073741827u, 2147483629u, kMaxN,     kMaxN - 1,
      3u << 29,    (3u << 29) + 1, 0x55555555u, 0x40000001u,
  };
  for (int k = 0; k <= 30; ++k) {
    const uint32_t p = 1u << k;
    divisors.insert(divisors.end(), {p, p + 1, p > 1 ? p - 1 : 1u});
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any_d(1, kMaxN);
  for (int i = 0; i < 200; ++i) divisors.push_back(any_d(rng));
  for (uint32_t d : divisors) {
    if (!check_divisor(d, rng)) return;
  }
}

// The FA2 prefill kernel rebuilds the page split from the parts its launcher computed
// (AttentionParams::kv_page_div_*): the same divisor, for every page size a cache can have.
TEST(FastDivmod, FromPartsIsTheSameDivisor) {
  std::mt19937 rng(36);
  for (uint32_t d = 1; d <= 4096; ++d) {
    const FastDivmod built(d);
    const FastDivmod f = FastDivmod::from_parts(d, built.mul, built.shift);
    ASSERT_EQ(f.d, d);
    ASSERT_EQ(f.mul, built.mul);
    ASSERT_EQ(f.shift, built.shift);
    std::uniform_int_distribution<uint32_t> any_n(0, kMaxN);
    for (int i = 0; i < 256; ++i) {
      if (!check_divmod(f, any_n(rng))) return;
    }
    if (!check_divmod(f, kMaxN) || !check_divmod(f, d - 1) || !check_divmod(f, d)) return;
  }
}

// Every n below 2^24 for the page sizes (and a few other divisors, whose multiplier is not a power
// of two), against a running (quotient, remainder) counter.
TEST(FastDivmod, ExhaustivePageSizes) {
  for (uint32_t d : {1u, 16u, 32u, 64u, 3u, 7u, 24u, 100u, 1000u}) {
    const FastDivmod f(d);
    uint32_t q = 0, r = 0;
    for (uint32_t n = 0; n < (1u << 24); ++n) {
      uint32_t q2, r2;
      f.divmod(n, q2, r2);
      if (q2 != q || r2 != r || f.div(n) != q || f.mod(n) != r) {
        FAIL() << "d=" << d << " n=" << n << ": got (" << q2 << ", " << r2 << "), expected (" << q
               << ", " << r << ")";
      }
      if (++r == d) {
        r = 0;
        ++q;
      }
    }
  }
}

// ---- SoftmaxState -------------------------------------------------------------------------------

constexpr int kN = 8;
using State = SoftmaxState<kN>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Token {
  float s;  // logit, log2 units
  float v[kN];
};

State empty_state() {
  State st;
  st.init();
  return st;
}

// Folds tokens [begin, end) one at a time, as a kernel does: each token is the state {v, s, 1}.
State fold(const std::vector<Token>& t, size_t begin, size_t end) {
  State st = empty_state();
  for (size_t i = begin; i < end; ++i) st.merge(t[i].v, t[i].s, 1.0f);
  return st;
}

bool same_bits(const State& a, const State& b) {
  return std::memcmp(a.o, b.o, sizeof(a.o)) == 0 && std::memcmp(&a.m, &b.m, sizeof(float)) == 0 &&
         std::memcmp(&a.d, &b.d, sizeof(float)) == 0;
}

// Random logits around `base`: mostly within +-16, some far below (weight 2^-1000 and less: zero
// in float), some -inf (masked); at least one finite.
std::vector<Token> random_tokens(std::mt19937& rng, size_t n, float base) {
  std::uniform_real_distribution<float> logit(-16.0f, 16.0f), value(-1.0f, 1.0f), unit(0, 1);
  std::vector<Token> t(n);
  for (Token& tok : t) {
    const float u = unit(rng);
    tok.s = u < 0.1f ? kNegInf : u < 0.2f ? base - 1000.0f + logit(rng) : base + logit(rng);
    for (float& x : tok.v) x = value(rng);
  }
  t[std::uniform_int_distribution<size_t>(0, n - 1)(rng)].s = base + logit(rng);
  return t;
}

// The direct softmax in fp64: normalized output, base-2 log-sum-exp, and per component the
// weighted sum of |v| / sum of weights, the scale against which the rounding error is measured
// (components of o can cancel to near 0).
struct Reference {
  double o[kN], lse, scale[kN];
};
Reference reference(const std::vector<Token>& t) {
  double m = -std::numeric_limits<double>::infinity();
  for (const Token& tok : t) m = std::max(m, double(tok.s));
  Reference ref{};
  double d = 0;
  for (const Token& tok : t) {
    const double w = std::exp2(double(tok.s) - m);  // exp2(-inf) == 0
    d += w;
    for (int i = 0; i < kN; ++i) {
      ref.o[i] += w * tok.v[i];
      ref.scale[i] += w * std::abs(tok.v[i]);
    }
  }
  for (int i = 0; i < kN; ++i) {
    ref.o[i] /= d;
    ref.scale[i] /= d;
  }
  ref.lse = m + std::log2(d);
  return ref;
}

void expect_matches(State st, const Reference& ref, const char* how) {
  ASSERT_GT(st.d, 0.0f) << how;
  const float lse = st.lse();
  EXPECT_LE(std::abs(lse - ref.lse), 1e-5 * std::max(1.0, std::abs(ref.lse)))
      << how << ": lse " << lse << " vs " << ref.lse;
  st.normalize();
  for (int i = 0; i < kN; ++i) {
    EXPECT_LE(std::abs(st.o[i] - ref.o[i]), 1e-5 * ref.scale[i])
        << how << ": o[" << i << "] " << st.o[i] << " vs " << ref.o[i];
  }
}

TEST(SoftmaxState, MergeStateFactors) {
  float s1, s2, m, d;
  merge_state(1.0f, 2.0f, 3.0f, 1.0f, &s1, &s2, &m, &d);  // 2^(1-3) = 0.25
  EXPECT_EQ(m, 3.0f);
  EXPECT_EQ(s1, 0.25f);
  EXPECT_EQ(s2, 1.0f);
  EXPECT_EQ(d, 1.5f);
  merge_state(-2.0f, 4.0f, -5.0f, 8.0f, &s1, &s2, &m, &d);  // 2^(-5+2) = 0.125
  EXPECT_EQ(m, -2.0f);
  EXPECT_EQ(s1, 1.0f);
  EXPECT_EQ(s2, 0.125f);
  EXPECT_EQ(d, 5.0f);
}

TEST(SoftmaxState, OneTokenAndTwoTokens) {
  const float v1[kN] = {1, 2, 3, 4, 5, 6, 7, 8}, v2[kN] = {8, 7, 6, 5, 4, 3, 2, 1};
  State st = empty_state();
  st.merge(v1, 3.0f, 1.0f);
  EXPECT_EQ(st.m, 3.0f);
  EXPECT_EQ(st.d, 1.0f);
  EXPECT_EQ(st.lse(), 3.0f);
  st.merge(v2, 4.0f, 1.0f);  // weights 2^-1 and 1: o = (v1 / 2 + v2) / 1.5
  EXPECT_EQ(st.m, 4.0f);
  EXPECT_EQ(st.d, 1.5f);
  EXPECT_FLOAT_EQ(st.lse(), 4.0f + std::log2(1.5f));
  st.normalize();
  for (int i = 0; i < kN; ++i) EXPECT_FLOAT_EQ(st.o[i], (v1[i] / 2 + v2[i]) / 1.5f) << i;
}

TEST(SoftmaxState, EmptyPlusEmptyStaysEmpty) {
  State a = empty_state();
  const State b = empty_state();
  a.merge(b);
  EXPECT_EQ(a.m, kNegInf);
  EXPECT_EQ(a.d, 0.0f);
  for (float x : a.o) EXPECT_EQ(x, 0.0f);
  EXPECT_EQ(a.lse(), kNegInf);
  a.normalize();
  for (float x : a.o) EXPECT_EQ(x, 0.0f);
  // A masked token (logit -inf) carries no weight: folding it leaves the state empty.
  const float v[kN] = {1, 1, 1, 1, 1, 1, 1, 1};
  a.merge(v, kNegInf, 1.0f);
  EXPECT_EQ(a.m, kNegInf);
  EXPECT_EQ(a.d, 0.0f);
  for (float x : a.o) EXPECT_EQ(x, 0.0f);
  float s1, s2, m, d;
  merge_state(kNegInf, 0.0f, kNegInf, 0.0f, &s1, &s2, &m, &d);
  EXPECT_FALSE(std::isnan(s1) || std::isnan(s2) || std::isnan(m) || std::isnan(d));
}

TEST(SoftmaxState, EmptyIsTheIdentity) {
  std::mt19937 rng(3);
  for (float base : {0.0f, -1e5f, 300.0f}) {
    const std::vector<Token> t = random_tokens(rng, 37, base);
    const State x = fold(t, 0, t.size());
    State left = empty_state();
    left.merge(x);
    EXPECT_TRUE(same_bits(left, x)) << "empty + x, base " << base;
    State right = x;
    right.merge(empty_state());
    EXPECT_TRUE(same_bits(right, x)) << "x + empty, base " << base;
  }
}

// Chunked folding merged in random orders and random trees matches the direct softmax.
TEST(SoftmaxState, ChunksMergedInAnyOrderMatchDirectSoftmax) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 200; ++trial) {
    // A large |base| checks that the max is subtracted before exponentiating (2^-1e5 is 0).
    const float base = trial % 4 == 1 ? -1e5f : trial % 4 == 3 ? 500.0f : 0.0f;
    const size_t n = std::uniform_int_distribution<size_t>(1, 200)(rng);
    const std::vector<Token> t = random_tokens(rng, n, base);
    const Reference ref = reference(t);
    expect_matches(fold(t, 0, n), ref, "one chunk");

    // Random chunk boundaries (chunks may be empty or all-masked).
    const size_t nchunks = std::uniform_int_distribution<size_t>(1, 16)(rng);
    std::vector<size_t> cuts = {0, n};
    for (size_t i = 1; i < nchunks; ++i) {
      cuts.push_back(std::uniform_int_distribution<size_t>(0, n)(rng));
    }
    std::sort(cuts.begin(), cuts.end());
    std::vector<State> chunks;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) chunks.push_back(fold(t, cuts[i], cuts[i + 1]));

    for (int order = 0; order < 3; ++order) {
      std::vector<State> s = chunks;
      std::shuffle(s.begin(), s.end(), rng);
      State acc = empty_state();
      for (const State& c : s) acc.merge(c);
      expect_matches(acc, ref, "left fold, shuffled");
    }
    for (int tree = 0; tree < 3; ++tree) {
      std::vector<State> s = chunks;
      while (s.size() > 1) {
        const size_t i = std::uniform_int_distribution<size_t>(0, s.size() - 1)(rng);
        size_t j = std::uniform_int_distribution<size_t>(0, s.size() - 2)(rng);
        if (j >= i) ++j;
        s[i].merge(s[j]);
        s.erase(s.begin() + j);
      }
      expect_matches(s[0], ref, "random tree");
    }
    if (HasFailure()) return;
  }
}

// ---- fp8 -> fp16 / bf16 widening (the FA2 prefill kernel's fp8 K/V) ---------------------------

#ifdef FLASHINFER_TEST_HAVE_CUDA_HEADERS
// Every code in every byte of the word (the other three bytes other codes) against the CPU's
// decode of fp8 (float_formats.h): the same bits as the CPU's fp32 value rounded to T, and that
// value read back unchanged (the widening is exact); NaN codes give a NaN.
template <class T, __nv_fp8_interpretation_t kKind>
void check_fp8_widen() {
  constexpr bool kHalf = std::is_same_v<T, __half>;
  auto decode = [](uint32_t code) {
    const auto b = static_cast<uint8_t>(code);
    return kKind == __NV_E4M3 ? flashinfer::e4m3fn_bits_to_float(b)
                              : flashinfer::e5m2_bits_to_float(b);
  };
  auto to_f32 = [](uint16_t bits) {
    return kHalf ? flashinfer::half_bits_to_float(bits) : flashinfer::bfloat16_bits_to_float(bits);
  };
  int checked = 0;
  for (uint32_t code = 0; code < 256; ++code) {
    for (int pos = 0; pos < 4; ++pos) {
      uint32_t codes[4], word = 0;
      for (int i = 0; i < 4; ++i) {
        codes[i] = i == pos ? code : (code * 37u + 11u * static_cast<uint32_t>(i) + 5u) & 0xffu;
        word |= codes[i] << (8 * i);
      }
      const uint2 w = flashinfer::kernels::cuda::dev::fp8x4_widen<T, kKind>(word);
      const uint16_t out[4] = {static_cast<uint16_t>(w.x), static_cast<uint16_t>(w.x >> 16),
                               static_cast<uint16_t>(w.y), static_cast<uint16_t>(w.y >> 16)};
      for (int i = 0; i < 4; ++i) {
        const float ref = decode(codes[i]);
        if (std::isnan(ref)) {
          ASSERT_TRUE(std::isnan(to_f32(out[i]))) << "code " << codes[i];
          continue;
        }
        const uint16_t want =
            kHalf ? flashinfer::float_to_half_bits(ref) : flashinfer::float_to_bfloat16_bits(ref);
        ASSERT_EQ(out[i], want) << "code " << codes[i] << " (" << ref << ") at byte " << i;
        ASSERT_EQ(to_f32(out[i]), ref) << "code " << codes[i] << " not exact";
        if (i == pos) ++checked;
      }
    }
  }
  // Every code in each of the 4 bytes, less the NaN codes (2 in e4m3, 6 in e5m2).
  EXPECT_EQ(checked, 4 * (kKind == __NV_E4M3 ? 254 : 250));
}

TEST(Fp8Widen, E4m3ToHalfEveryCode) { check_fp8_widen<__half, __NV_E4M3>(); }
TEST(Fp8Widen, E4m3ToBf16EveryCode) { check_fp8_widen<__nv_bfloat16, __NV_E4M3>(); }
TEST(Fp8Widen, E5m2ToHalfEveryCode) { check_fp8_widen<__half, __NV_E5M2>(); }
TEST(Fp8Widen, E5m2ToBf16EveryCode) { check_fp8_widen<__nv_bfloat16, __NV_E5M2>(); }

// The extremes the exactness argument rests on (fp8_widen.cuh), spelled out.
TEST(Fp8Widen, SubnormalsAndExtremes) {
  using flashinfer::kernels::cuda::dev::fp8x4_widen;
  // e4m3: 0x01 = 2^-9 (smallest subnormal), 0x7e = 448 (largest), 0x08 = 2^-6 (smallest normal),
  // 0x80 = -0.
  const uint2 h = fp8x4_widen<__half, __NV_E4M3>(0x80087e01u);
  EXPECT_EQ(h.x, 0x5f001800u);  // fp16 448 = 0x5f00, 2^-9 = 0x1800
  EXPECT_EQ(h.y, 0x80002400u);  // -0 = 0x8000, 2^-6 = 0x2400
  const uint2 b = fp8x4_widen<__nv_bfloat16, __NV_E4M3>(0x80087e01u);
  EXPECT_EQ(b.x, 0x43e03b00u);  // bf16 448 = 0x43e0, 2^-9 = 0x3b00
  EXPECT_EQ(b.y, 0x80003c80u);  // -0, 2^-6 = 0x3c80
  // e5m2: 0x01 = 2^-16 (an fp16 subnormal), 0x7b = 57344, 0x7c = inf, 0xfc = -inf.
  const uint2 h5 = fp8x4_widen<__half, __NV_E5M2>(0xfc7c7b01u);
  EXPECT_EQ(h5.x, 0x7b000100u);
  EXPECT_EQ(h5.y, 0xfc007c00u);
  const uint2 b5 = fp8x4_widen<__nv_bfloat16, __NV_E5M2>(0xfc7c7b01u);
  EXPECT_EQ(b5.x, 0x47603780u);  // bf16 57344 = 0x4760, 2^-16 = 0x3780
  EXPECT_EQ(b5.y, 0xff807f80u);
}

// The scaled widening (MLA's ckv_scale_arr): every e4m3 code times a scale, rounded to T, is
// what the CPU reference computes (fp32 product, round to nearest even): scales that round
// (1/3, 0.0179), that overflow fp16 (300 * 448), that reach subnormals (2^-20) and 1 (exact).
template <class T>
void check_fp8_widen_scaled() {
  constexpr bool kHalf = std::is_same_v<T, __half>;
  int checked = 0;
  for (float scale : {1.0f / 3.0f, 0.0179f, 300.0f, 0x1p-20f, 1.0f}) {
    for (uint32_t code = 0; code < 256; ++code) {
      const uint32_t word = code | (((code + 77u) & 0xffu) << 8) | (((code * 5u) & 0xffu) << 16) |
                            (((code ^ 0x5au) & 0xffu) << 24);
      const uint2 w = flashinfer::kernels::cuda::dev::fp8x4_widen_scaled<T, __NV_E4M3>(word, scale);
      const uint16_t out[4] = {static_cast<uint16_t>(w.x), static_cast<uint16_t>(w.x >> 16),
                               static_cast<uint16_t>(w.y), static_cast<uint16_t>(w.y >> 16)};
      for (int i = 0; i < 4; ++i) {
        const float x = flashinfer::e4m3fn_bits_to_float(static_cast<uint8_t>(word >> (8 * i)));
        const float want_f = x * scale;
        const uint16_t want = kHalf ? flashinfer::float_to_half_bits(want_f)
                                    : flashinfer::float_to_bfloat16_bits(want_f);
        if (std::isnan(want_f)) {
          const float got = kHalf ? flashinfer::half_bits_to_float(out[i])
                                  : flashinfer::bfloat16_bits_to_float(out[i]);
          ASSERT_TRUE(std::isnan(got)) << "code " << (word >> (8 * i) & 0xffu);
          continue;
        }
        ASSERT_EQ(out[i], want) << "code " << (word >> (8 * i) & 0xffu) << " x " << scale;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 5 * 1000);
}

TEST(Fp8Widen, ScaledE4m3ToHalfIsTheRoundedProduct) { check_fp8_widen_scaled<__half>(); }
TEST(Fp8Widen, ScaledE4m3ToBf16IsTheRoundedProduct) { check_fp8_widen_scaled<__nv_bfloat16>(); }
#endif

// ---- permuted shared-memory layout --------------------------------------------------------------

TEST(PermutedSmem, LayoutOk) {
  static_assert(permuted_layout_ok(8) && permuted_layout_ok(16) && permuted_layout_ok(64));
  static_assert(!permuted_layout_ok(0) && !permuted_layout_ok(4) && !permuted_layout_ok(12));
  static_assert(permuted_offset(1, 0, 8) == 9 && permuted_offset(3, 5, 16) == 48 + 6);
  for (uint32_t s = 0; s <= 256; ++s) EXPECT_EQ(permuted_layout_ok(s), s != 0 && s % 8 == 0) << s;
}

TEST(PermutedSmem, Bijection) {
  for (uint32_t stride16 : {8u, 16u, 32u}) {
    for (uint32_t rows : {8u, 16u, 64u}) {
      std::vector<bool> seen(rows * stride16, false);
      for (uint32_t row = 0; row < rows; ++row) {
        for (uint32_t col = 0; col < stride16; ++col) {
          const uint32_t off = permuted_offset(row, col, stride16);
          ASSERT_LT(off, rows * stride16) << row << "," << col;
          ASSERT_FALSE(seen[off]) << "offset " << off << " hit twice, stride16 " << stride16;
          seen[off] = true;
        }
      }
    }
  }
}

// ldmatrix reads one 16-byte unit from each of 8 rows: the 8 units must fall in 8 different
// 16-byte bank groups (offset mod 8), for every column and every aligned block of 8 rows.
bool conflict_free(uint32_t (*layout)(uint32_t, uint32_t, uint32_t), uint32_t stride16,
                   uint32_t rows) {
  for (uint32_t col = 0; col < stride16; ++col) {
    for (uint32_t r0 = 0; r0 < rows; r0 += 8) {
      std::set<uint32_t> groups;
      for (uint32_t r = r0; r < r0 + 8; ++r) groups.insert(layout(r, col, stride16) % 8);
      if (groups.size() != 8) return false;
    }
  }
  return true;
}

TEST(PermutedSmem, ConflictFreeColumnReads) {
  for (uint32_t stride16 : {8u, 16u, 32u}) {
    for (uint32_t rows : {8u, 16u, 64u}) {
      EXPECT_TRUE(
          conflict_free([](uint32_t r, uint32_t c, uint32_t s) { return permuted_offset(r, c, s); },
                        stride16, rows))
          << stride16 << " " << rows;
      // The check itself can fail: the plain row-major layout is an 8-way conflict.
      EXPECT_FALSE(conflict_free([](uint32_t r, uint32_t c, uint32_t s) { return r * s + c; },
                                 stride16, rows));
    }
  }
}

TEST(PermutedSmem, ColumnGroupsStayInTheirRow) {
  for (uint32_t stride16 : {8u, 16u, 32u}) {
    for (uint32_t row = 0; row < 64; ++row) {
      for (uint32_t col = 0; col < stride16; ++col) {
        const uint32_t group_start = row * stride16 + col / 8 * 8;
        const uint32_t off = permuted_offset(row, col, stride16);
        EXPECT_GE(off, group_start);
        EXPECT_LT(off, group_start + 8);
      }
    }
  }
}

TEST(PermutedSmem, AdvanceHelpers) {
  for (uint32_t stride16 : {8u, 16u, 32u}) {
    for (uint32_t row = 0; row < 32; ++row) {
      for (uint32_t col = 0; col < stride16; ++col) {
        const uint32_t off = permuted_offset(row, col, stride16);
        for (uint32_t rows = 0; rows <= 24; rows += 8) {
          EXPECT_EQ(permuted_advance_rows(off, rows, stride16),
                    permuted_offset(row + rows, col, stride16));
        }
        for (uint32_t g = 0; col + 8 * g < stride16; ++g) {
          EXPECT_EQ(permuted_advance_col_groups(off, g),
                    permuted_offset(row, col + 8 * g, stride16));
        }
      }
    }
  }
}

// ---- occupancy ----------------------------------------------------------------------------------

constexpr long kKiB = 1024;

TEST(Occupancy, DeviceLimits) {
  constexpr DeviceLimits a100 = device_limits(8, 0), h100 = device_limits(9, 0);
  static_assert(a100.smem_per_sm == 167936 && a100.max_smem_per_block == 166912);
  static_assert(h100.smem_per_sm == 233472 && h100.max_smem_per_block == 232448);
  for (const DeviceLimits& l : {a100, h100}) {
    EXPECT_EQ(l.max_threads_per_sm, 2048);
    EXPECT_EQ(l.max_warps_per_sm, 64);
    EXPECT_EQ(l.max_blocks_per_sm, 32);
  }
  const DeviceLimits ga10x = device_limits(8, 6), ada = device_limits(8, 9);
  for (const DeviceLimits& l : {ga10x, ada}) {
    EXPECT_EQ(l.smem_per_sm, 100 * kKiB);
    EXPECT_EQ(l.max_smem_per_block, 99 * kKiB);
    EXPECT_EQ(l.max_threads_per_sm, 1536);
    EXPECT_EQ(l.max_warps_per_sm, 48);
  }
  EXPECT_EQ(ga10x.max_blocks_per_sm, 16);
  EXPECT_EQ(ada.max_blocks_per_sm, 24);
  for (const DeviceLimits& l : {a100, h100, ga10x, ada}) {
    EXPECT_EQ(l.regs_per_sm, 65536);
    EXPECT_EQ(l.max_regs_per_thread, 255);
    EXPECT_EQ(l.reg_alloc_unit, 256);
    EXPECT_EQ(l.reserved_smem_per_block, 1 * kKiB);
    EXPECT_EQ(l.smem_alloc_unit, 128);
  }
  // An unknown capability never claims more than a listed one.
  const DeviceLimits other = device_limits(12, 7);
  for (const DeviceLimits& l : {a100, h100, ga10x, ada}) {
    EXPECT_LE(other.max_threads_per_sm, l.max_threads_per_sm);
    EXPECT_LE(other.max_blocks_per_sm, l.max_blocks_per_sm);
    EXPECT_LE(other.max_warps_per_sm, l.max_warps_per_sm);
    EXPECT_LE(other.smem_per_sm, l.smem_per_sm);
    EXPECT_LE(other.max_smem_per_block, l.max_smem_per_block);
  }
}

// Each expected value worked by hand: T = thread limit (warps), R = register limit, S = shared
// memory limit, B = block limit; the answer is the smallest. Registers per warp are
// round_up(regs * 32, 256), and each of the 4 sub-partitions holds floor(16384 / that) warps.
TEST(Occupancy, Sm90) {
  const DeviceLimits l = device_limits(9, 0);
  // 4 warps. T 64/4 = 16. R 64*32 = 2048/warp, 16384/2048 = 8 x 4 = 32 warps -> 8.
  // S 9216 + 1024 = 10240, 233472/10240 = 22. B 32. -> 8 (registers).
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 64, 9 * kKiB), 8);
  // T 16. R 1024/warp, 16 x 4 = 64 warps -> 16. S 233472/1024 = 228. -> 16 (threads).
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 32, 0), 16);
  // 1 warp. T 64. R 512/warp -> 128 warps -> 128. S 228. B 32. -> 32 (blocks).
  EXPECT_EQ(occupancy_blocks_per_sm(l, 32, 16, 0), 32);
  // 8 warps. T 8. R 255*32 = 8160 -> 8192/warp, 2 x 4 = 8 warps -> 1. -> 1.
  EXPECT_EQ(occupancy_blocks_per_sm(l, 256, 255, 0), 1);
  // 32 warps. R 65*32 = 2080 -> 2304/warp, 16384/2304 = 7 x 4 = 28 warps < 32 -> 0.
  EXPECT_EQ(occupancy_blocks_per_sm(l, 1024, 65, 0), 0);
  // 32 warps. T 2. R 2048/warp -> 32 warps -> 1. -> 1.
  EXPECT_EQ(occupancy_blocks_per_sm(l, 1024, 64, 0), 1);
  // 3 warps. T 64/3 = 21. R 40*32 = 1280/warp, 16384/1280 = 12 x 4 = 48 warps -> 16 (the whole
  // register file, 65536/1280 = 51 warps, would give 17). -> 16.
  EXPECT_EQ(occupancy_blocks_per_sm(l, 96, 40, 0), 16);
  // 4 warps. T 16. R 33*32 = 1056 -> 1280/warp, 16384/1280 = 12 x 4 = 48 warps -> 12 (unrounded,
  // 16384/1056 = 15 x 4 = 60 warps would give 15). -> 12.
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 33, 0), 12);
  // S 102400 + 1024 = 103424, 233472/103424 = 2. -> 2 (shared memory).
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 32, 100 * kKiB), 2);
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 32, 50 * kKiB, 50 * kKiB), 2);  // static counts too
  // S 49152 + 1024 = 50176, 233472/50176 = 4. -> 4.
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 32, 48 * kKiB), 4);
  // The largest block: 227 KiB + 1 KiB = 228 KiB -> 1; one byte more does not fit at all.
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 32, 227 * kKiB), 1);
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 32, 227 * kKiB + 1), 0);
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 32, 200 * kKiB, 28 * kKiB), 0);
  // The per-block cap applies by itself: without the opt-in, a block gets 48 KiB.
  DeviceLimits no_opt_in = l;
  no_opt_in.max_smem_per_block = 48 * kKiB;
  EXPECT_EQ(occupancy_blocks_per_sm(no_opt_in, 128, 32, 48 * kKiB), 4);
  EXPECT_EQ(occupancy_blocks_per_sm(no_opt_in, 128, 32, 40 * kKiB, 8 * kKiB + 1), 0);
  // Beyond the per-thread register or per-block thread limits, or an empty block.
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 256, 0), 0);
  EXPECT_EQ(occupancy_blocks_per_sm(l, 1025, 16, 0), 0);
  EXPECT_EQ(occupancy_blocks_per_sm(l, 0, 16, 0), 0);
  // No registers reported (an empty kernel): no register limit. T 16. -> 16.
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 0, 0), 16);
}

TEST(Occupancy, Sm80) {
  const DeviceLimits l = device_limits(8, 0);
  // T 16. R 8 (as on sm_90). S 167936/10240 = 16. -> 8 (registers).
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 64, 9 * kKiB), 8);
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 32, 0), 16);
  EXPECT_EQ(occupancy_blocks_per_sm(l, 32, 16, 0), 32);
  EXPECT_EQ(occupancy_blocks_per_sm(l, 256, 255, 0), 1);
  EXPECT_EQ(occupancy_blocks_per_sm(l, 1024, 65, 0), 0);
  // S 167936/103424 = 1. -> 1.
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 32, 100 * kKiB), 1);
  // S 167936/50176 = 3. -> 3.
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 32, 48 * kKiB), 3);
  // The 128-byte granule: 32516 -> 32640, + 1024 = 33664, 167936/33664 = 4 (unrounded, 33540
  // would give 5).
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 32, 32516), 4);
  // 163 KiB + 1 KiB = 164 KiB -> 1; one byte more -> 0.
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 32, 163 * kKiB), 1);
  EXPECT_EQ(occupancy_blocks_per_sm(l, 128, 32, 163 * kKiB + 1), 0);
}

TEST(Occupancy, Sm86AndSm89) {
  const DeviceLimits ga10x = device_limits(8, 6), ada = device_limits(8, 9);
  // 100 threads = 4 warps (whole warps count). T 48/4 = 12 (1536/100 would give 15). R 16 x 4 =
  // 64 warps -> 16. S 102400/1024 = 100. B 16. -> 12 (threads).
  EXPECT_EQ(occupancy_blocks_per_sm(ga10x, 100, 32, 0), 12);
  // 1 warp. T 48. R 128 warps. B 16 on 8.6, 24 on 8.9.
  EXPECT_EQ(occupancy_blocks_per_sm(ga10x, 32, 16, 0), 16);
  EXPECT_EQ(occupancy_blocks_per_sm(ada, 32, 16, 0), 24);
  // S (48 KiB + 1 KiB) = 50176, 102400/50176 = 2. -> 2.
  EXPECT_EQ(occupancy_blocks_per_sm(ada, 128, 32, 48 * kKiB), 2);
  EXPECT_EQ(occupancy_blocks_per_sm(ada, 128, 32, 99 * kKiB), 1);
  EXPECT_EQ(occupancy_blocks_per_sm(ada, 128, 32, 99 * kKiB + 1), 0);
}

// The launches' record of dynamic shared memory limits (kernels/cuda/smem_limits.h): raised only,
// one driver call per raise, and consistent when threads launch one kernel at different sizes at
// once (a record per launch size could end up naming one size while the driver held another, and
// every later launch of the larger size then skipped the call and failed). `driver` stands in
// for cudaFuncSetAttribute: it keeps the limit it was last set to.
TEST(SmemLimits, RaisedOnlyAndConsistentAcrossThreads) {
  flashinfer::kernels::cuda::SmemLimits limits;
  const int kernel_a = 0, kernel_b = 0;
  std::mutex driver_mutex;
  std::size_t driver = 0;
  int calls = 0;
  auto set = [&](std::size_t bytes) {
    const std::lock_guard<std::mutex> lock(driver_mutex);
    driver = bytes;
    ++calls;
    return 0;  // success, as cudaSuccess
  };
  EXPECT_EQ(limits.ensure(&kernel_a, 0, 100 << 10, set), 0);
  EXPECT_EQ(limits.ensure(&kernel_a, 0, 60 << 10, set), 0);  // under the limit: no call
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(driver, std::size_t{100} << 10);
  EXPECT_EQ(limits.limit(&kernel_a, 0), std::size_t{100} << 10);
  EXPECT_EQ(limits.limit(&kernel_a, 1), 0u);  // per device
  EXPECT_EQ(limits.limit(&kernel_b, 0), 0u);  // per kernel
  // A failed call records nothing.
  EXPECT_EQ(limits.ensure(&kernel_b, 0, 200 << 10, [](std::size_t) { return 7; }), 7);
  EXPECT_EQ(limits.limit(&kernel_b, 0), 0u);
  // Threads launching kernel b at sizes 50..57 KiB at once: afterwards the driver holds what the
  // record says, the largest.
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const std::size_t bytes = static_cast<std::size_t>(50 + (t + i) % 8) << 10;
        ASSERT_EQ(limits.ensure(&kernel_b, 0, bytes, set), 0);
        ASSERT_GE(limits.limit(&kernel_b, 0), bytes);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(limits.limit(&kernel_b, 0), std::size_t{57} << 10);
  EXPECT_EQ(driver, std::size_t{57} << 10);
  EXPECT_LE(calls, 1 + 8);  // kernel a's, then at most one a raise
}

}  // namespace
