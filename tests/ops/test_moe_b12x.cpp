// The Blackwell CuTe-DSL MoE wrappers (b12x_fused_moe, B12xMoEWrapper, CuteDslMoEWrapper):
// fp64 formulas (8 experts, top-2), the wrappers against the functions, bad input naming the
// argument, in-memory record/replay, and a dump in upstream's format written by torch with the
// engines' keyword arguments (__init__ and run records sharing self_id).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/replay.h"
#include "ops/moe_cute_test_util.h"
#include "ops/moe_fp4_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

namespace flashinfer::testing {
namespace {

using moe_cute_test::e2m1;
using moe_fp4::bytes_tensor;
using moe_fp4::e4m3_codes;
using moe_fp4::random_bytes;
using moe_fp4::Rng;

// The e2m1 value nearest to v (ties to the even code), saturating at 6: the grid written out.
float e2m1_round(float v) {
  static const float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float a = std::min(std::fabs(v), 6.0f);
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const float d = std::fabs(a - kGrid[c]), db = std::fabs(a - kGrid[best]);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return std::signbit(v) ? -kGrid[best] : kGrid[best];
}

// b12x's reference quantize-dequantize (moe_reference_f32, quantize_vec_to_fp4_dequant), in
// fp32 as torch computes it: per 16 values, sf = e4m3(min(amax * gs / 6, 448)), q = e2m1(v /
// max(sf / gs, 1e-30)), v' = q * sf.
std::vector<double> qdq_keep_scale(const std::vector<double>& v, float gs) {
  std::vector<double> out(v.size());
  for (size_t b = 0; b < v.size(); b += 16) {
    float amax = 0.0f;
    for (size_t i = b; i < b + 16; ++i) amax = std::max(amax, std::fabs(static_cast<float>(v[i])));
    const float sf = e4m3fn_bits_to_float(float_to_e4m3fn_bits(std::min(amax * gs / 6.0f, 448.0f)));
    const float d = std::max(sf / gs, 1e-30f);
    for (size_t i = b; i < b + 16; ++i) out[i] = e2m1_round(static_cast<float>(v[i]) / d) * sf;
  }
  return out;
}

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// ---- one MoE problem: plain NVFP4 weights, per-expert alphas, routing ------------------------

// The problem's data and prepared tensors: moe_cute_test::Nvfp4MoeData. MoeCase adds the b12x /
// w4a4 formulas.
struct MoeCase : moe_cute_test::Nvfp4MoeData {
  // fp64 GEMMs over the dequantized operands. b12x (launch_sm120_moe): x quantized per expert
  // with gs1 (per local expert or one value) and GEMM1's alpha w1_alpha * gs1, or, gs1 empty,
  // with w1_alpha as both; the activation rounded to bf16, then quantized with gs2. cute: NVFP4 x
  // as given, the fp32 activation quantized with gs2. Both keep the global scale in the values.
  // act_alpha/beta/limit: the SwiGLU parameters (the cute wrapper's, b12x's
  // swigluoai_uninterleave). gelu_tanh: gate * 0.5 * (1 + tanh(0.7978845608 (gate + 0.044715
  // gate^3))) * up instead.
  std::vector<double> expected(const std::vector<float>& gs1, const std::vector<float>& gs2,
                               double sw_alpha = 1.0, double sw_beta = 0.0,
                               double sw_limit = 3.4e38, bool gelu_tanh = false,
                               double situ_b = 0.0, double situ_lb = 0.0) const {
    const int64_t N1 = n1();
    std::vector<double> out(static_cast<size_t>(T * H), 0.0);
    auto pick = [](const std::vector<float>& g, int64_t e) {
      return g.empty() ? 1.0f : g[g.size() == 1 ? 0 : static_cast<size_t>(e)];
    };
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = static_cast<int64_t>(ids[static_cast<size_t>(t * K + k)]) - offset;
        if (e < 0 || e >= local) continue;
        std::vector<double> xr(static_cast<size_t>(H));
        for (int64_t d = 0; d < H; ++d) {
          xr[static_cast<size_t>(d)] =
              cute ? e2m1(xq, static_cast<size_t>(t * H + d)) *
                         e4m3fn_bits_to_float(xs[static_cast<size_t>(t * (H / 16) + d / 16)])
                   : x[static_cast<size_t>(t * H + d)];
        }
        double alpha1 = a1[static_cast<size_t>(e)];
        if (!cute) {
          const float a1f = static_cast<float>(alpha1);
          const float gx = gs1.empty() ? a1f : pick(gs1, e);
          if (!gs1.empty()) alpha1 = a1f * gx;  // the fold, an fp32 product
          xr = qdq_keep_scale(xr, gx);
        }
        std::vector<double> g(static_cast<size_t>(N1), 0.0);
        for (int64_t j = 0; j < N1; ++j) {
          for (int64_t d = 0; d < H; ++d) {
            const size_t wi = static_cast<size_t>((e * N1 + j) * H + d);
            g[static_cast<size_t>(j)] +=
                xr[static_cast<size_t>(d)] * e2m1(w1, wi) * e4m3fn_bits_to_float(s1[wi / 16]);
          }
          g[static_cast<size_t>(j)] *= alpha1;
        }
        std::vector<double> h(static_cast<size_t>(I));
        for (int64_t j = 0; j < I; ++j) {
          if (gated && situ_b > 0.0) {  // SiTU: up' * beta * tanh(gate / beta) * sigmoid(gate)
            const double gate = g[static_cast<size_t>(I + j)];
            // situ_lb 0: no linear beta, up unclamped (the w4a4 epilogue without the clamp).
            const double up = situ_lb > 0.0
                                  ? situ_lb * std::tanh(g[static_cast<size_t>(j)] / situ_lb)
                                  : g[static_cast<size_t>(j)];
            h[static_cast<size_t>(j)] =
                up * situ_b * std::tanh(gate / situ_b) / (1.0 + std::exp(-gate));
          } else if (gated && gelu_tanh) {
            const double gate = g[static_cast<size_t>(I + j)];
            const double z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate);
            h[static_cast<size_t>(j)] =
                gate * 0.5 * (1.0 + std::tanh(z)) * g[static_cast<size_t>(j)];
          } else if (gated) {  // up (linear) rows [0, I), gate rows [I, 2I)
            const double gate = std::min(g[static_cast<size_t>(I + j)], sw_limit);
            const double lin = std::clamp(g[static_cast<size_t>(j)], -sw_limit, sw_limit);
            h[static_cast<size_t>(j)] = gate / (1.0 + std::exp(-sw_alpha * gate)) * (lin + sw_beta);
          } else {
            const double v = std::max(g[static_cast<size_t>(j)], 0.0);
            h[static_cast<size_t>(j)] = v * v;
          }
        }
        if (!cute) {
          for (double& v : h)
            v = bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(v)));
        }
        h = qdq_keep_scale(h, pick(gs2, e));
        for (int64_t d = 0; d < H; ++d) {
          double y = 0.0;
          for (int64_t j = 0; j < I; ++j) {
            const size_t wi = static_cast<size_t>((e * H + d) * I + j);
            y += h[static_cast<size_t>(j)] * e2m1(w2, wi) * e4m3fn_bits_to_float(s2[wi / 16]);
          }
          out[static_cast<size_t>(t * H + d)] +=
              rw[static_cast<size_t>(t * K + k)] * a2[static_cast<size_t>(e)] * y;
        }
      }
    }
    return out;
  }
};

Tensor floats(const std::vector<float>& v) {
  std::vector<double> d(v.begin(), v.end());
  return Tensor::from_vector(d, {static_cast<int64_t>(v.size())}, DType::kFloat32);
}

// ---- b12x_fused_moe ---------------------------------------------------------------------------

// The activation quantization rounds to e2m1 as upstream's fp4_quantize_values_torch does
// ("kernel-matching tie-breaking", flashinfer/fused_moe/cute_dsl/utils.py): every midpoint goes
// to the even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4) and
// magnitudes above 6 saturate. Hand-checked against that function's interval table.
TEST(B12xFusedMoe, E2m1TieRuleIsUpstreams) {
  const float in[] = {0.25f, 0.26f, 0.75f, 1.25f, 1.3f,   1.75f, 2.5f, 2.6f,
                      3.5f,  5.0f,  5.1f,  7.0f,  -0.75f, -2.5f, -5.0f};
  const float want[] = {0.0f, 0.5f, 1.0f, 1.0f, 1.5f,  2.0f,  2.0f, 3.0f,
                        4.0f, 4.0f, 6.0f, 6.0f, -1.0f, -2.0f, -4.0f};
  for (size_t i = 0; i < std::size(in); ++i) {
    EXPECT_EQ(e2m1_bits_to_float(float_to_e2m1_bits(in[i])), want[i]) << "x = " << in[i];
  }
}

