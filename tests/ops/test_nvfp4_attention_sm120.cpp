// nvfp4_attention_sm120_quantize_qkv / nvfp4_attention_sm120_fwd: the layout rules (scale
// swizzle, K's row permutation), hand-checked quantizations (codes, scales, the correction, the
// padded block's mean), upstream's exact-output tests (V = 1, the causal eye), accuracy against
// fp64 attention on the original inputs (upstream's bounds), bad input naming the argument, and
// recorded calls replayed from disk; on any GPU, the CUDA kernels themselves against the CPU's
// bits. Sources: docs/ATTENTION.md ("NVFP4 attention on SM120").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernels/nvfp4_attention_params.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
#include "kernels/cuda/nvfp4_attention_cuda.h"
#endif

namespace flashinfer::testing {
namespace {

using kernels::nvfp4_attn_k_permute;
using kernels::nvfp4_attn_sf_offset;

const uint8_t* bytes(const Tensor& t) { return static_cast<const uint8_t*>(t.data_ptr()); }

// A bf16 [1, 1, S, D] tensor from f(s, d).
template <class F>
Tensor head(int64_t S, int64_t D, F f, DType dt = DType::kBFloat16) {
  std::vector<double> v;
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t d = 0; d < D; ++d) v.push_back(f(s, d));
  }
  return Tensor::from_vector(v, {1, 1, S, D}, dt);
}

TEST(Nvfp4AttentionRules, ScaleSwizzleIsABijectionOfAtoms) {
  // Hand-checked offsets in one 64-row chunk of 8 columns: rows of 16 bytes, row groups of 4.
  EXPECT_EQ(nvfp4_attn_sf_offset(0, 0, 8), 0);
  EXPECT_EQ(nvfp4_attn_sf_offset(0, 3, 8), 3);
  EXPECT_EQ(nvfp4_attn_sf_offset(0, 4, 8), 256);
  EXPECT_EQ(nvfp4_attn_sf_offset(1, 0, 8), 16);
  EXPECT_EQ(nvfp4_attn_sf_offset(16, 0, 8), 4);
  EXPECT_EQ(nvfp4_attn_sf_offset(63, 7, 8), 256 + 15 * 16 + 3 * 4 + 3);
  EXPECT_EQ(nvfp4_attn_sf_offset(64, 0, 8), 512);
  for (const int64_t ncols : {4, 8, 16}) {
    std::set<int64_t> seen;
    for (int64_t r = 0; r < 128; ++r) {
      for (int64_t c = 0; c < ncols; ++c) seen.insert(nvfp4_attn_sf_offset(r, c, ncols));
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), 128 * ncols);
    EXPECT_EQ(*seen.rbegin(), 128 * ncols - 1);
  }
}

TEST(Nvfp4AttentionRules, KRowPermutation) {
  const int64_t first[] = {0, 1, 8, 9, 16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27};
  for (int64_t r = 0; r < 16; ++r) EXPECT_EQ(nvfp4_attn_k_permute(r), first[r]) << r;
  EXPECT_EQ(nvfp4_attn_k_permute(31), 31);
  EXPECT_EQ(nvfp4_attn_k_permute(32 + 2), 32 + 8);  // per group of 32
  for (int64_t r = 0; r < 256; ++r) EXPECT_EQ(nvfp4_attn_k_permute(nvfp4_attn_k_permute(r)), r);
}

