// rmsnorm_quant, fused_add_rmsnorm_quant, layernorm_quant: hand-checked golden codes, the clamp
// (and NaN) at the fp8 range, an fp64 formula over dtypes, shapes, strides and both fp8 output
// formats, the written residual, every bad input, record/replay. CUDA: test_backend_ops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

std::vector<double> values(const Tensor& t) {
  Tensor c = t.to(DType::kFloat64).contiguous();
  return std::vector<double>(c.data<double>(), c.data<double>() + c.numel());
}

TEST(RmsNormQuant, Golden) {
  // rms of [3, 4] = sqrt(12.5); y = [0.8485, 1.1314]; / 0.5 = [1.697, 2.263] -> e4m3 1.75, 2.25.
  Tensor x = Tensor::from_vector({3, 4}, {1, 2}, DType::kFloat32);
  Tensor w = Tensor::from_vector({1, 1}, {2}, DType::kFloat32);
  Tensor out = Tensor::empty({1, 2}, DType::kFloat8E4M3FN);
  rmsnorm_quant(out, x, w, 0.5, 0.0);
  EXPECT_EQ(values(out), (std::vector<double>{1.75, 2.25}));
  // Scale as a tensor; out as e5m2 (steps of 0.25 in [1, 2), 0.5 in [2, 4): 1.75, 2.5).
  Tensor out2 = Tensor::empty({1, 2}, DType::kFloat8E5M2);
  rmsnorm_quant(out2, x, w, Tensor::full({1}, 0.5, DType::kBFloat16), 0.0);
  EXPECT_EQ(values(out2), (std::vector<double>{1.75, 2.5}));
}

std::vector<int> bytes(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.contiguous().data_ptr());
  return std::vector<int>(p, p + t.numel());
}

TEST(RmsNormQuant, ClampsAndNaN) {
  // Weight 1000 with scale 0.01: |y| ~ 1e5 saturates (e4m3 +-448, e5m2 +-57344). A NaN input makes
  // the row NaN, stored as the canonical NaN 0x7F in both formats: upstream's CuTe kernels convert
  // with cvt.rn.satfinite and no clamp (session 83; -448 before), and so does layernorm_quant's
  // (upstream 0.7.4's CuTe kernel; its CUDA fallback's bf16 clamp gave -max, 0xFE / 0xFB).
  Tensor x = Tensor::from_vector({1, -1, 1, std::nan("")}, {2, 2}, DType::kFloat16);
  Tensor w = Tensor::from_vector({1000, 1000}, {2}, DType::kFloat16);
  for (DType od : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
    SCOPED_TRACE(dtype_label(od));
    const int mx = od == DType::kFloat8E4M3FN ? 0x7E : 0x7B;
    Tensor out = Tensor::empty({2, 2}, od);
    rmsnorm_quant(out, x, w, 0.01);
    EXPECT_EQ(bytes(out), (std::vector<int>{mx, 0x80 | mx, 0x7F, 0x7F}));
    Tensor fused = Tensor::empty({2, 2}, od);
    Tensor res = Tensor::zeros({2, 2}, DType::kFloat16);
    fused_add_rmsnorm_quant(fused, x, res, w, 0.01);
    EXPECT_EQ(bytes(fused), (std::vector<int>{mx, 0x80 | mx, 0x7F, 0x7F}));
    Tensor ln = Tensor::empty({2, 2}, od);
    layernorm_quant(ln, x.to(DType::kBFloat16), Tensor::full({2}, 1.0, DType::kFloat32),
                    Tensor::zeros({2}, DType::kFloat32), 1.0, 0.0);
    EXPECT_EQ(bytes(ln)[2], 0x7F);
    EXPECT_EQ(bytes(ln)[3], 0x7F);
  }
}

