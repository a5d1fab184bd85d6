// MiniMax sparse attention's selection ops (flashinfer.msa_ops): msa_topk_select against a
// hand-checked case (ties to the lower tile, +NaN above everything, -inf tiles as candidates,
// per-token page counts) and an independent sort over random scores; msa_proxy_score against an
// fp64 formula over flat and paged keys, causal offsets, reduce_heads and fp8 keys; upstream's
// refusals by name; record / replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "api/device_props.h"
#include "flashinfer/flashinfer.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

constexpr DType kBf = DType::kBFloat16;
constexpr DType kF32 = DType::kFloat32;
constexpr DType kI32 = DType::kInt32;
const double kInf = std::numeric_limits<double>::infinity();

std::vector<int64_t> ints(const Tensor& t) {
  std::vector<int64_t> v;
  for (double x : t.to_double_vector()) v.push_back(static_cast<int64_t>(x));
  return v;
}

Tensor i32(const std::vector<double>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, kI32);
}

// ---- msa_topk_select ----------------------------------------------------------------------------

TEST(MsaTopkSelect, HandCheckedTiesNanInfAndPageCounts) {
  // One head, 20 tiles, 3 queries. Query 0: every tile 1.0 but tile 3 and 7 (-inf), 11 (-2) and
  // 12 (+NaN, which ranks first): the 16 kept are 12 and the 15 lowest of the tied 1.0 tiles
  // (19 loses its tie), sorted. Query 1: 5 valid pages (a per-token count): all of them, then -1.
  // Query 2: all -inf but tiles 9 and 4: those two and the 14 lowest -inf tiles.
  const int64_t P = 20, S = 3;
  std::vector<double> sc(static_cast<size_t>(P * S), 0.0);
  auto at = [&](int64_t t, int64_t s) -> double& { return sc[static_cast<size_t>(t * S + s)]; };
  for (int64_t t = 0; t < P; ++t) {
    at(t, 0) = 1.0;
    at(t, 1) = static_cast<double>(t);
    at(t, 2) = -kInf;
  }
  at(3, 0) = -kInf, at(7, 0) = -kInf, at(11, 0) = -2.0;
  at(12, 0) = std::numeric_limits<double>::quiet_NaN();
  at(9, 2) = 0.5, at(4, 2) = -100.0;
  const Tensor scores = Tensor::from_vector(sc, {1, P, S}, kF32);
  const Tensor nvp = i32({20, 5, 20});
  const Tensor out = msa_topk_select(scores, 16, Value(nvp));
  ASSERT_EQ(out.shape(), (Shape{3, 1, 16}));
  EXPECT_EQ(out.dtype(), kI32);
  const auto o = ints(out);
  const std::vector<int64_t> q0 = {0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 15, 16, 17, 18};
  const std::vector<int64_t> q1 = {0, 1, 2, 3, 4, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  const std::vector<int64_t> q2 = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  EXPECT_EQ(std::vector<int64_t>(o.begin(), o.begin() + 16), q0);
  EXPECT_EQ(std::vector<int64_t>(o.begin() + 16, o.begin() + 32), q1);
  EXPECT_EQ(std::vector<int64_t>(o.begin() + 32, o.end()), q2);
  // Forced tiles: the first and the last two of the valid range are kept whatever their scores.
  const Tensor f = msa_topk_select(scores, 16, Value(int64_t{20}), std::nullopt, 1, 2);
  const auto fo = ints(f);
  EXPECT_EQ(std::vector<int64_t>(fo.begin(), fo.begin() + 16),
            (std::vector<int64_t>{0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 15, 16, 18, 19}));
}

// An independent rule: forced tiles, then the middle by (score descending, tile ascending).
std::vector<int64_t> sort_select(const std::vector<double>& s, int64_t n, int64_t fb, int64_t fe) {
  std::vector<int64_t> keep;
  for (int64_t b = 0; b < fb; ++b) keep.push_back(b);
  for (int64_t b = n - fe; b < n; ++b) keep.push_back(b);
  std::vector<int64_t> mid;
  for (int64_t b = fb; b < n - fe; ++b) mid.push_back(b);
  std::stable_sort(mid.begin(), mid.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
  for (int64_t i = 0; i < 16 - fb - fe && i < static_cast<int64_t>(mid.size()); ++i) {
    keep.push_back(mid[i]);
  }
  std::sort(keep.begin(), keep.end());
  while (keep.size() < 16) keep.push_back(-1);
  return keep;
}

TEST(MsaTopkSelect, MatchesAnIndependentSortOverRandomScores) {
  const int64_t H = 2, P = 40, S = 5;
  const Tensor scores = rand_tensor({H, P, S}, kF32, 3, -5.0, 5.0);
  const auto sv = scores.to_double_vector();
  Tensor out = Tensor::full({S, H, 16}, 7.0, kI32);
  const Tensor r = msa_topk_select(scores, 16, Value(int64_t{33}), out, 2, 3);
  EXPECT_EQ(r.data_ptr(), out.data_ptr());
  const auto o = ints(out);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> col(static_cast<size_t>(P));
      for (int64_t t = 0; t < P; ++t) col[t] = sv[(h * P + t) * S + s];
      const auto want = sort_select(col, 33, 2, 3);
      EXPECT_EQ(
          std::vector<int64_t>(o.begin() + (s * H + h) * 16, o.begin() + (s * H + h + 1) * 16),
          want)
          << s << " " << h;
    }
  }
}

