// The chunked gated-delta-rule prefill kernel (src/kernels/cuda/gdn_chunk_cuda.cu), checked on
// the CPU: its shared-memory layout, its fragment addressing through the emulated ldmatrix /
// mma.sync (tests/util/mma_emulation.h), the gate sums and the inverse it computes
// (kernels/gdn_chunk_rules.h), the chunked form's algebra in fp64 against the token recurrence,
// the kernel's rounding points against the library's CPU reference at upstream's tolerances, and
// which calls it takes.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "kernels/cuda/gdn_chunk_shape.h"
#include "kernels/gdn_chunk_rules.h"
#include "util/gdn_chunk_emulation.h"
#include "util/mma_emulation.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

namespace gs = kernels::cuda::gdn_chunk;
namespace gc = kernels::gdn_chunk;
using mma_emu::Frag4;
using mma_emu::Pair;
using Acc = std::array<std::array<double, 4>, 32>;  // a 16 x 8 accumulator tile, [lane][e]

TEST(GdnChunkShape, LayoutFitsSm80AndSm90WithConflictFreeRows) {
  const gs::Layout a = gs::layout(128), b = gs::layout(64);
  // A stage: Q, K 2 x 17408, V 9216, raw gates 512; then M', T 2 x 9216, L, X 2 x 17408, 5 x 256.
  EXPECT_EQ(a.stage, 44544u);
  EXPECT_EQ(a.bytes, 99072u);
  EXPECT_EQ(b.bytes, 82688u);
  EXPECT_LE(a.bytes, 101376u);  // fits 99 KiB a block (sm_86 / 89), so 2 blocks on sm_90
  // Two stages: one more stage, one block an SM; within sm_80's 163 KiB.
  EXPECT_EQ(gs::layout(128, 2).bytes, 99072u + 44544u);
  EXPECT_LE(gs::layout(128, 2).bytes, 166912u);
  EXPECT_EQ(gs::layout(64, 2).bytes, 82688u + 28160u);
  for (const gs::Layout& s : {a, b, gs::layout(128, 2), gs::layout(64, 2)}) {
    for (uint32_t off : {s.q, s.k, s.v, s.alpha_raw, s.beta_raw, s.stage, s.m, s.t, s.l, s.x, s.w,
                         s.g, s.counts, s.beta, s.gamma, s.tail}) {
      EXPECT_EQ(off % 16, 0u);
    }
    EXPECT_EQ(s.w, s.t);  // the merges' W lives in T's place, T written after the last merge
    EXPECT_GE(s.l - s.t, 3u * 256 * 4);
    EXPECT_GE(s.m, s.stage);  // the stages before everything shared by them
  }
  EXPECT_EQ(gs::layout(128, 2).m, 2 * gs::layout(128).stage);
  // 16-bit rows 16 bytes past a multiple of 128: an ldmatrix's 8 rows hit 8 bank groups.
  for (int cols : {64, 128}) EXPECT_EQ(gs::io_ld(cols) * 2 % 128, 16) << cols;
  EXPECT_EQ(gs::kFloatLd * 4 % 128, 16);
  EXPECT_EQ(gs::kThreads, 128);
  EXPECT_EQ(gs::kSlice, 64);
}

// Two copy stages where every block has an SM and the device gives a block their shared
// memory; else one (two blocks an SM overlap each other's copies on sm_90).
TEST(GdnChunkShape, CopyStagesForAGrid) {
  EXPECT_EQ(gs::stages_for(128, 64, 132, 232448), 2);  // one sequence, 32 heads: 64 blocks
  EXPECT_EQ(gs::stages_for(128, 132, 132, 232448), 2);
  EXPECT_EQ(gs::stages_for(128, 133, 132, 232448), 1);  // past one wave
  EXPECT_EQ(gs::stages_for(128, 64, 108, 166912), 2);   // sm_80: 163 KiB
  EXPECT_EQ(gs::stages_for(128, 64, 84, 101376), 1);    // sm_86: 99 KiB, one stage
  EXPECT_EQ(gs::stages_for(64, 8, 84, 101376), 1);      // 110848 bytes for two stages at 64
  EXPECT_EQ(gs::stages_for(64, 8, 84, 110848), 2);
}

