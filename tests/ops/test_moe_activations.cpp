// cutlass_fused_moe's GegluTanh (8) and Situ (10) activations (docs/MOE.md "Activation math"):
// hand-checked golden values (the gate/up halves among them), an fp64 formula over dtypes with
// default and per-expert Situ parameters, bad inputs, the trtllm-gen refusals, record-and-replay
// in memory and through a dump directory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

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

// fp64 forms of the two activations (gate g, up u).
double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)));
}
double situ(double g, double u, double beta, double linear_beta) {
  return beta * std::tanh(g / beta) / (1.0 + std::exp(-g)) * linear_beta *
         std::tanh(u / linear_beta);
}

struct Case {
  int64_t T = 6, H = 16, I = 8, E = 4, K = 2;
  DType dt = DType::kFloat32;
  ActivationType act = ActivationType::GegluTanh;
  bool situ_params = false;  // per-expert situ_beta / situ_linear_beta
  bool biases = false;
  uint64_t seed = 1;
};

struct Inputs {
  Tensor x, ids, scales, w1, w2;
  std::optional<Tensor> b1, b2;
  CutlassFusedMoeOptions options;
};

Inputs make_inputs(const Case& c) {
  Inputs in;
  const int64_t N1 = 2 * c.I;  // both activations are gated
  // Wide inputs so that the tanh caps of small Situ betas are reached.
  in.x = rand_tensor({c.T, c.H}, c.dt, c.seed, -1.5, 1.5);
  std::vector<double> ids;
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t k = 0; k < c.K; ++k) {
      ids.push_back(static_cast<double>((t * 3 + static_cast<int64_t>(c.seed) + k) % c.E));
    }
  }
  in.ids = Tensor::from_vector(ids, {c.T, c.K}, DType::kInt32);
  in.scales = rand_tensor({c.T, c.K}, DType::kFloat32, c.seed + 1, 0.0, 1.0);
  in.w1 = rand_tensor({c.E, N1, c.H}, c.dt, c.seed + 2, -0.6, 0.6);
  in.w2 = rand_tensor({c.E, c.H, c.I}, c.dt, c.seed + 3, -0.4, 0.4);
  if (c.biases) {
    in.b1 = rand_tensor({c.E, N1}, c.dt, c.seed + 4, -0.5, 0.5);
    in.b2 = rand_tensor({c.E, c.H}, c.dt, c.seed + 5, -0.5, 0.5);
  }
  if (c.situ_params) {
    in.options.situ_beta = rand_tensor({c.E}, DType::kFloat32, c.seed + 6, 0.3, 1.0);
    in.options.situ_linear_beta = rand_tensor({c.E}, DType::kFloat32, c.seed + 7, 0.3, 1.0);
  }
  return in;
}

// The rounding points of docs/MOE.md: GEMM1 output and activation in the input dtype, GEMM2
// output in the output dtype (= input dtype here), fp64 weighted sum over k. The biases join the
// rounded GEMM outputs (upstream's doActivationKernel / finalizeMoeRoutingKernel; before
// session 12 this formula added them before the rounding, as the kernel then did).
std::vector<double> formula(const Case& c, const Inputs& in) {
  const auto x = in.x.to_double_vector(), w1 = in.w1.to_double_vector(),
             w2 = in.w2.to_double_vector(), sc = in.scales.to_double_vector(),
             ids = in.ids.to_double_vector();
  const std::vector<double> b1 = in.b1 ? in.b1->to_double_vector() : std::vector<double>();
  const std::vector<double> b2 = in.b2 ? in.b2->to_double_vector() : std::vector<double>();
  const std::vector<double> sb =
      in.options.situ_beta ? in.options.situ_beta->to_double_vector() : std::vector<double>();
  const std::vector<double> sl = in.options.situ_linear_beta
                                     ? in.options.situ_linear_beta->to_double_vector()
                                     : std::vector<double>();
  const int64_t I = c.I, H = c.H, N1 = 2 * I;
  std::vector<double> out(static_cast<size_t>(c.T * H), 0.0);
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t k = 0; k < c.K; ++k) {
      const auto e = static_cast<int64_t>(ids[static_cast<size_t>(t * c.K + k)]);
      std::vector<double> g(static_cast<size_t>(N1)), h(static_cast<size_t>(I));
      for (int64_t n = 0; n < N1; ++n) {
        double s = 0.0;
        for (int64_t j = 0; j < H; ++j) {
          s += x[static_cast<size_t>(t * H + j)] * w1[static_cast<size_t>((e * N1 + n) * H + j)];
        }
        g[static_cast<size_t>(n)] =
            round_as(c.dt, s) + (b1.empty() ? 0.0 : b1[static_cast<size_t>(e * N1 + n)]);
      }
      for (int64_t j = 0; j < I; ++j) {
        const double u = g[static_cast<size_t>(j)], gt = g[static_cast<size_t>(I + j)];
        double v = 0.0;
        if (c.act == ActivationType::GegluTanh) {
          v = gelu_tanh(gt) * u;
        } else {
          v = situ(gt, u, sb.empty() ? 4.0 : sb[static_cast<size_t>(e)],
                   sl.empty() ? 25.0 : sl[static_cast<size_t>(e)]);
        }
        h[static_cast<size_t>(j)] = round_as(c.dt, v);
      }
      for (int64_t j = 0; j < H; ++j) {
        double s = 0.0;
        for (int64_t i = 0; i < I; ++i) {
          s += h[static_cast<size_t>(i)] * w2[static_cast<size_t>((e * H + j) * I + i)];
        }
        out[static_cast<size_t>(t * H + j)] +=
            sc[static_cast<size_t>(t * c.K + k)] *
            (round_as(c.dt, s) + (b2.empty() ? 0.0 : b2[static_cast<size_t>(e * H + j)]));
      }
    }
  }
  return out;
}

