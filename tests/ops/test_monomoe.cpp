// flashinfer.fused_moe.monomoe: the scratchpad's size and allocation, the up weights' 8-row pair
// interleave (a formula), mono_moe on a hand-checked two-token case (every step exact by
// construction), its routing rules (ties to the lower expert, NaN / inf logits never chosen),
// interleave_up=False on pre-interleaved weights, a float64 formula on random weights for the
// three routing modes, upstream's checks and messages in its order, and on CUDA the kernel
// against the CPU bit for bit (sm_90; elsewhere refused by name).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "api/device_props.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

constexpr const char* kOp = "mono_moe";
constexpr int64_t kE = 256, kN = 512, kK = 2048;
constexpr DType kF8 = DType::kFloat8E4M3FN;

// The weights of one call: zero except the experts a test fills (a decode step reads only the
// experts it routes to).
struct Weights {
  Tensor wu = Tensor::zeros({kE, 2 * kN, kK}, kF8);
  Tensor su = Tensor::full({kE, 8, 16}, 1.0, DType::kFloat32);
  Tensor wd = Tensor::zeros({kE, kK, kN}, kF8);
  Tensor sd = Tensor::full({kE, 16, 4}, 1.0, DType::kFloat32);
  uint8_t* up(int64_t e, int64_t row) {
    return static_cast<uint8_t*>(wu.data_ptr()) + (e * 2 * kN + row) * kK;
  }
  uint8_t* down(int64_t e, int64_t c) {
    return static_cast<uint8_t*>(wd.data_ptr()) + (e * kK + c) * kN;
  }
  float& s_up(int64_t e, int64_t rb, int64_t kb) {
    return su.data<float>()[(e * 8 + rb) * 16 + kb];
  }
  float& s_down(int64_t e, int64_t cb, int64_t nb) {
    return sd.data<float>()[(e * 16 + cb) * 4 + nb];
  }
};

uint8_t code(double v) { return float_to_e4m3fn_bits(static_cast<float>(v), true); }

Tensor bf16(const std::vector<double>& v, Shape shape) {
  return Tensor::from_vector(v, std::move(shape), DType::kBFloat16);
}

// Logits: 0 everywhere but the listed (expert, value) pairs.
Tensor logits_with(const std::vector<std::vector<std::pair<int, double>>>& per_token) {
  std::vector<double> v(per_token.size() * kE, 0.0);
  for (size_t t = 0; t < per_token.size(); ++t) {
    for (auto [e, x] : per_token[t]) v[t * kE + e] = x;
  }
  return bf16(v, {static_cast<int64_t>(per_token.size()), kE});
}

// The hand-checked construction: every token's x has 448 at K index 0 (its first block's amax:
// the quantizer's multiplier 448 / 448 = 1 and scale 448 * fl(1/448) = 1 exactly) and 256 at
// index 1; an expert's gate rows hold 1.0 and its up rows 7/128 at index 1, with gate scales
// 1/8 and up scales 1, so gate = 256 / 8 = 32 and up = 256 * 7/128 = 14 for every column;
// e^-32 vanishes beside 1, so v = rw * 14 * 32 = 448 rw. With two equal logits rw = 1/2: v = 224,
// re-quantized to 448 with scale 1/2. Down rows hold d(e, c) at n = 0 only: y = 448 d / 2 = 224 d.
double d_of(int64_t e, int64_t c) {
  const double mant = 1.0 + static_cast<double>((c + e) % 8) / 8.0;
  return ((c + e) % 2 ? -1.0 : 1.0) * std::ldexp(mant, -static_cast<int>((c * 7 + e) % 4));
}
void fill_expert(Weights& w, int64_t e) {
  for (int64_t j = 0; j < kN; ++j) {
    w.up(e, j)[1] = code(1.0);
    w.up(e, kN + j)[1] = code(7.0 / 128.0);
  }
  for (int64_t rb = 0; rb < 4; ++rb) w.s_up(e, rb, 0) = 0.125f;
  for (int64_t c = 0; c < kK; ++c) w.down(e, c)[0] = code(d_of(e, c));
}
Tensor hand_x(int64_t M) {
  std::vector<double> v(M * kK, 0.0);
  for (int64_t t = 0; t < M; ++t) v[t * kK] = 448.0, v[t * kK + 1] = 256.0;
  return bf16(v, {M, kK});
}