TEST(B12xFusedMoe, MatchesFormula) {
  struct Variant {
    const char* name;
    bool gated, six_d;
    std::vector<float> gs1, gs2;
  };
  for (const Variant& v : {Variant{"silu, input_global_scale given", true, true, {2.0f}, {1.0f}},
                           Variant{"silu, per-expert scales",
                                   true,
                                   false,
                                   {1.0f, 0.5f, 2.0f, 1.0f, 0.25f, 1.0f, 4.0f, 1.0f},
                                   {2.0f, 1.0f, 0.5f, 1.0f, 1.0f, 4.0f, 1.0f, 0.5f}},
                           Variant{"relu2, no input_global_scale", false, true, {}, {0.5f}}}) {
    SCOPED_TRACE(v.name);
    MoeCase c;
    c.gated = v.gated;
    c.six_d = v.six_d;
    c.make(7);
    const auto expect = c.expected(v.gs1, v.gs2);
    EXPECT_GT(max_abs(expect), 0.5);
    const Tensor out = b12x_fused_moe(
        c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(), c.rw_t(), c.E, c.K,
        c.alpha(c.a1), c.alpha(c.a2), floats(v.gs2),
        v.gs1.empty() ? std::nullopt : std::optional<Tensor>(floats(v.gs1)), std::nullopt,
        std::nullopt, std::nullopt, DType::kBFloat16, v.gated ? "silu" : "relu2");
    EXPECT_EQ(out.dtype(), DType::kBFloat16);
    EXPECT_TRUE(all_close(out, expect, default_tolerance(DType::kBFloat16)));
  }
}

// A negative expert id is an unrouted slot (upstream 0.7.4: CUDA-graph padding contributes
// nothing; a token whose slots are all negative gets a zero row). Before session 86: refused.
TEST(B12xFusedMoe, NegativeIdsAreUnroutedSlots) {
  MoeCase c;
  c.gated = true;
  c.six_d = true;
  c.make(9);
  c.ids[0] = -1;                         // token 0: one slot unrouted
  c.ids[static_cast<size_t>(c.K)] = -1;  // token 1: every slot unrouted
  for (int64_t k = 1; k < c.K; ++k) c.ids[static_cast<size_t>(c.K + k)] = -7;
  const auto expect = c.expected({2.0f}, {1.0f});
  const Tensor out =
      b12x_fused_moe(c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(), c.rw_t(), c.E,
                     c.K, c.alpha(c.a1), c.alpha(c.a2), floats({1.0f}), floats({2.0f}),
                     std::nullopt, std::nullopt, std::nullopt, DType::kBFloat16, "silu");
  EXPECT_GT(max_abs(expect), 0.5);
  EXPECT_TRUE(all_close(out, expect, default_tolerance(DType::kBFloat16)));
  const auto ov = out.to_double_vector();
  for (int64_t d = 0; d < c.H; ++d) EXPECT_EQ(ov[static_cast<size_t>(c.H + d)], 0.0) << d;
}

// The other activations of the SM12x kernels (gated_activation_f32 in moe_activation.py of the
// 0.7.2.post1 wheel): gelu_tanh and swigluoai_uninterleave read the gate from rows [I, 2I) like
// silu; swigluoai takes swiglu_alpha / beta / limit (None: no clamp), the others ignore them.
TEST(B12xFusedMoe, OtherActivationsMatchFormula) {
  struct Variant {
    const char* name;
    const char* act;
    double alpha, beta;
    std::optional<double> limit;
  };
  for (const Variant& v :
       {Variant{"gelu_tanh", "gelu_tanh", 1.702, 1.0, std::nullopt},
        Variant{"swigluoai, limit 0.75", "swigluoai_uninterleave", 1.702, 1.0, 0.75},
        Variant{"swigluoai, no limit, alpha 0.5, beta -0.25", "swigluoai_uninterleave", 0.5, -0.25,
                std::nullopt}}) {
    SCOPED_TRACE(v.name);
    MoeCase c;
    c.make(23);
    const bool gelu = std::string(v.act) == "gelu_tanh";
    const std::vector<float> gs1{2.0f}, gs2{1.0f};
    const auto expect = gelu ? c.expected(gs1, gs2, 1.0, 0.0, 3.4e38, true)
                             : c.expected(gs1, gs2, v.alpha, v.beta, v.limit.value_or(3.4e38));
    EXPECT_GT(max_abs(expect), 0.5);
    const Tensor out = b12x_fused_moe(c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(),
                                      c.rw_t(), c.E, c.K, c.alpha(c.a1), c.alpha(c.a2), floats(gs2),
                                      floats(gs1), std::nullopt, std::nullopt, std::nullopt,
                                      DType::kBFloat16, v.act, v.alpha, v.beta, v.limit);
    EXPECT_TRUE(all_close(out, expect, default_tolerance(DType::kBFloat16)));
    // The wrapper keeps the activation and its parameters.
    B12xMoEWrapper w(c.E, c.K, c.H, c.I, false, 4096, std::nullopt, std::nullopt, DType::kBFloat16,
                     "cuda", v.act, v.alpha, v.beta, v.limit);
    const Tensor got = w.run(c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(),
                             c.rw_t(), c.alpha(c.a1), c.alpha(c.a2), floats(gs2), floats(gs1));
    EXPECT_TRUE(all_close(got, out.to_double_vector(), {0.0, 0.0}));
  }
  // The clamp matters for this data (else the limit case above proves nothing).
  MoeCase c;
  c.make(23);
  const auto clamped = c.expected({2.0f}, {1.0f}, 1.702, 1.0, 0.75);
  const auto unclamped = c.expected({2.0f}, {1.0f}, 1.702, 1.0);
  double diff = 0.0;
  for (size_t i = 0; i < unclamped.size(); ++i)
    diff = std::max(diff, std::abs(unclamped[i] - clamped[i]));
  EXPECT_GT(diff, 0.1);
}

// A swiglu_limit with relu2 is dropped by launch_sm120_moe's kernels (only gated activations read
// it; the normalizer that raises is reached only after the launcher cleared it), so it changes
// nothing.
TEST(B12xFusedMoe, SwigluLimitIgnoredWithRelu2) {
  MoeCase c;
  c.gated = false;
  c.make(19);
  const Tensor gs2 = floats({0.5f});
  const Tensor plain =
      b12x_fused_moe(c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(), c.rw_t(), c.E,
                     c.K, c.alpha(c.a1), c.alpha(c.a2), gs2, std::nullopt, std::nullopt,
                     std::nullopt, std::nullopt, DType::kBFloat16, "relu2");
  const Tensor limited =
      b12x_fused_moe(c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(), c.rw_t(), c.E,
                     c.K, c.alpha(c.a1), c.alpha(c.a2), gs2, std::nullopt, std::nullopt,
                     std::nullopt, std::nullopt, DType::kBFloat16, "relu2", 0.5, 0.0, 0.01);
  EXPECT_TRUE(all_close(limited, plain.to_double_vector(), {0.0, 0.0}));
}

// launch_sm120_moe (moe_dispatch.py upstream): input_global_scale, when given, is x's NVFP4
// global scale and is folded into GEMM1's alpha (w1_alpha * input_global_scale); absent,
// w1_alpha itself is x's global scale. So w1_alpha = a without input_global_scale is, bit for
// bit, w1_alpha = 1 with input_global_scale = a (both: x scale a, GEMM1 alpha a).
TEST(B12xFusedMoe, InputGlobalScaleIsUpstreams) {
  MoeCase c;
  c.make(13);
  const std::vector<double> ones(static_cast<size_t>(c.E), 1.0);
  std::vector<float> a1f(c.a1.begin(), c.a1.end());
  const Tensor gs2 = floats({1.0f});
  const Tensor absent =
      b12x_fused_moe(c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(), c.rw_t(), c.E,
                     c.K, c.alpha(c.a1), c.alpha(c.a2), gs2, std::nullopt);
  const Tensor folded =
      b12x_fused_moe(c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(), c.rw_t(), c.E,
                     c.K, c.alpha(ones), c.alpha(c.a2), gs2, floats(a1f));
  EXPECT_TRUE(all_close(absent, folded.to_double_vector(), {0.0, 0.0}));
  // The previous reading (x scale 1 when absent, no fold) gives a different result.
  const Tensor unit =
      b12x_fused_moe(c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(), c.rw_t(), c.E,
                     c.K, c.alpha(c.a1), c.alpha(c.a2), gs2, floats({1.0f}));
  const auto a = absent.to_double_vector(), u = unit.to_double_vector();
  double diff = 0.0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - u[i]));
  EXPECT_GT(diff, 0.1);
}

