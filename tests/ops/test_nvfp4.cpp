// The grouped / fused NVFP4 and MXFP8 quantizers, the weight shuffles and the NVFP4 KV-cache
// quantizers: hand-checked golden values, an independent per-block formula (float_formats.h
// conversions) over shapes and dtypes, the permuted output views, every bad input, record/replay.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "api/device_props.h"
#include "flashinfer/flashinfer.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#if FLASHINFER_TEST_HAVE_CUDART
#include "util/cuda_graph_util.h"
#endif

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

// a_global_sf of M entries: row r of every batch item under its own scale (upstream's
// SFScale[rowIdx]); e4m3 input takes fp4_quantize's fp8 path. Each batch item's rows equal
// fp4_quantize of that row alone under that row's scale.
TEST(Nvfp4BatchedQuantize, PerRowScalesAndFp8Input) {
  const int64_t b = 2, m = 3, k = 32, nb = k / 16;
  const std::vector<double> gsv{448.0 * 6.0 / 4.0, 100.0, 2.0};
  for (DType dt : {DType::kBFloat16, DType::kFloat8E4M3FN}) {
    SCOPED_TRACE(dtype_label(dt));
    Tensor a = rand_tensor({b, m, k}, DType::kFloat32, 71, -4, 4).to(dt);
    auto [q, sf] = nvfp4_batched_quantize(a, f32(gsv));
    const int64_t per = 128 * 4;
    const auto qb = bytes(q), sb = bytes(sf);
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t r = 0; r < m; ++r) {
        auto [qr, sr] =
            fp4_quantize(a.select(0, i).slice(0, r, r + 1).contiguous(), f32({gsv[r]}), 16, false,
                         /*is_sf_swizzled_layout=*/false);
        const auto want_q = bytes(qr), want_s = bytes(sr);
        EXPECT_EQ(std::vector<uint8_t>(qb.begin() + (i * m + r) * k / 2,
                                       qb.begin() + (i * m + r + 1) * k / 2),
                  want_q)
            << i << " " << r;
        for (int64_t c = 0; c < nb; ++c) {
          EXPECT_EQ(sb[i * per + r * 16 + c], want_s[c]) << i << " " << r << " " << c;
        }
      }
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

TEST(Nvfp4QuantizeDoShuffle, IsLinearQuantizeThenShuffles) {
  // nvfp4_quantize(do_shuffle=True): linear-scale quantization, then shuffle_matrix_a on the data
  // and shuffle_matrix_sf_a on the scales (reshaped to the linear scales' shape), as upstream.
  Tensor a = rand_tensor({256, 128}, DType::kBFloat16, 77, -4, 4);
  auto [q, sf] = nvfp4_quantize(a, f32({672}), SfLayout::layout_128x4, true);
  auto [ql, sfl] = fp4_quantize(a, f32({672}), 16, false, false);
  EXPECT_EQ(q.shape(), (Shape{256, 64}));
  EXPECT_EQ(sf.shape(), (Shape{256, 8}));
  EXPECT_EQ(bytes(q), bytes(shuffle_matrix_a(ql, 128)));
  EXPECT_EQ(bytes(sf), bytes(shuffle_matrix_sf_a(sfl, 128)));
  // Row 1 of the shuffled data is input row 4 (block 32: out row 8 * (i % 4) + i / 4 = 1 for
  // i = 4).
  const auto qb = bytes(q), lb = bytes(ql);
  for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(qb[64 + c], lb[4 * 64 + c]);
}

// ---- paged NVFP4 caches ----------------------------------------------------------------------

TEST(Nvfp4QuantizePagedKvCache, MatchesFp4QuantizeAndVSwizzle) {
  for (bool hnd : {true, false}) {
    SCOPED_TRACE(hnd ? "HND" : "NHD");
    const int64_t pages = 3, ps = 8, h = 2, d = 64, sd = d / 16;
    const Shape shape = hnd ? Shape{pages, h, ps, d} : Shape{pages, ps, h, d};
    Tensor k = rand_tensor(shape, DType::kBFloat16, 41, -3, 3);
    Tensor v = rand_tensor(shape, DType::kBFloat16, 42, -5, 5);
    auto [fp4, sf, kgs, vgs] = nvfp4_quantize_paged_kv_cache(k, v, hnd ? "HND" : "NHD");
    auto [kq, vq] = fp4;
    auto [ksf, vsf] = sf;
    // Auto global scales: 448 / amax; returned as 1 / gs.
    float ka = 0, va = 0;
    for (float x : floats(k)) ka = std::fmax(ka, std::fabs(x));
    for (float x : floats(v)) va = std::fmax(va, std::fabs(x));
    const float kg = static_cast<float>(448.0 / ka), vg = static_cast<float>(448.0 / va);
    EXPECT_EQ(kgs, static_cast<double>(1.0f / kg));
    EXPECT_EQ(vgs, static_cast<double>(1.0f / vg));
    auto [kq2, ksf2] = fp4_quantize(k.reshape({-1, d}), f32({kg}), 16, false, false);
    auto [vq2, vsf2] = fp4_quantize(v.reshape({-1, d}), f32({vg}), 16, false, false);
    EXPECT_EQ(kq.shape(), (hnd ? Shape{pages, h, ps, d / 2} : Shape{pages, ps, h, d / 2}));
    EXPECT_EQ(ksf.dtype(), DType::kFloat8E4M3FN);
    EXPECT_EQ(bytes(kq), bytes(kq2));
    EXPECT_EQ(bytes(vq), bytes(vq2));
    EXPECT_EQ(bytes(ksf), bytes(ksf2));
    // V: within each (page, head) [ps, S] tile, out[(t/4)*4*S + s*4 + t%4] = in[t*S + s].
    const auto lin = bytes(vsf2), sw = bytes(vsf);
    auto at = [&](int64_t p, int64_t t, int64_t hh, int64_t s2) {
      return hnd ? ((p * h + hh) * ps + t) * sd + s2 : ((p * ps + t) * h + hh) * sd + s2;
    };
    for (int64_t p = 0; p < pages; ++p) {
      for (int64_t hh = 0; hh < h; ++hh) {
        for (int64_t t = 0; t < ps; ++t) {
          for (int64_t s2 = 0; s2 < sd; ++s2) {
            const int64_t o = (t / 4) * 4 * sd + s2 * 4 + t % 4;
            ASSERT_EQ(sw[at(p, o / sd, hh, o % sd)], lin[at(p, t, hh, s2)]);
          }
        }
      }
    }
    // Given global scales are used as they are.
    auto [fp4b, sfb, kgs2, vgs2] =
        nvfp4_quantize_paged_kv_cache(k, v, hnd ? "HND" : "NHD", f32({100}), f32({50}));
    EXPECT_EQ(kgs2, static_cast<double>(1.0f / 100.0f));
    EXPECT_EQ(vgs2, static_cast<double>(1.0f / 50.0f));
    EXPECT_EQ(bytes(std::get<0>(fp4b)),
              bytes(std::get<0>(fp4_quantize(k.reshape({-1, d}), f32({100}), 16, false, false))));
  }
}

// Bytes of a uint8 tensor as float8_e4m3fn (upstream's .view(torch.float8_e4m3fn)).
Tensor as_e4m3(const Tensor& u8) {
  Tensor c = u8.contiguous();
  Tensor t = Tensor::empty(c.shape(), DType::kFloat8E4M3FN);
  std::memcpy(t.data_ptr(), c.data_ptr(), static_cast<size_t>(c.numel()));
  return t;
}

// A packed cache whose (page, entry, head) rows come from nvfp4_kv_quantize rows
// r = (page * ps + entry) * h + head; the paged output must equal nvfp4_kv_dequantize's row r.
TEST(Nvfp4KvDequantizePaged, MatchesDenseDequantize) {
  const int64_t pages = 5, ps = 4, h = 2, dk = 32, dv = 64, batch = 2, max_len = 7;
  Tensor krows = rand_tensor({pages * ps * h, dk}, DType::kBFloat16, 8, -3, 3);
  Tensor vrows = rand_tensor({pages * ps * h, dv}, DType::kBFloat16, 9, -3, 3);
  auto [kq, ks] = nvfp4_kv_quantize(krows, f32({0.01}));
  auto [vq, vs] = nvfp4_kv_quantize(vrows, f32({0.02}));
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const Tensor kd = nvfp4_kv_dequantize(kq, ks, f32({0.5}), dt);
    const Tensor vd = nvfp4_kv_dequantize(vq, vs, f32({0.25}), dt);
    for (bool hnd : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (hnd ? "HND" : "NHD") << " " << dtype_label(dt));
      auto layout = [&](const Tensor& t, int64_t w) {
        Tensor x = t.view({pages, ps, h, w});
        return hnd ? x.permute({0, 2, 1, 3}).contiguous() : x;
      };
      const PagedKVCache cache(layout(kq, dk / 2), layout(vq, dv / 2));
      const PagedKVCache sf(as_e4m3(layout(ks, dk / 16)), as_e4m3(layout(vs, dv / 16)));
      Tensor table = Tensor::from_vector({2, 4, 1, 3}, {batch, 2}, DType::kInt64);
      Tensor lens = i32({7, 3});
      Tensor ok = Tensor::full({batch, max_len, h, dk}, 123, dt);
      Tensor ov = Tensor::full({batch, max_len, h, dv}, 123, dt);
      nvfp4_kv_dequantize_paged(cache, sf, table, lens, f32({0.5}), 0.25, ok, ov,
                                hnd ? "HND" : "NHD");
      const auto okv = values(ok), ovv = values(ov), kdv = values(kd), vdv = values(vd);
      const int64_t tbl[2][2] = {{2, 4}, {1, 3}}, len[2] = {7, 3};
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t t = 0; t < max_len; ++t) {
          for (int64_t hh = 0; hh < h; ++hh) {
            const int64_t r = t < len[b] ? (tbl[b][t / ps] * ps + t % ps) * h + hh : -1;
            for (int64_t c = 0; c < dk; ++c) {
              ASSERT_EQ(okv[((b * max_len + t) * h + hh) * dk + c], r < 0 ? 123 : kdv[r * dk + c]);
            }
            for (int64_t c = 0; c < dv; ++c) {
              ASSERT_EQ(ovv[((b * max_len + t) * h + hh) * dv + c], r < 0 ? 123 : vdv[r * dv + c]);
            }
          }
        }
      }
    }
  }
}

