// CuTe-DSL MoE with quant_mode "w4a8" (MXFP8 x, MXFP4 weights; CuteDslMoEWrapper and
// cute_dsl_fused_moe_nvfp4): a hand-checked golden of GEMM1's MXFP8 epilogue (the ue8m0 scale
// rounded up), fp64 formulas (Swiglu with and without parameters, Relu2, expert parallelism), bad
// input naming the argument, in-memory record/replay. Sources: docs/MOE.md ("CuTe-DSL w4a8").
// Also the same MoE under upstream's fused_moe_mxfp8_mxfp4 names (cute_dsl_fused_moe_mxfp8_mxfp4,
// CuteDslMxfp8Mxfp4MoEWrapper) with that module's validation and tactics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/replay.h"
#include "ops/moe_cute_test_util.h"
#include "ops/moe_fp4_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

using moe_fp4::bytes_tensor;
using moe_fp4::random_bytes;
using moe_fp4::Rng;

constexpr double kFltMax = 3.4028234663852886e38;

double ue8m0(uint8_t c) { return std::ldexp(1.0, static_cast<int>(c) - 127); }

// The MXFP8 requantization of GEMM1's fp32 output, written from upstream's description
// (float_to_ue8m0_fast: the exponent of amax / 448 rounded up; the values times 2^(127 - code)
// rounded to e4m3 with saturation), in fp32 as the kernel computes it.
std::vector<double> mxfp8_qdq(const std::vector<double>& v) {
  std::vector<double> out(v.size());
  for (size_t b = 0; b < v.size(); b += 32) {
    float amax = 0.0f;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(static_cast<float>(v[i])));
    const float s = amax * (1.0f / 448.0f);
    int code = 0;
    if (s > 0.0f) {
      int e = 0;
      const float m = std::frexp(s, &e);  // s = m * 2^e, m in [0.5, 1)
      code = (m == 0.5f ? e - 1 : e) + 127;
      code = std::min(code, 254);
    }
    const double inv = code == 0 ? 0.0 : std::ldexp(1.0, 127 - code);
    for (size_t i = b; i < b + 32; ++i) {
      const float q = static_cast<float>(static_cast<float>(v[i]) * inv);
      out[i] =
          e4m3fn_bits_to_float(float_to_e4m3fn_bits(q, true)) * ue8m0(static_cast<uint8_t>(code));
    }
  }
  return out;
}