// The b12x kernels round the activation to bf16 before its NVFP4 quantization (FC1 epilogue of
// moe_static_kernel.py: `acc_vec.to(cutlass.BFloat16)` into shared memory, then quantized;
// upstream's moe_reference_nvfp4 does the same). Hand-checked: relu2, one expert, x = 1 (64
// values), an input_global_scale of 1: sf = e4m3(1/6) = 0.171875, x' = 6 * sf = 1.03125, GEMM1 rows
// of e2m1 1.0 with scales 1 and 0.9375 give 66 and 61.875; alpha 0.038355 makes h0 = 6.40814 and h1
// = 5.63215 (fp32). bf16: 6.40625 and 5.625. Block scale e4m3(6.40625 / 6) = 1.125, so h1 quantizes
// to e2m1(5.625 / 1.125 = 5, a tie) = 4 -> 4.5; unrounded, 5.0064 -> 6 -> 6.75. GEMM2 reads only
// column 1 (e2m1 1.0, scale 1): every output is 4.5.
TEST(B12xFusedMoe, ActivationRoundedToBf16BeforeQuantization) {
  MoeCase c;
  c.T = 1;
  c.E = 1;
  c.K = 1;
  c.H = 64;
  c.I = 16;
  c.local = 1;
  c.gated = false;
  c.x.assign(64, 1.0);
  c.w1.assign(16 * 32, 0);
  for (int i = 0; i < 64; ++i) c.w1[static_cast<size_t>(i)] = 0x22;  // rows 0, 1: e2m1 1.0
  c.s1.assign(16 * 4, 0x38);                                         // e4m3 1.0
  for (int i = 4; i < 8; ++i) c.s1[static_cast<size_t>(i)] = 0x37;   // row 1: e4m3 0.9375
  c.w2.assign(64 * 8, 0);
  for (int d = 0; d < 64; ++d) c.w2[static_cast<size_t>(d * 8)] = 0x20;  // column 1: 1.0
  c.s2.assign(64, 0x38);
  c.a1 = {static_cast<double>(0.038355f)};
  c.a2 = {1.0};
  c.ids = {0.0};
  c.rw = {1.0};
  const Tensor out =
      b12x_fused_moe(c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(), c.rw_t(), 1, 1,
                     c.alpha(c.a1), c.alpha(c.a2), floats({1.0f}), floats({1.0f}), std::nullopt,
                     std::nullopt, std::nullopt, DType::kBFloat16, "relu2");
  EXPECT_TRUE(all_close(out, std::vector<double>(64, 4.5), {0.0, 0.0}));
}

// swiglu_limit / swiglu_alpha / swiglu_beta reach only "swigluoai_uninterleave" in the SM12x
// kernels (gated_activation_f32, moe_activation.py upstream): with "silu" they change nothing.
TEST(B12xFusedMoe, SwigluParametersDoNotChangeSilu) {
  MoeCase c;
  c.make(17);
  const Tensor gs2 = floats({1.0f});
  const Tensor plain = b12x_fused_moe(c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(),
                                      c.rw_t(), c.E, c.K, c.alpha(c.a1), c.alpha(c.a2), gs2);
  const Tensor limited =
      b12x_fused_moe(c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(), c.rw_t(), c.E,
                     c.K, c.alpha(c.a1), c.alpha(c.a2), gs2, std::nullopt, std::nullopt,
                     std::nullopt, std::nullopt, DType::kBFloat16, "silu", 1.702, 1.0, 0.5);
  EXPECT_TRUE(all_close(limited, plain.to_double_vector(), {0.0, 0.0}));
}

TEST(B12xFusedMoe, WrapperMatchesFunctionAndOutputArgument) {
  MoeCase c;
  c.make(9);
  const Tensor gs2 = floats({0.5f});
  const Tensor ref = b12x_fused_moe(c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(),
                                    c.rw_t(), c.E, c.K, c.alpha(c.a1), c.alpha(c.a2), gs2);
  B12xMoEWrapper w(c.E, c.K, c.H, c.I, true, 16);
  EXPECT_EQ(w.quant_mode(), "nvfp4");
  const Tensor got = w.run(c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(), c.rw_t(),
                           c.alpha(c.a1), c.alpha(c.a2), gs2);
  EXPECT_TRUE(all_close(got, ref.to_double_vector(), {0.0, 0.0}));
  Tensor out = Tensor::full({c.T, c.H}, 9.0, DType::kBFloat16);
  const Tensor r2 =
      b12x_fused_moe(c.x_bf16(), c.w1_t(), c.s1_t(), c.w2_t(), c.s2_t(), c.ids_t(), c.rw_t(), c.E,
                     c.K, c.alpha(c.a1), c.alpha(c.a2), gs2, std::nullopt, c.E, std::nullopt, out);
  EXPECT_EQ(r2.data_ptr(), out.data_ptr());
  EXPECT_TRUE(all_close(out, ref.to_double_vector(), {0.0, 0.0}));
  // activation_precision "fp4" and quant_mode "w4a4" are spellings of "nvfp4".
  EXPECT_EQ(
      B12xMoEWrapper(c.E, c.K, c.H, c.I, false, 4096, std::nullopt, std::nullopt, DType::kBFloat16,
                     "cuda", "silu", 1.702, 1.0, std::nullopt, "bf16", "w4a4")
          .quant_mode(),
      "nvfp4");
  EXPECT_EQ(B12xMoEWrapper(c.E, c.K, c.H, c.I, false, 4096, std::nullopt, std::nullopt,
                           DType::kBFloat16, "cuda", "silu", 1.702, 1.0, std::nullopt, "bf16")
                .quant_mode(),
            "w4a16");
}