TEST(MsaTopkSelect, BadInputNamesOpAndArgument) {
  const char* op = "msa_topk_select";
  const Tensor sc = rand_tensor({1, 20, 2}, kF32, 5);
  EXPECT_FI_ERROR(msa_topk_select(sc, 8), op, "topk");
  EXPECT_FI_ERROR(msa_topk_select(sc.to(kBf), 16), op, "max_score");
  EXPECT_FI_ERROR(msa_topk_select(sc.reshape({20, 2}), 16), op, "max_score");
  EXPECT_FI_ERROR(msa_topk_select(sc.transpose(1, 2), 16), op, "max_score");
  EXPECT_FI_ERROR(msa_topk_select(sc, 16, Value(int64_t{0})), op, "num_valid_pages");
  EXPECT_FI_ERROR(msa_topk_select(sc, 16, Value(int64_t{21})), op, "num_valid_pages");
  EXPECT_FI_ERROR(msa_topk_select(sc, 16, Value(i32({5, 5, 5}))), op, "num_valid_pages");
  EXPECT_FI_ERROR(msa_topk_select(sc, 16, std::nullopt, std::nullopt, 10, 7), op,
                  "force_begin_blocks");
  EXPECT_FI_ERROR(msa_topk_select(sc, 16, Value(int64_t{4}), std::nullopt, 3, 2), op,
                  "force_begin_blocks");
  EXPECT_FI_ERROR(msa_topk_select(sc, 16, std::nullopt, Tensor::empty({2, 1, 8}, kI32)), op,
                  "output");
  EXPECT_FI_ERROR(msa_topk_select(sc, 16, std::nullopt, Tensor::empty({2, 1, 16}, kF32)), op,
                  "output");
}

// ---- msa_proxy_score ----------------------------------------------------------------------------

struct ProxyCase {
  std::vector<int64_t> sq, sk;  // per request
  int64_t Hq, Hkv;
};

// fp64: out[h, t, q0 + i] = max over visible keys of tile t of q . k, -inf where none.
std::vector<double> proxy_ref(const Tensor& q, const Tensor& k_flat, const ProxyCase& c,
                              int64_t tiles, bool causal, const std::vector<int64_t>* off) {
  const int64_t total_q = q.size(0), G = c.Hq / c.Hkv;
  const auto qv = q.to_double_vector(), kv = k_flat.to_double_vector();
  std::vector<double> out(static_cast<size_t>(c.Hq * tiles * total_q), -kInf);
  int64_t q0 = 0, k0 = 0;
  for (size_t b = 0; b < c.sq.size(); ++b) {
    const int64_t sq = c.sq[b], sk = c.sk[b];
    const int64_t o = off ? (*off)[b] : sk - sq;
    for (int64_t i = 0; i < sq; ++i) {
      for (int64_t h = 0; h < c.Hq; ++h) {
        const int64_t limit = causal ? std::min(i + o + 1, sk) : sk;
        for (int64_t j = 0; j < limit; ++j) {
          double acc = 0.0;
          for (int64_t d = 0; d < 128; ++d) {
            acc += qv[((q0 + i) * c.Hq + h) * 128 + d] * kv[((k0 + j) * c.Hkv + h / G) * 128 + d];
          }
          double& e = out[(h * tiles + j / 128) * total_q + q0 + i];
          e = std::max(e, acc);
        }
      }
    }
    q0 += sq;
    k0 += sk;
  }
  return out;
}

