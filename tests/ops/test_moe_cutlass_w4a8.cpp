// cutlass_fused_moe's W4A8 INT4 path (use_packed_weights with use_w4_group_scaling: fp16/bf16
// activations times per-column pre-quant scales cast to fp8 in the op, x signed int4 weights
// interleaved by interleave_moe_weights_for_sm90_mixed_gemm(..., "int4") with 16-bit group
// scales of 128 columns folded by interleave_moe_scales_for_sm90_mixed_gemm(..., 128)): a
// hand-checked golden, fp64 formulas on the plain (not interleaved) weights and scales, bad input
// naming the argument, record/replay. Sources: docs/MOE.md, "cutlass_fused_moe: W4A8 INT4".
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernels/moe_sm90_mixed_rules.h"
#include "ops/moe_fp4_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

using moe_fp4::bytes_tensor;
using moe_fp4::random_bytes;
using moe_fp4::Rng;
using moe_fp4::to_dt;

// Upstream's fp8 GEMM input, independently: the 16-bit product rounded once, then e4m3 (RNE,
// saturating at 448).
double act_fp8(DType dt, double v, double scale) {
  return e4m3fn_bits_to_float(float_to_e4m3fn_bits(static_cast<float>(to_dt(dt, v * scale)), true));
}

// A signed int4 code (two's complement nibble) of plain packed bytes, element (r, c) of [rows, k].
double int4_at(const std::vector<uint8_t>& w, int64_t rows, int64_t k, int64_t e, int64_t r,
               int64_t c) {
  const uint8_t b = w[static_cast<size_t>((e * rows + r) * (k / 2) + c / 2)];
  const int nib = c % 2 == 0 ? b & 0xF : b >> 4;
  return nib < 8 ? nib : nib - 16;
}

struct Case : moe_fp4::LayerExtras {
  int64_t T = 4, E = 4, H = 128, I = 128;
  ActivationType act = ActivationType::Swiglu;
  DType dt = DType::kBFloat16;
  bool bias = false, swiglu_params = false;
  int64_t ep_rank = 0, ep_size = 1, tp_rank = 0, tp_size = 1;

  bool gated() const { return act != ActivationType::Relu2; }
  int64_t N1() const { return gated() ? 2 * I : I; }

  std::vector<double> x, s1, s2, a1, a2, alpha1, alpha2;  // plain values
  std::vector<uint8_t> w1, w2;                            // plain packed int4 bytes
  Tensor ids;

  void make(uint64_t seed) {
    Rng r{seed};
    auto vec_dt = [&](int64_t n, double lo, double hi) {
      auto v = moe_fp4::uniform_f32(r, n, lo, hi);
      for (auto& d : v) d = to_dt(dt, d);
      return v;
    };
    x = vec_dt(T * H, -2, 2);
    w1 = random_bytes(static_cast<size_t>(E * N1() * H / 2), seed + 1);
    w2 = random_bytes(static_cast<size_t>(E * H * I / 2), seed + 2);
    s1 = vec_dt(E * N1() * (H / 128), 0.002, 0.02);
    s2 = vec_dt(E * H * (I / 128), 0.002, 0.02);
    a1 = vec_dt(H, 0.5, 4.0);
    a2 = vec_dt(I, 0.5, 4.0);
    alpha1 = moe_fp4::uniform_f32(r, E, 0.5, 2.0);
    alpha2 = moe_fp4::uniform_f32(r, E, 0.5, 2.0);
    LayerExtras::make(r, E, N1(), H, T, dt, bias, swiglu_params);
    ids = moe_fp4::top2_ids(T, E * ep_size);
  }

