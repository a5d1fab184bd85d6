// trtllm_fp8_block_scale_moe / _routed_ with Fp8QuantizationType.MxFp8 (MXFP8 x MXFP8): a
// hand-checked golden, fp64 formulas (8 experts, top-2, small sizes), upstream's prepared
// layouts (shuffled MajorK / BlockMajorK, written out independently) against plain weights
// bit for bit, routing from logits against the routed form, bad input naming the argument,
// record/replay, and the per-call CUDA refusal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/moe_fp4_test_util.h"
#include "ops/moe_shared_test_util.h"
#include "ops/op_test_util.h"
#include "util/moe_weight_prep.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

namespace flashinfer::testing {
namespace {

using moe_fp4::bytes_tensor;
using moe_fp4::Rng;
using moe_prep::bf16;
using moe_prep::max_abs;
using moe_prep::prepare_rows;
using moe_prep::silu;
using moe_prep::ue8m0;

constexpr auto kMx = Fp8QuantizationType::MxFp8;

double e4m3(uint8_t c) { return e4m3fn_bits_to_float(c); }

// ---- a case: plain data, its prepared forms, the fp64 formula ------------------------------

struct MxCase {
  int64_t T = 6, E = 8, K = 2, H = 128, I = 128, act = 3, offset = 0, local = 8;
  bool swiglu_params = false;
  std::vector<uint8_t> x, xs, w1, s1, w2, s2;
  std::vector<double> alpha, beta, limit;
  std::vector<double> b1, b2;  // plain gemm1_bias [El, N1] / gemm2_bias [El, H]; empty: none
  int64_t n1() const { return act == 3 ? 2 * I : I; }

  void make(uint64_t seed) {
    Rng r{seed};
    auto codes = [&](size_t n, double lo, double hi) {
      std::vector<uint8_t> v(n);
      for (auto& b : v) b = float_to_e4m3fn_bits(static_cast<float>(r.uniform(lo, hi)), true);
      return v;
    };
    auto exps = [&](size_t n, int base) {
      std::vector<uint8_t> v(n);
      for (auto& b : v) b = static_cast<uint8_t>(base + static_cast<int>(r.next() % 3));
      return v;
    };
    const int64_t El = local, N1 = n1();
    x = codes(static_cast<size_t>(T * H), -3, 3);
    xs = exps(static_cast<size_t>(T * H / 32), 125);
    w1 = codes(static_cast<size_t>(El * N1 * H), -2, 2);
    s1 = exps(static_cast<size_t>(El * N1 * H / 32), 123);
    w2 = codes(static_cast<size_t>(El * H * I), -2, 2);
    s2 = exps(static_cast<size_t>(El * H * I / 32), 123);
    if (swiglu_params) {
      for (int64_t e = 0; e < El; ++e) {
        alpha.push_back(static_cast<float>(r.uniform(1.5, 2.0)));
        beta.push_back(static_cast<float>(r.uniform(0.5, 1.0)));
        limit.push_back(static_cast<float>(r.uniform(1.0, 3.0)));
      }
    }
  }

  Tensor hidden() const { return bytes_tensor(x, {T, H}, DType::kFloat8E4M3FN); }
  Tensor hidden_scale() const { return bytes_tensor(xs, {T, H / 32}); }
  // shuffle: upstream's shuffled preparation; block: BlockMajorK (128-byte blocks) on top.
  Tensor gemm1(bool shuffle, bool block = false) const {
    if (!shuffle) return bytes_tensor(w1, {local, n1(), H}, DType::kFloat8E4M3FN);
    const auto p = prepare_rows(w1, local, n1(), H, act == 3, block ? 128 : 0);
    return block ? bytes_tensor(p, {local, H / 128, n1(), 128}, DType::kFloat8E4M3FN)
                 : bytes_tensor(p, {local, n1(), H}, DType::kFloat8E4M3FN);
  }
  Tensor gemm2(bool shuffle, bool block = false) const {
    if (!shuffle) return bytes_tensor(w2, {local, H, I}, DType::kFloat8E4M3FN);
    const auto p = prepare_rows(w2, local, H, I, false, block ? 128 : 0);
    return block ? bytes_tensor(p, {local, I / 128, H, 128}, DType::kFloat8E4M3FN)
                 : bytes_tensor(p, {local, H, I}, DType::kFloat8E4M3FN);
  }
  // Linear scales, or shuffle_matrix_sf_a's output: rows as the weights', then
  // block_scale_interleave, reshaped back to [E, rows, cols] as upstream's test does.
  Tensor scale1(bool shuffle) const {
    if (!shuffle) return bytes_tensor(s1, {local, n1(), H / 32});
    return block_scale_interleave(
               bytes_tensor(prepare_rows(s1, local, n1(), H / 32, act == 3), {local, n1(), H / 32}))
        .view({local, n1(), H / 32});
  }
  Tensor scale2(bool shuffle) const {
    if (!shuffle) return bytes_tensor(s2, {local, H, I / 32});
    return block_scale_interleave(
               bytes_tensor(prepare_rows(s2, local, H, I / 32, false), {local, H, I / 32}))
        .view({local, H, I / 32});
  }
  std::optional<Tensor> f32(const std::vector<double>& v) const {
    if (v.empty()) return std::nullopt;
    return Tensor::from_vector(v, {local}, DType::kFloat32);
  }

