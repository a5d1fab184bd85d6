// Tests of the FP4 / MXFP8 quantization ops: hand-checked codes, scale-layout offsets against
// the formulas, round trips, a naive reference over shapes, bad input, replay, CUDA vs CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

using testing::cuda_available;

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.numel() * static_cast<int64_t>(c.element_size()));
}

std::vector<float> floats(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  const float* p = c.data<float>();
  return std::vector<float>(p, p + c.numel());
}

Tensor fp32_scalar(double v) { return Tensor::from_vector({v}, {1}, DType::kFloat32); }

// ---- the reference formulas, written independently of the kernels ------------------------------

int64_t ref_offset_128x4(int64_t r, int64_t c, int64_t cols) {
  const int64_t tiles = (cols + 3) / 4;
  return (r / 128) * tiles * 512 + (c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
}

// ue8m0 exponent of the smallest power of two >= x, from frexp (x = f * 2^e, f in [0.5, 1)).
int ref_ue8m0_up(double x) {
  if (x <= 0) return 0;
  int e;
  const double f = std::frexp(x, &e);
  const int p = f == 0.5 ? e - 1 : e;  // x <= 2^p
  return std::clamp(p + 127, 0, 254);
}

// NVFP4 of one row: returns (codes, sf codes) following the documented formulas.
struct RefQuant {
  std::vector<uint8_t> q;   // unpacked codes
  std::vector<uint8_t> sf;  // one per block
};

RefQuant ref_nvfp4_row(const std::vector<float>& x, float gs, int vec) {
  RefQuant r;
  for (size_t b = 0; b < x.size() / vec; ++b) {
    float amax = 0;
    for (int i = 0; i < vec; ++i) amax = std::max(amax, std::fabs(x[b * vec + i]));
    const uint8_t code = float_to_e4m3fn_bits(gs * amax / 6.0f, true);
    const float sf = e4m3fn_bits_to_float(code);
    r.sf.push_back(code);
    for (int i = 0; i < vec; ++i) {
      r.q.push_back(sf == 0 ? 0 : float_to_e2m1_bits((x[b * vec + i] * gs) / sf));
    }
  }
  return r;
}

// ---- scale layouts ------------------------------------------------------------------------------

TEST(SfLayout, HandCheckedOffsets) {
  EXPECT_EQ(sf_layout_offset(SfLayout::layout_128x4, 0, 0, 8), 0);
  EXPECT_EQ(sf_layout_offset(SfLayout::layout_128x4, 0, 1, 8), 1);
  EXPECT_EQ(sf_layout_offset(SfLayout::layout_128x4, 1, 0, 8), 16);
  EXPECT_EQ(sf_layout_offset(SfLayout::layout_128x4, 32, 0, 8), 4);
  EXPECT_EQ(sf_layout_offset(SfLayout::layout_128x4, 0, 4, 8), 512);
  EXPECT_EQ(sf_layout_offset(SfLayout::layout_128x4, 128, 0, 8), 1024);
  // (130, 5), 8 columns: 1*2*512 + 1*512 + 2*16 + 0*4 + 1
  EXPECT_EQ(sf_layout_offset(SfLayout::layout_128x4, 130, 5, 8), 1569);
  // 8x4, (9, 6), 8 columns: 1*2*32 + 1*32 + 1*4 + 2
  EXPECT_EQ(sf_layout_offset(SfLayout::layout_8x4, 9, 6, 8), 102);
  EXPECT_EQ(sf_layout_offset(SfLayout::layout_linear, 3, 2, 7), 23);
  EXPECT_EQ(sf_layout_size(SfLayout::layout_128x4, 1, 1), 512);
  EXPECT_EQ(sf_layout_size(SfLayout::layout_128x4, 129, 5), 256 * 8);
  EXPECT_EQ(sf_layout_size(SfLayout::layout_8x4, 9, 5), 16 * 8);
  EXPECT_EQ(sf_layout_size(SfLayout::layout_linear, 9, 5), 45);
}

TEST(SfLayout, SwizzledLayoutsAreInjectiveAndInBounds) {
  for (SfLayout l : {SfLayout::layout_128x4, SfLayout::layout_8x4}) {
    const int64_t rows = 200, cols = 7;
    const int64_t size = sf_layout_size(l, rows, cols);
    std::set<int64_t> seen;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t o = sf_layout_offset(l, r, c, cols);
        ASSERT_GE(o, 0);
        ASSERT_LT(o, size);
        ASSERT_TRUE(seen.insert(o).second) << sf_layout_name(l) << " " << r << "," << c;
      }
    }
  }
  for (int64_t r = 0; r < 300; r += 7) {
    for (int64_t c = 0; c < 9; ++c) {
      ASSERT_EQ(sf_layout_offset(SfLayout::layout_128x4, r, c, 9), ref_offset_128x4(r, c, 9));
    }
  }
}

// ---- NVFP4 --------------------------------------------------------------------------------------

TEST(Nvfp4Quantize, HandCheckedCodes) {
  // amax 6 with gs = 1 gives sf = 1.0 (e4m3 0x38), so every value is its own e2m1 code. Ties
  // (0.25, 0.75, 5, -2.5) round to the even code.
  const std::vector<double> x = {0,    0.5, 1,    1.5,  2, 3,    4,   6,
                                 -0.5, -6,  0.25, 0.75, 5, -2.5, 2.9, -0.0};
  const std::vector<uint8_t> codes = {0, 1, 2, 3, 4, 5, 6, 7, 9, 15, 0, 2, 6, 12, 5, 8};
  Tensor in = Tensor::from_vector(x, {1, 16}, DType::kFloat16);
  auto [q, sf] = nvfp4_quantize(in, fp32_scalar(1.0), SfLayout::layout_linear);
  EXPECT_EQ(q.dtype(), DType::kUInt8);
  EXPECT_EQ(q.shape(), (Shape{1, 8}));
  EXPECT_EQ(sf.shape(), (Shape{1, 1}));
  EXPECT_EQ(bytes(sf), (std::vector<uint8_t>{0x38}));
  std::vector<uint8_t> packed;
  for (int t = 0; t < 8; ++t)
    packed.push_back(static_cast<uint8_t>(codes[2 * t] | (codes[2 * t + 1] << 4)));
  EXPECT_EQ(bytes(q), packed);
}

TEST(Nvfp4Quantize, GlobalScaleSaturationSubnormalAndZeroBlocks) {
  // Four blocks of 16 (fp16 inputs, all exact):
  //  0: amax 3 with gs 896 -> sf = e4m3(448) = 0x7E; x = 3 -> 3*896/448 = 6 (code 7)
  //  1: amax 5376 -> gs*amax/6 overflows e4m3 and saturates to 448; 5376*896/448 -> +6
  //  2: all zeros -> sf 0, codes 0
  //  3: amax 6*2^-9/896 ... use gs-independent: tiny values whose scale rounds to 0
  std::vector<double> x(64, 0.0);
  x[0] = 3.0;
  x[1] = -1.5;  // -1.5*896/448 = -3 (code 0xD)
  x[16] = 5376.0;
  x[17] = -5376.0;
  x[48] = 1e-7;  // 896 * 1e-7 / 6 < 2^-10: rounds to sf 0, upstream 0.7.4's output scale 0
  Tensor in = Tensor::from_vector(x, {1, 64}, DType::kFloat16);
  auto [q, sf] = fp4_quantize(in, fp32_scalar(896.0), 16, false, false);
  const auto s = bytes(sf);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0], 0x7E);
  EXPECT_EQ(s[1], 0x7E);
  EXPECT_EQ(s[2], 0x00);
  EXPECT_EQ(s[3], 0x00);
  const auto b = bytes(q);
  EXPECT_EQ(b[0], 0xD7);  // lo 3 -> 7, hi -1.5 -> 0xD
  EXPECT_EQ(b[8], 0xF7);  // +6 saturated, -6 saturated
  // sf == 0 under a non-zero amax: upstream 0.7.4's output scale is 0 (it tests the decoded
  // scale; 0.6.18 tested amax and saturated to +6), so 1e-7 and the zeros give +0 codes.
  for (int i = 24; i < 32; ++i) EXPECT_EQ(b[i], 0x00) << i;
  for (int i = 1; i < 8; ++i) EXPECT_EQ(b[i], 0) << i;
  for (int i = 16; i < 24; ++i) EXPECT_EQ(b[i], 0) << i;  // the all-zero block: zero codes

  // is_global_scale_inversed: passing 1/896 must give the same result.
  auto [q2, sf2] = fp4_quantize(in, fp32_scalar(1.0 / 896.0), 16, false, false, false, true);
  EXPECT_EQ(bytes(sf2), s);
  EXPECT_EQ(bytes(q2), b);
  // A bf16 global scale is converted to fp32 first (896 is exact in bf16).
  auto [q3, sf3] =
      fp4_quantize(in, Tensor::from_vector({896.0}, {1}, DType::kBFloat16), 16, false, false);
  EXPECT_EQ(bytes(sf3), s);
  EXPECT_EQ(bytes(q3), b);
}

