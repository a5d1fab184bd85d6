// The fused DiT gate/residual LayerNorm ops: hand-checked golden rows, an fp64 formula over
// random WAN-shaped inputs (strided gate/scale/shift chunks, biases, input scale), every bad
// input, record/replay.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

constexpr int64_t H = 3072;

std::vector<double> values(const Tensor& t) {
  Tensor c = t.to(DType::kFloat64).contiguous();
  return std::vector<double>(c.data<double>(), c.data<double>() + c.numel());
}
Tensor f32(const std::vector<double>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::kFloat32);
}
double bf16_round(double x) {
  return bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(x)));
}

// [b, m, 6, H] temb; chunk i is the strided [b, m, H] view WAN passes.
Tensor temb(int64_t b, int64_t m, uint64_t seed) {
  return rand_tensor({b, m, 6, H}, DType::kBFloat16, seed, -0.5, 0.5);
}

TEST(DitNorm, Golden) {
  // x = +-1 (alternating), residual 0, gate 2 (+ no bias): r = +-2, mean 0, var 4,
  // norm = r / sqrt(4 + 1e-6) = +-0.99999988 -> bf16 +-1 (gamma 1, beta 0).
  std::vector<double> x(H), ones(H, 1.0), zeros(H, 0.0);
  for (int64_t c = 0; c < H; ++c) x[c] = c % 2 == 0 ? 1.0 : -1.0;
  Tensor in = Tensor::from_vector(x, {1, 1, H}, DType::kBFloat16);
  Tensor res = Tensor::zeros({1, 1, H}, DType::kBFloat16);
  Tensor t = Tensor::zeros({1, 1, 6, H}, DType::kBFloat16);
  t.select(2, 0).copy_(Tensor::full({1, 1, H}, 2.0, DType::kBFloat16));
  auto [r, n] =
      fused_dit_gate_residual_layernorm_gamma_beta(in, res, t.select(2, 0), f32(ones), f32(zeros));
  const auto rv = values(r), nv = values(n);
  for (int64_t c = 0; c < H; ++c) {
    ASSERT_EQ(rv[c], 2.0 * x[c]);
    ASSERT_EQ(nv[c], x[c]);
  }
  // A constant row: var 0, so norm = beta exactly (here 0.25); gate_bias -1 makes g' = 1.
  std::vector<double> quarter(H, 0.25);
  Tensor gb = Tensor::full({1, H}, -1.0, DType::kFloat32);
  auto [r2, n2] = fused_dit_gate_residual_layernorm_gamma_beta(
      Tensor::full({1, 1, H}, 3.0, DType::kBFloat16), res, t.select(2, 0), f32(ones), f32(quarter),
      gb);
  EXPECT_EQ(values(r2), std::vector<double>(H, 3.0));
  EXPECT_EQ(values(n2), quarter);
  // Scale/shift, no gate: x = +-1, residual 1 -> r = 2 / 0: mean 1, var 1, norm = +-1/sqrt(1 +
  // 1e-6) * (1 + 0.5) + 0.25 -> bf16(1.75) / bf16(-1.25) (scale 0.5, shift 0.25 in the chunks).
  t.select(2, 1).copy_(Tensor::full({1, 1, H}, 0.5, DType::kBFloat16));
  t.select(2, 2).copy_(Tensor::full({1, 1, H}, 0.25, DType::kBFloat16));
  auto [r3, n3] = fused_dit_residual_layernorm_scale_shift(
      in, t.select(2, 1), t.select(2, 2), Tensor::full({1, 1, H}, 1.0, DType::kBFloat16));
  const auto r3v = values(r3), n3v = values(n3);
  for (int64_t c = 0; c < H; ++c) {
    ASSERT_EQ(r3v[c], x[c] + 1.0);
    ASSERT_EQ(n3v[c], x[c] > 0 ? 1.75 : -1.25);
  }
}

