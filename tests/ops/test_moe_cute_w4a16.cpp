// CuteDslMoEWrapper with quant_mode "w4a16" (bf16 x, NVFP4 weights): hand-checked goldens of
// the kernel's rounding points (bf16 intermediate, bf16 finalize), fp64 formulas (SwiGLU with and
// without parameters, Relu2, expert parallelism, both finalize paths), bad input naming the
// argument, in-memory record/replay, and a torch-written dump in upstream's format.
// Sources: docs/MOE.md ("CuteDslMoEWrapper: w4a16").
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
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

using moe_fp4::bytes_tensor;

constexpr double kFltMax = 3.4028234663852886e38;

double bf16(double v) {
  return bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(v)));
}

// The problem (moe_cute_test::Nvfp4MoeData) in the CuTe-DSL layout, with the W4A16 formula.
struct W4a16Case : moe_cute_test::Nvfp4MoeData {
  W4a16Case() { cute = true; }

  // fp64 formula of launch_w4a16_moe: g = alpha1 * (x @ W1.T); SwiGLU (clamp and beta only with
  // non-default parameters) or relu^2; h rounded to bf16. Fused finalize: each (t, k) adds
  // bf16((alpha2 * s) * (h @ W2.T)) into a bf16 output; two-stage: bf16(alpha2 * (h @ W2.T))
  // times s accumulated in k order, rounded once.
  // act: 3 Swiglu (or SiTU when situ_b > 0: situ_b * tanh(gate / situ_b) * sigmoid(gate) times
  // up, or times situ_lb * tanh(up / situ_lb) when situ_lb > 0), 8 GegluTanh (up *
  // gelu_tanh(gate)), 6 Relu2 (from `gated`).
  std::vector<double> expected(bool fused, double sa = 1.0, double sb = 0.0, double sl = kFltMax,
                               int64_t act = 3, double situ_b = 0.0, double situ_lb = 0.0) const {
    const bool param = sa != 1.0 || sb != 0.0 || sl != kFltMax;
    std::vector<double> out(static_cast<size_t>(T * H), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = static_cast<int64_t>(ids[static_cast<size_t>(t * K + k)]) - offset;
        if (e < 0 || e >= local) continue;
        std::vector<double> h(static_cast<size_t>(I));
        for (int64_t j = 0; j < I; ++j) {
          auto proj = [&](int64_t row) {
            double g = 0.0;
            for (int64_t d = 0; d < H; ++d) g += x[static_cast<size_t>(t * H + d)] * w1v(e, row, d);
            return a1[static_cast<size_t>(e)] * g;
          };
          double v;
          if (gated && act == 8) {
            const double up = proj(j), gate = proj(I + j);
            const double z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate);
            v = up * 0.5 * gate * (1.0 + std::tanh(z));
          } else if (gated && situ_b > 0.0) {
            double up = proj(j);
            const double gate = proj(I + j);
            if (situ_lb > 0.0) up = situ_lb * std::tanh(up / situ_lb);
            v = up * situ_b * std::tanh(gate / situ_b) / (1.0 + std::exp(-gate));
          } else if (gated) {
            double up = proj(j), gate = proj(I + j);
            if (param) {
              gate = std::min(gate, sl);
              up = std::clamp(up, -sl, sl) + sb;
            }
            v = up * gate / (1.0 + std::exp(-sa * gate));
          } else {
            const double r = std::max(proj(j), 0.0);
            v = r * r;
          }
          h[static_cast<size_t>(j)] = bf16(v);
        }
        const double s = rw[static_cast<size_t>(t * K + k)], al2 = a2[static_cast<size_t>(e)];
        for (int64_t d = 0; d < H; ++d) {
          double y = 0.0;
          for (int64_t j = 0; j < I; ++j) y += h[static_cast<size_t>(j)] * w2v(e, d, j);
          double& o = out[static_cast<size_t>(t * H + d)];
          o = fused ? bf16(o + bf16(al2 * s * y)) : o + bf16(al2 * y) * s;
        }
      }
    }
    if (!fused) {
      for (double& o : out) o = bf16(o);
    }
    return out;
  }
};