TEST(Nvfp4Quantize, SmallestSubnormalScale) {
  // gs = 1, amax = 6 * 2^-9: sf is e4m3's smallest subnormal (code 0x01) and amax maps to 6.
  std::vector<double> x(16, 0.0);
  x[0] = 6.0 * std::ldexp(1.0, -9);
  x[1] = -3.0 * std::ldexp(1.0, -9);
  Tensor in = Tensor::from_vector(x, {1, 16}, DType::kBFloat16);
  auto [q, sf] = fp4_quantize(in, fp32_scalar(1.0), 16, false, false);
  EXPECT_EQ(bytes(sf), (std::vector<uint8_t>{0x01}));
  EXPECT_EQ(bytes(q)[0], 0xD7);  // 6 -> 7, -3 -> 0xD
}

TEST(Nvfp4Quantize, MatchesReferenceOverShapesAndLayouts) {
  for (auto [m, k] : {std::pair<int64_t, int64_t>{1, 16}, {37, 96}, {130, 64}, {5, 512}}) {
    for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
      Tensor in = Tensor::empty({m, k}, dt).normal_(static_cast<uint64_t>(m * 1000 + k), 0, 2);
      const auto xs = in.to_double_vector();
      double amax = 0;
      for (double v : xs) amax = std::max(amax, std::fabs(v));
      const float gs = static_cast<float>(448.0 * 6.0 / amax);
      for (SfLayout l : {SfLayout::layout_128x4, SfLayout::layout_8x4, SfLayout::layout_linear}) {
        auto [q, sf] = nvfp4_quantize(in, fp32_scalar(gs), l);
        const int64_t cols = k / 16;
        if (l == SfLayout::layout_linear) {
          EXPECT_EQ(sf.shape(), (Shape{m, cols}));
        } else {
          const int64_t tile = l == SfLayout::layout_128x4 ? 128 : 8;
          EXPECT_EQ(sf.shape(), (Shape{(m + tile - 1) / tile * tile, (cols + 3) / 4 * 4}));
        }
        const auto qb = bytes(q);
        const auto sb = bytes(sf);
        int64_t bad = 0;
        std::vector<bool> used(sb.size(), false);
        for (int64_t r = 0; r < m; ++r) {
          std::vector<float> row(xs.begin() + r * k, xs.begin() + (r + 1) * k);
          const RefQuant ref = ref_nvfp4_row(row, gs, 16);
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t o = sf_layout_offset(l, r, c, cols);
            used[o] = true;
            bad += sb[o] != ref.sf[c];
          }
          for (int64_t i = 0; i < k; ++i) {
            const uint8_t byte = qb[r * (k / 2) + i / 2];
            const uint8_t code = (i % 2 == 0) ? (byte & 0xF) : (byte >> 4);
            bad += code != ref.q[i];
          }
        }
        for (size_t o = 0; o < sb.size(); ++o) bad += !used[o] && sb[o] != 0;  // zero padding
        EXPECT_EQ(bad, 0) << m << "x" << k << " " << sf_layout_name(l);
      }
    }
  }
}

