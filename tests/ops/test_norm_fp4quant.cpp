// flashinfer.cute_dsl.rmsnorm_fp4quant / add_rmsnorm_fp4quant: hand-checked codes, the residual
// update bit for bit, the dequantized output against an fp64 RMSNorm (upstream's tiered check),
// agreement with fp4_quantize on the normalized rows (upstream's > 95 %), the scale layouts
// (swizzled, row-major, both), MXFP4, y_out, bad inputs, record / replay, and on CUDA upstream's
// Blackwell-only rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "api/device_props.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "kernels/quantization_params.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
#include "flashinfer/stream.h"
#include "kernels/cuda/norm_fp4quant_cuda.h"
#endif

namespace flashinfer::testing {
namespace {

constexpr DType kBf = DType::kBFloat16;
constexpr DType kF32 = DType::kFloat32;
constexpr const char* kAdd = "add_rmsnorm_fp4quant";

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.numel() * static_cast<int64_t>(dtype_size(c.dtype())));
}

TEST(NormFp4Quant, HandCheckedCodes) {
  // Rows of ones, weight 1: y = 1 / sqrt(1 + eps) ~ 1. gs = 1: sf = 1/6 -> e4m3 0.171875 (0x23),
  // q = y * 5.818 -> e2m1 6 (code 7). gs = 100: sf = 16.67 -> e4m3 16 (0x58), q = 6.25 -> 6.
  Tensor x = Tensor::full({2, 64}, 1.0, kBf), w = Tensor::full({64}, 1.0, kBf);
  auto [q1, s1, u1, b1] = rmsnorm_fp4quant(x, w);
  EXPECT_EQ(q1.dtype(), DType::kFloat4E2M1FNx2);
  EXPECT_EQ(q1.shape(), (Shape{2, 32}));
  EXPECT_EQ(s1.dtype(), DType::kFloat8E4M3FN);
  EXPECT_EQ(s1.shape(), (Shape{2, 4}));
  EXPECT_EQ(bytes(q1), std::vector<uint8_t>(64, 0x77));
  EXPECT_EQ(bytes(s1), std::vector<uint8_t>(8, 0x23));
  auto [q2, s2, u2, b2] =
      rmsnorm_fp4quant(x, w, std::nullopt, std::nullopt, Tensor::full({1}, 100.0, kF32));
  EXPECT_EQ(bytes(q2), std::vector<uint8_t>(64, 0x77));
  EXPECT_EQ(bytes(s2), std::vector<uint8_t>(8, 0x58));
  // Zeros: scale code 0, payload 0.
  auto [q3, s3, u3, b3] = rmsnorm_fp4quant(Tensor::zeros({1, 64}, kBf), w);
  EXPECT_EQ(bytes(q3), std::vector<uint8_t>(32, 0));
  EXPECT_EQ(bytes(s3), std::vector<uint8_t>(4, 0));
}

// fp64 RMSNorm of h (the input dtype's rounding of x + r), as upstream's reference.
std::vector<double> rms_reference(const std::vector<double>& h, const std::vector<double>& w,
                                  int64_t M, int64_t H, double eps) {
  std::vector<double> y(h.size());
  for (int64_t m = 0; m < M; ++m) {
    double ss = 0.0;
    for (int64_t j = 0; j < H; ++j) ss += h[m * H + j] * h[m * H + j];
    const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(H) + eps);
    for (int64_t j = 0; j < H; ++j) y[m * H + j] = h[m * H + j] * rstd * w[j];
  }
  return y;
}

// The dequantized payload: e2m1 * decode(scale) / gs (e4m3) or e2m1 * 2^(code - 127) (ue8m0).
std::vector<double> dequantize(const Tensor& q, const Tensor& sf, int64_t M, int64_t H, int bs,
                               bool ue8m0, double gs, bool swizzled) {
  const auto qb = bytes(q), sb = bytes(sf);
  std::vector<double> out(static_cast<size_t>(M * H));
  const int64_t nb = H / bs;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t j = 0; j < H; ++j) {
      const uint8_t byte = qb[m * (H / 2) + j / 2];
      const double v = e2m1_bits_to_float(j % 2 ? e2m1x2_high(byte) : e2m1x2_low(byte));
      const uint8_t code = sb[kernels::sf_offset(
          swizzled ? kernels::SfLayoutCode::k128x4 : kernels::SfLayoutCode::kLinear, m, j / bs,
          nb)];
      const double scale =
          ue8m0 ? std::ldexp(1.0, static_cast<int>(code) - 127) : e4m3fn_bits_to_float(code) / gs;
      out[m * H + j] = v * scale;
    }
  }
  return out;
}