CuteDslMoEWrapper w4a16_wrapper(const W4a16Case& c, int64_t act = 3, bool fused = true,
                                double sa = 1.0, double sb = 0.0, double sl = kFltMax) {
  return CuteDslMoEWrapper(c.E, c.K, c.H, c.I, false, std::nullopt, c.local, c.offset, 128, 16,
                           DType::kBFloat16, "cuda", true, act, sa, sb, sl, std::nullopt,
                           std::nullopt, fused, "w4a16");
}

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// ---- hand-checked goldens ---------------------------------------------------------------------

// Relu2, E = 4 with experts 0 and 1 local (identical weights, unit alphas), H = I = 64. w1 rows:
// r0 = 1.0 at column 0; r1 = 0.5 at column 0 with block scale 0.125 (0.0625); r2 = 1.0 at
// column 1. w2 rows: d0 = 1.0 at columns 0 and 1; d1 = 1.0 at column 2 and -1.0 at column 0.
// x = [1, 0, ...] gives h = [1, 2^-8, 0], so y[d0] = 1 + 2^-8 and y[d1] = -1.
//  token 0, experts (0, 1), scales (0.75, 0.5):
//    fused: bf16(0.75 * 1.00390625 = 0.7529296875) = 0.75390625, bf16(0.501953125) = 0.5 (tie
//    to even), bf16(1.25390625) = 1.25 (tie to even); d1: -0.75 - 0.5 = -1.25.
//    two-stage: bf16(1.00390625) = 1.0 (tie to even), 0.75 + 0.5 = 1.25; d1 -1.25.
//    (One rounding of the exact sum 1.2548828125 would give 1.2578125.)
//  token 1, experts (0, 3 not local), scales (0.75, 0.25):
//    fused: d0 0.75390625, d1 -0.75; two-stage: d0 bf16(1.00390625) * 0.75 = 0.75, d1 -0.75.
//  token 2, x = [1, 1.0234375, 0, ...], experts (1, 3), scales (1, 0.5): h2 = bf16(1.0234375^2 =
//    1.04742431640625) = 1.046875, so d1 = 1.046875 - 1 = 0.046875 (without the bf16 rounding
//    of h: 0.04736328125); d0 = bf16(1.00390625) = 1.0 on both paths.
TEST(CuteDslW4a16, HandCheckedRoundingPoints) {
  const int64_t E = 4, El = 2, H = 64, I = 64, T = 3;
  std::vector<uint8_t> w1(static_cast<size_t>(El * I * H / 2), 0), w2(w1.size(), 0);
  std::vector<uint8_t> s1(static_cast<size_t>(El * I * H / 16), 0x38), s2(s1.size(), 0x38);
  for (int64_t e = 0; e < El; ++e) {
    uint8_t* a = &w1[static_cast<size_t>(e * I * H / 2)];
    a[0] = 0x02;                                              // r0 c0 = 1.0
    a[H / 2] = 0x01;                                          // r1 c0 = 0.5
    s1[static_cast<size_t>(e * I * H / 16 + H / 16)] = 0x20;  // r1 block 0 scale 0.125
    a[2 * (H / 2)] = 0x20;                                    // r2 c1 = 1.0
    uint8_t* b = &w2[static_cast<size_t>(e * H * I / 2)];
    b[0] = 0x22;          // d0 c0 = c1 = 1.0
    b[I / 2] = 0x0A;      // d1 c0 = -1.0
    b[I / 2 + 1] = 0x02;  // d1 c2 = 1.0
  }
  std::vector<double> x(static_cast<size_t>(T * H), 0.0);
  x[0] = 1.0;
  x[H] = 1.0;
  x[2 * H] = 1.0;
  x[2 * H + 1] = 1.0234375;
  const Tensor xt = Tensor::from_vector(x, {T, H}, DType::kBFloat16);
  const Tensor ids = Tensor::from_vector({0, 1, 0, 3, 1, 3}, {T, 2}, DType::kInt32);
  const Tensor rw = Tensor::from_vector({0.75, 0.5, 0.75, 0.25, 1.0, 0.5}, {T, 2}, DType::kFloat32);
  const Tensor ones = Tensor::from_vector({1.0, 1.0}, {El}, DType::kFloat32);
  const Tensor w1t = bytes_tensor(w1, {El, I, H / 2}), w2t = bytes_tensor(w2, {El, H, I / 2});
  const Tensor s1t = block_scale_interleave(bytes_tensor(s1, {El, I, H / 16}));
  const Tensor s2t = block_scale_interleave(bytes_tensor(s2, {El, H, I / 16}));
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused finalize" : "two-stage finalize");
    CuteDslMoEWrapper w(E, 2, H, I, false, std::nullopt, El, 0, 128, 16, DType::kBFloat16, "cuda",
                        true, 6, 1.0, 0.0, kFltMax, std::nullopt, std::nullopt, fused, "w4a16");
    const Tensor out =
        w.run(xt, std::nullopt, ids, rw, w1t, s1t, ones, std::nullopt, w2t, s2t, ones);
    ASSERT_EQ(out.dtype(), DType::kBFloat16);
    ASSERT_EQ(out.shape(), Shape({T, H}));
    std::vector<double> expect(static_cast<size_t>(T * H), 0.0);
    expect[0] = 1.25;
    expect[1] = -1.25;
    expect[H] = fused ? 0.75390625 : 0.75;
    expect[H + 1] = -0.75;
    expect[2 * H] = 1.0;
    expect[2 * H + 1] = 0.046875;
    EXPECT_TRUE(all_close(out, expect, {0.0, 0.0}));
  }
}

