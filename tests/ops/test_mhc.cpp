// flashinfer.mhc (DeepSeek-V4's hyper-connections): mhc_post bit for bit against upstream's
// multiply-add order and against fp64, a hand-checked case; mhc_pre_big_fuse against an fp64
// Sinkhorn, the split partials, the prenorm form equal to the explicit sum of squares; bad
// inputs; declarations; record / replay; CUDA against the CPU when a GPU is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

constexpr DType kBf = DType::kBFloat16;
constexpr DType kF32 = DType::kFloat32;

float bf16r(double v) {
  return bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(v)));
}

struct PostIn {
  Tensor x, residual, post, comb;
};
PostIn post_inputs(const Shape& outer, int64_t H, bool post_rank2, uint64_t seed) {
  auto with = [&](std::initializer_list<int64_t> tail) {
    Shape s = outer;
    s.insert(s.end(), tail.begin(), tail.end());
    return s;
  };
  PostIn in;
  in.x = rand_tensor(with({H}), kBf, seed);
  in.residual = rand_tensor(with({4, H}), kBf, seed + 1);
  in.post = rand_tensor(post_rank2 ? with({4, 1}) : with({4}), kF32, seed + 2);
  in.comb = rand_tensor(with({4, 4}), kF32, seed + 3);
  return in;
}

// Upstream's kernel order, written out here: x * post_j rounded once, then fma over the streams
// 0..3, then bf16.
std::vector<double> post_by_upstream_order(const PostIn& in, int64_t T, int64_t H) {
  const auto x = in.x.to_double_vector(), r = in.residual.to_double_vector(),
             p = in.post.to_double_vector(), c = in.comb.to_double_vector();
  std::vector<double> out(static_cast<size_t>(T * 4 * H));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < 4; ++j) {
      for (int64_t h = 0; h < H; ++h) {
        float acc = static_cast<float>(x[t * H + h]) * static_cast<float>(p[t * 4 + j]);
        for (int64_t i = 0; i < 4; ++i) {
          acc = std::fma(static_cast<float>(r[(t * 4 + i) * H + h]),
                         static_cast<float>(c[(t * 4 + i) * 4 + j]), acc);
        }
        out[(t * 4 + j) * H + h] = bf16r(acc);
      }
    }
  }
  return out;
}

TEST(MhcPost, UpstreamOrderBitForBitAndFp64) {
  for (const auto& [outer, H, rank2] : {std::tuple<Shape, int64_t, bool>{{1}, 64, false},
                                        {{2, 3}, 127, true},
                                        {{3}, 4096, false}}) {
    const PostIn in = post_inputs(outer, H, rank2, 10 + H);
    const int64_t T = in.x.numel() / H;
    Tensor out = mhc_post(in.x, in.residual, in.post, in.comb);
    EXPECT_EQ(out.shape(), in.residual.shape());
    EXPECT_EQ(out.dtype(), kBf);
    EXPECT_EQ(out.to_double_vector(), post_by_upstream_order(in, T, H)) << H;
    // And the fp64 formula within bf16 rounding.
    const auto x = in.x.to_double_vector(), r = in.residual.to_double_vector(),
               p = in.post.to_double_vector(), c = in.comb.to_double_vector();
    std::vector<double> ref(out.numel());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < 4; ++j) {
        for (int64_t h = 0; h < H; ++h) {
          double v = x[t * H + h] * p[t * 4 + j];
          for (int64_t i = 0; i < 4; ++i) v += c[(t * 4 + i) * 4 + j] * r[(t * 4 + i) * H + h];
          ref[(t * 4 + j) * H + h] = v;
        }
      }
    }
    EXPECT_TRUE(all_close(out.to_double_vector(), ref, {2e-2, 1e-2})) << H;
  }
}