  Tensor t16(const std::vector<double>& v, Shape s) const {
    return Tensor::from_vector(v, std::move(s), dt);
  }
  std::vector<Tensor> quant_scales() const {
    return {interleave_moe_scales_for_sm90_mixed_gemm(t16(s1, {E, N1(), H / 128}), 128),
            interleave_moe_scales_for_sm90_mixed_gemm(t16(s2, {E, H, I / 128}), 128),
            t16(a1, {H}),
            t16(a2, {I}),
            Tensor::empty({0}, dt),
            Tensor::empty({0}, dt),
            Tensor::from_vector(alpha1, {E}, DType::kFloat32),
            Tensor::from_vector(alpha2, {E}, DType::kFloat32)};
  }
  // The call with every other tensor argument copied to input's device.
  std::vector<Tensor> run(std::vector<Tensor> qs, DType out_dt, const Tensor& input) const {
    const Device dev = input.device();
    auto on = [&](std::optional<Tensor> t) -> std::optional<Tensor> {
      if (!t) return t;
      return t->to(dev);
    };
    for (Tensor& t : qs) t = t.to(dev);
    const Tensor w1i =
        interleave_moe_weights_for_sm90_mixed_gemm(bytes_tensor(w1, {E, N1(), H / 2}), "int4");
    const Tensor w2i =
        interleave_moe_weights_for_sm90_mixed_gemm(bytes_tensor(w2, {E, H, I / 2}), "int4");
    return cutlass_fused_moe(
        input, ids.to(dev), Tensor::from_vector(rw, {T, 2}, DType::kFloat32).to(dev), w1i.to(dev),
        w2i.to(dev), out_dt, std::move(qs), on(moe_fp4::opt_bias(b1, E, N1(), dt)),
        on(moe_fp4::opt_bias(b2, E, H, dt)), std::nullopt, on(moe_fp4::opt_expert_f32(alpha, E)),
        on(moe_fp4::opt_expert_f32(beta, E)), on(moe_fp4::opt_expert_f32(limit, E)), tp_size,
        tp_rank, ep_size, ep_rank, 1, 0, std::nullopt, false, false, true, false, false, true,
        false, 8192, std::nullopt, act);
  }
  std::vector<Tensor> run(std::vector<Tensor> qs) const {
    return run(std::move(qs), dt, t16(x, {T, H}));
  }
  std::vector<Tensor> run() const { return run(quant_scales()); }

  std::vector<double> expected() const {
    std::vector<double> out(static_cast<size_t>(T * H), 0.0);
    moe_fp4::for_each_local_pair(ids, T, E, ep_rank, [&](int64_t t, int64_t k, int64_t e) {
      std::vector<double> g(static_cast<size_t>(N1()));
      for (int64_t j = 0; j < N1(); ++j) {
        double acc = 0.0;
        for (int64_t d = 0; d < H; ++d) {
          acc += act_fp8(dt, x[static_cast<size_t>(t * H + d)], a1[static_cast<size_t>(d)]) *
                 int4_at(w1, N1(), H, e, j, d) *
                 s1[static_cast<size_t>((e * N1() + j) * (H / 128) + d / 128)];
        }
        g[static_cast<size_t>(j)] = to_dt(dt, acc * alpha1[static_cast<size_t>(e)]) +
                                    (b1.empty() ? 0.0 : b1[static_cast<size_t>(e * N1() + j)]);
      }
      std::vector<double> hq(static_cast<size_t>(I));
      for (int64_t j = 0; j < I; ++j) {
        hq[static_cast<size_t>(j)] =
            act_fp8(dt, to_dt(dt, act_ref(act, g, j, I, e)), a2[static_cast<size_t>(j)]);
      }
      for (int64_t d = 0; d < H; ++d) {
        double acc = 0.0;
        for (int64_t j = 0; j < I; ++j) {
          acc += hq[static_cast<size_t>(j)] * int4_at(w2, H, I, e, d, j) *
                 s2[static_cast<size_t>((e * H + d) * (I / 128) + j / 128)];
        }
        const double y = to_dt(dt, acc * alpha2[static_cast<size_t>(e)]);
        const double bias2 = b2.empty() || tp_rank != 0 ? 0.0 : b2[static_cast<size_t>(e * H + d)];
        out[static_cast<size_t>(t * H + d)] += rw[static_cast<size_t>(t * 2 + k)] * (y + bias2);
      }
    });
    return out;
  }
};

// ---- golden ---------------------------------------------------------------------------------