TEST(MonoMoe, ScratchpadSizeAndAllocation) {
  EXPECT_EQ(get_scratchpad_size_bytes(), 123968);
  EXPECT_TRUE(has_monomoe());
  Tensor s = alloc_scratchpad(Value(std::string("cpu")));
  EXPECT_EQ(s.dtype(), DType::kUInt8);
  ASSERT_EQ(s.shape(), Shape({123968}));
  const uint8_t* b = static_cast<const uint8_t*>(s.data_ptr());
  EXPECT_TRUE(std::all_of(b, b + 123968, [](uint8_t x) { return x == 0; }));
  EXPECT_FI_ERROR(alloc_scratchpad(Value(std::string("tpu"))), "Device", "device");
  EXPECT_FI_ERROR(alloc_scratchpad(std::nullopt), "alloc_scratchpad", "device");
}

TEST(MonoMoe, InterleaveMovesRowsInEightRowPairs) {
  const int64_t E = 2, R = 256, K = 3, N = R / 2;
  std::vector<double> v(E * R * K);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  Tensor w = Tensor::from_vector(v, {E, R, K}, DType::kInt32);
  Tensor out = interleave_for_tma_wgmma_up(w);
  ASSERT_EQ(out.shape(), w.shape());
  const std::vector<double> o = out.to_double_vector();
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t j = 0; j < N; ++j) {
        for (int64_t k = 0; k < K; ++k) {
          const int64_t nr = 16 * (j / 8) + 8 * h + j % 8;
          ASSERT_EQ(o[(e * R + nr) * K + k], v[(e * R + h * N + j) * K + k])
              << e << " " << h << " " << j;
        }
      }
    }
  }
  EXPECT_FI_ERROR(interleave_for_tma_wgmma_up(Tensor::zeros({2, 127, 3}, kF8)),
                  "interleave_for_tma_wgmma_up", "w_fp8");
  EXPECT_FI_ERROR(interleave_for_tma_wgmma_up(Tensor::zeros({2, 96, 3}, kF8)),
                  "interleave_for_tma_wgmma_up", "w_fp8");
  EXPECT_FI_ERROR(interleave_for_tma_wgmma_up(Tensor::zeros({96, 3}, kF8)),
                  "interleave_for_tma_wgmma_up", "w_fp8");
}

