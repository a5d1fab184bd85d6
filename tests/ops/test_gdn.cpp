// Gated delta rule ops (flashinfer.gdn_decode, flashinfer.gdn_prefill): an fp64 recurrence of
// upstream's reference math, a hand-checked step, the index rules (pools, negative slots, write
// slots, per-step states, checkpoints, zero-length sequences), equalities between the ops that
// hold bit for bit on the CPU, bad inputs, declarations, record / replay, and CUDA against the
// CPU when a GPU is visible.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "api/bench_support.h"
#include "flashinfer/bench.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
#include "kernels/cuda/gdn_cuda.h"
#endif
#include "flashinfer/replay.h"
#include "flashinfer/tensor_io.h"
#include "kernels/gdn_rules.h"
#include "ops/op_test_util.h"
#include "util/gdn_chunk_emulation.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

constexpr DType kBf = DType::kBFloat16;
constexpr DType kF32 = DType::kFloat32;

// ---- fp64 reference: S (K x V) per (sequence, head), decay first, delta on the decayed state,
// output from the updated state (upstream's tests/gdn/reference_delta_rule.py math). -----------

struct RefStep {
  std::vector<double> q, k, v;  // K, K, V
  double decay = 1.0, beta = 1.0;
};

// One token on S (K x V, row-major [k][v]); returns o (V).
std::vector<double> ref_step(std::vector<double>& S, const RefStep& s, int64_t K, int64_t V) {
  for (auto& x : S) x *= s.decay;
  std::vector<double> o(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) {
    double pred = 0.0;
    for (int64_t k = 0; k < K; ++k) pred += S[k * V + v] * s.k[k];
    const double u = (s.v[v] - pred) * s.beta;
    for (int64_t k = 0; k < K; ++k) S[k * V + v] += s.k[k] * u;
    double acc = 0.0;
    for (int64_t k = 0; k < K; ++k) acc += S[k * V + v] * s.q[k];
    o[v] = acc;
  }
  return o;
}

std::vector<double> l2n(std::vector<double> x) {
  double ss = 0.0;
  for (double e : x) ss += e * e;
  const double inv = 1.0 / std::sqrt(ss + 1e-6);
  for (auto& e : x) e *= inv;
  return x;
}

double softplus(double x) { return x <= 20.0 ? std::log1p(std::exp(x)) : x; }

// Row i (length n) of a tensor viewed as [rows, n] (contiguous copies).
std::vector<double> row(const std::vector<double>& all, int64_t i, int64_t n) {
  return {all.begin() + i * n, all.begin() + (i + 1) * n};
}

double bf16_round(double x) {
  return bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(x)));
}

// ---- decode inputs --------------------------------------------------------------------------

struct DecodeIn {
  int64_t B = 3, T = 1, H = 2, HV = 4, K = 32, V = 16;
  Tensor q, k, v, A_log, a, dt_bias, b;
};

DecodeIn decode_inputs(int64_t B, int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V,
                       uint64_t seed, DType io = kBf) {
  DecodeIn in;
  in.B = B, in.T = T, in.H = H, in.HV = HV, in.K = K, in.V = V;
  in.q = rand_tensor({B, T, H, K}, io, seed, -1.0, 1.0);
  in.k = rand_tensor({B, T, H, K}, io, seed + 1, -1.0, 1.0);
  in.v = rand_tensor({B, T, HV, V}, io, seed + 2, -1.0, 1.0);
  in.A_log = rand_tensor({HV}, kF32, seed + 3, -1.0, 0.5);
  in.a = rand_tensor({B, T, HV}, io, seed + 4, -1.0, 1.0);
  in.dt_bias = rand_tensor({HV}, kF32, seed + 5, -0.5, 0.5);
  in.b = rand_tensor({B, T, HV}, io, seed + 6, -2.0, 2.0);
  return in;
}

// Expected outputs (bf16-rounded, [B, T, HV, V]) and final states (K-last [B, HV, V, K]) of the
// decode math from K-last initial states state0 [B, HV, V, K].
struct DecodeRef {
  std::vector<double> out, state;
};
DecodeRef decode_reference(const DecodeIn& in, const std::vector<double>& state0, double scale,
                           bool l2norm) {
  const int64_t B = in.B, T = in.T, H = in.H, HV = in.HV, K = in.K, V = in.V;
  const auto q = in.q.to_double_vector(), k = in.k.to_double_vector(), v = in.v.to_double_vector();
  const auto A = in.A_log.to_double_vector(), a = in.a.to_double_vector();
  const auto dtb = in.dt_bias.to_double_vector(), bb = in.b.to_double_vector();
  DecodeRef r;
  r.out.resize(static_cast<size_t>(B * T * HV * V));
  r.state.resize(static_cast<size_t>(B * HV * V * K));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < HV; ++h) {
      const int64_t qh = h / (HV / H);
      std::vector<double> S(static_cast<size_t>(K * V));
      for (int64_t vv = 0; vv < V; ++vv) {
        for (int64_t kk = 0; kk < K; ++kk) {
          S[kk * V + vv] = state0[((b * HV + h) * V + vv) * K + kk];
        }
      }
      for (int64_t t = 0; t < T; ++t) {
        RefStep st;
        st.q = row(q, (b * T + t) * H + qh, K);
        st.k = row(k, (b * T + t) * H + qh, K);
        if (l2norm) st.q = l2n(st.q), st.k = l2n(st.k);
        for (auto& e : st.q) e *= scale;
        st.v = row(v, (b * T + t) * HV + h, V);
        const int64_t g = (b * T + t) * HV + h;
        st.decay = std::exp(-std::exp(A[h]) * softplus(a[g] + dtb[h]));
        st.beta = 1.0 / (1.0 + std::exp(-bb[g]));
        const auto o = ref_step(S, st, K, V);
        for (int64_t vv = 0; vv < V; ++vv) r.out[g * V + vv] = bf16_round(o[vv]);
      }
      for (int64_t vv = 0; vv < V; ++vv) {
        for (int64_t kk = 0; kk < K; ++kk) {
          r.state[((b * HV + h) * V + vv) * K + kk] = S[kk * V + vv];
        }
      }
    }
  }
  return r;
}

// ---- decode: against the fp64 recurrence -----------------------------------------------------

TEST(GdnDecode, PretransposeMatchesFp64Recurrence) {
  for (bool l2norm : {true, false}) {
    const DecodeIn in = decode_inputs(3, 1, 2, 4, 32, 16, 10);
    Tensor state = rand_tensor({3, 4, 16, 32}, kF32, 20, -0.5, 0.5);
    const auto s0 = state.to_double_vector();
    const double scale = 1.0 / std::sqrt(32.0);
    auto [out, st] =
        gated_delta_rule_decode_pretranspose(in.q, in.k, in.v, state, in.A_log, in.a, in.dt_bias,
                                             in.b, std::nullopt, std::nullopt, l2norm);
    const DecodeRef ref = decode_reference(in, s0, scale, l2norm);
    EXPECT_EQ(out.dtype(), kBf);
    EXPECT_EQ(out.shape(), (Shape{3, 1, 4, 16}));
    EXPECT_EQ(st.data_ptr(), state.data_ptr()) << "the state is updated in place and returned";
    // The output is rounded to bf16 once: within one bf16 ulp of the rounded fp64 value.
    EXPECT_TRUE(all_close(out, ref.out, {1e-3, 8e-3})) << "l2norm " << l2norm;
    EXPECT_TRUE(all_close(state, ref.state, {2e-5, 2e-5})) << "l2norm " << l2norm;
  }
}

// The decode gate as upstream's kernels evaluate it: softplus = log(1 + exp(x)) with the sum
// rounded to fp32, so a + dt_bias = -20 gives softplus 0 and a decay of exactly 1 (log1p would
// keep exp(-20) and give 1 - 2e-9 * exp(A_log), here 1 - 1.1e-7: not 1); above 20 softplus is x.
TEST(GdnDecode, DecayIsUpstreamsLogOfOnePlusExp) {
  EXPECT_EQ(kernels::gdn::decode_decay(-20.0f, 0.0f, 4.0f), 1.0f);
  EXPECT_EQ(kernels::gdn::decode_decay(25.0f, 0.0f, 0.0f), std::exp(-25.0f));
  EXPECT_FLOAT_EQ(kernels::gdn::decode_decay(0.0f, 0.0f, 0.0f), 0.5f);  // exp(-log 2)
}

// One step by hand: K = V = 2, A_log = a = dt_bias = 0 (decay exp(-ln 2) = 0.5), b = 0 (beta
// 0.5), k = q = (1, 0), v = (2, 4), scale 1, S = [[1, 2], [3, 4]] (S[k][v]).
//   S *= 0.5 -> [[0.5, 1], [1.5, 2]]; pred = S^T k = (0.5, 1); u = (v - pred) * 0.5 = (0.75, 1.5)
//   S += k u^T -> [[1.25, 2.5], [1.5, 2]]; o = S^T q = (1.25, 2.5).
// With the L2 norm off the values are exact in fp32 and bf16.
TEST(GdnDecode, HandCheckedStep) {
  auto t = [](std::vector<double> v, Shape s, DType d) { return Tensor::from_vector(v, s, d); };
  Tensor q = t({1, 0}, {1, 1, 1, 2}, kBf), k = t({1, 0}, {1, 1, 1, 2}, kBf);
  Tensor v = t({2, 4}, {1, 1, 1, 2}, kBf);
  // K-last [B, HV, V, K]: row v holds (S[0][v], S[1][v]).
  Tensor state = t({1, 3, 2, 4}, {1, 1, 2, 2}, kF32);
  Tensor zero1 = t({0}, {1}, kF32), zero3 = t({0}, {1, 1, 1}, kBf);
  auto [out, st] = gated_delta_rule_decode_pretranspose(q, k, v, state, zero1, zero3, zero1, zero3,
                                                        1.0, std::nullopt, false);
  EXPECT_EQ(out.to_double_vector(), (std::vector<double>{1.25, 2.5}));
  EXPECT_EQ(state.to_double_vector(), (std::vector<double>{1.25, 1.5, 2.5, 2.0}));
  // The same step on the K-major state of gated_delta_rule_decode.
  Tensor kmajor = t({1, 2, 3, 4}, {1, 1, 2, 2}, kF32);
  auto [out2, st2] = gated_delta_rule_decode(q, k, v, kmajor, zero1, zero3, zero1, zero3, 1.0,
                                             std::nullopt, false);
  EXPECT_EQ(out2.to_double_vector(), (std::vector<double>{1.25, 2.5}));
  EXPECT_EQ(kmajor.to_double_vector(), (std::vector<double>{1.25, 2.5, 1.5, 2.0}));
}

// gated_delta_rule_decode on a K-major state is the pretranspose op on its transpose, bit for bit
// (the CPU reference runs the same operations through the other strides) for bf16 operands
// (pretranspose rounds fp16 ones to bf16 first: UpstreamCastsPretransposeAndMtpOperandsToBf16).
TEST(GdnDecode, KMajorStateIsTheTransposeOfPretranspose) {
  const DecodeIn in = decode_inputs(2, 1, 1, 2, 24, 40, 30);
  Tensor kmajor = rand_tensor({2, 2, 24, 40}, kF32, 31, -0.5, 0.5);
  Tensor klast = kmajor.transpose(2, 3).contiguous();
  auto [o1, s1] =
      gated_delta_rule_decode(in.q, in.k, in.v, kmajor, in.A_log, in.a, in.dt_bias, in.b, 0.3);
  auto [o2, s2] = gated_delta_rule_decode_pretranspose(in.q, in.k, in.v, klast, in.A_log, in.a,
                                                       in.dt_bias, in.b, 0.3);
  EXPECT_TRUE(all_close(o1, o2, {0.0, 0.0}));
  EXPECT_TRUE(all_close(kmajor.transpose(2, 3), klast, {0.0, 0.0}));
}

// Upstream's pretranspose and MTP paths call as_bf16 (a rounding cast) on their operands before
// the kernel: q, k, v always, the a / b gates except on the fp32-state one-token kernel. So fp16
// q / k / v and fp32 gates give exactly what their bf16 roundings give; the K-major op keys its
// kernel on the dtypes and computes with fp16 as it is (its output differs, and takes q's dtype).
TEST(GdnDecode, UpstreamCastsPretransposeAndMtpOperandsToBf16) {
  DecodeIn in = decode_inputs(2, 1, 1, 2, 24, 40, 30, DType::kFloat16);
  in.a = rand_tensor({2, 1, 2}, kF32, 36, -1.0, 1.0);
  in.b = rand_tensor({2, 1, 2}, kF32, 37, -2.0, 2.0);
  auto bf = [](const Tensor& t) { return t.to(kBf); };
  Tensor klast = rand_tensor({2, 2, 40, 24}, kF32, 31, -0.5, 0.5);
  // fp32 state, T = 1: q / k / v rounded, the fp32 gates read as they are.
  Tensor s1 = klast.clone(), s2 = klast.clone(), s3 = klast.clone();
  auto [o1, r1] = gated_delta_rule_decode_pretranspose(in.q, in.k, in.v, s1, in.A_log, in.a,
                                                       in.dt_bias, in.b, 0.3);
  auto [o2, r2] = gated_delta_rule_decode_pretranspose(
      bf(in.q), bf(in.k), bf(in.v), s2, in.A_log, in.a, in.dt_bias, in.b, 0.3,
      Tensor::zeros({2, 1, 2, 40}, DType::kFloat16));
  EXPECT_EQ(o1.dtype(), DType::kFloat16) << "the output takes q's dtype";
  EXPECT_TRUE(all_close(o1, o2, {0.0, 0.0}));
  EXPECT_TRUE(all_close(s1, s2, {0.0, 0.0}));
  auto [o3, r3] = gated_delta_rule_decode_pretranspose(bf(in.q), bf(in.k), bf(in.v), s3, in.A_log,
                                                       bf(in.a), in.dt_bias, bf(in.b), 0.3);
  EXPECT_FALSE(all_close(s3, s1, {0.0, 0.0})) << "the gates are not rounded on this path";
  // The K-major op computes with fp16 as it is.
  Tensor kmajor = klast.transpose(2, 3).contiguous();
  (void)gated_delta_rule_decode(in.q, in.k, in.v, kmajor, in.A_log, in.a, in.dt_bias, in.b, 0.3);
  EXPECT_FALSE(all_close(kmajor.transpose(2, 3), s1, {0.0, 0.0}));
  // MTP (fp32 pool): everything rounded, gates included.
  const DecodeIn m = [&] {
    DecodeIn x = decode_inputs(2, 3, 1, 2, 24, 40, 50, DType::kFloat16);
    x.a = rand_tensor({2, 3, 2}, kF32, 56, -1.0, 1.0);
    x.b = rand_tensor({2, 3, 2}, kF32, 57, -2.0, 2.0);
    return x;
  }();
  Tensor pool = rand_tensor({3, 2, 40, 24}, kF32, 51, -0.5, 0.5);
  Tensor read = Tensor::from_vector({2, 0}, {2}, DType::kInt32);
  Tensor p1 = pool.clone(), p2 = pool.clone();
  auto [m1, q1] = gated_delta_rule_mtp(m.q, m.k, m.v, p1, read, m.A_log, m.a, m.dt_bias, m.b, 0.3,
                                       std::nullopt, std::nullopt, std::nullopt, false);
  auto [m2, q2] = gated_delta_rule_mtp(
      bf(m.q), bf(m.k), bf(m.v), p2, read, m.A_log, bf(m.a), m.dt_bias, bf(m.b), 0.3,
      Tensor::zeros({2, 3, 2, 40}, DType::kFloat16), std::nullopt, std::nullopt, false);
  EXPECT_TRUE(all_close(m1, m2, {0.0, 0.0}));
  EXPECT_TRUE(all_close(p1, p2, {0.0, 0.0}));
}