// Emulated shared memory holding matrices at the kernel's padded leading dimensions.
struct Tile {
  uint32_t base;
  int ld;
};
void put(mma_emu::Smem& sm, Tile t, const std::vector<double>& m, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) sm.slot.at((t.base + 2u * (r * t.ld + c)) / 2) = m[r * cols + c];
  }
}
Frag4 load(const mma_emu::Smem& sm, Tile t, int row0, int col0, int (*row)(int), int (*col)(int),
           bool trans) {
  std::array<uint32_t, 32> addr{};
  for (int l = 0; l < 32; ++l) addr[l] = t.base + 2u * ((row0 + row(l)) * t.ld + col0 + col(l));
  return mma_emu::ldmatrix_x4(sm, addr, trans);
}
void mma2(std::vector<Acc>& c, int p, const Frag4& a, const Frag4& b) {
  mma_emu::mma(c[2 * p], a, mma_emu::half_of(b, 0));
  mma_emu::mma(c[2 * p + 1], a, mma_emu::half_of(b, 2));
}
// Element (row, col) of accumulator tiles along the columns.
double at(const std::vector<Acc>& c, int row, int col) {
  for (int l = 0; l < 32; ++l) {
    for (int e = 0; e < 4; ++e) {
      if (gs::acc_row(l, e) == row && gs::acc_col(l, e) == col % 8) return c[col / 8][l][e];
    }
  }
  return NAN;
}
Frag4 acc_to_a(const std::vector<Acc>& c, int ks) {
  Frag4 a{};
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 4; ++i) {
      const int nt = gs::a_from_acc_tile(ks, i), e0 = gs::a_from_acc_elem(i);
      a[l][i] = Pair{c[nt][l][e0], c[nt][l][e0 + 1]};
    }
  }
  return a;
}
std::vector<double> ints(int n, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(-3, 3);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// One warp's products as the kernel issues them, at head dim 128, warp 2 (rows 32..47), on small
// integers (exact): KK's rows from K K^T, P = S K^T with S from accumulator tiles, V^T through
// the transposing load, and the state update's K as a transposed B operand.
TEST(GdnChunkShape, FragmentAddressingMultipliesThroughEmulatedMma) {
  constexpr int KD = 128, B = gc::kChunk, warp = 2;
  const gs::Layout lay = gs::layout(KD);
  const Tile kt{lay.k, gs::io_ld(KD)}, vt{lay.v, gs::io_ld(B)};
  std::mt19937 rng(7);
  const auto K = ints(B * KD, rng), V = ints(B * B, rng), S = ints(16 * KD, rng);
  mma_emu::Smem sm;
  put(sm, kt, K, B, KD);
  put(sm, vt, V, B, B);
  // KK rows 16 warp..: A from K's rows, B from K's rows.
  {
    std::vector<Acc> c(8, Acc{});
    for (int ks = 0; ks < KD / 16; ++ks) {
      const Frag4 a = load(sm, kt, 16 * warp, 16 * ks, gs::a_row, gs::a_col, false);
      for (int p = 0; p < 4; ++p)
        mma2(c, p, a, load(sm, kt, 16 * p, 16 * ks, gs::b_row, gs::b_col, false));
    }
    for (int r = 0; r < 16; ++r) {
      for (int t = 0; t < B; ++t) {
        double want = 0;
        for (int i = 0; i < KD; ++i) want += K[(16 * warp + r) * KD + i] * K[t * KD + i];
        ASSERT_EQ(at(c, r, t), want) << r << "," << t;
      }
    }
  }
  // S as accumulator tiles [16 x KD] (element (r, k) at tile k / 8), then P = S K^T.
  std::vector<Acc> s(KD / 8, Acc{});
  for (int nt = 0; nt < KD / 8; ++nt) {
    for (int l = 0; l < 32; ++l) {
      for (int e = 0; e < 4; ++e)
        s[nt][l][e] = S[gs::acc_row(l, e) * KD + 8 * nt + gs::acc_col(l, e)];
    }
  }
  {
    std::vector<Acc> c(8, Acc{});
    for (int ks = 0; ks < KD / 16; ++ks) {
      const Frag4 a = acc_to_a(s, ks);
      for (int p = 0; p < 4; ++p)
        mma2(c, p, a, load(sm, kt, 16 * p, 16 * ks, gs::b_row, gs::b_col, false));
    }
    for (int r = 0; r < 16; ++r) {
      for (int t = 0; t < B; ++t) {
        double want = 0;
        for (int i = 0; i < KD; ++i) want += S[r * KD + i] * K[t * KD + i];
        ASSERT_EQ(at(c, r, t), want) << r << "," << t;
      }
    }
  }
  // V^T (this warp's 16 columns of the V slice) as the A operand: V^T K^T[0:64 tokens] would mix
  // dims, so multiply by an identity B instead: the product is V^T itself.
  {
    const Tile it{lay.m, gs::io_ld(B)};
    std::vector<double> I(B * B, 0.0);
    for (int i = 0; i < B; ++i) I[i * B + i] = 1.0;
    put(sm, it, I, B, B);
    std::vector<Acc> c(8, Acc{});
    for (int kk = 0; kk < 4; ++kk) {
      const Frag4 a = load(sm, vt, 16 * kk, 16 * warp, gs::at_row, gs::at_col, true);
      for (int p = 0; p < 4; ++p)
        mma2(c, p, a, load(sm, it, 16 * p, 16 * kk, gs::b_row, gs::b_col, false));
    }
    for (int r = 0; r < 16; ++r) {
      for (int t = 0; t < B; ++t) ASSERT_EQ(at(c, r, t), V[t * B + 16 * warp + r]) << r << "," << t;
    }
  }
  // The state update: S += U K, U [16 x 64 tokens] from accumulator tiles, K stored [t][k] read
  // transposed.
  {
    const auto U = ints(16 * B, rng);
    std::vector<Acc> u(8, Acc{});
    for (int nt = 0; nt < 8; ++nt) {
      for (int l = 0; l < 32; ++l) {
        for (int e = 0; e < 4; ++e)
          u[nt][l][e] = U[gs::acc_row(l, e) * B + 8 * nt + gs::acc_col(l, e)];
      }
    }
    std::vector<Acc> c = s;
    for (int kk = 0; kk < 4; ++kk) {
      const Frag4 a = acc_to_a(u, kk);
      for (int p = 0; p < KD / 16; ++p)
        mma2(c, p, a, load(sm, kt, 16 * kk, 16 * p, gs::bt_row, gs::bt_col, true));
    }
    for (int r = 0; r < 16; ++r) {
      for (int k = 0; k < KD; ++k) {
        double want = S[r * KD + k];
        for (int t = 0; t < B; ++t) want += U[r * B + t] * K[t * KD + k];
        ASSERT_EQ(at(c, r, k), want) << r << "," << k;
      }
    }
  }
}

// Gamma_{s,t} from the running sums equals the product of the gates in (t, s]: zeros give 0
// exactly, negative gates their sign, 64 gates of 0.25 (2^-128, below fp32's normal range as a
// running product) no 0/0.
TEST(GdnChunkRules, DecayRatiosAreTheProductsOfTheGates) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0.05, 1.0);
  std::vector<double> alpha(64);
  for (auto& a : alpha) a = u(rng);
  alpha[5] = 0.0, alpha[40] = 0.0, alpha[9] = -0.5, alpha[22] = -0.8;
  std::vector<double> G(64);
  std::vector<int> c(64);
  double g = 0;
  int cnt = 0;
  for (int t = 0; t < 64; ++t) {
    const auto term = gc::gate_term(alpha[t]);
    g += term.log_abs, cnt += term.counts;
    G[t] = g, c[t] = cnt;
  }
  for (int s = 0; s < 64; ++s) {
    for (int t = 0; t <= s; ++t) {
      double want = 1.0;
      for (int r = t + 1; r <= s; ++r) want *= alpha[r];
      const double got = gc::decay_ratio(G[s], c[s], G[t], c[t]);
      if (want == 0.0) {
        ASSERT_EQ(got, 0.0) << s << "," << t;
      } else {
        ASSERT_NEAR(got, want, 1e-12 * std::fabs(want)) << s << "," << t;
      }
    }
  }
  float gf = 0;
  int cf = 0;
  for (int t = 0; t < 64; ++t) {
    const auto term = gc::gate_term(0.25f);
    gf += term.log_abs, cf += term.counts;
  }
  EXPECT_EQ(cf, 0);
  EXPECT_GT(gc::decay_ratio(0.0f, 0, -gf / 2, 0), 0.0f);  // 2^-64 from the middle: no underflow
  EXPECT_NEAR(std::log2(static_cast<double>(gc::decay_ratio(gf, 0, gf / 2, 0))), -64.0, 1e-3);
}

