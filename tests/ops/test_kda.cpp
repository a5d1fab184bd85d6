// flashinfer.kda.recurrent_kda (Kimi delta attention): an fp64 recurrence with the three gate
// forms, logit betas, GQA and the L2 toggle; the slot rules of each layout (dense with python's
// negative wrap, packed with padding, speculative with per-token states, accepted-token columns,
// inactive tokens, a read-only source pool, prefill with checkpoints); the batched speculative
// form equal to the packed one bit for bit; bad inputs; the declaration; record / replay; CUDA
// against the CPU when a GPU is visible.
#include <gtest/gtest.h>

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

constexpr DType kBf = DType::kBFloat16;
constexpr DType kF32 = DType::kFloat32;
constexpr DType kI32 = DType::kInt32;
constexpr const char* kOp = "recurrent_kda";

Tensor ints(std::vector<double> v, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  return Tensor::from_vector(v, shape, kI32);
}

// Inputs of `rows` x `T` tokens ([rows, T, heads, K]).
struct In {
  int64_t rows = 1, T = 1, H = 2, HV = 4, K = 64;
  Tensor q, k, v, g, beta, A_log, dt_bias;
};
In make(int64_t rows, int64_t T, int64_t H, int64_t HV, int64_t K, uint64_t seed) {
  In in;
  in.rows = rows, in.T = T, in.H = H, in.HV = HV, in.K = K;
  in.q = rand_tensor({rows, T, H, K}, kBf, seed, -1.0, 1.0);
  in.k = rand_tensor({rows, T, H, K}, kBf, seed + 1, -1.0, 1.0);
  in.v = rand_tensor({rows, T, HV, K}, kBf, seed + 2, -1.0, 1.0);
  in.g = rand_tensor({rows, T, HV, K}, kBf, seed + 3, -1.0, 0.5);
  in.beta = rand_tensor({rows, T, HV}, kBf, seed + 4, -1.0, 1.0);
  in.A_log = rand_tensor({H}, kF32, seed + 5, -1.0, 0.5);
  in.dt_bias = rand_tensor({H * K}, kF32, seed + 6, -0.5, 0.5);
  return in;
}

enum class Gate { kPre, kSoftplus, kLower };

struct RefOpts {
  Gate gate = Gate::kPre;
  double lower = -5.0;
  bool logit = false, l2 = true;
};

// One token of sequence row r, step t, value head hv on S [K][V] (fp64); returns o (V).
// u_out: the token's u = beta (v - S^T k^) per v (the frozen verify's correction).
std::vector<double> ref_step(const In& in, const RefOpts& o, int64_t r, int64_t t, int64_t hv,
                             std::vector<double>& S, std::vector<double>* u_out = nullptr) {
  const int64_t K = in.K, h = hv / (in.HV / in.H);
  auto at = [&](const Tensor& x, int64_t heads, int64_t hh, int64_t i) {
    return x.to_double_vector()[((r * in.T + t) * heads + hh) * K + i];
  };
  const auto qv = in.q.to_double_vector(), kv = in.k.to_double_vector(),
             vv = in.v.to_double_vector(), gv = in.g.to_double_vector(),
             bv = in.beta.to_double_vector(), al = in.A_log.to_double_vector(),
             db = in.dt_bias.to_double_vector();
  (void)at;
  std::vector<double> q(K), k(K), d(K);
  double sq = 0, sk = 0;
  for (int64_t i = 0; i < K; ++i) {
    q[i] = qv[((r * in.T + t) * in.H + h) * K + i];
    k[i] = kv[((r * in.T + t) * in.H + h) * K + i];
    sq += q[i] * q[i];
    sk += k[i] * k[i];
    const double gg = gv[((r * in.T + t) * in.HV + hv) * K + i];
    const double x = gg + db[h * K + i];
    double a = gg;
    if (o.gate == Gate::kSoftplus) a = -std::exp(al[h]) * (x > 20 ? x : std::log1p(std::exp(x)));
    if (o.gate == Gate::kLower) a = o.lower / (1.0 + std::exp(-std::exp(al[h]) * x));
    d[i] = std::exp(a);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(K));
  for (int64_t i = 0; i < K; ++i) {
    q[i] *= scale * (o.l2 ? 1.0 / std::sqrt(sq + 1e-6) : 1.0);
    k[i] *= o.l2 ? 1.0 / std::sqrt(sk + 1e-6) : 1.0;
  }
  double beta = bv[(r * in.T + t) * in.HV + hv];
  if (o.logit) beta = 1.0 / (1.0 + std::exp(-beta));
  std::vector<double> out(K);
  for (int64_t vi = 0; vi < K; ++vi) {
    double pred = 0;
    for (int64_t i = 0; i < K; ++i) {
      S[i * K + vi] *= d[i];
      pred += S[i * K + vi] * k[i];
    }
    const double u = beta * (vv[((r * in.T + t) * in.HV + hv) * K + vi] - pred);
    if (u_out) u_out->push_back(u);
    double acc = 0;
    for (int64_t i = 0; i < K; ++i) {
      S[i * K + vi] += k[i] * u;
      acc += S[i * K + vi] * q[i];
    }
    out[vi] = acc;
  }
  return out;
}

// S [K][V] of slot `slot`, head hv from a [slots, HV, V, K] pool.
std::vector<double> slot_state(const Tensor& pool, int64_t slot, int64_t hv) {
  const auto p = pool.select(0, slot).select(0, hv).contiguous().to_double_vector();  // [V][K]
  const int64_t K = pool.size(3);
  std::vector<double> S(K * K);
  for (int64_t v = 0; v < K; ++v) {
    for (int64_t k = 0; k < K; ++k) S[k * K + v] = p[v * K + k];
  }
  return S;
}
std::vector<double> transposed(const std::vector<double>& S, int64_t K) {  // [K][V] -> [V][K]
  std::vector<double> r(S.size());
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t v = 0; v < K; ++v) r[v * K + k] = S[k * K + v];
  }
  return r;
}

TEST(KdaDecode, DenseMatchesFp64WithEveryGateFormAndPythonWrap) {
  for (const Gate gate : {Gate::kPre, Gate::kSoftplus, Gate::kLower}) {
    for (bool l2 : {true, false}) {
      const In in = make(3, 1, 2, 4, 64, 10 + static_cast<int>(gate) * 2 + l2);
      Tensor pool = rand_tensor({5, 4, 64, 64}, kBf, 20, -0.2, 0.2);
      const Tensor pool0 = pool.clone();
      RefOpts o;
      o.gate = gate, o.l2 = l2, o.logit = true;
      // Rows read and write slots 3, 0 and -1 (python: the last slot, 4).
      auto [out, fs, cp] = recurrent_kda(
          in.q, in.k, in.v, in.g, in.beta, in.A_log, in.dt_bias, std::nullopt, pool, true, l2,
          gate != Gate::kPre, gate == Gate::kLower ? std::optional<double>(-5.0) : std::nullopt,
          std::nullopt, ints({3, 0, -1}), std::nullopt, std::nullopt, std::nullopt, std::nullopt,
          std::nullopt, true);
      EXPECT_EQ(out.shape(), (Shape{3, 1, 4, 64}));
      EXPECT_EQ(fs.shape(), (Shape{3, 4, 64, 64}));  // the gathered rows, as upstream returns
      const auto ov = out.to_double_vector();
      const int64_t slot_of_row[3] = {3, 0, 4};
      for (int64_t r = 0; r < 3; ++r) {
        for (int64_t hv = 0; hv < 4; ++hv) {
          std::vector<double> S = slot_state(pool0, slot_of_row[r], hv);
          const auto want = ref_step(in, o, r, 0, hv, S);
          std::vector<double> got(ov.begin() + (r * 4 + hv) * 64,
                                  ov.begin() + (r * 4 + hv + 1) * 64);
          EXPECT_TRUE(all_close(got, want, default_tolerance(kBf))) << r << " " << hv;
          EXPECT_TRUE(all_close(transposed(slot_state(pool, slot_of_row[r], hv), 64),
                                transposed(S, 64), default_tolerance(kBf)));
          EXPECT_EQ(fs.select(0, r).select(0, hv).contiguous().to_double_vector(),
                    pool.select(0, slot_of_row[r]).select(0, hv).contiguous().to_double_vector());
        }
      }
      EXPECT_EQ(pool.select(0, 1).contiguous().to_double_vector(),
                pool0.select(0, 1).contiguous().to_double_vector());
    }
  }
}

TEST(KdaDecode, PackedPaddingLeavesSlotZeroAndWritesZeros) {
  const In in = make(1, 3, 1, 2, 64, 30);  // three one-token sequences
  Tensor pool = rand_tensor({3, 2, 64, 64}, kBf, 31, -0.2, 0.2);
  const Tensor pool0 = pool.clone();
  Tensor out = Tensor::full({1, 3, 2, 64}, 9.0, kBf);
  auto [o, fs, cp] = recurrent_kda(
      in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt, std::nullopt, pool, true, true,
      false, std::nullopt, ints({0, 1, 2, 3}), ints({2, -1, 0}), std::nullopt, std::nullopt, out);
  EXPECT_EQ(o.data_ptr(), out.data_ptr());  // the caller's buffer (its shape and dtype fit)
  EXPECT_EQ(fs.data_ptr(), pool.data_ptr());
  const auto ov = out.to_double_vector();
  for (int64_t i = 128; i < 256; ++i) EXPECT_EQ(ov[i], 0.0) << i;  // the padded sequence
  EXPECT_EQ(pool.select(0, 1).contiguous().to_double_vector(),
            pool0.select(0, 1).contiguous().to_double_vector());
  EXPECT_NE(pool.select(0, 0).contiguous().to_double_vector(),
            pool0.select(0, 0).contiguous().to_double_vector());  // slot 0 is a real slot
}