// One w4a8 problem: e4m3 x with ue8m0 scales per 32, MXFP4 weights (plain rows [linear; gate] when
// gated, stored in the CuTe-DSL interleaved order), per-expert alphas, routing (t + 3k) % E.
struct W4a8Case {
  int64_t T = 5, E = 8, K = 2, H = 128, I = 128, offset = 0, local = 8;
  bool gated = true;
  std::vector<uint8_t> xq, xs, w1, s1, w2, s2;
  std::vector<double> a1, a2, ids, rw;
  Tensor s1_base, s2_base;
  int64_t n1() const { return gated ? 2 * I : I; }
  void make(uint64_t seed) {
    Rng r{seed};
    for (int64_t i = 0; i < T * H; ++i) {  // e4m3 magnitudes 0.125 .. 3.75, both signs
      const auto code = static_cast<uint8_t>(0x20 + r.next() % 0x2F);
      xq.push_back(static_cast<uint8_t>(code | (r.next() % 2 ? 0x80 : 0)));
    }
    for (int64_t i = 0; i < T * H / 32; ++i) xs.push_back(static_cast<uint8_t>(126 + r.next() % 3));
    w1 = random_bytes(static_cast<size_t>(local * n1() * H / 2), seed + 3);
    w2 = random_bytes(static_cast<size_t>(local * H * I / 2), seed + 4);
    for (int64_t i = 0; i < local * n1() * H / 32; ++i)
      s1.push_back(static_cast<uint8_t>(121 + r.next() % 3));
    for (int64_t i = 0; i < local * H * I / 32; ++i)
      s2.push_back(static_cast<uint8_t>(121 + r.next() % 3));
    for (int64_t e = 0; e < local; ++e) {
      a1.push_back(static_cast<float>(r.uniform(0.75, 1.25)));
      a2.push_back(static_cast<float>(r.uniform(0.75, 1.25)));
    }
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        ids.push_back(static_cast<double>((t + 3 * k) % E));
        rw.push_back(k == 0 ? 0.7 : 0.3);
      }
    }
  }
  Tensor x_t() const { return bytes_tensor(xq, {T, H}, DType::kFloat8E4M3FN); }
  Tensor xs_t() const { return bytes_tensor(xs, {T, H / 32}); }
  Tensor ids_t() const { return Tensor::from_vector(ids, {T, K}, DType::kInt32); }
  Tensor rw_t() const { return Tensor::from_vector(rw, {T, K}, DType::kFloat32); }
  Tensor alpha(const std::vector<double>& a) const {
    return Tensor::from_vector(a, {local}, DType::kFloat32);
  }
  // Rows in stored order (interleave_linear_and_gate(., 64) when gated).
  std::vector<uint8_t> stored(const std::vector<uint8_t>& plain, int64_t m, int64_t cols,
                              bool reorder) const {
    return moe_cute_test::stored_bytes(plain, local, m, cols, reorder);
  }
  Tensor w1_t() const { return bytes_tensor(stored(w1, n1(), H / 2, gated), {local, n1(), H / 2}); }
  Tensor w2_t() const { return bytes_tensor(w2, {local, H, I / 2}); }
  // convert_sf_to_mma_layout's 6-D view of the 128x4-swizzled ue8m0 bytes (validate_w4a8_inputs).
  Tensor scales(const std::vector<uint8_t>& plain, int64_t m, int64_t cols, bool reorder,
                Tensor& base) const {
    base = block_scale_interleave(bytes_tensor(stored(plain, m, cols, reorder), {local, m, cols}));
    const int64_t mt = (m + 127) / 128, kt = (cols + 3) / 4;
    return Tensor::from_storage(base.storage(), {32, 4, mt, 4, kt, local},
                                {16, 4, kt * 512, 1, 512, mt * kt * 512}, 0, DType::kUInt8);
  }
  Tensor s1_t() { return scales(s1, n1(), H / 32, gated, s1_base); }
  Tensor s2_t() { return scales(s2, H, I / 32, false, s2_base); }

  // fp64 GEMMs over the exactly decoded operands; the activation in fp64, then the MXFP8
  // requantization; the k contributions summed in fp64.
  std::vector<double> expected(double sw_alpha = 1.0, double sw_beta = 0.0,
                               double sw_limit = kFltMax, bool gelu_tanh = false) const {
    const int64_t N1 = n1();
    std::vector<double> out(static_cast<size_t>(T * H), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = static_cast<int64_t>(ids[static_cast<size_t>(t * K + k)]) - offset;
        if (e < 0 || e >= local) continue;
        std::vector<double> g(static_cast<size_t>(N1), 0.0);
        for (int64_t j = 0; j < N1; ++j) {
          for (int64_t d = 0; d < H; ++d) {
            const size_t xi = static_cast<size_t>(t * H + d);
            const size_t wi = static_cast<size_t>((e * N1 + j) * H + d);
            g[static_cast<size_t>(j)] += e4m3fn_bits_to_float(xq[xi]) * ue8m0(xs[xi / 32]) *
                                         moe_cute_test::e2m1(w1, wi) * ue8m0(s1[wi / 32]);
          }
          g[static_cast<size_t>(j)] *= a1[static_cast<size_t>(e)];
        }
        std::vector<double> h(static_cast<size_t>(I));
        for (int64_t j = 0; j < I; ++j) {
          if (gated && gelu_tanh) {  // (alpha * up) * gelu_tanh(alpha * gate)
            const double gate = g[static_cast<size_t>(I + j)];
            const double z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate);
            h[static_cast<size_t>(j)] =
                0.5 * gate * (1.0 + std::tanh(z)) * g[static_cast<size_t>(j)];
          } else if (gated) {  // linear rows [0, I), gate rows [I, 2I)
            const double gate = std::min(g[static_cast<size_t>(I + j)], sw_limit);
            const double lin = std::clamp(g[static_cast<size_t>(j)], -sw_limit, sw_limit);
            h[static_cast<size_t>(j)] = gate / (1.0 + std::exp(-sw_alpha * gate)) * (lin + sw_beta);
          } else {
            const double v = std::max(g[static_cast<size_t>(j)], 0.0);
            h[static_cast<size_t>(j)] = v * v;
          }
        }
        h = mxfp8_qdq(h);
        for (int64_t d = 0; d < H; ++d) {
          double y = 0.0;
          for (int64_t j = 0; j < I; ++j) {
            const size_t wi = static_cast<size_t>((e * H + d) * I + j);
            y += h[static_cast<size_t>(j)] * moe_cute_test::e2m1(w2, wi) * ue8m0(s2[wi / 32]);
          }
          out[static_cast<size_t>(t * H + d)] +=
              rw[static_cast<size_t>(t * K + k)] * a2[static_cast<size_t>(e)] * y;
        }
      }
    }
    return out;
  }
};

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