// K rows +-a_d with a_d = (d % 16) / 4: the mean over S is exactly 0, so the centred K is K.
// Each block of 16 has amax 3.75: scale e4m3(0.625) = 0x32 (exact), values 0.4 i rounded to
// e2m1: 0, .5, 1, 1, 1.5, 2, 2, 3, 3, 4, 4, 4, 4, 6, 6, 6 (codes below). Q is (g + 1) / 2 in
// every row of block g, so the centred Q is 0 (codes 0, scales 0) and the correction row g is
// (g + 1) / 2 * sum_d k[j, d] = +-(g + 1) 60.
TEST(Nvfp4AttentionQuantize, HandCheckedCodesScalesAndCorrection) {
  const int64_t S = 256, D = 64;
  auto a = [](int64_t d) { return static_cast<double>(d % 16) * 0.25; };
  const Tensor k = head(S, D, [&](int64_t s, int64_t d) { return (s % 2 ? -1.0 : 1.0) * a(d); });
  const Tensor q = head(S, D, [](int64_t s, int64_t) { return (s / 128 + 1) * 0.5; });
  const Tensor v = head(S, D, [](int64_t, int64_t) { return 0.0; });
  const Nvfp4AttentionQkv r = nvfp4_attention_sm120_quantize_qkv(q, k, v);
  EXPECT_EQ(r.k_fp4.shape(), Shape({1, 1, S, D / 2}));
  EXPECT_EQ(r.v_fp4_t.shape(), Shape({1, 1, D, S / 2}));
  EXPECT_EQ(r.k_scale.dtype(), DType::kFloat8E4M3FN);
  EXPECT_EQ(r.qk_correction.shape(), Shape({1, 1, 2, S}));
  const uint8_t mag[16] = {0, 1, 2, 2, 3, 4, 4, 5, 5, 6, 6, 6, 6, 7, 7, 7};
  for (int64_t row = 0; row < S; ++row) {
    const int64_t token = nvfp4_attn_k_permute(row);
    const uint8_t sign = token % 2 ? 8 : 0;
    for (int64_t d = 0; d < D; d += 2) {
      // A negative token's 0 is -0 (code 8): e2m1's conversion keeps the sign.
      const uint8_t lo = mag[d % 16] | sign, hi = mag[(d + 1) % 16] | sign;
      ASSERT_EQ(bytes(r.k_fp4)[row * D / 2 + d / 2], pack_e2m1x2(lo, hi)) << row << " " << d;
    }
    for (int64_t c = 0; c < D / 16; ++c) {
      ASSERT_EQ(bytes(r.k_scale)[nvfp4_attn_sf_offset(row, c, D / 16)], 0x32);
      ASSERT_EQ(bytes(r.q_scale)[nvfp4_attn_sf_offset(row, c, D / 16)], 0);
    }
    for (int64_t d = 0; d < D / 2; ++d) ASSERT_EQ(bytes(r.q_fp4)[row * D / 2 + d], 0);
  }
  const auto corr = r.qk_correction.to_double_vector();
  for (int64_t g = 0; g < 2; ++g) {
    for (int64_t j = 0; j < S; ++j) {
      ASSERT_EQ(corr[static_cast<size_t>(g * S + j)], (j % 2 ? -60.0 : 60.0) * (g + 1));
    }
  }
  // One mean over all rows instead: (0.5 + 1) / 2 = 0.75, one correction row of +-90.
  const Nvfp4AttentionQkv one = nvfp4_attention_sm120_quantize_qkv(q, k, v, false);
  EXPECT_EQ(one.qk_correction.shape(), Shape({1, 1, 1, S}));
  EXPECT_EQ(one.qk_correction.to_double_vector()[1], -90.0);
}

