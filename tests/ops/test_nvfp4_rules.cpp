// The arithmetic the NVFP4 / MXFP8 CPU references and CUDA kernels share (src/kernels/fp32_rules.h,
// src/kernels/nvfp4_rules.h), on the CPU: hand-checked values, exp_f32 against fp64 exp, the
// fp4_quantize block against the fp4_quantize op, the MXFP8 block against mxfp8_quantize, the
// append rounding at every tie, and the V-scale interleave against upstream's view/permute written
// out as index arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernels/fp32_rules.h"
#include "kernels/nvfp4_rules.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

using kernels::exp_f32;
using kernels::mxfp8_scale_code;
using kernels::mxfp8_value_code;
using kernels::nvfp4_append_block;
using kernels::nvfp4_append_e2m1;
using kernels::nvfp4_quantize_block;
using kernels::nvfp4_v_scale_slot;
using kernels::Nvfp4Block;
using kernels::silu_mul_f32;

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

// Units in the last place between two finite positive floats.
int64_t ulps(float a, float b) {
  return std::llabs(static_cast<int64_t>(bits(a)) - static_cast<int64_t>(bits(b)));
}

TEST(Fp32Rules, ExpIsWithinOneUlpOfFp64) {
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-100.0f), 0.0f);  // flushed below -86
  EXPECT_EQ(exp_f32(100.0f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
  int64_t worst = 0;
  for (float x = -86.0f; x <= 88.6f; x += 0.00137f) {
    const auto want = static_cast<float>(std::exp(static_cast<double>(x)));
    worst = std::max(worst, ulps(exp_f32(x), want));
  }
  EXPECT_LE(worst, 1);
  // The argument is clamped to 88.6 (the activation reference's choice): e^x for x in
  // (88.6, 88.72] is e^88.6, finite.
  EXPECT_EQ(exp_f32(88.7f), exp_f32(88.6f));
}

TEST(Fp32Rules, SiluMulIsTheOnceRoundedFormula) {
  EXPECT_EQ(silu_mul_f32(0.0f, 5.0f), 0.0f);
  EXPECT_EQ(silu_mul_f32(100.0f, 2.0f), 200.0f);  // e^-100 = 0: g / 1 * u
  EXPECT_EQ(silu_mul_f32(-100.0f, 2.0f), -0.0f);  // e^100 = inf: g / inf
  // g / (1 + e^-g) * u, each step rounded once, with exp_f32.
  for (float g : {-3.5f, -0.75f, 0.3f, 1.0f, 2.25f}) {
    const float want = g / (1.0f + exp_f32(-g)) * 1.5f;
    EXPECT_EQ(bits(silu_mul_f32(g, 1.5f)), bits(want)) << g;
    const double ref = g / (1.0 + std::exp(-static_cast<double>(g))) * 1.5;
    EXPECT_NEAR(silu_mul_f32(g, 1.5f), ref, 4e-7 * std::fabs(ref)) << g;
  }
}

// Bytes 0..7 of a block's packed codes.
std::vector<uint8_t> packed_bytes(const Nvfp4Block& b) {
  std::vector<uint8_t> v(8);
  for (int t = 0; t < 8; ++t) v[t] = static_cast<uint8_t>(b.packed >> (8 * t));
  return v;
}

TEST(Nvfp4Rules, QuantizeBlockGolden) {
  // {6, 3, -1.5, 0 x 13}, gs 1: sf = e4m3(6 / 6) = 1 (0x38); codes 7, 5, 8|3, 0.
  float v[16] = {6.0f, 3.0f, -1.5f};
  Nvfp4Block b = nvfp4_quantize_block(v, 1.0f);
  EXPECT_EQ(b.sf, 0x38);
  EXPECT_EQ(packed_bytes(b), (std::vector<uint8_t>{0x57, 0x0B, 0, 0, 0, 0, 0, 0}));
  // gs 2: sf = e4m3(2 * 6 / 6) = 2 (0x40); codes of v * 2 / 2: unchanged.
  b = nvfp4_quantize_block(v, 2.0f);
  EXPECT_EQ(b.sf, 0x40);
  EXPECT_EQ(packed_bytes(b)[0], 0x57);
  // A zero block: scale 0, codes e2m1(v * 0), so a -0.0 keeps its sign (code 8), as upstream's
  // output scale 0 gives.
  float zeros[16] = {};
  EXPECT_EQ(nvfp4_quantize_block(zeros, 1.0f).packed, 0u);
  zeros[1] = -0.0f;
  EXPECT_EQ(packed_bytes(nvfp4_quantize_block(zeros, 1.0f))[0], 0x80);
  // A scale below e4m3's smallest subnormal: scale 0, and upstream 0.7.4's output scale is 0
  // (it tests the decoded scale): signed zeros, -1.5 -> -0 (8). (0.6.18 saturated to +-6.)
  EXPECT_EQ(nvfp4_quantize_block(v, 1e-6f).sf, 0);
  EXPECT_EQ(packed_bytes(nvfp4_quantize_block(v, 1e-6f)),
            (std::vector<uint8_t>{0x00, 0x08, 0, 0, 0, 0, 0, 0}));
}

// The block rule equals the fp4_quantize op (linear scales) on rows of random blocks.
TEST(Nvfp4Rules, QuantizeBlockIsFp4Quantize) {
  const int64_t m = 6, k = 64;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const Tensor x = rand_tensor({m, k}, dt, 17, -5, 5);
    const Tensor gs = Tensor::from_vector({672.0}, {1}, DType::kFloat32);
    auto [q, sf] = fp4_quantize(x, gs, 16, false, false);
    const Tensor xf = x.to(DType::kFloat32).contiguous();
    const auto* qb = q.contiguous().data<uint8_t>();
    const auto* sb = static_cast<const uint8_t*>(sf.contiguous().data_ptr());
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t b = 0; b < k / 16; ++b) {
        const Nvfp4Block blk = nvfp4_quantize_block(xf.data<float>() + r * k + b * 16, 672.0f);
        ASSERT_EQ(blk.sf, sb[r * (k / 16) + b]) << r << " " << b;
        const auto pb = packed_bytes(blk);
        for (int t = 0; t < 8; ++t) ASSERT_EQ(pb[t], qb[r * (k / 2) + b * 8 + t]) << r << " " << b;
      }
    }
  }
}

