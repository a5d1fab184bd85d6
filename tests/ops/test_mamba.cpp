// flashinfer.mamba.selective_state_update: an fp64 recurrence of upstream's reference math, a
// hand-checked step, the slot rules of its three paths (padding, dst slots, disabled updates,
// intermediate states, varlen with accepted tokens), equalities between the paths that hold bit
// for bit on the CPU, the int16 and stochastic-fp16 state encodings against their formulas,
// upstream's shape normalization, bad inputs, the declaration, record / replay, and CUDA
// against the CPU when a GPU is visible.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "kernels/ssu_rules.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

constexpr DType kBf = DType::kBFloat16;
constexpr DType kF32 = DType::kFloat32;
constexpr DType kI32 = DType::kInt32;
constexpr const char* kOp = "selective_state_update";

// A per-head tensor [lead..., H] seen as [lead..., H, n...] with stride 0 along the n axes, as
// upstream's callers pass dt, A, D and dt_bias.
Tensor per_head(const Tensor& base, Shape trailing) {
  Shape shape = base.shape(), strides = base.strides();
  for (int64_t n : trailing) shape.push_back(n), strides.push_back(0);
  return base.as_strided(shape, strides, base.storage_offset());
}

// One update's inputs. T == 0: STP ([batch, nheads, dim] io); T >= 1: MTP ([batch, T, ...]).
struct Ssu {
  int64_t batch = 3, T = 0, nheads = 4, dim = 8, dstate = 16, ngroups = 2, slots = 6;
  DType io = kF32;
  Tensor state, x, dt_h, dt, A_h, A, D_h, D, bias_h, bias, B, C, z;
  Shape lead() const { return T == 0 ? Shape{batch} : Shape{batch, T}; }
};

Ssu make(int64_t batch, int64_t T, int64_t nheads, int64_t dim, int64_t dstate, int64_t ngroups,
         int64_t slots, uint64_t seed, DType io = kF32, DType state_dtype = kF32) {
  Ssu c;
  c.batch = batch, c.T = T, c.nheads = nheads, c.dim = dim, c.dstate = dstate;
  c.ngroups = ngroups, c.slots = slots, c.io = io;
  c.state = rand_tensor({slots, nheads, dim, dstate}, state_dtype, seed, -1.0, 1.0);
  Shape xs = c.lead(), bs = c.lead(), hs = c.lead();
  xs.insert(xs.end(), {nheads, dim});
  bs.insert(bs.end(), {ngroups, dstate});
  hs.push_back(nheads);
  c.x = rand_tensor(xs, io, seed + 1);
  c.z = rand_tensor(xs, io, seed + 2);
  c.B = rand_tensor(bs, io, seed + 3);
  c.C = rand_tensor(bs, io, seed + 4);
  c.dt_h = rand_tensor(hs, kF32, seed + 5, -1.0, 1.0);
  c.dt = per_head(c.dt_h, {dim});
  c.A_h = rand_tensor({nheads}, kF32, seed + 6, -2.0, -1.0);  // upstream's tests: -(rand + 1)
  c.A = per_head(c.A_h, {dim, dstate});
  c.D_h = rand_tensor({nheads}, kF32, seed + 7);
  c.D = per_head(c.D_h, {dim});
  c.bias_h = rand_tensor({nheads}, kF32, seed + 8, -4.0, -3.0);  // upstream's tests: rand - 4
  c.bias = per_head(c.bias_h, {dim});
  return c;
}

// ---- fp64 reference ----------------------------------------------------------------------------

double softplus64(double v) { return v <= 20.0 ? std::log1p(std::exp(v)) : v; }

struct Ref {
  std::vector<double> out;                  // like x
  std::vector<std::vector<double>> states;  // per sequence, per step: [nheads, dim, dstate]
};

// src[b] < 0 with pad: zero state. Every token of sequence b steps its fp64 state.
Ref reference(const Ssu& c, const std::vector<int64_t>& src, int64_t pad, bool use_z, bool use_bias,
              bool softplus) {
  const int64_t T = std::max<int64_t>(c.T, 1), H = c.nheads, P = c.dim, N = c.dstate;
  const auto st = c.state.to_double_vector(), x = c.x.to_double_vector(),
             z = c.z.to_double_vector(), B = c.B.to_double_vector(), C = c.C.to_double_vector(),
             dt = c.dt_h.to_double_vector(), A = c.A_h.to_double_vector(),
             D = c.D_h.to_double_vector(), bias = c.bias_h.to_double_vector();
  Ref r;
  r.out.assign(x.size(), 0.0);
  for (int64_t b = 0; b < c.batch; ++b) {
    std::vector<double> S(static_cast<size_t>(H * P * N), 0.0);
    if (src[b] != pad) {
      std::copy(st.begin() + src[b] * H * P * N, st.begin() + (src[b] + 1) * H * P * N, S.begin());
    }
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / (H / c.ngroups);
        double d_t = dt[(b * T + t) * H + h] + (use_bias ? bias[h] : 0.0);
        if (softplus) d_t = softplus64(d_t);
        const double dA = std::exp(A[h] * d_t);
        for (int64_t p = 0; p < P; ++p) {
          const int64_t xi = ((b * T + t) * H + h) * P + p;
          double y = D[h] * x[xi];
          for (int64_t n = 0; n < N; ++n) {
            double& s = S[(h * P + p) * N + n];
            const double bn = B[((b * T + t) * c.ngroups + g) * N + n];
            s = s * dA + bn * d_t * x[xi];
            y += s * C[((b * T + t) * c.ngroups + g) * N + n];
          }
          if (use_z) y *= z[xi] / (1.0 + std::exp(-z[xi]));
          r.out[xi] = y;
        }
      }
      r.states.push_back(S);
    }
  }
  return r;
}

// Slot `slot` of a state tensor as doubles.
std::vector<double> slot_of(const Tensor& state, int64_t slot) {
  return state.select(0, slot).contiguous().to_double_vector();
}

Tensor idx(std::vector<double> v, DType dt = kI32) {
  const auto n = static_cast<int64_t>(v.size());
  return Tensor::from_vector(v, {n}, dt);
}

// ---- STP against fp64 ---------------------------------------------------------------------------

TEST(SsuStp, MatchesFp64RecurrenceWithSlotsGatesAndGroups) {
  for (int64_t ngroups : {1, 2, 4}) {
    Ssu c = make(3, 0, 4, 8, 16, ngroups, 6, 10 + ngroups);
    const Tensor before = c.state.clone();
    const std::vector<int64_t> src = {4, 0, 2};
    const Ref r = reference(c, src, -1, true, true, true);
    Tensor out = selective_state_update(c.state, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true,
                                        idx({4, 0, 2}));
    EXPECT_TRUE(all_close(out.to_double_vector(), r.out, {2e-5, 2e-5})) << ngroups;
    for (int64_t b = 0; b < 3; ++b) {
      EXPECT_TRUE(all_close(slot_of(c.state, src[b]), r.states[b], {2e-6, 2e-6})) << b;
    }
    for (int64_t untouched : {1, 3, 5}) {
      EXPECT_EQ(slot_of(c.state, untouched), slot_of(before, untouched)) << untouched;
    }
  }
}

TEST(SsuStp, HandCheckedStep) {
  // One head, one row, dstate 2: s = [1, 2], x = 1, dt = 0.5 (no bias, no softplus), A = -1,
  // B = [1, 2], C = [1, 1], D = 0.5: dA = e^-0.5, s' = [e^-0.5 + 0.5, 2 e^-0.5 + 1],
  // y = 0.5 + s'[0] + s'[1] = 2 + 3 e^-0.5.
  Tensor state = Tensor::from_vector({1, 2}, {1, 1, 2}, kF32);  // [cache, dim, dstate]
  Tensor x = Tensor::from_vector({1}, {1, 1}, kF32);            // [batch, dim]
  Tensor dt = Tensor::from_vector({0.5}, {1, 1}, kF32);
  Tensor A = Tensor::from_vector({-1, -1}, {1, 2}, kF32);  // [dim, dstate], materialized
  Tensor B = Tensor::from_vector({1, 2}, {1, 2}, kF32);
  Tensor C = Tensor::from_vector({1, 1}, {1, 2}, kF32);
  Tensor D = Tensor::from_vector({0.5}, {1}, kF32);
  Tensor out = selective_state_update(state, x, dt, A, B, C, D);
  EXPECT_EQ(out.shape(), (Shape{1, 1, 1}));  // upstream returns the normalized x's shape
  const double e = std::exp(-0.5);
  EXPECT_NEAR(out.to_double_vector()[0], 2.0 + 3.0 * e, 1e-6);
  EXPECT_NEAR(state.to_double_vector()[0], e + 0.5, 1e-6);
  EXPECT_NEAR(state.to_double_vector()[1], 2.0 * e + 1.0, 1e-6);
}