TEST(MhcPost, HandChecked) {
  // One token, H = 1: x = 2, streams r = [1, 2, 3, 4], post = [1, 0, 0.5, -1], comb the identity
  // plus comb[3][0] = 1: out_j = 2 post_j + r_j, and out_0 also gets r_3.
  Tensor x = Tensor::from_vector({2}, {1, 1}, kBf);
  Tensor r = Tensor::from_vector({1, 2, 3, 4}, {1, 4, 1}, kBf);
  Tensor post = Tensor::from_vector({1, 0, 0.5, -1}, {1, 4}, kF32);
  std::vector<double> comb(16, 0.0);
  for (int i = 0; i < 4; ++i) comb[i * 4 + i] = 1.0;
  comb[3 * 4 + 0] = 1.0;
  Tensor out = mhc_post(x, r, post, Tensor::from_vector(comb, {1, 4, 4}, kF32));
  EXPECT_EQ(out.to_double_vector(), (std::vector<double>{2 + 1 + 4, 0 + 2, 1 + 3, -2 + 4}));
}

// ---- mhc_pre_big_fuse ---------------------------------------------------------------------------

struct PreIn {
  Tensor dot_mix, sqrsum, residual, scale, base;
  int64_t T = 0, H = 0, S = 1;
};
PreIn pre_inputs(int64_t T, int64_t H, int64_t S, uint64_t seed) {
  PreIn in;
  in.T = T, in.H = H, in.S = S;
  const Shape lead = S > 1 ? Shape{S, T} : Shape{T};
  Shape dm = lead;
  dm.push_back(24);
  in.dot_mix = rand_tensor(dm, kF32, seed, -0.02, 0.02);
  in.sqrsum = rand_tensor(lead, kF32, seed + 1, 0.0, 4.0 * H / S);
  in.residual = rand_tensor({T, 4, H}, kBf, seed + 2, -0.02, 0.02);
  in.scale = rand_tensor({3}, kF32, seed + 3, -0.5, 0.5);
  in.base = rand_tensor({24}, kF32, seed + 4, -0.5, 0.5);
  return in;
}

struct PreRef {
  std::vector<double> post, comb, layer_input;
};
// fp64: the same steps and eps placement as upstream's test reference.
PreRef pre_reference(const PreIn& in, double k, int repeat, double post_mult, double eps) {
  const auto dm = in.dot_mix.to_double_vector(), sq = in.sqrsum.to_double_vector(),
             r = in.residual.to_double_vector(), sc = in.scale.to_double_vector(),
             b = in.base.to_double_vector();
  PreRef out;
  for (int64_t t = 0; t < in.T; ++t) {
    double y[24] = {}, q = 0.0;
    for (int64_t s = 0; s < in.S; ++s) {
      for (int c = 0; c < 24; ++c) y[c] += dm[(s * in.T + t) * 24 + c];
      q += sq[s * in.T + t];
    }
    const double rstd = 1.0 / std::sqrt(q / k + 1e-6);
    auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
    double pre[4];
    for (int c = 0; c < 4; ++c) {
      pre[c] = sig(y[c] * rstd * sc[0] + b[c]) + 1e-6;
      out.post.push_back(sig(y[4 + c] * rstd * sc[1] + b[4 + c]) * post_mult);
    }
    double m[4][4];
    for (int i = 0; i < 4; ++i) {
      double L[4], mx = -1e300, s = 0.0;
      for (int j = 0; j < 4; ++j) L[j] = y[8 + 4 * i + j] * rstd * sc[2] + b[8 + 4 * i + j];
      for (double l : L) mx = std::max(mx, l);
      for (int j = 0; j < 4; ++j) s += std::exp(L[j] - mx);
      for (int j = 0; j < 4; ++j) m[i][j] = std::exp(L[j] - mx) / s + eps;
    }
    auto cols = [&] {
      for (int j = 0; j < 4; ++j) {
        const double cs = m[0][j] + m[1][j] + m[2][j] + m[3][j];
        for (auto& row : m) row[j] /= cs + eps;
      }
    };
    cols();
    for (int it = 1; it < repeat; ++it) {
      for (auto& row : m) {
        const double rs = row[0] + row[1] + row[2] + row[3] + eps;
        for (double& v : row) v /= rs;
      }
      cols();
    }
    for (auto& row : m) out.comb.insert(out.comb.end(), row, row + 4);
    for (int64_t h = 0; h < in.H; ++h) {
      double acc = 0.0;
      for (int i = 0; i < 4; ++i) acc += pre[i] * r[(t * 4 + i) * in.H + h];
      out.layer_input.push_back(acc);
    }
  }
  return out;
}

