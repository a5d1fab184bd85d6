// The grouped / fused NVFP4 and MXFP8 quantizers, the weight shuffles and the NVFP4 KV-cache
// quantizers: hand-checked golden values, an independent per-block formula (float_formats.h
// conversions) over shapes and dtypes, the permuted output views, every bad input, record/replay.
#include <gtest/gtest.h>

#include <cmath>
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
std::vector<uint8_t> bytes(const Tensor& t) {
  Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.numel() * static_cast<int64_t>(c.element_size()));
}
Tensor i32(const std::vector<double>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::kInt32);
}
Tensor f32(const std::vector<double>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::kFloat32);
}

// Index of (row, col) in a 128x4-swizzled scale block with num_sf_cols columns (the layout
// formula of docs/GEMM_AND_QUANTIZATION.md, written out here independently).
int64_t swz(int64_t r, int64_t c, int64_t num_sf_cols) {
  const int64_t t = (num_sf_cols + 3) / 4;
  return (r / 128) * t * 512 + (c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
}

// One NVFP4 block of 16 values (fp32 steps as upstream): (scale code, 16 e2m1 codes).
std::pair<uint8_t, std::vector<uint8_t>> nvfp4_block(const float* x, float gs) {
  float amax = 0;
  for (int i = 0; i < 16; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const uint8_t sc = float_to_e4m3fn_bits(gs * amax / 6.0f, true);
  const float sf = e4m3fn_bits_to_float(sc);
  std::vector<uint8_t> q(16, 0);
  for (int i = 0; i < 16; ++i) q[i] = sf == 0.0f ? 0 : float_to_e2m1_bits((x[i] * gs) / sf);
  return {sc, q};
}

// Expected (data [m, k/2], 128x4 scales) of an [m, k] fp32 matrix of rows that were already
// rounded to the input dtype.
void expect_nvfp4_rows(const std::vector<float>& x, int64_t m, int64_t k, float gs,
                       const uint8_t* q, const uint8_t* sf) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < k / 16; ++b) {
      auto [sc, codes] = nvfp4_block(&x[r * k + b * 16], gs);
      ASSERT_EQ(sf[swz(r, b, k / 16)], sc) << "row " << r << " block " << b;
      for (int i = 0; i < 8; ++i) {
        ASSERT_EQ(q[r * (k / 2) + b * 8 + i], pack_e2m1x2(codes[2 * i], codes[2 * i + 1]))
            << "row " << r << " block " << b << " byte " << i;
      }
    }
  }
}

std::vector<float> floats(const Tensor& t) {
  std::vector<float> v;
  for (double d : values(t)) v.push_back(static_cast<float>(d));
  return v;
}

// silu(g) * u in fp32, rounded to dtype.
Tensor silu_mul_ref(const Tensor& a, DType dtype) {
  const int64_t k = a.size(-1) / 2, rows = a.numel() / a.size(-1);
  const auto v = floats(a);
  std::vector<double> y;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      const float g = v[r * 2 * k + j], u = v[r * 2 * k + k + j];
      y.push_back(g / (1.0f + std::exp(-g)) * u);
    }
  }
  Shape s = a.shape();
  s.back() = k;
  return Tensor::from_vector(y, s, DType::kFloat32).to(dtype);
}

// ---- golden values ---------------------------------------------------------------------------