// The kernel's inverse (diagonal blocks by substitution, then the merges by distance) inverts
// I + L for L as the kernel builds it (|entries| <= 1 from normalized k, beta and decays <= 1).
TEST(GdnChunkRules, InverseInTheKernelsOrderInvertsIPlusL) {
  constexpr int B = gc::kChunk, ld = gs::kFloatLd;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-0.3f, 0.3f);
  std::vector<float> L(B * ld, 0.0f), X(B * ld, 0.0f), W(3 * 256);
  for (int s = 0; s < B; ++s) {
    for (int t = 0; t < s; ++t) L[s * ld + t] = u(rng);
  }
  for (int b = 0; b < gc::kSubs; ++b) {
    for (int c = 0; c < gc::kSub; ++c) {
      float x[gc::kSub];
      gc::inverse_block_column(L.data(), ld, b, c, x);
      for (int i = 0; i < gc::kSub; ++i) X[(16 * b + i) * ld + 16 * b + c] = x[i];
    }
  }
  for (int d = 1; d < gc::kSubs; ++d) {
    for (int e = 0; e < gc::merge_blocks(d) * 64; ++e) {
      float w4[4];
      gc::merge_sum4(L.data(), X.data(), ld, e / 64 + d, e / 64, (e / 4) % 16, 4 * (e % 4), w4);
      for (int q = 0; q < 4; ++q) W[(e / 64) * 256 + ((e / 4) % 16) * 16 + 4 * (e % 4) + q] = w4[q];
    }
    for (int e = 0; e < gc::merge_blocks(d) * 64; ++e) {
      const int j = e / 64, r = (e / 4) % 16, c0 = 4 * (e % 4);
      float x4[4];
      gc::merge_block4(X.data(), ld, W.data() + j * 256, j + d, r, c0, x4);
      for (int q = 0; q < 4; ++q) X[(16 * (j + d) + r) * ld + 16 * j + c0 + q] = x4[q];
    }
  }
  // Against fp64 forward substitution, and (I + L) X = I.
  std::vector<double> Xd(B * B, 0.0);
  for (int c = 0; c < B; ++c) {
    for (int i = c; i < B; ++i) {
      double acc = i == c ? 1.0 : 0.0;
      for (int m = c; m < i; ++m) acc -= L[i * ld + m] * Xd[m * B + c];
      Xd[i * B + c] = acc;
    }
  }
  for (int s = 0; s < B; ++s) {
    for (int t = 0; t <= s; ++t) {
      ASSERT_NEAR(X[s * ld + t], Xd[s * B + t], 1e-5 * (1.0 + std::fabs(Xd[s * B + t])))
          << s << "," << t;
      double id = X[s * ld + t];
      for (int m = t; m < s; ++m) id += L[s * ld + m] * X[m * ld + t];
      ASSERT_NEAR(id, s == t ? 1.0 : 0.0, 1e-5) << s << "," << t;
    }
  }
}