std::vector<Tensor> run(const Case& c, const Inputs& in) {
  return cutlass_fused_moe(in.x, in.ids, in.scales, in.w1, in.w2, c.dt, {}, in.b1, in.b2,
                           std::nullopt, std::nullopt, std::nullopt, std::nullopt, 1, 0, 1, 0, 1, 0,
                           std::nullopt, false, false, false, false, false, false, false, 8192,
                           std::nullopt, c.act, true, true, std::nullopt, std::nullopt, in.options);
}

// One token, one expert, H = 2, I = 1. w1 rows [up; gate] pick up = x0 = 1, gate = x1 = 2;
// w2 = (1, 0.5). Values computed by hand in fp64 (Python's math module); a kernel that swapped
// the halves would read gate = 1, up = 2 and give other numbers.
Inputs golden_inputs() {
  Inputs in;
  in.x = Tensor::from_vector({1.0, 2.0}, {1, 2}, DType::kFloat32);
  in.ids = Tensor::from_vector({0}, {1, 1}, DType::kInt32);
  in.scales = Tensor::from_vector({1.0}, {1, 1}, DType::kFloat32);
  in.w1 = Tensor::from_vector({1.0, 0.0, 0.0, 1.0}, {1, 2, 2}, DType::kFloat32);
  in.w2 = Tensor::from_vector({1.0, 0.5}, {1, 2, 1}, DType::kFloat32);
  return in;
}

TEST(MoeActivations, GoldenGegluTanh) {
  Case c;
  c.act = ActivationType::GegluTanh;
  // 0.5 * 2 * (1 + tanh(0.7978845608 * 2 * (1 + 0.044715 * 4))) * 1
  const double h = 1.954597694087775;
  EXPECT_TRUE(all_close(run(c, golden_inputs())[0], std::vector<double>{h, 0.5 * h}, {1e-6, 1e-6}));
}

TEST(MoeActivations, GoldenSitu) {
  Case c;
  c.act = ActivationType::Situ;
  // Defaults: 4 tanh(2 / 4) sigmoid(2) * 25 tanh(1 / 25).
  const double h = 1.6272579888236705;
  EXPECT_TRUE(all_close(run(c, golden_inputs())[0], std::vector<double>{h, 0.5 * h}, {1e-6, 1e-6}));
  // Per-expert beta 1, linear_beta 0.5: tanh(2) sigmoid(2) * 0.5 tanh(2), both caps engaged.
  Inputs in = golden_inputs();
  in.options.situ_beta = Tensor::from_vector({1.0}, {1}, DType::kFloat32);
  in.options.situ_linear_beta = Tensor::from_vector({0.5}, {1}, DType::kFloat32);
  const double hp = 0.40928401894524397;
  EXPECT_TRUE(all_close(run(c, in)[0], std::vector<double>{hp, 0.5 * hp}, {1e-6, 1e-6}));
}