// Appends checked block by block against the append formula (sf = e4m3(amax / (6 * scale)),
// q = e2m1(x / (sf * scale))); every other cache byte is unchanged.
void expect_appended(const Tensor& cache_k, const Tensor& sf_k, const Tensor& before_k,
                     const Tensor& before_sf, const Tensor& key, float scale,
                     const std::vector<std::pair<int64_t, int64_t>>& dest, int64_t h, int64_t d) {
  // cache/sf NHD [pages, ps, h, d/2 | d/16] contiguous; dest[i] = (page, entry) or (-1, -1).
  const auto cb = bytes(cache_k), sb = bytes(sf_k);
  auto cexp = bytes(before_k), sexp = bytes(before_sf);
  const auto x = floats(key);
  const int64_t ps = cache_k.size(1);
  for (size_t i = 0; i < dest.size(); ++i) {
    if (dest[i].first < 0) continue;
    for (int64_t hh = 0; hh < h; ++hh) {
      const int64_t row = (dest[i].first * ps + dest[i].second) * h + hh;
      for (int64_t b = 0; b < d / 16; ++b) {
        const float* v = &x[(static_cast<int64_t>(i) * h + hh) * d + b * 16];
        float amax = 0;
        for (int j = 0; j < 16; ++j) amax = std::fmax(amax, std::fabs(v[j]));
        const uint8_t sc = float_to_e4m3fn_bits(amax > 0 ? amax / (6.0f * scale) : 0.0f, true);
        const float sr = e4m3fn_bits_to_float(sc);
        const float os = amax > 0 && sr > 0 ? 1.0f / (sr * scale) : 0.0f;
        sexp[row * (d / 16) + b] = sc;
        for (int j = 0; j < 8; ++j) {
          cexp[row * (d / 2) + b * 8 + j] =
              pack_e2m1x2(float_to_e2m1_bits(v[2 * j] * os), float_to_e2m1_bits(v[2 * j + 1] * os));
        }
      }
    }
  }
  EXPECT_EQ(cb, cexp);
  EXPECT_EQ(sb, sexp);
}

TEST(Nvfp4QuantizeAppendPagedKvCache, Golden) {
  // One token, one head, d 16: {6, 3, -1.5, 0...} with scale 1 -> sf 0x38, bytes 0x57 0x0B.
  std::vector<double> x(16, 0.0);
  x[0] = 6, x[1] = 3, x[2] = -1.5;
  Tensor key = Tensor::from_vector(x, {1, 1, 16}, DType::kBFloat16);
  Tensor kc = Tensor::zeros({2, 2, 1, 8}, DType::kUInt8),
         vc = Tensor::zeros({2, 2, 1, 8}, DType::kUInt8);
  Tensor ks = Tensor::zeros({2, 2, 1, 1}, DType::kFloat8E4M3FN),
         vs = Tensor::zeros({2, 2, 1, 1}, DType::kFloat8E4M3FN);
  // Request 0 owns page 1; position 1 -> page 1, entry 1.
  nvfp4_quantize_append_paged_kv_cache(key, key, i32({0}), i32({1}), PagedKVCache(kc, vc),
                                       PagedKVCache(ks, vs), i32({1}), i32({0, 1}), i32({2}), 1.0,
                                       0.5);
  const auto kb = bytes(kc), vb = bytes(vc), kss = bytes(ks), vss = bytes(vs);
  EXPECT_EQ(kb[(1 * 2 + 1) * 8 + 0], 0x57);
  EXPECT_EQ(kb[(1 * 2 + 1) * 8 + 1], 0x0B);
  EXPECT_EQ(kss[3], 0x38);
  EXPECT_EQ(vss[3], 0x40);  // 6 / (6 * 0.5) = 2; codes unchanged (x / (2 * 0.5))
  EXPECT_EQ(vb[(1 * 2 + 1) * 8 + 0], 0x57);
  EXPECT_EQ(kb[0], 0);
  EXPECT_EQ(kss[0], 0);
}