// ---- the whole chunked form ------------------------------------------------------------------

// The token recurrence in fp64 (decay first, the delta on the decayed state, the output from
// the updated state), [v][k] states.
gdn_chunk_emu::Result recurrence(const gdn_chunk_emu::Problem& pb) {
  const int64_t H = pb.heads(), D = pb.D, N = static_cast<int64_t>(pb.cu.size()) - 1;
  gdn_chunk_emu::Result r;
  r.out.assign(static_cast<size_t>(pb.cu.back() * H * D), 0.0);
  r.state.assign(static_cast<size_t>(N * H * D * D), 0.0);
  int64_t row = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (pb.cu[n] == pb.cu[n + 1]) continue;  // no state written, no checkpoints
    for (int64_t h = 0; h < H; ++h) {
      const int64_t qh = h * pb.Hq / H, kh = h * pb.Hk / H, vh = h * pb.Hv / H;
      std::vector<double> S(pb.state0.begin() + (n * H + h) * D * D,
                            pb.state0.begin() + (n * H + h + 1) * D * D);
      for (int64_t tok = pb.cu[n]; tok < pb.cu[n + 1]; ++tok) {
        const double* q = &pb.q[(tok * pb.Hq + qh) * D];
        const double* k = &pb.k[(tok * pb.Hk + kh) * D];
        const double* v = &pb.v[(tok * pb.Hv + vh) * D];
        for (auto& x : S) x *= pb.g[tok * H + h];
        for (int64_t vv = 0; vv < D; ++vv) {
          double pred = 0;
          for (int64_t i = 0; i < D; ++i) pred += S[vv * D + i] * k[i];
          const double uu = (v[vv] - pred) * pb.beta[tok * H + h];
          double o = 0;
          for (int64_t i = 0; i < D; ++i) S[vv * D + i] += k[i] * uu, o += S[vv * D + i] * q[i];
          r.out[(tok * H + h) * D + vv] = o * pb.scale;
        }
        const int64_t done = tok + 1 - pb.cu[n];
        if (pb.every > 0 && done % pb.every == 0) {
          const int64_t j = row + done / pb.every - 1;
          if (r.ckpt.size() < static_cast<size_t>((j + 1) * H * D * D)) {
            r.ckpt.resize(static_cast<size_t>((j + 1) * H * D * D), 0.0);
          }
          std::copy(S.begin(), S.end(), r.ckpt.begin() + (j * H + h) * D * D);
        }
      }
      std::copy(S.begin(), S.end(), r.state.begin() + (n * H + h) * D * D);
    }
    if (pb.every > 0) row += (pb.cu[n + 1] - pb.cu[n]) / pb.every;
  }
  return r;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// In exact arithmetic the chunked form is the recurrence (the derivation in
