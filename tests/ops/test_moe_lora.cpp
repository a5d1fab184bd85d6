// Multi-LoRA over MoE: bgmv_moe_shrink, bgmv_moe_expand, bgmv_moe, bgmv_moe_gemm1_lora_delta,
// bgmv_moe_gemm2_lora_delta. A hand-checked case, fp64 formulas (8 experts, top-2, 2 adapters, a
// token without adapter), the pointer-table guard, bad input naming the argument, record/replay,
// and dumps written by torch in upstream's format.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/replay.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

namespace flashinfer::testing {
namespace {

double bf16r(double v) {
  return bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(v)));
}

Tensor i64(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kInt64);
  for (size_t i = 0; i < v.size(); ++i) t.data<int64_t>()[i] = v[i];
  return t;
}

// 5 tokens, 8 experts, top-2, 2 adapters; token 2 has none.
struct LoraCase {
  int64_t T = 5, K = 2, E = 8, L = 2, H = 32, R = 8, F = 24;
  std::vector<int64_t> topk = {3, 5, 0, 7, 2, 3, 6, 1, 5, 4};
  std::vector<int64_t> lora = {0, 1, -1, 1, 0};
  Tensor x, a, b, w, tok, exp, lid;
  LoraCase() {
    x = rand_tensor({T, H}, DType::kBFloat16, 1, -1, 1);
    a = rand_tensor({L, E, R, H}, DType::kBFloat16, 2, -0.5, 0.5);
    b = rand_tensor({L, E, F, R}, DType::kBFloat16, 3, -0.5, 0.5);
    w = rand_tensor({T * K}, DType::kFloat32, 4, 0, 1);
    std::vector<int64_t> t;
    for (int64_t p = 0; p < T * K; ++p) t.push_back(p / K);
    tok = i64(t);
    exp = i64(topk);
    lid = i64(lora);
  }
  int64_t P() const { return T * K; }
};

// A[l, e] @ v (rank rows) and B[l, e] @ u (F rows), in fp64 from the stored values.
std::vector<double> matvec(const Tensor& bank, int64_t l, int64_t e, const std::vector<double>& v) {
  const int64_t rows = bank.size(2), cols = bank.size(3);
  const auto d = bank.to_double_vector();
  std::vector<double> out(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      out[static_cast<size_t>(r)] +=
          d[static_cast<size_t>(((l * bank.size(1) + e) * rows + r) * cols + c)] *
          v[static_cast<size_t>(c)];
    }
  }
  return out;
}
std::vector<double> row(const Tensor& t, int64_t i) {
  const auto d = t.to_double_vector();
  const int64_t n = t.size(t.dim() - 1);
  return std::vector<double>(d.begin() + i * n, d.begin() + (i + 1) * n);
}

// Hand-checked: H = 2, rank 1, feat_out 2, one adapter, A[0, e] = [e, 1], B[0, e] = [1, e].
// Token 0 (experts 3 and 5, weights 0.25 and 0.75): shrink 1*3 + 2*1 = 5 and 5 + 2 = 7, expand
// 0.25 * 5 * [1, 3] + 0.75 * 7 * [1, 5] = [6.5, 30]. Token 1 has no adapter: zeros.
TEST(BgmvMoe, HandChecked) {
  const int64_t E = 8;
  Tensor x = Tensor::empty({2, 2}, DType::kFloat32);
  const float xv[] = {1, 2, 3, -1};
  std::copy(xv, xv + 4, x.data<float>());
  Tensor a = Tensor::empty({1, E, 1, 2}, DType::kFloat32),
         b = Tensor::empty({1, E, 2, 1}, DType::kFloat32);
  for (int64_t e = 0; e < E; ++e) {
    a.data<float>()[e * 2] = static_cast<float>(e);
    a.data<float>()[e * 2 + 1] = 1;
    b.data<float>()[e * 2] = 1;
    b.data<float>()[e * 2 + 1] = static_cast<float>(e);
  }
  Tensor w = Tensor::empty({4}, DType::kFloat32);
  const float wv[] = {0.25f, 0.75f, 0.5f, 0.5f};
  std::copy(wv, wv + 4, w.data<float>());
  Tensor out = bgmv_moe(x.to(DType::kBFloat16), {a.to(DType::kBFloat16)}, {b.to(DType::kBFloat16)},
                        i64({0, 0, 1, 1}), i64({3, 5, 1, 2}), i64({0, -1}), w, E);
  ASSERT_EQ(out.shape(), Shape({2, 2}));
  EXPECT_EQ(out.dtype(), DType::kBFloat16);
  EXPECT_TRUE(all_close(out, std::vector<double>{6.5, 30, 0, 0}, {0, 0}));
  // output_dim wider than the slices: the extra columns stay zero.
  Tensor wide = bgmv_moe(x.to(DType::kBFloat16), {a.to(DType::kBFloat16)}, {b.to(DType::kBFloat16)},
                         i64({0, 0, 1, 1}), i64({3, 5, 1, 2}), i64({0, -1}), w, E, 3);
  EXPECT_TRUE(all_close(wide, std::vector<double>{6.5, 30, 0, 0, 0, 0}, {0, 0}));
}