TEST(SsuStp, PadSlotComputesOutputFromZeroStateAndStoresNothing) {
  Ssu c = make(2, 0, 2, 4, 8, 1, 3, 30);
  const Tensor before = c.state.clone();
  const Ref r = reference(c, {7, 1}, 7, true, true, true);
  Tensor out = selective_state_update(c.state, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true,
                                      idx({7, 1}), 7);
  EXPECT_TRUE(all_close(out.to_double_vector(), r.out, {2e-5, 2e-5}));
  EXPECT_EQ(slot_of(c.state, 0), slot_of(before, 0));
  EXPECT_EQ(slot_of(c.state, 2), slot_of(before, 2));
  EXPECT_TRUE(all_close(slot_of(c.state, 1), r.states[1], {2e-6, 2e-6}));
  // Without indices the row number itself is compared with pad_slot_id (upstream's rule).
  Ssu d = make(2, 0, 2, 4, 8, 1, 3, 31);
  const Tensor before_d = d.state.clone();
  const Ref rd = reference(d, {0, 1}, 1, false, false, false);
  Tensor out_d = selective_state_update(d.state, d.x, d.dt, d.A, d.B, d.C, d.D, std::nullopt,
                                        std::nullopt, false, std::nullopt, 1);
  EXPECT_TRUE(all_close(out_d.to_double_vector(), rd.out, {2e-5, 2e-5}));
  EXPECT_EQ(slot_of(d.state, 1), slot_of(before_d, 1));
  EXPECT_FALSE(slot_of(d.state, 0) == slot_of(before_d, 0));
}

TEST(SsuStp, DstSlotsAndDisabledUpdate) {
  Ssu c = make(2, 0, 2, 4, 8, 2, 5, 40);
  const Tensor before = c.state.clone();
  Tensor out =
      selective_state_update(c.state, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true, idx({0, 1}),
                             -1, std::nullopt, std::nullopt, false, std::nullopt, std::nullopt,
                             std::nullopt, std::nullopt, 10, 0, "auto", idx({3, 4}));
  const Ref r = reference(c, {0, 1}, -1, true, true, true);
  EXPECT_TRUE(all_close(out.to_double_vector(), r.out, {2e-5, 2e-5}));
  for (int64_t s : {0, 1, 2}) EXPECT_EQ(slot_of(c.state, s), slot_of(before, s)) << s;
  EXPECT_TRUE(all_close(slot_of(c.state, 3), r.states[0], {2e-6, 2e-6}));
  EXPECT_TRUE(all_close(slot_of(c.state, 4), r.states[1], {2e-6, 2e-6}));

  // disable_state_update: the same output bits, the cache untouched.
  Tensor cache = before.clone();
  Tensor out2 = selective_state_update(cache, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true,
                                       idx({0, 1}), -1, std::nullopt, std::nullopt, true);
  EXPECT_EQ(out2.to_double_vector(), out.to_double_vector());
  EXPECT_EQ(cache.to_double_vector(), before.to_double_vector());
}

TEST(SsuStp, Bf16IoAndStatesAgainstFp64) {
  for (DType st : {kF32, DType::kFloat16, kBf}) {
    Ssu c = make(4, 0, 4, 16, 32, 2, 4, 50, kBf, st);
    const Ref r = reference(c, {0, 1, 2, 3}, -1, true, true, true);
    Tensor out = selective_state_update(c.state, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true);
    EXPECT_EQ(out.dtype(), kBf);
    EXPECT_TRUE(all_close(out.to_double_vector(), r.out, {3e-2, 2e-2})) << dtype_label(st);
    const Tolerance tol = st == kF32 ? Tolerance{1e-5, 1e-5} : default_tolerance(st);
    EXPECT_TRUE(all_close(slot_of(c.state, 2), r.states[2], tol)) << dtype_label(st);
  }
}

// ---- MTP and varlen ----------------------------------------------------------------------------

// T single-token calls on an fp32 state: what one multi-token call must equal bit for bit.
struct Chained {
  std::vector<double> out;                  // [batch, T, nheads, dim]
  std::vector<std::vector<double>> states;  // per (b, t): the slot after the step
};
Chained chain_stp(const Ssu& c, const Tensor& state0, const std::vector<int64_t>& src,
                  const std::vector<int64_t>& steps) {
  Chained r;
  const int64_t H = c.nheads, P = c.dim;
  r.out.assign(static_cast<size_t>(c.batch * c.T * H * P), 0.0);
  for (int64_t b = 0; b < c.batch; ++b) {
    Tensor st = state0.clone();
    for (int64_t t = 0; t < steps[b]; ++t) {
      auto tok = [&](const Tensor& v) { return v.select(0, b).select(0, t).unsqueeze(0); };
      Tensor o = selective_state_update(st, tok(c.x), tok(c.dt), c.A, tok(c.B), tok(c.C), c.D,
                                        tok(c.z), c.bias, true, idx({static_cast<double>(src[b])}));
      const auto ov = o.to_double_vector();
      std::copy(ov.begin(), ov.end(), r.out.begin() + (b * c.T + t) * H * P);
      r.states.push_back(slot_of(st, src[b]));
    }
  }
  return r;
}

TEST(SsuMtp, EqualsChainedSingleTokenStepsWithIntermediates) {
  Ssu c = make(2, 3, 4, 8, 16, 2, 5, 60);
  const Tensor state0 = c.state.clone();
  const Chained ref = chain_stp(c, state0, {3, 1}, {3, 3});
  Tensor buffer = Tensor::zeros({4, 3, 4, 8, 16}, kF32);
  Tensor out = selective_state_update(c.state, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true,
                                      idx({3, 1}), -1, std::nullopt, std::nullopt, true, buffer,
                                      idx({2, 0}), std::nullopt, std::nullopt, 10, 3);
  EXPECT_EQ(out.shape(), (Shape{2, 3, 4, 8}));
  EXPECT_EQ(out.to_double_vector(), ref.out);
  EXPECT_EQ(c.state.to_double_vector(), state0.to_double_vector());  // disabled update
  for (int64_t t = 0; t < 3; ++t) {
    EXPECT_EQ(buffer.select(0, 2).select(0, t).contiguous().to_double_vector(), ref.states[t]);
    EXPECT_EQ(buffer.select(0, 0).select(0, t).contiguous().to_double_vector(), ref.states[3 + t]);
  }
  EXPECT_EQ(slot_of(buffer, 1), std::vector<double>(3 * 4 * 8 * 16, 0.0));
  // With the update on, the final state goes back to the read slot.
  Tensor out2 = selective_state_update(
      c.state, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true, idx({3, 1}), -1, std::nullopt,
      std::nullopt, false, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 10, 3);
  EXPECT_EQ(out2.to_double_vector(), ref.out);
  EXPECT_EQ(slot_of(c.state, 3), ref.states[2]);
  EXPECT_EQ(slot_of(c.state, 1), ref.states[5]);
  // Intermediates with the update on: every step to the buffer, the last one also to the slot.
  Tensor st3 = state0.clone();
  Tensor buf3 = Tensor::zeros({4, 3, 4, 8, 16}, kF32);
  (void)selective_state_update(st3, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true, idx({3, 1}),
                               -1, std::nullopt, std::nullopt, false, buf3, std::nullopt,
                               std::nullopt, std::nullopt, 10, 3);
  EXPECT_EQ(buf3.select(0, 3).select(0, 1).contiguous().to_double_vector(), ref.states[1]);
  EXPECT_EQ(buf3.select(0, 1).select(0, 2).contiguous().to_double_vector(), ref.states[5]);
  EXPECT_EQ(slot_of(st3, 3), ref.states[2]);
  EXPECT_EQ(slot_of(st3, 1), ref.states[5]);
}

TEST(SsuMtp, PaddingDstSlotsAndTheirUpdateRule) {
  Ssu c = make(2, 3, 2, 4, 8, 1, 6, 65);
  const Tensor state0 = c.state.clone();
  // A padded request: outputs from a zero state, no buffer entry written.
  const Ref r = reference(c, {5, 2}, 5, true, true, true);
  const Ref r2 = reference(c, {0, 1}, -1, true, true, true);
  Tensor buffer = Tensor::zeros({6, 3, 2, 4, 8}, kF32);
  Tensor out = selective_state_update(c.state, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true,
                                      idx({5, 2}), 5, std::nullopt, std::nullopt, false, buffer,
                                      std::nullopt, std::nullopt, std::nullopt, 10, 3);
  EXPECT_TRUE(all_close(out.to_double_vector(), r.out, {2e-5, 2e-5}));
  EXPECT_EQ(slot_of(buffer, 5), std::vector<double>(3 * 2 * 4 * 8, 0.0));
  EXPECT_EQ(slot_of(c.state, 5), slot_of(state0, 5));
  EXPECT_TRUE(all_close(slot_of(c.state, 2), r.states[5], {2e-6, 2e-6}));
  // A 1-D dst index: every step writes the same slot, the last step wins; the read slot stays,
  // and disable_state_update does not stop dst writes (upstream's MTP rule).
  Tensor st = state0.clone();
  (void)selective_state_update(st, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true, idx({0, 1}),
                               -1, std::nullopt, std::nullopt, true, std::nullopt, std::nullopt,
                               std::nullopt, std::nullopt, 10, 3, "auto", idx({3, 4}));
  EXPECT_TRUE(all_close(slot_of(st, 3), r2.states[2], {2e-6, 2e-6}));
  EXPECT_TRUE(all_close(slot_of(st, 4), r2.states[5], {2e-6, 2e-6}));
  for (int64_t s : {0, 1, 2, 5}) EXPECT_EQ(slot_of(st, s), slot_of(state0, s)) << s;
}