// Upstream's tiered check: >= 99 % within |d| <= 0.5 or rel <= 0.3, all within 2.0 or 0.5.
::testing::AssertionResult tiered(const std::vector<double>& got, const std::vector<double>& ref,
                                  double scale) {
  size_t tight = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(got[i] - ref[i]) / scale,
                 rel = d / (std::fabs(ref[i]) / scale + 1e-12);
    if (d <= 0.5 || rel <= 0.3) ++tight;
    if (!(d <= 2.0 || rel <= 0.5)) {
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs " << ref[i];
    }
  }
  if (tight * 100 < got.size() * 99) {
    return ::testing::AssertionFailure() << tight << " of " << got.size() << " in the tight band";
  }
  return ::testing::AssertionSuccess();
}

TEST(AddNormFp4Quant, ResidualUpdateAndDequantizedOutput) {
  for (DType dt : {kBf, DType::kFloat16}) {
    for (int bs : {16, 32}) {
      const int64_t M = 37, H = 256;
      Tensor x = rand_tensor({M, H}, dt, 10 + bs), r = rand_tensor({M, H}, dt, 11 + bs);
      Tensor w = rand_tensor({H}, dt, 12 + bs, -2.0, 2.0);
      // h = x + r in the input dtype (upstream's residual, bit for bit).
      const auto xv = x.to_double_vector(), rv = r.to_double_vector();
      std::vector<double> h(xv.size());
      for (size_t i = 0; i < h.size(); ++i) h[i] = xv[i] + rv[i];
      const Tensor h_t = Tensor::from_vector(h, {M, H}, dt);
      const double gs = bs == 16 ? 50.0 : 1.0;
      auto [q, sf, un, both] = add_rmsnorm_fp4quant(x, r, w, std::nullopt, std::nullopt,
                                                    Tensor::full({1}, gs, kF32), 1e-6, bs);
      EXPECT_EQ(r.to_double_vector(), h_t.to_double_vector()) << dtype_label(dt) << bs;
      EXPECT_EQ(sf.dtype(), bs == 32 ? DType::kUInt8 : DType::kFloat8E4M3FN);
      const auto y = rms_reference(h_t.to_double_vector(), w.to_double_vector(), M, H, 1e-6);
      EXPECT_TRUE(tiered(dequantize(q, sf, M, H, bs, bs == 32, gs, false), y, 1.0))
          << dtype_label(dt) << " " << bs;
    }
  }
}

TEST(AddNormFp4Quant, AgreesWithFp4QuantizeOfTheNormalizedRows) {
  const int64_t M = 64, H = 512;
  Tensor x = rand_tensor({M, H}, kBf, 20), r = rand_tensor({M, H}, kBf, 21);
  Tensor w = rand_tensor({H}, kBf, 22, 0.5, 1.5);
  Tensor y_out = Tensor::zeros({M, H}, kBf);
  Tensor gs = Tensor::full({1}, 80.0, kF32);
  auto [q, sf, un, both] =
      add_rmsnorm_fp4quant(x, r, w, std::nullopt, std::nullopt, gs, 1e-6, 16, std::nullopt, false,
                           false, std::nullopt, std::nullopt, y_out);
  // y_out is y rounded to bf16; fp4_quantize of it gives the same bytes almost everywhere (the
  // fused op quantizes the fp32 y).
  auto [q2, sf2] = fp4_quantize(y_out, gs, 16, false, false);
  const auto a = bytes(q), b = bytes(q2), sa = bytes(sf), sb = bytes(sf2);
  size_t same = 0, same_sf = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  for (size_t i = 0; i < sa.size(); ++i) same_sf += sa[i] == sb[i];
  EXPECT_GT(same * 100, a.size() * 95);
  EXPECT_GT(same_sf * 100, sa.size() * 95);
  // y_out against fp64.
  const auto y = rms_reference(r.to_double_vector(), w.to_double_vector(), M, H, 1e-6);
  EXPECT_TRUE(all_close(y_out.to_double_vector(), y, default_tolerance(kBf)));
}