TEST(KdaSpec, PerTokenStatesAcceptedColumnAndInactiveTokens) {
  // Two sequences of 3 tokens (S = 2): sequence 0 starts from column 1 (two accepted) and
  // writes slots 4, 5, 6; sequence 1 has an inactive middle token (slot -1).
  const In in = make(1, 6, 2, 2, 64, 40);
  Tensor pool = rand_tensor({8, 2, 64, 64}, kBf, 41, -0.2, 0.2);
  const Tensor pool0 = pool.clone();
  Tensor idx = ints({3, 2, 1, 7, -1, 0}, {2, 3});
  // Sequence 0 reads column 1 (slot 2) and writes its tokens' states to slots 3, 2, 1.
  auto [out, fs, cp] =
      recurrent_kda(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt, std::nullopt, pool,
                    false, true, false, std::nullopt, ints({0, 3, 6}), idx, 2, ints({2, 1}));
  RefOpts o;
  const auto ov = out.to_double_vector();
  for (int64_t hv = 0; hv < 2; ++hv) {
    // Sequence 0 reads slot 2 (column 1); writes 3, 2, 1 after each token.
    std::vector<double> S = slot_state(pool0, 2, hv);
    const int64_t w0[3] = {3, 2, 1};
    for (int64_t t = 0; t < 3; ++t) {
      const auto want = ref_step(in, o, 0, t, hv, S);
      std::vector<double> got(ov.begin() + (t * 2 + hv) * 64, ov.begin() + (t * 2 + hv + 1) * 64);
      EXPECT_TRUE(all_close(got, want, {2e-2, 2e-2})) << t;
      EXPECT_TRUE(
          all_close(transposed(slot_state(pool, w0[t], hv), 64), transposed(S, 64), {2e-2, 2e-2}))
          << t;
    }
    // Sequence 1 reads slot 7 (column 0); token 4 is inactive: zero output, S unchanged.
    std::vector<double> S1 = slot_state(pool0, 7, hv);
    for (int64_t t = 3; t < 6; ++t) {
      std::vector<double> got(ov.begin() + (t * 2 + hv) * 64, ov.begin() + (t * 2 + hv + 1) * 64);
      if (t == 4) {
        EXPECT_EQ(got, std::vector<double>(64, 0.0));
        continue;
      }
      const auto want = ref_step(in, o, 0, t, hv, S1);
      EXPECT_TRUE(all_close(got, want, {2e-2, 2e-2})) << t;
    }
    EXPECT_TRUE(
        all_close(transposed(slot_state(pool, 0, hv), 64), transposed(S1, 64), {2e-2, 2e-2}));
  }
  // The batched form ([B, 1 + S] rows) is the packed call, bit for bit.
  Tensor pool_a = pool0.clone(), pool_b = pool0.clone();
  const In b = make(2, 3, 2, 2, 64, 42);
  auto flat = [](const Tensor& t) { return t.reshape({1, 6, t.size(2), t.size(3)}); };
  auto [oa, fa, ca] =
      recurrent_kda(b.q, b.k, b.v, b.g, b.beta, std::nullopt, std::nullopt, std::nullopt, pool_a,
                    false, true, false, std::nullopt, std::nullopt, std::nullopt, 2);
  auto [ob, fb, cb] =
      recurrent_kda(flat(b.q), flat(b.k), flat(b.v), flat(b.g), b.beta.reshape({1, 6, 2}),
                    std::nullopt, std::nullopt, std::nullopt, pool_b, false, true, false,
                    std::nullopt, ints({0, 3, 6}), ints({0, 1, 2, 3, 4, 5}, {2, 3}), 2);
  EXPECT_EQ(oa.shape(), (Shape{2, 3, 2, 64}));
  EXPECT_EQ(oa.to_double_vector(), ob.to_double_vector());
  EXPECT_EQ(pool_a.to_double_vector(), pool_b.to_double_vector());
}

TEST(KdaPrefill, EveryTokenInPlaceWithCheckpointsAndASourcePool) {
  // Packed prefill: sequences of 40 and 17 tokens, checkpoints every 16 tokens.
  const In in = make(1, 57, 1, 2, 64, 50);
  Tensor pool = rand_tensor({2, 2, 64, 64}, kBf, 51, -0.2, 0.2);
  const Tensor pool0 = pool.clone();
  Tensor cps = Tensor::zeros({5, 2, 64, 64}, kBf);
  Tensor starts = Tensor::from_vector({0, 3, 5}, {3}, DType::kInt64);
  RefOpts o;
  o.gate = Gate::kLower, o.logit = true;
  auto [out, fs, cp] = recurrent_kda(
      in.q, in.k, in.v, in.g, in.beta, in.A_log, in.dt_bias, std::nullopt, pool, false, true, true,
      -5.0, ints({0, 40, 57}), ints({1, 0}), std::nullopt, std::nullopt, std::nullopt, std::nullopt,
      std::nullopt, true, std::nullopt, std::nullopt, cps, starts, 16);
  EXPECT_FALSE(fs.defined());
  EXPECT_EQ(cp.data_ptr(), cps.data_ptr());
  const auto ov = out.to_double_vector();
  for (int64_t hv = 0; hv < 2; ++hv) {
    for (const auto& [seq, begin, len, slot] :
         {std::tuple<int, int64_t, int64_t, int64_t>{0, 0, 40, 1}, {1, 40, 17, 0}}) {
      std::vector<double> S = slot_state(pool0, slot, hv);
      for (int64_t t = 0; t < len; ++t) {
        if (t % 16 == 0) {
          const int64_t row = (seq == 0 ? 0 : 3) + t / 16;
          EXPECT_TRUE(
              all_close(transposed(slot_state(cps, row, hv), 64), transposed(S, 64), {3e-2, 3e-2}))
              << seq << " " << t;
          if (t == 0) {
            EXPECT_EQ(cps.select(0, row).select(0, hv).contiguous().to_double_vector(),
                      pool0.select(0, slot).select(0, hv).contiguous().to_double_vector());
          }
        }
        const auto want = ref_step(in, o, 0, begin + t, hv, S);
        std::vector<double> got(ov.begin() + ((begin + t) * 2 + hv) * 64,
                                ov.begin() + ((begin + t) * 2 + hv + 1) * 64);
        ASSERT_TRUE(all_close(got, want, {3e-2, 3e-2})) << seq << " " << t;
      }
      EXPECT_TRUE(
          all_close(transposed(slot_state(pool, slot, hv), 64), transposed(S, 64), {3e-2, 3e-2}));
    }
  }
  // A source pool supplies the first read; the pool is written.
  const In d = make(1, 2, 1, 2, 64, 52);
  Tensor src = rand_tensor({3, 2, 64, 64}, kBf, 53, -0.2, 0.2);
  Tensor dst = Tensor::zeros({2, 2, 64, 64}, kBf);
  const Tensor src0 = src.clone();
  (void)recurrent_kda(d.q, d.k, d.v, d.g, d.beta, std::nullopt, std::nullopt, std::nullopt, dst,
                      false, true, false, std::nullopt, ints({0, 1, 2}), ints({1, 0}), std::nullopt,
                      std::nullopt, std::nullopt, src, ints({2, 0}));
  EXPECT_EQ(src.to_double_vector(), src0.to_double_vector());
  for (int64_t hv = 0; hv < 2; ++hv) {
    std::vector<double> S = slot_state(src0, 2, hv);
    (void)ref_step(d, RefOpts{}, 0, 0, hv, S);
    EXPECT_TRUE(all_close(transposed(slot_state(dst, 1, hv), 64), transposed(S, 64),
                          default_tolerance(kBf)));
  }
}

// ---- upstream 0.7.4: the frozen verify (disable_state_update) and indexed checkpoints ----------

// The keyword tail of a call: checkpoint_state_indices, disable_state_update, the caches.
struct Frozen {
  std::optional<Tensor> cp_idx = std::nullopt, corr = std::nullopt, kg = std::nullopt;
  bool disable = true;
};
KdaOutput frozen_call(const In& in, std::optional<Tensor> pool, std::optional<Tensor> cu,
                      std::optional<Tensor> slots, std::optional<int64_t> spec, const Frozen& f,
                      std::optional<Tensor> output = std::nullopt, std::string backend = "auto",
                      std::optional<Tensor> source = std::nullopt) {
  return recurrent_kda(in.q, in.k, in.v, in.g, in.beta, in.A_log, in.dt_bias, std::nullopt, pool,
                       false, true, true, -5.0, cu, slots, spec, std::nullopt, output, source,
                       std::nullopt, true, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                       0, f.cp_idx, f.disable, f.corr, f.kg, backend);
}