std::vector<double> cumsum(const std::vector<int64_t>& v) {
  std::vector<double> c = {0.0};
  for (int64_t x : v) c.push_back(c.back() + static_cast<double>(x));
  return c;
}

TEST(MsaProxyScore, MatchesAnFp64FormulaFlatAndPaged) {
  // Three requests: 3 queries over 300 keys (three tiles, the last partial), 1 over 128, 2 over
  // 0; GQA 4 q heads over 2 kv heads.
  const ProxyCase c{{3, 1, 2}, {300, 128, 0}, 4, 2};
  const int64_t total_q = 6, total_k = 428, tiles = 3;
  const Tensor q = rand_tensor({total_q, 4, 128}, kBf, 11, -1.0, 1.0);
  const Tensor k = rand_tensor({total_k, 2, 128}, kBf, 12, -1.0, 1.0);
  const Tensor cq = i32(cumsum(c.sq)), ck = i32(cumsum(c.sk));
  for (bool causal : {true, false}) {
    const Tensor out = msa_proxy_score(q, k, cq, ck, std::nullopt, std::nullopt, causal);
    ASSERT_EQ(out.shape(), (Shape{4, tiles, total_q}));
    EXPECT_TRUE(all_close(out, proxy_ref(q, k, c, tiles, causal, nullptr), {1e-4, 1e-5})) << causal;
    // Paged: the same keys in pages of 128 (request 0 in pages 4, 1, 6; request 1 in page 2).
    Tensor pages = Tensor::zeros({8, 2, 128, 128}, kBf);
    const std::vector<std::vector<int64_t>> table = {{4, 1, 6}, {2, 0, 0}, {0, 0, 0}};
    int64_t k0 = 0;
    for (size_t b = 0; b < 3; ++b) {
      for (int64_t j = 0; j < c.sk[b]; ++j) {
        pages.select(0, table[b][j / 128]).select(1, j % 128).copy_(k.select(0, k0 + j));
      }
      k0 += c.sk[b];
    }
    std::vector<double> tv;
    for (const auto& row : table) tv.insert(tv.end(), row.begin(), row.end());
    const Tensor pt = Tensor::from_vector(tv, {3, 3}, kI32);
    const Tensor paged =
        msa_proxy_score(q, pages, cq, std::nullopt, pt, i32({300, 128, 0}), causal);
    EXPECT_TRUE(all_close(paged, out, {0.0, 0.0})) << causal;
  }
  // An explicit offset (the query's position is q_offset[b] + i) and an int offset.
  const std::vector<int64_t> off = {100, 0, 5};
  const Tensor o1 = msa_proxy_score(q, k, cq, ck, std::nullopt, std::nullopt, true, std::nullopt,
                                    std::nullopt, std::nullopt, false, Value(i32({100, 0, 5})));
  EXPECT_TRUE(all_close(o1, proxy_ref(q, k, c, tiles, true, &off), {1e-4, 1e-5}));
  const std::vector<int64_t> zero = {0, 0, 0};
  const Tensor o2 = msa_proxy_score(q, k, cq, ck, std::nullopt, std::nullopt, true, std::nullopt,
                                    std::nullopt, std::nullopt, false, Value(int64_t{0}));
  EXPECT_TRUE(all_close(o2, proxy_ref(q, k, c, tiles, true, &zero), {1e-4, 1e-5}));
  EXPECT_FALSE(all_close(o2, o1, {1e-4, 1e-5}));
}