TEST(Nvfp4Quantize, RoundTripThroughDequantize) {
  const int64_t m = 19, k = 48;
  Tensor in = Tensor::empty({m, k}, DType::kBFloat16).uniform_(7, -3, 3);
  const float gs = 448.0f * 6.0f / 3.0f;
  for (bool swz : {true, false}) {
    auto [q, sf] = fp4_quantize(in, fp32_scalar(gs), 16, false, swz);
    Tensor deq = e2m1_and_ufp8sf_scale_to_float(q, sf, fp32_scalar(1.0 / gs), 16, 1, swz);
    ASSERT_EQ(deq.shape(), (Shape{m, k}));
    ASSERT_EQ(deq.dtype(), DType::kFloat32);
    const auto xs = in.to_double_vector();
    const auto d = floats(deq);
    int64_t bad = 0;
    for (int64_t r = 0; r < m; ++r) {
      std::vector<float> row(xs.begin() + r * k, xs.begin() + (r + 1) * k);
      const RefQuant ref = ref_nvfp4_row(row, gs, 16);
      for (int64_t i = 0; i < k; ++i) {
        const float expect =
            e2m1_bits_to_float(ref.q[i]) * (e4m3fn_bits_to_float(ref.sf[i / 16]) * (1.0f / gs));
        bad += d[r * k + i] != expect;
        // And the round trip is within half an e2m1 step of the block scale.
        const double step = e4m3fn_bits_to_float(ref.sf[i / 16]) / gs;
        bad += std::fabs(d[r * k + i] - xs[r * k + i]) > step * 1.0 + 1e-6;
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(Fp4Quantize, OutputShapesNdAndColumnMajor) {
  Tensor in = Tensor::empty({2, 3, 32}, DType::kFloat16).uniform_(3);
  auto [q, sf] = fp4_quantize(in, fp32_scalar(100.0));
  EXPECT_EQ(q.shape(), (Shape{2, 3, 16}));
  EXPECT_EQ(sf.shape(), (Shape{128, 4}));
  auto [q2, sf2] = fp4_quantize(in.reshape({6, 32}), fp32_scalar(100.0));
  EXPECT_EQ(bytes(q), bytes(q2));
  EXPECT_EQ(bytes(sf), bytes(sf2));

  // Column-major [K, M] input: quantized as its transpose, outputs transposed back.
  Tensor rm = Tensor::empty({5, 32}, DType::kBFloat16).uniform_(4);
  Tensor cm = rm.transpose(0, 1);  // [32, 5], stride(-2) == 1
  auto [qc, sfc] = fp4_quantize(cm, fp32_scalar(50.0), 16, false, false);
  auto [qr, sfr] = fp4_quantize(rm, fp32_scalar(50.0), 16, false, false);
  EXPECT_EQ(qc.shape(), (Shape{16, 5}));
  EXPECT_EQ(sfc.shape(), (Shape{2, 5}));
  EXPECT_EQ(bytes(qc.transpose(0, 1)), bytes(qr));
  EXPECT_EQ(bytes(sfc.transpose(0, 1)), bytes(sfr));

  // 3-D too (upstream tests stride(-2) == 1 at any rank): [B, M, K] whose M axis is the
  // contiguous one is quantized along M, as its transpose [B, K, M], the outputs transposed back.
  Tensor t3 = Tensor::empty({2, 32, 48}, DType::kBFloat16).uniform_(5);  // [B, K, M]
  Tensor c3 = t3.transpose(1, 2);                                        // [B, M=48, K=32]
  auto [q3, sf3] = fp4_quantize(c3, fp32_scalar(50.0), 16, false, false);
  auto [qt, sft] = fp4_quantize(t3, fp32_scalar(50.0), 16, false, false);
  EXPECT_EQ(q3.shape(), (Shape{2, 24, 32}));
  EXPECT_EQ(sf3.shape(), (Shape{3, 64}));
  EXPECT_EQ(bytes(q3.transpose(1, 2)), bytes(qt));
  EXPECT_EQ(bytes(sf3.transpose(0, 1)), bytes(sft));
}

// No rows (SGLang's idle data-parallel ranks quantize a [0, hidden] tensor before every MoE
// layer): upstream returns empty outputs of the usual shapes (its scale buffer sized for 0 rows);
// so do we, on the CPU and on a GPU (no kernel launched); K must still be positive.
TEST(Fp4Quantize, NoRowsGiveEmptyOutputs) {
  std::vector<Device> devices = {Device::cpu()};
  if (testing::cuda_available()) devices.push_back(Device::cuda(0));
  for (const Device& d : devices) {
    SCOPED_TRACE(d.str());
    const Tensor x = Tensor::empty({0, 64}, DType::kBFloat16, d);
    const Tensor gs = fp32_scalar(100.0).to(d);
    auto [q, sf] = fp4_quantize(x, gs);
    EXPECT_EQ(q.shape(), (Shape{0, 32}));
    EXPECT_EQ(q.dtype(), DType::kUInt8);
    EXPECT_EQ(sf.shape(), (Shape{0, 4}));
    auto [ql, sfl] = fp4_quantize(x, gs, 16, false, false);
    EXPECT_EQ(sfl.shape(), (Shape{0, 4}));
    auto [q3, sf3] = fp4_quantize(Tensor::empty({2, 0, 64}, DType::kFloat16, d), gs);
    EXPECT_EQ(q3.shape(), (Shape{2, 0, 32}));
    EXPECT_EQ(sf3.numel(), 0);
    auto [qn, sfn] = nvfp4_quantize(x, gs);
    EXPECT_EQ(qn.shape(), (Shape{0, 32}));
    EXPECT_EQ(sfn.numel(), 0);
    // do_shuffle: nothing to shuffle (the shuffles themselves refuse empty inputs).
    auto [qs, sfs] = nvfp4_quantize(x, gs, SfLayout::layout_128x4, true);
    EXPECT_EQ(qs.shape(), (Shape{0, 32}));
    EXPECT_EQ(sfs.numel(), 0);
    auto [qm, sfm] = mxfp4_quantize(x);
    EXPECT_EQ(qm.shape(), (Shape{0, 32}));
    EXPECT_EQ(sfm.numel(), 0);
    auto [q8, sf8] = mxfp8_quantize(x);
    EXPECT_EQ(q8.shape(), (Shape{0, 64}));
    EXPECT_EQ(q8.dtype(), DType::kFloat8E4M3FN);
    EXPECT_EQ(sf8.numel(), 0);
    EXPECT_FI_ERROR(fp4_quantize(Tensor::empty({4, 0}, DType::kBFloat16, d), gs), "fp4_quantize",
                    "input");
    EXPECT_FI_ERROR(mxfp8_quantize(Tensor::empty({4, 0}, DType::kBFloat16, d)), "mxfp8_quantize",
                    "input");
  }
  // Recorded and replayed like any call (replayed after the recording ends: a replay is a call).
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    (void)fp4_quantize(Tensor::empty({0, 64}, DType::kBFloat16), fp32_scalar(100.0));
    (void)mxfp8_quantize(Tensor::empty({0, 64}, DType::kBFloat16));
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& call : calls) {
    EXPECT_TRUE(call.error.empty()) << call.error;
    EXPECT_TRUE(testing::replays_identically(call)) << call.name;
  }
}

// A global scale per row (upstream's row-wise form: numel == M): row r is quantized exactly as
// fp4_quantize of that row alone with scale gs[r], in both scale layouts and with the inversed
// flag, on the CPU and on a GPU; another count is an error naming the scale.
TEST(Fp4Quantize, PerRowGlobalScaleQuantizesEachRowWithItsOwn) {
  std::vector<Device> devices = {Device::cpu()};
  if (testing::cuda_available()) devices.push_back(Device::cuda(0));
  const int64_t m = 5, k = 64;
  const Tensor x = Tensor::empty({m, k}, DType::kBFloat16).uniform_(31, -6, 6);
  const std::vector<double> gsv = {100.0, 3.0, 0.5, 448.0, 1.0};
  for (const Device& d : devices) {
    for (bool swizzled : {true, false}) {
      for (bool inversed : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << d.str() << " swizzled " << swizzled << " inversed " << inversed);
        auto [q, sf] = fp4_quantize(x.to(d), Tensor::from_vector(gsv, {m}, DType::kFloat32).to(d),
                                    16, false, swizzled, false, inversed);
        const auto qb = bytes(q.to(Device::cpu()));
        for (int64_t r = 0; r < m; ++r) {
          auto [qr, sfr] =
              fp4_quantize(x.slice(0, r, r + 1), fp32_scalar(gsv[static_cast<size_t>(r)]), 16,
                           false, false, false, inversed);
          const auto rb = bytes(qr);
          for (int64_t c = 0; c < k / 2; ++c) {
            ASSERT_EQ(qb[static_cast<size_t>(r * k / 2 + c)], rb[static_cast<size_t>(c)]) << r;
          }
          if (!swizzled) {
            const auto sb = bytes(sf.to(Device::cpu())), srb = bytes(sfr);
            for (int64_t c = 0; c < k / 16; ++c) {
              ASSERT_EQ(sb[static_cast<size_t>(r * k / 16 + c)], srb[static_cast<size_t>(c)]) << r;
            }
          }
        }
      }
    }
  }
  EXPECT_FI_ERROR(fp4_quantize(x, Tensor::from_vector({1.0, 2.0}, {2}, DType::kFloat32)),
                  "fp4_quantize", "global_scale");
}

// backend "auto" (upstream 0.7.4's default name) runs the "cuda" kernel: the same bytes.
TEST(Fp4Quantize, AutoBackendIsTheCudaKernel) {
  Tensor in = Tensor::empty({3, 64}, DType::kBFloat16).uniform_(17, -8, 8);
  auto [q1, s1] =
      fp4_quantize(in, fp32_scalar(100.0), 16, false, true, false, false, std::nullopt, "auto");
  auto [q2, s2] = fp4_quantize(in, fp32_scalar(100.0), 16, false, true);
  EXPECT_EQ(bytes(q1), bytes(q2));
  EXPECT_EQ(bytes(s1), bytes(s2));
  auto [m1, t1] = mxfp4_quantize(in, "auto");
  auto [m2, t2] = mxfp4_quantize(in);
  EXPECT_EQ(bytes(m1), bytes(m2));
  EXPECT_EQ(bytes(t1), bytes(t2));
  auto [x1, u1] = mxfp8_quantize(in, true, 32, std::nullopt, "auto");
  auto [x2, u2] = mxfp8_quantize(in);
  EXPECT_EQ(bytes(x1), bytes(x2));
  EXPECT_EQ(bytes(u1), bytes(u2));
}

TEST(Fp4Quantize, Fp8InputAndMxfp4Mode) {
  // fp8 input: upstream's cvt_warp_fp8_to_fp4 (Fp8InputIsRescaledFirstAsUpstream has a hand case),
  // here as its formula over random blocks under a global scale that is not a power of two.
  Tensor in = Tensor::empty({4, 64}, DType::kFloat8E4M3FN).uniform_(9, -100, 100);
  const float gs = 10.0f;
  auto [q, sf] = fp4_quantize(in, fp32_scalar(gs), 16, false, false);
  const auto xs = in.to_double_vector();
  const auto qb = bytes(q);
  const auto sb = bytes(sf);
  for (int64_t r = 0; r < 4; ++r) {
    for (int c = 0; c < 4; ++c) {
      float h[16], amax = 0.0f;
      for (int i = 0; i < 16; ++i) {
        const float xv = static_cast<float>(xs[r * 64 + c * 16 + i]);
        h[i] = Half::from_float(xv * (6.0f * (1.0f / gs))).to_float();
        amax = std::max(amax, std::fabs(h[i]));
      }
      const float s = gs * (amax * (1.0f / 6.0f));
      const uint8_t code = float_to_e4m3fn_bits(s, true);
      const float out = s != 0.0f ? gs * (1.0f / e4m3fn_bits_to_float(code)) : 0.0f;
      EXPECT_EQ(sb[r * 4 + c], code);
      for (int i = 0; i < 16; ++i) {
        const uint8_t byte = qb[r * 32 + (c * 16 + i) / 2];
        EXPECT_EQ((i % 2 == 0) ? (byte & 0xF) : (byte >> 4), float_to_e2m1_bits(h[i] * out));
      }
    }
  }
  // fp4_quantize with sf_vec_size=32 and ue8m0 scales equals mxfp4_quantize (global scale unused).
  Tensor h = Tensor::empty({3, 64}, DType::kFloat16).uniform_(10, -5, 5);
  auto [q1, s1] = fp4_quantize(h, fp32_scalar(123.0), 32, true);
  auto [q2, s2] = mxfp4_quantize(h);
  EXPECT_EQ(bytes(q1), bytes(q2));
  EXPECT_EQ(bytes(s1), bytes(s2));
}

// ---- MXFP4 --------------------------------------------------------------------------------------

TEST(Mxfp4Quantize, HandCheckedScalesAndCodes) {
  // Row 0: amax 6 -> 6/6 = 1 -> ue8m0 127, codes are the values' own. Row 1: amax 7 -> 7/6
  // rounds up to 2 (code 128) -> 7/2 = 3.5 ties to 4 (code 6). Row 2: all zero -> code 0.
  std::vector<double> x(3 * 32, 0.0);
  x[0] = 6;
  x[1] = -0.5;
  x[32] = 7;
  x[33] = 1;  // 1/2 = 0.5 -> code 1
  Tensor in = Tensor::from_vector(x, {3, 32}, DType::kFloat16);
  auto [q, sf] = mxfp4_quantize(in);
  EXPECT_EQ(q.shape(), (Shape{3, 16}));
  EXPECT_EQ(sf.shape(), (Shape{128, 4}));
  const auto s = bytes(sf);
  EXPECT_EQ(s[sf_layout_offset(SfLayout::layout_128x4, 0, 0, 1)], 127);
  EXPECT_EQ(s[sf_layout_offset(SfLayout::layout_128x4, 1, 0, 1)], 128);
  EXPECT_EQ(s[sf_layout_offset(SfLayout::layout_128x4, 2, 0, 1)], 0);
  const auto b = bytes(q);
  EXPECT_EQ(b[0], 0x97);   // 6 -> 7, -0.5 -> 9
  EXPECT_EQ(b[16], 0x16);  // 3.5 -> 6, 0.5 -> 1
  EXPECT_EQ(b[32], 0x00);

  Tensor deq = mxfp4_dequantize(q, sf);
  const auto d = floats(deq);
  EXPECT_EQ(d[0], 6.0f);
  EXPECT_EQ(d[1], -0.5f);
  EXPECT_EQ(d[32], 8.0f);
  EXPECT_EQ(d[33], 1.0f);
  EXPECT_EQ(d[64], 0.0f);
}

TEST(Mxfp4Quantize, RoundTripMatchesReference) {
  const int64_t m = 33, k = 96;
  Tensor in = Tensor::empty({m, k}, DType::kBFloat16).normal_(12, 0, 10);
  auto [q, sf] = mxfp4_quantize(in);
  const auto d = floats(mxfp4_dequantize(q, sf));
  const auto xs = in.to_double_vector();
  int64_t bad = 0;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < k / 32; ++b) {
      double amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xs[r * k + b * 32 + i]));
      const int e = ref_ue8m0_up(static_cast<float>(amax) / 6.0f);
      bad += bytes(sf)[sf_layout_offset(SfLayout::layout_128x4, r, b, k / 32)] != e;
      const double scale = std::ldexp(1.0, e - 127);
      for (int i = 0; i < 32; ++i) {
        const double x = xs[r * k + b * 32 + i];
        const double expect =
            e2m1_bits_to_float(float_to_e2m1_bits(static_cast<float>(x / scale))) * scale;
        bad += d[r * k + b * 32 + i] != expect;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

// ---- MXFP8 --------------------------------------------------------------------------------------

TEST(Mxfp8Quantize, HandCheckedAndRoundTrip) {
  std::vector<double> x(2 * 32, 0.0);
  x[0] = 448;                    // amax 448 -> scale 1 (127), code 0x7E
  x[1] = std::ldexp(1.0, -9);    // smallest e4m3 subnormal, code 0x01
  x[2] = -std::ldexp(1.0, -10);  // half of it: ties to even -> -0 (0x80)
  x[32] = 449;                   // 449/448 rounds up to 2 -> code 128; 224.5 -> 224 (0x76)
  Tensor in = Tensor::from_vector(x, {2, 32}, DType::kFloat16);
  for (bool swz : {true, false}) {
    auto [q, sf] = mxfp8_quantize(in, swz);
    EXPECT_EQ(q.dtype(), DType::kFloat8E4M3FN);  // as on CUDA (issue 47)
    EXPECT_EQ(sf.dtype(), DType::kUInt8);
    EXPECT_EQ(q.shape(), (Shape{2, 32}));
    EXPECT_EQ(sf.dim(), 1);
    EXPECT_EQ(sf.numel(), swz ? 512 : 2);
    const auto s = bytes(sf);
    const SfLayout l = swz ? SfLayout::layout_128x4 : SfLayout::layout_linear;
    EXPECT_EQ(s[sf_layout_offset(l, 0, 0, 1)], 127);
    EXPECT_EQ(s[sf_layout_offset(l, 1, 0, 1)], 128);
    const auto b = bytes(q);
    EXPECT_EQ(b[0], 0x7E);
    EXPECT_EQ(b[1], 0x01);
    EXPECT_EQ(b[2], 0x80);
    EXPECT_EQ(b[32], 0x76);
    const auto d = floats(mxfp8_dequantize_host(q, sf, swz));
    EXPECT_EQ(d[0], 448.0f);
    EXPECT_EQ(d[1], std::ldexp(1.0f, -9));
    EXPECT_EQ(d[32], 448.0f);
  }
  // Random round trip: within half an e4m3 ulp of the block scale.
  Tensor r = Tensor::empty({7, 64}, DType::kBFloat16).normal_(5, 0, 3);
  auto [q, sf] = mxfp8_quantize(r);
  const auto d = floats(mxfp8_dequantize_host(q, sf));
  const auto xs = r.to_double_vector();
  int64_t bad = 0;
  for (size_t i = 0; i < xs.size(); ++i)
    bad += std::fabs(d[i] - xs[i]) > std::fabs(xs[i]) / 16 + 1e-3;
  EXPECT_EQ(bad, 0);
}

// One result dtype on every device: the CPU returned uint8 and CUDA float8_e4m3fn, so a CUDA
// call did not match its CPU reference (issue 47). The values read back as e4m3 numbers, and
// mxfp8_dequantize_host gives the same result for the bytes viewed as uint8 (what upstream's
// host quantizer returns).
TEST(Mxfp8Quantize, ValuesAreFloat8E4M3FnAndDequantizeTakesTheirBytes) {
  Tensor x = Tensor::empty({3, 64}, DType::kBFloat16).normal_(17, 0, 2);
  for (const SfLayout l : {SfLayout::layout_128x4, SfLayout::layout_linear}) {
    auto [q, sf] = mxfp8_quantize(x, true, 32, std::nullopt, "cuda", l);
    ASSERT_EQ(q.dtype(), DType::kFloat8E4M3FN);
    EXPECT_EQ(q.shape(), x.shape());
    EXPECT_EQ(sf.dtype(), DType::kUInt8);
    const auto b = bytes(q);
    const std::vector<double> v = q.to_double_vector();
    for (size_t i = 0; i < b.size(); ++i) {
      const double want = e4m3fn_bits_to_float(b[i]);
      if (std::isnan(want)) {
        ADD_FAILURE() << "a NaN code at " << i;
      } else {
        EXPECT_EQ(v[i], want) << i;
      }
    }
    Tensor u8 =
        Tensor::from_blob(q.data_ptr(), q.shape(), q.strides(), DType::kUInt8, Device::cpu());
    const auto d = floats(mxfp8_dequantize_host(q, sf, true, l));
    EXPECT_EQ(floats(mxfp8_dequantize_host(u8, sf, true, l)), d);
    // Each value is the e4m3 number times its block's power-of-two scale.
    const auto s = bytes(sf);
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t c = 0; c < 64; ++c) {
        const double scale = std::ldexp(1.0, s[sf_layout_offset(l, r, c / 32, 2)] - 127);
        EXPECT_EQ(d[r * 64 + c], v[r * 64 + c] * scale) << r << " " << c;
      }
    }
  }
}