TEST(SsuMtp, ThreeDimensionalXWithCacheStepsIsOneToken) {
  Ssu c = make(2, 0, 2, 4, 8, 1, 2, 70);
  Tensor s1 = c.state.clone(), s2 = c.state.clone();
  Tensor stp = selective_state_update(s1, c.x, c.dt, c.A, c.B, c.C, c.D);
  Tensor mtp =
      selective_state_update(s2, c.x, c.dt, c.A, c.B, c.C, c.D, std::nullopt, std::nullopt, false,
                             std::nullopt, -1, std::nullopt, std::nullopt, false, std::nullopt,
                             std::nullopt, std::nullopt, std::nullopt, 10, 1);
  EXPECT_EQ(mtp.shape(), (Shape{2, 1, 2, 4}));
  EXPECT_EQ(mtp.to_double_vector(), stp.to_double_vector());
  EXPECT_EQ(s2.to_double_vector(), s1.to_double_vector());
}

TEST(SsuVarlen, AcceptedTokensPickTheReadColumnAndEveryStepWritesItsDstSlot) {
  // Three sequences of 2, 0 and 3 tokens packed in 5 rows; state_batch_indices [3, 3] (the
  // column num_accepted_tokens - 1 is the read slot), dst [3, 3] per step.
  Ssu c = make(1, 5, 2, 4, 8, 2, 12, 80);
  const Tensor state0 = c.state.clone();
  auto packed = [](const Tensor& t) { return t.select(0, 0); };  // [5, heads, n]
  Tensor src = Tensor::from_vector({0, 1, 2, 3, 4, 5, 6, 7, 8}, {3, 3}, kI32);
  Tensor dst = Tensor::from_vector({9, 10, -1, 0, 0, 0, 11, 11, 11}, {3, 3}, kI32);
  Tensor na = idx({2, 1, 1});
  Tensor cu = idx({0, 2, 2, 5});
  Tensor out = selective_state_update(c.state, packed(c.x), packed(c.dt), c.A, packed(c.B),
                                      packed(c.C), c.D, packed(c.z), c.bias, true, src, -1,
                                      std::nullopt, std::nullopt, false, std::nullopt, std::nullopt,
                                      std::nullopt, std::nullopt, 10, 3, "auto", dst, cu, na);
  EXPECT_EQ(out.shape(), (Shape{5, 2, 4}));
  // Sequence 0 reads slot 1 (column 1), sequence 2 reads slot 6 (column 0); per-step chains.
  Ssu s0 = c, s2 = c;
  s0.batch = 1, s0.T = 2;
  s0.x = c.x.slice(1, 0, 2), s0.dt = c.dt.slice(1, 0, 2), s0.B = c.B.slice(1, 0, 2);
  s0.C = c.C.slice(1, 0, 2), s0.z = c.z.slice(1, 0, 2);
  s2.batch = 1, s2.T = 3;
  s2.x = c.x.slice(1, 2, 5), s2.dt = c.dt.slice(1, 2, 5), s2.B = c.B.slice(1, 2, 5);
  s2.C = c.C.slice(1, 2, 5), s2.z = c.z.slice(1, 2, 5);
  const Chained r0 = chain_stp(s0, state0, {1}, {2});
  const Chained r2 = chain_stp(s2, state0, {6}, {3});
  const auto ov = out.to_double_vector();
  const int64_t row = 2 * 4;
  EXPECT_EQ(std::vector<double>(ov.begin(), ov.begin() + 2 * row), r0.out);
  EXPECT_EQ(std::vector<double>(ov.begin() + 2 * row, ov.end()), r2.out);
  EXPECT_EQ(slot_of(c.state, 9), r0.states[0]);   // sequence 0, step 0
  EXPECT_EQ(slot_of(c.state, 10), r0.states[1]);  // step 1
  EXPECT_EQ(slot_of(c.state, 11), r2.states[2]);  // sequence 2: every step to 11, the last wins
  for (int64_t s = 0; s < 9; ++s) EXPECT_EQ(slot_of(c.state, s), slot_of(state0, s)) << s;
}

// ---- state encodings ----------------------------------------------------------------------------

TEST(SsuEncodings, StochasticFp16BitsGolden) {
  using kernels::ssu::f16_stochastic_bits;
  const float one_and_half_ulp = 1.0f + 0x1p-11f;  // halfway between fp16 1.0 and 1 + 2^-10
  EXPECT_EQ(f16_stochastic_bits(one_and_half_ulp, 0), 0x3C00u);
  EXPECT_EQ(f16_stochastic_bits(one_and_half_ulp, 0xFFF), 0x3C00u);
  EXPECT_EQ(f16_stochastic_bits(one_and_half_ulp, 0x1000), 0x3C01u);
  EXPECT_EQ(f16_stochastic_bits(-1.0f, 0x1FFF), 0xBC00u);  // exact values never move
  EXPECT_EQ(f16_stochastic_bits(1e-6f, 0x1FFF), 0x0000u);  // below fp16's normals: flushed
  EXPECT_EQ(f16_stochastic_bits(-1e-6f, 0), 0x8000u);
  EXPECT_EQ(f16_stochastic_bits(70000.0f, 0), 0x7C00u);
  EXPECT_EQ(f16_stochastic_bits(-INFINITY, 0), 0xFC00u);
  EXPECT_EQ(f16_stochastic_bits(NAN, 0), 0x7E00u);
  EXPECT_EQ(f16_stochastic_bits(65504.0f, 0x1FFF), 0x7BFFu);  // the largest half stays finite
  // Philox-4x32-10 known answer (Random123's kat_vectors): counter 0, key 0.
  const auto w = kernels::philox4x32_rounds({{0, 0, 0, 0}}, 0, 0, 10);
  EXPECT_EQ(w.v[0], 0x6627e8d5u);
  EXPECT_EQ(w.v[3], 0x9b00dbd8u);
  EXPECT_EQ(kernels::ssu::sr_word(0, 10, 0), 0x6627e8d5u);
  EXPECT_EQ(kernels::ssu::sr_bits(0x6627e8d5u, 0), 0x08d5u);
  EXPECT_EQ(kernels::ssu::sr_bits(0x6627e8d5u, 1), 0x0627u);
}

TEST(SsuEncodings, Int16StateRoundTripsThroughItsScales) {
  Ssu c = make(2, 0, 2, 4, 32, 1, 3, 90);
  Tensor q = Tensor::zeros({3, 2, 4, 32}, DType::kInt16);
  Tensor scale = rand_tensor({3, 2, 4}, kF32, 91, 1e-4, 2e-4);
  {
    const auto src = c.state.to_double_vector();
    std::vector<double> qv(src.size());
    for (size_t i = 0; i < src.size(); ++i) qv[i] = std::round(src[i] * 20000.0);
    q = Tensor::from_vector(qv, {3, 2, 4, 32}, DType::kInt16);
  }
  // The fp32 path on the dequantized state gives the same output bits.
  Tensor deq = Tensor::zeros({3, 2, 4, 32}, kF32);
  {
    const auto qv = q.to_double_vector(), sv = scale.to_double_vector();
    std::vector<double> dv(qv.size());
    for (size_t i = 0; i < qv.size(); ++i) {
      dv[i] = static_cast<double>(static_cast<float>(qv[i]) * static_cast<float>(sv[i / 32]));
    }
    deq = Tensor::from_vector(dv, {3, 2, 4, 32}, kF32);
  }
  Tensor o16 = selective_state_update(q, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true,
                                      idx({2, 0}), -1, scale);
  Tensor o32 =
      selective_state_update(deq, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true, idx({2, 0}));
  EXPECT_EQ(o16.to_double_vector(), o32.to_double_vector());
  // Each updated row: q = rint(s * 32767 / amax), scale = amax / 32767 (as 1 / encode).
  const auto qv = q.to_double_vector(), sv = scale.to_double_vector(), fv = deq.to_double_vector();
  for (int64_t slot : {2, 0}) {
    for (int64_t r = 0; r < 2 * 4; ++r) {
      const int64_t base = (slot * 8 + r) * 32;
      float amax = 0.0f;
      for (int64_t n = 0; n < 32; ++n)
        amax = std::fmax(amax, std::fabs(static_cast<float>(fv[base + n])));
      const float enc = 32767.0f / amax;
      EXPECT_EQ(static_cast<float>(sv[slot * 8 + r]), 1.0f / enc);
      for (int64_t n = 0; n < 32; ++n) {
        EXPECT_EQ(qv[base + n],
                  std::nearbyint(std::fmin(
                      std::fmax(static_cast<float>(fv[base + n]) * enc, -32767.0f), 32767.0f)))
            << slot << " " << r << " " << n;
      }
    }
  }
}

