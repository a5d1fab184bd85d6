// rope_quantize_fp8 and mla_rope_quantize_fp8: rotation against fp64 (within half an fp8 step),
// the non-rotary parts bit-exact to float_formats.h's saturating RNE, saturation and NaN, GQA and
// MLA layouts, NeoX and interleaved, int32/int64 positions, absent nope parts, given outputs,
// a hand-checked golden, bad input, record and replay, and CUDA bit-exact against the CPU
// (skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "flashinfer/float_formats.h"
#include "flashinfer/ops/rope_quantize.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

using testing::int_tensor;

std::vector<uint8_t> codes(const Tensor& t) {
  Tensor c = t.contiguous().to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.numel());
}

float decode(uint8_t b, DType d) {
  return d == DType::kFloat8E4M3FN ? e4m3fn_bits_to_float(b) : e5m2_bits_to_float(b);
}

// Distance from x to the next fp8 value of the format, at x's magnitude.
double fp8_step(double x, DType d) {
  const int mbits = d == DType::kFloat8E4M3FN ? 3 : 2, emin = d == DType::kFloat8E4M3FN ? -6 : -14;
  int e = x != 0 ? static_cast<int>(std::floor(std::log2(std::fabs(x)))) : emin;
  return std::ldexp(1.0, std::max(e, emin) - mbits);
}

struct Layout {
  bool mla, neox, pos64;
  DType in, q8;
  int64_t hq, hk, rd, nq, nk;
};

TEST(RopeQuantizeFp8, MatchesFormulaOverLayouts) {
  const DType bf16 = DType::kBFloat16, f16 = DType::kFloat16;
  const DType e4m3 = DType::kFloat8E4M3FN, e5m2 = DType::kFloat8E5M2;
  const std::vector<Layout> cases = {
      {true, true, false, bf16, e4m3, 4, 1, 64, 128, 512},
      {true, false, true, f16, e4m3, 2, 1, 16, 8, 24},
      {false, true, true, bf16, e5m2, 4, 2, 32, 96, 96},
      {false, false, false, f16, e4m3, 3, 3, 8, 0, 0},
  };
  int idx = 0;
  for (const Layout& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    const int64_t nnz = 7, max_pos = 50;
    Tensor q_rope = testing::rand_tensor({nnz, c.hq, c.rd}, c.in, 100 + idx);
    Tensor k_rope = c.mla ? testing::rand_tensor({nnz, c.rd}, c.in, 101 + idx)
                          : testing::rand_tensor({nnz, c.hk, c.rd}, c.in, 101 + idx);
    Tensor q_nope = testing::rand_tensor({nnz, c.hq, c.nq}, c.in, 102 + idx, -40, 40);
    Tensor k_nope = c.mla ? testing::rand_tensor({nnz, c.nk}, c.in, 103 + idx, -40, 40)
                          : testing::rand_tensor({nnz, c.hk, c.nk}, c.in, 103 + idx, -40, 40);
    Tensor cs = testing::rand_tensor({max_pos, c.rd}, DType::kFloat32, 104 + idx, -1, 1);
    std::vector<int32_t> pos{3, 0, 49, 7, 7, 12, 30};
    Tensor pos_t = int_tensor(pos);
    if (c.pos64) pos_t = pos_t.to(DType::kInt64);
    const double sq = 3.5, skv = 0.75;
    auto [qr, kr, qn, kn] =
        rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cs, pos_t, c.neox, c.q8, sq, skv);
    ASSERT_EQ(qr.dtype(), c.q8);
    ASSERT_EQ(kr.shape(), k_rope.shape());
    // Non-rotary parts: exactly the saturating RNE of x * scale in fp32.
    for (const auto& [in, out, scale] :
         {std::tuple{&q_nope, &qn, sq}, std::tuple{&k_nope, &kn, skv}}) {
      const std::vector<double> x = in->contiguous().to_double_vector();
      const std::vector<uint8_t> got = codes(*out);
      ASSERT_EQ(got.size(), x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        const float v = static_cast<float>(x[i]) * static_cast<float>(scale);
        const uint8_t want =
            c.q8 == e4m3 ? float_to_e4m3fn_bits(v, true) : float_to_e5m2_bits(v, true);
        ASSERT_EQ(got[i], want) << "element " << i;
      }
    }
    // Rotary parts: fp64 rotation times the scale, within half an fp8 step (plus fp32 slack).
    const std::vector<double> csv = cs.to_double_vector();
    for (const auto& [in, out, scale, heads] :
         {std::tuple{&q_rope, &qr, sq, c.hq}, std::tuple{&k_rope, &kr, skv, c.mla ? 1 : c.hk}}) {
      const std::vector<double> x = in->contiguous().to_double_vector();
      const std::vector<uint8_t> got = codes(*out);
      const int64_t half = c.rd / 2;
      for (int64_t t = 0; t < nnz; ++t) {
        for (int64_t h = 0; h < heads; ++h) {
          const double* xr = &x[(t * heads + h) * c.rd];
          for (int64_t i = 0; i < c.rd; ++i) {
            const int64_t j = c.neox ? (i < half ? i : i - half) : i / 2;
            const double co = csv[pos[t] * c.rd + j], si = csv[pos[t] * c.rd + half + j];
            double y;
            if (c.neox) {
              y = i < half ? xr[i] * co - xr[i + half] * si : xr[i] * co + xr[i - half] * si;
            } else {
              y = i % 2 == 0 ? xr[i] * co - xr[i + 1] * si : xr[i] * co + xr[i - 1] * si;
            }
            const double want = y * scale;
            const double g = decode(got[(t * heads + h) * c.rd + i], c.q8);
            ASSERT_LE(std::fabs(g - want), 0.5 * fp8_step(want, c.q8) + 1e-5 * std::fabs(want))
                << "t " << t << " h " << h << " i " << i << ": got " << g << " want " << want;
          }
        }
      }
    }
    ++idx;
  }
}

