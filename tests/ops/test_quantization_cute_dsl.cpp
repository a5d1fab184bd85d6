// The CuTe-DSL quantizer entry points (flashinfer.quantization.kernels.*): where their scales are
// non-zero they equal the CUDA-path ops byte for byte (mxfp4_quantize, nvfp4_quantize,
// mxfp8_quantize); their own rules checked by hand: 2-D outputs of flattened rows, the zero rule
// (a zero decoded scale gives e2m1(x * 0): signed zeros), fp32 MXFP8 input and K padding, the
// per-token scales; bad input by name; record / replay; CUDA against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

constexpr DType kBf = DType::kBFloat16;

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.numel() * static_cast<int64_t>(c.element_size()));
}

Tensor scalar(double v) { return Tensor::from_vector({v}, {1}, DType::kFloat32); }

// Values in [-4, 4) away from zero: every block's scale is a normal e4m3 / ue8m0 > 0.
Tensor input(Shape shape, DType dt, uint64_t seed) {
  Tensor t = rand_tensor(shape, DType::kFloat32, seed, 0.25, 4.0);
  Tensor sign = rand_tensor(shape, DType::kFloat32, seed + 1, -1.0, 1.0);
  float* v = t.data<float>();
  const float* s = sign.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = s[i] < 0 ? -v[i] : v[i];
  return t.to(dt);
}

TEST(Mxfp4QuantizeCuteDsl, EqualsMxfp4QuantizeWhereScalesAreNonZero) {
  const Tensor x = input({2, 3, 64}, kBf, 1);  // leading dims flattened: 6 rows
  for (int64_t layout : {0, 1, 2}) {
    auto [q, sf] = mxfp4_quantize_cute_dsl(x, layout);
    auto [q2, sf2] =
        mxfp4_quantize(x.reshape({6, 64}), "cuda", std::nullopt, static_cast<SfLayout>(layout));
    EXPECT_EQ(q.shape(), (Shape{6, 32}));
    EXPECT_EQ(sf.shape(), layout == 0   ? (Shape{128, 4})
                          : layout == 1 ? (Shape{8, 4})
                                        : (Shape{6, 2}));
    EXPECT_EQ(bytes(q), bytes(q2)) << layout;
    EXPECT_EQ(bytes(sf), bytes(sf2)) << layout;
  }
}

// A block whose scale code is 0 (amax / 6 at most 2^-127): upstream's CuTe-DSL kernel multiplies
// by an inverse scale of 0 (codes +0 / -0: 0x0 / 0x8), and since 0.7.4 mxfp4_quantize does too
// (0.6.18 divided by 2^-127: 2e-38 / 2^-127 = 3.4, code 5).
TEST(Mxfp4QuantizeCuteDsl, ZeroScaleCodeGivesSignedZeros) {
  std::vector<double> v(64);
  for (int i = 0; i < 32; ++i) v[i] = (i % 2 ? -1.0 : 1.0) * 2e-38;  // block 0: code 0
  for (int i = 32; i < 64; ++i) v[i] = 0.5 * ((i % 7) - 3);          // block 1: amax 1.5
  const Tensor x = Tensor::from_vector(v, {1, 64}, DType::kFloat32).to(kBf);
  auto [q, sf] = mxfp4_quantize_cute_dsl(x, 2);
  auto [q2, sf2] = mxfp4_quantize(x, "cuda", std::nullopt, SfLayout::layout_linear);
  const auto b = bytes(q), b2 = bytes(q2);
  EXPECT_EQ(bytes(sf)[0], 0);
  for (int t = 0; t < 16; ++t) EXPECT_EQ(b[t], 0x80) << t;  // +0 low nibble, -0 high nibble
  // mxfp4_quantize too, as upstream 0.7.4 (its inverse scale of code 0 is 0; 0.6.18 divided).
  for (int t = 0; t < 32; ++t) EXPECT_EQ(b[t], b2[t]) << t;
  EXPECT_EQ(bytes(sf), bytes(sf2));
}