CuteDslMoEWrapper make_wrapper(const W4a8Case& c, int64_t act = 3, double alpha = 1.0,
                               double beta = 0.0, double limit = kFltMax) {
  return CuteDslMoEWrapper(c.E, c.K, c.H, c.I, false, std::nullopt, c.local, c.offset, 128, 16,
                           DType::kBFloat16, "cuda", true, act, alpha, beta, limit, std::nullopt,
                           std::nullopt, true, "w4a8");
}

// GEMM1's MXFP8 epilogue, hand-checked. Relu2, one expert, x = 1 (e4m3 0x38, scale code 127),
// every W1 row e2m1 0.5 (scale 1) and alpha1 = 0.34375: g = 128 * 0.5 * 0.34375 = 22, h = 484 for
// all 128 values. amax / 448 = 1.0804 has a mantissa, so the ue8m0 code rounds up to 128 (scale
// 2); 484 / 2 = 242 rounds to the e4m3 240 (spacing 16 in [128, 256)), read back as 480. W2's
// rows hold e2m1 1.0 in column 0 only: every output is 480. (Without the requantization 484; with
// the exponent rounded down, scale 1 and e4m3 saturation: 448.)
TEST(CuteDslW4a8, HandCheckedMxfp8Epilogue) {
  W4a8Case c;
  c.T = 1;
  c.E = 1;
  c.K = 1;
  c.local = 1;
  c.gated = false;
  c.xq.assign(128, 0x38);
  c.xs.assign(4, 127);
  c.w1.assign(128 * 64, 0x11);  // e2m1 0.5 in both nibbles
  c.s1.assign(128 * 4, 127);
  c.w2.assign(128 * 64, 0);
  for (int d = 0; d < 128; ++d) c.w2[static_cast<size_t>(d * 64)] = 0x02;  // column 0: 1.0
  c.s2.assign(128 * 4, 127);
  c.a1 = {0.34375};
  c.a2 = {1.0};
  c.ids = {0.0};
  c.rw = {1.0};
  CuteDslMoEWrapper w = make_wrapper(c, 6);
  const Tensor out = w.run(c.x_t(), c.xs_t(), c.ids_t(), c.rw_t(), c.w1_t(), c.s1_t(),
                           c.alpha(c.a1), std::nullopt, c.w2_t(), c.s2_t(), c.alpha(c.a2));
  EXPECT_TRUE(all_close(out, std::vector<double>(128, 480.0), {0.0, 0.0}));
  EXPECT_TRUE(all_close(out, c.expected(), {0.0, 0.0}));
}