TEST(LayerNormQuant, Golden) {
  // x = [1, 3]: mean 2, var 1, normalized [-1, 1]; gamma [2, 1], beta [0.5, 0] -> [-1.5, 1];
  // scale 0.25 -> [-6, 4].
  Tensor x = Tensor::from_vector({1, 3}, {1, 2}, DType::kBFloat16);
  Tensor g = Tensor::from_vector({2, 1}, {2}, DType::kFloat32);
  Tensor b = Tensor::from_vector({0.5, 0}, {2}, DType::kFloat32);
  Tensor out = Tensor::empty({1, 2}, DType::kFloat8E4M3FN);
  layernorm_quant(out, x, g, b, 0.25, 0.0);
  EXPECT_EQ(values(out), (std::vector<double>{-6, 4}));
}

// Upstream 0.7.4's default kernel (CuTe) converts y from fp32: y = 1.0625 + 2^-12 is just above
// the midpoint of e4m3's 1.0 and 1.125 and gives 1.125 (its CUDA fallback, and session 83, first
// rounded y to bf16 1.0625, which ties to even, 1.0).
TEST(LayerNormQuant, ConvertsTheFp32ValueDirectly) {
  Tensor x = Tensor::from_vector({1, 3}, {1, 2}, DType::kBFloat16);
  Tensor g = Tensor::from_vector({2, 1}, {2}, DType::kFloat32);
  Tensor b = Tensor::from_vector({0.5, 0.0625 + std::ldexp(1.0, -12)}, {2}, DType::kFloat32);
  Tensor out = Tensor::empty({1, 2}, DType::kFloat8E4M3FN);
  layernorm_quant(out, x, g, b, 1.0, 0.0);
  EXPECT_EQ(values(out), (std::vector<double>{-1.5, 1.125}));
}

// One fp8 unit in the last place at the expected value's magnitude (the kernels round an fp32
// value that may differ from the fp64 one by a few fp32 ulps, which can cross a rounding
// boundary).
double fp8_ulp(double v, DType d) {
  const int man = d == DType::kFloat8E4M3FN ? 3 : 2;
  const double min_sub = d == DType::kFloat8E4M3FN ? std::ldexp(1.0, -9) : std::ldexp(1.0, -16);
  if (v == 0) return min_sub;
  return std::max(min_sub, std::ldexp(1.0, std::ilogb(std::fabs(v)) - man));
}

double clamp_q(double y, DType d) {
  const double mx = d == DType::kFloat8E4M3FN ? 448 : 57344;
  return std::min(std::max(y, -mx), mx);
}

TEST(NormQuant, MatchesFp64Formula) {
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (DType od : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
      for (int64_t hidden : {1, 7, 300}) {
        SCOPED_TRACE(::testing::Message() << dtype_label(dt) << " hidden " << hidden
                                          << (od == DType::kFloat8E5M2 ? " e5m2" : " e4m3"));
        const int64_t rows = 3;
        const double scale = 0.05, eps = 1e-5;
        Tensor x = strided_rand({rows, hidden}, dt, 1 + hidden);
        Tensor res = rand_tensor({rows, hidden}, dt, 2 + hidden);
        Tensor w = rand_tensor({hidden}, dt, 3 + hidden);
        Tensor g = rand_tensor({hidden}, DType::kFloat32, 4 + hidden);
        Tensor b = rand_tensor({hidden}, DType::kFloat32, 5 + hidden);
        const auto xv = values(x), rv = values(res), wv = values(w), gv = values(g), bv = values(b);
        Tensor o1 = Tensor::empty({rows, hidden}, od), o2 = Tensor::empty({rows, hidden}, od),
               o3 = Tensor::empty({rows, hidden}, od);
        rmsnorm_quant(o1, x, w, scale, eps);
        Tensor res2 = res.clone();
        fused_add_rmsnorm_quant(o2, x, res2, w, Tensor::full({1}, scale, DType::kFloat32), eps);
        layernorm_quant(o3, x, g, b, scale, eps);
        const auto q1 = values(o1), q2 = values(o2), q3 = values(o3), r2 = values(res2);
        for (int64_t r = 0; r < rows; ++r) {
          double ss = 0, ss2 = 0, mean = 0, var = 0;
          for (int64_t i = 0; i < hidden; ++i) {
            const double v = xv[r * hidden + i], s = v + rv[r * hidden + i];
            ss += v * v;
            ss2 += s * s;
            mean += v;
          }
          mean /= hidden;
          for (int64_t i = 0; i < hidden; ++i) var += std::pow(xv[r * hidden + i] - mean, 2);
          const double rs = 1 / std::sqrt(ss / hidden + eps),
                       rs2 = 1 / std::sqrt(ss2 / hidden + eps),
                       rl = 1 / std::sqrt(var / hidden + eps);
          for (int64_t i = 0; i < hidden; ++i) {
            const int64_t k = r * hidden + i;
            const double s = xv[k] + rv[k];
            const double e1 = clamp_q(xv[k] * rs * wv[i] / scale, od);
            const double e2 = clamp_q(s * rs2 * wv[i] / scale, od);
            const double e3 = clamp_q(((xv[k] - mean) * rl * gv[i] + bv[i]) / scale, od);
            ASSERT_LE(std::fabs(q1[k] - e1), fp8_ulp(e1, od)) << k;
            ASSERT_LE(std::fabs(q2[k] - e2), fp8_ulp(e2, od)) << k;
            ASSERT_LE(std::fabs(q3[k] - e3), fp8_ulp(e3, od)) << k;
            // The residual is the fp32 sum rounded once to the dtype.
            const double rounded =
                Tensor::full(
                    {1}, static_cast<double>(static_cast<float>(xv[k]) + static_cast<float>(rv[k])),
                    dt)
                    .to(DType::kFloat64)
                    .data<double>()[0];
            ASSERT_EQ(r2[k], rounded) << k;
          }
        }
      }
    }
  }
}