// Hand-checked: rope_dim 2, NeoX, x = (1, 0.5), cos 0, sin 1 (a quarter turn): y = (-0.5, 1);
// quant scale 2: (-1, 2) -> e4m3 codes 0xB8 and 0x40. Interleaved with the same pair: the same.
// Non-rotary 300 * 2 = 600 saturates to 448 (0x7E); NaN stays NaN (0x7F).
TEST(RopeQuantizeFp8, HandCheckedGoldenSaturationAndNan) {
  Tensor cs = Tensor::from_vector({0.0, 1.0}, {1, 2}, DType::kFloat32);
  Tensor q = Tensor::from_vector({1.0, 0.5}, {1, 1, 2}, DType::kBFloat16);
  Tensor k = Tensor::from_vector({1.0, 0.5}, {1, 2}, DType::kBFloat16);
  Tensor qn = Tensor::from_vector({300.0, std::numeric_limits<double>::quiet_NaN()}, {1, 1, 2},
                                  DType::kBFloat16);
  Tensor kn = Tensor::from_vector({-300.0}, {1, 1}, DType::kBFloat16);
  for (bool neox : {true, false}) {
    auto [qr, kr, qno, kno] =
        mla_rope_quantize_fp8(q, k, qn, kn, cs, int_tensor({0}), neox, std::nullopt, 2.0, 2.0);
    EXPECT_EQ(codes(qr), (std::vector<uint8_t>{0xB8, 0x40}));
    EXPECT_EQ(codes(kr), (std::vector<uint8_t>{0xB8, 0x40}));
    EXPECT_EQ(codes(qno), (std::vector<uint8_t>{0x7E, 0x7F}));
    EXPECT_EQ(codes(kno), (std::vector<uint8_t>{0xFE}));
  }
}