// Upstream's kernels (moe_bgmv_impl.cuh): a pair whose token lies outside [0, num_tokens) is
// skipped, its output left as it was; shrink adds the fp32 dot rounded to y's dtype, Y +=
// out_T(acc). Hand-checked: x = [2^-8, -2^-20], A = [1, 1] gives acc = 2^-8 - 2^-20, which bf16
// rounds to 2^-8; y = 1.0078125 + 2^-8 is the midpoint 1.01171875, which rounds to the even
// 1.015625 (adding the unrounded acc would stay below the midpoint: 1.0078125).
TEST(BgmvMoe, ShrinkRoundingAndSkippedTokensAreUpstreams) {
  const int64_t E = 2;
  Tensor x =
      Tensor::from_vector({std::ldexp(1.0, -8), -std::ldexp(1.0, -20)}, {1, 2}, DType::kBFloat16);
  Tensor a = Tensor::from_vector({1, 1, 1, 1}, {1, E, 1, 2}, DType::kBFloat16);
  Tensor wa = Tensor::zeros({1, E}, DType::kInt64);
  const int64_t sa = fill_w_ptr(wa, a, E, 0);
  // Pairs: token 0 (expert 1), token 1 (outside lora_indices of 1 token), token -1 (padding).
  Tensor y = Tensor::from_vector({1.0078125, 5.0, 7.0}, {1, 3, 1}, DType::kBFloat16);
  bgmv_moe_shrink(y, x, wa, i64({0, 1, -1}), i64({1, 0, 0}), i64({0}), sa);
  EXPECT_EQ(y.to_double_vector(), (std::vector<double>{1.015625, 5.0, 7.0}));
}

// Shrink (token rows and per-pair rows, accumulating into y) and expand (finalize and per-pair
// store) through pointer tables, against fp64 formulas.
TEST(BgmvMoeShrinkExpand, MatchFormulas) {
  LoraCase c;
  Tensor wa = Tensor::zeros({2, c.E}, DType::kInt64), wb = Tensor::zeros({2, c.E}, DType::kInt64);
  Tensor a2 = rand_tensor({c.L, c.E, c.R, c.H}, DType::kBFloat16, 5, -0.5, 0.5);
  Tensor b2 = rand_tensor({c.L, c.E, c.F, c.R}, DType::kBFloat16, 6, -0.5, 0.5);
  const int64_t sa = fill_w_ptr(wa, c.a, c.E, 0);
  EXPECT_EQ(fill_w_ptr(wa, a2, c.E, 1), sa);
  EXPECT_EQ(sa, c.E * c.R * c.H);
  const int64_t sb = fill_w_ptr(wb, c.b, c.E, 0);
  (void)fill_w_ptr(wb, b2, c.E, 1);
  const std::vector<const Tensor*> as = {&c.a, &a2}, bs = {&c.b, &b2};
  for (bool per_pair : {false, true}) {
    SCOPED_TRACE(per_pair ? "per_pair_input" : "token rows");
    Tensor xin = per_pair ? rand_tensor({c.P(), c.H}, DType::kBFloat16, 7, -1, 1) : c.x;
    Tensor y0 = rand_tensor({2, c.P(), c.R}, DType::kBFloat16, 8, -1, 1);
    Tensor y = y0.clone();
    bgmv_moe_shrink(y, xin, wa, c.tok, c.exp, c.lid, sa, per_pair);
    std::vector<double> want = y0.to_double_vector();
    for (int64_t s = 0; s < 2; ++s) {
      for (int64_t p = 0; p < c.P(); ++p) {
        const int64_t t = p / c.K, l = c.lora[static_cast<size_t>(t)];
        if (l < 0) continue;
        const auto v = matvec(*as[static_cast<size_t>(s)], l, c.topk[static_cast<size_t>(p)],
                              row(xin, per_pair ? p : t));
        for (int64_t r = 0; r < c.R; ++r)
          want[static_cast<size_t>((s * c.P() + p) * c.R + r)] += v[static_cast<size_t>(r)];
      }
    }
    EXPECT_TRUE(all_close(y, want, default_tolerance(DType::kBFloat16)));
  }
  Tensor xs = rand_tensor({2, c.P(), c.R}, DType::kBFloat16, 9, -1, 1);
  Tensor starts = i64({0, c.F});
  for (bool finalize : {true, false}) {
    SCOPED_TRACE(finalize ? "finalize" : "per pair");
    const int64_t rows = finalize ? c.T : c.P();
    Tensor y = Tensor::zeros({rows, 2 * c.F}, DType::kFloat32);
    bgmv_moe_expand(y, xs, wb, c.tok, c.exp, c.w, c.lid, starts, {c.F, c.F}, sb, finalize);
    std::vector<double> want(static_cast<size_t>(rows * 2 * c.F), 0.0);
    const auto wv = c.w.to_double_vector();
    for (int64_t s = 0; s < 2; ++s) {
      for (int64_t p = 0; p < c.P(); ++p) {
        const int64_t t = p / c.K, l = c.lora[static_cast<size_t>(t)];
        if (l < 0) continue;
        const auto v = matvec(*bs[static_cast<size_t>(s)], l, c.topk[static_cast<size_t>(p)],
                              row(xs.reshape({2 * c.P(), c.R}), s * c.P() + p));
        for (int64_t j = 0; j < c.F; ++j) {
          want[static_cast<size_t>((finalize ? t : p) * 2 * c.F + s * c.F + j)] +=
              (finalize ? wv[static_cast<size_t>(p)] : 1.0) * v[static_cast<size_t>(j)];
        }
      }
    }
    EXPECT_TRUE(all_close(y, want, {1e-5, 1e-5}));
  }
}