TEST(B12xFusedMoe, BadInput) {
  const char* op = "b12x_fused_moe";
  MoeCase c;
  c.make(11);
  const Tensor gs = floats({1.0f});
  struct In {
    Tensor x, w1, s1, w2, s2, ids, rw, a1, a2;
    std::optional<Tensor> fc2, igs, output;
  };
  const In good{c.x_bf16(), c.w1_t(),      c.s1_t(),      c.w2_t(), c.s2_t(),     c.ids_t(),
                c.rw_t(),   c.alpha(c.a1), c.alpha(c.a2), gs,       std::nullopt, std::nullopt};
  auto call = [&](const In& a, std::optional<int64_t> local = std::nullopt,
                  DType od = DType::kBFloat16, std::string act = "silu",
                  std::optional<double> limit = std::nullopt, std::string prec = "fp4",
                  std::optional<std::string> qm = std::nullopt) {
    (void)b12x_fused_moe(a.x, a.w1, a.s1, a.w2, a.s2, a.ids, a.rw, c.E, c.K, a.a1, a.a2, a.fc2,
                         a.igs, local, std::nullopt, a.output, od, act, 1.702, 1.0, limit, prec,
                         qm);
  };
  auto with = [&](auto f) {
    In a = good;
    f(a);
    return a;
  };
  EXPECT_FI_ERROR(call(with([](In& a) { a.x = a.x.to(DType::kFloat16); })), op, "x");
  EXPECT_FI_ERROR(call(with([&](In& a) {
                    a.w1 = Tensor::zeros({8, 100, 64}, DType::kUInt8);
                  })),
                  op, "w1_weight");
  EXPECT_FI_ERROR(call(with([](In& a) { a.s1 = Tensor::zeros({100}, DType::kUInt8); })), op,
                  "w1_weight_sf");
  EXPECT_FI_ERROR(call(with([](In& a) {
                    a.w2 = Tensor::zeros({8, 128, 16}, DType::kUInt8);
                  })),
                  op, "w2_weight");
  EXPECT_FI_ERROR(call(with([](In& a) { a.s2 = Tensor::zeros({7}, DType::kUInt8); })), op,
                  "w2_weight_sf");
  EXPECT_FI_ERROR(call(with([](In& a) { a.a1 = Tensor::zeros({3}, DType::kFloat32); })), op,
                  "w1_alpha");
  EXPECT_FI_ERROR(call(with([](In& a) { a.a2 = Tensor::zeros({8}, DType::kBFloat16); })), op,
                  "w2_alpha");
  EXPECT_FI_ERROR(call(with([](In& a) { a.fc2 = std::nullopt; })), op, "fc2_input_scale");
  EXPECT_FI_ERROR(call(with([](In& a) { a.igs = Tensor::zeros({3}, DType::kFloat32); })), op,
                  "input_global_scale");
  EXPECT_FI_ERROR(call(with([](In& a) {
                    a.ids = Tensor::full({5, 2}, 8.0, DType::kInt32);
                  })),
                  op, "token_selected_experts");
  EXPECT_FI_ERROR(call(with([](In& a) {
                    a.rw = Tensor::zeros({5, 3}, DType::kFloat32);
                  })),
                  op, "token_final_scales");
  EXPECT_FI_ERROR(call(with([](In& a) {
                    a.output = Tensor::zeros({5, 128}, DType::kFloat32);
                  })),
                  op, "output");
  EXPECT_FI_ERROR(call(good, std::nullopt, DType::kFloat16), op, "output_dtype");
  // Expert parallelism: upstream 0.7.4 runs it for quant_mode "w4a16" only (with expert_map).
  EXPECT_FI_ERROR_CODE(call(good, 4), op, "quant_mode", ErrorCode::kUnsupported);
  // Outside SUPPORTED_MOE_ACTIVATIONS: upstream's ValueError.
  EXPECT_FI_ERROR_CODE(call(good, std::nullopt, DType::kBFloat16, "swigluoai"), op, "activation",
                       ErrorCode::kInvalidArgument);
  EXPECT_FI_ERROR(call(good, std::nullopt, DType::kBFloat16, "silu", std::nullopt, "fp8"), op,
                  "activation_precision");
  // "bf16" (w4a16) runs since session 15 (tests/ops/test_moe_b12x_w4a16.cpp); w4a8_* do not.
  EXPECT_FI_ERROR_CODE(
      call(good, std::nullopt, DType::kBFloat16, "silu", std::nullopt, "fp4", "w4a8_mx"), op,
      "quant_mode", ErrorCode::kUnsupported);
  EXPECT_FI_ERROR(call(good, std::nullopt, DType::kBFloat16, "silu", std::nullopt, "fp4", "int8"),
                  op, "quant_mode");
  // _normalize_source_format_for_quant_mode (launch_sm120_moe, 0.7.2.post1 wheel):
  // "compressed_tensors" requires quant_mode "w4a16".
  EXPECT_FI_ERROR(
      (void)b12x_fused_moe(good.x, good.w1, good.s1, good.w2, good.s2, good.ids, good.rw, c.E, c.K,
                           good.a1, good.a2, good.fc2, std::nullopt, std::nullopt, std::nullopt,
                           std::nullopt, DType::kBFloat16, "silu", 1.702, 1.0, std::nullopt, "fp4",
                           std::nullopt, "compressed_tensors"),
      op, "source_format");
  EXPECT_EQ(op_backends(op), std::vector<std::string>{"cpu"});

  const char* init = "B12xMoEWrapper.__init__";
  EXPECT_FI_ERROR(
      B12xMoEWrapper(8, 2, 128, 64, false, 4096, std::nullopt, std::nullopt, DType::kFloat16), init,
      "output_dtype");
  EXPECT_FI_ERROR_CODE(B12xMoEWrapper(8, 2, 128, 64, false, 4096, 4), init, "quant_mode",
                       ErrorCode::kUnsupported);
  EXPECT_FI_ERROR(B12xMoEWrapper(8, 2, 128, 64, false, 4096, std::nullopt, std::nullopt,
                                 DType::kBFloat16, "tpu"),
                  init, "device");
  EXPECT_FI_ERROR(B12xMoEWrapper(8, 0, 128, 64), init, "top_k");
  EXPECT_FI_ERROR(B12xMoEWrapper(8, 2, 128, 64, false, 4096, std::nullopt, std::nullopt,
                                 DType::kBFloat16, "cuda", "silu", 1.702, 1.0, std::nullopt, "fp4",
                                 std::nullopt, "compressed_tensors"),
                  init, "source_format");
  EXPECT_FI_ERROR(B12xMoEWrapper(8, 2, 100, 64), init, "hidden_size");
  const char* run = "B12xMoEWrapper.run";
  B12xMoEWrapper small(8, 2, 128, 64, true, 4);
  EXPECT_FI_ERROR(small.run(good.x, good.w1, good.s1, good.w2, good.s2, good.ids, good.rw, good.a1,
                            good.a2, gs),
                  run, "token_selected_experts");
  B12xMoEWrapper wide(8, 2, 256, 64);
  EXPECT_FI_ERROR(
      wide.run(good.x, good.w1, good.s1, good.w2, good.s2, good.ids, good.rw, good.a1, good.a2, gs),
      run, "x");
  B12xMoEWrapper other_i(8, 2, 128, 128);
  EXPECT_FI_ERROR(other_i.run(good.x, good.w1, good.s1, good.w2, good.s2, good.ids, good.rw,
                              good.a1, good.a2, gs),
                  run, "w1_weight");
}

// ---- CuteDslMoEWrapper -----------------------------------------------------------------------

// Upstream 0.7.4's CuTe-DSL additions, checked with its texts: ClampedRelu2's limit (required
// with it, refused with any other activation; ClampedRelu2 itself is refused here, as swap_ab's
// up16 / gate16 rows are), the functional form's locality-domain shards (Rubin only) and its
// nvfp4_4over6 (only with quant_mode "w4a4" and per_token_scale).
TEST(CuteDslMoEWrapper, Upstream074ArgumentsChecked) {
  const char* init = "CuteDslMoEWrapper.__init__";
  auto make = [](int64_t act, std::optional<Tensor> limit, bool swap_ab) {
    CuteDslMoEWrapper w(8, 2, 128, 64, false, std::nullopt, std::nullopt, 0, 128, 16,
                        DType::kBFloat16, "cpu", true, act, 1.0, 0.0, 3.4028234663852886e38,
                        std::nullopt, std::nullopt, true, "w4a4", limit, swap_ab);
  };
  const Tensor one = Tensor::full({1}, 2.0, DType::kFloat32);
  testing::expect_error_text(
      [&] { make(3, one, false); }, init, "clamped_relu2_limit",
      "clamped_relu2_limit is supported only with ActivationType.ClampedRelu2");
  testing::expect_error_text(
      [&] { make(12, std::nullopt, false); }, init, "clamped_relu2_limit",
      "ActivationType.ClampedRelu2 requires a one-element clamped_relu2_limit tensor");
  testing::expect_error_text([&] { make(12, Tensor::full({2}, 2.0, DType::kFloat32), false); },
                             init, "clamped_relu2_limit",
                             "requires model-wide clamped_relu2_limit with shape (1,)");
  EXPECT_FI_ERROR_CODE(make(12, one, false), init, "activation_type", ErrorCode::kUnsupported);
  EXPECT_FI_ERROR_CODE(make(3, std::nullopt, true), init, "swap_ab", ErrorCode::kUnsupported);
  // The functional form's checks come before any tensor's.
  const char* op = "cute_dsl_fused_moe_nvfp4";
  const Tensor z = Tensor::zeros({1}, DType::kFloat32);
  auto fn = [&](std::optional<Value> shards, const Value& four_over_six) {
    (void)cute_dsl_fused_moe_nvfp4(z, z, z, z, z, z, z, z, z, z, z, 8, 2, std::nullopt, 0,
                                   DType::kBFloat16, true, std::nullopt, std::nullopt, true, 3, 1.0,
                                   0.0, 3.4028234663852886e38, std::nullopt, std::nullopt, "w4a4",
                                   std::nullopt, shards, std::nullopt, std::nullopt, std::nullopt,
                                   false, false, four_over_six);
  };
  testing::expect_error_text([&] { fn(std::nullopt, Value(true)); }, op, "nvfp4_4over6",
                             "nvfp4_4over6 requires quant_mode='w4a4' with per_token_scale");
  testing::expect_error_text([&] { fn(Value(std::string("two shards")), nvfp4_4over6_unset()); },
                             op, "localized_weights",
                             "locality-domain localization is Rubin (SM107) only");
}

TEST(CuteDslMoEWrapper, MatchesFormulaAndFunction) {
  struct Variant {
    const char* name;
    bool gated, six_d;
    int64_t offset, local;
    double alpha, beta, limit;
    std::vector<float> gs2;
  };
  for (const Variant& v :
       {Variant{"swiglu", true, true, 0, 8, 1.0, 0.0, 3.4028234663852886e38, {1.0f}},
        Variant{"swiglu params, EP rank 1", true, false, 4, 4, 1.702, 1.0, 2.0, {0.5f}},
        Variant{"relu2, per-expert fc2 scales",
                false,
                true,
                0,
                8,
                1.0,
                0.0,
                3.4028234663852886e38,
                {2.0f, 1.0f, 0.5f, 1.0f, 1.0f, 4.0f, 1.0f, 0.5f}}}) {
    SCOPED_TRACE(v.name);
    MoeCase c;
    c.cute = true;
    c.gated = v.gated;
    c.six_d = v.six_d;
    c.offset = v.offset;
    c.local = v.local;
    c.make(21);
    const auto expect = c.expected({}, v.gs2, v.alpha, v.beta, v.limit);
    EXPECT_GT(max_abs(expect), 0.5);
    const int64_t act = v.gated ? 3 : 6;
    CuteDslMoEWrapper w(c.E, c.K, c.H, c.I, false, std::nullopt, c.local, c.offset, 128, 16,
                        DType::kFloat32, "cuda", true, act, v.alpha, v.beta, v.limit);
    const Tensor x = bytes_tensor(c.xq, {c.T, c.H / 2}), xs = bytes_tensor(c.xs, {c.T, c.H / 16});
    const Tensor out = w.run(x, xs, c.ids_t(), c.rw_t(), c.w1_t(), c.s1_t(), c.alpha(c.a1),
                             floats(v.gs2), c.w2_t(), c.s2_t(), c.alpha(c.a2));
    EXPECT_EQ(out.dtype(), DType::kFloat32);
    EXPECT_TRUE(all_close(out, expect, {1e-4, 1e-4}));
    // The same settings through cute_dsl_fused_moe_nvfp4, bit for bit.
    const Tensor ref = cute_dsl_fused_moe_nvfp4(
        x, xs, c.ids_t(), c.rw_t(), c.w1_t(), c.s1_t(), c.alpha(c.a1), floats(v.gs2), c.w2_t(),
        c.s2_t(), c.alpha(c.a2), c.E, c.K, c.local, c.offset, DType::kFloat32, true, std::nullopt,
        std::nullopt, true, act, v.alpha, v.beta, v.limit);
    EXPECT_TRUE(all_close(out, ref.to_double_vector(), {0.0, 0.0}));
  }
}