TEST(MhcPre, MatchesFp64SinkhornWithSplits) {
  for (int64_t S : {1, 4}) {
    for (int repeat : {1, 3, 20}) {
      const PreIn in = pre_inputs(5, 64, S, 100 + S * 10 + repeat);
      auto [post, comb, li] = mhc_pre_big_fuse(in.dot_mix, in.sqrsum, in.residual, in.scale,
                                               in.base, 4 * 64, 1e-6, 1e-6, 1e-6, 2.0, repeat, S);
      EXPECT_EQ(post.shape(), (Shape{5, 4, 1}));
      EXPECT_EQ(comb.shape(), (Shape{5, 4, 4}));
      EXPECT_EQ(li.shape(), (Shape{5, 64}));
      EXPECT_EQ(li.dtype(), kBf);
      const PreRef ref = pre_reference(in, 4 * 64, repeat, 2.0, 1e-6);
      EXPECT_TRUE(all_close(post.to_double_vector(), ref.post, {1e-6, 1e-5})) << S << repeat;
      EXPECT_TRUE(all_close(comb.to_double_vector(), ref.comb, {1e-6, 1e-5})) << S << repeat;
      EXPECT_TRUE(all_close(li.to_double_vector(), ref.layer_input, default_tolerance(kBf)));
      // Sinkhorn ends on a column step: every column sums to col / (col + eps), about 1.
      const auto c = comb.to_double_vector();
      for (int64_t t = 0; t < 5; ++t) {
        for (int j = 0; j < 4; ++j) {
          double cs = 0.0;
          for (int i = 0; i < 4; ++i) cs += c[t * 16 + i * 4 + j];
          EXPECT_NEAR(cs, 1.0, 1e-5);
        }
      }
    }
  }
}

TEST(MhcPre, PrenormEqualsTheExplicitSumOfSquares) {
  const PreIn in = pre_inputs(3, 128, 1, 200);
  // The sum of squares of each token's 4H values, fused multiply-adds in order, as the CPU
  // reference takes it: then both ops see the same q and agree bit for bit.
  const auto r = in.residual.to_double_vector();
  std::vector<double> sq(3);
  for (int64_t t = 0; t < 3; ++t) {
    float q = 0.0f;
    for (int64_t i = 0; i < 4 * 128; ++i) {
      const auto v = static_cast<float>(r[t * 512 + i]);
      q = std::fma(v, v, q);
    }
    sq[t] = q;
  }
  auto [p1, c1, l1] = mhc_pre_big_fuse(in.dot_mix, Tensor::from_vector(sq, {3}, kF32), in.residual,
                                       in.scale, in.base, 4 * 128);
  auto [p2, c2, l2] =
      mhc_pre_big_fuse_with_prenorm(in.dot_mix.unsqueeze(0), in.residual, in.scale, in.base);
  EXPECT_EQ(p1.to_double_vector(), p2.to_double_vector());
  EXPECT_EQ(c1.to_double_vector(), c2.to_double_vector());
  EXPECT_EQ(l1.to_double_vector(), l2.to_double_vector());
}