TEST(Nvfp4Kv, Golden) {
  // Block {6, 3, -1.5, 0 x 13}: gs = 1 -> sf = e4m3(1 * (6 * (1/6))) = 1 (0x38), codes 7, 5,
  // 8|3, 0 -> bytes 0x57, 0x0B, 0, ...
  std::vector<double> x(16, 0.0);
  x[0] = 6, x[1] = 3, x[2] = -1.5;
  Tensor in = Tensor::from_vector(x, {1, 16}, DType::kBFloat16);
  auto [q, s] = nvfp4_kv_quantize(in, f32({1.0}));
  EXPECT_EQ(q.shape(), (Shape{1, 8}));
  EXPECT_EQ(s.shape(), (Shape{1, 1}));
  EXPECT_EQ(bytes(s), (std::vector<uint8_t>{0x38}));
  EXPECT_EQ(bytes(q), (std::vector<uint8_t>{0x57, 0x0B, 0, 0, 0, 0, 0, 0}));
  // gs = 0.5: sf = 2 (0x40), out scale 1 / (2 * 0.5) = 1: the same codes.
  auto [q2, s2] = nvfp4_kv_quantize(in, f32({0.5}));
  EXPECT_EQ(bytes(s2), (std::vector<uint8_t>{0x40}));
  EXPECT_EQ(bytes(q2), bytes(q));
  // Dequantized: e2m1 * 2 * 0.5.
  Tensor d = nvfp4_kv_dequantize(q2, s2, f32({0.5}));
  EXPECT_EQ(d.dtype(), DType::kBFloat16);
  EXPECT_EQ(values(d), x);
  Tensor d16 = nvfp4_kv_dequantize(q2, s2, f32({0.25}), DType::kFloat16);
  EXPECT_EQ(d16.dtype(), DType::kFloat16);
  EXPECT_EQ(values(d16)[0], 3.0);
  // An all-zero block: sf 0, codes 0.
  auto [q3, s3] = nvfp4_kv_quantize(Tensor::zeros({2, 32}, DType::kFloat16), f32({1.0}));
  EXPECT_EQ(bytes(s3), (std::vector<uint8_t>(4, 0)));
  EXPECT_EQ(bytes(q3), (std::vector<uint8_t>(32, 0)));
}

TEST(ShuffleMatrixA, Golden) {
  // Rows hold their index. Block 16 (epilogue_tile_m 64): out = [0, 2, ..., 14, 1, 3, ..., 15].
  std::vector<double> rows;
  for (int i = 0; i < 32; ++i) rows.insert(rows.end(), {double(i), double(i)});
  Tensor x = Tensor::from_vector(rows, {32, 2}, DType::kInt32);
  Tensor y = shuffle_matrix_a(x, 64);
  std::vector<double> want;
  for (int blk = 0; blk < 2; ++blk) {
    for (int j = 0; j < 8; ++j) want.insert(want.end(), {16.0 * blk + 2 * j, 16.0 * blk + 2 * j});
    for (int j = 0; j < 8; ++j) {
      want.insert(want.end(), {16.0 * blk + 2 * j + 1, 16.0 * blk + 2 * j + 1});
    }
  }
  EXPECT_EQ(values(y), want);
  // Block 32 (epilogue_tile_m 128): out row 8*a + b takes input row 4*b + a
  // (row_map {0, 8, 16, 24, 1, 9, ...}: input row i goes to out row 8*(i%4) + i/4).
  Tensor z = shuffle_matrix_a(x, 128);
  const auto zv = values(z);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(zv[2 * (8 * (i % 4) + i / 4)], i) << i;
}

TEST(ShuffleMatrixSfA, IsShuffleThenInterleave) {
  Tensor sf = Tensor::empty({256, 8}, DType::kUInt8);
  for (int64_t i = 0; i < sf.numel(); ++i) sf.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
  Tensor out = shuffle_matrix_sf_a(sf, 128);
  EXPECT_EQ(out.shape(), (Shape{256 * 8}));
  EXPECT_EQ(bytes(out), bytes(block_scale_interleave(shuffle_matrix_a(sf, 128))));
  // Element (new row r, col c) of the 128x4 layout is input row row_indices[r].
  Tensor shuffled = shuffle_matrix_a(sf, 128);
  const auto o = bytes(out), sh = bytes(shuffled);
  for (int64_t r = 0; r < 256; ++r) {
    for (int64_t c = 0; c < 8; ++c) ASSERT_EQ(o[swz(r, c, 8)], sh[r * 8 + c]);
  }
}