TEST(KdaFrozen, BatchedVerifyIsTheUpdatingCallWithNothingStored) {
  // GQA (1 query head, 2 value heads), 3 tokens a row, rows reading slots 2 and 0; the call that
  // updates the state computes the same outputs, bit for bit, and the frozen one stores nothing.
  const In in = make(2, 3, 1, 2, 128, 200);
  const Tensor pool = rand_tensor({3, 2, 128, 128}, kBf, 201, -0.2, 0.2);
  const Tensor pool0 = pool.clone();
  auto [out, fs, cp] = frozen_call(in, pool, std::nullopt, ints({2, 0}), std::nullopt, {});
  EXPECT_FALSE(fs.defined());
  EXPECT_FALSE(cp.defined());
  EXPECT_EQ(pool.to_double_vector(), pool0.to_double_vector());
  Tensor updated = pool0.clone();
  auto [want, fs2, cp2] =
      frozen_call(in, updated, std::nullopt, ints({2, 0}), std::nullopt, Frozen{.disable = false});
  EXPECT_EQ(out.to_double_vector(), want.to_double_vector());
  EXPECT_NE(updated.to_double_vector(), pool0.to_double_vector());
  // Against the fp64 recurrence, row 1 (slot 0), value head 1.
  RefOpts o;
  o.gate = Gate::kLower, o.logit = true;
  std::vector<double> S = slot_state(pool0, 0, 1);
  const auto ov = out.to_double_vector();
  for (int64_t t = 0; t < 3; ++t) {
    const auto w = ref_step(in, o, 1, t, 1, S);
    std::vector<double> got(ov.begin() + ((3 + t) * 2 + 1) * 128,
                            ov.begin() + ((3 + t) * 2 + 2) * 128);
    EXPECT_TRUE(all_close(got, w, {2e-2, 2e-2})) << t;
  }
  // initial_state_source is the pool read in place of initial_state; a negative slot is a
  // sequence of zeros.
  const Tensor src = rand_tensor({3, 2, 128, 128}, kBf, 202, -0.2, 0.2);
  auto [os, fss, cps] =
      frozen_call(in, pool, std::nullopt, ints({-1, 1}), std::nullopt, {}, {}, "auto", src);
  auto [ou, fsu, cpu2] =
      frozen_call(in, src.clone(), std::nullopt, ints({0, 1}), std::nullopt, Frozen{});
  const auto sv = os.to_double_vector(), uv = ou.to_double_vector();
  for (int64_t i = 0; i < 3 * 2 * 128; ++i) ASSERT_EQ(sv[i], 0.0) << i;
  EXPECT_EQ(std::vector<double>(sv.begin() + 768, sv.end()),
            std::vector<double>(uv.begin() + 768, uv.end()));
  EXPECT_EQ(pool.to_double_vector(), pool0.to_double_vector());
}

TEST(KdaFrozen, EveryGateFormAndBetaIsTheUpdatingCallsOutputs) {
  // The precomputed gate (a lower_bound given beside it is ignored, as upstream passes it only
  // with the gate in the kernel), softplus and the lower bound; betas as given or as logits.
  const In in = make(2, 2, 2, 2, 128, 205);
  const Tensor pool = rand_tensor({3, 2, 128, 128}, kBf, 206, -0.2, 0.2);
  for (const Gate gate : {Gate::kPre, Gate::kSoftplus, Gate::kLower}) {
    for (const bool logit : {false, true}) {
      const auto call = [&](const Tensor& state, bool frozen, std::optional<double> lb,
                            std::optional<Tensor> ssm, std::optional<Tensor> src_idx) {
        return recurrent_kda(in.q, in.k, in.v, in.g, in.beta, in.A_log, in.dt_bias, std::nullopt,
                             state, false, true, gate != Gate::kPre, lb, std::nullopt, ssm,
                             std::nullopt, std::nullopt, std::nullopt, std::nullopt, src_idx, logit,
                             std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0,
                             std::nullopt, frozen)
            .output;
      };
      const std::optional<double> lb =
          gate == Gate::kLower ? std::optional<double>(-5.0) : std::nullopt;
      const Tensor got = call(pool, true, gate == Gate::kPre ? -3.0 : lb, ints({2, 0}), {});
      const Tensor want = call(pool.clone(), false, lb, ints({2, 0}), {});
      EXPECT_EQ(got.to_double_vector(), want.to_double_vector())
          << static_cast<int>(gate) << " " << logit;
      // initial_state_indices is the slot read, before ssm_state_indices.
      const Tensor by_src = call(pool, true, lb, ints({0, 0}), ints({2, 0}));
      EXPECT_EQ(by_src.to_double_vector(), got.to_double_vector());
    }
  }
}

TEST(KdaFrozen, CachesHoldTheRawKeyGateAndTheCorrection) {
  // Packed windows of 3 (num_spec_tokens 2): sequences of 3, 1 and 2 tokens at slots 4, -1 (a
  // padding slot, which must not become slot 0) and 2 of a 5-slot pool; equal heads (2) of 128.
  const In in = make(1, 6, 2, 2, 128, 210);
  const Tensor pool = rand_tensor({5, 2, 128, 128}, kBf, 211, -0.2, 0.2);
  const Tensor pool0 = pool.clone();
  Tensor corr = Tensor::full({5, 2, 3, 128}, 7.0, kF32);
  Tensor kg = Tensor::full({5, 2, 3, 256}, 7.0, kBf);
  Tensor out = Tensor::full({1, 6, 2, 128}, 9.0, kBf);
  auto [o, fs, cp] = frozen_call(in, pool, ints({0, 3, 4, 6}), ints({4, -1, 2}), 2,
                                 Frozen{.corr = corr, .kg = kg}, out);
  EXPECT_EQ(o.data_ptr(), out.data_ptr());
  EXPECT_FALSE(fs.defined());
  EXPECT_EQ(pool.to_double_vector(), pool0.to_double_vector());
  RefOpts ro;
  ro.gate = Gate::kLower, ro.logit = true;
  const auto ov = out.to_double_vector(), cv = corr.to_double_vector();
  const auto kbits = in.k.to_double_vector(), gbits = in.g.to_double_vector();
  const auto kgv = kg.to_double_vector();
  for (int64_t hv = 0; hv < 2; ++hv) {
    for (const auto& [begin, len, slot] :
         {std::tuple<int64_t, int64_t, int64_t>{0, 3, 4}, {3, 1, -1}, {4, 2, 2}}) {
      std::vector<double> S = slot >= 0 ? slot_state(pool0, slot, hv) : std::vector<double>();
      for (int64_t t = 0; t < len; ++t) {
        const int64_t tok = begin + t;
        std::vector<double> got(ov.begin() + (tok * 2 + hv) * 128,
                                ov.begin() + (tok * 2 + hv + 1) * 128);
        if (slot < 0) {  // padding: zero outputs
          EXPECT_EQ(got, std::vector<double>(128, 0.0));
          continue;
        }
        std::vector<double> u;
        const auto w = ref_step(in, ro, 0, tok, hv, S, &u);
        EXPECT_TRUE(all_close(got, w, {2e-2, 2e-2})) << tok;
        const int64_t row = (slot * 2 + hv) * 3 + t;
        EXPECT_TRUE(
            all_close(std::vector<double>(cv.begin() + row * 128, cv.begin() + (row + 1) * 128), u,
                      {2e-3, 2e-3}))
            << tok;
        for (int64_t i = 0; i < 128; ++i) {  // the raw key | raw gate, bit for bit
          ASSERT_EQ(kgv[row * 256 + i], kbits[(tok * 2 + hv) * 128 + i]) << tok;
          ASSERT_EQ(kgv[row * 256 + 128 + i], gbits[(tok * 2 + hv) * 128 + i]) << tok;
        }
      }
    }
    // Rows past a sequence's length and slots no sequence reads stay as they were.
    for (const auto& [slot, t] :
         {std::pair<int64_t, int64_t>{0, 0}, {0, 1}, {0, 2}, {1, 0}, {2, 2}, {3, 2}}) {
      const int64_t row = (slot * 2 + hv) * 3 + t;
      EXPECT_EQ(cv[row * 128], 7.0) << slot << " " << t;
      EXPECT_EQ(kgv[row * 256 + 255], 7.0) << slot << " " << t;
    }
  }
  // The batched form with caches ([B, T] rows, the window T) is the packed call bit for bit.
  const In b = make(2, 3, 2, 2, 128, 212);
  auto flat = [](const Tensor& t) { return t.reshape({1, 6, t.size(2), t.size(3)}); };
  In bp = b;
  bp.q = flat(b.q), bp.k = flat(b.k), bp.v = flat(b.v), bp.g = flat(b.g);
  bp.beta = b.beta.reshape({1, 6, 2});
  Tensor c1 = Tensor::zeros({5, 2, 3, 128}, kF32), k1 = Tensor::zeros({5, 2, 3, 256}, kBf);
  Tensor c2 = c1.clone(), k2 = k1.clone();
  auto [ob, fb, cb] =
      frozen_call(b, pool, std::nullopt, ints({3, 1}), std::nullopt, Frozen{.corr = c1, .kg = k1});
  auto [op, fp, cpp] = frozen_call(bp, pool, ints({0, 3, 6}), ints({3, 1}), std::nullopt,
                                   Frozen{.corr = c2, .kg = k2});
  EXPECT_EQ(ob.shape(), (Shape{2, 3, 2, 128}));
  EXPECT_EQ(ob.to_double_vector(), op.to_double_vector());
  EXPECT_EQ(c1.to_double_vector(), c2.to_double_vector());
  EXPECT_EQ(k1.to_double_vector(), k2.to_double_vector());
}

