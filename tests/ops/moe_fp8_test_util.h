// fp64 reference of the DeepSeek-FP8 block-scale trtllm MoE (docs/MOE.md, "FP8 block scale"),
// shared by the tests of trtllm_fp8_block_scale_moe (test_moe_quant.cpp) and of its fused
// shared experts (test_moe_fused_shared.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "flashinfer/flashinfer.h"

namespace flashinfer::testing::moe_fp8 {

inline double bf16(double v) {
  return bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(v)));
}
inline double silu(double v) { return v / (1.0 + std::exp(-v)); }

/// x fp8 [T, H] with scales xs [H / 128, T]; plain MajorK weights w1 [E_w, 2I, H], w2 [E_w, H, I]
/// with 128x128 block scales s1, s2; Swiglu. Every (token, slot) pair of `routing` (ids with
/// fp32/bf16 weights, [T, slots]) whose expert lies in [offset, offset + local) runs weight row
/// (expert - offset): silu(gate) * up quantized to e4m3 per 128 columns, bf16 GEMM2 output,
/// weighted by the bf16-rounded routing weight and summed in fp64. b1 [E_w, 2I] / b2 [E_w, H]
/// (plain rows; empty: none): upstream 0.7.4's gemm1_bias added to GEMM1's dequantized output
/// before the activation, gemm2_bias to GEMM2's before its bf16 rounding.
inline std::vector<double> fp8_block_moe_reference(
    const Tensor& x, const Tensor& xs, const Tensor& w1, const Tensor& s1, const Tensor& w2,
    const Tensor& s2, const MoeTopkIds& routing, int64_t offset, int64_t local,
    const std::vector<double>& b1 = {}, const std::vector<double>& b2 = {}) {
  const int64_t T = x.size(0), H = x.size(1), I = w2.size(2), K = routing.ids.size(1);
  const auto xv = x.to_double_vector(), xsv = xs.to_double_vector(), w1v = w1.to_double_vector(),
             s1v = s1.to_double_vector(), w2v = w2.to_double_vector(), s2v = s2.to_double_vector(),
             idv = routing.ids.to_double_vector(), wv = routing.weights->to_double_vector();
  std::vector<double> out(static_cast<size_t>(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = static_cast<int64_t>(idv[static_cast<size_t>(t * K + k)]) - offset;
      if (e < 0 || e >= local) continue;
      std::vector<double> h(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double up = 0.0, gate = 0.0;
        for (int64_t d = 0; d < H; ++d) {
          const double xd =
              xv[static_cast<size_t>(t * H + d)] * xsv[static_cast<size_t>((d / 128) * T + t)];
          auto w1d = [&](int64_t row) {
            return w1v[static_cast<size_t>((e * 2 * I + row) * H + d)] *
                   s1v[static_cast<size_t>((e * (2 * I / 128) + row / 128) * (H / 128) + d / 128)];
          };
          up += xd * w1d(i);
          gate += xd * w1d(I + i);
        }
        if (!b1.empty()) {
          up += b1[static_cast<size_t>(e * 2 * I + i)];
          gate += b1[static_cast<size_t>(e * 2 * I + I + i)];
        }
        h[static_cast<size_t>(i)] = silu(gate) * up;
      }
      // GEMM2 reads the activation as e4m3 with an fp32 scale per 128 columns:
      // scale = max(amax / 448, FLT_MIN), q = e4m3(h / scale) (RNE, satfinite).
      for (int64_t b = 0; b < I; b += 128) {
        float amax = 0.0f;
        for (int64_t i = b; i < b + 128 && i < I; ++i) {
          amax = std::max(amax, static_cast<float>(std::fabs(h[static_cast<size_t>(i)])));
        }
        const float scale = std::max(amax / 448.0f, std::numeric_limits<float>::min());
        for (int64_t i = b; i < b + 128 && i < I; ++i) {
          const float v = static_cast<float>(h[static_cast<size_t>(i)]) / scale;
          h[static_cast<size_t>(i)] =
              static_cast<double>(e4m3fn_bits_to_float(float_to_e4m3fn_bits(v, true))) * scale;
        }
      }
      for (int64_t d = 0; d < H; ++d) {
        double y = 0.0;
        for (int64_t i = 0; i < I; ++i) {
          y += h[static_cast<size_t>(i)] * w2v[static_cast<size_t>((e * H + d) * I + i)] *
               s2v[static_cast<size_t>((e * (H / 128) + d / 128) * (I / 128) + i / 128)];
        }
        if (!b2.empty()) y += b2[static_cast<size_t>(e * H + d)];
        out[static_cast<size_t>(t * H + d)] += bf16(wv[static_cast<size_t>(t * K + k)]) * bf16(y);
      }
    }
  }
  return out;
}

}  // namespace flashinfer::testing::moe_fp8
