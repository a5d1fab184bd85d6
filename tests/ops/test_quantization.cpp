// Tests of the FP4 / MXFP8 quantization ops: hand-checked codes, scale-layout offsets against
// the formulas, round trips, a naive reference over shapes, bad input, replay, CUDA vs CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernels/nvfp4_rules.h"
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
  EXPECT_NE(d->signature().find("backend='auto'"), std::string::npos) << d->signature();
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
       "is_sf_8x4_layout=False, is_global_scale_inversed=False, enable_pdl=None, backend='auto', "
       "nvfp4_4over6=_UNSET, *, batch_invariant=False)"},
      {"nvfp4_quantize", fp4,
       "(a, a_global_sf, sfLayout=<SfLayout.layout_128x4: 0>, do_shuffle=False, sf_vec_size=16, "
       "enable_pdl=None, backend='auto', per_token_activation=False, "
       "expanded_idx_to_permuted_idx=None, out_scale=None, nvfp4_4over6=_UNSET, *, "
       "batch_invariant=False)"},
      {"mxfp4_quantize", fp4,
       "(a, backend='auto', enable_pdl=None, sfLayout=<SfLayout.layout_128x4: 0>, *, "
       "batch_invariant=False)"},
      {"mxfp4_dequantize", fp4, "(a_fp4, a_sf, sfLayout=<SfLayout.layout_128x4: 0>)"},
      {"e2m1_and_ufp8sf_scale_to_float", fp4,
       "(e2m1_tensor, ufp8_scale_tensor, global_scale_tensor=None, sf_vec_size=16, ufp8_type=1, "
       "is_sf_swizzled_layout=True, is_sf_8x4_layout=False)"},
      {"block_scale_interleave", fp4, "(unswizzled_sf, *, out=None)"},
      {"mxfp8_quantize", fp8,
       "(input, is_sf_swizzled_layout=True, alignment=32, enable_pdl=None, backend='auto', "
       "sf_swizzle_layout=None, *, batch_invariant=False)"},
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

// ---- batch_invariant=True (upstream 0.7.4) ------------------------------------------------------