// S = 100 pads to 128. Q = 1 in the real rows: the padded block's mean counts the 28 zero rows,
// 100 / 128 = 0.78125, so the centred rows hold 0.21875 (and -0.78125 in the padding). For the
// real rows amax / 6 = 0.036458 rounds down to the e4m3 0.03515625 (code 0x11), and 0.21875 /
// 0.03515625 = 6.22 saturates to the e2m1 code 6 (7). V^T's padded tokens are zero.
TEST(Nvfp4AttentionQuantize, PaddedBlockMeanAndSaturation) {
  const int64_t S = 100, D = 64;
  const Tensor q = head(S, D, [](int64_t, int64_t) { return 1.0; });
  const Tensor k = head(S, D, [](int64_t s, int64_t) { return s % 3 ? 0.5 : -1.0; });
  const Tensor v = head(S, D, [](int64_t, int64_t) { return 2.0; });
  const Nvfp4AttentionQkv r = nvfp4_attention_sm120_quantize_qkv(q, k, v);
  EXPECT_EQ(r.q_fp4.shape(), Shape({1, 1, 128, D / 2}));
  EXPECT_EQ(bytes(r.q_scale)[nvfp4_attn_sf_offset(5, 1, 4)], 0x11);
  EXPECT_EQ(bytes(r.q_fp4)[5 * D / 2], 0x77);
  // Padded row 120: -0.78125, amax / 6 = 0.1302 -> e4m3 0.125 (0x20); 6.25 saturates to -6.
  EXPECT_EQ(bytes(r.q_scale)[nvfp4_attn_sf_offset(120, 0, 4)], 0x20);
  EXPECT_EQ(bytes(r.q_fp4)[120 * D / 2], 0xFF);
  // V^T row 0: tokens 0..99 hold 2 (scale e4m3(1/3) = 0.34375, 2 / 0.34375 = 5.8 -> 6),
  // tokens 96..127 of the last blocks: 96..99 real, the rest 0.
  EXPECT_EQ(bytes(r.v_fp4_t)[0], 0x77);
  EXPECT_EQ(bytes(r.v_fp4_t)[49], 0x77);  // tokens 98, 99
  EXPECT_EQ(bytes(r.v_fp4_t)[50], 0x00);  // tokens 100, 101
  EXPECT_EQ(bytes(r.v_scale_t)[nvfp4_attn_sf_offset(0, 6, 8)], 0x2B);
  // The padded K rows are zero after the centring (so are their scales).
  for (int64_t row = 0; row < 128; ++row) {
    if (nvfp4_attn_k_permute(row) < S) continue;
    for (int64_t d = 0; d < D / 2; ++d) ASSERT_EQ(bytes(r.k_fp4)[row * D / 2 + d], 0) << row;
  }
}

// Upstream's output-magnitude test, exact here: q = k = 0, v = 1. Every P is 2688 (its block
// scale 448, code 6), V quantizes to 6 * e4m3(1/6) = 1.03125, so out = 1.03125 and lse = ln S.
TEST(Nvfp4AttentionFwd, UniformScoresGiveExactOutput) {
  const int64_t S = 512, D = 128;
  const Tensor zero = head(S, D, [](int64_t, int64_t) { return 0.0; });
  const Tensor one = head(S, D, [](int64_t, int64_t) { return 1.0; });
  const Nvfp4AttentionQkv r = nvfp4_attention_sm120_quantize_qkv(zero, zero, one);
  const Nvfp4AttentionOutput o = nvfp4_attention_sm120_fwd(r.q_fp4, r.k_fp4, r.v_fp4_t, r.q_scale,
                                                           r.k_scale, r.v_scale_t, r.qk_correction);
  EXPECT_EQ(o.out.dtype(), DType::kBFloat16);
  EXPECT_TRUE(all_close(o.out, std::vector<double>(S * D, 1.03125), {0.0, 0.0}));
  EXPECT_TRUE(all_close(o.lse, std::vector<double>(S, std::log(512.0)), {1e-5, 0.0}));
}

// Upstream's causal column-order test: q = k = 0, v = eye(128), causal. Row r averages keys
// 0..r, each value e2m1 6 times e4m3(1/6): out[r, c] = 1.03125 / (r + 1) for c <= r, exactly 0
// above the diagonal.
TEST(Nvfp4AttentionFwd, CausalEyeKeepsColumnOrder) {
  const int64_t S = 128, D = 128;
  const Tensor zero = head(S, D, [](int64_t, int64_t) { return 0.0; });
  const Tensor eye = head(S, D, [](int64_t s, int64_t d) { return s == d ? 1.0 : 0.0; });
  const Nvfp4AttentionQkv r = nvfp4_attention_sm120_quantize_qkv(zero, zero, eye);
  const Nvfp4AttentionOutput o =
      nvfp4_attention_sm120_fwd(r.q_fp4, r.k_fp4, r.v_fp4_t, r.q_scale, r.k_scale, r.v_scale_t,
                                r.qk_correction, std::nullopt, /*causal=*/true);
  const auto out = o.out.to_double_vector();
  for (int64_t row = 0; row < S; ++row) {
    for (int64_t c = 0; c < D; ++c) {
      const double got = out[static_cast<size_t>(row * D + c)];
      if (c > row) {
        ASSERT_EQ(got, 0.0) << row << " " << c;
      } else {
        ASSERT_NEAR(got, 1.03125 / (row + 1), 1.03125 / (row + 1) / 128) << row << " " << c;
      }
    }
  }
  const auto lse = o.lse.to_double_vector();
  for (int64_t row = 0; row < S; ++row) {
    ASSERT_NEAR(lse[static_cast<size_t>(row)], std::log(row + 1.0), 1e-5);
  }
}