TEST(Nvfp4QuantizeAppendPagedKvCache, MatchesBlockFormula) {
  const int64_t pages = 4, ps = 4, h = 2, d = 32, nnz = 5;
  for (bool hnd : {false, true}) {
    SCOPED_TRACE(hnd ? "HND" : "NHD");
    Tensor key = rand_tensor({nnz, h, d}, DType::kFloat16, 3, -4, 4);
    Tensor val = rand_tensor({nnz, h, d}, DType::kFloat16, 4, -4, 4);
    // NHD storage, passed as HND views when hnd (the same bytes, permuted logically).
    Tensor k0 = rand_tensor({pages, ps, h, d / 2}, DType::kFloat32, 5, 0, 255).to(DType::kUInt8);
    Tensor v0 = rand_tensor({pages, ps, h, d / 2}, DType::kFloat32, 6, 0, 255).to(DType::kUInt8);
    Tensor s0 = as_e4m3(Tensor::full({pages, ps, h, d / 16}, 7, DType::kUInt8));
    Tensor kc = k0.clone(), vc = v0.clone(), ksf = s0.clone(), vsf = s0.clone();
    auto view = [&](const Tensor& t) { return hnd ? t.permute({0, 2, 1, 3}) : t; };
    // Two requests: request 0 has pages [3, 1] (length 6), request 1 page [0] (length 3).
    // Appended: request 0 positions 3, 4, 5; request 1 positions 1, 2.
    nvfp4_quantize_append_paged_kv_cache(
        key, val, i32({0, 0, 0, 1, 1}), i32({3, 4, 5, 1, 2}), PagedKVCache(view(kc), view(vc)),
        PagedKVCache(view(ksf), view(vsf)), i32({3, 1, 0}), i32({0, 2, 3}), i32({2, 3}), 0.02, 0.03,
        hnd ? "HND" : "NHD");
    const std::vector<std::pair<int64_t, int64_t>> dest = {{3, 3}, {1, 0}, {1, 1}, {0, 1}, {0, 2}};
    expect_appended(kc, ksf, k0, s0, key, 0.02f, dest, h, d);
    expect_appended(vc, vsf, v0, s0, val, 0.03f, dest, h, d);
  }
}

// Page size 1 without the page axis (upstream's _unpack_paged_kv_cache on both the packed and the
// scale caches): 3-D pools write what the 4-D page-size-1 caches get.
TEST(Nvfp4QuantizeAppendPagedKvCache, PageSizeOnePoolsWithoutThePageAxis) {
  const int64_t tokens = 6, h = 2, d = 32, nnz = 3;
  const Tensor key = rand_tensor({nnz, h, d}, DType::kFloat16, 3, -4, 4);
  const Tensor val = rand_tensor({nnz, h, d}, DType::kFloat16, 4, -4, 4);
  const Tensor c0 =
      rand_tensor({tokens, 1, h, d / 2}, DType::kFloat32, 5, 0, 255).to(DType::kUInt8);
  const Tensor s0 = as_e4m3(Tensor::full({tokens, 1, h, d / 16}, 7, DType::kUInt8));
  Tensor kc = c0.clone(), vc = c0.clone(), ks = s0.clone(), vs = s0.clone();
  Tensor kc3 = c0.clone(), vc3 = c0.clone(), ks3 = s0.clone(), vs3 = s0.clone();
  // One request of 4 tokens at slots [5, 2, 0, 3]: positions 1..3 appended.
  const auto append = [&](const PagedKVCache& cache, const PagedKVCache& sf) {
    nvfp4_quantize_append_paged_kv_cache(key, val, i32({0, 0, 0}), i32({1, 2, 3}), cache, sf,
                                         i32({5, 2, 0, 3}), i32({0, 4}), i32({1}), 0.02, 0.03);
  };
  append(PagedKVCache(kc, vc), PagedKVCache(ks, vs));
  append(PagedKVCache(kc3.squeeze(1), vc3.squeeze(1)),
         PagedKVCache(ks3.squeeze(1), vs3.squeeze(1)));
  EXPECT_NE(bytes(kc), bytes(c0));
  EXPECT_EQ(bytes(kc3), bytes(kc));
  EXPECT_EQ(bytes(vc3), bytes(vc));
  EXPECT_EQ(bytes(ks3), bytes(ks));
  EXPECT_EQ(bytes(vs3), bytes(vs));
}

TEST(Nvfp4QuantizeAppendWithSlotMapping, MatchesBlockFormula) {
  const int64_t pages = 3, ps = 4, h = 1, d = 16;
  Tensor key = rand_tensor({5, h, d}, DType::kBFloat16, 13, -2, 2);
  Tensor val = rand_tensor({5, h, d}, DType::kBFloat16, 14, -2, 2);
  Tensor kv = Tensor::zeros({pages, 2, ps, h, d / 2}, DType::kUInt8);  // stacked
  Tensor sf = Tensor::zeros({pages, 2, ps, h, d / 16}, DType::kFloat8E4M3FN);
  Tensor k0 = Tensor::zeros({pages, ps, h, d / 2}, DType::kUInt8);
  Tensor s0 = Tensor::zeros({pages, ps, h, d / 16}, DType::kFloat8E4M3FN);
  // Slots: 5 -> (1, 1); -1 skipped; 11 -> (2, 3); 12 is past the cache, skipped. Row 4 of
  // key/value is padding (only slot_mapping.shape[0] rows are read).
  nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
      key, val, Tensor::from_vector({5, -1, 11, 12}, {4}, DType::kInt64), kv, sf, f32({0.05}),
      0.04);
  const std::vector<std::pair<int64_t, int64_t>> dest = {{1, 1}, {-1, -1}, {2, 3}, {-1, -1}};
  expect_appended(kv.select(1, 0).contiguous(), sf.select(1, 0).contiguous(), k0, s0,
                  key.slice(0, 0, 4), 0.05f, dest, h, d);
  expect_appended(kv.select(1, 1).contiguous(), sf.select(1, 1).contiguous(), k0, s0,
                  val.slice(0, 0, 4), 0.04f, dest, h, d);
}

// nvfp4_4over6 (upstream 0.7.4) on the grouped, batched and KV-append quantizers: None and the
// default (the environment off) are the standard recipe; an explicit recipe, or
// FLASHINFER_NVFP4_4OVER6=1 where the default reads it, runs the 4over6 recipe: each group's bytes
// are fp4_quantize's with the same recipe. The KV append (another recipe upstream) refuses it; its
// default is None, so the environment does not reach it.
TEST(Nvfp4Ops, FourOverSixRunsOnTheGroupedAndBatchedQuantizers) {
  const Value config = nvfp4_4over6_config();
  Tensor a = rand_tensor({2, 4, 32}, DType::kBFloat16, 3, -2, 2);
  const Tensor m2 = i32({4, 4}), gs2 = f32({1, 1});
  const auto base = scaled_fp4_grouped_quantize(a, m2, gs2);
  EXPECT_EQ(bytes(std::get<0>(scaled_fp4_grouped_quantize(a, m2, gs2, Value()))),
            bytes(std::get<0>(base)));
  // Group g of the batched quantizer is fp4_quantize of a[g] (128x4 scales), recipe and all.
  const auto per_group = [&](const Tensor& in, const Value& four) {
    std::vector<uint8_t> q, sf;
    for (int64_t g = 0; g < in.size(0); ++g) {
      auto [qg, sg] = fp4_quantize(in.select(0, g).contiguous(), f32({1}), 16, false, true, false,
                                   false, std::nullopt, "auto", four);
      const auto qb = bytes(qg), sb = bytes(sg);
      q.insert(q.end(), qb.begin(), qb.end());
      sf.insert(sf.end(), sb.begin(), sb.end());
    }
    return std::pair{q, sf};
  };
  const auto [bq, bsf] = nvfp4_batched_quantize(a, f32({1}), 16, config);
  const auto [wq, wsf] = per_group(a, config);
  EXPECT_EQ(bytes(bq), wq);
  EXPECT_EQ(bytes(bsf), wsf);
  EXPECT_NE(wsf, per_group(a, Value()).second);  // the recipe changed some scale
  // The grouped quantizers write the same blocks (their views permute the same bytes).
  const auto [g4, gs4] = scaled_fp4_grouped_quantize(a, m2, gs2, config);
  EXPECT_EQ(bytes(g4.permute({2, 0, 1})), wq);
  Tensor a2 = rand_tensor({2, 4, 64}, DType::kBFloat16, 4, -2, 2);
  EXPECT_NE(bytes(std::get<1>(silu_and_mul_scaled_nvfp4_experts_quantize(a2, m2, gs2, config))),
            bytes(std::get<1>(silu_and_mul_scaled_nvfp4_experts_quantize(a2, m2, gs2))));
  // silu_and_mul_nvfp4_quantize passes its recipe to its quantization step.
  const Tensor a1 = a2.select(0, 0).contiguous();
  const auto s4 = silu_and_mul_nvfp4_quantize(a1, f32({1}), 16, true, false, std::nullopt, config);
  EXPECT_NE(bytes(std::get<1>(s4)), bytes(std::get<1>(silu_and_mul_nvfp4_quantize(a1, f32({1})))));
  {
    testing::ScopedEnv on("FLASHINFER_NVFP4_4OVER6", "1");
    EXPECT_EQ(bytes(std::get<1>(silu_and_mul_nvfp4_quantize(a1, f32({1})))),
              bytes(std::get<1>(s4)));
    EXPECT_EQ(bytes(std::get<0>(nvfp4_batched_quantize(a, f32({1})))), wq);
    EXPECT_NE(bytes(std::get<1>(nvfp4_batched_quantize(a, f32({1}), 16, Value()))), wsf);
    // The KV append defaults to None: the environment is not read.
    Tensor key = rand_tensor({1, 1, 16}, DType::kBFloat16, 15, -2, 2);
    Tensor kv = Tensor::zeros({1, 2, 4, 1, 8}, DType::kUInt8);
    Tensor sf = Tensor::zeros({1, 2, 4, 1, 1}, DType::kFloat8E4M3FN);
    EXPECT_NO_THROW(nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
        key, key, Tensor::from_vector({0}, {1}, DType::kInt64), kv, sf, 1.0, 1.0));
    EXPECT_FI_ERROR_CODE(nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
                             key, key, Tensor::from_vector({0}, {1}, DType::kInt64), kv, sf, 1.0,
                             1.0, "NHD", config),
                         "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping", "nvfp4_4over6",
                         ErrorCode::kUnsupported);
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
  // num_elts_per_sf is unused upstream: MXFP8's 32 gives the bytes of the default.
  Tensor sf = Tensor::empty({128, 8}, DType::kUInt8);
  for (int64_t i = 0; i < sf.numel(); ++i) sf.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
  EXPECT_EQ(bytes(shuffle_matrix_sf_a(sf, 128, 32)), bytes(shuffle_matrix_sf_a(sf, 128)));
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

