// Private to the Blackwell CuTe-DSL MoE tests (test_moe_b12x, test_moe_cute_w4a16): one NVFP4 MoE
// problem (bf16 x, plain NVFP4 weights with linear scale codes, per-expert alphas, top-k routing)
// and its tensors in upstream's prepared layouts, plus the wrapper-call replay check.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "ops/moe_fp4_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing::moe_cute_test {

inline double e2m1(const std::vector<uint8_t>& packed, size_t i) {
  const uint8_t b = packed[i / 2];
  return e2m1_bits_to_float(i % 2 == 0 ? (b & 0xF) : (b >> 4));
}

/// Upstream's CuTe-DSL gated layout (interleave_linear_and_gate(w1, 64)): stored row s holds
/// plain row src[s]; b12x keeps the plain rows.
inline std::vector<int64_t> stored_rows(int64_t n1, bool cute_gated) {
  std::vector<int64_t> src(static_cast<size_t>(n1));
  const int64_t I = n1 / 2;
  for (int64_t s = 0; s < n1; ++s) {
    src[static_cast<size_t>(s)] = cute_gated ? ((s % 128) / 64) * I + (s / 128) * 64 + s % 64 : s;
  }
  return src;
}

/// Rows of `plain` [local, m, cols] bytes in stored order (stored_rows).
inline std::vector<uint8_t> stored_bytes(const std::vector<uint8_t>& plain, int64_t local,
                                         int64_t m, int64_t cols, bool reorder) {
  const auto src = stored_rows(m, reorder);
  std::vector<uint8_t> out(plain.size());
  for (int64_t e = 0; e < local; ++e) {
    for (int64_t s = 0; s < m; ++s) {
      std::memcpy(&out[static_cast<size_t>((e * m + s) * cols)],
                  &plain[static_cast<size_t>((e * m + src[static_cast<size_t>(s)]) * cols)],
                  static_cast<size_t>(cols));
    }
  }
  return out;
}