// fp64 reference of the three ops; mode 0 residual/scale/shift, 1 gate/scale/shift, 2 gamma/beta.
void check_formula(int mode, const Tensor& in, const Tensor* res, const Tensor* gate,
                   const Tensor* scale, const Tensor* shift, const Tensor* gamma,
                   const Tensor* beta, const std::vector<double>& gb, const std::vector<double>& sb,
                   const std::vector<double>& shb, double in_scale, const Tensor& r_out,
                   const Tensor& n_out) {
  const int64_t rows = in.size(0) * in.size(1);
  const auto x = values(in), ro = values(r_out), no = values(n_out);
  const auto rs = res ? values(*res) : std::vector<double>(x.size(), 0.0);
  auto rows_of = [&](const Tensor* t) {
    return t ? values(t->reshape({rows, H})) : std::vector<double>();
  };
  const auto g = rows_of(gate), sc = rows_of(scale), sh = rows_of(shift);
  const auto ga = gamma ? values(*gamma) : std::vector<double>(),
             be = beta ? values(*beta) : std::vector<double>();
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<double> v(H);
    double mean = 0, sq = 0;
    for (int64_t c = 0; c < H; ++c) {
      const double gg = mode == 0 ? 1.0 : static_cast<float>(g[i * H + c] + gb[c]) * in_scale;
      v[c] = static_cast<float>(x[i * H + c] * static_cast<float>(gg) + rs[i * H + c]);
      ASSERT_NEAR(ro[i * H + c], bf16_round(v[c]), 0.0) << i << " " << c;
      mean += v[c];
    }
    mean /= H;
    for (int64_t c = 0; c < H; ++c) sq += (v[c] - mean) * (v[c] - mean);
    const double inv = 1.0 / std::sqrt(sq / H + 1e-6);
    for (int64_t c = 0; c < H; ++c) {
      double y = (v[c] - mean) * inv;
      y = mode == 2 ? y * ga[c] + be[c]
                    : y * (1.0 + (sc[i * H + c] + sb[c])) + (sh[i * H + c] + shb[c]);
      ASSERT_NEAR(no[i * H + c], y, 1.6e-2 * std::max(1.0, std::fabs(y))) << i << " " << c;
    }
  }
}

TEST(DitNorm, MatchesFp64Formula) {
  const int64_t b = 2, m = 3;
  Tensor in = rand_tensor({b, m, H}, DType::kBFloat16, 1, -2, 2);
  Tensor res = rand_tensor({b, m, H}, DType::kBFloat16, 2, -2, 2);
  Tensor te = temb(b, m, 3);
  Tensor gamma = rand_tensor({H}, DType::kFloat32, 4, 0.5, 1.5);
  Tensor beta = rand_tensor({H}, DType::kFloat32, 5, -0.5, 0.5);
  Tensor gb = rand_tensor({H}, DType::kFloat32, 6, -0.2, 0.2);
  Tensor sb = rand_tensor({1, H}, DType::kFloat32, 7, -0.2, 0.2);
  Tensor shb = rand_tensor({H}, DType::kFloat32, 8, -0.2, 0.2);
  const auto gbv = values(gb), sbv = values(sb), shbv = values(shb);
  const std::vector<double> zero(H, 0.0);
  Tensor gate = te.select(2, 2), scale = te.select(2, 4), shift = te.select(2, 3);
  {
    auto [r, n] = fused_dit_gate_residual_layernorm_gamma_beta(in, res, gate, gamma, beta, gb);
    check_formula(2, in, &res, &gate, nullptr, nullptr, &gamma, &beta, gbv, zero, zero, 1.0, r, n);
  }
  {
    // With an input scale and given outputs.
    Tensor ro = Tensor::empty({b, m, H}, DType::kBFloat16), no = ro.clone();
    auto [r, n] = fused_dit_gate_residual_layernorm_scale_shift(in, res, gate, scale, shift, gb, sb,
                                                                shb, 1e-6, false, false,
                                                                std::nullopt, f32({0.75}), ro, no);
    EXPECT_EQ(r.data_ptr(), ro.data_ptr());
    EXPECT_EQ(n.data_ptr(), no.data_ptr());
    check_formula(1, in, &res, &gate, &scale, &shift, nullptr, nullptr, gbv, sbv, shbv, 0.75, r, n);
  }
  {
    // No residual; 2-D [b * m, H] chunks with the 6 * H row stride.
    Tensor sc2 = te.reshape({b * m, 6, H}).select(1, 1),
           sh2 = te.reshape({b * m, 6, H}).select(1, 0);
    auto [r, n] =
        fused_dit_residual_layernorm_scale_shift(in, sc2, sh2, std::nullopt, std::nullopt, shb);
    Tensor s3 = te.select(2, 1), h3 = te.select(2, 0);
    check_formula(0, in, nullptr, nullptr, &s3, &h3, nullptr, nullptr, zero, zero, shbv, 1.0, r, n);
    // Contiguous copies of the chunks (as a recording may hold them) give the same bytes.
    auto [rc, nc] = fused_dit_residual_layernorm_scale_shift(in, s3.contiguous(), h3.contiguous(),
                                                             std::nullopt, std::nullopt, shb);
    EXPECT_EQ(values(nc), values(n));
    // The 3-D chunks give the same bytes.
    auto [r3, n3] =
        fused_dit_residual_layernorm_scale_shift(in, s3, h3, std::nullopt, std::nullopt, shb);
    EXPECT_EQ(values(n3), values(n));
  }
}