// docs/upstream-facts/gdn_chunked_prefill.md, section 4): in fp64 with no rounding they agree to
// 1e-12 over lengths 0, 1, 63, 64, 65, 129 and 200 (partial and whole chunks, two and four
// chunks), GVA heads, an initial state, checkpoints, and gates that are 0 or negative.
TEST(GdnChunk, Fp64ChunkedFormEqualsTheRecurrence) {
  for (const int64_t D : {64, 32}) {
    gdn_chunk_emu::Problem pb =
        gdn_chunk_emu::make_problem({0, 0, 1, 64, 127, 192, 321, 521}, 1, 1, 2, D, 40 + D, false);
    pb.every = 64;
    pb.g[3 * 2 + 1] = 0.0;     // sequence 2's third token, head 1: the state before it is lost
    pb.g[130 * 2 + 0] = -0.7;  // a negative gate
    pb.g[300 * 2 + 1] = 0.0;
    const auto chunked = gdn_chunk_emu::run<double>(pb, [](double x) { return x; });
    const auto ref = recurrence(pb);
    EXPECT_LT(max_abs_diff(chunked.out, ref.out), 1e-12) << D;
    EXPECT_LT(max_abs_diff(chunked.state, ref.state), 1e-12) << D;
    ASSERT_EQ(chunked.ckpt.size(), ref.ckpt.size());
    EXPECT_LT(max_abs_diff(chunked.ckpt, ref.ckpt), 1e-12) << D;
    double big = 0;
    for (double x : ref.out) big = std::max(big, std::fabs(x));
    EXPECT_GT(big, 0.1);  // the outputs are not all small
  }
}