TEST(SsuEncodings, StochasticFp16StatesBracketTheFp32ValueAndFollowTheSeed) {
  Ssu c = make(2, 0, 2, 8, 64, 2, 2, 100);
  Tensor s32 = c.state.to(kF32);
  (void)selective_state_update(s32, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true);
  const Tensor h0 = c.state.to(DType::kFloat16);
  auto run = [&](int64_t seed, int64_t rounds) {
    Tensor h = h0.clone();
    (void)selective_state_update(
        h, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true, std::nullopt, -1, std::nullopt,
        std::nullopt, false, std::nullopt, std::nullopt, std::nullopt,
        Tensor::from_vector({static_cast<double>(seed)}, {1}, DType::kInt64), rounds);
    return h;
  };
  // The fp32 path starts from the fp16 state's values too.
  Tensor s32b = h0.to(kF32);
  (void)selective_state_update(s32b, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true);
  const auto exact = s32b.to_double_vector();
  const Tensor a = run(1234, 10), b = run(1234, 10), other = run(98765, 10), r7 = run(1234, 7);
  EXPECT_EQ(a.to_double_vector(), b.to_double_vector());
  EXPECT_NE(a.to_double_vector(), other.to_double_vector());
  EXPECT_NE(a.to_double_vector(), r7.to_double_vector());
  const auto av = a.to_double_vector();
  int up = 0, down = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    const float f = static_cast<float>(exact[i]);
    const uint16_t lo = kernels::ssu::f16_stochastic_bits(f, 0);
    const uint16_t hi = kernels::ssu::f16_stochastic_bits(f, 0x1FFF);
    const double lo_v = half_bits_to_float(lo), hi_v = half_bits_to_float(hi);
    ASSERT_TRUE(av[i] == lo_v || av[i] == hi_v) << i << ": " << av[i] << " vs " << f;
    up += av[i] == hi_v && hi != lo;
    down += av[i] == lo_v && hi != lo;
  }
  EXPECT_GT(up, 100);
  EXPECT_GT(down, 100);
  // Element 2k + 1 uses bits 16..28 of the pair's word at the read slot's offset 2k.
  const int64_t seed = 1234;
  for (int64_t n : {0, 1, 6, 7}) {
    const uint32_t w = kernels::ssu::sr_word(seed, 10, static_cast<uint64_t>(n & ~int64_t{1}));
    const uint16_t bits = kernels::ssu::f16_stochastic_bits(static_cast<float>(exact[n]),
                                                            kernels::ssu::sr_bits(w, n));
    EXPECT_EQ(av[n], half_bits_to_float(bits)) << n;
  }
}

// ---- upstream's normalization and bad input
// -------------------------------------------------------

TEST(SsuShapes, MaterializedPerHeadTensorsAsUpstreamDumpsHoldThem) {
  Ssu c = make(2, 0, 3, 4, 8, 1, 2, 110);
  Tensor s1 = c.state.clone(), s2 = c.state.clone();
  Tensor o1 = selective_state_update(s1, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true);
  Tensor o2 = selective_state_update(s2, c.x, c.dt.contiguous(), c.A.contiguous(), c.B, c.C,
                                     c.D.contiguous(), c.z, c.bias.contiguous(), true);
  EXPECT_EQ(o1.to_double_vector(), o2.to_double_vector());
  EXPECT_EQ(s1.to_double_vector(), s2.to_double_vector());
  Tensor bad_A = c.A.contiguous();
  bad_A.data<float>()[5] += 1.0f;
  EXPECT_FI_ERROR(selective_state_update(s1, c.x, c.dt, bad_A, c.B, c.C, c.D), kOp, "A");
  Tensor bad_dt = c.dt.contiguous();
  bad_dt.data<float>()[1] += 1.0f;
  EXPECT_FI_ERROR(selective_state_update(s1, c.x, bad_dt, c.A, c.B, c.C, c.D), kOp, "dt");
}

TEST(SsuBadInput, ErrorsNameOpAndArgument) {
  Ssu c = make(2, 0, 2, 4, 8, 2, 3, 120);
  Tensor& st = c.state;
  auto call = [&](const Tensor& state, const Tensor& x, const Tensor& B) {
    return selective_state_update(state, x, c.dt, c.A, B, c.C, c.D);
  };
  EXPECT_FI_ERROR(call(st, c.x.to(DType::kInt32), c.B), kOp, "x");
  EXPECT_FI_ERROR(call(st, c.x, c.B.to(kBf)), kOp, "B");
  EXPECT_FI_ERROR(call(st.slice(3, 0, 4), c.x, c.B), kOp, "state");
  EXPECT_FI_ERROR(call(Tensor::zeros({1, 2, 4, 8}, kF32), c.x, c.B), kOp, "state");  // < batch
  EXPECT_FI_ERROR(call(st.to(DType::kInt16), c.x, c.B), kOp, "state_scale");
  EXPECT_FI_ERROR(call(st, c.x, rand_tensor({2, 3, 8}, kF32, 1)), kOp, "B");  // 2 % 3 != 0
  EXPECT_FI_ERROR(selective_state_update(st, c.x, c.dt, c.A, c.B, c.C, c.D.to(kBf)), kOp, "D");
  auto with = [&](std::optional<Tensor> sbi, int64_t pad, std::optional<Tensor> seed,
                  std::string algorithm, std::string backend, int64_t cache_steps = 0) {
    return selective_state_update(st, c.x, c.dt, c.A, c.B, c.C, c.D, std::nullopt, std::nullopt,
                                  false, sbi, pad, std::nullopt, std::nullopt, false, std::nullopt,
                                  std::nullopt, std::nullopt, seed, 10, cache_steps, algorithm,
                                  std::nullopt, std::nullopt, std::nullopt, backend);
  };
  EXPECT_FI_ERROR(with(idx({0, 3}), -1, std::nullopt, "auto", "auto"), kOp, "state_batch_indices");
  EXPECT_FI_ERROR(with(idx({0}), -1, std::nullopt, "auto", "auto"), kOp, "state_batch_indices");
  EXPECT_NO_THROW(with(idx({0, 3}), 3, std::nullopt, "auto", "auto"));  // 3 is padding
  EXPECT_FI_ERROR(with(std::nullopt, -1, std::nullopt, "fastest", "auto"), kOp, "algorithm");
  EXPECT_FI_ERROR(with(std::nullopt, -1, std::nullopt, "auto", "triton"), kOp, "backend");
  EXPECT_FI_ERROR(with(std::nullopt, -1, std::nullopt, "auto", "auto", -1), kOp, "cache_steps");
  Tensor seed = Tensor::from_vector({7}, {1}, DType::kInt64);
  EXPECT_FI_ERROR(with(std::nullopt, -1, seed, "auto", "auto"), kOp, "rand_seed");  // fp32 state
  // Upstream's algorithm limits that hold on any device; one kernel here, "cake" falls back.
  EXPECT_FI_ERROR(with(std::nullopt, -1, std::nullopt, "vertical", "auto"), kOp, "algorithm");
  EXPECT_NO_THROW(with(std::nullopt, -1, std::nullopt, "horizontal", "cake"));
}

TEST(SsuBadInput, MultiTokenArguments) {
  Ssu c = make(2, 2, 2, 4, 8, 1, 4, 130);
  auto mtp = [&](std::optional<Tensor> buffer, std::optional<Tensor> dst, std::optional<Tensor> na,
                 std::optional<Tensor> sbi) {
    return selective_state_update(c.state, c.x, c.dt, c.A, c.B, c.C, c.D, std::nullopt,
                                  std::nullopt, false, sbi, -1, std::nullopt, std::nullopt, true,
                                  buffer, std::nullopt, std::nullopt, std::nullopt, 10, 2, "auto",
                                  dst, std::nullopt, na);
  };
  EXPECT_FI_ERROR(mtp(Tensor::zeros({4, 2, 2, 4, 8}, kF32), idx({0, 1}), std::nullopt, idx({0, 1})),
                  kOp, "dst_state_batch_indices");
  EXPECT_FI_ERROR(
      mtp(Tensor::zeros({4, 1, 2, 4, 8}, kF32), std::nullopt, std::nullopt, idx({0, 1})), kOp,
      "intermediate_states_buffer");  // one step for two tokens
  EXPECT_FI_ERROR(mtp(Tensor::zeros({4, 2, 2, 4, 8}, kBf), std::nullopt, std::nullopt, idx({0, 1})),
                  kOp, "intermediate_states_buffer");
  EXPECT_FI_ERROR(mtp(std::nullopt, std::nullopt, idx({1, 1}), std::nullopt), kOp,
                  "num_accepted_tokens");
  EXPECT_FI_ERROR(
      mtp(Tensor::zeros({1, 2, 2, 4, 8}, kF32), std::nullopt, std::nullopt, idx({0, 1})), kOp,
      "state_batch_indices");  // entry 1 past the buffer's one entry
  // varlen: cache_steps is max_seqlen, and no sequence may be longer.
  auto packed = [](const Tensor& t) { return t.select(0, 0); };
  EXPECT_FI_ERROR(
      selective_state_update(c.state, packed(c.x), packed(c.dt), c.A, packed(c.B), packed(c.C), c.D,
                             std::nullopt, std::nullopt, false, std::nullopt, -1, std::nullopt,
                             std::nullopt, false, std::nullopt, std::nullopt, std::nullopt,
                             std::nullopt, 10, 1, "auto", std::nullopt, idx({0, 2})),
      kOp, "cu_seqlens");
  EXPECT_FI_ERROR(
      selective_state_update(c.state, packed(c.x), packed(c.dt), c.A, packed(c.B), packed(c.C), c.D,
                             std::nullopt, std::nullopt, false, std::nullopt, -1, std::nullopt,
                             std::nullopt, false, std::nullopt, std::nullopt, std::nullopt,
                             std::nullopt, 10, 0, "auto", std::nullopt, idx({0, 2})),
      kOp, "cache_steps");
}

// ---- declaration, record and replay -------------------------------------------------------------

