// cutlass_fused_moe's FP8 paths (issue 19): FP8 per tensor (e4m3 input and weights, upstream's
// four quant_scales) and DeepSeek FP8 block scale (bf16 input quantized 1x128 inside, 128x128
// weight blocks). fp64 formulas with upstream's rounding points over a small grid (8 experts,
// top-2), hand-checked golden values (the fp8 rounding and saturation of the intermediate, the
// 1x128 scales), bad input naming the argument, record and replay (in memory and through a dump
// directory), the arithmetic shared with the CUDA kernels, and (MoeCudaFp8.*, skipped without a
// GPU) the CUDA kernels against the CPU reference.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

#if FLASHINFER_TEST_HAVE_CUDART
#include <cuda_runtime.h>

#include "api/device_props.h"
#include "kernels/cuda/grouped_gemm_cuda.h"
#include "kernels/cuda/moe_cuda.h"
#endif
#include "kernels/moe_cutlass_fp8_rules.h"

namespace flashinfer::testing {
namespace {

const char* kOp = "cutlass_fused_moe";

double round_as(DType dt, double v) {
  const float f = static_cast<float>(v);
  switch (dt) {
    case DType::kFloat16:
      return half_bits_to_float(float_to_half_bits(f));
    case DType::kBFloat16:
      return bfloat16_bits_to_float(float_to_bfloat16_bits(f));
    default:
      return f;
  }
}
// e4m3 with saturation (CUDA's cvt.rn.satfinite), from a float.
double e4m3_sat(float v) { return e4m3fn_bits_to_float(float_to_e4m3fn_bits(v, true)); }

bool gated(ActivationType a) {
  return a == ActivationType::Swiglu || a == ActivationType::SwigluBias ||
         a == ActivationType::SwigluStep || a == ActivationType::Geglu;
}
double silu(double x) { return x / (1.0 + std::exp(-x)); }

// The activation of one row in fp64 (up = first half, gate = second half for gated ones).
double act(ActivationType a, double up, double gate, double alpha, double beta, double limit) {
  switch (a) {
    case ActivationType::Swiglu:
      return silu(gate) * up;
    case ActivationType::SwigluBias: {
      const double g = std::min(gate, limit);
      return g / (1.0 + std::exp(-alpha * g)) * (std::clamp(up, -limit, limit) + beta);
    }
    case ActivationType::SwigluStep:
      return std::min(silu(gate), 7.0) * std::clamp(up, -7.0, 7.0);
    case ActivationType::Relu2:
      return std::max(up, 0.0) * std::max(up, 0.0);
    case ActivationType::Relu:
      return std::max(up, 0.0);
    case ActivationType::Identity:
      return up;
    default:
      ADD_FAILURE() << "activation not in the formula";
      return 0.0;
  }
}

struct Fp8Case {
  int64_t T = 6, H = 64, I = 32, E = 8, K = 2;
  bool block = false;  // DeepSeek FP8 block scale
  DType out_dt = DType::kBFloat16;
  ActivationType act = ActivationType::Swiglu;
  bool per_expert_fc2_quant = false;
  bool biases = false;
  bool swiglu_params = false;
  int64_t ep_size = 1, ep_rank = 0;
  int64_t tp_size = 1, tp_rank = 0;
  uint64_t seed = 1;
};

struct Fp8Inputs {
  Tensor x, ids, scales, w1, w2;
  std::vector<Tensor> quant_scales;
  std::optional<Tensor> b1, b2, alpha, beta, limit;
};

// Values on the e4m3 grid with magnitudes in [0.5, 2): fp8 x fp8 GEMM sums of such values are
// exact in fp32, so the CPU's accumulation order cannot move a rounding point.
Tensor grid_fp8(Shape shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) {
    const double m = static_cast<double>(8 + rng() % 8) / 8.0;  // 1.0 .. 1.875
    x = (rng() % 2 ? -1.0 : 1.0) * (rng() % 2 ? m : m / 2.0);
  }
  return Tensor::from_vector(v, std::move(shape), DType::kFloat8E4M3FN);
}

int64_t cdiv(int64_t a) { return (a + 127) / 128; }

Fp8Inputs make_inputs(const Fp8Case& c) {
  Fp8Inputs in;
  const int64_t N1 = gated(c.act) ? 2 * c.I : c.I;
  const int64_t global = c.E * c.ep_size;
  std::vector<double> ids;
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t e0 = (t * 3 + static_cast<int64_t>(c.seed)) % global;
    for (int64_t k = 0; k < c.K; ++k) ids.push_back(static_cast<double>((e0 + k * 5) % global));
  }
  in.ids = Tensor::from_vector(ids, {c.T, c.K}, DType::kInt32);
  in.scales = rand_tensor({c.T, c.K}, DType::kFloat32, c.seed + 1, 0.0, 1.0);
  in.w1 = grid_fp8({c.E, N1, c.H}, c.seed + 2);
  in.w2 = grid_fp8({c.E, c.H, c.I}, c.seed + 3);
  if (c.block) {
    in.x = rand_tensor({c.T, c.H}, DType::kBFloat16, c.seed, -3.0, 3.0);
    in.quant_scales = {
        rand_tensor({c.E, cdiv(N1), cdiv(c.H)}, DType::kFloat32, c.seed + 4, 0.05, 0.2),
        rand_tensor({c.E, cdiv(c.H), cdiv(c.I)}, DType::kFloat32, c.seed + 5, 0.05, 0.2)};
  } else {
    in.x = grid_fp8({c.T, c.H}, c.seed);
    const int64_t nq = c.per_expert_fc2_quant ? c.E : 1;
    Tensor q2 = rand_tensor({nq}, DType::kFloat32, c.seed + 5, 4.0, 16.0);
    in.quant_scales = {rand_tensor({c.E}, DType::kFloat32, c.seed + 4, 0.1, 0.4),
                       c.per_expert_fc2_quant ? q2 : q2.view({}),
                       rand_tensor({c.E}, DType::kFloat32, c.seed + 6, 0.005, 0.02),
                       Tensor::full({}, 0.02, DType::kFloat32)};
  }
  if (c.biases) {
    in.b1 = rand_tensor({c.E, N1}, c.out_dt, c.seed + 7, -0.5, 0.5);
    in.b2 = rand_tensor({c.E, c.H}, c.out_dt, c.seed + 8, -0.5, 0.5);
  }
  if (c.swiglu_params) {
    in.alpha = rand_tensor({c.E}, DType::kFloat32, c.seed + 9, 0.5, 2.0);
    in.beta = rand_tensor({c.E}, DType::kFloat32, c.seed + 10, 0.0, 1.0);
    in.limit = rand_tensor({c.E}, DType::kFloat32, c.seed + 11, 0.2, 0.6);
  }
  return in;
}

std::vector<Tensor> run(const Fp8Case& c, const Fp8Inputs& in,
                        std::optional<Tensor> output = std::nullopt) {
  return cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, c.out_dt, in.quant_scales, in.b1,
                           in.b2, std::nullopt, in.alpha, in.beta, in.limit, c.tp_size, c.tp_rank,
                           c.ep_size, c.ep_rank, 1, 0, output, false, c.block, false, false, false,
                           false, false, 8192, std::nullopt, c.act);
}

// Upstream's scale_1x128_kernel in the test's own words: per 128 values, quant = 448 / amax
// (1 when all zero), stored scale 1 / quant, values e4m3 with saturation.
void quant_1x128(const std::vector<double>& x, std::vector<double>& q, std::vector<double>& s) {
  const int64_t n = static_cast<int64_t>(x.size());
  q.assign(x.size(), 0.0);
  s.assign(static_cast<size_t>(cdiv(n)), 0.0);
  for (int64_t b = 0; b < cdiv(n); ++b) {
    float amax = 0.0f;
    for (int64_t j = b * 128; j < std::min(n, b * 128 + 128); ++j) {
      amax = std::max(amax, static_cast<float>(std::fabs(x[static_cast<size_t>(j)])));
    }
    const float quant = amax != 0.0f ? 448.0f / amax : 1.0f;
    s[static_cast<size_t>(b)] = 1.0f / quant;
    for (int64_t j = b * 128; j < std::min(n, b * 128 + 128); ++j) {
      q[static_cast<size_t>(j)] = e4m3_sat(static_cast<float>(x[static_cast<size_t>(j)]) * quant);
    }
  }
}