TEST(MhcBadInput, ErrorsNameOpAndArgument) {
  const PostIn in = post_inputs({2}, 16, false, 300);
  EXPECT_FI_ERROR(mhc_post(in.x.to(kF32), in.residual, in.post, in.comb), "mhc_post", "x");
  EXPECT_FI_ERROR(mhc_post(in.x, in.residual.slice(1, 0, 3), in.post, in.comb), "mhc_post",
                  "residual");
  EXPECT_FI_ERROR(mhc_post(in.x, in.residual, in.comb, in.comb), "mhc_post", "post_layer_mix");
  EXPECT_FI_ERROR(mhc_post(in.x, in.residual, in.post, in.post), "mhc_post", "comb_res_mix");
  EXPECT_FI_ERROR(mhc_post(in.x.slice(1, 0, 8), in.residual, in.post, in.comb), "mhc_post", "x");
  const PreIn p = pre_inputs(2, 16, 1, 301);
  const char* op = "mhc_pre_big_fuse";
  EXPECT_FI_ERROR(mhc_pre_big_fuse(p.dot_mix, p.sqrsum, p.residual, p.scale, p.base, 64, 1e-6, 1e-6,
                                   1e-6, 1.0, 20, 3),
                  op, "num_splits");
  EXPECT_FI_ERROR(mhc_pre_big_fuse(p.dot_mix, p.sqrsum, p.residual, p.scale, p.base, 0), op, "k");
  EXPECT_FI_ERROR(mhc_pre_big_fuse(p.dot_mix, p.sqrsum, p.residual, p.scale, p.base, 64, 0.0), op,
                  "rms_eps");
  EXPECT_FI_ERROR(mhc_pre_big_fuse(p.dot_mix, p.sqrsum, p.residual, p.scale, p.base, 64, NAN), op,
                  "rms_eps");
  EXPECT_FI_ERROR(mhc_pre_big_fuse(p.dot_mix, p.sqrsum, p.residual, p.scale, p.base, 64, 1e-6, 1e-6,
                                   1e-6, 1.0, 0),
                  op, "sinkhorn_repeat");
  EXPECT_FI_ERROR(
      mhc_pre_big_fuse(p.dot_mix, p.sqrsum, p.residual.slice(2, 0, 12), p.scale, p.base, 48), op,
      "residual");  // hidden size 12: not a multiple of 8
  EXPECT_FI_ERROR(
      mhc_pre_big_fuse(p.dot_mix.unsqueeze(0), p.sqrsum, p.residual, p.scale, p.base, 64), op,
      "dot_mix");  // num_splits 1 takes no split dimension
  EXPECT_FI_ERROR(
      mhc_pre_big_fuse(p.dot_mix, p.sqrsum.unsqueeze(0), p.residual, p.scale, p.base, 64), op,
      "sqrsum");
  EXPECT_FI_ERROR(mhc_pre_big_fuse(p.dot_mix, p.sqrsum, p.residual, p.base, p.base, 64), op,
                  "mhc_scale");
  EXPECT_FI_ERROR(mhc_pre_big_fuse(p.dot_mix, p.sqrsum, p.residual, p.scale, p.scale, 64), op,
                  "mhc_base");
  EXPECT_FI_ERROR(mhc_pre_big_fuse_with_prenorm(p.dot_mix.unsqueeze(0).unsqueeze(0), p.residual,
                                                p.scale, p.base),
                  "mhc_pre_big_fuse_with_prenorm", "dot_mix");
}

TEST(MhcDecl, SignaturesModuleBackends) {
  struct D {
    const char* name;
    const char* sig;
  };
  for (const D d :
       {D{"mhc_post", "(x, residual, post_layer_mix, comb_res_mix)"},
        D{"mhc_pre_big_fuse",
          "(dot_mix, sqrsum, residual, mhc_scale, mhc_base, k, rms_eps=1e-06, mhc_pre_eps=1e-06, "
          "mhc_sinkhorn_eps=1e-06, mhc_post_mult_value=1.0, sinkhorn_repeat=20, num_splits=1, "
          "block_size=0)"},
        D{"mhc_pre_big_fuse_with_prenorm",
          "(dot_mix, residual, mhc_scale, mhc_base, rms_eps=1e-06, mhc_pre_eps=1e-06, "
          "mhc_sinkhorn_eps=1e-06, mhc_post_mult_value=1.0, sinkhorn_repeat=20, block_size=0)"}}) {
    const OpDecl* decl = OpRegistry::global().find(d.name);
    ASSERT_NE(decl, nullptr) << d.name;
    EXPECT_EQ(decl->module, "flashinfer.mhc");
    EXPECT_EQ(decl->signature(), d.sig);
    EXPECT_TRUE(op_has_backend(d.name, DeviceType::kCPU));
    EXPECT_EQ(op_has_backend(d.name, DeviceType::kCUDA), cuda_compiled());
  }
}