TEST(Nvfp4PagedOps, BadInput) {
  const char* qp = "nvfp4_quantize_paged_kv_cache";
  Tensor k = rand_tensor({2, 2, 8, 64}, DType::kBFloat16, 1);
  EXPECT_FI_ERROR(nvfp4_quantize_paged_kv_cache(k, k, "XYZ"), qp, "kv_layout");
  EXPECT_FI_ERROR(nvfp4_quantize_paged_kv_cache(k.to(DType::kFloat32), k), qp, "k_cache");
  EXPECT_FI_ERROR(nvfp4_quantize_paged_kv_cache(k, k.slice(0, 0, 1)), qp, "v_cache");
  EXPECT_FI_ERROR(nvfp4_quantize_paged_kv_cache(rand_tensor({2, 2, 6, 64}, DType::kBFloat16, 1),
                                                rand_tensor({2, 2, 6, 64}, DType::kBFloat16, 1)),
                  qp, "k_cache");  // page_size % 4
  EXPECT_FI_ERROR(nvfp4_quantize_paged_kv_cache(k, k, "HND", f32({1, 2})), qp, "k_global_sf");

  const char* dp = "nvfp4_kv_dequantize_paged";
  const PagedKVCache c(Tensor::zeros({2, 4, 1, 8}, DType::kUInt8),
                       Tensor::zeros({2, 4, 1, 8}, DType::kUInt8));
  const PagedKVCache sf(Tensor::zeros({2, 4, 1, 1}, DType::kFloat8E4M3FN),
                        Tensor::zeros({2, 4, 1, 1}, DType::kFloat8E4M3FN));
  Tensor out = Tensor::zeros({1, 5, 1, 16}, DType::kBFloat16);
  Tensor out2 = Tensor::zeros({1, 5, 1, 16}, DType::kBFloat16);
  Tensor bt = Tensor::from_vector({0, 1}, {1, 2}, DType::kInt32);
  EXPECT_FI_ERROR(
      nvfp4_kv_dequantize_paged(c, sf, bt.slice(1, 0, 1), i32({5}), 1.0, 1.0, out, out2), dp,
      "block_tables");  // column count insufficient
  EXPECT_FI_ERROR(
      nvfp4_kv_dequantize_paged(c, sf, Tensor::from_vector({0, 2}, {1, 2}, DType::kInt32), i32({5}),
                                1.0, 1.0, out, out2),
      dp, "block_tables");  // page 2 of 2
  EXPECT_FI_ERROR(nvfp4_kv_dequantize_paged(c, sf, bt, i32({6}), 1.0, 1.0, out, out2), dp,
                  "seq_lens");
  EXPECT_FI_ERROR(nvfp4_kv_dequantize_paged(c, sf, bt, i32({5}), f32({1, 1}), 1.0, out, out2), dp,
                  "k_scale");
  EXPECT_FI_ERROR(nvfp4_kv_dequantize_paged(c, sf, bt, i32({5}), 1.0, -1.0, out, out2), dp,
                  "v_scale");
  EXPECT_FI_ERROR(nvfp4_kv_dequantize_paged(c, sf, bt, i32({5}), 1.0, 1.0,
                                            Tensor::zeros({1, 5, 1, 32}, DType::kBFloat16), out2),
                  dp, "paged_kv_cache");
  EXPECT_FI_ERROR(
      nvfp4_kv_dequantize_paged(c, sf, bt, i32({5}), 1.0, 1.0, out.to(DType::kFloat32), out2), dp,
      "output_k");

  const char* ap = "nvfp4_quantize_append_paged_kv_cache";
  Tensor key = rand_tensor({1, 1, 16}, DType::kBFloat16, 2);
  auto append = [&](const Tensor& kk, const PagedKVCache& cc, const PagedKVCache& ss,
                    const Tensor& pos, double scale) {
    nvfp4_quantize_append_paged_kv_cache(kk, kk, i32({0}), pos, cc, ss, i32({1}), i32({0, 1}),
                                         i32({2}), scale, 1.0);
  };
  EXPECT_FI_ERROR(append(key, c, sf, i32({1}), 0.0), ap, "k_scale");
  EXPECT_FI_ERROR(append(key, c, sf, i32({2}), 1.0), ap, "positions");
  EXPECT_FI_ERROR(append(key.to(DType::kFloat32), c, sf, i32({1}), 1.0), ap, "append_key");
  EXPECT_FI_ERROR(append(rand_tensor({1, 1, 32}, DType::kBFloat16, 2), c, sf, i32({1}), 1.0), ap,
                  "paged_kv_cache");
  EXPECT_FI_ERROR(append(key,
                         PagedKVCache(Tensor::zeros({2, 4, 1, 8}, DType::kBFloat16),
                                      Tensor::zeros({2, 4, 1, 8}, DType::kBFloat16)),
                         sf, i32({1}), 1.0),
                  ap, "paged_kv_cache");
  EXPECT_FI_ERROR(append(key, c,
                         PagedKVCache(Tensor::zeros({2, 4, 1, 1}, DType::kUInt8),
                                      Tensor::zeros({2, 4, 1, 1}, DType::kUInt8)),
                         i32({1}), 1.0),
                  ap, "kv_cache_sf");
  const char* sp = "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping";
  EXPECT_FI_ERROR(nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(key, key, i32({0, 1}), c,
                                                                         sf, 1.0, 1.0),
                  sp, "append_key");
  EXPECT_FI_ERROR(
      nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(key, key, f32({0}), c, sf, 1.0, 1.0),
      sp, "slot_mapping");
  EXPECT_FI_ERROR(nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(key, key, i32({0}), c, sf,
                                                                         f32({std::nan("")}), 1.0),
                  sp, "k_scale");
  EXPECT_FI_ERROR(nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(key, key, i32({0}), c, sf,
                                                                         1.0, 1.0, "XYZ"),
                  sp, "kv_layout");
}