// ---- upstream 0.7.4's NVFP4 4over6 block -------------------------------------------------

using kernels::nvfp4_4over6_block;
using kernels::Nvfp4FourOverSix;

uint8_t code_at(const Nvfp4Block& b, int i) { return (b.packed >> (4 * i)) & 0xF; }

// Hand-checked: amax 4 with S = 1. The 6 candidate's scale RN(4 RN(1/6)) = 0.6666667 rounds to
// e4m3 0.6875 (0x33), under which 4 becomes 5.82 -> code 6.0 (0x7), dequantized 4.125 (error
// 0.125); the 4 candidate's RN(0.6666667 * 1.5) = 1.0 (0x38) keeps 4 exact (code 0x6, error 0):
// the 4 candidate wins, where the standard recipe writes 0x33 and 0x7.
TEST(Nvfp4Rules, FourOverSixGolden) {
  float x[16] = {4.0f};
  for (const bool mse : {false, true}) {
    for (const bool fast_err : {false, true}) {
      for (const bool exact : {false, true}) {
        const Nvfp4Block b = nvfp4_4over6_block(x, 1.0f, {true, mse, fast_err, exact});
        EXPECT_EQ(b.sf, 0x38);
        EXPECT_EQ(b.packed, 0x6u);
      }
    }
  }
  const Nvfp4Block standard = nvfp4_quantize_block(x, 1.0f);
  EXPECT_EQ(standard.sf, 0x33);
  EXPECT_EQ(standard.packed, 0x7u);
  // 4.125 = 6 * 0.6875 is exact under the 6 candidate (error 0); the 4 candidate's 1.03125
  // rounds to e4m3 1.0 and gives 4 (error 0.125): the 6 candidate (0x33, code 0x7).
  float y[16] = {4.125f};
  const Nvfp4Block b6 = nvfp4_4over6_block(y, 1.0f, {true, false, false, false});
  EXPECT_EQ(b6.sf, 0x33);
  EXPECT_EQ(b6.packed, 0x7u);
  // A tie: 3 is exact under both (0.5 * 6 and 0.75 * 4): the 6 candidate (0x30, code 0x7).
  float w[16] = {3.0f};
  for (const bool mse : {false, true}) {
    const Nvfp4Block bt = nvfp4_4over6_block(w, 1.0f, {true, mse, false, false});
    EXPECT_EQ(bt.sf, 0x30);
    EXPECT_EQ(bt.packed, 0x7u);
  }
  // An all-zero block, -0 included: scale 0 and +0 codes (the standard recipe keeps the signs).
  float z[16] = {};
  z[3] = -0.0f;
  const Nvfp4Block bz = nvfp4_4over6_block(z, 1.0f, {true, false, false, false});
  EXPECT_EQ(bz.sf, 0);
  EXPECT_EQ(bz.packed, 0u);
  EXPECT_EQ(code_at(nvfp4_quantize_block(z, 1.0f), 3), 0x8);
  // A block whose scale rounds to e4m3 0 (amax / 6 <= 2^-10): upstream's output scale 1 / 0 =
  // +Inf, so nonzero values give +-6 (0x7 / 0xF) and zeros NaN (0x7); with its exact math the
  // scale is FLT_MAX: +-6 and zeros 0.
  float t[16] = {1e-6f, -1e-6f};
  const Nvfp4Block q = nvfp4_4over6_block(t, 1.0f, {true, false, false, false});
  EXPECT_EQ(q.sf, 0);
  EXPECT_EQ(code_at(q, 0), 0x7);
  EXPECT_EQ(code_at(q, 1), 0xF);
  EXPECT_EQ(code_at(q, 2), 0x7);
  const Nvfp4Block qe = nvfp4_4over6_block(t, 1.0f, {true, false, false, true});
  EXPECT_EQ(qe.sf, 0);
  EXPECT_EQ(code_at(qe, 0), 0x7);
  EXPECT_EQ(code_at(qe, 1), 0xF);
  EXPECT_EQ(code_at(qe, 2), 0x0);
  // NaN elements: NaN errors, so the 6 candidate; the amax ignores them unless every odd one is.
  float n[16] = {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f};
  const Nvfp4Block bn = nvfp4_4over6_block(n, 1.0f, {true, false, false, false});
  EXPECT_EQ(bn.sf,
            float_to_e4m3fn_bits(kernels::fp32_mul(2.0f, kernels::fp32_div(1.0f, 6.0f)), true));
  EXPECT_EQ(code_at(bn, 1), 0x7);
}

