// flashinfer.gemm.gemm_bf16_fp4: prepare_bf16_fp4_weights (the cudnn and cute-dsl layouts,
// bit-exact against upstream's definitions and hand-checked words) and mm_bf16_fp4 (fp64
// formula of the canonical weight, both backends bit-identical); bad inputs; declarations;
// record/replay (live and through dump directories).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "api/device_props.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "kernels/gemm_bf16_fp4_params.h"
#include "ops/gemm_reference.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

constexpr DType kBf = DType::kBFloat16;

// Canonical weights as callers make them: nvfp4_quantize of a bf16 [n, k] weight, 128x4 scales.
struct Weights {
  Tensor b, sf, sf_linear;
  int64_t n, k;
};
Weights make_weights(int64_t n, int64_t k, uint64_t seed) {
  Tensor w = rand_tensor({n, k}, kBf, seed, -3.0, 3.0);
  Tensor gs = Tensor::full({1}, 448.0 * 6.0 / 3.0, DType::kFloat32);
  auto [q, sf] = nvfp4_quantize(w, gs, SfLayout::layout_128x4);
  auto [q2, lin] = nvfp4_quantize(w, gs, SfLayout::layout_linear);
  return {q, sf, lin, n, k};
}

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

// Upstream's _unswizzle_sf_128x4 docstring formula.
int64_t swizzled(int64_t n, int64_t c, int64_t ksf) {
  return ((n / 128) * ((ksf + 3) / 4) + c / 4) * 512 + (n % 32) * 16 + ((n % 128) / 32) * 4 + c % 4;
}

// The fp64 formula of the canonical weight: sum_k a[i,k] * e2m1(b[j,k]) * e4m3(sf[j,k/16]).
std::vector<double> reference(const Tensor& a, const Weights& w, double alpha) {
  const int64_t m = a.size(0), n = w.n, k = w.k, ksf = k / 16;
  const auto av = a.to_double_vector();
  const auto bb = bytes(w.b), sb = bytes(w.sf);
  std::vector<double> out(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const uint8_t byte = bb[j * (k / 2) + c / 2];
        const double v = e2m1_bits_to_float(c % 2 ? byte >> 4 : byte & 0xF);
        acc += av[i * k + c] * v * e4m3fn_bits_to_float(sb[swizzled(j, c / 16, ksf)]);
      }
      out[i * n + j] = acc * alpha;
    }
  }
  return out;
}

TEST(PrepareBf16Fp4Weights, CudnnKeepsWeightAndUnswizzlesScales) {
  const Weights w = make_weights(200, 96, 1);  // two 128-row blocks, K_sf = 6 (padded to 8)
  Tensor alpha = Tensor::full({1}, 0.25, DType::kFloat32);
  auto [pb, psf, pal] = prepare_bf16_fp4_weights(w.b, w.sf, alpha, "cudnn");
  EXPECT_EQ(pb.data_ptr(), w.b.data_ptr());
  ASSERT_TRUE(pal.has_value());
  EXPECT_EQ(pal->data_ptr(), alpha.data_ptr());
  EXPECT_EQ(psf.dtype(), DType::kFloat8E4M3FN);
  ASSERT_EQ(psf.shape(), (Shape{200, 6}));
  // The un-swizzled scales are nvfp4_quantize's linear-layout scales, byte for byte.
  EXPECT_EQ(bytes(psf), bytes(w.sf_linear));
  const auto sw = bytes(w.sf), lin = bytes(psf);
  for (int64_t r : {0, 31, 32, 127, 128, 199}) {
    for (int64_t c = 0; c < 6; ++c) EXPECT_EQ(lin[r * 6 + c], sw[swizzled(r, c, 6)]);
  }
  auto [pb2, psf2, pal2] = prepare_bf16_fp4_weights(w.b, w.sf.view({-1}), std::nullopt, "cudnn");
  EXPECT_FALSE(pal2.has_value());
  EXPECT_EQ(bytes(psf2), bytes(psf));
}