  Tensor run_routed(const MoeTopkIds& routing, bool shuffle = false, bool block = false) const {
    return trtllm_fp8_block_scale_routed_moe(
        routing, std::nullopt, hidden(), hidden_scale(), gemm1(shuffle, block), scale1(shuffle),
        gemm2(shuffle, block), scale2(shuffle), E, K, std::nullopt, std::nullopt, I, offset, local,
        std::nullopt, 0, shuffle, block ? WeightLayout::BlockMajorK : WeightLayout::MajorK, true,
        std::nullopt, std::nullopt, std::nullopt, 8192, kMx, act, f32(alpha), f32(beta),
        f32(limit));
  }

  // fp64 formula (upstream's run_moe_reference_mxfp8 / run_moe_dequant): exact MXFP8 values,
  // GEMM1, the activation ("up" first in w1), the activation rounded to bf16 and re-quantized
  // by mxfp8_quantize (the library's, the function that reference calls), GEMM2 rounded to
  // bf16, the sum weighted by the bf16-rounded routing weights.
  std::vector<double> expected(const MoeTopkIds& routing) const {
    const auto idv = routing.ids.to_double_vector(), wv = routing.weights->to_double_vector();
    // The combine takes the weights as given: bf16 ones are the routing's, fp32 pairs are not
    // rounded (upstream's launchers take their dtype; session 82).
    const int64_t N1 = n1();
    std::vector<double> out(static_cast<size_t>(T * H), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = static_cast<int64_t>(idv[static_cast<size_t>(t * K + k)]) - offset;
        if (e < 0 || e >= local) continue;
        std::vector<double> g(static_cast<size_t>(N1), 0.0);
        for (int64_t j = 0; j < N1; ++j) {
          for (int64_t d = 0; d < H; ++d) {
            const size_t wi = static_cast<size_t>((e * N1 + j) * H + d);
            g[static_cast<size_t>(j)] +=
                e4m3(x[static_cast<size_t>(t * H + d)]) *
                ue8m0(xs[static_cast<size_t>(t * (H / 32) + d / 32)]) * e4m3(w1[wi]) *
                ue8m0(s1[static_cast<size_t>((e * N1 + j) * (H / 32) + d / 32)]);
          }
        }
        for (int64_t j = 0; j < N1 && !b1.empty(); ++j) {
          g[static_cast<size_t>(j)] += b1[static_cast<size_t>(e * N1 + j)];
        }
        std::vector<double> h(static_cast<size_t>(I));
        for (int64_t j = 0; j < I; ++j) {
          const double up = g[static_cast<size_t>(j)];
          if (act != 3) {  // Relu2
            const double a = std::max(up, 0.0);
            h[static_cast<size_t>(j)] = a * a;
            continue;
          }
          const double gate = g[static_cast<size_t>(I + j)];
          if (alpha.empty()) {
            h[static_cast<size_t>(j)] = silu(gate) * up;
          } else {
            const double gl = std::min(gate, limit[e]);
            const double ul = std::clamp(up, -limit[e], limit[e]) + beta[e];
            h[static_cast<size_t>(j)] = gl / (1.0 + std::exp(-alpha[e] * gl)) * ul;
          }
        }
        for (double& v : h) v = bf16(v);
        auto [q, sf] = mxfp8_quantize(Tensor::from_vector(h, {1, I}, DType::kBFloat16), false);
        const std::vector<double> hq = mxfp8_dequantize_host(q, sf, false).to_double_vector();
        for (int64_t d = 0; d < H; ++d) {
          double y = 0.0;
          for (int64_t j = 0; j < I; ++j) {
            y += hq[static_cast<size_t>(j)] * e4m3(w2[static_cast<size_t>((e * H + d) * I + j)]) *
                 ue8m0(s2[static_cast<size_t>((e * H + d) * (I / 32) + j / 32)]);
          }
          if (!b2.empty()) y += b2[static_cast<size_t>(e * H + d)];
          out[static_cast<size_t>(t * H + d)] += wv[static_cast<size_t>(t * K + k)] * bf16(y);
        }
      }
    }
    return out;
  }
};

// (ids, weights) for every token: distinct experts (t + 3k) mod E, weights w0 / 1 - w0.
MoeTopkIds pair_routing(int64_t T, int64_t E, int64_t K, double w0 = 0.7) {
  std::vector<double> ids, w;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      ids.push_back(static_cast<double>((t + 3 * k) % E));
      w.push_back(k == 0 ? w0 : 1.0 - w0);
    }
  }
  return MoeTopkIds(Tensor::from_vector(ids, {T, K}, DType::kInt32),
                    Tensor::from_vector(w, {T, K}, DType::kFloat32));
}