TEST(KdaFrozen, CommittingTheCachedCorrectionsGivesTheUpdatedState) {
  // The verify caches' contract: S <- S * exp(a(raw gate)) + correction k^(raw key)^T, token by
  // token from the committed state, is the state the updating call stores.
  const In in = make(1, 2, 2, 2, 128, 220);
  const Tensor pool = rand_tensor({2, 2, 128, 128}, kBf, 221, -0.2, 0.2);
  Tensor corr = Tensor::zeros({2, 2, 2, 128}, kF32), kg = Tensor::zeros({2, 2, 2, 256}, kBf);
  (void)frozen_call(in, pool, ints({0, 2}), ints({1}), 1, Frozen{.corr = corr, .kg = kg});
  Tensor updated = pool.clone();
  (void)frozen_call(in, updated, ints({0, 2}), ints({1}), std::nullopt, Frozen{.disable = false});
  const auto cv = corr.to_double_vector(), kgv = kg.to_double_vector();
  const auto al = in.A_log.to_double_vector(), db = in.dt_bias.to_double_vector();
  for (int64_t hv = 0; hv < 2; ++hv) {
    std::vector<double> S = slot_state(pool, 1, hv);  // [K][V]
    for (int64_t t = 0; t < 2; ++t) {
      const int64_t row = (1 * 2 + hv) * 2 + t;
      double sk = 0;
      for (int64_t i = 0; i < 128; ++i) sk += kgv[row * 256 + i] * kgv[row * 256 + i];
      for (int64_t i = 0; i < 128; ++i) {
        const double x = kgv[row * 256 + 128 + i] + db[hv * 128 + i];
        const double a = std::exp(-5.0 / (1.0 + std::exp(-std::exp(al[hv]) * x)));
        const double kh = kgv[row * 256 + i] / std::sqrt(sk + 1e-6);
        for (int64_t v = 0; v < 128; ++v) {
          S[i * 128 + v] = S[i * 128 + v] * a + cv[row * 128 + v] * kh;
        }
      }
    }
    EXPECT_TRUE(
        all_close(transposed(slot_state(updated, 1, hv), 128), transposed(S, 128), {1e-2, 1e-2}))
        << hv;
  }
}

TEST(KdaPrefill, IndexedCheckpointsTakeEachCompletedBoundary) {
  // Packed prefill of 64 and 40 tokens, every 32: sequence 0 completes boundaries 32 and 64
  // (entries 0, 1 of the table; 64 is its end: the final state), sequence 1 boundary 32 (entry
  // 2). Table {3, 1, 0}. Each indexed row is the state the unindexed call stores before that
  // token, or the final state; then rows outside the pool (-1, 9) are skipped.
  const In in = make(1, 104, 2, 2, 128, 230);
  const Tensor pool0 = rand_tensor({2, 2, 128, 128}, kBf, 231, -0.2, 0.2);
  Tensor pool_a = pool0.clone(), pool_b = pool0.clone();
  Tensor rows = Tensor::full({4, 2, 128, 128}, 3.0, kBf);
  auto [oa, fa, ca] = recurrent_kda(
      in.q, in.k, in.v, in.g, in.beta, in.A_log, in.dt_bias, std::nullopt, pool_a, false, true,
      true, -5.0, ints({0, 64, 104}), ints({1, 0}), std::nullopt, std::nullopt, std::nullopt,
      std::nullopt, std::nullopt, true, std::nullopt, std::nullopt, rows,
      Tensor::from_vector({0, 2, 3}, {3}, DType::kInt64), 32, ints({3, 1, 0}));
  EXPECT_EQ(ca.data_ptr(), rows.data_ptr());
  Tensor plain = Tensor::zeros({4, 2, 128, 128}, kBf);
  auto [ob, fb, cb] =
      recurrent_kda(in.q, in.k, in.v, in.g, in.beta, in.A_log, in.dt_bias, std::nullopt, pool_b,
                    false, true, true, -5.0, ints({0, 64, 104}), ints({1, 0}), std::nullopt,
                    std::nullopt, std::nullopt, std::nullopt, std::nullopt, true, std::nullopt,
                    std::nullopt, plain, Tensor::from_vector({0, 2, 4}, {3}, DType::kInt64), 32);
  EXPECT_EQ(oa.to_double_vector(), ob.to_double_vector());
  EXPECT_EQ(pool_a.to_double_vector(), pool_b.to_double_vector());
  auto row = [](const Tensor& t, int64_t r) {
    return t.select(0, r).contiguous().to_double_vector();
  };
  EXPECT_EQ(row(rows, 3), row(plain, 1));   // sequence 0 after 32 tokens
  EXPECT_EQ(row(rows, 1), row(pool_a, 1));  // sequence 0 after 64: its final state (slot 1)
  EXPECT_EQ(row(rows, 0), row(plain, 3));   // sequence 1 after 32 tokens
  EXPECT_EQ(row(rows, 2), std::vector<double>(2 * 128 * 128, 3.0));
  Tensor skip = Tensor::full({4, 2, 128, 128}, 3.0, kBf);
  (void)recurrent_kda(in.q, in.k, in.v, in.g, in.beta, in.A_log, in.dt_bias, std::nullopt,
                      pool0.clone(), false, true, true, -5.0, ints({0, 64, 104}), ints({1, 0}),
                      std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, true,
                      std::nullopt, std::nullopt, skip,
                      Tensor::from_vector({0, 2, 3}, {3}, DType::kInt64), 32, ints({-1, 9, 0}));
  EXPECT_EQ(row(skip, 0), row(plain, 3));
  for (int64_t r = 1; r < 4; ++r) EXPECT_EQ(row(skip, r), std::vector<double>(2 * 128 * 128, 3.0));
}

