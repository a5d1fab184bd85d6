// b12x_fused_moe / B12xMoEWrapper with quant_mode "w4a16" (bf16 x, NVFP4 weights): fp64 formulas
// with the SM120 kernel's rounding points, a hand-checked golden (scale flush, bf16 products),
// bad input naming the argument, in-memory record/replay. Facts: docs/MOE.md ("b12x w4a16").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
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

double bf(double v) {
  return bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(v)));
}

Tensor fl(const std::vector<float>& v) {
  std::vector<double> d(v.begin(), v.end());
  return Tensor::from_vector(d, {static_cast<int64_t>(v.size())}, DType::kFloat32);
}

// The formula, in double with the kernel's bf16 points: g = bf16(fp32(alpha1 * acc)); silu h =
// bf16(bf16(g_gate * sigmoid(g_gate)) * g_up), relu2 h = bf16(relu(g)^2); per route
// bf16(bf16(acc2) * bf16(w * alpha2)); the routes summed in fp32 (one rounding) or, fused, each
// add rounded to bf16. The random data's scales are far above the flush threshold.
std::vector<double> expected(const moe_cute_test::Nvfp4MoeData& m, bool fused) {
  const int64_t N1 = m.n1();
  std::vector<double> out(static_cast<size_t>(m.T * m.H), 0.0);
  for (int64_t t = 0; t < m.T; ++t) {
    std::vector<double> acc(static_cast<size_t>(m.H), 0.0);
    for (int64_t k = 0; k < m.K; ++k) {
      const int64_t e = static_cast<int64_t>(m.ids[static_cast<size_t>(t * m.K + k)]);
      std::vector<double> g(static_cast<size_t>(N1));
      for (int64_t j = 0; j < N1; ++j) {
        double s = 0.0;
        for (int64_t d = 0; d < m.H; ++d)
          s += m.x[static_cast<size_t>(t * m.H + d)] * m.w1v(e, j, d);
        g[static_cast<size_t>(j)] =
            bf(static_cast<float>(m.a1[static_cast<size_t>(e)]) * static_cast<float>(s));
      }
      std::vector<double> h(static_cast<size_t>(m.I));
      for (int64_t j = 0; j < m.I; ++j) {
        if (m.gated) {
          const double gate = g[static_cast<size_t>(m.I + j)], up = g[static_cast<size_t>(j)];
          h[static_cast<size_t>(j)] = bf(bf(gate / (1.0 + std::exp(-gate))) * up);
        } else {
          const double v = std::max(g[static_cast<size_t>(j)], 0.0);
          h[static_cast<size_t>(j)] = bf(v * v);
        }
      }
      const double ws = bf(static_cast<float>(m.rw[static_cast<size_t>(t * m.K + k)]) *
                           static_cast<float>(m.a2[static_cast<size_t>(e)]));
      for (int64_t d = 0; d < m.H; ++d) {
        double y = 0.0;
        for (int64_t j = 0; j < m.I; ++j) y += h[static_cast<size_t>(j)] * m.w2v(e, d, j);
        const double term = bf(bf(static_cast<float>(y)) * ws);
        double& a = acc[static_cast<size_t>(d)];
        a = fused ? bf(a + term) : static_cast<float>(a + term);
      }
    }
    for (int64_t d = 0; d < m.H; ++d)
      out[static_cast<size_t>(t * m.H + d)] = bf(acc[static_cast<size_t>(d)]);
  }
  return out;
}

// One bf16 ulp: the sigmoid's exp (fp32 in the reference, double here) can move a rounding.
void expect_close(const Tensor& got, const std::vector<double>& want) {
  const auto g = got.to_double_vector();
  ASSERT_EQ(g.size(), want.size());
  int exact = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double tol = std::ldexp(1.0, std::ilogb(std::max(std::abs(want[i]), 1e-30)) - 7);
    EXPECT_NEAR(g[i], want[i], tol) << "index " << i;
    exact += g[i] == want[i];
  }
  EXPECT_GT(exact, static_cast<int>(g.size() * 9 / 10));  // almost all bit-exact
}