// Pool mode: slot r = initial_state_indices[b] read, output_state_indices[b] (or r) written, the
// other slots untouched; fp32 T = 1: a negative read skips the request with a zero output, a
// negative write goes to slot 0.
TEST(GdnDecode, PoolIndicesAndNegativeSlotsFp32) {
  const DecodeIn in = decode_inputs(4, 1, 1, 2, 32, 8, 40);
  Tensor pool = rand_tensor({6, 2, 8, 32}, kF32, 41, -0.5, 0.5);
  const Tensor before = pool.clone();
  Tensor read = Tensor::from_vector({4, -1, 1, 2}, {4}, DType::kInt32);
  Tensor write = Tensor::from_vector({5, 3, 1, -1}, {4}, DType::kInt64);
  auto [out, st] = gated_delta_rule_decode_pretranspose(in.q, in.k, in.v, std::nullopt, in.A_log,
                                                        in.a, in.dt_bias, in.b, std::nullopt,
                                                        std::nullopt, true, pool, read, write);
  EXPECT_EQ(st.data_ptr(), pool.data_ptr());
  // The reference from the gathered slots.
  const auto p0 = before.to_double_vector();
  const int64_t slot = 2 * 8 * 32;
  std::vector<double> gathered;
  for (int64_t r : {4, 0, 1, 2}) {
    gathered.insert(gathered.end(), p0.begin() + r * slot, p0.begin() + (r + 1) * slot);
  }
  const DecodeRef ref = decode_reference(in, gathered, 1.0 / std::sqrt(32.0), true);
  const auto o = out.to_double_vector(), p = pool.to_double_vector();
  const int64_t orow = 2 * 8;
  for (int64_t b = 0; b < 4; ++b) {
    for (int64_t i = 0; i < orow; ++i) {
      if (b == 1) {
        EXPECT_EQ(o[b * orow + i], 0.0) << "a skipped request's output is zero";
      } else {
        EXPECT_NEAR(o[b * orow + i], ref.out[b * orow + i],
                    1e-3 + 8e-3 * std::fabs(ref.out[b * orow + i]));
      }
    }
  }
  // Written: slot 5 (from 4), slot 1 (in place), slot 0 (request 3's negative write, from 2).
  // Untouched: 2, 3 (request 1 was skipped), 4.
  auto expect_slot = [&](int64_t s, const std::vector<double>& want, int64_t from) {
    for (int64_t i = 0; i < slot; ++i) {
      ASSERT_NEAR(p[s * slot + i], want[from * slot + i], 2e-5) << "slot " << s;
    }
  };
  expect_slot(5, ref.state, 0);
  expect_slot(1, ref.state, 2);
  expect_slot(0, ref.state, 3);
  for (int64_t s : {2, 3, 4}) expect_slot(s, p0, s);
}

// bf16 state: a negative read index uses slot 0 (the caller's null slot), read and written.
TEST(GdnDecode, Bf16StateNegativeIndexUsesSlotZero) {
  const DecodeIn in = decode_inputs(2, 2, 1, 1, 32, 8, 50);
  Tensor pool = rand_tensor({3, 1, 8, 32}, kBf, 51, -0.5, 0.5);
  const auto p0 = pool.to_double_vector();
  Tensor read = Tensor::from_vector({2, -1}, {2}, DType::kInt32);
  auto [out, st] = gated_delta_rule_decode_pretranspose(in.q, in.k, in.v, std::nullopt, in.A_log,
                                                        in.a, in.dt_bias, in.b, std::nullopt,
                                                        std::nullopt, true, pool, read);
  const int64_t slot = 8 * 32;
  std::vector<double> gathered(p0.begin() + 2 * slot, p0.begin() + 3 * slot);
  gathered.insert(gathered.end(), p0.begin(), p0.begin() + slot);
  const DecodeRef ref = decode_reference(in, gathered, 1.0 / std::sqrt(32.0), true);
  EXPECT_TRUE(all_close(out, ref.out, {2e-3, 8e-3}));
  // Both tokens run in fp32; the state is rounded to bf16 once, at the end.
  const auto p = pool.to_double_vector();
  for (int64_t i = 0; i < slot; ++i) {
    EXPECT_NEAR(p[2 * slot + i], bf16_round(ref.state[i]), 1e-6 + 8e-3 * std::fabs(ref.state[i]));
    EXPECT_NEAR(p[i], bf16_round(ref.state[slot + i]),
                1e-6 + 8e-3 * std::fabs(ref.state[slot + i]));
    EXPECT_EQ(p[slot + i], p0[slot + i]) << "slot 1 is untouched";
  }
}

// ---- gated_delta_rule_mtp -----------------------------------------------------------------------

// Two tokens at once equal two one-token steps (bit for bit: the same fp32 operations), and the
// buffer holds the state after each token; disable_state_update (None: True) keeps the pool.
TEST(GdnMtp, StepsBufferAndDisabledUpdate) {
  const DecodeIn in = decode_inputs(2, 2, 2, 2, 32, 8, 60);
  Tensor pool = rand_tensor({4, 2, 8, 32}, kF32, 61, -0.5, 0.5);
  const Tensor before = pool.clone();
  Tensor read = Tensor::from_vector({3, 1}, {2}, DType::kInt64);
  Tensor buffer = Tensor::zeros({2, 2, 2, 8, 32}, kF32);
  auto [out, st] = gated_delta_rule_mtp(in.q, in.k, in.v, pool, read, in.A_log, in.a, in.dt_bias,
                                        in.b, std::nullopt, std::nullopt, buffer);
  EXPECT_TRUE(all_close(pool, before, {0.0, 0.0})) << "disable_state_update defaults to True";
  // The same tokens one at a time through the pretranspose op on a copy of the pool.
  Tensor pool2 = before.clone();
  std::vector<Tensor> outs;
  for (int64_t t = 0; t < 2; ++t) {
    auto step = [&](const Tensor& x) { return x.slice(1, t, t + 1).contiguous(); };
    auto [o, s] = gated_delta_rule_decode_pretranspose(
        step(in.q), step(in.k), step(in.v), std::nullopt, in.A_log, step(in.a), in.dt_bias,
        step(in.b), std::nullopt, std::nullopt, true, pool2, read);
    outs.push_back(o);
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t slot = b == 0 ? 3 : 1;
      EXPECT_TRUE(all_close(buffer.select(0, b).select(0, t), pool2.select(0, slot), {0.0, 0.0}))
          << "buffer[" << b << ", " << t << "]";
    }
  }
  for (int64_t t = 0; t < 2; ++t) {
    EXPECT_TRUE(all_close(out.slice(1, t, t + 1), outs[t], {0.0, 0.0})) << "token " << t;
  }
  // A buffer of more steps a request than T (upstream's cache_steps = stride(0) / (HV V K)):
  // request n's state after token t lands in row n * cache_steps + t; the steps past T keep
  // their values. A cache[:, :T] view of it writes the same rows.
  for (bool view : {false, true}) {
    Tensor wide = Tensor::full({2, 5, 2, 8, 32}, 9.0, kF32);
    Tensor pool4 = before.clone();
    (void)gated_delta_rule_mtp(in.q, in.k, in.v, pool4, read, in.A_log, in.a, in.dt_bias, in.b,
                               std::nullopt, std::nullopt, view ? wide.slice(1, 0, 2) : wide);
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t t = 0; t < 5; ++t) {
        const Tensor row = wide.select(0, b).select(0, t);
        if (t < 2) {
          EXPECT_TRUE(all_close(row, buffer.select(0, b).select(0, t), {0.0, 0.0}))
              << view << " " << b << " " << t;
        } else {
          for (double x : row.to_double_vector()) ASSERT_EQ(x, 9.0) << view << " " << b << " " << t;
        }
      }
    }
  }
  // With the update enabled the pool ends where the one-token steps ended.
  Tensor pool3 = before.clone();
  (void)gated_delta_rule_mtp(in.q, in.k, in.v, pool3, read, in.A_log, in.a, in.dt_bias, in.b,
                             std::nullopt, std::nullopt, std::nullopt, std::nullopt, false);
  EXPECT_TRUE(all_close(pool3, pool2, {0.0, 0.0}));
}

// Upstream 0.7.4's ReplaySSM verify (cache_replayssm): the output of the frozen verify, the pool
// untouched, and for every request with read slot s >= 0 its raw inputs in the four windows at
// row s: v and the un-normalized k (bf16, bit for bit), g = -exp(A_log) softplus(a + dt_bias)
// (fp32, softplus(x) = x above 20) and sigmoid(b); a negative slot writes nothing. Then
// upstream's refusals, in its order and with its texts.
TEST(GdnMtp, ReplaySsmCachesTheRawInputs) {
  const DecodeIn in = decode_inputs(3, 3, 1, 2, 128, 128, 70);
  Tensor pool = rand_tensor({4, 2, 128, 128}, kF32, 71, -0.5, 0.5);
  const Tensor before = pool.clone();
  const Tensor read = Tensor::from_vector({2, -1, 0}, {3}, DType::kInt32);
  Tensor rv = Tensor::full({4, 2, 3, 128}, 5.0, kBf), rk = Tensor::full({4, 1, 3, 128}, 5.0, kBf);
  Tensor rg = Tensor::full({4, 2, 3}, 5.0, kF32), rb = Tensor::full({4, 2, 3}, 5.0, kF32);
  auto [out, st] = gated_delta_rule_mtp(
      in.q, in.k, in.v, pool, read, in.A_log, in.a, in.dt_bias, in.b, std::nullopt, std::nullopt,
      std::nullopt, std::nullopt, true, true, std::nullopt, true, rv, rk, rg, rb);
  auto [plain, st2] =
      gated_delta_rule_mtp(in.q, in.k, in.v, before.clone(), read, in.A_log, in.a, in.dt_bias, in.b,
                           std::nullopt, std::nullopt, std::nullopt, std::nullopt, true);
  EXPECT_EQ(testing::bytes_of(out), testing::bytes_of(plain));
  EXPECT_EQ(testing::bytes_of(pool), testing::bytes_of(before));
  const auto v = in.v.to(kBf).to_double_vector(), k = in.k.to(kBf).to_double_vector();
  const auto a = in.a.to(kBf).to_double_vector(), b = in.b.to(kBf).to_double_vector();
  const auto A = in.A_log.to_double_vector(), dt = in.dt_bias.to_double_vector();
  const auto rvv = rv.to_double_vector(), rkv = rk.to_double_vector(), rgv = rg.to_double_vector(),
             rbv = rb.to_double_vector();
  const int64_t slots[3] = {2, -1, 0};
  for (int64_t s = 0; s < 4; ++s) {
    int64_t i = -1;
    for (int64_t r = 0; r < 3; ++r) i = slots[r] == s ? r : i;
    for (int64_t t = 0; t < 3; ++t) {
      for (int64_t hv = 0; hv < 2; ++hv) {
        for (int64_t x = 0; x < 128; ++x) {
          ASSERT_EQ(rvv[((s * 2 + hv) * 3 + t) * 128 + x],
                    i < 0 ? 5.0 : v[((i * 3 + t) * 2 + hv) * 128 + x])
              << s << " " << t;
        }
        double g = 5.0, be = 5.0;  // the windows' fill where no request writes
        if (i >= 0) {
          const auto ai = static_cast<std::size_t>((i * 3 + t) * 2 + hv);
          const float xg = static_cast<float>(a[ai]) + static_cast<float>(dt[hv]);
          const float sp = xg > 20.0f ? xg : std::log1p(std::exp(xg));
          g = -std::exp(static_cast<float>(A[hv])) * sp;
          be = 1.0f / (1.0f + std::exp(-static_cast<float>(b[ai])));
        }
        ASSERT_EQ(rgv[(s * 2 + hv) * 3 + t], static_cast<float>(g)) << s << " " << t;
        ASSERT_EQ(rbv[(s * 2 + hv) * 3 + t], static_cast<float>(be)) << s << " " << t;
      }
      for (int64_t x = 0; x < 128; ++x) {
        ASSERT_EQ(rkv[(s * 3 + t) * 128 + x], i < 0 ? 5.0 : k[(i * 3 + t) * 128 + x]);
      }
    }
  }
  const char* op = "gated_delta_rule_mtp";
  auto call = [&](std::optional<bool> disable, bool flag, std::optional<Tensor> v_buf,
                  std::optional<Tensor> k_buf) {
    (void)gated_delta_rule_mtp(in.q, in.k, in.v, pool, read, in.A_log, in.a, in.dt_bias, in.b,
                               std::nullopt, std::nullopt, std::nullopt, std::nullopt, disable,
                               true, std::nullopt, flag, v_buf, k_buf, rg, rb);
  };
  testing::expect_error_text(
      [&] { call(false, true, rv, rk); }, op, "disable_state_update",
      "ReplaySSM verify must leave the checkpoint frozen (disable_state_update=True)");
  testing::expect_error_text([&] { call(true, false, rv, rk); }, op, "cache_replayssm",
                             "replayssm_* buffers require cache_replayssm=True");
  testing::expect_error_text([&] { call(true, true, std::nullopt, rk); }, op, "replayssm_rawv",
                             "cache_replayssm=True requires replayssm_rawv/rawk/g/beta");
  testing::expect_error_text([&] { call(true, true, rv.slice(2, 0, 2).contiguous(), rk); }, op,
                             "replayssm_rawv",
                             "replayssm_rawv must have shape [4, 2, 3, 128], got (4, 2, 2, 128)");
  testing::expect_error_text([&] { call(true, true, rv, rk.to(kF32)); }, op, "replayssm_rawk",
                             "replayssm_rawk must have dtype torch.bfloat16, got torch.float32");
  const DecodeIn two = decode_inputs(1, 2, 1, 2, 128, 128, 72);
  testing::expect_error_text(
      [&] {
        (void)gated_delta_rule_mtp(two.q, two.k, two.v, pool,
                                   Tensor::from_vector({0}, {1}, DType::kInt32), two.A_log, two.a,
                                   two.dt_bias, two.b, std::nullopt, std::nullopt, std::nullopt,
                                   std::nullopt, true, true, std::nullopt, true, rv, rk, rg, rb);
      },
      op, "q", "ReplaySSM caching requires T >= 3, got T=2");
}

