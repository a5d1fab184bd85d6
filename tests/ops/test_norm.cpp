// fused_add_rmsnorm, gemma_rmsnorm, gemma_fused_add_rmsnorm, layernorm: hand-checked golden
// values, an fp64 formula over dtypes, shapes and strides, every bad input, record/replay, and
// CUDA vs the CPU reference (skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "ops/norm_act_reference.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

const std::vector<DType> kDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// ---- fp64 references ------------------------------------------------------------------------

// Output tolerance: the default for the dtype, relaxed slightly for normalized outputs of
// reduced-precision inputs (the fp32 sum of squares is rounded once more than the fp64 one).
Tolerance norm_tol(DType d) {
  Tolerance t = default_tolerance(d);
  if (d == DType::kFloat32) t = {2e-5, 2e-5};
  return t;
}

// ---- golden values --------------------------------------------------------------------------

TEST(FusedAddRmsNorm, GoldenFp32) {
  Tensor x = Tensor::from_vector({1, 2}, {1, 2}, DType::kFloat32);
  Tensor r = Tensor::from_vector({3, 4}, {1, 2}, DType::kFloat32);
  Tensor w = Tensor::from_vector({1, 0.5}, {2}, DType::kFloat32);
  fused_add_rmsnorm(x, r, w, 0.0);
  // sum = [4, 6], mean square = 26.
  EXPECT_TRUE(all_close(r, {4, 6}, {0, 0}));
  EXPECT_TRUE(all_close(x, {4 / std::sqrt(26.0), 3 / std::sqrt(26.0)}, {1e-7, 1e-6}));
}

// The normalization must use the fp32 sum, not the residual rounded to fp16: here the rounded
// sum overflows to inf (so a kernel normalizing it would produce NaN/0), the fp32 one does not.
TEST(FusedAddRmsNorm, NormalizesUnroundedSum) {
  Tensor x = Tensor::from_vector({60000, 1000}, {1, 2}, DType::kFloat16);
  Tensor r = Tensor::from_vector({60000, 1000}, {1, 2}, DType::kFloat16);
  Tensor w = Tensor::from_vector({1, 1}, {2}, DType::kFloat16);
  fused_add_rmsnorm(x, r, w);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(all_close(r, {inf, 2000}, {0, 0}));
  const double rms = std::sqrt((120000.0 * 120000.0 + 2000.0 * 2000.0) / 2 + 1e-6);
  EXPECT_TRUE(all_close(x, {120000 / rms, 2000 / rms}, default_tolerance(DType::kFloat16)));
}

// The residual is the fp32 sum rounded to fp16 / bf16 (round to nearest even), bit for bit as
// the library's software conversion does it, including subnormal, overflowing and NaN sums: the
// CPU kernels may convert with vector instructions (F16C, AVX2), which must not change any bit.
TEST(FusedAddRmsNorm, ResidualRoundingIsExact) {
  const int64_t n = 4096;
  std::vector<double> xv, rv;
  for (int64_t i = 0; i < n; ++i) {
    const double scale = std::ldexp(1.0, static_cast<int>(i % 48) - 24);  // 2^-24 .. 2^23
    xv.push_back(scale * std::sin(0.37 * i) * 1.7);
    rv.push_back(scale * std::cos(0.11 * i) * 1.3);
  }
  xv[5] = std::nan("");
  rv[77] = -std::numeric_limits<double>::infinity();
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_label(d));
    Tensor x = Tensor::from_vector(xv, {2, n / 2}, d);
    Tensor r = Tensor::from_vector(rv, {2, n / 2}, d);
    std::vector<double> want;
    const auto xs = x.to_double_vector(), rs = r.to_double_vector();
    for (int64_t i = 0; i < n; ++i) {
      const float sum = static_cast<float>(xs[i]) + static_cast<float>(rs[i]);
      want.push_back(d == DType::kFloat16 ? Half::from_float(sum).to_float()
                                          : BFloat16::from_float(sum).to_float());
    }
    fused_add_rmsnorm(x, r, Tensor::full({n / 2}, 1.0, d));
    EXPECT_TRUE(all_close(r, want, {0, 0}));
  }
}