Tensor run_fn(moe_cute_test::Nvfp4MoeData& m, const std::string& act, const Tensor& a1,
              const Tensor& a2, const std::string& fmt = "modelopt") {
  return b12x_fused_moe(m.x_bf16(), m.w1_t(), m.s1_t(), m.w2_t(), m.s2_t(), m.ids_t(), m.rw_t(),
                        m.E, m.K, a1, a2, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                        std::nullopt, DType::kBFloat16, act, 1.702, 1.0, std::nullopt, "fp4",
                        "w4a16", fmt);
}

TEST(B12xW4a16, MatchesFormula) {
  for (const bool gated : {true, false}) {
    for (const int64_t T : {5, 3}) {  // 3 tokens: the TC-decode path when gated
      SCOPED_TRACE(::testing::Message() << "gated " << gated << " T " << T);
      moe_cute_test::Nvfp4MoeData m;
      m.gated = gated;
      m.T = T;
      m.make(7 + static_cast<uint64_t>(T));
      const Tensor out = run_fn(m, gated ? "silu" : "relu2", m.alpha(m.a1), m.alpha(m.a2));
      expect_close(out, expected(m, gated && T <= 4));
    }
  }
}

TEST(B12xW4a16, SixDScalesWrapperAndCompressedTensors) {
  moe_cute_test::Nvfp4MoeData m;
  m.make(11);
  const Tensor ref = run_fn(m, "silu", m.alpha(m.a1), m.alpha(m.a2));
  // compressed_tensors holds 1 / alpha; the op inverts it in fp32.
  std::vector<float> c1, c2, m1, m2;
  for (int64_t e = 0; e < m.E; ++e) {
    c1.push_back(1.0f / static_cast<float>(m.a1[static_cast<size_t>(e)]));
    c2.push_back(1.0f / static_cast<float>(m.a2[static_cast<size_t>(e)]));
    m1.push_back(1.0f / c1.back());
    m2.push_back(1.0f / c2.back());
  }
  EXPECT_TRUE(all_close(run_fn(m, "silu", fl(c1), fl(c2), "compressed_tensors"),
                        run_fn(m, "silu", fl(m1), fl(m2)).to_double_vector(), {0.0, 0.0}));
  m.six_d = true;
  EXPECT_TRUE(all_close(run_fn(m, "silu", m.alpha(m.a1), m.alpha(m.a2)), ref.to_double_vector(),
                        {0.0, 0.0}));
  m.six_d = false;
  B12xMoEWrapper w(m.E, m.K, m.H, m.I, false, 4096, std::nullopt, std::nullopt, DType::kBFloat16,
                   "cpu", "silu", 1.702, 1.0, std::nullopt, "bf16", std::nullopt, "modelopt");
  // fc2_input_scale and input_global_scale are ignored by w4a16.
  EXPECT_TRUE(all_close(w.run(m.x_bf16(), m.w1_t(), m.s1_t(), m.w2_t(), m.s2_t(), m.ids_t(),
                              m.rw_t(), m.alpha(m.a1), m.alpha(m.a2), fl({2.0f}), fl({3.0f})),
                        ref.to_double_vector(), {0.0, 0.0}));
}