TEST(RopeQuantizeFp8, OutputsNoneNopeAndTheMlaName) {
  const int64_t nnz = 5;
  Tensor q = testing::rand_tensor({nnz, 2, 16}, DType::kBFloat16, 1);
  Tensor k = testing::rand_tensor({nnz, 16}, DType::kBFloat16, 2);
  Tensor qn = testing::rand_tensor({nnz, 2, 32}, DType::kBFloat16, 3);
  Tensor kn = testing::rand_tensor({nnz, 48}, DType::kBFloat16, 4);
  Tensor cs = testing::rand_tensor({9, 16}, DType::kFloat32, 5);
  Tensor pos = int_tensor({0, 8, 1, 2, 3});
  auto a = rope_quantize_fp8(q, k, qn, kn, cs, pos, true, std::nullopt, 1.5, 0.5);
  auto b = mla_rope_quantize_fp8(q, k, qn, kn, cs, pos, true, std::nullopt, 1.5, 0.5);
  EXPECT_EQ(codes(std::get<0>(a)), codes(std::get<0>(b)));
  EXPECT_EQ(codes(std::get<3>(a)), codes(std::get<3>(b)));
  // Given outputs (e5m2 inferred from the first given one) are filled and returned.
  Tensor qo = Tensor::zeros({nnz, 2, 16}, DType::kFloat8E5M2);
  Tensor kno = Tensor::zeros({nnz, 48}, DType::kFloat8E5M2);
  auto c = rope_quantize_fp8(q, k, qn, kn, cs, pos, true, std::nullopt, 1.5, 0.5, qo, std::nullopt,
                             std::nullopt, kno);
  EXPECT_EQ(std::get<0>(c).data_ptr(), qo.data_ptr());
  EXPECT_EQ(std::get<3>(c).data_ptr(), kno.data_ptr());
  EXPECT_EQ(std::get<1>(c).dtype(), DType::kFloat8E5M2);
  // Absent nope parts: zero-width outputs, the rope parts unchanged.
  auto d =
      rope_quantize_fp8(q, k, std::nullopt, std::nullopt, cs, pos, true, std::nullopt, 1.5, 0.5);
  EXPECT_EQ(std::get<2>(d).shape(), (Shape{nnz, 2, 0}));
  EXPECT_EQ(std::get<3>(d).shape(), (Shape{nnz, 0}));
  EXPECT_EQ(codes(std::get<0>(d)), codes(std::get<0>(a)));
  // mla_rope_quantize_fp8 forwards None nope parts the same way (upstream's Python).
  auto e = mla_rope_quantize_fp8(q, k, std::nullopt, std::nullopt, cs, pos, true, std::nullopt, 1.5,
                                 0.5);
  EXPECT_EQ(std::get<3>(e).shape(), (Shape{nnz, 0}));
  EXPECT_EQ(codes(std::get<1>(e)), codes(std::get<1>(a)));
}

