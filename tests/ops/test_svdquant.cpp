// flashinfer.gemm.gemm_svdquant: mm_nvfp4_svdquant (fp64 formula, hand-checked epilogue),
// nvfp4_quantize_smooth (byte-identical to nvfp4_quantize of the bf16 product, as upstream's
// docstring states), svdquant_linear (the three-step chain exactly); bad inputs; declarations;
// record/replay (live and through dump directories).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/gemm_reference.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

constexpr DType kBf = DType::kBFloat16;

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

int64_t swz(int64_t r, int64_t c, int64_t ksf) {
  return ((r / 128) * ((ksf + 3) / 4) + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
}

// The dequantized NVFP4 value [r, c] (no global scale: alpha carries it).
double dq(const std::vector<uint8_t>& q, const std::vector<uint8_t>& sf, int64_t r, int64_t c,
          int64_t k) {
  const uint8_t byte = q[r * (k / 2) + c / 2];
  return e2m1_bits_to_float(c % 2 ? byte >> 4 : byte & 0xF) *
         e4m3fn_bits_to_float(sf[swz(r, c / 16, k / 16)]);
}

struct Problem {
  Tensor a, b, a_sf, b_sf, alpha, d, l1, bias;
  int64_t m, n, k, r;
};
Problem problem(int64_t m, int64_t n, int64_t k, int64_t r, uint64_t seed) {
  Tensor gs = Tensor::full({1}, 448.0 * 6.0 / 2.0, DType::kFloat32);
  auto [qa, sa] = nvfp4_quantize(rand_tensor({m, k}, kBf, seed), gs);
  auto [qb, sb] = nvfp4_quantize(rand_tensor({n, k}, kBf, seed + 1), gs);
  return {qa,
          qb,
          sa.reshape({-1}),
          sb,
          Tensor::full({1}, 1.0 / (1344.0 * 1344.0), DType::kFloat32),
          rand_tensor({m, r}, kBf, seed + 2),
          rand_tensor({n, r}, kBf, seed + 3, -1e5, 1e5),  // l1 pre-divided by alpha: large
          rand_tensor({n}, kBf, seed + 4),
          m,
          n,
          k,
          r};
}

std::vector<double> reference(const Problem& p, bool with_bias) {
  const auto qa = bytes(p.a), qb = bytes(p.b), sa = bytes(p.a_sf), sb = bytes(p.b_sf);
  const auto d = p.d.to_double_vector(), l1 = p.l1.to_double_vector(),
             bias = p.bias.to_double_vector();
  const double alpha = static_cast<double>(static_cast<float>(1.0 / (1344.0 * 1344.0)));
  std::vector<double> out(static_cast<size_t>(p.m * p.n));
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double acc = 0.0;
      for (int64_t c = 0; c < p.k; ++c) acc += dq(qa, sa, i, c, p.k) * dq(qb, sb, j, c, p.k);
      for (int64_t c = 0; c < p.r; ++c) acc += d[i * p.r + c] * l1[j * p.r + c];
      out[i * p.n + j] = alpha * acc + (with_bias ? bias[j] : 0.0);
    }
  }
  return out;
}

TEST(MmNvfp4Svdquant, MatchesFp64Formula) {
  for (auto [m, n, k, r] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 32, 32, 32},
                            {7, 64, 96, 64},
                            {130, 32, 64, 32}}) {
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
    const Problem p = problem(m, n, k, r, static_cast<uint64_t>(m + n + k));
    Tensor out = mm_nvfp4_svdquant(p.a, p.b, p.a_sf, p.b_sf, p.alpha, p.d, p.l1);
    EXPECT_EQ(out.dtype(), kBf);
    EXPECT_TRUE(all_close(out, reference(p, false), gemm_tol(kBf, k + r)));
    Tensor given = Tensor::zeros({m, n}, kBf);
    Tensor out2 = mm_nvfp4_svdquant(p.a, p.b, p.a_sf, p.b_sf, p.alpha, p.d, p.l1, p.bias, given);
    EXPECT_EQ(out2.data_ptr(), given.data_ptr());
    EXPECT_TRUE(all_close(given, reference(p, true), gemm_tol(kBf, k + r)));
  }
}