TEST(GemmaRmsNorm, Golden) {
  Tensor x = Tensor::from_vector({3, 4}, {1, 2}, DType::kFloat32);
  Tensor w = Tensor::from_vector({0, 1}, {2}, DType::kFloat32);
  Tensor y = gemma_rmsnorm(x, w, 0.0);
  const double rms = std::sqrt(12.5);
  EXPECT_TRUE(all_close(y, {3 / rms, 8 / rms}, {1e-7, 1e-6}));
}

TEST(GemmaFusedAddRmsNorm, Golden) {
  Tensor x = Tensor::from_vector({1, 1}, {1, 2}, DType::kFloat32);
  Tensor r = Tensor::from_vector({2, 3}, {1, 2}, DType::kFloat32);
  Tensor w = Tensor::from_vector({0, -0.5}, {2}, DType::kFloat32);
  gemma_fused_add_rmsnorm(x, r, w, 0.0);
  // sum = [3, 4], rms = sqrt(12.5); scale (1 + w) = [1, 0.5].
  EXPECT_TRUE(all_close(r, {3, 4}, {0, 0}));
  EXPECT_TRUE(all_close(x, {3 / std::sqrt(12.5), 2 / std::sqrt(12.5)}, {1e-7, 1e-6}));
}

TEST(LayerNorm, Golden) {
  Tensor x = Tensor::from_vector({1, 2, 3, 4}, {1, 4}, DType::kBFloat16);
  Tensor g = Tensor::from_vector({1, 1, 2, 1}, {4}, DType::kFloat32);
  Tensor b = Tensor::from_vector({0, 0, 0, 10}, {4}, DType::kFloat32);
  Tensor y = layernorm(x, g, b, 0.0);
  // mean 2.5, variance 1.25.
  const double s = std::sqrt(1.25);
  EXPECT_EQ(y.dtype(), DType::kBFloat16);
  EXPECT_TRUE(all_close(y, {-1.5 / s, -0.5 / s, 2 * 0.5 / s, 1.5 / s + 10},
                        default_tolerance(DType::kBFloat16)));
}

// A row with a large mean and a tiny spread: a one-pass E[x^2] - E[x]^2 variance in fp32
// would cancel to garbage; the two-pass kernel must not.
TEST(LayerNorm, LargeMeanIsStable) {
  std::vector<double> v;
  for (int i = 0; i < 256; ++i) v.push_back(10000.0 + (i % 2 == 0 ? 0.25 : -0.25));
  Tensor x = Tensor::from_vector(v, {1, 256}, DType::kFloat32);
  Tensor g = Tensor::full({256}, 1.0, DType::kFloat32);
  Tensor b = Tensor::zeros({256}, DType::kFloat32);
  Tensor y = layernorm(x, g, b, 0.0);
  std::vector<double> want(256);
  for (int i = 0; i < 256; ++i) want[i] = i % 2 == 0 ? 1.0 : -1.0;
  EXPECT_TRUE(all_close(y, want, {1e-5, 1e-5}));
}

// ---- formulas over dtypes, shapes and strides -----------------------------------------------

struct Case {
  Shape shape;
  bool strided;
};
const std::vector<Case> kCases = {
    {{1, 8}, false},     {{7, 129}, false},  {{5, 1024}, true},
    {{3, 4, 64}, false}, {{2, 3, 40}, true}, {{64, 4096}, false},
};

Tensor make_input(const Case& c, DType d, uint64_t seed) {
  return c.strided ? strided_rand(c.shape, d, seed) : rand_tensor(c.shape, d, seed);
}

TEST(FusedAddRmsNorm, MatchesFormula) {
  for (DType d : kDTypes) {
    for (const Case& c : kCases) {
      for (bool gemma : {false, true}) {
        SCOPED_TRACE(std::string(dtype_label(d)) + " " + shape_to_string(c.shape) +
                     (c.strided ? " strided" : "") + (gemma ? " gemma" : ""));
        const int64_t n = c.shape.back();
        Tensor x = make_input(c, d, 11);
        Tensor r = make_input(c, d, 12);
        Tensor w = rand_tensor({n}, d, 13, -1.0, 1.0);
        const std::vector<double> xv = x.to_double_vector(), rv = r.to_double_vector();
        std::vector<double> sum(xv.size());
        for (std::size_t i = 0; i < xv.size(); ++i) sum[i] = xv[i] + rv[i];
        const auto want =
            ref_rmsnorm(sum, n, with_bias(w.to_double_vector(), gemma ? 1.0 : 0.0), 1e-5);
        if (gemma) {
          gemma_fused_add_rmsnorm(x, r, w, 1e-5);
        } else {
          fused_add_rmsnorm(x, r, w, 1e-5);
        }
        EXPECT_TRUE(all_close(r, sum, default_tolerance(d)));
        EXPECT_TRUE(all_close(x, want, norm_tol(d)));
      }
    }
  }
}

