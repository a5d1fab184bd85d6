// gdn_fused_decode_step (flashinfer.gdn_kernels.experimental.gdn_fused_decode): an fp64
// composition of upstream's composable path, bit-for-bit equality with its parts (the b/a GEMV
// and conv written out here, then gated_delta_rule_decode_pretranspose), the conv pool's shift
// (hand-checked, shared slots as index_copy_ leaves them), SD and DS pools, `out`, the scale's
// None / 0, bad inputs, upstream's routing probe, record / replay, and CUDA against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "api/device_props.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

#if FLASHINFER_TEST_HAVE_CUDART
#include "util/cuda_graph_util.h"
#endif

namespace flashinfer::testing {
namespace {

constexpr DType kBf = DType::kBFloat16;
constexpr DType kF32 = DType::kFloat32;

float bf(double x) { return bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(x))); }

// One call's inputs: B requests, HV value heads over Hq q / k heads of D, conv width W, pools of
// P slots. The conv pool is an SD pool's transpose (vLLM's) unless `ds`.
struct FusedIn {
  int64_t B, hidden, Hq, HV, D, W, P;
  Tensor hs, w_ba, x, cw, cb, conv, A_log, dt, ssm, idx;
  int64_t qkv() const { return (2 * Hq + HV) * D; }
};