// With the kernel's rounding points (every MMA operand in the io dtype, fp32 elsewhere), the
// chunked form stays within upstream's test tolerances of the library's CPU reference (the fp32
// recurrence), on upstream's test inputs: bf16 out 1e-2 / 1e-2, state 5e-3 / 1e-3; fp16 out
// 2e-3 / 1e-3, state 1e-3 / 1e-4 (docs/upstream-facts/gdn_prefill.md, section 5). The cases
// are the GPU test's (gdn_chunk_emu::cuda_cases), so the tolerances that test asserts are ones
// the kernel's arithmetic meets; checkpoints included.
TEST(GdnChunk, CudaTestCasesEmulatedWithinUpstreamTolerances) {
  for (const auto& c : gdn_chunk_emu::cuda_cases()) {
    gdn_chunk_emu::Problem pb = gdn_chunk_emu::cuda_problem(c);
    const DType io = c.bf16 ? DType::kBFloat16 : DType::kFloat16;
    auto to_io = [io](float x) { return gdn_chunk_emu::round_to_io(io, x); };
    for (auto* xs : {&pb.q, &pb.k, &pb.v}) {
      for (auto& x : *xs) x = to_io(static_cast<float>(x));
    }
    const int64_t T = pb.cu.back(), H = pb.heads(), D = pb.D;
    const int64_t N = static_cast<int64_t>(pb.cu.size()) - 1;
    const auto chunked = gdn_chunk_emu::run<float>(pb, to_io);
    std::vector<double> cu(pb.cu.begin(), pb.cu.end()), starts{0};
    for (int64_t n = 0; n < N; ++n)
      starts.push_back(starts.back() + (pb.cu[n + 1] - pb.cu[n]) / 64);
    const int64_t rows = static_cast<int64_t>(starts.back());
    Tensor ckpt = Tensor::zeros({rows, H, D, D}, DType::kFloat32);
    auto r = chunk_gated_delta_rule(
        Tensor::from_vector(pb.q, {T, pb.Hq, D}, io), Tensor::from_vector(pb.k, {T, pb.Hk, D}, io),
        Tensor::from_vector(pb.v, {T, pb.Hv, D}, io),
        Tensor::from_vector(pb.g, {T, H}, DType::kFloat32),
        Tensor::from_vector(pb.beta, {T, H}, DType::kFloat32), std::nullopt,
        Tensor::from_vector(pb.state0, {N, H, D, D}, DType::kFloat32), true,
        Tensor::from_vector(cu, {N + 1}, DType::kInt64), false, std::nullopt, std::nullopt, ckpt,
        Tensor::from_vector(starts, {N + 1}, DType::kInt64), 64);
    const bool bf = c.bf16;
    const Tolerance out_tol = bf ? Tolerance{1e-2, 1e-2} : Tolerance{2e-3, 1e-3};
    const Tolerance st_tol = bf ? Tolerance{5e-3, 1e-3} : Tolerance{1e-3, 1e-4};
    EXPECT_TRUE(
        all_close(Tensor::from_vector(chunked.out, {T, H, D}, DType::kFloat32), r.output, out_tol))
        << c.seed;
    // An empty sequence's row stays as the op left it (zeros), the emulation's too.
    EXPECT_TRUE(all_close(Tensor::from_vector(chunked.state, {N, H, D, D}, DType::kFloat32),
                          r.final_state, st_tol))
        << c.seed;
    EXPECT_TRUE(all_close(Tensor::from_vector(chunked.ckpt, {rows, H, D, D}, DType::kFloat32), ckpt,
                          st_tol))
        << c.seed;
  }
}