// ---- block_scale_interleave ---------------------------------------------------------------------

TEST(BlockScaleInterleave, MatchesFormulaWithZeroPadding) {
  const int64_t e = 2, rows = 130, cols = 6;
  std::vector<double> v(e * rows * cols);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(1 + i % 251);
  for (DType dt : {DType::kUInt8, DType::kBFloat16}) {
    Tensor in = Tensor::from_vector(v, {e, rows, cols}, dt);
    Tensor out = block_scale_interleave(in);
    const int64_t per = 256 * 8;
    ASSERT_EQ(out.shape(), (Shape{e * per}));
    ASSERT_EQ(out.dtype(), dt);
    const auto o = out.to_double_vector();
    std::vector<bool> used(o.size(), false);
    int64_t bad = 0;
    for (int64_t b = 0; b < e; ++b) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t off = b * per + ref_offset_128x4(r, c, cols);
          used[off] = true;
          bad += o[off] != v[(b * rows + r) * cols + c];
        }
      }
    }
    for (size_t i = 0; i < o.size(); ++i) bad += !used[i] && o[i] != 0;
    EXPECT_EQ(bad, 0);
  }
  // 2-D input equals the swizzle fp4_quantize produces from its own linear scales.
  Tensor x = Tensor::empty({40, 64}, DType::kFloat16).uniform_(21);
  auto [q1, lin] = fp4_quantize(x, fp32_scalar(300.0), 16, false, false);
  auto [q2, swz] = fp4_quantize(x, fp32_scalar(300.0), 16, false, true);
  EXPECT_EQ(bytes(block_scale_interleave(lin)), bytes(swz));
  // Upstream 0.7.4's out=: the same bytes written into the caller's flat buffer (its padding
  // too), which is returned; the wrong size, dtype or a 2-D buffer is refused.
  {
    Tensor mine = Tensor::full({swz.numel()}, 77.0, DType::kUInt8);
    const Tensor got = block_scale_interleave(lin, mine);
    EXPECT_EQ(got.data_ptr(), mine.data_ptr());
    EXPECT_EQ(bytes(mine), bytes(swz));
    EXPECT_FI_ERROR(block_scale_interleave(lin, Tensor::zeros({swz.numel() + 1}, DType::kUInt8)),
                    "block_scale_interleave", "out");
    EXPECT_FI_ERROR(block_scale_interleave(lin, Tensor::zeros({swz.numel()}, DType::kInt8)),
                    "block_scale_interleave", "out");
    EXPECT_FI_ERROR(block_scale_interleave(lin, Tensor::zeros({1, swz.numel()}, DType::kUInt8)),
                    "block_scale_interleave", "out");
  }
}