// Upstream 0.7.4's pretranspose additions: with an fp32 pool and T > 1 the buffer holds the state
// after each token as gated_delta_rule_mtp writes it, and disable_state_update keeps the pool;
// T = 1 refuses both; a bf16 state's buffer is not supported; backend names are checked.
TEST(GdnMtp, PretransposeBufferAndDisabledUpdate) {
  const DecodeIn in = decode_inputs(2, 2, 2, 2, 32, 8, 60);
  Tensor pool = rand_tensor({4, 2, 8, 32}, kF32, 61, -0.5, 0.5);
  const Tensor before = pool.clone();
  Tensor read = Tensor::from_vector({3, 1}, {2}, DType::kInt64);
  Tensor want_buf = Tensor::zeros({2, 2, 2, 8, 32}, kF32);
  Tensor want_pool = before.clone();
  auto [want_out, ws] =
      gated_delta_rule_mtp(in.q, in.k, in.v, want_pool, read, in.A_log, in.a, in.dt_bias, in.b,
                           std::nullopt, std::nullopt, want_buf, std::nullopt, false);
  for (bool disable : {false, true}) {
    Tensor buf = Tensor::zeros({2, 2, 2, 8, 32}, kF32);
    Tensor p2 = before.clone();
    auto [out, st] = gated_delta_rule_decode_pretranspose(
        in.q, in.k, in.v, std::nullopt, in.A_log, in.a, in.dt_bias, in.b, std::nullopt,
        std::nullopt, true, p2, read, std::nullopt, buf, disable, "cake_gdn");
    EXPECT_TRUE(all_close(buf, want_buf, {0.0, 0.0})) << disable;
    EXPECT_TRUE(all_close(out, want_out, {0.0, 0.0})) << disable;
    EXPECT_TRUE(all_close(p2, disable ? before : want_pool, {0.0, 0.0})) << disable;
  }
  const char* op = "gated_delta_rule_decode_pretranspose";
  auto step = [&](const Tensor& x) { return x.slice(1, 0, 1).contiguous(); };
  Tensor p3 = before.clone();
  EXPECT_FI_ERROR(gated_delta_rule_decode_pretranspose(
                      step(in.q), step(in.k), step(in.v), std::nullopt, in.A_log, step(in.a),
                      in.dt_bias, step(in.b), std::nullopt, std::nullopt, true, p3, read,
                      std::nullopt, Tensor::zeros({2, 1, 2, 8, 32}, kF32)),
                  op, "intermediate_states_buffer");
  EXPECT_FI_ERROR(
      gated_delta_rule_decode_pretranspose(
          step(in.q), step(in.k), step(in.v), std::nullopt, in.A_log, step(in.a), in.dt_bias,
          step(in.b), std::nullopt, std::nullopt, true, p3, read, std::nullopt, std::nullopt, true),
      op, "disable_state_update");
  EXPECT_FI_ERROR(
      gated_delta_rule_decode_pretranspose(in.q, in.k, in.v, std::nullopt, in.A_log, in.a,
                                           in.dt_bias, in.b, std::nullopt, std::nullopt, true, p3,
                                           read, std::nullopt, std::nullopt, false, "triton"),
      op, "backend");
  Tensor pool_bf = before.to(kBf);
  EXPECT_FI_ERROR(
      gated_delta_rule_decode_pretranspose(
          in.q, in.k, in.v, std::nullopt, in.A_log, in.a, in.dt_bias, in.b, std::nullopt,
          std::nullopt, true, pool_bf, read, std::nullopt, Tensor::zeros({2, 2, 2, 8, 32}, kF32)),
      op, "intermediate_states_buffer");
}

// ssm_state_indices: each token's state to its own pool slot, no final write-back; a negative
// read index skips the request and leaves its output rows as they were.
TEST(GdnMtp, StepSlotsAndSkippedRequest) {
  const DecodeIn in = decode_inputs(2, 2, 1, 1, 32, 8, 70);
  Tensor pool = rand_tensor({6, 1, 8, 32}, kF32, 71, -0.5, 0.5);
  const Tensor before = pool.clone();
  Tensor read = Tensor::from_vector({0, -1}, {2}, DType::kInt32);
  Tensor steps = Tensor::from_vector({4, 5, 2, 3}, {2, 2}, DType::kInt32);
  Tensor output = Tensor::full({2, 2, 1, 8}, 7.0, kBf);
  auto [out, st] = gated_delta_rule_mtp(in.q, in.k, in.v, pool, read, in.A_log, in.a, in.dt_bias,
                                        in.b, std::nullopt, output, std::nullopt, steps, false);
  EXPECT_EQ(out.data_ptr(), output.data_ptr());
  const auto o = out.to_double_vector();
  for (int64_t i = 16; i < 32; ++i) EXPECT_EQ(o[i], 7.0) << "request 1 was skipped";
  const std::vector<double> all0 = before.to_double_vector();
  const std::vector<double> s0(all0.begin(), all0.begin() + 8 * 32);
  DecodeIn one = in;
  one.B = 1;
  one.q = in.q.slice(0, 0, 1), one.k = in.k.slice(0, 0, 1), one.v = in.v.slice(0, 0, 1);
  one.a = in.a.slice(0, 0, 1), one.b = in.b.slice(0, 0, 1);
  one.T = 1;
  DecodeIn first = one;
  first.q = one.q.slice(1, 0, 1), first.k = one.k.slice(1, 0, 1), first.v = one.v.slice(1, 0, 1);
  first.a = one.a.slice(1, 0, 1), first.b = one.b.slice(1, 0, 1);
  const DecodeRef r1 = decode_reference(first, s0, 1.0 / std::sqrt(32.0), true);
  one.T = 2;
  const DecodeRef r2 = decode_reference(one, s0, 1.0 / std::sqrt(32.0), true);
  EXPECT_TRUE(all_close(pool.select(0, 4).reshape({256}), r1.state, {2e-5, 2e-5}));
  EXPECT_TRUE(all_close(pool.select(0, 5).reshape({256}), r2.state, {2e-5, 2e-5}));
  for (int64_t s : {0, 1, 2, 3}) {
    EXPECT_TRUE(all_close(pool.select(0, s), before.select(0, s), {0.0, 0.0})) << "slot " << s;
  }
}

// ---- chunk_gated_delta_rule -------------------------------------------------------------------

struct PrefillIn {
  std::vector<int64_t> cu;
  int64_t Hq = 2, Hk = 2, Hv = 4, D = 16;
  Tensor q, k, v, g, beta, cu_t;
};

PrefillIn prefill_inputs(std::vector<int64_t> cu, int64_t Hq, int64_t Hk, int64_t Hv, int64_t D,
                         uint64_t seed, DType io = kBf) {
  PrefillIn in;
  in.cu = cu;
  in.Hq = Hq, in.Hk = Hk, in.Hv = Hv, in.D = D;
  const int64_t T = cu.back(), H = std::max(Hq, Hv);
  in.q = rand_tensor({T, Hq, D}, io, seed, -1.0, 1.0);
  // k rows normalized by the caller, as upstream's tests and engines pass them.
  Tensor k = rand_tensor({T, Hk, D}, kF32, seed + 1, -1.0, 1.0);
  auto kv = k.to_double_vector();
  for (int64_t r = 0; r < T * Hk; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < D; ++i) ss += kv[r * D + i] * kv[r * D + i];
    for (int64_t i = 0; i < D; ++i) kv[r * D + i] /= std::sqrt(ss);
  }
  in.k = Tensor::from_vector(kv, {T, Hk, D}, io);
  in.v = rand_tensor({T, Hv, D}, io, seed + 2, -1.0, 1.0);
  in.g = rand_tensor({T, H}, kF32, seed + 3, 0.3, 1.0);
  in.beta = rand_tensor({T, H}, kF32, seed + 4, 0.0, 1.0);
  std::vector<double> c(cu.begin(), cu.end());
  in.cu_t = Tensor::from_vector(c, {static_cast<int64_t>(cu.size())}, DType::kInt64);
  return in;
}

// Expected output [T, H, D] (fp64, unrounded) and final states [N, H, V, K] from initial states
// state0 [N, H, V, K] (empty: zeros). A zero-length sequence's final state is not written (left
// at zero here: the op allocates output_state zeroed; upstream's row is untouched).
struct PrefillRef {
  std::vector<double> out, state;
};
PrefillRef prefill_reference(const PrefillIn& in, const std::vector<double>& state0, double scale,
                             bool use_g, bool use_beta, bool l2norm = false) {
  const int64_t H = std::max(in.Hq, in.Hv), D = in.D, N = static_cast<int64_t>(in.cu.size()) - 1;
  const auto q = in.q.to_double_vector(), k = in.k.to_double_vector(), v = in.v.to_double_vector();
  const auto g = in.g.to_double_vector(), be = in.beta.to_double_vector();
  const DType io = in.q.dtype();
  auto round_io = [&](std::vector<double> x) {
    for (auto& e : x) {
      e = io == kBf ? bf16_round(e) : half_bits_to_float(float_to_half_bits(static_cast<float>(e)));
    }
    return x;
  };
  PrefillRef r;
  r.out.assign(static_cast<size_t>(in.cu.back() * H * D), 0.0);
  r.state.assign(static_cast<size_t>(N * H * D * D), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    if (in.cu[n] == in.cu[n + 1]) continue;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t qh = h * in.Hq / H, kh = h * in.Hk / H, vh = h * in.Hv / H;
      std::vector<double> S(static_cast<size_t>(D * D), 0.0);
      if (!state0.empty()) {
        for (int64_t vv = 0; vv < D; ++vv) {
          for (int64_t kk = 0; kk < D; ++kk)
            S[kk * D + vv] = state0[((n * H + h) * D + vv) * D + kk];
        }
      }
      for (int64_t t = in.cu[n]; t < in.cu[n + 1]; ++t) {
        RefStep st;
        st.q = row(q, t * in.Hq + qh, D);
        st.k = row(k, t * in.Hk + kh, D);
        if (l2norm) st.q = round_io(l2n(st.q)), st.k = round_io(l2n(st.k));
        st.v = row(v, t * in.Hv + vh, D);
        st.decay = use_g ? g[t * H + h] : 1.0;
        st.beta = use_beta ? be[t * H + h] : 1.0;
        const auto o = ref_step(S, st, D, D);
        for (int64_t vv = 0; vv < D; ++vv) r.out[(t * H + h) * D + vv] = o[vv] * scale;
      }
      for (int64_t vv = 0; vv < D; ++vv) {
        for (int64_t kk = 0; kk < D; ++kk)
          r.state[((n * H + h) * D + vv) * D + kk] = S[kk * D + vv];
      }
    }
  }
  return r;
}

TEST(GdnPrefill, MatchesFp64RecurrenceGvaAndGqa) {
  struct Case {
    int64_t Hq, Hk, Hv;
    bool g, beta;
    DType io;
  };
  for (const Case c : {Case{2, 2, 4, true, true, kBf}, Case{4, 2, 2, true, false, kBf},
                       Case{1, 1, 1, false, true, DType::kFloat16}}) {
    const PrefillIn in = prefill_inputs({0, 5, 5, 22}, c.Hq, c.Hk, c.Hv, 16, 80, c.io);
    const int64_t H = std::max(c.Hq, c.Hv);
    Tensor init = rand_tensor({3, H, 16, 16}, kF32, 81, -0.3, 0.3);
    auto r = chunk_gated_delta_rule(in.q, in.k, in.v, c.g ? std::optional(in.g) : std::nullopt,
                                    c.beta ? std::optional(in.beta) : std::nullopt, 0.0, init, true,
                                    in.cu_t);
    const PrefillRef ref =
        prefill_reference(in, init.to_double_vector(), 0.25, c.g, c.beta);  // scale 0: 16^-0.5
    EXPECT_EQ(r.output.dtype(), c.io);
    EXPECT_EQ(r.output.shape(), (Shape{22, H, 16}));
    ASSERT_TRUE(r.final_state.defined());
    const double rt = c.io == kBf ? 8e-3 : 1e-3;
    EXPECT_TRUE(all_close(r.output, ref.out, {1e-3, rt})) << c.Hq << ":" << c.Hv;
    EXPECT_TRUE(all_close(r.final_state, ref.state, {1e-4, 1e-4})) << c.Hq << ":" << c.Hv;
  }
}

// Without output_final_state the result is the output alone (one tensor, as upstream returns).
TEST(GdnPrefill, ReturnsOutputAloneWithoutFinalState) {
  const PrefillIn in = prefill_inputs({0, 7}, 1, 1, 1, 8, 90);
  auto r = chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt,
                                  false, in.cu_t);
  EXPECT_FALSE(r.final_state.defined());
  EXPECT_TRUE(to_value(r).is_tensor());
  const PrefillRef ref = prefill_reference(in, {}, 1.0 / std::sqrt(8.0), true, true);
  EXPECT_TRUE(all_close(r.output, ref.out, {1e-3, 8e-3}));
}

// A zero-length sequence leaves its output_state row as it was; checkpoints hold the state after
// every 64 tokens, equal bit for bit to the final state of a call on the prefix.
TEST(GdnPrefill, ZeroLengthSequenceAndCheckpoints) {
  const PrefillIn in = prefill_inputs({0, 130, 130, 194}, 1, 1, 2, 8, 100);
  Tensor out_state = Tensor::full({3, 2, 8, 8}, 123.0, kF32);
  Tensor ckpt = Tensor::zeros({3, 2, 8, 8}, kF32);
  Tensor starts = Tensor::from_vector({0, 2, 2, 3}, {4}, DType::kInt64);
  auto r = chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt, true,
                                  in.cu_t, false, std::nullopt, out_state, ckpt, starts, 64);
  EXPECT_EQ(r.final_state.data_ptr(), out_state.data_ptr());
  for (double x : out_state.select(0, 1).to_double_vector()) EXPECT_EQ(x, 123.0);
  // Prefix calls: sequence 0's first 64 and 128 tokens, sequence 2's 64 (all of it).
  auto prefix_state = [&](int64_t start, int64_t len) {
    const PrefillIn p = [&] {
      PrefillIn x = in;
      x.q = in.q.slice(0, start, start + len), x.k = in.k.slice(0, start, start + len);
      x.v = in.v.slice(0, start, start + len), x.g = in.g.slice(0, start, start + len);
      x.beta = in.beta.slice(0, start, start + len);
      x.cu_t = Tensor::from_vector({0, static_cast<double>(len)}, {2}, DType::kInt64);
      return x;
    }();
    return chunk_gated_delta_rule(p.q, p.k, p.v, p.g, p.beta, std::nullopt, std::nullopt, true,
                                  p.cu_t)
        .final_state.select(0, 0);
  };
  EXPECT_TRUE(all_close(ckpt.select(0, 0), prefix_state(0, 64), {0.0, 0.0}));
  EXPECT_TRUE(all_close(ckpt.select(0, 1), prefix_state(0, 128), {0.0, 0.0}));
  EXPECT_TRUE(all_close(ckpt.select(0, 2), prefix_state(130, 64), {0.0, 0.0}));
  EXPECT_TRUE(all_close(ckpt.select(0, 2), out_state.select(0, 2), {0.0, 0.0}))
      << "a sequence of a multiple of 64 tokens: its last checkpoint is its final state";
}

// state_indices: pools read and written in place at each sequence's slot, equal bit for bit to
// the packed call; the other slots untouched.
TEST(GdnPrefill, StateIndicesPoolInPlaceEqualsPacked) {
  const PrefillIn in = prefill_inputs({0, 9, 20}, 2, 2, 2, 8, 110);
  Tensor packed_init = rand_tensor({2, 2, 8, 8}, kF32, 111, -0.3, 0.3);
  auto packed = chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, std::nullopt, packed_init,
                                       true, in.cu_t);
  Tensor pool = rand_tensor({5, 2, 8, 8}, kF32, 112, -0.3, 0.3);
  pool.select(0, 3).copy_(packed_init.select(0, 0));
  pool.select(0, 1).copy_(packed_init.select(0, 1));
  const Tensor before = pool.clone();
  Tensor idx = Tensor::from_vector({3, 1}, {2}, DType::kInt32);
  auto pooled = chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, std::nullopt, pool, true,
                                       in.cu_t, false, std::nullopt, pool, std::nullopt,
                                       std::nullopt, 0, Value(std::string("auto")), idx);
  EXPECT_EQ(pooled.final_state.data_ptr(), pool.data_ptr());
  EXPECT_TRUE(all_close(pooled.output, packed.output, {0.0, 0.0}));
  EXPECT_TRUE(all_close(pool.select(0, 3), packed.final_state.select(0, 0), {0.0, 0.0}));
  EXPECT_TRUE(all_close(pool.select(0, 1), packed.final_state.select(0, 1), {0.0, 0.0}));
  for (int64_t s : {0, 2, 4}) {
    EXPECT_TRUE(all_close(pool.select(0, s), before.select(0, s), {0.0, 0.0})) << "slot " << s;
  }
}

