// silu_and_mul, gelu_and_mul, gelu_tanh_and_mul: golden values, an fp64 formula over dtypes,
// ranks and strides, every bad input, record/replay, and CUDA vs the CPU reference.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "ops/norm_act_reference.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

const std::vector<DType> kDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// out[..., i] = act(x[..., i]) * x[..., d + i] over the logical (row-major) element order.
std::vector<double> reference(const Tensor& x, double (*act)(double)) {
  return ref_act(x.to_double_vector(), x.size(-1), act);
}

// Golden values computed independently (Python math module, fp64) for the row
// [gate | up] = [1, -2, 0.5 | 2, 0.5, -3].
TEST(Activation, Golden) {
  const std::vector<std::vector<double>> want = {
      {1.4621171572600098, -0.11920292202211755, -0.933688996802782},
      {1.6826894921370859, -0.02275013194817921, -1.0371936919110196},
      {1.6823839812165535, -0.02270115295611247, -1.0371420294754319},
  };
  Tensor x = Tensor::from_vector({1, -2, 0.5, 2, 0.5, -3}, {1, 6}, DType::kFloat32);
  for (std::size_t a = 0; a < kActs.size(); ++a) {
    SCOPED_TRACE(kActs[a].name);
    Tensor y = kActs[a].op(x, std::nullopt, std::nullopt);
    EXPECT_EQ(y.shape(), (Shape{1, 3}));
    EXPECT_TRUE(all_close(y, want[a], {1e-6, 1e-6}));
  }
}

// Saturated inputs: exp(-x) overflows to inf for x = -100 and the result must be (-)0, not NaN;
// NaN propagates. Nine gates, so both the 8-wide vector body and the scalar tail see them.
TEST(Activation, ExtremeInputs) {
  const double nan = std::nan("");
  std::vector<double> row = {-100, 100, 0, nan, -100, 100, 0, nan, -100};
  row.resize(18, 1.0);
  Tensor x = Tensor::from_vector(row, {1, 18}, DType::kFloat32);
  for (const auto& a : kActs) {
    SCOPED_TRACE(a.name);
    EXPECT_TRUE(all_close(a.op(x, std::nullopt, std::nullopt), {0, 100, 0, nan, 0, 100, 0, nan, 0},
                          {1e-6, 1e-6}));
  }
}

// The fp32 tails, where 1 + erf / 1 + tanh would cancel: relative accuracy must hold.
TEST(Activation, NegativeTailIsAccurate) {
  std::vector<double> row;
  for (int i = 0; i < 24; ++i) row.push_back(-1.0 - 0.5 * i);  // -1 .. -12.5
  row.resize(48, 1.0);
  Tensor x = Tensor::from_vector(row, {1, 48}, DType::kFloat32);
  for (const auto& a : kActs) {
    SCOPED_TRACE(a.name);
    const auto want = reference(x, a.ref);
    // rtol: the fp32 arguments (x^3, z^2 terms) carry ~1 ulp, which e^(...) turns into a few
    // 1e-6 relative; cancellation would cost 1e-2 or more. atol: the reference keeps going
    // below fp32's range, where the op flushes to 0.
    EXPECT_TRUE(all_close(a.op(x, std::nullopt, std::nullopt), want, {1e-37, 8e-6}));
  }
}

TEST(Activation, MatchesFormula) {
  const std::vector<Shape> shapes = {{2}, {1, 2}, {4, 14}, {3, 5, 128}, {4, 4096}, {2, 3, 2, 66}};
  for (const auto& a : kActs) {
    for (DType d : kDTypes) {
      for (const Shape& s : shapes) {
        for (bool strided : {false, true}) {
          SCOPED_TRACE(std::string(a.name) + " " + dtype_label(d) + " " + shape_to_string(s) +
                       (strided ? " strided" : ""));
          Tensor x = strided ? strided_rand(s, d, 7, -6, 6) : rand_tensor(s, d, 7, -6, 6);
          const auto want = reference(x, a.ref);
          Tensor y = a.op(x, std::nullopt, std::nullopt);
          Shape out_shape = s;
          out_shape.back() /= 2;
          EXPECT_EQ(y.shape(), out_shape);
          EXPECT_TRUE(y.is_contiguous());
          EXPECT_TRUE(all_close(y, want, default_tolerance(d)));
          // Into a strided `out`, returned as is.
          Tensor out = strided_rand(out_shape, d, 8);
          Tensor ret = a.op(x, out, std::nullopt);
          EXPECT_EQ(ret.data_ptr(), out.data_ptr());
          EXPECT_TRUE(all_close(out, want, default_tolerance(d)));
        }
      }
    }
  }
}