TEST(Mxfp4DequantizeHost, Golden) {
  // Byte 0x72: low nibble 2 -> 1.0, high 7 -> 6.0. Scales 128 -> 2, 127 -> 1, 0 -> 2^-127,
  // 255 -> NaN; group_size 2 gives one scale per byte.
  Tensor w = Tensor::from_vector({0x72, 0x72, 0xF9, 0x72}, {1, 4}, DType::kUInt8);
  Tensor s = Tensor::from_vector({128, 127, 0, 255}, {1, 4}, DType::kUInt8);
  Tensor y = mxfp4_dequantize_host(w, s, 2);
  EXPECT_EQ(y.dtype(), DType::kFloat32);
  const auto v = values(y);
  EXPECT_EQ(v[0], 2.0);
  EXPECT_EQ(v[1], 12.0);
  EXPECT_EQ(v[2], 1.0);
  EXPECT_EQ(v[3], 6.0);
  EXPECT_EQ(v[4], -0.5 * std::ldexp(1.0, -127));  // 0xF9: low 9 -> -0.5, high 15 -> -6
  EXPECT_EQ(v[5], -6.0 * std::ldexp(1.0, -127));
  EXPECT_TRUE(std::isnan(v[6]));
  // Default group_size 32: one scale for 32 values.
  Tensor w2 = Tensor::full({2, 16}, 0x21, DType::kUInt8);  // 0.5, 1.0
  Tensor s2 = Tensor::from_vector({126, 130}, {2, 1}, DType::kUInt8);
  const auto v2 = values(mxfp4_dequantize_host(w2, s2));
  EXPECT_EQ(v2[0], 0.25);
  EXPECT_EQ(v2[1], 0.5);
  EXPECT_EQ(v2[32], 4.0);
  EXPECT_EQ(v2[33], 8.0);
}

// ---- formulas over shapes and dtypes ---------------------------------------------------------

TEST(Nvfp4BatchedQuantize, MatchesBlockFormula) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (Shape shp : {Shape{2, 3, 32}, Shape{3, 130, 48}}) {
      SCOPED_TRACE(dtype_label(dt));
      Tensor a = rand_tensor(shp, dt, 5 + shp[1], -4, 4);
      const float gs = 448.0f * 6.0f / 4.0f;
      auto [q, sf] = nvfp4_batched_quantize(a, f32({gs}));
      const int64_t b = shp[0], m = shp[1], k = shp[2];
      const int64_t per = (m + 127) / 128 * 128 * ((k / 16 + 3) / 4 * 4);
      EXPECT_EQ(q.shape(), (Shape{b, m, k / 2}));
      EXPECT_EQ(sf.shape(), (Shape{b, per}));
      const auto x = floats(a);
      const auto qb = bytes(q), sb = bytes(sf);
      for (int64_t i = 0; i < b; ++i) {
        std::vector<float> xi(x.begin() + i * m * k, x.begin() + (i + 1) * m * k);
        expect_nvfp4_rows(xi, m, k, gs, qb.data() + i * m * k / 2, sb.data() + i * per);
      }
      // Padding scales are zero; and each batch equals fp4_quantize of that batch.
      auto [q0, sf0] = fp4_quantize(a.select(0, b - 1).contiguous(), f32({gs}));
      EXPECT_EQ(std::vector<uint8_t>(sb.end() - per, sb.end()), bytes(sf0));
      EXPECT_EQ(std::vector<uint8_t>(qb.end() - m * k / 2, qb.end()), bytes(q0));
    }
  }
}

// Checks a grouped NVFP4 result against the block formula on `x` ([L, M, K] fp32 values already
// in the input dtype): per-group scales, rows >= mask zero, upstream's permuted views.
void expect_grouped(const Tensor& q, const Tensor& sf, const std::vector<float>& x, int64_t l,
                    int64_t m, int64_t k, const std::vector<double>& mask,
                    const std::vector<double>& gs) {
  const int64_t pm = (m + 127) / 128 * 128, pk = (k / 16 + 3) / 4 * 4;
  EXPECT_EQ(q.shape(), (Shape{m, k / 2, l}));
  EXPECT_EQ(q.strides(), (Shape{k / 2, 1, m * k / 2}));
  EXPECT_EQ(q.dtype(), DType::kUInt8);
  EXPECT_EQ(sf.shape(), (Shape{32, 4, pm / 128, 4, pk / 4, l}));
  EXPECT_EQ(sf.dtype(), DType::kFloat8E4M3FN);
  // The views' storage: group-major bytes.
  const Tensor qp = q.permute({2, 0, 1}).contiguous();
  const Tensor sp = sf.permute({5, 2, 4, 0, 1, 3}).contiguous();
  const auto qb = bytes(qp), sb = bytes(sp);
  for (int64_t g = 0; g < l; ++g) {
    const int64_t rows = static_cast<int64_t>(mask[g]);
    std::vector<float> xg(x.begin() + g * m * k, x.begin() + g * m * k + rows * k);
    expect_nvfp4_rows(xg, rows, k, static_cast<float>(gs[g]), qb.data() + g * m * k / 2,
                      sb.data() + g * pm * pk);
    for (int64_t i = rows * k / 2; i < m * k / 2; ++i) ASSERT_EQ(qb[g * m * k / 2 + i], 0);
    for (int64_t r = rows; r < pm; ++r) {
      for (int64_t c = 0; c < pk; ++c) ASSERT_EQ(sb[g * pm * pk + swz(r, c, pk)], 0);
    }
  }
  // The logical view: sf[r % 32, (r % 128) / 32, r / 128, c % 4, c / 4, g] is scale (r, c).
  const Tensor sfc = sf.contiguous();
  const auto s6 = bytes(sfc);
  const Shape st = sfc.strides();
  const int64_t g = l - 1, r = std::min<int64_t>(static_cast<int64_t>(mask[g]), m) - 1, c = 0;
  if (r >= 0) {
    const int64_t at = (r % 32) * st[0] + ((r % 128) / 32) * st[1] + (r / 128) * st[2] +
                       (c % 4) * st[3] + (c / 4) * st[4] + g * st[5];
    EXPECT_EQ(s6[at], sb[g * pm * pk + swz(r, c, pk)]);
  }
}