TEST(AddNormFp4Quant, ScaleLayoutsCarryTheSameCodes) {
  const int64_t M = 130, H = 192;  // a partial 128-row tile and 12 scale columns
  Tensor x = rand_tensor({M, H}, kBf, 30), r0 = rand_tensor({M, H}, kBf, 31);
  Tensor w = rand_tensor({H}, kBf, 32);
  Tensor r1 = r0.clone(), r2 = r0.clone();
  auto [q_lin, s_lin, u0, b0] = add_rmsnorm_fp4quant(x, r0, w);
  auto [q_swz, s_swz, u1, b1] = add_rmsnorm_fp4quant(x, r1, w, std::nullopt, std::nullopt,
                                                     std::nullopt, 1e-6, 16, std::nullopt, true);
  auto [q_both, s_both, u_both, is_both] = add_rmsnorm_fp4quant(
      x, r2, w, std::nullopt, std::nullopt, std::nullopt, 1e-6, 16, std::nullopt, false, true);
  EXPECT_TRUE(is_both);
  EXPECT_EQ(s_swz.shape(), (Shape{2 * 3 * 512}));
  EXPECT_EQ(bytes(q_swz), bytes(q_lin));
  EXPECT_EQ(bytes(q_both), bytes(q_lin));
  EXPECT_EQ(bytes(u_both), bytes(s_lin));
  const auto lin = bytes(s_lin), swz = bytes(s_swz), bsw = bytes(s_both);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < 12; ++b) {
      const int64_t o = kernels::sf_offset(kernels::SfLayoutCode::k128x4, m, b, 12);
      ASSERT_EQ(swz[o], lin[m * 12 + b]) << m << " " << b;
      ASSERT_EQ(bsw[o], lin[m * 12 + b]) << m << " " << b;
    }
  }
}