TEST(SsuDecl, SignatureModuleBackends) {
  const OpDecl* decl = OpRegistry::global().find(kOp);
  ASSERT_NE(decl, nullptr);
  EXPECT_EQ(decl->module, "flashinfer.mamba.selective_state_update");
  EXPECT_EQ(decl->signature(),
            "(state, x, dt, A, B, C, D, z=None, dt_bias=None, dt_softplus=False, "
            "state_batch_indices=None, pad_slot_id=-1, state_scale=None, out=None, "
            "disable_state_update=False, intermediate_states_buffer=None, "
            "intermediate_state_indices=None, intermediate_state_scales=None, rand_seed=None, "
            "philox_rounds=10, cache_steps=0, algorithm='auto', dst_state_batch_indices=None, "
            "cu_seqlens=None, num_accepted_tokens=None, backend='auto')");
  EXPECT_TRUE(op_has_backend(kOp, DeviceType::kCPU));
  EXPECT_EQ(op_has_backend(kOp, DeviceType::kCUDA), cuda_compiled());
}

void run_some_updates() {
  Ssu c = make(2, 0, 2, 4, 8, 1, 3, 140);
  (void)selective_state_update(c.state, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true,
                               idx({2, 0}));
  Ssu m = make(2, 2, 2, 4, 8, 1, 3, 141, kBf, DType::kFloat16);
  Tensor buffer = Tensor::zeros({3, 2, 2, 4, 8}, DType::kFloat16);
  (void)selective_state_update(m.state, m.x, m.dt, m.A, m.B, m.C, m.D, m.z, m.bias, true,
                               idx({1, 2}), -1, std::nullopt, std::nullopt, false, buffer,
                               std::nullopt, std::nullopt,
                               Tensor::from_vector({42}, {1}, DType::kInt64), 10, 2);
}

TEST(SsuReplay, RecordAndReplay) {
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    run_some_updates();
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& c : calls) EXPECT_TRUE(replays_identically(c)) << c.name;
}

TEST(SsuReplay, DumpReplayPasses) { EXPECT_EQ(dump_replay_all("ssu", run_some_updates), 2); }

// ---- CUDA against the CPU -----------------------------------------------------------------------

Tensor cuda(const Tensor& t) { return to_keep_layout(t, Device::cuda(0)); }
std::optional<Tensor> cuda(const std::optional<Tensor>& t) {
  return t ? std::optional<Tensor>(cuda(*t)) : std::nullopt;
}

// An int16 state's values (q * its row scale), or any other state's.
std::vector<double> state_values(const Tensor& st, const std::optional<Tensor>& scale) {
  const auto v = st.to(Device::cpu()).contiguous().to_double_vector();
  if (!scale) return v;
  const auto sc = scale->to(Device::cpu()).contiguous().to_double_vector();
  const size_t n = v.size() / sc.size();
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = v[i] * sc[i / n];
  return r;
}

TEST(SsuCuda, SingleTokenMatchesCpuAcrossStateDtypesAndSizes) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (DType st : {kF32, DType::kFloat16, kBf, DType::kInt16}) {
    for (int64_t dstate : {16, 64, 96, 128, 256}) {
      Ssu c = make(5, 0, 8, 24, dstate, 2, 9, 200 + dstate, kBf, st == DType::kInt16 ? kF32 : st);
      std::optional<Tensor> scale;
      if (st == DType::kInt16) {
        c.state = rand_tensor({9, 8, 24, dstate}, DType::kInt16, 201, -30000, 30000);
        scale = rand_tensor({9, 8, 24}, kF32, 202, 1e-5, 3e-5);
      }
      Tensor ds = cuda(c.state);
      std::optional<Tensor> dscale = cuda(scale);
      Tensor src = idx({3, 8, -1, 0, 5}), dst = idx({3, 2, 4, 1, 6});
      Tensor oc = selective_state_update(
          c.state, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true, src, -1, scale, std::nullopt,
          false, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 10, 0, "auto", dst);
      Tensor og = selective_state_update(ds, cuda(c.x), cuda(c.dt), cuda(c.A), cuda(c.B), cuda(c.C),
                                         cuda(c.D), cuda(c.z), cuda(c.bias), true, cuda(src), -1,
                                         dscale, std::nullopt, false, std::nullopt, std::nullopt,
                                         std::nullopt, std::nullopt, 10, 0, "auto", cuda(dst));
      const std::string label = std::string(dtype_label(st)) + " " + std::to_string(dstate);
      EXPECT_TRUE(all_close(og.to(Device::cpu()), oc, {2e-2, 2e-2})) << label;
      const Tolerance tol = st == kF32            ? Tolerance{1e-5, 1e-5}
                            : st == DType::kInt16 ? Tolerance{1e-4, 1e-3}
                                                  : default_tolerance(st);
      EXPECT_TRUE(all_close(state_values(ds, dscale), state_values(c.state, scale), tol)) << label;
    }
  }
}

TEST(SsuCuda, MultiTokenAndVarlenMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  // MTP, int16 state with intermediate states and their scales, update on.
  {
    Ssu c = make(3, 4, 4, 16, 128, 1, 6, 210, kBf);
    c.state = rand_tensor({6, 4, 16, 128}, DType::kInt16, 211, -30000, 30000);
    Tensor scale = rand_tensor({6, 4, 16}, kF32, 212, 1e-5, 3e-5);
    Tensor buf = Tensor::zeros({3, 4, 4, 16, 128}, DType::kInt16);
    Tensor bscale = Tensor::zeros({3, 4, 4, 16}, kF32);
    Tensor ds = cuda(c.state), dscale = cuda(scale), dbuf = cuda(buf), dbscale = cuda(bscale);
    Tensor src = idx({5, 1, 3}), ii = idx({2, 0, 1});
    Tensor oc =
        selective_state_update(c.state, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true, src, -1,
                               scale, std::nullopt, false, buf, ii, bscale, std::nullopt, 10, 4);
    Tensor og =
        selective_state_update(ds, cuda(c.x), cuda(c.dt), cuda(c.A), cuda(c.B), cuda(c.C),
                               cuda(c.D), cuda(c.z), cuda(c.bias), true, cuda(src), -1, dscale,
                               std::nullopt, false, dbuf, cuda(ii), dbscale, std::nullopt, 10, 4);
    EXPECT_TRUE(all_close(og.to(Device::cpu()), oc, {2e-2, 2e-2}));
    EXPECT_TRUE(all_close(state_values(ds, dscale), state_values(c.state, scale), {1e-4, 1e-3}));
    EXPECT_TRUE(all_close(state_values(dbuf, dbscale), state_values(buf, bscale), {1e-4, 1e-3}));
  }
  // varlen: sequences of 3, 0, 1 and 4 tokens, accepted-token columns, per-step dst slots.
  {
    Ssu c = make(1, 8, 4, 16, 64, 2, 20, 220, kBf, kBf);
    auto packed = [](const Tensor& t) { return t.select(0, 0); };
    std::vector<double> sv;
    for (int i = 0; i < 16; ++i) sv.push_back(i);
    // Write slots nobody reads (the read slots are 1, 8 and 14), each written by one sequence.
    const std::vector<double> dv = {19, 18, 17, 16, 0, 0, 0, 0, 11, 0, 0, 0, -1, -1, -1, -1};
    Tensor src = Tensor::from_vector(sv, {4, 4}, kI32), dst = Tensor::from_vector(dv, {4, 4}, kI32);
    Tensor na = idx({2, 1, 1, 3}), cu = idx({0, 3, 3, 4, 8});
    Tensor ds = cuda(c.state);
    Tensor oc = selective_state_update(
        c.state, packed(c.x), packed(c.dt), c.A, packed(c.B), packed(c.C), c.D, packed(c.z), c.bias,
        true, src, -1, std::nullopt, std::nullopt, false, std::nullopt, std::nullopt, std::nullopt,
        std::nullopt, 10, 4, "auto", dst, cu, na);
    Tensor og = selective_state_update(
        ds, cuda(packed(c.x)), cuda(packed(c.dt)), cuda(c.A), cuda(packed(c.B)), cuda(packed(c.C)),
        cuda(c.D), cuda(packed(c.z)), cuda(c.bias), true, cuda(src), -1, std::nullopt, std::nullopt,
        false, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 10, 4, "auto", cuda(dst),
        cuda(cu), cuda(na));
    EXPECT_TRUE(all_close(og.to(Device::cpu()), oc, {2e-2, 2e-2}));
    EXPECT_TRUE(all_close(ds.to(Device::cpu()), c.state, default_tolerance(kBf)));
  }
}