TEST(ScaledFp4GroupedQuantize, MatchesBlockFormula) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const int64_t l = 3, m = 5, k = 80;
    Tensor a = rand_tensor({l, m, k}, dt, 17, -4, 4);
    const std::vector<double> mask = {5, 2, 0}, gs = {672, 300, 1000};
    auto [q, sf] = scaled_fp4_grouped_quantize(a, i32(mask), f32(gs));
    expect_grouped(q, sf, floats(a), l, m, k, mask, gs);
  }
  // More rows than one 128-row tile.
  Tensor a = rand_tensor({2, 130, 32}, DType::kBFloat16, 3, -4, 4);
  auto [q, sf] = scaled_fp4_grouped_quantize(a, i32({130, 129}), f32({672, 672}));
  expect_grouped(q, sf, floats(a), 2, 130, 32, {130, 129}, {672, 672});
}

TEST(SiluAndMulScaledNvfp4ExpertsQuantize, IsSiluMulThenGroupedQuantize) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const int64_t l = 2, m = 4, k = 32;
    Tensor a = rand_tensor({l, m, 2 * k}, dt, 9, -4, 4);
    const std::vector<double> mask = {3, 4}, gs = {672, 1000};
    auto [q, sf] = silu_and_mul_scaled_nvfp4_experts_quantize(a, i32(mask), f32(gs));
    const Tensor y = silu_mul_ref(a, dt);
    expect_grouped(q, sf, floats(y), l, m, k, mask, gs);
  }
}

TEST(SiluAndMulNvfp4Quantize, IsSiluMulThenFp4Quantize) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    Tensor a = rand_tensor({7, 64}, dt, 21, -4, 4);
    const Tensor y = silu_mul_ref(a, dt);
    for (bool swizzled : {true, false}) {
      for (bool l8x4 : {false, true}) {
        auto [q, sf] = silu_and_mul_nvfp4_quantize(a, f32({672}), 16, swizzled, l8x4);
        auto [q2, sf2] = fp4_quantize(y, f32({672}), 16, false, swizzled, l8x4);
        EXPECT_EQ(q.shape(), (Shape{7, 16}));
        EXPECT_EQ(sf.shape(), sf2.shape());
        EXPECT_EQ(bytes(q), bytes(q2));
        EXPECT_EQ(bytes(sf), bytes(sf2));
      }
    }
    // And the block formula directly (128x4 scales).
    auto [q, sf] = silu_and_mul_nvfp4_quantize(a, f32({672}));
    const auto qb = bytes(q), sb = bytes(sf);
    expect_nvfp4_rows(floats(y), 7, 32, 672.0f, qb.data(), sb.data());
  }
}