// bgmv_moe: shrink rounded to x's dtype, weighted expand in fp32, the result in x's dtype.
TEST(BgmvMoe, MatchesFormulaTwoSlices) {
  LoraCase c;
  Tensor a2 = rand_tensor({c.L, c.E, c.R, c.H}, DType::kBFloat16, 15, -0.5, 0.5);
  Tensor b2 = rand_tensor({c.L, c.E, c.F, c.R}, DType::kBFloat16, 16, -0.5, 0.5);
  Tensor out = bgmv_moe(c.x, {c.a, a2}, {c.b, b2}, c.tok, c.exp, c.lid, c.w, c.E);
  ASSERT_EQ(out.shape(), Shape({c.T, 2 * c.F}));
  std::vector<double> want(static_cast<size_t>(c.T * 2 * c.F), 0.0);
  const auto wv = c.w.to_double_vector();
  const std::vector<const Tensor*> as = {&c.a, &a2}, bs = {&c.b, &b2};
  for (int64_t s = 0; s < 2; ++s) {
    for (int64_t p = 0; p < c.P(); ++p) {
      const int64_t t = p / c.K, l = c.lora[static_cast<size_t>(t)],
                    e = c.topk[static_cast<size_t>(p)];
      if (l < 0) continue;
      auto h = matvec(*as[static_cast<size_t>(s)], l, e, row(c.x, t));
      for (double& v : h) v = bf16r(v);
      const auto v = matvec(*bs[static_cast<size_t>(s)], l, e, h);
      for (int64_t j = 0; j < c.F; ++j) {
        want[static_cast<size_t>(t * 2 * c.F + s * c.F + j)] +=
            wv[static_cast<size_t>(p)] * v[static_cast<size_t>(j)];
      }
    }
  }
  EXPECT_TRUE(all_close(out, want, default_tolerance(DType::kBFloat16)));
  for (int64_t j = 0; j < 2 * c.F; ++j)
    EXPECT_EQ(out.to_double_vector()[static_cast<size_t>(2 * 2 * c.F + j)], 0.0);
}