// ---- bad input ----------------------------------------------------------------------------------

TEST(QuantizationBadInput, ErrorsNameOpAndArgument) {
  Tensor x = Tensor::empty({4, 32}, DType::kFloat16).uniform_(1);
  Tensor gs = fp32_scalar(1.0);
  EXPECT_FI_ERROR(fp4_quantize(Tensor::empty({4, 24}, DType::kFloat16), gs), "fp4_quantize",
                  "input");
  EXPECT_FI_ERROR(fp4_quantize(x, gs, 8), "fp4_quantize", "sf_vec_size");
  EXPECT_FI_ERROR(fp4_quantize(x.to(DType::kFloat32), gs), "fp4_quantize", "input");
  EXPECT_FI_ERROR(fp4_quantize(Tensor::empty({32}, DType::kFloat16), gs), "fp4_quantize", "input");
  EXPECT_FI_ERROR(fp4_quantize(x, Tensor::zeros({2}, DType::kFloat32)), "fp4_quantize",
                  "global_scale");
  EXPECT_FI_ERROR(fp4_quantize(x, Tensor::zeros({1}, DType::kInt32)), "fp4_quantize",
                  "global_scale");
  EXPECT_FI_ERROR(fp4_quantize(x, gs, 16, false, true, false, false, std::nullopt, "triton"),
                  "fp4_quantize", "backend");
  EXPECT_FI_ERROR(nvfp4_quantize(x, gs, SfLayout::layout_128x4, true), "nvfp4_quantize", "a");
  EXPECT_FI_ERROR(nvfp4_quantize(x, gs, SfLayout::layout_linear, true), "nvfp4_quantize",
                  "sfLayout");
  EXPECT_FI_ERROR(nvfp4_quantize(Tensor::empty({4, 40}, DType::kBFloat16), gs), "nvfp4_quantize",
                  "a");
  // An SfLayout cast from an out-of-range int: an error, not a scale tensor of a made-up shape.
  EXPECT_FI_ERROR(nvfp4_quantize(x, gs, static_cast<SfLayout>(7)), "nvfp4_quantize", "sfLayout");
  EXPECT_FI_ERROR(mxfp4_quantize(x, "cuda", std::nullopt, static_cast<SfLayout>(-1)),
                  "mxfp4_quantize", "sfLayout");
  EXPECT_FI_ERROR(sf_layout_size(static_cast<SfLayout>(3), 4, 4), "sf_layout_size", "layout");
  EXPECT_FI_ERROR(mxfp4_quantize(Tensor::empty({4, 48}, DType::kFloat16)), "mxfp4_quantize", "a");
  EXPECT_FI_ERROR(mxfp4_quantize(Tensor::empty({4, 64}, DType::kFloat32)), "mxfp4_quantize", "a");
  auto [q, sf] = mxfp4_quantize(x);
  EXPECT_FI_ERROR(mxfp4_dequantize(q, sf.slice(0, 0, 64)), "mxfp4_dequantize", "a_sf");
  EXPECT_FI_ERROR(mxfp4_dequantize(q.to(DType::kInt32), sf), "mxfp4_dequantize", "a_fp4");
  EXPECT_FI_ERROR(mxfp4_dequantize(Tensor::zeros({4, 8}, DType::kUInt8), sf), "mxfp4_dequantize",
                  "a_fp4");
  EXPECT_FI_ERROR(e2m1_and_ufp8sf_scale_to_float(q, sf, std::nullopt, 32, 2),
                  "e2m1_and_ufp8sf_scale_to_float", "ufp8_type");
  EXPECT_FI_ERROR(
      e2m1_and_ufp8sf_scale_to_float(q, sf, Tensor::full({1}, 1.0, DType::kFloat32), 16, 1, false),
      "e2m1_and_ufp8sf_scale_to_float", "ufp8_scale_tensor");
  // e4m3 scales need the global scale (upstream: "globalScale is required when sfType is 1").
  EXPECT_FI_ERROR(e2m1_and_ufp8sf_scale_to_float(q, sf, std::nullopt, 32, 1),
                  "e2m1_and_ufp8sf_scale_to_float", "global_scale_tensor");
  EXPECT_FI_ERROR(e2m1_and_ufp8sf_scale_to_float(q, sf.to(DType::kFloat32), std::nullopt, 32, 0),
                  "e2m1_and_ufp8sf_scale_to_float", "ufp8_scale_tensor");
  EXPECT_FI_ERROR(block_scale_interleave(Tensor::zeros({4, 4}, DType::kFloat32)),
                  "block_scale_interleave", "unswizzled_sf");
  EXPECT_FI_ERROR(block_scale_interleave(Tensor::zeros({4}, DType::kUInt8)),
                  "block_scale_interleave", "unswizzled_sf");
  EXPECT_FI_ERROR(mxfp8_quantize(x, true, 48), "mxfp8_quantize", "alignment");
  EXPECT_FI_ERROR(mxfp8_quantize(x, true, 32, std::nullopt, "cuda", SfLayout::layout_8x4),
                  "mxfp8_quantize", "sf_swizzle_layout");
  EXPECT_FI_ERROR(mxfp8_quantize(Tensor::empty({2, 48}, DType::kBFloat16)), "mxfp8_quantize",
                  "input");
  auto [q8, sf8] = mxfp8_quantize(x);
  EXPECT_FI_ERROR(mxfp8_dequantize_host(q8, sf8, false), "mxfp8_dequantize_host", "scale_tensor");
  EXPECT_FI_ERROR(mxfp8_dequantize_host(q8, sf8, true, SfLayout::layout_8x4),
                  "mxfp8_dequantize_host", "sf_swizzle_layout");
}

// ---- declarations and replay --------------------------------------------------------------------