FusedIn fused_inputs(int64_t B, int64_t hidden, int64_t Hq, int64_t HV, int64_t D, int64_t P,
                     std::vector<int64_t> slots, uint64_t seed, bool ds = false, int64_t W = 4) {
  FusedIn in{B, hidden, Hq, HV, D, W, P, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  const int64_t qkv = in.qkv();
  in.hs = rand_tensor({B, hidden}, kBf, seed, -1.0, 1.0);
  in.w_ba = rand_tensor({hidden, 2 * HV}, kBf, seed + 1, -0.3, 0.3);
  in.x = rand_tensor({B, qkv}, kBf, seed + 2);
  in.cw = rand_tensor({qkv, W}, kBf, seed + 3, -0.6, 0.6);
  in.cb = rand_tensor({qkv}, kBf, seed + 4, -0.2, 0.2);
  in.conv = ds ? rand_tensor({P, qkv, W - 1}, kBf, seed + 5)
               : rand_tensor({P, W - 1, qkv}, kBf, seed + 5).transpose(1, 2);
  in.A_log = rand_tensor({HV}, kF32, seed + 6, -1.0, 0.5);
  in.dt = rand_tensor({HV}, kBf, seed + 7, -0.5, 0.5);
  in.ssm = rand_tensor({P, HV, D, D}, kF32, seed + 8, -0.5, 0.5);
  std::vector<double> s(slots.begin(), slots.end());
  in.idx = Tensor::from_vector(s, {B}, DType::kInt32);
  return in;
}

// A copy of the pools (the op updates them in place).
FusedIn fresh_pools(const FusedIn& in) {
  FusedIn c = in;
  // An SD pool is the transpose of dense [P, W - 1, qkv] rows: the copy keeps that layout.
  c.conv =
      in.conv.is_contiguous() ? in.conv.clone() : in.conv.transpose(1, 2).clone().transpose(1, 2);
  c.ssm = in.ssm.clone();
  return c;
}

std::tuple<Tensor, Tensor, Tensor> run(const FusedIn& in, std::optional<double> scale = {},
                                       std::optional<Tensor> out = {}, bool l2 = true) {
  return gdn_fused_decode_step(in.hs, in.w_ba, in.x, in.cw, in.cb, in.conv, in.A_log, in.dt, scale,
                               in.ssm, in.idx, l2, out);
}

// Element `ix` of a CPU tensor of any layout.
double val(const Tensor& t, std::vector<int64_t> ix) {
  Tensor s = t;
  for (int64_t i : ix) s = s.select(0, i);
  return s.to_double_vector()[0];
}

// ---- fp64 composition of upstream's composable path ---------------------------------------------

struct RefOut {
  std::vector<double> out;                     // [B, HV, D]
  std::map<int64_t, std::vector<double>> ssm;  // slot -> [HV, V, K] after the call
};

RefOut reference(const FusedIn& in, double scale, bool l2) {
  const int64_t B = in.B, HV = in.HV, Hq = in.Hq, D = in.D, W = in.W, qkv = in.qkv();
  RefOut r;
  r.out.assign(static_cast<size_t>(B * HV * D), 0.0);
  const auto slots = in.idx.to_double_vector();
  for (int64_t b = 0; b < B; ++b) {
    const auto slot = static_cast<int64_t>(slots[b]);
    std::vector<double> ba(static_cast<size_t>(2 * HV));
    for (int64_t j = 0; j < 2 * HV; ++j) {
      double acc = 0.0;
      for (int64_t i = 0; i < in.hidden; ++i) acc += val(in.hs, {b, i}) * val(in.w_ba, {i, j});
      ba[j] = bf(acc);
    }
    std::vector<double> co(static_cast<size_t>(qkv));
    for (int64_t c = 0; c < qkv; ++c) {
      double y = 0.0;
      for (int64_t t = 0; t < W - 1; ++t) y += val(in.conv, {slot, c, t}) * val(in.cw, {c, t});
      y += val(in.x, {b, c}) * val(in.cw, {c, W - 1}) + val(in.cb, {c});
      co[c] = bf(y / (1.0 + std::exp(-y)));
    }
    auto head = [&](int64_t base, bool norm) {
      std::vector<double> h(co.begin() + base, co.begin() + base + D);
      if (!norm) return h;
      double ss = 0.0;
      for (double e : h) ss += e * e;
      for (double& e : h) e /= std::sqrt(ss + 1e-6);
      return h;
    };
    std::vector<double>& st = r.ssm[slot];
    if (st.empty()) {
      st.resize(static_cast<size_t>(HV * D * D));
      for (int64_t h = 0; h < HV; ++h) {
        for (int64_t v = 0; v < D; ++v) {
          for (int64_t k = 0; k < D; ++k) st[(h * D + v) * D + k] = val(in.ssm, {slot, h, v, k});
        }
      }
    }
    for (int64_t h = 0; h < HV; ++h) {
      const int64_t qh = h / (HV / Hq);
      const auto q = head(qh * D, l2), k = head((Hq + qh) * D, l2),
                 v = head(2 * Hq * D + h * D, false);
      const double a = ba[HV + h], bb = ba[h];
      const double x = a + val(in.dt, {h});
      const double sp = x <= 20.0 ? std::log1p(std::exp(x)) : x;
      const double g = std::exp(-std::exp(val(in.A_log, {h})) * sp);
      const double beta = 1.0 / (1.0 + std::exp(-bb));
      for (int64_t vv = 0; vv < D; ++vv) {
        double* row = &st[(h * D + vv) * D];
        double pred = 0.0;
        for (int64_t kk = 0; kk < D; ++kk) {
          row[kk] *= g;
          pred += row[kk] * k[kk];
        }
        const double u = beta * (v[vv] - pred);
        double o = 0.0;
        for (int64_t kk = 0; kk < D; ++kk) {
          row[kk] += u * k[kk];
          o += row[kk] * q[kk];
        }
        r.out[(b * HV + h) * D + vv] = scale * o;
      }
    }
  }
  return r;
}

TEST(GdnFusedDecode, MatchesAnFp64CompositionOfUpstreamsPath) {
  for (bool l2 : {true, false}) {
    // GVA 2 -> 6 value heads, D 16, a 40-wide hidden state, requests in slots 4, 0 and 2 of 5.
    const FusedIn in = fused_inputs(3, 40, 2, 6, 16, 5, {4, 0, 2}, 11);
    const FusedIn c = fresh_pools(in);
    const RefOut ref = reference(in, 0.3, l2);
    auto [o, conv, ssm] = run(c, 0.3, std::nullopt, l2);
    ASSERT_EQ(o.shape(), (Shape{3, 1, 6, 16}));
    EXPECT_EQ(o.dtype(), kBf);
    EXPECT_EQ(conv.data_ptr(), c.conv.data_ptr());
    EXPECT_EQ(ssm.data_ptr(), c.ssm.data_ptr());
    EXPECT_TRUE(all_close(o, ref.out, default_tolerance(kBf))) << l2;
    for (const auto& [slot, st] : ref.ssm) {
      EXPECT_TRUE(all_close(ssm.select(0, slot), st, {2e-3, 2e-3})) << slot;
    }
    // Slots 1 and 3 are nobody's: untouched.
    for (int64_t s : {1, 3}) {
      EXPECT_TRUE(all_close(ssm.select(0, s), in.ssm.select(0, s), {0.0, 0.0}));
      EXPECT_TRUE(all_close(conv.select(0, s), in.conv.select(0, s), {0.0, 0.0}));
    }
  }
}

// The conv pool's rows shift left by one and take the raw input: [s0, s1, s2] -> [s1, s2, x],
// exactly. Two requests sharing a slot both read the row as it was, and the slot keeps the last
// one's window (upstream gathers before its index_copy_), not a row shifted twice.
TEST(GdnFusedDecode, ConvRowsShiftAndSharedSlotsKeepTheLastWindow) {
  const FusedIn in = fused_inputs(3, 16, 1, 2, 8, 4, {2, 0, 2}, 21);
  const FusedIn c = fresh_pools(in);
  auto [o, conv, ssm] = run(c);
  const int64_t qkv = in.qkv();
  for (int64_t ch = 0; ch < qkv; ++ch) {
    EXPECT_EQ(val(conv, {0, ch, 0}), val(in.conv, {0, ch, 1}));
    EXPECT_EQ(val(conv, {0, ch, 1}), val(in.conv, {0, ch, 2}));
    EXPECT_EQ(val(conv, {0, ch, 2}), val(in.x, {1, ch}));
    EXPECT_EQ(val(conv, {2, ch, 0}), val(in.conv, {2, ch, 1}));
    EXPECT_EQ(val(conv, {2, ch, 1}), val(in.conv, {2, ch, 2}));
    EXPECT_EQ(val(conv, {2, ch, 2}), val(in.x, {2, ch}));  // request 2's window, from the old row
  }
  // Requests 0 and 2 share slot 2 and read the same old row: request 0's output equals that of a
  // call that has request 0 alone.
  // Request r of `in` alone, on fresh copies of the pools.
  auto only = [&](int64_t r) {
    FusedIn one = fresh_pools(in);
    one.B = 1;
    one.hs = in.hs.slice(0, r, r + 1);
    one.x = in.x.slice(0, r, r + 1);
    one.idx = in.idx.slice(0, r, r + 1);
    return run(one);
  };
  auto [o1, conv1, ssm1] = only(0);
  EXPECT_TRUE(all_close(o.slice(0, 0, 1), o1, {0.0, 0.0}));
  // So does request 2 (from the slot's state as it was, not request 0's), and the slot keeps
  // the last request's state.
  auto [o2, conv2, ssm2] = only(2);
  EXPECT_TRUE(all_close(o.slice(0, 2, 3), o2, {0.0, 0.0}));
  EXPECT_TRUE(all_close(ssm.select(0, 2), ssm2.select(0, 2), {0.0, 0.0}));
  EXPECT_TRUE(all_close(conv.select(0, 2), conv2.select(0, 2), {0.0, 0.0}));
}

// The op is its parts: ba and the conv output written out here in the CPU reference's order,
// then gated_delta_rule_decode_pretranspose on them. With D 16 the default scale is 1/4, a power
// of two, so scaling q (pretranspose) and scaling the output (this op) round alike: bit for bit.
TEST(GdnFusedDecode, EqualsItsPartsBitForBit) {
  const FusedIn in = fused_inputs(4, 48, 2, 4, 16, 6, {5, 1, 3, 0}, 31);
  const int64_t B = in.B, HV = in.HV, Hq = in.Hq, D = in.D, W = in.W, qkv = in.qkv();
  Tensor ba = Tensor::empty({B, 2 * HV}, kBf), co = Tensor::empty({B, qkv}, kBf);
  const auto slots = in.idx.to_double_vector();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < 2 * HV; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < in.hidden; ++i) {
        acc += static_cast<float>(val(in.hs, {b, i})) * static_cast<float>(val(in.w_ba, {i, j}));
      }
      ba.data<uint16_t>()[b * 2 * HV + j] = float_to_bfloat16_bits(acc);
    }
    const auto slot = static_cast<int64_t>(slots[b]);
    for (int64_t c = 0; c < qkv; ++c) {
      float y = 0.0f;
      for (int64_t t = 0; t < W - 1; ++t) {
        y +=
            static_cast<float>(val(in.conv, {slot, c, t})) * static_cast<float>(val(in.cw, {c, t}));
      }
      y += static_cast<float>(val(in.x, {b, c})) * static_cast<float>(val(in.cw, {c, W - 1}));
      y += static_cast<float>(val(in.cb, {c}));
      y = y * (1.0f / (1.0f + std::exp(-y)));
      co.data<uint16_t>()[b * qkv + c] = float_to_bfloat16_bits(y);
    }
  }
  const Tensor q = co.slice(1, 0, Hq * D).reshape({B, 1, Hq, D});
  const Tensor k = co.slice(1, Hq * D, 2 * Hq * D).reshape({B, 1, Hq, D});
  const Tensor v = co.slice(1, 2 * Hq * D, qkv).reshape({B, 1, HV, D});
  const Tensor bgate = ba.slice(1, 0, HV).reshape({B, 1, HV});
  const Tensor agate = ba.slice(1, HV, 2 * HV).reshape({B, 1, HV});
  Tensor pool = in.ssm.clone();
  auto [o_parts, s_parts] =
      gated_delta_rule_decode_pretranspose(q, k, v, std::nullopt, in.A_log, agate, in.dt, bgate,
                                           std::nullopt, std::nullopt, true, pool, in.idx);
  const FusedIn c = fresh_pools(in);
  auto [o, conv, ssm] = run(c);
  EXPECT_TRUE(all_close(o, o_parts, {0.0, 0.0}));
  EXPECT_TRUE(all_close(ssm, pool, {0.0, 0.0}));
}