TEST(DitNorm, BadInput) {
  const char* gbo = "fused_dit_gate_residual_layernorm_gamma_beta";
  Tensor in = rand_tensor({1, 2, H}, DType::kBFloat16, 1);
  Tensor te = temb(1, 2, 2);
  Tensor g = te.select(2, 0);
  Tensor gamma = Tensor::full({H}, 1.0, DType::kFloat32),
         beta = Tensor::zeros({H}, DType::kFloat32);
  EXPECT_FI_ERROR(fused_dit_gate_residual_layernorm_gamma_beta(
                      rand_tensor({1, 2, 64}, DType::kBFloat16, 1), in, g, gamma, beta),
                  gbo, "input");
  EXPECT_FI_ERROR(
      fused_dit_gate_residual_layernorm_gamma_beta(in.to(DType::kFloat16), in, g, gamma, beta), gbo,
      "input");
  EXPECT_FI_ERROR(
      fused_dit_gate_residual_layernorm_gamma_beta(in, in.slice(1, 0, 1), g, gamma, beta), gbo,
      "residual");
  EXPECT_FI_ERROR(fused_dit_gate_residual_layernorm_gamma_beta(
                      in, in, te.select(2, 0).slice(1, 0, 1), gamma, beta),
                  gbo, "gate");
  EXPECT_FI_ERROR(
      fused_dit_gate_residual_layernorm_gamma_beta(in, in, te.select(3, 0), gamma, beta), gbo,
      "gate");
  EXPECT_FI_ERROR(
      fused_dit_gate_residual_layernorm_gamma_beta(in, in, g, gamma.to(DType::kBFloat16), beta),
      gbo, "gamma");
  EXPECT_FI_ERROR(
      fused_dit_gate_residual_layernorm_gamma_beta(in, in, g, gamma, beta.slice(0, 0, 8)), gbo,
      "beta");
  EXPECT_FI_ERROR(fused_dit_gate_residual_layernorm_gamma_beta(in, in, g, gamma, beta,
                                                               gamma.to(DType::kBFloat16)),
                  gbo, "gate_bias");
  EXPECT_FI_ERROR(fused_dit_gate_residual_layernorm_gamma_beta(in, in, g, gamma, beta, std::nullopt,
                                                               1e-6, true),
                  gbo, "global_scaling_factor");
  try {
    fused_dit_gate_residual_layernorm_gamma_beta(in, in, g, gamma, beta, std::nullopt, 1e-6, true,
                                                 false, f32({1.0}));
    ADD_FAILURE() << "NVFP4 output accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(e.arg(), "use_nvfp4");
  }
  EXPECT_FI_ERROR(fused_dit_gate_residual_layernorm_gamma_beta(in, in, g, gamma, beta, std::nullopt,
                                                               1e-6, false, true),
                  gbo, "use_mxfp8");
  EXPECT_FI_ERROR(
      fused_dit_gate_residual_layernorm_gamma_beta(in, in, g, gamma, beta, std::nullopt, 1e-6,
                                                   false, false, std::nullopt, f32({1, 2})),
      gbo, "input_global_scaling_factor");
  EXPECT_FI_ERROR(fused_dit_gate_residual_layernorm_gamma_beta(
                      in, in, g, gamma, beta, std::nullopt, 1e-6, false, false, std::nullopt,
                      std::nullopt, Tensor::empty({1, 2, H}, DType::kFloat32)),
                  gbo, "residual_out");
  const char* gss = "fused_dit_gate_residual_layernorm_scale_shift";
  EXPECT_FI_ERROR(fused_dit_gate_residual_layernorm_scale_shift(in, in, g, te.select(2, 1),
                                                                temb(2, 2, 3).select(2, 0)),
                  gss, "shift");
  const char* rss = "fused_dit_residual_layernorm_scale_shift";
  EXPECT_FI_ERROR(
      fused_dit_residual_layernorm_scale_shift(in, te.select(2, 1), te.select(2, 2), std::nullopt,
                                               Tensor::zeros({2, H}, DType::kFloat32)),
      rss, "scale_bias");
  EXPECT_FI_ERROR(fused_dit_residual_layernorm_scale_shift(
                      in, te.select(2, 1), te.select(2, 2), std::nullopt, std::nullopt,
                      std::nullopt, 1e-6, false, false, std::nullopt, std::nullopt, std::nullopt,
                      Tensor::empty({1, 2, H}, DType::kFloat16)),
                  rss, "norm_out");
}