TEST(CuteDslW4a8, MatchesFormula) {
  struct Variant {
    const char* name;
    bool gated;
    int64_t offset, local;
    double alpha, beta, limit;
    bool gelu = false;
  };
  for (const Variant& v :
       {Variant{"swiglu", true, 0, 8, 1.0, 0.0, kFltMax},
        Variant{"swiglu with parameters, EP rank 1", true, 4, 4, 1.702, 1.0, 3.0},
        Variant{"relu2", false, 0, 8, 1.0, 0.0, kFltMax}}) {
    SCOPED_TRACE(v.name);
    W4a8Case c;
    c.gated = v.gated;
    c.offset = v.offset;
    c.local = v.local;
    c.make(31);
    const auto expect = c.expected(v.alpha, v.beta, v.limit, v.gelu);
    const int64_t act = v.gelu ? 8 : v.gated ? 3 : 6;
    EXPECT_GT(max_abs(expect), 0.1);
    CuteDslMoEWrapper w = make_wrapper(c, act, v.alpha, v.beta, v.limit);
    const Tensor s1 = c.s1_t(), s2 = c.s2_t();
    const Tensor out = w.run(c.x_t(), c.xs_t(), c.ids_t(), c.rw_t(), c.w1_t(), s1, c.alpha(c.a1),
                             std::nullopt, c.w2_t(), s2, c.alpha(c.a2));
    EXPECT_EQ(out.dtype(), DType::kBFloat16);
    EXPECT_TRUE(all_close(out, expect, default_tolerance(DType::kBFloat16)));
    // The function with quant_mode "w4a8" is the same computation.
    const Tensor f = cute_dsl_fused_moe_nvfp4(
        c.x_t(), c.xs_t(), c.ids_t(), c.rw_t(), c.w1_t(), s1, c.alpha(c.a1), std::nullopt, c.w2_t(),
        s2, c.alpha(c.a2), c.E, c.K, c.local, c.offset, DType::kBFloat16, true, std::nullopt,
        std::nullopt, true, v.gated ? 3 : 6, v.alpha, v.beta, v.limit, std::nullopt, std::nullopt,
        "w4a8");
    EXPECT_TRUE(all_close(f, out.to_double_vector(), {0.0, 0.0}));
  }
}