// H = I = 128, Relu2, one local expert of two (ep rank 0 of 2). x = bf16(0.3) = 0.30078125
// everywhere, fc1 act scales 3: 0.90234375 (exact in bf16) -> e4m3 0.875 (step 1/16). fc1
// weights code +1 (0x11), group scales 0.5, alpha 0.25: 128 * 0.875 * 0.5 * 0.25 = 14; Relu2
// 196; fc2 act scales 0.25: 49 -> e4m3 48 (step 4 in [32, 64)). fc2 weights code -1 (0xFF),
// scales 0.5, alpha 0.5: 128 * 48 * -0.5 * 0.5 = -1536. Token 0 routes to experts 0 (0.75) and 1
// (not local): -1152; token 1 to 0 (1.0) and 1: -1536.
// GoldenRelu2's call on `dev`; returns the output on the CPU.
Tensor golden_relu2(Device dev) {
  const int64_t H = 128, I = 128;
  const auto w = [&](uint8_t b) {
    return interleave_moe_weights_for_sm90_mixed_gemm(
               bytes_tensor(std::vector<uint8_t>(I * H / 2, b), {1, I, H / 2}), "int4")
        .to(dev);
  };
  const auto full = [&](Shape s, double v, DType d) {
    return Tensor::full(std::move(s), v, d).to(dev);
  };
  const DType bf = DType::kBFloat16;
  const std::vector<Tensor> qs = {
      interleave_moe_scales_for_sm90_mixed_gemm(Tensor::full({1, I, H / 128}, 0.5, bf), 128)
          .to(dev),
      interleave_moe_scales_for_sm90_mixed_gemm(Tensor::full({1, H, I / 128}, 0.5, bf), 128)
          .to(dev),
      full({H}, 3.0, bf),
      full({I}, 0.25, bf),
      Tensor::empty({0}, bf, dev),
      Tensor::empty({0}, bf, dev),
      full({1}, 0.25, DType::kFloat32),
      full({1}, 0.5, DType::kFloat32)};
  const auto out = cutlass_fused_moe(
      full({2, H}, 0.3, bf), Tensor::from_vector({0, 1, 0, 1}, {2, 2}, DType::kInt32).to(dev),
      Tensor::from_vector({0.75, 0.25, 1.0, 0.5}, {2, 2}, DType::kFloat32).to(dev), w(0x11),
      w(0xFF), bf, qs, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
      std::nullopt, 1, 0, 2, 0, 1, 0, std::nullopt, false, false, true, false, false, true, false,
      8192, std::nullopt, ActivationType::Relu2);
  EXPECT_EQ(out.size(), 4u);
  return out[0].to(Device::cpu());
}

void expect_golden_relu2(const Tensor& out) {
  const int64_t H = 128;
  const auto got = out.to_double_vector();
  for (int64_t d = 0; d < H; ++d) {
    EXPECT_EQ(got[static_cast<size_t>(d)], -1152.0) << d;
    EXPECT_EQ(got[static_cast<size_t>(H + d)], -1536.0) << d;
  }
}

TEST(CutlassFusedMoeW4A8, GoldenRelu2) { expect_golden_relu2(golden_relu2(Device::cpu())); }