// Hand-checked: 1 token, 1 expert, H = 64, I = 32, x = 1 on d < 32. w1 up row 0: code 2.0 with
// scale 1 on block 0 (sum 32) and code 6.0 with the subnormal scale 2^-7 on block 1 (0.75); w1
// gate row 32: 1.0 with scale 2^-4 on block 0 (sum 1); a zero block with scale 448 makes the
// rescale f = 1, so scales below 2^-6 are flushed: up = 32 (not 32.75), gate = 1.
// h0 = bf16(bf16(silu(1) = 0.7310586) * 32) = bf16(0.73046875 * 32) = 23.375. w2 row 0: 1.0,
// scale 1 at col 0, so acc2 = 23.375; w = 0.3, alpha2 = 1: bf16(0.3) = 0.30078125 and
// bf16(23.375 * 0.30078125 = 7.03076171875) = 7.03125 (one rounding of 23.375 * 0.3 gives 7.0;
// without the flush h0 = bf16(0.73046875 * 32.75) = 23.875 and the output 7.1875).
TEST(B12xW4a16, HandCheckedGolden) {
  moe_cute_test::Nvfp4MoeData m;
  m.T = 1;
  m.E = m.local = 1;
  m.K = 1;
  m.H = 64;
  m.I = 32;
  for (int64_t d = 0; d < m.H; ++d) m.x.push_back(d < 32 ? 1.0 : 0.0);
  m.w1.assign(static_cast<size_t>(64 * 32), 0);
  m.s1.assign(static_cast<size_t>(64 * 4), 0x38);                             // 1.0
  for (int c = 0; c < 8; ++c) m.w1[static_cast<size_t>(c)] = 0x44;            // 2.0, 2.0
  for (int c = 8; c < 16; ++c) m.w1[static_cast<size_t>(c)] = 0x77;           // 6.0, 6.0
  m.s1[1] = 0x04;                                                             // 2^-7
  for (int c = 0; c < 8; ++c) m.w1[static_cast<size_t>(32 * 32 + c)] = 0x22;  // 1.0, 1.0
  m.s1[32 * 4] = 0x18;                                                        // 2^-4
  m.s1[33 * 4] = 0x7E;                                                        // 448, zero weights
  m.w2.assign(static_cast<size_t>(64 * 16), 0);
  m.s2.assign(static_cast<size_t>(64 * 2), 0x38);
  m.w2[0] = 0x02;  // 1.0 at (row 0, col 0)
  m.a1 = {1.0};
  m.a2 = {1.0};
  m.ids = {0.0};
  m.rw = {0.3};
  const auto out = run_fn(m, "silu", m.alpha(m.a1), m.alpha(m.a2)).to_double_vector();
  EXPECT_EQ(out[0], 7.03125);
  for (size_t i = 1; i < out.size(); ++i) EXPECT_EQ(out[i], 0.0) << i;
}

TEST(B12xW4a16, BadInput) {
  moe_cute_test::Nvfp4MoeData m;
  m.make(3);
  const Tensor a1 = m.alpha(m.a1), a2 = m.alpha(m.a2);
  EXPECT_FI_ERROR(run_fn(m, "gelu_tanh", a1, a2), "b12x_fused_moe", "activation");
  EXPECT_FI_ERROR(run_fn(m, "swigluoai_uninterleave", a1, a2), "b12x_fused_moe", "activation");
  EXPECT_FI_ERROR(run_fn(m, "silu", fl({1.0f}), a2), "b12x_fused_moe", "w1_alpha");
  EXPECT_FI_ERROR(run_fn(m, "silu", a1, fl({1.0f})), "b12x_fused_moe", "w2_alpha");
  const Tensor a1d = Tensor::from_vector(m.a1, {m.E}, DType::kFloat64);
  EXPECT_FI_ERROR(run_fn(m, "silu", a1d, a2), "b12x_fused_moe", "w1_alpha");
  // w1 rows must be a multiple of 64 (relu2 with I = 32).
  moe_cute_test::Nvfp4MoeData r;
  r.gated = false;
  r.I = 32;
  r.make(4);
  EXPECT_FI_ERROR(run_fn(r, "relu2", r.alpha(r.a1), r.alpha(r.a2)), "b12x_fused_moe", "w1_weight");
  // Expert parallelism outside w4a16 (activation_precision "fp4": nvfp4): upstream's refusal.
  EXPECT_FI_ERROR_CODE(
      b12x_fused_moe(m.x_bf16(), m.w1_t(), m.s1_t(), m.w2_t(), m.s2_t(), m.ids_t(), m.rw_t(), m.E,
                     m.K, a1, a2, std::nullopt, std::nullopt, m.E - 1),
      "b12x_fused_moe", "quant_mode", ErrorCode::kUnsupported);
}