// The index the CPU reference and the CUDA kernel share (bf16_fp4_cudnn_sf_source) is upstream's
// _unswizzle_sf_128x4 formula, and maps the [n, k_sf] scales one-to-one into the padded
// swizzled buffer.
TEST(PrepareBf16Fp4Weights, CudnnScaleIndexIsTheSwizzleAndOneToOne) {
  for (int64_t n : {int64_t{1}, int64_t{64}, int64_t{200}, int64_t{384}}) {
    for (int64_t ksf : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{6}, int64_t{9}}) {
      const int64_t padded = (n + 127) / 128 * 128 * ((ksf + 3) / 4 * 4);
      std::vector<int> hits(static_cast<size_t>(padded), 0);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t c = 0; c < ksf; ++c) {
          const int64_t o = kernels::bf16_fp4_cudnn_sf_source(r, c, ksf);
          ASSERT_EQ(o, swizzled(r, c, ksf)) << n << " " << ksf << " " << r << " " << c;
          ASSERT_LT(o, padded);
          ++hits[static_cast<size_t>(o)];
        }
      }
      EXPECT_EQ(std::count(hits.begin(), hits.end(), 1), n * ksf) << n << " " << ksf;
      EXPECT_EQ(std::count_if(hits.begin(), hits.end(), [](int h) { return h > 1; }), 0);
    }
  }
  // Hand-checked: row 33, column 5 of k_sf 6 (two 4-column tiles) is in tile 1 of row block 0,
  // lane row 1, row group 1: 512 + 1 * 16 + 1 * 4 + 1.
  EXPECT_EQ(kernels::bf16_fp4_cudnn_sf_source(33, 5, 6), 512 + 16 + 4 + 1);
}

// The CUDA kernel of the cudnn layout against the CPU reference, byte for byte, over shapes with
// partial 128-row blocks and partial 4-column tiles, a strided weight, and a non-contiguous
// scale view; the weight comes back as the same tensor. The cute-dsl layout stays refused on
// CUDA (upstream's text on sm90). Skipped without a GPU.
TEST(PrepareBf16Fp4WeightsCuda, CudnnMatchesCpu) {
  struct Dims {
    int64_t n, k;
  };
  const Dims dims[] = {{200, 96}, {64, 64}, {128, 256}, {333, 16}, {1, 144}};
  std::vector<Weights> ws;
  for (const Dims& d : dims) ws.push_back(make_weights(d.n, d.k, 40 + d.n));
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device dev = Device::cuda(0);
  for (const Weights& w : ws) {
    SCOPED_TRACE("n " + std::to_string(w.n) + " k " + std::to_string(w.k));
    auto [cb, csf, cal] = prepare_bf16_fp4_weights(w.b, w.sf, std::nullopt, "cudnn");
    (void)cal;
    const Tensor b = w.b.to(dev);
    Tensor alpha = Tensor::full({1}, 0.5, DType::kFloat32).to(dev);
    auto [gb, gsf, gal] = prepare_bf16_fp4_weights(b, w.sf.to(dev), alpha, "cudnn");
    EXPECT_EQ(gb.data_ptr(), b.data_ptr());
    ASSERT_TRUE(gal.has_value());
    EXPECT_EQ(gal->data_ptr(), alpha.data_ptr());
    EXPECT_TRUE(gsf.device().is_cuda());
    EXPECT_EQ(gsf.dtype(), DType::kFloat8E4M3FN);
    EXPECT_EQ(gsf.shape(), csf.shape());
    EXPECT_EQ(bytes(gsf.to(Device::cpu())), bytes(csf));
  }
  // A weight with padded rows (row stride > K / 2) and the scales as a strided view.
  {
    const Weights& w = ws[0];
    Tensor wide = Tensor::zeros({w.n, w.k / 2 + 16}, DType::kUInt8);
    wide.slice(1, 0, w.k / 2).copy_(w.b);
    Tensor sf2 = Tensor::zeros({2 * w.sf.numel()}, DType::kUInt8);
    sf2.view({-1, 2}).select(1, 0).copy_(w.sf.view({-1}));
    const Tensor sfv = sf2.view({-1, 2}).select(1, 0);
    auto [cb, csf, cal] =
        prepare_bf16_fp4_weights(wide.slice(1, 0, w.k / 2), sfv, std::nullopt, "cudnn");
    const Tensor gwide = wide.to(dev), gsf2 = sf2.to(dev);
    auto [gb, gsf, gal] = prepare_bf16_fp4_weights(
        gwide.slice(1, 0, w.k / 2), gsf2.view({-1, 2}).select(1, 0), std::nullopt, "cudnn");
    EXPECT_EQ(bytes(gsf.to(Device::cpu())), bytes(csf));
    EXPECT_EQ(bytes(csf), bytes(w.sf_linear));
  }
  if (api::compute_capability(dev) == 90) {
    EXPECT_FI_ERROR(
        (void)prepare_bf16_fp4_weights(ws[1].b.to(dev), ws[1].sf.to(dev), std::nullopt, "cute-dsl"),
        "prepare_bf16_fp4_weights", "backend");
  }
}