// Two tokens, top 2 of equal logits (weights 1/2 each): token 0 to experts 3 and 7, token 1 to
// 7 and 200. out[t, c] = bf16(sum over its experts of 224 d(e, c)), each term exact.
TEST(MonoMoe, HandCheckedTwoTokens) {
  Weights w;
  for (int64_t e : {3, 7, 200}) fill_expert(w, e);
  Tensor logits = logits_with({{{3, 1.0}, {7, 1.0}}, {{7, 2.0}, {200, 2.0}}});
  Tensor out = mono_moe(hand_x(2), logits, w.wu, w.su, w.wd, w.sd, 2);
  ASSERT_EQ(out.shape(), Shape({2, kK}));
  ASSERT_EQ(out.dtype(), DType::kBFloat16);
  const uint16_t* o = out.data<uint16_t>();
  const int64_t experts[2][2] = {{3, 7}, {7, 200}};
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t c = 0; c < kK; ++c) {
      const double want = 224.0 * d_of(experts[t][0], c) + 224.0 * d_of(experts[t][1], c);
      ASSERT_EQ(o[t * kK + c], float_to_bfloat16_bits(static_cast<float>(want)))
          << "token " << t << " column " << c << " want " << want;
    }
  }
  // A given out is written and returned; a given scratchpad (unused on the CPU) is accepted.
  Tensor given = Tensor::zeros({2, kK}, DType::kBFloat16);
  Tensor r = mono_moe(hand_x(2), logits, w.wu, w.su, w.wd, w.sd, 2, "softmax", true, given,
                      alloc_scratchpad(Value(std::string("cpu"))));
  EXPECT_EQ(r.data_ptr(), given.data_ptr());
  EXPECT_TRUE(std::equal(o, o + 2 * kK, given.data<uint16_t>()));
  // Pre-interleaved weights with interleave_up=False: the same bits; the raw ones read as
  // interleaved (gate rows taken for up rows) give another result.
  Tensor wi = interleave_for_tma_wgmma_up(w.wu);
  Tensor same = mono_moe(hand_x(2), logits, wi, w.su, w.wd, w.sd, 2, "softmax", true, std::nullopt,
                         std::nullopt, false);
  EXPECT_TRUE(std::equal(o, o + 2 * kK, same.data<uint16_t>()));
  Tensor wrong = mono_moe(hand_x(2), logits, w.wu, w.su, w.wd, w.sd, 2, "softmax", true,
                          std::nullopt, std::nullopt, false);
  EXPECT_FALSE(std::equal(o, o + 2 * kK, wrong.data<uint16_t>()));
}

// top_k 1 (weight 1, v = 448): equal logits pick the lower expert; NaN and +inf logits are
// -FLT_MAX (never chosen over a finite one); each result is the chosen expert's alone.
TEST(MonoMoe, RoutingTiesToTheLowerExpertAndSkipsNanAndInf) {
  Weights w;
  for (int64_t e : {2, 4, 5, 6, 9}) fill_expert(w, e);
  auto run = [&](const Tensor& logits) {
    Tensor o = mono_moe(hand_x(1), logits, w.wu, w.su, w.wd, w.sd, 1);
    return std::vector<uint16_t>(o.data<uint16_t>(), o.data<uint16_t>() + kK);
  };
  auto alone = [](int64_t e) {
    std::vector<uint16_t> v(kK);
    for (int64_t c = 0; c < kK; ++c)
      v[c] = float_to_bfloat16_bits(static_cast<float>(448.0 * d_of(e, c)));
    return v;
  };
  EXPECT_EQ(run(logits_with({{{9, 3.0}, {4, 3.0}}})), alone(4));
  EXPECT_EQ(run(logits_with({{{9, 3.0}, {4, 2.5}}})), alone(9));
  std::vector<double> lg(kE, 0.0);
  lg[2] = std::nan(""), lg[6] = INFINITY, lg[5] = 0.5;
  EXPECT_EQ(run(bf16(lg, {1, kE})), alone(5));
  // Sigmoid, not renormalized: the weight is sigmoid(x) itself; x = 30 makes it 1.
  Tensor o =
      mono_moe(hand_x(1), logits_with({{{6, 30.0}}}), w.wu, w.su, w.wd, w.sd, 1, "sigmoid", false);
  EXPECT_EQ(std::vector<uint16_t>(o.data<uint16_t>(), o.data<uint16_t>() + kK), alone(6));
}