TEST(RopeQuantizeFp8, BadInput) {
  const char* op = "rope_quantize_fp8";
  Tensor q = testing::rand_tensor({3, 2, 8}, DType::kBFloat16, 1);
  Tensor k = testing::rand_tensor({3, 8}, DType::kBFloat16, 2);
  Tensor qn = testing::rand_tensor({3, 2, 4}, DType::kBFloat16, 3);
  Tensor kn = testing::rand_tensor({3, 4}, DType::kBFloat16, 4);
  Tensor cs = testing::rand_tensor({4, 8}, DType::kFloat32, 5);
  Tensor pos = int_tensor({0, 1, 3});
  auto run = [&](const Tensor& qq, const Tensor& kk, const Tensor& c, const Tensor& p,
                 std::optional<DType> qd = std::nullopt, std::optional<Tensor> qo = std::nullopt) {
    rope_quantize_fp8(qq, kk, qn, kn, c, p, true, qd, 1.0, 1.0, qo);
  };
  run(q, k, cs, pos);  // valid
  EXPECT_FI_ERROR(run(q, k, cs.to(DType::kFloat16), pos), op, "cos_sin_cache");
  EXPECT_FI_ERROR(run(q, k, testing::rand_tensor({4, 6}, DType::kFloat32, 6), pos), op,
                  "cos_sin_cache");
  EXPECT_FI_ERROR(run(q, k, cs, int_tensor({0, 1, 4})), op, "pos_ids");
  EXPECT_FI_ERROR(run(q, k, cs, int_tensor({0, 1})), op, "pos_ids");
  EXPECT_FI_ERROR(run(q, k.slice(0, 0, 2), cs, pos), op, "k_rope");
  EXPECT_FI_ERROR(run(q.to(DType::kFloat32), k, cs, pos), op, "q_rope");
  EXPECT_FI_ERROR(run(q, k.to(DType::kFloat16), cs, pos), op, "k_rope");
  EXPECT_FI_ERROR(run(q, k, cs, pos, DType::kBFloat16), op, "quantize_dtype");
  EXPECT_FI_ERROR(
      run(q, k, cs, pos, DType::kFloat8E4M3FN, Tensor::zeros({3, 2, 8}, DType::kFloat8E5M2)), op,
      "q_rope_out");
  EXPECT_FI_ERROR(run(q, k, cs, pos, std::nullopt, Tensor::zeros({3, 2, 4}, DType::kFloat8E4M3FN)),
                  op, "q_rope_out");
  EXPECT_FI_ERROR(
      rope_quantize_fp8(q, k, qn, testing::rand_tensor({2, 4}, DType::kBFloat16, 7), cs, pos), op,
      "k_nope");
  EXPECT_FI_ERROR(
      rope_quantize_fp8(q, k, qn, kn, cs, pos, true, std::nullopt, 1.0, 1.0, std::nullopt,
                        std::nullopt, std::nullopt, std::nullopt, false, "cutile"),
      op, "is_neox");
  EXPECT_FI_ERROR(
      rope_quantize_fp8(q, k, qn, kn, cs, pos, true, std::nullopt, 1.0, 1.0, std::nullopt,
                        std::nullopt, std::nullopt, std::nullopt, false, "triton"),
      op, "backend");
}

TEST(RopeQuantizeFp8, RecordAndReplay) {
  Tensor q = testing::rand_tensor({4, 2, 16}, DType::kBFloat16, 1);
  Tensor k = testing::rand_tensor({4, 2, 16}, DType::kBFloat16, 2);
  Tensor qn = testing::rand_tensor({4, 2, 8}, DType::kBFloat16, 3);
  Tensor kn = testing::rand_tensor({4, 2, 8}, DType::kBFloat16, 4);
  Tensor cs = testing::rand_tensor({6, 16}, DType::kFloat32, 5);
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    rope_quantize_fp8(q, k, qn, kn, cs, int_tensor({5, 4, 0, 1}), false, std::nullopt, 2.0, 0.5);
    mla_rope_quantize_fp8(q, k.select(1, 0), qn, kn.select(1, 0), cs, int_tensor({1, 2, 3, 4}));
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& call : calls) EXPECT_TRUE(testing::replays_identically(call));
}

TEST(RopeQuantizeFp8Cuda, BitExactWithCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  for (bool neox : {true, false}) {
    for (DType q8 : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
      Tensor q = testing::rand_tensor({300, 16, 64}, DType::kBFloat16, 1, -30, 30);
      Tensor k = testing::rand_tensor({300, 64}, DType::kBFloat16, 2, -30, 30);
      Tensor qn = testing::rand_tensor({300, 16, 512}, DType::kBFloat16, 3, -30, 30);
      Tensor kn = testing::rand_tensor({300, 512}, DType::kBFloat16, 4, -30, 30);
      Tensor cs = testing::rand_tensor({1000, 64}, DType::kFloat32, 5);
      std::vector<int64_t> p;
      for (int64_t t = 0; t < 300; ++t) p.push_back((t * 37) % 1000);
      Tensor pos = int_tensor(std::vector<int32_t>(p.begin(), p.end())).to(DType::kInt64);
      auto want = rope_quantize_fp8(q, k, qn, kn, cs, pos, neox, q8, 3.0, 5.0);
      auto got = rope_quantize_fp8(q.to(gpu), k.to(gpu), qn.to(gpu), kn.to(gpu), cs.to(gpu),
                                   pos.to(gpu), neox, q8, 3.0, 5.0);
      EXPECT_EQ(codes(std::get<0>(got)), codes(std::get<0>(want)));
      EXPECT_EQ(codes(std::get<1>(got)), codes(std::get<1>(want)));
      EXPECT_EQ(codes(std::get<2>(got)), codes(std::get<2>(want)));
      EXPECT_EQ(codes(std::get<3>(got)), codes(std::get<3>(want)));
    }
  }
}