TEST(MmNvfp4Svdquant, HandCheckedEpilogue) {
  // a, b all 1.0 (code 0x2) with scale 1.0 (0x38): a @ b^T = k = 32; d @ l1^T = 32 * 1 * 2 = 64;
  // out = 0.5 * (32 + 64) + 1 = 49.
  Tensor a = Tensor::full({2, 16}, 0x22, DType::kUInt8),
         b = Tensor::full({32, 16}, 0x22, DType::kUInt8);
  Tensor sf = Tensor::full({128 * 4}, 0x38, DType::kUInt8);
  Tensor out = mm_nvfp4_svdquant(a, b, sf, sf, Tensor::full({2}, 0.5, DType::kFloat32),
                                 Tensor::full({2, 32}, 1.0, kBf), Tensor::full({32, 32}, 2.0, kBf),
                                 Tensor::full({32}, 1.0, kBf));
  for (double v : out.to_double_vector()) EXPECT_EQ(v, 49.0);
}

TEST(Nvfp4QuantizeSmooth, EqualsStockQuantizerOfTheBf16Product) {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{3, 32}, {130, 80}}) {
    Tensor x = rand_tensor({m, n}, kBf, 11), s = rand_tensor({n}, kBf, 12, 0.25, 4.0);
    Tensor gs = Tensor::full({1}, 448.0 * 6.0 / 8.0, DType::kFloat32);
    auto [q, sf] = nvfp4_quantize_smooth(x, s, gs);
    ASSERT_EQ(q.shape(), (Shape{m, n / 2}));
    ASSERT_EQ(sf.dim(), 1);
    EXPECT_EQ(sf.numel(), (m + 127) / 128 * 128 * ((n / 16 + 3) / 4 * 4));
    // bf16(x * s), elementwise
    Tensor y = Tensor::empty({m, n}, kBf);
    const auto xv = x.to_double_vector(), sv = s.to_double_vector();
    auto* yp = static_cast<uint16_t*>(y.data_ptr());
    for (int64_t i = 0; i < m * n; ++i) {
      yp[i] = float_to_bfloat16_bits(static_cast<float>(xv[i]) * static_cast<float>(sv[i % n]));
    }
    auto [q2, sf2] = nvfp4_quantize(y, gs, SfLayout::layout_128x4);
    EXPECT_EQ(bytes(q), bytes(q2));
    EXPECT_EQ(bytes(sf), bytes(sf2));
  }
  // pre_quant_scale of ones: the stock quantizer of x itself.
  Tensor x = rand_tensor({4, 64}, kBf, 13);
  Tensor gs = Tensor::full({1}, 1000.0, DType::kFloat32);
  auto [q, sf] = nvfp4_quantize_smooth(x, Tensor::full({64}, 1.0, kBf), gs);
  auto [q2, sf2] = nvfp4_quantize(x, gs);
  EXPECT_EQ(bytes(q), bytes(q2));
  EXPECT_EQ(bytes(sf), bytes(sf2));
  // Upstream's smooth kernel has the standard recipe only: FLASHINFER_NVFP4_4OVER6 does not
  // reach it.
  testing::ScopedEnv on("FLASHINFER_NVFP4_4OVER6", "1");
  auto [q3, sf3] = nvfp4_quantize_smooth(x, Tensor::full({64}, 1.0, kBf), gs);
  EXPECT_EQ(bytes(sf3), bytes(sf2));
  EXPECT_NE(bytes(std::get<1>(nvfp4_quantize(x, gs))), bytes(sf2));  // the plain call takes it
}