TEST(AddNormFp4Quant, ThreeDimensionalAndStridedResidual) {
  Tensor x = rand_tensor({2, 3, 64}, kBf, 40), w = rand_tensor({64}, kBf, 41);
  Tensor big = rand_tensor({2, 3, 128}, kBf, 42);
  Tensor r = big.slice(2, 0, 64);  // rows 128 apart: written in place through the stride
  Tensor r_c = r.contiguous();
  auto [q, sf, u, b] = add_rmsnorm_fp4quant(x, r, w);
  auto [q2, sf2, u2, b2] = add_rmsnorm_fp4quant(x, r_c, w);
  EXPECT_EQ(q.shape(), (Shape{2, 3, 32}));
  EXPECT_EQ(sf.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(bytes(q), bytes(q2));
  EXPECT_EQ(r.to_double_vector(), r_c.to_double_vector());
  // A residual whose rows are not evenly spaced is updated too (through a copy).
  Tensor r3 = rand_tensor({3, 2, 64}, kBf, 42).transpose(0, 1);
  Tensor r3_c = r3.contiguous();
  auto [q3, sf3, u3, b3] = add_rmsnorm_fp4quant(x, r3, w);
  auto [q4, sf4, u4, b4] = add_rmsnorm_fp4quant(x, r3_c, w);
  EXPECT_EQ(bytes(q3), bytes(q4));
  EXPECT_EQ(r3.to_double_vector(), r3_c.to_double_vector());
}

TEST(NormFp4QuantBadInput, ErrorsNameOpAndArgument) {
  Tensor x = rand_tensor({4, 64}, kBf, 50), w = rand_tensor({64}, kBf, 51);
  EXPECT_FI_ERROR(
      add_rmsnorm_fp4quant(x, x.clone(), w, std::nullopt, std::nullopt, std::nullopt, 1e-6, 24),
      kAdd, "block_size");
  Tensor x48 = rand_tensor({4, 48}, kBf, 52);
  EXPECT_FI_ERROR(add_rmsnorm_fp4quant(x48, x48.clone(), rand_tensor({48}, kBf, 1)), kAdd, "input");
  Tensor x80 = rand_tensor({4, 80}, kBf, 53);
  EXPECT_FI_ERROR(add_rmsnorm_fp4quant(x80, x80.clone(), rand_tensor({80}, kBf, 1), std::nullopt,
                                       std::nullopt, std::nullopt, 1e-6, 32),
                  kAdd, "input");  // 80 % 32
  EXPECT_FI_ERROR(add_rmsnorm_fp4quant(x, x.clone(), w, std::nullopt, std::nullopt, std::nullopt,
                                       1e-6, 16, std::string("fp8")),
                  kAdd, "scale_format");
  EXPECT_FI_ERROR(add_rmsnorm_fp4quant(x, x.clone(), w.to(DType::kFloat16)), kAdd, "weight");
  EXPECT_FI_ERROR(add_rmsnorm_fp4quant(x, x.slice(1, 0, 32).clone(), w), kAdd, "residual");
  EXPECT_FI_ERROR(add_rmsnorm_fp4quant(x, x.clone(), w, std::nullopt, std::nullopt,
                                       Tensor::full({2}, 1.0, kF32)),
                  kAdd, "global_scale");
  EXPECT_FI_ERROR(add_rmsnorm_fp4quant(x, x.clone(), w, Tensor::zeros({4, 64}, DType::kUInt8)),
                  kAdd, "y_fp4");
  EXPECT_FI_ERROR(
      add_rmsnorm_fp4quant(x, x.clone(), w, std::nullopt, Tensor::zeros({10}, DType::kUInt8),
                           std::nullopt, 1e-6, 16, std::nullopt, true),
      kAdd, "block_scale");
  EXPECT_FI_ERROR(rmsnorm_fp4quant(x.to(kF32), w), "rmsnorm_fp4quant", "input");
}

void run_norm_fp4_ops() {
  Tensor x = rand_tensor({3, 64}, kBf, 60), r = rand_tensor({3, 64}, kBf, 61);
  Tensor w = rand_tensor({64}, kBf, 62);
  (void)add_rmsnorm_fp4quant(x, r, w, std::nullopt, std::nullopt, Tensor::full({1}, 30.0, kF32),
                             1e-6, 16, std::nullopt, true, true);
  (void)rmsnorm_fp4quant(x, w, std::nullopt, std::nullopt, std::nullopt, 1e-5, 32);
}

TEST(NormFp4QuantReplay, RecordAndReplay) {
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    run_norm_fp4_ops();
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& c : calls) EXPECT_TRUE(replays_identically(c)) << c.name;
}

TEST(NormFp4QuantReplay, DumpReplayPasses) {
  EXPECT_EQ(dump_replay_all("norm_fp4", run_norm_fp4_ops), 2);
}

// ---- CUDA ---------------------------------------------------------------------------------------

Tensor cuda(const Tensor& t) { return to_keep_layout(t, Device::cuda(0)); }

// At least 99.9 % of the bytes equal: rstd may differ from the CPU's in its last bit, which can
// move a code across a rounding boundary.
bool mostly_equal(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return false;
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return same * 1000 >= a.size() * 999;
}