// One GEMM row in fp64: per tensor sum(a * w) * alpha (alpha applied in fp32 as the epilogue
// does); block scale sum over K blocks of float(sa * sb) * exact partial sum.
double gemm_row(const std::vector<double>& a, const std::vector<double>& as,
                const std::vector<double>& w, int64_t w_row, int64_t kdim, const float* ws,
                int64_t n_row_blocks_unused, float alpha, bool block) {
  (void)n_row_blocks_unused;
  if (!block) {
    double s = 0.0;
    for (int64_t j = 0; j < kdim; ++j) {
      s += a[static_cast<size_t>(j)] * w[static_cast<size_t>(w_row * kdim + j)];
    }
    return static_cast<float>(s) * alpha;
  }
  double acc = 0.0;
  for (int64_t b = 0; b < cdiv(kdim); ++b) {
    double part = 0.0;
    for (int64_t j = b * 128; j < std::min(kdim, b * 128 + 128); ++j) {
      part += a[static_cast<size_t>(j)] * w[static_cast<size_t>(w_row * kdim + j)];
    }
    const float sc = static_cast<float>(as[static_cast<size_t>(b)]) * ws[b];
    acc += static_cast<double>(sc) * part;
  }
  return acc;
}

// fp64 formula with upstream's rounding points (docs/MOE.md, "cutlass_fused_moe: FP8 paths").
std::vector<double> formula(const Fp8Case& c, const Fp8Inputs& in) {
  const auto x = in.x.to_double_vector(), w1 = in.w1.to_double_vector(),
             w2 = in.w2.to_double_vector(), sc = in.scales.to_double_vector(),
             ids = in.ids.to_double_vector();
  const auto vec = [](const std::optional<Tensor>& t) {
    return t ? t->to_double_vector() : std::vector<double>();
  };
  const auto b1 = vec(in.b1), b2 = vec(in.b2), al = vec(in.alpha), be = vec(in.beta),
             li = vec(in.limit);
  const int64_t I = c.I, H = c.H, N1 = gated(c.act) ? 2 * I : I;
  const float* qs0 = in.quant_scales[0].data<float>();
  const float* qs1 = in.quant_scales[1].data<float>();
  const DType mid = c.block ? DType::kBFloat16 : c.out_dt;
  std::vector<double> out(static_cast<size_t>(c.T * H), 0.0);
  for (int64_t t = 0; t < c.T; ++t) {
    std::vector<double> xr(x.begin() + t * H, x.begin() + (t + 1) * H), xs;
    if (c.block) quant_1x128(std::vector<double>(xr), xr, xs);
    for (int64_t k = 0; k < c.K; ++k) {
      const int64_t e =
          static_cast<int64_t>(ids[static_cast<size_t>(t * c.K + k)]) - c.ep_rank * c.E;
      if (e < 0 || e >= c.E) continue;
      std::vector<double> g(static_cast<size_t>(N1)), h(static_cast<size_t>(I)), hs;
      for (int64_t n = 0; n < N1; ++n) {
        const double v = gemm_row(xr, xs, w1, e * N1 + n, H,
                                  c.block ? qs0 + (e * cdiv(N1) + n / 128) * cdiv(H) : nullptr, 0,
                                  c.block ? 1.0f : qs0[e], c.block);
        g[static_cast<size_t>(n)] =
            round_as(mid, v) + (b1.empty() ? 0.0 : b1[static_cast<size_t>(e * N1 + n)]);
      }
      for (int64_t j = 0; j < I; ++j) {
        const double up = g[static_cast<size_t>(j)];
        const double gate = gated(c.act) ? g[static_cast<size_t>(I + j)] : up;
        const double a = act(c.act, up, gate, al.empty() ? 1.0 : al[static_cast<size_t>(e)],
                             be.empty() ? 0.0 : be[static_cast<size_t>(e)],
                             li.empty() ? 3.4e38 : static_cast<float>(li[static_cast<size_t>(e)]));
        if (c.block) {
          h[static_cast<size_t>(j)] = round_as(DType::kBFloat16, a);
        } else {
          const float q = qs1[c.per_expert_fc2_quant ? e : 0];
          h[static_cast<size_t>(j)] = e4m3_sat(static_cast<float>(a) * q);
        }
      }
      if (c.block) quant_1x128(std::vector<double>(h), h, hs);
      const float* d2 = c.block ? nullptr : in.quant_scales[2].data<float>();
      for (int64_t j = 0; j < H; ++j) {
        const double v = gemm_row(h, hs, w2, e * H + j, I,
                                  c.block ? qs1 + (e * cdiv(H) + j / 128) * cdiv(I) : nullptr, 0,
                                  c.block ? 1.0f : d2[e], c.block);
        const double y =
            round_as(c.out_dt, v) + (b2.empty() ? 0.0 : b2[static_cast<size_t>(e * H + j)]);
        out[static_cast<size_t>(t * H + j)] += sc[static_cast<size_t>(t * c.K + k)] * y;
      }
    }
  }
  return out;
}

// The scales above give outputs of order 1, so the output dtype's tolerance is a relative one
// (a test whose outputs all sit inside atol could not fail).
::testing::AssertionResult matches(const Tensor& got, const std::vector<double>& want, DType dt) {
  double m = 0.0;
  for (double v : want) m = std::max(m, std::fabs(v));
  if (m < 0.25) return ::testing::AssertionFailure() << "outputs too small to test: max " << m;
  return all_close(got, want, default_tolerance(dt));
}

// ---- formulas --------------------------------------------------------------------------------

TEST(CutlassFusedMoeFp8, PerTensorMatchesFormula) {
  int n = 0;
  for (DType out_dt : {DType::kBFloat16, DType::kFloat16}) {
    for (ActivationType a :
         {ActivationType::Swiglu, ActivationType::Relu2, ActivationType::SwigluStep}) {
      for (int variant = 0; variant < 2; ++variant) {
        Fp8Case c;
        c.out_dt = out_dt;
        c.act = a;
        c.per_expert_fc2_quant = variant == 1;
        c.biases = variant == 1;
        c.seed = static_cast<uint64_t>(++n);
        const Fp8Inputs in = make_inputs(c);
        EXPECT_TRUE(matches(run(c, in)[0], formula(c, in), out_dt))
            << dtype_label(out_dt) << " act " << static_cast<int>(a) << " variant " << variant;
      }
    }
  }
}

TEST(CutlassFusedMoeFp8, PerTensorSwigluBiasAndExpertParallel) {
  Fp8Case c;
  c.swiglu_params = true;  // Swiglu with alpha / beta / limit: upstream runs SwigluBias
  c.out_dt = DType::kFloat16;
  c.ep_size = 2;
  c.ep_rank = 1;
  c.seed = 21;
  const Fp8Inputs in = make_inputs(c);
  Fp8Case cb = c;
  cb.act = ActivationType::SwigluBias;
  EXPECT_TRUE(matches(run(c, in)[0], formula(cb, in), c.out_dt));
}

// Upstream's finalize adds the fc2 bias on tensor-parallel rank 0 only ("Only add bias on rank 0
// for tensor parallelism"; docs/MOE.md "Where the biases join"), b1 on every rank: on rank 1 of
// 2 the output does not depend on b2 and matches the formula without it; on rank 0 it does.
TEST(CutlassFusedMoeFp8, Fc2BiasOnTensorParallelRankZeroOnly) {
  for (bool block : {false, true}) {
    Fp8Case c;
    c.block = block;
    c.I = 128;
    c.biases = true;
    c.tp_size = 2;
    c.seed = 31;
    const Fp8Inputs in = make_inputs(c);
    Fp8Inputs no_b2 = in;
    no_b2.b2 = Tensor::zeros({c.E, c.H}, c.out_dt);
    c.tp_rank = 1;
    const auto r1 = run(c, in)[0].to_double_vector();
    EXPECT_EQ(r1, run(c, no_b2)[0].to_double_vector()) << block;
    EXPECT_TRUE(matches(Tensor::from_vector(r1, {c.T, c.H}, c.out_dt), formula(c, no_b2), c.out_dt))
        << block;
    c.tp_rank = 0;
    const auto r0 = run(c, in)[0].to_double_vector();
    EXPECT_NE(r0, r1) << block;
    EXPECT_TRUE(matches(Tensor::from_vector(r0, {c.T, c.H}, c.out_dt), formula(c, in), c.out_dt))
        << block;
  }
}