// Every value exact, worked by hand: x = 1 (scale 2^0), Relu2 (non-gated), w1 = 2^-6 so
// GEMM1 = 128 * 2^-6 = 2 and h = 4 (MXFP8 holds 4 exactly: scale 2^-6, code 256); w2 = 1 with
// scale 2^-9 (even experts) or 2^-8 (odd), so GEMM2 = 128 * 4 * 2^-9 = 1 or 2. Token t routes
// to experts t % 8 and (t + 3) % 8 with weights 0.75 / 0.25, one even and one odd:
// even t: 0.75 * 1 + 0.25 * 2 = 1.25; odd t: 0.75 * 2 + 0.25 * 1 = 1.75.
TEST(TrtllmFp8BlockScaleMoeMxFp8, HandCheckedGolden) {
  const int64_t T = 4, E = 8, K = 2, H = 128, I = 128;
  const uint8_t one = float_to_e4m3fn_bits(1.0f, true);
  const uint8_t w1v = float_to_e4m3fn_bits(0.015625f, true);
  std::vector<uint8_t> s2(static_cast<size_t>(E * H * I / 32));
  for (int64_t e = 0; e < E; ++e) {
    std::fill(s2.begin() + e * H * I / 32, s2.begin() + (e + 1) * H * I / 32,
              static_cast<uint8_t>(e % 2 == 0 ? 118 : 119));
  }
  const Tensor out = trtllm_fp8_block_scale_routed_moe(
      pair_routing(T, E, K, 0.75), std::nullopt,
      bytes_tensor(std::vector<uint8_t>(T * H, one), {T, H}, DType::kFloat8E4M3FN),
      bytes_tensor(std::vector<uint8_t>(T * H / 32, 127), {T, H / 32}),
      bytes_tensor(std::vector<uint8_t>(E * I * H, w1v), {E, I, H}, DType::kFloat8E4M3FN),
      bytes_tensor(std::vector<uint8_t>(E * I * H / 32, 127), {E, I, H / 32}),
      bytes_tensor(std::vector<uint8_t>(E * H * I, one), {E, H, I}, DType::kFloat8E4M3FN),
      bytes_tensor(s2, {E, H, I / 32}), E, K, std::nullopt, std::nullopt, I, 0, E, std::nullopt, 0,
      false, WeightLayout::MajorK, true, std::nullopt, std::nullopt, std::nullopt, 8192, kMx, 6);
  std::vector<double> expect;
  for (int64_t t = 0; t < T; ++t) expect.insert(expect.end(), H, t % 2 == 0 ? 1.25 : 1.75);
  EXPECT_TRUE(all_close(out, expect, {0, 0}));
}

TEST(TrtllmFp8BlockScaleMoeMxFp8, SwigluMatchesFormulaAndPreparedLayouts) {
  for (int64_t offset : {int64_t{0}, int64_t{4}}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    MxCase c;
    c.offset = offset;
    c.local = offset == 0 ? 8 : 4;
    c.make(11 + static_cast<uint64_t>(offset));
    const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
    const Tensor out = c.run_routed(routing);
    EXPECT_EQ(out.dtype(), DType::kBFloat16);
    const auto expect = c.expected(routing);
    EXPECT_GT(max_abs(expect), 0.5);
    EXPECT_TRUE(all_close(out, expect, default_tolerance(DType::kBFloat16)));
    // Upstream's shuffled preparations undo to the same plain weights: the same bits.
    EXPECT_TRUE(all_close(c.run_routed(routing, true), out, {0, 0}));
    EXPECT_TRUE(all_close(c.run_routed(routing, true, true), out, {0, 0}));
  }
}

TEST(TrtllmFp8BlockScaleMoeMxFp8, SwigluParamsAndRelu2MatchFormula) {
  MxCase gated;
  gated.swiglu_params = true;
  gated.make(21);
  const MoeTopkIds routing = pair_routing(gated.T, gated.E, gated.K);
  auto expect = gated.expected(routing);
  EXPECT_GT(max_abs(expect), 0.5);
  EXPECT_TRUE(
      all_close(gated.run_routed(routing, true), expect, default_tolerance(DType::kBFloat16)));
  MxCase relu2;
  relu2.act = 6;
  relu2.make(22);
  expect = relu2.expected(routing);
  EXPECT_GT(max_abs(expect), 0.5);
  EXPECT_TRUE(all_close(relu2.run_routed(routing), expect, default_tolerance(DType::kBFloat16)));
  // Non-gated GEMM1 rows are shuffled without the interleave.
  EXPECT_TRUE(all_close(relu2.run_routed(routing, true), relu2.run_routed(routing), {0, 0}));
}