// A float64 formula of upstream's math on random weights: routing (softmax over all 256, top k
// by probability, renormalized or not; sigmoid), x quantized 1 x 128, the block-scaled GEMMs,
// rw SiLU(gate) up re-quantized in 64-wide groups, the experts summed. Within fp32 and fp8
// rounding of the library's order (an fp8 rounding of the intermediate can flip).
std::vector<double> formula(const Tensor& x, const Tensor& logits, const Weights& w, int64_t top_k,
                            const std::string& scoring, bool renorm) {
  const int64_t M = x.size(0);
  const std::vector<double> xv = x.to_double_vector(), lv = logits.to_double_vector();
  const auto* wu = static_cast<const uint8_t*>(w.wu.data_ptr());
  const auto* wd = static_cast<const uint8_t*>(w.wd.data_ptr());
  const float* su = w.su.data<float>();
  const float* sd = w.sd.data<float>();
  auto f8 = [](uint8_t c) { return static_cast<double>(e4m3fn_bits_to_float(c)); };
  std::vector<double> out(M * kK, 0.0);
  for (int64_t t = 0; t < M; ++t) {
    std::vector<double> score(kE);
    double mx = -1e300, sum = 0.0;
    for (int64_t e = 0; e < kE; ++e) mx = std::max(mx, lv[t * kE + e]);
    for (int64_t e = 0; e < kE; ++e) {
      const double l = lv[t * kE + e];
      score[e] = scoring == "softmax" ? std::exp(l - mx) : 1.0 / (1.0 + std::exp(-l));
      sum += score[e];
    }
    if (scoring == "softmax") {
      for (double& s : score) s /= sum;
    }
    std::vector<int64_t> ids;
    std::vector<double> rw;
    std::vector<bool> taken(kE, false);
    for (int64_t k = 0; k < top_k; ++k) {
      int64_t best = -1;
      for (int64_t e = 0; e < kE; ++e) {
        if (!taken[e] && (best < 0 || score[e] > score[best])) best = e;
      }
      taken[best] = true, ids.push_back(best), rw.push_back(score[best]);
    }
    if (renorm) {
      double s = 0.0;
      for (double r : rw) s += r;
      for (double& r : rw) r /= s;
    }
    std::vector<double> q(kK), xs(16);
    for (int64_t kb = 0; kb < 16; ++kb) {
      double amax = 1e-10;
      for (int64_t i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(xv[t * kK + kb * 128 + i]));
      xs[kb] = amax / 448.0;
      for (int64_t i = 0; i < 128; ++i) {
        q[kb * 128 + i] = f8(code(xv[t * kK + kb * 128 + i] * 448.0 / amax));
      }
    }
    for (int64_t k = 0; k < top_k; ++k) {
      const int64_t e = ids[k];
      std::vector<double> v(kN);
      for (int64_t j = 0; j < kN; ++j) {
        double g = 0.0, u = 0.0;
        for (int64_t kb = 0; kb < 16; ++kb) {
          double dg = 0.0, du = 0.0;
          for (int64_t i = kb * 128; i < kb * 128 + 128; ++i) {
            dg += q[i] * f8(wu[(e * 2 * kN + j) * kK + i]);
            du += q[i] * f8(wu[(e * 2 * kN + kN + j) * kK + i]);
          }
          g += dg * su[(e * 8 + j / 128) * 16 + kb] * xs[kb];
          u += du * su[(e * 8 + 4 + j / 128) * 16 + kb] * xs[kb];
        }
        v[j] = rw[k] * u * g / (1.0 + std::exp(-g));
      }
      std::vector<double> iq(kN), is(8);
      for (int64_t gi = 0; gi < 8; ++gi) {
        double m = 1e-10;
        for (int64_t j = gi * 64; j < gi * 64 + 64; ++j) m = std::max(m, std::fabs(v[j]));
        is[gi] = m / 448.0;
        for (int64_t j = gi * 64; j < gi * 64 + 64; ++j) iq[j] = f8(code(v[j] * 448.0 / m));
      }
      for (int64_t c = 0; c < kK; ++c) {
        double y = 0.0;
        for (int64_t n = 0; n < kN; ++n) {
          y += iq[n] * f8(wd[(e * kK + c) * kN + n]) * is[n / 64] *
               sd[(e * 16 + c / 128) * 4 + n / 128];
        }
        out[t * kK + c] += y;
      }
    }
  }
  return out;
}