TEST(SvdquantLinear, IsTheThreeStepChain) {
  const int64_t m = 5, n = 64, k = 64, r = 32;
  Tensor x = rand_tensor({m, k}, kBf, 21), s = rand_tensor({k}, kBf, 22, 0.5, 2.0);
  Tensor gs_w = Tensor::full({1}, 1344.0, DType::kFloat32);
  auto [w, wsf] = nvfp4_quantize(rand_tensor({n, k}, kBf, 23), gs_w);
  Tensor l2t = rand_tensor({k, r}, kBf, 24, -0.2, 0.2), l1 = rand_tensor({n, r}, kBf, 25);
  Tensor gs = Tensor::full({1}, 448.0 * 6.0 / 4.0, DType::kFloat32);
  Tensor alpha = Tensor::full({1}, 1.0 / (1344.0 * 672.0), DType::kFloat32);
  Tensor bias = rand_tensor({n}, kBf, 26);
  Tensor y = svdquant_linear(x, w, wsf, alpha, s, l2t, l1, gs, bias);
  // Step by step: down = bf16(x @ l2t) with fp32 sums (fp64 here: the same bf16 but at ties).
  auto [xq, xsf] = nvfp4_quantize_smooth(x, s, gs);
  Tensor down = Tensor::empty({m, r}, kBf);
  const auto xv = x.to_double_vector(), lv = l2t.to_double_vector();
  auto* dp = static_cast<uint16_t*>(down.data_ptr());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < r; ++j) {
      float acc = 0.0f;
      for (int64_t c = 0; c < k; ++c) {
        acc += static_cast<float>(xv[i * k + c]) * static_cast<float>(lv[c * r + j]);
      }
      dp[i * r + j] = float_to_bfloat16_bits(acc);
    }
  }
  Tensor y2 = mm_nvfp4_svdquant(xq, w, xsf, wsf, alpha, down, l1, bias);
  EXPECT_EQ(bytes(y), bytes(y2));
}

TEST(SvdquantBadInput, ErrorsNameOpAndArgument) {
  const Problem p = problem(3, 32, 64, 32, 31);
  const char* o = "mm_nvfp4_svdquant";
  EXPECT_FI_ERROR(mm_nvfp4_svdquant(p.a.to(DType::kInt32), p.b, p.a_sf, p.b_sf, p.alpha, p.d, p.l1),
                  o, "a");
  EXPECT_FI_ERROR(mm_nvfp4_svdquant(p.a, p.b.slice(1, 0, 16), p.a_sf, p.b_sf, p.alpha, p.d, p.l1),
                  o, "b");
  EXPECT_FI_ERROR(mm_nvfp4_svdquant(p.a, p.b.slice(0, 0, 16), p.a_sf, p.b_sf, p.alpha, p.d,
                                    p.l1.slice(0, 0, 16)),
                  o, "b");  // n = 16
  EXPECT_FI_ERROR(mm_nvfp4_svdquant(p.a, p.b, p.a_sf.slice(0, 0, 100), p.b_sf, p.alpha, p.d, p.l1),
                  o, "a_sf");
  EXPECT_FI_ERROR(
      mm_nvfp4_svdquant(p.a, p.b, p.a_sf, p.b_sf.reshape({-1}).slice(0, 0, 64), p.alpha, p.d, p.l1),
      o, "b_sf");
  EXPECT_FI_ERROR(mm_nvfp4_svdquant(p.a, p.b, p.a_sf, p.b_sf, p.alpha.to(kBf), p.d, p.l1), o,
                  "alpha");
  EXPECT_FI_ERROR(mm_nvfp4_svdquant(p.a, p.b, p.a_sf, p.b_sf, p.alpha, p.d.slice(1, 0, 16),
                                    p.l1.slice(1, 0, 16)),
                  o, "d");  // rank 16
  EXPECT_FI_ERROR(
      mm_nvfp4_svdquant(p.a, p.b, p.a_sf, p.b_sf, p.alpha, p.d.to(DType::kFloat16), p.l1), o, "d");
  EXPECT_FI_ERROR(
      mm_nvfp4_svdquant(p.a, p.b, p.a_sf, p.b_sf, p.alpha, p.d, rand_tensor({32, 64}, kBf, 1)), o,
      "l1");
  EXPECT_FI_ERROR(
      mm_nvfp4_svdquant(p.a, p.b, p.a_sf, p.b_sf, p.alpha, p.d, p.l1, rand_tensor({31}, kBf, 1)), o,
      "bias");
  EXPECT_FI_ERROR(mm_nvfp4_svdquant(p.a, p.b, p.a_sf, p.b_sf, p.alpha, p.d, p.l1, std::nullopt,
                                    Tensor::zeros({3, 32}, DType::kFloat16)),
                  o, "out");
  EXPECT_FI_ERROR(mm_nvfp4_svdquant(p.a, p.b, p.a_sf, p.b_sf, p.alpha, p.d, p.l1, std::nullopt,
                                    std::nullopt, "cute-dsl"),
                  o, "backend");
  const char* q = "nvfp4_quantize_smooth";
  Tensor x = rand_tensor({2, 32}, kBf, 2), s = rand_tensor({32}, kBf, 3);
  Tensor gs = Tensor::full({1}, 100.0, DType::kFloat32);
  EXPECT_FI_ERROR(nvfp4_quantize_smooth(x.to(DType::kFloat16), s, gs), q, "x");
  EXPECT_FI_ERROR(
      nvfp4_quantize_smooth(rand_tensor({2, 40}, kBf, 4), rand_tensor({40}, kBf, 5), gs), q, "x");
  EXPECT_FI_ERROR(nvfp4_quantize_smooth(x, s.slice(0, 0, 16), gs), q, "pre_quant_scale");
  EXPECT_FI_ERROR(nvfp4_quantize_smooth(x, s.to(DType::kFloat32), gs), q, "pre_quant_scale");
  EXPECT_FI_ERROR(nvfp4_quantize_smooth(x, s, Tensor::full({2}, 1.0, DType::kFloat32)), q,
                  "global_scale");
  EXPECT_FI_ERROR(nvfp4_quantize_smooth(x, s, gs, std::nullopt, "cuda"), q, "backend");
  EXPECT_FI_ERROR(
      svdquant_linear(x, p.b, p.b_sf, p.alpha, s, rand_tensor({16, 32}, kBf, 6), p.l1, gs),
      "svdquant_linear", "l2t_smoothed");
}