// Which calls the chunked kernel takes (chunk_gated_delta_rule's, at head dims 64 / 128, fp16 /
// bf16, aligned rows, sm_80+, with room for its shared memory), and the switch that sends every
// call to the recurrent kernel.
TEST(GdnChunkShape, WhichCallsTakeTheChunkedKernel) {
  alignas(16) static uint16_t buf[64];
  kernels::GdnParams p;
  p.decode_gates = false, p.scale_output = true, p.cu_seqlens = buf;
  p.negative_read = kernels::GdnNegativeRead::kInvalid;
  p.K = p.V = 128, p.io_dtype = p.out_dtype = DType::kBFloat16;
  p.q = p.k = p.v = p.out = buf;
  p.q_stride_tok = p.k_stride_tok = p.v_stride_tok = p.out_stride_tok = 512;
  p.q_stride_head = p.k_stride_head = p.v_stride_head = p.out_stride_head = 128;
  EXPECT_EQ(gs::chunked_refusal(p, 9, 232448), nullptr);
  EXPECT_EQ(gs::chunked_refusal(p, 8, 101376), nullptr);  // sm_86 / 89: 99 KiB is enough
  EXPECT_NE(gs::chunked_refusal(p, 8, 99071), nullptr);
  EXPECT_NE(gs::chunked_refusal(p, 7, 232448), nullptr);
  auto refused = [&](auto edit) {
    kernels::GdnParams x = p;
    edit(x);
    return gs::chunked_refusal(x, 9, 232448) != nullptr;
  };
  EXPECT_FALSE(refused([](kernels::GdnParams& x) { x.K = x.V = 64; }));
  EXPECT_FALSE(refused([](kernels::GdnParams& x) { x.io_dtype = x.out_dtype = DType::kFloat16; }));
  EXPECT_TRUE(refused([](kernels::GdnParams& x) { x.K = x.V = 96; }));
  EXPECT_TRUE(refused([](kernels::GdnParams& x) { x.K = 128, x.V = 64; }));
  EXPECT_TRUE(refused([](kernels::GdnParams& x) { x.decode_gates = true; }));  // decode
  EXPECT_TRUE(
      refused([](kernels::GdnParams& x) { x.intermediates = kernels::GdnIntermediates::kBuffer; }));
  EXPECT_TRUE(refused([](kernels::GdnParams& x) { x.q_stride_head = 132; }));  // 264-byte rows
  EXPECT_TRUE(refused([](kernels::GdnParams& x) { x.out = buf + 1; }));
  EXPECT_TRUE(refused(
      [](kernels::GdnParams& x) { x.state_in.data = buf, x.state_in.dtype = DType::kBFloat16; }));
  EXPECT_TRUE(refused([](kernels::GdnParams& x) { x.out_dtype = DType::kFloat32; }));
  alignas(8) static float ck[4];
  EXPECT_FALSE(refused([](kernels::GdnParams& x) { x.checkpoint_every = 64, x.checkpoints = ck; }));
  EXPECT_TRUE(
      refused([](kernels::GdnParams& x) { x.checkpoint_every = 64, x.checkpoints = ck + 1; }));
  // Upstream 0.7.4's slot arguments: a read of -1 from zeros (output_state_indices) is taken;
  // checkpoints at absolute positions, in pool rows or padded rows go to the recurrent kernel.
  EXPECT_FALSE(refused(
      [](kernels::GdnParams& x) { x.negative_read = kernels::GdnNegativeRead::kZeroState; }));
  EXPECT_TRUE(refused(
      [](kernels::GdnParams& x) { x.negative_read = kernels::GdnNegativeRead::kSkipZeroOutput; }));
  auto ckpt = [](kernels::GdnParams& x) {
    x.H = 2, x.checkpoint_every = 64, x.checkpoints = ck, x.checkpoint_row_stride = 2 * 128 * 128;
  };
  EXPECT_FALSE(refused(ckpt));
  EXPECT_TRUE(refused([&](kernels::GdnParams& x) { ckpt(x), x.checkpoint_prefix = buf; }));
  EXPECT_TRUE(refused([&](kernels::GdnParams& x) { ckpt(x), x.checkpoint_slots = buf; }));
  EXPECT_TRUE(refused([&](kernels::GdnParams& x) { ckpt(x), x.checkpoint_row_stride += 8; }));
  {
    ScopedEnv off("FLASHINFER_GDN_CHUNKED", "0");
    EXPECT_STREQ(gs::chunked_refusal(p, 9, 232448), "FLASHINFER_GDN_CHUNKED=0");
  }
  EXPECT_EQ(gs::chunked_refusal(p, 9, 232448), nullptr);
}

}  // namespace
}  // namespace flashinfer::testing