TEST(MonoMoe, MatchesTheFormulaOnRandomWeights) {
  const int64_t M = 3, top_k = 3;
  Weights w;
  Tensor x = rand_tensor({M, kK}, DType::kBFloat16, 7, -3.0, 3.0);
  Tensor logits = rand_tensor({M, kE}, DType::kBFloat16, 8, -4.0, 4.0);
  // Random weights for every expert a token could choose (the top 3 by logit).
  const std::vector<double> lv = logits.to_double_vector();
  uint64_t r = 12345;
  auto next = [&r] {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    return r;
  };
  for (int64_t t = 0; t < M; ++t) {
    std::vector<int64_t> order(kE);
    for (int64_t e = 0; e < kE; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return lv[t * kE + a] > lv[t * kE + b]; });
    for (int64_t k = 0; k < top_k; ++k) {
      const int64_t e = order[k];
      uint8_t* u = w.up(e, 0);
      for (int64_t i = 0; i < 2 * kN * kK; ++i)
        u[i] = static_cast<uint8_t>((next() & 0x3F) | (r & 0x80));
      uint8_t* d = w.down(e, 0);
      for (int64_t i = 0; i < kK * kN; ++i)
        d[i] = static_cast<uint8_t>((next() & 0x3F) | (r & 0x80));
      for (int64_t i = 0; i < 8 * 16; ++i)
        w.su.data<float>()[e * 128 + i] = 0.002f * (1 + next() % 8);
      for (int64_t i = 0; i < 16 * 4; ++i)
        w.sd.data<float>()[e * 64 + i] = 0.002f * (1 + next() % 8);
    }
  }
  for (auto [scoring, renorm] :
       {std::pair{std::string("softmax"), true}, std::pair{std::string("softmax"), false},
        std::pair{std::string("sigmoid"), true}, std::pair{std::string("sigmoid"), false}}) {
    Tensor out = mono_moe(x, logits, w.wu, w.su, w.wd, w.sd, top_k, scoring, renorm);
    const std::vector<double> got = out.to_double_vector();
    const std::vector<double> want = formula(x, logits, w, top_k, scoring, renorm);
    double dot = 0, gg = 0, ww = 0, worst = 0, peak = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      dot += got[i] * want[i], gg += got[i] * got[i], ww += want[i] * want[i];
      worst = std::max(worst, std::fabs(got[i] - want[i]));
      peak = std::max(peak, std::fabs(want[i]));
    }
    ASSERT_GT(peak, 0.0) << scoring;
    EXPECT_GT(dot / std::sqrt(gg * ww), 0.9999) << scoring << " renorm " << renorm;
    EXPECT_LT(worst, 0.03 * peak) << scoring << " renorm " << renorm;
  }
}

