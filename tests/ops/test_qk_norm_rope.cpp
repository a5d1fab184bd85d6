// fused_qk_rmsnorm_rope (flashinfer.norm): fp64 formula of upstream's test reference (RMSNorm
// across heads, 3D RoPE, interleaved and NeoX), hand-checked positions, YaRN, fp8 outputs, V
// copy; bad inputs; declaration; record/replay (live and through dump directories).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

constexpr DType kBf = DType::kBFloat16;

struct Cfg {
  int64_t batch = 0;  // 0: 2-D qkv of `seqs` sequences
  int64_t seqs = 1, ppf = 2, pph = 3, ppw = 2;
  int64_t hq = 2, hk = 1, hv = 3, d = 64;
  int64_t fc = 24, hc = 20, wc = 20;
  bool interleave = true, norm = true;
  double factor = 1.0, low = 0.0, high = 0.0, attn = 1.0;
};

std::tuple<Tensor, Tensor, Tensor> run(const Cfg& c, const Tensor& qkv, const Tensor& qw,
                                       const Tensor& kw, bool fp8 = false, double qs = 1.0,
                                       double vs = 1.0) {
  return fused_qk_rmsnorm_rope(qkv, qw, kw, c.ppf, c.pph, c.ppw, c.fc, c.hc, c.wc, c.hq, c.hk, c.hv,
                               c.d, 1e-6, 10000.0, c.interleave, c.factor, c.low, c.high, c.attn,
                               c.norm, fp8, qs, vs);
}

// fp64 reference: upstream's test (nn.RMSNorm over H*D in bf16, then the rotation), with the
// frequencies and sections of its NeoX/interleaved tables and YaRN as the kernel's host table.
std::vector<double> reference(const Cfg& c, const Tensor& qkv, const Tensor& w, bool is_q) {
  const int64_t seq = c.ppf * c.pph * c.ppw;
  const int64_t tokens = qkv.numel() / ((c.hq + c.hk + c.hv) * c.d);
  const int64_t heads = is_q ? c.hq : c.hk, n = heads * c.d, row = (c.hq + c.hk + c.hv) * c.d;
  const auto x = qkv.to_double_vector(), wv = w.to_double_vector();
  std::vector<double> out(static_cast<size_t>(tokens * n));
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> v(static_cast<size_t>(n));
    double ss = 0.0;
    for (int64_t e = 0; e < n; ++e) {
      v[e] = x[t * row + (is_q ? 0 : c.hq * c.d) + e];
      ss += v[e] * v[e];
    }
    if (c.norm) {
      const double r = 1.0 / std::sqrt(ss / static_cast<double>(n) + 1e-6);
      for (int64_t e = 0; e < n; ++e) {
        v[e] = static_cast<double>(
            bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(v[e] * r * wv[e]))));
      }
    }
    const int64_t s = t % seq;
    const int64_t pos[3] = {s / (c.pph * c.ppw), (s % (c.pph * c.ppw)) / c.ppw, s % c.ppw};
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < c.d / 2; ++i) {
        int sec = 2 * i < c.fc ? 0 : (2 * i < c.fc + c.hc ? 1 : 2);
        const int64_t start = sec == 0 ? 0 : (sec == 1 ? c.fc : c.fc + c.hc);
        const int64_t size = sec == 0 ? c.fc : (sec == 1 ? c.hc : c.wc);
        const double j = static_cast<double>(i - start / 2);
        double f = std::pow(10000.0, -2.0 * j / static_cast<double>(size));
        if (c.factor != 1.0) {
          const double hi = std::fabs(c.low - c.high) <= 1e-6 ? c.high + 0.001 : c.high;
          const double ramp = std::min(std::max((j - c.low) / (hi - c.low), 0.0), 1.0);
          f = f / c.factor * ramp + f * (1.0 - ramp);
        }
        const double th = static_cast<double>(pos[sec]) * f;
        const int64_t a = c.interleave ? 2 * i : i, b = c.interleave ? 2 * i + 1 : i + c.d / 2;
        const double xa = v[h * c.d + a], xb = v[h * c.d + b];
        out[t * n + h * c.d + a] = (xa * std::cos(th) - xb * std::sin(th)) * c.attn;
        out[t * n + h * c.d + b] = (xb * std::cos(th) + xa * std::sin(th)) * c.attn;
      }
    }
  }
  return out;
}