// reduce_heads is the max over the heads of the per-head scores, exactly; fp8 keys score as their
// bf16 values (exact products); more tiles than keys are -inf; `output` is written.
TEST(MsaProxyScore, ReduceHeadsFp8KeysTilesAndOutput) {
  const Tensor q = rand_tensor({4, 2, 128}, kBf, 21, -1.0, 1.0);
  const Tensor k8 = rand_tensor({200, 1, 128}, kF32, 22, -2.0, 2.0).to(DType::kFloat8E4M3FN);
  const Tensor kb = k8.to(kBf);
  const Tensor cq = i32({0, 4}), ck = i32({0, 200});
  const Tensor per_head =
      msa_proxy_score(q, kb, cq, ck, std::nullopt, std::nullopt, true, std::nullopt, int64_t{4});
  ASSERT_EQ(per_head.shape(), (Shape{2, 4, 4}));
  Tensor red = Tensor::empty({1, 4, 4}, kF32);
  const Tensor r = msa_proxy_score(q, kb, cq, ck, std::nullopt, std::nullopt, true, std::nullopt,
                                   std::nullopt, red, true);
  EXPECT_EQ(r.data_ptr(), red.data_ptr());
  const auto ph = per_head.to_double_vector(), rv = red.to_double_vector();
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(rv[i], std::max(ph[i], ph[16 + i])) << i;
  for (int64_t t = 2; t < 4; ++t) {
    for (int64_t s = 0; s < 4; ++s) EXPECT_EQ(ph[t * 4 + s], -kInf);
  }
  const Tensor f8 =
      msa_proxy_score(q, k8, cq, ck, std::nullopt, std::nullopt, true, std::nullopt, int64_t{4});
  EXPECT_TRUE(all_close(f8, per_head, {0.0, 0.0}));
}

// NVFP4 operands: the scores of the dequantized values (e2m1 x e4m3, exact in bf16) times the two
// global scales, bit for bit, flat and paged (scale rows token * Hkv + head; (page * Hkv + head)
// * 128 + row).
TEST(MsaProxyScoreFp4, IsTheProxyScoreOfTheDequantizedValues) {
  auto quant = [](const Tensor& rows, double gs) {  // [M, 128] -> (fp4 [M, 64], 128x4 scales)
    auto [q, sf] = nvfp4_quantize_cute_dsl(rows, Value(gs), 0);
    const Tensor deq =
        e2m1_and_ufp8sf_scale_to_float(q, sf, Tensor::full({1}, 1.0, DType::kFloat32), 16, 1, true);
    return std::make_tuple(q, sf, deq.to(kBf));
  };
  const Tensor qf = rand_tensor({6 * 2, 128}, kBf, 91, -3.0, 3.0);
  const Tensor kf = rand_tensor({300 * 1, 128}, kBf, 92, -3.0, 3.0);
  const double gq = 400.0, gk = 250.0;
  auto [q4, qsf, qd] = quant(qf, gq);
  auto [k4, ksf, kd] = quant(kf, gk);
  const Tensor cq = i32({0, 4, 6}), ck = i32({0, 200, 300});
  const Tensor f4 = msa_proxy_score_fp4(q4.reshape({6, 2, 64}), k4.reshape({300, 1, 64}), qsf, ksf,
                                        1.0 / gq, 1.0 / gk, cq, ck);
  const Tensor ref = msa_proxy_score(qd.reshape({6, 2, 128}), kd.reshape({300, 1, 128}), cq, ck);
  const float g = static_cast<float>((1.0 / gq) * (1.0 / gk));
  const auto fv = f4.to_double_vector(), rv = ref.to_double_vector();
  ASSERT_EQ(fv.size(), rv.size());
  for (size_t i = 0; i < fv.size(); ++i) {
    EXPECT_EQ(fv[i], static_cast<double>(static_cast<float>(rv[i]) * g)) << i;
  }
  // Paged: 3 pages of 128 rows, request 0 in pages 2, 0; request 1 in page 1.
  const Tensor kp = rand_tensor({3 * 128, 128}, kBf, 93, -3.0, 3.0);
  auto [kp4, kpsf, kpd] = quant(kp, gk);
  const Tensor pt = Tensor::from_vector({2, 0, 1, 0}, {2, 2}, kI32);
  const Tensor pf4 =
      msa_proxy_score_fp4(q4.reshape({6, 2, 64}), kp4.reshape({3, 1, 128, 64}), qsf, kpsf, 1.0 / gq,
                          1.0 / gk, cq, std::nullopt, pt, i32({200, 100}));
  const Tensor pref = msa_proxy_score(qd.reshape({6, 2, 128}), kpd.reshape({3, 1, 128, 128}), cq,
                                      std::nullopt, pt, i32({200, 100}));
  const auto pv = pf4.to_double_vector(), prv = pref.to_double_vector();
  for (size_t i = 0; i < pv.size(); ++i) {
    EXPECT_EQ(pv[i], static_cast<double>(static_cast<float>(prv[i]) * g)) << i;
  }
  const char* op = "msa_proxy_score_fp4";
  EXPECT_FI_ERROR(msa_proxy_score_fp4(qd.reshape({6, 2, 128}), k4.reshape({300, 1, 64}), qsf, ksf,
                                      1.0, 1.0, cq, ck),
                  op, "q_fp4");
  EXPECT_FI_ERROR(msa_proxy_score_fp4(q4.reshape({6, 2, 64}), k4.reshape({300, 1, 64}),
                                      qsf.slice(0, 0, 1), ksf, 1.0, 1.0, cq, ck),
                  op, "q_scale");
  EXPECT_FI_ERROR(msa_proxy_score_fp4(q4.reshape({6, 2, 64}), k4.reshape({150, 1, 128}), qsf, ksf,
                                      1.0, 1.0, cq, ck),
                  op, "k_fp4");
}