TEST(CutlassFusedMoeFp8, BlockScaleMatchesFormula) {
  int n = 0;
  for (int64_t I : {int64_t{128}, int64_t{160}}) {  // 160: partial last blocks of N and K
    for (ActivationType a : {ActivationType::Swiglu, ActivationType::Relu2}) {
      Fp8Case c;
      c.block = true;
      c.H = 256;
      c.I = I;
      c.T = 5;
      c.act = a;
      c.biases = I == 160;
      c.seed = static_cast<uint64_t>(40 + ++n);
      const Fp8Inputs in = make_inputs(c);
      EXPECT_TRUE(matches(run(c, in)[0], formula(c, in), c.out_dt))
          << "I " << I << " act " << static_cast<int>(a);
    }
  }
}

// ---- hand-checked golden values ----------------------------------------------------------------

// H = 2, I = 1, two experts, Swiglu. Expert 0: g1 = [1, 2] * 0.5 = [0.5, 1] (up, gate),
// silu(1) * 0.5 = 0.365529; * fc2_quant 2 = 0.731059 -> e4m3 0.75 (grid 0.6875, 0.75);
// y = [0.75, 1.5] * 0.25 = [0.1875, 0.375]. Expert 1: g1 = [2, 1] * 0.5 = [1, 0.5],
// silu(0.5) * 1 * 2 = 0.622459 -> e4m3 0.625; y = [-0.625, 0.625] * 0.25. Weights 0.25, 0.75:
// out = [0.046875 - 0.1171875, 0.09375 + 0.1171875] = [-0.0703125, 0.2109375] (bf16-exact).
TEST(CutlassFusedMoeFp8, GoldenPerTensorIntermediateRoundedToFp8) {
  const DType f8 = DType::kFloat8E4M3FN;
  Tensor x = Tensor::from_vector({1, 2}, {1, 2}, f8);
  Tensor ids = Tensor::from_vector({0, 1}, {1, 2}, DType::kInt32);
  Tensor sc = Tensor::from_vector({0.25, 0.75}, {1, 2}, DType::kFloat32);
  Tensor w1 = Tensor::from_vector({1, 0, 0, 1, /*e1*/ 0, 1, 1, 0}, {2, 2, 2}, f8);
  Tensor w2 = Tensor::from_vector({1, 2, /*e1*/ -1, 1}, {2, 2, 1}, f8);
  std::vector<Tensor> qs = {Tensor::from_vector({0.5, 0.5}, {2}, DType::kFloat32),
                            Tensor::full({}, 2.0, DType::kFloat32),
                            Tensor::from_vector({0.25, 0.25}, {2}, DType::kFloat32),
                            Tensor::full({}, 1.0, DType::kFloat32)};
  const auto r = cutlass_fused_moe(x, ids, sc, w1, w2, DType::kBFloat16, qs);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].dtype(), DType::kBFloat16);
  EXPECT_TRUE(all_close(r[0], {-0.0703125, 0.2109375}, {0, 0}));
  // Without the fp8 step the result would be [-0.0726, 0.2120]: the rounding is observable.
  // fc2_quant 2000 on expert 0 alone: 0.365529 * 2000 = 731 saturates to 448 (cvt.rn.satfinite;
  // a non-saturating cast would give NaN); y = 448 * [1, 2] / 1024 = [0.4375, 0.875].
  Tensor ids0 = Tensor::from_vector({0}, {1, 1}, DType::kInt32);
  Tensor sc1 = Tensor::from_vector({1}, {1, 1}, DType::kFloat32);
  qs[1] = Tensor::full({}, 2000.0, DType::kFloat32);
  qs[2] = Tensor::from_vector({1.0 / 1024, 1.0 / 1024}, {2}, DType::kFloat32);
  const auto s = cutlass_fused_moe(x, ids0, sc1, w1, w2, DType::kFloat16, qs);
  EXPECT_TRUE(all_close(s[0], {0.4375, 0.875}, {0, 0}));
}

// Block scale, H = 2 (one partial 1x128 block), I = 1, one expert. x = [1, -3]: amax 3,
// quant 448 / 3 = 149.333, codes [144 (grid 144, 160), -448], scale 1 / 149.333. With fc1 block
// scale 0.5: g1 = bf16([144, -448] / 149.333 * 0.5) = [0.482421875 (0.482143), -1.5];
// h = bf16(silu(-1.5) * 0.482421875) = bf16(-0.132009) = -0.1318359375; its block quantizes to
// exactly -448 with scale 0.1318359375 / 448, so with fc2 block scale 0.25 and w2 = [1, 2]:
// y = [-0.032958984375, -0.0659179688] (bf16-exact).
TEST(CutlassFusedMoeFp8, GoldenBlockScaleQuantizesActivations1x128) {
  const DType f8 = DType::kFloat8E4M3FN;
  Tensor x = Tensor::from_vector({1, -3}, {1, 2}, DType::kBFloat16);
  Tensor ids = Tensor::from_vector({0}, {1, 1}, DType::kInt32);
  Tensor sc = Tensor::from_vector({1}, {1, 1}, DType::kFloat32);
  Tensor w1 = Tensor::from_vector({1, 0, 0, 1}, {1, 2, 2}, f8);
  Tensor w2 = Tensor::from_vector({1, 2}, {1, 2, 1}, f8);
  std::vector<Tensor> qs = {Tensor::full({1, 1, 1}, 0.5, DType::kFloat32),
                            Tensor::full({1, 1, 1}, 0.25, DType::kFloat32)};
  const auto r = cutlass_fused_moe(x, ids, sc, w1, w2, DType::kBFloat16, qs, std::nullopt,
                                   std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                   std::nullopt, 1, 0, 1, 0, 1, 0, std::nullopt, false, true);
  EXPECT_TRUE(all_close(r[0], {-0.032958984375, -0.06591796875}, {0, 0}));
}

// ---- bad input -------------------------------------------------------------------------------