struct Inputs {
  Tensor qkv, qw, kw;
};
Inputs inputs(const Cfg& c, uint64_t seed) {
  const int64_t seq = c.ppf * c.pph * c.ppw, row = (c.hq + c.hk + c.hv) * c.d;
  Shape shape = c.batch > 0 ? Shape{c.batch, seq, row} : Shape{c.seqs * seq, row};
  return {rand_tensor(shape, kBf, seed), rand_tensor({c.hq * c.d}, kBf, seed + 1, 0.5, 1.5),
          rand_tensor({c.hk * c.d}, kBf, seed + 2, 0.5, 1.5)};
}

TEST(FusedQkRmsnormRope, MatchesFp64FormulaOverModes) {
  std::vector<Cfg> grid;
  for (bool il : {true, false}) {
    Cfg c;
    c.interleave = il;
    grid.push_back(c);
    c.batch = 2;
    c.d = 128, c.fc = 44, c.hc = 42, c.wc = 42;  // WAN's split: 2 * (D / 6) for h and w
    grid.push_back(c);
    c = Cfg{};
    c.interleave = il;
    c.seqs = 2, c.norm = false;
    grid.push_back(c);
    c = Cfg{};
    c.interleave = il;
    c.d = 256, c.fc = 86, c.hc = 84, c.wc = 86, c.hq = 1, c.hk = 2, c.hv = 1;
    c.factor = 4.0, c.low = 2.0, c.high = 20.0, c.attn = 1.25;  // YaRN
    grid.push_back(c);
  }
  uint64_t seed = 1;
  for (const Cfg& c : grid) {
    SCOPED_TRACE("d=" + std::to_string(c.d) + " interleave=" + std::to_string(c.interleave) +
                 " norm=" + std::to_string(c.norm) + " batch=" + std::to_string(c.batch) +
                 " factor=" + std::to_string(c.factor));
    const Inputs in = inputs(c, seed += 3);
    auto [q, k, v] = run(c, in.qkv, in.qw, in.kw);
    const int64_t tokens = in.qkv.numel() / ((c.hq + c.hk + c.hv) * c.d);
    EXPECT_EQ(q.dim(), c.batch > 0 ? 4 : 3);
    EXPECT_EQ(q.numel(), tokens * c.hq * c.d);
    EXPECT_TRUE(all_close(q, reference(c, in.qkv, in.qw, true), {1e-2, 1e-2}));
    EXPECT_TRUE(all_close(k, reference(c, in.qkv, in.kw, false), {1e-2, 1e-2}));
    // V: an exact copy of the qkv's V slice.
    const auto x = in.qkv.to_double_vector(), vv = v.to_double_vector();
    const int64_t row = (c.hq + c.hk + c.hv) * c.d, nv = c.hv * c.d;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t e = 0; e < nv; ++e) {
        ASSERT_EQ(vv[t * nv + e], x[t * row + (c.hq + c.hk) * c.d + e]);
      }
    }
  }
}

TEST(FusedQkRmsnormRope, HandCheckedPositions) {
  // Token 0 is at (0, 0, 0): no rotation, so q is the bf16 RMSNorm, and without the norm the
  // input itself. Token 1 (ppw = 2) is at w = 1: only the width channels rotate, by 1 rad at
  // their first pair (freq base^0 = 1).
  Cfg c;
  c.norm = false;
  c.hq = c.hk = c.hv = 1;
  Tensor qkv = Tensor::zeros({12, 3 * 64}, kBf);
  auto* p = static_cast<uint16_t*>(qkv.data_ptr());
  for (int64_t e = 0; e < 64; ++e) {
    p[e] = float_to_bfloat16_bits(0.5f);                          // token 0, q
    p[3 * 64 + e] = float_to_bfloat16_bits(e % 2 ? 0.0f : 1.0f);  // token 1, q: (1, 0) pairs
  }
  Tensor w = Tensor::full({64}, 1.0, kBf);
  auto [q, k, v] = run(c, qkv, w, w);
  const auto qv = q.to_double_vector();
  for (int64_t e = 0; e < 64; ++e) EXPECT_EQ(qv[e], 0.5) << e;
  // Token 1: pair 22 (channel 44, the first width pair) -> (cos 1, sin 1).
  EXPECT_NEAR(qv[64 + 44], std::cos(1.0), 4e-3);
  EXPECT_NEAR(qv[64 + 45], std::sin(1.0), 4e-3);
  // Frame and height pairs do not rotate at t = h = 0.
  for (int64_t e = 0; e < 44; ++e) EXPECT_EQ(qv[64 + e], e % 2 ? 0.0 : 1.0) << e;
  // With the norm: mean square 0.25 -> x / 0.5 = 1.0 at token 0.
  c.norm = true;
  auto [q2, k2, v2] = run(c, qkv, w, w);
  for (int64_t e = 0; e < 64; ++e) EXPECT_NEAR(q2.to_double_vector()[e], 1.0, 1e-2);
}