TEST(CuteDslW4a8, BadInput) {
  W4a8Case c;
  c.make(41);
  const char* op = "CuteDslMoEWrapper.run";
  CuteDslMoEWrapper w = make_wrapper(c);
  const Tensor x = c.x_t(), xs = c.xs_t(), ids = c.ids_t(), rw = c.rw_t(), w1 = c.w1_t(),
               s1 = c.s1_t(), w2 = c.w2_t(), s2 = c.s2_t(), a1 = c.alpha(c.a1), a2 = c.alpha(c.a2);
  const Tensor one = Tensor::full({1}, 1.0, DType::kFloat32);
  EXPECT_FI_ERROR(w.run(x.to(DType::kBFloat16), xs, ids, rw, w1, s1, a1, std::nullopt, w2, s2, a2),
                  op, "x");
  EXPECT_FI_ERROR(w.run(x, std::nullopt, ids, rw, w1, s1, a1, std::nullopt, w2, s2, a2), op,
                  "x_sf");
  EXPECT_FI_ERROR(w.run(x, xs, ids, rw, w1, s1, a1, one, w2, s2, a2), op, "fc2_input_scale");
  EXPECT_FI_ERROR(w.run(x, xs, ids, rw, w1, s1, a1, std::nullopt, w2, s2, a2, std::nullopt,
                        Tensor::full({c.T}, 1.0, DType::kFloat32)),
                  op, "per_token_scale");
  EXPECT_FI_ERROR(w.run(x, Tensor::zeros({c.T, c.H / 16}, DType::kUInt8), ids, rw, w1, s1, a1,
                        std::nullopt, w2, s2, a2),
                  op, "x_sf");
  EXPECT_FI_ERROR(w.run(x, xs.to(DType::kFloat32), ids, rw, w1, s1, a1, std::nullopt, w2, s2, a2),
                  op, "x_sf");
  EXPECT_FI_ERROR(w.run(x, xs, ids, rw.to(DType::kBFloat16), w1, s1, a1, std::nullopt, w2, s2, a2),
                  op, "token_final_scales");
  // The flat swizzled bytes are not the MMA view validate_w4a8_inputs asks for.
  EXPECT_FI_ERROR(w.run(x, xs, ids, rw, w1, c.s1_base, a1, std::nullopt, w2, s2, a2), op,
                  "w1_weight_sf");
  EXPECT_FI_ERROR(w.run(x, xs, ids, rw, w1, s1, a1, std::nullopt, w2, c.s2_base, a2), op,
                  "w2_weight_sf");
  EXPECT_FI_ERROR(w.run(x, xs, ids, rw, Tensor::zeros({8, 100, 64}, DType::kUInt8), s1, a1,
                        std::nullopt, w2, s2, a2),
                  op, "w1_weight");
  EXPECT_FI_ERROR(w.run(x, xs, ids, rw, w1, s1, a1, std::nullopt,
                        Tensor::zeros({8, 128, 32}, DType::kUInt8), s2, a2),
                  op, "w2_weight");
  EXPECT_FI_ERROR(
      w.run(x, xs, ids, rw, w1, s1, Tensor::zeros({3}, DType::kFloat32), std::nullopt, w2, s2, a2),
      op, "w1_alpha");
  const char* init = "CuteDslMoEWrapper.__init__";
  EXPECT_FI_ERROR(CuteDslMoEWrapper(8, 2, 128, 128, false, std::nullopt, std::nullopt, 0, 128, 16,
                                    DType::kFloat16, "cuda", true, 3, 1.0, 0.0, kFltMax,
                                    std::nullopt, std::nullopt, true, "w4a8"),
                  init, "output_dtype");
  EXPECT_FI_ERROR(CuteDslMoEWrapper(8, 2, 128, 128, false, std::nullopt, std::nullopt, 0, 128, 16,
                                    DType::kBFloat16, "cuda", true, 3, 1.0, 0.0, kFltMax,
                                    std::nullopt, std::nullopt, false, "w4a8"),
                  init, "use_fused_finalize");
  EXPECT_FI_ERROR(CuteDslMoEWrapper(8, 2, 128, 128, false, std::nullopt, std::nullopt, 0, 128, 16,
                                    DType::kBFloat16, "cuda", true, 3, 1.0, 0.0, kFltMax, 4.0,
                                    std::nullopt, true, "w4a8"),
                  init, "situ_beta");
  const char* fn = "cute_dsl_fused_moe_nvfp4";
  EXPECT_FI_ERROR(
      cute_dsl_fused_moe_nvfp4(x, xs, ids, rw, w1, s1, a1, std::nullopt, w2, s2, a2, c.E, c.K,
                               std::nullopt, 0, DType::kBFloat16, false, std::nullopt, std::nullopt,
                               true, 3, 1.0, 0.0, kFltMax, std::nullopt, std::nullopt, "w4a8"),
      fn, "use_fused_finalize");
  EXPECT_FI_ERROR(
      cute_dsl_fused_moe_nvfp4(x, xs, ids, rw, w1, s1, a1, std::nullopt, w2, s2, a2, c.E, c.K,
                               std::nullopt, 0, DType::kFloat32, true, std::nullopt, std::nullopt,
                               true, 3, 1.0, 0.0, kFltMax, std::nullopt, std::nullopt, "w4a8"),
      fn, "output_dtype");
}

TEST(CuteDslW4a8, RecordReplay) {
  W4a8Case c;
  c.offset = 4;
  c.local = 4;
  c.make(54);
  const Tensor s1 = c.s1_t(), s2 = c.s2_t();
  std::optional<CuteDslMoEWrapper> w;
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    w.emplace(c.E, c.K, c.H, c.I, false, std::nullopt, c.local, c.offset, 128, 16, DType::kBFloat16,
              "cuda", true, 3, 1.0, 0.0, kFltMax, std::nullopt, std::nullopt, true, "w4a8");
    (void)w->run(c.x_t(), c.xs_t(), c.ids_t(), c.rw_t(), c.w1_t(), s1, c.alpha(c.a1), std::nullopt,
                 c.w2_t(), s2, c.alpha(c.a2));
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  ASSERT_TRUE(calls[0].error.empty()) << calls[0].error;
  EXPECT_NO_THROW((void)replay(calls[0]));
  EXPECT_TRUE(replays_identically(calls[1]));
}