TEST(SsuCuda, StochasticRoundingFollowsTheSeed) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  Tensor seed = Tensor::from_vector({20261127}, {1}, DType::kInt64);
  // STP at 2, 4 and 8 values a lane, and MTP's fp16 intermediate states (T = 0: STP).
  for (const auto& shape : {std::pair<int64_t, int64_t>{0, 64}, {0, 128}, {0, 256}, {3, 128}}) {
    const int64_t T = shape.first, dstate = shape.second;  // lambdas below capture them
    Ssu c = make(4, T, 4, 32, dstate, 2, 4, 230 + dstate, kBf, DType::kFloat16);
    auto run = [&](bool gpu) {
      Tensor st = gpu ? cuda(c.state) : c.state.clone();
      std::optional<Tensor> buf;
      if (T > 0) buf = Tensor::zeros({4, T, 4, 32, dstate}, DType::kFloat16, st.device());
      auto dev = [&](const Tensor& t) { return gpu ? cuda(t) : t; };
      (void)selective_state_update(st, dev(c.x), dev(c.dt), dev(c.A), dev(c.B), dev(c.C), dev(c.D),
                                   dev(c.z), dev(c.bias), true, std::nullopt, -1, std::nullopt,
                                   std::nullopt, false, buf, std::nullopt, std::nullopt, dev(seed),
                                   10, T);
      auto v = st.to(Device::cpu()).to_double_vector();
      if (buf) {
        const auto b = buf->to(Device::cpu()).to_double_vector();
        v.insert(v.end(), b.begin(), b.end());
      }
      return v;
    };
    const auto cpu = run(false), g1 = run(true), g2 = run(true);
    EXPECT_EQ(g1, g2) << dstate;  // the seed, not the run, picks the bits
    // The same random bits as the CPU: equal wherever both round the same fp32 value (the fp32
    // values may differ in their last bit: another exp, contracted multiply-adds).
    size_t same = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      same += cpu[i] == g1[i];
      ASSERT_NEAR(g1[i], cpu[i], 2e-3 * std::fabs(cpu[i]) + 1e-6) << dstate << " " << i;
    }
    EXPECT_GE(same, cpu.size() * 99 / 100) << dstate;
  }
}

TEST(SsuCuda, UnalignedStateRowsAndPaddedVarlenMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  // A slot stride of H * P * N + 1 elements: no vector access (the element-by-element path).
  Ssu c = make(3, 0, 2, 16, 64, 1, 4, 250, kBf, kBf);
  const int64_t per_slot = 2 * 16 * 64 + 1;
  Tensor big = rand_tensor({4 * per_slot}, kBf, 251, -1.0, 1.0);
  Tensor st = big.as_strided({4, 2, 16, 64}, {per_slot, 16 * 64, 64, 1}, 0);
  Tensor dbig = cuda(big);
  Tensor dst = dbig.as_strided({4, 2, 16, 64}, {per_slot, 16 * 64, 64, 1}, 0);
  Tensor oc =
      selective_state_update(st, c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.bias, true, idx({3, 0, 1}));
  Tensor og =
      selective_state_update(dst, cuda(c.x), cuda(c.dt), cuda(c.A), cuda(c.B), cuda(c.C), cuda(c.D),
                             cuda(c.z), cuda(c.bias), true, cuda(idx({3, 0, 1})));
  EXPECT_TRUE(all_close(og.to(Device::cpu()), oc, {2e-2, 2e-2}));
  EXPECT_TRUE(all_close(dbig.to(Device::cpu()), big, default_tolerance(kBf)));
  // varlen with a padded sequence (read slot = pad_slot_id): outputs from zeros, no writes.
  Ssu v = make(1, 5, 2, 16, 64, 1, 6, 260, kBf);
  auto packed = [](const Tensor& t) { return t.select(0, 0); };
  Tensor vs = cuda(v.state);
  Tensor src = idx({5, 2}), dsts = Tensor::from_vector({3, 3, 3, 4, 4, 4}, {2, 3}, kI32);
  Tensor cu = idx({0, 2, 5});
  Tensor vc = selective_state_update(v.state, packed(v.x), packed(v.dt), v.A, packed(v.B),
                                     packed(v.C), v.D, packed(v.z), v.bias, true, src, 5,
                                     std::nullopt, std::nullopt, false, std::nullopt, std::nullopt,
                                     std::nullopt, std::nullopt, 10, 3, "auto", dsts, cu);
  Tensor vg = selective_state_update(
      vs, cuda(packed(v.x)), cuda(packed(v.dt)), cuda(v.A), cuda(packed(v.B)), cuda(packed(v.C)),
      cuda(v.D), cuda(packed(v.z)), cuda(v.bias), true, cuda(src), 5, std::nullopt, std::nullopt,
      false, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 10, 3, "auto", cuda(dsts),
      cuda(cu));
  EXPECT_TRUE(all_close(vg.to(Device::cpu()), vc, {2e-2, 2e-2}));
  EXPECT_TRUE(all_close(vs.to(Device::cpu()), v.state, {1e-5, 1e-5}));
}

TEST(SsuCuda, DeviceGuardsWhereTheCpuChecksOnTheHost) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  Ssu c = make(2, 0, 2, 8, 64, 1, 3, 240, kBf);
  Tensor ds = cuda(c.state);
  // Slot 7 is outside the 3-slot cache: NaN outputs for that row, nothing stored anywhere.
  Tensor og = selective_state_update(
      ds, cuda(c.x), cuda(c.dt), cuda(c.A), cuda(c.B), cuda(c.C), cuda(c.D), std::nullopt,
      std::nullopt, false, cuda(idx({7, 1})), -1, std::nullopt, std::nullopt, false, std::nullopt,
      std::nullopt, std::nullopt, std::nullopt, 10, 0, "auto", cuda(idx({1, 9})));
  const auto o = og.to(Device::cpu()).to_double_vector();
  for (size_t i = 0; i < o.size() / 2; ++i) EXPECT_TRUE(std::isnan(o[i])) << i;
  for (size_t i = o.size() / 2; i < o.size(); ++i) EXPECT_FALSE(std::isnan(o[i])) << i;
  EXPECT_EQ(ds.to(Device::cpu()).to_double_vector(), c.state.to_double_vector());
}

// ---- checkpointing_ssu
// ---------------------------------------------------------------------------

constexpr const char* kCkpt = "checkpointing_ssu";

// A ring setup: slots, per-slot ring_start / history counts, T new tokens a row.
struct Ring {
  Ssu c;  // new tokens: c.x [batch, T, ...]; c.state the checkpoints
  int64_t L = 0;
  Tensor x_cache, B_cache, dt_cache, ring_start, pnat;
};
Ring make_ring(int64_t batch, int64_t T, int64_t L, int64_t slots, std::vector<double> starts,
               std::vector<double> hist, uint64_t seed, DType state_dtype = kF32) {
  Ring r;
  r.c = make(batch, T, 4, 8, 32, 2, slots, seed, kBf, state_dtype);
  r.L = L;
  r.x_cache = rand_tensor({slots, 4, L, 8}, kBf, seed + 20);
  r.B_cache = rand_tensor({slots, 2, L, 32}, kBf, seed + 21);
  r.dt_cache = rand_tensor({slots, 4, L}, kF32, seed + 22, 0.0, 1.0);
  r.ring_start = Tensor::from_vector(starts, {slots}, kI32);
  r.pnat = Tensor::from_vector(hist, {slots}, kI32);
  return r;
}

Tensor call_ckpt(Ring& r, const Tensor& out, std::optional<Tensor> sbi = std::nullopt,
                 int64_t pad = -1, std::optional<Tensor> scale = std::nullopt) {
  return checkpointing_ssu(r.c.state, r.x_cache, r.B_cache, r.dt_cache, r.ring_start, r.pnat, r.c.x,
                           r.c.dt, r.c.A, r.c.B, r.c.C, out, r.c.D, r.c.z, r.c.bias, true, sbi, pad,
                           scale);
}

// What checkpointing_ssu must give, from selective_state_update (bit for bit on the CPU): the
// slot's history replayed as single tokens (processed dt, no bias, softplus or D), then the new
// tokens from that state. Returns (outputs [T, heads, dim] of row b, the replayed state).
std::pair<std::vector<double>, std::vector<double>> ckpt_by_ssu(const Ring& r, int64_t b,
                                                                int64_t slot) {
  const int64_t L = r.L, r0 = static_cast<int64_t>(r.ring_start.to_double_vector()[slot]),
                pn = static_cast<int64_t>(r.pnat.to_double_vector()[slot]);
  Tensor st = r.c.state.select(0, slot).unsqueeze(0).to(kF32).clone();  // not a view
  Tensor zeros_D = per_head(Tensor::zeros({4}, kF32), {8});
  for (int64_t i = 0; i < pn; ++i) {
    const int64_t row = (r0 + i) % L;
    Tensor x = r.x_cache.select(0, slot).select(1, row).unsqueeze(0);  // [1, 4, 8]
    Tensor B = r.B_cache.select(0, slot).select(1, row).unsqueeze(0);  // [1, 2, 32]
    Tensor dt = per_head(r.dt_cache.select(0, slot).select(1, row).unsqueeze(0).contiguous(), {8});
    (void)selective_state_update(st, x, dt, r.c.A, B, B, zeros_D);
  }
  const auto H = st.to_double_vector();
  Tensor out = selective_state_update(
      st, r.c.x.select(0, b).unsqueeze(0), r.c.dt.select(0, b).unsqueeze(0), r.c.A,
      r.c.B.select(0, b).unsqueeze(0), r.c.C.select(0, b).unsqueeze(0), r.c.D,
      r.c.z.select(0, b).unsqueeze(0), r.c.bias, true);
  return {out.to_double_vector(), H};
}