TEST(NormQuant, BadInput) {
  Tensor x = rand_tensor({4, 8}, DType::kFloat16, 1);
  Tensor w = rand_tensor({8}, DType::kFloat16, 2);
  Tensor out = Tensor::empty({4, 8}, DType::kFloat8E4M3FN);
  const char* op = "rmsnorm_quant";
  EXPECT_FI_ERROR(rmsnorm_quant(Tensor::empty({4, 8}, DType::kFloat16), x, w, 1.0), op, "out");
  EXPECT_FI_ERROR(rmsnorm_quant(Tensor::empty({4, 9}, DType::kFloat8E4M3FN), x, w, 1.0), op, "out");
  EXPECT_FI_ERROR(rmsnorm_quant(out, rand_tensor({8}, DType::kFloat16, 1), w, 1.0), op, "input");
  EXPECT_FI_ERROR(rmsnorm_quant(out, rand_tensor({4, 8}, DType::kFloat64, 1), w, 1.0), op, "input");
  EXPECT_FI_ERROR(rmsnorm_quant(out, x, rand_tensor({8}, DType::kBFloat16, 1), 1.0), op, "weight");
  EXPECT_FI_ERROR(rmsnorm_quant(out, x, rand_tensor({7}, DType::kFloat16, 1), 1.0), op, "weight");
  EXPECT_FI_ERROR(rmsnorm_quant(out, x, w, 0.0), op, "scale");
  EXPECT_FI_ERROR(rmsnorm_quant(out, x, w, Tensor::full({2}, 1.0, DType::kFloat32)), op, "scale");
  EXPECT_FI_ERROR(rmsnorm_quant(out, x, w, Tensor::full({1}, 1.0, DType::kInt32)), op, "scale");
  EXPECT_FI_ERROR(rmsnorm_quant(out, x, w, 1.0, -1.0), op, "eps");

  const char* fop = "fused_add_rmsnorm_quant";
  Tensor r = rand_tensor({4, 8}, DType::kFloat16, 3);
  EXPECT_FI_ERROR(fused_add_rmsnorm_quant(out, x, rand_tensor({4, 7}, DType::kFloat16, 1), w, 1.0),
                  fop, "residual");
  EXPECT_FI_ERROR(fused_add_rmsnorm_quant(out, x, x, w, 1.0), fop, "residual");
  EXPECT_FI_ERROR(fused_add_rmsnorm_quant(out, x, r.to(DType::kBFloat16), w, 1.0), fop, "residual");

  const char* lop = "layernorm_quant";
  Tensor g = rand_tensor({8}, DType::kFloat32, 4), b = rand_tensor({8}, DType::kFloat32, 5);
  EXPECT_FI_ERROR(layernorm_quant(out, x, g.to(DType::kFloat16), b, 1.0), lop, "gemma");
  EXPECT_FI_ERROR(layernorm_quant(out, x, g, rand_tensor({9}, DType::kFloat32, 1), 1.0), lop,
                  "beta");
  EXPECT_FI_ERROR(layernorm_quant(out, x, g, b, std::nan("")), lop, "scale");
}