/// One MoE problem: plain NVFP4 weights (rows [linear; gate] when gated), linear e4m3 scale codes,
/// per-expert alphas, routing (t + 3k) % E with weights 0.7 / 0.3.
struct Nvfp4MoeData {
  int64_t T = 5, E = 8, K = 2, H = 128, I = 64, offset = 0, local = 8;
  bool gated = true, six_d = false, cute = false;  // cute: the CuTe-DSL w1 layout (and NVFP4 x)
  std::vector<double> x;                           // bf16 values [T, H]
  std::vector<uint8_t> xq, xs;                     // packed NVFP4 x and its linear scales
  std::vector<uint8_t> w1, s1, w2, s2;             // plain rows, linear scale codes
  std::vector<double> a1, a2, ids, rw;
  Tensor s1_base, s2_base;
  int64_t n1() const { return gated ? 2 * I : I; }
  void make(uint64_t seed) {
    moe_fp4::Rng r{seed};
    for (int64_t i = 0; i < T * H; ++i) {
      x.push_back(
          bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(r.uniform(-2.0, 2.0)))));
    }
    xq = moe_fp4::random_bytes(static_cast<size_t>(T * H / 2), seed + 1);
    xs = moe_fp4::e4m3_codes(static_cast<size_t>(T * H / 16), seed + 2, 0.5, 1.0);
    w1 = moe_fp4::random_bytes(static_cast<size_t>(local * n1() * H / 2), seed + 3);
    w2 = moe_fp4::random_bytes(static_cast<size_t>(local * H * I / 2), seed + 4);
    s1 = moe_fp4::e4m3_codes(static_cast<size_t>(local * n1() * H / 16), seed + 5, 0.02, 0.06);
    s2 = moe_fp4::e4m3_codes(static_cast<size_t>(local * H * I / 16), seed + 6, 0.02, 0.06);
    for (int64_t e = 0; e < local; ++e) {
      a1.push_back(static_cast<float>(r.uniform(0.75, 1.25)));
      a2.push_back(static_cast<float>(r.uniform(0.75, 1.25)));
    }
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        ids.push_back(static_cast<double>((t + 3 * k) % E));
        rw.push_back(k == 0 ? 0.7 : 0.3);
      }
    }
  }
  Tensor x_bf16() const { return Tensor::from_vector(x, {T, H}, DType::kBFloat16); }
  Tensor ids_t() const { return Tensor::from_vector(ids, {T, K}, DType::kInt32); }
  Tensor rw_t() const { return Tensor::from_vector(rw, {T, K}, DType::kFloat32); }
  Tensor alpha(const std::vector<double>& a) const {
    return Tensor::from_vector(a, {local}, DType::kFloat32);
  }
  std::vector<uint8_t> stored(const std::vector<uint8_t>& plain, int64_t m, int64_t cols,
                              bool reorder) const {
    return stored_bytes(plain, local, m, cols, reorder);
  }
  Tensor w1_t() const {
    return moe_fp4::bytes_tensor(stored(w1, n1(), H / 2, cute && gated), {local, n1(), H / 2});
  }
  Tensor w2_t() const { return moe_fp4::bytes_tensor(w2, {local, H, I / 2}); }
  // Swizzled scales (rows in stored order): contiguous, or convert_sf_to_mma_layout's 6-D view.
  Tensor scales(const std::vector<uint8_t>& plain, int64_t m, int64_t cols, bool reorder,
                Tensor& base) const {
    base = block_scale_interleave(
        moe_fp4::bytes_tensor(stored(plain, m, cols, reorder), {local, m, cols}));
    if (!six_d) return base;
    const int64_t mt = (m + 127) / 128, kt = (cols + 3) / 4;
    return Tensor::from_blob(base.data_ptr(), {32, 4, mt, 4, kt, local},
                             {16, 4, kt * 512, 1, 512, mt * kt * 512}, DType::kUInt8,
                             Device::cpu());
  }
  Tensor s1_t() { return scales(s1, n1(), H / 16, cute && gated, s1_base); }
  Tensor s2_t() { return scales(s2, H, I / 16, false, s2_base); }
  // Dequantized plain weights: W1[e][j][d], W2[e][d][j].
  double w1v(int64_t e, int64_t j, int64_t d) const {
    const size_t i = static_cast<size_t>((e * n1() + j) * H + d);
    return e2m1(w1, i) * e4m3fn_bits_to_float(s1[i / 16]);
  }
  double w2v(int64_t e, int64_t d, int64_t j) const {
    const size_t i = static_cast<size_t>((e * H + d) * I + j);
    return e2m1(w2, i) * e4m3fn_bits_to_float(s2[i / 16]);
  }
};

/// Python for the torch-written dumps: the 128x4 scale layout of one matrix and
/// convert_sf_to_mma_layout's 6-D view of E of them.
inline constexpr const char* kScaleLayoutPy = R"PY(
def interleave_128x4(s):  # block_scale_interleave of one [M, C] matrix
    M, C = s.shape
    Mp, Cp = (M + 127) // 128 * 128, (C + 3) // 4 * 4
    p = torch.zeros(Mp, Cp, dtype=s.dtype)
    p[:M, :C] = s
    return p.view(Mp // 128, 4, 32, Cp // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)
def mma_view(flat, El, m, cols):  # convert_sf_to_mma_layout
    return flat.view(El, (m + 127) // 128, (cols + 3) // 4, 32, 4, 4).permute(3, 4, 1, 5, 2, 0)
)PY";

/// The calls a wrapper test recorded all succeeded and replay: a replayed __init__ builds a new
/// object (its own id), so it only has to succeed; every other call replays identically.
inline void expect_wrapper_calls_replay(const std::vector<RecordingObserver::Call>& calls) {
  for (const auto& call : calls) {
    SCOPED_TRACE(call.name);
    ASSERT_TRUE(call.error.empty()) << call.error;
    if (call.name.ends_with(".__init__")) {
      EXPECT_NO_THROW((void)replay(call));
      continue;
    }
    EXPECT_TRUE(replays_identically(call));
  }
}

}  // namespace flashinfer::testing::moe_cute_test