// Rows [T, heads, D] of io dtype L2-normalized as upstream 0.7.4 does before its chunked
// kernels: fp32 sums in order, x * rsqrt(sum + 1e-6), rounded to the io dtype.
Tensor l2_normalized_rows(const Tensor& x) {
  const int64_t D = x.size(2), rows = x.numel() / D;
  auto v = x.to_double_vector();
  for (int64_t r = 0; r < rows; ++r) {
    float ss = 0.0f;
    for (int64_t i = 0; i < D; ++i) {
      const float f = static_cast<float>(v[r * D + i]);
      ss += f * f;
    }
    const float inv = 1.0f / std::sqrt(ss + 1e-6f);
    for (int64_t i = 0; i < D; ++i) v[r * D + i] = static_cast<float>(v[r * D + i]) * inv;
  }
  return Tensor::from_vector(v, x.shape(), x.dtype());
}

// use_qk_l2norm_in_kernel (upstream 0.7.4; its pinned-era kernels ignored the flag): q and k
// normalized before the kernel, bit for bit a call on rows the caller normalized, and the
// fp64 recurrence on the normalized rows.
TEST(GdnPrefill, QkNormalizationAsUpstream) {
  PrefillIn in = prefill_inputs({0, 12, 20}, 2, 2, 4, 16, 120);
  in.k = rand_tensor({20, 2, 16}, kBf, 121, -0.3, 0.3);  // not normalized by the caller
  auto on = chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, 1.0, std::nullopt, true,
                                   in.cu_t, true);
  auto pre = chunk_gated_delta_rule(l2_normalized_rows(in.q), l2_normalized_rows(in.k), in.v, in.g,
                                    in.beta, 1.0, std::nullopt, true, in.cu_t, false);
  EXPECT_TRUE(all_close(on.output, pre.output, {0.0, 0.0}));
  EXPECT_TRUE(all_close(on.final_state, pre.final_state, {0.0, 0.0}));
  auto off = chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, 1.0, std::nullopt, true,
                                    in.cu_t, false);
  EXPECT_FALSE(all_close(on.output, off.output, {1e-2, 1e-2}));
  const PrefillRef ref = prefill_reference(in, {}, 1.0, true, true, /*l2norm=*/true);
  EXPECT_TRUE(all_close(on.output, ref.out, {1e-3, 8e-3}));
  EXPECT_TRUE(all_close(on.final_state, ref.state, {1e-4, 1e-4}));
}

// The gate conventions of upstream 0.7.4 (gdn_kernels/gates.py): gate_domain "log" takes
// log alpha, use_gate_in_kernel raw gates (alpha = exp(-exp(A_log) * softplus(g + dt_bias)),
// torch's softplus with its threshold 20), beta_is_logit a logit beta (sigmoid in fp32, rounded
// to beta's dtype). Each is bit for bit the call on the fp32 alpha / beta computed here.
TEST(GdnPrefill, GateConventionsAsUpstream) {
  const PrefillIn in = prefill_inputs({0, 9, 16}, 2, 2, 4, 16, 130);
  const int64_t T = 16, H = 4;
  auto run = [&](const Tensor& g, const Tensor& beta, const std::string& domain, bool raw,
                 std::optional<Tensor> A_log, std::optional<Tensor> dt_bias, bool logit) {
    return chunk_gated_delta_rule(
        in.q, in.k, in.v, g, beta, std::nullopt, std::nullopt, true, in.cu_t, false, std::nullopt,
        std::nullopt, std::nullopt, std::nullopt, 0, Value(std::string("auto")), std::nullopt,
        std::nullopt, "auto", std::nullopt, domain, raw, A_log, dt_bias, logit);
  };
  const auto base = run(in.g, in.beta, "linear", false, std::nullopt, std::nullopt, false);
  // "log": g = log alpha; alpha = exp(g) in fp32.
  {
    auto gl = in.g.to_double_vector();
    for (auto& e : gl) e = std::log(static_cast<float>(e));
    const Tensor g_log = Tensor::from_vector(gl, {T, H}, kF32);
    std::vector<double> alpha(gl.size());
    for (size_t i = 0; i < gl.size(); ++i) alpha[i] = std::exp(static_cast<float>(gl[i]));
    const auto r = run(g_log, in.beta, "log", false, std::nullopt, std::nullopt, false);
    const auto want = run(Tensor::from_vector(alpha, {T, H}, kF32), in.beta, "linear", false,
                          std::nullopt, std::nullopt, false);
    EXPECT_TRUE(all_close(r.output, want.output, {0.0, 0.0}));
    EXPECT_TRUE(all_close(r.final_state, want.final_state, {0.0, 0.0}));
    EXPECT_TRUE(all_close(r.output, base.output, {1e-3, 1e-2}));  // exp(log g) ~ g
  }
  // Raw gates: bf16 g and dt_bias, fp32 A_log; one x = g + dt_bias above 20 (softplus(x) = x).
  {
    Tensor g_raw = rand_tensor({T, H}, kBf, 131, -3.0, 3.0);
    auto gv = g_raw.to_double_vector();
    gv[5] = 22.0;
    g_raw = Tensor::from_vector(gv, {T, H}, kBf);
    const Tensor A_log = Tensor::from_vector({-2.0, -1.0, 0.5, -4.0}, {H}, kF32);
    const Tensor dt_bias = Tensor::from_vector({0.25, -0.5, 1.0, 0.0}, {H}, kBf);
    std::vector<double> alpha(static_cast<size_t>(T * H));
    const auto av = A_log.to_double_vector(), dv = dt_bias.to_double_vector();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const float x = static_cast<float>(gv[t * H + h]) + static_cast<float>(dv[h]);
        const float sp = x <= 20.0f ? std::log1p(std::exp(x)) : x;
        alpha[t * H + h] = std::exp(-std::exp(static_cast<float>(av[h])) * sp);
      }
    }
    const auto r = run(g_raw, in.beta, "linear", true, A_log, dt_bias, false);
    const auto want = run(Tensor::from_vector(alpha, {T, H}, kF32), in.beta, "linear", false,
                          std::nullopt, std::nullopt, false);
    EXPECT_TRUE(all_close(r.output, want.output, {0.0, 0.0}));
    EXPECT_TRUE(all_close(r.final_state, want.final_state, {0.0, 0.0}));
    // gate_domain is ignored with raw gates, as upstream says.
    const auto r_log = run(g_raw, in.beta, "log", true, A_log, dt_bias, false);
    EXPECT_TRUE(all_close(r_log.output, r.output, {0.0, 0.0}));
  }
  // Logit beta in bf16 (q's dtype): beta = bf16(sigmoid(b)).
  {
    const Tensor b = rand_tensor({T, H}, kBf, 132, -4.0, 4.0);
    auto bv = b.to_double_vector();
    std::vector<double> beta(bv.size());
    for (size_t i = 0; i < bv.size(); ++i) {
      beta[i] = bf16_round(1.0f / (1.0f + std::exp(-static_cast<float>(bv[i]))));
    }
    const auto r = run(in.g, b, "linear", false, std::nullopt, std::nullopt, true);
    const auto want = run(in.g, Tensor::from_vector(beta, {T, H}, kF32), "linear", false,
                          std::nullopt, std::nullopt, false);
    EXPECT_TRUE(all_close(r.output, want.output, {0.0, 0.0}));
    EXPECT_TRUE(all_close(r.final_state, want.final_state, {0.0, 0.0}));
  }
  // Refusals, with upstream's texts.
  const char* op = "chunk_gated_delta_rule";
  const Tensor A = Tensor::zeros({H}, kF32);
  EXPECT_FI_ERROR(run(in.g, in.beta, "exp", false, std::nullopt, std::nullopt, false), op,
                  "gate_domain");
  EXPECT_FI_ERROR(run(in.g, in.beta, "linear", true, A, std::nullopt, false), op, "dt_bias");
  EXPECT_FI_ERROR(run(in.g, in.beta, "linear", false, A, A, false), op, "A_log");
  EXPECT_FI_ERROR(run(in.g, in.beta, "linear", true, A.to(DType::kInt32), A, false), op, "A_log");
  EXPECT_FI_ERROR(run(in.g, in.beta, "linear", true, Tensor::zeros({H + 1}, kF32), A, false), op,
                  "A_log");
  // Read as [H] arrays: a strided or broadcast view is refused (it would be misread).
  EXPECT_FI_ERROR(run(in.g, in.beta, "linear", true,
                      Tensor::zeros({2 * H}, kF32).slice(0, 0, 2 * H, 2), A, false),
                  op, "A_log");
  EXPECT_FI_ERROR(
      run(in.g, in.beta.to(DType::kFloat16), "linear", false, std::nullopt, std::nullopt, true), op,
      "beta");  // neither fp32 nor q's dtype
  // Without a transform g and beta stay fp32 only.
  EXPECT_FI_ERROR(run(in.g, in.beta.to(kBf), "linear", false, std::nullopt, std::nullopt, false),
                  op, "beta");
}

// output_state_indices (upstream 0.7.4): sequence i reads pool row state_indices[i] (-1: the
// zero state) and writes its final state to row output_state_indices[i] (-1: no write), here in
// place over one pool; bit for bit the packed call on the gathered states.
TEST(GdnPrefill, OutputStateIndicesReadZeroAndSkipWrites) {
  const PrefillIn in = prefill_inputs({0, 6, 13, 20}, 1, 1, 2, 8, 140);
  const int64_t H = 2, D = 8;
  const Tensor pool0 = rand_tensor({4, H, D, D}, kF32, 141, -0.5, 0.5);
  Tensor pool = pool0.clone();
  const Tensor read = Tensor::from_vector({2, -1, 0}, {3}, DType::kInt32);
  const Tensor write = Tensor::from_vector({1, 3, -1}, {3}, DType::kInt64);
  auto call = [&](const Tensor& rd, const Tensor& wr, Tensor& pl, const std::string& backend,
                  Value use_cp) {
    return chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, std::nullopt, pl, true, in.cu_t,
                                  false, std::nullopt, pl, std::nullopt, std::nullopt, 0, use_cp,
                                  rd, std::nullopt, backend, std::nullopt, "linear", false,
                                  std::nullopt, std::nullopt, false, Value(), wr);
  };
  const auto r = call(read, write, pool, "auto", Value(std::string("auto")));
  // The packed call: initial states [pool[2], 0, pool[0]].
  Tensor init = Tensor::zeros({3, H, D, D}, kF32);
  init.select(0, 0).copy_(pool0.select(0, 2));
  init.select(0, 2).copy_(pool0.select(0, 0));
  const auto packed =
      chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, std::nullopt, init, true, in.cu_t);
  EXPECT_TRUE(all_close(r.output, packed.output, {0.0, 0.0}));
  EXPECT_TRUE(all_close(pool.select(0, 1), packed.final_state.select(0, 0), {0.0, 0.0}));
  EXPECT_TRUE(all_close(pool.select(0, 3), packed.final_state.select(0, 1), {0.0, 0.0}));
  EXPECT_TRUE(all_close(pool.select(0, 0), pool0.select(0, 0), {0.0, 0.0}));  // write skipped
  EXPECT_TRUE(all_close(pool.select(0, 2), pool0.select(0, 2), {0.0, 0.0}));  // only read
  const char* op = "chunk_gated_delta_rule";
  Tensor p2 = pool0.clone();
  EXPECT_FI_ERROR(call(read, Tensor::from_vector({1, -2, 0}, {3}, DType::kInt64), p2, "auto",
                       Value(std::string("auto"))),
                  op, "output_state_indices");
  EXPECT_FI_ERROR(call(read, Tensor::from_vector({1, 4, 0}, {3}, DType::kInt64), p2, "auto",
                       Value(std::string("auto"))),
                  op, "output_state_indices");
  EXPECT_FI_ERROR(call(Tensor::from_vector({2, -2, 0}, {3}, DType::kInt32), write, p2, "auto",
                       Value(std::string("auto"))),
                  op, "state_indices");
  EXPECT_FI_ERROR(call(read, write.slice(0, 0, 2), p2, "auto", Value(std::string("auto"))), op,
                  "output_state_indices");
  EXPECT_FI_ERROR(call(read, write, p2, "cake_gdn", Value(std::string("auto"))), op, "backend");
  EXPECT_FI_ERROR(call(read, write, p2, "auto", Value(true)), op, "output_state_indices");
  EXPECT_TRUE(all_close(p2, pool0, {0.0, 0.0}));  // refused before anything ran
  // Without state_indices, or without output_final_state.
  EXPECT_FI_ERROR(chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, std::nullopt, p2, true,
                                         in.cu_t, false, std::nullopt, p2, std::nullopt,
                                         std::nullopt, 0, Value(std::string("auto")), std::nullopt,
                                         std::nullopt, "auto", std::nullopt, "linear", false,
                                         std::nullopt, std::nullopt, false, Value(), write),
                  op, "output_state_indices");
}