TEST(FusedRmsNormSilu, MatchesFp64Formula) {
  for (int64_t hidden : {2, 33, 300}) {
    Tensor x = strided_rand({3, hidden}, DType::kBFloat16, hidden, -3, 3);
    Tensor w = rand_tensor({hidden}, DType::kBFloat16, hidden + 1);
    Tensor y = fused_rmsnorm_silu(x, w, 1e-5);
    Tensor o = Tensor::empty({3, hidden}, DType::kBFloat16);
    Tensor y2 = fused_rmsnorm_silu(x, w, 1e-5, o);
    EXPECT_EQ(y2.data_ptr(), o.data_ptr());
    const auto xv = values(x), wv = values(w), yv = values(y), y2v = values(o);
    std::vector<double> want;
    for (int64_t r = 0; r < 3; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < hidden; ++i) ss += xv[r * hidden + i] * xv[r * hidden + i];
      const double rs = 1 / std::sqrt(ss / hidden + 1e-5);
      for (int64_t i = 0; i < hidden; ++i) {
        const double v = xv[r * hidden + i] * rs * wv[i];
        want.push_back(v / (1 + std::exp(-v)));
      }
    }
    EXPECT_TRUE(all_close(y, want, default_tolerance(DType::kBFloat16)));
    EXPECT_EQ(yv, y2v);
  }
  // Golden: [3, 4] -> rmsnorm [0.8485, 1.1314] -> silu [0.5942, 0.8514], in bf16.
  Tensor g = fused_rmsnorm_silu(Tensor::from_vector({3, 4}, {1, 2}, DType::kBFloat16),
                                Tensor::from_vector({1, 1}, {2}, DType::kBFloat16), 0.0);
  EXPECT_TRUE(all_close(g, {0.59420, 0.85140}, {4e-3, 4e-3}));
}

// fp8 output (upstream's binding: scale 1.0): e4m3 of silu(y), saturating at 448.
TEST(FusedRmsNormSilu, Fp8OutputMatchesFp64Formula) {
  for (int64_t hidden : {2, 33, 300}) {
    Tensor x = strided_rand({3, hidden}, DType::kBFloat16, hidden, -3, 3);
    Tensor w = rand_tensor({hidden}, DType::kBFloat16, hidden + 7);
    Tensor o = Tensor::empty({3, hidden}, DType::kFloat8E4M3FN);
    Tensor y = fused_rmsnorm_silu(x, w, 1e-5, o);
    EXPECT_EQ(y.data_ptr(), o.data_ptr());
    EXPECT_EQ(y.dtype(), DType::kFloat8E4M3FN);
    const auto xv = values(x), wv = values(w), yv = values(y);
    for (int64_t r = 0; r < 3; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < hidden; ++i) ss += xv[r * hidden + i] * xv[r * hidden + i];
      const double rs = 1 / std::sqrt(ss / hidden + 1e-5);
      for (int64_t i = 0; i < hidden; ++i) {
        const double v = xv[r * hidden + i] * rs * wv[i];
        const double want = clamp_q(v / (1 + std::exp(-v)), DType::kFloat8E4M3FN);
        EXPECT_NEAR(yv[r * hidden + i], want, fp8_ulp(want, DType::kFloat8E4M3FN))
            << "hidden " << hidden << " row " << r << " col " << i;
      }
    }
  }
  // Golden: [3, 4] -> rmsnorm [0.8485, 1.1314] -> silu [0.5942, 0.8554] -> e4m3 0.625, 0.875;
  // weight 1000 -> [848.5, 1131.4] -> saturates to 448.
  Tensor x = Tensor::from_vector({3, 4}, {1, 2}, DType::kBFloat16);
  Tensor o = Tensor::empty({1, 2}, DType::kFloat8E4M3FN);
  fused_rmsnorm_silu(x, Tensor::from_vector({1, 1}, {2}, DType::kBFloat16), 0.0, o);
  EXPECT_EQ(values(o), (std::vector<double>{0.625, 0.875}));
  fused_rmsnorm_silu(x, Tensor::from_vector({1000, 1000}, {2}, DType::kBFloat16), 0.0, o);
  EXPECT_EQ(values(o), (std::vector<double>{448, 448}));
}