// Upstream's checks in its order: the shapes (_check_shapes), top_k, scoring_func, the token
// count, then each tensor's device, layout and dtype; ours for out's shape. Tensors of the right
// shape are allocated unwritten (only the checks read them).
TEST(MonoMoe, RefusesBadInputByName) {
  auto e8 = [](Shape s) { return Tensor::empty(std::move(s), kF8); };
  auto f32 = [](Shape s) { return Tensor::empty(std::move(s), DType::kFloat32); };
  auto b16 = [](Shape s) { return Tensor::empty(std::move(s), DType::kBFloat16); };
  const Tensor x = b16({2, kK}), lg = b16({2, kE}), wu = e8({kE, 2 * kN, kK}),
               su = f32({kE, 8, 16});
  const Tensor wd = e8({kE, kK, kN}), sd = f32({kE, 16, 4});
  EXPECT_FI_ERROR(mono_moe(b16({kK}), lg, wu, su, wd, sd, 2), kOp, "activations_in");
  EXPECT_FI_ERROR(mono_moe(x, lg, wu, su, e8({kE, kK}), sd, 2), kOp, "expert_weights_down");
  EXPECT_FI_ERROR(mono_moe(x, lg, e8({kE, kK}), su, wd, sd, 2), kOp, "expert_weights_up");
  EXPECT_FI_ERROR(mono_moe(x, lg, wu, su, e8({64, kK, kN}), sd, 2), kOp, "expert_weights_down");
  EXPECT_FI_ERROR(mono_moe(b16({9, kK}), b16({9, kE}), wu, su, wd, sd, 2), kOp, "activations_in");
  EXPECT_FI_ERROR(mono_moe(b16({2, 1024}), lg, wu, su, wd, sd, 2), kOp, "activations_in");
  EXPECT_FI_ERROR(mono_moe(x, b16({2, 128}), wu, su, wd, sd, 2), kOp, "router_logits");
  EXPECT_FI_ERROR(mono_moe(x, lg, e8({kE, kN, kK}), su, wd, sd, 2), kOp, "expert_weights_up");
  EXPECT_FI_ERROR(mono_moe(x, lg, wu, f32({kE, 4, 16}), wd, sd, 2), kOp, "expert_scales_up");
  EXPECT_FI_ERROR(mono_moe(x, lg, wu, su, wd, f32({kE, 16, 8}), 2), kOp, "expert_scales_down");
  // A shape error comes before a bad top_k, as upstream's decorator checks first.
  EXPECT_FI_ERROR(mono_moe(x, b16({2, 128}), wu, su, wd, sd, 0), kOp, "router_logits");
  EXPECT_FI_ERROR(mono_moe(x, lg, wu, su, wd, sd, 0), kOp, "top_k");
  EXPECT_FI_ERROR(mono_moe(x, lg, wu, su, wd, sd, 9), kOp, "top_k");
  EXPECT_FI_ERROR(mono_moe(x, lg, wu, su, wd, sd, 2, "relu"), kOp, "scoring_func");
  EXPECT_FI_ERROR(mono_moe(b16({0, kK}), b16({0, kE}), wu, su, wd, sd, 2), kOp, "activations_in");
  EXPECT_FI_ERROR(mono_moe(Tensor::empty({2, kK}, DType::kFloat16), lg, wu, su, wd, sd, 2), kOp,
                  "activations_in");
  EXPECT_FI_ERROR(mono_moe(x, lg, Tensor::empty({kE, 2 * kN, kK}, DType::kUInt8), su, wd, sd, 2),
                  kOp, "expert_weights_up");
  EXPECT_FI_ERROR(mono_moe(x, lg, wu, su, wd, Tensor::empty({kE, 16, 4}, DType::kFloat16), 2), kOp,
                  "expert_scales_down");
  EXPECT_FI_ERROR(mono_moe(b16({kK, 2}).transpose(0, 1), lg, wu, su, wd, sd, 2), kOp,
                  "activations_in");
  EXPECT_FI_ERROR(mono_moe(x, lg, wu, su, wd, sd, 2, "softmax", true, b16({1, kK})), kOp, "out");
  EXPECT_FI_ERROR(mono_moe(x, lg, wu, su, wd, sd, 2, "softmax", true, f32({2, kK})), kOp, "out");
  // Every tensor's layout before any dtype, as upstream's launcher: fp16 activations beside
  // non-contiguous logits name the logits.
  EXPECT_FI_ERROR(mono_moe(Tensor::empty({2, kK}, DType::kFloat16), b16({kE, 2}).transpose(0, 1),
                           wu, su, wd, sd, 2),
                  kOp, "router_logits");
  // Upstream's texts.
  auto text = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto has = [](const std::string& s, const char* part) {
    return s.find(part) != std::string::npos ? ::testing::AssertionSuccess()
                                             : ::testing::AssertionFailure() << s;
  };
  EXPECT_TRUE(has(text([&] { mono_moe(b16({kK}), lg, wu, su, wd, sd, 2); }),
                  "activations_in must be [M, K], got 1D"));
  EXPECT_TRUE(has(text([&] {
                    mono_moe(x, lg, wu, su, e8({64, kK, kN}), sd, 2);
                  }),
                  "monomoe: unsupported shape (E=64, N=512, K=2048). This kernel is "
                  "hard-specialized to E=256, N=512, K=2048 only."));
  EXPECT_TRUE(has(text([&] {
                    mono_moe(b16({9, kK}), b16({9, kE}), wu, su, wd, sd, 2);
                  }),
                  "this kernel caps tokens at 8; got M=9"));
  EXPECT_TRUE(has(text([&] {
                    mono_moe(b16({2, 1024}), lg, wu, su, wd, sd, 2);
                  }),
                  "activations K must be 2048, got 1024"));
  EXPECT_TRUE(
      has(text([&] { mono_moe(x, lg, wu, su, wd, sd, 9); }), "top_k must be in [1, 8], got 9"));
  EXPECT_TRUE(has(text([&] { mono_moe(x, lg, wu, su, wd, sd, 2, "relu"); }),
                  "scoring_func must be 'sigmoid' or 'softmax', got 'relu'"));
  EXPECT_TRUE(has(text([&] {
                    mono_moe(b16({0, kK}), b16({0, kE}), wu, su, wd, sd, 2);
                  }),
                  "monomoe_topk: token count M=0 out of range"));
  EXPECT_TRUE(has(text([&] {
                    mono_moe(b16({kK, 2}).transpose(0, 1), lg, wu, su, wd, sd, 2);
                  }),
                  "activations_in must be contiguous"));
  EXPECT_TRUE(has(text([&] {
                    mono_moe(x, lg, wu, su, wd, Tensor::empty({kE, 16, 4}, DType::kFloat16), 2);
                  }),
                  "Inconsistency of Tensor type: expert_scales_down"));
}