TEST(MoeActivations, MatchesFormula) {
  uint64_t seed = 40;
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (ActivationType act : {ActivationType::GegluTanh, ActivationType::Situ}) {
      for (bool params : {false, true}) {
        if (act == ActivationType::GegluTanh && params) continue;
        Case c;
        c.dt = dt;
        c.act = act;
        c.situ_params = params;
        c.seed = ++seed;
        c.biases = seed % 2 == 0;
        SCOPED_TRACE(std::string(dtype_label(dt)) + " " + std::string(activation_type_name(act)) +
                     (params ? " per-expert" : ""));
        const Inputs in = make_inputs(c);
        EXPECT_TRUE(all_close(run(c, in)[0], formula(c, in), default_tolerance(dt)));
      }
    }
  }
}

TEST(MoeActivations, BadInput) {
  const char* op = "cutlass_fused_moe";
  Case c;
  c.act = ActivationType::Situ;
  Inputs in = make_inputs(c);
  in.options.situ_beta = Tensor::zeros({c.E + 1}, DType::kFloat32);
  EXPECT_FI_ERROR((void)run(c, in), op, "situ_beta");
  in.options.situ_beta = std::nullopt;
  in.options.situ_linear_beta = Tensor::zeros({c.E}, DType::kFloat16);
  EXPECT_FI_ERROR((void)run(c, in), op, "situ_linear_beta");
  // The Situ parameters with another activation: refused, naming them.
  Case g = c;
  g.act = ActivationType::GegluTanh;
  in.options.situ_linear_beta = Tensor::zeros({c.E}, DType::kFloat32);
  EXPECT_FI_ERROR((void)run(g, in), op, "situ_linear_beta");
  // Gated: w1 must be [E, 2 I, H].
  Inputs half = make_inputs(g);
  half.w1 = rand_tensor({c.E, c.I, c.H}, c.dt, 3);
  EXPECT_FI_ERROR((void)run(g, half), op, "fc1_expert_weights");
}

// The trtllm-gen ops keep refusing both: GegluTanh has no kernel there (upstream raises), and
// Situ's SiTuGlu epilogue lives in cubins.
TEST(MoeActivations, TrtllmRefusesBoth) {
  for (int64_t act : {int64_t{8}, int64_t{10}}) {
    SCOPED_TRACE(act);
    try {
      (void)trtllm_bf16_moe(
          rand_tensor({4, 16}, DType::kFloat32, 3), std::nullopt,
          rand_tensor({4, 8}, DType::kBFloat16, 5), rand_tensor({16, 8, 8}, DType::kBFloat16, 6),
          rand_tensor({16, 8, 4}, DType::kBFloat16, 7), 16, 2, std::nullopt, std::nullopt, 4, 0, 16,
          std::nullopt, 1, false, WeightLayout::MajorK, true, false, 8192, act);
      ADD_FAILURE() << "expected a refusal";
    } catch (const Error& e) {
      EXPECT_EQ(e.arg(), "activation_type") << e.what();
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    }
  }
}