// Checkpoints at absolute positions (prefix_lens) into pool rows (checkpoint_state_indices),
// upstream 0.7.4: sequence i checkpoints after its n-th new token when prefix_lens[i] + n is a
// multiple of N, its j-th to row checkpoint_state_indices[checkpoint_cu_starts[i] + j] (-1:
// skipped), rows of a padded pool. Each equals the final state of a call on that many tokens.
TEST(GdnPrefill, CheckpointPoolRowsAtAbsolutePositions) {
  // Sequence 0: prefix 30, 100 new tokens: checkpoints after n = 34 and 98; sequence 1: prefix
  // 0, 70 tokens: after n = 64.
  const PrefillIn in = prefill_inputs({0, 100, 170}, 1, 1, 1, 8, 150);
  const int64_t H = 1, D = 8;
  Tensor storage = Tensor::full({6, H + 1, D, D}, 7.0, kF32);
  Tensor ckpt = storage.slice(1, 0, H);  // rows padded: stride(0) = 2 H V K
  const Tensor slots = Tensor::from_vector({5, -1, 2}, {3}, DType::kInt64);
  const Tensor starts = Tensor::from_vector({0, 2}, {2}, DType::kInt32);  // [N]: allowed here
  const Tensor prefix = Tensor::from_vector({30, 0}, {2}, DType::kInt64);
  auto call = [&](Tensor c, const Tensor& st, std::optional<Tensor> sl, std::optional<Tensor> pre,
                  int64_t every) {
    return chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt, true,
                                  in.cu_t, false, std::nullopt, std::nullopt, c, st, every,
                                  Value(std::string("auto")), std::nullopt, std::nullopt, "auto",
                                  std::nullopt, "linear", false, std::nullopt, std::nullopt, false,
                                  Value(), std::nullopt, sl, pre);
  };
  (void)call(ckpt, starts, slots, prefix, 64);
  auto prefix_state = [&](int64_t begin, int64_t n) {
    const Tensor cu = Tensor::from_vector({0.0, static_cast<double>(n)}, {2}, DType::kInt64);
    auto r = chunk_gated_delta_rule(
        in.q.slice(0, begin, begin + n), in.k.slice(0, begin, begin + n),
        in.v.slice(0, begin, begin + n), in.g.slice(0, begin, begin + n),
        in.beta.slice(0, begin, begin + n), std::nullopt, std::nullopt, true, cu);
    return r.final_state.select(0, 0);
  };
  EXPECT_TRUE(all_close(ckpt.select(0, 5), prefix_state(0, 34), {0.0, 0.0}));
  EXPECT_TRUE(all_close(ckpt.select(0, 2), prefix_state(100, 64), {0.0, 0.0}));
  for (int64_t row : {0, 1, 3, 4}) {  // the skipped checkpoint (n = 98) and unnamed rows
    EXPECT_TRUE(all_close(ckpt.select(0, row), Tensor::full({H, D, D}, 7.0, kF32), {0.0, 0.0}));
  }
  EXPECT_TRUE(all_close(storage.slice(1, H, H + 1), Tensor::full({6, 1, D, D}, 7.0, kF32),
                        {0.0, 0.0}));  // the padding untouched
  // prefix_lens alone: dense rows start + j, three checkpoints ((30 + 100) / 64 - 0 = 2, 1).
  Tensor dense = Tensor::zeros({3, H, D, D}, kF32);
  (void)call(dense, Tensor::from_vector({0, 2, 3}, {3}, DType::kInt64), std::nullopt, prefix, 64);
  EXPECT_TRUE(all_close(dense.select(0, 0), prefix_state(0, 34), {0.0, 0.0}));
  EXPECT_TRUE(all_close(dense.select(0, 1), prefix_state(0, 98), {0.0, 0.0}));
  EXPECT_TRUE(all_close(dense.select(0, 2), prefix_state(100, 64), {0.0, 0.0}));
  const char* op = "chunk_gated_delta_rule";
  EXPECT_FI_ERROR(
      call(dense, Tensor::from_vector({0, 3, 3}, {3}, DType::kInt64), std::nullopt, prefix, 64), op,
      "checkpoint_cu_starts");  // sequence 1's checkpoint past the 3 rows
  EXPECT_FI_ERROR(call(dense, starts, std::nullopt, prefix, 64), op, "checkpoint_cu_starts");
  // The checkpoint pool may be the state pool itself (a paged recurrent-state cache): sequence 0
  // reads row 0 and writes back there, sequence 1 row 1; the checkpoints land in rows 3 and 4.
  {
    const Tensor pool0 = rand_tensor({6, H, D, D}, kF32, 151, -0.3, 0.3);
    Tensor pool = pool0.clone();
    (void)chunk_gated_delta_rule(
        in.q, in.k, in.v, in.g, in.beta, std::nullopt, pool, true, in.cu_t, false, std::nullopt,
        pool, pool, starts, 64, Value(std::string("auto")),
        Tensor::from_vector({0, 1}, {2}, DType::kInt32), std::nullopt, "auto", std::nullopt,
        "linear", false, std::nullopt, std::nullopt, false, Value(), std::nullopt,
        Tensor::from_vector({3, -1, 4}, {3}, DType::kInt64), prefix);
    auto with_init = [&](int64_t begin, int64_t n, int64_t row) {
      const Tensor cu = Tensor::from_vector({0.0, static_cast<double>(n)}, {2}, DType::kInt64);
      return chunk_gated_delta_rule(
                 in.q.slice(0, begin, begin + n), in.k.slice(0, begin, begin + n),
                 in.v.slice(0, begin, begin + n), in.g.slice(0, begin, begin + n),
                 in.beta.slice(0, begin, begin + n), std::nullopt,
                 pool0.slice(0, row, row + 1).contiguous(), true, cu)
          .final_state.select(0, 0);
    };
    EXPECT_TRUE(all_close(pool.select(0, 3), with_init(0, 34, 0), {0.0, 0.0}));
    EXPECT_TRUE(all_close(pool.select(0, 4), with_init(100, 64, 1), {0.0, 0.0}));
    EXPECT_TRUE(all_close(pool.select(0, 0), with_init(0, 100, 0), {0.0, 0.0}));
    EXPECT_TRUE(all_close(pool.select(0, 5), pool0.select(0, 5), {0.0, 0.0}));
  }
  // A prefix whose checkpoint count would overflow.
  EXPECT_FI_ERROR(call(dense, Tensor::from_vector({0, 2, 3}, {3}, DType::kInt64), std::nullopt,
                       Tensor::from_vector({0.0, 9.2e18}, {2}, DType::kInt64), 64),
                  op, "prefix_lens");
  EXPECT_FI_ERROR(
      call(ckpt, starts, Tensor::from_vector({5, -1, 6}, {3}, DType::kInt64), prefix, 64), op,
      "checkpoint_state_indices");
  EXPECT_FI_ERROR(
      call(ckpt, Tensor::from_vector({0, 2}, {2}, DType::kInt32), slots.slice(0, 0, 2), prefix, 64),
      op, "checkpoint_cu_starts");  // sequence 1 names entry 2 of 2
  EXPECT_FI_ERROR(call(storage.slice(3, 0, D - 1), starts, slots, prefix, 64), op,
                  "state_checkpoints");
  EXPECT_FI_ERROR(call(ckpt, starts, std::nullopt, std::nullopt, 64), op,
                  "checkpoint_cu_starts");  // [N] starts only with checkpoint_state_indices
  EXPECT_FI_ERROR(call(ckpt, Tensor::from_vector({0, 2, 3}, {3}, DType::kInt64), std::nullopt,
                       std::nullopt, 64),
                  op, "state_checkpoints");  // padded rows only with checkpoint_state_indices
  EXPECT_FI_ERROR(
      chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt, true,
                             in.cu_t, false, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                             0, Value(std::string("auto")), std::nullopt, std::nullopt, "auto",
                             std::nullopt, "linear", false, std::nullopt, std::nullopt, false,
                             Value(), std::nullopt, std::nullopt, prefix),
      op, "prefix_lens");
}

// backend, max_seqlen and cu_seqlens_cpu (upstream 0.7.4): hints here, checked as upstream.
TEST(GdnPrefill, BackendAndHintsCheckedAsUpstream) {
  const PrefillIn in = prefill_inputs({0, 5, 12}, 1, 1, 1, 8, 160);
  auto call = [&](const std::string& backend, std::optional<int64_t> max_seqlen, Value host) {
    return chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt, true,
                                  in.cu_t, false, std::nullopt, std::nullopt, std::nullopt,
                                  std::nullopt, 0, Value(std::string("auto")), std::nullopt,
                                  std::nullopt, backend, max_seqlen, "linear", false, std::nullopt,
                                  std::nullopt, false, host);
  };
  const auto base = call("auto", std::nullopt, Value());
  Value::Items offsets{Value(int64_t{0}), Value(int64_t{5}), Value(int64_t{12})};
  for (const char* b : {"flashinfer", "sm120_cute", "cake_gdn", "cudnn"}) {
    const auto r = call(b, 7, Value::list(offsets));
    EXPECT_TRUE(all_close(r.output, base.output, {0.0, 0.0})) << b;
  }
  const auto r = call("auto", 12, Value(Tensor::from_vector({0, 5, 12}, {3}, DType::kInt32)));
  EXPECT_TRUE(all_close(r.final_state, base.final_state, {0.0, 0.0}));
  const char* op = "chunk_gated_delta_rule";
  EXPECT_FI_ERROR(call("triton", std::nullopt, Value()), op, "backend");
  EXPECT_FI_ERROR(call("auto", 13, Value()), op, "max_seqlen");  // above total_seq_len
  EXPECT_FI_ERROR(call("auto", 5, Value()), op, "max_seqlen");   // below ceil(12 / 2)
  EXPECT_FI_ERROR(call("auto", std::nullopt, Value::list({Value(int64_t{0}), Value(int64_t{12})})),
                  op, "cu_seqlens_cpu");
  EXPECT_FI_ERROR(call("auto", std::nullopt, Value(in.cu_t.to(DType::kFloat32))), op,
                  "cu_seqlens_cpu");
  // cuDNN's engine takes no checkpoints (upstream's NotImplementedError).
  Tensor ck = Tensor::zeros({1, 1, 8, 8}, kF32);
  EXPECT_FI_ERROR_CODE(
      chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt, true,
                             in.cu_t, false, std::nullopt, std::nullopt, ck,
                             Tensor::from_vector({0, 0, 0}, {3}, DType::kInt64), 64,
                             Value(std::string("auto")), std::nullopt, std::nullopt, "cudnn"),
      op, "checkpoint_every_n_tokens", ErrorCode::kUnsupported);
}

// Padding sent to slot 0 by several requests (bf16 pool, all indices -1): the CPU reference
// meets them in one order, so two identical calls give identical bits (upstream leaves it
// undefined); fp16 q on the bf16-state path returns the kernel's bf16 output, as upstream.
TEST(GdnDecode, SharedNullSlotIsDeterministicAndBf16PathOutputIsBf16) {
  const DecodeIn in = decode_inputs(8, 1, 1, 4, 32, 8, 125, DType::kFloat16);
  Tensor pool = rand_tensor({2, 4, 8, 32}, kBf, 126, -0.5, 0.5);
  Tensor idx = Tensor::from_vector(std::vector<double>(8, -1.0), {8}, DType::kInt32);
  Tensor p1 = pool.clone(), p2 = pool.clone();
  auto [o1, s1] = gated_delta_rule_decode_pretranspose(in.q, in.k, in.v, std::nullopt, in.A_log,
                                                       in.a, in.dt_bias, in.b, std::nullopt,
                                                       std::nullopt, true, p1, idx);
  auto [o2, s2] = gated_delta_rule_decode_pretranspose(in.q, in.k, in.v, std::nullopt, in.A_log,
                                                       in.a, in.dt_bias, in.b, std::nullopt,
                                                       std::nullopt, true, p2, idx);
  EXPECT_EQ(o1.dtype(), kBf);
  EXPECT_TRUE(all_close(o1, o2, {0.0, 0.0}));
  EXPECT_TRUE(all_close(p1, p2, {0.0, 0.0}));
  EXPECT_TRUE(all_close(p1.select(0, 1), pool.select(0, 1), {0.0, 0.0}));
}

// ---- bad input ----------------------------------------------------------------------------------

TEST(GdnBadInput, ErrorsNameOpAndArgument) {
  const DecodeIn in = decode_inputs(2, 1, 1, 2, 16, 8, 130);
  Tensor state = Tensor::zeros({2, 2, 8, 16}, kF32);
  const char* op = "gated_delta_rule_decode_pretranspose";
  auto pre = [&](const Tensor& q, const Tensor& v, std::optional<Tensor> st,
                 std::optional<Tensor> init = std::nullopt,
                 std::optional<Tensor> idx = std::nullopt,
                 std::optional<Tensor> widx = std::nullopt, const Tensor* A_log = nullptr) {
    return gated_delta_rule_decode_pretranspose(q, in.k, v, st, A_log ? *A_log : in.A_log, in.a,
                                                in.dt_bias, in.b, std::nullopt, std::nullopt, true,
                                                init, idx, widx);
  };
  EXPECT_FI_ERROR(pre(in.q.to(kF32), in.v, state), op, "q");
  EXPECT_FI_ERROR(pre(in.q, in.v.to(DType::kFloat16), state), op, "v");
  EXPECT_FI_ERROR(pre(in.q, in.v, std::nullopt), op, "state");
  EXPECT_FI_ERROR(pre(in.q, in.v, Tensor::zeros({2, 2, 16, 8}, kF32)), op, "state");
  Tensor pool = Tensor::zeros({3, 2, 8, 16}, kF32);
  EXPECT_FI_ERROR(pre(in.q, in.v, std::nullopt, pool), op, "initial_state_indices");
  EXPECT_FI_ERROR(
      pre(in.q, in.v, std::nullopt, pool, Tensor::from_vector({0, 3}, {2}, DType::kInt32)), op,
      "initial_state_indices");
  EXPECT_FI_ERROR(pre(in.q, in.v, state, std::nullopt, std::nullopt,
                      Tensor::from_vector({0, 1}, {2}, DType::kInt32)),
                  op, "output_state_indices");
  Tensor bad_a = Tensor::zeros({2}, DType::kFloat16);
  EXPECT_FI_ERROR(pre(in.q, in.v, state, std::nullopt, std::nullopt, std::nullopt, &bad_a), op,
                  "A_log");
  // fp32 state with T > 1 needs pool mode, as upstream.
  const DecodeIn in2 = decode_inputs(2, 2, 1, 2, 16, 8, 131);
  EXPECT_FI_ERROR(gated_delta_rule_decode_pretranspose(in2.q, in2.k, in2.v, state, in2.A_log, in2.a,
                                                       in2.dt_bias, in2.b),
                  op, "state");
  EXPECT_FI_ERROR(gated_delta_rule_decode(in2.q, in2.k, in2.v, Tensor::zeros({2, 2, 16, 8}, kF32),
                                          in2.A_log, in2.a, in2.dt_bias, in2.b),
                  "gated_delta_rule_decode", "q");
  // mtp: fp32 pool only; ssm_state_indices needs the update enabled.
  Tensor idx = Tensor::from_vector({0, 1}, {2}, DType::kInt32);
  EXPECT_FI_ERROR(gated_delta_rule_mtp(in2.q, in2.k, in2.v, pool.to(kBf), idx, in2.A_log, in2.a,
                                       in2.dt_bias, in2.b),
                  "gated_delta_rule_mtp", "initial_state");
  EXPECT_FI_ERROR(gated_delta_rule_mtp(in2.q, in2.k, in2.v, pool, idx, in2.A_log, in2.a,
                                       in2.dt_bias, in2.b, std::nullopt, std::nullopt, std::nullopt,
                                       Tensor::zeros({2, 2}, DType::kInt32)),
                  "gated_delta_rule_mtp", "disable_state_update");
  // Prefill.
  const PrefillIn p = prefill_inputs({0, 4, 9}, 2, 2, 4, 8, 132);
  const char* pop = "chunk_gated_delta_rule";
  EXPECT_FI_ERROR(chunk_gated_delta_rule(p.q, p.k, p.v), pop, "cu_seqlens");
  EXPECT_FI_ERROR(chunk_gated_delta_rule(p.q, p.k, p.v, p.g.to(kBf), std::nullopt, std::nullopt,
                                         std::nullopt, false, p.cu_t),
                  pop, "g");
  EXPECT_FI_ERROR(chunk_gated_delta_rule(p.q, p.k.slice(1, 0, 1), p.v, std::nullopt, std::nullopt,
                                         std::nullopt, std::nullopt, false, p.cu_t),
                  pop, "k");
  EXPECT_FI_ERROR(
      chunk_gated_delta_rule(p.q, p.k, p.v, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                             false, Tensor::from_vector({0, 6, 4}, {3}, DType::kInt64)),
      pop, "cu_seqlens");
  EXPECT_FI_ERROR(chunk_gated_delta_rule(p.q, p.k, p.v, std::nullopt, std::nullopt, std::nullopt,
                                         std::nullopt, false, p.cu_t, false, std::nullopt,
                                         std::nullopt, std::nullopt, std::nullopt, 32),
                  pop, "checkpoint_every_n_tokens");
  {  // checkpoint rows past state_checkpoints, a start near INT64_MAX included (no wrap)
    const PrefillIn lp = prefill_inputs({0, 64, 128}, 1, 1, 1, 8, 133);
    Tensor ck = Tensor::zeros({2, 1, 8, 8}, kF32);
    for (double start : {2.0, 9.2233720368547e18}) {
      Tensor st = Tensor::from_vector({0, start, 2}, {3}, DType::kInt64);
      EXPECT_FI_ERROR(chunk_gated_delta_rule(lp.q, lp.k, lp.v, std::nullopt, std::nullopt,
                                             std::nullopt, std::nullopt, false, lp.cu_t, false,
                                             std::nullopt, std::nullopt, ck, st, 64),
                      pop, "checkpoint_cu_starts");
    }
  }
  // A negative state index (no pools given: still an error, not a silent skip).
  EXPECT_FI_ERROR(chunk_gated_delta_rule(
                      p.q, p.k, p.v, std::nullopt, std::nullopt, std::nullopt, std::nullopt, false,
                      p.cu_t, false, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0,
                      Value(std::string("auto")), Tensor::from_vector({0, -1}, {2}, DType::kInt32)),
                  pop, "state_indices");
  // mtp step slots outside the pool.
  EXPECT_FI_ERROR(
      gated_delta_rule_mtp(in2.q, in2.k, in2.v, pool, idx, in2.A_log, in2.a, in2.dt_bias, in2.b,
                           std::nullopt, std::nullopt, std::nullopt,
                           Tensor::from_vector({0, 1, 2, 3}, {2, 2}, DType::kInt32), false),
      "gated_delta_rule_mtp", "ssm_state_indices");
  EXPECT_FI_ERROR(gated_delta_rule_decode_pretranspose(in.q, in.k, in.v, Tensor::zeros({}, kF32),
                                                       in.A_log, in.a, in.dt_bias, in.b),
                  op, "state");
  EXPECT_FI_ERROR(
      chunk_gated_delta_rule(p.q, p.k, p.v, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                             false, p.cu_t, false, std::nullopt, std::nullopt, std::nullopt,
                             std::nullopt, 0, Value(std::string("always"))),
      pop, "use_cp");
  EXPECT_FI_ERROR(chunk_gated_delta_rule(
                      p.q, p.k, p.v, std::nullopt, std::nullopt, std::nullopt, std::nullopt, true,
                      p.cu_t, false, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0,
                      Value(std::string("auto")), Tensor::from_vector({0, 1}, {2}, DType::kInt32)),
                  pop, "output_state");
}