TEST(MsaProxyScore, BadInputNamesOpAndArgument) {
  const char* op = "msa_proxy_score";
  const Tensor q = rand_tensor({2, 2, 128}, kBf, 31);
  const Tensor k = rand_tensor({4, 1, 128}, kBf, 32);
  const Tensor cq = i32({0, 2}), ck = i32({0, 4});
  EXPECT_FI_ERROR(msa_proxy_score(q.to(kF32), k, cq, ck), op, "q");
  EXPECT_FI_ERROR(msa_proxy_score(rand_tensor({2, 2, 64}, kBf, 1), k, cq, ck), op, "q");
  EXPECT_FI_ERROR(msa_proxy_score(q, rand_tensor({4, 3, 128}, kBf, 1), cq, ck), op, "k");
  EXPECT_FI_ERROR(msa_proxy_score(q, k.to(DType::kFloat16), cq, ck), op, "k");
  EXPECT_FI_ERROR(msa_proxy_score(q, k, cq), op, "cu_seqlens_k");
  EXPECT_FI_ERROR(msa_proxy_score(q, k, cq, i32({0, 9})), op, "cu_seqlens_k");
  EXPECT_FI_ERROR(msa_proxy_score(q, k, i32({0, 1, 2}), ck), op, "cu_seqlens_q");
  const Tensor pages = rand_tensor({2, 1, 128, 128}, kBf, 33);
  const Tensor pt = Tensor::from_vector({0.0}, {1, 1}, kI32);
  EXPECT_FI_ERROR(msa_proxy_score(q, pages, cq, std::nullopt, pt), op, "seqused_k");
  EXPECT_FI_ERROR(msa_proxy_score(q, k, cq, std::nullopt, pt, i32({4})), op, "k");
  EXPECT_FI_ERROR(msa_proxy_score(q, pages, cq, std::nullopt,
                                  Tensor::from_vector({5.0}, {1, 1}, kI32), i32({4})),
                  op, "page_table");
  EXPECT_FI_ERROR(msa_proxy_score(q, k, cq, ck, std::nullopt, std::nullopt, true, std::nullopt,
                                  std::nullopt, Tensor::empty({2, 2, 3}, kF32)),
                  op, "output");
  EXPECT_FI_ERROR(
      msa_proxy_score(q, k, cq, ck, std::nullopt, std::nullopt, true, std::nullopt, std::nullopt,
                      std::nullopt, false, Value(Tensor::from_vector({0.0}, {1}, DType::kInt64))),
      op, "q_offset");
}

// ---- msa_sparse_attention / msa_sparse_decode_attention ----------------------------------------

struct AttnRef {
  std::vector<double> out, lse, lse_t;  // [total_q, Hq, 128], [total_q, Hq]
};