TEST(Nvfp4QuantizeCuteDsl, EqualsNvfp4QuantizeWhereScalesAreNonZero) {
  const Tensor x = input({5, 48}, DType::kFloat16, 3);
  const double gs = 448.0 * 6.0 / 4.0;
  for (int64_t layout : {0, 1, 2}) {
    auto [q, sf] = nvfp4_quantize_cute_dsl(x, Value(gs), layout);
    auto [qt, sft] = nvfp4_quantize_cute_dsl(x, Value(scalar(gs)), layout);
    auto [q2, sf2] = nvfp4_quantize(x, scalar(gs), static_cast<SfLayout>(layout));
    EXPECT_EQ(bytes(q), bytes(q2)) << layout;
    EXPECT_EQ(bytes(sf), bytes(sf2)) << layout;
    EXPECT_EQ(sf.shape(), sf2.shape());
    EXPECT_EQ(bytes(qt), bytes(q));
    EXPECT_EQ(bytes(sft), bytes(sf));
  }
}

// gs * amax / 6 below e4m3's smallest subnormal half (2^-10): the scale byte is 0 on both paths,
// and both write e2m1(x * 0), so negative values give 0x8 (upstream 0.7.4's
// cvt_warp_fp16_to_fp4 tests the decoded scale; 0.6.18 saturated nvfp4_quantize's to -6).
TEST(Nvfp4QuantizeCuteDsl, ZeroDecodedScaleGivesSignedZeros) {
  std::vector<double> v(32, 0.0);
  for (int i = 0; i < 16; ++i) v[i] = -0.001;  // gs 1: 0.001 / 6 < 2^-10
  for (int i = 16; i < 32; ++i) v[i] = i % 2 ? 3.0 : -1.5;
  const Tensor x = Tensor::from_vector(v, {1, 32}, kBf);
  auto [q, sf] = nvfp4_quantize_cute_dsl(x, Value(1.0), 2);
  auto [q2, sf2] = nvfp4_quantize(x, scalar(1.0), SfLayout::layout_linear);
  EXPECT_EQ(bytes(sf), bytes(sf2));
  EXPECT_EQ(bytes(sf)[0], 0);
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(bytes(q)[t], 0x88) << t;
    EXPECT_EQ(bytes(q2)[t], 0x88) << t;
  }
  for (int t = 8; t < 16; ++t) EXPECT_EQ(bytes(q)[t], bytes(q2)[t]);
}