// fp64 attention on the original inputs; lse over the K-centred scores (what the kernel sees).
struct Reference {
  std::vector<double> out, lse;
};
Reference reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), D = q.size(3);
  const auto qv = q.to_double_vector(), kv = k.to_double_vector(), vv = v.to_double_vector();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Reference r;
  r.out.assign(static_cast<size_t>(B * H * S * D), 0.0);
  r.lse.assign(static_cast<size_t>(B * H * S), 0.0);
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const size_t base = static_cast<size_t>(bh * S * D);
    std::vector<double> mean(static_cast<size_t>(D), 0.0);
    for (int64_t j = 0; j < S; ++j) {
      for (int64_t d = 0; d < D; ++d) mean[d] += kv[base + j * D + d] / S;
    }
    for (int64_t i = 0; i < S; ++i) {
      const int64_t n = causal ? i + 1 : S;
      std::vector<double> s(static_cast<size_t>(n)), sc(static_cast<size_t>(n));
      double m = -1e300, mc = -1e300;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0.0, dotc = 0.0;
        for (int64_t d = 0; d < D; ++d) {
          dot += qv[base + i * D + d] * kv[base + j * D + d];
          dotc += qv[base + i * D + d] * (kv[base + j * D + d] - mean[d]);
        }
        s[j] = dot * scale, sc[j] = dotc * scale;
        m = std::max(m, s[j]), mc = std::max(mc, sc[j]);
      }
      double sum = 0.0, sumc = 0.0;
      for (int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - m), sumc += std::exp(sc[j] - mc);
      for (int64_t j = 0; j < n; ++j) {
        const double p = std::exp(s[j] - m) / sum;
        for (int64_t d = 0; d < D; ++d) r.out[base + i * D + d] += p * vv[base + j * D + d];
      }
      r.lse[static_cast<size_t>(bh * S + i)] = mc + std::log(sumc);
    }
  }
  return r;
}

struct Accuracy {
  double cosine, mae, lse_mean, lse_max;
};
Accuracy accuracy(const Nvfp4AttentionOutput& o, const Reference& ref, int64_t S, int64_t D) {
  // The output's first S rows of each head (the padding sliced off, as the caller does).
  const auto out = o.out.to_double_vector(), lse = o.lse.to_double_vector();
  const int64_t Sp = o.out.size(2), heads = o.out.size(0) * o.out.size(1);
  double dot = 0, na = 0, nb = 0, mae = 0, lm = 0, lx = 0;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < S; ++i) {
      for (int64_t d = 0; d < D; ++d) {
        const double a = out[static_cast<size_t>((h * Sp + i) * D + d)];
        const double b = ref.out[static_cast<size_t>((h * S + i) * D + d)];
        dot += a * b, na += a * a, nb += b * b, mae += std::abs(a - b);
      }
      const double e =
          std::abs(lse[static_cast<size_t>(h * Sp + i)] - ref.lse[static_cast<size_t>(h * S + i)]);
      lm += e, lx = std::max(lx, e);
    }
  }
  return {dot / std::sqrt(na * nb), mae / static_cast<double>(heads * S * D),
          lm / static_cast<double>(heads * S), lx};
}