// FC1 delta: per (token, slot), unweighted, scale * [gate | up]; FC2 delta: the permuted
// activation gathered back (inactive slots zero), weighted and combined per token.
TEST(BgmvMoeLoraDelta, Gemm1AndGemm2MatchFormulas) {
  LoraCase c;
  const int64_t I = 16;
  Tensor ag = rand_tensor({c.L, c.E, c.R, c.H}, DType::kBFloat16, 20, -0.5, 0.5);
  Tensor au = rand_tensor({c.L, c.E, c.R, c.H}, DType::kBFloat16, 21, -0.5, 0.5);
  Tensor bg = rand_tensor({c.L, c.E, I, c.R}, DType::kBFloat16, 22, -0.5, 0.5);
  Tensor bu = rand_tensor({c.L, c.E, I, c.R}, DType::kBFloat16, 23, -0.5, 0.5);
  Tensor wa = Tensor::zeros({2, c.E}, DType::kInt64), wb = Tensor::zeros({2, c.E}, DType::kInt64);
  int64_t sa = 0, sb = 0;
  sa = fill_w_ptr(wa, ag, c.E, 0);
  sa = fill_w_ptr(wa, au, c.E, 1);
  sb = fill_w_ptr(wb, bg, c.E, 0);
  sb = fill_w_ptr(wb, bu, c.E, 1);
  Tensor hs = rand_tensor({c.T, c.H}, DType::kFloat32, 24, -1, 1);  // cast to the LoRA dtype
  Tensor ids = c.exp.reshape({c.T, c.K});
  Tensor d1 = bgmv_moe_gemm1_lora_delta(hs, wa, sa, wb, sb, ids, c.lid, c.R, I, DType::kBFloat16,
                                        0.5, DType::kFloat32);
  ASSERT_EQ(d1.shape(), Shape({c.T, c.K, 2 * I}));
  EXPECT_EQ(d1.dtype(), DType::kFloat32);
  std::vector<double> want1(static_cast<size_t>(c.P() * 2 * I), 0.0);
  const Tensor hb = hs.to(DType::kBFloat16);
  for (int64_t p = 0; p < c.P(); ++p) {
    const int64_t t = p / c.K, l = c.lora[static_cast<size_t>(t)],
                  e = c.topk[static_cast<size_t>(p)];
    if (l < 0) continue;
    const std::vector<const Tensor*> A = {&ag, &au}, B = {&bg, &bu};
    for (int s = 0; s < 2; ++s) {
      auto h = matvec(*A[static_cast<size_t>(s)], l, e, row(hb, t));
      for (double& v : h) v = bf16r(v);
      const auto v = matvec(*B[static_cast<size_t>(s)], l, e, h);
      for (int64_t j = 0; j < I; ++j)
        want1[static_cast<size_t>(p * 2 * I + s * I + j)] = 0.5 * v[static_cast<size_t>(j)];
    }
  }
  EXPECT_TRUE(all_close(d1, want1, {1e-5, 1e-5}));

  // FC2: rank 8 down projection of I = 16 back to H = 32; rows 0..9 of a permuted activation.
  Tensor ad = rand_tensor({c.L, c.E, c.R, I}, DType::kBFloat16, 25, -0.5, 0.5);
  Tensor bd = rand_tensor({c.L, c.E, c.H, c.R}, DType::kBFloat16, 26, -0.5, 0.5);
  Tensor wa2 = Tensor::zeros({1, c.E}, DType::kInt64), wb2 = Tensor::zeros({1, c.E}, DType::kInt64);
  const int64_t sa2 = fill_w_ptr(wa2, ad, c.E, 0), sb2 = fill_w_ptr(wb2, bd, c.E, 0);
  Tensor act = rand_tensor({12, I}, DType::kBFloat16, 27, -1, 1);
  const std::vector<int64_t> perm = {9, 3, -1, 0, 11, 4, 2, -1, 7, 5};
  Tensor tw = c.w.reshape({c.T, c.K});
  Tensor d2 = bgmv_moe_gemm2_lora_delta(act, i64(perm), wa2, sa2, wb2, sb2, ids, tw, c.lid, c.R,
                                        c.H, DType::kBFloat16, 2.0);
  ASSERT_EQ(d2.shape(), Shape({c.T, c.H}));
  EXPECT_EQ(d2.dtype(), DType::kBFloat16);
  std::vector<double> want2(static_cast<size_t>(c.T * c.H), 0.0);
  const auto wv = c.w.to_double_vector();
  for (int64_t p = 0; p < c.P(); ++p) {
    const int64_t t = p / c.K, l = c.lora[static_cast<size_t>(t)],
                  e = c.topk[static_cast<size_t>(p)];
    if (l < 0 || perm[static_cast<size_t>(p)] < 0) continue;
    auto h = matvec(ad, l, e, row(act, perm[static_cast<size_t>(p)]));
    for (double& v : h) v = bf16r(v);
    const auto v = matvec(bd, l, e, h);
    for (int64_t j = 0; j < c.H; ++j)
      want2[static_cast<size_t>(t * c.H + j)] +=
          2.0 * wv[static_cast<size_t>(p)] * v[static_cast<size_t>(j)];
  }
  EXPECT_TRUE(all_close(d2, want2, default_tolerance(DType::kBFloat16)));
}