// Per token: row r's scale is amax_r * gsi and its blocks are NVFP4 with the encode scale
// 1 / that: the same bytes as nvfp4_quantize_cute_dsl of the row with that global scale. A zero
// row has scale 0, zero scale bytes and zero codes.
TEST(Nvfp4QuantizePerTokenCuteDsl, RowScalesAndBlocks) {
  Tensor x = input({4, 64}, kBf, 5);
  auto* xv = static_cast<uint16_t*>(x.data_ptr());
  for (int i = 0; i < 64; ++i) xv[2 * 64 + i] = 0;  // row 2 is zero
  const float gsi = 1.0f / (448.0f * 6.0f);
  auto [q, sf, scale] = nvfp4_quantize_per_token_cute_dsl(x, Value(static_cast<double>(gsi)), 2);
  ASSERT_EQ(scale.shape(), (Shape{4}));
  EXPECT_EQ(scale.dtype(), DType::kFloat32);
  const auto qb = bytes(q), sb = bytes(sf);
  for (int64_t r = 0; r < 4; ++r) {
    const Tensor row = x.slice(0, r, r + 1);
    float amax = 0.0f;
    for (double e : row.to_double_vector()) amax = std::max(amax, static_cast<float>(std::fabs(e)));
    const float expect = amax == 0.0f ? 0.0f : amax * gsi;
    EXPECT_EQ(scale.data<float>()[r], expect) << r;
    if (amax == 0.0f) {
      for (int t = 0; t < 32; ++t) EXPECT_EQ(qb[r * 32 + t], 0) << t;
      for (int t = 0; t < 4; ++t) EXPECT_EQ(sb[r * 4 + t], 0) << t;
      continue;
    }
    auto [qr, sfr] = nvfp4_quantize_cute_dsl(row, Value(static_cast<double>(1.0f / expect)), 2);
    const auto qrb = bytes(qr), srb = bytes(sfr);
    for (int t = 0; t < 32; ++t) EXPECT_EQ(qb[r * 32 + t], qrb[t]) << r << " " << t;
    for (int t = 0; t < 4; ++t) EXPECT_EQ(sb[r * 4 + t], srb[t]) << r << " " << t;
  }
  // The inverse scale as a tensor: the same bytes; the swizzled layouts place the same scales.
  auto [q3, sf3, scale3] = nvfp4_quantize_per_token_cute_dsl(x, Value(scalar(gsi)), 2);
  EXPECT_EQ(bytes(q3), qb);
  EXPECT_EQ(bytes(scale3), bytes(scale));
  auto [q4, sf4, scale4] = nvfp4_quantize_per_token_cute_dsl(x, Value(static_cast<double>(gsi)));
  EXPECT_EQ(sf4.shape(), (Shape{128, 4}));
  EXPECT_EQ(bytes(q4), qb);
  EXPECT_EQ(bytes(sf4)[sf_layout_offset(SfLayout::layout_128x4, 3, 2, 4)], sb[3 * 4 + 2]);
}

// nvfp4_quantize(per_token_activation=True) as vLLM's NVFP4 MoE and SGLang's FP4 dispatcher
// call it (a_global_sf the float 1 / (448 * 6), linear scales; SGLang with backend="cute-dsl"):
// the per-token form's three outputs, the same bytes as nvfp4_quantize_per_token_cute_dsl;
// recorded as upstream returns them (a 3-tuple) and replayed; with do_shuffle the rows and their
// scales move together. The row remapping is not implemented (kUnsupported); a float scale
// without the per-token form, and sf_vec_size 32 with it, are refused by name.
TEST(Nvfp4QuantizePerToken, AsTheEnginesCallIt) {
  Tensor x = input({256, 64}, kBf, 7);
  const double gsi = 1.0 / (448.0 * 6.0);
  auto [qw, sfw, sw] = nvfp4_quantize_per_token_cute_dsl(x, Value(gsi), 2);
  for (std::string_view backend : {"cuda", "cute-dsl"}) {
    SCOPED_TRACE(backend);
    const Nvfp4QuantizeResult r = nvfp4_quantize(x, Value(gsi), SfLayout::layout_linear, false, 16,
                                                 std::nullopt, backend, true);
    ASSERT_TRUE(r.per_token_scale.defined());
    EXPECT_EQ(bytes(std::get<0>(r)), bytes(qw));
    EXPECT_EQ(bytes(std::get<1>(r)), bytes(sfw));
    EXPECT_EQ(bytes(r.per_token_scale), bytes(sw));
  }
  // A one-element tensor scale, the 128x4 layout: the per-token cute-dsl entry's bytes.
  auto [q1, sf1, s1] = nvfp4_quantize_per_token_cute_dsl(x, Value(gsi), 0);
  const Nvfp4QuantizeResult t = nvfp4_quantize(x, Value(scalar(gsi)), SfLayout::layout_128x4, false,
                                               16, std::nullopt, "cuda", true);
  EXPECT_EQ(bytes(std::get<1>(t)), bytes(sf1));
  EXPECT_EQ(bytes(t.per_token_scale), bytes(s1));
  // Recorded as a 3-tuple; replays identically.
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    (void)nvfp4_quantize(x, Value(gsi), SfLayout::layout_linear, false, 16, std::nullopt, "cuda",
                         true);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  ASSERT_TRUE(calls[0].result.is_sequence());
  EXPECT_EQ(calls[0].result.items().size(), 3u);
  EXPECT_TRUE(testing::replays_identically(calls[0]));
  // do_shuffle: row i of the shuffled codes is row idx[i] of the plain ones, and so is its scale.
  const Nvfp4QuantizeResult sh =
      nvfp4_quantize(x, Value(gsi), SfLayout::layout_128x4, true, 16, std::nullopt, "cuda", true);
  const Tensor moved = shuffle_matrix_a(qw, 128);
  EXPECT_EQ(bytes(std::get<0>(sh)), bytes(moved));
  const Tensor scale_moved = shuffle_matrix_a(sw.view({256, 1}), 128).view({256});
  EXPECT_EQ(bytes(sh.per_token_scale), bytes(scale_moved));
  EXPECT_EQ(bytes(std::get<1>(sh)), bytes(shuffle_matrix_sf_a(sfw, 128)));
  const char* op = "nvfp4_quantize";
  EXPECT_FI_ERROR(nvfp4_quantize(x, Value(gsi), SfLayout::layout_linear, false, 16, std::nullopt,
                                 "cuda", true, Tensor::zeros({256}, DType::kInt32)),
                  op, "expanded_idx_to_permuted_idx");
  EXPECT_FI_ERROR(nvfp4_quantize(x, Value(gsi), SfLayout::layout_linear), op, "a_global_sf");
  EXPECT_FI_ERROR(
      nvfp4_quantize(x, Value(gsi), SfLayout::layout_linear, false, 32, std::nullopt, "cuda", true),
      op, "sf_vec_size");
}