TEST(DitNorm, RecordAndReplay) {
  Tensor in = rand_tensor({1, 2, H}, DType::kBFloat16, 1);
  Tensor res = rand_tensor({1, 2, H}, DType::kBFloat16, 2);
  Tensor te = temb(1, 2, 3);
  Tensor gamma = rand_tensor({H}, DType::kFloat32, 4, 0.5, 1.5);
  Tensor beta = rand_tensor({H}, DType::kFloat32, 5);
  Tensor ro = Tensor::empty({1, 2, H}, DType::kBFloat16), no = ro.clone();
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    fused_dit_gate_residual_layernorm_gamma_beta(in, res, te.select(2, 2), gamma, beta);
    fused_dit_gate_residual_layernorm_scale_shift(
        in, res, te.select(2, 2), te.select(2, 4), te.select(2, 3), std::nullopt,
        gamma.view({1, H}), std::nullopt, 1e-5, false, false, std::nullopt, f32({0.5}), ro, no);
    fused_dit_residual_layernorm_scale_shift(in, te.select(2, 1), te.select(2, 0), res);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 3u);
  for (const auto& c : calls) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(replays_identically(c));
  }
}

TEST(DitNorm, Backends) {
  for (const char* op : {"fused_dit_gate_residual_layernorm_gamma_beta",
                         "fused_dit_gate_residual_layernorm_scale_shift",
                         "fused_dit_residual_layernorm_scale_shift"}) {
    EXPECT_TRUE(op_has_backend(op, DeviceType::kCPU)) << op;
    EXPECT_EQ(op_has_backend(op, DeviceType::kCUDA), cuda_compiled()) << op;
  }
}

}  // namespace
}  // namespace flashinfer::testing
