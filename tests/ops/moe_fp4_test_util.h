// Private to the NVFP4 MoE tests (test_moe_fp4, test_moe_b12x): their deterministic random
// packed weights and e4m3 scale codes.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "flashinfer/float_formats.h"
#include "flashinfer/tensor.h"

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

}  // namespace flashinfer::testing::moe_fp4