TEST(QuantizationDecl, ModulesSignaturesAndInvoke) {
  const OpDecl* d = OpRegistry::global().find("nvfp4_quantize");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->module, "flashinfer.quantization.fp4_quantization");
  EXPECT_NE(d->signature().find("sfLayout="), std::string::npos) << d->signature();
  EXPECT_NE(d->signature().find("backend='cuda'"), std::string::npos) << d->signature();
  EXPECT_EQ(OpRegistry::global().find("mxfp8_quantize")->module,
            "flashinfer.quantization.fp8_quantization");
  for (const char* name :
       {"fp4_quantize", "mxfp4_quantize", "mxfp4_dequantize", "e2m1_and_ufp8sf_scale_to_float",
        "block_scale_interleave", "mxfp8_dequantize_host"}) {
    EXPECT_NE(OpRegistry::global().find(name), nullptr) << name;
  }

  // Replay-style invocation from Values gives the same bytes as the direct call.
  Tensor x = Tensor::empty({9, 32}, DType::kBFloat16).uniform_(31);
  Tensor gs = fp32_scalar(77.0);
  auto [q, sf] = nvfp4_quantize(x, gs, SfLayout::layout_8x4);
  const Value r = d->invoke(
      CallArgs(*d, bind_arguments(*d, {Value(x), Value(gs), to_value(SfLayout::layout_8x4)})));
  ASSERT_EQ(r.items().size(), 2u);
  EXPECT_EQ(bytes(r.items()[0].as_tensor()), bytes(q));
  EXPECT_EQ(bytes(r.items()[1].as_tensor()), bytes(sf));
  // An int works for the enum too (upstream records may carry the value).
  const Value r2 = d->invoke(CallArgs(*d, bind_arguments(*d, {Value(x), Value(gs), Value(1)})));
  EXPECT_EQ(bytes(r2.items()[1].as_tensor()), bytes(sf));

  const OpDecl* f = OpRegistry::global().find("fp4_quantize");
  const Value r3 = f->invoke(
      CallArgs(*f, bind_arguments(*f, {Value(x), Value(gs)}, {{"is_sf_8x4_layout", Value(true)}})));
  EXPECT_EQ(bytes(r3.items()[1].as_tensor()), bytes(sf));
}

// Upstream's signatures and defining modules: str(inspect.signature(f)) as the recorder writes it
// (an Enum default is its repr, "<SfLayout.layout_128x4: 0>"; the upstream table writes the
// source form "SfLayout.layout_128x4").
TEST(QuantizationDecl, SignaturesAndModulesEqualUpstream) {
  const std::string fp4 = "flashinfer.quantization.fp4_quantization";
  const std::string fp8 = "flashinfer.quantization.fp8_quantization";
  const std::vector<std::array<std::string, 3>> expected = {
      {"fp4_quantize", fp4,
       "(input, global_scale=None, sf_vec_size=16, sf_use_ue8m0=False, is_sf_swizzled_layout=True, "
       "is_sf_8x4_layout=False, is_global_scale_inversed=False, enable_pdl=None, backend='cuda')"},
      {"nvfp4_quantize", fp4,
       "(a, a_global_sf, sfLayout=<SfLayout.layout_128x4: 0>, do_shuffle=False, sf_vec_size=16, "
       "enable_pdl=None, backend='cuda', per_token_activation=False, "
       "expanded_idx_to_permuted_idx=None)"},
      {"mxfp4_quantize", fp4,
       "(a, backend='cuda', enable_pdl=None, sfLayout=<SfLayout.layout_128x4: 0>)"},
      {"mxfp4_dequantize", fp4, "(a_fp4, a_sf, sfLayout=<SfLayout.layout_128x4: 0>)"},
      {"e2m1_and_ufp8sf_scale_to_float", fp4,
       "(e2m1_tensor, ufp8_scale_tensor, global_scale_tensor=None, sf_vec_size=16, ufp8_type=1, "
       "is_sf_swizzled_layout=True, is_sf_8x4_layout=False)"},
      {"block_scale_interleave", fp4, "(unswizzled_sf, *, out=None)"},
      {"mxfp8_quantize", fp8,
       "(input, is_sf_swizzled_layout=True, alignment=32, enable_pdl=None, backend='cuda', "
       "sf_swizzle_layout=None)"},
      {"mxfp8_dequantize_host", fp8,
       "(input, scale_tensor, is_sf_swizzled_layout=True, sf_swizzle_layout=None)"},
  };
  for (const auto& [name, module, sig] : expected) {
    const OpDecl* d = OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->module, module) << name;
    EXPECT_EQ(d->signature(), sig) << name;
  }
  // The layout parameters are the SfLayout enum.
  const OpDecl* m = OpRegistry::global().find("mxfp4_dequantize");
  EXPECT_EQ(m->params.at(2).kind, ParamKind::kEnum);
  EXPECT_EQ(m->params.at(2).type_name, "SfLayout");
  for (const char* name : {"mxfp8_quantize", "mxfp8_dequantize_host"}) {
    const OpDecl* d = OpRegistry::global().find(name);
    const ParamDecl& p =
        d->params.at(static_cast<std::size_t>(d->param_index("sf_swizzle_layout")));
    EXPECT_EQ(p.kind, ParamKind::kEnum) << name;
    EXPECT_EQ(p.type_name, "SfLayout") << name;
    EXPECT_TRUE(p.optional) << name;
  }
}

// nvfp4_quantize's last two parameters are positional-or-keyword upstream: a call with all nine
// positional arguments binds, and the non-default values are refused naming the argument.
TEST(QuantizationDecl, Nvfp4TrailingParametersBindPositionally) {
  const OpDecl* d = OpRegistry::global().find("nvfp4_quantize");
  ASSERT_NE(d, nullptr);
  Tensor x = Tensor::empty({4, 32}, DType::kBFloat16).uniform_(5);
  Tensor gs = fp32_scalar(1.0);
  const std::vector<Value> base = {Value(x),     Value(gs), to_value(SfLayout::layout_linear),
                                   Value(false), Value(16), Value(),
                                   Value("cuda")};
  std::vector<Value> args = base;
  args.push_back(Value(false));
  args.push_back(Value());
  const Value r = d->invoke(CallArgs(*d, bind_arguments(*d, args)));
  auto [q, sf] = nvfp4_quantize(x, gs, SfLayout::layout_linear);
  EXPECT_EQ(bytes(r.items()[0].as_tensor()), bytes(q));
  EXPECT_EQ(bytes(r.items()[1].as_tensor()), bytes(sf));

  // per_token_activation binds eighth: the per-token form's three outputs.
  args[7] = Value(true);
  const Value rp = d->invoke(CallArgs(*d, bind_arguments(*d, args)));
  ASSERT_EQ(rp.items().size(), 3u);
  EXPECT_EQ(rp.items()[2].as_tensor().shape(), (Shape{4}));
  args[7] = Value(false);
  args[8] = Value(Tensor::zeros({4}, DType::kInt32));
  EXPECT_FI_ERROR(d->invoke(CallArgs(*d, bind_arguments(*d, args))), "nvfp4_quantize",
                  "expanded_idx_to_permuted_idx");
}

// mxfp4_quantize / mxfp4_dequantize take upstream's sfLayout: the scales are those of
// fp4_quantize(sf_vec_size=32, sf_use_ue8m0=True) in that layout, and every layout dequantizes
// to the same values.
TEST(Mxfp4Quantize, SfLayoutSelectsTheScaleLayout) {
  Tensor x = Tensor::empty({9, 64}, DType::kBFloat16).normal_(17, 0, 3);
  auto [q0, s0] = mxfp4_quantize(x);
  const auto d0 = floats(mxfp4_dequantize(q0, s0));
  const struct {
    SfLayout layout;
    bool swizzled, is_8x4;
    Shape sf_shape;
  } cases[] = {{SfLayout::layout_8x4, true, true, {16, 4}},
               {SfLayout::layout_linear, false, false, {9, 2}},
               {SfLayout::layout_128x4, true, false, {128, 4}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(sf_layout_name(c.layout)));
    auto [q, sf] = mxfp4_quantize(x, "cuda", std::nullopt, c.layout);
    EXPECT_EQ(sf.shape(), c.sf_shape);
    EXPECT_EQ(bytes(q), bytes(q0));
    auto [qr, sr] = fp4_quantize(x, std::nullopt, 32, true, c.swizzled, c.is_8x4);
    EXPECT_EQ(bytes(sf), bytes(sr));
    EXPECT_EQ(floats(mxfp4_dequantize(q, sf, c.layout)), d0);
    if (c.layout != SfLayout::layout_128x4) {
      // Scales of another layout have another size: refused, naming a_sf.
      EXPECT_FI_ERROR(mxfp4_dequantize(q, sf), "mxfp4_dequantize", "a_sf");
    }
  }
  // From Values, as replay binds an upstream record: sfLayout by keyword.
  const OpDecl* d = OpRegistry::global().find("mxfp4_dequantize");
  auto [q8, s8] = mxfp4_quantize(x, "cuda", std::nullopt, SfLayout::layout_8x4);
  const Value r =
      d->invoke(CallArgs(*d, bind_arguments(*d, {Value(q8), Value(s8)},
                                            {{"sfLayout", to_value(SfLayout::layout_8x4)}})));
  EXPECT_EQ(floats(r.as_tensor()), d0);
}