TEST(CkptSsu, ReplaysTheRingThenRunsTheNewTokensBitForBitAsSsu) {
  // Slot 0: 5 history rows wrapping the ring (start 6 of 8), 2 new tokens: 7 > W = 6, a flush.
  // Slot 1: 1 history row, no flush (state untouched). Ring length 8, T = 2.
  Ring r = make_ring(2, 2, 8, 2, {6, 3}, {5, 1}, 300);
  const Ring before{r.c,          r.L,   r.x_cache.clone(), r.B_cache.clone(), r.dt_cache.clone(),
                    r.ring_start, r.pnat};
  const Tensor state0 = r.c.state.clone();
  const auto [o0, H0] = ckpt_by_ssu(r, 0, 0);
  const auto [o1, H1] = ckpt_by_ssu(r, 1, 1);
  Tensor out = Tensor::zeros({2, 2, 4, 8}, kBf);
  EXPECT_EQ(call_ckpt(r, out).data_ptr(), out.data_ptr());
  const auto ov = out.to_double_vector();
  const size_t per_row = 2 * 4 * 8;
  EXPECT_EQ(std::vector<double>(ov.begin(), ov.begin() + per_row), o0);
  EXPECT_EQ(std::vector<double>(ov.begin() + per_row, ov.end()), o1);
  EXPECT_EQ(slot_of(r.c.state, 0), H0);                  // flushed: the replayed checkpoint
  EXPECT_EQ(slot_of(r.c.state, 1), slot_of(state0, 1));  // no flush: byte-identical
  // The appends: slot 0's tokens at rows (6 + 5 + t) % 8 = 3, 4; slot 1's at 4, 5.
  const auto dth = r.c.dt_h.to_double_vector(), bias = r.c.bias_h.to_double_vector();
  for (const auto& [b, slot, first] : {std::tuple<int64_t, int64_t, int64_t>{0, 0, 3}, {1, 1, 4}}) {
    for (int64_t t = 0; t < 2; ++t) {
      const int64_t row = first + t;
      EXPECT_EQ(r.x_cache.select(0, slot).select(1, row).contiguous().to_double_vector(),
                r.c.x.select(0, b).select(0, t).contiguous().to_double_vector());
      EXPECT_EQ(r.B_cache.select(0, slot).select(1, row).contiguous().to_double_vector(),
                r.c.B.select(0, b).select(0, t).contiguous().to_double_vector());
      for (int64_t h = 0; h < 4; ++h) {
        const float v = kernels::ssu::softplus(static_cast<float>(dth[(b * 2 + t) * 4 + h]) +
                                               static_cast<float>(bias[h]));
        EXPECT_EQ(r.dt_cache.to_double_vector()[(slot * 4 + h) * 8 + row], v);
      }
    }
  }
  // Every other ring row is untouched (x, B and dt).
  const auto xc = r.x_cache.to_double_vector(), xb = before.x_cache.to_double_vector();
  const auto bcv = r.B_cache.to_double_vector(), bbv = before.B_cache.to_double_vector();
  const auto dcv = r.dt_cache.to_double_vector(), dbv = before.dt_cache.to_double_vector();
  for (int64_t slot : {0, 1}) {
    for (int64_t row = 0; row < 8; ++row) {
      const bool appended = slot == 0 ? (row == 3 || row == 4) : (row == 4 || row == 5);
      if (appended) continue;
      for (int64_t h = 0; h < 4; ++h) {
        for (int64_t d = 0; d < 8; ++d) {
          const size_t i = static_cast<size_t>(((slot * 4 + h) * 8 + row) * 8 + d);
          ASSERT_EQ(xc[i], xb[i]) << slot << " " << row;
        }
        const size_t di = static_cast<size_t>((slot * 4 + h) * 8 + row);
        ASSERT_EQ(dcv[di], dbv[di]) << slot << " " << row;
      }
      for (int64_t gi = 0; gi < 2; ++gi) {
        for (int64_t n = 0; n < 32; ++n) {
          const size_t i = static_cast<size_t>(((slot * 2 + gi) * 8 + row) * 32 + n);
          ASSERT_EQ(bcv[i], bbv[i]) << slot << " " << row;
        }
      }
    }
  }
}

TEST(CkptSsu, VarlenEqualsPerSequenceCallsAndPaddingSkipsTheRow) {
  // Packed rows of 2 and 1 tokens (max_seqlen 2, ring 8: W = 6) through slots 2 and 0, then
  // the same sequences one call each.
  Ring r = make_ring(1, 3, 8, 3, {1, 0, 7}, {6, 0, 2}, 310);
  const Tensor st0 = r.c.state.clone(), xc0 = r.x_cache.clone(), bc0 = r.B_cache.clone(),
               dc0 = r.dt_cache.clone();
  auto packed = [](const Tensor& t) { return t; };  // already [1, 3, ...]
  Tensor out = Tensor::full({1, 3, 4, 8}, 7.0, kBf);
  (void)checkpointing_ssu(r.c.state, r.x_cache, r.B_cache, r.dt_cache, r.ring_start, r.pnat,
                          packed(r.c.x), r.c.dt, r.c.A, r.c.B, r.c.C, out, r.c.D, r.c.z, r.c.bias,
                          true, idx({2, 0}), -1, std::nullopt, std::nullopt, 10, std::nullopt,
                          idx({0, 2, 3}), 2);
  std::vector<double> want;
  Tensor st = st0.clone(), xc = xc0.clone(), bc = bc0.clone(), dc = dc0.clone();
  for (const auto& seq : {std::tuple<int64_t, int64_t, int64_t>{2, 0, 2}, {0, 2, 1}}) {
    const auto [slot, t0, n] = seq;
    const int64_t first = t0, count = n;  // captured by the lambda (not the bindings)
    auto sl = [&](const Tensor& t) { return t.slice(1, first, first + count); };
    Tensor o = Tensor::zeros({1, n, 4, 8}, kBf);
    // A non-varlen call of T = n needs a ring of L = W + n with the same W: ring length 8 - 2 + n.
    // Both calls see W = 6, so the flush rule agrees (slot 2: 2 + 2 <= 6; slot 0: 6 + 1 > 6).
    const int64_t L = 6 + n;
    Tensor xcn = xc.slice(2, 0, L).contiguous(), bcn = bc.slice(2, 0, L).contiguous(),
           dcn = dc.slice(2, 0, L).contiguous();
    (void)checkpointing_ssu(st, xcn, bcn, dcn, r.ring_start.clone(), r.pnat, sl(r.c.x), sl(r.c.dt),
                            r.c.A, sl(r.c.B), sl(r.c.C), o, r.c.D, sl(r.c.z), r.c.bias, true,
                            idx({static_cast<double>(slot)}));
    const auto ov = o.to_double_vector();
    want.insert(want.end(), ov.begin(), ov.end());
  }
  EXPECT_EQ(out.to_double_vector(), want);
  EXPECT_EQ(slot_of(r.c.state, 0), slot_of(st, 0));   // slot 0 flushed in both
  EXPECT_EQ(slot_of(r.c.state, 2), slot_of(st0, 2));  // slot 2 did not
  // The appended rows of slot 2 (the same ring length in both calls): rows (1 + 6 + t) % 8.
  for (int64_t row : {7, 0}) {
    EXPECT_EQ(r.x_cache.select(0, 2).select(1, row).contiguous().to_double_vector(),
              xc.select(0, 2).select(1, row).contiguous().to_double_vector())
        << row;
    EXPECT_EQ(r.B_cache.select(0, 2).select(1, row).contiguous().to_double_vector(),
              bc.select(0, 2).select(1, row).contiguous().to_double_vector())
        << row;
  }
  // Padding: the row is skipped whole (its outputs keep their values; its slot, a real one, and
  // that slot's ring rows are untouched).
  Ring q = make_ring(2, 1, 4, 2, {0, 0}, {1, 1}, 320);
  const Tensor qx = q.x_cache.clone(), qb = q.B_cache.clone(), qd = q.dt_cache.clone(),
               qs = q.c.state.clone();
  Tensor qo = Tensor::full({2, 1, 4, 8}, 5.0, kBf);
  (void)call_ckpt(q, qo, idx({1, 0}), 0);
  const auto qv = qo.to_double_vector();
  for (size_t i = 32; i < 64; ++i) EXPECT_EQ(qv[i], 5.0) << i;
  EXPECT_EQ(slot_of(q.x_cache, 0), slot_of(qx, 0));
  EXPECT_EQ(slot_of(q.B_cache, 0), slot_of(qb, 0));
  EXPECT_EQ(slot_of(q.dt_cache, 0), slot_of(qd, 0));
  EXPECT_EQ(slot_of(q.c.state, 0), slot_of(qs, 0));
  EXPECT_NE(slot_of(q.x_cache, 1), slot_of(qx, 1));  // the real row appended
}

