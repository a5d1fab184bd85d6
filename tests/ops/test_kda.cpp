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
std::vector<double> ref_step(const In& in, const RefOpts& o, int64_t r, int64_t t, int64_t hv,
                             std::vector<double>& S) {
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
  // Write slots 4, 5, 6 for sequence 0 instead of its read slots: a separate table would be
  // needed upstream too; here the read column of sequence 0 is idx[0, 1] = 2.
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

TEST(KdaBadInput, ErrorsNameOpAndArgument) {
  const In in = make(2, 1, 2, 4, 64, 60);
  Tensor pool = Tensor::zeros({2, 4, 64, 64}, kBf);
  auto call = [&](const Tensor& q, std::optional<Tensor> A_log, bool gate, std::optional<double> lb,
                  std::string backend = "auto") {
    return recurrent_kda(q, in.k, in.v, in.g, in.beta, A_log, std::nullopt, std::nullopt, pool,
                         false, true, gate, lb, std::nullopt, std::nullopt, std::nullopt,
                         std::nullopt, std::nullopt, std::nullopt, std::nullopt, false,
                         std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0, backend);
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
            "checkpoint_every_n_tokens=0, *, backend='auto')");
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
    EXPECT_TRUE(all_close(g1, c1, {1e-2, 1e-2})) << K;
    EXPECT_TRUE(all_close(dpool.to(Device::cpu()), pool, {1e-2, 1e-2})) << K;
    const Tensor c2 = run(pool, false, ints({0, 5}), ints({1, 2, 3, -1, 4}, {1, 5}), 4);
    const Tensor g2 = run(dpool, true, ints({0, 5}), ints({1, 2, 3, -1, 4}, {1, 5}), 4);
    EXPECT_TRUE(all_close(g2, c2, {1e-2, 1e-2})) << K;
    EXPECT_TRUE(all_close(dpool.to(Device::cpu()), pool, {1e-2, 1e-2})) << K;
    const Tensor c3 = run(pool, false, ints({0, 2, 5}), ints({0, 4}), {});
    const Tensor g3 = run(dpool, true, ints({0, 2, 5}), ints({0, 4}), {});
    EXPECT_TRUE(all_close(g3, c3, {1e-2, 1e-2})) << K;
    EXPECT_TRUE(all_close(dpool.to(Device::cpu()), pool, {1e-2, 1e-2})) << K;
  }
}

}  // namespace
}  // namespace flashinfer::testing