TEST(Nvfp4PagedOps, RecordAndReplay) {
  Tensor k = rand_tensor({2, 4, 1, 64}, DType::kBFloat16, 3, -3, 3);
  Tensor key = rand_tensor({3, 1, 64}, DType::kBFloat16, 4, -3, 3);
  Tensor kc = Tensor::zeros({2, 4, 1, 32}, DType::kUInt8), vc = kc.clone();
  Tensor ks = Tensor::zeros({2, 4, 1, 4}, DType::kFloat8E4M3FN), vs = ks.clone();
  Tensor ok = Tensor::zeros({1, 6, 1, 64}, DType::kBFloat16), ov = ok.clone();
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    nvfp4_quantize_paged_kv_cache(k, k, "NHD");
    nvfp4_quantize_append_paged_kv_cache(key, key, i32({0, 0, 0}), i32({3, 4, 5}),
                                         PagedKVCache(kc, vc), PagedKVCache(ks, vs), i32({1, 0}),
                                         i32({0, 2}), i32({2}), 0.01, 0.02);
    nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
        key, key, i32({0, -1, 7}), PagedKVCache(kc, vc), PagedKVCache(ks, vs), f32({0.03}), 0.04);
    nvfp4_kv_dequantize_paged(PagedKVCache(kc, vc), PagedKVCache(ks, vs),
                              Tensor::from_vector({1, 0}, {1, 2}, DType::kInt32), i32({6}), 0.5,
                              f32({0.25}), ok, ov);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 4u);
  for (const auto& c : calls) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(replays_identically(c));
  }
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
  for (const char* op : {"mxfp4_dequantize_host", "nvfp4_kv_quantize"}) {
    SCOPED_TRACE(op);
    EXPECT_TRUE(op_has_backend(op, DeviceType::kCPU));
    EXPECT_FALSE(op_has_backend(op, DeviceType::kCUDA));
  }
  // A CUDA kernel in every CUDA build (upstream runs these on Hopper, but for
  // mxfp8_grouped_quantize, which it gates to sm100+; the kernel serves those).
  for (const char* op :
       {"shuffle_matrix_a", "shuffle_matrix_sf_a", "nvfp4_kv_dequantize",
        "nvfp4_kv_dequantize_paged", "nvfp4_batched_quantize", "silu_and_mul_nvfp4_quantize",
        "silu_and_mul_scaled_nvfp4_experts_quantize", "scaled_fp4_grouped_quantize",
        "mxfp8_grouped_quantize", "nvfp4_quantize_paged_kv_cache",
        "nvfp4_quantize_append_paged_kv_cache",
        "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping"}) {
    SCOPED_TRACE(op);
    EXPECT_TRUE(op_has_backend(op, DeviceType::kCPU));
    EXPECT_EQ(op_has_backend(op, DeviceType::kCUDA), cuda_compiled());
  }
}

// ---- CUDA: the same bytes as the CPU reference (skipped without a GPU) ------------------------

Tensor host(const Tensor& t) { return t.to(Device::cpu()); }

// Both backends on the same input: a contiguous one (the kernels' 16-byte loads) and a view
// whose rows start 132 elements apart (not 16-byte aligned: element loads). 130 rows cross a
// 128-row scale tile; values up to 12 reach silu's tails and spread the block scales.
// nvfp4_quantize(do_shuffle=True) on a GPU (refused before: the shuffles ran on the host only):
// the quantizer's and the shuffles' kernels give the CPU's bytes, per-tensor and per-token.
TEST(Nvfp4OpsCuda, QuantizeDoShuffleMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  Tensor a = rand_tensor({256, 128}, DType::kBFloat16, 78, -4, 4);
  auto [q, sf] = nvfp4_quantize(a, f32({672}), SfLayout::layout_128x4, true);
  auto [qd, sfd] = nvfp4_quantize(a.to(d), f32({672}).to(d), SfLayout::layout_128x4, true);
  EXPECT_EQ(bytes(qd.to(Device::cpu())), bytes(q));
  EXPECT_EQ(bytes(sfd.to(Device::cpu())), bytes(sf));
  EXPECT_EQ(sfd.shape(), sf.shape());
}

TEST(Nvfp4OpsCuda, SiluAndMulNvfp4QuantizeMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device dev = Device::cuda(0);
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const Tensor dense = rand_tensor({130, 128}, dt, 31, -12, 12);
    const Tensor wide = rand_tensor({130, 132}, dt, 32, -12, 12);
    const Tensor gs = f32({672});
    for (bool strided : {false, true}) {
      const Tensor x = strided ? wide.slice(1, 0, 128) : dense;
      const Tensor dx = strided ? wide.to(dev).slice(1, 0, 128) : dense.to(dev);
      for (bool swizzled : {true, false}) {
        for (bool l8x4 : {false, true}) {
          SCOPED_TRACE(::testing::Message() << dtype_torch_name(dt) << " strided " << strided
                                            << " swizzled " << swizzled << " 8x4 " << l8x4);
          auto [q, sf] = silu_and_mul_nvfp4_quantize(x, gs, 16, swizzled, l8x4);
          auto [dq, dsf] = silu_and_mul_nvfp4_quantize(dx, gs.to(dev), 16, swizzled, l8x4);
          EXPECT_EQ(dq.device(), dev);
          EXPECT_EQ(dq.shape(), q.shape());
          EXPECT_EQ(dsf.shape(), sf.shape());
          EXPECT_EQ(bytes(host(dq)), bytes(q));
          EXPECT_EQ(bytes(host(dsf)), bytes(sf));
        }
      }
    }
  }
}

// Whole caches in both layouts and dtypes, automatic and given global scales, a contiguous
// cache (16-byte loads) and one whose head_dim rows start 68 elements apart (element loads);
// page 0 of K is zero (zero scales and codes).
TEST(Nvfp4OpsCuda, QuantizePagedKvCacheMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device dev = Device::cuda(0);
  const int64_t pages = 3, ps = 8, h = 2, d = 64;
  for (bool hnd : {false, true}) {
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      for (bool strided : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << (hnd ? "HND " : "NHD ") << dtype_torch_name(dt) << " strided " << strided);
        const int64_t w = strided ? d + 4 : d;
        const Shape shape = hnd ? Shape{pages, h, ps, w} : Shape{pages, ps, h, w};
        Tensor k = rand_tensor(shape, dt, 41, -3, 3).slice(3, 0, d);
        Tensor v = rand_tensor(shape, dt, 42, -500, 500).slice(3, 0, d);
        k.slice(0, 0, 1).fill_(0.0);
        // The device copies keep the views' strides.
        Tensor dk = Tensor::empty(shape, dt, dev).slice(3, 0, d);
        Tensor dv = Tensor::empty(shape, dt, dev).slice(3, 0, d);
        dk.copy_(k);
        dv.copy_(v);
        const std::string_view layout = hnd ? "HND" : "NHD";
        for (bool given : {false, true}) {
          std::optional<Tensor> kg, vg, dkg, dvg;
          if (given) {
            kg = f32({100}), vg = f32({0.5});
            dkg = kg->to(dev), dvg = vg->to(dev);
          }
          auto [fp4, sf, kgs, vgs] = nvfp4_quantize_paged_kv_cache(k, v, layout, kg, vg);
          auto [dfp4, dsf, dkgs, dvgs] = nvfp4_quantize_paged_kv_cache(dk, dv, layout, dkg, dvg);
          EXPECT_EQ(dkgs, kgs);
          EXPECT_EQ(dvgs, vgs);
          EXPECT_EQ(std::get<0>(dfp4).shape(), std::get<0>(fp4).shape());
          EXPECT_EQ(std::get<1>(dsf).dtype(), DType::kFloat8E4M3FN);
          EXPECT_EQ(bytes(host(std::get<0>(dfp4))), bytes(std::get<0>(fp4)));
          EXPECT_EQ(bytes(host(std::get<1>(dfp4))), bytes(std::get<1>(fp4)));
          EXPECT_EQ(bytes(host(std::get<0>(dsf))), bytes(std::get<0>(sf)));
          EXPECT_EQ(bytes(host(std::get<1>(dsf))), bytes(std::get<1>(sf)));
        }
      }
    }
  }
}