// The CUDA kernels read W4A8 weights and scales in place (kernels/moe_sm90_mixed_rules.h): the
// "int4" layout's words (16-bit units of 4 codes, row r's in the low half, row r + 8's in the
// high half), then the lane loop as a warp runs it (sm90_mixed_lane_rows on each of 32 lanes, the
// four lanes of a row added) against plain dot products over the signed codes before upstream's
// interleave times the 16-bit scales before its fold (group 128; bf16 and fp16 scales). Integer x
// and power-of-two scales keep every fp32 sum exact, so the sums must be equal.
TEST(CutlassFusedMoeW4A8, Sm90LanesReadWhatTheInterleaveWrote) {
  const int64_t rows = 128, k = 256, row_bytes = k / 2;
  const std::vector<uint8_t> plain = random_bytes(static_cast<size_t>(rows * row_bytes), 93);
  const Tensor inter =
      interleave_moe_weights_for_sm90_mixed_gemm(bytes_tensor(plain, {1, rows, row_bytes}), "int4");
  const auto* w = static_cast<const uint8_t*>(inter.data_ptr());
  auto code_at = [&](int64_t row, int64_t col) {
    return moe_fp4::plain_code(plain, row_bytes, row, col);
  };
  moe_fp4::expect_sm90_unit_words_hold(w, plain, rows, k,
                                       [](uint32_t v, int n) { return (v >> (4 * n)) & 15u; });
  Rng r{94};
  std::vector<double> sc(static_cast<size_t>(rows * (k / 128)));
  for (auto& v : sc) v = std::ldexp(1.0, static_cast<int>(r.next() % 5) - 4);  // 2^-4 .. 1
  std::vector<float> x(static_cast<size_t>(k));
  for (auto& v : x) v = static_cast<float>(static_cast<int>(r.next() % 7) - 3);
  auto x_cols = [&](int, int64_t c, float(&xs)[16]) {
    for (int i = 0; i < 16; ++i) xs[i] = x[static_cast<size_t>(c + i)];
  };
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const Tensor folded = interleave_moe_scales_for_sm90_mixed_gemm(
        Tensor::from_vector(sc, {1, rows, k / 128}, dt), 128);
    const auto* sf = static_cast<const uint8_t*>(folded.data_ptr());
    for (int64_t blk = 0; blk < rows / 16; ++blk) {
      float lo[32][1], hi[32][1];
      for (int lane = 0; lane < 32; ++lane) {
        kernels::sm90_mixed_lane_rows<kernels::Sm90Mixed::kW4A8, 1>(
            w, sf, k, blk, lane, 1, x_cols, lo[lane], hi[lane], dt == DType::kFloat16);
      }
      for (int lane = 0; lane < 16; lane += 2) {
        const int64_t row = blk * 16 + lane / 2;
        for (const auto& [got, rr] : {std::pair{lo, row}, std::pair{hi, row + 8}}) {
          const float sum = got[lane][0] + got[lane ^ 1][0] + got[lane ^ 16][0] + got[lane ^ 17][0];
          double want = 0.0;
          for (int64_t c = 0; c < k; ++c) {
            want += x[static_cast<size_t>(c)] * kernels::sm90_int4_value(code_at(rr, c)) *
                    sc[static_cast<size_t>(rr * (k / 128) + c / 128)];
          }
          EXPECT_EQ(static_cast<double>(sum), want) << dtype_label(dt) << " row " << rr;
        }
      }
    }
  }
}

// ---- fp64 formulas ----------------------------------------------------------------------------

TEST(CutlassFusedMoeW4A8, MatchesFormula) {
  moe_fp4::expect_dtypes_and_acts_match_formula<Case>(700);
}

// SwigluBias parameters on expert-parallel rank 1 of 2 and tensor-parallel rank 1 of 2 (no fc2
// bias there), K = 256 (two scale groups per row).
TEST(CutlassFusedMoeW4A8, SwigluBiasParallelTwoGroups) {
  Case c;
  c.H = 256;
  c.I = 256;
  c.bias = true;
  c.swiglu_params = true;
  moe_fp4::set_rank1_of_2(c);
  c.make(711);
  moe_fp4::expect_close_to_formula(c.run()[0].to_double_vector(), c.expected());
}