// SD and DS pools hold the same logical rows: the same results, bit for bit. `out` is written
// and returned; None, 0 and D^-0.5 are one scale; int64 indices read as int32 ones.
TEST(GdnFusedDecode, PoolLayoutsOutScaleAndIndexTypesAgree) {
  const FusedIn sd = fused_inputs(2, 32, 1, 2, 16, 3, {2, 0}, 41);
  FusedIn ds = fresh_pools(sd);
  ds.conv = sd.conv.contiguous();  // [P, qkv, W - 1] rows: DS
  ASSERT_NE(ds.conv.stride(2), sd.conv.stride(2));
  const FusedIn a = fresh_pools(sd);
  auto [o1, c1, s1] = run(a);
  auto [o2, c2, s2] = run(ds);
  EXPECT_TRUE(all_close(o1, o2, {0.0, 0.0}));
  EXPECT_TRUE(all_close(c1, c2, {0.0, 0.0}));
  EXPECT_TRUE(all_close(s1, s2, {0.0, 0.0}));
  for (std::optional<double> scale : {std::optional<double>(0.0), std::optional<double>(0.25)}) {
    FusedIn b = fresh_pools(sd);
    Tensor out = Tensor::full({2, 1, 2, 16}, 7.0, kBf);
    auto [o3, c3, s3] = run(b, scale, out);
    EXPECT_EQ(o3.data_ptr(), out.data_ptr());
    EXPECT_TRUE(all_close(out, o1, {0.0, 0.0}));
  }
  FusedIn wide = fresh_pools(sd);
  wide.idx = sd.idx.to(DType::kInt64);
  auto [o4, c4, s4] = run(wide);
  EXPECT_TRUE(all_close(o4, o1, {0.0, 0.0}));
  FusedIn other = fresh_pools(sd);  // another scale changes the output
  auto [o5, c5, s5] = run(other, 0.5);
  EXPECT_FALSE(all_close(o5, o1, {0.0, 0.0}));
}