// GegluTanh (8) in the GEMM1 epilogue (blockscaled_contiguous_gather_grouped_gemm_act_fusion of
// the 0.7.2.post1 wheel): (alpha * up) * gelu_tanh(alpha * gate) on the interleaved [linear;
// gate] rows, the SwiGLU parameters unused; then the NVFP4 output quantization as for Swiglu.
TEST(CuteDslMoEWrapper, GegluTanhMatchesFormula) {
  MoeCase c;
  c.cute = true;
  c.make(27);
  const auto expect = c.expected({}, {0.5f}, 1.0, 0.0, 3.4e38, true);
  EXPECT_GT(max_abs(expect), 0.5);
  CuteDslMoEWrapper w(c.E, c.K, c.H, c.I, false, std::nullopt, c.local, c.offset, 128, 16,
                      DType::kFloat32, "cuda", true, 8, 1.702, 1.0, 5.0);
  const Tensor x = bytes_tensor(c.xq, {c.T, c.H / 2}), xs = bytes_tensor(c.xs, {c.T, c.H / 16});
  const Tensor out = w.run(x, xs, c.ids_t(), c.rw_t(), c.w1_t(), c.s1_t(), c.alpha(c.a1),
                           floats({0.5f}), c.w2_t(), c.s2_t(), c.alpha(c.a2));
  EXPECT_TRUE(all_close(out, expect, {1e-4, 1e-4}));
  // It differs from Swiglu on the same data.
  const auto swiglu = c.expected({}, {0.5f});
  double diff = 0.0;
  for (size_t i = 0; i < swiglu.size(); ++i) diff = std::max(diff, std::abs(swiglu[i] - expect[i]));
  EXPECT_GT(diff, 0.1);
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0.0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
  return diff;
}

// The w4a4 wrapper with SiTU (beta 1.5) and fc2_input_scale 0.5, fp32 output.
Tensor run_cute_situ(MoeCase& c, std::optional<double> linear_beta) {
  CuteDslMoEWrapper w(c.E, c.K, c.H, c.I, false, std::nullopt, c.local, c.offset, 128, 16,
                      DType::kFloat32, "cuda", true, 3, 1.0, 0.0, 3.4028234663852886e38, 1.5,
                      linear_beta);
  return w.run(bytes_tensor(c.xq, {c.T, c.H / 2}), bytes_tensor(c.xs, {c.T, c.H / 16}), c.ids_t(),
               c.rw_t(), c.w1_t(), c.s1_t(), c.alpha(c.a1), floats({0.5f}), c.w2_t(), c.s2_t(),
               c.alpha(c.a2));
}

// SiTU in the w4a4 GEMM1 epilogue (situ_f32 and the act-fusion kernel of the 0.7.2.post1 wheel):
// (linear_beta * tanh(up / linear_beta)) * (beta * tanh(gate / beta) * sigmoid(gate)), here with
// both betas given.
TEST(CuteDslMoEWrapper, SituMatchesFormula) {
  MoeCase c;
  c.cute = true;
  c.make(29);
  const auto expect = c.expected({}, {0.5f}, 1.0, 0.0, 3.4e38, false, 1.5, 3.0);
  EXPECT_GT(max_abs(expect), 0.5);
  EXPECT_TRUE(all_close(run_cute_situ(c, 3.0), expect, {1e-4, 1e-4}));
  EXPECT_GT(max_diff(c.expected({}, {0.5f}), expect), 0.1);  // not Swiglu
}

// SiTU without situ_linear_beta (situ_f32 in common/kernel_utils.py of the 0.7.2.post1 wheel:
// up is used as is, with no tanh clamp and no default 25): up * beta * tanh(gate / beta) *
// sigmoid(gate). The wrapper and the function agree bit for bit, and the function's record replays.
TEST(CuteDslMoEWrapper, SituWithoutLinearBetaMatchesFormula) {
  MoeCase c;
  c.cute = true;
  c.make(31);
  const auto expect = c.expected({}, {0.5f}, 1.0, 0.0, 3.4e38, false, 1.5, 0.0);
  EXPECT_GT(max_abs(expect), 0.5);
  const Tensor out = run_cute_situ(c, std::nullopt);
  EXPECT_TRUE(all_close(out, expect, {1e-4, 1e-4}));
  // A clamp (even the CUTLASS default 25, or a small linear beta) would change the result.
  for (const double lb : {25.0, 1.0}) {
    EXPECT_GT(max_diff(c.expected({}, {0.5f}, 1.0, 0.0, 3.4e38, false, 1.5, lb), expect),
              lb > 10.0 ? 1e-5 : 0.05)
        << lb;
  }
  const Tensor x = bytes_tensor(c.xq, {c.T, c.H / 2}), xs = bytes_tensor(c.xs, {c.T, c.H / 16});
  const Tensor w1 = c.w1_t(), s1 = c.s1_t(), w2 = c.w2_t(), s2 = c.s2_t();
  std::vector<RecordingObserver::Call> calls;
  Tensor f;
  {
    RecordingScope scope;
    f = cute_dsl_fused_moe_nvfp4(x, xs, c.ids_t(), c.rw_t(), w1, s1, c.alpha(c.a1), floats({0.5f}),
                                 w2, s2, c.alpha(c.a2), c.E, c.K, c.local, c.offset,
                                 DType::kFloat32, true, std::nullopt, std::nullopt, true, 3, 1.0,
                                 0.0, 3.4028234663852886e38, 1.5);
    calls = scope.observer().calls;
  }
  EXPECT_TRUE(all_close(f, out.to_double_vector(), {0.0, 0.0}));
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_TRUE(replays_identically(calls[0]));
}

// w4a4 with per_token_scale (the per-token path of _moe_core_impl in the 0.7.2.post1 wheel): GEMM1
// alpha times per_token_scale[t]; the SwiGLU output rounded to bf16 (output_dtype); per routed row
// nvfp4_quantize_per_token_cute_dsl with fc2_input_scale as the inverse global scale: pts = amax *
// gs_inv, enc = 1 / pts, per 16: sf = e4m3(enc * bmax / 6), q = e2m1(h / (sf / enc)); GEMM2 reads
// q * sf and its row is scaled by pts (with w2_alpha and the routing weight). Written in fp32
// where the kernel works in fp32, the GEMMs in fp64.
std::vector<double> per_token_expected(const MoeCase& c, const std::vector<double>& pts,
                                       float gs_inv) {
  std::vector<double> out(static_cast<size_t>(c.T * c.H), 0.0);
  const int64_t I = c.I, H = c.H;
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t k = 0; k < c.K; ++k) {
      const int64_t e = static_cast<int64_t>(c.ids[static_cast<size_t>(t * c.K + k)]);
      const float alpha = static_cast<float>(c.a1[static_cast<size_t>(e)]) *
                          static_cast<float>(pts[static_cast<size_t>(t)]);
      auto proj = [&](int64_t row) {
        double g = 0.0;
        for (int64_t d = 0; d < H; ++d) {
          g += moe_cute_test::e2m1(c.xq, static_cast<size_t>(t * H + d)) *
               e4m3fn_bits_to_float(c.xs[static_cast<size_t>(t * (H / 16) + d / 16)]) *
               c.w1v(e, row, d);
        }
        return static_cast<double>(alpha) * g;
      };
      std::vector<float> h(static_cast<size_t>(I));
      float amax = 0.0f;
      for (int64_t j = 0; j < I; ++j) {
        const double up = proj(j), gate = proj(I + j);
        h[static_cast<size_t>(j)] = bfloat16_bits_to_float(
            float_to_bfloat16_bits(static_cast<float>(up * gate / (1.0 + std::exp(-gate)))));
        amax = std::max(amax, std::fabs(h[static_cast<size_t>(j)]));
      }
      const float p2 = amax * gs_inv, enc = 1.0f / p2;
      for (int64_t b = 0; b < I; b += 16) {
        float bmax = 0.0f;
        for (int64_t j = b; j < b + 16; ++j)
          bmax = std::max(bmax, std::fabs(h[static_cast<size_t>(j)]));
        const float sf = e4m3fn_bits_to_float(float_to_e4m3fn_bits(enc * (bmax / 6.0f), true));
        for (int64_t j = b; j < b + 16; ++j) {
          h[static_cast<size_t>(j)] = e2m1_round(h[static_cast<size_t>(j)] / (sf / enc)) * sf;
        }
      }
      for (int64_t d = 0; d < H; ++d) {
        double y = 0.0;
        for (int64_t j = 0; j < I; ++j) y += h[static_cast<size_t>(j)] * c.w2v(e, d, j);
        out[static_cast<size_t>(t * H + d)] +=
            c.rw[static_cast<size_t>(t * c.K + k)] * c.a2[static_cast<size_t>(e)] * p2 * y;
      }
    }
  }
  return out;
}