// NVFP4 output, hand-checked: rows of ones (eps 0) make y = silu(weight), which is the weight
// itself in fp32 for weights >= 17 (exp(-17) < 2^-24) and 0 for 0.
TEST(FusedRmsNormSilu, Nvfp4OutputGolden) {
  std::vector<double> w(32, 0.0);
  // Block 0: amax 144 -> s = 24, scale e4m3 0x5C; y / 24 = 1, 2, 4, 6, 1.5, 2.5 (tie -> 2, the
  // even code), 3.5 (tie -> 4), 0 -> codes 2, 4, 6, 7, 3, 4, 6, 0.
  const double b0[] = {24, 48, 96, 144, 36, 60, 84};
  for (int i = 0; i < 7; ++i) w[i] = b0[i];
  // Block 1: amax 100 -> s = 16.67 (stored as e4m3 16 = 0x58); 41 / 16.67 = 2.46 -> code 4
  // (dividing by the stored 16 would give 2.56 -> code 5: upstream divides by the unrounded s).
  w[16] = 100;
  w[17] = 41;
  Tensor x = Tensor::full({3, 32}, 1.0, DType::kBFloat16);
  // Row 1 zero with eps 0: rsqrt(0) = inf, y = 0 * inf = NaN. amax skips NaN (fmaxf), so s is
  // FLT_MIN, which e4m3 flushes to 0, and e2m1(NaN) is +6 (code 7, as CUDA's cvt).
  x.slice(0, 1, 2).fill_(0.0);
  Tensor wt = Tensor::from_vector(w, {32}, DType::kBFloat16);
  Tensor out = Tensor::empty({3, 16}, DType::kFloat4E2M1FNx2);
  std::memset(out.data_ptr(), 0xFF, 48);
  RmsNormSiluOutput r = fused_rmsnorm_silu(x, wt, 0.0, out);
  EXPECT_EQ(r.out.data_ptr(), out.data_ptr());
  ASSERT_TRUE(r.block_scale.defined());
  EXPECT_EQ(r.block_scale.dtype(), DType::kFloat8E4M3FN);
  EXPECT_EQ(r.block_scale.shape(), (Shape{3, 2}));
  const uint8_t* q = static_cast<const uint8_t*>(out.data_ptr());
  const uint8_t* sf = static_cast<const uint8_t*>(r.block_scale.data_ptr());
  const std::vector<uint8_t> row0 = {0x42, 0x76, 0x43, 0x06, 0, 0, 0, 0, 0x47, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(std::vector<uint8_t>(q, q + 16), row0);
  EXPECT_EQ(std::vector<uint8_t>(q + 16, q + 32), std::vector<uint8_t>(16, 0x77));
  EXPECT_EQ(std::vector<uint8_t>(q + 32, q + 48), row0);
  EXPECT_EQ(std::vector<uint8_t>(sf, sf + 6), (std::vector<uint8_t>{0x5C, 0x58, 0, 0, 0x5C, 0x58}));

  // Scale saturation: amax 5376 -> s = 896, stored as 448 (0x7E); codes 5376 / 896 = 6 (7),
  // 1792 / 896 = 2 (4). A block of silu(-24) ~ -9e-10 alone: s ~ 1.5e-10 is stored as e4m3 0,
  // yet y / s = -6 -> code 0xF (upstream quantizes with the unrounded s).
  std::vector<double> w2(32, 0.0);
  w2[0] = 5376;
  w2[1] = 1792;
  w2[16] = -24;
  Tensor block = Tensor::empty({1, 2}, DType::kFloat8E4M3FN);
  Tensor out2 = Tensor::empty({1, 16}, DType::kFloat4E2M1FNx2);
  RmsNormSiluOutput r2 =
      fused_rmsnorm_silu(Tensor::full({1, 32}, 1.0, DType::kBFloat16),
                         Tensor::from_vector(w2, {32}, DType::kBFloat16), 0.0, out2, block);
  EXPECT_EQ(r2.block_scale.data_ptr(), block.data_ptr());
  const uint8_t* q2 = static_cast<const uint8_t*>(out2.data_ptr());
  const uint8_t* s2 = static_cast<const uint8_t*>(block.data_ptr());
  EXPECT_EQ(q2[0], 0x47);
  EXPECT_EQ(q2[8], 0x0F);
  EXPECT_EQ(s2[0], 0x7E);
  EXPECT_EQ(s2[1], 0x00);
}

// The e4m3 / e2m1 grids, for the fp64 reference below: the nearest grid value, ties to the even
// code; `margin` gets the distance to the nearest rounding boundary relative to the value.
int nearest_code(double a, const std::vector<double>& grid, double& margin) {
  int best = 0;
  for (int c = 1; c < static_cast<int>(grid.size()); ++c) {
    const double d = std::fabs(a - grid[c]), db = std::fabs(a - grid[best]);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  margin = std::numeric_limits<double>::infinity();
  for (std::size_t c = 0; c + 1 < grid.size(); ++c) {
    const double mid = 0.5 * (grid[c] + grid[c + 1]);
    margin = std::min(margin, std::fabs(a - mid) / std::max(std::fabs(a), 1e-30));
  }
  return best;
}

// NVFP4 output against an fp64 formula: y in fp64, s = max(amax / 6, FLT_MIN), the scale byte
// the nearest e4m3 to s (saturating), codes the nearest e2m1 to y / s. Values within 1e-5 of a
// rounding boundary (where fp32 and fp64 may part) are not compared; nearly all are.
TEST(FusedRmsNormSilu, Nvfp4OutputMatchesFp64Formula) {
  std::vector<double> e4m3, e2m1 = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 127; ++c) e4m3.push_back(e4m3fn_bits_to_float(static_cast<uint8_t>(c)));
  int compared = 0, total = 0;
  for (int64_t hidden : {16, 64, 160}) {
    Tensor x = strided_rand({5, hidden}, DType::kBFloat16, hidden, -3, 3);
    Tensor w = rand_tensor({hidden}, DType::kBFloat16, hidden + 3, -4, 4);
    Tensor out = Tensor::empty({5, hidden / 2}, DType::kFloat4E2M1FNx2);
    RmsNormSiluOutput r = fused_rmsnorm_silu(x, w, 1e-5, out);
    const auto xv = values(x), wv = values(w);
    const uint8_t* q = static_cast<const uint8_t*>(out.data_ptr());
    const uint8_t* sf = static_cast<const uint8_t*>(r.block_scale.data_ptr());
    for (int64_t row = 0; row < 5; ++row) {
      double ss = 0;
      for (int64_t i = 0; i < hidden; ++i) ss += xv[row * hidden + i] * xv[row * hidden + i];
      const double rs = 1 / std::sqrt(ss / hidden + 1e-5);
      std::vector<double> y(hidden);
      for (int64_t i = 0; i < hidden; ++i) {
        const double v = xv[row * hidden + i] * rs * wv[i];
        y[i] = v / (1 + std::exp(-v));
      }
      for (int64_t blk = 0; blk < hidden / 16; ++blk) {
        double amax = 0;
        for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(y[blk * 16 + i]));
        const double s = std::max(amax / 6, static_cast<double>(std::numeric_limits<float>::min()));
        double m = 0;
        const int sc = nearest_code(std::min(s, 448.0), e4m3, m);
        ++total;
        if (m > 1e-5) {
          ++compared;
          EXPECT_EQ(sf[row * (hidden / 16) + blk], sc) << hidden << " " << row << " " << blk;
        }
        for (int i = 0; i < 16; ++i) {
          const double a = y[blk * 16 + i] / s;
          const int code = nearest_code(std::min(std::fabs(a), 6.0), e2m1, m) + (a < 0 ? 8 : 0);
          const int64_t e = row * hidden + blk * 16 + i;
          const int got = (e % 2 == 0) ? (q[e / 2] & 0xF) : (q[e / 2] >> 4);
          ++total;
          if (m > 1e-5) {
            ++compared;
            EXPECT_EQ(got, code) << hidden << " " << row << " " << blk * 16 + i << " " << a;
          }
        }
      }
    }
  }
  EXPECT_GT(compared, total * 95 / 100);
}