// Upstream's host decode (E2M1AndUFP8SFScaleToFloatV2): e4m3 scales times the global scale
// first, then the value (1.5 * (1.75 * fp32(1/3)) = 0.87500006, where (1.5 * 1.75) * fp32(1/3) =
// 0.875); ue8m0 scales as the float of exponent bits `code` (0 -> +0.0, 255 -> +inf) with the
// global scale ignored; any vector size dividing K. mxfp8_dequantize_host decodes ue8m0 so too.
TEST(Nvfp4Dequantize, HostDecodeAsUpstreamsV2) {
  std::vector<double> b(8, 0.0);
  b[0] = 0x03;  // element 0: e2m1 1.5
  Tensor q = Tensor::from_vector(b, {1, 8}, DType::kUInt8);
  const Tensor third = fp32_scalar(1.0 / 3.0);
  const auto y = floats(e2m1_and_ufp8sf_scale_to_float(
      q, Tensor::from_vector({0x3E}, {1}, DType::kUInt8), third, 16, 1, false));  // e4m3 1.75
  EXPECT_EQ(y[0], 1.5f * (1.75f * static_cast<float>(1.0 / 3.0)));
  EXPECT_NE(y[0], 0.875f);
  // ue8m0: blocks of 4 with codes 0, 255, 128 (2.0) and 127 (1.0); elements 1.0 and 0 each.
  std::vector<double> b2(8, 0.0);
  for (int blk = 0; blk < 4; ++blk) b2[blk * 2] = 0x02;  // element 4 blk: 1.0, then zeros
  Tensor q2 = Tensor::from_vector(b2, {1, 8}, DType::kUInt8);
  const Tensor sf2 = Tensor::from_vector({0, 255, 128, 127}, {4}, DType::kUInt8);
  for (const std::optional<Tensor>& g : {std::optional<Tensor>{}, std::optional<Tensor>{third}}) {
    const auto z = floats(e2m1_and_ufp8sf_scale_to_float(q2, sf2, g, 4, 0, false));
    EXPECT_EQ(z[0], 0.0f);
    EXPECT_EQ(z[4], std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(z[5]));  // 0 * inf
    EXPECT_EQ(z[8], 2.0f);
    EXPECT_EQ(z[12], 1.0f);
  }
  // mxfp4_dequantize (upstream: this function with ufp8_type=0): the same decode.
  std::vector<double> b3(32, 0.0);
  b3[0] = b3[16] = 0x02;
  const auto w = floats(mxfp4_dequantize(Tensor::from_vector(b3, {1, 32}, DType::kUInt8),
                                         Tensor::from_vector({0, 255}, {2}, DType::kUInt8),
                                         SfLayout::layout_linear));
  EXPECT_EQ(w[0], 0.0f);
  EXPECT_EQ(w[32], std::numeric_limits<float>::infinity());
  // mxfp8_dequantize_host: e4m3 1.0 in blocks of 32 with codes 0 and 255.
  std::vector<double> d(64, 0.0);
  d[0] = d[32] = 0x38;  // e4m3 1.0
  const auto m =
      floats(mxfp8_dequantize_host(Tensor::from_vector(d, {1, 64}, DType::kUInt8),
                                   Tensor::from_vector({0, 255}, {2}, DType::kUInt8), false));
  EXPECT_EQ(m[0], 0.0f);
  EXPECT_EQ(m[32], std::numeric_limits<float>::infinity());
}

// e4m3 input, as upstream's cvt_warp_fp8_to_fp4: h = fp16(x * 6 / gs), s = gs * (amax(h) / 6),
// codes e2m1(h * gs / s). x = [1, 0.5, -2, 0, ...] with gs 2: h = [3, 1.5, -6, 0], s = 2 (e4m3
// 0x40), codes 5, 3, 0xF, 0: bytes 0x35, 0x0F. Quantized directly (the fp16 rule) the scale would
// be e4m3(2 * 2 / 6) instead. mxfp4_quantize (gs 1, ue8m0): h = [6, 3, -12, 0], s = 2 (code 128),
// the same codes.
TEST(Fp4Quantize, Fp8InputIsRescaledFirstAsUpstream) {
  std::vector<double> x(32, 0.0);
  x[0] = 1.0;
  x[1] = 0.5;
  x[2] = -2.0;
  const Tensor in = Tensor::from_vector(x, {1, 32}, DType::kFloat8E4M3FN);
  auto [q, sf] = fp4_quantize(in, fp32_scalar(2.0), 16, false, false);
  const auto qb = q.to_double_vector(), sb = sf.to_double_vector();
  EXPECT_EQ(qb[0], 0x35);
  EXPECT_EQ(qb[1], 0x0F);
  for (int i = 2; i < 16; ++i) EXPECT_EQ(qb[i], 0) << i;
  EXPECT_EQ(sb[0], 0x40);
  EXPECT_EQ(sb[1], 0);  // the second block is all zeros: scale 0, codes 0
  auto [mq, msf] = mxfp4_quantize(in, "cuda", std::nullopt, SfLayout::layout_linear);
  const auto mqb = mq.to_double_vector();
  EXPECT_EQ(mqb[0], 0x35);
  EXPECT_EQ(mqb[1], 0x0F);
  EXPECT_EQ(msf.to_double_vector()[0], 128);
  // fp4_quantize with ue8m0 scales keeps the global scale on the e4m3 path, where fp16 input
  // ignores it: gs = 2^-14 makes fp16(x * 6 / gs) overflow for |x| >= 1 (1 -> +inf, -2 -> -inf;
  // 0.5 -> 49152), so amax is inf, the scale saturates (code 254) and the codes are +6, 0, -6, 0
  // (bytes 0x07, 0x0F); ignoring gs would give the codes above.
  auto [uq, usf] = fp4_quantize(in, fp32_scalar(std::ldexp(1.0, -14)), 32, true, false);
  EXPECT_EQ(uq.to_double_vector()[0], 0x07);
  EXPECT_EQ(uq.to_double_vector()[1], 0x0F);
  EXPECT_EQ(usf.to_double_vector()[0], 254);
}

// e2m1_and_ufp8sf_scale_to_float reads 8x4 scales with is_sf_8x4_layout=True.
TEST(Nvfp4Dequantize, Reads8x4ScalesWithIsSf8x4Layout) {
  Tensor x = Tensor::empty({10, 48}, DType::kFloat16).normal_(23, 0, 2);
  Tensor gs = fp32_scalar(448.0 * 6.0 / 8.0);
  Tensor inv = fp32_scalar(8.0 / (448.0 * 6.0));
  auto [q, sf] = nvfp4_quantize(x, gs);
  auto [q8, sf8] = nvfp4_quantize(x, gs, SfLayout::layout_8x4);
  EXPECT_EQ(sf8.numel(), 16 * 4);
  const auto ref = floats(e2m1_and_ufp8sf_scale_to_float(q, sf, inv));
  EXPECT_EQ(floats(e2m1_and_ufp8sf_scale_to_float(q8, sf8, inv, 16, 1, true, true)), ref);
  // Without the flag the 8x4 buffer is the wrong size for the 128x4 layout.
  EXPECT_FI_ERROR(e2m1_and_ufp8sf_scale_to_float(q8, sf8, inv), "e2m1_and_ufp8sf_scale_to_float",
                  "ufp8_scale_tensor");
  // The 8x4 flag needs a swizzled layout (upstream: "isSf8x4Layout requires isSfSwizzledLayout
  // to be true"); linear scales read without it.
  auto [ql, sfl] = nvfp4_quantize(x, gs, SfLayout::layout_linear);
  EXPECT_FI_ERROR(e2m1_and_ufp8sf_scale_to_float(ql, sfl, inv, 16, 1, false, true),
                  "e2m1_and_ufp8sf_scale_to_float", "is_sf_8x4_layout");
  EXPECT_EQ(floats(e2m1_and_ufp8sf_scale_to_float(ql, sfl, inv, 16, 1, false)), ref);
  const OpDecl* d = OpRegistry::global().find("e2m1_and_ufp8sf_scale_to_float");
  const Value r = d->invoke(CallArgs(*d, bind_arguments(*d, {Value(q8), Value(sf8), Value(inv)},
                                                        {{"is_sf_8x4_layout", Value(true)}})));
  EXPECT_EQ(floats(r.as_tensor()), ref);
}

// ---- CUDA vs CPU --------------------------------------------------------------------------------