// Random blocks: the written bytes are one of the two candidates, computed here step by step, and
// the one with the smaller error in fp64 whenever the two errors are apart (ties go to 6), for
// each metric; both candidates and both metrics' disagreements occur.
TEST(Nvfp4Rules, FourOverSixPicksTheSmallerErrorCandidate) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  int picked4 = 0, picked6 = 0, metrics_differ = 0;
  for (int it = 0; it < 2000; ++it) {
    float x[16];
    for (float& v : x) v = bfloat16_bits_to_float(float_to_bfloat16_bits(u(rng)));
    const float S = 448.0f * 6.0f / 3.0f;
    // The flags rotate: the fast error (an S-scaled comparison) and the exact-math association.
    const bool fast_err = it % 3 == 1, exact = it % 3 == 2;
    uint8_t pick_by_metric[2];
    for (const bool mse : {false, true}) {
      const Nvfp4Block b = nvfp4_4over6_block(x, S, {true, mse, fast_err, exact});
      float amax = 0.0f;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      const float sf6 =
          exact ? kernels::fp32_mul(kernels::fp32_div(amax, 6.0f), S)
                : kernels::fp32_mul(S, kernels::fp32_mul(amax, kernels::fp32_div(1.0f, 6.0f)));
      double err[2];
      uint8_t codes[2][16], sfc[2];
      for (int k = 0; k < 2; ++k) {
        sfc[k] = float_to_e4m3fn_bits(k == 0 ? sf6 : kernels::fp32_mul(sf6, 1.5f), true);
        const double s = e4m3fn_bits_to_float(sfc[k]);
        const float os = 1.0f / kernels::fp32_mul(static_cast<float>(s), 1.0f / S);
        err[k] = 0.0;
        for (int i = 0; i < 16; ++i) {
          codes[k][i] = float_to_e2m1_bits(kernels::fp32_mul(x[i], os));
          const double q = (codes[k][i] & 8 ? -1.0 : 1.0) * e2m1_bits_to_float(codes[k][i] & 7);
          const double d = fast_err ? q * s - static_cast<double>(x[i]) * S : q * s / S - x[i];
          err[k] += mse ? d * d : std::fabs(d);
        }
      }
      const int pick = b.sf == sfc[1] && sfc[0] != sfc[1] ? 1 : 0;
      ASSERT_EQ(b.sf, sfc[pick]) << it;
      for (int i = 0; i < 16; ++i) ASSERT_EQ(code_at(b, i), codes[pick][i]) << it << " " << i;
      if (std::fabs(err[0] - err[1]) > 1e-5 * (err[0] + err[1])) {
        ASSERT_EQ(pick, err[1] < err[0] ? 1 : 0) << it << " " << err[0] << " " << err[1];
      }
      (pick ? picked4 : picked6) += 1;
      pick_by_metric[mse] = b.sf;
    }
    metrics_differ += pick_by_metric[0] != pick_by_metric[1];
  }
  EXPECT_GT(picked4, 100);
  EXPECT_GT(picked6, 100);
  EXPECT_GT(metrics_differ, 0);
}