// ClampedRelu2 (upstream 0.7.4, ActivationType 12, cutlass_fused_moe only; non-gated):
// h = (L tanh(relu(a) / L))^2 with L = clamped_relu2_limit[0], fused into GEMM1's epilogue (no
// rounding of GEMM1's output first). Hand-checked: x = (1, 2), w1 = (1, 1) gives a = 3; L = 2:
// (2 tanh(1.5))^2 = 3.2771734443054057 (Python's math module); w2 = (1, 0.5). Then bf16 layers
// against the fp64 formula, the refusals with upstream's texts, and what its other 0.7.4
// keywords take (backend "cutlass"; nvfp4_4over6 only on NVFP4 x NVFP4; PowLU not here).
TEST(MoeActivations, ClampedRelu2AsUpstream) {
  Case c;
  c.act = ActivationType::ClampedRelu2;
  c.dt = DType::kBFloat16;  // upstream runs it on BF16 x BF16 (or MXFP8) only
  Inputs in;
  in.x = Tensor::from_vector({1.0, 2.0}, {1, 2}, DType::kBFloat16);
  in.ids = Tensor::from_vector({0}, {1, 1}, DType::kInt32);
  in.scales = Tensor::from_vector({1.0}, {1, 1}, DType::kFloat32);
  in.w1 = Tensor::from_vector({1.0, 1.0}, {1, 1, 2}, DType::kBFloat16);
  in.w2 = Tensor::from_vector({1.0, 0.5}, {1, 2, 1}, DType::kBFloat16);
  in.options.clamped_relu2_limit = Tensor::from_vector({2.0}, {1}, DType::kFloat32);
  // 3.2771734443054057 in bf16 is 3.28125 (1 + 82 / 128, times 2); halved exactly.
  EXPECT_TRUE(all_close(run(c, in)[0], std::vector<double>{3.28125, 1.640625}, {0, 0}));
  EXPECT_FALSE(is_gated_activation(ActivationType::ClampedRelu2));
  EXPECT_TRUE(is_gated_activation(ActivationType::PowLU));
  // bf16 layers: GEMM1 in fp32, the activation and GEMM2 rounded to bf16, the fp64 sum.
  Case b;
  b.act = ActivationType::ClampedRelu2;
  b.dt = DType::kBFloat16;
  b.H = 32;
  b.I = 16;
  Inputs bi;
  bi.x = rand_tensor({b.T, b.H}, b.dt, 51, -1.5, 1.5);
  std::vector<double> ids;
  for (int64_t t = 0; t < b.T; ++t) {
    for (int64_t k = 0; k < b.K; ++k) ids.push_back(static_cast<double>((t + k) % b.E));
  }
  bi.ids = Tensor::from_vector(ids, {b.T, b.K}, DType::kInt32);
  bi.scales = rand_tensor({b.T, b.K}, DType::kFloat32, 52, 0.0, 1.0);
  bi.w1 = rand_tensor({b.E, b.I, b.H}, b.dt, 53, -0.6, 0.6);
  bi.w2 = rand_tensor({b.E, b.H, b.I}, b.dt, 54, -0.4, 0.4);
  bi.options.clamped_relu2_limit = Tensor::from_vector({1.25}, {1}, DType::kFloat32);
  const auto x = bi.x.to_double_vector(), w1 = bi.w1.to_double_vector(),
             w2 = bi.w2.to_double_vector(), sc = bi.scales.to_double_vector();
  std::vector<double> want(static_cast<size_t>(b.T * b.H), 0.0);
  double largest = 0.0;
  for (int64_t t = 0; t < b.T; ++t) {
    for (int64_t k = 0; k < b.K; ++k) {
      const auto e = static_cast<int64_t>(ids[static_cast<size_t>(t * b.K + k)]);
      std::vector<double> hv(static_cast<size_t>(b.I));
      for (int64_t i = 0; i < b.I; ++i) {
        double a = 0.0;
        for (int64_t j = 0; j < b.H; ++j) a += x[t * b.H + j] * w1[(e * b.I + i) * b.H + j];
        largest = std::max(largest, a);
        const double cl = 1.25 * std::tanh(std::max(a, 0.0) / 1.25);
        hv[static_cast<size_t>(i)] = round_as(b.dt, cl * cl);
      }
      for (int64_t j = 0; j < b.H; ++j) {
        double y = 0.0;
        for (int64_t i = 0; i < b.I; ++i) y += hv[i] * w2[(e * b.H + j) * b.I + i];
        want[static_cast<size_t>(t * b.H + j)] += sc[t * b.K + k] * round_as(b.dt, y);
      }
    }
  }
  EXPECT_GT(largest, 1.25);  // the clamp is reached
  EXPECT_TRUE(all_close(run(b, bi)[0], want, default_tolerance(b.dt)));

  const char* op = "cutlass_fused_moe";
  auto expect_text = [&](const Case& cc, const Inputs& ii, const char* arg, const char* text) {
    try {
      (void)run(cc, ii);
      ADD_FAILURE() << "expected an error naming " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.op(), op);
      EXPECT_EQ(e.arg(), arg) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  Inputs no_limit = bi;
  no_limit.options.clamped_relu2_limit = std::nullopt;
  expect_text(b, no_limit, "clamped_relu2_limit",
              "ActivationType.ClampedRelu2 requires a one-element clamped_relu2_limit tensor");
  Inputs two = bi;
  two.options.clamped_relu2_limit = Tensor::zeros({2}, DType::kFloat32);
  expect_text(b, two, "clamped_relu2_limit",
              "requires model-wide clamped_relu2_limit with shape (1,), got (2,)");
  Inputs f16 = bi;
  f16.options.clamped_relu2_limit = Tensor::zeros({1}, DType::kFloat16);
  expect_text(b, f16, "clamped_relu2_limit", "expected torch.float32, got torch.float16");
  Inputs biased = bi;
  biased.b1 = rand_tensor({b.E, b.I}, b.dt, 55);
  expect_text(b, biased, "fc1_expert_biases",
              "ClampedRelu2 does not support FC1 bias or min-latency mode");
  Case f32 = b;
  f32.dt = DType::kFloat32;
  Inputs f32i = bi;
  f32i.x = bi.x.to(DType::kFloat32);
  f32i.w1 = bi.w1.to(DType::kFloat32);
  f32i.w2 = bi.w2.to(DType::kFloat32);
  expect_text(f32, f32i, "activation_type", "ClampedRelu2 supports only BF16xBF16 or MXFP8xMXFP8");
  Case relu2 = b;
  relu2.act = ActivationType::Relu2;
  expect_text(relu2, bi, "clamped_relu2_limit",
              "clamped_relu2_limit is supported only with ActivationType.ClampedRelu2");
  Inputs cake = bi;
  cake.options.backend = "cake";
  EXPECT_FI_ERROR_CODE((void)run(b, cake), op, "backend", ErrorCode::kUnsupported);
  cake.options.backend = "triton";
  expect_text(b, cake, "backend", "unsupported fused MoE backend: 'triton'");
  Inputs four = bi;
  four.options.nvfp4_4over6 = Value(true);
  expect_text(b, four, "nvfp4_4over6", "nvfp4_4over6 requires NVFP4");
  four.options.nvfp4_4over6 = Value();  // None: off, the call runs
  EXPECT_TRUE(all_close(run(b, four)[0], want, default_tolerance(b.dt)));
  Case powlu = b;
  powlu.act = ActivationType::PowLU;
  Inputs pi = bi;
  pi.options.clamped_relu2_limit = std::nullopt;
  EXPECT_FI_ERROR_CODE((void)run(powlu, pi), op, "activation_type", ErrorCode::kUnsupported);
}

TEST(MoeActivations, RecordAndReplay) {
  Case situ_case;
  situ_case.act = ActivationType::Situ;
  situ_case.situ_params = true;
  situ_case.dt = DType::kBFloat16;
  Case tanh_case;
  tanh_case.dt = DType::kBFloat16;
  const Inputs a = make_inputs(situ_case), b = make_inputs(tanh_case);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    (void)run(situ_case, a);
    (void)run(tanh_case, b);
    (void)is_gated_activation(ActivationType::Situ);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 3u);
  for (const auto& call : calls) {
    SCOPED_TRACE(call.name);
    EXPECT_TRUE(replays_identically(call));
  }
  EXPECT_EQ(calls[2].result, Value(true));
}