// Routing from logits (DeepSeekV3, groups, bias, scaling) equals the routed op fed
// fused_topk_deepseek's routing; routing_replay_out receives the ids.
TEST(TrtllmFp8BlockScaleMoeMxFp8, RoutingFromLogitsMatchesRouted) {
  MxCase c;
  c.T = 5;
  c.make(31);
  Tensor logits = rand_tensor({c.T, c.E}, DType::kFloat32, 32, -3.0, 3.0);
  Tensor bias = rand_tensor({c.E}, DType::kFloat32, 33, -0.3, 0.3);
  Tensor replay = Tensor::zeros({c.T, c.K}, DType::kInt16);
  const Tensor out = trtllm_fp8_block_scale_moe(
      logits, bias, c.hidden(), c.hidden_scale(), c.gemm1(true), c.scale1(true), c.gemm2(true),
      c.scale2(true), c.E, c.K, 4, 2, c.I, 0, c.E, 2.5, 2, true, WeightLayout::MajorK, true,
      std::nullopt, 8192, kMx, std::nullopt, 3, true, replay);
  Tensor vals = Tensor::zeros({c.T, c.K}, DType::kFloat32);
  Tensor idx = Tensor::zeros({c.T, c.K}, DType::kInt32);
  fused_topk_deepseek(logits, bias, 4, 2, c.K, 2.5, vals, idx);
  EXPECT_TRUE(all_close(replay.to(DType::kInt32), idx, {0, 0}));
  // bf16 weights, as routing from logits keeps them (fp32 pairs would be taken as given).
  const MoeTopkIds routing(idx, vals.to(DType::kBFloat16));
  EXPECT_TRUE(all_close(out, c.run_routed(routing), {0, 0}));
  EXPECT_TRUE(all_close(out, c.expected(routing), default_tolerance(DType::kBFloat16)));
}

// Upstream 0.7.4's padded dimensions on MXFP8 (docs/MOE.md, "Padded dimensions"): the layer
// padded to H 256 and I 256 (random codes in every padding: weights, scales, the hidden states'
// extra columns) computes the unpadded layer's output bit for bit, plain or in upstream's
// shuffled BlockMajorK layouts, valid_hidden_size wide.
TEST(TrtllmFp8BlockScaleMoeMxFp8, ValidDimsComputeTheUnpaddedLayer) {
  MxCase c;
  c.make(131);
  const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
  const Tensor small = c.run_routed(routing);
  const int64_t Hp = 256, Ip = 256, El = c.local, H = c.H, I = c.I;
  Rng r{132};
  auto any_byte = [&](uint8_t* p) { *p = static_cast<uint8_t>(r.next()); };
  auto finite = [&](uint8_t* p) {
    *p = float_to_e4m3fn_bits(static_cast<float>(r.uniform(-3, 3)), true);
  };
  auto exps = [&](uint8_t* p) { *p = static_cast<uint8_t>(124 + r.next() % 3); };
  using moe_prep::embed;
  const auto rows1 = moe_prep::gated_rows(I, Ip), rows_t = moe_prep::identity_rows(c.T);
  const auto x = embed(c.x, 1, c.T, H, c.T, Hp, rows_t, 1, finite);
  const auto xs = embed(c.xs, 1, c.T, H / 32, c.T, Hp / 32, rows_t, 1, exps);
  const auto w1 = embed(c.w1, El, 2 * I, H, 2 * Ip, Hp, rows1, 1, any_byte);
  const auto s1 = embed(c.s1, El, 2 * I, H / 32, 2 * Ip, Hp / 32, rows1, 1, any_byte);
  const auto rows2 = moe_prep::identity_rows(H);
  const auto w2 = embed(c.w2, El, H, I, H, Ip, rows2, 1, any_byte);
  const auto s2 = embed(c.s2, El, H, I / 32, H, Ip / 32, rows2, 1, any_byte);
  auto run = [&](bool shuffle, int64_t vh, int64_t vi) {
    Tensor a = bytes_tensor(w1, {El, 2 * Ip, Hp}, DType::kFloat8E4M3FN);
    Tensor as = bytes_tensor(s1, {El, 2 * Ip, Hp / 32});
    Tensor b = bytes_tensor(w2, {El, H, Ip}, DType::kFloat8E4M3FN);
    Tensor bs = bytes_tensor(s2, {El, H, Ip / 32});
    if (shuffle) {
      a = bytes_tensor(prepare_rows(w1, El, 2 * Ip, Hp, true, 128), {El, Hp / 128, 2 * Ip, 128},
                       DType::kFloat8E4M3FN);
      b = bytes_tensor(prepare_rows(w2, El, H, Ip, false, 128), {El, Ip / 128, H, 128},
                       DType::kFloat8E4M3FN);
      as = block_scale_interleave(
               bytes_tensor(prepare_rows(s1, El, 2 * Ip, Hp / 32, true), {El, 2 * Ip, Hp / 32}))
               .view({El, 2 * Ip, Hp / 32});
      bs = block_scale_interleave(
               bytes_tensor(prepare_rows(s2, El, H, Ip / 32, false), {El, H, Ip / 32}))
               .view({El, H, Ip / 32});
    }
    return trtllm_fp8_block_scale_routed_moe(
        routing, std::nullopt, bytes_tensor(x, {c.T, Hp}, DType::kFloat8E4M3FN),
        bytes_tensor(xs, {c.T, Hp / 32}), a, as, b, bs, c.E, c.K, std::nullopt, std::nullopt, Ip, 0,
        El, std::nullopt, 0, shuffle, shuffle ? WeightLayout::BlockMajorK : WeightLayout::MajorK,
        true, std::nullopt, std::nullopt, std::nullopt, 8192, kMx, 3, std::nullopt, std::nullopt,
        std::nullopt, vh, vi);
  };
  const Tensor got = run(false, 128, 128);
  ASSERT_EQ(got.shape(), Shape({c.T, H}));
  EXPECT_EQ(testing::bytes_of(got), testing::bytes_of(small));
  EXPECT_EQ(testing::bytes_of(run(true, 128, 97)), testing::bytes_of(small));
  EXPECT_EQ(testing::bytes_of(run(false, 96, 128)), testing::bytes_of(small.slice(1, 0, 96)));
}