TEST(KdaFrozen, RefusalsInUpstreamsOrderWithItsTexts) {
  const In in = make(2, 2, 2, 2, 128, 240);
  const Tensor pool = Tensor::zeros({3, 2, 128, 128}, kBf);
  const Tensor corr = Tensor::zeros({3, 2, 2, 128}, kF32), kg = Tensor::zeros({3, 2, 2, 256}, kBf);
  auto fail = [&](const std::function<void()>& f, const char* arg, const std::string& text) {
    expect_error_text(f, kOp, arg, text);
  };
  fail([&] { frozen_call(in, pool, {}, {}, {}, {}, {}, "triton"); }, "backend",
       "backend must be 'auto', 'cute-dsl', 'cute-dsl-persistent', 'tirx', 'ptx', 'cake', "
       "'small-bh', or 'cudnn', got 'triton'");
  fail(
      [&] {
        frozen_call(in, pool, {}, ints({0, 1}), {}, {}, {}, "ptx");
      },
      "backend", "backend='ptx' does not support ssm_state_indices, disable_state_update");
  fail([&] { frozen_call(in, pool, {}, {}, {}, {}, {}, "cudnn"); }, "backend",
       "recurrent_kda(backend=\"cudnn\") does not support disable_state_update");
  // cuDNN reads a state pool only in an ordinary multi-token prefill: not in a one-token decode.
  const In one = make(2, 1, 2, 2, 128, 246);
  fail(
      [&] {
        recurrent_kda(one.q, one.k, one.v, one.g, one.beta, std::nullopt, std::nullopt,
                      std::nullopt, pool, false, true, false, std::nullopt, std::nullopt,
                      ints({0, 1}), std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                      std::nullopt, false, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                      0, std::nullopt, false, std::nullopt, std::nullopt, "cudnn");
      },
      "ssm_state_indices",
      "recurrent_kda(backend=\"cudnn\") state pools require ordinary multi-token prefill");
  fail([&] { frozen_call(in, pool, {}, {}, {}, Frozen{.corr = corr, .kg = kg, .disable = false}); },
       "correction_cache",
       "correction_cache/kg_cache are speculative-verify caches and require "
       "disable_state_update=True");
  fail([&] { frozen_call(in, pool, {}, {}, {}, Frozen{.cp_idx = ints({0})}, {}, "cake"); },
       "checkpoint_state_indices", "checkpoint_state_indices is supported only by CuTe DSL");
  fail([&] { frozen_call(in, pool, {}, {}, {}, {}, {}, "small-bh"); }, "backend",
       "backend='small-bh' has no frozen-state kernels; disable_state_update=True requires the "
       "CuTe-DSL backends");
  fail([&] { frozen_call(in, pool, {}, {}, {}, Frozen{.cp_idx = ints({0})}); },
       "disable_state_update",
       "prefill-only arguments are incompatible with disable_state_update=True");
  fail([&] { frozen_call(in, pool, {}, {}, {}, {}, {}, "cake"); }, "backend",
       "backend='cake' has no frozen-state kernels");
  fail(
      [&] {
        recurrent_kda(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt, std::nullopt,
                      pool, true, true, false, std::nullopt, std::nullopt, std::nullopt,
                      std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, false,
                      std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0, std::nullopt,
                      true);
      },
      "output_final_state",
      "output_final_state=True is incompatible with disable_state_update=True (no state is "
      "produced)");
  fail(
      [&] {
        recurrent_kda(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt, std::nullopt,
                      pool, false, false, false, std::nullopt, std::nullopt, std::nullopt,
                      std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, false,
                      std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0, std::nullopt,
                      true);
      },
      "use_qk_l2norm_in_kernel", "always applies Q/K L2 normalization");
  fail(
      [&] {
        recurrent_kda(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt, std::nullopt,
                      pool, false, true, false, std::nullopt, std::nullopt, std::nullopt,
                      std::nullopt, ints({1, 1}), std::nullopt, std::nullopt, std::nullopt, false,
                      std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0, std::nullopt,
                      true);
      },
      "num_accepted_tokens",
      "num_accepted_tokens applies to the state-updating fused spec path, not the frozen-verify "
      "mode");
  fail([&] { frozen_call(in, std::nullopt, {}, {}, {}, {}); }, "initial_state",
       "requires a committed state pool via initial_state_source (preferred) or initial_state");
  fail([&] { frozen_call(in, pool, {}, {}, {}, Frozen{.corr = corr}); }, "kg_cache",
       "correction_cache and kg_cache must be provided together");
  const In t17 = make(1, 17, 2, 2, 128, 241);
  fail([&] { frozen_call(t17, pool, {}, {}, {}, {}); }, "q", "T must be in [1, 16]; got 17");
  const In k64 = make(2, 2, 2, 2, 64, 242);
  fail(
      [&] {
        frozen_call(k64, Tensor::zeros({3, 2, 64, 64}, kBf), {}, {}, {}, {});
      },
      "q", "this kernel requires K==V==128; got K=64, V=64");
  fail(
      [&] {
        frozen_call(in, pool, {}, ints({0, 1, 2}), {}, {});
      },
      "ssm_state_indices", "initial_state_indices must be [B=2]; got (3,)");
  const In gqa = make(2, 2, 1, 2, 128, 243);
  try {
    frozen_call(gqa, pool, {}, {}, {}, Frozen{.corr = corr, .kg = kg});
    ADD_FAILURE() << "GQA with the caches accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("GQA (HV != H) is not supported by the packed "
                                         "frozen-verify path"),
              std::string::npos);
  }
  const In packed = make(1, 4, 2, 2, 128, 244);
  fail(
      [&] {
        frozen_call(packed, pool, ints({0, 2, 4}), {}, 1, {});
      },
      "cu_seqlens",
      "packed (cu_seqlens) frozen-verify calls currently require correction_cache/kg_cache");
  fail(
      [&] {
        frozen_call(packed, pool, ints({0, 3, 4}), {}, 1, Frozen{.corr = corr, .kg = kg});
      },
      "cu_seqlens", "more than the verify window of 2");
  fail(
      [&] {
        frozen_call(packed, pool, ints({0, 2, 4}), {}, 1,
                    Frozen{.corr = Tensor::zeros({2, 2, 2, 128}, kF32), .kg = kg});
      },
      "correction_cache", "KDA RecoverSSM correction buffer shape is incompatible");
  fail(
      [&] {
        frozen_call(packed, pool, ints({0, 2, 4}), {}, 1,
                    Frozen{.corr = corr, .kg = Tensor::zeros({3, 2, 2, 256}, kF32)});
      },
      "kg_cache", "KDA RecoverSSM activations and kg buffer must be bf16");
  fail(
      [&] {
        frozen_call(packed, pool, ints({0, 2, 4}), ints({0, 3}), 1, Frozen{.corr = corr, .kg = kg});
      },
      "ssm_state_indices", "slot 3 is outside the state pool of 3 slots");
  // Indexed checkpoints: the CuTe-DSL prefill's contract.
  const In pre = make(1, 64, 2, 2, 128, 245);
  const auto indexed = [&](int64_t every, std::optional<Tensor> rows) {
    recurrent_kda(pre.q, pre.k, pre.v, pre.g, pre.beta, pre.A_log, pre.dt_bias, std::nullopt,
                  pool.clone(), false, true, true, -5.0, ints({0, 64}), ints({0}), std::nullopt,
                  std::nullopt, std::nullopt, std::nullopt, std::nullopt, true, std::nullopt,
                  std::nullopt, rows, Tensor::from_vector({0, 2}, {2}, DType::kInt64), every,
                  ints({0, 1}));
  };
  fail([&] { indexed(32, std::nullopt); }, "state_checkpoints",
       "state checkpoints are supported only by eligible frozen SM100/SM103 recurrent_kda "
       "prefill");
  fail(
      [&] {
        indexed(16, Tensor::zeros({2, 2, 128, 128}, kBf));
      },
      "checkpoint_every_n_tokens", "a positive multiple of 32");
}

TEST(KdaBadInput, ErrorsNameOpAndArgument) {
  const In in = make(2, 1, 2, 4, 64, 60);
  Tensor pool = Tensor::zeros({2, 4, 64, 64}, kBf);
  auto call = [&](const Tensor& q, std::optional<Tensor> A_log, bool gate, std::optional<double> lb,
                  std::string backend = "auto") {
    return recurrent_kda(q, in.k, in.v, in.g, in.beta, A_log, std::nullopt, std::nullopt, pool,
                         false, true, gate, lb, std::nullopt, std::nullopt, std::nullopt,
                         std::nullopt, std::nullopt, std::nullopt, std::nullopt, false,
                         std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0, std::nullopt,
                         false, std::nullopt, std::nullopt, backend);
  };
  EXPECT_FI_ERROR(call(in.q.to(DType::kFloat16), std::nullopt, false, std::nullopt), kOp, "q");
  EXPECT_FI_ERROR(call(in.q, std::nullopt, true, std::nullopt), kOp, "A_log");
  EXPECT_FI_ERROR(call(in.q, in.A_log, false, -5.0), kOp, "lower_bound");
  EXPECT_FI_ERROR(call(in.q, in.A_log, true, 1.0), kOp, "lower_bound");
  EXPECT_FI_ERROR(call(in.q, std::nullopt, false, std::nullopt, "triton"), kOp, "backend");
  const In k96 = make(2, 1, 2, 4, 96, 61);
  EXPECT_FI_ERROR(recurrent_kda(k96.q, k96.k, k96.v, k96.g, k96.beta), kOp, "q");
  const In h3 = make(2, 1, 3, 4, 64, 62);
  EXPECT_FI_ERROR(recurrent_kda(h3.q, h3.k, h3.v, h3.g, h3.beta), kOp, "v");
  EXPECT_FI_ERROR(
      recurrent_kda(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt, std::nullopt, pool,
                    false, true, false, std::nullopt, std::nullopt, ints({0, 2})),
      kOp, "ssm_state_indices");  // slot 2 of 2
  EXPECT_FI_ERROR(recurrent_kda(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt,
                                std::nullopt, pool, false, true, false, std::nullopt, ints({0, 2})),
                  kOp, "q");  // cu_seqlens needs B == 1
  EXPECT_FI_ERROR(
      recurrent_kda(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt, std::nullopt, pool,
                    false, true, false, std::nullopt, std::nullopt, std::nullopt, 2),
      kOp, "q");  // T must be 1 + S in the batched form
  EXPECT_FI_ERROR(
      recurrent_kda(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt, std::nullopt, pool,
                    false, true, false, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                    std::nullopt, std::nullopt, pool.clone()),
      kOp, "initial_state_indices");
}

TEST(KdaDecode, UndersizedPoolRefusedAndCakePaddingIsPadding) {
  const In in = make(4, 1, 1, 2, 64, 63);
  Tensor big = Tensor::zeros({4, 2, 64, 64}, kBf);
  Tensor small = big.slice(0, 0, 1);  // one slot for four rows without indices
  EXPECT_FI_ERROR(recurrent_kda(in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt,
                                std::nullopt, small),
                  kOp, "initial_state");
  // backend "cake" (SGLang's dense decode): -1 is padding, not the last slot.
  Tensor pool = rand_tensor({3, 2, 64, 64}, kBf, 64, -0.2, 0.2);
  const Tensor pool0 = pool.clone();
  auto [out, fs, cp] = recurrent_kda(
      in.q, in.k, in.v, in.g, in.beta, std::nullopt, std::nullopt, std::nullopt, pool, true, true,
      false, std::nullopt, std::nullopt, ints({0, -1, 1, 2}), std::nullopt, std::nullopt,
      std::nullopt, std::nullopt, std::nullopt, false, std::nullopt, std::nullopt, std::nullopt,
      std::nullopt, 0, std::nullopt, false, std::nullopt, std::nullopt, "cake");
  const auto ov = out.to_double_vector();
  for (int64_t i = 128; i < 256; ++i) ASSERT_EQ(ov[i], 0.0) << i;  // row 1
  EXPECT_NE(pool.select(0, 2).contiguous().to_double_vector(),
            pool0.select(0, 2).contiguous().to_double_vector());  // row 3's own slot
  EXPECT_EQ(fs.select(0, 1).contiguous().to_double_vector(), std::vector<double>(2 * 64 * 64, 0.0));
}