TEST(GdnFusedDecode, BadInputNamesOpAndArgument) {
  const FusedIn in = fused_inputs(2, 16, 1, 2, 8, 3, {0, 2}, 51);
  const char* op = "gdn_fused_decode_step";
  auto call = [&](FusedIn c) { return run(c); };
  FusedIn c = in;
  c.hs = in.hs.to(DType::kFloat16);
  EXPECT_FI_ERROR(call(c), op, "hidden_states");
  c = in;
  c.w_ba = rand_tensor({16, 6}, kBf, 1);
  EXPECT_FI_ERROR(call(c), op, "w_ba");
  c = in;
  c.x = rand_tensor({2, 4 * 8 + 3}, kBf, 1);  // not (2 H_q + HV) D
  EXPECT_FI_ERROR(call(c), op, "mixed_qkv");
  c = in;
  c.cw = rand_tensor({in.qkv(), 3}, kBf, 1);  // width 3 against a pool of 3 steps
  EXPECT_FI_ERROR(call(c), op, "conv_state");
  c = in;
  c.cb = rand_tensor({in.qkv() - 1}, kBf, 1);
  EXPECT_FI_ERROR(call(c), op, "conv_bias");
  c = in;
  c.conv = rand_tensor({4, in.qkv(), 3}, kBf, 1);  // 4 slots against the ssm pool's 3
  EXPECT_FI_ERROR(call(c), op, "conv_state");
  c = in;
  c.A_log = in.A_log.to(kBf);
  EXPECT_FI_ERROR(call(c), op, "A_log");
  c = in;
  c.ssm = rand_tensor({3, 2, 8, 8}, kF32, 1).transpose(2, 3);  // not K-contiguous
  EXPECT_FI_ERROR(call(c), op, "ssm_state");
  c = in;
  c.ssm = rand_tensor({3, 2, 8, 8}, kBf, 1);
  EXPECT_FI_ERROR(call(c), op, "ssm_state");
  c = in;
  c.idx = Tensor::from_vector({0, 3}, {2}, DType::kInt32);  // outside the pool of 3
  EXPECT_FI_ERROR(call(c), op, "state_indices");
  c = in;
  c.idx = Tensor::from_vector({0, -1}, {2}, DType::kInt32);  // upstream's index_select refuses
  EXPECT_FI_ERROR(call(c), op, "state_indices");
  c = in;
  c.idx = Tensor::from_vector({0, 1, 2}, {3}, DType::kInt32);
  EXPECT_FI_ERROR(call(c), op, "state_indices");
  EXPECT_FI_ERROR(run(in, std::nullopt, Tensor::empty({2, 2, 8}, kBf)), op, "out");
  EXPECT_FI_ERROR(run(in, std::nullopt, Tensor::empty({2, 1, 2, 8}, kF32)), op, "out");
}