// ---- cute_dsl_fused_moe_mxfp8_mxfp4 / CuteDslMxfp8Mxfp4MoEWrapper (the same MoE under the names
// of upstream's fused_moe_mxfp8_mxfp4 module, with its own validation) ----

CuteDslMxfp8Mxfp4MoEWrapper make_mixed(const W4a8Case& c, int64_t act = 3, double alpha = 1.0,
                                       double beta = 0.0, double limit = kFltMax) {
  return CuteDslMxfp8Mxfp4MoEWrapper(c.E, c.K, c.H, c.I, std::nullopt, c.local, c.offset, false,
                                     "cpu", true, act, alpha, beta, limit);
}

TEST(CuteDslMxfp8Mxfp4, MatchesFormulaAndTheW4a8Wrapper) {
  struct Variant {
    const char* name;
    bool gated;
    int64_t offset, local;
    double alpha, beta, limit;
  };
  for (const Variant& v :
       {Variant{"swiglu", true, 0, 8, 1.0, 0.0, kFltMax},
        Variant{"swiglu with parameters, EP rank 1", true, 4, 4, 1.702, 1.0, 3.0},
        Variant{"relu2, EP rank 0", false, 0, 4, 1.0, 0.0, kFltMax}}) {
    SCOPED_TRACE(v.name);
    W4a8Case c;
    c.gated = v.gated;
    c.offset = v.offset;
    c.local = v.local;
    c.make(77);
    const int64_t act = v.gated ? 3 : 6;
    const auto expect = c.expected(v.alpha, v.beta, v.limit);
    EXPECT_GT(max_abs(expect), 0.1);
    const Tensor s1 = c.s1_t(), s2 = c.s2_t();
    const Tensor f = cute_dsl_fused_moe_mxfp8_mxfp4(
        c.x_t(), c.xs_t(), c.ids_t(), c.rw_t(), c.w1_t(), s1, c.alpha(c.a1), c.w2_t(), s2,
        c.alpha(c.a2), c.E, c.K, c.local, c.offset, std::nullopt, std::nullopt, std::nullopt, true,
        act, v.alpha, v.beta, v.limit);
    EXPECT_EQ(f.dtype(), DType::kBFloat16);
    EXPECT_TRUE(all_close(f, expect, default_tolerance(DType::kBFloat16)));
    // Tokens whose experts are all remote get zero rows (routing (t + 3k) % 8, local 4).
    CuteDslMxfp8Mxfp4MoEWrapper w = make_mixed(c, act, v.alpha, v.beta, v.limit);
    const Tensor r = w.run(c.x_t(), c.xs_t(), c.ids_t(), c.rw_t(), c.w1_t(), s1, c.alpha(c.a1),
                           c.w2_t(), s2, c.alpha(c.a2));
    EXPECT_TRUE(all_close(r, f.to_double_vector(), {0.0, 0.0}));
    CuteDslMoEWrapper w4a8 = make_wrapper(c, act, v.alpha, v.beta, v.limit);
    const Tensor ref = w4a8.run(c.x_t(), c.xs_t(), c.ids_t(), c.rw_t(), c.w1_t(), s1, c.alpha(c.a1),
                                std::nullopt, c.w2_t(), s2, c.alpha(c.a2));
    EXPECT_TRUE(all_close(f, ref.to_double_vector(), {0.0, 0.0}));
  }
}