TEST(KdaDecl, SignatureModule) {
  const OpDecl* decl = OpRegistry::global().find(kOp);
  ASSERT_NE(decl, nullptr);
  EXPECT_EQ(decl->module, "flashinfer.kda");
  EXPECT_EQ(decl->signature(),
            "(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None, "
            "output_final_state=False, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=False, "
            "lower_bound=None, cu_seqlens=None, ssm_state_indices=None, num_spec_tokens=None, "
            "num_accepted_tokens=None, output=None, initial_state_source=None, "
            "initial_state_indices=None, beta_is_logit=False, seq_order=None, "
            "prefill_workspace=None, state_checkpoints=None, checkpoint_cu_starts=None, "
            "checkpoint_every_n_tokens=0, checkpoint_state_indices=None, *, "
            "disable_state_update=False, correction_cache=None, kg_cache=None, backend='auto')");
}

void run_kda_calls() {
  const In in = make(1, 3, 1, 2, 64, 70);
  Tensor pool = rand_tensor({3, 2, 64, 64}, kBf, 71, -0.2, 0.2);
  (void)recurrent_kda(in.q, in.k, in.v, in.g, in.beta, in.A_log, in.dt_bias, std::nullopt, pool,
                      true, true, true, -5.0, ints({0, 1, 2, 3}), ints({2, -1, 0}));
  const In sp = make(2, 2, 1, 2, 64, 72);
  Tensor pool2 = rand_tensor({4, 2, 64, 64}, kBf, 73, -0.2, 0.2);
  (void)recurrent_kda(sp.q, sp.k, sp.v, sp.g, sp.beta, std::nullopt, std::nullopt, 0.2, pool2,
                      false, true, false, std::nullopt, std::nullopt, std::nullopt, 1);
}

TEST(KdaReplay, RecordAndReplay) {
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    run_kda_calls();
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& c : calls) EXPECT_TRUE(replays_identically(c)) << c.name;
  EXPECT_EQ(dump_replay_all("kda", run_kda_calls), 2);
}

// ---- CUDA against the CPU -----------------------------------------------------------------------

Tensor cuda(const Tensor& t) { return to_keep_layout(t, Device::cuda(0)); }

TEST(KdaCuda, DecodeSpecAndPrefillMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (int64_t K : {64, 128}) {
    // Packed decode with padding, then a speculative call, then a prefill.
    const In in = make(1, 5, 2, 4, K, 80 + K);
    Tensor pool = rand_tensor({6, 4, K, K}, kBf, 81, -0.2, 0.2);
    Tensor dpool = cuda(pool);
    auto run = [&](Tensor& p, bool gpu, std::optional<Tensor> cu, std::optional<Tensor> idx,
                   std::optional<int64_t> spec) {
      auto dv = [&](const Tensor& t) { return gpu ? cuda(t) : t; };
      auto dopt = [&](const std::optional<Tensor>& t) {
        return t ? std::optional<Tensor>(dv(*t)) : std::nullopt;
      };
      auto r = recurrent_kda(dv(in.q), dv(in.k), dv(in.v), dv(in.g), dv(in.beta), dv(in.A_log),
                             dv(in.dt_bias), std::nullopt, p, false, true, true, -5.0, dopt(cu),
                             dopt(idx), spec, std::nullopt, std::nullopt, std::nullopt,
                             std::nullopt, true);
      return r.output.to(Device::cpu());
    };
    const Tensor c1 = run(pool, false, ints({0, 1, 2, 3, 4, 5}), ints({5, -1, 0, 2, 3}), {});
    const Tensor g1 = run(dpool, true, ints({0, 1, 2, 3, 4, 5}), ints({5, -1, 0, 2, 3}), {});
    // Outputs here are about 1e-2 in size: an atol of 1e-3 (fp32 summation order only) is what
    // tells a wrong state row or decay index apart.
    EXPECT_TRUE(all_close(g1, c1, {1e-3, 1e-2})) << K;
    EXPECT_TRUE(all_close(dpool.to(Device::cpu()), pool, {1e-2, 1e-2})) << K;
    const Tensor c2 = run(pool, false, ints({0, 5}), ints({1, 2, 3, -1, 4}, {1, 5}), 4);
    const Tensor g2 = run(dpool, true, ints({0, 5}), ints({1, 2, 3, -1, 4}, {1, 5}), 4);
    EXPECT_TRUE(all_close(g2, c2, {1e-3, 1e-2})) << K;
    EXPECT_TRUE(all_close(dpool.to(Device::cpu()), pool, {1e-2, 1e-2})) << K;
    const Tensor c3 = run(pool, false, ints({0, 2, 5}), ints({0, 4}), {});
    const Tensor g3 = run(dpool, true, ints({0, 2, 5}), ints({0, 4}), {});
    EXPECT_TRUE(all_close(g3, c3, {1e-3, 1e-2})) << K;
    EXPECT_TRUE(all_close(dpool.to(Device::cpu()), pool, {1e-2, 1e-2})) << K;
  }
}

// ---- fused_kda_decode, packed_kda_decode --------------------------------------------------------

struct Fused {
  int64_t R = 3, H = 12, slots = 4;
  Tensor x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, idx, state, out_gate, norm_w;
};
Fused make_fused(int64_t R, std::vector<double> idx, DType state_dtype, uint64_t seed) {
  Fused f;
  f.R = R;
  const int64_t H = 12, D = 128, C = 3 * H * D;
  f.x = rand_tensor({R, C}, kBf, seed, -1.0, 1.0);
  f.weight = rand_tensor({3, 4, H * D}, kF32, seed + 1, -0.5, 0.5);
  f.conv_state = rand_tensor({f.slots, 3, C}, kBf, seed + 2, -1.0, 1.0).transpose(1, 2);
  f.raw_gate = rand_tensor({1, R, H, D}, kBf, seed + 3, -1.0, 1.0);
  f.raw_beta = rand_tensor({1, R, H}, kBf, seed + 4, -2.0, 2.0);
  f.A_log = rand_tensor({H}, kF32, seed + 5, -1.0, 0.5);
  f.dt_bias = rand_tensor({H * D}, kF32, seed + 6, -0.5, 0.5);
  f.idx = ints(idx);
  f.state = rand_tensor({f.slots, H, D, D}, state_dtype, seed + 7, -0.1, 0.1);
  f.out_gate = rand_tensor({R, H, D}, kBf, seed + 8);
  f.norm_w = rand_tensor({D}, kF32, seed + 9, 0.5, 1.5);
  return f;
}

double bf(double v) {
  return bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(v)));
}

TEST(KdaFused, MatchesFp64WithItsRoundingPointsAndNullRows) {
  for (const bool softplus : {false, true}) {
    Fused f = make_fused(3, {2, 0, 1}, kF32, 90 + softplus);
    const int64_t H = 12, D = 128, C = 3 * H * D;
    const Tensor cs0 = f.conv_state.contiguous(), st0 = f.state.clone();
    Tensor out = fused_kda_decode(f.x, f.weight, f.conv_state, f.raw_gate, f.raw_beta, f.A_log,
                                  f.dt_bias, f.idx, f.state, f.out_gate, f.norm_w,
                                  softplus ? std::nullopt : std::optional<double>(-5.0), 1e-5);
    EXPECT_EQ(out.shape(), (Shape{1, 3, 12, 128}));
    const auto ov = out.to_double_vector(), xv = f.x.to_double_vector(),
               wv = f.weight.to_double_vector(), cv = cs0.to_double_vector(),
               gv = f.raw_gate.to_double_vector(), bv = f.raw_beta.to_double_vector(),
               al = f.A_log.to_double_vector(), db = f.dt_bias.to_double_vector(),
               og = f.out_gate.to_double_vector(), nw = f.norm_w.to_double_vector();
    const int64_t slot_of[3] = {2, 0, 1};
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t h : {0, 7}) {
        std::vector<double> got(ov.begin() + (r * H + h) * D, ov.begin() + (r * H + h + 1) * D);
        if (slot_of[r] == 0) {  // the null row
          EXPECT_EQ(got, std::vector<double>(D, 0.0));
          continue;
        }
        const int64_t s = slot_of[r];
        // cs0 is [slots, C, 3] contiguous (history j of channel c at (s * C + c) * 3 + j).
        std::vector<double> m(3 * D);
        for (int64_t which = 0; which < 3; ++which) {
          for (int64_t i = 0; i < D; ++i) {
            const int64_t c = which * H * D + h * D + i;
            double acc = xv[r * C + c] * wv[(which * 4 + 3) * H * D + h * D + i];
            for (int64_t j = 0; j < 3; ++j) {
              acc += cv[(s * C + c) * 3 + j] * wv[(which * 4 + j) * H * D + h * D + i];
            }
            m[which * D + i] = bf(acc / (1.0 + std::exp(-acc)));
          }
        }
        double sq = 0, sk = 0;
        for (int64_t i = 0; i < D; ++i) sq += m[i] * m[i], sk += m[D + i] * m[D + i];
        std::vector<double> S = slot_state(st0.select(1, h).unsqueeze(1), s, 0);  // [K][V]
        const double beta = 1.0 / (1.0 + std::exp(-bv[r * H + h]));
        std::vector<double> q(D), k(D), d(D), o(D);
        for (int64_t i = 0; i < D; ++i) {
          q[i] = m[i] / std::sqrt(sq + 1e-6) / std::sqrt(128.0);
          k[i] = m[D + i] / std::sqrt(sk + 1e-6);
          const double xg = gv[(r * H + h) * D + i] + db[h * D + i], A = std::exp(al[h]);
          const double a = softplus ? -A * (xg > 20 ? xg : std::log1p(std::exp(xg)))
                                    : -5.0 / (1.0 + std::exp(-A * xg));
          d[i] = std::exp(a);
        }
        for (int64_t v = 0; v < D; ++v) {
          double pred = 0;
          for (int64_t i = 0; i < D; ++i) S[i * D + v] *= d[i], pred += S[i * D + v] * k[i];
          const double u = beta * (m[2 * D + v] - pred);
          double acc = 0;
          for (int64_t i = 0; i < D; ++i) S[i * D + v] += k[i] * u, acc += S[i * D + v] * q[i];
          o[v] = bf(acc);
        }
        double ss = 0;
        for (double e : o) ss += e * e;
        const double rstd = 1.0 / std::sqrt(ss / D + 1e-5);
        std::vector<double> want(D);
        for (int64_t i = 0; i < D; ++i) {
          want[i] = o[i] * rstd * nw[i] / (1.0 + std::exp(-og[(r * H + h) * D + i]));
        }
        EXPECT_TRUE(all_close(got, want, {2e-2, 3e-2})) << r << " " << h;
        EXPECT_TRUE(all_close(transposed(slot_state(f.state.select(1, h).unsqueeze(1), s, 0), D),
                              transposed(S, D), {2e-3, 3e-2}))
            << r << " " << h;
      }
    }
    // The conv history shifted exactly for live rows ([h1, h2, x]); the null row's slot 0 and
    // slot 3 untouched.
    const auto cn = f.conv_state.contiguous().to_double_vector();
    for (int64_t r : {0, 2}) {
      const int64_t s = slot_of[r];
      for (int64_t c = 0; c < C; c += 97) {
        EXPECT_EQ(cn[(s * C + c) * 3 + 0], cv[(s * C + c) * 3 + 1]);
        EXPECT_EQ(cn[(s * C + c) * 3 + 1], cv[(s * C + c) * 3 + 2]);
        EXPECT_EQ(cn[(s * C + c) * 3 + 2], xv[r * C + c]);
      }
    }
    for (int64_t s : {0, 3}) {
      for (int64_t i = 0; i < C * 3; ++i) ASSERT_EQ(cn[s * C * 3 + i], cv[s * C * 3 + i]) << s;
      EXPECT_EQ(f.state.select(0, s).contiguous().to_double_vector(),
                st0.select(0, s).contiguous().to_double_vector());
    }
  }
}