TEST(Mxfp8GroupedQuantize, MatchesMxfp8Blocks) {
  const int64_t l = 2, m = 3, k = 96, pk = 128, pm = 128, sk = pk / 32;
  Tensor a = rand_tensor({l, m, k}, DType::kBFloat16, 4, -4, 4);
  const std::vector<double> mask = {3, 1};
  auto [q, sf] = mxfp8_grouped_quantize(a, i32(mask));
  EXPECT_EQ(q.shape(), (Shape{m, pk, l}));
  EXPECT_EQ(q.dtype(), DType::kFloat8E4M3FN);
  EXPECT_EQ(sf.shape(), (Shape{32, 4, pm / 128, 4, pk / 128, l}));
  EXPECT_EQ(sf.dtype(), DType::kUInt8);
  const auto qb = bytes(q.permute({2, 0, 1}).contiguous());
  const auto sb = bytes(sf.permute({5, 2, 4, 0, 1, 3}).contiguous());
  const auto x = floats(a);
  for (int64_t g = 0; g < l; ++g) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t b = 0; b < sk; ++b) {
        const bool valid = r < mask[g];
        float amax = 0;
        for (int i = 0; i < 32; ++i) {
          const int64_t c = b * 32 + i;
          if (valid && c < k) amax = std::fmax(amax, std::fabs(x[(g * m + r) * k + c]));
        }
        // ue8m0: the smallest power of two >= amax / 448 (2^-127 for a zero block).
        int e = -127;
        while (valid && amax > 0 && std::ldexp(1.0, e) < static_cast<double>(amax / 448.0f)) ++e;
        const uint8_t code = valid ? static_cast<uint8_t>(e + 127) : 0;
        ASSERT_EQ(sb[g * pm * sk + swz(r, b, sk)], code) << g << " " << r << " " << b;
        for (int i = 0; i < 32; ++i) {
          const int64_t c = b * 32 + i;
          const float v = valid && c < k ? x[(g * m + r) * k + c] : 0.0f;
          const uint8_t want = valid ? float_to_e4m3fn_bits(v / std::ldexp(1.0f, e), true) : 0;
          ASSERT_EQ(qb[(g * m + r) * pk + c], want) << g << " " << r << " " << c;
        }
      }
    }
  }
}

TEST(Nvfp4Kv, RoundTripAndFormula) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    Tensor x = rand_tensor({9, 64}, dt, 31, -3, 3);
    const float gs = 3.0f / (448.0f * 6.0f);
    auto [q, s] = nvfp4_kv_quantize(x, f32({gs}));
    const auto xv = floats(x);
    const auto qb = bytes(q), sb = bytes(s);
    for (int64_t r = 0; r < 9; ++r) {
      for (int64_t b = 0; b < 4; ++b) {
        float amax = 0;
        for (int i = 0; i < 16; ++i) amax = std::fmax(amax, std::fabs(xv[r * 64 + b * 16 + i]));
        const uint8_t sc = float_to_e4m3fn_bits((1.0f / gs) * (amax * (1.0f / 6.0f)), true);
        ASSERT_EQ(sb[r * 4 + b], sc);
        const float os = amax != 0 ? 1.0f / (e4m3fn_bits_to_float(sc) * gs) : 0.0f;
        for (int i = 0; i < 16; ++i) {
          const uint8_t byte = qb[r * 32 + b * 8 + i / 2];
          ASSERT_EQ(i % 2 == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte),
                    float_to_e2m1_bits(xv[r * 64 + b * 16 + i] * os));
        }
      }
    }
    // Dequantize: fp32 (e2m1 * sf) * gs rounded to the output dtype; within half an e2m1 step
    // of the input (the block scale is amax / 6 up to e4m3 rounding).
    Tensor d = nvfp4_kv_dequantize(q, s, f32({gs}), dt);
    const auto dv = values(d);
    for (int64_t i = 0; i < 9 * 64; ++i) {
      const uint8_t byte = qb[i / 2];
      const float e = e2m1_bits_to_float(i % 2 == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte));
      const float want = e * e4m3fn_bits_to_float(sb[i / 16]) * gs;
      ASSERT_EQ(dv[i], values(Tensor::full({1}, want, DType::kFloat32).to(dt))[0]);
      EXPECT_NEAR(dv[i], xv[i], 0.6);
    }
  }
}

// ---- bad input -------------------------------------------------------------------------------