TEST(Mxfp8QuantizeCuteDsl, EqualsMxfp8QuantizeAndPadsK) {
  const Tensor x = input({3, 96}, kBf, 7);
  auto [q, sf] = mxfp8_quantize_cute_dsl(x);
  auto [q2, sf2] = mxfp8_quantize(x);
  EXPECT_EQ(q.dtype(), DType::kFloat8E4M3FN);
  EXPECT_EQ(bytes(q), bytes(q2));
  EXPECT_EQ(bytes(sf), bytes(sf2));
  EXPECT_EQ(sf.dim(), 1);
  // fp32 input holding the same bf16 values: the same bytes.
  auto [qf, sff] = mxfp8_quantize_cute_dsl(x.to(DType::kFloat32), false);
  auto [ql, sfl] = mxfp8_quantize(x, false);
  EXPECT_EQ(bytes(qf), bytes(ql));
  EXPECT_EQ(bytes(sff), bytes(sfl));
  // alignment 64: K 96 -> 128, the padding block all zero with scale code 0.
  auto [qp, sfp] = mxfp8_quantize_cute_dsl(x, false, 64);
  ASSERT_EQ(qp.shape(), (Shape{3, 128}));
  ASSERT_EQ(sfp.shape(), (Shape{12}));
  const auto qpb = bytes(qp), sfpb = bytes(sfp), qlb = bytes(ql), sflb = bytes(sfl);
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t c = 0; c < 128; ++c) {
      EXPECT_EQ(qpb[r * 128 + c], c < 96 ? qlb[r * 96 + c] : 0) << r << " " << c;
    }
    for (int64_t b = 0; b < 4; ++b) EXPECT_EQ(sfpb[r * 4 + b], b < 3 ? sflb[r * 3 + b] : 0);
  }
  // The "cuda" backend pads the same way (vLLM's gpt-oss MXFP8 path asks alignment 256).
  auto [qc, sfc] = mxfp8_quantize(x, false, 64);
  EXPECT_EQ(qc.shape(), qp.shape());
  EXPECT_EQ(bytes(qc), qpb);
  EXPECT_EQ(bytes(sfc), sfpb);
  // 8x4 on the CPU too (the CUDA-path op refuses it there, as upstream's host kernel does).
  auto [q8, sf8] = mxfp8_quantize_cute_dsl(x.reshape({1, 3, 96}), true, 32, std::nullopt, true);
  EXPECT_EQ(q8.shape(), (Shape{3, 96}));
  EXPECT_EQ(sf8.numel(), 8 * 4);
  EXPECT_EQ(bytes(q8), bytes(q2));
}