// Upstream's accuracy bounds (cosine >= 0.95 or 0.94, mean |error| <= its mae) against fp64
// attention over the original q, k, v, and its lse test's (mean <= 0.05, max <= 0.5), for
// Gaussian bf16 inputs; Q carries a per-block bias in one case (the correction's reason).
TEST(Nvfp4AttentionFwd, MatchesAttentionWithinUpstreamBounds) {
  struct Case {
    int64_t H, S, D;
    bool causal, per_block_mean;
    double bias, cos, mae;
  };
  for (const Case& c : {Case{2, 128, 64, false, true, 0.0, 0.95, 0.08},
                        Case{2, 256, 128, false, true, 0.0, 0.95, 0.06},
                        Case{2, 256, 128, true, true, 0.0, 0.94, 0.09},
                        Case{1, 384, 64, false, false, 0.0, 0.95, 0.06},
                        Case{2, 256, 128, false, true, 2.0, 0.95, 0.06}}) {
    SCOPED_TRACE(::testing::Message()
                 << "S " << c.S << " D " << c.D << " causal " << c.causal << " per_block_mean "
                 << c.per_block_mean << " bias " << c.bias);
    const Shape shape{1, c.H, c.S, c.D};
    Tensor q = Tensor::empty(shape, DType::kFloat32), k = q.clone(), v = q.clone();
    q.normal_(11), k.normal_(12), v.normal_(13);
    if (c.bias != 0.0) {  // one bias per 128-token block of each head
      std::vector<double> qv = q.to_double_vector();
      for (size_t i = 0; i < qv.size(); ++i) {
        const int64_t row = static_cast<int64_t>(i) / c.D;
        qv[i] += c.bias * std::sin(static_cast<double>(row / 128 + 1));
      }
      q = Tensor::from_vector(qv, shape, DType::kFloat32);
    }
    q = q.to(DType::kBFloat16), k = k.to(DType::kBFloat16), v = v.to(DType::kBFloat16);
    const Nvfp4AttentionQkv r = nvfp4_attention_sm120_quantize_qkv(q, k, v, c.per_block_mean);
    const Nvfp4AttentionOutput o =
        nvfp4_attention_sm120_fwd(r.q_fp4, r.k_fp4, r.v_fp4_t, r.q_scale, r.k_scale, r.v_scale_t,
                                  r.qk_correction, std::nullopt, c.causal, c.per_block_mean);
    const Accuracy a = accuracy(o, reference(q, k, v, c.causal), c.S, c.D);
    EXPECT_GE(a.cosine, c.cos);
    EXPECT_LE(a.mae, c.mae);
    EXPECT_LE(a.lse_mean, 0.05);
    EXPECT_LE(a.lse_max, 0.5);
  }
}

TEST(Nvfp4AttentionFwd, OutputsScalesAndDtypes) {
  const int64_t S = 128, D = 64;
  const Tensor x = rand_tensor({1, 2, S, D}, DType::kFloat16, 5, -1.0, 1.0);
  const Nvfp4AttentionQkv r = nvfp4_attention_sm120_quantize_qkv(x, x, x);
  const auto run = [&](std::optional<double> sm, std::optional<double> alias,
                       std::optional<Tensor> out, DType dt) {
    return nvfp4_attention_sm120_fwd(r.q_fp4, r.k_fp4, r.v_fp4_t, r.q_scale, r.k_scale, r.v_scale_t,
                                     r.qk_correction, sm, false, true, out, std::nullopt, dt,
                                     alias);
  };
  const Nvfp4AttentionOutput a = run(std::nullopt, std::nullopt, std::nullopt, DType::kFloat16);
  EXPECT_EQ(a.out.dtype(), DType::kFloat16);
  // The default scale is D^-0.5; softmax_scale is its alias.
  const Nvfp4AttentionOutput b = run(0.125, std::nullopt, std::nullopt, DType::kFloat16);
  const Nvfp4AttentionOutput c = run(std::nullopt, 0.125, std::nullopt, DType::kFloat16);
  EXPECT_TRUE(all_close(b.out, a.out, {0.0, 0.0}));
  EXPECT_TRUE(all_close(c.lse, a.lse, {0.0, 0.0}));
  const Nvfp4AttentionOutput d = run(0.5, std::nullopt, std::nullopt, DType::kFloat16);
  EXPECT_FALSE(all_close(d.lse, a.lse, {1e-3, 0.0}));
  // A given out takes its own dtype (out_dtype ignored) and is what comes back.
  Tensor out = Tensor::zeros({1, 2, S, D}, DType::kBFloat16);
  const Nvfp4AttentionOutput e = run(std::nullopt, std::nullopt, out, DType::kFloat16);
  EXPECT_EQ(e.out.data_ptr(), out.data_ptr());
  EXPECT_TRUE(all_close(out, a.out, default_tolerance(DType::kBFloat16)));
}