TEST(CutlassFusedMoeFp8, BadInput) {
  Fp8Case c;
  const Fp8Inputs in = make_inputs(c);
  auto call = [&](Fp8Inputs v, DType out_dt = DType::kBFloat16, bool w4 = false) {
    (void)cutlass_fused_moe(v.x, v.ids, v.scales, v.w1, v.w2, out_dt, v.quant_scales, v.b1, v.b2,
                            std::nullopt, std::nullopt, std::nullopt, std::nullopt, 1, 0, 1, 0, 1,
                            0, std::nullopt, false, false, w4);
  };
  auto with_scales = [&](std::vector<Tensor> qs) {
    Fp8Inputs v = in;
    v.quant_scales = std::move(qs);
    return v;
  };
  const auto& q = in.quant_scales;
  EXPECT_FI_ERROR(call(with_scales({q[0], q[1], q[2]})), kOp, "quant_scales");  // count
  EXPECT_FI_ERROR(call(with_scales({})), kOp, "quant_scales");                  // none
  // None (upstream's unquantized call) on the FP8 path: its scales are missing.
  EXPECT_FI_ERROR((void)cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, DType::kBFloat16,
                                          std::nullopt),
                  kOp, "quant_scales");
  EXPECT_FI_ERROR(call(with_scales({q[0].to(DType::kFloat16), q[1], q[2], q[3]})), kOp,
                  "quant_scales");  // dtype
  EXPECT_FI_ERROR(call(with_scales({q[0].slice(0, 0, 4), q[1], q[2], q[3]})), kOp,
                  "quant_scales");  // [E]
  EXPECT_FI_ERROR(call(with_scales({q[0], Tensor::full({3}, 1.0, DType::kFloat32), q[2], q[3]})),
                  kOp, "quant_scales");  // fc2_quant
  EXPECT_FI_ERROR(call(with_scales({q[0], q[1], q[2], q[3].view({1})})), kOp,
                  "quant_scales");  // 0-d
  EXPECT_FI_ERROR(call(with_scales({q[0], q[1], q[2], Tensor()})), kOp, "quant_scales");
  EXPECT_FI_ERROR(call(in, DType::kFloat32), kOp, "output_dtype");
  // use_w4_group_scaling selects nothing with e4m3 weights (upstream ignores it too).
  EXPECT_NO_THROW(call(in, DType::kBFloat16, true));
  Fp8Inputs w = in;
  w.w2 = in.w2.to(DType::kBFloat16);
  EXPECT_FI_ERROR(call(w), kOp, "fc2_expert_weights");
  w = in;
  w.b1 = Tensor::zeros({c.E, 2 * c.I}, DType::kFloat16);  // biases are of output_dtype
  w.b2 = Tensor::zeros({c.E, c.H}, DType::kBFloat16);
  EXPECT_FI_ERROR(call(w), kOp, "fc1_expert_biases");
  EXPECT_FI_ERROR((void)cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, DType::kBFloat16,
                                          in.quant_scales, std::nullopt, std::nullopt,
                                          Tensor::zeros({c.T, 4}, DType::kUInt8)),
                  kOp, "input_sf");

  // Block scale: bf16 input and output, two [E, ., .] fp32 block-scale tensors.
  Fp8Case cb;
  cb.block = true;
  cb.H = 256;
  cb.I = 128;
  const Fp8Inputs ib = make_inputs(cb);
  auto callb = [&](const Tensor& x, std::vector<Tensor> qs, DType out_dt = DType::kBFloat16) {
    (void)cutlass_fused_moe(x, ib.ids, ib.scales, ib.w1, ib.w2, out_dt, std::move(qs), std::nullopt,
                            std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 1,
                            0, 1, 0, 1, 0, std::nullopt, false, true);
  };
  const auto& s = ib.quant_scales;
  EXPECT_FI_ERROR(callb(ib.x, {s[0]}), kOp, "quant_scales");
  EXPECT_FI_ERROR(callb(ib.x, {s[0], s[1], s[1]}), kOp, "quant_scales");
  EXPECT_FI_ERROR(callb(ib.x, {s[1], s[0]}), kOp, "quant_scales");  // shapes swapped
  EXPECT_FI_ERROR(callb(ib.x, {s[0].to(DType::kBFloat16), s[1]}), kOp, "quant_scales");
  EXPECT_FI_ERROR(callb(ib.x.to(DType::kFloat16), s), kOp, "input");
  EXPECT_FI_ERROR(callb(ib.x, s, DType::kFloat16), kOp, "output_dtype");
  EXPECT_FI_ERROR(
      (void)cutlass_fused_moe(ib.x, ib.ids, ib.scales, ib.w1.to(DType::kBFloat16),
                              ib.w2.to(DType::kBFloat16), DType::kBFloat16, s, std::nullopt,
                              std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                              1, 0, 1, 0, 1, 0, std::nullopt, false, true),
      kOp, "use_deepseek_fp8_block_scale");
}

// ---- record and replay; the CUDA device --------------------------------------------------------

TEST(CutlassFusedMoeFp8, RecordAndReplay) {
  Fp8Case c;
  c.biases = true;
  const Fp8Inputs in = make_inputs(c);
  Fp8Case cb;
  cb.block = true;
  cb.H = 128;
  cb.I = 128;
  const Fp8Inputs ib = make_inputs(cb);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    (void)run(c, in);
    (void)run(cb, ib);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& call : calls) {
    ASSERT_TRUE(call.error.empty()) << call.error;
    const OpDecl* d = OpRegistry::global().find(call.name);
    ASSERT_NE(d, nullptr);
    std::vector<Value> args;
    for (const auto& a : call.inputs) args.push_back(snapshot(a));
    CallArgs bound(*d, std::move(args));
    EXPECT_TRUE(same_values(d->invoke(bound), call.result));
  }
}

// Through a dump directory (fp8 tensors and the quant_scales list in upstream's torch format):
// both calls replay and pass.
TEST(CutlassFusedMoeFp8, DumpReplay) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_moe_fp8_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg);
  Fp8Case c;
  c.per_expert_fc2_quant = true;
  const Fp8Inputs in = make_inputs(c);
  (void)run(c, in);
  Fp8Case cb;
  cb.block = true;
  cb.H = 128;
  cb.I = 128;
  const Fp8Inputs ib = make_inputs(cb);
  (void)run(cb, ib);
  recorder::stop();
  const auto results = replay::replay_sequence(dir.string());
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
    EXPECT_EQ(r.skipped_outputs, (std::vector<std::string>{"result__1", "result__2", "result__3"}));
  }
  fs::remove_all(dir);
}

// ---- the arithmetic the CPU reference and the CUDA kernels share ------------------------------

// kernels/moe_cutlass_fp8_rules.h: the 1x128 quantizer's scale and its stored inverse (1 / quant,
// one ulp above amax / 448 for this amax), the saturating e4m3 cast (RNE, ties to even), the
// block-scale promotion and the finalize step.
TEST(CutlassFusedMoeFp8, SharedRulesGolden) {
  using namespace kernels;
  EXPECT_EQ(moe_fp8_block_quant(448.0f), 1.0f);
  EXPECT_EQ(moe_fp8_block_quant(7.0f), 64.0f);
  EXPECT_EQ(moe_fp8_block_quant(0.0f), 1.0f);            // an all-zero block
  const float amax = std::bit_cast<float>(0x3fa66667u);  // 1.3000001
  const float quant = moe_fp8_block_quant(amax);
  EXPECT_EQ(std::bit_cast<uint32_t>(quant), 0x43ac4ec4u);  // 344.61536
  EXPECT_EQ(std::bit_cast<uint32_t>(moe_fp8_block_dequant(quant)), 0x3b3e2be4u);
  EXPECT_EQ(std::bit_cast<uint32_t>(amax / 448.0f), 0x3b3e2be3u);
  EXPECT_EQ(moe_e4m3_sat(0.731059f), 0.75f);
  EXPECT_EQ(moe_e4m3_sat(17.0f), 16.0f);  // halfway between 16 and 18: the even code
  EXPECT_EQ(moe_e4m3_sat(19.0f), 20.0f);
  EXPECT_EQ(moe_e4m3_sat(500.0f), 448.0f);
  EXPECT_EQ(moe_e4m3_sat(-1e9f), -448.0f);
  EXPECT_TRUE(std::isnan(moe_e4m3_sat(std::nanf(""))));
  EXPECT_EQ(moe_fp8_block_accumulate(1.0f, 0.5f, 0.25f, 8.0f), 2.0f);
  EXPECT_EQ(moe_fp8_finalize_step(1.0f, 0.5f, 3.0f, true, 1.0f), 3.0f);
  EXPECT_EQ(moe_fp8_finalize_step(1.0f, 0.5f, 3.0f, false, 100.0f), 2.5f);
}

// Integer values in [lo, hi] of dtype dt, as a double vector (to edit) or a tensor.
std::vector<double> int_values(int64_t n, uint64_t seed, int lo, int hi) {
  std::mt19937_64 rng(seed);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1));
  return v;
}
Tensor int_tensor(Shape shape, DType dt, uint64_t seed, int lo, int hi) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return Tensor::from_vector(int_values(n, seed, lo, hi), std::move(shape), dt);
}
// Powers of two 2^lo .. 2^hi.
Tensor pow2_tensor(Shape shape, uint64_t seed, int lo, int hi) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v = int_values(n, seed, lo, hi);
  for (double& x : v) x = std::ldexp(1.0, static_cast<int>(x));
  return Tensor::from_vector(v, std::move(shape), DType::kFloat32);
}

// Routing over the ep_size * E global experts with token 0 routed to experts of other ranks
// only (no local expert) and the others spread over all of them.
Tensor routing_ids(const Fp8Case& c) {
  const int64_t global = c.E * c.ep_size;
  std::vector<double> ids;
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t k = 0; k < c.K; ++k) {
      int64_t id = (t * 3 + k * 5 + static_cast<int64_t>(c.seed)) % global;
      if (t == 0) id = ((c.ep_rank + 1) % c.ep_size) * c.E + k % c.E;
      ids.push_back(static_cast<double>(id));
    }
  }
  return Tensor::from_vector(ids, {c.T, c.K}, DType::kInt32);
}