TEST(GdnDecl, SignaturesModulesBackends) {
  struct D {
    const char* name;
    const char* module;
  };
  for (const D d : {D{"gated_delta_rule_decode_pretranspose", "flashinfer.gdn_decode"},
                    D{"gated_delta_rule_decode", "flashinfer.gdn_decode"},
                    D{"gated_delta_rule_mtp", "flashinfer.gdn_decode"},
                    D{"chunk_gated_delta_rule", "flashinfer.gdn_prefill"}}) {
    const OpDecl* decl = OpRegistry::global().find(d.name);
    ASSERT_NE(decl, nullptr) << d.name;
    EXPECT_EQ(decl->module, d.module);
    EXPECT_TRUE(op_has_backend(d.name, DeviceType::kCPU));
    EXPECT_EQ(op_has_backend(d.name, DeviceType::kCUDA), cuda_compiled());
  }
  EXPECT_EQ(OpRegistry::global().find("chunk_gated_delta_rule")->signature(),
            "(q, k, v, g=None, beta=None, scale=None, initial_state=None, "
            "output_final_state=False, cu_seqlens=None, use_qk_l2norm_in_kernel=False, "
            "output=None, output_state=None, state_checkpoints=None, checkpoint_cu_starts=None, "
            "checkpoint_every_n_tokens=0, use_cp='auto', state_indices=None, _cp_chunk_len=None, "
            "backend='auto', max_seqlen=None, *, gate_domain='linear', use_gate_in_kernel=False, "
            "A_log=None, dt_bias=None, beta_is_logit=False, cu_seqlens_cpu=None, "
            "output_state_indices=None, checkpoint_state_indices=None, prefix_lens=None)");
}

// ---- record and replay --------------------------------------------------------------------------

void run_every_op() {
  const DecodeIn in = decode_inputs(2, 1, 1, 2, 16, 8, 140);
  Tensor state = rand_tensor({2, 2, 8, 16}, kF32, 141, -0.5, 0.5);
  (void)gated_delta_rule_decode_pretranspose(in.q, in.k, in.v, state, in.A_log, in.a, in.dt_bias,
                                             in.b);
  Tensor kmajor = rand_tensor({2, 2, 16, 8}, kF32, 142, -0.5, 0.5);
  (void)gated_delta_rule_decode(in.q, in.k, in.v, kmajor, in.A_log, in.a, in.dt_bias, in.b);
  const DecodeIn in2 = decode_inputs(2, 2, 1, 2, 16, 8, 143);
  Tensor pool = rand_tensor({3, 2, 8, 16}, kF32, 144, -0.5, 0.5);
  Tensor buffer = Tensor::zeros({2, 2, 2, 8, 16}, kF32);
  (void)gated_delta_rule_mtp(
      in2.q, in2.k, in2.v, pool, Tensor::from_vector({2, 0}, {2}, DType::kInt32), in2.A_log, in2.a,
      in2.dt_bias, in2.b, std::nullopt, std::nullopt, buffer, std::nullopt, false);
  const PrefillIn p = prefill_inputs({0, 3, 10}, 1, 1, 2, 8, 145);
  (void)chunk_gated_delta_rule(p.q, p.k, p.v, p.g, p.beta, std::nullopt, std::nullopt, true,
                               p.cu_t);
}

TEST(GdnReplay, RecordAndReplay) {
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    run_every_op();
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 4u);
  for (const auto& c : calls) EXPECT_TRUE(replays_identically(c)) << c.name;
}

TEST(GdnReplay, DumpReplayPasses) { EXPECT_EQ(dump_replay_all("gdn", run_every_op), 4); }

// A recording as a GPU makes it (the chunked form's outputs, states and checkpoints: the CPU
// emulation of the chunked kernel stands in for the GPU) replays on the CPU: its fp32 states are
// outside replay's fp32 tolerance of the CPU's recurrence, within upstream's test tolerance for
// bf16, which chunk_gated_delta_rule's comparator allows; a state element off by 0.05 still
// fails, in the returned state and in a written output_state pool alike.
TEST(GdnReplay, ChunkedFormStatesReplayWithinUpstreamToleranceOnly) {
  namespace fs = std::filesystem;
  gdn_chunk_emu::Problem pb = gdn_chunk_emu::make_problem({0, 100, 230}, 1, 1, 2, 64, 400, true);
  pb.every = 64;
  const int64_t T = 230, H = 2, D = 64, N = 2, rows = 3;  // 1 + 2 checkpoints
  const Tensor q = Tensor::from_vector(pb.q, {T, 1, D}, kBf);
  const Tensor k = Tensor::from_vector(pb.k, {T, 1, D}, kBf);
  const Tensor v = Tensor::from_vector(pb.v, {T, 2, D}, kBf);
  pb.q = q.to_double_vector(), pb.k = k.to_double_vector(), pb.v = v.to_double_vector();
  const Tensor g = Tensor::from_vector(pb.g, {T, H}, kF32);
  const Tensor beta = Tensor::from_vector(pb.beta, {T, H}, kF32);
  const Tensor init = Tensor::from_vector(pb.state0, {N, H, D, D}, kF32);
  const Tensor cu = Tensor::from_vector({0, 100, 230}, {3}, DType::kInt64);
  const Tensor starts = Tensor::from_vector({0, 1, 3}, {3}, DType::kInt64);
  const auto emu = gdn_chunk_emu::run<float>(
      pb, [](float x) { return bfloat16_bits_to_float(float_to_bfloat16_bits(x)); });
  const Tensor emu_state = Tensor::from_vector(emu.state, {N, H, D, D}, kF32);
  const Tensor emu_ckpt = Tensor::from_vector(emu.ckpt, {rows, H, D, D}, kF32);
  const fs::path dir = record_dump("gdn_chunked_states", [&] {
    Tensor out_state = Tensor::zeros({N, H, D, D}, kF32),
           ckpt = Tensor::zeros({rows, H, D, D}, kF32);
    const auto r = chunk_gated_delta_rule(q, k, v, g, beta, std::nullopt, init, true, cu, false,
                                          std::nullopt, out_state, ckpt, starts, 64);
    // Replay's fp32 tolerance alone would refuse the chunked form's states.
    EXPECT_FALSE(replay::compare_tensors("s", emu_state, r.final_state).match);
  });
  std::vector<fs::path> calls;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) calls.push_back(e.path());
  }
  ASSERT_EQ(calls.size(), 1u);
  // The recorded outputs (outputs.pt: the returned output and final state) and written
  // arguments (mutated.pt: output, output_state, state_checkpoints) as the GPU would have written
  // them; `bump` adds 0.05 to one state element in the file named by `which`.
  const std::string files[2] = {(calls[0] / "outputs.pt").string(),
                                (calls[0] / "mutated.pt").string()};
  const NamedTensors recorded[2] = {load_torch(files[0]), load_torch(files[1])};
  auto rewrite = [&](int which) {
    int states = 0, ckpts = 0;
    for (int f = 0; f < 2; ++f) {
      NamedTensors t;
      for (const auto& [key, x] : recorded[f]) {
        Tensor y = x;
        if (x.dtype() == kBf) y = Tensor::from_vector(emu.out, x.shape(), kBf);
        if (x.dtype() == kF32 && x.size(0) == N) {
          ++states;
          std::vector<double> st = emu.state;
          if (which == f) st[777] += 0.05;
          y = Tensor::from_vector(st, x.shape(), kF32);
        }
        if (x.dtype() == kF32 && x.size(0) == rows) ++ckpts, y = emu_ckpt;
        t.emplace_back(key, y);
      }
      save_torch(files[f], t);
    }
    EXPECT_EQ(states, 2) << "the returned final state and the written output_state";
    EXPECT_EQ(ckpts, 1);
    return replay::replay_from_dump(calls[0].string());
  };
  const replay::Result ok = rewrite(-1);
  EXPECT_EQ(ok.status, replay::Status::kPassed) << ok.error << " " << ok.note;
  EXPECT_NE(ok.note.find("upstream's test tolerance"), std::string::npos) << ok.note;
  for (const int which : {0, 1}) {
    const replay::Result bad = rewrite(which);
    EXPECT_EQ(bad.status, replay::Status::kMismatch) << which;
    int64_t mismatched = 0;
    for (const auto& c : bad.comparisons) mismatched += c.mismatches;
    EXPECT_EQ(mismatched, 1) << which;
  }
  fs::remove_all(dir);
}

// `flashinfer bench --refcheck` judges a backend's outputs as replay does: the final state
// (fp32) of a GPU's chunked form passes within upstream's bf16 state tolerance, where replay's
// plain fp32 comparison would call it a mismatch; a state element off by 0.05 still fails.
TEST(GdnBench, RefcheckJudgesStatesByTheOpsComparator) {
  BenchShape shape;
  shape.batch_size = 2, shape.s_kv = 80, shape.num_qo_heads = 4, shape.num_kv_heads = 2;
  const BenchHook* hook = find_bench_hook("chunk_gated_delta_rule");
  ASSERT_NE(hook, nullptr);
  BenchCase c = (*hook)(shape, Device::cpu());
  c.run();
  const NamedTensors expected = c.outputs();
  ASSERT_EQ(expected.size(), 2u);
  ASSERT_EQ(expected[1].first, "result[1]");
  auto nudged = [&](double by) {
    NamedTensors a = expected;
    std::vector<double> st = a[1].second.to_double_vector();
    st[17] += by;
    a[1].second = Tensor::from_vector(st, a[1].second.shape(), kF32);
    return a;
  };
  const NamedTensors close = nudged(1e-3);
  EXPECT_FALSE(replay::compare_tensors("s", close[1].second, expected[1].second).match);
  auto judged = api::bench::judge_outputs("chunk_gated_delta_rule", c, close, expected);
  ASSERT_EQ(judged.size(), 2u);
  EXPECT_TRUE(judged[0].match && judged[1].match);
  EXPECT_EQ(judged[1].key, "result[1]");
  judged = api::bench::judge_outputs("chunk_gated_delta_rule", c, nudged(0.05), expected);
  EXPECT_TRUE(judged[0].match);
  EXPECT_FALSE(judged[1].match);
  EXPECT_EQ(judged[1].mismatches, 1);
  // An op without a comparator: replay's comparison alone.
  judged = api::bench::judge_outputs("rmsnorm", c, close, expected);
  EXPECT_FALSE(judged[1].match);
}

// The same for a written argument (an output_state pool), through the comparator's second look.
TEST(GdnBench, RefcheckJudgesAWrittenStatePoolByTheOpsComparator) {
  const PrefillIn in = prefill_inputs({0, 40}, 1, 1, 1, 16, 410);
  Tensor pool = Tensor::zeros({1, 1, 16, 16}, kF32);
  BenchCase c =
      api::bench::invoke_case("chunk_gated_delta_rule",
                              {Value(in.q), Value(in.k), Value(in.v), Value(in.g), Value(in.beta)},
                              {{"output_final_state", Value(true)},
                               {"cu_seqlens", Value(in.cu_t)},
                               {"output_state", Value(pool)}});
  c.run();
  const NamedTensors expected = c.outputs();
  std::size_t at = expected.size();
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (expected[i].first == "output_state") at = i;
  }
  ASSERT_LT(at, expected.size());
  auto nudged = [&](double by) {
    NamedTensors a = expected;
    std::vector<double> st = a[at].second.to_double_vector();
    st[3] += by;
    a[at].second = Tensor::from_vector(st, a[at].second.shape(), kF32);
    return a;
  };
  EXPECT_TRUE(
      api::bench::judge_outputs("chunk_gated_delta_rule", c, nudged(1e-3), expected)[at].match);
  const auto bad = api::bench::judge_outputs("chunk_gated_delta_rule", c, nudged(0.05), expected);
  EXPECT_FALSE(bad[at].match);
  EXPECT_EQ(bad[at].mismatches, 1);
}

// ---- CUDA against the CPU -----------------------------------------------------------------------

Tensor cuda(const Tensor& t) { return to_keep_layout(t, Device::cuda(0)); }

// Calls the chunked prefill kernel took so far (0 in a build without CUDA, whose GPU cases skip).
// Not `&& FLASHINFER_WITH_CUDA`: that is the library's private definition (src/CMakeLists.txt),
// undefined here, so the counter read 0 on every GPU; tests/CMakeLists.txt sets
// FLASHINFER_TEST_HAVE_CUDA_HEADERS exactly when the library has its CUDA backend.
uint64_t chunked_launches() {
#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
  return kernels::cuda::gdn_chunked_launches();
#else
  return 0;
#endif
}

TEST(GdnCuda, DecodeOpsMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (int64_t K : {128, 96, 256}) {
    const DecodeIn in = decode_inputs(5, 1, 2, 4, K, 64, 150 + K);
    Tensor state = rand_tensor({5, 4, 64, K}, kF32, 151, -0.5, 0.5);
    Tensor dstate = cuda(state);
    auto [o_cpu, s_cpu] = gated_delta_rule_decode_pretranspose(in.q, in.k, in.v, state, in.A_log,
                                                               in.a, in.dt_bias, in.b);
    auto [o_gpu, s_gpu] = gated_delta_rule_decode_pretranspose(cuda(in.q), cuda(in.k), cuda(in.v),
                                                               dstate, cuda(in.A_log), cuda(in.a),
                                                               cuda(in.dt_bias), cuda(in.b));
    EXPECT_TRUE(all_close(o_gpu.to(Device::cpu()), o_cpu, {1e-4, 8e-3})) << K;
    EXPECT_TRUE(all_close(dstate.to(Device::cpu()), state, {2e-5, 1e-4})) << K;
    Tensor kmajor = rand_tensor({5, 4, K, 64}, kF32, 152, -0.5, 0.5);
    Tensor dk = cuda(kmajor);
    auto [o2c, s2c] =
        gated_delta_rule_decode(in.q, in.k, in.v, kmajor, in.A_log, in.a, in.dt_bias, in.b);
    auto [o2g, s2g] =
        gated_delta_rule_decode(cuda(in.q), cuda(in.k), cuda(in.v), dk, cuda(in.A_log), cuda(in.a),
                                cuda(in.dt_bias), cuda(in.b));
    EXPECT_TRUE(all_close(o2g.to(Device::cpu()), o2c, {1e-4, 8e-3})) << K;
    EXPECT_TRUE(all_close(dk.to(Device::cpu()), kmajor, {2e-5, 1e-4})) << K;
  }
  // bf16 pool with a negative index (slot 0), T = 3.
  const DecodeIn in = decode_inputs(3, 3, 1, 2, 128, 32, 160, DType::kFloat16);
  Tensor pool = rand_tensor({4, 2, 32, 128}, kBf, 161, -0.5, 0.5);
  Tensor dpool = cuda(pool);
  Tensor idx = Tensor::from_vector({3, -1, 2}, {3}, DType::kInt64);
  auto [oc, sc] = gated_delta_rule_decode_pretranspose(in.q, in.k, in.v, std::nullopt, in.A_log,
                                                       in.a, in.dt_bias, in.b, std::nullopt,
                                                       std::nullopt, true, pool, idx);
  auto [og, sg] = gated_delta_rule_decode_pretranspose(
      cuda(in.q), cuda(in.k), cuda(in.v), std::nullopt, cuda(in.A_log), cuda(in.a),
      cuda(in.dt_bias), cuda(in.b), std::nullopt, std::nullopt, true, dpool, cuda(idx));
  EXPECT_TRUE(all_close(og.to(Device::cpu()), oc, {1e-4, 8e-3}));
  EXPECT_TRUE(all_close(dpool.to(Device::cpu()), pool, {1e-2, 1e-2}));
}