// moe_output is written and returned (a stale value in it does not survive); a tactic from
// upstream's list changes nothing.
TEST(CuteDslMxfp8Mxfp4, MoeOutputAndTactic) {
  W4a8Case c;
  c.offset = 4;  // some tokens route only to remote experts: their rows must be zeroed
  c.local = 4;
  c.make(78);
  const Tensor s1 = c.s1_t(), s2 = c.s2_t();
  Tensor out = Tensor::full({c.T, c.H}, 7.0, DType::kBFloat16);
  const Value tactic = Value::tuple(
      {Value(int64_t{256}),
       Value::tuple({Value::tuple({Value(int64_t{256}), Value(int64_t{128})}),
                     Value::tuple({Value(int64_t{2}), Value(int64_t{1})}), Value(false)}),
       Value::tuple({Value::tuple({Value(int64_t{256}), Value(int64_t{192})}),
                     Value::tuple({Value(int64_t{2}), Value(int64_t{2})}), Value(false)})});
  const Tensor r = cute_dsl_fused_moe_mxfp8_mxfp4(
      c.x_t(), c.xs_t(), c.ids_t(), c.rw_t(), c.w1_t(), s1, c.alpha(c.a1), c.w2_t(), s2,
      c.alpha(c.a2), c.E, c.K, c.local, c.offset, out, std::nullopt, tactic);
  EXPECT_EQ(r.data_ptr(), out.data_ptr());
  EXPECT_TRUE(all_close(out, c.expected(), default_tolerance(DType::kBFloat16)));
  CuteDslMxfp8Mxfp4MoEWrapper w = make_mixed(c);
  const Tensor plain = w.run(c.x_t(), c.xs_t(), c.ids_t(), c.rw_t(), c.w1_t(), s1, c.alpha(c.a1),
                             c.w2_t(), s2, c.alpha(c.a2), Value(int64_t{-1}));
  EXPECT_TRUE(all_close(plain, out.to_double_vector(), {0.0, 0.0}));
}

TEST(CuteDslMxfp8Mxfp4, BadInputNamesTheArgument) {
  W4a8Case c;
  c.make(79);
  const char* fn = "cute_dsl_fused_moe_mxfp8_mxfp4";
  const Tensor x = c.x_t(), xs = c.xs_t(), ids = c.ids_t(), rw = c.rw_t(), w1 = c.w1_t(),
               s1 = c.s1_t(), w2 = c.w2_t(), s2 = c.s2_t(), a1 = c.alpha(c.a1), a2 = c.alpha(c.a2);
  auto call = [&](const Tensor& xx, const Tensor& xss, const Tensor& rww, const Tensor& ss1,
                  const Tensor& ww2, std::optional<Value> tactic, int64_t act, int64_t offset) {
    return cute_dsl_fused_moe_mxfp8_mxfp4(xx, xss, ids, rww, w1, ss1, a1, ww2, s2, a2, c.E, c.K,
                                          std::nullopt, offset, std::nullopt, std::nullopt,
                                          std::move(tactic), true, act);
  };
  // upstream's test: bf16 routing weights (TypeError naming token_final_scales) and contiguous
  // weight scales (ValueError "MMA scale strides").
  EXPECT_FI_ERROR(call(x, xs, rw.to(DType::kBFloat16), s1, w2, std::nullopt, 3, 0), fn,
                  "token_final_scales");
  try {
    call(x, xs, rw, s1.contiguous(), w2, std::nullopt, 3, 0);
    ADD_FAILURE() << "contiguous weight scales were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.arg(), "w1_weight_sf");
    EXPECT_NE(std::string(e.what()).find("MMA scale strides"), std::string::npos) << e.what();
  }
  EXPECT_FI_ERROR(call(x.to(DType::kBFloat16), xs, rw, s1, w2, std::nullopt, 3, 0), fn, "x");
  EXPECT_FI_ERROR(
      call(x, Tensor::zeros({c.T, c.H / 16}, DType::kUInt8), rw, s1, w2, std::nullopt, 3, 0), fn,
      "x_sf");
  EXPECT_FI_ERROR(call(x, xs, rw, s1, Tensor::zeros({8, 128}, DType::kUInt8), std::nullopt, 3, 0),
                  fn, "w2_weight");
  EXPECT_FI_ERROR(call(x, xs, rw, s1, w2, std::nullopt, 5, 0), fn, "activation_type");
  EXPECT_FI_ERROR(call(x, xs, rw, s1, w2, std::nullopt, 3, 1), fn, "local_expert_offset");
  // [128, 96] is no GEMM1 tile upstream has; a 2-sequence is no tactic.
  const Value bad = Value::tuple(
      {Value(int64_t{128}),
       Value::list({Value::list({Value(int64_t{128}), Value(int64_t{96})}),
                    Value::list({Value(int64_t{1}), Value(int64_t{1})}), Value(false)}),
       Value::list({Value::list({Value(int64_t{128}), Value(int64_t{128})}),
                    Value::list({Value(int64_t{1}), Value(int64_t{1})}), Value(false)})});
  EXPECT_FI_ERROR(call(x, xs, rw, s1, w2, bad, 3, 0), fn, "tactic");
  EXPECT_FI_ERROR(
      call(x, xs, rw, s1, w2, Value::tuple({Value(int64_t{128}), Value(int64_t{1})}), 3, 0), fn,
      "tactic");
  // The function canonicalizes -1 and refuses it (only the wrapper's runner takes it); a tile
  // pair flattened into three numbers is no tactic either.
  EXPECT_FI_ERROR(call(x, xs, rw, s1, w2, Value(int64_t{-1}), 3, 0), fn, "tactic");
  const Value flat = Value::tuple(
      {Value(int64_t{128}),
       Value::tuple({Value::tuple({Value(int64_t{128}), Value(int64_t{128}), Value(int64_t{1})}),
                     Value(int64_t{1}), Value(false)}),
       Value::tuple({Value::tuple({Value(int64_t{128}), Value(int64_t{128})}),
                     Value::tuple({Value(int64_t{1}), Value(int64_t{1})}), Value(false)})});
  EXPECT_FI_ERROR(call(x, xs, rw, s1, w2, flat, 3, 0), fn, "tactic");
  // num_local_experts=0 is not None: "must be positive".
  EXPECT_FI_ERROR(
      cute_dsl_fused_moe_mxfp8_mxfp4(x, xs, ids, rw, w1, s1, a1, w2, s2, a2, c.E, c.K, int64_t{0}),
      fn, "num_local_experts");
  // The wrapper: hidden size against its own, sizes not multiples of 128 at construction.
  CuteDslMxfp8Mxfp4MoEWrapper w(c.E, c.K, 256, c.I, std::nullopt, std::nullopt, 0, false, "cpu");
  EXPECT_FI_ERROR(w.run(x, xs, ids, rw, w1, s1, a1, w2, s2, a2), "CuteDslMxfp8Mxfp4MoEWrapper.run",
                  "x");
  EXPECT_FI_ERROR(CuteDslMxfp8Mxfp4MoEWrapper(8, 2, 192, 128),
                  "CuteDslMxfp8Mxfp4MoEWrapper.__init__", "hidden_size");
  EXPECT_FI_ERROR(CuteDslMxfp8Mxfp4MoEWrapper(8, 9, 128, 128),
                  "CuteDslMxfp8Mxfp4MoEWrapper.__init__", "top_k");
}