// Leading dimensions that do not collapse into one row stride (a transposed batch), for both
// input and out: the op stages through contiguous copies and still writes `out`.
TEST(Activation, NonCollapsibleLeadingDims) {
  for (const auto& a : kActs) {
    SCOPED_TRACE(a.name);
    Tensor x = rand_tensor({3, 4, 10}, DType::kFloat16, 9).transpose(0, 1);  // [4, 3, 10]
    Tensor out = Tensor::empty({3, 4, 5}, DType::kFloat16).transpose(0, 1);  // [4, 3, 5]
    a.op(x, out, std::nullopt);
    EXPECT_TRUE(all_close(out, reference(x, a.ref), default_tolerance(DType::kFloat16)));
  }
}

TEST(Activation, EmptyBatch) {
  for (const auto& a : kActs) {
    Tensor y = a.op(Tensor::empty({0, 8}, DType::kFloat16), std::nullopt, std::nullopt);
    EXPECT_EQ(y.shape(), (Shape{0, 4}));
  }
}

TEST(Activation, BadInput) {
  for (const auto& a : kActs) {
    SCOPED_TRACE(a.name);
    Tensor x = rand_tensor({4, 8}, DType::kBFloat16, 1);
    EXPECT_FI_ERROR(a.op(Tensor(), std::nullopt, std::nullopt), a.name, "input");
    EXPECT_FI_ERROR(a.op(rand_tensor({4, 7}, DType::kBFloat16, 1), std::nullopt, std::nullopt),
                    a.name, "input");  // odd last dimension
    EXPECT_FI_ERROR(a.op(rand_tensor({4, 0}, DType::kBFloat16, 1), std::nullopt, std::nullopt),
                    a.name, "input");
    EXPECT_FI_ERROR(a.op(Tensor::full({}, 1.0, DType::kFloat32), std::nullopt, std::nullopt),
                    a.name, "input");  // 0-D
    EXPECT_FI_ERROR(a.op(rand_tensor({4, 8}, DType::kInt32, 1), std::nullopt, std::nullopt), a.name,
                    "input");
    EXPECT_FI_ERROR(a.op(rand_tensor({4, 8}, DType::kFloat64, 1), std::nullopt, std::nullopt),
                    a.name, "input");
    EXPECT_FI_ERROR(a.op(x, Tensor::empty({4, 8}, DType::kBFloat16), std::nullopt), a.name, "out");
    EXPECT_FI_ERROR(a.op(x, Tensor::empty({4, 4}, DType::kFloat16), std::nullopt), a.name, "out");
    EXPECT_FI_ERROR(a.op(x, Tensor::empty({2, 4}, DType::kBFloat16), std::nullopt), a.name, "out");
    EXPECT_FI_ERROR(a.op(x, x.slice(1, 0, 4), std::nullopt), a.name, "out");  // overlaps input
    EXPECT_FI_ERROR(a.op(x, Tensor::empty({1, 4}, DType::kBFloat16).as_strided({4, 4}, {0, 1}, 0),
                         std::nullopt),
                    a.name, "out");  // broadcast out
  }
}

TEST(ActivationDecls, SignaturesAndReplay) {
  for (const auto& a : kActs) {
    const OpDecl* d = OpRegistry::global().find(a.name);
    ASSERT_NE(d, nullptr) << a.name;
    EXPECT_EQ(d->module, "flashinfer.activation");
    EXPECT_EQ(d->signature(), "(input, out=None, enable_pdl=None)");
  }
  Tensor x = rand_tensor({5, 32}, DType::kFloat16, 3);
  Tensor out = Tensor::empty({5, 16}, DType::kFloat16);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    for (const auto& a : kActs) a.op(x, std::nullopt, std::nullopt);
    silu_and_mul(x, out, false);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 4u);
  for (const auto& c : calls) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(c.error.empty());
    auto [result, after] = replay(c);
    EXPECT_TRUE(result.is_tensor());
    EXPECT_TRUE(same_values(result, c.result));
  }
  EXPECT_TRUE(calls[3].inputs[2] == Value(false));
}

TEST(ActivationCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const std::vector<Shape> shapes = {{1, 2}, {4, 14}, {3, 5, 128}, {64, 11008}, {7, 2 * 4100}};
  for (const auto& a : kActs) {
    for (DType d : kDTypes) {
      for (const Shape& s : shapes) {
        for (bool strided : {false, true}) {
          SCOPED_TRACE(std::string(a.name) + " " + dtype_label(d) + " " + shape_to_string(s) +
                       (strided ? " strided" : ""));
          Tensor x = strided ? strided_rand(s, d, 5, -6, 6) : rand_tensor(s, d, 5, -6, 6);
          Tensor yc = a.op(x, std::nullopt, std::nullopt);
          Tensor yg = a.op(to_keep_layout(x, gpu), std::nullopt, std::nullopt).to(Device::cpu());
          EXPECT_TRUE(all_close(yg, yc, default_tolerance(d)));
        }
      }
    }
  }
}

}  // namespace
}  // namespace flashinfer::testing