// Upstream's probe answers from its registry of SM120 kernels: false on every other device and
// for every geometry it does not list; a bad layout or a non-CUDA device is false, not an error.
TEST(GdnFusedDecodeSupported, AnswersAsUpstreamsRegistry) {
  EXPECT_FALSE(gdn_fused_decode_step_supported(1, 5120, 96, 10240, 16, 48, 128, 4, 3,
                                               Value(std::string("cpu"))));
  EXPECT_FALSE(
      gdn_fused_decode_step_supported(1, 5120, 96, 10240, 16, 48, 128, 4, 3, std::nullopt, "XY"));
  EXPECT_FALSE(gdn_fused_decode_step_supported(1, 5120, 96, 10240, 16, 48, 128, 4, 3, Value(99)));
  const int cc = cuda_device_count() > 0 ? api::compute_capability(Device::cuda(0)) : 0;
  const bool sm120 = cc == 120 || cc == 121;
  // Registered: Qwen3.6-27B at batches 1, 2, 4, 8; Qwen3.6-35B-A3B at 1, 2, 4 ("SD" only).
  EXPECT_EQ(gdn_fused_decode_step_supported(8), sm120);
  EXPECT_EQ(gdn_fused_decode_step_supported(4, 2048, 64, 8192, 16, 32), sm120);
  EXPECT_FALSE(gdn_fused_decode_step_supported(8, 2048, 64, 8192, 16, 32));
  EXPECT_FALSE(gdn_fused_decode_step_supported(3));
  EXPECT_FALSE(gdn_fused_decode_step_supported(16));
  EXPECT_FALSE(
      gdn_fused_decode_step_supported(1, 5120, 96, 10240, 16, 48, 128, 4, 3, std::nullopt, "DS"));
  EXPECT_FALSE(gdn_fused_decode_step_supported(1, 4096));
}