// Recorded to disk (the weight scales keep their MMA-view strides there) and replayed as a
// session (the wrapper's run on the object its recorded __init__ rebuilds).
TEST(CuteDslMxfp8Mxfp4, RecordedCallsReplayFromDisk) {
  W4a8Case c;
  c.offset = 4;
  c.local = 4;
  c.make(80);
  const Tensor s1 = c.s1_t(), s2 = c.s2_t();
  const std::filesystem::path dir = record_dump("mxfp8_mxfp4", [&] {
    (void)cute_dsl_fused_moe_mxfp8_mxfp4(c.x_t(), c.xs_t(), c.ids_t(), c.rw_t(), c.w1_t(), s1,
                                         c.alpha(c.a1), c.w2_t(), s2, c.alpha(c.a2), c.E, c.K,
                                         c.local, c.offset);
    CuteDslMxfp8Mxfp4MoEWrapper w = make_mixed(c);
    (void)w.run(c.x_t(), c.xs_t(), c.ids_t(), c.rw_t(), c.w1_t(), s1, c.alpha(c.a1), c.w2_t(), s2,
                c.alpha(c.a2));
  });
  const std::vector<replay::Result> rs = replay::replay_sequence(dir.string());
  std::filesystem::remove_all(dir);
  ASSERT_EQ(rs.size(), 3u);
  for (const replay::Result& r : rs) EXPECT_EQ(r.status, replay::Status::kPassed) << r.error;
}

}  // namespace
}  // namespace flashinfer::testing