TEST(Mxfp8Rules, ScaleAndValueCodesGolden) {
  // The smallest power of two >= amax / 448: 448 -> 2^0 (127), just above -> 2^1, 224 -> 2^-1;
  // a zero block gets code 0 (2^-127), a NaN-free infinite one saturates at 2^127 (254).
  EXPECT_EQ(mxfp8_scale_code(448.0f), 127);
  EXPECT_EQ(mxfp8_scale_code(449.0f), 128);
  EXPECT_EQ(mxfp8_scale_code(224.0f), 126);
  EXPECT_EQ(mxfp8_scale_code(0.0f), 0);
  EXPECT_EQ(mxfp8_scale_code(std::numeric_limits<float>::infinity()), 254);
  // e4m3_satfinite(v / sf): 448 = 0x7E, saturating above; -1 = 0xB8; 3 / 2 = 1.5 = 0x3C.
  EXPECT_EQ(mxfp8_value_code(448.0f, 1.0f), 0x7E);
  EXPECT_EQ(mxfp8_value_code(1000.0f, 1.0f), 0x7E);
  EXPECT_EQ(mxfp8_value_code(-1.0f, 1.0f), 0xB8);
  EXPECT_EQ(mxfp8_value_code(3.0f, 2.0f), 0x3C);
  // Scale code 0 (2^-127): upstream 0.7.4's inverse scale is 0, so signed zeros (0.6.18 divided:
  // 1e-36 / 2^-127 = 1.7e2, code 0x73).
  EXPECT_EQ(mxfp8_value_code(1e-36f, 0x1p-127f), 0x00);
  EXPECT_EQ(mxfp8_value_code(-1e-36f, 0x1p-127f), 0x80);
}

// The MXFP8 block rule equals the mxfp8_quantize op (linear scales) on rows of random blocks.
TEST(Mxfp8Rules, BlockIsMxfp8Quantize) {
  const int64_t m = 5, k = 128;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const Tensor x = rand_tensor({m, k}, dt, 23, -300, 300);
    auto [q, sf] = mxfp8_quantize(x, false);
    const Tensor xf = x.to(DType::kFloat32).contiguous();
    const auto* qb = static_cast<const uint8_t*>(q.contiguous().data_ptr());
    const auto* sb = sf.contiguous().data<uint8_t>();
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t b = 0; b < k / 32; ++b) {
        const float* v = xf.data<float>() + r * k + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(v[i]));
        const uint8_t code = mxfp8_scale_code(amax);
        ASSERT_EQ(code, sb[r * (k / 32) + b]) << r << " " << b;
        const float s = kernels::ue8m0_to_float(code);
        for (int i = 0; i < 32; ++i) {
          ASSERT_EQ(mxfp8_value_code(v[i], s), qb[r * k + b * 32 + i]) << r << " " << b << " " << i;
        }
      }
    }
  }
}