TEST(CkptSsu, EightBitStatesFlushWithTheirScales) {
  for (DType dt : {DType::kInt8, DType::kFloat8E4M3FN}) {
    Ring r = make_ring(1, 2, 8, 1, {0}, {6}, 330);
    const double qmax = dt == DType::kInt8 ? 127.0 : 448.0;
    // The checkpoint as 8-bit codes with scales, and its fp32 value for the reference.
    Tensor scale = rand_tensor({1, 4, 8}, kF32, 331, 0.005, 0.01);
    const auto sc = scale.to_double_vector();
    std::vector<double> codes, vals;
    const auto s0 = r.c.state.to_double_vector();
    for (size_t i = 0; i < s0.size(); ++i) {
      const double q =
          dt == DType::kInt8
              ? std::round(s0[i] * 100.0)
              : e4m3fn_bits_to_float(float_to_e4m3fn_bits(static_cast<float>(s0[i] * 100.0), true));
      codes.push_back(q);
      vals.push_back(static_cast<float>(q) * static_cast<float>(sc[i / 32]));
    }
    Tensor q8 = Tensor::from_vector(codes, {1, 4, 8, 32}, dt);
    r.c.state = Tensor::from_vector(vals, {1, 4, 8, 32}, kF32);
    const auto [o_ref, H] = ckpt_by_ssu(r, 0, 0);
    r.c.state = q8;
    Tensor out = Tensor::zeros({1, 2, 4, 8}, kBf);
    (void)call_ckpt(r, out, std::nullopt, -1, scale);
    EXPECT_EQ(out.to_double_vector(), o_ref) << dtype_label(dt);  // outputs from fp32 H
    const auto got = state_values(q8, scale), ns = scale.to_double_vector();
    for (int64_t r8 = 0; r8 < 32; ++r8) {
      double amax = 0.0;
      for (int64_t n = 0; n < 32; ++n) amax = std::max(amax, std::fabs(H[r8 * 32 + n]));
      EXPECT_NEAR(ns[r8], amax / qmax, amax / qmax * 1e-6) << r8;
      for (int64_t n = 0; n < 32; ++n) {
        ASSERT_NEAR(got[r8 * 32 + n], H[r8 * 32 + n],
                    amax / qmax * (dt == DType::kInt8 ? 0.51 : 16.1))
            << dtype_label(dt) << " " << r8 << " " << n;
      }
    }
  }
}

TEST(CkptSsuBadInput, ErrorsNameOpAndArgument) {
  Ring r = make_ring(2, 2, 8, 2, {0, 0}, {1, 1}, 340);
  Tensor out = Tensor::zeros({2, 2, 4, 8}, kBf);
  auto with = [&](Ring& q, std::optional<int64_t> d_split, std::string algorithm,
                  std::optional<Tensor> seed = std::nullopt) {
    return checkpointing_ssu(q.c.state, q.x_cache, q.B_cache, q.dt_cache, q.ring_start, q.pnat,
                             q.c.x, q.c.dt, q.c.A, q.c.B, q.c.C, out, q.c.D, std::nullopt, q.c.bias,
                             true, std::nullopt, -1, std::nullopt, seed, 10, d_split, std::nullopt,
                             std::nullopt, false, std::nullopt, std::nullopt, std::nullopt, 0,
                             algorithm);
  };
  EXPECT_NO_THROW(with(r, 1, "monolith"));
  EXPECT_FI_ERROR(with(r, 3, "auto"), kCkpt, "d_split");
  EXPECT_FI_ERROR(with(r, std::nullopt, "fast"), kCkpt, "algorithm");
  EXPECT_FI_ERROR(with(r, std::nullopt, "two-kernel"), kCkpt, "algorithm");
  Ring big = make_ring(2, 2, 20, 2, {0, 0}, {1, 1}, 341);  // W = 18 > 16
  EXPECT_FI_ERROR(with(big, std::nullopt, "auto"), kCkpt, "x_cache");
  Ring tight = make_ring(2, 2, 3, 2, {0, 0}, {0, 0}, 342);  // W = 1 < T
  EXPECT_FI_ERROR(with(tight, std::nullopt, "auto"), kCkpt, "x");
  Ring bad_start = make_ring(2, 2, 8, 2, {0, 8}, {1, 1}, 343);
  EXPECT_FI_ERROR(with(bad_start, std::nullopt, "auto"), kCkpt, "ring_start");
  Ring bad_hist = make_ring(2, 2, 8, 2, {0, 0}, {1, 7}, 344);  // W = 6
  EXPECT_FI_ERROR(with(bad_hist, std::nullopt, "auto"), kCkpt, "prev_num_accepted_tokens");
  Ring q8 = make_ring(2, 2, 8, 2, {0, 0}, {1, 1}, 345);
  q8.c.state = Tensor::zeros({2, 4, 8, 32}, DType::kInt8);
  EXPECT_FI_ERROR(with(q8, std::nullopt, "auto"), kCkpt, "state_scale");
  Ring f16 = make_ring(2, 2, 8, 2, {0, 0}, {1, 1}, 346, DType::kFloat16);
  EXPECT_NO_THROW(with(f16, std::nullopt, "auto", Tensor::from_vector({3}, {1}, DType::kInt64)));
  EXPECT_FI_ERROR(checkpointing_ssu(r.c.state, r.x_cache, r.B_cache, r.dt_cache, r.ring_start,
                                    r.pnat, r.c.x, r.c.dt, r.c.A, r.c.B, r.c.C, out, r.c.D,
                                    std::nullopt, std::nullopt, false, std::nullopt, -1,
                                    std::nullopt, std::nullopt, 10, std::nullopt, std::nullopt, 2),
                  kCkpt, "max_seqlen");  // only with cu_seqlens
}

TEST(CkptSsuDecl, SignatureModule) {
  const OpDecl* decl = OpRegistry::global().find(kCkpt);
  ASSERT_NE(decl, nullptr);
  EXPECT_EQ(decl->module, "flashinfer.mamba.checkpointing_ssu");
  EXPECT_EQ(decl->signature(),
            "(state, x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens, x, dt, A, "
            "B, C, out, D=None, z=None, dt_bias=None, dt_softplus=False, "
            "state_batch_indices=None, pad_slot_id=-1, state_scale=None, rand_seed=None, "
            "philox_rounds=10, d_split=None, cu_seqlens=None, max_seqlen=None, "
            "enable_pdl=False, cb_scaled=None, cumAdt_vec=None, cb_old=None, "
            "precompute_heads_per_cta=0, algorithm='auto')");
}

void run_ckpt_calls() {
  Ring r = make_ring(2, 2, 8, 3, {6, 0, 2}, {5, 0, 3}, 350, DType::kFloat16);
  Tensor out = Tensor::zeros({2, 2, 4, 8}, kBf);
  (void)checkpointing_ssu(r.c.state, r.x_cache, r.B_cache, r.dt_cache, r.ring_start, r.pnat, r.c.x,
                          r.c.dt, r.c.A, r.c.B, r.c.C, out, r.c.D, r.c.z, r.c.bias, true,
                          idx({0, 2}), -1, std::nullopt,
                          Tensor::from_vector({77}, {1}, DType::kInt64));
}

TEST(CkptSsuReplay, RecordAndReplay) {
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    run_ckpt_calls();
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_TRUE(replays_identically(calls[0]));
  EXPECT_EQ(dump_replay_all("ckpt", run_ckpt_calls), 1);
}

TEST(CkptSsuCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (DType dt : {kF32, kBf, DType::kInt8}) {
    Ring r =
        make_ring(3, 3, 12, 4, {10, 0, 5, 2}, {7, 2, 9, 0}, 360, dt == DType::kInt8 ? kF32 : dt);
    std::optional<Tensor> scale;
    if (dt == DType::kInt8) {
      r.c.state = rand_tensor({4, 4, 8, 32}, DType::kInt8, 361, -120, 120);
      scale = rand_tensor({4, 4, 8}, kF32, 362, 0.005, 0.01);
    }
    // A bf16 dt beside fp32 D and dt_bias (upstream: dt of any dtype, widened in the kernel):
    // read in its own dtype, with no host round trip (the call stays capturable).
    if (dt == kBf) r.c.dt = r.c.dt.to(kBf);
    Ring g = r;
    g.c.state = cuda(r.c.state);
    g.x_cache = cuda(r.x_cache), g.B_cache = cuda(r.B_cache), g.dt_cache = cuda(r.dt_cache);
    std::optional<Tensor> gscale = cuda(scale);
    Tensor oc = Tensor::zeros({3, 3, 4, 8}, kBf), og = cuda(oc);
    // Slot 1 keeps its 2-token history (no flush), slots 0 and 2 flush.
    Tensor sbi = idx({1, 0, 2});
    (void)call_ckpt(r, oc, sbi, -1, scale);
    (void)checkpointing_ssu(g.c.state, g.x_cache, g.B_cache, g.dt_cache, cuda(r.ring_start),
                            cuda(r.pnat), cuda(r.c.x), cuda(r.c.dt), cuda(r.c.A), cuda(r.c.B),
                            cuda(r.c.C), og, cuda(r.c.D), cuda(r.c.z), cuda(r.c.bias), true,
                            cuda(sbi), -1, gscale);
    EXPECT_TRUE(all_close(og.to(Device::cpu()), oc, {2e-2, 2e-2})) << dtype_label(dt);
    EXPECT_TRUE(all_close(state_values(g.c.state, gscale), state_values(r.c.state, scale),
                          dt == DType::kInt8 ? Tolerance{2e-2, 2e-2} : Tolerance{1e-2, 1e-2}))
        << dtype_label(dt);
    EXPECT_EQ(g.x_cache.to(Device::cpu()).to_double_vector(), r.x_cache.to_double_vector());
    EXPECT_EQ(g.B_cache.to(Device::cpu()).to_double_vector(), r.B_cache.to_double_vector());
    EXPECT_TRUE(all_close(g.dt_cache.to(Device::cpu()), r.dt_cache, {1e-6, 1e-5}));
  }
}

}  // namespace
}  // namespace flashinfer::testing