// ---- fp64 formulas ----------------------------------------------------------------------------

TEST(CuteDslW4a16, MatchesFormula) {
  struct Variant {
    const char* name;
    bool gated, six_d, fused;
    int64_t offset, local;
    double sa, sb, sl;
    int64_t act = 3;
    double situ_b = 0.0, situ_lb = 0.0;
  };
  for (const Variant& v :
       {Variant{"swiglu, fused", true, true, true, 0, 8, 1.0, 0.0, kFltMax},
        Variant{"geglu tanh, fused", true, false, true, 0, 8, 1.0, 0.0, kFltMax, 8},
        Variant{"situ, two-stage", true, false, false, 0, 8, 1.0, 0.0, kFltMax, 3, 0.75},
        Variant{"situ with linear beta, fused", true, true, true, 4, 4, 1.0, 0.0, kFltMax, 3, 0.75,
                2.0},
        Variant{"swiglu, two-stage", true, false, false, 0, 8, 1.0, 0.0, kFltMax},
        Variant{"swiglu params, EP rank 1", true, false, true, 4, 4, 1.702, 1.0, 2.0},
        Variant{"relu2, two-stage", false, true, false, 0, 8, 1.0, 0.0, kFltMax},
        Variant{"relu2, EP rank 1, fused", false, false, true, 4, 4, 1.0, 0.0, kFltMax}}) {
    SCOPED_TRACE(v.name);
    W4a16Case c;
    c.gated = v.gated;
    c.six_d = v.six_d;
    c.offset = v.offset;
    c.local = v.local;
    c.make(51);
    const auto expect = c.expected(v.fused, v.sa, v.sb, v.sl, v.act, v.situ_b, v.situ_lb);
    EXPECT_GT(max_abs(expect), 0.25);
    const auto beta = [](double b) { return b > 0.0 ? std::optional<double>(b) : std::nullopt; };
    CuteDslMoEWrapper w(c.E, c.K, c.H, c.I, false, std::nullopt, c.local, c.offset, 128, 16,
                        DType::kBFloat16, "cuda", true, v.gated ? v.act : 6, v.sa, v.sb, v.sl,
                        beta(v.situ_b), beta(v.situ_lb), v.fused, "w4a16");
    const Tensor out = w.run(c.x_bf16(), std::nullopt, c.ids_t(), c.rw_t(), c.w1_t(), c.s1_t(),
                             c.alpha(c.a1), std::nullopt, c.w2_t(), c.s2_t(), c.alpha(c.a2));
    EXPECT_EQ(out.dtype(), DType::kBFloat16);
    // The formula sums in fp64 where the reference rounds sums to fp32: a bf16 value of h or of a
    // finalize term may land one ulp apart, hence one bf16 ulp of tolerance.
    EXPECT_TRUE(all_close(out, expect, {1e-3 * max_abs(expect), 1.0 / 128}));
  }
}

