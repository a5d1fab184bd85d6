#include "kernels/cpu/dit_norm_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "flashinfer/float_formats.h"

namespace flashinfer::kernels::cpu {
namespace {

inline float bf(uint16_t b) { return bfloat16_bits_to_float(b); }
inline float bias(const float* p, int64_t c) { return p ? p[c] : 0.0f; }

}  // namespace

// The steps of upstream's kernel, in fp32 with its fused multiply-adds: the gated residual
// v = fma(x, g', r) (g' = gate + gate_bias, times the input scale when given), written as bf16;
// LayerNorm statistics on the fp32 v (sum and fma-accumulated sum of squares, sequential here),
// var = fma(-mean, mean, mean_sq) clamped at 0; then fma(v - mean, inv_std * gamma, beta) or
// (v - mean) * inv_std, then fma(., 1 + (scale + scale_bias), shift + shift_bias); rounded once.
void dit_layernorm(const DitNormParams& p) {
  const bool gated = p.mode != DitNormMode::kResidualScaleShift;
  const bool scale_shift = p.mode != DitNormMode::kGammaBeta;
  const float inv_h = 1.0f / static_cast<float>(p.hidden);
#pragma omp parallel for schedule(static) if (p.batch * p.rows * p.hidden >= (1 << 15))
  for (int64_t br = 0; br < p.batch * p.rows; ++br) {
    const int64_t b = br / p.rows, r = br % p.rows;
    const int64_t off = br * p.hidden;
    std::vector<float> v(static_cast<size_t>(p.hidden));
    const uint16_t* g = gated ? p.gate + b * p.gate_stride_b + r * p.gate_stride_r : nullptr;
    for (int64_t c = 0; c < p.hidden; ++c) {
      const float x = bf(p.input[off + c]);
      const float res = p.residual ? bf(p.residual[off + c]) : 0.0f;
      float y;
      if (gated) {
        float gv = bf(g[c]) + bias(p.gate_bias, c);
        if (p.has_input_scale) gv = gv * p.input_scale;
        y = std::fma(x, gv, res);
      } else {
        y = p.has_input_scale ? std::fma(x, p.input_scale, res) : x + res;
      }
      v[c] = y;
      p.residual_out[off + c] = float_to_bfloat16_bits(y);
    }
    float sum = 0.0f, sum_sq = 0.0f;
    for (int64_t c = 0; c < p.hidden; ++c) {
      sum += v[c];
      sum_sq = std::fma(v[c], v[c], sum_sq);
    }
    const float mean = sum * inv_h;
    const float mean_sq = sum_sq * inv_h;
    const float var = std::fma(-mean, mean, mean_sq);
    const float inv_std = 1.0f / std::sqrt(std::max(0.0f, var) + p.eps);
    const uint16_t* sc =
        scale_shift ? p.scale + b * p.scale_stride_b + r * p.scale_stride_r : nullptr;
    const uint16_t* sh =
        scale_shift ? p.shift + b * p.shift_stride_b + r * p.shift_stride_r : nullptr;
    for (int64_t c = 0; c < p.hidden; ++c) {
      float y = v[c] - mean;
      if (p.mode == DitNormMode::kGammaBeta) {
        y = std::fma(y, inv_std * p.gamma[c], p.beta[c]);
      } else {
        y = y * inv_std;
        y = std::fma(y, 1.0f + (bf(sc[c]) + bias(p.scale_bias, c)),
                     bf(sh[c]) + bias(p.shift_bias, c));
      }
      p.norm_out[off + c] = float_to_bfloat16_bits(y);
    }
  }
}

}  // namespace flashinfer::kernels::cpu