// gemm1_bias / gemm2_bias on MXFP8 (upstream 0.7.4; fp32, rows stored as the weights': GEMM1's
// interleaved and shuffled): added to GEMM1's output before the activation and to GEMM2's
// before the routing weights, against the fp64 formula (Renormalize routing from logits, the
// routing taken from routing_replay_out), H = 2 I so that only which argument a bias came in
// tells them apart; upstream's prepared layouts give the same bits.
TEST(TrtllmFp8BlockScaleMoeMxFp8, BiasesMatchFormula) {
  MxCase c;
  c.H = 256;  // GEMM1's rows (2 I) as many as the hidden size: the two biases' widths agree
  c.make(141);
  Rng r{142};
  for (int64_t i = 0; i < c.local * c.n1(); ++i)
    c.b1.push_back(static_cast<float>(r.uniform(-2, 2)));
  for (int64_t i = 0; i < c.local * c.H; ++i) c.b2.push_back(static_cast<float>(r.uniform(-1, 1)));
  const Tensor logits = rand_tensor({c.T, c.E}, DType::kFloat32, 143, -3.0, 3.0);
  Tensor replay = Tensor::zeros({c.T, c.K}, DType::kInt16);
  auto prepared_bias = [&](const std::vector<double>& b, int64_t m, bool interleave, bool shuffle) {
    std::vector<double> out = b;
    if (shuffle) {
      const auto rows = moe_prep::prepared_rows(m, interleave);
      for (int64_t e = 0; e < c.local; ++e) {
        for (int64_t i = 0; i < m; ++i) out[e * m + i] = b[e * m + rows[static_cast<size_t>(i)]];
      }
    }
    return Tensor::from_vector(out, {c.local, m}, DType::kFloat32);
  };
  auto run = [&](bool shuffle) {
    return trtllm_fp8_block_scale_moe(
               logits, std::nullopt, c.hidden(), c.hidden_scale(), c.gemm1(shuffle, shuffle),
               c.scale1(shuffle), c.gemm2(shuffle, shuffle), c.scale2(shuffle), c.E, c.K,
               std::nullopt, std::nullopt, c.I, 0, c.local, std::nullopt, 1, shuffle,
               shuffle ? WeightLayout::BlockMajorK : WeightLayout::MajorK, true, std::nullopt, 8192,
               kMx, std::nullopt, 3, true, replay, std::nullopt, std::nullopt, std::nullopt,
               std::nullopt, std::nullopt, std::nullopt, prepared_bias(c.b1, c.n1(), true, shuffle),
               prepared_bias(c.b2, c.H, false, shuffle))
        .tensors[0];
  };
  const Tensor out = run(false);
  const auto ids = replay.to(DType::kInt32).to_double_vector(), lv = logits.to_double_vector();
  std::vector<double> wts;
  for (int64_t t = 0; t < c.T; ++t) {
    const double l0 = lv[static_cast<size_t>(t * c.E + static_cast<int64_t>(ids[t * c.K]))];
    const double l1 = lv[static_cast<size_t>(t * c.E + static_cast<int64_t>(ids[t * c.K + 1]))];
    const double m = std::max(l0, l1), z = std::exp(l0 - m) + std::exp(l1 - m);
    wts.push_back(bf16(std::exp(l0 - m) / z));
    wts.push_back(bf16(std::exp(l1 - m) / z));
  }
  const MoeTopkIds routing(replay.to(DType::kInt32),
                           Tensor::from_vector(wts, {c.T, c.K}, DType::kFloat32));
  const auto expect = c.expected(routing);
  EXPECT_GT(max_abs(expect), 0.5);
  EXPECT_TRUE(all_close(out, expect, default_tolerance(DType::kBFloat16)));
  EXPECT_EQ(testing::bytes_of(run(true)), testing::bytes_of(out));
}