// The activation's bf16 rounding and the finalize path are visible in the result: the two paths
// differ on this problem, and each equals its own formula above.
TEST(CuteDslW4a16, FinalizePathsDiffer) {
  W4a16Case c;
  c.make(52);
  auto run = [&](bool fused) {
    CuteDslMoEWrapper w = w4a16_wrapper(c, 3, fused);
    return w
        .run(c.x_bf16(), std::nullopt, c.ids_t(), c.rw_t(), c.w1_t(), c.s1_t(), c.alpha(c.a1),
             std::nullopt, c.w2_t(), c.s2_t(), c.alpha(c.a2))
        .to_double_vector();
  };
  const auto a = run(true), b = run(false);
  EXPECT_NE(a, b);
  EXPECT_TRUE(all_close(a, b, {max_abs(a) / 128, 1.0 / 64}));
}

// ---- bad input --------------------------------------------------------------------------------

TEST(CuteDslW4a16, BadInput) {
  const char* init = "CuteDslMoEWrapper.__init__";
  const char* run = "CuteDslMoEWrapper.run";
  EXPECT_FI_ERROR(CuteDslMoEWrapper(8, 2, 128, 64, false, std::nullopt, std::nullopt, 0, 128, 16,
                                    DType::kFloat32, "cuda", true, 3, 1.0, 0.0, kFltMax,
                                    std::nullopt, std::nullopt, true, "w4a16"),
                  init, "output_dtype");
  W4a16Case c;
  c.make(53);
  const Tensor x = c.x_bf16(), w1 = c.w1_t(), s1 = c.s1_t(), w2 = c.w2_t(), s2 = c.s2_t();
  const Tensor a1 = c.alpha(c.a1), a2 = c.alpha(c.a2), ids = c.ids_t(), rw = c.rw_t();
  CuteDslMoEWrapper w = w4a16_wrapper(c);
  const Tensor one = Tensor::from_vector({1.0}, {1}, DType::kFloat32);
  const Tensor xs = Tensor::zeros({c.T, c.H / 16}, DType::kUInt8);
  EXPECT_FI_ERROR(w.run(x, xs, ids, rw, w1, s1, a1, std::nullopt, w2, s2, a2), run, "x_sf");
  EXPECT_FI_ERROR(w.run(x, std::nullopt, ids, rw, w1, s1, a1, one, w2, s2, a2), run,
                  "fc2_input_scale");
  EXPECT_FI_ERROR(w.run(x, std::nullopt, ids, rw, w1, s1, a1, std::nullopt, w2, s2, a2,
                        std::nullopt, Tensor::full({c.T}, 1.0, DType::kFloat32)),
                  run, "per_token_scale");
  EXPECT_FI_ERROR(
      w.run(x.to(DType::kFloat32), std::nullopt, ids, rw, w1, s1, a1, std::nullopt, w2, s2, a2),
      run, "x");
  EXPECT_FI_ERROR(w.run(Tensor::zeros({c.T, 64}, DType::kBFloat16), std::nullopt, ids, rw, w1, s1,
                        a1, std::nullopt, w2, s2, a2),
                  run, "x");
  EXPECT_FI_ERROR(
      w.run(x, std::nullopt, ids, rw.to(DType::kBFloat16), w1, s1, a1, std::nullopt, w2, s2, a2),
      run, "token_final_scales");
  EXPECT_FI_ERROR(w.run(x, std::nullopt, ids, rw, Tensor::zeros({8, 64, 64}, DType::kUInt8), s1, a1,
                        std::nullopt, w2, s2, a2),
                  run, "w1_weight");
  EXPECT_FI_ERROR(w.run(x, std::nullopt, ids, rw, w1, Tensor::zeros({7}, DType::kUInt8), a1,
                        std::nullopt, w2, s2, a2),
                  run, "w1_weight_sf");
  EXPECT_FI_ERROR(w.run(x, std::nullopt, ids, rw, w1, s1, Tensor::zeros({3}, DType::kFloat32),
                        std::nullopt, w2, s2, a2),
                  run, "w1_alpha");
  EXPECT_FI_ERROR(w.run(x, std::nullopt, ids, rw, w1, s1, a1, std::nullopt, w2, s2,
                        Tensor::zeros({3}, DType::kFloat32)),
                  run, "w2_alpha");
  // validate_cute_dsl_moe_situ_config, at construction: situ_linear_beta needs situ_beta, SiTU
  // needs Swiglu, positive finite betas.
  auto situ = [](int64_t act, std::optional<double> b, std::optional<double> lb) {
    return CuteDslMoEWrapper(8, 2, 128, 64, false, std::nullopt, std::nullopt, 0, 128, 16,
                             DType::kBFloat16, "cuda", true, act, 1.0, 0.0, kFltMax, b, lb, true,
                             "w4a16");
  };
  EXPECT_FI_ERROR(situ(3, std::nullopt, 2.0), init, "situ_linear_beta");
  EXPECT_FI_ERROR(situ(8, 2.0, std::nullopt), init, "situ_beta");
  EXPECT_FI_ERROR(situ(3, -1.0, std::nullopt), init, "situ_beta");
  EXPECT_FI_ERROR(situ(3, 1e300, std::nullopt), init, "situ_beta");
  EXPECT_FI_ERROR(situ(3, 2.0, 0.0), init, "situ_linear_beta");
}