// Through a dump directory, as `flashinfer replay` does: the enum member and the keyword-only
// per-expert Situ tensors are rebuilt from their records and the call passes.
TEST(MoeActivations, DumpReplay) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_moe_act_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg);
  Case c;
  c.act = ActivationType::Situ;
  c.situ_params = true;
  const Inputs in = make_inputs(c);
  (void)run(c, in);
  recorder::stop();
  std::vector<fs::path> dumps;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) dumps.push_back(e.path());
  }
  ASSERT_EQ(dumps.size(), 1u);
  const replay::Result r = replay::replay_from_dump(dumps[0].string());
  EXPECT_EQ(r.status, replay::Status::kPassed) << r.error;
  ASSERT_FALSE(r.comparisons.empty());
  EXPECT_EQ(r.comparisons[0].key, "result__0");
  fs::remove_all(dir);
}

// The CUDA kernel (compiled in CI; runs only where a GPU is visible) against the CPU reference.
TEST(MoeActivationsCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (ActivationType act : {ActivationType::GegluTanh, ActivationType::Situ}) {
    Case c;
    c.T = 21;
    c.dt = DType::kBFloat16;
    c.act = act;
    c.situ_params = act == ActivationType::Situ;
    c.biases = true;
    const Inputs in = make_inputs(c);
    const Tensor ref = run(c, in)[0];
    const Device d = Device::cuda(0);
    Inputs g = in;
    g.x = in.x.to(d);
    g.ids = in.ids.to(d);
    g.scales = in.scales.to(d);
    g.w1 = in.w1.to(d);
    g.w2 = in.w2.to(d);
    g.b1 = in.b1->to(d);
    g.b2 = in.b2->to(d);
    if (c.situ_params) {
      g.options.situ_beta = in.options.situ_beta->to(d);
      g.options.situ_linear_beta = in.options.situ_linear_beta->to(d);
    }
    EXPECT_TRUE(all_close(run(c, g)[0].to(Device::cpu()), ref, default_tolerance(c.dt)))
        << activation_type_name(act);
  }
}

}  // namespace
}  // namespace flashinfer::testing