TEST(Nvfp4Rules, AppendE2m1RoundsTiesToEvenAndKeepsTheSign) {
  const std::vector<std::pair<float, uint8_t>> cases = {
      {0.0f, 0},
      {0.25f, 0},
      {0.2500001f, 1},
      {0.5f, 1},
      {0.75f, 2},
      {0.7499999f, 1},
      {1.0f, 2},
      {1.25f, 2},
      {1.2500001f, 3},
      {1.75f, 4},
      {2.5f, 4},
      {2.5000002f, 5},
      {3.0f, 5},
      {3.5f, 6},
      {5.0f, 6},
      {5.0000005f, 7},
      {6.0f, 7},
      {1e30f, 7},
      {std::numeric_limits<float>::infinity(), 7}};
  for (const auto& [x, code] : cases) {
    EXPECT_EQ(nvfp4_append_e2m1(x), code) << x;
    EXPECT_EQ(nvfp4_append_e2m1(-x), code | 0x8) << -x;
  }
  EXPECT_EQ(nvfp4_append_e2m1(std::numeric_limits<float>::quiet_NaN()), 0);
}

TEST(Nvfp4Rules, AppendBlockGolden) {
  // {6, 3, -1.5, -0, 0 x 12}, gs 1: sf = e4m3(6 / 6) = 0x38, 1 / (1 * 1) = 1: codes 7, 5, 8|3,
  // 8 (the sign of -0), 0.
  float v[16] = {6.0f, 3.0f, -1.5f, -0.0f};
  Nvfp4Block b = nvfp4_append_block(v, 1.0f);
  EXPECT_EQ(b.sf, 0x38);
  EXPECT_EQ(packed_bytes(b), (std::vector<uint8_t>{0x57, 0x8B, 0, 0, 0, 0, 0, 0}));
  // gs 0.5: sf = e4m3(6 / 3) = 2 (0x40), 1 / (2 * 0.5) = 1: the same codes.
  b = nvfp4_append_block(v, 0.5f);
  EXPECT_EQ(b.sf, 0x40);
  EXPECT_EQ(packed_bytes(b)[0], 0x57);
  // All zero: scale 0 and codes of x * 0 (so -0 keeps code 8).
  float z[16] = {0.0f, -0.0f};
  b = nvfp4_append_block(z, 1.0f);
  EXPECT_EQ(b.sf, 0);
  EXPECT_EQ(packed_bytes(b)[0], 0x80);
}

// Upstream's V swizzle (NHD): view [pages, ps/4, 4, H, 4, sd/4], permute (0, 1, 4, 3, 5, 2),
// contiguous, viewed as [pages, ps, H, sd]. Element (p, t, h, s) of the input lands at the flat
// offset below; nvfp4_v_scale_slot must name the same place.
TEST(Nvfp4Rules, VScaleSlotIsUpstreamsPermute) {
  const int64_t pages = 2, ps = 8, H = 3;
  for (int64_t sd : {4, 8, 16}) {
    std::set<int64_t> seen;
    for (int64_t p = 0; p < pages; ++p) {
      for (int64_t t = 0; t < ps; ++t) {
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t s = 0; s < sd; ++s) {
            const int64_t t4 = t / 4, tl = t % 4, shi = s / (sd / 4), slo = s % (sd / 4);
            const int64_t want =
                ((((p * (ps / 4) + t4) * 4 + shi) * H + h) * (sd / 4) + slo) * 4 + tl;
            const auto slot = nvfp4_v_scale_slot(t, s, sd);
            ASSERT_EQ(((p * ps + slot.token) * H + h) * sd + slot.col, want)
                << "sd " << sd << " t " << t << " s " << s;
            seen.insert(want);
            // The params' offset (NHD: A = tokens, B = heads), and HND with the roles swapped.
            kernels::Nvfp4PagedQuantParams q;
            q.shape[0] = pages, q.shape[1] = ps, q.shape[2] = H, q.shape[3] = sd * 16;
            q.swizzle_sf = true;
            ASSERT_EQ(kernels::nvfp4_paged_sf_offset(q, p, t, h, s), want);
            q.hnd = true;
            q.shape[1] = H, q.shape[2] = ps;
            ASSERT_EQ(kernels::nvfp4_paged_sf_offset(q, p, h, t, s),
                      ((p * H + h) * ps + slot.token) * sd + slot.col);
            q.swizzle_sf = false;
            ASSERT_EQ(kernels::nvfp4_paged_sf_offset(q, p, h, t, s),
                      ((p * H + h) * ps + t) * sd + s);
          }
        }
      }
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), pages * ps * H * sd);  // a permutation
  }
}

}  // namespace
}  // namespace flashinfer::testing