TEST(GemmaRmsNorm, MatchesFormula) {
  for (DType d : kDTypes) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(std::string(dtype_label(d)) + " " + shape_to_string(c.shape));
      const int64_t n = c.shape.back();
      Tensor x = make_input(c, d, 21);
      Tensor w = rand_tensor({n}, d, 22, -1.0, 1.0);
      const auto want =
          ref_rmsnorm(x.to_double_vector(), n, with_bias(w.to_double_vector(), 1.0), 1e-6);
      EXPECT_TRUE(all_close(gemma_rmsnorm(x, w), want, norm_tol(d)));
      // Into a strided `out`.
      Tensor out = strided_rand(c.shape, d, 23);
      Tensor ret = gemma_rmsnorm(x, w, 1e-6, out);
      EXPECT_EQ(ret.data_ptr(), out.data_ptr());
      EXPECT_TRUE(all_close(out, want, norm_tol(d)));
    }
  }
}

TEST(LayerNorm, MatchesFormula) {
  for (DType d : kDTypes) {
    for (const Case& c : kCases) {
      if (c.shape.size() != 2) continue;
      SCOPED_TRACE(std::string(dtype_label(d)) + " " + shape_to_string(c.shape));
      const int64_t n = c.shape.back();
      Tensor x = make_input(c, d, 31);
      Tensor g = rand_tensor({n}, DType::kFloat32, 32, 0.5, 1.5);
      Tensor b = strided_rand({n}, DType::kFloat32, 33);
      const auto want =
          ref_layernorm(x.to_double_vector(), n, g.to_double_vector(), b.to_double_vector(), 1e-6);
      Tensor y = layernorm(x, g, b);
      EXPECT_TRUE(y.is_contiguous());
      EXPECT_TRUE(all_close(y, want, norm_tol(d)));
    }
  }
}

// gamma and beta may be fp16 or bf16 (the same dtype), as upstream's CuTe kernel takes them:
// widened exactly, so the output is the fp32 parameters' bit for bit when they hold the same
// values.
TEST(LayerNorm, SixteenBitGammaAndBetaWidenExactly) {
  const int64_t n = 300;
  for (DType d : kDTypes) {
    for (DType pd : {DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(dtype_label(d)) + " params " + dtype_label(pd));
      Tensor x = rand_tensor({5, n}, d, 61);
      Tensor g16 = rand_tensor({n}, pd, 62, 0.5, 1.5), b16 = strided_rand({n}, pd, 63);
      Tensor want = layernorm(x, g16.to(DType::kFloat32), b16.to(DType::kFloat32));
      EXPECT_TRUE(all_close(layernorm(x, g16, b16), want, {0, 0}));
    }
  }
}

// ---- bad input ------------------------------------------------------------------------------