// Upstream 0.7.4's expert parallelism (w4a16 with expert_map, int32 [num_experts]): global
// expert g runs local weights expert_map[g]; a route to an expert this rank does not hold (-1)
// or an id outside [0, num_experts) is dropped, so the output is this rank's partial. It equals
// the call on the local experts alone with the routing mapped by hand (dropped routes -1, the
// unrouted slot), bit for bit, in the function and the wrapper (which validates and clones
// the map); then upstream's texts.
TEST(B12xW4a16, ExpertMapRunsTheLocalExperts) {
  moe_cute_test::Nvfp4MoeData m;
  m.make(31);                 // E experts of weights: the rank's local ones
  const int64_t G = 2 * m.E;  // global experts
  // Local expert l holds global expert 2 l + 1; the even ones live elsewhere.
  std::vector<double> map(static_cast<size_t>(G), -1.0);
  for (int64_t l = 0; l < m.E; ++l) map[static_cast<size_t>(2 * l + 1)] = static_cast<double>(l);
  const Tensor mt = Tensor::from_vector(map, {G}, DType::kInt32);
  // Global routing: the local id l as 2 l + 1, and every third route to an even (remote) one.
  const auto ids = m.ids_t().to_double_vector();
  std::vector<double> global, mapped;
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool remote = i % 3 == 0;
    global.push_back(remote ? 2.0 * ids[i] : 2.0 * ids[i] + 1.0);
    mapped.push_back(remote ? -1.0 : ids[i]);
  }
  const Tensor gids = Tensor::from_vector(global, m.ids_t().shape(), DType::kInt32);
  const Tensor lids = Tensor::from_vector(mapped, m.ids_t().shape(), DType::kInt32);
  const Tensor a1 = m.alpha(m.a1), a2 = m.alpha(m.a2);
  auto call = [&](const Tensor& route, int64_t experts, std::optional<int64_t> local,
                  std::optional<Tensor> emap) {
    return b12x_fused_moe(m.x_bf16(), m.w1_t(), m.s1_t(), m.w2_t(), m.s2_t(), route, m.rw_t(),
                          experts, m.K, a1, a2, std::nullopt, std::nullopt, local, emap,
                          std::nullopt, DType::kBFloat16, "silu", 1.702, 1.0, std::nullopt, "bf16");
  };
  const Tensor want = call(lids, m.E, std::nullopt, std::nullopt);
  EXPECT_EQ(testing::bytes_of(call(gids, G, m.E, mt)), testing::bytes_of(want));
  B12xMoEWrapper w(G, m.K, m.H, m.I, false, 4096, m.E, mt, DType::kBFloat16, "cpu", "silu", 1.702,
                   1.0, std::nullopt, "bf16");
  EXPECT_EQ(testing::bytes_of(
                w.run(m.x_bf16(), m.w1_t(), m.s1_t(), m.w2_t(), m.s2_t(), gids, m.rw_t(), a1, a2)),
            testing::bytes_of(want));
  const char* op = "b12x_fused_moe";
  testing::expect_error_text(
      [&] { (void)call(gids, G, m.E, std::nullopt); }, op, "expert_map",
      "requires expert_map. A default map would silently assume this rank holds global "
      "experts [0, ");
  testing::expect_error_text([&] { (void)call(gids, G, m.E, mt.to(DType::kInt64)); }, op,
                             "expert_map",
                             "expert_map must have dtype torch.int32, got torch.int64");
  testing::expect_error_text([&] { (void)call(gids, G, m.E, mt.slice(0, 0, G - 1).contiguous()); },
                             op, "expert_map", "expert_map must have num_experts=");
  const char* init = "B12xMoEWrapper.__init__";
  std::vector<double> twice = map;
  twice[0] = 0.0;  // local expert 0 mapped twice
  testing::expect_error_text(
      [&] {
        B12xMoEWrapper bad(G, m.K, m.H, m.I, false, 4096, m.E,
                           Tensor::from_vector(twice, {G}, DType::kInt32), DType::kBFloat16, "cpu",
                           "silu", 1.702, 1.0, std::nullopt, "bf16");
      },
      init, "expert_map", "expert_map must map every local expert id exactly once: expected [0, ");
  std::vector<double> past = map;
  past[0] = static_cast<double>(m.E);
  testing::expect_error_text(
      [&] {
        B12xMoEWrapper bad(G, m.K, m.H, m.I, false, 4096, m.E,
                           Tensor::from_vector(past, {G}, DType::kInt32), DType::kBFloat16, "cpu",
                           "silu", 1.702, 1.0, std::nullopt, "bf16");
      },
      init, "expert_map", "expert_map values must be -1 or valid local expert ids");
  // shared_output: CUDA-graph wrappers only; run returns its first T rows.
  testing::expect_error_text(
      [&] {
        B12xMoEWrapper bad(m.E, m.K, m.H, m.I, false, 4096, std::nullopt, std::nullopt,
                           DType::kBFloat16, "cpu", "silu", 1.702, 1.0, std::nullopt, "bf16",
                           std::nullopt, "modelopt", std::nullopt, std::nullopt,
                           Tensor::zeros({8, m.H}, DType::kBFloat16));
      },
      init, "use_cuda_graph", "require use_cuda_graph=True");
  Tensor shared = Tensor::zeros({8, m.H}, DType::kBFloat16);
  B12xMoEWrapper g(m.E, m.K, m.H, m.I, true, 8, std::nullopt, std::nullopt, DType::kBFloat16, "cpu",
                   "silu", 1.702, 1.0, std::nullopt, "bf16", std::nullopt, "modelopt", std::nullopt,
                   std::nullopt, shared);
  const Tensor got =
      g.run(m.x_bf16(), m.w1_t(), m.s1_t(), m.w2_t(), m.s2_t(), lids, m.rw_t(), a1, a2);
  EXPECT_EQ(got.data_ptr(), shared.data_ptr());
  EXPECT_EQ(testing::bytes_of(shared.slice(0, 0, m.T)), testing::bytes_of(want));
}