// Integer operands whose every fp32 sum is exact and power-of-two scales (per tensor), or
// (block scale) inputs whose 1x128 blocks each hold one 448 2^-s, s in {0, 1, 2} by token and
// block, the rest in [-1, 1] (the quantizer's scale 2^s: the codes the integers x 2^s, the
// dequantization scale 2^-s, both exact; a row's scale differs from its neighbours', so a scale
// read from the wrong row or block changes the output) with the weights zero in that column,
// GEMM1 rows at the start of each 128-wide block of inter zero
// and their fc1 bias 448 (the activation's blocks quantize with scale 1 too), power-of-two
// block scales: the CPU reference and the CUDA kernels differ only in summation order, which
// cannot change an exact sum, so they agree bit for bit. Non-gated activations only (the gated
// ones are checked within a bound below).
Fp8Inputs integer_inputs(const Fp8Case& c) {
  Fp8Inputs in;
  const int64_t N1 = gated(c.act) ? 2 * c.I : c.I, H = c.H, I = c.I, E = c.E;
  const DType f8 = DType::kFloat8E4M3FN;
  in.ids = routing_ids(c);
  in.scales = pow2_tensor({c.T, c.K}, c.seed + 1, -2, 1);
  in.b1 = int_tensor({E, N1}, c.out_dt, c.seed + 7, -2, 2);
  in.b2 = int_tensor({E, H}, c.out_dt, c.seed + 8, -3, 3);
  if (!c.block) {
    in.x = int_tensor({c.T, H}, f8, c.seed, -2, 2);
    in.w1 = int_tensor({E, N1, H}, f8, c.seed + 2, -2, 2);
    in.w2 = int_tensor({E, H, I}, f8, c.seed + 3, -2, 2);
    in.quant_scales = {pow2_tensor({E}, c.seed + 4, -2, 0),
                       c.per_expert_fc2_quant ? pow2_tensor({E}, c.seed + 5, -1, 1)
                                              : Tensor::full({}, 0.5, DType::kFloat32),
                       pow2_tensor({E}, c.seed + 6, -6, -4),
                       Tensor::full({}, 1.0, DType::kFloat32)};
    return in;
  }
  std::vector<double> x = int_values(c.T * H, c.seed, -1, 1);
  std::vector<double> w1 = int_values(E * N1 * H, c.seed + 2, -1, 1);
  std::vector<double> b1 = in.b1->to_double_vector();
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t j = 0; j < H; j += 128) {
      x[static_cast<size_t>(t * H + j)] = std::ldexp(448.0, -static_cast<int>((t + j / 128) % 3));
    }
  }
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t n = 0; n < N1; ++n) {
      for (int64_t j = 0; j < H; ++j) {
        if (j % 128 == 0 || (n < I && n % 128 == 0))
          w1[static_cast<size_t>((e * N1 + n) * H + j)] = 0;
      }
    }
    for (int64_t n = 0; n < I; n += 128) b1[static_cast<size_t>(e * N1 + n)] = 448;
  }
  in.x = Tensor::from_vector(x, {c.T, H}, DType::kBFloat16);
  in.w1 = Tensor::from_vector(w1, {E, N1, H}, f8);
  in.b1 = Tensor::from_vector(b1, {E, N1}, c.out_dt);
  in.w2 = int_tensor({E, H, I}, f8, c.seed + 3, -1, 1);
  in.quant_scales = {pow2_tensor({E, cdiv(N1), cdiv(H)}, c.seed + 4, -2, 0),
                     pow2_tensor({E, cdiv(H), cdiv(I)}, c.seed + 5, -2, 0)};
  return in;
}

std::string label(const Fp8Case& c) {
  return std::string(c.block ? "block" : "per-tensor") + " E " + std::to_string(c.E) + " K " +
         std::to_string(c.K) + " ep " + std::to_string(c.ep_rank) + "/" +
         std::to_string(c.ep_size) + " H " + std::to_string(c.H) + " I " + std::to_string(c.I) +
         " " + std::string(dtype_label(c.out_dt)) + " act " +
         std::to_string(static_cast<int>(c.act));
}

// Shapes: experts, top-k, local expert offsets (ep ranks), H / I with partial 128-blocks.
std::vector<Fp8Case> cuda_cases(bool block) {
  std::vector<Fp8Case> v;
  // Per tensor: decode-sized (GEMV route); 5 pairs per local expert (grouped route); inter 40, not
  // a multiple of 16 (GEMV route even when the grouped one is forced); 300 pairs over 8 local
  // experts of 16 (grouped route).
  const int64_t shapes[][7] = {// E, K, ep_size, ep_rank, T, H, I
                               {8, 2, 2, 1, 9, 64, 32},
                               {3, 3, 1, 0, 5, 96, 48},
                               {4, 1, 3, 2, 12, 32, 160},
                               {2, 2, 1, 0, 6, 48, 40},
                               {8, 2, 2, 1, 150, 64, 32}};
  // Block scale: H 200 (GEMV route: rows not of 16-byte multiples); H 144 (grouped route with a
  // partial last k block in GEMM1 and the gather's scales, a partial n block in GEMM2); 150 rows
  // an expert (a second 128-row m tile: the a scales of rows past the first tile).
  const int64_t block_shapes[][7] = {{8, 2, 2, 1, 9, 256, 128},
                                     {3, 3, 1, 0, 5, 200, 160},
                                     {4, 1, 3, 2, 12, 128, 288},
                                     {3, 3, 1, 0, 5, 144, 160},
                                     {2, 2, 1, 0, 150, 128, 128}};
  int n = 0;
  for (int i = 0; i < 5; ++i) {
    const int64_t* s = block ? block_shapes[i] : shapes[i];
    for (ActivationType a : {ActivationType::Relu, ActivationType::Identity}) {
      for (DType out_dt : {DType::kBFloat16, DType::kFloat16}) {
        if (block && out_dt != DType::kBFloat16) continue;  // the block-scale path writes bf16
        Fp8Case c;
        c.block = block;
        c.E = s[0];
        c.K = s[1];
        c.ep_size = s[2];
        c.ep_rank = s[3];
        c.T = s[4];
        c.H = s[5];
        c.I = s[6];
        c.act = a;
        c.out_dt = out_dt;
        c.biases = true;
        c.per_expert_fc2_quant = n % 2 == 1;
        c.seed = static_cast<uint64_t>(100 + ++n);
        v.push_back(c);
      }
    }
  }
  return v;
}

// The CUDA tests' integer operands (MoeCudaFp8.*BitExactOnIntegerOperands) keep every fp32 sum
// exact: the CPU reference equals the fp64 formula rounded to the output dtype bit for bit (a sum
// that rounded could differ), the block-scale ones with quantizer scales of 1. The CUDA tests'
// guard on the reference (more than one row of non-zero outputs) is checked here too, so a case
// whose routing leaves a single local token fails without a GPU.
TEST(CutlassFusedMoeFp8, CudaTestIntegerOperandsAreExactOnCpu) {
  for (bool block : {false, true}) {
    for (const Fp8Case& c : cuda_cases(block)) {
      const Fp8Inputs in = integer_inputs(c);
      std::vector<double> want = formula(c, in);
      for (double& v : want) v = round_as(c.out_dt, v);
      const Tensor got = run(c, in)[0];
      EXPECT_TRUE(all_close(got, want, {0, 0})) << label(c);
      const auto r = got.to_double_vector();
      EXPECT_GT(std::count_if(r.begin(), r.end(), [](double v) { return v != 0.0; }), c.H)
          << label(c);
    }
  }
}

#if FLASHINFER_TEST_HAVE_CUDART
// ---- CUDA against the CPU reference ------------------------------------------------------------

namespace moe_cuda = kernels::cuda;

Fp8Inputs to_cuda(const Fp8Inputs& in) {
  const Device d = Device::cuda(0);
  Fp8Inputs g = in;
  g.x = in.x.to(d);
  g.ids = in.ids.to(d);
  g.scales = in.scales.to(d);
  g.w1 = in.w1.to(d);
  g.w2 = in.w2.to(d);
  for (auto& t : g.quant_scales) t = t.to(d);
  for (auto* t : {&g.b1, &g.b2, &g.alpha, &g.beta, &g.limit}) {
    if (*t) *t = (*t)->to(d);
  }
  return g;
}

// The block-scale path runs on sm90 only (upstream's refusal elsewhere).
bool block_scale_runs_here() {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major == 9 && minor == 0;
}