// Device positions are read by the kernel only (no copy to the host, no synchronization): a
// token outside the cos/sin cache gets NaN in its rope parts, where the CPU refuses the call by
// name; every other token and every nope part has the CPU's codes. Without nope parts the
// zero-width outputs are empty views (nothing allocated, which a CUDA graph would refuse).
TEST(RopeQuantizeFp8Cuda, DevicePositionsOutsideTheCacheGiveNaN) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const DType q8 = DType::kFloat8E4M3FN;
  Tensor q = testing::rand_tensor({6, 4, 64}, DType::kBFloat16, 11, -3, 3);
  Tensor k = testing::rand_tensor({6, 2, 64}, DType::kBFloat16, 12, -3, 3);
  Tensor qn = testing::rand_tensor({6, 4, 32}, DType::kBFloat16, 13, -3, 3);
  Tensor kn = testing::rand_tensor({6, 2, 32}, DType::kBFloat16, 14, -3, 3);
  Tensor cs = testing::rand_tensor({100, 64}, DType::kFloat32, 15);
  const Tensor bad = int_tensor({3, -1, 50, 100, 99, 0});
  const Tensor good = int_tensor({3, 0, 50, 0, 99, 0});  // tokens 1 and 3 at position 0
  EXPECT_FI_ERROR(rope_quantize_fp8(q, k, qn, kn, cs, bad, true, q8), "rope_quantize_fp8",
                  "pos_ids");
  const auto want = rope_quantize_fp8(q, k, qn, kn, cs, good, true, q8);
  const auto got = rope_quantize_fp8(q.to(gpu), k.to(gpu), qn.to(gpu), kn.to(gpu), cs.to(gpu),
                                     bad.to(gpu), true, q8);
  EXPECT_EQ(codes(std::get<2>(got)), codes(std::get<2>(want)));
  EXPECT_EQ(codes(std::get<3>(got)), codes(std::get<3>(want)));
  for (const auto& [g, w] : {std::pair{std::get<0>(got), std::get<0>(want)},
                             std::pair{std::get<1>(got), std::get<1>(want)}}) {
    const auto gc = codes(g), wc = codes(w);
    const auto per_token = gc.size() / 6;
    for (std::size_t i = 0; i < gc.size(); ++i) {
      const std::size_t t = i / per_token;
      if (t == 1 || t == 3) {
        EXPECT_TRUE(std::isnan(decode(gc[i], q8))) << "token " << t;
      } else {
        EXPECT_EQ(gc[i], wc[i]) << "token " << t;
      }
    }
  }
  const auto bare = rope_quantize_fp8(q.to(gpu), k.to(gpu), std::nullopt, std::nullopt, cs.to(gpu),
                                      good.to(gpu), true, q8);
  EXPECT_EQ(std::get<2>(bare).shape(), (Shape{6, 4, 0}));
  EXPECT_EQ(std::get<3>(bare).shape(), (Shape{6, 2, 0}));
  EXPECT_EQ(codes(std::get<0>(bare)), codes(std::get<0>(want)));
  EXPECT_EQ(codes(std::get<1>(bare)), codes(std::get<1>(want)));
}

}  // namespace
}  // namespace flashinfer