TEST(NormFp4QuantCuda, BlackwellMatchesCpuElsewhereRefusedByName) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int64_t M = 33, H = 2048;
  Tensor x = rand_tensor({M, H}, kBf, 70), r = rand_tensor({M, H}, kBf, 71);
  Tensor w = rand_tensor({H}, kBf, 72);
  Tensor gs = Tensor::full({1}, 60.0, kF32);
  Tensor dr = cuda(r);
  if (api::compute_capability(Device::cuda(0)) < 100) {
    EXPECT_FI_ERROR(
        add_rmsnorm_fp4quant(cuda(x), dr, cuda(w), std::nullopt, std::nullopt, cuda(gs)), kAdd,
        "input");
    return;
  }
  for (int bs : {16, 32}) {
    Tensor rc = r.clone(), rg = cuda(r);
    auto [qc, sc, uc, bc] = add_rmsnorm_fp4quant(x, rc, w, std::nullopt, std::nullopt, gs, 1e-6, bs,
                                                 std::nullopt, true);
    auto [qg, sg, ug, bg] = add_rmsnorm_fp4quant(cuda(x), rg, cuda(w), std::nullopt, std::nullopt,
                                                 cuda(gs), 1e-6, bs, std::nullopt, true);
    EXPECT_EQ(rg.to(Device::cpu()).to_double_vector(), rc.to_double_vector());
    EXPECT_TRUE(mostly_equal(bytes(qc), bytes(qg))) << bs;
    EXPECT_TRUE(mostly_equal(bytes(sc), bytes(sg))) << bs;  // the scales too
  }
}

#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
// The kernel itself on any GPU (the ops refuse below compute capability 10.0, as upstream, so on
// the Hopper machines this is what runs it): add_rmsnorm_fp4quant's parameters with both scale
// layouts and y_out, 130 rows (swizzle padding), e4m3 scales at block 16 and ue8m0 at block 32,
// against the CPU op byte for byte (a code may differ where rstd differs in its last bit).
TEST(NormFp4QuantCuda, KernelMatchesCpuOnAnyGpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int64_t M = 130, H = 256;
  Tensor x = rand_tensor({M, H}, kBf, 80), r = rand_tensor({M, H}, kBf, 81);
  Tensor w = rand_tensor({H}, kBf, 82);
  Tensor gs = Tensor::full({1}, 40.0, kF32);
  for (int bs : {16, 32}) {
    Tensor rc = r.clone(), yc = Tensor::zeros({M, H}, kBf);
    const NormFp4QuantOutput c =
        add_rmsnorm_fp4quant(x, rc, w, std::nullopt, std::nullopt, gs, 1e-6, bs, std::nullopt, true,
                             true, std::nullopt, std::nullopt, yc);
    Tensor dx = cuda(x), dr = cuda(r), dw = cuda(w), dgs = cuda(gs);
    Tensor dq = Tensor::zeros({M, H / 2}, DType::kUInt8, Device::cuda(0));
    Tensor dsf = Tensor::zeros({c.block_scale.numel()}, DType::kUInt8, Device::cuda(0));
    Tensor dlin = Tensor::zeros({M * (H / bs)}, DType::kUInt8, Device::cuda(0));
    Tensor dy = Tensor::zeros({M, H}, kBf, Device::cuda(0));
    kernels::NormFp4Params p;
    p.M = M, p.H = H, p.block_size = bs, p.dtype = kBf;
    p.input = dx.data_ptr(), p.in_stride = H;
    p.residual = dr.data_ptr(), p.res_stride = H;
    p.weight = dw.data_ptr();
    p.global_scale = dgs.data<float>();
    p.eps = 1e-6f;
    p.ue8m0 = bs == 32;
    p.y_fp4 = static_cast<uint8_t*>(dq.data_ptr());
    p.sf = static_cast<uint8_t*>(dsf.data_ptr());
    p.sf_layout = kernels::SfLayoutCode::k128x4;
    p.sf_linear = static_cast<uint8_t*>(dlin.data_ptr());
    p.y_out = dy.data_ptr();
    kernels::cuda::rmsnorm_fp4quant(p, current_cuda_stream(), false);
    EXPECT_EQ(dr.to(Device::cpu()).to_double_vector(), rc.to_double_vector()) << bs;
    EXPECT_TRUE(all_close(dy.to(Device::cpu()), yc, {0.0, 8e-3})) << bs;
    EXPECT_TRUE(mostly_equal(bytes(dq.to(Device::cpu())), bytes(c.y_fp4))) << bs;
    EXPECT_TRUE(mostly_equal(bytes(dsf.to(Device::cpu())), bytes(c.block_scale))) << bs;
    EXPECT_TRUE(mostly_equal(bytes(dlin.to(Device::cpu())), bytes(c.block_scale_unswizzled))) << bs;
  }
}
#endif

}  // namespace
}  // namespace flashinfer::testing