// Golden vectors from upstream 0.7.4's own exact-arithmetic specification of the batch-invariant
// classes (batch_invariant/fp_interface/exact.py with quantization/nvfp4_spec.py and
// mx_spec.py, evaluated in Python's Fractions): bf16 rows (bits), the scale bytes in linear
// layout and the packed codes. nv_*: NVFP4, 4 rows x 32 (gs = 1, and gs = fp32(2688 / 0.37));
// mx8 / mx4: 2 rows x 64; pt: per-token NVFP4 with gsi = fp32(1 / 2688), a zero third row.
namespace bi_golden {
// nv_gs1 gs=1.0
const uint16_t nv_gs1_x[] = {
    0x3f8d, 0x3e5f, 0xbd1a, 0x3dab, 0x3f21, 0x3e97, 0xbf3e, 0xbf4e, 0x3de6, 0xbe80, 0x3e32, 0xbe4d,
    0x3e8e, 0xbf18, 0xbf5e, 0xbef8, 0x3d5f, 0x3e51, 0x3e8b, 0xbe75, 0xbd5c, 0x3e77, 0xbec6, 0x3e9b,
    0xbfb3, 0x3e39, 0xbf1f, 0x3cbc, 0x3d86, 0xbf66, 0x3ea8, 0x3f8b, 0xbd07, 0x3f3a, 0xbeae, 0xbeea,
    0xbebe, 0xbf3c, 0xbf73, 0x3ed2, 0x3ef4, 0x3f4d, 0x3e2e, 0xbf5f, 0x3f60, 0xbf1f, 0xbe45, 0x3d77,
    0x3da5, 0x3d76, 0x3ee5, 0x3f71, 0x3f75, 0xbf0f, 0x3f23, 0xbec5, 0x3eb1, 0xbf4a, 0x3e48, 0xbd10,
    0x3e37, 0xbf01, 0x3d87, 0x3f8a, 0x3bfc, 0xbd63, 0xbd93, 0x3d8d, 0xbd10, 0xbd8a, 0xbdc9, 0xbc9e,
    0xbcb0, 0xbdc3, 0x3b2b, 0xbc8f, 0x3d46, 0xbcb0, 0x3cdb, 0xbd46, 0x3bae, 0xbd44, 0xbcee, 0x3d09,
    0xbc59, 0x3d55, 0xbd54, 0x3cb9, 0xbdf0, 0x3d70, 0x3c11, 0x3cbc, 0x3c73, 0xbb4b, 0xbb6c, 0x3ca6,
    0xbf9b, 0x3f38, 0xbbd5, 0x3f2a, 0x3deb, 0x3f2c, 0xbde1, 0xbe7f, 0x3f1c, 0x3e5a, 0xbe90, 0x3e58,
    0xbf44, 0xbeca, 0x3b75, 0xbef8, 0xbf69, 0x3f36, 0x3e6a, 0x3d82, 0xbfdd, 0x3f32, 0xbcd5, 0xbf1e,
    0xbe83, 0x3e99, 0x3e3f, 0x3eac, 0x3e8f, 0xbf38, 0x3eb9, 0x3e45};
const uint8_t nv_gs1_sf[] = {0x24, 0x27, 0x22, 0x24, 0x08, 0x0a, 0x25, 0x29};
const uint8_t nv_gs1_q[] = {
    0x27, 0x18, 0x35, 0xee, 0xb1, 0xa2, 0xd3, 0xde, 0x20, 0xa2, 0x28, 0x3b, 0x2f, 0x0d, 0xe1, 0x63,
    0x68, 0xdc, 0xec, 0x5f, 0x75, 0xf2, 0xe7, 0x1a, 0x11, 0x74, 0xd7, 0xc5, 0xe4, 0x82, 0xd2, 0x71,
    0xe1, 0x6e, 0xec, 0xaf, 0xfb, 0xa0, 0xb5, 0xd3, 0xc1, 0x3b, 0x59, 0x2d, 0x5f, 0x21, 0x82, 0x28,
    0x6f, 0x58, 0x51, 0xa9, 0x25, 0x2b, 0xce, 0xc0, 0x5d, 0x02, 0x4f, 0xc8, 0x2a, 0x21, 0xd2, 0x13};
// nv_gsg gs=7264.86474609375
const uint16_t nv_gsg_x[] = {
    0x3eeb, 0xbf55, 0xbf06, 0x400d, 0xbf56, 0xbe8e, 0xbba4, 0x3ffd, 0x3fc9, 0x4011, 0x4097, 0x4093,
    0x3d66, 0x4003, 0xbef6, 0xbfcf, 0xbf43, 0xbf12, 0xbfe0, 0x3db5, 0xbfc4, 0x4014, 0x3f7d, 0xbe80,
    0x3f65, 0x3fa8, 0xc012, 0x3fa9, 0x3ef4, 0xbeee, 0xbfcd, 0x3d77, 0x3c30, 0xbc89, 0x3a7f, 0x3c93,
    0xbd51, 0xbbc8, 0x3bd4, 0x3c43, 0xbd2f, 0xbc3e, 0x3d06, 0xbb9e, 0xbc72, 0x3c6c, 0x3c1f, 0xbc26,
    0xb9bf, 0xbc70, 0xbd0d, 0x3c30, 0xbce5, 0x3d36, 0xbd31, 0xba7a, 0xbcc7, 0xbb4c, 0x3c34, 0xbbef,
    0x3ccb, 0x3b9e, 0x3ca9, 0xbd3a, 0xbf54, 0x3f0a, 0x3e77, 0xbfa9, 0x3fdb, 0xbed9, 0xbec9, 0xbf94,
    0x3f3c, 0x3f87, 0xbe85, 0x3f2f, 0x3f3f, 0x3d91, 0xbebe, 0x3d9d, 0x3fa9, 0xbf4f, 0x3cea, 0xbe6e,
    0x3ff6, 0x3fc7, 0xbdbe, 0x3eb8, 0x3e02, 0xbe6c, 0xbf59, 0xbf18, 0xbef8, 0x3f34, 0x3d2d, 0x3f7c,
    0x3bd1, 0xbb6e, 0x3c4d, 0xbc8e, 0xbba8, 0xbafb, 0xbc94, 0x3c22, 0xbd3b, 0x3bc1, 0xbc86, 0x39b8,
    0xbcbf, 0x3c7f, 0x3c2c, 0xbc80, 0xbc44, 0x3c42, 0x3b49, 0xbb86, 0xbb6f, 0x3d0d, 0x3c2e, 0x3caf,
    0xb8e4, 0xbcae, 0xbca7, 0x3925, 0x3ccb, 0xbb0f, 0xbbef, 0x3d12};
const uint8_t nv_gsg_sf[] = {0x7e, 0x7e, 0x67, 0x66, 0x7e, 0x7e, 0x66, 0x63};
const uint8_t nv_gsg_q[] = {
    0xf7, 0x7f, 0xef, 0x78, 0x77, 0x77, 0x72, 0xff, 0xff, 0x3f, 0x7f, 0xe7, 0x77, 0x7f, 0xf7, 0x2f,
    0xc3, 0x40, 0x9f, 0x32, 0xbf, 0x96, 0x3c, 0xa2, 0xc8, 0x3e, 0x7e, 0x8f, 0x9d, 0xa3, 0x15, 0xf5,
    0x7f, 0xf6, 0xf7, 0xff, 0x77, 0x7e, 0x27, 0x2f, 0xf7, 0xe1, 0x77, 0x7b, 0xe4, 0xff, 0x7f, 0x71,
    0x92, 0xc3, 0x89, 0x3c, 0x2f, 0x0c, 0x4d, 0xc3, 0x4c, 0x91, 0x79, 0x64, 0xe8, 0x0d, 0x96, 0x7a};
// mx8 gs=0.0
const uint16_t mx8_x[] = {
    0xbe59, 0xbf03, 0x3db3, 0x3ce4, 0x3cfc, 0xba9f, 0xbd54, 0x3e5e, 0x3dd6, 0x3df0, 0x3eaa, 0x3d04,
    0xbdf9, 0x3ccc, 0x3dd2, 0xbe25, 0x3ca4, 0xbc59, 0xbe3a, 0xbe0a, 0xbdd9, 0xbd87, 0xbe41, 0xbe37,
    0xbda3, 0x3e8d, 0x3ddc, 0xbdfd, 0x3e5d, 0xbe0a, 0xbe92, 0x3e7b, 0x3d99, 0x3e5f, 0x3d91, 0x3e21,
    0xbdc0, 0xbd22, 0x3918, 0xbc69, 0xbe07, 0x3dc8, 0xbc8a, 0xbe2c, 0x3dd3, 0xbc37, 0xbcda, 0xbc7d,
    0x3c2e, 0xbdd1, 0x3e3d, 0xbe05, 0xbd58, 0xbd90, 0x3e11, 0xbe2f, 0x3cad, 0x3867, 0x3d26, 0xbe41,
    0x3d94, 0xbd8b, 0x3dfe, 0xbd4c, 0xbb1b, 0x3b78, 0x3bf3, 0xbad3, 0x3b0e, 0xbc1b, 0xbbf0, 0x3bbe,
    0xba71, 0xbb59, 0xbb39, 0xba27, 0xbb37, 0xba17, 0x3a01, 0x3b70, 0xbc07, 0x3ac9, 0xbbfd, 0xbc68,
    0x3c36, 0x3b18, 0x3ba0, 0x3c0d, 0xbb43, 0x3bba, 0xbb64, 0x3b59, 0x3c65, 0xbadf, 0x39a8, 0x3b7a,
    0xbad8, 0x3a56, 0x3ba8, 0x3b7d, 0xbb94, 0x3bd3, 0xbade, 0xb936, 0x3be4, 0xbb89, 0x3a73, 0x3b0c,
    0x3a15, 0x3b3c, 0xbba3, 0x3a88, 0x3ba5, 0x3b8e, 0xbb75, 0xbb2f, 0x3bd3, 0xbb8e, 0x3b4c, 0x3b37,
    0xbb7d, 0xbb11, 0x3be6, 0xbba3, 0x3c59, 0xbb5f, 0xbb9a, 0x3a78};
const uint8_t mx8_sf[] = {0x76, 0x74, 0x71, 0x70};
const uint8_t mx8_q[] = {
    0xee, 0xf8, 0x63, 0x56, 0x58, 0xb2, 0xdd, 0x6e, 0x65, 0x67, 0x73, 0x58, 0xe8, 0x55, 0x65, 0xea,
    0x52, 0xce, 0xec, 0xe9, 0xe6, 0xe0, 0xec, 0xeb, 0xe2, 0x71, 0x66, 0xe8, 0x6e, 0xe9, 0xf1, 0x70,
    0x72, 0x7e, 0x71, 0x7a, 0xf4, 0xea, 0x2a, 0xdf, 0xf8, 0x74, 0xe1, 0xfb, 0x75, 0xdb, 0xe6, 0xe0,
    0x5b, 0xf5, 0x7c, 0xf8, 0xee, 0xf1, 0x79, 0xfb, 0x63, 0x1e, 0x6a, 0xfc, 0x71, 0xf1, 0x78, 0xed,
    0xe2, 0x68, 0x6f, 0xdd, 0x61, 0xf2, 0xef, 0x6c, 0xd7, 0xe6, 0xe4, 0xd2, 0xe3, 0xd1, 0x50, 0x67,
    0xf0, 0x5d, 0xf0, 0xf6, 0x73, 0x62, 0x6a, 0x71, 0xe4, 0x6c, 0xe6, 0x66, 0x76, 0xde, 0x4a, 0x68,
    0xe6, 0x5d, 0x72, 0x70, 0xf1, 0x75, 0xe6, 0xcb, 0x76, 0xf1, 0x5f, 0x69, 0x59, 0x6c, 0xf2, 0x60,
    0x72, 0x71, 0xef, 0xeb, 0x75, 0xf1, 0x6d, 0x6b, 0xf0, 0xe9, 0x76, 0xf2, 0x7e, 0xee, 0xf2, 0x60};
// mx4 gs=0.0
const uint16_t mx4_x[] = {
    0x3f28, 0xbe83, 0x3e18, 0x3f03, 0x3db4, 0xbf41, 0xbf2f, 0xbf36, 0x3e86, 0x3e8d, 0x3db1, 0x3f14,
    0x3ead, 0x3f2a, 0x3df9, 0xbe1b, 0xbeab, 0xbf15, 0xbdc6, 0xbe58, 0xbec6, 0x3ee8, 0x3cb8, 0x3e01,
    0xbd99, 0xbe80, 0x3e56, 0xbed6, 0xbf5c, 0x3e4e, 0x3ec8, 0xbe0b, 0xbe3c, 0xbf78, 0x3e17, 0xbe17,
    0xbe3f, 0x3cd6, 0x3f15, 0x3f28, 0x3f39, 0x3e6a, 0xbe87, 0xbe51, 0xbf55, 0xbf07, 0x3f76, 0xbeed,
    0x3ba7, 0x3f5f, 0xbc70, 0xbeb2, 0xbe5f, 0xbe2f, 0x3ebb, 0xbd91, 0xbf03, 0x3d89, 0xbea0, 0xbf2f,
    0xbea7, 0xbe8a, 0xbf29, 0xbf9a, 0x3f71, 0x3e4b, 0x3ecb, 0xbd85, 0xbdc1, 0xbed3, 0x3f33, 0x3ead,
    0xbe2d, 0xbf1b, 0xbd1d, 0x3de6, 0x3cb3, 0x3ebf, 0xbe08, 0x3f0c, 0x3f8c, 0x3ef7, 0x3e7b, 0xbf19,
    0x3e8c, 0x3e68, 0xbd05, 0x3f09, 0xbe7c, 0xbf41, 0xbee7, 0xbee9, 0xbe98, 0xbde5, 0xbe79, 0xbf02,
    0x3f2c, 0x3e1e, 0xbece, 0x3f3e, 0xbe97, 0x3f0c, 0xbd93, 0x3ee5, 0xbe74, 0x3e81, 0xbed6, 0x3f05,
    0x3ec5, 0xbeaa, 0x3c88, 0x3ec2, 0x3e6a, 0xbdd0, 0xbf3a, 0xbe35, 0xbe6c, 0xbf6e, 0xbf40, 0xbf12,
    0xbd41, 0x3e40, 0xbe6c, 0x3e1e, 0x3ead, 0xbd33, 0xbe90, 0xbe97};
const uint8_t mx4_sf[] = {0x7d, 0x7d, 0x7d, 0x7d};
const uint8_t mx4_q[] = {
    0xa5, 0x41, 0xd1, 0xdd, 0x22, 0x41, 0x53, 0x91, 0xcb, 0xa9, 0x4b, 0x10, 0xa9, 0xb2, 0x2d, 0x93,
    0xe9, 0x91, 0x09, 0x54, 0x25, 0xaa, 0xcd, 0xc6, 0x50, 0xb8, 0x9a, 0x93, 0x1c, 0xda, 0xab, 0xed,
    0x26, 0x93, 0xb9, 0x35, 0xc9, 0x18, 0x30, 0x49, 0x46, 0xc2, 0x22, 0x48, 0xda, 0xcc, 0x9a, 0xca,
    0x15, 0x5b, 0x4a, 0x49, 0x2a, 0x4b, 0xb3, 0x30, 0x92, 0x9d, 0xea, 0xcd, 0x28, 0x1a, 0x83, 0xaa};
// pt gs=0.00037202381645329297
const uint16_t pt_x[] = {
    0x3fc0, 0xc15c, 0x4188, 0xbfe0, 0x3e82, 0x40c1, 0xbf3f, 0xc064, 0xc116, 0xbf9f, 0x40f1, 0xbf23,
    0x3f66, 0x40c5, 0x400e, 0xbf65, 0x401c, 0x40be, 0xc051, 0x3ffd, 0xbfb2, 0xc04a, 0xc01d, 0xc0c0,
    0xc003, 0x412d, 0x40e1, 0x40e5, 0xbf8a, 0x40b1, 0xbf81, 0xbea7, 0xbc58, 0xbc72, 0x3985, 0x3c96,
    0x3ad1, 0x3cad, 0xbb93, 0x3cca, 0xbc46, 0x3c1f, 0x3a37, 0x3b0b, 0xbc2e, 0xbc31, 0xbce5, 0xbccc,
    0x3c09, 0xbc88, 0x3c14, 0xbc5e, 0x3c05, 0xbd20, 0xbc92, 0xbca0, 0xbc6c, 0xbb2e, 0xbc16, 0xbc8c,
    0x3c1c, 0x3b3d, 0x3cad, 0xba8d, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000,
    0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000,
    0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000};
const uint8_t pt_sf[] = {0x7e, 0x79, 0x7a, 0x7e, 0x00, 0x00};
const uint8_t pt_q[] = {0xe1, 0x97, 0x40, 0xb9, 0x9d, 0x85, 0x41, 0x92, 0x53, 0x2c, 0xba, 0xdb,
                        0x7a, 0x66, 0x59, 0x89, 0xdd, 0x60, 0x61, 0x7a, 0x4d, 0x10, 0xcc, 0xff,
                        0xd3, 0xc3, 0xf2, 0xdd, 0x9c, 0xdb, 0x13, 0x85, 0x00, 0x00, 0x00, 0x00,
                        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
const uint32_t pt_pts[] = {0x3bcf3cf4, 0x3773cf3e, 0x00200000};
// gsg bits 0x45e306eb gsi bits 0x39c30c31
}  // namespace bi_golden

Tensor bf16_rows(const uint16_t* bits, int64_t rows, int64_t cols) {
  Tensor t = Tensor::empty({rows, cols}, DType::kBFloat16);
  std::memcpy(t.data_ptr(), bits, static_cast<size_t>(rows * cols) * 2);
  return t;
}

template <size_t N>
std::vector<uint8_t> vec(const uint8_t (&a)[N]) {
  return std::vector<uint8_t>(a, a + N);
}

float f32_of(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(BatchInvariantQuantize, Nvfp4MatchesUpstreamsExactSpec) {
  using namespace bi_golden;
  const Value unset = nvfp4_4over6_unset();
  const Tensor x1 = bf16_rows(nv_gs1_x, 4, 32);
  auto [q1, sf1] = fp4_quantize(x1, std::nullopt, 16, false, false, false, false, std::nullopt,
                                "auto", unset, true);
  EXPECT_EQ(bytes(q1), vec(nv_gs1_q));
  EXPECT_EQ(bytes(sf1), vec(nv_gs1_sf));
  const Tensor xg = bf16_rows(nv_gsg_x, 4, 32);
  const Tensor gs =
      Tensor::from_vector({static_cast<double>(f32_of(0x45e306ebu))}, {1}, DType::kFloat32);
  auto [qg, sfg] = nvfp4_quantize(xg, Value(gs), SfLayout::layout_linear, false, 16, std::nullopt,
                                  "auto", false, std::nullopt, std::nullopt, unset, true);
  EXPECT_EQ(bytes(qg), vec(nv_gsg_q));
  EXPECT_EQ(bytes(sfg), vec(nv_gsg_sf));
  // The same global scale as its inverse (is_global_scale_inversed: one fp32 division).
  const Tensor inv =
      Tensor::from_vector({static_cast<double>(1.0f / f32_of(0x45e306ebu))}, {1}, DType::kFloat32);
  auto [qi, sfi] =
      fp4_quantize(xg, inv, 16, false, false, false, true, std::nullopt, "auto", unset, true);
  const float back = 1.0f / (1.0f / f32_of(0x45e306ebu));
  if (back == f32_of(0x45e306ebu)) {
    EXPECT_EQ(bytes(qi), vec(nv_gsg_q));
    EXPECT_EQ(bytes(sfi), vec(nv_gsg_sf));
  }
  // Per token: the scales upstream's spec returns (a zero row: 2^-128, not 0).
  const Tensor xp = bf16_rows(pt_x, 3, 32);
  const Nvfp4QuantizeResult r = nvfp4_quantize(
      xp, Value(static_cast<double>(f32_of(0x39c30c31u))), SfLayout::layout_linear, false, 16,
      std::nullopt, "auto", true, std::nullopt, std::nullopt, unset, true);
  const auto& [qp, sfp] = r;
  EXPECT_EQ(bytes(qp), vec(pt_q));
  EXPECT_EQ(bytes(sfp), vec(pt_sf));
  const auto ptv = floats(r.per_token_scale);
  ASSERT_EQ(ptv.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    uint32_t b;
    std::memcpy(&b, &ptv[i], 4);
    EXPECT_EQ(b, pt_pts[i]) << i;
  }
  EXPECT_EQ(pt_pts[2], 0x00200000u);
}

TEST(BatchInvariantQuantize, MxMatchesUpstreamsExactSpec) {
  using namespace bi_golden;
  const Tensor x8 = bf16_rows(mx8_x, 2, 64);
  auto [q8, sf8] = mxfp8_quantize(x8, false, 32, std::nullopt, "auto", std::nullopt, true);
  EXPECT_EQ(q8.dtype(), DType::kFloat8E4M3FN);
  EXPECT_EQ(bytes(q8), vec(mx8_q));
  EXPECT_EQ(bytes(sf8), vec(mx8_sf));
  const Tensor x4 = bf16_rows(mx4_x, 2, 64);
  auto [q4, sf4] = mxfp4_quantize(x4, "auto", std::nullopt, SfLayout::layout_linear, true);
  EXPECT_EQ(bytes(q4), vec(mx4_q));
  EXPECT_EQ(bytes(sf4), vec(mx4_sf));
  // fp4_quantize's MXFP4 class is the same recipe.
  auto [qf, sff] = fp4_quantize(x4, std::nullopt, 32, true, false, false, false, std::nullopt,
                                "auto", nvfp4_4over6_unset(), true);
  EXPECT_EQ(bytes(qf), vec(mx4_q));
  EXPECT_EQ(bytes(sff), vec(mx4_sf));
}

// Where the recipe differs from the regular path, hand-checked (the worked examples of the
// session 86 read of upstream's spec): an exact e2m1 tie moved by the inexact reciprocal, the
// scale byte rounded from amax * RN(gs / 6), a zero scale that saturates, MX byte 0 (inverse
// 2^127, real codes) and an infinite element (+-448, 6).
TEST(BatchInvariantQuantize, DiffersFromTheRegularRecipeWhereUpstreamSays) {
  const Value unset = nvfp4_4over6_unset();
  auto block = [](std::vector<double> v, int64_t n, DType dt = DType::kBFloat16) {
    v.resize(static_cast<size_t>(n), 0.0);
    return Tensor::from_vector(v, {1, n}, dt);
  };
  auto nv = [&](const Tensor& x, std::optional<Tensor> gs, bool bi) {
    auto [q, sf] =
        fp4_quantize(x, gs, 16, false, false, false, false, std::nullopt, "auto", unset, bi);
    return std::pair{bytes(q), bytes(sf)};
  };
  // Tie: 0.03662109375 / 0.029296875 = 1.25 exactly (regular: code 2); BI: x * RN(1 / sf) =
  // 1.2500001 (code 3).
  const Tensor tie = block({0.17578125, 0.03662109375}, 16);
  EXPECT_EQ(nv(tie, std::nullopt, false).first[0], 0x27);
  EXPECT_EQ(nv(tie, std::nullopt, true).first[0], 0x37);
  EXPECT_EQ(nv(tie, std::nullopt, true).second[0], 0x0F);
  // Scale byte: RN(RN(gs * amax) / 6) = 72 (0x69) against RN(amax * RN(gs * fp32(1/6))) = 76,
  // the midpoint, to even: 80 (0x6A).
  const Tensor gsx = Tensor::from_vector({13733.646484375}, {1}, DType::kFloat32);
  const Tensor sb = block(
      {std::ldexp(1.0625, -5), -std::ldexp(1.0625, -6), std::ldexp(1.5, -7), std::ldexp(1.25, -8)},
      16);
  EXPECT_EQ(nv(sb, gsx, false).second[0], 0x69);
  EXPECT_EQ(nv(sb, gsx, true).second[0], 0x6A);
  // Zero scale: e4m3(1e-3 / 6) underflows; the regular path gives signed zeros, BI saturates.
  const Tensor tiny = block({1e-3, -1e-3}, 16);
  EXPECT_EQ(nv(tiny, std::nullopt, false).first[0], 0x80);
  EXPECT_EQ(nv(tiny, std::nullopt, true).first[0], 0xF7);
  EXPECT_EQ(nv(tiny, std::nullopt, true).second[0], 0x00);
  // MXFP8 byte 0: inverse 2^127, codes 8.0 (0x50) and -4.0 (0xC8); regular: zeros.
  const Tensor m8 = block({std::ldexp(1.0, -124), -std::ldexp(1.0, -125)}, 32);
  auto [r8, rs8] = mxfp8_quantize(m8, false, 32, std::nullopt, "auto", std::nullopt, false);
  auto [b8, bs8] = mxfp8_quantize(m8, false, 32, std::nullopt, "auto", std::nullopt, true);
  EXPECT_EQ(bytes(bs8)[0], 0);
  EXPECT_EQ(bytes(rs8)[0], 0);
  EXPECT_EQ(bytes(b8)[0], 0x50);
  EXPECT_EQ(bytes(b8)[1], 0xC8);
  EXPECT_EQ(bytes(r8)[0], 0x00);
  // MXFP4 byte 0: [2^-127, -2^-128] give codes 2 (1.0) and 9 (-0.5); regular: 0 and -0.
  const Tensor m4 = block({std::ldexp(1.0, -127), -std::ldexp(1.0, -128)}, 32);
  auto [r4, rs4] = mxfp4_quantize(m4, "auto", std::nullopt, SfLayout::layout_linear, false);
  auto [b4, bs4] = mxfp4_quantize(m4, "auto", std::nullopt, SfLayout::layout_linear, true);
  EXPECT_EQ(bytes(b4)[0], 0x92);
  EXPECT_EQ(bytes(r4)[0], 0x80);
  // An infinite element (fp32 input, which only BI takes): byte 254, +inf -> 448 (0x7E), the
  // finite ones to 0.
  const Tensor inf8 = block({std::numeric_limits<double>::infinity(), 3.0}, 32, DType::kFloat32);
  auto [i8, is8] = mxfp8_quantize(inf8, false, 32, std::nullopt, "auto", std::nullopt, true);
  EXPECT_EQ(bytes(is8)[0], 254);
  EXPECT_EQ(bytes(i8)[0], 0x7E);
  EXPECT_EQ(bytes(i8)[1], 0x00);
}

// Upstream's checks and texts: backend "auto" only; fp8 input, a row-wise global scale, out_scale,
// a K off the block, MXFP4's recipe pairs refused by the class; the layouts and do_shuffle.
TEST(BatchInvariantQuantize, RefusalsAsUpstream) {
  const Value unset = nvfp4_4over6_unset();
  const Tensor x = Tensor::empty({4, 64}, DType::kBFloat16).uniform_(7);
  const Tensor gs1 = fp32_scalar(1.0);
  auto fp4 = [&](const Tensor& in, std::optional<Tensor> gs, int64_t vec, bool ue8m0,
                 std::string_view backend, const Value& four) {
    (void)fp4_quantize(in, gs, vec, ue8m0, true, false, false, std::nullopt, backend, four, true);
  };
  EXPECT_FI_ERROR(fp4(x, gs1, 16, false, "cuda", unset), "fp4_quantize", "backend");
  EXPECT_FI_ERROR(fp4(x.to(DType::kFloat8E4M3FN), gs1, 16, false, "auto", unset), "fp4_quantize",
                  "input");
  EXPECT_FI_ERROR(fp4(x, gs1, 32, false, "auto", unset), "fp4_quantize", "sf_vec_size");
  EXPECT_FI_ERROR(fp4(x, Tensor::full({4}, 1.0, DType::kFloat32), 16, false, "auto", unset),
                  "fp4_quantize", "global_scale");
  EXPECT_FI_ERROR(fp4(x.slice(1, 0, 40), gs1, 16, false, "auto", unset), "fp4_quantize", "input");
  // An explicit 4over6 recipe is another specification for BI; MXFP4 refuses any recipe.
  const Value config(
      ObjectRef{"NVFP44Over6Config", "NVFP44Over6Config(e4m3_max=448)", 1, nullptr, nullptr});
  EXPECT_FI_ERROR(fp4(x, gs1, 16, false, "auto", config), "fp4_quantize", "nvfp4_4over6");
  EXPECT_FI_ERROR(fp4(x, gs1, 32, true, "auto", config), "fp4_quantize", "nvfp4_4over6");
  EXPECT_NO_THROW(fp4(x, gs1, 16, false, "auto", Value()));  // None: off
  try {
    fp4(x, gs1, 16, false, "cuda", unset);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch_invariant=True requires backend='auto'"),
              std::string::npos);
  }
  try {
    fp4(x.to(DType::kFloat8E4M3FN), gs1, 16, false, "auto", unset);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch_invariant=True: the class `nvfp4.quant` does not "
                                         "support input dtype torch.float8_e4m3fn; the limit is "
                                         "bf16, f16 or fp32 inputs"),
              std::string::npos)
        << e.what();
  }
  auto nv = [&](std::optional<Tensor> out_scale, bool shuffle, SfLayout layout, const Tensor& in) {
    (void)nvfp4_quantize(in, Value(gs1), layout, shuffle, 16, std::nullopt, "auto", true,
                         std::nullopt, out_scale, unset, true);
  };
  EXPECT_FI_ERROR(nv(fp32_scalar(2.0), false, SfLayout::layout_128x4, x), "nvfp4_quantize",
                  "out_scale");
  EXPECT_FI_ERROR(nv(std::nullopt, true, SfLayout::layout_linear, x), "nvfp4_quantize",
                  "do_shuffle");
  EXPECT_FI_ERROR(nv(std::nullopt, true, SfLayout::layout_128x4, x), "nvfp4_quantize",
                  "do_shuffle");  // 4 rows: not a multiple of 32
  EXPECT_FI_ERROR((void)mxfp8_quantize(x, true, 48, std::nullopt, "auto", std::nullopt, true),
                  "mxfp8_quantize", "alignment");
  EXPECT_FI_ERROR(
      (void)mxfp4_quantize(x.slice(1, 0, 48), "auto", std::nullopt, SfLayout::layout_128x4, true),
      "mxfp4_quantize", "a");
  // Layouts: the swizzled scales are the linear ones placed by the layout's formula; fp32 input
  // equals its bf16 values'; M = 0 gives empty outputs.
  auto [ql, sfl] = nvfp4_quantize(x, Value(gs1), SfLayout::layout_linear, false, 16, std::nullopt,
                                  "auto", false, std::nullopt, std::nullopt, unset, true);
  auto [qs, sfs] = nvfp4_quantize(x, Value(gs1), SfLayout::layout_128x4, false, 16, std::nullopt,
                                  "auto", false, std::nullopt, std::nullopt, unset, true);
  auto [qf, sff] =
      nvfp4_quantize(x.to(DType::kFloat32), Value(1.0), SfLayout::layout_linear, false, 16,
                     std::nullopt, "auto", false, std::nullopt, std::nullopt, unset, true);
  EXPECT_EQ(bytes(ql), bytes(qs));
  EXPECT_EQ(bytes(ql), bytes(qf));
  EXPECT_EQ(bytes(sfl), bytes(sff));
  const auto lin = bytes(sfl), swz = bytes(sfs);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 4; ++c) {
      EXPECT_EQ(swz[static_cast<size_t>(ref_offset_128x4(r, c, 4))],
                lin[static_cast<size_t>(r * 4 + c)]);
    }
  }
  auto [q0, sf0] = mxfp8_quantize(Tensor::empty({0, 64}, DType::kBFloat16), true, 32, std::nullopt,
                                  "auto", std::nullopt, true);
  EXPECT_EQ(q0.numel(), 0);
}