TEST(QuantizationCuda, Fp4MatchesCpuBitExact) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  Tensor x = Tensor::empty({150, 256}, DType::kBFloat16).normal_(41, 0, 4);
  Tensor gs = fp32_scalar(448.0 * 6.0 / 16.0);
  for (bool swz : {true, false}) {
    for (bool e8x4 : {false, true}) {
      auto [qc, sc] = fp4_quantize(x, gs, 16, false, swz, e8x4);
      auto [qg, sg] =
          fp4_quantize(x.to(Device::cuda()), gs.to(Device::cuda()), 16, false, swz, e8x4);
      EXPECT_EQ(bytes(qg), bytes(qc));
      EXPECT_EQ(bytes(sg), bytes(sc));
    }
  }
  auto [qc, sc] = mxfp4_quantize(x);
  auto [qg, sg] = mxfp4_quantize(x.to(Device::cuda()));
  EXPECT_EQ(bytes(qg), bytes(qc));
  EXPECT_EQ(bytes(sg), bytes(sc));
}

// Bit-exactness where device and host arithmetic could part: special values (inf, NaN, -0,
// float subnormals, values that overflow the scale), an inverted global scale, fp8 input, and a
// strided input view kept strided on the GPU.
TEST(QuantizationCuda, Fp4EdgeCasesMatchCpuBitExact) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  Tensor x = Tensor::empty({40, 2 * 64 + 1}, DType::kFloat32).normal_(45, 0, 3);
  float* v = x.data<float>();
  const float specials[] = {INFINITY, -INFINITY, NAN, -0.0f, 1e-40f, -3e-39f, 1e30f, 7e-45f};
  for (int i = 0; i < 8; ++i) v[(5 * i) * x.stride(0) + 3 * i + 1] = specials[i];
  // Row 7, first block of the strided view (odd columns 1..31): zeros and one subnormal value.
  for (int i = 1; i < 33; i += 2) v[7 * x.stride(0) + i] = 0.0f;
  v[7 * x.stride(0) + 3] = 1e-38f;
  for (DType dt : {DType::kBFloat16, DType::kFloat16, DType::kFloat8E4M3FN}) {
    Tensor xs = x.to(dt).slice(1, 1, 2 * 64 + 1, 2);  // [40, 64], column stride 2
    for (const auto& [gs_value, inversed] :
         {std::pair{448.0 * 6.0 / 16.0, false}, std::pair{16.0 / (448.0 * 6.0), true}}) {
      Tensor gs = fp32_scalar(gs_value);
      auto [qc, sc] = fp4_quantize(xs, gs, 16, false, true, false, inversed);
      auto [qg, sg] =
          fp4_quantize(testing::to_keep_layout(xs, g), gs.to(g), 16, false, true, false, inversed);
      EXPECT_EQ(bytes(qg), bytes(qc)) << dtype_torch_name(dt) << " inversed " << inversed;
      EXPECT_EQ(bytes(sg), bytes(sc)) << dtype_torch_name(dt) << " inversed " << inversed;
    }
    if (dt != DType::kFloat8E4M3FN) {
      auto [qc, sc] = mxfp4_quantize(xs.contiguous());
      auto [qg, sg] = mxfp4_quantize(xs.contiguous().to(g));
      EXPECT_EQ(bytes(qg), bytes(qc)) << dtype_torch_name(dt);
      EXPECT_EQ(bytes(sg), bytes(sc)) << dtype_torch_name(dt);
      auto [q8c, s8c] = mxfp8_quantize(xs.contiguous());
      auto [q8g, s8g] = mxfp8_quantize(xs.contiguous().to(g));
      EXPECT_EQ(bytes(q8g), bytes(q8c)) << dtype_torch_name(dt);
      EXPECT_EQ(bytes(s8g), bytes(s8c)) << dtype_torch_name(dt);
    }
  }
}

// The CUDA quantizers read 16 bytes at a time when the rows are unit-stride and 16-byte aligned
// (fp4_quantize_kernel, mxfp8_quantize_kernel; grid-stride over the blocks) and element by
// element otherwise (*_strided_kernel). The same values in an aligned matrix and in a view
// starting one element into wider rows take one kernel each: their codes and scales agree with
// each other and with the CPU, bit for bit, specials included. 1100 rows of 8192 outrun one pass
// of the vector grid (SMs x resident blocks x 128 threads) on an H100 or H200.
TEST(QuantizationCuda, VectorAndStridedKernelsAgreeBitExact) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  for (const int64_t m : {1100, 37}) {
    const int64_t k = m > 100 ? 8192 : 256;
    Tensor x = Tensor::empty({m, k + 16}, DType::kFloat32).normal_(47, 0, 3);
    float* v = x.data<float>();
    const float specials[] = {INFINITY, -INFINITY, NAN, -0.0f, 1e-40f, -3e-39f, 1e30f, 7e-45f};
    for (int i = 0; i < 8; ++i) {
      v[(3 * i) * x.stride(0) + 5 * i + 1] = specials[i];  // inside both views
      v[(3 * i + 1) * x.stride(0) + 7 * i + 2] = specials[i];
    }
    for (int i = 0; i < 33; ++i) v[9 * x.stride(0) + 1 + i] = 0.0f;  // a zero block
    for (DType dt : {DType::kBFloat16, DType::kFloat16, DType::kFloat8E4M3FN}) {
      SCOPED_TRACE(::testing::Message() << dtype_torch_name(dt) << " m " << m);
      Tensor wide = x.to(dt);
      Tensor aligned = wide.slice(1, 1, k + 1).contiguous();  // vector kernels
      Tensor shifted = wide.slice(1, 1, k + 1);               // 1 element in: strided kernels
      // (Sliced on the device: a copy of the view alone would start at an aligned address.)
      Tensor ag = aligned.to(g), sg = wide.to(g).slice(1, 1, k + 1);
      const bool check_cpu = m < 100;  // the CPU reference on the small matrix only
      Tensor gs = fp32_scalar(448.0 * 6.0 / 16.0);
      for (bool e8x4 : {false, true}) {
        auto [qa, sa] = fp4_quantize(ag, gs.to(g), 16, false, true, e8x4);
        auto [qs, ss] = fp4_quantize(sg, gs.to(g), 16, false, true, e8x4);
        EXPECT_EQ(bytes(qa), bytes(qs));
        EXPECT_EQ(bytes(sa), bytes(ss));
        if (check_cpu) {
          auto [qc, sc] = fp4_quantize(aligned, gs, 16, false, true, e8x4);
          EXPECT_EQ(bytes(qa), bytes(qc));
          EXPECT_EQ(bytes(sa), bytes(sc));
        }
      }
      if (dt == DType::kFloat8E4M3FN) continue;  // mxfp4 and mxfp8 take 16-bit inputs
      {
        auto [qa, sa] = mxfp4_quantize(ag);
        auto [qs, ss] = mxfp4_quantize(sg);
        EXPECT_EQ(bytes(qa), bytes(qs));
        EXPECT_EQ(bytes(sa), bytes(ss));
        if (check_cpu) {
          auto [qc, sc] = mxfp4_quantize(aligned);
          EXPECT_EQ(bytes(qa), bytes(qc));
          EXPECT_EQ(bytes(sa), bytes(sc));
        }
      }
      auto [qa, sa] = mxfp8_quantize(ag);
      auto [qs, ss] = mxfp8_quantize(sg);
      EXPECT_EQ(bytes(qa), bytes(qs));
      EXPECT_EQ(bytes(sa), bytes(ss));
      if (check_cpu) {
        auto [qc, sc] = mxfp8_quantize(aligned);
        EXPECT_EQ(bytes(qa), bytes(qc));
        EXPECT_EQ(bytes(sa), bytes(sc));
      }
    }
  }
}

TEST(QuantizationCuda, Mxfp8AndInterleaveMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  Tensor x = Tensor::empty({70, 128}, DType::kFloat16).normal_(43, 0, 100);
  auto [qc, sc] = mxfp8_quantize(x);
  auto [qg, sg] = mxfp8_quantize(x.to(Device::cuda()));
  EXPECT_EQ(qg.dtype(), DType::kFloat8E4M3FN);
  EXPECT_EQ(bytes(qg), bytes(qc));
  EXPECT_EQ(bytes(sg), bytes(sc));
  Tensor s = Tensor::empty({3, 100, 9}, DType::kUInt8).uniform_(44, 0, 255);
  EXPECT_EQ(bytes(block_scale_interleave(s.to(Device::cuda()))), bytes(block_scale_interleave(s)));
}

}  // namespace
}  // namespace flashinfer