TEST(Nvfp4Ops, BadInput) {
  Tensor a = rand_tensor({2, 4, 32}, DType::kBFloat16, 1);
  Tensor m2 = i32({4, 4}), gs2 = f32({1, 1});
  const char* g = "scaled_fp4_grouped_quantize";
  EXPECT_FI_ERROR(scaled_fp4_grouped_quantize(a.select(0, 0), m2, gs2), g, "a");
  EXPECT_FI_ERROR(scaled_fp4_grouped_quantize(a.to(DType::kFloat32), m2, gs2), g, "a");
  EXPECT_FI_ERROR(
      scaled_fp4_grouped_quantize(rand_tensor({2, 4, 24}, DType::kBFloat16, 1), m2, gs2), g, "a");
  EXPECT_FI_ERROR(scaled_fp4_grouped_quantize(a, i32({4}), gs2), g, "mask");
  EXPECT_FI_ERROR(scaled_fp4_grouped_quantize(a, i32({4, 5}), gs2), g, "mask");
  EXPECT_FI_ERROR(scaled_fp4_grouped_quantize(a, f32({4, 4}), gs2), g, "mask");
  EXPECT_FI_ERROR(scaled_fp4_grouped_quantize(a, m2, f32({1})), g, "a_global_sf");
  const char* ex = "silu_and_mul_scaled_nvfp4_experts_quantize";
  EXPECT_FI_ERROR(silu_and_mul_scaled_nvfp4_experts_quantize(
                      rand_tensor({2, 4, 48}, DType::kBFloat16, 1), m2, gs2),
                  ex, "a");  // K = 24;  // K = 16
  EXPECT_FI_ERROR(silu_and_mul_scaled_nvfp4_experts_quantize(
                      rand_tensor({2, 4, 64}, DType::kBFloat16, 1), i32({1, -1}), gs2),
                  ex, "mask");
  const char* b = "nvfp4_batched_quantize";
  EXPECT_FI_ERROR(nvfp4_batched_quantize(a, f32({1}), 32), b, "sf_vec_size");
  EXPECT_FI_ERROR(nvfp4_batched_quantize(a, gs2), b, "a_global_sf");
  EXPECT_FI_ERROR(nvfp4_batched_quantize(a.select(0, 0), f32({1})), b, "a");
  const char* x8 = "mxfp8_grouped_quantize";
  EXPECT_FI_ERROR(mxfp8_grouped_quantize(rand_tensor({2, 4, 48}, DType::kBFloat16, 1), m2), x8,
                  "a");
  EXPECT_FI_ERROR(mxfp8_grouped_quantize(a, Tensor::from_vector({4, 4}, {2}, DType::kInt64)), x8,
                  "mask");
  const char* s = "silu_and_mul_nvfp4_quantize";
  Tensor in = rand_tensor({4, 64}, DType::kBFloat16, 2);
  EXPECT_FI_ERROR(silu_and_mul_nvfp4_quantize(in, f32({1}), 32), s, "sf_vec_size");
  EXPECT_FI_ERROR(silu_and_mul_nvfp4_quantize(rand_tensor({4, 48}, DType::kBFloat16, 2), f32({1})),
                  s, "input");
  EXPECT_FI_ERROR(silu_and_mul_nvfp4_quantize(in, f32({1, 2})), s, "global_scale");
  EXPECT_FI_ERROR(silu_and_mul_nvfp4_quantize(in.to(DType::kFloat32), f32({1})), s, "input");
  Tensor u8 = Tensor::zeros({48, 8}, DType::kUInt8);
  EXPECT_FI_ERROR(shuffle_matrix_a(u8, 128), "shuffle_matrix_a", "input_tensor");  // 48 % 32
  EXPECT_FI_ERROR(shuffle_matrix_a(u8, 0), "shuffle_matrix_a", "epilogue_tile_m");
  EXPECT_FI_ERROR(shuffle_matrix_a(Tensor::zeros({32}, DType::kUInt8), 64), "shuffle_matrix_a",
                  "input_tensor");
  const char* sa = "shuffle_matrix_sf_a";
  EXPECT_FI_ERROR(shuffle_matrix_sf_a(Tensor::zeros({64, 8}, DType::kUInt8), 128), sa,
                  "input_tensor");
  EXPECT_FI_ERROR(shuffle_matrix_sf_a(Tensor::zeros({128, 6}, DType::kUInt8), 128), sa,
                  "input_tensor");
  EXPECT_FI_ERROR(shuffle_matrix_sf_a(Tensor::zeros({128, 8}, DType::kFloat32), 128), sa,
                  "input_tensor");
  EXPECT_FI_ERROR(shuffle_matrix_sf_a(Tensor::zeros({128, 8}, DType::kUInt8), 128, 32), sa,
                  "num_elts_per_sf");
  const char* h = "mxfp4_dequantize_host";
  Tensor w = Tensor::zeros({2, 16}, DType::kUInt8);
  EXPECT_FI_ERROR(mxfp4_dequantize_host(w, Tensor::zeros({2, 2}, DType::kUInt8)), h, "scale");
  EXPECT_FI_ERROR(mxfp4_dequantize_host(w, Tensor::zeros({3, 1}, DType::kUInt8)), h, "scale");
  EXPECT_FI_ERROR(mxfp4_dequantize_host(w.to(DType::kInt32), Tensor::zeros({2, 1}, DType::kUInt8)),
                  h, "weight");
  EXPECT_FI_ERROR(mxfp4_dequantize_host(w, Tensor::zeros({2, 1}, DType::kUInt8), 0), h,
                  "group_size");
  const char* kq = "nvfp4_kv_quantize";
  EXPECT_FI_ERROR(nvfp4_kv_quantize(rand_tensor({2, 24}, DType::kBFloat16, 1), f32({1})), kq,
                  "input");
  EXPECT_FI_ERROR(nvfp4_kv_quantize(rand_tensor({2, 32}, DType::kFloat32, 1), f32({1})), kq,
                  "input");
  EXPECT_FI_ERROR(nvfp4_kv_quantize(rand_tensor({2, 32}, DType::kBFloat16, 1), f32({1, 1})), kq,
                  "global_scale");
  const char* kd = "nvfp4_kv_dequantize";
  Tensor d = Tensor::zeros({2, 16}, DType::kUInt8);
  EXPECT_FI_ERROR(nvfp4_kv_dequantize(d, Tensor::zeros({2, 1}, DType::kUInt8), f32({1})), kd,
                  "block_scales");
  EXPECT_FI_ERROR(nvfp4_kv_dequantize(Tensor::zeros({2, 12}, DType::kUInt8),
                                      Tensor::zeros({2, 1}, DType::kUInt8), f32({1})),
                  kd, "fp4_data");
  EXPECT_FI_ERROR(
      nvfp4_kv_dequantize(d, Tensor::zeros({2, 2}, DType::kUInt8), f32({1}), DType::kFloat32), kd,
      "output_dtype");
}