Tensor cuda(const Tensor& t) { return t.to(Device::cuda(0)); }
std::vector<uint16_t> bits(const Tensor& t) {
  return std::vector<uint16_t>(t.data<uint16_t>(), t.data<uint16_t>() + t.numel());
}

TEST(MonoMoeCuda, MatchesCpuBitForBitOnSm90ElsewhereRefusedByName) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  Weights w;
  for (int64_t e : {3, 7, 200}) fill_expert(w, e);
  Tensor logits = logits_with({{{3, 1.0}, {7, 1.0}}, {{7, 2.0}, {200, 2.0}}});
  Tensor dx = cuda(hand_x(2)), dl = cuda(logits), dwu = cuda(w.wu), dsu = cuda(w.su),
         dwd = cuda(w.wd), dsd = cuda(w.sd);
  if (api::compute_capability(Device::cuda(0)) != 90) {
    EXPECT_FI_ERROR(mono_moe(dx, dl, dwu, dsu, dwd, dsd, 2), kOp, "activations_in");
    return;
  }
  // The hand-checked case, then random experts under each routing mode, M 1 / 5 / 8, top_k up
  // to 8, on one reused scratchpad (each call writes what it reads).
  Tensor scratch = alloc_scratchpad(Value(std::string("cuda:0")));
  Tensor c = mono_moe(hand_x(2), logits, w.wu, w.su, w.wd, w.sd, 2);
  Tensor g = mono_moe(dx, dl, dwu, dsu, dwd, dsd, 2, "softmax", true, std::nullopt, scratch);
  EXPECT_EQ(g.to(Device::cpu()).to_double_vector(), c.to_double_vector()) << "hand-checked";
  Weights rw;
  uint64_t r = 99;
  auto next = [&r] {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    return r;
  };
  for (int64_t e = 0; e < kE; e += 3) {  // every third expert random, the rest zero
    uint8_t* u = rw.up(e, 0);
    for (int64_t i = 0; i < 2 * kN * kK; ++i) {  // every magnitude up to 448, no NaN code
      const auto c = static_cast<uint8_t>(next());
      u[i] = (c & 0x7F) == 0x7F ? static_cast<uint8_t>(c ^ 1) : c;
    }
    uint8_t* d = rw.down(e, 0);
    for (int64_t i = 0; i < kK * kN; ++i) d[i] = static_cast<uint8_t>((next() & 0x3F) | (r & 0x80));
    for (int64_t i = 0; i < 128; ++i) rw.su.data<float>()[e * 128 + i] = 0.001f * (1 + next() % 8);
    for (int64_t i = 0; i < 64; ++i) rw.sd.data<float>()[e * 64 + i] = 0.001f * (1 + next() % 8);
  }
  Tensor ru = cuda(rw.wu), rsu = cuda(rw.su), rd = cuda(rw.wd), rsd = cuda(rw.sd);
  Tensor ri = interleave_for_tma_wgmma_up(ru);
  int seed = 300;
  for (int64_t M : {1, 5, 8}) {
    for (int64_t top_k : {1, 3, 8}) {
      for (auto [scoring, renorm] :
           {std::pair{std::string("softmax"), true}, std::pair{std::string("softmax"), false},
            std::pair{std::string("sigmoid"), true}, std::pair{std::string("sigmoid"), false}}) {
        Tensor x = rand_tensor({M, kK}, DType::kBFloat16, seed++, -3.0, 3.0);
        Tensor lg = rand_tensor({M, kE}, DType::kBFloat16, seed++, -4.0, 4.0);
        Tensor want = mono_moe(x, lg, rw.wu, rw.su, rw.wd, rw.sd, top_k, scoring, renorm);
        const std::string what = "M " + std::to_string(M) + " top_k " + std::to_string(top_k) +
                                 " " + scoring + (renorm ? " renorm" : "");
        // Pre-interleaved weights on the first token count, the raw ones on the others.
        const bool pre = M == 1;
        Tensor got = mono_moe(cuda(x), cuda(lg), pre ? ri : ru, rsu, rd, rsd, top_k, scoring,
                              renorm, std::nullopt, scratch, !pre);
        EXPECT_EQ(bits(got.to(Device::cpu())), bits(want)) << what;
      }
    }
  }
  // NaN and inf: NaN / +-inf logits (a row with fewer finite logits than top_k), an inf and a
  // NaN activation, a NaN weight code, inf / NaN down scales: the CPU's bits, NaNs included.
  {
    std::vector<double> lg(2 * kE);
    for (int64_t i = 0; i < kE; ++i) lg[i] = static_cast<double>((i * 37) % 11) - 5.0;
    for (int64_t e = 0; e < kE; ++e) lg[kE + e] = e % 3 == 0 ? -INFINITY : std::nan("");
    lg[kE + 9] = INFINITY, lg[kE + 12] = 1.0;
    std::vector<double> xv(2 * kK, 0.5);
    xv[5] = INFINITY, xv[kK + 700] = std::nan("");
    rw.up(0, 3)[17] = 0x7F;
    rw.s_down(3, 2, 1) = INFINITY, rw.s_down(6, 5, 0) = std::nanf("");
    Tensor x = bf16(xv, {2, kK}), l = bf16(lg, {2, kE});
    for (int64_t top_k : {1, 4}) {
      Tensor want = mono_moe(x, l, rw.wu, rw.su, rw.wd, rw.sd, top_k);
      Tensor got = mono_moe(cuda(x), cuda(l), cuda(rw.wu), cuda(rw.su), cuda(rw.wd), cuda(rw.sd),
                            top_k, "softmax", true, std::nullopt, scratch);
      EXPECT_EQ(bits(got.to(Device::cpu())), bits(want)) << "NaN / inf, top_k " << top_k;
    }
  }
  // A scratchpad smaller than the kernels' share is refused by name.
  EXPECT_FI_ERROR(mono_moe(dx, dl, dwu, dsu, dwd, dsd, 2, "softmax", true, std::nullopt,
                           Tensor::zeros({1000}, DType::kUInt8, Device::cuda(0))),
                  kOp, "scratchpad");
}

}  // namespace
}  // namespace flashinfer::testing