TEST(GdnFusedDecodeReplay, DumpsReplay) {
  const int n = dump_replay_all("gdnfused", [] {
    const FusedIn in = fused_inputs(2, 24, 1, 2, 16, 4, {3, 1}, 61);
    (void)run(fresh_pools(in), 0.2);
    (void)gdn_fused_decode_step_supported(2, 2048, 64, 8192, 16, 32, 128, 4, 3, std::nullopt, "SD");
  });
  EXPECT_EQ(n, 2);
}

// ---- CUDA
// ----------------------------------------------------------------------------------------

Tensor cuda(const Tensor& t) { return to_keep_layout(t, Device::cuda(0)); }

FusedIn on_cuda(const FusedIn& in) {
  FusedIn c = in;
  for (Tensor* t : {&c.hs, &c.w_ba, &c.x, &c.cw, &c.cb, &c.conv, &c.A_log, &c.dt, &c.ssm, &c.idx}) {
    *t = cuda(*t);
  }
  return c;
}

TEST(GdnFusedDecodeCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t B, hidden, Hq, HV, D, P;
    std::vector<int64_t> slots;
    bool ds;
  };
  // Qwen3.6-35B-A3B's layer at batch 3 (SD pool), a small GQA one with a DS pool, D 64 with a
  // hidden size that is not a multiple of the GEMV's slices; the last case shares slot 2 between
  // requests 0 and 2. Only the conv pool is defined there on CUDA (the window kernel lets the
  // slot's last request write); the recurrence's state rows, and so the outputs, are written by
  // both requests in no set order, as upstream's kernels leave them: not compared.
  for (const Case& k :
       {Case{3, 2048, 16, 32, 128, 4, {3, 0, 1}, false},
        Case{5, 64, 2, 4, 16, 8, {7, 2, 4, 0, 5}, true}, Case{2, 203, 1, 3, 64, 3, {1, 2}, false},
        Case{3, 40, 1, 2, 32, 3, {2, 0, 2}, false}}) {
    const FusedIn in = fused_inputs(k.B, k.hidden, k.Hq, k.HV, k.D, k.P, k.slots, 71 + k.D, k.ds);
    const FusedIn c = fresh_pools(in);
    const FusedIn g = on_cuda(fresh_pools(in));
    auto [oc, cc, sc] = run(c);
    auto [og, cg, sg] = run(g);
    const bool shared = std::set<int64_t>(k.slots.begin(), k.slots.end()).size() < k.slots.size();
    EXPECT_TRUE(all_close(cg.to(Device::cpu()), cc, {0.0, 0.0})) << k.D;  // copies: exact
    if (shared) continue;
    EXPECT_TRUE(all_close(og.to(Device::cpu()), oc, {1e-3, 1.6e-2})) << k.D;
    EXPECT_TRUE(all_close(sg.to(Device::cpu()), sc, {1e-3, 1e-3})) << k.D;
  }
  {  // D 512 is refused before the conv pool is shifted
    const FusedIn big = fused_inputs(1, 16, 1, 1, 512, 2, {1}, 91);
    const FusedIn g = on_cuda(fresh_pools(big));
    EXPECT_FI_ERROR(run(g), "gdn_fused_decode_step", "ssm_state");
    EXPECT_TRUE(all_close(g.conv.to(Device::cpu()), big.conv, {0.0, 0.0}));
  }
  // A slot outside the pool (not checked on the host for device indices): NaN outputs for that
  // request, neither pool touched there.
  const FusedIn in = fused_inputs(2, 32, 1, 2, 16, 3, {9, 1}, 81);
  const FusedIn g = on_cuda(fresh_pools(in));
  auto [og, cg, sg] = run(g);
  const Tensor o = og.to(Device::cpu());
  for (double x : o.slice(0, 0, 1).to_double_vector()) EXPECT_TRUE(std::isnan(x));
  for (double x : o.slice(0, 1, 2).to_double_vector()) EXPECT_FALSE(std::isnan(x));
  for (int64_t s : {0, 2}) {
    EXPECT_TRUE(all_close(cg.to(Device::cpu()).select(0, s), in.conv.select(0, s), {0.0, 0.0}));
    EXPECT_TRUE(all_close(sg.to(Device::cpu()).select(0, s), in.ssm.select(0, s), {0.0, 0.0}));
  }
}