TEST(BgmvMoe, BadInput) {
  LoraCase c;
  Tensor wa = Tensor::zeros({1, c.E}, DType::kInt64), wb = Tensor::zeros({1, c.E}, DType::kInt64);
  const int64_t sa = fill_w_ptr(wa, c.a, c.E, 0), sb = fill_w_ptr(wb, c.b, c.E, 0);
  Tensor y = Tensor::zeros({1, c.P(), c.R}, DType::kBFloat16);
  const char* sh = "bgmv_moe_shrink";
  // A table naming memory no registered bank holds (as a recording's does), or a bank of
  // another dtype, is refused before anything is read.
  Tensor foreign = Tensor::full({1, c.E}, 4096.0, DType::kFloat32).to(DType::kInt64);
  EXPECT_FI_ERROR(bgmv_moe_shrink(y, c.x, foreign, c.tok, c.exp, c.lid, sa), sh, "w_ptr");
  Tensor wf = Tensor::zeros({1, c.E}, DType::kInt64);
  (void)fill_w_ptr(wf, c.a.to(DType::kFloat16), c.E, 0);  // the fp16 copy dies here
  EXPECT_FI_ERROR(bgmv_moe_shrink(y, c.x, wf, c.tok, c.exp, c.lid, sa), sh, "w_ptr");
  Tensor a16 = c.a.to(DType::kFloat16);
  (void)fill_w_ptr(wf, a16, c.E, 0);
  EXPECT_FI_ERROR(bgmv_moe_shrink(y, c.x, wf, c.tok, c.exp, c.lid, sa), sh, "w_ptr");
  // A stride that walks past the bank.
  EXPECT_FI_ERROR(bgmv_moe_shrink(y, c.x, wa, c.tok, c.exp, c.lid, sa * 2), sh, "w_ptr");
  EXPECT_FI_ERROR(
      bgmv_moe_shrink(y, c.x, wa, c.tok, i64({0, 8, 0, 0, 0, 0, 0, 0, 0, 0}), c.lid, sa), sh,
      "expert_ids");
  EXPECT_FI_ERROR(bgmv_moe_shrink(y.to(DType::kFloat16), c.x, wa, c.tok, c.exp, c.lid, sa), sh,
                  "y");
  EXPECT_FI_ERROR(bgmv_moe_shrink(y, c.x.to(DType::kFloat32), wa, c.tok, c.exp, c.lid, sa), sh,
                  "x");
  EXPECT_FI_ERROR(bgmv_moe_shrink(y, c.x, wa.to(DType::kInt32), c.tok, c.exp, c.lid, sa), sh,
                  "w_ptr");
  EXPECT_FI_ERROR(bgmv_moe_shrink(y, c.x, wa, c.tok, c.exp, c.lid, sa, true), sh, "x");
  const char* ex = "bgmv_moe_expand";
  Tensor xs = Tensor::zeros({1, c.P(), c.R}, DType::kBFloat16);
  Tensor yo = Tensor::zeros({c.T, c.F}, DType::kFloat32);
  EXPECT_FI_ERROR(bgmv_moe_expand(yo, xs, wb, c.tok, c.exp, c.w, c.lid, i64({1}), {c.F}, sb), ex,
                  "slice_start_loc");
  EXPECT_FI_ERROR(bgmv_moe_expand(yo.to(DType::kBFloat16), xs, wb, c.tok, c.exp, c.w, c.lid,
                                  i64({0}), {c.F}, sb),
                  ex, "y");
  EXPECT_FI_ERROR(bgmv_moe_expand(yo, xs, wb, c.tok, c.exp, c.w.to(DType::kBFloat16), c.lid,
                                  i64({0}), {c.F}, sb),
                  ex, "topk_weights");
  EXPECT_FI_ERROR(bgmv_moe_expand(yo, xs, wb, c.tok, c.exp, c.w, c.lid, i64({0}), {c.F}, sb, false),
                  ex, "y");
  Tensor xs2 = Tensor::zeros({2, c.P(), c.R}, DType::kBFloat16);
  Tensor wb_2 = Tensor::zeros({2, c.E}, DType::kInt64);
  (void)fill_w_ptr(wb_2, c.b, c.E, 0);
  (void)fill_w_ptr(wb_2, c.b, c.E, 1);
  EXPECT_FI_ERROR(bgmv_moe_expand(Tensor::zeros({c.T, 2 * c.F}, DType::kFloat32), xs2, wb_2, c.tok,
                                  c.exp, c.w, c.lid, i64({0, c.F}), {c.F, c.F - 8}, sb),
                  ex, "output_slices");
  const char* bm = "bgmv_moe";
  EXPECT_FI_ERROR(bgmv_moe(c.x, {c.a}, {c.b}, c.tok, c.exp, i64({0, 2, -1, 1, 0}), c.w, c.E), bm,
                  "lora_indices");
  EXPECT_FI_ERROR(bgmv_moe(c.x, {c.a}, {c.b, c.b}, c.tok, c.exp, c.lid, c.w, c.E), bm,
                  "lora_b_weights");
  EXPECT_FI_ERROR(bgmv_moe(c.x, {c.a}, {c.b}, c.tok, c.exp, c.lid, c.w, 4), bm, "lora_a_weights");
  EXPECT_FI_ERROR(bgmv_moe(c.x, {c.a.to(DType::kFloat16)}, {c.b}, c.tok, c.exp, c.lid, c.w, c.E),
                  bm, "lora_a_weights");
  EXPECT_FI_ERROR(bgmv_moe(c.x, {c.a}, {c.b}, c.tok, c.exp, c.lid, c.w, c.E, c.F - 1), bm,
                  "output_dim");
  const char* g1 = "bgmv_moe_gemm1_lora_delta";
  Tensor ids = c.exp.reshape({c.T, c.K});
  EXPECT_FI_ERROR(bgmv_moe_gemm1_lora_delta(c.x, wa, sa, wb, sb, ids, c.lid, c.R, c.F), g1,
                  "w_ptr_a");
  Tensor wa_2 = Tensor::zeros({2, c.E}, DType::kInt64);
  (void)fill_w_ptr(wa_2, c.a, c.E, 0);
  (void)fill_w_ptr(wa_2, c.a, c.E, 1);
  EXPECT_FI_ERROR(
      bgmv_moe_gemm1_lora_delta(c.x, wa_2, sa, wb_2, sb, ids, c.lid, c.R, c.F, DType::kFloat32), g1,
      "lora_dtype");
  EXPECT_FI_ERROR(bgmv_moe_gemm1_lora_delta(c.x, wa_2, sa, wb_2, sb, ids, i64({0, 1, 0}), c.R, c.F),
                  g1, "lora_ids");
  EXPECT_FI_ERROR(bgmv_moe_gemm1_lora_delta(c.x, wa_2, sa, wb_2, sb,
                                            i64({0, 1, 2, 3, 4, 5, 6, 7, 9, 1}).reshape({c.T, c.K}),
                                            c.lid, c.R, c.F),
                  g1, "topk_ids");
  const char* g2 = "bgmv_moe_gemm2_lora_delta";
  Tensor wa1 = Tensor::zeros({1, c.E}, DType::kInt64);
  Tensor ad = rand_tensor({c.L, c.E, c.R, c.F}, DType::kBFloat16, 30);
  (void)fill_w_ptr(wa1, ad, c.E, 0);
  Tensor act = rand_tensor({4, c.F}, DType::kBFloat16, 31);
  Tensor tw = c.w.reshape({c.T, c.K});
  EXPECT_FI_ERROR(
      bgmv_moe_gemm2_lora_delta(act, i64({0, 1, 2}), wa1, sa, wb, sb, ids, tw, c.lid, c.R, c.H), g2,
      "expanded_idx_to_permuted_idx");
  EXPECT_FI_ERROR(bgmv_moe_gemm2_lora_delta(act, i64({0, 1, 2, 3, 4, 0, 1, 2, 3, -1}), wa1, sa, wb,
                                            sb, ids, tw, c.lid, c.R, c.H),
                  g2, "expanded_idx_to_permuted_idx");
  EXPECT_FI_ERROR(bgmv_moe_gemm2_lora_delta(act, i64({0, 1, 2, 3, 0, 0, 1, 2, 3, -1}), wa_2, sa, wb,
                                            sb, ids, tw, c.lid, c.R, c.H),
                  g2, "w_ptr_a");
}