TEST(Nvfp4AttentionSm120, BadInputNamesTheArgument) {
  const char* qop = "nvfp4_attention_sm120_quantize_qkv";
  const Tensor x = rand_tensor({1, 2, 128, 64}, DType::kBFloat16, 3);
  EXPECT_FI_ERROR(nvfp4_attention_sm120_quantize_qkv(x.to(DType::kFloat32), x, x), qop, "q");
  EXPECT_FI_ERROR(
      nvfp4_attention_sm120_quantize_qkv(x, rand_tensor({1, 2, 64, 64}, DType::kBFloat16, 4), x),
      qop, "k");
  EXPECT_FI_ERROR(nvfp4_attention_sm120_quantize_qkv(x, x, x.to(DType::kFloat16)), qop, "v");
  const Tensor d96 = rand_tensor({1, 2, 128, 96}, DType::kBFloat16, 4);
  EXPECT_FI_ERROR(nvfp4_attention_sm120_quantize_qkv(d96, d96, d96), qop, "q");
  EXPECT_FI_ERROR(nvfp4_attention_sm120_quantize_qkv(x.transpose(2, 3), x, x), qop, "q");
  const char* fop = "nvfp4_attention_sm120_fwd";
  const Nvfp4AttentionQkv r = nvfp4_attention_sm120_quantize_qkv(x, x, x);
  // upstream's test: a correction expanded to one row per query is refused, naming it.
  Tensor expanded = Tensor::zeros({1, 2, 128, 128}, DType::kFloat32);
  EXPECT_FI_ERROR(nvfp4_attention_sm120_fwd(r.q_fp4, r.k_fp4, r.v_fp4_t, r.q_scale, r.k_scale,
                                            r.v_scale_t, expanded),
                  fop, "qk_correction");
  EXPECT_FI_ERROR(nvfp4_attention_sm120_fwd(r.q_fp4, r.k_fp4, r.v_fp4_t, r.q_scale, r.k_scale,
                                            r.v_scale_t, r.qk_correction, 0.1, false, true,
                                            std::nullopt, std::nullopt, DType::kBFloat16, 0.1),
                  fop, "softmax_scale");
  EXPECT_FI_ERROR(nvfp4_attention_sm120_fwd(r.q_fp4, r.k_fp4, r.v_fp4_t, r.q_scale, r.k_scale,
                                            r.v_scale_t, r.qk_correction, std::nullopt, false, true,
                                            std::nullopt, std::nullopt, DType::kFloat32),
                  fop, "out_dtype");
  EXPECT_FI_ERROR(nvfp4_attention_sm120_fwd(r.q_fp4, r.k_fp4, r.v_fp4_t,
                                            Tensor::zeros({1, 2, 128, 4}, DType::kUInt8), r.k_scale,
                                            r.v_scale_t, r.qk_correction),
                  fop, "q_scale");
  EXPECT_FI_ERROR(nvfp4_attention_sm120_fwd(r.q_fp4, r.k_fp4.slice(2, 0, 64), r.v_fp4_t, r.q_scale,
                                            r.k_scale, r.v_scale_t, r.qk_correction),
                  fop, "k_fp4");
  const Tensor unpadded = Tensor::zeros({1, 2, 100, 32}, DType::kUInt8);
  EXPECT_FI_ERROR(nvfp4_attention_sm120_fwd(unpadded, unpadded, r.v_fp4_t, r.q_scale, r.k_scale,
                                            r.v_scale_t, r.qk_correction),
                  fop, "q_fp4");
  EXPECT_FI_ERROR(
      nvfp4_attention_sm120_fwd(r.q_fp4, r.k_fp4, r.v_fp4_t, r.q_scale, r.k_scale, r.v_scale_t,
                                r.qk_correction, std::nullopt, false, true, std::nullopt,
                                Tensor::zeros({1, 2, 128}, DType::kFloat16)),
      fop, "lse");
}

TEST(Nvfp4AttentionSm120, RecordedCallsReplayFromDisk) {
  const Tensor x = rand_tensor({1, 2, 160, 64}, DType::kBFloat16, 8);
  const int n = dump_replay_all("nvfp4_attn", [&] {
    const Nvfp4AttentionQkv r = nvfp4_attention_sm120_quantize_qkv(x, x, x);
    (void)nvfp4_attention_sm120_fwd(r.q_fp4, r.k_fp4, r.v_fp4_t, r.q_scale, r.k_scale, r.v_scale_t,
                                    r.qk_correction, std::nullopt, true);
  });
  EXPECT_EQ(n, 2);
}