TEST(FusedAddRmsNorm, BadInput) {
  Tensor x = rand_tensor({4, 8}, DType::kFloat16, 1);
  Tensor r = rand_tensor({4, 8}, DType::kFloat16, 2);
  Tensor w = rand_tensor({8}, DType::kFloat16, 3);
  for (const char* op : {"fused_add_rmsnorm", "gemma_fused_add_rmsnorm"}) {
    auto call = [&](const Tensor& a, const Tensor& b, const Tensor& c, double eps = 1e-6) {
      if (std::string(op) == "fused_add_rmsnorm") {
        fused_add_rmsnorm(a, b, c, eps);
      } else {
        gemma_fused_add_rmsnorm(a, b, c, eps);
      }
    };
    EXPECT_FI_ERROR(call(Tensor(), r, w), op, "input");
    EXPECT_FI_ERROR(call(x, Tensor(), w), op, "residual");
    EXPECT_FI_ERROR(call(x, r, Tensor()), op, "weight");
    EXPECT_FI_ERROR(call(rand_tensor({8}, DType::kFloat16, 1), r, w), op, "input");
    EXPECT_FI_ERROR(call(rand_tensor({4, 8}, DType::kFloat64, 1), r, w), op, "input");
    EXPECT_FI_ERROR(
        call(rand_tensor({0, 8}, DType::kFloat16, 1), rand_tensor({0, 8}, DType::kFloat16, 1), w),
        op, "input");
    EXPECT_FI_ERROR(call(x, rand_tensor({4, 9}, DType::kFloat16, 1), w), op, "residual");
    EXPECT_FI_ERROR(call(x, rand_tensor({4, 8}, DType::kBFloat16, 1), w), op, "residual");
    EXPECT_FI_ERROR(call(x, r, rand_tensor({9}, DType::kFloat16, 1)), op, "weight");
    EXPECT_FI_ERROR(call(x, r, rand_tensor({1, 8}, DType::kFloat16, 1)), op, "weight");
    EXPECT_FI_ERROR(call(x, r, rand_tensor({8}, DType::kFloat32, 1)), op, "weight");
    EXPECT_FI_ERROR(call(x, r, w, -1.0), op, "eps");
    EXPECT_FI_ERROR(call(x, r, w, std::nan("")), op, "eps");
    EXPECT_FI_ERROR(call(x, x, w), op, "residual");  // aliased
    EXPECT_FI_ERROR(
        call(x.select(0, 0).unsqueeze(0).as_strided({4, 8}, {0, 1}, x.storage_offset()), r, w), op,
        "input");  // broadcast
    // weight inside input: the gate names the written input (and weight in the message).
    EXPECT_FI_ERROR(call(x, r, x.select(0, 1)), op, "input");
  }
}

TEST(GemmaRmsNorm, BadInput) {
  Tensor x = rand_tensor({4, 8}, DType::kBFloat16, 1);
  Tensor w = rand_tensor({8}, DType::kBFloat16, 2);
  EXPECT_FI_ERROR(gemma_rmsnorm(x, rand_tensor({7}, DType::kBFloat16, 1)), "gemma_rmsnorm",
                  "weight");
  EXPECT_FI_ERROR(gemma_rmsnorm(rand_tensor({2, 2, 2, 8}, DType::kBFloat16, 1), w), "gemma_rmsnorm",
                  "input");
  EXPECT_FI_ERROR(gemma_rmsnorm(x, w, 1e-6, rand_tensor({4, 8}, DType::kFloat16, 1)),
                  "gemma_rmsnorm", "out");
  EXPECT_FI_ERROR(gemma_rmsnorm(x, w, -1.0), "gemma_rmsnorm", "eps");
}

TEST(LayerNorm, BadInput) {
  Tensor x = rand_tensor({4, 8}, DType::kBFloat16, 1);
  Tensor g = rand_tensor({8}, DType::kFloat32, 2);
  Tensor b = rand_tensor({8}, DType::kFloat32, 3);
  EXPECT_FI_ERROR(layernorm(Tensor(), g, b), "layernorm", "input");
  EXPECT_FI_ERROR(layernorm(rand_tensor({2, 4, 8}, DType::kBFloat16, 1), g, b), "layernorm",
                  "input");
  EXPECT_FI_ERROR(layernorm(rand_tensor({4, 8}, DType::kInt32, 1), g, b), "layernorm", "input");
  EXPECT_FI_ERROR(layernorm(rand_tensor({0, 8}, DType::kBFloat16, 1), g, b), "layernorm", "input");
  EXPECT_FI_ERROR(layernorm(x, rand_tensor({8}, DType::kFloat64, 1), b), "layernorm", "gemma");
  EXPECT_FI_ERROR(layernorm(x, rand_tensor({8}, DType::kBFloat16, 1), b), "layernorm", "beta");
  EXPECT_FI_ERROR(layernorm(x, rand_tensor({7}, DType::kFloat32, 1), b), "layernorm", "gemma");
  EXPECT_FI_ERROR(layernorm(x, g, rand_tensor({8}, DType::kFloat16, 1)), "layernorm", "beta");
  EXPECT_FI_ERROR(layernorm(x, g, rand_tensor({2, 8}, DType::kFloat32, 1)), "layernorm", "beta");
  EXPECT_FI_ERROR(layernorm(x, g, b, -0.5), "layernorm", "eps");
}

// ---- declarations, record and replay --------------------------------------------------------