TEST(FusedRmsNormSilu, Nvfp4BadInput) {
  const char* op = "fused_rmsnorm_silu";
  Tensor x = rand_tensor({4, 32}, DType::kBFloat16, 1);
  Tensor w = rand_tensor({32}, DType::kBFloat16, 2);
  Tensor out = Tensor::empty({4, 16}, DType::kFloat4E2M1FNx2);
  // hidden % 16 != 0; out shapes of the bf16 layout and a wrong column count.
  EXPECT_FI_ERROR(fused_rmsnorm_silu(rand_tensor({4, 24}, DType::kBFloat16, 3),
                                     rand_tensor({24}, DType::kBFloat16, 4), 1e-6,
                                     Tensor::empty({4, 12}, DType::kFloat4E2M1FNx2)),
                  op, "out");
  EXPECT_FI_ERROR(fused_rmsnorm_silu(x, w, 1e-6, Tensor::empty({4, 32}, DType::kFloat4E2M1FNx2)),
                  op, "out");
  EXPECT_FI_ERROR(fused_rmsnorm_silu(x, w, 1e-6, Tensor::empty({3, 16}, DType::kFloat4E2M1FNx2)),
                  op, "out");
  // block_scale: dtype, shape, undefined.
  EXPECT_FI_ERROR(fused_rmsnorm_silu(x, w, 1e-6, out, Tensor::empty({4, 2}, DType::kUInt8)), op,
                  "block_scale");
  EXPECT_FI_ERROR(fused_rmsnorm_silu(x, w, 1e-6, out, Tensor::empty({4, 4}, DType::kFloat8E4M3FN)),
                  op, "block_scale");
  EXPECT_FI_ERROR(fused_rmsnorm_silu(x, w, 1e-6, out, Tensor()), op, "block_scale");
}