// Both appends into caches holding the same random bytes on both backends: every byte equal
// afterwards (written and untouched ones). Keys with a head stride of 36 (element loads) as
// well as dense ones; the slot mapping skips -1 and a slot past the cache. A page index past the
// cache is an Error naming the op and kv_indices, before any write.
TEST(Nvfp4OpsCuda, QuantizeAppendPagedKvCacheMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device dev = Device::cuda(0);
  const int64_t pages = 4, ps = 4, h = 2, d = 32, nnz = 5;
  auto dv = [&](const Tensor& t) { return t.clone().to(dev); };  // a storage of its own
  for (bool hnd : {false, true}) {
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      for (bool strided : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << (hnd ? "HND " : "NHD ") << dtype_torch_name(dt) << " strided " << strided);
        const int64_t w = strided ? d + 4 : d;
        const Tensor key = rand_tensor({nnz, h, w}, dt, 3, -4, 4).slice(2, 0, d);
        const Tensor val = rand_tensor({nnz, h, w}, dt, 4, -300, 300).slice(2, 0, d);
        Tensor dkey = Tensor::empty({nnz, h, w}, dt, dev).slice(2, 0, d);
        Tensor dval = Tensor::empty({nnz, h, w}, dt, dev).slice(2, 0, d);
        dkey.copy_(key);
        dval.copy_(val);
        const Tensor k0 =
            rand_tensor({pages, ps, h, d / 2}, DType::kFloat32, 5, 0, 255).to(DType::kUInt8);
        const Tensor s0 = as_e4m3(
            rand_tensor({pages, ps, h, d / 16}, DType::kFloat32, 6, 0, 120).to(DType::kUInt8));
        Tensor kc = k0.clone(), vc = k0.clone(), ks = s0.clone(), vs = s0.clone();
        Tensor dkc = dv(k0), dvc = dv(k0), dks = dv(s0), dvs = dv(s0);
        auto view = [&](const Tensor& t) { return hnd ? t.permute({0, 2, 1, 3}) : t; };
        const std::string_view layout = hnd ? "HND" : "NHD";
        nvfp4_quantize_append_paged_kv_cache(key, val, i32({0, 0, 0, 1, 1}), i32({3, 4, 5, 1, 2}),
                                             PagedKVCache(view(kc), view(vc)),
                                             PagedKVCache(view(ks), view(vs)), i32({3, 1, 0}),
                                             i32({0, 2, 3}), i32({2, 3}), 0.02, 0.03, layout);
        nvfp4_quantize_append_paged_kv_cache(
            dkey, dval, dv(i32({0, 0, 0, 1, 1})), dv(i32({3, 4, 5, 1, 2})),
            PagedKVCache(view(dkc), view(dvc)), PagedKVCache(view(dks), view(dvs)),
            dv(i32({3, 1, 0})), dv(i32({0, 2, 3})), dv(i32({2, 3})), 0.02, 0.03, layout);
        EXPECT_EQ(bytes(host(dkc)), bytes(kc));
        EXPECT_EQ(bytes(host(dvc)), bytes(vc));
        EXPECT_EQ(bytes(host(dks)), bytes(ks));
        EXPECT_EQ(bytes(host(dvs)), bytes(vs));
        EXPECT_NE(bytes(kc), bytes(k0));  // something was written

        // Slot mapping: 5 -> (1, 1), -1 skipped, 11 -> (2, 3), 16 past the cache, skipped.
        const Tensor slots = Tensor::from_vector({5, -1, 11, 16}, {4}, DType::kInt64);
        nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
            key, val, slots, PagedKVCache(view(kc), view(vc)), PagedKVCache(view(ks), view(vs)),
            f32({0.05}), 0.04, layout);
        nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
            dkey, dval, dv(slots), PagedKVCache(view(dkc), view(dvc)),
            PagedKVCache(view(dks), view(dvs)), dv(f32({0.05})), 0.04, layout);
        EXPECT_EQ(bytes(host(dkc)), bytes(kc));
        EXPECT_EQ(bytes(host(dvc)), bytes(vc));
        EXPECT_EQ(bytes(host(dks)), bytes(ks));
        EXPECT_EQ(bytes(host(dvs)), bytes(vs));

        // The index arrays are read on the device (kernels::append_slot): page 9 is past the
        // 4-page cache, so request 0's positions 4 and 5 are not written (the CPU refuses the
        // call by name); rows 0, 3 and 4 land as the CPU puts them.
        EXPECT_FI_ERROR(nvfp4_quantize_append_paged_kv_cache(
                            key, val, i32({0, 0, 0, 1, 1}), i32({3, 4, 5, 1, 2}),
                            PagedKVCache(view(kc), view(vc)), PagedKVCache(view(ks), view(vs)),
                            i32({3, 9, 0}), i32({0, 2, 3}), i32({2, 3}), 0.02, 0.03, layout),
                        "nvfp4_quantize_append_paged_kv_cache", "kv_indices");
        const std::vector<int64_t> kept{0, 3, 4};
        Tensor key_kept = Tensor::empty({3, h, d}, dt), val_kept = Tensor::empty({3, h, d}, dt);
        for (int64_t j = 0; j < 3; ++j) {
          key_kept.select(0, j).copy_(key.select(0, kept[j]));
          val_kept.select(0, j).copy_(val.select(0, kept[j]));
        }
        nvfp4_quantize_append_paged_kv_cache(key_kept, val_kept, i32({0, 1, 1}), i32({3, 1, 2}),
                                             PagedKVCache(view(kc), view(vc)),
                                             PagedKVCache(view(ks), view(vs)), i32({3, 1, 0}),
                                             i32({0, 2, 3}), i32({2, 3}), 0.07, 0.01, layout);
        nvfp4_quantize_append_paged_kv_cache(
            dkey, dval, dv(i32({0, 0, 0, 1, 1})), dv(i32({3, 4, 5, 1, 2})),
            PagedKVCache(view(dkc), view(dvc)), PagedKVCache(view(dks), view(dvs)),
            dv(i32({3, 9, 0})), dv(i32({0, 2, 3})), dv(i32({2, 3})), 0.07, 0.01, layout);
        EXPECT_EQ(bytes(host(dkc)), bytes(kc));
        EXPECT_EQ(bytes(host(dvc)), bytes(vc));
        EXPECT_EQ(bytes(host(dks)), bytes(ks));
        EXPECT_EQ(bytes(host(dvs)), bytes(vs));

        // A device scale that is not positive and finite: the CPU refuses it by name, the kernel
        // (which reads it on the device) writes nothing.
        const Tensor dkc_before = host(dkc), dks_before = host(dks);
        nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
            dkey, dval, dv(slots), PagedKVCache(view(dkc), view(dvc)),
            PagedKVCache(view(dks), view(dvs)), dv(f32({std::nan("")})), 0.04, layout);
        EXPECT_EQ(bytes(host(dkc)), bytes(dkc_before));
        EXPECT_EQ(bytes(host(dks)), bytes(dks_before));
        EXPECT_FI_ERROR(nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
                            key, val, slots, PagedKVCache(view(kc), view(vc)),
                            PagedKVCache(view(ks), view(vs)), f32({std::nan("")}), 0.04, layout),
                        "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping", "k_scale");
      }
    }
  }
}