TEST(TrtllmFp8BlockScaleMoeMxFp8, BadInput) {
  const char* op = "trtllm_fp8_block_scale_moe";
  MxCase c;
  c.T = 3;
  c.make(41);
  Tensor logits = rand_tensor({c.T, c.E}, DType::kFloat32, 42);
  auto call = [&](const Tensor& h, const Tensor& hs, const Tensor& a, const Tensor& as,
                  const Tensor& b, const Tensor& bs, int64_t inter = 128, bool shuffled = false,
                  int64_t act = 3) {
    (void)trtllm_fp8_block_scale_moe(logits, std::nullopt, h, hs, a, as, b, bs, c.E, c.K,
                                     std::nullopt, std::nullopt, inter, 0, c.E, std::nullopt, 1,
                                     shuffled, WeightLayout::MajorK, true, std::nullopt, 8192, kMx,
                                     std::nullopt, act);
  };
  const Tensor x = c.hidden(), xs = c.hidden_scale(), w1 = c.gemm1(false), s1 = c.scale1(false),
               w2 = c.gemm2(false), s2 = c.scale2(false);
  EXPECT_NO_THROW(call(x, xs, w1, s1, w2, s2));
  EXPECT_FI_ERROR(call(bytes_tensor(c.x, {c.T, c.H}), xs, w1, s1, w2, s2), op, "hidden_states");
  // DeepSeek's fp32 [H / 128, T] scales are not MXFP8 scales.
  EXPECT_FI_ERROR(call(x, Tensor::full({1, c.T}, 0.1, DType::kFloat32), w1, s1, w2, s2), op,
                  "hidden_states_scale");
  EXPECT_FI_ERROR(call(x, xs.slice(1, 0, 2), w1, s1, w2, s2), op, "hidden_states_scale");
  EXPECT_FI_ERROR(call(x, xs, bytes_tensor(c.w1, {c.E, 2 * c.I, c.H}), s1, w2, s2), op,
                  "gemm1_weights");
  EXPECT_FI_ERROR(call(x, xs, w1, s1.slice(1, 0, 128), w2, s2), op, "gemm1_weights_scale");
  EXPECT_FI_ERROR(call(x, xs, w1, s1, w2.slice(2, 0, 64), s2), op, "gemm2_weights");
  EXPECT_FI_ERROR(
      call(x, xs, w1, s1, w2, bytes_tensor(c.s2, {c.E, c.H, c.I / 32}, DType::kFloat8E4M3FN)), op,
      "gemm2_weights_scale");
  EXPECT_FI_ERROR(call(x, xs, w1, s1, w2, s2, 64), op, "intermediate_size");
  EXPECT_FI_ERROR(call(x, xs, w1, s1, w2, s2, 128, false, 11), op, "activation_type");
  EXPECT_FI_ERROR(
      (void)trtllm_fp8_block_scale_moe(logits, std::nullopt, x, xs, w1, s1, w2, s2, c.E, c.K,
                                       std::nullopt, std::nullopt, 64, 0, c.E, std::nullopt, 1,
                                       false, WeightLayout::MajorK, false, std::nullopt, 8192, kMx),
      op, "intermediate_size");
  EXPECT_FI_ERROR(
      (void)trtllm_fp8_block_scale_moe(logits, std::nullopt, x, xs, w1, s1, w2, s2, c.E, c.K,
                                       std::nullopt, std::nullopt, 128, 0, c.E, std::nullopt, 1,
                                       false, WeightLayout::MajorMn, true, std::nullopt, 8192, kMx),
      op, "weight_layout");
  EXPECT_FI_ERROR((void)trtllm_fp8_block_scale_moe(
                      logits, std::nullopt, x, xs, w1, s1, w2, s2, c.E, c.K, std::nullopt,
                      std::nullopt, 128, 0, c.E, std::nullopt, 1, false, WeightLayout::MajorK, true,
                      std::nullopt, 8192, Fp8QuantizationType::NoneFp8),
                  op, "fp8_quantization_type");
}

TEST(TrtllmFp8BlockScaleMoeMxFp8, RecordReplay) {
  MxCase c;
  c.T = 3;
  c.make(51);
  // Prepared outside the scope: the preparation makes recorded calls of its own.
  const Tensor logits = rand_tensor({c.T, c.E}, DType::kBFloat16, 52), x = c.hidden(),
               xs = c.hidden_scale(), w1 = c.gemm1(true), s1 = c.scale1(true), w2 = c.gemm2(true),
               s2 = c.scale2(true), w1b = c.gemm1(true, true), w2b = c.gemm2(true, true);
  const MoeTopkIds routing = pair_routing(c.T, c.E, c.K);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    (void)trtllm_fp8_block_scale_moe(logits, std::nullopt, x, xs, w1, s1, w2, s2, c.E, c.K,
                                     std::nullopt, std::nullopt, c.I, 0, c.E, std::nullopt, 1, true,
                                     WeightLayout::MajorK, true, std::nullopt, 8192, kMx);
    (void)trtllm_fp8_block_scale_routed_moe(routing, std::nullopt, x, xs, w1b, s1, w2b, s2, c.E,
                                            c.K, std::nullopt, std::nullopt, c.I, 0, c.E,
                                            std::nullopt, 0, true, WeightLayout::BlockMajorK, true,
                                            std::nullopt, std::nullopt, std::nullopt, 8192, kMx);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& call : calls) {
    SCOPED_TRACE(call.name);
    EXPECT_TRUE(replays_identically(call));
  }
}