TEST(KdaPacked, IsRecurrentKdaWithItsFixedParameters) {
  const int64_t B = 3, H = 12, D = 128;
  Tensor rows = rand_tensor({B, 6144}, kBf, 100, -1.0, 1.0);
  Tensor mixed = rows.slice(1, 0, 3 * H * D);
  Tensor gate = rand_tensor({B, H * D}, kBf, 101, -1.0, 1.0);
  Tensor beta = rand_tensor({B, H}, kBf, 102, -2.0, 2.0);
  Tensor A_log = rand_tensor({H}, kF32, 103, -1.0, 0.5), dt_bias = rand_tensor({H * D}, kF32, 104);
  Tensor pool = rand_tensor({4, H, D, D}, kBf, 105, -0.1, 0.1);
  Tensor pool2 = pool.clone();
  Tensor idx = ints({3, -1, 0});
  Tensor out = packed_kda_decode(mixed, gate, beta, A_log, dt_bias, pool, idx);
  EXPECT_EQ(out.shape(), (Shape{B, 1, H, D}));
  auto part = [&](int64_t i) {
    return mixed.slice(1, i * H * D, (i + 1) * H * D).reshape({1, B, H, D});
  };
  auto [o2, fs, cp] = recurrent_kda(part(0), part(1), part(2), gate.reshape({1, B, H, D}),
                                    beta.reshape({1, B, H}), A_log, dt_bias, std::nullopt, pool2,
                                    false, true, true, -5.0, ints({0, 1, 2, 3}), idx, std::nullopt,
                                    std::nullopt, std::nullopt, std::nullopt, std::nullopt, true);
  EXPECT_EQ(out.to_double_vector(), o2.to_double_vector());
  EXPECT_EQ(pool.to_double_vector(), pool2.to_double_vector());
  const auto ov = out.to_double_vector();
  for (int64_t i = H * D; i < 2 * H * D; ++i) ASSERT_EQ(ov[i], 0.0);  // the inactive row
  EXPECT_FI_ERROR(packed_kda_decode(rows.slice(1, 0, 4000), gate, beta, A_log, dt_bias, pool, idx),
                  "packed_kda_decode", "mixed_qkv");
}

TEST(KdaFusedBadInput, ErrorsNameOpAndArgument) {
  Fused f = make_fused(2, {1, 2}, kF32, 110);
  auto call = [&](const Tensor& x, std::optional<double> lb, double eps = 1e-5) {
    return fused_kda_decode(x, f.weight, f.conv_state, f.raw_gate, f.raw_beta, f.A_log, f.dt_bias,
                            f.idx, f.state, f.out_gate, f.norm_w, lb, eps);
  };
  const char* op = "fused_kda_decode";
  EXPECT_FI_ERROR(call(f.x.slice(1, 0, 100), -5.0), op, "x");
  EXPECT_FI_ERROR(call(f.x, 0.0), op, "lower_bound");
  EXPECT_FI_ERROR(call(f.x, -5.0, -1.0), op, "norm_eps");
  EXPECT_FI_ERROR(
      fused_kda_decode(f.x, f.weight, f.conv_state.slice(2, 0, 2), f.raw_gate, f.raw_beta, f.A_log,
                       f.dt_bias, f.idx, f.state, f.out_gate, f.norm_w),
      op, "conv_state");  // two history entries
  // A compact [slots, C, 3] history (as a snapshot holds it) gives the SD layout's results.
  Fused g = make_fused(2, {1, 2}, kF32, 111);
  Tensor compact = g.conv_state.contiguous(), st2 = g.state.clone();
  Tensor o1 = fused_kda_decode(g.x, g.weight, g.conv_state, g.raw_gate, g.raw_beta, g.A_log,
                               g.dt_bias, g.idx, g.state, g.out_gate, g.norm_w);
  Tensor o2 = fused_kda_decode(g.x, g.weight, compact, g.raw_gate, g.raw_beta, g.A_log, g.dt_bias,
                               g.idx, st2, g.out_gate, g.norm_w);
  EXPECT_EQ(o1.to_double_vector(), o2.to_double_vector());
  EXPECT_EQ(g.conv_state.contiguous().to_double_vector(), compact.to_double_vector());
  EXPECT_FI_ERROR(fused_kda_decode(f.x, f.weight, f.conv_state, f.raw_gate, f.raw_beta, f.A_log,
                                   f.dt_bias, ints({1, 4}), f.state, f.out_gate, f.norm_w),
                  op, "state_indices");
  EXPECT_FI_ERROR(
      fused_kda_decode(f.x, f.weight, f.conv_state, f.raw_gate, f.raw_beta, f.A_log, f.dt_bias,
                       f.idx, f.state.to(DType::kFloat16), f.out_gate, f.norm_w),
      op, "state");
}