TEST(FusedRmsNormSilu, Nvfp4RecordAndReplay) {
  Tensor x = rand_tensor({3, 48}, DType::kBFloat16, 11);
  Tensor w = rand_tensor({48}, DType::kBFloat16, 12);
  Tensor out = Tensor::empty({3, 24}, DType::kFloat4E2M1FNx2);
  Tensor bs = Tensor::empty({3, 3}, DType::kFloat8E4M3FN);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    fused_rmsnorm_silu(x, w, 1e-6, out);
    fused_rmsnorm_silu(x, w, 1e-5, out, bs);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& c : calls) EXPECT_TRUE(replays_identically(c));
}

TEST(FusedRmsNormSilu, BadInput) {
  Tensor x = rand_tensor({4, 8}, DType::kBFloat16, 1);
  Tensor w = rand_tensor({8}, DType::kBFloat16, 2);
  const char* op = "fused_rmsnorm_silu";
  EXPECT_FI_ERROR(fused_rmsnorm_silu(x.to(DType::kFloat16), w.to(DType::kFloat16)), op, "input");
  EXPECT_FI_ERROR(fused_rmsnorm_silu(x, w.to(DType::kFloat32)), op, "weight");
  EXPECT_FI_ERROR(fused_rmsnorm_silu(x, w, 1e-6, Tensor::empty({4, 8}, DType::kFloat8E5M2)), op,
                  "out");
  EXPECT_FI_ERROR(fused_rmsnorm_silu(x, w, 1e-6, Tensor::empty({4, 4}, DType::kUInt8)), op, "out");
  EXPECT_FI_ERROR(fused_rmsnorm_silu(x, w, 1e-6, Tensor::empty({4, 7}, DType::kBFloat16)), op,
                  "out");
  EXPECT_FI_ERROR(fused_rmsnorm_silu(x, w, -1.0), op, "eps");
}