// ---- record / replay --------------------------------------------------------------------------

TEST(CuteDslW4a16, RecordReplay) {
  W4a16Case c;
  c.offset = 4;
  c.local = 4;
  c.make(54);
  const Tensor x = c.x_bf16(), w1 = c.w1_t(), s1 = c.s1_t(), w2 = c.w2_t(), s2 = c.s2_t();
  std::optional<CuteDslMoEWrapper> w;
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    w.emplace(c.E, c.K, c.H, c.I, false, std::nullopt, c.local, c.offset, 128, 16, DType::kBFloat16,
              "cuda", true, 3, 1.0, 0.0, kFltMax, std::nullopt, std::nullopt, false, "w4a16");
    (void)w->run(x, std::nullopt, c.ids_t(), c.rw_t(), w1, s1, c.alpha(c.a1), std::nullopt, w2, s2,
                 c.alpha(c.a2));
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  ASSERT_TRUE(calls[0].error.empty()) << calls[0].error;
  EXPECT_NO_THROW((void)replay(calls[0]));
  EXPECT_TRUE(replays_identically(calls[1]));
}

// ---- a dump in upstream's format --------------------------------------------------------------

// Written by torch (1.13) as upstream's recorder writes it: CuteDslMoEWrapper constructed with
// quant_mode "w4a16" as SGLang's ensure_cutedsl_wrapper builds it on EP rank 1 of 2 (experts 4..7
// local) and run with SGLang's keywords (x bf16, x_sf and fc2_input_scale None); then a Relu2
// wrapper with use_fused_finalize=False. __init__ records carry the object as arg_0 and share
// self_id with the run records. Expected outputs: torch in fp32 with the kernel's rounding points
// (docs/MOE.md). Every call replays and passes.
TEST(CuteDslW4a16, UpstreamDumpReplays) {
  const std::string body = std::string(moe_cute_test::kScaleLayoutPy) + R"PY(
def bf(v):
    return v.bfloat16().float()

torch.manual_seed(3)
T, E, H, I, K = 4, 8, 128, 128, 2
ids = torch.tensor([[5, 0], [6, 4], [2, 7], [4, 1]], dtype=torch.int32)
rw = torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.55, 0.45], [0.8, 0.2]])
x = (torch.rand(T, H) * 2 - 1).bfloat16()
BF16 = {"type": "torch.dtype", "value": "torch.bfloat16"}