TEST(CutlassFusedMoeW4A8, BadInput) {
  Case c;
  c.T = 2;
  c.make(720);
  const char* op = "cutlass_fused_moe";
  auto with = [&](size_t i, Tensor t) { return moe_fp4::quant_scales_with(c, i, std::move(t)); };
  moe_fp4::expect_short_quant_scales_refused(c);
  // Missing act scales or alphas (upstream reads an unwritten buffer / null pointers).
  EXPECT_FI_ERROR((void)c.run(with(2, Tensor::empty({0}, c.dt))), op, "quant_scales");
  EXPECT_FI_ERROR((void)c.run(with(7, Tensor::empty({0}, DType::kFloat32))), op, "quant_scales");
  // Per-expert act scales: upstream's binding wants them shared ([hidden_size]).
  EXPECT_FI_ERROR((void)c.run(with(2, Tensor::full({c.E, c.H}, 1.0, c.dt))), op, "quant_scales");
  EXPECT_FI_ERROR((void)c.run(with(0, Tensor::full({c.E, c.N1(), 1}, 1.0, DType::kFloat16))), op,
                  "quant_scales");
  // Zero points: refused (the folded-scale mainloop has none).
  try {
    (void)c.run(with(4, Tensor::zeros({c.E, c.N1(), 1}, c.dt)));
    ADD_FAILURE() << "expected kUnsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_EQ(e.arg(), "quant_scales") << e.what();
  }
  // Input: fp16 / bf16 only; the output has the input's dtype.
  EXPECT_FI_ERROR((void)c.run(c.quant_scales(), c.dt, c.t16(c.x, {c.T, c.H}).to(DType::kFloat32)),
                  op, "input");
  EXPECT_FI_ERROR((void)c.run(c.quant_scales(), DType::kFloat16, c.t16(c.x, {c.T, c.H})), op,
                  "output_dtype");
  // Without use_w4_group_scaling the same tensors select weight-only INT4 (since session 16,
  // tests/ops/test_moe_cutlass_woq_int4.cpp): W4A8's 8 quant_scales have the counts and dtypes
  // it takes, so the call runs on the CPU.
  const auto woq = cutlass_fused_moe(
      c.t16(c.x, {c.T, c.H}), c.ids, Tensor::from_vector(c.rw, {c.T, 2}, DType::kFloat32),
      bytes_tensor(c.w1, {c.E, c.N1(), c.H / 2}), bytes_tensor(c.w2, {c.E, c.H, c.I / 2}), c.dt,
      c.quant_scales(), std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
      std::nullopt, 1, 0, 1, 0, 1, 0, std::nullopt, false, false, false, false, false, true, false);
  ASSERT_EQ(woq.size(), 4u);
  EXPECT_EQ(woq[0].shape(), Shape({c.T, c.H}));
  for (double v : woq[0].to_double_vector()) EXPECT_TRUE(std::isfinite(v));
}

#if FLASHINFER_TEST_HAVE_CUDART
// W4A8 INT4 on CUDA (upstream's SM90 path; refused by name below sm90, as upstream): the
// hand-checked golden exactly on both routes (a block per pair, tiles of up to 8 pairs of one
// expert); random layers against the CPU reference within the formula tests' tolerance (the
// activation's expf can move an fp8 code of GEMM2's input by one step): bf16 Swiglu, fp16 Relu2
// with biases, SwigluBias on expert-parallel rank 1 of 2 with K = 256 (two scale groups), 9 and
// 64 tokens, each on both routes and the default.
TEST(CutlassFusedMoeW4A8Cuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  moe_fp4::expect_sm90_mixed_routes(golden_relu2, expect_golden_relu2, [](Device d) {
    for (int which = 0; which < 3; ++which) {
      for (int64_t T : {9, 64}) {
        Case c;
        c.T = T;
        c.E = 8;
        c.dt = which == 1 ? DType::kFloat16 : DType::kBFloat16;
        c.act = which == 1 ? ActivationType::Relu2 : ActivationType::Swiglu;
        c.bias = which != 0;
        c.swiglu_params = which == 2;
        if (which == 2) {
          c.H = c.I = 256;
          c.ep_size = 2;
          c.ep_rank = 1;
        }
        c.make(750 + static_cast<uint64_t>(which));
        const Tensor got = c.run(c.quant_scales(), c.dt, c.t16(c.x, {c.T, c.H}).to(d))[0];
        SCOPED_TRACE(::testing::Message() << "case " << which << " T " << T);
        moe_fp4::expect_close_to_formula(got.to(Device::cpu()).to_double_vector(),
                                         c.run()[0].to_double_vector());
      }
    }
  });
}
#endif  // FLASHINFER_TEST_HAVE_CUDART

TEST(CutlassFusedMoeW4A8, RecordAndReplay) {
  moe_fp4::expect_default_and_fp16_relu2_replay<Case>(741);
}

}  // namespace
}  // namespace flashinfer::testing
