// Private to the FP4 / FP8 MoE tests: their deterministic random packed weights and e4m3 scale
// codes, and the shared fp64-formula comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "flashinfer/float_formats.h"
#include "flashinfer/tensor.h"
#include "ops/op_test_util.h"

namespace flashinfer::testing::moe_fp4 {

/// A 64-bit LCG: the same sequence on every platform.
struct Rng {
  uint64_t s;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * (next() / 2147483648.0); }
};

/// `v`'s bytes as a tensor of `shape` and `dtype` (sizes must agree).
inline Tensor bytes_tensor(const std::vector<uint8_t>& v, const Shape& shape,
                           DType dtype = DType::kUInt8) {
  Tensor t = Tensor::empty(shape, dtype);
  EXPECT_EQ(static_cast<size_t>(t.numel()) * t.element_size(), v.size());
  std::memcpy(t.data_ptr(), v.data(), v.size());
  return t;
}

inline std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  Rng r{seed};
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(r.next() & 0xFF);
  return v;
}

/// e4m3 codes of values in [lo, hi).
inline std::vector<uint8_t> e4m3_codes(size_t n, uint64_t seed, double lo, double hi) {
  Rng r{seed};
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = float_to_e4m3fn_bits(static_cast<float>(r.uniform(lo, hi)), true);
  return v;
}

/// v rounded to dt (fp16 or bf16; fp32 otherwise), as a double.
inline double to_dt(DType dt, double v) {
  const float f = static_cast<float>(v);
  if (dt == DType::kFloat16) return half_bits_to_float(float_to_half_bits(f));
  if (dt == DType::kBFloat16) return bfloat16_bits_to_float(float_to_bfloat16_bits(f));
  return f;
}

inline double silu(double v) { return v / (1.0 + std::exp(-v)); }

/// A quantized MoE output against its fp64 formula: quantization codes can flip where fp32 and
/// fp64 sums round differently, so a loose elementwise bound, plus a tight bound on the mean
/// error that a wrong formula would break.
inline void expect_close_to_formula(const std::vector<double>& got,
                                    const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  double max_ref = 0.0, err_sum = 0.0;
  for (double w : want) max_ref = std::max(max_ref, std::fabs(w));
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    err_sum += err;
    if (err > 0.02 * std::fabs(want[i]) + 0.02 * max_ref) ++bad;
  }
  EXPECT_EQ(bad, 0) << "max |ref| " << max_ref;
  EXPECT_LT(err_sum / static_cast<double>(got.size()), 2e-3 * max_ref + 1e-6);
  EXPECT_GT(max_ref, 0.0);
}

/// Runs every case (`c.run()`) under a recorder; each cutlass_fused_moe call it made (weight
/// preparations left out) must succeed and replay identically.
template <class Case>
void expect_cutlass_moe_calls_replay(const std::vector<Case>& cases) {
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    for (const Case& c : cases) (void)c.run();
    for (const auto& call : scope.observer().calls) {
      if (call.name == "cutlass_fused_moe") calls.push_back(call);
    }
  }
  ASSERT_EQ(calls.size(), cases.size());
  for (const auto& call : calls) {
    ASSERT_TRUE(call.error.empty()) << call.error;
    EXPECT_TRUE(replays_identically(call));
  }
}

}  // namespace flashinfer::testing::moe_fp4