// The cute-dsl scale byte of one e4m3 code, through the op (every scale of a 64 x 16 weight).
int s0e5m3(int code) {
  Tensor b = Tensor::zeros({64, 8}, DType::kUInt8);
  Tensor sf = Tensor::full({512}, code, DType::kUInt8);
  auto [pb, psf, pal] = prepare_bf16_fp4_weights(b, sf, std::nullopt, "cute-dsl");
  const auto v = bytes(psf);
  for (uint8_t x : v) EXPECT_EQ(x, v[0]);
  return v[0];
}

TEST(PrepareBf16Fp4Weights, S0E5M3HandChecked) {
  EXPECT_EQ(s0e5m3(0x38), 0x78);  // 1.0 = fp16 0x3C00
  EXPECT_EQ(s0e5m3(0xB8), 0x78);  // -1.0: the sign is dropped
  EXPECT_EQ(s0e5m3(0x01), 0x30);  // 2^-9 = fp16 0x1800
  EXPECT_EQ(s0e5m3(0x7E), 0xBE);  // 448 = fp16 0x5F00
  EXPECT_EQ(s0e5m3(0x00), 0x00);
  EXPECT_EQ(s0e5m3(0x7F), 0xFC);    // NaN -> fp16 0x7E00
  for (int c = 0; c < 0x7F; ++c) {  // every finite non-negative code decodes back
    EXPECT_EQ(half_bits_to_float(static_cast<uint16_t>(s0e5m3(c) << 7)),
              e4m3fn_bits_to_float(static_cast<uint8_t>(c)));
  }
}