TEST(BgmvMoe, DeclsCpuOnlyAndRecordReplay) {
  for (const char* name : {"bgmv_moe_shrink", "bgmv_moe_expand", "bgmv_moe"}) {
    const OpDecl* d = OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->module, "flashinfer.fused_moe.bgmv_moe");
  }
  for (const char* name : {"bgmv_moe_gemm1_lora_delta", "bgmv_moe_gemm2_lora_delta"}) {
    const OpDecl* d = OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->module, "flashinfer.fused_moe.moe_lora_delta");
  }
  for (const char* name : {"bgmv_moe_shrink", "bgmv_moe_expand", "bgmv_moe",
                           "bgmv_moe_gemm1_lora_delta", "bgmv_moe_gemm2_lora_delta"}) {
    EXPECT_TRUE(op_has_backend(name, DeviceType::kCPU)) << name;
    EXPECT_FALSE(op_has_backend(name, DeviceType::kCUDA)) << name;
  }
  EXPECT_EQ(OpRegistry::global().find("bgmv_moe_gemm1_lora_delta")->signature(),
            "(hidden_states, w_ptr_a, lora_stride_a, w_ptr_b, lora_stride_b, topk_ids, lora_ids, "
            "rank, intermediate_size, *, lora_dtype=torch.bfloat16, scale=1.0, "
            "out_dtype=torch.bfloat16)");
  LoraCase c;
  Tensor wa = Tensor::zeros({2, c.E}, DType::kInt64), wb = Tensor::zeros({2, c.E}, DType::kInt64);
  int64_t sa = 0, sb = 0;
  for (int64_t s = 0; s < 2; ++s) {
    sa = fill_w_ptr(wa, c.a, c.E, s);
    sb = fill_w_ptr(wb, c.b, c.E, s);
  }
  Tensor ad = rand_tensor({c.L, c.E, c.R, c.F}, DType::kBFloat16, 40);
  Tensor wa1 = Tensor::zeros({1, c.E}, DType::kInt64), wb1 = Tensor::zeros({1, c.E}, DType::kInt64);
  const int64_t sa1 = fill_w_ptr(wa1, ad, c.E, 0);
  Tensor bd = rand_tensor({c.L, c.E, c.H, c.R}, DType::kBFloat16, 41);
  const int64_t sb1 = fill_w_ptr(wb1, bd, c.E, 0);
  Tensor ids = c.exp.reshape({c.T, c.K});
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    Tensor y = rand_tensor({2, c.P(), c.R}, DType::kBFloat16, 42);
    bgmv_moe_shrink(y, c.x, wa, c.tok, c.exp, c.lid, sa);
    bgmv_moe_expand(Tensor::zeros({c.T, 2 * c.F}, DType::kFloat32), y, wb, c.tok, c.exp, c.w, c.lid,
                    i64({0, c.F}), {c.F, c.F}, sb);
    (void)bgmv_moe(c.x, {c.a}, {c.b}, c.tok, c.exp, c.lid, c.w, c.E, std::nullopt);
    (void)bgmv_moe_gemm1_lora_delta(c.x, wa, sa, wb, sb, ids, c.lid, c.R, c.F);
    (void)bgmv_moe_gemm2_lora_delta(rand_tensor({c.P(), c.F}, DType::kBFloat16, 43),
                                    i64({0, 1, 2, 3, 4, 5, 6, 7, 8, -1}), wa1, sa1, wb1, sb1, ids,
                                    c.w.reshape({c.T, c.K}), c.lid, c.R, c.H, DType::kBFloat16,
                                    0.25, DType::kFloat32);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 5u);
  for (const auto& call : calls) EXPECT_TRUE(replays_identically(call)) << call.name;
}