TEST(B12xW4a16, RecordReplay) {
  moe_cute_test::Nvfp4MoeData m;
  m.make(21);
  const Tensor x = m.x_bf16(), w1 = m.w1_t(), s1 = m.s1_t(), w2 = m.w2_t(), s2 = m.s2_t();
  const Tensor a1 = m.alpha(m.a1), a2 = m.alpha(m.a2);
  std::optional<B12xMoEWrapper> w;
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    (void)b12x_fused_moe(x, w1, s1, w2, s2, m.ids_t(), m.rw_t(), m.E, m.K, a1, a2, std::nullopt,
                         std::nullopt, std::nullopt, std::nullopt, std::nullopt, DType::kBFloat16,
                         "silu", 1.702, 1.0, std::nullopt, "bf16", std::nullopt,
                         "compressed_tensors");
    w.emplace(m.E, m.K, m.H, m.I, false, 4096, std::nullopt, std::nullopt, DType::kBFloat16, "cpu",
              "silu", 1.702, 1.0, std::nullopt, "fp4", "w4a16", "modelopt");
    (void)w->run(x, w1, s1, w2, s2, m.ids_t(), m.rw_t(), a1, a2);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 3u);
  moe_cute_test::expect_wrapper_calls_replay(calls);
}

}  // namespace
}  // namespace flashinfer::testing