// The public quantizers with backend="cute-dsl" run the CuTe-DSL entry points, as upstream routes
// them: the same bytes and shapes.
TEST(QuantizeCuteDsl, PublicQuantizersRouteTheBackend) {
  const Tensor x = input({2, 3, 64}, kBf, 19);
  const Tensor gs = scalar(300.0);
  auto [a, as] = fp4_quantize(x, gs, 16, false, true, false, false, std::nullopt, "cute-dsl");
  auto [b, bs] = nvfp4_quantize_cute_dsl(x, Value(gs), 0);
  EXPECT_EQ(a.shape(), (Shape{6, 32}));  // 2-D, where the "cuda" backend keeps [2, 3, 32]
  EXPECT_EQ(bytes(a), bytes(b));
  EXPECT_EQ(bytes(as), bytes(bs));
  auto [c, cs] =
      fp4_quantize(x, std::nullopt, 32, true, false, false, false, std::nullopt, "cute-dsl");
  auto [d, ds] = mxfp4_quantize_cute_dsl(x, 2);
  EXPECT_EQ(bytes(c), bytes(d));
  EXPECT_EQ(bytes(cs), bytes(ds));
  auto [e, es] = mxfp4_quantize(x, "cute-dsl", std::nullopt, SfLayout::layout_8x4);
  auto [f, fs] = mxfp4_quantize_cute_dsl(x, 1);
  EXPECT_EQ(bytes(e), bytes(f));
  EXPECT_EQ(bytes(es), bytes(fs));
  auto [g, gss] =
      nvfp4_quantize(x, gs, SfLayout::layout_linear, false, 16, std::nullopt, "cute-dsl");
  auto [h, hs] = nvfp4_quantize_cute_dsl(x, Value(gs), 2);
  EXPECT_EQ(bytes(g), bytes(h));
  EXPECT_EQ(bytes(gss), bytes(hs));
  auto [i, is] = mxfp8_quantize(x, true, 64, std::nullopt, "cute-dsl", SfLayout::layout_8x4);
  auto [j, js] = mxfp8_quantize_cute_dsl(x, true, 64, std::nullopt, true);
  EXPECT_EQ(i.shape(), (Shape{6, 64}));
  EXPECT_EQ(bytes(i), bytes(j));
  EXPECT_EQ(bytes(is), bytes(js));
  EXPECT_FI_ERROR(fp4_quantize(x, gs, 32, false, true, false, false, std::nullopt, "cute-dsl"),
                  "fp4_quantize", "sf_vec_size");
  EXPECT_FI_ERROR(
      fp4_quantize(x, std::nullopt, 16, false, true, false, false, std::nullopt, "cute-dsl"),
      "fp4_quantize", "global_scale");
  EXPECT_FI_ERROR(
      nvfp4_quantize(x, gs, SfLayout::layout_128x4, false, 32, std::nullopt, "cute-dsl"),
      "nvfp4_quantize", "sf_vec_size");
  // Routed calls name their own arguments.
  EXPECT_FI_ERROR(mxfp4_quantize(input({2, 48}, kBf, 1), "cute-dsl"), "mxfp4_quantize", "a");
  EXPECT_FI_ERROR(nvfp4_quantize(x, Tensor::from_vector({1.0, 2.0}, {2}, DType::kFloat32),
                                 SfLayout::layout_128x4, false, 16, std::nullopt, "cute-dsl"),
                  "nvfp4_quantize", "a_global_sf");
}