def case(El, off, gated, fused, self_id):
    n1 = 2 * I if gated else I
    w1 = rbytes((El, n1, H // 2))        # stored rows
    w2 = rbytes((El, H, I // 2))
    s1 = torch.randint(0x18, 0x21, (El, n1, H // 16))  # e4m3 0.0625 .. 0.125
    s2 = torch.randint(0x18, 0x21, (El, H, I // 16))
    # interleave_linear_and_gate(w1, 64): stored row s holds plain row lg[s].
    lg = torch.arange(n1).view(2, n1 // 128, 64).transpose(0, 1).reshape(-1) if gated else torch.arange(n1)
    a1, a2 = torch.linspace(0.75, 1.25, El), torch.linspace(1.25, 0.75, El)
    out = torch.zeros(T, H)
    for t in range(T):
        acc = torch.zeros(H)
        for k in range(K):
            e = int(ids[t, k]) - off
            if not 0 <= e < El:
                continue
            st = fp4_values(w1[e]) * E4M3[s1[e]].repeat_interleave(16, 1)
            W1 = torch.empty_like(st)
            W1[lg] = st
            W2 = fp4_values(w2[e]) * E4M3[s2[e]].repeat_interleave(16, 1)
            g = a1[e] * (W1 @ x[t].float())
            if gated:
                h = bf(g[:I] * (g[I:] * torch.sigmoid(g[I:])))
            else:
                h = bf(torch.relu(g) ** 2)
            y = W2 @ h
            if fused:  # bf16((alpha2 * s) * y) reduce-added into the bf16 output
                acc = bf(acc + bf((a2[e] * rw[t, k]) * y))
            else:      # bf16(alpha2 * y) * s accumulated in fp32, rounded once
                acc = acc + bf(a2[e] * y) * rw[t, k]
        out[t] = acc
    obj = {"type": "CuteDslMoEWrapper",
           "repr": "<flashinfer.fused_moe.cute_dsl.fused_moe.CuteDslMoEWrapper object at 0x%x>" % self_id}
    meta = {"arg_0": obj, "kwarg_num_experts": E, "kwarg_top_k": K, "kwarg_hidden_size": H,
            "kwarg_intermediate_size": I, "kwarg_use_cuda_graph": True,
            "kwarg_max_num_tokens": 64, "kwarg_num_local_experts": El,
            "kwarg_local_expert_offset": off, "kwarg_output_dtype": BF16,
            "kwarg_device": "cuda:0", "kwarg_quant_mode": "w4a16"}
    if not gated:
        meta["kwarg_activation_type"] = 6
    if not fused:
        meta["kwarg_use_fused_finalize"] = False
    record("CuteDslMoEWrapper.__init__", "flashinfer.fused_moe.cute_dsl.fused_moe", {}, meta,
           None, self_id=self_id)
    sf1 = mma_view(torch.stack([interleave_128x4(s1[e].to(torch.uint8)) for e in range(El)]), El, n1, H // 16)
    sf2 = mma_view(torch.stack([interleave_128x4(s2[e].to(torch.uint8)) for e in range(El)]), El, H, I // 16)
    record("CuteDslMoEWrapper.run", "flashinfer.fused_moe.cute_dsl.fused_moe",
           {"kwarg_x": x, "kwarg_token_selected_experts": ids, "kwarg_token_final_scales": rw,
            "kwarg_w1_weight": w1, "kwarg_w1_weight_sf": sf1, "kwarg_w1_alpha": a1,
            "kwarg_w2_weight": w2, "kwarg_w2_weight_sf": sf2, "kwarg_w2_alpha": a2},
           {"arg_0": obj, "kwarg_x_sf": None, "kwarg_fc2_input_scale": None},
           out.bfloat16(), self_id=self_id)

case(4, 4, True, True, 139637976730001)
case(8, 0, False, False, 139637976730002)
)PY";
  std::vector<replay::Result> results;
  if (!run_upstream_dump_script("fi_moe_cute_w4a16", body, 4u, &results)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
  for (const auto& r : results) {
    if (r.function_name.ends_with(".__init__")) continue;
    ASSERT_FALSE(r.comparisons.empty()) << r.function_name;
    EXPECT_EQ(r.comparisons[0].key, "result") << r.function_name;
  }
}

}  // namespace
}  // namespace flashinfer::testing