TEST(Nvfp4Ops, RecordAndReplay) {
  Tensor a = rand_tensor({2, 4, 64}, DType::kBFloat16, 2, -4, 4);
  Tensor sf = Tensor::empty({128, 4}, DType::kUInt8);
  for (int64_t i = 0; i < sf.numel(); ++i) sf.data<uint8_t>()[i] = static_cast<uint8_t>(i);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    silu_and_mul_nvfp4_quantize(a.select(0, 0).contiguous(), f32({672}));
    silu_and_mul_scaled_nvfp4_experts_quantize(a, i32({4, 1}), f32({672, 500}));
    scaled_fp4_grouped_quantize(a, i32({2, 4}), f32({672, 500}));
    nvfp4_batched_quantize(a, f32({672}));
    mxfp8_grouped_quantize(a, i32({3, 0}));
    shuffle_matrix_a(sf, 64);
    shuffle_matrix_sf_a(sf, 128);
    mxfp4_dequantize_host(sf, Tensor::full({128, 1}, 127, DType::kUInt8), 8);
    auto [q, s] = nvfp4_kv_quantize(a.select(0, 1).contiguous(), f32({0.01}));
    nvfp4_kv_dequantize(q, s, f32({0.01}), DType::kFloat16);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 10u);
  for (const auto& c : calls) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(replays_identically(c));
  }
}

TEST(Nvfp4Ops, HostOnlyBackends) {
  for (const char* op :
       {"silu_and_mul_nvfp4_quantize", "silu_and_mul_scaled_nvfp4_experts_quantize",
        "scaled_fp4_grouped_quantize", "nvfp4_batched_quantize", "mxfp8_grouped_quantize",
        "shuffle_matrix_a", "shuffle_matrix_sf_a", "mxfp4_dequantize_host", "nvfp4_kv_quantize",
        "nvfp4_kv_dequantize"}) {
    SCOPED_TRACE(op);
    EXPECT_TRUE(op_has_backend(op, DeviceType::kCPU));
    EXPECT_FALSE(op_has_backend(op, DeviceType::kCUDA));
  }
}

}  // namespace
}  // namespace flashinfer::testing