TEST(PrepareBf16Fp4Weights, CuteDslWordsHandChecked) {
  // b[n][kh] = distinct bytes per (n, kh) within a tile: n + 64 * (kh % 4) is unique for
  // kh < 4; the k-half offset 4 is told apart by the second tile row pattern below.
  const int64_t n = 128, k = 32;
  Tensor b = Tensor::empty({n, k / 2}, DType::kUInt8);
  auto* bp = static_cast<uint8_t*>(b.data_ptr());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t kh = 0; kh < k / 2; ++kh) bp[r * (k / 2) + kh] = static_cast<uint8_t>(r * 16 + kh);
  }
  const int64_t need = 1 * 2 * 512;
  Tensor sf = Tensor::full({need}, 0x38, DType::kUInt8);
  auto [pb, psf, pal] = prepare_bf16_fp4_weights(b, sf, std::nullopt, "cute-dsl");
  ASSERT_EQ(pb.dtype(), DType::kInt32);
  ASSERT_EQ(pb.shape(), (Shape{2, 256}));
  ASSERT_EQ(psf.shape(), (Shape{2, 128}));
  const auto* words = static_cast<const uint32_t*>(pb.data_ptr());
  auto src = [&](int64_t r, int64_t kh) { return static_cast<uint32_t>(bp[r * (k / 2) + kh]); };
  auto word = [&](int64_t r0, int64_t r1, int64_t kh) {
    // bytes: (r0, kh), (r0, kh + 4), (r1, kh), (r1, kh + 4), little-endian
    return src(r0, kh) | src(r0, kh + 4) << 8 | src(r1, kh) << 16 | src(r1, kh + 4) << 24;
  };
  EXPECT_EQ(words[0], word(0, 16, 0));               // lane 0, even word: n 0 / 16
  EXPECT_EQ(words[1], word(32, 48, 0));              // odd word: n 32 / 48
  EXPECT_EQ(words[2], word(0, 16, 1));               // lane 1: k-half 1
  EXPECT_EQ(words[8], word(1, 17, 0));               // lane 4: n 1
  EXPECT_EQ(words[64], word(8, 24, 0));              // second warp: n 8
  EXPECT_EQ(words[127], word(15 + 32, 15 + 48, 3));  // last word of the tile
  EXPECT_EQ(words[128], word(64, 80, 0));            // second n tile
  EXPECT_EQ(words[256 + 128], word(64, 80, 8));      // second k tile, second n tile
  // Every source byte lands exactly once.
  std::vector<int> seen(static_cast<size_t>(n * k / 2), 0);
  for (int64_t kt = 0; kt < 2; ++kt) {
    for (int64_t w = 0; w < 256; ++w) {
      for (int64_t j = 0; j < 4; ++j) {
        // upstream's _cute_dsl_pack_fp4_weight gather, spelled as its index arithmetic
        const int64_t u = w % 128, lane = (u / 2) % 32;
        const int64_t kh = lane % 4 + (j % 2) * 4;
        const int64_t nn = (u / 64) * 8 + lane / 4 + (u % 2) * 32 + (j / 2) * 16;
        const int64_t r = (w / 128) * 64 + nn, c = kt * 8 + kh;
        ++seen[static_cast<size_t>(r * (k / 2) + c)];
        EXPECT_EQ((words[kt * 256 + w] >> (8 * j)) & 0xFF, src(r, c));
      }
    }
  }
  for (int s : seen) ASSERT_EQ(s, 1);
  for (uint8_t s : bytes(psf)) EXPECT_EQ(s, 0x78);
}

TEST(MmBf16Fp4, MatchesFp64FormulaOnBothBackends) {
  for (auto [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 64, 16}, {5, 128, 96}, {17, 192, 256}}) {
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
    const Weights w = make_weights(n, k, static_cast<uint64_t>(m + n + k));
    Tensor a = rand_tensor({m, k}, kBf, 7);
    for (bool with_alpha : {false, true}) {
      std::optional<Tensor> alpha;
      if (with_alpha) alpha = Tensor::full({1}, 1.0 / 896.0, DType::kFloat32);
      // alpha = 1 / global scale, as callers pass it (the weight then has its bf16 range).
      const double al = with_alpha ? static_cast<double>(static_cast<float>(1.0 / 896.0)) : 1.0;
      auto [cb, csf, cal] = prepare_bf16_fp4_weights(w.b, w.sf, alpha, "cudnn");
      auto [qb, qsf, qal] = prepare_bf16_fp4_weights(w.b, w.sf, alpha, "cute-dsl");
      Tensor out_c = mm_bf16_fp4(a, cb, csf, cal, "cudnn");
      Tensor out_q = mm_bf16_fp4(a, qb, qsf, qal, "cute-dsl");
      EXPECT_EQ(out_c.dtype(), kBf);
      EXPECT_TRUE(all_close(out_c, reference(a, w, al), gemm_tol(kBf, k)));
      // Same exact weights, same accumulation order: the same bits.
      EXPECT_EQ(bytes(out_c), bytes(out_q));
      if (!with_alpha) continue;  // fp16 holds the output only with alpha applied
      Tensor out16 = Tensor::zeros({m, n}, DType::kFloat16);
      (void)mm_bf16_fp4(a, cb, csf, cal, "cudnn", DType::kFloat16, out16);
      EXPECT_TRUE(all_close(out16, reference(a, w, al), gemm_tol(DType::kFloat16, k)));
    }
  }
}