// Dumps written by Python in upstream's recorder format (tests/util/upstream_dump_py.h), for the
// calls vLLM makes with MXFP8 MoE: trtllm_fp8_block_scale_moe with every argument by keyword,
// Renormalize routing of bf16 logits, weights prepared as upstream's FP8BlockScaleMoe does for
// MxFp8 (gated interleave of rows and scale rows, shuffle with epilogue_tile_m 128, MajorK;
// scales through shuffle_matrix_sf_a's 128x4 layout), the enum recorded as upstream records it;
// and trtllm_fp8_block_scale_routed_moe with packed topk_ids (expert << 16 | bf16 weight bits).
// Expected outputs computed by torch in fp32 as upstream's reference does (the activation
// re-quantized to MXFP8 by an independent quantizer: scale 2^ceil(log2(amax / 448)), values
// to the nearest e4m3, ties to even). Both replay here and pass.
TEST(TrtllmFp8BlockScaleMoeMxFp8, UpstreamFormatDumpsReplay) {
  const std::string body = R"PY(
import torch.nn.functional as F
torch.manual_seed(0)
CORE = "flashinfer.fused_moe.core"

MOD8 = FIN8[E4M3[FIN8].abs() <= 4]  # e4m3 codes of magnitude at most 4
def fp8_codes(*shape):  # random such codes
    return MOD8[torch.randint(0, len(MOD8), shape)].to(torch.uint8)
MAP32 = [0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
         4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31]
def shuffle_idx(m):  # get_shuffle_matrix_a_row_indices, epilogue_tile_m 128
    idx = torch.empty(m, dtype=torch.long)
    for old in range(m):
        idx[old // 32 * 32 + MAP32[old % 32]] = old
    return idx
def interleave_idx(m):  # reorder_rows_for_gated_act_gemm
    r = torch.arange(m)
    p = torch.empty_like(r)
    p[0::2] = r[: m // 2]
    p[1::2] = r[m // 2:]
    return p
def sf_128x4(sf):  # block_scale_interleave of [m, c] (m % 128 == 0, c % 4 == 0)
    m, c = sf.shape
    return sf.view(m // 128, 4, 32, c // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)
def mx_values(codes, sf):  # e4m3 codes [.., n], ue8m0 [.., n / 32]
    return E4M3[codes.long()] * torch.pow(2.0, sf.float() - 127).repeat_interleave(32, -1)
def mxfp8_qdq(v):  # v: [n] bf16-rounded fp32
    b = v.view(-1, 32)
    amax = b.abs().amax(-1, keepdim=True)
    e = torch.where(amax > 0, torch.ceil(torch.log2(amax / 448.0)), torch.full_like(amax, -127.0))
    sc = torch.pow(2.0, e)
    y = b / sc
    q = POS8[rne(y.abs().clamp(max=448.0), POS8)] * torch.sign(y)
    return (q * sc).reshape(-1)

T, E, H, I, K = 4, 8, 128, 128, 2
logits = torch.randn(T, E).to(torch.bfloat16)
xc = fp8_codes(T, H)
xs = torch.randint(125, 128, (T, H // 32), dtype=torch.int64).to(torch.uint8)
w1c = fp8_codes(E, 2 * I, H)
w2c = fp8_codes(E, H, I)
s1 = torch.randint(122, 125, (E, 2 * I, H // 32), dtype=torch.int64).to(torch.uint8)
s2 = torch.randint(122, 125, (E, H, I // 32), dtype=torch.int64).to(torch.uint8)
p1 = interleave_idx(2 * I)[shuffle_idx(2 * I)]
p2 = shuffle_idx(H)
w1k = torch.stack([w1c[e][p1] for e in range(E)])
w2k = torch.stack([w2c[e][p2] for e in range(E)])
s1k = torch.stack([sf_128x4(s1[e][p1]) for e in range(E)]).reshape(E, 2 * I, H // 32)
s2k = torch.stack([sf_128x4(s2[e][p2]) for e in range(E)]).reshape(E, H, I // 32)
xd = mx_values(xc, xs)
w1d = mx_values(w1c, s1)
w2d = mx_values(w2c, s2)
tv, ti = torch.topk(logits.float(), K, dim=-1)
wts = torch.softmax(tv, -1).bfloat16().float()
def reference(ti, wts):
    out = torch.zeros(T, H)
    for t in range(T):
        for k in range(K):
            e = int(ti[t, k])
            g = xd[t] @ w1d[e].T
            h = mxfp8_qdq((F.silu(g[I:]) * g[:I]).bfloat16().float())
            out[t] += wts[t, k] * (h @ w2d[e].T).bfloat16().float()
    return out.bfloat16()
MXFP8 = {"type": "enum", "name": "Fp8QuantizationType.MxFp8", "value": 2}
record("trtllm_fp8_block_scale_moe", CORE,
       {"kwarg_routing_logits": logits, "kwarg_hidden_states": ("fp8", xc),
        "kwarg_hidden_states_scale": xs, "kwarg_gemm1_weights": ("fp8", w1k),
        "kwarg_gemm1_weights_scale": s1k, "kwarg_gemm2_weights": ("fp8", w2k),
        "kwarg_gemm2_weights_scale": s2k},
       {"kwarg_routing_bias": None, "kwarg_num_experts": E, "kwarg_top_k": K,
        "kwarg_n_group": None, "kwarg_topk_group": None, "kwarg_intermediate_size": I,
        "kwarg_local_expert_offset": 0, "kwarg_local_num_experts": E,
        "kwarg_routed_scaling_factor": None, "kwarg_routing_method_type": 1,
        "kwarg_use_shuffled_weight": True,
        "kwarg_weight_layout": {"type": "enum", "name": "WeightLayout.MajorK", "value": 0},
        "kwarg_fp8_quantization_type": MXFP8, "kwarg_activation_type": 3},
       reference(ti, wts))

# The routed form: experts (t + 3k) mod E with weights 0.625 / 0.375, packed.
ri = torch.tensor([[(t + 3 * k) % E for k in range(K)] for t in range(T)], dtype=torch.int32)
rw = torch.tensor([[0.625, 0.375]] * T)
bits = rw.bfloat16().view(torch.int16).to(torch.int32) & 0xFFFF
record("trtllm_fp8_block_scale_routed_moe", CORE,
       {"kwarg_topk_ids": (ri << 16) | bits, "kwarg_hidden_states": ("fp8", xc),
        "kwarg_hidden_states_scale": xs, "kwarg_gemm1_weights": ("fp8", w1k),
        "kwarg_gemm1_weights_scale": s1k, "kwarg_gemm2_weights": ("fp8", w2k),
        "kwarg_gemm2_weights_scale": s2k},
       {"kwarg_routing_bias": None, "kwarg_num_experts": E, "kwarg_top_k": K,
        "kwarg_n_group": None, "kwarg_topk_group": None, "kwarg_intermediate_size": I,
        "kwarg_local_expert_offset": 0, "kwarg_local_num_experts": E,
        "kwarg_routed_scaling_factor": None, "kwarg_routing_method_type": 1,
        "kwarg_use_shuffled_weight": True, "kwarg_weight_layout": 0,
        "kwarg_fp8_quantization_type": MXFP8, "kwarg_do_finalize": True},
       reference(ri, rw))
)PY";
  if (!run_upstream_dump_script("fi_moe_fp8_mx", body, 2)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
}

// No CUDA kernel: a call on CUDA tensors is refused per call (kUnsupported naming
// hidden_states), so a replay with --device cuda falls back to the CPU.
TEST(TrtllmFp8BlockScaleMoeMxFp8, CudaCallRefused) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  MxCase c;
  c.T = 3;
  c.make(61);
  const Device d = Device::cuda(0);
  try {
    (void)trtllm_fp8_block_scale_routed_moe(
        MoeTopkIds(pair_routing(c.T, c.E, c.K).ids.to(d)), std::nullopt, c.hidden().to(d),
        c.hidden_scale().to(d), c.gemm1(false).to(d), c.scale1(false).to(d), c.gemm2(false).to(d),
        c.scale2(false).to(d), c.E, c.K, std::nullopt, std::nullopt, c.I, 0, c.E, std::nullopt, 0,
        false, WeightLayout::MajorK, true, std::nullopt, std::nullopt, std::nullopt, 8192, kMx);
    ADD_FAILURE() << "expected kUnsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(e.arg(), "hidden_states");
  }
}

// num_fused_shared_experts with MxFp8 (docs/MOE.md, "Fused shared experts"): one shared expert
// (weight row 8 of 9) after DeepSeekV3 routing equals the routed op fed fused_topk_deepseek's
// routing with slot (8, 1.0) appended, bit for bit, and the fp64 formula.
TEST(TrtllmFp8BlockScaleMoeMxFp8, FusedSharedExpert) {
  MxCase c;
  c.T = 5;
  c.local = 9;
  c.make(41);
  const int64_t E = 8, K = 2, T = c.T;
  Tensor logits = rand_tensor({T, E}, DType::kFloat32, 42, -3.0, 3.0);
  Tensor bias = rand_tensor({E}, DType::kFloat32, 43, -0.3, 0.3);
  Tensor replay = Tensor::zeros({T, K}, DType::kInt16);
  const Tensor out = trtllm_fp8_block_scale_moe(
      logits, bias, c.hidden(), c.hidden_scale(), c.gemm1(true), c.scale1(true), c.gemm2(true),
      c.scale2(true), E, K, 4, 2, c.I, 0, E, 2.5, 2, true, WeightLayout::MajorK, true, std::nullopt,
      8192, kMx, 1, 3, true, replay);
  Tensor vals = Tensor::zeros({T, K}, DType::kFloat32), idx = Tensor::zeros({T, K}, DType::kInt32);
  fused_topk_deepseek(logits, bias, 4, 2, K, 2.5, vals, idx);
  EXPECT_TRUE(all_close(replay.to(DType::kInt32), idx, {0, 0}));
  const MoeTopkIds routing = append_shared_slots(idx, vals.to(DType::kBFloat16), E, 1);
  c.E = 9;
  c.K = 3;
  EXPECT_TRUE(all_close(out, c.run_routed(routing, true), {0, 0}));
  EXPECT_TRUE(all_close(out, c.expected(routing), default_tolerance(DType::kBFloat16)));
}

}  // namespace
}  // namespace flashinfer::testing