TEST(FusedQkRmsnormRope, Fp8OutputsAreSaturatedScaledValues) {
  Cfg c;
  const Inputs in = inputs(c, 40);
  auto [qb, kb, vb] = run(c, in.qkv, in.qw, in.kw);
  auto [q, k, v] = run(c, in.qkv, in.qw, in.kw, true, 100.0, 300.0);
  EXPECT_EQ(q.dtype(), DType::kFloat8E4M3FN);
  EXPECT_EQ(v.dtype(), DType::kFloat8E4M3FN);
  // V: e4m3(satfinite(v * 300)) exactly; |v| < 2 so some saturate at 448.
  const auto x = in.qkv.to_double_vector(), vv = v.to_double_vector();
  const int64_t row = (c.hq + c.hk + c.hv) * c.d, nv = c.hv * c.d;
  bool saturated = false;
  for (int64_t t = 0; t < 12; ++t) {
    for (int64_t e = 0; e < nv; ++e) {
      const float s = static_cast<float>(x[t * row + (c.hq + c.hk) * c.d + e]) * 300.0f;
      ASSERT_EQ(vv[t * nv + e], e4m3fn_bits_to_float(float_to_e4m3fn_bits(s, true)));
      saturated |= std::fabs(vv[t * nv + e]) == 448.0;
    }
  }
  EXPECT_TRUE(saturated);
  // Q: the bf16 result times 100 within e4m3's step (the fp8 path skips the bf16 rounding).
  const auto q8 = q.to_double_vector(), q16 = qb.to_double_vector();
  for (size_t i = 0; i < q8.size(); ++i) {
    const double want = std::min(448.0, std::max(-448.0, q16[i] * 100.0));
    ASSERT_NEAR(q8[i], want, std::fabs(want) / 8.0 + 0.5) << i;
  }
}

TEST(FusedQkRmsnormRope, OutBuffersAreWritten) {
  Cfg c;
  c.batch = 1;
  const Inputs in = inputs(c, 50);
  Tensor qo = Tensor::zeros({1, 12, 2, 64}, kBf), ko = Tensor::zeros({1, 12, 1, 64}, kBf),
         vo = Tensor::zeros({1, 12, 3, 64}, kBf);
  auto [q, k, v] =
      fused_qk_rmsnorm_rope(in.qkv, in.qw, in.kw, 2, 3, 2, 24, 20, 20, 2, 1, 3, 64, 1e-6, 10000.0,
                            true, 1.0, 0.0, 0.0, 1.0, true, false, 1.0, 1.0, qo, ko, vo);
  EXPECT_EQ(q.data_ptr(), qo.data_ptr());
  EXPECT_EQ(v.data_ptr(), vo.data_ptr());
  auto [q2, k2, v2] = run(c, in.qkv, in.qw, in.kw);
  EXPECT_TRUE(all_close(qo, q2, {0.0, 0.0}));
  EXPECT_TRUE(all_close(ko, k2, {0.0, 0.0}));
}