TEST(MmBf16Fp4, HandChecked) {
  // One row of ones times a weight whose codes are all 1.0 (0x2) with scale 2.0 (0x40): k * 2.
  const int64_t n = 64, k = 32;
  Tensor b = Tensor::full({n, k / 2}, 0x22, DType::kUInt8);
  Tensor sf = Tensor::full({512}, 0x40, DType::kUInt8);
  Tensor a = Tensor::full({1, k}, 1.0, kBf);
  for (const char* be : {"cudnn", "cute-dsl"}) {
    auto [pb, psf, pal] =
        prepare_bf16_fp4_weights(b, sf, Tensor::full({1}, 0.5, DType::kFloat32), be);
    Tensor out = mm_bf16_fp4(a, pb, psf, pal, be);
    for (double v : out.to_double_vector()) EXPECT_EQ(v, 32.0) << be;
  }
}

TEST(MmBf16Fp4BadInput, ErrorsNameOpAndArgument) {
  const Weights w = make_weights(64, 32, 3);
  const char* p = "prepare_bf16_fp4_weights";
  EXPECT_FI_ERROR(prepare_bf16_fp4_weights(w.b.view({-1}), w.sf, std::nullopt, "cudnn"), p, "b");
  EXPECT_FI_ERROR(prepare_bf16_fp4_weights(w.b.to(DType::kInt32), w.sf, std::nullopt, "cudnn"), p,
                  "b");
  EXPECT_FI_ERROR(prepare_bf16_fp4_weights(w.b.slice(1, 0, 4), w.sf, std::nullopt, "cudnn"), p,
                  "b");  // K = 8
  EXPECT_FI_ERROR(
      prepare_bf16_fp4_weights(w.b, w.sf.view({-1}).slice(0, 0, 100), std::nullopt, "cudnn"), p,
      "b_descale");
  EXPECT_FI_ERROR(
      prepare_bf16_fp4_weights(w.b, w.sf, Tensor::full({2}, 1.0, DType::kFloat32), "cudnn"), p,
      "alpha");
  EXPECT_FI_ERROR(
      prepare_bf16_fp4_weights(w.b, w.sf, Tensor::full({1}, 1.0, DType::kFloat16), "cudnn"), p,
      "alpha");
  EXPECT_FI_ERROR(prepare_bf16_fp4_weights(w.b, w.sf, std::nullopt, "cutlass"), p, "backend");
  EXPECT_FI_ERROR(prepare_bf16_fp4_weights(w.b, w.sf, std::nullopt, "cudnn", 32), p, "block_size");
  const Weights odd = make_weights(32, 32, 4);
  EXPECT_FI_ERROR(prepare_bf16_fp4_weights(odd.b, odd.sf, std::nullopt, "cute-dsl"), p, "b");

  const char* o = "mm_bf16_fp4";
  auto [cb, csf, cal] = prepare_bf16_fp4_weights(w.b, w.sf, std::nullopt, "cudnn");
  auto [qb, qsf, qal] = prepare_bf16_fp4_weights(w.b, w.sf, std::nullopt, "cute-dsl");
  Tensor a = rand_tensor({3, 32}, kBf, 5);
  EXPECT_FI_ERROR(mm_bf16_fp4(a.to(DType::kFloat16), cb, csf, cal, "cudnn"), o, "a");
  EXPECT_FI_ERROR(mm_bf16_fp4(a.view({-1}), cb, csf, cal, "cudnn"), o, "a");
  EXPECT_FI_ERROR(mm_bf16_fp4(rand_tensor({3, 48}, kBf, 6), cb, csf, cal, "cudnn"), o, "a");
  EXPECT_FI_ERROR(mm_bf16_fp4(a, qb, qsf, qal, "cudnn"), o, "b");  // cute-dsl's int32 weight
  EXPECT_FI_ERROR(mm_bf16_fp4(a, cb, csf, cal, "cute-dsl"), o, "b");
  EXPECT_FI_ERROR(mm_bf16_fp4(a, cb, w.sf, cal, "cudnn"), o, "b_descale");  // still swizzled
  EXPECT_FI_ERROR(mm_bf16_fp4(a, qb, csf, qal, "cute-dsl"), o, "b_descale");
  EXPECT_FI_ERROR(mm_bf16_fp4(a, cb, csf, Tensor::full({1}, 1.0, kBf), "cudnn"), o, "alpha");
  EXPECT_FI_ERROR(mm_bf16_fp4(a, cb, csf, cal, "trtllm"), o, "backend");
  EXPECT_FI_ERROR(mm_bf16_fp4(a, cb, csf, cal, "cudnn", DType::kFloat32), o, "out_dtype");
  EXPECT_FI_ERROR(mm_bf16_fp4(a, qb, qsf, qal, "cute-dsl", DType::kFloat16), o, "out_dtype");
  EXPECT_FI_ERROR(mm_bf16_fp4(a, cb, csf, cal, "cudnn", std::nullopt, Tensor::zeros({3, 63}, kBf)),
                  o, "out");
  EXPECT_FI_ERROR(
      mm_bf16_fp4(a, cb, csf, cal, "cudnn", std::nullopt, Tensor::zeros({3, 64}, DType::kFloat16)),
      o, "out");
  EXPECT_FI_ERROR(mm_bf16_fp4(a, cb, csf, cal, "cudnn", std::nullopt, std::nullopt, 32), o,
                  "block_size");
}