TEST(CuteDslMoEWrapper, PerTokenScaleMatchesFormula) {
  MoeCase c;
  c.cute = true;
  c.make(33);
  const std::vector<double> pts{0.5, 1.0, 2.0, 0.75, 1.5};
  const float gs_inv = 1.0f / 2688.0f;  // 1 / (6 * 448): the recipe's usual constant
  const auto expect = per_token_expected(c, pts, gs_inv);
  EXPECT_GT(max_abs(expect), 0.5);
  const Tensor x = bytes_tensor(c.xq, {c.T, c.H / 2}), xs = bytes_tensor(c.xs, {c.T, c.H / 16});
  const Tensor pt = Tensor::from_vector(pts, {c.T}, DType::kFloat32);
  CuteDslMoEWrapper w(c.E, c.K, c.H, c.I);
  const Tensor out = w.run(x, xs, c.ids_t(), c.rw_t(), c.w1_t(), c.s1_t(), c.alpha(c.a1),
                           floats({gs_inv}), c.w2_t(), c.s2_t(), c.alpha(c.a2), std::nullopt, pt);
  EXPECT_EQ(out.dtype(), DType::kBFloat16);
  EXPECT_TRUE(all_close(out, expect, default_tolerance(DType::kBFloat16)));
  // The function takes the same path.
  const Tensor f = cute_dsl_fused_moe_nvfp4(
      x, xs, c.ids_t(), c.rw_t(), c.w1_t(), c.s1_t(), c.alpha(c.a1), floats({gs_inv}), c.w2_t(),
      c.s2_t(), c.alpha(c.a2), c.E, c.K, std::nullopt, 0, DType::kBFloat16, true, std::nullopt,
      std::nullopt, true, 3, 1.0, 0.0, 3.4028234663852886e38, std::nullopt, std::nullopt, "w4a4",
      pt);
  EXPECT_TRUE(all_close(f, out.to_double_vector(), {0.0, 0.0}));
  {  // recorded with per_token_scale, replayed
    const Tensor w1 = c.w1_t(), s1 = c.s1_t(), w2 = c.w2_t(), s2 = c.s2_t();
    std::vector<RecordingObserver::Call> calls;
    {
      RecordingScope scope;
      (void)cute_dsl_fused_moe_nvfp4(x, xs, c.ids_t(), c.rw_t(), w1, s1, c.alpha(c.a1),
                                     floats({gs_inv}), w2, s2, c.alpha(c.a2), c.E, c.K,
                                     std::nullopt, 0, DType::kBFloat16, true, std::nullopt,
                                     std::nullopt, true, 3, 1.0, 0.0, 3.4028234663852886e38,
                                     std::nullopt, std::nullopt, "w4a4", pt);
      calls = scope.observer().calls;
    }
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_TRUE(replays_identically(calls[0]));
  }
  // Bad input: fp32 output (no fp32 intermediate), a per-expert fc2_input_scale, a wrong shape.
  const char* fn = "cute_dsl_fused_moe_nvfp4";
  auto call = [&](DType od, const Tensor& fc2, const Tensor& p) {
    (void)cute_dsl_fused_moe_nvfp4(x, xs, c.ids_t(), c.rw_t(), c.w1_t(), c.s1_t(), c.alpha(c.a1),
                                   fc2, c.w2_t(), c.s2_t(), c.alpha(c.a2), c.E, c.K, std::nullopt,
                                   0, od, true, std::nullopt, std::nullopt, true, 3, 1.0, 0.0,
                                   3.4028234663852886e38, std::nullopt, std::nullopt, "w4a4", p);
  };
  EXPECT_FI_ERROR(call(DType::kFloat32, floats({gs_inv}), pt), fn, "output_dtype");
  EXPECT_FI_ERROR(call(DType::kBFloat16, floats(std::vector<float>(8, gs_inv)), pt), fn,
                  "fc2_input_scale");
  EXPECT_FI_ERROR(call(DType::kBFloat16, floats({gs_inv}), Tensor::full({3}, 1.0, DType::kFloat32)),
                  fn, "per_token_scale");
  EXPECT_FI_ERROR(call(DType::kBFloat16, floats({gs_inv}), pt.to(DType::kBFloat16)), fn,
                  "per_token_scale");
}

TEST(CuteDslMoEWrapper, BadInput) {
  const char* init = "CuteDslMoEWrapper.__init__";
  EXPECT_FI_ERROR(CuteDslMoEWrapper(8, 2, 128, 64, false, std::nullopt, std::nullopt, 0, 128, 16,
                                    DType::kBFloat16, "cuda", true, 3, 1.0, 0.0, 1e30, std::nullopt,
                                    std::nullopt, true, "int8"),
                  init, "quant_mode");
  EXPECT_FI_ERROR(CuteDslMoEWrapper(8, 2, 128, 64, false, std::nullopt, std::nullopt, 0, 128, 16,
                                    DType::kBFloat16, "cuda", true, 4),
                  init, "activation_type");
  EXPECT_FI_ERROR(CuteDslMoEWrapper(8, 9, 128, 64), init, "top_k");
  EXPECT_FI_ERROR(CuteDslMoEWrapper(8, 2, 128, 64, false, std::nullopt, std::nullopt, 0, 128, 16,
                                    DType::kInt32),
                  init, "output_dtype");
  EXPECT_FI_ERROR(CuteDslMoEWrapper(8, 2, 128, 64, false, std::nullopt, std::nullopt, 0, 128, 16,
                                    DType::kBFloat16, "npu"),
                  init, "device");
  EXPECT_EQ(CuteDslMoEWrapper(8, 2, 128, 64, false, std::nullopt, std::nullopt, 0, 128, 16,
                              DType::kBFloat16, "cuda", true, 3, 1.0, 0.0, 1e30, std::nullopt,
                              std::nullopt, true, "nvfp4")
                .quant_mode(),
            "w4a4");

  const char* run = "CuteDslMoEWrapper.run";
  MoeCase c;
  c.cute = true;
  c.make(31);
  const Tensor x = bytes_tensor(c.xq, {c.T, c.H / 2}), xs = bytes_tensor(c.xs, {c.T, c.H / 16});
  const Tensor w1 = c.w1_t(), s1 = c.s1_t(), w2 = c.w2_t(), s2 = c.s2_t();
  auto run_with = [&](CuteDslMoEWrapper& w, const Tensor& xx, const Tensor& a1,
                      std::optional<Tensor> pts = std::nullopt,
                      std::optional<Tensor> fc2 = floats({1.0f})) {
    (void)w.run(xx, xs, c.ids_t(), c.rw_t(), w1, s1, a1, fc2, w2, s2, c.alpha(c.a2), std::nullopt,
                pts);
  };
  CuteDslMoEWrapper ok(c.E, c.K, c.H, c.I);
  // w4a4's GEMM1 quantizes its output to NVFP4 and requires the global scale upstream.
  EXPECT_FI_ERROR(run_with(ok, x, c.alpha(c.a1), std::nullopt, std::nullopt), run,
                  "fc2_input_scale");
  EXPECT_FI_ERROR(run_with(ok, Tensor::zeros({c.T, 32}, DType::kUInt8), c.alpha(c.a1)), run, "x");
  EXPECT_FI_ERROR(run_with(ok, x, Tensor::zeros({3}, DType::kFloat32)), run, "w1_alpha");
  // per_token_scale runs (PerTokenScaleMatchesFormula).
  // w4a16 and w4a8 run (tests/ops/test_moe_cute_w4a16.cpp, test_moe_cute_w4a8.cpp); w4a8 takes
  // e4m3 x ("quant_mode='w4a8' requires float8_e4m3fn input", a TypeError upstream).
  CuteDslMoEWrapper w4a8(c.E, c.K, c.H, c.I, false, std::nullopt, std::nullopt, 0, 128, 16,
                         DType::kBFloat16, "cuda", true, 3, 1.0, 0.0, 1e30, std::nullopt,
                         std::nullopt, true, "w4a8");
  EXPECT_FI_ERROR(run_with(w4a8, x, c.alpha(c.a1), std::nullopt, std::nullopt), run, "x");
  // GegluTanh and SiTU run, with and without situ_linear_beta (GegluTanhMatchesFormula,
  // SituMatchesFormula, SituWithoutLinearBetaMatchesFormula); the linear beta alone is an error.
  EXPECT_FI_ERROR(
      CuteDslMoEWrapper(c.E, c.K, c.H, c.I, false, std::nullopt, std::nullopt, 0, 128, 16,
                        DType::kBFloat16, "cuda", true, 3, 1.0, 0.0, 1e30, std::nullopt, 2.0),
      "CuteDslMoEWrapper.__init__", "situ_linear_beta");
  // sf_vec_size is only stored upstream (the block size follows x's dtype): 32 changes nothing.
  CuteDslMoEWrapper sf32(c.E, c.K, c.H, c.I, false, std::nullopt, std::nullopt, 0, 128, 32);
  const Tensor r16 = ok.run(x, xs, c.ids_t(), c.rw_t(), w1, s1, c.alpha(c.a1), floats({1.0f}), w2,
                            s2, c.alpha(c.a2));
  const Tensor r32 = sf32.run(x, xs, c.ids_t(), c.rw_t(), w1, s1, c.alpha(c.a1), floats({1.0f}), w2,
                              s2, c.alpha(c.a2));
  EXPECT_TRUE(all_close(r32, r16.to_double_vector(), {0.0, 0.0}));
  EXPECT_EQ(op_backends(run), std::vector<std::string>{"cpu"});
}