void run_mhc_ops() {
  const PostIn in = post_inputs({2, 2}, 24, true, 400);
  (void)mhc_post(in.x, in.residual, in.post, in.comb);
  const PreIn p = pre_inputs(3, 32, 2, 401);
  (void)mhc_pre_big_fuse(p.dot_mix, p.sqrsum, p.residual, p.scale, p.base, 128, 1e-6, 1e-6, 1e-6,
                         2.0, 20, 2);
  const PreIn q = pre_inputs(3, 32, 1, 402);
  (void)mhc_pre_big_fuse_with_prenorm(q.dot_mix, q.residual, q.scale, q.base);
}

TEST(MhcReplay, RecordAndReplay) {
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    run_mhc_ops();
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 3u);
  for (const auto& c : calls) EXPECT_TRUE(replays_identically(c)) << c.name;
}

TEST(MhcReplay, DumpReplayPasses) { EXPECT_EQ(dump_replay_all("mhc", run_mhc_ops), 3); }

// ---- CUDA against the CPU -----------------------------------------------------------------------

Tensor cuda(const Tensor& t) { return to_keep_layout(t, Device::cuda(0)); }

TEST(MhcCuda, PostIsBitIdenticalToTheCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (int64_t H : {127, 4096, 7168}) {  // the element path and the 128-bit path
    const PostIn in = post_inputs({3, 2}, H, H == 127, 500 + H);
    Tensor c = mhc_post(in.x, in.residual, in.post, in.comb);
    Tensor g = mhc_post(cuda(in.x), cuda(in.residual), cuda(in.post), cuda(in.comb));
    EXPECT_EQ(g.to(Device::cpu()).to_double_vector(), c.to_double_vector()) << H;
  }
}

TEST(MhcCuda, PreOpsMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (int64_t S : {1, 8}) {
    const PreIn in = pre_inputs(7, 4096, S, 600 + S);
    auto [pc, cc, lc] = mhc_pre_big_fuse(in.dot_mix, in.sqrsum, in.residual, in.scale, in.base,
                                         4 * 4096, 1e-6, 1e-6, 1e-6, 2.0, 20, S);
    auto [pg, cg, lg] =
        mhc_pre_big_fuse(cuda(in.dot_mix), cuda(in.sqrsum), cuda(in.residual), cuda(in.scale),
                         cuda(in.base), 4 * 4096, 1e-6, 1e-6, 1e-6, 2.0, 20, S);
    EXPECT_TRUE(all_close(pg.to(Device::cpu()), pc, {1e-6, 1e-5})) << S;
    EXPECT_TRUE(all_close(cg.to(Device::cpu()), cc, {1e-6, 1e-5})) << S;
    EXPECT_TRUE(all_close(lg.to(Device::cpu()), lc, default_tolerance(kBf))) << S;
  }
  const PreIn in = pre_inputs(5, 7168, 1, 700);
  auto [pc, cc, lc] = mhc_pre_big_fuse_with_prenorm(in.dot_mix, in.residual, in.scale, in.base);
  auto [pg, cg, lg] = mhc_pre_big_fuse_with_prenorm(cuda(in.dot_mix), cuda(in.residual),
                                                    cuda(in.scale), cuda(in.base));
  EXPECT_TRUE(all_close(pg.to(Device::cpu()), pc, {1e-6, 1e-5}));
  EXPECT_TRUE(all_close(cg.to(Device::cpu()), cc, {1e-6, 1e-5}));
  EXPECT_TRUE(all_close(lg.to(Device::cpu()), lc, default_tolerance(kBf)));
}

}  // namespace
}  // namespace flashinfer::testing