TEST(MmBf16Fp4Decl, SignaturesModulesAndBackends) {
  const std::vector<std::tuple<std::string, std::string>> expected = {
      {"prepare_bf16_fp4_weights", "(b, b_descale, alpha=None, *, backend, block_size=16)"},
      {"mm_bf16_fp4",
       "(a, b, b_descale, alpha=None, *, backend, out_dtype=None, out=None, block_size=16, "
       "enable_pdl=True)"},
  };
  for (const auto& [name, sig] : expected) {
    const OpDecl* d = OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->module, "flashinfer.gemm.gemm_bf16_fp4") << name;
    EXPECT_EQ(d->signature(), sig) << name;
    EXPECT_TRUE(op_has_backend(name, DeviceType::kCPU));
    const BackendRequirement& req = backend_requirement(name);
    EXPECT_TRUE(req.is_known_backend("cudnn"));
    EXPECT_TRUE(req.is_known_backend("cute-dsl"));
    // The cute-dsl layout and mm_bf16_fp4 have no CUDA kernel here; prepare's cudnn layout has
    // one, for every GPU (Hopper included, as upstream's torch indexing).
    EXPECT_FALSE(req.is_backend_supported("cute-dsl", 120));
    const bool prepare = name == "prepare_bf16_fp4_weights";
    EXPECT_EQ(op_has_backend(name, DeviceType::kCUDA), prepare && cuda_compiled());
    for (int cc : {80, 90, 100}) {
      EXPECT_EQ(req.is_backend_supported("cudnn", cc), prepare && cuda_compiled()) << cc;
    }
  }
}

// ---- record and replay ------------------------------------------------------------------------

void run_every_op(const Weights& w) {
  Tensor alpha = Tensor::full({1}, 0.5, DType::kFloat32);
  auto [cb, csf, cal] = prepare_bf16_fp4_weights(w.b, w.sf, alpha, "cudnn");
  auto [qb, qsf, qal] = prepare_bf16_fp4_weights(w.b, w.sf, std::nullopt, "cute-dsl");
  Tensor a = rand_tensor({3, 48}, kBf, 10);
  (void)mm_bf16_fp4(a, cb, csf, cal, "cudnn", DType::kFloat16,
                    Tensor::zeros({3, 64}, DType::kFloat16));
  (void)mm_bf16_fp4(a, qb, qsf, qal, "cute-dsl");
}

TEST(MmBf16Fp4, RecordAndReplay) {
  std::vector<RecordingObserver::Call> calls;
  {
    const Weights w = make_weights(64, 48, 9);
    RecordingScope scope;
    run_every_op(w);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 4u);
  for (const auto& c : calls) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(replays_identically(c));
  }
}

TEST(MmBf16Fp4, DumpReplayPasses) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_bf16fp4_rec_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  const Weights w = make_weights(64, 48, 9);
  recorder::start(cfg, [](const std::string&) {});
  run_every_op(w);
  recorder::stop();
  std::vector<fs::path> calls;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) calls.push_back(e.path());
  }
  ASSERT_EQ(calls.size(), 4u);
  for (const auto& c : calls) {
    const replay::Result r = replay::replay_from_dump(c.string());
    EXPECT_EQ(r.status, replay::Status::kPassed) << c << ": " << r.error;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashinfer::testing