// ---- record / replay --------------------------------------------------------------------------

TEST(B12xMoeRecordReplay, InMemory) {
  MoeCase b;
  b.make(41);
  MoeCase c;
  c.cute = true;
  c.make(42);
  // Inputs built before recording (block_scale_interleave is an op too).
  const Tensor bx = b.x_bf16(), bw1 = b.w1_t(), bs1 = b.s1_t(), bw2 = b.w2_t(), bs2 = b.s2_t();
  const Tensor cx = bytes_tensor(c.xq, {c.T, c.H / 2}), cxs = bytes_tensor(c.xs, {c.T, c.H / 16});
  const Tensor cw1 = c.w1_t(), cs1 = c.s1_t(), cw2 = c.w2_t(), cs2 = c.s2_t();
  // The wrappers outlive the recording: the run records refer to them.
  std::optional<B12xMoEWrapper> w;
  std::optional<CuteDslMoEWrapper> cw;
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    (void)b12x_fused_moe(bx, bw1, bs1, bw2, bs2, b.ids_t(), b.rw_t(), b.E, b.K, b.alpha(b.a1),
                         b.alpha(b.a2), floats({1.0f}), floats({0.5f}));
    w.emplace(b.E, b.K, b.H, b.I);
    (void)w->run(bx, bw1, bs1, bw2, bs2, b.ids_t(), b.rw_t(), b.alpha(b.a1), b.alpha(b.a2),
                 floats({0.5f}));
    cw.emplace(c.E, c.K, c.H, c.I);
    (void)cw->run(cx, cxs, c.ids_t(), c.rw_t(), cw1, cs1, c.alpha(c.a1), floats({0.5f}), cw2, cs2,
                  c.alpha(c.a2));
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 5u);
  moe_cute_test::expect_wrapper_calls_replay(calls);
}

// ---- a dump in upstream's format --------------------------------------------------------------

// Written by Python (torch 1.13) as upstream's recorder writes it: b12x_fused_moe as vLLM's
// FlashInferB12xExperts calls it (every argument by keyword, output= given), B12xMoEWrapper
// constructed and run with keywords, and CuteDslMoEWrapper constructed as SGLang's
// ensure_cutedsl_wrapper does (EP rank 1 of 2: num_local_experts 4, local_expert_offset 4) and
// run with SGLang's keywords. __init__ records carry the object as arg_0 and share self_id with
// the run records. Expected outputs: torch in fp32 with upstream's reference formulas. Every call
// replays and passes.
TEST(B12xMoeUpstreamDump, EngineStyleDumpReplays) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_moe_b12x_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string py =
      std::string(flashinfer::testing::kTorchSavePy) + moe_cute_test::kScaleLayoutPy + R"PY(
import json, os, sys
try:
    import torch
except ImportError:
    sys.exit(77)

d = sys.argv[1]
seq = [0]
def record(name, module, inputs, meta, outputs, self_id=None):
    seq[0] += 1
    call = "%s/20261122_230000_%03d_pid4242_%s_call%04d" % (d, seq[0], name, seq[0])
    os.makedirs(call)
    save(inputs, call + "/inputs.pt")
    save(outputs, call + "/outputs.pt")
    rec = {"function_name": name, "module": module, "call_sequence": seq[0],
           "timestamp": "20261122_230000_%03d" % seq[0], "process_id": 4242,
           "input_metadata": meta, "output_metadata": {} if outputs else {"result": None},
           "tensor_info": {"input_tensor_keys": list(inputs), "output_tensor_keys": list(outputs)},
           "tensor_format": "torch", "execution_status": "completed"}
    if self_id is not None:
        rec["self_id"] = self_id
    with open(call + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")

def e4m3_value(c):
    s = -1.0 if c & 0x80 else 1.0
    e, m = (c >> 3) & 0xF, c & 7
    if e == 0xF and m == 7: return float("nan")
    return s * (m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))
E4M3 = torch.tensor([e4m3_value(c) for c in range(256)])
POS = torch.tensor([c for c in range(127)])
def e4m3_codes(x):  # nearest non-negative code, ties to even, saturating at 448
    dist = (x.double().reshape(-1, 1) - E4M3[POS].double().reshape(1, -1)).abs()
    idx = (dist + (POS % 2).double().reshape(1, -1) * 1e-12).argmin(1)
    return POS[idx].reshape(x.shape)
E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
def e2m1_codes(x):  # nearest, ties to the even code, saturating at 6
    a = x.abs().clamp(max=6).double().reshape(-1, 1)
    dist = (a - E2M1[:8].double().reshape(1, -1)).abs() + (torch.arange(8) % 2).double() * 1e-12
    return dist.argmin(1).reshape(x.shape) + 8 * (x < 0).long()
def pack(codes):
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
def qdq(v, gs):  # b12x's quantize_vec_to_fp4_dequant (the global scale stays in the values)
    b = v.reshape(-1, 16)
    sf = E4M3[e4m3_codes((b.abs().amax(1) * gs / 6.0).clamp(max=448.0))]
    q = E2M1[e2m1_codes(b / (sf / gs).clamp(min=1e-30)[:, None])]
    return (q * sf[:, None]).reshape(v.shape)
BF16 = {"type": "torch.dtype", "value": "torch.bfloat16"}