// The CUDA kernel reads a row with 16-byte loads where it is unit-stride and 16-byte aligned
// (norm_quant_kernel: the row staged in shared memory, then the element kernel's passes) and
// element by element otherwise (norm_quant_strided_kernel). The same values at an aligned address
// and one element past it take one kernel each: every output byte and the written residual
// agree bit for bit (the same per-thread sums in the same order).
TEST(NormQuantCuda, VectorAndStridedKernelsAgreeBitExact) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  auto bytes_of = [](const Tensor& t) {
    const Tensor c = t.to(Device::cpu()).contiguous();
    const auto* p = static_cast<const uint8_t*>(c.data_ptr());
    return std::vector<uint8_t>(p, p + c.numel() * static_cast<int64_t>(c.element_size()));
  };
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t hidden : {4096, 520}) {
      SCOPED_TRACE(::testing::Message() << dtype_label(dt) << " hidden " << hidden);
      const int64_t rows = 40, n = rows * hidden;
      Tensor xb = rand_tensor({n + 1}, dt, 11 + hidden).to(g);
      Tensor rb = rand_tensor({n + 1}, dt, 12 + hidden).to(g);
      Tensor w = rand_tensor({hidden}, dt, 13).to(g);
      Tensor gm = rand_tensor({hidden}, DType::kFloat32, 14).to(g);
      Tensor bt = rand_tensor({hidden}, DType::kFloat32, 15).to(g);
      std::vector<std::vector<uint8_t>> got[2];
      for (int64_t off : {0, 1}) {
        // Elements 1..n of the buffers: in place (one element past an aligned address: strided
        // kernel), or cloned to an aligned allocation (vector kernel).
        Tensor x = xb.slice(0, 1, n + 1).view({rows, hidden});
        Tensor res = rb.clone().slice(0, 1, n + 1).view({rows, hidden});
        if (off == 0) {
          x = x.clone();
          res = res.clone();
        }
        std::vector<std::vector<uint8_t>>& out = got[off];
        for (DType od : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
          Tensor o1 = Tensor::empty({rows, hidden}, od, g),
                 o2 = Tensor::empty({rows, hidden}, od, g),
                 o3 = Tensor::empty({rows, hidden}, od, g);
          rmsnorm_quant(o1, x, w, 0.05, 1e-5);
          fused_add_rmsnorm_quant(o2, x, res, w, 0.05, 1e-5);
          layernorm_quant(o3, x, gm, bt, 0.05, 1e-5);
          for (const Tensor& t : {o1, o2, o3, res}) out.push_back(bytes_of(t));
        }
        if (dt == DType::kBFloat16) {
          out.push_back(bytes_of(fused_rmsnorm_silu(x, w, 1e-5).out));
          out.push_back(bytes_of(
              fused_rmsnorm_silu(x, w, 1e-5, Tensor::empty({rows, hidden}, DType::kFloat8E4M3FN, g))
                  .out));
        }
      }
      ASSERT_EQ(got[0].size(), got[1].size());
      for (std::size_t i = 0; i < got[0].size(); ++i) EXPECT_EQ(got[0][i], got[1][i]) << i;
    }
  }
}

TEST(NormQuant, RecordAndReplay) {
  Tensor x = rand_tensor({3, 40}, DType::kBFloat16, 1);
  Tensor r = rand_tensor({3, 40}, DType::kBFloat16, 2);
  Tensor w = rand_tensor({40}, DType::kBFloat16, 3);
  Tensor g = rand_tensor({40}, DType::kFloat32, 4), b = rand_tensor({40}, DType::kFloat32, 5);
  Tensor o = Tensor::empty({3, 40}, DType::kFloat8E4M3FN);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    rmsnorm_quant(o, x, w, 0.1);
    fused_add_rmsnorm_quant(o, x, r, w, Tensor::full({1}, 0.2, DType::kFloat32));
    layernorm_quant(o, x, g, b, 0.3, 1e-5);
    fused_rmsnorm_silu(x, w);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 4u);
  for (const auto& c : calls) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(replays_identically(c));
  }
}

}  // namespace
}  // namespace flashinfer::testing