// fp64: each (row, head) attends the listed tiles' visible keys (a repeated tile again), softmax
// of scale * q . k; empty: 0 and -inf.
AttnRef attn_ref(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q2k,
                 const std::vector<int64_t>& sq, const std::vector<int64_t>& sk, bool causal,
                 double scale, double T, double vg) {
  const int64_t total_q = q.size(0), Hq = q.size(1), Hkv = k.size(1), topk = q2k.size(2);
  const auto qv = q.to_double_vector(), kv = k.to_double_vector(), vv = v.to_double_vector();
  const auto idx = ints(q2k);
  AttnRef r;
  r.out.assign(static_cast<size_t>(total_q * Hq * 128), 0.0);
  r.lse.assign(static_cast<size_t>(total_q * Hq), -kInf);
  r.lse_t = r.lse;
  int64_t q0 = 0, k0 = 0;
  for (size_t b = 0; b < sq.size(); ++b) {
    for (int64_t i = 0; i < sq[b]; ++i) {
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t qi = q0 + i, kh = h / (Hq / Hkv);
        const int64_t limit = causal ? std::min(sk[b], sk[b] - sq[b] + i + 1) : sk[b];
        std::vector<int64_t> keys;
        for (int64_t e = 0; e < topk; ++e) {
          const int64_t t = idx[(kh * total_q + qi) * topk + e];
          if (t < 0) break;
          for (int64_t j = t * 128; j < std::min(limit, (t + 1) * 128); ++j) keys.push_back(j);
        }
        if (keys.empty()) continue;
        std::vector<double> sc;
        for (int64_t j : keys) {
          double acc = 0.0;
          for (int64_t d = 0; d < 128; ++d) {
            acc += qv[(qi * Hq + h) * 128 + d] * kv[((k0 + j) * Hkv + kh) * 128 + d];
          }
          sc.push_back(scale * acc);
        }
        const double m = *std::max_element(sc.begin(), sc.end());
        double sum = 0.0, sum_t = 0.0;
        for (double x : sc) sum += std::exp(x - m), sum_t += std::exp(T * x - T * m);
        for (size_t n = 0; n < keys.size(); ++n) {
          const double w = std::exp(sc[n] - m) / sum;
          for (int64_t d = 0; d < 128; ++d) {
            r.out[(qi * Hq + h) * 128 + d] += vg * w * vv[((k0 + keys[n]) * Hkv + kh) * 128 + d];
          }
        }
        r.lse[qi * Hq + h] = m + std::log(sum);
        r.lse_t[qi * Hq + h] = T * m + std::log(sum_t);
      }
    }
    q0 += sq[b];
    k0 += sk[b];
  }
  return r;
}

TEST(MsaSparseAttention, MatchesAnFp64SoftmaxOverTheListedTiles) {
  // Request 0: 3 queries over 300 keys; request 1: 2 over 130. 4 q heads over 2 kv heads, topk 4.
  // Lists: ascending, -1 tails, a repeated tile (counted twice), a tile past the keys (nothing),
  // and for request 1's first row on kv head 1 nothing at all (0 and -inf).
  const std::vector<int64_t> sq = {3, 2}, sk = {300, 130};
  const Tensor q = rand_tensor({5, 4, 128}, kBf, 61, -1.0, 1.0);
  const Tensor k = rand_tensor({430, 2, 128}, kBf, 62, -1.0, 1.0);
  const Tensor v = rand_tensor({430, 2, 128}, kBf, 63, -1.0, 1.0);
  const std::vector<double> lists = {
      // kv head 0: rows 0..4
      0, 2, -1, -1, 1, 1, 2, -1, 0, 1, 2, 5, 0, 1, -1, -1, 1, -1, -1, -1,
      // kv head 1
      2, -1, -1, -1, 0, -1, -1, -1, 1, 2, -1, -1, -1, -1, -1, -1, 0, 1, -1, -1};
  const Tensor q2k = Tensor::from_vector(lists, {2, 5, 4}, kI32);
  const Tensor cq = i32({0, 3, 5}), ck = i32({0, 300, 430});
  for (bool causal : {false, true}) {
    const MsaAttentionOutput r = msa_sparse_attention(
        q, k, v, q2k, cq, ck, causal, 0.1, std::nullopt, std::nullopt, true, std::nullopt,
        std::nullopt, std::nullopt, 0.5, std::nullopt, true, 0.7);
    const AttnRef ref = attn_ref(q, k, v, q2k, sq, sk, causal, 0.1, 0.7, 0.5);
    ASSERT_TRUE(r.lse.defined() && r.lse_t.defined());
    EXPECT_EQ(r.out.dtype(), kBf);
    EXPECT_TRUE(all_close(r.out, ref.out, default_tolerance(kBf))) << causal;
    EXPECT_TRUE(all_close(r.lse, ref.lse, {1e-5, 1e-5})) << causal;
    EXPECT_TRUE(all_close(r.lse_t, ref.lse_t, {1e-5, 1e-5})) << causal;
  }
  // Empty: request 1's first row on kv head 1 (q heads 2, 3): zeros and -inf.
  const MsaAttentionOutput e = msa_sparse_attention(q, k, v, q2k, cq, ck, false, std::nullopt,
                                                    std::nullopt, std::nullopt, true);
  EXPECT_FALSE(e.lse_t.defined());
  EXPECT_EQ(e.lse.to_double_vector()[3 * 4 + 2], -kInf);
  for (double x : e.out.select(0, 3).select(0, 2).to_double_vector()) EXPECT_EQ(x, 0.0);
  // Paged: the same keys and values in pages of 128 give the same bits.
  Tensor kp = Tensor::zeros({6, 2, 128, 128}, kBf), vp = Tensor::zeros({6, 2, 128, 128}, kBf);
  const std::vector<std::vector<int64_t>> table = {{3, 0, 5}, {1, 4, 0}};
  int64_t k0 = 0;
  for (size_t b = 0; b < 2; ++b) {
    for (int64_t j = 0; j < sk[b]; ++j) {
      kp.select(0, table[b][j / 128]).select(1, j % 128).copy_(k.select(0, k0 + j));
      vp.select(0, table[b][j / 128]).select(1, j % 128).copy_(v.select(0, k0 + j));
    }
    k0 += sk[b];
  }
  const Tensor pt = Tensor::from_vector({3, 0, 5, 1, 4, 0}, {2, 3}, kI32);
  const MsaAttentionOutput pg = msa_sparse_attention(q, kp, vp, q2k, cq, std::nullopt, true,
                                                     std::nullopt, pt, i32({300, 130}), true);
  const MsaAttentionOutput fl = msa_sparse_attention(q, k, v, q2k, cq, ck, true, std::nullopt,
                                                     std::nullopt, std::nullopt, true);
  EXPECT_TRUE(all_close(pg.out, fl.out, {0.0, 0.0}));
  EXPECT_TRUE(all_close(pg.lse, fl.lse, {0.0, 0.0}));
}