TEST(NormDecls, SignaturesMatchUpstream) {
  auto sig = [](const char* name) { return OpRegistry::global().find(name)->signature(); };
  EXPECT_EQ(sig("fused_add_rmsnorm"), "(input, residual, weight, eps=1e-06, enable_pdl=None)");
  EXPECT_EQ(sig("gemma_fused_add_rmsnorm"),
            "(input, residual, weight, eps=1e-06, enable_pdl=None)");
  EXPECT_EQ(sig("gemma_rmsnorm"), "(input, weight, eps=1e-06, out=None, enable_pdl=None)");
  EXPECT_EQ(sig("layernorm"), "(input, gemma, beta, eps=1e-06)");
  for (const char* n :
       {"fused_add_rmsnorm", "gemma_fused_add_rmsnorm", "gemma_rmsnorm", "layernorm"}) {
    EXPECT_EQ(OpRegistry::global().find(n)->module, "flashinfer.norm") << n;
  }
}

TEST(NormDecls, RecordAndReplay) {
  Tensor x = rand_tensor({3, 16}, DType::kFloat16, 1);
  Tensor r = rand_tensor({3, 16}, DType::kFloat16, 2);
  Tensor w = rand_tensor({16}, DType::kFloat16, 3);
  Tensor g = rand_tensor({16}, DType::kFloat32, 4);
  Tensor b = rand_tensor({16}, DType::kFloat32, 5);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    fused_add_rmsnorm(x, r, w);
    gemma_fused_add_rmsnorm(x, r, w, 1e-5);
    gemma_rmsnorm(x, w);
    layernorm(x.to(DType::kBFloat16), g, b);
    calls = scope.observer().calls;
  }  // replay below is not recorded
  ASSERT_EQ(calls.size(), 4u);
  for (const auto& c : calls) {
    SCOPED_TRACE(c.name);
    // In-place ops: the replayed arguments end up exactly like the live ones.
    EXPECT_TRUE(replays_identically(c));
  }
  // The in-place calls returned None and changed input and residual.
  EXPECT_TRUE(calls[0].result.is_none());
  EXPECT_FALSE(same_values(calls[0].inputs[0], calls[0].after[0]));
  EXPECT_FALSE(same_values(calls[0].inputs[1], calls[0].after[1]));
}

// ---- CUDA vs the CPU reference --------------------------------------------------------------

TEST(NormCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  for (DType d : kDTypes) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(std::string(dtype_label(d)) + " " + shape_to_string(c.shape) +
                   (c.strided ? " strided" : ""));
      const int64_t n = c.shape.back();
      Tensor x = make_input(c, d, 41), r = make_input(c, d, 42);
      Tensor w = rand_tensor({n}, d, 43);
      for (bool gemma : {false, true}) {
        Tensor xc = x.clone(), rc = r.clone();
        Tensor xg = to_keep_layout(x, gpu), rg = to_keep_layout(r, gpu);
        if (gemma) {
          gemma_fused_add_rmsnorm(xc, rc, w);
          gemma_fused_add_rmsnorm(xg, rg, w.to(gpu));
        } else {
          fused_add_rmsnorm(xc, rc, w);
          fused_add_rmsnorm(xg, rg, w.to(gpu));
        }
        EXPECT_TRUE(all_close(rg.to(Device::cpu()), rc, {0, 0}));
        EXPECT_TRUE(all_close(xg.to(Device::cpu()), xc, norm_tol(d)));
        Tensor yc = gemma ? gemma_rmsnorm(x, w) : rmsnorm(x, w);
        const Tensor xk = to_keep_layout(x, gpu);
        Tensor yg = gemma ? gemma_rmsnorm(xk, w.to(gpu)) : rmsnorm(xk, w.to(gpu));
        EXPECT_TRUE(all_close(yg.to(Device::cpu()), yc, norm_tol(d)));
      }
      if (c.shape.size() == 2) {
        for (DType pd : {DType::kFloat32, DType::kBFloat16}) {  // 16-bit gamma / beta too
          Tensor g = rand_tensor({n}, pd, 44), b = rand_tensor({n}, pd, 45);
          EXPECT_TRUE(
              all_close(layernorm(to_keep_layout(x, gpu), g.to(gpu), b.to(gpu)).to(Device::cpu()),
                        layernorm(x, g, b), norm_tol(d)));
        }
      }
    }
  }
}

}  // namespace
}  // namespace flashinfer::testing