// vLLM's decode step appends through the slot-mapping form inside a CUDA graph: the slots and the
// tensor scales are read on the device, so the call captures in global mode (which refuses any
// synchronizing call) and the graph writes what the eager call writes. int32 slots this time.
TEST(Nvfp4OpsCuda, SlotMappingAppendCapturesIntoAGraph) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
#if FLASHINFER_TEST_HAVE_CUDART
  const Device dev = Device::cuda(0);
  const int64_t pages = 4, ps = 4, h = 2, d = 32, nnz = 4;
  const Tensor key = rand_tensor({nnz, h, d}, DType::kBFloat16, 7, -4, 4).to(dev);
  const Tensor val = rand_tensor({nnz, h, d}, DType::kBFloat16, 8, -4, 4).to(dev);
  const Tensor slots = i32({5, -1, 11, 16}).to(dev);
  const Tensor kscale = f32({0.05}).to(dev), vscale = f32({0.04}).to(dev);
  auto caches = [&] {
    return std::vector<Tensor>{Tensor::zeros({pages, ps, h, d / 2}, DType::kUInt8, dev),
                               Tensor::zeros({pages, ps, h, d / 2}, DType::kUInt8, dev),
                               Tensor::zeros({pages, ps, h, d / 16}, DType::kFloat8E4M3FN, dev),
                               Tensor::zeros({pages, ps, h, d / 16}, DType::kFloat8E4M3FN, dev)};
  };
  auto call = [&](std::vector<Tensor>& c) {
    nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
        key, val, slots, PagedKVCache(c[0], c[1]), PagedKVCache(c[2], c[3]), kscale, vscale, "NHD");
  };
  std::vector<Tensor> eager = caches(), graph = caches();
  call(eager);
  std::size_t kernels = 0;
  ASSERT_NO_FATAL_FAILURE(testing::capture_on_own_stream([&] { call(graph); }, &kernels));
  EXPECT_EQ(kernels, 1u) << "the append's kernel, captured";
  for (std::size_t j = 0; j < eager.size(); ++j) {
    EXPECT_EQ(bytes(host(graph[j])), bytes(host(eager[j]))) << j;
  }
  EXPECT_NE(bytes(host(eager[0])), bytes(host(caches()[0])));  // something was written
#else
  GTEST_SKIP() << "built without the CUDA runtime for the tests";
#endif
}

// ---- the masked grouped quantizers on CUDA ----------------------------------------------------

// An input layout of [L, M, W] for both backends: `base` is built on the host, then the same view
// is taken of it and of its device copy (so both keep the view's strides and offset).
struct GroupedLayout {
  const char* name;
  int pad;       // elements added to each row of the base
  int offset;    // first element of each row within the base row
  bool permute;  // base [M, L, W'] viewed as [L, M, W'] (groups inner)
};
// Dense, an aligned wider row and groups-inner (16-byte loads); a row stride of W + 4 and rows
// starting 4 elements in (8 bytes: element loads).
constexpr GroupedLayout kGroupedLayouts[] = {
    {"dense", 0, 0, false},
    {"row stride W+8", 8, 0, false},
    {"groups inner", 0, 0, true},
    {"row stride W+4 (unaligned)", 4, 0, false},
    {"offset 4 (unaligned)", 8, 4, false},
};

// (host view, device view) of a random [L, M, W] input in `lay`; the first row of every group is
// zero (a zero block: scale code 0).
std::pair<Tensor, Tensor> grouped_input(const GroupedLayout& lay, int64_t l, int64_t m, int64_t w,
                                        DType dt, uint64_t seed, double range) {
  const int64_t wide = w + lay.pad;
  Tensor base =
      rand_tensor(lay.permute ? Shape{m, l, wide} : Shape{l, m, wide}, dt, seed, -range, range);
  base.slice(lay.permute ? 0 : 1, 0, 1).fill_(0.0);
  auto view = [&](const Tensor& t) {
    const Tensor v = lay.permute ? t.permute({1, 0, 2}) : t;
    return v.slice(2, lay.offset, lay.offset + w);
  };
  return {view(base), view(base.to(Device::cuda(0)))};
}

// Both results of a grouped quantizer: same shapes, dtypes, strides, device and every byte.
void expect_same_result(const std::tuple<Tensor, Tensor>& cpu,
                        const std::tuple<Tensor, Tensor>& cuda) {
  const Tensor& q = std::get<0>(cpu);
  const Tensor& sf = std::get<1>(cpu);
  const Tensor& dq = std::get<0>(cuda);
  const Tensor& dsf = std::get<1>(cuda);
  EXPECT_TRUE(dq.device().is_cuda());
  EXPECT_TRUE(dsf.device().is_cuda());
  EXPECT_EQ(dq.shape(), q.shape());
  EXPECT_EQ(dq.strides(), q.strides());
  EXPECT_EQ(dq.dtype(), q.dtype());
  EXPECT_EQ(dsf.shape(), sf.shape());
  EXPECT_EQ(dsf.strides(), sf.strides());
  EXPECT_EQ(dsf.dtype(), sf.dtype());
  EXPECT_EQ(bytes(host(dq)), bytes(q));
  EXPECT_EQ(bytes(host(dsf)), bytes(sf));
}

// Shapes: K with scale-column padding (K / 16 = 5), 130 rows crossing a 128-row scale tile;
// masks with full, partial and empty groups; per-group global scales. Every layout (16-byte and
// element loads), both dtypes.
struct Fp4Case {
  int64_t l, m, k;
  std::vector<double> mask, gs;
};
const std::vector<Fp4Case>& fp4_cases() {
  static const std::vector<Fp4Case> cases = {
      {3, 5, 80, {5, 2, 0}, {672, 300, 1000}},
      {2, 130, 32, {130, 129}, {672, 500}},
      {4, 7, 64, {7, 3, 1, 6}, {448, 672, 1e5, 2}},
  };
  return cases;
}