// Decode is the prefill rule with every request's rows right-aligned and causal by default: the
// same bits as msa_sparse_attention on those rows; an fp8 q computes and returns bf16.
TEST(MsaSparseDecodeAttention, IsThePrefillRuleOnRightAlignedRows) {
  const Tensor q = rand_tensor({4, 2, 128}, kBf, 71, -1.0, 1.0);  // 2 requests x 2 rows
  const Tensor k = rand_tensor({400, 1, 128}, kBf, 72, -1.0, 1.0);
  const Tensor v = rand_tensor({400, 1, 128}, kBf, 73, -1.0, 1.0);
  const Tensor q2k =
      Tensor::from_vector({0, 1, 0, 1, 0, 1, 0, 1}, {1, 4, 2}, kI32);  // topk 2 is fine here
  const Tensor ck = i32({0, 200, 400});
  const MsaAttentionOutput d = msa_sparse_decode_attention(q, k, v, q2k, std::nullopt, std::nullopt,
                                                           ck, 2, true, std::nullopt, true);
  const Tensor q2k4 = Tensor::from_vector({0, 1, -1, -1, 0, 1, -1, -1, 0, 1, -1, -1, 0, 1, -1, -1},
                                          {1, 4, 4}, kI32);
  const MsaAttentionOutput p = msa_sparse_attention(q, k, v, q2k4, i32({0, 2, 4}), ck, true,
                                                    std::nullopt, std::nullopt, std::nullopt, true);
  EXPECT_TRUE(all_close(d.out, p.out, {0.0, 0.0}));
  EXPECT_TRUE(all_close(d.lse, p.lse, {0.0, 0.0}));
  const Tensor q8 = q.to(DType::kFloat8E4M3FN);
  const MsaAttentionOutput d8 =
      msa_sparse_decode_attention(q8, k, v, q2k, std::nullopt, std::nullopt, ck, 2);
  EXPECT_EQ(d8.out.dtype(), kBf);
  EXPECT_FALSE(d8.lse.defined());
  const MsaAttentionOutput db =
      msa_sparse_decode_attention(q8.to(kBf), k, v, q2k, std::nullopt, std::nullopt, ck, 2);
  EXPECT_TRUE(all_close(d8.out, db.out, {0.0, 0.0}));
}