torch.manual_seed(0)
T, E, H, I, K = 4, 8, 128, 128, 2
ids = torch.tensor([[3, 0], [6, 1], [2, 7], [5, 4]], dtype=torch.int32)
rw = torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.55, 0.45], [0.8, 0.2]])
w1q = torch.randint(0, 16, (E, 2 * I, H))
w2q = torch.randint(0, 16, (E, H, I))
s1 = e4m3_codes(torch.rand(E, 2 * I, H // 16) * 0.04 + 0.02)
s2 = e4m3_codes(torch.rand(E, H, I // 16) * 0.04 + 0.02)
w1d = E2M1[w1q] * E4M3[s1].repeat_interleave(16, 2)
w2d = E2M1[w2q] * E4M3[s2].repeat_interleave(16, 2)
a1, a2 = torch.linspace(0.75, 1.25, E), torch.linspace(1.25, 0.75, E)

# b12x: plain [up; gate] rows, 6-D scale views, bf16 x quantized in the op.
x = (torch.rand(T, H) * 4 - 2).bfloat16()
s1b = mma_view(torch.stack([interleave_128x4(s1[e].to(torch.uint8)) for e in range(E)]), E, 2 * I, H // 16)
s2b = mma_view(torch.stack([interleave_128x4(s2[e].to(torch.uint8)) for e in range(E)]), E, H, I // 16)
w1b = torch.stack([pack(w1q[e]) for e in range(E)])
w2b = torch.stack([pack(w2q[e]) for e in range(E)])
def act(g, name, alpha=1.702, beta=1.0, limit=None):  # gated_activation_f32; up [0, I), gate [I, 2I)
    gate, up = g[I:], g[:I]
    if name == "gelu_tanh":
        return gate * torch.sigmoid(2 * 0.7978845608028654 * (gate + 0.044715 * gate ** 3)) * up
    if name == "swigluoai_uninterleave":
        if limit is not None:
            gate, up = torch.clamp(gate, max=limit), torch.clamp(up, -limit, limit)
        return gate * torch.sigmoid(alpha * gate) * (up + beta)
    return gate * torch.sigmoid(gate) * up

def b12x_ref(gs1, gs2, name="silu", **kw):  # launch_sm120_moe: gs1 None -> w1_alpha quantizes x
    out = torch.zeros(T, H)
    for t in range(T):
        for k in range(K):
            e = int(ids[t, k])
            gx = a1[e] if gs1 is None else torch.tensor(gs1)
            al = a1[e] if gs1 is None else a1[e] * gx
            xd = qdq(x[t].float(), gx)
            g = al * (w1d[e] @ xd)
            h = qdq(act(g, name, **kw).bfloat16().float(), gs2)
            out[t] += rw[t, k] * a2[e] * (w2d[e] @ h)
    return out.bfloat16()

# 1. b12x_fused_moe as vLLM's FlashInferB12xExperts.apply calls it (fc2_input_scale filled
# with 1.0 per expert, output given, no input_global_scale).
fc2 = torch.ones(E)
out_buf = torch.zeros(T, H).bfloat16()
ref = b12x_ref(None, 1.0)
record("b12x_fused_moe", "flashinfer.fused_moe.cute_dsl.b12x_moe",
       {"kwarg_x": x, "kwarg_token_selected_experts": ids, "kwarg_token_final_scales": rw,
        "kwarg_w1_weight": w1b, "kwarg_w1_weight_sf": s1b, "kwarg_w1_alpha": a1,
        "kwarg_fc2_input_scale": fc2, "kwarg_w2_weight": w2b, "kwarg_w2_weight_sf": s2b,
        "kwarg_w2_alpha": a2, "kwarg_output": out_buf},
       {"kwarg_num_experts": E, "kwarg_top_k": K, "kwarg_num_local_experts": E,
        "kwarg_output_dtype": BF16},
       {"result": ref})

# 2. B12xMoEWrapper: constructed with keywords (CUDA graphs on), run with keywords and an
# input_global_scale of 0.5.
SELF = 139637976727296
obj = {"type": "B12xMoEWrapper",
       "repr": "<flashinfer.fused_moe.cute_dsl.b12x_moe.B12xMoEWrapper object at 0x%x>" % SELF}
record("B12xMoEWrapper.__init__", "flashinfer.fused_moe.cute_dsl.b12x_moe", {},
       {"arg_0": obj, "kwarg_num_experts": E, "kwarg_top_k": K, "kwarg_hidden_size": H,
        "kwarg_intermediate_size": I, "kwarg_use_cuda_graph": True, "kwarg_max_num_tokens": 16,
        "kwarg_num_local_experts": E, "kwarg_output_dtype": BF16, "kwarg_device": "cuda:0"},
       {}, self_id=SELF)
record("B12xMoEWrapper.run", "flashinfer.fused_moe.cute_dsl.b12x_moe",
       {"kwarg_x": x, "kwarg_w1_weight": w1b, "kwarg_w1_weight_sf": s1b, "kwarg_w2_weight": w2b,
        "kwarg_w2_weight_sf": s2b, "kwarg_token_selected_experts": ids,
        "kwarg_token_final_scales": rw, "kwarg_w1_alpha": a1, "kwarg_w2_alpha": a2,
        "kwarg_fc2_input_scale": torch.tensor([2.0]),
        "kwarg_input_global_scale": torch.tensor([0.5])},
       {"arg_0": obj}, {"result": b12x_ref(0.5, 2.0)}, self_id=SELF)

# 3. CuteDslMoEWrapper as SGLang's ensure_cutedsl_wrapper builds it on EP rank 1 of 2 (experts
# 4..7 local), run with SGLang's keywords: NVFP4 x with linear scales, the CuTe-DSL w1 layout
# (linear / gate rows interleaved in groups of 64), scalar fc2_input_scale 0.5.
El, off = 4, 4
SELF2 = 139637976729999
obj2 = {"type": "CuteDslMoEWrapper",
        "repr": "<flashinfer.fused_moe.cute_dsl.fused_moe.CuteDslMoEWrapper object at 0x%x>" % SELF2}
record("CuteDslMoEWrapper.__init__", "flashinfer.fused_moe.cute_dsl.fused_moe", {},
       {"arg_0": obj2, "kwarg_num_experts": E, "kwarg_top_k": K, "kwarg_hidden_size": H,
        "kwarg_intermediate_size": I, "kwarg_use_cuda_graph": True, "kwarg_max_num_tokens": 64,
        "kwarg_num_local_experts": El, "kwarg_local_expert_offset": off,
        "kwarg_output_dtype": BF16, "kwarg_device": "cuda:0"},
       {}, self_id=SELF2)
lg = torch.arange(2 * I).view(2, 2 * I // 128, 64).transpose(0, 1).reshape(-1)
xq = torch.randint(0, 16, (T, H))
xs = e4m3_codes(torch.rand(T, H // 16) * 0.5 + 0.5)
xd = E2M1[xq] * E4M3[xs].repeat_interleave(16, 1)
gs = torch.tensor([0.5])
loc = range(off, off + El)
s1c = mma_view(torch.stack([interleave_128x4(s1[e][lg].to(torch.uint8)) for e in loc]), El, 2 * I, H // 16)
s2c = mma_view(torch.stack([interleave_128x4(s2[e].to(torch.uint8)) for e in loc]), El, H, I // 16)
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        e = int(ids[t, k])
        if not off <= e < off + El:
            continue
        g = a1[e] * (xd[t] @ w1d[e].T)
        # The GEMM1 epilogue quantizes the fp32 activation; GEMM2 reads e2m1 * sf.
        q = qdq(g[I:] * torch.sigmoid(g[I:]) * g[:I], gs)
        out[t] += rw[t, k] * a2[e] * (q @ w2d[e].T)
record("CuteDslMoEWrapper.run", "flashinfer.fused_moe.cute_dsl.fused_moe",
       {"kwarg_x": pack(xq), "kwarg_x_sf": xs.to(torch.uint8),
        "kwarg_token_selected_experts": ids, "kwarg_token_final_scales": rw,
        "kwarg_w1_weight": torch.stack([pack(w1q[e])[lg] for e in loc]),
        "kwarg_w1_weight_sf": s1c, "kwarg_w1_alpha": a1[off:off + El].clone(),
        "kwarg_fc2_input_scale": gs,
        "kwarg_w2_weight": torch.stack([pack(w2q[e]) for e in loc]),
        "kwarg_w2_weight_sf": s2c, "kwarg_w2_alpha": a2[off:off + El].clone()},
       {"arg_0": obj2}, {"result": out.bfloat16()}, self_id=SELF2)

# 4, 5. b12x_fused_moe with the other gated activations of the SM12x kernels (session 15):
# gelu_tanh, and swigluoai_uninterleave with alpha 1.5, beta 0.5, limit 1.0.
for name, kw in (("gelu_tanh", {}),
                 ("swigluoai_uninterleave", {"alpha": 1.5, "beta": 0.5, "limit": 1.0})):
    meta = {"kwarg_num_experts": E, "kwarg_top_k": K, "kwarg_activation": name}
    if kw:
        meta.update({"kwarg_swiglu_alpha": kw["alpha"], "kwarg_swiglu_beta": kw["beta"],
                     "kwarg_swiglu_limit": kw["limit"]})
    record("b12x_fused_moe", "flashinfer.fused_moe.cute_dsl.b12x_moe",
           {"kwarg_x": x, "kwarg_token_selected_experts": ids, "kwarg_token_final_scales": rw,
            "kwarg_w1_weight": w1b, "kwarg_w1_weight_sf": s1b, "kwarg_w1_alpha": a1,
            "kwarg_fc2_input_scale": torch.tensor([1.0]), "kwarg_w2_weight": w2b,
            "kwarg_w2_weight_sf": s2b, "kwarg_w2_alpha": a2},
           meta, {"result": b12x_ref(None, 1.0, name, **kw)})
)PY";
  std::vector<replay::Result> results;
  if (!run_dump_script(dir, py, dir, 7u, &results)) GTEST_SKIP() << "python3-torch not installed";
  for (const auto& r : results) {
    if (r.function_name.ends_with(".__init__")) continue;
    ASSERT_FALSE(r.comparisons.empty()) << r.function_name;
    EXPECT_EQ(r.comparisons[0].key, "result") << r.function_name;
  }
}

}  // namespace
}  // namespace flashinfer::testing