// nvfp4_kv_dequantize with its global scale on the data's device (SGLang's FP4 KV cache, every
// layer of a decode step): the kernel reads the scale there, as upstream's does, so nothing is
// read back and the call captures in global mode; a replay after the scale tensor changes
// dequantizes with the new value. The result is the CPU's, bit for bit, for each scale.
TEST(Nvfp4OpsCuda, KvDequantizeReadsTheDeviceScaleAndCaptures) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
#if FLASHINFER_TEST_HAVE_CUDART
  const Device dev = Device::cuda(0);
  const auto [q, s] =
      nvfp4_kv_quantize(rand_tensor({12, 64}, DType::kBFloat16, 21, -4, 4), f32({0.5}));
  const Tensor qd = q.to(dev), sd = s.to(dev);
  Tensor gs = f32({0.5}).to(dev);
  EXPECT_EQ(bytes(host(nvfp4_kv_dequantize(qd, sd, gs))),
            bytes(nvfp4_kv_dequantize(q, s, f32({0.5}))));
  Tensor out = Tensor::zeros({12, 64}, DType::kBFloat16, dev);
  const CudaGraphMemoryScope hold(0);  // the graph's blocks, freed after it is destroyed
  testing::ReplayableGraph g;
  ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(g, [&] { nvfp4_kv_dequantize(qd, sd, gs); }));
  ASSERT_NO_FATAL_FAILURE(
      testing::capture_for_replay(g, [&] { out.copy_(nvfp4_kv_dequantize(qd, sd, gs)); }));
  for (double v : {0.5, 0.125}) {
    gs.fill_(v);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(g.exec, g.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(g.stream), cudaSuccess);
    EXPECT_EQ(bytes(host(out)), bytes(nvfp4_kv_dequantize(q, s, f32({v})))) << v;
  }
  EXPECT_EQ(cudaGraphExecDestroy(g.exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(g.graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(g.stream), cudaSuccess);
#else
  GTEST_SKIP() << "built without the CUDA runtime for the tests";
#endif
}

TEST(Nvfp4OpsCuda, ScaledFp4GroupedQuantizeMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device dev = Device::cuda(0);
  for (const Fp4Case& c : fp4_cases()) {
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      for (const GroupedLayout& lay : kGroupedLayouts) {
        SCOPED_TRACE(::testing::Message() << "L " << c.l << " M " << c.m << " K " << c.k << " "
                                          << dtype_torch_name(dt) << " " << lay.name);
        const auto in = grouped_input(lay, c.l, c.m, c.k, dt, 51, 4);
        expect_same_result(
            scaled_fp4_grouped_quantize(in.first, i32(c.mask), f32(c.gs)),
            scaled_fp4_grouped_quantize(in.second, i32(c.mask).to(dev), f32(c.gs).to(dev)));
      }
    }
  }
}

// Values up to 12 reach silu's tails; gate and up halves of each [L, M, 2K] row.
TEST(Nvfp4OpsCuda, SiluAndMulScaledNvfp4ExpertsQuantizeMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device dev = Device::cuda(0);
  for (const Fp4Case& c : fp4_cases()) {
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      for (const GroupedLayout& lay : kGroupedLayouts) {
        SCOPED_TRACE(::testing::Message() << "L " << c.l << " M " << c.m << " K " << c.k << " "
                                          << dtype_torch_name(dt) << " " << lay.name);
        const auto in = grouped_input(lay, c.l, c.m, 2 * c.k, dt, 52, 12);
        expect_same_result(
            silu_and_mul_scaled_nvfp4_experts_quantize(in.first, i32(c.mask), f32(c.gs)),
            silu_and_mul_scaled_nvfp4_experts_quantize(in.second, i32(c.mask).to(dev),
                                                       f32(c.gs).to(dev)));
      }
    }
  }
}

// K 96 (one zero-padded block of 32), 256 (none) and 32 (three); 130 rows; masks as above.
TEST(Nvfp4OpsCuda, Mxfp8GroupedQuantizeMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device dev = Device::cuda(0);
  struct Case {
    int64_t l, m, k;
    std::vector<double> mask;
  };
  const Case cases[] = {{2, 3, 96, {3, 1}}, {3, 130, 256, {130, 0, 77}}, {2, 9, 32, {9, 4}}};
  if (api::compute_capability(dev) < 100) {  // upstream's gate, raised as upstream raises it
    const auto in = grouped_input(kGroupedLayouts[0], 2, 3, 96, DType::kBFloat16, 53, 300);
    EXPECT_FI_ERROR(mxfp8_grouped_quantize(in.second, i32({3, 1}).to(dev)),
                    "mxfp8_grouped_quantize", "a");
    return;
  }
  for (const Case& c : cases) {
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      for (const GroupedLayout& lay : kGroupedLayouts) {
        SCOPED_TRACE(::testing::Message() << "L " << c.l << " M " << c.m << " K " << c.k << " "
                                          << dtype_torch_name(dt) << " " << lay.name);
        const auto in = grouped_input(lay, c.l, c.m, c.k, dt, 53, 300);
        expect_same_result(mxfp8_grouped_quantize(in.first, i32(c.mask)),
                           mxfp8_grouped_quantize(in.second, i32(c.mask).to(dev)));
      }
    }
  }
}

// A device mask is read on the device only (no host copy, no synchronization: upstream reads it
// there too), so an entry outside [0, M] is not named as on the CPU: the kernel clamps it to
// [0, M], giving the CPU's result for the clamped mask. A strided device mask (every other entry
// of [4, 9, 3]) is read through its contiguous copy.
TEST(Nvfp4OpsCuda, GroupedQuantizersClampTheDeviceMask) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device dev = Device::cuda(0);
  const Tensor a = rand_tensor({3, 4, 32}, DType::kBFloat16, 1, -4, 4);
  const Tensor a2 = rand_tensor({3, 4, 64}, DType::kBFloat16, 2, -4, 4);
  const Tensor bad = i32({9, -3, 2}).to(dev), clamped = i32({4, 0, 2});
  const Tensor gs = f32({672, 500, 100});
  expect_same_result(scaled_fp4_grouped_quantize(a, clamped, gs),
                     scaled_fp4_grouped_quantize(a.to(dev), bad, gs.to(dev)));
  expect_same_result(silu_and_mul_scaled_nvfp4_experts_quantize(a2, clamped, gs),
                     silu_and_mul_scaled_nvfp4_experts_quantize(a2.to(dev), bad, gs.to(dev)));
  if (api::compute_capability(dev) < 100) return;  // mxfp8_grouped_quantize: sm100+ upstream
  expect_same_result(mxfp8_grouped_quantize(a, clamped), mxfp8_grouped_quantize(a.to(dev), bad));
  const Tensor a8 = rand_tensor({2, 4, 32}, DType::kBFloat16, 3, -4, 4);
  expect_same_result(mxfp8_grouped_quantize(a8, i32({4, 3})),
                     mxfp8_grouped_quantize(a8.to(dev), i32({4, 9, 3}).to(dev).slice(0, 0, 3, 2)));
}

// A CUDA input with a host mask or host scales, or an unsupported dtype: an Error naming the op
// and the argument.
TEST(Nvfp4OpsCuda, GroupedQuantizersRefuseOffDeviceArguments) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  const Tensor a = rand_tensor({2, 4, 32}, DType::kBFloat16, 1).to(d);
  const Tensor a2 = rand_tensor({2, 4, 64}, DType::kBFloat16, 2).to(d);
  const Tensor mask = i32({4, 3}), gs = f32({672, 672});
  const char* g = "scaled_fp4_grouped_quantize";
  const char* ex = "silu_and_mul_scaled_nvfp4_experts_quantize";
  const char* x8 = "mxfp8_grouped_quantize";
  EXPECT_FI_ERROR(scaled_fp4_grouped_quantize(a, mask, gs.to(d)), g, "mask");
  EXPECT_FI_ERROR(scaled_fp4_grouped_quantize(a, mask.to(d), gs), g, "a_global_sf");
  EXPECT_FI_ERROR(scaled_fp4_grouped_quantize(a.to(DType::kFloat32), mask.to(d), gs.to(d)), g, "a");
  EXPECT_FI_ERROR(silu_and_mul_scaled_nvfp4_experts_quantize(a2, mask, gs.to(d)), ex, "mask");
  EXPECT_FI_ERROR(silu_and_mul_scaled_nvfp4_experts_quantize(a2, mask.to(d), gs), ex,
                  "a_global_sf");
  EXPECT_FI_ERROR(mxfp8_grouped_quantize(a, mask), x8, "mask");
  EXPECT_FI_ERROR(mxfp8_grouped_quantize(a.to(DType::kFloat32), mask.to(d)), x8, "a");
}

}  // namespace
}  // namespace flashinfer::testing