// bgmv_moe as upstream's test calls it (positional, one slice per list), recorded in upstream's
// dump format by Python with torch, which computes the expected output itself (shrink rounded to
// bf16, fp32 weighted expand, bf16 result): it replays and passes. A recorded
// bgmv_moe_gemm1_lora_delta carries the recording process's device addresses in w_ptr_a/w_ptr_b
// and not the weights they point to: its replay is refused with an error naming w_ptr_a, the
// one outcome possible without the weights.
TEST(BgmvMoeUpstreamDumps, EngineStyleDumpsReplay) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_moe_lora_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string py = R"PY(
import json, os, sys
try:
    import torch
except ImportError:
    sys.exit(77)

d = sys.argv[1]
torch.manual_seed(0)
seq = [0]
def tmeta(t, key):
    return {"type": "torch.Tensor", "shape": list(t.shape), "dtype": str(t.dtype),
            "stride": list(t.stride()), "device": "cuda:0", "requires_grad": False,
            "is_contiguous": True, "tensor_key": key}
def record(name, module, inputs, meta, outputs, sig):
    seq[0] += 1
    call = "%s/20261122_190000_%03d_pid4242_%s_call%04d" % (d, seq[0], name, seq[0])
    os.makedirs(call)
    torch.save(inputs, call + "/inputs.pt")
    torch.save(outputs, call + "/outputs.pt")
    rec = {"function_name": name, "module": module, "call_sequence": seq[0],
           "timestamp": "20261122_190000_%03d" % seq[0], "process_id": 4242,
           "input_metadata": meta, "output_metadata": {},
           "tensor_info": {"input_tensor_keys": list(inputs), "output_tensor_keys": list(outputs)},
           "tensor_format": "torch", "function_signature": sig, "execution_status": "completed"}
    with open(call + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")

T, K, E, L, H, R, F = 6, 2, 8, 3, 64, 16, 48
x = torch.randn(T, H).bfloat16()
A = (torch.randn(L, E, R, H) * 0.1).bfloat16()
B = (torch.randn(L, E, F, R) * 0.1).bfloat16()
ids = torch.stack([torch.randperm(E)[:K] for _ in range(T)])
tok = torch.arange(T).repeat_interleave(K)
exp = ids.reshape(-1).long()
lora = torch.tensor([0, 2, -1, 1, 0, 2])
w = torch.softmax(torch.randn(T, K), -1).reshape(-1)
y = torch.zeros(T, F)
for p in range(T * K):
    t, l, e = int(tok[p]), int(lora[int(tok[p])]), int(exp[p])
    if l < 0:
        continue
    h = (x[t].float() @ A[l, e].float().T).bfloat16().float()
    y[t] += w[p] * (h @ B[l, e].float().T)
record("bgmv_moe", "flashinfer.fused_moe.bgmv_moe",
       {"arg_0": x, "arg_1__0": A, "arg_2__0": B, "arg_3": tok, "arg_4": exp, "arg_5": lora,
        "arg_6": w},
       {"arg_1": {"type": "list", "length": 1, "items": [tmeta(A, "arg_1__0")], "truncated": False},
        "arg_2": {"type": "list", "length": 1, "items": [tmeta(B, "arg_2__0")], "truncated": False},
        "arg_7": E},
       {"result": y.bfloat16()},
       "(x, lora_a_weights, lora_b_weights, sorted_token_ids, expert_ids, lora_indices, "
       "topk_weights, num_experts, output_dim=None)")
# FC1 delta with device pointer tables, as the docstring's caller wiring builds them
wpa = torch.tensor([[0x7f0000000000 + e * R * H * 2 for e in range(E)]] * 2, dtype=torch.int64)
wpb = torch.tensor([[0x7f1000000000 + e * F * R * 2 for e in range(E)]] * 2, dtype=torch.int64)
record("bgmv_moe_gemm1_lora_delta", "flashinfer.fused_moe.moe_lora_delta",
       {"arg_0": x, "arg_1": wpa, "arg_3": wpb, "arg_5": ids.int(), "arg_6": lora.int()},
       {"arg_2": E * R * H, "arg_4": E * F * R, "arg_7": R, "arg_8": F,
        "kwarg_scale": 0.5},
       {"result": torch.zeros(T, K, 2 * F).bfloat16()},
       "(hidden_states, w_ptr_a, lora_stride_a, w_ptr_b, lora_stride_b, topk_ids, lora_ids, rank, "
       "intermediate_size, *, lora_dtype=torch.bfloat16, scale=1.0, out_dtype=torch.bfloat16)")
)PY";
  // Not run_dump_script(): the second call is expected to fail.
  const auto replayed = replay_dump_script(dir, py, dir, dir);
  if (!replayed) GTEST_SKIP() << "python3-torch not installed";
  const auto& results = *replayed;
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].function_name, "bgmv_moe");
  EXPECT_EQ(results[0].status, replay::Status::kPassed) << results[0].error;
  EXPECT_EQ(results[1].function_name, "bgmv_moe_gemm1_lora_delta");
  EXPECT_EQ(results[1].status, replay::Status::kError);
  EXPECT_NE(results[1].error.find("w_ptr_a"), std::string::npos) << results[1].error;
  EXPECT_NE(results[1].error.find("fill_w_ptr"), std::string::npos) << results[1].error;
}

}  // namespace
}  // namespace flashinfer::testing