// nvfp4_4over6 on the regular path: None and the default (the environment off) are the standard
// recipe; an explicit recipe or FLASHINFER_NVFP4_4OVER6=1 runs the 4over6 recipe (on the CPU: each
// row's blocks are kernels::nvfp4_4over6_block's, the scales at the layout's offsets), with the
// environment's error mode and upstream's texts; the environment is ignored for fp8 input, as
// upstream's CUDA path; an explicit recipe with fp8 input is upstream's error.
TEST(Fp4Quantize, Nvfp4FourOverSixRunsTheRecipe) {
  // Row 0's first block holds amax 4 (the 4 candidate wins: kernels' golden); the rest random.
  Tensor x = Tensor::empty({4, 32}, DType::kBFloat16).uniform_(9);
  x.select(0, 0).slice(0, 0, 16).fill_(0.0);
  x.select(0, 0).select(0, 0).fill_(4.0);
  const Tensor gs = fp32_scalar(1.0);
  auto run = [&](const Tensor& in, const Value& four) {
    return fp4_quantize(in, gs, 16, false, false, false, false, std::nullopt, "auto", four);
  };
  const auto base = run(x, Value());
  EXPECT_EQ(bytes(std::get<0>(run(x, nvfp4_4over6_unset()))), bytes(std::get<0>(base)));
  const auto expect_recipe = [&](const std::tuple<Tensor, Tensor>& got, kernels::Nvfp4FourOverSix c,
                                 float S = 1.0f) {
    const auto q = bytes(std::get<0>(got)), sf = bytes(std::get<1>(got));
    const auto xv = x.to_double_vector();
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t b = 0; b < 2; ++b) {
        float v[16];
        for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(xv[r * 32 + b * 16 + i]);
        const kernels::Nvfp4Block blk = kernels::nvfp4_4over6_block(v, S, c);
        ASSERT_EQ(sf[r * 2 + b], blk.sf) << r << " " << b;  // linear scales
        for (int i = 0; i < 8; ++i) {
          ASSERT_EQ(q[r * 16 + b * 8 + i], static_cast<uint8_t>(blk.packed >> (8 * i)));
        }
      }
    }
  };
  const auto mae = run(x, nvfp4_4over6_config());
  expect_recipe(mae, {true, false, false, false});
  EXPECT_NE(bytes(std::get<1>(mae)), bytes(std::get<1>(base)));
  EXPECT_EQ(bytes(std::get<1>(mae))[0], 0x38);  // the 4 candidate's scale
  // Another global scale, given or inversed: the block function's with that S.
  const auto with_gs = [&](double g, bool inversed, const Value& four) {
    return fp4_quantize(x, fp32_scalar(g), 16, false, false, false, inversed, std::nullopt, "auto",
                        four);
  };
  expect_recipe(with_gs(896.0, false, nvfp4_4over6_config(448, "MSE", true)),
                {true, true, true, false}, 896.0f);
  expect_recipe(with_gs(1.0 / 896.0, true, nvfp4_4over6_config()), {true, false, false, false},
                1.0f / static_cast<float>(1.0 / 896.0));
  testing::expect_error_text([&] { run(x, Value(false)); }, "fp4_quantize", "nvfp4_4over6",
                             "nvfp4_4over6 must be an NVFP44Over6Config or None (or omitted); "
                             "got bool.");
  testing::expect_error_text(
      [&] {
        nvfp4_quantize(x, Value(gs), SfLayout::layout_128x4, false, 32, std::nullopt, "auto", false,
                       std::nullopt, std::nullopt, nvfp4_4over6_config());
      },
      "nvfp4_quantize", "nvfp4_4over6", "nvfp4_4over6 applies to NVFP4 only");
  expect_recipe(run(x, nvfp4_4over6_config(256, "mse", true)), {true, true, true, false});
  // Upstream's recorder keeps the object as its type and repr: the same recipe.
  const Value recorded(ObjectRef{"NVFP44Over6Config",
                                 "NVFP44Over6Config(err_mode=NVFP44Over6ErrMode.MSE)", 1, nullptr,
                                 nullptr});
  expect_recipe(run(x, recorded), {true, true, false, false});
  EXPECT_EQ(nvfp4_4over6_config(256, "MSE", true).as_object().repr,
            "NVFP44Over6Config(e4m3_max=256, err_mode=NVFP44Over6ErrMode.MSE, "
            "err_use_fast_math=True)");
  EXPECT_EQ(nvfp4_4over6_config().as_object().repr, "NVFP44Over6Config()");
  EXPECT_THROW(nvfp4_4over6_config(512), Error);
  EXPECT_THROW(nvfp4_4over6_config(448, "rms"), Error);
  EXPECT_FI_ERROR(run(x.to(DType::kFloat8E4M3FN), nvfp4_4over6_config()), "fp4_quantize",
                  "nvfp4_4over6");
  EXPECT_FI_ERROR(run(x, Value(int64_t{3})), "fp4_quantize", "nvfp4_4over6");
  {
    testing::ScopedEnv on("FLASHINFER_NVFP4_4OVER6", "1");
    expect_recipe(run(x, nvfp4_4over6_unset()), {true, false, false, false});
    EXPECT_EQ(bytes(std::get<0>(run(x, Value()))), bytes(std::get<0>(base)));  // None: off
    EXPECT_NO_THROW(run(x.to(DType::kFloat8E4M3FN), nvfp4_4over6_unset()));
    {
      testing::ScopedEnv mode("FLASHINFER_NVFP4_4OVER6_ERR_MODE", "mse");
      testing::ScopedEnv fast("FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH", "1");
      testing::ScopedEnv exact("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "1");
      expect_recipe(run(x, nvfp4_4over6_unset()), {true, true, true, true});
    }
    testing::ScopedEnv bad("FLASHINFER_NVFP4_4OVER6_ERR_MODE", "L2");
    testing::expect_error_text([&] { run(x, nvfp4_4over6_unset()); }, "fp4_quantize",
                               "nvfp4_4over6", "NVFP4 4over6 error mode must be MAE or MSE.");
  }
  // Upstream's recorder writes the default by its repr: still "omitted".
  EXPECT_EQ(
      bytes(std::get<0>(run(x, Value("<nvfp4_4over6 unset: read FLASHINFER_NVFP4_4OVER6*>")))),
      bytes(std::get<0>(base)));
  // nvfp4_quantize's per-tensor form is fp4_quantize's; its per-token form refuses the recipe.
  const Nvfp4QuantizeResult nv =
      nvfp4_quantize(x, Value(gs), SfLayout::layout_linear, false, 16, std::nullopt, "auto", false,
                     std::nullopt, std::nullopt, nvfp4_4over6_config());
  EXPECT_EQ(bytes(std::get<1>(nv)), bytes(std::get<1>(mae)));
  EXPECT_FI_ERROR_CODE(
      nvfp4_quantize(x, Value(1.0 / 2688.0), SfLayout::layout_128x4, false, 16, std::nullopt,
                     "auto", true, std::nullopt, std::nullopt, nvfp4_4over6_config()),
      "nvfp4_quantize", "nvfp4_4over6", ErrorCode::kUnsupported);
  if (cuda_available()) {
    EXPECT_FI_ERROR_CODE(run(x.to(Device::cuda(0)), nvfp4_4over6_config()), "fp4_quantize",
                         "nvfp4_4over6", ErrorCode::kUnsupported);
  }
}