TEST(FusedQkRmsnormRopeBadInput, ErrorsNameOpAndArgument) {
  const char* op = "fused_qk_rmsnorm_rope";
  Cfg c;
  const Inputs in = inputs(c, 60);
  auto call = [&](const Tensor& qkv, const Tensor& qw, const Tensor& kw, Cfg g, bool fp8 = false,
                  std::optional<Tensor> qo = std::nullopt) {
    (void)fused_qk_rmsnorm_rope(qkv, qw, kw, g.ppf, g.pph, g.ppw, g.fc, g.hc, g.wc, g.hq, g.hk,
                                g.hv, g.d, 1e-6, 10000.0, g.interleave, g.factor, g.low, g.high,
                                g.attn, g.norm, fp8, 1.0, 1.0, qo);
  };
  EXPECT_FI_ERROR(call(in.qkv.to(DType::kFloat16), in.qw, in.kw, c), op, "qkv");
  EXPECT_FI_ERROR(call(in.qkv.view({-1}), in.qw, in.kw, c), op, "qkv");
  EXPECT_FI_ERROR(call(in.qkv.slice(0, 0, 11), in.qw, in.kw, c), op, "qkv");  // 11 % 12
  EXPECT_FI_ERROR(call(rand_tensor({12, 2 * 64}, kBf, 1), in.qw, in.kw, c), op, "qkv");
  EXPECT_FI_ERROR(call(rand_tensor({2, 24, 6 * 64}, kBf, 1), in.qw, in.kw, c), op, "qkv");
  Cfg g = c;
  g.d = 96, g.fc = 32, g.hc = 32, g.wc = 32;
  EXPECT_FI_ERROR(call(in.qkv, in.qw, in.kw, g), op, "head_dim");
  g = c;
  g.hq = 33;
  EXPECT_FI_ERROR(call(in.qkv, in.qw, in.kw, g), op, "num_heads_q");
  g = c;
  g.fc = 26;
  EXPECT_FI_ERROR(call(in.qkv, in.qw, in.kw, g), op, "num_frame_channels");
  g = c;
  g.fc = 23, g.hc = 21;
  EXPECT_FI_ERROR(call(in.qkv, in.qw, in.kw, g), op, "num_frame_channels");
  g = c;
  g.ppw = 0;
  EXPECT_FI_ERROR(call(in.qkv, in.qw, in.kw, g), op, "ppw");
  g = c;
  g.attn = 2.0;
  EXPECT_FI_ERROR(call(in.qkv, in.qw, in.kw, g), op, "attention_factor");
  EXPECT_FI_ERROR(call(in.qkv, in.kw, in.kw, c), op, "q_weight");
  EXPECT_FI_ERROR(call(in.qkv, in.qw, in.kw.to(DType::kFloat32), c), op, "k_weight");
  EXPECT_FI_ERROR(call(in.qkv, in.qw, in.kw, c, false,
                       Tensor::zeros({12, 2, 64}, kBf).to(DType::kFloat8E4M3FN)),
                  op, "q_out");
  EXPECT_FI_ERROR(call(in.qkv, in.qw, in.kw, c, false, Tensor::zeros({12, 1, 64}, kBf)), op,
                  "q_out");
  EXPECT_FI_ERROR(
      call(in.qkv, in.qw, in.kw, c, false, Tensor::zeros({12, 64, 2}, kBf).transpose(1, 2)), op,
      "q_out");
}

TEST(FusedQkRmsnormRopeDecl, SignatureModuleCpuOnly) {
  const OpDecl* d = OpRegistry::global().find("fused_qk_rmsnorm_rope");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->module, "flashinfer.norm");
  EXPECT_EQ(d->signature(),
            "(qkv, q_weight, k_weight, *, ppf, pph, ppw, num_frame_channels, num_height_channels, "
            "num_width_channels, num_heads_q, num_heads_k, num_heads_v, head_dim, eps=1e-06, "
            "base=10000.0, interleave=True, factor=1.0, low=0.0, high=0.0, attention_factor=1.0, "
            "is_qk_norm=True, output_fp8=False, output_quant_scale=1.0, v_quant_scale=1.0, "
            "q_out=None, k_out=None, v_out=None)");
  EXPECT_TRUE(op_has_backend("fused_qk_rmsnorm_rope", DeviceType::kCPU));
  EXPECT_EQ(op_has_backend("fused_qk_rmsnorm_rope", DeviceType::kCUDA), cuda_compiled());
}

// ---- record and replay ------------------------------------------------------------------------

void run_every_call(const Inputs& in) {
  Cfg c;
  (void)run(c, in.qkv, in.qw, in.kw);
  c.interleave = false;
  (void)run(c, in.qkv, in.qw, in.kw, true, 50.0, 60.0);
}

TEST(FusedQkRmsnormRope, RecordAndReplay) {
  const Inputs in = inputs(Cfg{}, 70);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    run_every_call(in);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& c : calls) EXPECT_TRUE(replays_identically(c));
}

TEST(FusedQkRmsnormRope, DumpReplayPasses) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_qknr_rec_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const Inputs in = inputs(Cfg{}, 80);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  run_every_call(in);
  recorder::stop();
  std::vector<fs::path> calls;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) calls.push_back(e.path());
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& c : calls) {
    const replay::Result r = replay::replay_from_dump(c.string());
    EXPECT_EQ(r.status, replay::Status::kPassed) << c << ": " << r.error;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashinfer::testing