// Runs the case on CUDA with the route forced (0 auto, 1 GEMV, 2 grouped where eligible);
// `grouped` gets whether the grouped route ran (and the test fails unless one route ran).
Tensor run_cuda(const Fp8Case& c, const Fp8Inputs& g, int force = 0, bool* grouped = nullptr) {
  moe_cuda::set_cutlass_moe_route(force);
  const moe_cuda::CutlassMoeCudaStats s0 = moe_cuda::cutlass_moe_cuda_stats();
  Tensor out = run(c, g)[0].to(Device::cpu());
  moe_cuda::set_cutlass_moe_route(0);
  const moe_cuda::CutlassMoeCudaStats s1 = moe_cuda::cutlass_moe_cuda_stats();
  EXPECT_EQ(s1.grouped_runs - s0.grouped_runs + s1.gemv_runs - s0.gemv_runs, 1u);
  if (grouped) *grouped = s1.grouped_runs == s0.grouped_runs + 1;
  return out;
}

// Whether the grouped route takes the case, per tensor or block scale (moe_grouped_plan.h: e4m3
// rows of 16-byte multiples; auto also needs two pairs per local expert, counted over every
// rank's experts).
bool grouped_route(const Fp8Case& c, int force) {
  if (force == 1 || c.H % 16 != 0 || c.I % 16 != 0) return false;
  return force == 2 || c.T * c.K >= 2 * c.E * c.ep_size;
}

// On an sm_90 device of a build with CUTLASS the grouped route's two GEMMs run CUTLASS's e4m3
// grouped GEMM where the output is bf16 (one alpha per expert,
// kernels/cuda/grouped_gemm_cutlass.cuh), the mma.sync kernel for fp16: the route counters say
// which. CUTLASS's FP8 wgmma keeps about 14 significant bits inside a 128-deep k tile before
// adding into fp32: GEMM1's sums here (|x w1| <= 4, at most 96 terms) stay exact, but GEMM2's a
// operand is the e4m3 activation (codes from 2^-3 to 448), whose tile sums can lose low bits
// before the bf16 rounding. So on that route the output is held to two bf16 ulps (and most
// elements still bit for bit), everywhere else to the bit.
TEST(MoeCudaFp8, PerTensorBitExactOnIntegerOperands) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
#if FLASHINFER_TEST_HAVE_CUTLASS
  const bool cutlass = api::compute_capability(Device::cuda(0)) == 90;
#else
  const bool cutlass = false;
#endif
  for (const Fp8Case& c : cuda_cases(false)) {
    const Fp8Inputs in = integer_inputs(c);
    const Tensor ref = run(c, in)[0];
    const Fp8Inputs g = to_cuda(in);
    for (int force : {0, 1, 2}) {
      bool grouped = false;
      const moe_cuda::GroupedMmRoutes r0 = moe_cuda::grouped_mm_routes();
      const Tensor got = run_cuda(c, g, force, &grouped);
      const moe_cuda::GroupedMmRoutes r1 = moe_cuda::grouped_mm_routes();
      const bool on_cutlass = grouped && cutlass && c.out_dt == DType::kBFloat16;
      EXPECT_EQ(r1.cutlass - r0.cutlass, on_cutlass ? 2u : 0u) << label(c) << ", force " << force;
      EXPECT_EQ(grouped, grouped_route(c, force)) << label(c) << ", force " << force;
      if (!on_cutlass) {
        EXPECT_TRUE(all_close(got, ref, {0, 0})) << label(c) << ", force " << force;
        continue;
      }
      const auto gv = got.to_double_vector(), rv = ref.to_double_vector();
      double scale = 0.0;
      for (double v : rv) scale = std::max(scale, std::abs(v));
      EXPECT_TRUE(all_close(got, ref, {std::ldexp(scale, -10), std::ldexp(1.0, -7)}))
          << label(c) << ", force " << force;
      std::size_t same = 0;
      for (std::size_t i = 0; i < gv.size(); ++i) same += gv[i] == rv[i];
      EXPECT_GE(2 * same, gv.size()) << label(c) << ", force " << force << ": " << same << " of "
                                     << gv.size() << " bit for bit";
    }
    // Not all zero: the case exercises the GEMMs; token 0, routed to no local expert when there
    // are other ranks, is zero.
    const auto r = ref.to_double_vector();
    EXPECT_GT(std::count_if(r.begin(), r.end(), [](double v) { return v != 0.0; }), c.H)
        << label(c);
    if (c.ep_size > 1) {
      for (int64_t j = 0; j < c.H; ++j) EXPECT_EQ(r[static_cast<size_t>(j)], 0.0) << label(c);
    }
  }
}

// On sm90 the block-scale path matches the CPU bit for bit on both routes (the grouped one on the
// block-scaled mma.sync GEMM, twice a call: never CUTLASS's, which has no block scales; H 200 is
// not a multiple of 16, so that case stays on the GEMV route); elsewhere the call is refused as
// upstream refuses it (kUnsupported naming the flag). Either way the case runs (gpu-check counts
// a skipped CUDA case as a failure).
TEST(MoeCudaFp8, BlockScaleBitExactOnIntegerOperandsOrRefusedOffSm90) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  // The mma.sync kernel, whatever the run exported (CUTLASS's block-scaled route has its own test).
  const testing::ScopedEnv no_cutlass_block("FLASHINFER_MOE_FP8_BLOCK_CUTLASS", nullptr);
  if (!block_scale_runs_here()) {
    Fp8Case c;
    c.block = true;
    c.H = c.I = 128;
    const Fp8Inputs g = to_cuda(make_inputs(c));
    EXPECT_FI_ERROR((void)run(c, g), kOp, "use_deepseek_fp8_block_scale");
    try {
      (void)run(c, g);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    }
    return;
  }
  for (const Fp8Case& c : cuda_cases(true)) {
    const Fp8Inputs in = integer_inputs(c);
    const Tensor ref = run(c, in)[0];
    const Fp8Inputs g = to_cuda(in);
    for (int force : {1, 2}) {
      bool grouped = false;
      const moe_cuda::GroupedMmRoutes r0 = moe_cuda::grouped_mm_routes();
      const Tensor got = run_cuda(c, g, force, &grouped);
      const moe_cuda::GroupedMmRoutes r1 = moe_cuda::grouped_mm_routes();
      EXPECT_EQ(grouped, grouped_route(c, force)) << label(c) << ", force " << force;
      EXPECT_EQ(r1.mma - r0.mma, grouped ? 2u : 0u) << label(c) << ", force " << force;
      EXPECT_EQ(r1.cutlass, r0.cutlass) << label(c) << ", force " << force;
      EXPECT_TRUE(all_close(got, ref, {0, 0})) << label(c) << ", force " << force;
    }
    const auto r = ref.to_double_vector();
    EXPECT_GT(std::count_if(r.begin(), r.end(), [](double v) { return v != 0.0; }), c.H)
        << label(c);
  }
}

// FLASHINFER_MOE_FP8_BLOCK_CUTLASS=1 (sm_90, a build with CUTLASS): the grouped route's GEMMs run
// CUTLASS's block-scaled grouped GEMM (kernels/cuda/grouped_gemm_cutlass_fp8_block.cu), the
// cases' partial last n and k blocks (hidden 144, inter 160 and 288) included; the route counters
// say which kernel ran. CUTLASS's FP8 wgmma sums a 128-deep k block with about 14 significant bits
// before the block's scales and the fp32 accumulator, so the output is held to
// PerTensorBitExactOnIntegerOperands' bound against the CPU (and to the bit where no CUTLASS GEMM
// ran), and random operands to the output dtype's tolerance of the fp64 formula.
TEST(MoeCudaFp8, BlockScaleOnCutlassWhereItFits) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  if (!block_scale_runs_here()) GTEST_SKIP() << "the block-scale path runs on sm_90 only";
#if FLASHINFER_TEST_HAVE_CUTLASS
  constexpr bool kCutlass = true;
#else
  constexpr bool kCutlass = false;