// out_scale (upstream 0.7.4): the CuTe-DSL per-token form's scales times out_scale[0], the codes
// and block scales unchanged; refused elsewhere with upstream's texts.
TEST(Nvfp4Quantize, OutScaleMultipliesThePerTokenScales) {
  const Tensor x = Tensor::empty({4, 32}, DType::kBFloat16).uniform_(11);
  const Value gsi(1.0 / 2688.0);
  auto run = [&](std::optional<Tensor> out_scale, std::string_view backend, bool per_token) {
    return nvfp4_quantize(x, per_token ? gsi : Value(fp32_scalar(1.0)), SfLayout::layout_128x4,
                          false, 16, std::nullopt, backend, per_token, std::nullopt, out_scale);
  };
  const Nvfp4QuantizeResult a = run(std::nullopt, "cute-dsl", true);
  const Nvfp4QuantizeResult b = run(fp32_scalar(0.5), "cute-dsl", true);
  EXPECT_EQ(bytes(std::get<0>(a)), bytes(std::get<0>(b)));
  EXPECT_EQ(bytes(std::get<1>(a)), bytes(std::get<1>(b)));
  const auto pa = floats(a.per_token_scale), pb = floats(b.per_token_scale);
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pb[i], pa[i] * 0.5f) << i;
  EXPECT_FI_ERROR(run(fp32_scalar(0.5), "auto", true), "nvfp4_quantize", "out_scale");
  // With nvfp4_4over6 given (None too), a float per-token scale must be 1 / (448 * 6) (1e-3).
  EXPECT_NO_THROW(nvfp4_quantize(x, gsi, SfLayout::layout_128x4, false, 16, std::nullopt, "auto",
                                 true, std::nullopt, std::nullopt, Value()));
  EXPECT_FI_ERROR(nvfp4_quantize(x, Value(0.5), SfLayout::layout_128x4, false, 16, std::nullopt,
                                 "auto", true, std::nullopt, std::nullopt, Value()),
                  "nvfp4_quantize", "a_global_sf");
  EXPECT_NO_THROW(nvfp4_quantize(x, Value(0.5), SfLayout::layout_128x4, false, 16, std::nullopt,
                                 "auto", true));  // omitted: not checked
  EXPECT_FI_ERROR(run(fp32_scalar(0.5), "cute-dsl", false), "nvfp4_quantize", "out_scale");
}

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