TEST(QuantizeCuteDsl, EmptyInputGivesEmptyOutputs) {
  // K = 0: empty outputs of the unpadded shape, for every layout.
  const Tensor k0 = Tensor::empty({2, 0}, kBf);
  for (int64_t layout : {0, 1, 2}) {
    auto [q0, sf0] = mxfp4_quantize_cute_dsl(k0, layout);
    EXPECT_EQ(q0.shape(), (Shape{2, 0}));
    EXPECT_EQ(sf0.shape(), (Shape{2, 0}));
    auto [n0, nsf0] = nvfp4_quantize_cute_dsl(k0, Value(1.0), layout);
    EXPECT_EQ(nsf0.shape(), (Shape{2, 0}));
    auto [p0, psf0, ps0] = nvfp4_quantize_per_token_cute_dsl(k0, Value(1.0), layout);
    EXPECT_EQ(ps0.to_double_vector(), (std::vector<double>{0.0, 0.0}));
  }
  auto [m0, msf0] = mxfp8_quantize_cute_dsl(k0);
  EXPECT_EQ(m0.shape(), (Shape{2, 0}));
  EXPECT_EQ(msf0.numel(), 0);
  const Tensor x = Tensor::empty({0, 64}, kBf);
  auto [q, sf] = mxfp4_quantize_cute_dsl(x);
  EXPECT_EQ(q.shape(), (Shape{0, 32}));
  EXPECT_EQ(sf.numel(), 0);
  auto [q8, sf8] = mxfp8_quantize_cute_dsl(x);
  EXPECT_EQ(q8.shape(), (Shape{0, 64}));
  EXPECT_EQ(sf8.numel(), 0);
  auto [qn, sfn, sc] = nvfp4_quantize_per_token_cute_dsl(x, Value(1.0));
  EXPECT_EQ(sc.numel(), 0);
}

TEST(QuantizeCuteDsl, BadInputNamesOpAndArgument) {
  const Tensor x = input({2, 64}, kBf, 9);
  EXPECT_FI_ERROR(mxfp4_quantize_cute_dsl(x, 3), "mxfp4_quantize_cute_dsl", "sf_layout");
  EXPECT_FI_ERROR(mxfp4_quantize_cute_dsl(x.to(DType::kFloat32)), "mxfp4_quantize_cute_dsl",
                  "input");
  EXPECT_FI_ERROR(mxfp4_quantize_cute_dsl(input({2, 48}, kBf, 1)), "mxfp4_quantize_cute_dsl",
                  "input");
  EXPECT_FI_ERROR(nvfp4_quantize_cute_dsl(input({2, 40}, kBf, 1), Value(1.0)),
                  "nvfp4_quantize_cute_dsl", "input");
  EXPECT_FI_ERROR(nvfp4_quantize_cute_dsl(x, Value(std::string("one"))), "nvfp4_quantize_cute_dsl",
                  "global_scale");
  EXPECT_FI_ERROR(nvfp4_quantize_cute_dsl(x.to(DType::kFloat8E4M3FN), Value(1.0)),
                  "nvfp4_quantize_cute_dsl", "input");
  EXPECT_FI_ERROR(nvfp4_quantize_per_token_cute_dsl(x.reshape({1, 2, 64}), Value(1.0)),
                  "nvfp4_quantize_per_token_cute_dsl", "input");
  EXPECT_FI_ERROR(nvfp4_quantize_per_token_cute_dsl(
                      x, Value(Tensor::from_vector({1.0, 2.0}, {2}, DType::kFloat32))),
                  "nvfp4_quantize_per_token_cute_dsl", "global_scale_inv");
  EXPECT_FI_ERROR(mxfp8_quantize_cute_dsl(x, true, 48), "mxfp8_quantize_cute_dsl", "alignment");
  EXPECT_FI_ERROR(mxfp8_quantize_cute_dsl(input({2, 40}, kBf, 1)), "mxfp8_quantize_cute_dsl",
                  "input");
}