#endif
  const testing::ScopedEnv on("FLASHINFER_MOE_FP8_BLOCK_CUTLASS", "1");
  const testing::ScopedEnv cutlass_on("FLASHINFER_GROUPED_MM_CUTLASS", nullptr);
  int cutlass_gemms = 0;
  // The cases of the block-scale test, and one whose GEMMs both have two n blocks and two k
  // blocks (only there do the weights' k-major scales differ from an n-major reading, and each
  // row's scales span two k blocks), with rows enough for two m tiles.
  std::vector<Fp8Case> cases = cuda_cases(true);
  Fp8Case big;
  big.block = true;
  big.E = 2;
  big.K = 2;
  big.T = 140;
  big.H = big.I = 256;
  big.act = ActivationType::Relu;
  big.biases = true;
  big.seed = 333;
  cases.push_back(big);
  for (const Fp8Case& c : cases) {
    if (!grouped_route(c, 2)) continue;
    const Fp8Inputs in = integer_inputs(c);
    const Tensor ref = run(c, in)[0];
    const Fp8Inputs g = to_cuda(in);
    // Both GEMMs of the grouped route (rows of 16-byte multiples), partial blocks included.
    const uint64_t want = kCutlass ? 2 : 0;
    const moe_cuda::GroupedMmRoutes r0 = moe_cuda::grouped_mm_routes();
    bool grouped = false;
    const Tensor got = run_cuda(c, g, 2, &grouped);
    const moe_cuda::GroupedMmRoutes r1 = moe_cuda::grouped_mm_routes();
    EXPECT_TRUE(grouped) << label(c);
    EXPECT_EQ(r1.cutlass - r0.cutlass, want) << label(c);
    EXPECT_EQ(r1.mma - r0.mma, 2 - want) << label(c);
    cutlass_gemms += static_cast<int>(want);
    double scale = 0.0;
    for (double v : ref.to_double_vector()) scale = std::max(scale, std::abs(v));
    const Tolerance tol =
        want > 0 ? Tolerance{std::ldexp(scale, -10), std::ldexp(1.0, -7)} : Tolerance{0, 0};
    EXPECT_TRUE(all_close(got, ref, tol)) << label(c);
  }
  EXPECT_EQ(cutlass_gemms > 0, kCutlass) << "no case reached the CUTLASS route";
  // Random operands: DeepSeek's gated SwiGLU (GEMM1 n = 2 I), two experts' worth of rows each.
  Fp8Case c;
  c.block = true;
  c.H = 256;
  c.I = 128;
  c.T = 40;
  c.seed = 321;
  const Fp8Inputs in = make_inputs(c);
  const Fp8Inputs g = to_cuda(in);
  const moe_cuda::GroupedMmRoutes r0 = moe_cuda::grouped_mm_routes();
  bool grouped = false;
  const Tensor got = run_cuda(c, g, 2, &grouped);
  EXPECT_TRUE(grouped);
  EXPECT_EQ(moe_cuda::grouped_mm_routes().cutlass - r0.cutlass, kCutlass ? 2u : 0u);
  EXPECT_TRUE(matches(got, formula(c, in), c.out_dt));
  EXPECT_TRUE(all_close(got, run(c, in)[0], default_tolerance(c.out_dt)));
}

// Random operands (the formula tests' cases: gated activations, SwiGLU parameters, biases,
// per-expert fc2_quant, an EP rank): CUDA within the output dtype's tolerance of the fp64 formula
// (the test the CPU reference passes) and of the CPU reference (the activation's exp and the
// summation order may move a rounding point by one unit). Block scale on sm90 only.
TEST(MoeCudaFp8, RandomOperandsWithinBound) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const bool block_runs = block_scale_runs_here();
  int n = 0;
  for (bool block : {false, true}) {
    if (block && !block_runs) continue;
    for (ActivationType a :
         {ActivationType::Swiglu, ActivationType::SwigluStep, ActivationType::Relu2}) {
      for (int variant = 0; variant < 2; ++variant) {
        Fp8Case c;
        c.block = block;
        if (block) {
          c.H = 256;
          c.I = variant == 0 ? 128 : 160;
          c.T = 5;
        }
        c.act = a;
        c.out_dt = block || variant == 0 ? DType::kBFloat16 : DType::kFloat16;
        c.per_expert_fc2_quant = variant == 1;
        c.biases = variant == 1;
        c.swiglu_params = variant == 1 && a == ActivationType::Swiglu;
        c.ep_size = variant == 1 ? 2 : 1;
        c.ep_rank = variant == 1 ? 1 : 0;
        c.seed = static_cast<uint64_t>(200 + ++n);
        const Fp8Inputs in = make_inputs(c);
        Fp8Case cf = c;
        if (c.swiglu_params) cf.act = ActivationType::SwigluBias;
        const Tensor ref = run(c, in)[0];
        const Fp8Inputs g = to_cuda(in);
        for (int force : {1, 2}) {  // both routes (H 64 / 256, I 32 / 128 / 160: grouped-eligible)
          bool grouped = false;
          const Tensor got = run_cuda(c, g, force, &grouped);
          EXPECT_EQ(grouped, force == 2) << label(c);
          EXPECT_TRUE(matches(got, formula(cf, in), c.out_dt)) << label(c) << ", force " << force;
          EXPECT_TRUE(all_close(got, ref, default_tolerance(c.out_dt)))
              << label(c) << ", force " << force;
        }
      }
    }
  }
}

// FLASHINFER_MOE_GROUPED=0 keeps a prefill-sized batch (16 pairs an expert) on the GEMV route,
// which the default sends to the grouped one; both match the CPU bit for bit on integer operands.
TEST(MoeCudaFp8, EnvironmentKeepsTheGemvRoute) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  Fp8Case c;
  c.T = 64;
  ASSERT_TRUE(grouped_route(c, 0));
  const Fp8Inputs in = integer_inputs(c);
  const Tensor ref = run(c, in)[0];
  const Fp8Inputs g = to_cuda(in);
  for (const char* v : {static_cast<const char*>(nullptr), "0"}) {
    const testing::ScopedEnv env("FLASHINFER_MOE_GROUPED", v);
    bool grouped = false;
    const moe_cuda::GroupedMmRoutes r0 = moe_cuda::grouped_mm_routes();
    const Tensor got = run_cuda(c, g, 0, &grouped);
    const bool on_cutlass = moe_cuda::grouped_mm_routes().cutlass != r0.cutlass;
    EXPECT_EQ(grouped, v == nullptr) << (v ? "FLASHINFER_MOE_GROUPED=0" : "default");
    // CUTLASS's grouped GEMM (the default route's GEMMs on sm_90) rounds its epilogue its own way
    // (PerTensorBitExactOnIntegerOperands' bound); the GEMV and mma.sync kernels match bit for bit.
    double scale = 0.0;
    for (double x : ref.to_double_vector()) scale = std::max(scale, std::abs(x));
    const Tolerance tol =
        on_cutlass ? Tolerance{std::ldexp(scale, -10), std::ldexp(1.0, -7)} : Tolerance{0, 0};
    EXPECT_FALSE(on_cutlass && v != nullptr) << "FLASHINFER_MOE_GROUPED=0 ran CUTLASS";
    EXPECT_TRUE(all_close(got, ref, tol)) << (v ? "FLASHINFER_MOE_GROUPED=0" : "default");
  }
}

// Once the stream's scratch is large enough, 100 calls of one shape allocate no scratch, on each
// route.
TEST(MoeCudaFp8, NoScratchAllocationOnceWarm) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (int route : {0, 1, 2, 3}) {  // per tensor GEMV, grouped; block scale GEMV, grouped
    const bool block = route >= 2;
    if (block && !block_scale_runs_here()) continue;
    Fp8Case c;
    c.block = block;
    c.T = 32;
    c.H = block ? 256 : 64;
    c.I = 128;
    const Fp8Inputs g = to_cuda(make_inputs(c));
    Tensor out = Tensor::empty({c.T, c.H}, c.out_dt, Device::cuda(0));
    const bool grouped = route == 1 || route == 3;
    moe_cuda::set_cutlass_moe_route(grouped ? 2 : 1);
    (void)run(c, g, out);
    const moe_cuda::CutlassMoeCudaStats s0 = moe_cuda::cutlass_moe_cuda_stats();
    for (int i = 0; i < 100; ++i) (void)run(c, g, out);
    const moe_cuda::CutlassMoeCudaStats s1 = moe_cuda::cutlass_moe_cuda_stats();
    moe_cuda::set_cutlass_moe_route(0);
    EXPECT_EQ(s1.scratch_allocs, s0.scratch_allocs) << route;
    EXPECT_EQ(grouped ? s1.grouped_runs - s0.grouped_runs : s1.gemv_runs - s0.gemv_runs, 100u)
        << route;
  }
}
#endif  // FLASHINFER_TEST_HAVE_CUDART