TEST(SvdquantDecl, SignaturesModuleCpuOnly) {
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"mm_nvfp4_svdquant",
       "(a, b, a_sf, b_sf, alpha, d, l1, bias=None, out=None, backend='cutlass', "
       "enable_pdl=None)"},
      {"nvfp4_quantize_smooth",
       "(x, pre_quant_scale, global_scale, enable_pdl=None, backend='cutlass')"},
      {"svdquant_linear",
       "(x, weight_fp4, weight_sf, alpha, pre_quant_scale, l2t_smoothed, l1_scaled, "
       "global_scale, bias=None, enable_pdl=None)"},
  };
  for (const auto& [name, sig] : expected) {
    const OpDecl* d = OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->module, "flashinfer.gemm.gemm_svdquant");
    EXPECT_EQ(d->signature(), sig);
    EXPECT_TRUE(op_has_backend(name, DeviceType::kCPU));
    EXPECT_FALSE(op_has_backend(name, DeviceType::kCUDA));
  }
  EXPECT_FALSE(backend_requirement("mm_nvfp4_svdquant").is_backend_supported("cutlass", 100));
  EXPECT_EQ(backend_requirement("mm_nvfp4_svdquant").default_backend, "cutlass");
}

// ---- record and replay ------------------------------------------------------------------------

void run_every_op(const Problem& p) {
  (void)mm_nvfp4_svdquant(p.a, p.b, p.a_sf, p.b_sf, p.alpha, p.d, p.l1, p.bias);
  Tensor x = rand_tensor({3, 64}, kBf, 41), s = rand_tensor({64}, kBf, 42, 0.5, 2.0);
  Tensor gs = Tensor::full({1}, 448.0 * 6.0 / 4.0, DType::kFloat32);
  (void)nvfp4_quantize_smooth(x, s, gs);
  (void)svdquant_linear(x, p.b, p.b_sf, p.alpha, s, rand_tensor({64, 32}, kBf, 43, -0.2, 0.2), p.l1,
                        gs, p.bias);
}

TEST(Svdquant, RecordAndReplay) {
  const Problem p = problem(3, 32, 64, 32, 51);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    run_every_op(p);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 3u);  // svdquant_linear's inner calls are not observed
  for (const auto& c : calls) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(replays_identically(c));
  }
}

TEST(Svdquant, DumpReplayPasses) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_svdq_rec_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const Problem p = problem(3, 32, 64, 32, 61);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  run_every_op(p);
  recorder::stop();
  std::vector<fs::path> calls;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) calls.push_back(e.path());
  }
  ASSERT_EQ(calls.size(), 3u);
  for (const auto& c : calls) {
    const replay::Result r = replay::replay_from_dump(c.string());
    EXPECT_EQ(r.status, replay::Status::kPassed) << c << ": " << r.error;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashinfer::testing