TEST(GdnCuda, MtpMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const DecodeIn in = decode_inputs(4, 3, 2, 4, 128, 128, 170);
  Tensor pool = rand_tensor({6, 4, 128, 128}, kF32, 171, -0.5, 0.5);
  Tensor dpool = cuda(pool);
  Tensor idx = Tensor::from_vector({5, -1, 0, 2}, {4}, DType::kInt32);
  Tensor widx = Tensor::from_vector({1, 3, -1, 4}, {4}, DType::kInt32);
  Tensor buf = Tensor::zeros({4, 3, 4, 128, 128}, kF32), dbuf = cuda(buf);
  auto [oc, sc] =
      gated_delta_rule_mtp(in.q, in.k, in.v, pool, idx, in.A_log, in.a, in.dt_bias, in.b,
                           std::nullopt, std::nullopt, buf, std::nullopt, false, true, widx);
  auto [og, sg] =
      gated_delta_rule_mtp(cuda(in.q), cuda(in.k), cuda(in.v), dpool, cuda(idx), cuda(in.A_log),
                           cuda(in.a), cuda(in.dt_bias), cuda(in.b), std::nullopt, std::nullopt,
                           dbuf, std::nullopt, false, true, cuda(widx));
  EXPECT_TRUE(all_close(og.to(Device::cpu()), oc, {1e-4, 8e-3}));
  EXPECT_TRUE(all_close(dpool.to(Device::cpu()), pool, {2e-5, 1e-4}));
  EXPECT_TRUE(all_close(dbuf.to(Device::cpu()), buf, {2e-5, 1e-4}));
}

// The recurrent kernel (FLASHINFER_GDN_CHUNKED=0; the chunked kernel takes head dim 128 by
// default): agreement to fp32 rounding.
TEST(GdnCuda, PrefillMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const ScopedEnv recurrent("FLASHINFER_GDN_CHUNKED", "0");
  const uint64_t chunked_before = chunked_launches();
  for (const DType io : {kBf, DType::kFloat16}) {
    const PrefillIn in = prefill_inputs({0, 70, 70, 200, 333}, 2, 2, 4, 128, 180, io);
    Tensor init = rand_tensor({4, 4, 128, 128}, kF32, 181, -0.3, 0.3);
    // Lengths 70, 0, 130, 133: 1, 0, 2 and 2 checkpoints of 64 tokens.
    Tensor ckpt = Tensor::zeros({5, 4, 128, 128}, kF32), dckpt = cuda(ckpt);
    Tensor starts = Tensor::from_vector({0, 1, 1, 3, 5}, {5}, DType::kInt32);
    auto rc = chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, std::nullopt, init, true,
                                     in.cu_t, true, std::nullopt, std::nullopt, ckpt, starts, 64);
    auto rg = chunk_gated_delta_rule(cuda(in.q), cuda(in.k), cuda(in.v), cuda(in.g), cuda(in.beta),
                                     std::nullopt, cuda(init), true, cuda(in.cu_t), true,
                                     std::nullopt, std::nullopt, dckpt, cuda(starts), 64);
    const double rt = io == kBf ? 1.6e-2 : 2e-3;
    EXPECT_TRUE(all_close(rg.output.to(Device::cpu()), rc.output, {2e-3, rt}));
    EXPECT_TRUE(all_close(rg.final_state.to(Device::cpu()), rc.final_state, {1e-4, 1e-3}));
    EXPECT_TRUE(all_close(dckpt.to(Device::cpu()), ckpt, {1e-4, 1e-3}));
  }
  EXPECT_EQ(chunked_launches(), chunked_before);
}

// Upstream 0.7.4's arguments on the GPU against the CPU: the q / k L2 norms and the raw-gate /
// logit-beta transforms (materialized by their own kernels, then the chunked kernel), a read of
// -1 from zeros and a skipped write (output_state_indices, chunked too), and checkpoints at
// absolute positions into padded pool rows (the recurrent kernel takes those).
TEST(GdnCuda, PrefillUpstream074ArgumentsMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const PrefillIn in = prefill_inputs({0, 70, 200, 333}, 2, 2, 4, 128, 185);
  const int64_t T = 333, H = 4, D = 128;
  const Tensor g_raw = rand_tensor({T, H}, kBf, 186, -3.0, 3.0);
  const Tensor b_logit = rand_tensor({T, H}, kBf, 187, -4.0, 4.0);
  const Tensor A_log = Tensor::from_vector({-2.0, -1.0, 0.5, -4.0}, {H}, kF32);
  const Tensor dt_bias = Tensor::from_vector({0.25, -0.5, 1.0, 0.0}, {H}, kBf);
  const Tensor pool0 = rand_tensor({4, H, D, D}, kF32, 188, -0.3, 0.3);
  const Tensor read = Tensor::from_vector({2, -1, 0}, {3}, DType::kInt32);
  const Tensor write = Tensor::from_vector({1, 3, -1}, {3}, DType::kInt32);
  Tensor pc = pool0.clone(), pg = cuda(pool0);
  const uint64_t chunked_before = chunked_launches();
  auto call = [&](const PrefillIn& x, const Tensor& g, const Tensor& b, const Tensor& A,
                  const Tensor& dt, Tensor& pool, const Tensor& rd, const Tensor& wr,
                  const Tensor& cu) {
    return chunk_gated_delta_rule(x.q, x.k, x.v, g, b, std::nullopt, pool, true, cu, true,
                                  std::nullopt, pool, std::nullopt, std::nullopt, 0,
                                  Value(std::string("auto")), rd, std::nullopt, "auto",
                                  std::nullopt, "linear", true, A, dt, true, Value(), wr);
  };
  auto rc = call(in, g_raw, b_logit, A_log, dt_bias, pc, read, write, in.cu_t);
  PrefillIn dev = in;
  dev.q = cuda(in.q), dev.k = cuda(in.k), dev.v = cuda(in.v);
  auto rg = call(dev, cuda(g_raw), cuda(b_logit), cuda(A_log), cuda(dt_bias), pg, cuda(read),
                 cuda(write), cuda(in.cu_t));
  EXPECT_TRUE(all_close(rg.output.to(Device::cpu()), rc.output, {2e-3, 1.6e-2}));
  EXPECT_TRUE(all_close(pg.to(Device::cpu()), pc, {1e-4, 1e-3}));
  EXPECT_EQ(chunked_launches(), chunked_before + 1);
  // Checkpoints into padded pool rows: sequence 0 (a 30-token prefix, 70 new) after its 34th
  // token to row 5; sequence 1 (130) after 64 and 128 to rows 2 and 0; sequence 2 (133) skips
  // its first and writes its second to row 4.
  Tensor store_c = Tensor::full({6, H + 1, D, D}, 7.0, kF32), store_g = cuda(store_c);
  const Tensor slots = Tensor::from_vector({5, -1, 2, 0, -1, 4}, {6}, DType::kInt64);
  const Tensor starts = Tensor::from_vector({0, 2, 4}, {3}, DType::kInt32);
  const Tensor prefix = Tensor::from_vector({30, 0, 0}, {3}, DType::kInt64);
  auto ck = [&](const PrefillIn& x, const Tensor& cu, Tensor store, const Tensor& st,
                const Tensor& sl, const Tensor& pre) {
    return chunk_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, std::nullopt, std::nullopt, true, cu,
                                  false, std::nullopt, std::nullopt, store.slice(1, 0, H), st, 64,
                                  Value(std::string("auto")), std::nullopt, std::nullopt, "auto",
                                  std::nullopt, "linear", false, std::nullopt, std::nullopt, false,
                                  Value(), std::nullopt, sl, pre);
  };
  dev.g = cuda(in.g), dev.beta = cuda(in.beta);
  const auto cc = ck(in, in.cu_t, store_c, starts, slots, prefix);
  const auto cg = ck(dev, cuda(in.cu_t), store_g, cuda(starts), cuda(slots), cuda(prefix));
  EXPECT_TRUE(all_close(cg.output.to(Device::cpu()), cc.output, {2e-3, 1.6e-2}));
  EXPECT_TRUE(all_close(store_g.to(Device::cpu()), store_c, {1e-4, 1e-3}));
}

// The paths and guards the cases above do not reach: small K (1 and 2 values a lane), the fp32
// one-token pool (negative read: zero output; negative write: slot 0), per-step pool slots,
// prefill GQA; and the device-side guards where the CPU raises: a read slot outside the pool
// (NaN outputs, no state written), an invalid cu_seqlens range (the sequence skipped), a
// negative state index in prefill (NaN outputs).
TEST(GdnCuda, SmallHeadDimsPoolRulesAndGuards) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (int64_t K : {16, 64}) {
    const DecodeIn in = decode_inputs(4, 1, 1, 2, K, 8, 190 + K);
    Tensor pool = rand_tensor({5, 2, 8, K}, kF32, 191, -0.5, 0.5), dpool = cuda(pool);
    Tensor read = Tensor::from_vector({4, -1, 1, 2}, {4}, DType::kInt32);
    Tensor write = Tensor::from_vector({3, 0, 1, -1}, {4}, DType::kInt32);
    auto [oc, sc] = gated_delta_rule_decode_pretranspose(in.q, in.k, in.v, std::nullopt, in.A_log,
                                                         in.a, in.dt_bias, in.b, std::nullopt,
                                                         std::nullopt, true, pool, read, write);
    auto [og, sg] = gated_delta_rule_decode_pretranspose(
        cuda(in.q), cuda(in.k), cuda(in.v), std::nullopt, cuda(in.A_log), cuda(in.a),
        cuda(in.dt_bias), cuda(in.b), std::nullopt, std::nullopt, true, dpool, cuda(read),
        cuda(write));
    EXPECT_TRUE(all_close(og.to(Device::cpu()), oc, {1e-4, 8e-3})) << K;
    EXPECT_TRUE(all_close(dpool.to(Device::cpu()), pool, {2e-5, 1e-4})) << K;
  }
  {  // per-step pool slots
    const DecodeIn in = decode_inputs(2, 2, 1, 1, 32, 8, 195);
    Tensor pool = rand_tensor({6, 1, 8, 32}, kF32, 196, -0.5, 0.5), dpool = cuda(pool);
    Tensor read = Tensor::from_vector({0, 1}, {2}, DType::kInt32);
    Tensor steps = Tensor::from_vector({2, 3, -1, 5}, {2, 2}, DType::kInt32);
    auto [oc, sc] =
        gated_delta_rule_mtp(in.q, in.k, in.v, pool, read, in.A_log, in.a, in.dt_bias, in.b,
                             std::nullopt, std::nullopt, std::nullopt, steps, false);
    auto [og, sg] = gated_delta_rule_mtp(
        cuda(in.q), cuda(in.k), cuda(in.v), dpool, cuda(read), cuda(in.A_log), cuda(in.a),
        cuda(in.dt_bias), cuda(in.b), std::nullopt, std::nullopt, std::nullopt, cuda(steps), false);
    EXPECT_TRUE(all_close(og.to(Device::cpu()), oc, {1e-4, 8e-3}));
    EXPECT_TRUE(all_close(dpool.to(Device::cpu()), pool, {2e-5, 1e-4}));
  }
  {  // prefill GQA (4 q heads over 2 k / v heads), on the recurrent kernel
    const ScopedEnv recurrent("FLASHINFER_GDN_CHUNKED", "0");
    const PrefillIn in = prefill_inputs({0, 40, 97}, 4, 2, 2, 64, 197);
    auto rc = chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt,
                                     true, in.cu_t);
    auto rg = chunk_gated_delta_rule(cuda(in.q), cuda(in.k), cuda(in.v), cuda(in.g), cuda(in.beta),
                                     std::nullopt, std::nullopt, true, cuda(in.cu_t));
    EXPECT_TRUE(all_close(rg.output.to(Device::cpu()), rc.output, {2e-3, 1.6e-2}));
    EXPECT_TRUE(all_close(rg.final_state.to(Device::cpu()), rc.final_state, {1e-4, 1e-3}));
  }
  auto all_nan = [](const Tensor& t) {
    for (double x : t.to(Device::cpu()).to_double_vector()) {
      if (!std::isnan(x)) return false;
    }
    return true;
  };
  {  // a read slot outside the pool: NaN outputs for that request, its slots untouched
    const DecodeIn in = decode_inputs(2, 1, 1, 1, 32, 8, 198);
    Tensor pool = rand_tensor({3, 1, 8, 32}, kF32, 199, -0.5, 0.5), dpool = cuda(pool);
    Tensor read = Tensor::from_vector({7, 1}, {2}, DType::kInt32);
    auto [og, sg] = gated_delta_rule_decode_pretranspose(
        cuda(in.q), cuda(in.k), cuda(in.v), std::nullopt, cuda(in.A_log), cuda(in.a),
        cuda(in.dt_bias), cuda(in.b), std::nullopt, std::nullopt, true, dpool, cuda(read));
    EXPECT_TRUE(all_nan(og.slice(0, 0, 1)));
    EXPECT_FALSE(all_nan(og.slice(0, 1, 2)));
    const Tensor after = dpool.to(Device::cpu());
    for (int64_t s : {0, 2}) {
      EXPECT_TRUE(all_close(after.select(0, s), pool.select(0, s), {0.0, 0.0})) << s;
    }
  }
  {  // an invalid cu_seqlens range is skipped (its output rows stay zero); a negative state
     // index writes NaN
    const PrefillIn in = prefill_inputs({0, 4, 9}, 1, 1, 1, 16, 200);
    Tensor bad_cu = Tensor::from_vector({0, 6, 4}, {3}, DType::kInt64);
    auto r = chunk_gated_delta_rule(cuda(in.q), cuda(in.k), cuda(in.v), cuda(in.g), cuda(in.beta),
                                    std::nullopt, std::nullopt, false, cuda(bad_cu));
    const auto o = r.output.to(Device::cpu()).to_double_vector();
    for (int64_t i = 6 * 16; i < 9 * 16; ++i) EXPECT_EQ(o[i], 0.0);
    Tensor pool = Tensor::zeros({2, 1, 16, 16}, kF32);
    auto rn = chunk_gated_delta_rule(
        cuda(in.q), cuda(in.k), cuda(in.v), cuda(in.g), cuda(in.beta), std::nullopt, cuda(pool),
        false, cuda(in.cu_t), false, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0,
        Value(std::string("auto")), cuda(Tensor::from_vector({1, -1}, {2}, DType::kInt32)));
    EXPECT_TRUE(all_nan(rn.output.slice(0, 4, 9)));
    EXPECT_FALSE(all_nan(rn.output.slice(0, 0, 4)));
    // No initial state, an output pool of 2 slots and a state index of 5 (the CPU refuses it):
    // NaN outputs there too, not outputs from a zero state with the write dropped.
    Tensor out_pool = cuda(Tensor::zeros({2, 1, 16, 16}, kF32));
    auto ro = chunk_gated_delta_rule(
        cuda(in.q), cuda(in.k), cuda(in.v), cuda(in.g), cuda(in.beta), std::nullopt, std::nullopt,
        true, cuda(in.cu_t), false, std::nullopt, out_pool, std::nullopt, std::nullopt, 0,
        Value(std::string("auto")), cuda(Tensor::from_vector({0, 5}, {2}, DType::kInt32)));
    EXPECT_TRUE(all_nan(ro.output.slice(0, 4, 9)));
    EXPECT_FALSE(all_nan(ro.output.slice(0, 0, 4)));
  }
  {  // K 16 (lanes past K in every warp): an inf value gives inf outputs, as on the CPU
    // q, k positive: every state entry of the row becomes +inf and so does each output, where an
    // inf times a padding lane's 0 would make the warp's sum NaN.
    PrefillIn in = prefill_inputs({0, 1}, 1, 1, 1, 16, 201);
    in.q = in.q.clone(), in.k = in.k.clone(), in.v = in.v.clone();
    in.q.fill_(0.5);
    in.k.fill_(0.25);
    in.v.fill_(std::numeric_limits<double>::infinity());
    in.beta = in.beta.clone();
    in.beta.fill_(0.5);
    auto rc = chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt,
                                     false, in.cu_t);
    auto rg = chunk_gated_delta_rule(cuda(in.q), cuda(in.k), cuda(in.v), cuda(in.g), cuda(in.beta),
                                     std::nullopt, std::nullopt, false, cuda(in.cu_t));
    const auto c = rc.output.to_double_vector(), g = rg.output.to(Device::cpu()).to_double_vector();
    ASSERT_EQ(c.size(), g.size());
    for (std::size_t i = 0; i < c.size(); ++i) {
      EXPECT_TRUE(std::isinf(c[i]) && c[i] > 0) << i;  // the CPU reference: +inf
      EXPECT_EQ(g[i], c[i]) << i;
    }
  }
}