// ---- a dump written by Python in upstream's format, as vLLM calls the op -----------------------

// vLLM's FlashInferExperts.apply (docs/MOE.md [vllm-fp8]) and SGLang's flashinfer_cutlass
// runner ([sglang-fp8]) pass every argument by keyword:
// FP8 per tensor with quant_scales [g1_alphas, a2_gscale (0-d), g2_alphas, a1_scale (0-d)] and
// e4m3 hidden states; the block-scale path with bf16 hidden states and [w1_scale, w2_scale].
// Expected outputs computed by torch in fp32 at upstream's rounding points; fp8 tensors pickled
// as torch >= 2.1 does (the machine's torch 1.13 has no float8). The list result is result__0..
const char* const kFp8Calls = R"PY(
import torch.nn.functional as F
torch.manual_seed(0)
T, K, E = 4, 2, 8
def grid_codes(shape):  # e4m3 codes of +-[0.5, 2): exact fp32 GEMM sums
    e = torch.randint(6, 8, shape); m = torch.randint(0, 8, shape); s = torch.randint(0, 2, shape)
    return ((s << 7) | (e << 3) | m).to(torch.uint8)
def val(c):
    return E4M3[c.long()]
def fp8(v):  # e4m3 value of fp32 v: RNE, saturating at 448 (cvt.rn.satfinite)
    a = POS8[rne(v.abs().clamp(max=448.0), POS8)]
    return torch.where(v < 0, -a, a)
def tmeta(t, key, dtype=None):
    return {"type": "torch.Tensor", "shape": list(t.shape), "dtype": dtype or str(t.dtype),
            "stride": list(t.stride()), "device": "cuda:0", "requires_grad": False,
            "is_contiguous": True, "tensor_key": key}
def rec(name, inputs, meta, out):
    seq[0] += 1
    call = "%s/20261123_090000_%03d_pid4242_%s_call%04d" % (d, seq[0], name, seq[0])
    os.makedirs(call)
    save(inputs, call + "/inputs.pt")
    save({"result__0": out}, call + "/outputs.pt")
    r = {"function_name": name, "module": "flashinfer.fused_moe.core", "call_sequence": seq[0],
         "timestamp": "20261123_090000_%03d" % seq[0], "process_id": 4242,
         "input_metadata": meta, "output_metadata": {},
         "tensor_info": {"input_tensor_keys": list(inputs), "output_tensor_keys": ["result__0"]},
         "tensor_format": "torch", "execution_status": "completed"}
    with open(call + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(r) + "\n")
import os
ids = torch.tensor([[1, 6], [0, 3], [7, 2], [5, 4]], dtype=torch.int32)
rw = torch.tensor([[0.75, 0.25], [0.5, 0.5], [0.625, 0.375], [0.875, 0.125]])
SWIGLU = {"type": "enum", "name": "ActivationType.Swiglu", "value": 3}
BF16 = {"type": "torch.dtype", "value": "torch.bfloat16"}
def common(qs, block):
    m = {"kwarg_output_dtype": BF16, "kwarg_input_sf": None, "kwarg_tp_size": 1,
         "kwarg_tp_rank": 0, "kwarg_ep_size": 1, "kwarg_ep_rank": 0,
         "kwarg_activation_type": SWIGLU, "kwarg_use_deepseek_fp8_block_scale": block,
         "kwarg_quant_scales": {"type": "list", "length": len(qs), "truncated": False,
                                "items": [tmeta(q, "kwarg_quant_scales__%d" % i)
                                          for i, q in enumerate(qs)]}}
    return m

# 1. FP8 per tensor.
H, I = 64, 32
xq, w1q, w2q = grid_codes((T, H)), grid_codes((E, 2 * I, H)), grid_codes((E, H, I))
g1a = torch.rand(E) * 0.3 + 0.1
a2g = torch.tensor(8.0)
g2a = torch.rand(E) * 0.015 + 0.005
a1s = torch.tensor(0.02)
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        e = int(ids[t, k])
        g = ((val(xq[t]) @ val(w1q[e]).T) * g1a[e]).bfloat16().float()
        h = fp8(F.silu(g[I:]) * g[:I] * a2g)
        out[t] += rw[t, k] * ((h @ val(w2q[e]).T) * g2a[e]).bfloat16().float()
qs = [g1a, a2g, g2a, a1s]
inp = {"kwarg_input": ("fp8", xq), "kwarg_token_selected_experts": ids,
       "kwarg_token_final_scales": rw, "kwarg_fc1_expert_weights": ("fp8", w1q),
       "kwarg_fc2_expert_weights": ("fp8", w2q), "kwarg_output": torch.zeros(T, H).bfloat16()}
for i, q in enumerate(qs):
    inp["kwarg_quant_scales__%d" % i] = q
rec("cutlass_fused_moe", inp, common(qs, False), out.bfloat16())

# 1b. The same layer as SGLang's flashinfer_cutlass runner calls it (x quantized with
# quant_scales[3] by the caller, tune_max_num_tokens, enable_alltoall, use_fused_finalize), with
# a per-expert fc2 quant scale.
a2e = torch.rand(E) * 8 + 4
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        e = int(ids[t, k])
        g = ((val(xq[t]) @ val(w1q[e]).T) * g1a[e]).bfloat16().float()
        h = fp8(F.silu(g[I:]) * g[:I] * a2e[e])
        out[t] += rw[t, k] * ((h @ val(w2q[e]).T) * g2a[e]).bfloat16().float()
qs = [g1a, a2e, g2a, a1s]
for i, q in enumerate(qs):
    inp["kwarg_quant_scales__%d" % i] = q
m = common(qs, False)
del m["kwarg_use_deepseek_fp8_block_scale"]
m.update({"kwarg_tune_max_num_tokens": 4, "kwarg_enable_alltoall": False,
          "kwarg_use_fused_finalize": False})
rec("cutlass_fused_moe", inp, m, out.bfloat16())

# 2. DeepSeek FP8 block scale: 128x128 weight blocks, the input quantized 1x128 inside.
H, I = 128, 128
xb = (torch.randn(T, H) * 2).bfloat16()
w1q, w2q = grid_codes((E, 2 * I, H)), grid_codes((E, H, I))
s1 = torch.rand(E, 2, 1) * 0.15 + 0.05
s2 = torch.rand(E, 1, 1) * 0.15 + 0.05
def q1x128(v):  # upstream's scale_1x128_kernel: quant 448 / amax, stored 1 / quant
    amax = v.abs().max()
    quant = (torch.tensor(448.0) / amax) if amax != 0 else torch.tensor(1.0)
    return fp8(v * quant), torch.tensor(1.0) / quant
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        e = int(ids[t, k])
        xv, xs = q1x128(xb[t].float())
        part = xv @ val(w1q[e]).T
        g = torch.cat([(xs * s1[e, 0, 0]) * part[:128], (xs * s1[e, 1, 0]) * part[128:]])
        h = (F.silu(g.bfloat16().float()[I:]) * g.bfloat16().float()[:I]).bfloat16().float()
        hv, hs = q1x128(h)
        out[t] += rw[t, k] * ((hs * s2[e, 0, 0]) * (hv @ val(w2q[e]).T)).bfloat16().float()
qs = [s1, s2]
inp = {"kwarg_input": xb, "kwarg_token_selected_experts": ids, "kwarg_token_final_scales": rw,
       "kwarg_fc1_expert_weights": ("fp8", w1q), "kwarg_fc2_expert_weights": ("fp8", w2q),
       "kwarg_output": torch.zeros(T, H).bfloat16()}
for i, q in enumerate(qs):
    inp["kwarg_quant_scales__%d" % i] = q
rec("cutlass_fused_moe", inp, common(qs, True), out.bfloat16())
)PY";

TEST(CutlassFusedMoeFp8, TorchWrittenDumpsReplay) {
  std::vector<replay::Result> results;
  if (!run_upstream_dump_script("fi_moe_fp8_dumps", kFp8Calls, 3, &results)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
  for (const auto& r : results) {
    ASSERT_FALSE(r.comparisons.empty());
    EXPECT_EQ(r.comparisons[0].key, "result__0");
  }
}

}  // namespace
}  // namespace flashinfer::testing