// Upstream 0.7.4's keywords: backend "cute-dsl" (default) or "auto" run this kernel; "cake" needs a
// state_indices_mode and has no route off SM100a / SM103a (refused, kUnsupported); the mode is a
// promise about state_indices that changes nothing; unknown values are refused with upstream's
// texts.
TEST(KdaFusedBadInput, BackendAndStateIndicesModeAsUpstream) {
  Fused f = make_fused(2, {1, 2}, kF32, 112), g = make_fused(2, {1, 2}, kF32, 112);
  auto call = [](Fused& c, std::string_view backend, std::optional<std::string> mode) {
    return fused_kda_decode(c.x, c.weight, c.conv_state, c.raw_gate, c.raw_beta, c.A_log, c.dt_bias,
                            c.idx, c.state, c.out_gate, c.norm_w, -5.0, 1e-5, std::nullopt, backend,
                            mode);
  };
  const Tensor o1 = call(f, "cute-dsl", std::nullopt);
  const Tensor o2 = call(g, "auto", std::string("repeated_positive"));
  EXPECT_EQ(o1.to_double_vector(), o2.to_double_vector());
  EXPECT_EQ(f.state.to_double_vector(), g.state.to_double_vector());
  const char* op = "fused_kda_decode";
  auto expect_text = [&](std::string_view backend, std::optional<std::string> mode, const char* arg,
                         const char* text) {
    try {
      (void)call(f, backend, mode);
      ADD_FAILURE() << "expected an error naming " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.op(), op);
      EXPECT_EQ(e.arg(), arg) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_text("triton", std::nullopt, "backend",
              "backend must be 'cute-dsl', 'cake', or 'auto', got 'triton'");
  expect_text("cute-dsl", std::string("unique"), "state_indices_mode",
              "state_indices_mode must be 'positive_unique', 'unique_or_null', or "
              "'repeated_positive', got 'unique'");
  expect_text("cake", std::nullopt, "state_indices_mode",
              "backend='cake' requires the host-known state_indices_mode assertion");
  EXPECT_FI_ERROR_CODE((void)call(f, "cake", std::string("positive_unique")), op, "backend",
                       ErrorCode::kUnsupported);
}

void run_fused_calls() {
  Fused f = make_fused(2, {1, -1}, kBf, 120);
  (void)fused_kda_decode(f.x, f.weight, f.conv_state, f.raw_gate, f.raw_beta, f.A_log, f.dt_bias,
                         f.idx, f.state, f.out_gate, f.norm_w);
}

TEST(KdaFusedReplay, RecordAndReplay) {
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    run_fused_calls();
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_TRUE(replays_identically(calls[0]));
  EXPECT_EQ(dump_replay_all("fused_kda", run_fused_calls), 1);
}

TEST(KdaCuda, FusedMatchesCpuPackedRefusedBeforeSm100) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (DType st : {kF32, kBf}) {
    Fused f = make_fused(3, {2, 0, 3}, st, 130);
    Tensor dcs = cuda(f.conv_state), dst = cuda(f.state);
    Tensor oc = fused_kda_decode(f.x, f.weight, f.conv_state, f.raw_gate, f.raw_beta, f.A_log,
                                 f.dt_bias, f.idx, f.state, f.out_gate, f.norm_w);
    Tensor og = fused_kda_decode(cuda(f.x), cuda(f.weight), dcs, cuda(f.raw_gate), cuda(f.raw_beta),
                                 cuda(f.A_log), cuda(f.dt_bias), cuda(f.idx), dst, cuda(f.out_gate),
                                 cuda(f.norm_w));
    EXPECT_TRUE(all_close(og.to(Device::cpu()), oc, {2e-2, 3e-2}));
    EXPECT_EQ(dcs.to(Device::cpu()).contiguous().to_double_vector(),
              f.conv_state.contiguous().to_double_vector());
    EXPECT_TRUE(all_close(dst.to(Device::cpu()), f.state, {2e-3, 3e-2}));
  }
  if (api::compute_capability(Device::cuda(0)) < 100) {
    Tensor mixed = cuda(rand_tensor({2, 4608}, kBf, 131));
    EXPECT_FI_ERROR(
        packed_kda_decode(mixed, cuda(rand_tensor({2, 1536}, kBf, 132)),
                          cuda(rand_tensor({2, 12}, kBf, 133)), cuda(rand_tensor({12}, kF32, 134)),
                          cuda(rand_tensor({1536}, kF32, 135)),
                          cuda(Tensor::zeros({3, 12, 128, 128}, kBf)), cuda(ints({1, 2}))),
        "packed_kda_decode", "mixed_qkv");
  }
}

TEST(KdaCuda, CheckpointsSourcePoolAcceptedColumnsAndGateFormsMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  // Prefill with checkpoints, the softplus gate, L2 off.
  const In in = make(1, 40, 2, 4, 64, 140);
  Tensor pool = rand_tensor({2, 4, 64, 64}, kBf, 141, -0.2, 0.2), dpool = cuda(pool);
  Tensor cps = Tensor::zeros({4, 4, 64, 64}, kBf), dcps = cuda(cps);
  Tensor starts = Tensor::from_vector({0, 2, 4}, {3}, DType::kInt64);
  auto [oc, fc, cc] = recurrent_kda(
      in.q, in.k, in.v, in.g, in.beta, in.A_log, in.dt_bias, std::nullopt, pool, false, false, true,
      std::nullopt, ints({0, 17, 40}), ints({1, 0}), std::nullopt, std::nullopt, std::nullopt,
      std::nullopt, std::nullopt, false, std::nullopt, std::nullopt, cps, starts, 16);
  auto [og, fg, cg] = recurrent_kda(
      cuda(in.q), cuda(in.k), cuda(in.v), cuda(in.g), cuda(in.beta), cuda(in.A_log),
      cuda(in.dt_bias), std::nullopt, dpool, false, false, true, std::nullopt,
      cuda(ints({0, 17, 40})), cuda(ints({1, 0})), std::nullopt, std::nullopt, std::nullopt,
      std::nullopt, std::nullopt, false, std::nullopt, std::nullopt, dcps, cuda(starts), 16);
  EXPECT_TRUE(all_close(og.to(Device::cpu()), oc, {2e-2, 2e-2}));
  EXPECT_TRUE(all_close(dpool.to(Device::cpu()), pool, {2e-2, 2e-2}));
  EXPECT_TRUE(all_close(dcps.to(Device::cpu()), cps, {2e-2, 2e-2}));
  // Speculative from a source pool, then from accepted-token columns (precomputed gate).
  const In sp = make(1, 6, 2, 4, 64, 150);
  Tensor spool = rand_tensor({7, 4, 64, 64}, kBf, 151, -0.2, 0.2), dspool = cuda(spool);
  Tensor src = rand_tensor({2, 4, 64, 64}, kBf, 152, -0.2, 0.2);
  Tensor sidx = ints({1, 2, 3, 4, -1, 6}, {2, 3});
  for (const bool from_source : {true, false}) {
    std::optional<Tensor> s_c, s_g, i_c, i_g;
    if (from_source) s_c = src, s_g = cuda(src), i_c = ints({1, 0}), i_g = cuda(ints({1, 0}));
    auto [o1, f1, c1] = recurrent_kda(
        sp.q, sp.k, sp.v, sp.g, sp.beta, std::nullopt, std::nullopt, std::nullopt, spool, false,
        true, false, std::nullopt, ints({0, 3, 6}), sidx, 2, ints({3, 9}), std::nullopt, s_c, i_c);
    auto [o2, f2, c2] = recurrent_kda(cuda(sp.q), cuda(sp.k), cuda(sp.v), cuda(sp.g), cuda(sp.beta),
                                      std::nullopt, std::nullopt, std::nullopt, dspool, false, true,
                                      false, std::nullopt, cuda(ints({0, 3, 6})), cuda(sidx), 2,
                                      cuda(ints({3, 9})), std::nullopt, s_g, i_g);
    EXPECT_TRUE(all_close(o2.to(Device::cpu()), o1, {2e-2, 2e-2})) << from_source;
    EXPECT_TRUE(all_close(dspool.to(Device::cpu()), spool, {2e-2, 2e-2})) << from_source;
  }
}

TEST(KdaCuda, FrozenVerifyAndIndexedCheckpointsMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  // The packed frozen verify with caches (a padding slot), then an indexed-checkpoint prefill.
  const In in = make(1, 6, 2, 2, 128, 250);
  const Tensor pool = rand_tensor({5, 2, 128, 128}, kBf, 251, -0.2, 0.2);
  Tensor corr = Tensor::full({5, 2, 3, 128}, 7.0, kF32),
         kg = Tensor::full({5, 2, 3, 256}, 7.0, kBf);
  Tensor dcorr = cuda(corr), dkg = cuda(kg), dpool = cuda(pool);
  auto [oc, fc, cc] = frozen_call(in, pool, ints({0, 3, 4, 6}), ints({4, -1, 0}), 2,
                                  Frozen{.corr = corr, .kg = kg});
  In din = in;
  din.q = cuda(in.q), din.k = cuda(in.k), din.v = cuda(in.v), din.g = cuda(in.g);
  din.beta = cuda(in.beta), din.A_log = cuda(in.A_log), din.dt_bias = cuda(in.dt_bias);
  auto [og, fg, cg] = frozen_call(din, dpool, cuda(ints({0, 3, 4, 6})), cuda(ints({4, -1, 0})), 2,
                                  Frozen{.corr = dcorr, .kg = dkg});
  EXPECT_TRUE(all_close(og.to(Device::cpu()), oc, {1e-3, 1e-2}));
  EXPECT_TRUE(all_close(dcorr.to(Device::cpu()), corr, {1e-3, 1e-2}));
  EXPECT_EQ(dkg.to(Device::cpu()).to_double_vector(), kg.to_double_vector());
  EXPECT_EQ(dpool.to(Device::cpu()).to_double_vector(), pool.to_double_vector());
  const In pre = make(1, 104, 2, 2, 128, 252);
  Tensor p1 = pool.slice(0, 0, 2).clone(), dp1 = cuda(p1);
  Tensor rows = Tensor::full({4, 2, 128, 128}, 3.0, kBf), drows = cuda(rows);
  const Tensor starts = Tensor::from_vector({0, 2, 3}, {3}, DType::kInt64);
  auto run = [&](bool gpu, Tensor& st, Tensor& cps) {
    auto dv = [&](const Tensor& t) { return gpu ? cuda(t) : t; };
    return recurrent_kda(dv(pre.q), dv(pre.k), dv(pre.v), dv(pre.g), dv(pre.beta), dv(pre.A_log),
                         dv(pre.dt_bias), std::nullopt, st, false, true, true, -5.0,
                         dv(ints({0, 64, 104})), dv(ints({1, 0})), std::nullopt, std::nullopt,
                         std::nullopt, std::nullopt, std::nullopt, true, std::nullopt, std::nullopt,
                         cps, dv(starts), 32, dv(ints({3, -1, 0})))
        .output.to(Device::cpu());
  };
  EXPECT_TRUE(all_close(run(true, dp1, drows), run(false, p1, rows), {1e-3, 1e-2}));
  EXPECT_TRUE(all_close(drows.to(Device::cpu()), rows, {2e-2, 2e-2}));
}

}  // namespace
}  // namespace flashinfer::testing