// The chunked tensor-core kernel (gdn_chunk_cuda.cu) against the CPU's recurrence at upstream's
// test tolerances (bf16 out 1e-2 / 1e-2, state 5e-3 / 1e-3; fp16 2e-3 / 1e-3, 1e-3 / 1e-4) and
// against its CPU emulation (tests/util/gdn_chunk_emulation.h, the same rounding points) at the
// same: outputs, final states and checkpoints, on the cases whose emulation
// GdnChunk.CudaTestCasesEmulatedWithinUpstreamTolerances checks without a GPU. Then one copy
// stage against two (bit for bit) and a grid past one wave, strided
// views of a fused projection and a wider output buffer (bit for bit the contiguous call), a
// pool with state indices (bit for bit the packed call), the NaN rows of a negative index,
// FLASHINFER_GDN_CHUNKED=0, and the NaN rows of an index past the output pool.
TEST(GdnCuda, ChunkedPrefillMatchesCpuAtUpstreamTolerances) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (const auto& c : gdn_chunk_emu::cuda_cases()) {
    gdn_chunk_emu::Problem pb = gdn_chunk_emu::cuda_problem(c);
    const DType io = c.bf16 ? kBf : DType::kFloat16;
    const int64_t T = pb.cu.back(), H = pb.heads(), D = pb.D;
    const int64_t N = static_cast<int64_t>(pb.cu.size()) - 1;
    const Tensor q = Tensor::from_vector(pb.q, {T, pb.Hq, D}, io);
    const Tensor k = Tensor::from_vector(pb.k, {T, pb.Hk, D}, io);
    const Tensor v = Tensor::from_vector(pb.v, {T, pb.Hv, D}, io);
    pb.q = q.to_double_vector(), pb.k = k.to_double_vector(), pb.v = v.to_double_vector();
    const Tensor g = Tensor::from_vector(pb.g, {T, H}, kF32);
    const Tensor beta = Tensor::from_vector(pb.beta, {T, H}, kF32);
    const Tensor init = Tensor::from_vector(pb.state0, {N, H, D, D}, kF32);
    std::vector<double> cu_v(pb.cu.begin(), pb.cu.end()), starts_v{0};
    for (int64_t n = 0; n < N; ++n) {
      starts_v.push_back(starts_v.back() + static_cast<double>((pb.cu[n + 1] - pb.cu[n]) / 64));
    }
    const int64_t rows = static_cast<int64_t>(starts_v.back());
    const Tensor cu = Tensor::from_vector(cu_v, {N + 1}, DType::kInt64);
    const Tensor starts = Tensor::from_vector(starts_v, {N + 1}, DType::kInt64);
    Tensor ckpt = Tensor::zeros({rows, H, D, D}, kF32), dckpt = cuda(ckpt);
    auto rc = chunk_gated_delta_rule(q, k, v, g, beta, std::nullopt, init, true, cu, false,
                                     std::nullopt, std::nullopt, ckpt, starts, 64);
    const uint64_t before = chunked_launches();
    auto rg = chunk_gated_delta_rule(cuda(q), cuda(k), cuda(v), cuda(g), cuda(beta), std::nullopt,
                                     cuda(init), true, cuda(cu), false, std::nullopt, std::nullopt,
                                     dckpt, cuda(starts), 64);
    EXPECT_EQ(chunked_launches(), before + 1) << c.seed;
    const auto emu =
        gdn_chunk_emu::run<float>(pb, [io](float x) { return gdn_chunk_emu::round_to_io(io, x); });
    const Tolerance out_tol = c.bf16 ? Tolerance{1e-2, 1e-2} : Tolerance{2e-3, 1e-3};
    const Tolerance st_tol = c.bf16 ? Tolerance{5e-3, 1e-3} : Tolerance{1e-3, 1e-4};
    const Tensor out = rg.output.to(Device::cpu());
    EXPECT_TRUE(all_close(out, rc.output, out_tol)) << c.seed;
    EXPECT_TRUE(all_close(out, emu.out, out_tol)) << c.seed << " (emulation)";
    EXPECT_TRUE(all_close(rg.final_state.to(Device::cpu()), rc.final_state, st_tol)) << c.seed;
    EXPECT_TRUE(all_close(rg.final_state.to(Device::cpu()), emu.state, st_tol)) << c.seed;
    EXPECT_TRUE(all_close(dckpt.to(Device::cpu()), ckpt, st_tol)) << c.seed;
  }
  {
    // One copy stage and two (FLASHINFER_GDN_CHUNK_STAGES): the same arithmetic, the same bits;
    // a grid of 400 blocks (past one wave) on its own choice, which is one stage.
    const PrefillIn in = prefill_inputs({0, 70, 200, 333}, 2, 2, 4, 128, 330);
    const Tensor init = cuda(rand_tensor({3, 4, 128, 128}, kF32, 331, -0.3, 0.3));
    for (const bool gates : {true, false}) {  // without g and beta: alpha = beta = 1
      auto run = [&](const char* stages) {
        const ScopedEnv env("FLASHINFER_GDN_CHUNK_STAGES", stages);
        auto r = chunk_gated_delta_rule(cuda(in.q), cuda(in.k), cuda(in.v),
                                        gates ? std::optional(cuda(in.g)) : std::nullopt,
                                        gates ? std::optional(cuda(in.beta)) : std::nullopt,
                                        std::nullopt, init, true, cuda(in.cu_t));
        return std::pair{r.output.to(Device::cpu()), r.final_state.to(Device::cpu())};
      };
      const auto one = run("1"), two = run("2");
      EXPECT_TRUE(all_close(one.first, two.first, {0.0, 0.0})) << gates;
      EXPECT_TRUE(all_close(one.second, two.second, {0.0, 0.0})) << gates;
    }
    std::vector<int64_t> cu{0};
    for (int i = 0; i < 100; ++i) cu.push_back(cu.back() + 17 + (i * 7) % 60);
    const PrefillIn many = prefill_inputs(cu, 2, 2, 2, 128, 332);  // 100 x 2 heads x 2 slices
    auto rc = chunk_gated_delta_rule(many.q, many.k, many.v, many.g, many.beta, std::nullopt,
                                     std::nullopt, true, many.cu_t);
    auto rg =
        chunk_gated_delta_rule(cuda(many.q), cuda(many.k), cuda(many.v), cuda(many.g),
                               cuda(many.beta), std::nullopt, std::nullopt, true, cuda(many.cu_t));
    EXPECT_TRUE(all_close(rg.output.to(Device::cpu()), rc.output, {1e-2, 1e-2}));
    EXPECT_TRUE(all_close(rg.final_state.to(Device::cpu()), rc.final_state, {5e-3, 1e-3}));
  }
  {
    // As the engines pass them: q, k and v heads of one fused projection row (token stride
    // (2 + 2 + 4) x 128), the output a view into a wider buffer. The chunked kernel takes the
    // views (no copy) and gives the bits of the contiguous call.
    const PrefillIn in = prefill_inputs({0, 100, 230}, 2, 2, 4, 128, 320);
    Tensor fused = cuda(Tensor::zeros({230, 8, 128}, kBf));
    fused.slice(1, 0, 2).copy_(cuda(in.q));
    fused.slice(1, 2, 4).copy_(cuda(in.k));
    fused.slice(1, 4, 8).copy_(cuda(in.v));
    Tensor wide = cuda(Tensor::zeros({230, 5, 128}, kBf));
    const Tensor init = cuda(rand_tensor({2, 4, 128, 128}, kF32, 321, -0.3, 0.3));
    auto contiguous =
        chunk_gated_delta_rule(cuda(in.q), cuda(in.k), cuda(in.v), cuda(in.g), cuda(in.beta),
                               std::nullopt, init, true, cuda(in.cu_t));
    const uint64_t before = chunked_launches();
    auto views = chunk_gated_delta_rule(
        fused.slice(1, 0, 2), fused.slice(1, 2, 4), fused.slice(1, 4, 8), cuda(in.g), cuda(in.beta),
        std::nullopt, init, true, cuda(in.cu_t), false, wide.slice(1, 1, 5));
    EXPECT_EQ(chunked_launches(), before + 1);
    EXPECT_TRUE(all_close(wide.slice(1, 1, 5).to(Device::cpu()),
                          contiguous.output.to(Device::cpu()), {0.0, 0.0}));
    EXPECT_TRUE(all_close(views.final_state.to(Device::cpu()),
                          contiguous.final_state.to(Device::cpu()), {0.0, 0.0}));
    for (double x : wide.slice(1, 0, 1).to(Device::cpu()).to_double_vector()) ASSERT_EQ(x, 0.0);
  }
  // A pool read and written in place at state_indices: bit for bit the packed call on the GPU.
  const PrefillIn in = prefill_inputs({0, 9, 150}, 2, 2, 2, 128, 310);
  Tensor packed_init = rand_tensor({2, 2, 128, 128}, kF32, 311, -0.1, 0.1);
  auto packed =
      chunk_gated_delta_rule(cuda(in.q), cuda(in.k), cuda(in.v), cuda(in.g), cuda(in.beta),
                             std::nullopt, cuda(packed_init), true, cuda(in.cu_t));
  Tensor pool = rand_tensor({4, 2, 128, 128}, kF32, 312, -0.1, 0.1);
  pool.select(0, 3).copy_(packed_init.select(0, 0));
  pool.select(0, 1).copy_(packed_init.select(0, 1));
  Tensor dpool = cuda(pool);
  const Tensor idx = cuda(Tensor::from_vector({3, 1}, {2}, DType::kInt32));
  auto pooled =
      chunk_gated_delta_rule(cuda(in.q), cuda(in.k), cuda(in.v), cuda(in.g), cuda(in.beta),
                             std::nullopt, dpool, true, cuda(in.cu_t), false, std::nullopt, dpool,
                             std::nullopt, std::nullopt, 0, Value(std::string("auto")), idx);
  EXPECT_TRUE(
      all_close(pooled.output.to(Device::cpu()), packed.output.to(Device::cpu()), {0.0, 0.0}));
  const Tensor after = dpool.to(Device::cpu()), fin = packed.final_state.to(Device::cpu());
  EXPECT_TRUE(all_close(after.select(0, 3), fin.select(0, 0), {0.0, 0.0}));
  EXPECT_TRUE(all_close(after.select(0, 1), fin.select(0, 1), {0.0, 0.0}));
  for (int64_t sl : {0, 2}) {
    EXPECT_TRUE(all_close(after.select(0, sl), pool.select(0, sl), {0.0, 0.0})) << sl;
  }
  // A negative state index: that sequence's rows NaN, the other's not.
  const uint64_t before = chunked_launches();
  auto rn = chunk_gated_delta_rule(
      cuda(in.q), cuda(in.k), cuda(in.v), cuda(in.g), cuda(in.beta), std::nullopt, dpool, false,
      cuda(in.cu_t), false, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0,
      Value(std::string("auto")), cuda(Tensor::from_vector({1, -1}, {2}, DType::kInt32)));
  EXPECT_EQ(chunked_launches(), before + 1);
  for (double x : rn.output.slice(0, 9, 150).to(Device::cpu()).to_double_vector()) {
    ASSERT_TRUE(std::isnan(x));
  }
  for (double x : rn.output.slice(0, 0, 9).to(Device::cpu()).to_double_vector()) {
    ASSERT_FALSE(std::isnan(x));
  }
  {
    const ScopedEnv recurrent("FLASHINFER_GDN_CHUNKED", "0");
    chunk_gated_delta_rule(cuda(in.q), cuda(in.k), cuda(in.v), cuda(in.g), cuda(in.beta),
                           std::nullopt, std::nullopt, false, cuda(in.cu_t));
    EXPECT_EQ(chunked_launches(), before + 1);
  }
  {
    // No initial state and an index past the output pool (the CPU refuses it): that sequence's
    // rows NaN and no slot written, as on the recurrent kernel (SmallHeadDimsPoolRulesAndGuards).
    const Tensor pool_before = dpool.to(Device::cpu());
    const uint64_t launches = chunked_launches();
    auto ro = chunk_gated_delta_rule(
        cuda(in.q), cuda(in.k), cuda(in.v), cuda(in.g), cuda(in.beta), std::nullopt, std::nullopt,
        true, cuda(in.cu_t), false, std::nullopt, dpool, std::nullopt, std::nullopt, 0,
        Value(std::string("auto")), cuda(Tensor::from_vector({1, 7}, {2}, DType::kInt32)));
    EXPECT_EQ(chunked_launches(), launches + 1);
    for (double x : ro.output.slice(0, 9, 150).to(Device::cpu()).to_double_vector()) {
      ASSERT_TRUE(std::isnan(x));
    }
    for (double x : ro.output.slice(0, 0, 9).to(Device::cpu()).to_double_vector()) {
      ASSERT_FALSE(std::isnan(x));
    }
    const Tensor pool_after = dpool.to(Device::cpu());
    for (int64_t sl : {0, 2, 3}) {
      EXPECT_TRUE(all_close(pool_after.select(0, sl), pool_before.select(0, sl), {0.0, 0.0})) << sl;
    }
  }
}

}  // namespace
}  // namespace flashinfer::testing