#if FLASHINFER_TEST_HAVE_CUDART
// An engine captures its decode step into a CUDA graph (global mode, torch's default): the
// step's intermediates (ba, the conv rows) come from the stream's scratch, so nothing is freed
// during the capture, and the graph gives the eager step's outputs and pools.
TEST(GdnFusedDecodeCuda, CapturesIntoAGraph) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const FusedIn in = fused_inputs(3, 256, 2, 4, 64, 4, {3, 0, 1}, 97);
  // Declared before every CUDA tensor below, so destroyed after them: a tensor made while the
  // stream is current belongs to it, and its death asks the stream (capture status, an event),
  // so the stream must outlive it (include/flashinfer/stream.h). Destroying the stream first
  // crashed in cudaStreamIsCapturing when ~Tensor ran at the end of the test.
  struct OwnedStream {
    cudaStream_t s = nullptr;
    ~OwnedStream() {
      if (s != nullptr) cudaStreamDestroy(s);
    }
  } owned;
  ASSERT_EQ(cudaStreamCreateWithFlags(&owned.s, cudaStreamNonBlocking), cudaSuccess);
  cudaStream_t const stream = owned.s;
  const CurrentStreamScope scope(stream);  // the previous stream back however the test ends
  const FusedIn eager = on_cuda(fresh_pools(in));
  auto [oe, ce, se] = run(eager);  // also grows the stream's scratch before the capture
  const FusedIn graphed = on_cuda(fresh_pools(in));
  Tensor og = Tensor::zeros(oe.shape(), oe.dtype(), Device::cuda(0));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_NO_FATAL_FAILURE(capture_and_launch(stream, cudaStreamCaptureModeGlobal,
                                             [&] { (void)run(graphed, std::nullopt, og); }));
  EXPECT_TRUE(all_close(og.to(Device::cpu()), oe.to(Device::cpu()), {0.0, 0.0}));
  EXPECT_TRUE(all_close(graphed.conv.to(Device::cpu()), ce.to(Device::cpu()), {0.0, 0.0}));
  EXPECT_TRUE(all_close(graphed.ssm.to(Device::cpu()), se.to(Device::cpu()), {0.0, 0.0}));
}
#endif

}  // namespace
}  // namespace flashinfer::testing