TEST(QuantizeCuteDslReplay, DumpsReplay) {
  const int n = dump_replay_all("qcute", [] {
    const Tensor x = input({3, 64}, kBf, 11);
    (void)mxfp4_quantize_cute_dsl(x, 1);
    (void)mxfp8_quantize_cute_dsl(x, true, 64);
    (void)nvfp4_quantize_cute_dsl(x, Value(scalar(200.0)));
    (void)nvfp4_quantize_per_token_cute_dsl(x, Value(1.0 / 2688.0), 0);
  });
  EXPECT_EQ(n, 4);
}

// ---- CUDA: the same bytes as the CPU ------------------------------------------------------------

TEST(QuantizeCuteDslCuda, MatchesCpuBitForBit) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda(0);
  for (DType dt : {kBf, DType::kFloat16}) {
    Tensor x = input({130, 256}, dt, 13);
    // Tiny blocks (zero scales) and a zero row among them.
    auto* xv = static_cast<uint16_t*>(x.data_ptr());
    for (int i = 0; i < 32; ++i) xv[5 * 256 + i] = 0x8001;  // -smallest subnormal
    for (int i = 0; i < 256; ++i) xv[7 * 256 + i] = 0;
    const Tensor xg = x.to(g);
    for (int64_t layout : {0, 1, 2}) {
      auto [qc, sfc] = mxfp4_quantize_cute_dsl(x, layout);
      auto [qg, sfg] = mxfp4_quantize_cute_dsl(xg, layout);
      EXPECT_EQ(bytes(qg), bytes(qc)) << layout;
      EXPECT_EQ(bytes(sfg), bytes(sfc)) << layout;
      auto [nc, nsc] = nvfp4_quantize_cute_dsl(x, Value(700.0), layout);
      auto [ng, nsg] = nvfp4_quantize_cute_dsl(xg, Value(scalar(700.0).to(g)), layout);
      EXPECT_EQ(bytes(ng), bytes(nc)) << layout;
      EXPECT_EQ(bytes(nsg), bytes(nsc)) << layout;
      auto [pc, psc, sc] = nvfp4_quantize_per_token_cute_dsl(x, Value(1.0 / 2688.0), layout);
      auto [pg, psg, sg] = nvfp4_quantize_per_token_cute_dsl(xg, Value(1.0 / 2688.0), layout);
      EXPECT_EQ(bytes(pg), bytes(pc)) << layout;
      EXPECT_EQ(bytes(psg), bytes(psc)) << layout;
      EXPECT_EQ(bytes(sg), bytes(sc)) << layout;
    }
    for (bool swz : {true, false}) {
      auto [mc, msc] = mxfp8_quantize_cute_dsl(x.to(DType::kFloat32), swz, 64);
      auto [mg, msg] = mxfp8_quantize_cute_dsl(xg.to(DType::kFloat32), swz, 64);
      EXPECT_EQ(bytes(mg), bytes(mc)) << swz;
      EXPECT_EQ(bytes(msg), bytes(msc)) << swz;
    }
  }
  // Rows starting off 16-byte boundaries (the element-load kernel) on the per-token path, the
  // inverse scale as a device tensor.
  const Tensor wide = input({16, 512}, kBf, 17);
  const Tensor view = wide.slice(1, 1, 257);
  auto [pc, psc, sc] = nvfp4_quantize_per_token_cute_dsl(view, Value(1.0 / 2688.0));
  auto [pg, psg, sg] =
      nvfp4_quantize_per_token_cute_dsl(to_keep_layout(view, g), Value(scalar(1.0 / 2688.0).to(g)));
  EXPECT_EQ(bytes(pg), bytes(pc));
  EXPECT_EQ(bytes(sg), bytes(sc));
}

}  // namespace
}  // namespace flashinfer::testing