#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
// The kernels themselves on any GPU (the ops refuse every GPU but compute capability 12.0): the
// seven quantized tensors and the forward's out must be the CPU reference's bytes (NaNs, -0 and
// the two e4m3 zeros included), the lse its value to the last place of the logarithm (the
// device's log and the host's may differ there). The last case's large sm_scale drives P's
// exponents to the flush and the clamps, and its output is fp16; the one before it has infinite
// and huge inputs (non-finite corrections and lse; a NaN is the device's on both sides).
TEST(Nvfp4AttentionCuda, KernelsMatchCpuBitForBitOnAnyGpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  struct Case {
    DType dt;
    int64_t S, D;
    bool per_block_mean, causal;
    double sm_scale = 0.0;  // 0: D^-0.5
    DType out_dtype = DType::kBFloat16;
    bool non_finite = false;
  };
  // The bytes of a GPU tensor against a CPU one.
  auto same_bytes = [](const Tensor& gpu_t, const Tensor& cpu_t) {
    const Tensor h = gpu_t.to(Device::cpu()).contiguous(), c = cpu_t.contiguous();
    return h.nbytes() == c.nbytes() && std::memcmp(h.data_ptr(), c.data_ptr(), h.nbytes()) == 0;
  };
  for (const Case& c :
       {Case{DType::kBFloat16, 200, 64, true, false}, Case{DType::kFloat16, 256, 128, false, true},
        Case{DType::kBFloat16, 130, 128, true, true},
        Case{DType::kBFloat16, 128, 64, true, false, 0.0, DType::kBFloat16, true},
        Case{DType::kFloat16, 256, 64, false, true, 8.0, DType::kFloat16}}) {
    SCOPED_TRACE(::testing::Message() << "S " << c.S << " D " << c.D << " sm_scale " << c.sm_scale
                                      << (c.non_finite ? " non-finite" : ""));
    const int64_t B = 2, H = 2, S = c.S, D = c.D, Sp = (S + 127) / 128 * 128;
    Tensor q = rand_tensor({B, H, S, D}, c.dt, 21, -3.0, 3.0);
    const Tensor k = rand_tensor({B, H, S, D}, c.dt, 22, -3.0, 3.0);
    Tensor v = rand_tensor({B, H, S, D}, c.dt, 23, -3.0, 3.0);
    if (c.non_finite) {
      // Batch 0 head 0: an infinite query and value element; batch 1 head 1: queries near
      // 3e19, past the e4m3 scales' range (on the CPU: 128 infinite corrections and lse).
      std::vector<double> qv = q.to_double_vector(), vv = v.to_double_vector();
      qv[static_cast<std::size_t>(5 * D + 3)] = std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < S * D; ++i) {
        qv[static_cast<std::size_t>((3 * S * D) + i)] *= 1e19;
      }
      vv[static_cast<std::size_t>(7 * D)] = -std::numeric_limits<double>::infinity();
      q = Tensor::from_vector(qv, q.shape(), c.dt);
      v = Tensor::from_vector(vv, v.shape(), c.dt);
    }
    const std::optional<double> scale =
        c.sm_scale != 0.0 ? std::optional<double>(c.sm_scale) : std::nullopt;
    const Nvfp4AttentionQkv r = nvfp4_attention_sm120_quantize_qkv(q, k, v, c.per_block_mean);
    const Nvfp4AttentionOutput o = nvfp4_attention_sm120_fwd(
        r.q_fp4, r.k_fp4, r.v_fp4_t, r.q_scale, r.k_scale, r.v_scale_t, r.qk_correction, scale,
        c.causal, c.per_block_mean, std::nullopt, std::nullopt, c.out_dtype);
    const Tensor dq = q.to(gpu), dk = k.to(gpu), dv = v.to(gpu);
    Nvfp4AttentionQkv g;
    g.q_fp4 = Tensor::zeros(r.q_fp4.shape(), DType::kUInt8, gpu);
    g.k_fp4 = Tensor::zeros(r.k_fp4.shape(), DType::kUInt8, gpu);
    g.v_fp4_t = Tensor::zeros(r.v_fp4_t.shape(), DType::kUInt8, gpu);
    g.q_scale = Tensor::zeros(r.q_scale.shape(), DType::kFloat8E4M3FN, gpu);
    g.k_scale = Tensor::zeros(r.k_scale.shape(), DType::kFloat8E4M3FN, gpu);
    g.v_scale_t = Tensor::zeros(r.v_scale_t.shape(), DType::kFloat8E4M3FN, gpu);
    g.qk_correction = Tensor::zeros(r.qk_correction.shape(), DType::kFloat32, gpu);
    kernels::Nvfp4AttnQuantParams qp;
    qp.q = dq.data_ptr(), qp.k = dk.data_ptr(), qp.v = dv.data_ptr(), qp.dtype = c.dt;
    qp.B = B, qp.H = H, qp.S = S, qp.S_pad = Sp, qp.D = D, qp.per_block_mean = c.per_block_mean;
    qp.q_fp4 = static_cast<uint8_t*>(g.q_fp4.data_ptr());
    qp.k_fp4 = static_cast<uint8_t*>(g.k_fp4.data_ptr());
    qp.v_fp4_t = static_cast<uint8_t*>(g.v_fp4_t.data_ptr());
    qp.q_scale = static_cast<uint8_t*>(g.q_scale.data_ptr());
    qp.k_scale = static_cast<uint8_t*>(g.k_scale.data_ptr());
    qp.v_scale_t = static_cast<uint8_t*>(g.v_scale_t.data_ptr());
    qp.qk_correction = g.qk_correction.data<float>();
    // (The means: the launcher's own stream scratch.)
    kernels::cuda::nvfp4_attention_quantize_qkv(qp, nullptr, false);
    EXPECT_TRUE(same_bytes(g.q_fp4, r.q_fp4));
    EXPECT_TRUE(same_bytes(g.k_fp4, r.k_fp4));
    EXPECT_TRUE(same_bytes(g.v_fp4_t, r.v_fp4_t));
    EXPECT_TRUE(same_bytes(g.q_scale, r.q_scale));
    EXPECT_TRUE(same_bytes(g.k_scale, r.k_scale));
    EXPECT_TRUE(same_bytes(g.v_scale_t, r.v_scale_t));
    EXPECT_TRUE(same_bytes(g.qk_correction, r.qk_correction));
    Tensor out = Tensor::zeros(o.out.shape(), c.out_dtype, gpu);
    Tensor lse = Tensor::zeros(o.lse.shape(), DType::kFloat32, gpu);
    kernels::Nvfp4AttnFwdParams fp;
    fp.q_fp4 = static_cast<const uint8_t*>(g.q_fp4.data_ptr());
    fp.k_fp4 = static_cast<const uint8_t*>(g.k_fp4.data_ptr());
    fp.v_fp4_t = static_cast<const uint8_t*>(g.v_fp4_t.data_ptr());
    fp.q_scale = static_cast<const uint8_t*>(g.q_scale.data_ptr());
    fp.k_scale = static_cast<const uint8_t*>(g.k_scale.data_ptr());
    fp.v_scale_t = static_cast<const uint8_t*>(g.v_scale_t.data_ptr());
    fp.qk_correction = g.qk_correction.data<float>();
    fp.B = B, fp.H = H, fp.S = Sp, fp.D = D, fp.causal = c.causal;
    fp.per_block_mean = c.per_block_mean;
    fp.sm_scale = c.sm_scale != 0.0 ? static_cast<float>(c.sm_scale)
                                    : static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    fp.out = out.data_ptr(), fp.out_dtype = c.out_dtype, fp.lse = lse.data<float>();
    kernels::cuda::nvfp4_attention_fwd(fp, nullptr, false);
    EXPECT_TRUE(same_bytes(out, o.out));
    EXPECT_TRUE(all_close(lse.to(Device::cpu()), o.lse, {1e-6, 1e-6}));
  }
}
#endif

}  // namespace
}  // namespace flashinfer::testing