TEST(MsaSparseAttention, BadInputNamesOpAndArgument) {
  const char* op = "msa_sparse_attention";
  const Tensor q = rand_tensor({2, 2, 128}, kBf, 81);
  const Tensor k = rand_tensor({128, 1, 128}, kBf, 82);
  const Tensor q2k = Tensor::full({1, 2, 4}, 0.0, kI32);
  const Tensor cq = i32({0, 2}), ck = i32({0, 128});
  EXPECT_FI_ERROR(msa_sparse_attention(q.to(kF32), k, k, q2k, cq, ck), op, "q");
  EXPECT_FI_ERROR(msa_sparse_attention(q, k, k, Tensor::full({1, 2, 5}, 0.0, kI32), cq, ck), op,
                  "q2k_indices");
  EXPECT_FI_ERROR(msa_sparse_attention(q, k, k, Tensor::full({1, 3, 4}, 0.0, kI32), cq, ck), op,
                  "q2k_indices");
  EXPECT_FI_ERROR(msa_sparse_attention(q, k, k, q2k, cq), op, "cu_seqlens_k");
  EXPECT_FI_ERROR(msa_sparse_attention(q, k, k.to(DType::kFloat16), q2k, cq, ck), op, "v");
  EXPECT_FI_ERROR(msa_sparse_attention(q, k.to(DType::kUInt8), k.to(DType::kUInt8), q2k, cq, ck),
                  op, "k");
  const char* dop = "msa_sparse_decode_attention";
  EXPECT_FI_ERROR(msa_sparse_decode_attention(q, k, k, q2k, std::nullopt, std::nullopt, ck, 3), dop,
                  "q");
  EXPECT_FI_ERROR(msa_sparse_decode_attention(rand_tensor({1, 32, 128}, kBf, 1), k, k,
                                              Tensor::full({1, 1, 4}, 0.0, kI32), std::nullopt,
                                              std::nullopt, i32({0, 128})),
                  dop, "q");
  EXPECT_FI_ERROR(msa_sparse_decode_attention(q, k, k, q2k), dop, "cu_seqlens_k");
  EXPECT_FI_ERROR(
      msa_sparse_decode_attention(q, k, k, q2k, std::nullopt, std::nullopt, i32({0, 64, 128}), 1,
                                  true, std::nullopt, false, std::nullopt, std::nullopt,
                                  std::nullopt, std::nullopt, std::nullopt, DType::kInt32),
      dop, "partial_dtype");
}

TEST(MsaReplay, DumpsReplay) {
  const int n = dump_replay_all("msa", [] {
    const Tensor q = rand_tensor({3, 2, 128}, kBf, 41);
    const Tensor k = rand_tensor({260, 1, 128}, kBf, 42);
    const Tensor s = msa_proxy_score(q, k, i32({0, 3}), i32({0, 260}), std::nullopt, std::nullopt,
                                     true, std::nullopt, int64_t{16});
    (void)msa_topk_select(s, 16, Value(int64_t{3}));
    const Tensor v = rand_tensor({260, 1, 128}, kBf, 43);
    const Tensor q2k =
        Tensor::from_vector({0, 2, -1, -1, 1, -1, -1, -1, 2, 0, 1, -1}, {1, 3, 4}, kI32);
    (void)msa_sparse_attention(q, k, v, q2k, i32({0, 3}), i32({0, 260}), true, std::nullopt,
                               std::nullopt, std::nullopt, true);
    (void)msa_sparse_decode_attention(q, k, v, q2k, std::nullopt, std::nullopt,
                                      i32({0, 100, 180, 260}));
  });
  EXPECT_EQ(n, 4);
}

// Upstream runs these on SM120 / SM121 only and refuses other GPUs by name; this library has no
// CUDA kernel for them yet, so on an SM12x GPU the call is refused as a CUDA op without a kernel.
TEST(MsaCuda, RefusedByName) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda(0);
  const int cc = api::compute_capability(g);
  try {
    (void)msa_topk_select(rand_tensor({1, 20, 2}, kF32, 51).to(g), 16);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.op(), "msa_topk_select");
    if (cc != 120 && cc != 121) {
      EXPECT_NE(std::string(e.what()).find("requires SM120 or SM121"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace flashinfer::testing
